//! The subprocess seam: the execution world (argv spawn, byte streams, tree kill, PTYs).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::Result;

/// Environment overlay applied after the provider's scrub: `Some` sets, `None` unsets.
pub type EnvOverlay = BTreeMap<String, Option<String>>;

/// What the child's stdin is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StdinSpec {
    /// `/dev/null`.
    #[default]
    Null,
    /// These bytes, then EOF.
    Bytes(Vec<u8>),
    /// A pipe the caller writes with [`Process::write_stdin`].
    Pipe,
}

/// What happens to one output stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputSpec {
    /// Discarded (`/dev/null`).
    #[default]
    Null,
    /// Collected by the provider: the last `max_bytes` stay in memory, the whole stream is
    /// spilled to a private 0600 file until it passes `spill_cap` bytes.
    Collect {
        /// Tail bytes kept in memory.
        max_bytes: usize,
        /// Largest complete spill; past it the spill is deleted.
        spill_cap: u64,
    },
    /// Stderr only: written into the stdout collector, interleaved in arrival order.
    MergeIntoStdout,
}

/// Which collected stream a read addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamId {
    /// Standard output (and merged stderr).
    Stdout,
    /// Standard error when collected separately.
    Stderr,
}

/// What settlement waits for once the direct child has exited.
///
/// A child's background descendants inherit its output pipes, so EOF can come long after
/// the child itself is gone (`sleep 600 & echo started`), or never (`setsid daemon &`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterExit {
    /// Settle when every collected stream reaches EOF, however long that takes. A kill
    /// still settles: processes holding the pipes are stopped after the group is gone.
    #[default]
    WaitForEof,
    /// Give processes left behind `drain` to finish by themselves, then stop every
    /// process still in the child's group or still holding one of its output pipes
    /// (TERM → grace → KILL), seal the streams and settle. Nothing the command left
    /// attached outlives the call; the stopped processes are reported as leftovers.
    StopLeftovers {
        /// How long leftovers may run on after the direct child exits.
        drain: Duration,
    },
}

/// A process that was still running after the direct child exited and was stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`comm`).
    pub name: String,
    /// True when it held one of the collected output pipes (it kept the output open).
    pub held_output: bool,
}

/// Everything a spawn needs; the provider guesses nothing.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SpawnSpec {
    /// argv[0] is the executable (resolved on the provider's PATH); no shell interpretation.
    pub argv: Vec<String>,
    /// Working directory; must exist.
    pub cwd: PathBuf,
    /// Stdin disposition.
    pub stdin: StdinSpec,
    /// Stdout disposition.
    pub stdout: OutputSpec,
    /// Stderr disposition.
    pub stderr: OutputSpec,
    /// Time between TERM and KILL when the tree is killed.
    pub grace: Duration,
    /// Cancelling this kills the tree.
    pub cancel: CancellationToken,
    /// Applied after the scrub.
    pub env: EnvOverlay,
    /// What settlement waits for after the direct child exits.
    pub after_exit: AfterExit,
}

impl SpawnSpec {
    /// A spec with null stdio, a 3 s grace and a fresh cancel token.
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            argv,
            cwd: cwd.into(),
            stdin: StdinSpec::Null,
            stdout: OutputSpec::Null,
            stderr: OutputSpec::Null,
            grace: Duration::from_secs(3),
            cancel: CancellationToken::new(),
            env: EnvOverlay::new(),
            after_exit: AfterExit::WaitForEof,
        }
    }

    /// Sets what settlement waits for after the direct child exits.
    #[must_use]
    pub fn with_after_exit(mut self, after_exit: AfterExit) -> Self {
        self.after_exit = after_exit;
        self
    }

    /// Sets stdin.
    #[must_use]
    pub fn with_stdin(mut self, stdin: StdinSpec) -> Self {
        self.stdin = stdin;
        self
    }

    /// Sets stdout.
    #[must_use]
    pub fn with_stdout(mut self, out: OutputSpec) -> Self {
        self.stdout = out;
        self
    }

    /// Sets stderr.
    #[must_use]
    pub fn with_stderr(mut self, err: OutputSpec) -> Self {
        self.stderr = err;
        self
    }

    /// Sets the kill grace.
    #[must_use]
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Sets the cancel token.
    #[must_use]
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets (`Some`) or unsets (`None`) one variable after the scrub.
    #[must_use]
    pub fn with_env(mut self, key: impl Into<String>, value: Option<String>) -> Self {
        self.env.insert(key.into(), value);
        self
    }
}

