//! A remote terminal: output from the local replica, observation and control on the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::{
    ExitStatus, ForegroundTarget, Probe, Result, Signal, SignalDelivery, TeardownReport,
    TerminalObservation, TerminalProcess, TerminalSize,
};
use reqwest::Method;

use super::Shared;
use super::input::Input;
use super::mirror::Mirror;
use conch_provider_remote_proto::{self as proto, Stream};

/// Largest chunk `read_chunk` hands out.
const CHUNK: usize = 64 << 10;

/// A PTY process in the daemon's world.
#[derive(Debug)]
pub struct RemoteTerminal {
    pub(crate) shared: Arc<Shared>,
    pub(crate) mirror: Arc<Mirror>,
    pub(crate) pid: Option<u32>,
    /// Output offset `read_chunk` has handed out up to.
    pub(crate) delivered: tokio::sync::Mutex<u64>,
    pub(crate) delivered_now: AtomicU64,
    /// Keyboard input, written in order and exactly once.
    pub(crate) input: Input,
    pub(crate) ops: AtomicU64,
}

impl RemoteTerminal {
    fn path(&self, what: &str) -> String {
        format!("/v1/terms/{}/{what}", self.mirror.id)
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        body: &(impl serde::Serialize + Sync),
        extra: Duration,
    ) -> Result<T> {
        self.shared.http.call(Method::POST, &self.path(what), Some(body), extra).await
    }
}

/// The notice put in the output where bytes were lost in transport: a terminal stream has
/// no other way to say so, and hiding the loss would make the screen lie.
fn lost_notice(n: u64) -> Vec<u8> {
    format!("\r\n[conch: {n} bytes of terminal output were lost in transport]\r\n").into_bytes()
}

#[async_trait]
impl TerminalProcess for RemoteTerminal {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    async fn read_chunk(&self) -> Result<Option<Vec<u8>>> {
        let mut delivered = self.delivered.lock().await;
        let at = *delivered;
        self.mirror
            .until(|m, _| {
                let c = m.stream(Stream::Pty)?;
                (c.total_bytes() > at || c.is_sealed()).then_some(())
            })
            .await?;
        let Some(c) = self.mirror.stream(Stream::Pty) else { return Ok(None) };
        let r = c.read(at, CHUNK);
        if r.data.is_empty() && r.sealed && r.next_offset <= at {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(r.data.len());
        if r.lossy || r.start_offset > at {
            out.extend(lost_notice(r.start_offset - at));
        }
        out.extend_from_slice(&r.data);
        *delivered = r.next_offset;
        self.delivered_now.store(r.next_offset, Ordering::Release);
        if out.is_empty() {
            // Only a gap up to the seal: nothing more will come.
            return Ok(None);
        }
        Ok(Some(out))
    }

    async fn write(&self, data: &[u8]) -> Result<()> {
        self.input.send(&self.shared, self.path("input"), data.to_vec(), false).await
    }

    async fn observe(&self, probe: Probe) -> Result<TerminalObservation> {
        let mut obs: TerminalObservation =
            self.post("observe", &proto::ObserveReq { probe }, Duration::ZERO).await?;
        // The daemon's count is what it took from the PTY; output is pending here until this
        // side handed all of it out.
        let mine = self.delivered_now.load(Ordering::Acquire);
        obs.output_pending = obs.output_pending || obs.delivered_bytes > mine;
        obs.delivered_bytes = mine;
        Ok(obs)
    }

    async fn signal_foreground(
        &self,
        signal: Signal,
        target: ForegroundTarget,
    ) -> Result<Option<SignalDelivery>> {
        let op = self.ops.fetch_add(1, Ordering::Relaxed) + 1;
        self.post("signal", &proto::SignalReq { op, signal, target }, Duration::ZERO).await
    }

    async fn resize(&self, size: TerminalSize) -> Result<()> {
        let _: serde_json::Value = self.post("resize", &size, Duration::ZERO).await?;
        Ok(())
    }

    async fn terminate(&self, grace: Duration) -> Result<TeardownReport> {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        // Teardown waits out the grace (twice: descendants, then the leader) on the daemon.
        let report: TeardownReport =
            self.post("terminate", &proto::TerminateReq { grace_ms }, grace * 3).await?;
        // The daemon reaped the leader before it answered: the status is known now, even if
        // its `exited` message is still on the way.
        if let Some(status) = &report.leader {
            let id = self.mirror.id.clone();
            self.mirror.message(proto::ServerMsg::Exited { id, status: status.clone() });
        }
        Ok(report)
    }

    async fn wait(&self) -> Result<ExitStatus> {
        self.mirror.until(|_, f| f.exited.clone()).await
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.mirror.facts().exited.clone()
    }
}

impl Drop for RemoteTerminal {
    fn drop(&mut self) {
        self.shared.forget(&self.mirror, &format!("/v1/terms/{}", self.mirror.id));
    }
}
