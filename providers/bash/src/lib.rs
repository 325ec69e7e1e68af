//! `bash-local`: the shell seam as `bash -c` over the subprocess seam, with model-friendly
//! terminal overrides, fused timeout/abort, and background handles that never fail.
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
    AfterExit, CollectedOutput, ConfigIssue, Error, ExitStatus, Leftover, OutputSpec, PluginConfig,
    Process, Result, SandboxInfo, ShellCapabilities, ShellDialect, ShellExecRequest, ShellExecSpec,
    ShellExecutor, ShellProcess, ShellProcessRead, ShellProcessStatus, ShellRunResult, SpawnSpec,
    StdinSpec, StreamId, Subprocess,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Plugin name.
pub const NAME: &str = "bash-local";

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

/// The bash-local executor.
#[derive(Debug)]
pub struct BashLocal {
    config: BashLocalConfig,
    subprocess: Arc<dyn Subprocess>,
}

impl BashLocal {
    /// An executor over a subprocess provider.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: BashLocalConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        config.check(NAME)?;
        Ok(Self { config, subprocess })
    }

    /// The argv that runs `command`, see [`bash_argv`] (protected-style hook for wrapping
    /// executors).
    pub fn argv(&self, command: &str) -> Vec<String> {
        bash_argv(&self.config.bash, command)
    }

    fn spawn_spec(&self, spec: &ShellExecSpec, kill: CancellationToken) -> SpawnSpec {
        SpawnSpec::in_default_dir(self.argv(&spec.command))
            .with_cwd(spec.cwd.clone())
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
            })
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
        NAME
    }

    fn capabilities(&self) -> ShellCapabilities {
        ShellCapabilities::default()
    }

    fn dialect(&self) -> ShellDialect {
        ShellDialect::BASH
    }

    fn resolve(&self, request: ShellExecRequest) -> Result<ShellExecSpec> {
        if request.command.trim().is_empty() {
            return Err(Error::invalid("command is empty")
                .with_provider(NAME)
                .with_operation("resolve"));
        }
        let (len, cap) = (request.command.len(), self.config.max_command_bytes);
        if len > cap {
            return Err(Error::invalid(format!(
                "command is {len} bytes; the limit is {cap} ({NAME} max_command_bytes)"
            ))
            .with_provider(NAME)
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
                return Err(Error::invalid("timeout_ms must be greater than 0").with_provider(NAME));
            }
            Some(t) => t.min(self.config.max_timeout_ms),
            None => self.config.timeout_ms,
        };
        let mut env: conch_seams::EnvOverlay =
            ENV_OVERRIDES.iter().map(|(k, v)| ((*k).to_string(), Some((*v).to_string()))).collect();
        env.extend(request.env);
        // The trusted managed snapshot is applied last so a caller cannot spoof CONCH_*.
        env.extend(request.managed_env.into_iter().map(|(k, v)| (k, Some(v))));
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
        })
    }

    async fn run(&self, spec: ShellExecSpec) -> Result<ShellRunResult> {
        let kill = CancellationToken::new();
        let mut sspec = self.spawn_spec(&spec, kill.clone());
        sspec.env = spec.env.clone();
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
        let process = self.subprocess.spawn(sspec).await?;
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
        Ok(ShellRunResult {
            status,
            timed_out: cause == Cause::Timeout,
            aborted: cause == Cause::Abort,
            timeout_ms: spec.timeout.as_millis() as u64,
            output: process.collected(StreamId::Stdout).unwrap_or_default(),
            sandbox: None,
            leftovers: process.leftovers(),
        })
    }

    async fn start(&self, spec: ShellExecSpec) -> Arc<dyn ShellProcess> {
        let kill = CancellationToken::new();
        let mut sspec = self.spawn_spec(&spec, kill.clone());
        sspec.env = spec.env.clone();
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
            Ok(process) => Arc::new(Background::new(process, kill, spec.output_max_bytes)),
            Err(e) => Arc::new(FailedStart { text: format!("{e}\n") }),
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

/// A running background bash.
#[derive(Debug)]
struct Background {
    process: Arc<dyn Process>,
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
    fn new(process: Arc<dyn Process>, kill: CancellationToken, max_read: usize) -> Self {
        Self {
            process,
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
}

#[async_trait]
impl ShellProcess for Background {
    fn status(&self) -> ShellProcessStatus {
        if self.lost().is_some() {
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
        None
    }

    fn leftovers(&self) -> Vec<Leftover> {
        self.process.leftovers()
    }

    fn release(&self) {
        self.process.release();
    }
}

/// A background start whose spawn failed: already settled as killed, error in the output.
#[derive(Debug)]
struct FailedStart {
    text: String,
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
        None
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
    fn config_validation_names_the_key() {
        let c = BashLocalConfig { max_timeout_ms: 10, ..BashLocalConfig::default() };
        let err = c.check(NAME).unwrap_err();
        assert_eq!(err.code(), conch_seams::ErrorCode::InvalidComposition);
        assert!(err.message().contains("max_timeout_ms"), "{err}");
    }
}