/// How a process ended. A non-zero exit is data, not an error.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ExitStatus {
    /// Exit code, `None` when killed by a signal.
    pub code: Option<i32>,
    /// Signal name such as `SIGKILL`, when killed by one.
    pub signal: Option<String>,
}

impl ExitStatus {
    /// True for a zero exit code.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One offset read of a collected stream.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StreamRead {
    /// The bytes returned.
    pub data: Vec<u8>,
    /// Stream offset of `data[0]` (greater than the requested offset when `lossy`).
    pub start_offset: u64,
    /// Where the next contiguous read starts.
    pub next_offset: u64,
    /// True when bytes between the requested offset and `start_offset` were dropped from
    /// memory; the retained tail was returned instead of a fake contiguous delta.
    pub lossy: bool,
    /// The spill file, only while it holds the complete stream so far.
    pub spill_path: Option<PathBuf>,
    /// True once the stream reached EOF and was sealed.
    pub sealed: bool,
}

/// Summary of a collected stream (for final results).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CollectedOutput {
    /// The retained tail as text (UTF-8 safe: a partial leading code point is cut).
    pub text: String,
    /// Exact count of bytes the stream produced.
    pub total_bytes: u64,
    /// Bytes dropped from the head (`total_bytes` minus retained bytes).
    pub omitted_bytes: u64,
    /// The complete spill file, if still complete.
    pub spill_path: Option<PathBuf>,
}

/// What a process provider can do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubprocessCapabilities {
    /// `spawn_terminal` works.
    pub terminals: bool,
    /// Tree kill proves group disappearance (not just direct-child exit).
    pub group_liveness: bool,
}

/// A live (or finished) process. Handles are cheap to share behind `Arc`.
///
/// # Contract
/// - `wait_exit` resolves when the direct child exits; `wait` resolves at settlement:
///   the child exited and its collected streams reached EOF or were sealed as
///   [`SpawnSpec::after_exit`] says.
/// - `kill` is idempotent and returns at once; the TERM → grace → KILL escalation runs in
///   the background and keeps probing group liveness after the direct child is gone.
///   After a kill, settlement is bounded even when an escaped process holds a pipe.
#[async_trait]
pub trait Process: Send + Sync + fmt::Debug {
    /// OS pid of the direct child (None for providers that do not expose it).
    fn pid(&self) -> Option<u32>;
    /// Waits for settlement (see contract).
    async fn wait(&self) -> ExitStatus;
    /// Waits for the direct child's exit only; streams may still be open.
    async fn wait_exit(&self) -> ExitStatus;
    /// Processes stopped because they outlived the direct child (final after `wait`).
    fn leftovers(&self) -> Vec<Leftover>;
    /// The exit status if already known.
    fn try_status(&self) -> Option<ExitStatus>;
    /// Reads a collected stream from a caller-owned offset, at most `max_bytes`.
    ///
    /// # Errors
    /// `invalid_argument` when the stream is not collected.
    fn read(&self, stream: StreamId, offset: u64, max_bytes: usize) -> Result<StreamRead>;
    /// A summary of a collected stream (None when not collected).
    fn collected(&self, stream: StreamId) -> Option<CollectedOutput>;
    /// Writes to a piped stdin.
    ///
    /// # Errors
    /// `invalid_argument` when stdin is not a pipe; `io` when the child closed it.
    async fn write_stdin(&self, data: &[u8]) -> Result<()>;
    /// Closes a piped stdin (EOF for the child).
    fn close_stdin(&self);
    /// Requests a tree kill (TERM, grace, KILL).
    fn kill(&self);
    /// Resolves once the whole process group is gone (the liveness proof).
    async fn wait_group_gone(&self);
}

