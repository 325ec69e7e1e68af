//! The executor every local shell dialect shares: defaults and caps, the env layering, the
//! optional sandbox wrap, fused timeout/abort, leftovers, and background handles that never
//! fail. A dialect ([`Flavor`]) supplies only its names, its terminal overrides and the argv
//! that runs one command; bash-local, bash-sandbox, pwsh-local and pwsh-sandbox are this one
//! executor with a flavour and, for the sandboxed two, a sandbox bound.
//!
//! `Settings` holds the config keys every flavour has, checked by one `validate`; each flavour's
//! config struct is declared by the `local_shell_config!` macro with its own executable key.
//! `resolve` applies defaults and caps (`max_command_bytes`, NUL refusal) and layers the
//! environment (flavour overrides, caller env, managed snapshot), with no filesystem facts. Timeout
//! and abort are fused (the first cause wins); the engine also handles leftovers, background
//! handles that never fail, the optional sandbox wrap, and the missing-program message (a provider
//! error with `MISSING_PROGRAM`, or, sandboxed, a PATH look-up until the program was found once). A
//! `Flavor` supplies only its plugin names, `Dialect`, terminal overrides, executable key and
//! `invocation(program, command) -> {argv, env}`.
//!
//! Sandboxed (`LocalShell::sandboxed`), `resolve` stamps the complete per-call policy into
//! `ShellExecSpec::sandbox`: the composition's default (its `sandbox-policy` entry), with the mode
//! a request may override through `ShellExecRequest::sandbox_mode` (the shell tool sets
//! danger-full-access only for an approved escalation). The spawn path wraps the `CommandLine
//! {argv, cwd, env}` through `conch_confine::Confinement` (the protocol it shares with
//! `terminal-bash`) before building the `SpawnSpec`. A wrap error, a spawn failure of a wrapped
//! command, or an exit the sandbox's own `classify` calls a runner failure is
//! `sandbox_unavailable` in the foreground and a killed handle with a runner-failed verdict in the
//! background; results carry the `SandboxInfo` verdict. `ShellExecutor::sandbox_mode` tells tools
//! the default mode.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_confine::{ConfinedSubject, Confinement, SandboxRelease};
use conch_registry::ConfigIssue;
use conch_seams::{
    AfterExit, CollectedOutput, CommandLine, Dialect, EnvOverlay, Error, ErrorBody, ErrorCode,
    ErrorReason, ExitStatus, Leftover, OutputSpec, Process, Result, Sandbox, SandboxInfo,
    SandboxMode, SandboxPolicy, ShellCapabilities, ShellExecRequest, ShellExecSpec, ShellExecutor,
    ShellProcess, ShellProcessRead, ShellProcessStatus, ShellRunResult, SpawnSpec, StdinSpec,
    StreamId, Subprocess,
};
use conch_sync::LockExt;
use tokio_util::sync::CancellationToken;

/// The longest argv (or environment) string Linux accepts: MAX_ARG_STRLEN is 32 pages (at
/// least 4 KiB each) and counts the terminating NUL.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;

/// The largest `max_command_bytes` accepted: the command, its loader and the environment
/// share ARG_MAX (2 MiB with the usual 8 MiB stack), so the cap stays well below it.
pub const MAX_COMMAND_BYTES_LIMIT: usize = 1536 * 1024;

/// The command line that runs one command in a dialect: the argv, and variables it needs
/// (a command too long for one argv string travels in them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// The first element is the shell.
    pub argv: Vec<String>,
    /// Set last, after the caller's environment and the managed snapshot.
    pub env: Vec<(String, String)>,
}

/// What a shell dialect gives the shared executor.
pub trait Flavor: Send + Sync + std::fmt::Debug + 'static {
    /// Plugin name of the unconfined executor (`bash-local`).
    const NAME: &'static str;
    /// Plugin name of the sandboxed executor (`bash-sandbox`).
    const SANDBOX_NAME: &'static str;
    /// The dialect tools built on it speak.
    const DIALECT: Dialect;
    /// Variables that keep tool output plain; the caller's env and the managed snapshot are
    /// layered on top of these.
    const ENV_OVERRIDES: &'static [(&'static str, &'static str)];
    /// The config key naming the executable (`bash`).
    const PROGRAM_KEY: &'static str;
    /// The command line that runs `command` with `program` as the dialect's one-shot mode
    /// runs it.
    fn invocation(program: &str, command: &str) -> Invocation;
    /// What to tell the user when `program` is not there (`None`: the subprocess provider's
    /// own error says it well enough).
    fn missing_program(program: &str) -> Option<String>;
}

