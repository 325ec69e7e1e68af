//! `approval-prompt`: asks the person at conch's controlling terminal (`/dev/tty`), y/N with a
//! timeout. Without a terminal, without an answer in time, or with any answer but y/yes, the
//! escalation is denied.
//!
//! The question and the answer go through [`PromptIo`], so the dialogue is tested over real
//! pipes; the terminal implementation is the only part that needs a terminal.
//!
//! A timed-out read is handed to the next prompt rather than racing a second reader.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{Approval, ApprovalDecision, EscalationRequest, Result};
use conch_sync::LockExt;
use serde::Deserialize;
use tokio::sync::oneshot;

/// Plugin name.
pub const PROMPT_NAME: &str = "approval-prompt";

/// The controlling terminal of whatever process opens it.
const TTY: &str = "/dev/tty";

/// `approval-prompt` config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptConfig {
    /// How long to wait for an answer before denying.
    pub timeout_ms: u64,
}

impl Default for PromptConfig {
    fn default() -> Self {
        Self { timeout_ms: 60_000 }
    }
}

impl PluginConfig for PromptConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("timeout_ms", self.timeout_ms)?;
        ConfigIssue::at_most("timeout_ms", self.timeout_ms, 3_600_000)
    }
}

/// Where a prompt writes its question and reads its answer.
#[async_trait]
pub(crate) trait PromptIo: Send {
    /// Writes all of `text` (and flushes).
    async fn write_all(&mut self, text: &str) -> io::Result<()>;
    /// The next line without its terminator; `None` at end of input.
    async fn read_line(&mut self) -> io::Result<Option<String>>;
}

fn denied(reason: impl Into<String>) -> ApprovalDecision {
    ApprovalDecision::Denied { reason: reason.into() }
}

fn question(request: &EscalationRequest, timeout: Duration) -> String {
    format!(
        "\n[conch] The model asks to run a command outside the sandbox ({}).\n  command:       {}\n  justification: {}\n  session:       {}\nAllow it once? [y/N] (denied after {} s) ",
        request.permissions,
        request.command,
        request.justification,
        request.session,
        timeout.as_secs().max(1)
    )
}

/// The dialogue: one question, one line back, y/yes approves and everything else denies.
pub(crate) async fn ask(
    io: &mut dyn PromptIo,
    request: &EscalationRequest,
    timeout: Duration,
) -> ApprovalDecision {
    if let Err(e) = io.write_all(&question(request, timeout)).await {
        return denied(format!("could not ask on the terminal: {e}"));
    }
    match tokio::time::timeout(timeout, io.read_line()).await {
        Err(_) => {
            // Best effort: the person should see why their late answer does nothing.
            let _ = io.write_all("\n[conch] no answer in time: denied\n").await;
            denied(format!("nobody answered on the terminal within {} ms", timeout.as_millis()))
        }
        Ok(Err(e)) => denied(format!("could not read an answer from the terminal: {e}")),
        Ok(Ok(None)) => denied("the terminal closed without an answer"),
        Ok(Ok(Some(line))) => {
            let answer = line.trim().to_ascii_lowercase();
            if answer == "y" || answer == "yes" {
                ApprovalDecision::Approved
            } else {
                denied(format!("the person at the terminal answered {:?}, not yes", line.trim()))
            }
        }
    }
}

/// A line read from the terminal by a thread of its own.
type LineSlot = oneshot::Receiver<io::Result<Option<String>>>;

/// Asks on the controlling terminal.
#[derive(Debug)]
pub struct PromptApproval {
    tty: PathBuf,
    timeout: Duration,
    /// One prompt at a time, so two questions never share one answer.
    turn: tokio::sync::Mutex<()>,
    /// A read left waiting by a prompt that timed out. A blocking terminal read cannot be
    /// interrupted without touching the process world, so the next prompt takes it over
    /// instead of starting a second reader that would race it for the person's answer.
    pending: Arc<Mutex<Option<LineSlot>>>,
}

