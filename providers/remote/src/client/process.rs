//! A remote process: reads come from the local replica, control goes to the daemon.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::{
    CollectedOutput, Error, ExitStatus, Leftover, Process, Result, StreamId, StreamRead,
};
use reqwest::Method;

use super::Shared;
use super::input::Input;
use super::mirror::Mirror;
use crate::proto::Stream;

/// A process running in the daemon's world.
#[derive(Debug)]
pub struct RemoteProcess {
    pub(crate) shared: Arc<Shared>,
    pub(crate) mirror: Arc<Mirror>,
    pub(crate) pid: Option<u32>,
    /// Stdin, written in order and exactly once (the close goes after every write).
    pub(crate) stdin: Input,
    pub(crate) stdin_piped: bool,
    pub(crate) done: tokio_util::sync::CancellationToken,
}

impl RemoteProcess {
    fn path(&self, what: &str) -> String {
        format!("/v1/procs/{}/{what}", self.mirror.id)
    }

    fn collected_stream(&self, stream: StreamId) -> Result<&conch_output::Collector> {
        self.mirror.stream(Stream::of(stream)).ok_or_else(|| {
            Error::invalid(format!("{stream:?} is not collected for this process").to_lowercase())
        })
    }

    /// Sends a control call in the background (the seam's sync methods).
    fn fire(&self, what: &'static str) {
        let shared = Arc::clone(&self.shared);
        let path = self.path(what);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let r: Result<serde_json::Value> =
                    shared.http.call(Method::POST, &path, None::<&()>, Duration::ZERO).await;
                if let Err(e) = r {
                    tracing::debug!(error = %e, path = %path, "control call failed");
                }
            });
        }
    }
}

#[async_trait]
impl Process for RemoteProcess {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    async fn wait(&self) -> Result<ExitStatus> {
        self.mirror.until(|_, f| f.settled.as_ref().map(|(s, _)| s.clone())).await
    }

    async fn wait_exit(&self) -> Result<ExitStatus> {
        self.mirror.until(|_, f| f.exited.clone()).await
    }

    fn leftovers(&self) -> Vec<Leftover> {
        self.mirror.facts().settled.as_ref().map(|(_, l)| l.clone()).unwrap_or_default()
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.mirror.facts().settled.as_ref().map(|(s, _)| s.clone())
    }

    fn read(&self, stream: StreamId, offset: u64, max_bytes: usize) -> Result<StreamRead> {
        let mut r = self.collected_stream(stream)?.read(offset, max_bytes);
        (r.spill, r.spill_evicted) = self.mirror.spill(Stream::of(stream));
        Ok(r)
    }

    async fn readable(&self, stream: StreamId, offset: u64) -> Result<()> {
        self.collected_stream(stream)?;
        let s = Stream::of(stream);
        self.mirror
            .until(|m, _| {
                let c = m.stream(s)?;
                (c.total_bytes() > offset || c.is_sealed()).then_some(())
            })
            .await
    }

    fn collected(&self, stream: StreamId) -> Option<CollectedOutput> {
        let mut c = self.mirror.stream(Stream::of(stream))?.summary();
        (c.spill, c.spill_evicted) = self.mirror.spill(Stream::of(stream));
        Some(c)
    }

    async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        if !self.stdin_piped {
            return Err(Error::invalid("stdin is not a pipe for this process"));
        }
        self.stdin.send(&self.shared, self.path("stdin"), data.to_vec(), false).await
    }

    fn close_stdin(&self) {
        if !self.stdin_piped {
            return;
        }
        let (shared, stdin, path) =
            (Arc::clone(&self.shared), self.stdin.clone(), self.path("stdin"));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = stdin.send(&shared, path, Vec::new(), true).await {
                    tracing::debug!(error = %e, "closing stdin failed");
                }
            });
        }
    }

    fn kill(&self) {
        // The daemon does the kill (and logs it); this only asks.
        let _span = tracing::debug_span!("kill", pid = self.pid, remote = true).entered();
        self.fire("kill");
    }

    async fn wait_group_gone(&self) -> Result<()> {
        self.mirror.until(|_, f| f.group_gone.then_some(())).await
    }

    fn release(&self) {
        self.fire("release");
    }
}

impl Drop for RemoteProcess {
    fn drop(&mut self) {
        self.done.cancel();
        self.shared.forget(&self.mirror, &format!("/v1/procs/{}", self.mirror.id));
    }
}