/// The default foreground timeout of every flavour.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// The settings every local shell executor has (each flavour's config maps onto them, so
/// the keys and their checks are the same for all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Default working directory (default: the subprocess provider's default directory).
    pub cwd: Option<PathBuf>,
    /// Default foreground timeout.
    pub timeout_ms: u64,
    /// Largest foreground timeout a caller may ask for.
    pub max_timeout_ms: u64,
    /// In-memory output tail.
    pub max_output_bytes: usize,
    /// Spill cap per stream.
    pub max_spill_bytes: u64,
    /// TERM → KILL grace.
    pub grace_ms: u64,
    /// How long processes a command left behind may run on after the shell exits.
    pub drain_ms: u64,
    /// The shell executable.
    pub program: String,
    /// Longest command accepted, in bytes.
    pub max_command_bytes: usize,
}

impl Settings {
    /// The checks every flavour's config runs; `program_key` names the executable's key.
    ///
    /// # Errors
    /// The first key whose value is out of range.
    pub fn validate(&self, program_key: &'static str) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("timeout_ms", self.timeout_ms)?;
        ConfigIssue::timeout_within_max(self.timeout_ms, self.max_timeout_ms, DEFAULT_TIMEOUT_MS)?;
        ConfigIssue::positive("max_output_bytes", self.max_output_bytes as u64)?;
        if self.max_spill_bytes < self.max_output_bytes as u64 {
            return Err(ConfigIssue::new("max_spill_bytes", "must be at least max_output_bytes"));
        }
        ConfigIssue::at_most("drain_ms", self.drain_ms, 60_000)?;
        ConfigIssue::positive("max_command_bytes", self.max_command_bytes as u64)?;
        ConfigIssue::at_most(
            "max_command_bytes",
            self.max_command_bytes as u64,
            MAX_COMMAND_BYTES_LIMIT as u64,
        )?;
        if self.program.is_empty() {
            return Err(ConfigIssue::new(program_key, "must name an executable"));
        }
        Ok(())
    }
}

/// The shared local shell executor in flavour `F`; with a sandbox bound, its sandboxed
/// variant.
#[derive(Debug)]
pub struct LocalShell<F: Flavor> {
    settings: Settings,
    subprocess: Arc<dyn Subprocess>,
    confinement: Option<Confinement>,
    /// The program was seen on the provider's PATH (checked before the first sandboxed call
    /// of a flavour that has its own missing-program message).
    program_found: AtomicBool,
    flavor: PhantomData<F>,
}

/// A command line ready to spawn, and whether a sandbox runner stands in front of it.
struct Prepared {
    command: CommandLine,
    wrapped: bool,
    /// Frees what the runner made for this command once it is dropped (held while the
    /// command may run).
    release: Option<SandboxRelease>,
}

