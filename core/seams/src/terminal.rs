//! The terminal backend seam: persistent PTY sessions with readiness results.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::Dialect;
use crate::subprocess::{ExitStatus, SignalDelivery, TerminalSize};
use crate::{Result, Signal};

/// Why a send returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum WaitReason {
    /// A prompt or an exact probe showed the foreground waiting for input.
    StdinRead,
    /// Output was silent, and the foreground not busy on the CPU, for the configured window.
    InferredIdle,
    /// This send's deadline passed.
    Timeout,
    /// The top-level PTY process exited.
    SessionExit,
    /// The send's `wait_for` pattern appeared in its output.
    Matched,
}

impl WaitReason {
    /// The snake_case name models see.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::StdinRead => "stdin_read",
            WaitReason::InferredIdle => "inferred_idle",
            WaitReason::Timeout => "timeout",
            WaitReason::SessionExit => "session_exit",
            WaitReason::Matched => "matched",
        }
    }
}

/// Whether the session's top-level process is still there.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "state", rename_all = "snake_case"))]
pub enum SessionStatus {
    /// The shell is alive.
    Running,
    /// Exited with a code or signal.
    Exited(ExitStatus),
    /// The provider lost the session's world (a remote daemon that restarted or went
    /// away): the shell cannot be reached and how it ended is unknown.
    Lost {
        /// The error code of the loss (`remote_unavailable`, `connection_failed`).
        code: crate::ErrorCode,
        /// The loss as a message (reason in front, as errors show it).
        message: String,
    },
}

/// A key pressed as a key (not typed as text): what [`SendRequest::keys`] carries. The
/// backend sends the bytes a terminal would for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Enter (carriage return).
    Enter,
    /// Tab (completion in a shell).
    Tab,
    /// Shift-Tab (`ESC [ Z`).
    BackTab,
    /// Escape (a lone `ESC` byte).
    Esc,
    /// Backspace (DEL).
    Backspace,
    /// The Delete key (`ESC [ 3 ~`).
    Delete,
    /// Arrow up.
    Up,
    /// Arrow down.
    Down,
    /// Arrow right.
    Right,
    /// Arrow left.
    Left,
    /// The Home key (`ESC [ H`, `ESC O H` in application cursor mode).
    Home,
    /// The End key (`ESC [ F`, `ESC O F` in application cursor mode).
    End,
    /// Page up.
    PageUp,
    /// Page down.
    PageDown,
    /// Control plus a letter (`C-a` .. `C-z`), or `C-\`, `C-]`, `C-@` (a lowercase ASCII
    /// byte: the letter, `\`, `]` or `@`).
    Ctrl(u8),
}

/// Called with each piece of a send's output as it arrives (a background send's job shows
/// it while the send runs).
pub type SendProgress = Arc<dyn Fn(&str) + Send + Sync>;

/// One send: what to type and press, and how long and for what to wait.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct SendRequest {
    /// Text typed literally: tabs, `!`, quotes, non-ASCII and line breaks reach the reader
    /// as text, never as keys (`\r\n`, `\r` and `\n` are each one line end).
    pub text: String,
    /// Keys pressed after the text, in order.
    pub keys: Vec<Key>,
    /// Press Enter after the text and keys.
    pub submit: bool,
    /// This send's deadline (`None`: the backend's configured one).
    pub timeout: Option<Duration>,
    /// Output silence does not end the send (only the prompt, a program waiting for input,
    /// `wait_for`, the deadline or the session's exit do).
    pub ignore_silence: bool,
    /// A regular expression: the send returns ([`WaitReason::Matched`]) once its output
    /// matches. Output silence does not end such a send.
    pub wait_for: Option<String>,
    /// Most bytes of output returned (the newest are kept; `None`: the backend's cap).
    pub max_output_bytes: Option<usize>,
    /// Sees the send's output as it arrives.
    pub progress: Option<SendProgress>,
}

impl SendRequest {
    /// Types `text` and presses Enter, with the backend's default waits.
    pub fn line(text: impl Into<String>) -> Self {
        Self { text: text.into(), submit: true, ..Self::default() }
    }

    /// Types `text`, pressing Enter after it when `submit`.
    pub fn typed(text: impl Into<String>, submit: bool) -> Self {
        Self { text: text.into(), submit, ..Self::default() }
    }
}

