//! The shell seam: one command → a foreground result or a background process.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::subprocess::{CollectedOutput, EnvOverlay, ExitStatus, Leftover};
use crate::{Dialect, Result, SandboxInfo, SandboxMode, SandboxPolicy};

/// A raw request; [`ShellExecutor::resolve`] fills defaults and caps.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ShellExecRequest {
    /// The command line, interpreted by the shell.
    pub command: String,
    /// Working directory: absolute, or relative to the executor's configured cwd (default:
    /// that cwd, or the subprocess provider's default directory).
    pub workdir: Option<PathBuf>,
    /// Foreground timeout (capped by the executor's maximum).
    pub timeout_ms: Option<u64>,
    /// In-memory output bytes (tail).
    pub output_max_bytes: Option<usize>,
    /// Stdin bytes (default: /dev/null).
    pub stdin: Option<Vec<u8>>,
    /// Caller environment (applied after the executor's terminal overrides).
    pub env: EnvOverlay,
    /// Trusted managed CONCH_* snapshot; wins over `env`.
    pub managed_env: BTreeMap<String, String>,
    /// Caller cancellation (foreground only).
    pub cancel: Option<CancellationToken>,
    /// The sandbox mode for this call instead of the executor's default. The bash tool sets
    /// `DangerFullAccess` only for an escalation the approval seam approved; a sandboxed
    /// executor stamps it into the call's policy, and an unsandboxed one refuses a confining
    /// mode it cannot apply (`unsupported`).
    pub sandbox_mode: Option<SandboxMode>,
    /// Collect stderr on its own ([`ShellRunResult::stderr`]) instead of merged into the
    /// output.
    pub separate_stderr: bool,
}

impl ShellExecRequest {
    /// A request for one command with every other field defaulted.
    pub fn new(command: impl Into<String>) -> Self {
        Self { command: command.into(), ..Self::default() }
    }

    /// Sets the working directory.
    #[must_use]
    pub fn with_workdir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workdir = Some(dir.into());
        self
    }

    /// Sets the timeout.
    #[must_use]
    pub fn with_timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = Some(ms);
        self
    }

    /// Sets the in-memory output cap.
    #[must_use]
    pub fn with_output_max_bytes(mut self, n: usize) -> Self {
        self.output_max_bytes = Some(n);
        self
    }

    /// Sets the cancel token.
    #[must_use]
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Sets the managed CONCH_* snapshot.
    #[must_use]
    pub fn with_managed_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.managed_env = env;
        self
    }
}

/// A resolved request: every value explicit.
#[derive(Clone, Debug)]
pub struct ShellExecSpec {
    /// The command line.
    pub command: String,
    /// Working directory as the subprocess provider will see it (`None`: its default). Not
    /// checked here: the provider that owns the world does that at spawn.
    pub cwd: Option<PathBuf>,
    /// Effective foreground timeout.
    pub timeout: Duration,
    /// In-memory tail bytes.
    pub output_max_bytes: usize,
    /// Spill cap.
    pub spill_cap: u64,
    /// TERM → KILL grace.
    pub grace: Duration,
    /// Stdin bytes.
    pub stdin: Option<Vec<u8>>,
    /// Final environment overlay (overrides, caller env, managed snapshot — in that order).
    pub env: EnvOverlay,
    /// Caller cancellation.
    pub cancel: CancellationToken,
    /// The complete sandbox policy this call runs under (`None`: the executor confines
    /// nothing).
    pub sandbox: Option<SandboxPolicy>,
    /// Where a foreground run reports how far it has come (elapsed time, output bytes so
    /// far) while it runs; `None`: nowhere. `resolve` leaves it unset; a tool that has a
    /// progress sink sets it.
    pub progress: Option<std::sync::Arc<dyn crate::ProgressSink>>,
    /// Collect stderr on its own instead of merged into stdout (a foreground run only; a
    /// background process's output stays merged).
    pub separate_stderr: bool,
}

/// A foreground result. Non-zero exit, timeout and abort are facts, not errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellRunResult {
    /// How the shell ended.
    pub status: ExitStatus,
    /// The executor timeout was the first cause of the kill.
    pub timed_out: bool,
    /// Caller cancellation was the first cause of the kill.
    pub aborted: bool,
    /// Effective timeout after default and cap.
    pub timeout_ms: u64,
    /// Merged stdout+stderr (stdout alone with [`ShellExecSpec::separate_stderr`]).
    pub output: CollectedOutput,
    /// Stderr, when [`ShellExecSpec::separate_stderr`] asked for it on its own.
    pub stderr: Option<CollectedOutput>,
    /// Sandbox facts; None for unsandboxed executors.
    pub sandbox: Option<SandboxInfo>,
    /// Processes the command left running when the shell exited; the executor stopped
    /// them so nothing outlives a one-shot call unnoticed.
    pub leftovers: Vec<Leftover>,
}