impl<F: Flavor> LocalShell<F> {
    /// The unconfined executor (`F::NAME`) over a subprocess provider.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn with_settings(settings: Settings, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        settings.validate(F::PROGRAM_KEY).map_err(|i| i.into_error(F::NAME))?;
        Ok(Self {
            settings,
            subprocess,
            confinement: None,
            program_found: AtomicBool::new(false),
            flavor: PhantomData,
        })
    }

    /// The sandboxed executor (`F::SANDBOX_NAME`): every command line wrapped by `sandbox`
    /// under a per-call policy, `policy` unless a request overrides its mode.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn with_settings_sandboxed(
        settings: Settings,
        subprocess: Arc<dyn Subprocess>,
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
    ) -> Result<Self> {
        settings.validate(F::PROGRAM_KEY).map_err(|i| i.into_error(F::SANDBOX_NAME))?;
        Ok(Self {
            settings,
            subprocess,
            confinement: Some(Confinement::new(
                sandbox,
                policy,
                F::SANDBOX_NAME,
                "run",
                ConfinedSubject::Command,
            )),
            program_found: AtomicBool::new(false),
            flavor: PhantomData,
        })
    }

    fn name(&self) -> &'static str {
        if self.confinement.is_some() { F::SANDBOX_NAME } else { F::NAME }
    }

    /// The settings this executor runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The command line that runs `command` (see [`Flavor::invocation`]).
    pub fn invocation(&self, command: &str) -> Invocation {
        F::invocation(&self.settings.program, command)
    }

    /// The argv that runs `command` (the invocation without its variables).
    pub fn argv(&self, command: &str) -> Vec<String> {
        self.invocation(command).argv
    }

    /// The flavour's error for its missing program, when it has one.
    fn missing(&self) -> Option<Error> {
        F::missing_program(&self.settings.program).map(|m| {
            Error::new(ErrorCode::SpawnFailed, m).with_provider(self.name()).with_operation("run")
        })
    }

    /// A spawn error as the user should read it: a missing program in the flavour's words.
    fn spawn_error(&self, e: Error) -> Error {
        if e.reason() == Some(ErrorReason::MissingProgram)
            && let Some(missing) = self.missing()
        {
            return missing;
        }
        e
    }

    /// Before a sandboxed call: the runner is what gets spawned, so a missing shell would only
    /// show as the runner's exit 127. A flavour with its own message checks the provider's
    /// PATH instead, once it has been found never again.
    async fn check_program(&self) -> Result<()> {
        if self.confinement.is_none() || self.program_found.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(missing) = self.missing() else { return Ok(()) };
        // A provider that could not look says so; that is not "missing".
        if self.subprocess.which(&self.settings.program).await?.is_none() {
            return Err(missing);
        }
        self.program_found.store(true, Ordering::Release);
        Ok(())
    }

    /// The policy a spec runs under; a sandboxed executor never runs a spec without one
    /// (a spec missing it gets the default, never no confinement).
    fn policy_of(&self, spec: &ShellExecSpec) -> Option<(&Confinement, SandboxPolicy)> {
        self.confinement
            .as_ref()
            .map(|c| (c, spec.sandbox.clone().unwrap_or_else(|| c.policy().clone())))
    }

    /// The command line for `spec`, wrapped when a sandbox is bound.
    ///
    /// # Errors
    /// The sandbox's wrap error, as `sandbox_unavailable`.
    fn prepare(&self, spec: &ShellExecSpec) -> Result<Prepared> {
        let invocation = self.invocation(&spec.command);
        let mut env = spec.env.clone();
        env.extend(invocation.env.into_iter().map(|(k, v)| (k, Some(v))));
        let command = CommandLine::new(invocation.argv).with_cwd(spec.cwd.clone()).with_env(env);
        let Some((confinement, policy)) = self.policy_of(spec) else {
            return Ok(Prepared { command, wrapped: false, release: None });
        };
        let w = confinement.wrap(&policy, command)?;
        Ok(Prepared { command: w.command, wrapped: w.runner, release: Some(w.release) })
    }

    fn spawn_spec(
        &self,
        spec: &ShellExecSpec,
        command: CommandLine,
        kill: CancellationToken,
        background: bool,
    ) -> SpawnSpec {
        let mut sspec = SpawnSpec::in_default_dir(command.argv)
            .with_cwd(command.cwd)
            .with_stdin(spec.stdin.clone().map_or(StdinSpec::Null, StdinSpec::bytes))
            .with_stdout(OutputSpec::Collect {
                max_bytes: spec.output_max_bytes,
                spill_cap: spec.spill_cap,
            })
            .with_stderr(if spec.separate_stderr && !background {
                OutputSpec::Collect { max_bytes: spec.output_max_bytes, spill_cap: spec.spill_cap }
            } else {
                OutputSpec::MergeIntoStdout
            })
            .with_grace(spec.grace)
            .with_cancel(kill)
            .with_after_exit(AfterExit::StopLeftovers {
                drain: Duration::from_millis(self.settings.drain_ms),
            });
        sspec.env = command.env;
        sspec
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    Exit,
    Timeout,
    Abort,
}