/// Terminal size in cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminalSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for TerminalSize {
    fn default() -> Self {
        Self { rows: 24, cols: 200 }
    }
}

/// A PTY spawn request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TerminalSpawnSpec {
    /// argv[0] is the executable.
    pub argv: Vec<String>,
    /// Working directory; validated (never silently replaced by $HOME).
    pub cwd: PathBuf,
    /// Applied after the scrub.
    pub env: EnvOverlay,
    /// Initial size.
    pub size: TerminalSize,
}

impl TerminalSpawnSpec {
    /// A spec with the default size and no overlay.
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> Self {
        Self { argv, cwd: cwd.into(), env: EnvOverlay::new(), size: TerminalSize::default() }
    }
}

/// A process on a PTY. Output arrives as chunks; the terminal backend does the parsing.
#[async_trait]
pub trait TerminalProcess: Send + Sync + fmt::Debug {
    /// Pid of the session leader.
    fn pid(&self) -> Option<u32>;
    /// Next chunk of PTY output; None at EOF.
    async fn read_chunk(&self) -> Option<Vec<u8>>;
    /// Writes bytes to the master.
    ///
    /// # Errors
    /// `io` when the PTY is gone.
    async fn write(&self, data: &[u8]) -> Result<()>;
    /// Current foreground process group of the terminal, when observable.
    fn foreground_pgid(&self) -> Option<i32>;
    /// True when an exact probe saw a foreground task blocked reading the terminal.
    fn stdin_wait_probe(&self) -> bool;
    /// Sends a signal to a process group.
    ///
    /// # Errors
    /// `not_found` when the group does not exist.
    fn signal_group(&self, pgid: i32, signal: i32) -> Result<()>;
    /// Resizes the terminal.
    ///
    /// # Errors
    /// `io` when the PTY is gone.
    fn resize(&self, size: TerminalSize) -> Result<()>;
    /// Waits for the leader to exit.
    async fn wait(&self) -> ExitStatus;
    /// The leader's status if it already exited.
    fn try_status(&self) -> Option<ExitStatus>;
}

/// The subprocess seam.
///
/// # Contract
/// - MUST scrub the ambient environment (names matching KEY|PASSWORD|SECRET|TOKEN
///   case-insensitively, and every CONCH_* name) before applying the overlay.
/// - MUST put each spawned child in its own process group and kill trees, not pids.
/// - `spawn` returns as soon as the child exists; spawn failure is an `Err`, exit is data.
/// - `shutdown` kills and reaps everything still live.
///
/// # Cancellation
/// Cancelling `SpawnSpec::cancel` is the same as [`Process::kill`].
#[async_trait]
pub trait Subprocess: Send + Sync + fmt::Debug + 'static {
    /// Provider name for diagnostics.
    fn provider_name(&self) -> &'static str;
    /// What this provider supports.
    fn capabilities(&self) -> SubprocessCapabilities;
    /// Resolves an executable on the provider's PATH.
    async fn which(&self, program: &str) -> Option<PathBuf>;
    /// Starts a process.
    ///
    /// # Errors
    /// `spawn_failed` (missing executable, bad cwd), `invalid_argument` (empty argv).
    async fn spawn(&self, spec: SpawnSpec) -> Result<std::sync::Arc<dyn Process>>;
    /// Starts a process on a new PTY.
    ///
    /// # Errors
    /// `unsupported` when `capabilities().terminals` is false; `spawn_failed` otherwise.
    async fn spawn_terminal(
        &self,
        spec: TerminalSpawnSpec,
    ) -> Result<std::sync::Arc<dyn TerminalProcess>>;
    /// Kills and reaps every live process this provider started.
    async fn shutdown(&self);
}
