//! A lost transport is an error, never an exit or EOF, and a reader that falls behind is not
//! silence: terminal-bash over a subprocess provider whose PTY stream breaks or stalls. The
//! only test double in the suites: a wrapper around the real local provider that cuts the
//! output stream on demand, the way a dropped connection to a remote world would, or holds it
//! back, the way a starved reader on a loaded machine does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};
use conch_seams::{
    Error, ErrorCode, ExitStatus, ForegroundTarget, Probe, Process, Result, SendOutcome,
    SessionStatus, Signal, SignalDelivery, SpawnSpec, Subprocess, SubprocessCapabilities,
    TeardownReport, TerminalBackend, TerminalObservation, TerminalOpenSpec, TerminalProcess,
    TerminalSize, TerminalSpawnSpec, WaitReason,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The local provider, with switches that break or hold back every terminal's output
/// stream.
#[derive(Debug)]
struct Cuttable {
    inner: LocalSubprocess,
    cut: watch::Sender<bool>,
    stall: watch::Sender<bool>,
}

#[derive(Debug)]
struct CutTerminal {
    inner: Arc<dyn TerminalProcess>,
    cut: watch::Receiver<bool>,
    stall: watch::Receiver<bool>,
}

#[async_trait]
impl TerminalProcess for CutTerminal {
    fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }
    async fn read_chunk(&self) -> Result<Option<Vec<u8>>> {
        let mut cut = self.cut.clone();
        // While stalled, nothing is read: the provider keeps what its programs write.
        let _ = self.stall.clone().wait_for(|s| !*s).await;
        tokio::select! {
            r = self.inner.read_chunk() => r,
            _ = cut.wait_for(|c| *c) => {
                Err(Error::new(ErrorCode::ConnectionFailed, "connection reset by peer"))
            }
        }
    }
    async fn write(&self, data: &[u8]) -> Result<()> {
        self.inner.write(data).await
    }
    async fn observe(&self, probe: Probe) -> Result<TerminalObservation> {
        self.inner.observe(probe).await
    }
    async fn signal_foreground(
        &self,
        signal: Signal,
        target: ForegroundTarget,
    ) -> Result<Option<SignalDelivery>> {
        self.inner.signal_foreground(signal, target).await
    }
    async fn resize(&self, size: TerminalSize) -> Result<()> {
        self.inner.resize(size).await
    }
    async fn terminate(&self, grace: Duration) -> Result<TeardownReport> {
        self.inner.terminate(grace).await
    }
    async fn wait(&self) -> Result<ExitStatus> {
        self.inner.wait().await
    }
    fn try_status(&self) -> Option<ExitStatus> {
        self.inner.try_status()
    }
}

#[async_trait]
impl Subprocess for Cuttable {
    fn provider_name(&self) -> &'static str {
        "cuttable-local"
    }
    fn capabilities(&self) -> SubprocessCapabilities {
        self.inner.capabilities()
    }
    async fn which(&self, program: &str) -> conch_seams::Result<Option<PathBuf>> {
        self.inner.which(program).await
    }
    async fn keep_spill(
        &self,
        text: Vec<u8>,
    ) -> conch_seams::Result<Option<conch_seams::SpillRef>> {
        self.inner.keep_spill(text).await
    }
    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        self.inner.spawn(spec).await
    }
    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        let inner = self.inner.spawn_terminal(spec).await?;
        Ok(Arc::new(CutTerminal {
            inner,
            cut: self.cut.subscribe(),
            stall: self.stall.subscribe(),
        }))
    }
    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

/// A `terminal-bash` session (idle window `idle_ms`) over the local provider behind the
/// switches, and the provider that holds them.
async fn open_over_cuttable(
    idle_ms: u64,
) -> (Arc<Cuttable>, Arc<dyn conch_seams::TerminalSession>) {
    let sub = Arc::new(Cuttable {
        inner: LocalSubprocess::new(LocalConfig::default()),
        cut: watch::Sender::new(false),
        stall: watch::Sender::new(false),
    });
    let backend = TerminalShell::new(
        TerminalShellConfig { idle_silence_ms: idle_ms, ..TerminalShellConfig::default() },
        Arc::clone(&sub) as Arc<dyn Subprocess>,
    )
    .unwrap();
    let session = backend.open(TerminalOpenSpec::default()).await.expect("open");
    (sub, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_terminal_stream_is_a_connection_error_not_a_session_exit() {
    let (sub, session) = open_over_cuttable(60_000).await;
    let first = session
        .send(conch_seams::SendRequest::line("echo fine"), CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&first, SendOutcome::Ready(s) if s.wait_reason == WaitReason::StdinRead && s.delta.contains("fine")),
        "{first:?}"
    );
    // The command is running when the stream breaks: silence, not an exit.
    let send = session.send(conch_seams::SendRequest::line("sleep 1000"), CancellationToken::new());
    let cutter = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sub.cut.send_replace(true);
    };
    let (r, ()) =
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(send, cutter) })
            .await
            .expect("the send returns once the stream is lost");
    let e = r.expect_err("a lost stream is an error");
    assert_eq!(e.code(), ErrorCode::ConnectionFailed, "{e}");
    // Lost, not exited (the shell did not exit) and no longer running as far as anyone
    // can tell.
    assert!(
        matches!(session.status(), SessionStatus::Lost { code: ErrorCode::ConnectionFailed, .. }),
        "{:?}",
        session.status()
    );
    // A lost session refuses before typing: a retry must not run the command again.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let again = session
        .send(
            conch_seams::SendRequest::line(format!("touch {}", marker.display())),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(again.code(), ErrorCode::ConnectionFailed, "the session stays lost: {again}");
    let cmd = session
        .run_command("true", Duration::from_secs(5), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(cmd.code(), ErrorCode::ConnectionFailed, "{cmd}");
    // Teardown still goes through the provider, which can reach its world.
    let report = session.close().await.expect("close");
    assert!(report.survivors.is_empty(), "{report:?}");
    assert!(!marker.exists(), "nothing was typed into the lost session");
    sub.shutdown().await;
}

/// Output a program wrote that the session has not read yet is not silence: a send does not
/// end "idle" while its reader is behind. (Seen in a soak under load: `seq 1 30000` returned
/// `inferred_idle` with only 8,247 lines read, the rest still queued.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_waiting_unread_is_not_silence() {
    let (sub, session) = open_over_cuttable(200).await;
    // The reader stops taking output for longer than the idle window; the command finishes
    // meanwhile and its output waits in the provider.
    sub.stall.send_replace(true);
    let send =
        session.send(conch_seams::SendRequest::line("seq 1 30000"), CancellationToken::new());
    let release = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sub.stall.send_replace(false);
    };
    let (r, ()) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(send, release) })
            .await
            .expect("the send returns");
    let SendOutcome::Ready(s) = r.expect("send") else { panic!("interrupted") };
    assert_eq!(
        s.wait_reason,
        WaitReason::StdinRead,
        "not idle while output waited: {:.200}",
        s.delta
    );
    assert!(s.delta.lines().any(|l| l.trim_end() == "30000"), "all of it: {:.200}", s.delta);
    let report = session.close().await.expect("close");
    assert!(report.survivors.is_empty(), "{report:?}");
    sub.shutdown().await;
}