#[async_trait]
impl<F: Flavor> ShellExecutor for LocalShell<F> {
    fn provider_name(&self) -> &'static str {
        self.name()
    }

    fn capabilities(&self) -> ShellCapabilities {
        let mut caps = ShellCapabilities::default();
        caps.sandboxed = self.confinement.is_some();
        caps.pid_isolated = self.confinement.as_ref().is_some_and(Confinement::pid_isolated);
        caps
    }

    fn sandbox_mode(&self) -> Option<SandboxMode> {
        self.confinement.as_ref().map(|c| c.policy().mode)
    }

    fn dialect(&self) -> Dialect {
        F::DIALECT
    }

    fn resolve(&self, request: ShellExecRequest) -> Result<ShellExecSpec> {
        let invalid = |message: String| {
            Error::invalid(message).with_provider(self.name()).with_operation("resolve")
        };
        if request.command.trim().is_empty() {
            return Err(invalid("command is empty".into()));
        }
        let (len, cap) = (request.command.len(), self.settings.max_command_bytes);
        if len > cap {
            return Err(invalid(format!(
                "command is {len} bytes; the limit is {cap} ({} max_command_bytes)",
                self.name()
            )));
        }
        // An argv or environment string ends at its first NUL, so no command line can carry
        // one: refused here, before anything runs, rather than cut short or failed at spawn.
        if let Some(at) = request.command.find('\0') {
            return Err(invalid(format!(
                "command contains a NUL byte (at byte {at}), which no command line can carry"
            )));
        }
        // No filesystem facts here: the subprocess provider checks the directory in its own
        // world and resolves what is still relative against its default directory.
        let cwd = match (request.workdir, &self.settings.cwd) {
            (Some(w), Some(base)) if w.is_relative() => Some(base.join(w)),
            (Some(w), _) => Some(w),
            (None, base) => base.clone(),
        };
        let timeout_ms = match request.timeout_ms {
            Some(0) => return Err(invalid("timeout_ms must be greater than 0".into())),
            Some(t) => t.min(self.settings.max_timeout_ms),
            None => self.settings.timeout_ms,
        };
        let mut env: EnvOverlay = F::ENV_OVERRIDES
            .iter()
            .map(|(k, v)| ((*k).to_string(), Some((*v).to_string())))
            .collect();
        env.extend(request.env);
        // The trusted managed snapshot is applied last so a caller cannot spoof CONCH_*.
        env.extend(request.managed_env.into_iter().map(|(k, v)| (k, Some(v))));
        // The complete per-call policy: the composition's default, with the mode a request
        // may override (the shell tool does so only for an approved escalation).
        let sandbox = match (&self.confinement, request.sandbox_mode) {
            (Some(c), mode) => {
                let mut policy = c.policy().clone();
                if let Some(mode) = mode {
                    policy.mode = mode;
                }
                Some(policy)
            }
            (None, Some(mode)) if mode.confines() => {
                return Err(Error::new(
                    ErrorCode::Unsupported,
                    format!(
                        "{} confines nothing; it cannot run a command under {mode} mode",
                        F::NAME
                    ),
                )
                .with_provider(F::NAME)
                .with_operation("resolve"));
            }
            (None, _) => None,
        };
        Ok(ShellExecSpec {
            command: request.command,
            cwd,
            timeout: Duration::from_millis(timeout_ms),
            output_max_bytes: request
                .output_max_bytes
                .unwrap_or(self.settings.max_output_bytes)
                .max(1),
            spill_cap: self.settings.max_spill_bytes,
            grace: Duration::from_millis(self.settings.grace_ms),
            stdin: request.stdin,
            env,
            cancel: request.cancel.unwrap_or_default(),
            sandbox,
            progress: None,
            separate_stderr: request.separate_stderr,
        })
    }

    async fn run(&self, spec: ShellExecSpec) -> Result<ShellRunResult> {
        let kill = CancellationToken::new();
        let aborted = || ShellRunResult {
            status: ExitStatus::default(),
            timed_out: false,
            aborted: true,
            timeout_ms: spec.timeout.as_millis() as u64,
            output: CollectedOutput::default(),
            stderr: None,
            sandbox: None,
            leftovers: Vec::new(),
        };
        if spec.cancel.is_cancelled() {
            return Ok(aborted());
        }
        self.check_program().await?;
        let prepared = self.prepare(&spec)?;
        let wrapped = prepared.wrapped;
        // Dropped when this call ends, every path: the command has settled (or never ran).
        let _release = prepared.release;
        let sspec = self.spawn_spec(&spec, prepared.command, kill.clone(), false);
        if spec.cancel.is_cancelled() {
            return Ok(aborted());
        }
        let process = match self.subprocess.spawn(sspec).await {
            Ok(p) => p,
            Err(e) => {
                return Err(match &self.confinement {
                    // A missing workdir is the caller's mistake wherever the command runs.
                    Some(c) if wrapped && !e.reason().is_some_and(ErrorReason::is_bad_workdir) => {
                        c.launch_failed(&e)
                    }
                    _ => self.spawn_error(e),
                });
            }
        };
        // Stopped when this call ends, whichever way.
        let _progress = spec.progress.clone().map(|sink| report_progress(sink, &process));
        // One fused deadline: whichever of exit, timeout and abort fires first is the cause.
        // Only the shell's own exit counts: output held open by its leftovers must not hold
        // the call until the timeout.
        let cause = tokio::select! {
            biased;
            exited = process.wait_exit() => {
                exited?;
                Cause::Exit
            }
            () = tokio::time::sleep(spec.timeout) => Cause::Timeout,
            () = spec.cancel.cancelled() => Cause::Abort,
        };
        if cause != Cause::Exit {
            kill.cancel();
        }
        // Settlement drains and stops leftovers; an abort meanwhile cuts the drain short.
        let status = tokio::select! {
            s = process.wait() => s,
            () = spec.cancel.cancelled(), if cause == Cause::Exit => {
                kill.cancel();
                process.wait().await
            }
        }?;
        let output = process.collected(StreamId::Stdout).unwrap_or_default();
        let stderr =
            spec.separate_stderr.then(|| process.collected(StreamId::Stderr).unwrap_or_default());
        // Whether the runner refused is the sandbox's to judge: its exit protocol is its own
        // (the helper's fail-closed line, bwrap's setup errors), written to stderr.
        let sandbox = match self.policy_of(&spec) {
            Some((c, policy)) => {
                let tail = match &stderr {
                    Some(e) => std::borrow::Cow::Owned(format!("{}{}", output.text, e.text)),
                    None => std::borrow::Cow::Borrowed(output.text.as_str()),
                };
                Some(c.verdict(&policy, &status, &tail, wrapped)?)
            }
            None => None,
        };
        Ok(ShellRunResult {
            status,
            timed_out: cause == Cause::Timeout,
            aborted: cause == Cause::Abort,
            timeout_ms: spec.timeout.as_millis() as u64,
            output,
            stderr,
            sandbox,
            leftovers: process.leftovers(),
        })
    }

    async fn start(&self, spec: ShellExecSpec) -> Arc<dyn ShellProcess> {
        let kill = CancellationToken::new();
        let confinement = self.policy_of(&spec);
        let runner_failed = |text: String| -> Arc<dyn ShellProcess> {
            let info = confinement.as_ref().map(|(c, p)| c.runner_failed(p));
            Arc::new(FailedStart { text, sandbox: info })
        };
        if let Err(e) = self.check_program().await {
            return Arc::new(FailedStart { text: format!("{e}\n"), sandbox: None });
        }
        let prepared = match self.prepare(&spec) {
            Ok(p) => p,
            Err(e) => return runner_failed(format!("{e}\n")),
        };
        let wrapped = prepared.wrapped;
        let release = prepared.release;
        let sspec = self.spawn_spec(&spec, prepared.command, kill.clone(), true);
        // The caller's token may also stop a background process; no timeout applies.
        let caller = spec.cancel.clone();
        let k = kill.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = caller.cancelled() => k.cancel(),
                () = k.cancelled() => {}
            }
        });
        match self.subprocess.spawn(sspec).await {
            Ok(process) => {
                if let Some(release) = release {
                    // Freed when the process has settled, not when the job's record goes.
                    let settled = Arc::clone(&process);
                    tokio::spawn(async move {
                        let _ = settled.wait().await;
                        drop(release);
                    });
                }
                Arc::new(Background::new(
                    process,
                    kill,
                    spec.output_max_bytes,
                    confinement.as_ref().map(|(c, policy)| BackgroundSandbox {
                        confinement: (*c).clone(),
                        policy: policy.clone(),
                        wrapped,
                    }),
                ))
            }
            Err(e) => match &confinement {
                Some((c, _)) if wrapped && !e.reason().is_some_and(ErrorReason::is_bad_workdir) => {
                    runner_failed(format!("{}\n", c.launch_failed(&e)))
                }
                _ => Arc::new(FailedStart {
                    text: format!("{}\n", self.spawn_error(e)),
                    sandbox: None,
                }),
            },
        }
    }
}