/// Background process state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShellProcessStatus {
    /// Still running.
    Running,
    /// Exited by itself (any exit code).
    Completed,
    /// Killed (by kill/cancel, a signal, or it never spawned).
    Killed,
    /// The subprocess provider lost the process's world (a remote daemon that restarted or
    /// went away): how it ended is unknown, and [`ShellProcess::world_lost`] says why.
    Lost,
}

impl ShellProcessStatus {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ShellProcessStatus::Running => "running",
            ShellProcessStatus::Completed => "completed",
            ShellProcessStatus::Killed => "killed",
            ShellProcessStatus::Lost => "lost",
        }
    }
}

/// One incremental read of a background process: a [`crate::JobRead`], since a background
/// process is read the same way as the job that runs it.
pub type ShellProcessRead = crate::JobRead;

/// A background process handle.
///
/// # Contract
/// `wait` never fails: a spawn failure settles as `Killed` with the error in the output.
#[async_trait]
pub trait ShellProcess: Send + Sync + fmt::Debug {
    /// Current status.
    fn status(&self) -> ShellProcessStatus;
    /// How it ended, once settled (`None` while running, or when it never spawned).
    fn exit(&self) -> Option<ExitStatus>;
    /// Resolves at settlement.
    async fn wait(&self);
    /// Consuming incremental read: never re-delivers output.
    fn read_output(&self) -> ShellProcessRead;
    /// Non-consuming view of everything retained.
    fn snapshot(&self) -> ShellProcessRead;
    /// Requests a tree kill; `Ok(false)` if already settled.
    ///
    /// # Errors
    /// The kill could not be delivered (the subprocess provider lost its world): the
    /// process may still run.
    async fn kill(&self) -> Result<bool>;
    /// Sandbox facts.
    fn sandbox(&self) -> Option<SandboxInfo>;
    /// Processes left running when the shell exited and stopped (final after `wait`).
    fn leftovers(&self) -> Vec<Leftover>;
    /// Why the process's world was lost, once the status is [`ShellProcessStatus::Lost`].
    fn world_lost(&self) -> Option<crate::ErrorBody>;
    /// Releases retained output (the spill file is deleted); for owners done with it.
    ///
    /// # Errors
    /// The request could not be delivered (the subprocess provider lost its world).
    async fn release(&self) -> Result<()>;
}

/// What an executor supports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShellCapabilities {
    /// Commands run under a sandbox policy.
    pub sandboxed: bool,
    /// Commands run in a pid namespace of their own (a sandbox runner's): whatever they
    /// start ends with the shell, killed by the kernel with the namespace, so it is stopped
    /// without being listed as a leftover, and pids the command prints are the namespace's.
    pub pid_isolated: bool,
}

/// The shell seam.
///
/// # Contract
/// - `resolve` owns defaults and caps; callers always resolve before run/start.
/// - `run` errs only for infrastructure failure; `timed_out` and `aborted` are exclusive.
/// - `start` never fails and applies no timeout.
/// - A call ends with its shell: processes the command left behind (`cmd &`) get a short
///   drain, are then stopped, and are reported as leftovers. A background child holding
///   the output pipe never keeps a call running until its timeout.
#[async_trait]
pub trait ShellExecutor: Send + Sync + fmt::Debug + 'static {
    /// Provider name.
    fn provider_name(&self) -> &'static str;
    /// What this executor supports (background runs, sandboxing).
    fn capabilities(&self) -> ShellCapabilities;
    /// The shell dialect (tool names and wording).
    fn dialect(&self) -> Dialect;
    /// Fills defaults and validates.
    ///
    /// # Errors
    /// `invalid_argument` for an empty command or a bad timeout. A missing workdir is the
    /// subprocess provider's `spawn_failed` at run/start: resolve computes no filesystem facts.
    fn resolve(&self, request: ShellExecRequest) -> Result<ShellExecSpec>;
    /// Runs in the foreground.
    ///
    /// # Errors
    /// Infrastructure failures only (`spawn_failed`, `io`).
    async fn run(&self, spec: ShellExecSpec) -> Result<ShellRunResult>;
    /// Starts in the background.
    async fn start(&self, spec: ShellExecSpec) -> Arc<dyn ShellProcess>;
    /// The sandbox mode calls run under by default (`None`: the executor confines nothing).
    /// Tools read it once to decide what they offer (escalation arguments, denial wording).
    /// No default: a wrapper that forgot it would hide its inner executor's sandbox.
    fn sandbox_mode(&self) -> Option<SandboxMode>;
}