impl fmt::Debug for SendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendRequest")
            .field("text_bytes", &self.text.len())
            .field("keys", &self.keys)
            .field("submit", &self.submit)
            .field("timeout", &self.timeout)
            .field("ignore_silence", &self.ignore_silence)
            .field("wait_for", &self.wait_for)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// The result of one send that reached readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendSettle {
    /// Output produced during the send (markers stripped, bounded). Output cut to the
    /// send's `max_output_bytes` starts with a line beginning [`OMITTED_NOTE`], naming the
    /// spill that holds all of it when one was kept; a renderer that caps again keeps it.
    pub delta: String,
    /// Why it returned.
    pub wait_reason: WaitReason,
    /// The shell's own prompt ended the wait (the shell, not a program it started, reads the
    /// terminal again); false for a program's input wait, silence, a match, the deadline or
    /// an exit.
    pub at_prompt: bool,
    /// Session status at return.
    pub session_status: SessionStatus,
    /// A full-screen program held the alternate screen when the send settled: what it drew is
    /// not in `delta`, and [`TerminalSession::screen`] shows it.
    pub full_screen: bool,
}

/// How the first line of a send's output begins when output was cut from its start:
/// `[earlier output omitted; full output: PATH]` or `[earlier output omitted]`.
pub const OMITTED_NOTE: &str = "[earlier output omitted";

/// A send whose cancellation fired before readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interrupted {
    /// Output produced before the interruption (markers stripped, bounded).
    pub delta: String,
    /// False when the cancellation came before any text was typed (nothing ran).
    pub typed: bool,
    /// True when a command still held the terminal's foreground when the interrupt gave up
    /// (after the session's grace): it ignored or trapped SIGINT and keeps running, and text
    /// sent next goes to it.
    pub still_running: bool,
    /// Session status at return.
    pub session_status: SessionStatus,
}

/// How a send ended: at readiness, or interrupted by its cancel token (the foreground
/// group got SIGINT until the shell was back at its prompt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// Readiness was reached.
    Ready(SendSettle),
    /// The cancel token fired first.
    Interrupted(Interrupted),
}

/// How a framed command ended ([`TerminalSession::run_command`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandEnd {
    /// The command finished and the shell reported its status.
    Exited(i32),
    /// The deadline passed first and the command was not stopped (the backend could not
    /// bring the shell back to its prompt, or does not try): it may still be running; close
    /// the session (or signal it) to stop it.
    TimedOut,
    /// The cancel token fired first. As with `TimedOut`, the command may still be running.
    Cancelled,
    /// A program is waiting for input on the terminal (the framing cannot answer it) and was
    /// not stopped, as for `TimedOut`.
    WaitingForInput,
    /// The shell itself exited.
    SessionExited,
    /// The command ran past its deadline, or waited for input on the terminal, and was
    /// stopped (interrupted; killed when it ignored that): the shell is back at its prompt
    /// with its state (working directory, variables, functions).
    Stopped(StopCause),
}

/// Why a framed command was stopped ([`CommandEnd::Stopped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// Its deadline passed.
    Timeout,
    /// It waited for input on the terminal (a program that opens `/dev/tty`, such as a
    /// password prompt; stdin itself is at end of file).
    WaitingForInput,
}

/// The result of one framed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutcome {
    /// The command's own output: no echo, no prompt, no framing (bounded; the tail is kept
    /// and `omitted_bytes` counts what was dropped). After `TimedOut` or `Cancelled` it is
    /// what the command printed so far.
    pub output: String,
    /// Bytes of the command's output that were dropped before `output` began (exact).
    pub omitted_bytes: u64,
    /// How it ended.
    pub end: CommandEnd,
    /// Session status at return.
    pub session_status: SessionStatus,
    /// The shell's state after the command when it changed since the session last reported
    /// it (a shell reports it at its prompt, so only a command that got back there has one):
    /// what [`OpenRequest::restore`] gives a replacement shell. `None`: unchanged, or unknown.
    pub state: Option<ShellState>,
    /// The command's whole output in a file, when it passed a backend's spill threshold and
    /// the shell's world reads the files the spill's world holds; `output` is its tail.
    pub spill: Option<crate::SpillRef>,
}

/// A persistent shell's state as a command left it: the working directory, and the exported
/// variables when [`ShellState::exports`]. Only the backend that read it reads `script` (text
/// in its dialect); everything else passes it on. `Debug` leaves the script out: it holds
/// environment values.
#[derive(Clone, PartialEq, Eq)]
pub struct ShellState {
    /// The dialect `script` is written in.
    pub dialect: Dialect,
    /// Whether the exported variables are in it (otherwise only the working directory is).
    pub exports: bool,
    /// What restores it, in `dialect`.
    pub script: String,
}

impl fmt::Debug for ShellState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShellState")
            .field("dialect", &self.dialect)
            .field("exports", &self.exports)
            .field("script_bytes", &self.script.len())
            .finish()
    }
}

/// A page of scrollback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrollbackPage {
    /// The lines, newline-joined.
    pub text: String,
    /// Retained lines.
    pub total_lines: usize,
    /// First line index in the page.
    pub line_begin: usize,
    /// One past the last line index.
    pub line_end: usize,
    /// Older lines were dropped from retention or the page was cut.
    pub truncated: bool,
}