/// Splits off a trailing incomplete UTF-8 sequence so consuming reads never cut a char.
fn split_utf8_carry(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = if b >= 0xF0 {
            4
        } else if b >= 0xE0 {
            3
        } else if b >= 0xC0 {
            2
        } else {
            1
        };
        return if need > back { n - back } else { n };
    }
    n
}

/// The sandbox a background shell runs in.
#[derive(Debug)]
struct BackgroundSandbox {
    confinement: Confinement,
    policy: SandboxPolicy,
    wrapped: bool,
}

/// A running background shell.
#[derive(Debug)]
struct Background {
    process: Arc<dyn Process>,
    confinement: Option<BackgroundSandbox>,
    kill: CancellationToken,
    kill_requested: AtomicBool,
    max_read: usize,
    cursor: Mutex<(u64, Vec<u8>)>,
    /// Set when the provider lost the process (its world went away): the job settles as
    /// lost with this error, instead of waiting forever or faking an exit.
    lost: Mutex<Option<ErrorBody>>,
    /// The lost note was handed to a consuming read (it is delivered once).
    lost_read: AtomicBool,
}

impl Background {
    fn new(
        process: Arc<dyn Process>,
        kill: CancellationToken,
        max_read: usize,
        confinement: Option<BackgroundSandbox>,
    ) -> Self {
        Self {
            process,
            confinement,
            kill,
            kill_requested: AtomicBool::new(false),
            max_read,
            cursor: Mutex::new((0, Vec::new())),
            lost: Mutex::new(None),
            lost_read: AtomicBool::new(false),
        }
    }

