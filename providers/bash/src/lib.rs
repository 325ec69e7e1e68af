//! `bash-local`: the shell seam as `bash -c` over the subprocess seam, with model-friendly
//! terminal overrides, fused timeout/abort, and background handles that never fail.
//!
//! `bash-sandbox` is the same executor with its command line wrapped through the sandbox
//! seam under a per-call policy (one code path: the wrap is an optional step before the
//! spawn), reporting what the sandbox did with every result.
//!
//! A command longer than one argv string may be (Linux refuses a longer one with E2BIG) goes
//! to bash in several argv strings and a fixed loader joins and evals them, so the argv stays
//! the only channel and works for any subprocess provider, remote ones included.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    AfterExit, CollectedOutput, CommandLine, ConfigIssue, Error, ErrorCode, ErrorReason,
    ExitStatus, Leftover, OutputSpec, PluginConfig, Process, Result, Sandbox, SandboxInfo,
    SandboxMode, SandboxPolicy, SandboxRelease, ShellCapabilities, ShellDialect, ShellExecRequest,
    ShellExecSpec, ShellExecutor, ShellProcess, ShellProcessRead, ShellProcessStatus,
    ShellRunResult, SpawnSpec, StdinSpec, StreamId, Subprocess,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Plugin name.
pub const NAME: &str = "bash-local";

/// Plugin name of the sandboxed variant.
pub const SANDBOX_NAME: &str = "bash-sandbox";

/// How much of a result's output tail a sandbox classifier sees.
const CLASSIFY_TAIL_BYTES: usize = 4096;

/// Variables that keep tool output free of colour and pagers; the caller's env and the
/// managed snapshot are layered on top of these.
pub const ENV_OVERRIDES: &[(&str, &str)] =
    &[("NO_COLOR", "1"), ("TERM", "dumb"), ("PAGER", "cat"), ("GIT_PAGER", "cat")];

/// The longest argv string Linux accepts: MAX_ARG_STRLEN is 32 pages (at least 4 KiB each)
/// and counts the terminating NUL. A command up to this length runs as plain `bash -c`.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;

/// The largest `max_command_bytes` accepted: the command, its loader and the environment
/// share ARG_MAX (2 MiB with the usual 8 MiB stack), so the cap stays well below it.
pub const MAX_COMMAND_BYTES_LIMIT: usize = 1536 * 1024;

/// Runs a command that came in chunks as `"$@"` the way `bash -c` would have run it whole:
/// - `$_` is read first, before any command of ours changes it, and replayed by `:` as the
///   last simple command before the user's, quoted by `%q` so `eval` restores it exactly;
/// - `printf -v` joins the chunks unchanged and `set --` clears them, so `$#` is 0 (`$0` is
///   the bash name passed after the loader, as `bash -c` sets it);
/// - the text is expanded once into `eval`'s argument, expansion results are never rescanned,
///   and `eval` parses it once, command by command like a `-c` string (lines count from 1);
/// - `BASH_EXECUTION_STRING` is set to the text, and the first thing `eval` runs unsets both
///   helpers, before any of the user's commands.
///
/// Differences left: a syntax error is reported as `eval: line N` instead of `-c: line N`, and
/// bash forks the last command instead of replacing itself with it (so a last command killed
/// by a signal shows as bash's exit code 128+N).
const LOADER: &str = concat!(
    r#"printf -v __conch_u %q "$_"; printf -v __conch_c %s "$@"; set --; "#,
    r#"eval "BASH_EXECUTION_STRING=\$__conch_c; unset __conch_c __conch_u; : $__conch_u; $__conch_c""#,
);

/// The argv that runs `command` with `bash` exactly as `bash -c <command>` would: that argv
/// itself when the command fits one argv string, else the loader over chunks of at most
/// [`MAX_ARG_BYTES`], cut on char boundaries (argv strings are UTF-8 here).
pub fn bash_argv(bash: &str, command: &str) -> Vec<String> {
    if command.len() <= MAX_ARG_BYTES {
        return vec![bash.into(), "-c".into(), command.into()];
    }
    let mut argv = vec![bash.into(), "-c".into(), LOADER.into(), bash.into()];
    let mut rest = command;
    while !rest.is_empty() {
        let mut end = rest.len().min(MAX_ARG_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, tail) = rest.split_at(end);
        argv.push(chunk.into());
        rest = tail;
    }
    argv
}

