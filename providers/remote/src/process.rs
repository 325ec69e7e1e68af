//! A remote process: reads come from the local replica, control goes to the daemon.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::{
    CollectedOutput, Error, ExitStatus, Leftover, Process, Result, StreamId, StreamRead,
};
use reqwest::Method;
use tracing::Instrument;

use super::Shared;
use super::input::Input;
use super::mirror::Mirror;
use conch_provider_remote_proto::Stream;

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

    /// Sends a control call and waits for the daemon's answer (retried up to `give_up_ms`,
    /// failing at once when the daemon is known to be gone).
    async fn control(&self, what: &'static str) -> Result<()> {
        self.shared.check_alive()?;
        let _: serde_json::Value = self
            .shared
            .http
            .call(Method::POST, &self.path(what), None::<&()>, Duration::ZERO)
            .await?;
        Ok(())
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

    async fn close_stdin(&self) -> Result<()> {
        if !self.stdin_piped {
            return Ok(());
        }
        self.stdin.send(&self.shared, self.path("stdin"), Vec::new(), true).await
    }

    async fn kill(&self) -> Result<()> {
        // The daemon does the kill (and logs it); this asks and waits for its answer.
        let span = tracing::debug_span!("kill", pid = self.pid, remote = true);
        self.control("kill").instrument(span).await
    }

    async fn wait_group_gone(&self) -> Result<()> {
        self.mirror.until(|_, f| f.group_gone.then_some(())).await
    }

    async fn release(&self) -> Result<()> {
        self.control("release").await
    }
}

impl Drop for RemoteProcess {
    fn drop(&mut self) {
        self.done.cancel();
        self.shared.forget(&self.mirror, &format!("/v1/procs/{}", self.mirror.id));
    }
}