    fn lost(&self) -> Option<ErrorBody> {
        self.lost.locked().clone()
    }

    /// The note the output carries once the world was lost.
    fn lost_note(&self) -> Option<String> {
        self.lost().map(|b| {
            let code = b.code;
            format!("\n[{code}: {}]\n", Error::from_body(b))
        })
    }

    /// The sandbox's verdict on the settled process (`None` while it runs or unconfined).
    fn verdict(&self) -> Option<SandboxInfo> {
        let c = self.confinement.as_ref()?;
        let status = self.process.try_status()?;
        let text = self.process.collected(StreamId::Stdout).unwrap_or_default().text;
        Some(c.confinement.classify(&c.policy, &status, &text, c.wrapped))
    }

    /// The runner exited saying it could not confine the command (which never ran).
    fn runner_failed(&self) -> bool {
        self.verdict().is_some_and(|i| i.runner_failed())
    }
}

#[async_trait]
impl ShellProcess for Background {
    fn status(&self) -> ShellProcessStatus {
        if self.lost().is_some() {
            return ShellProcessStatus::Lost;
        }
        if self.runner_failed() {
            return ShellProcessStatus::Killed;
        }
        match self.process.try_status() {
            None => ShellProcessStatus::Running,
            Some(s)
                if s.signal.is_some()
                    || self.kill_requested.load(Ordering::Acquire) && s.code.is_none() =>
            {
                ShellProcessStatus::Killed
            }
            Some(_) => ShellProcessStatus::Completed,
        }
    }

    fn exit(&self) -> Option<ExitStatus> {
        self.process.try_status()
    }

    async fn wait(&self) {
        if let Err(e) = self.process.wait().await {
            *self.lost.locked() = Some(e.to_body());
        }
    }

    fn read_output(&self) -> ShellProcessRead {
        let mut cursor = self.cursor.locked();
        let (offset, carry) = &mut *cursor;
        let Ok(r) = self.process.read(StreamId::Stdout, *offset, self.max_read.max(1)) else {
            return ShellProcessRead::default();
        };
        let lossy = r.lossy;
        // A lossy read also drops the carried partial character from before the gap.
        let skipped_bytes =
            if lossy { r.start_offset.saturating_sub(*offset) + carry.len() as u64 } else { 0 };
        let mut bytes = if lossy { Vec::new() } else { std::mem::take(carry) };
        bytes.extend_from_slice(&r.data);
        *offset = r.next_offset;
        let cut = if r.sealed && self.process.try_status().is_some() {
            bytes.len()
        } else {
            split_utf8_carry(&bytes)
        };
        *carry = bytes.split_off(cut);
        let total = self
            .process
            .collected(StreamId::Stdout)
            .map(|c| c.total_bytes)
            .unwrap_or(r.next_offset);
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some(lost) = self.lost_note()
            && !self.lost_read.swap(true, Ordering::AcqRel)
        {
            text.push_str(&lost);
        }
        ShellProcessRead {
            text,
            lossy,
            skipped_bytes,
            spill: r.spill,
            spill_evicted: r.spill_evicted,
            total_bytes: total,
        }
    }