/// The visible screen of a session, as a person looking at the terminal would see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScreenView {
    /// The screen's rows, newline-joined, with trailing spaces and trailing blank rows
    /// trimmed.
    pub text: String,
    /// The terminal size the screen is laid out in.
    pub size: TerminalSize,
    /// The cursor's 0-based row and column.
    pub cursor: (u16, u16),
    /// A full-screen program switched to the alternate screen (vim, less, top): what the
    /// screen shows is that program's, and it is not in the scrollback.
    pub alternate: bool,
}

/// How a session was opened.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TerminalOpenSpec {
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Rows and columns (`None`: the backend's configured size).
    pub size: Option<TerminalSize>,
    /// The TERM the shell and its programs see (`None`: the backend's configured type).
    pub term: Option<String>,
    /// Aborts unpublished setup.
    pub cancel: CancellationToken,
    /// Trusted managed CONCH_* snapshot for the shell; applied last, so it wins.
    pub managed_env: std::collections::BTreeMap<String, String>,
    /// State a replaced shell left ([`CommandOutcome::state`]), restored before the
    /// session's first framed command; a backend of another dialect ignores it.
    pub restore: Option<ShellState>,
}

/// The result of a close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseReport {
    /// The top-level process's exit.
    pub root_exit: SessionStatus,
    /// Pids still alive after teardown (empty on success).
    pub survivors: Vec<u32>,
}

/// One live backend session.
#[async_trait]
pub trait TerminalSession: Send + Sync + fmt::Debug {
    /// The banner printed before the first prompt.
    fn motd(&self) -> String;
    /// Types the request's text literally, presses its keys (then Enter when `submit`), and
    /// waits for readiness as the request says.
    ///
    /// # Errors
    /// `io` when the PTY is gone; `connection_failed` when the provider's world is lost;
    /// `invalid_argument` for a `wait_for` that is not a valid pattern.
    ///
    /// # Cancellation
    /// When `cancel` fires before readiness, the foreground group gets SIGINT until the shell
    /// is back at its prompt, and the outcome is [`SendOutcome::Interrupted`] with the
    /// partial output. A token cancelled before the call types nothing.
    async fn send(&self, req: SendRequest, cancel: CancellationToken) -> Result<SendOutcome>;
    /// Runs one command line in the shell, framed in the backend's dialect so only the
    /// command's own output and exit status come back; state changes (cwd, variables)
    /// persist, and no shell option the command sets (such as `set -e`) makes the shell exit.
    /// Ends at the command's exit, at `timeout` or `cancel` (the command is left running for
    /// the caller to close or signal), when a program waits for input, or when the shell
    /// exits.
    ///
    /// # Errors
    /// As [`TerminalSession::send`].
    async fn run_command(
        &self,
        command: &str,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<CommandOutcome>;
    /// Reads a page of scrollback, `offset` lines back from the newest.
    fn read(&self, offset_lines: usize, max_lines: usize) -> ScrollbackPage;
    /// The visible screen (`None`: the backend keeps no screen). No default, so a wrapper
    /// cannot hide its inner session's screen by forgetting it.
    fn screen(&self) -> Option<ScreenView>;
    /// Changes the terminal's rows and columns; the foreground program gets SIGWINCH. No
    /// default, so a wrapper cannot silently turn a resize into `unsupported`.
    ///
    /// # Errors
    /// `unsupported` when the backend cannot resize; `invalid_argument` for a zero size;
    /// `io` or `connection_failed` when the terminal is gone.
    async fn resize(&self, size: TerminalSize) -> Result<()>;
    /// Signals the current foreground group.
    ///
    /// # Errors
    /// `invalid_argument` for SIGKILL at the shell; `not_found` when the terminal has no
    /// foreground group.
    async fn signal(&self, signal: Signal) -> Result<SignalDelivery>;
    /// Current status.
    fn status(&self) -> SessionStatus;
    /// Tears down the captured tree and awaits quiescence.
    ///
    /// # Errors
    /// `internal` naming survivors when teardown could not prove quiescence.
    async fn close(&self) -> Result<CloseReport>;
    /// The sandbox mode the session's shell runs under, fixed when it was opened (`None`:
    /// the backend bound no sandbox, so the shell runs unconfined). No default, as for
    /// [`crate::ShellExecutor::sandbox_mode`].
    fn sandbox_mode(&self) -> Option<crate::SandboxMode>;
}

/// The terminal backend seam.
#[async_trait]
pub trait TerminalBackend: Send + Sync + fmt::Debug + 'static {
    /// Backend type name (`bash`).
    fn type_name(&self) -> &'static str;
    /// The shell dialect its sessions speak (names and words for the tools).
    fn dialect(&self) -> Dialect;
    /// Opens a session.
    ///
    /// # Errors
    /// `spawn_failed`, `cancelled`, `timeout` (no prompt).
    async fn open(&self, spec: TerminalOpenSpec) -> Result<Arc<dyn TerminalSession>>;
}