/// bash-local config.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BashLocalConfig {
    /// Default working directory (default: the process cwd).
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
    /// How long processes the command left behind (`cmd &`) may run on after bash exits
    /// before they are stopped and reported.
    pub drain_ms: u64,
    /// The bash executable.
    pub bash: String,
    /// Longest command accepted, in bytes (at most [`MAX_COMMAND_BYTES_LIMIT`]); a longer one
    /// is refused by `resolve` as `invalid_argument`.
    pub max_command_bytes: usize,
}

impl Default for BashLocalConfig {
    fn default() -> Self {
        Self {
            cwd: None,
            timeout_ms: 120_000,
            max_timeout_ms: 600_000,
            max_output_bytes: 64_000,
            max_spill_bytes: 64 * 1024 * 1024,
            grace_ms: 3_000,
            drain_ms: 250,
            bash: "bash".into(),
            max_command_bytes: 1024 * 1024,
        }
    }
}

impl PluginConfig for BashLocalConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("timeout_ms", self.timeout_ms)?;
        if self.max_timeout_ms < self.timeout_ms {
            return Err(ConfigIssue::new("max_timeout_ms", "must be at least timeout_ms"));
        }
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
        if self.bash.is_empty() {
            return Err(ConfigIssue::new("bash", "must name an executable"));
        }
        Ok(())
    }
}

/// A sandbox and the default policy its calls run under.
#[derive(Debug, Clone)]
struct Confinement {
    sandbox: Arc<dyn Sandbox>,
    policy: SandboxPolicy,
}

/// The bash-local executor, and with a sandbox bound, bash-sandbox.
#[derive(Debug)]
pub struct BashLocal {
    config: BashLocalConfig,
    subprocess: Arc<dyn Subprocess>,
    confinement: Option<Confinement>,
}

/// A command line ready to spawn, and whether a sandbox runner stands in front of it.
struct Prepared {
    command: CommandLine,
    wrapped: bool,
    /// Frees what the runner made for this command once it is dropped (held while the
    /// command may run).
    release: Option<SandboxRelease>,
}

/// The tail of `text` a classifier sees, cut on a char boundary.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(CLASSIFY_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The foreground error for a runner that refused to confine: the command never ran, so
/// all it printed is the runner's own explanation.
fn runner_refused(output: &str) -> Error {
    unavailable(format!(
        "the sandbox runner could not confine the command (it did not run): {}",
        output.trim()
    ))
}

fn unavailable(message: String) -> Error {
    Error::new(ErrorCode::SandboxUnavailable, message)
        .with_provider(SANDBOX_NAME)
        .with_operation("run")
}