    fn snapshot(&self) -> ShellProcessRead {
        let c = self.process.collected(StreamId::Stdout).unwrap_or_default();
        let mut text = c.text;
        if let Some(lost) = self.lost_note() {
            text.push_str(&lost);
        }
        ShellProcessRead {
            lossy: c.omitted_bytes > 0,
            skipped_bytes: c.omitted_bytes,
            text,
            spill: c.spill,
            spill_evicted: c.spill_evicted,
            total_bytes: c.total_bytes,
        }
    }

    async fn kill(&self) -> Result<bool> {
        if self.process.try_status().is_some() {
            return Ok(false);
        }
        self.kill_requested.store(true, Ordering::Release);
        // Asked directly rather than through the spawn's cancel token, whose watcher can
        // only log a kill that could not be delivered; the token is cancelled too, so the
        // caller-token watcher of `start` ends.
        let delivered = self.process.kill().await;
        self.kill.cancel();
        delivered.map(|()| true)
    }

    fn sandbox(&self) -> Option<SandboxInfo> {
        let c = self.confinement.as_ref()?;
        Some(self.verdict().unwrap_or_else(|| SandboxInfo::new(c.policy.mode)))
    }

    fn leftovers(&self) -> Vec<Leftover> {
        self.process.leftovers()
    }

    fn world_lost(&self) -> Option<ErrorBody> {
        self.lost()
    }

    async fn release(&self) -> Result<()> {
        self.process.release().await
    }
}

/// A background start whose spawn (or sandbox runner) failed: already settled as killed,
/// error in the output.
#[derive(Debug)]
struct FailedStart {
    text: String,
    /// For a sandboxed start: the mode, with a runner-failed verdict.
    sandbox: Option<SandboxInfo>,
}

#[async_trait]
impl ShellProcess for FailedStart {
    fn status(&self) -> ShellProcessStatus {
        ShellProcessStatus::Killed
    }

    fn exit(&self) -> Option<ExitStatus> {
        None
    }

    async fn wait(&self) {}

    fn read_output(&self) -> ShellProcessRead {
        self.snapshot()
    }

    fn snapshot(&self) -> ShellProcessRead {
        ShellProcessRead {
            text: self.text.clone(),
            lossy: false,
            skipped_bytes: 0,
            spill: None,
            spill_evicted: false,
            total_bytes: self.text.len() as u64,
        }
    }

    async fn kill(&self) -> Result<bool> {
        Ok(false)
    }

    fn sandbox(&self) -> Option<SandboxInfo> {
        self.sandbox.clone()
    }

    fn leftovers(&self) -> Vec<Leftover> {
        Vec::new()
    }

    fn world_lost(&self) -> Option<ErrorBody> {
        None
    }

    async fn release(&self) -> Result<()> {
        Ok(())
    }
}