impl PromptApproval {
    /// An approver asking on `/dev/tty`.
    ///
    /// # Errors
    /// Invalid config, naming the key.
    pub fn new(config: PromptConfig) -> Result<Self> {
        config.check(PROMPT_NAME)?;
        Ok(Self {
            tty: PathBuf::from(TTY),
            timeout: Duration::from_millis(config.timeout_ms),
            turn: tokio::sync::Mutex::new(()),
            pending: Arc::new(Mutex::new(None)),
        })
    }

    /// Asks on another terminal device (tests use a path that cannot be opened).
    #[must_use]
    pub fn with_tty_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.tty = path.into();
        self
    }
}

/// The controlling terminal as a [`PromptIo`]: writes directly, reads a line on a thread.
struct TtyIo {
    path: PathBuf,
    out: File,
    slot: Option<LineSlot>,
    pending: Arc<Mutex<Option<LineSlot>>>,
}

#[async_trait]
impl PromptIo for TtyIo {
    async fn write_all(&mut self, text: &str) -> io::Result<()> {
        self.out.write_all(text.as_bytes())?;
        self.out.flush()
    }

    async fn read_line(&mut self) -> io::Result<Option<String>> {
        if self.slot.is_none() {
            let left = self.pending.locked().take();
            // A line that reached a timed-out prompt's reader answered that prompt; it is
            // not an answer to this one.
            self.slot = left.filter(|s| s.is_empty() && !s.is_terminated());
        }
        if self.slot.is_none() {
            let (tx, rx) = oneshot::channel();
            let path = self.path.clone();
            // A plain thread, not the blocking pool: a read nobody answers must not hold a
            // runtime's shutdown.
            std::thread::spawn(move || {
                let line = OpenOptions::new().read(true).open(&path).and_then(|f| {
                    let mut line = String::new();
                    let n = BufReader::new(f).read_line(&mut line)?;
                    Ok((n > 0).then(|| line.trim_end_matches(['\n', '\r']).to_string()))
                });
                let _ = tx.send(line);
            });
            self.slot = Some(rx);
        }
        let Some(slot) = self.slot.as_mut() else { return Ok(None) };
        let line = slot.await.unwrap_or(Ok(None));
        self.slot = None;
        line
    }
}

impl Drop for TtyIo {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            *self.pending.locked() = Some(slot);
        }
    }
}

#[async_trait]
impl Approval for PromptApproval {
    fn provider_name(&self) -> &'static str {
        PROMPT_NAME
    }

    async fn approve_escalation(&self, request: &EscalationRequest) -> Result<ApprovalDecision> {
        let _turn = self.turn.lock().await;
        let out = match OpenOptions::new().write(true).open(&self.tty) {
            Ok(f) => f,
            Err(e) => {
                return Ok(denied(format!(
                    "no terminal to ask on ({}: {e}); {PROMPT_NAME} denies what it cannot ask \
                     about",
                    self.tty.display()
                )));
            }
        };
        let mut io =
            TtyIo { path: self.tty.clone(), out, slot: None, pending: Arc::clone(&self.pending) };
        Ok(ask(&mut io, request, self.timeout).await)
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PromptConfig = ctx.config()?;
    let approval = PromptApproval::new(config).map_err(|e| ctx.locate(e))?;
    Ok(PluginOutput::seam(SeamHandle::Approval(Arc::new(approval))))
}

register_plugin!(PluginEntry {
    name: PROMPT_NAME,
    provides: Some(SeamId::Approval),
    requires: &[],
    description: "asks on conch's controlling terminal (y/N with a timeout) whether to allow a sandbox escalation",
    build,
});

#[cfg(test)]
mod tests {
    use conch_seams::ErrorCode;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
    use tokio::net::unix::pipe;

    use super::*;

    /// The dialogue over two real pipes: the prompt's output and the person's input.
    struct PipeIo {
        out: pipe::Sender,
        input: TokioBufReader<pipe::Receiver>,
    }

    #[async_trait]
    impl PromptIo for PipeIo {
        async fn write_all(&mut self, text: &str) -> io::Result<()> {
            self.out.write_all(text.as_bytes()).await
        }

        async fn read_line(&mut self) -> io::Result<Option<String>> {
            let mut line = String::new();
            let n = self.input.read_line(&mut line).await?;
            Ok((n > 0).then(|| line.trim_end_matches('\n').to_string()))
        }
    }