/// A request to open a session through the terminals service.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenRequest {
    /// Backend type (default: the only/first backend).
    pub type_name: Option<String>,
    /// Optional owner-unique name.
    pub name: Option<String>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Rows and columns (`None`: the backend's configured size).
    pub size: Option<TerminalSize>,
    /// The TERM the shell sees (`None`: the backend's configured type).
    pub term: Option<String>,
    /// Trusted managed CONCH_* snapshot (the same one one-shot commands get).
    pub managed_env: std::collections::BTreeMap<String, String>,
    /// State a replaced shell left, restored before the first framed command (see
    /// [`TerminalOpenSpec::restore`]).
    pub restore: Option<ShellState>,
}

/// A published session as its owner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminalInfo {
    /// Opaque id `pty-N`.
    pub id: String,
    /// Owner-unique name, if given.
    pub name: Option<String>,
    /// Backend type.
    pub type_name: String,
    /// Banner printed before the first prompt.
    pub motd: String,
    /// Current status.
    pub status: SessionStatus,
    /// The sandbox mode the shell runs under (`None`: unconfined, no sandbox bound).
    pub sandbox: Option<crate::SandboxMode>,
}

/// An exclusive send reservation; dropping it unused releases the session's send slot.
#[async_trait]
pub trait SendSlot: Send + fmt::Debug {
    /// Performs the send while holding the slot.
    ///
    /// # Errors
    /// As [`TerminalSession::send`].
    async fn send(
        self: Box<Self>,
        req: SendRequest,
        cancel: CancellationToken,
    ) -> Result<SendOutcome>;
    /// Runs one framed command while holding the slot.
    ///
    /// # Errors
    /// As [`TerminalSession::run_command`].
    async fn run_command(
        self: Box<Self>,
        command: String,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<CommandOutcome>;
}

/// The terminals service: owner-scoped persistent sessions over a backend.
///
/// # Contract
/// - Every operation checks the exact owner (`foreign_owner` / `not_found`).
/// - `open` is reserve → initialize → publish → rollback; owner or service disposal aborts
///   unpublished setup and awaits its rollback.
/// - At most one send is active per session (`already_exists`, reason `SEND_ACTIVE`).
/// - `close` removes the record only after backend quiescence; a failed close can be retried.
/// - Errors carry an [`crate::ErrorReason`] saying which refusal it is.
#[async_trait]
pub trait Terminals: Send + Sync + fmt::Debug + 'static {
    /// The dialect of the default backend (what the persistent shell tool speaks).
    fn dialect(&self) -> Dialect;
    /// Opens and publishes a session for `owner`.
    ///
    /// # Errors
    /// `disposing` (owner not live or service disposing), `already_exists` (duplicate name),
    /// `not_found` (no backend of that type), backend errors.
    async fn open(
        &self,
        owner: &Arc<crate::Owner>,
        req: OpenRequest,
        cancel: CancellationToken,
    ) -> Result<TerminalInfo>;
    /// Reserves the session's single send slot.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`, `already_exists` when a send is active.
    fn reserve_send(&self, owner: &crate::Owner, id: &str) -> Result<Box<dyn SendSlot>>;
    /// Reads scrollback.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`.
    fn read(
        &self,
        owner: &crate::Owner,
        id: &str,
        offset_lines: usize,
        max_lines: usize,
    ) -> Result<ScrollbackPage>;
    /// The session's visible screen.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`, `unsupported` (the backend keeps no screen).
    fn screen(&self, owner: &crate::Owner, id: &str) -> Result<ScreenView>;
    /// Changes the session's rows and columns.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`, `invalid_argument`, the backend's errors.
    async fn resize(&self, owner: &crate::Owner, id: &str, size: TerminalSize) -> Result<()>;
    /// Signals the foreground group.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`, `invalid_argument` (SIGKILL at the shell).
    async fn signal(
        &self,
        owner: &crate::Owner,
        id: &str,
        signal: Signal,
    ) -> Result<SignalDelivery>;
    /// The owner's sessions.
    fn list(&self, owner: &crate::Owner) -> Vec<TerminalInfo>;
    /// Closes a session and awaits quiescence.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`, `internal` with survivors (retryable by calling again).
    async fn close(&self, owner: &crate::Owner, id: &str) -> Result<CloseReport>;
    /// Closes every session and rejects new work.
    async fn shutdown(&self);
}