/// Declares a flavour's config: the [`Settings`] keys, with the executable under `$key`.
macro_rules! local_shell_config {
    ($(#[$meta:meta])* $name:ident, $key:ident, $default:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize, PartialEq, Eq)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            /// Default working directory (default: the subprocess provider's default
            /// directory).
            pub cwd: Option<std::path::PathBuf>,
            /// Default foreground timeout.
            pub timeout_ms: u64,
            /// Largest foreground timeout a caller may ask for.
            pub max_timeout_ms: u64,
            /// In-memory output tail.
            pub max_output_bytes: usize,
            /// Spill cap per stream.
            pub max_spill_bytes: u64,
            /// TERM → KILL grace.
            pub grace_ms: u64,
            /// How long processes the command left behind may run on after the shell exits
            /// before they are stopped and reported.
            pub drain_ms: u64,
            #[doc = concat!("The ", $default, " executable: a name looked up on the subprocess provider's PATH, or a path.")]
            pub $key: String,
            /// Longest command accepted, in bytes (at most
            /// [`crate::MAX_COMMAND_BYTES_LIMIT`]); a longer one is refused by `resolve` as
            /// `invalid_argument`.
            pub max_command_bytes: usize,
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    cwd: None,
                    timeout_ms: $crate::engine::DEFAULT_TIMEOUT_MS,
                    max_timeout_ms: 600_000,
                    max_output_bytes: 64_000,
                    max_spill_bytes: 64 * 1024 * 1024,
                    grace_ms: 3_000,
                    drain_ms: 250,
                    $key: $default.into(),
                    max_command_bytes: 1024 * 1024,
                }
            }
        }

        impl $name {
            /// The shared executor's settings.
            pub fn settings(&self) -> $crate::engine::Settings {
                $crate::engine::Settings {
                    cwd: self.cwd.clone(),
                    timeout_ms: self.timeout_ms,
                    max_timeout_ms: self.max_timeout_ms,
                    max_output_bytes: self.max_output_bytes,
                    max_spill_bytes: self.max_spill_bytes,
                    grace_ms: self.grace_ms,
                    drain_ms: self.drain_ms,
                    program: self.$key.clone(),
                    max_command_bytes: self.max_command_bytes,
                }
            }
        }

        impl conch_registry::PluginConfig for $name {
            fn validate(&self) -> std::result::Result<(), conch_registry::ConfigIssue> {
                self.settings().validate(stringify!($key))
            }
        }
    };
}

pub(crate) use local_shell_config;

/// Plugin factories shared by the flavours.
pub(crate) mod plugin {
    use std::sync::Arc;

    use conch_registry::{BuildContext, PluginOutput, SeamHandle};
    use conch_seams::{Error, ErrorCode, Result};

    use super::{Flavor, LocalShell, Settings};

    /// Builds `F::NAME` from its settings.
    pub(crate) fn build_local<F: Flavor>(
        ctx: &BuildContext<'_>,
        settings: Settings,
    ) -> Result<PluginOutput> {
        let exec = LocalShell::<F>::with_settings(settings, ctx.subprocess()?)
            .map_err(|e| ctx.locate(e))?;
        Ok(PluginOutput::seam(SeamHandle::Shell(Arc::new(exec))))
    }

    /// Builds `F::SANDBOX_NAME` from its settings and the composition's sandbox and policy.
    pub(crate) fn build_sandboxed<F: Flavor>(
        ctx: &BuildContext<'_>,
        settings: Settings,
    ) -> Result<PluginOutput> {
        let policy = ctx.sandbox_policy().ok_or_else(|| {
            ctx.locate(Error::new(
                ErrorCode::SeamUnbound,
                format!(
                    "{} needs the composition's `sandbox-policy` entry for its default policy",
                    F::SANDBOX_NAME
                ),
            ))
        })?;
        let exec = LocalShell::<F>::with_settings_sandboxed(
            settings,
            ctx.subprocess()?,
            ctx.sandbox_required()?,
            policy.as_ref().clone(),
        )
        .map_err(|e| ctx.locate(e))?;
        Ok(PluginOutput::seam(SeamHandle::Shell(Arc::new(exec))))
    }
}

/// How often a foreground run reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Aborts the progress reporter when the run ends.
struct ProgressReporter(tokio::task::JoinHandle<()>);

impl Drop for ProgressReporter {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports `process`'s elapsed time and output bytes so far to `sink`, now and every
/// [`PROGRESS_EVERY`], until the returned guard is dropped.
fn report_progress(
    sink: Arc<dyn conch_seams::ProgressSink>,
    process: &Arc<dyn Process>,
) -> ProgressReporter {
    let process = Arc::clone(process);
    let started = std::time::Instant::now();
    ProgressReporter(tokio::spawn(async move {
        let mut every = tokio::time::interval(PROGRESS_EVERY);
        loop {
            every.tick().await;
            let bytes = process.collected(StreamId::Stdout).map_or(0, |c| c.total_bytes);
            sink.progress(conch_seams::Progress {
                elapsed: started.elapsed(),
                output_bytes: bytes,
                message: None,
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_carry_holds_back_only_incomplete_sequences() {
        let s = "aé€😀".as_bytes();
        assert_eq!(split_utf8_carry(s), s.len());
        assert_eq!(split_utf8_carry(&s[..s.len() - 1]), s.len() - 4);
        assert_eq!(split_utf8_carry(&s[..2]), 1);
        assert_eq!(split_utf8_carry(b""), 0);
    }
}