impl BashLocal {
    /// An executor over a subprocess provider.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: BashLocalConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        config.check(NAME)?;
        Ok(Self { config, subprocess, confinement: None })
    }

    /// bash-sandbox: the same executor with every command line wrapped by `sandbox` under a
    /// per-call policy, `policy` unless a request overrides its mode.
    ///
    /// # Errors
    /// Invalid config.
    pub fn sandboxed(
        config: BashLocalConfig,
        subprocess: Arc<dyn Subprocess>,
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
    ) -> Result<Self> {
        config.check(SANDBOX_NAME)?;
        Ok(Self { config, subprocess, confinement: Some(Confinement { sandbox, policy }) })
    }

    fn name(&self) -> &'static str {
        if self.confinement.is_some() { SANDBOX_NAME } else { NAME }
    }

    /// The policy a spec runs under; a sandboxed executor never runs a spec without one
    /// (a spec missing it gets the default, never no confinement).
    fn policy_of(&self, spec: &ShellExecSpec) -> Option<(Arc<dyn Sandbox>, SandboxPolicy)> {
        self.confinement.as_ref().map(|c| {
            (Arc::clone(&c.sandbox), spec.sandbox.clone().unwrap_or_else(|| c.policy.clone()))
        })
    }

    /// The command line for `spec`, wrapped when a sandbox is bound.
    ///
    /// # Errors
    /// The sandbox's wrap error, as `sandbox_unavailable`.
    fn prepare(&self, spec: &ShellExecSpec) -> Result<Prepared> {
        let command = CommandLine::new(self.argv(&spec.command))
            .with_cwd(spec.cwd.clone())
            .with_env(spec.env.clone());
        let Some((sandbox, policy)) = self.policy_of(spec) else {
            return Ok(Prepared { command, wrapped: false, release: None });
        };
        let original = command.argv.clone();
        let command = sandbox.wrap(&policy, command).map_err(|e| {
            if e.code() == ErrorCode::SandboxUnavailable {
                e
            } else {
                unavailable(format!(
                    "{} cannot run this command under {} mode: {e}",
                    sandbox.provider_name(),
                    policy.mode
                ))
            }
        })?;
        // Only a command line with a runner in front can fail as a runner; one passed through
        // unchanged (danger-full-access) fails the way bash-local's would.
        let wrapped = command.argv != original;
        let release = Some(SandboxRelease::new(sandbox, command.clone()));
        Ok(Prepared { command, wrapped, release })
    }

    /// The argv that runs `command`, see [`bash_argv`] (protected-style hook for wrapping
    /// executors).
    pub fn argv(&self, command: &str) -> Vec<String> {
        bash_argv(&self.config.bash, command)
    }

    fn spawn_spec(
        &self,
        spec: &ShellExecSpec,
        command: CommandLine,
        kill: CancellationToken,
    ) -> SpawnSpec {
        let mut sspec = SpawnSpec::in_default_dir(command.argv)
            .with_cwd(command.cwd)
            .with_stdin(spec.stdin.clone().map_or(StdinSpec::Null, StdinSpec::bytes))
            .with_stdout(OutputSpec::Collect {
                max_bytes: spec.output_max_bytes,
                spill_cap: spec.spill_cap,
            })
            .with_stderr(OutputSpec::MergeIntoStdout)
            .with_grace(spec.grace)
            .with_cancel(kill)
            .with_after_exit(AfterExit::StopLeftovers {
                drain: Duration::from_millis(self.config.drain_ms),
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
impl ShellExecutor for BashLocal {
    fn provider_name(&self) -> &'static str {
        self.name()
    }

    fn capabilities(&self) -> ShellCapabilities {
        let mut caps = ShellCapabilities::default();
        caps.sandboxed = self.confinement.is_some();
        caps.pid_isolated = self
            .confinement
            .as_ref()
            .is_some_and(|c| c.policy.mode.confines() && c.sandbox.capabilities().pid_isolation);
        caps
    }

    fn sandbox_mode(&self) -> Option<SandboxMode> {
        self.confinement.as_ref().map(|c| c.policy.mode)
    }

    fn dialect(&self) -> ShellDialect {
        ShellDialect::BASH
    }

    fn resolve(&self, request: ShellExecRequest) -> Result<ShellExecSpec> {
        if request.command.trim().is_empty() {
            return Err(Error::invalid("command is empty")
                .with_provider(self.name())
                .with_operation("resolve"));
        }
        let (len, cap) = (request.command.len(), self.config.max_command_bytes);
        if len > cap {
            return Err(Error::invalid(format!(
                "command is {len} bytes; the limit is {cap} ({} max_command_bytes)",
                self.name()
            ))
            .with_provider(self.name())
            .with_operation("resolve"));
        }
        // No filesystem facts here: the subprocess provider checks the directory in its own
        // world and resolves what is still relative against its default directory.
        let cwd = match (request.workdir, &self.config.cwd) {
            (Some(w), Some(base)) if w.is_relative() => Some(base.join(w)),
            (Some(w), _) => Some(w),
            (None, base) => base.clone(),
        };
        let timeout_ms = match request.timeout_ms {
            Some(0) => {
                return Err(
                    Error::invalid("timeout_ms must be greater than 0").with_provider(self.name())
                );
            }
            Some(t) => t.min(self.config.max_timeout_ms),
            None => self.config.timeout_ms,
        };
        let mut env: conch_seams::EnvOverlay =
            ENV_OVERRIDES.iter().map(|(k, v)| ((*k).to_string(), Some((*v).to_string()))).collect();
        env.extend(request.env);
        // The trusted managed snapshot is applied last so a caller cannot spoof CONCH_*.
        env.extend(request.managed_env.into_iter().map(|(k, v)| (k, Some(v))));
        // The complete per-call policy: the composition's default, with the mode a request
        // may override (the bash tool does so only for an approved escalation).
        let sandbox = match (&self.confinement, request.sandbox_mode) {
            (Some(c), mode) => {
                let mut policy = c.policy.clone();
                if let Some(mode) = mode {
                    policy.mode = mode;
                }
                Some(policy)
            }
            (None, Some(mode)) if mode.confines() => {
                return Err(Error::new(
                    ErrorCode::Unsupported,
                    format!("{NAME} confines nothing; it cannot run a command under {mode} mode"),
                )
                .with_provider(NAME)
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
                .unwrap_or(self.config.max_output_bytes)
                .max(1),
            spill_cap: self.config.max_spill_bytes,
            grace: Duration::from_millis(self.config.grace_ms),
            stdin: request.stdin,
            env,
            cancel: request.cancel.unwrap_or_default(),
            sandbox,
        })
    }

    async fn run(&self, spec: ShellExecSpec) -> Result<ShellRunResult> {
        let kill = CancellationToken::new();
        let prepared = self.prepare(&spec)?;
        let wrapped = prepared.wrapped;
        // Dropped when this call ends, every path: the command has settled (or never ran).
        let _release = prepared.release;
        let sspec = self.spawn_spec(&spec, prepared.command, kill.clone());
        if spec.cancel.is_cancelled() {
            return Ok(ShellRunResult {
                status: ExitStatus::default(),
                timed_out: false,
                aborted: true,
                timeout_ms: spec.timeout.as_millis() as u64,
                output: CollectedOutput::default(),
                sandbox: None,
                leftovers: Vec::new(),
            });
        }
        let process = match self.subprocess.spawn(sspec).await {
            Ok(p) => p,
            // A missing workdir is the caller's mistake wherever the command runs.
            Err(e) if wrapped && e.reason() != Some(ErrorReason::MissingWorkdir) => {
                return Err(unavailable(format!("the sandbox runner could not be launched: {e}")));
            }
            Err(e) => return Err(e),
        };
        // One fused deadline: whichever of exit, timeout and abort fires first is the cause.
        // Only bash's own exit counts: output held open by its leftovers must not hold the
        // call until the timeout.
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
        let sandbox = match self.policy_of(&spec) {
            Some((sandbox, policy)) => {
                // Whether the runner refused is the sandbox's to judge: its exit protocol is
                // its own (the helper's fail-closed line, bwrap's setup errors).
                let info = sandbox.classify(&policy, &status, tail(&output.text));
                if wrapped && info.runner_failed {
                    return Err(runner_refused(&output.text));
                }
                Some(info)
            }
            None => None,
        };
        Ok(ShellRunResult {
            status,
            timed_out: cause == Cause::Timeout,
            aborted: cause == Cause::Abort,
            timeout_ms: spec.timeout.as_millis() as u64,
            output,
            sandbox,
            leftovers: process.leftovers(),
        })
    }

    async fn start(&self, spec: ShellExecSpec) -> Arc<dyn ShellProcess> {
        let kill = CancellationToken::new();
        let confinement = self.policy_of(&spec);
        let runner_failed = |text: String| -> Arc<dyn ShellProcess> {
            let info = confinement.as_ref().map(|(_, p)| {
                let mut info = SandboxInfo::new(p.mode);
                info.runner_failed = true;
                info
            });
            Arc::new(FailedStart { text, sandbox: info })
        };
        let prepared = match self.prepare(&spec) {
            Ok(p) => p,
            Err(e) => return runner_failed(format!("{e}\n")),
        };
        let wrapped = prepared.wrapped;
        let release = prepared.release;
        let sspec = self.spawn_spec(&spec, prepared.command, kill.clone());
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
                    confinement.map(|(sandbox, policy)| BackgroundSandbox {
                        sandbox,
                        policy,
                        wrapped,
                    }),
                ))
            }
            Err(e) if wrapped && e.reason() != Some(ErrorReason::MissingWorkdir) => {
                runner_failed(format!(
                    "{}\n",
                    unavailable(format!("the sandbox runner could not be launched: {e}"))
                ))
            }
            Err(e) => Arc::new(FailedStart { text: format!("{e}\n"), sandbox: None }),
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

/// The sandbox a background bash runs in.
#[derive(Debug)]
struct BackgroundSandbox {
    sandbox: Arc<dyn Sandbox>,
    policy: SandboxPolicy,
    wrapped: bool,
}

/// A running background bash.
#[derive(Debug)]
struct Background {
    process: Arc<dyn Process>,
    confinement: Option<BackgroundSandbox>,
    kill: CancellationToken,
    kill_requested: AtomicBool,
    max_read: usize,
    cursor: Mutex<(u64, Vec<u8>)>,
    /// Set when the provider lost the process (its world went away): the job settles as
    /// killed with this text, instead of waiting forever or faking an exit.
    lost: Mutex<Option<String>>,
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

    fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The sandbox's verdict on the settled process (`None` while it runs or unconfined).
    fn verdict(&self) -> Option<SandboxInfo> {
        let c = self.confinement.as_ref()?;
        let status = self.process.try_status()?;
        let text = self.process.collected(StreamId::Stdout).unwrap_or_default().text;
        let mut info = c.sandbox.classify(&c.policy, &status, tail(&text));
        // Only a runner that was actually put in front can have refused.
        info.runner_failed &= c.wrapped;
        Some(info)
    }

    /// The runner exited saying it could not confine the command (which never ran).
    fn runner_failed(&self) -> bool {
        self.verdict().is_some_and(|i| i.runner_failed)
    }
}

#[async_trait]
impl ShellProcess for Background {
    fn status(&self) -> ShellProcessStatus {
        if self.lost().is_some() || self.runner_failed() {
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
            *self.lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("\n[{e}]\n"));
        }
    }

    fn read_output(&self) -> ShellProcessRead {
        let mut cursor = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
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
        if let Some(lost) = self.lost()
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
        if let Some(lost) = self.lost() {
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

    fn kill(&self) -> bool {
        if self.process.try_status().is_some() {
            return false;
        }
        self.kill_requested.store(true, Ordering::Release);
        self.kill.cancel();
        true
    }

    fn sandbox(&self) -> Option<SandboxInfo> {
        let c = self.confinement.as_ref()?;
        Some(self.verdict().unwrap_or_else(|| SandboxInfo::new(c.policy.mode)))
    }

    fn leftovers(&self) -> Vec<Leftover> {
        self.process.leftovers()
    }

    fn release(&self) {
        self.process.release();
    }
}

/// A background start whose spawn (or sandbox runner) failed: already settled as killed,
/// error in the output.
#[derive(Debug)]
struct FailedStart {
    text: String,
    /// For a sandboxed start: the mode, with `runner_failed`.
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

    fn kill(&self) -> bool {
        false
    }

    fn sandbox(&self) -> Option<SandboxInfo> {
        self.sandbox.clone()
    }

    fn leftovers(&self) -> Vec<Leftover> {
        Vec::new()
    }

    fn release(&self) {}
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BashLocalConfig = ctx.config()?;
    let exec = BashLocal::new(config, ctx.subprocess()?).map_err(|e| ctx.locate(e))?;
    Ok(PluginOutput::seam(SeamHandle::Shell(Arc::new(exec))))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess],
    description: "bash -c over the subprocess seam",
    build,
});

fn build_sandboxed(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BashLocalConfig = ctx.config()?;
    let policy = ctx.sandbox_policy().ok_or_else(|| {
        ctx.locate(Error::new(
            ErrorCode::SeamUnbound,
            format!("{SANDBOX_NAME} needs the sandbox-policy plugin for its default policy"),
        ))
    })?;
    let exec = BashLocal::sandboxed(
        config,
        ctx.subprocess()?,
        ctx.sandbox_required()?,
        policy.as_ref().clone(),
    )
    .map_err(|e| ctx.locate(e))?;
    Ok(PluginOutput::seam(SeamHandle::Shell(Arc::new(exec))))
}

register_plugin!(PluginEntry {
    name: SANDBOX_NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess, SeamId::Sandbox, SeamId::SandboxPolicy],
    description: "bash-local with every command line wrapped through the sandbox seam",
    build: build_sandboxed,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

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

    #[test]
    fn a_command_that_fits_one_argv_string_keeps_the_plain_argv() {
        let cmd = "x".repeat(MAX_ARG_BYTES);
        assert_eq!(bash_argv("bash", &cmd), ["bash", "-c", cmd.as_str()]);
    }

    #[test]
    fn a_longer_command_is_cut_into_strings_that_fit_on_char_boundaries() {
        // One ASCII byte first, so the 4-byte chars straddle every cut at MAX_ARG_BYTES.
        let cmd = format!("x{}", "😀".repeat(MAX_ARG_BYTES / 2));
        let argv = bash_argv("/bin/bash", &cmd);
        assert_eq!(argv[..4], ["/bin/bash", "-c", LOADER, "/bin/bash"], "$0 is the bash name");
        let chunks = &argv[4..];
        assert!(chunks.len() > 1 && chunks.iter().all(|c| c.len() <= MAX_ARG_BYTES));
        assert!(chunks.iter().any(|c| c.len() < MAX_ARG_BYTES), "a cut moved off a char");
        assert_eq!(chunks.concat(), cmd);
        let cmd = "y".repeat(MAX_ARG_BYTES + 1);
        assert_eq!(bash_argv("bash", &cmd)[4..].concat(), cmd);
    }

    #[test]
    fn max_command_bytes_stays_well_below_arg_max() {
        let at = |max_command_bytes| BashLocalConfig { max_command_bytes, ..Default::default() };
        assert_eq!(at(MAX_COMMAND_BYTES_LIMIT).check(NAME).map_err(|e| e.to_string()), Ok(()));
        for bad in [0, MAX_COMMAND_BYTES_LIMIT + 1] {
            let err = at(bad).check(NAME).unwrap_err();
            assert!(err.message().contains("max_command_bytes"), "{err}");
        }
    }

    #[test]
    fn a_refused_runner_is_reported_with_its_own_line() {
        // Which exits are refusals is the sandbox's verdict (`classify`, tested with the
        // runners); the executor reports the runner's line as its error.
        let line = "conch-sandbox: unavailable: landlock is not enabled in this kernel";
        let e = runner_refused(&format!("{line}\n"));
        assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
        assert!(e.message().ends_with(line), "{e}");
    }

    #[test]
    fn the_classifier_tail_is_cut_on_a_char_boundary() {
        let text = format!("é{}", "x".repeat(CLASSIFY_TAIL_BYTES - 1));
        assert_eq!(tail(&text).len(), CLASSIFY_TAIL_BYTES - 1);
        assert_eq!(tail("short"), "short");
    }

    #[test]
    fn config_validation_names_the_key() {
        let c = BashLocalConfig { max_timeout_ms: 10, ..BashLocalConfig::default() };
        let err = c.check(NAME).unwrap_err();
        assert_eq!(err.code(), conch_seams::ErrorCode::InvalidComposition);
        assert!(err.message().contains("max_timeout_ms"), "{err}");
    }
}