    fn request() -> EscalationRequest {
        EscalationRequest::new(
            "touch /etc/conch-x",
            "the build writes there",
            conch_seams::EscalationPermissions::RequireEscalated,
            "s-7",
        )
    }

    /// Runs one dialogue where the person types `typed` (then closes input when `close`),
    /// and returns the decision and everything the prompt wrote.
    async fn dialogue(typed: &str, close: bool, timeout_ms: u64) -> (ApprovalDecision, String) {
        let (out_tx, mut out_rx) = pipe::pipe().unwrap();
        let (mut in_tx, in_rx) = pipe::pipe().unwrap();
        in_tx.write_all(typed.as_bytes()).await.unwrap();
        let keep = if close {
            drop(in_tx);
            None
        } else {
            Some(in_tx)
        };
        let mut io = PipeIo { out: out_tx, input: TokioBufReader::new(in_rx) };
        let decision = ask(&mut io, &request(), Duration::from_millis(timeout_ms)).await;
        drop(io);
        drop(keep);
        let mut written = String::new();
        out_rx.read_to_string(&mut written).await.unwrap();
        (decision, written)
    }

    #[tokio::test]
    async fn the_question_shows_command_justification_and_permissions() {
        let (decision, written) = dialogue("y\n", false, 5_000).await;
        assert_eq!(decision, ApprovalDecision::Approved);
        for part in ["touch /etc/conch-x", "the build writes there", "require_escalated", "[y/N]"] {
            assert!(written.contains(part), "{part} missing from {written:?}");
        }
    }

    #[tokio::test]
    async fn only_y_or_yes_approves() {
        for yes in ["y\n", "yes\n", "YES\n", " Y \n"] {
            assert_eq!(dialogue(yes, false, 5_000).await.0, ApprovalDecision::Approved, "{yes:?}");
        }
        for no in ["n\n", "\n", "no\n", "yess\n", "sure\n"] {
            match dialogue(no, false, 5_000).await.0 {
                ApprovalDecision::Denied { reason } => {
                    assert!(reason.contains("answered"), "{reason}");
                }
                ApprovalDecision::Approved => panic!("{no:?} approved"),
            }
        }
    }

    #[tokio::test]
    async fn no_answer_in_time_is_denied_and_said_on_the_terminal() {
        let started = std::time::Instant::now();
        let (decision, written) = dialogue("", false, 200).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        match decision {
            ApprovalDecision::Denied { reason } => {
                assert!(reason.contains("within 200 ms"), "{reason}");
            }
            ApprovalDecision::Approved => panic!("silence approved"),
        }
        assert!(written.contains("no answer in time: denied"), "{written:?}");
    }

    #[tokio::test]
    async fn closed_input_is_denied() {
        match dialogue("", true, 5_000).await.0 {
            ApprovalDecision::Denied { reason } => assert!(reason.contains("closed"), "{reason}"),
            ApprovalDecision::Approved => panic!("end of input approved"),
        }
    }

    #[tokio::test]
    async fn without_a_terminal_it_denies_at_once() {
        let p = PromptApproval::new(PromptConfig::default())
            .unwrap()
            .with_tty_path("/nonexistent/conch-test-tty");
        match p.approve_escalation(&request()).await.unwrap() {
            ApprovalDecision::Denied { reason } => {
                assert!(reason.starts_with("no terminal to ask on"), "{reason}");
            }
            ApprovalDecision::Approved => panic!("approved without a terminal"),
        }
        // The real default path, when this test runs without a controlling terminal (CI).
        if OpenOptions::new().write(true).open(TTY).is_err() {
            let p = PromptApproval::new(PromptConfig::default()).unwrap();
            let d = p.approve_escalation(&request()).await.unwrap();
            assert!(
                matches!(&d, ApprovalDecision::Denied { reason } if reason.starts_with("no terminal to ask on (/dev/tty")),
                "{d:?}"
            );
        }
    }

    #[test]
    fn config_errors_name_the_key() {
        for bad in [0, 3_600_001] {
            let e = PromptApproval::new(PromptConfig { timeout_ms: bad }).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidComposition);
            assert!(e.message().contains("plugins.approval-prompt.timeout_ms"), "{e}");
        }
    }
}
