//! `terminal-bash`: the terminal backend. Starts a shell on a PTY with a controlled startup
//! (no rc files or profile, a private OSC prompt marker, history expansion off, a UTF-8
//! locale when the environment names none: see `LOCALE_START` and
//! `conch_dialect::bash::prompt_command`) and answers each send with a
//! readiness result: prompt or exact stdin-wait probe (stdin_read), output silence
//! (inferred_idle), deadline (timeout), or shell exit (session_exit).
//!
//! The shell is bash by default; `shell_dialect: pwsh` starts PowerShell 7 instead
//! (`pwsh -NoLogo -NoProfile -NoExit`, with the startup script of
//! `conch_dialect::pwsh::session_script`),
//! whose sessions also answer cursor position requests, since .NET asks for the cursor
//! before every prompt and would otherwise wait up to a second (ten the first time) for a
//! terminal that never answers.
//!
//! bash sessions get a real TERM (`term`, `xterm-256color` by default, or the one asked for
//! at open) and a size (`rows` × `cols`, or the one asked for at open, changed later by
//! [`TerminalSession::resize`]); what programs draw is read back line by line or as the
//! screen (see `session.rs`).
//!
//! When the composition binds a sandbox, the shell's whole command line (argv, cwd, env) is
//! wrapped through it under the composition's default policy (its `sandbox-policy` entry) before
//! the PTY spawn, so the session and everything typed into it run confined, in a mode fixed for
//! the session's lifetime.
//!
//! bash runs as `bash --norc --noprofile +H -i` with a private OSC marker (`OSC 7770;<nonce> BEL`)
//! in PS1, re-asserted by PROMPT_COMMAND. With `shell_dialect: pwsh` it starts `pwsh -NoLogo
//! -NoProfile -NoExit -EncodedCommand <conch_dialect::pwsh::session_script>` instead: PSReadLine
//! removed, a `PSConsoleHostReadLine` reading with .NET's `Console.In.ReadLine()` (one echo per
//! typed character), a `prompt` function that ends a pending frame and prints the marker, and
//! `__conch_f`, which frames a command typed as ` . __conch_f '<nonce>' '<base64>'` (each
//! dialect's framing text comes from `conch_dialect`). pwsh sessions answer cursor position
//! requests (`parser.rs` follows the printed text's column; the pump writes the answer, and Tier 1
//! waits while one is in flight), because .NET asks before every prompt; pwsh runs commands in its
//! own process group, so a signal while it is busy counts as a command's, and an interrupt repeats
//! its SIGINT until the prompt is back.
//!
//! When the composition binds a sandbox (and then a `sandbox-policy`, or the build fails naming
//! it), the shell's `{argv, cwd, env}` is wrapped through `conch_confine::Confinement` (the
//! protocol it shares with the shell executors) before `spawn_terminal`, so the whole session
//! runs confined in a mode fixed at open (`TerminalSession::sandbox_mode`, shown by
//! `terminal_open` and `terminal_list` as `sandbox`, null when unconfined); a wrap error, or a
//! startup exit of the runner that the sandbox's `classify` calls a runner failure, fails the
//! open as `sandbox_unavailable`. A spawn error stays the subprocess provider's. Under
//! `sandbox-bwrap` bash cannot see the session's process group from inside the pid namespace and
//! leads a group of its own; subprocess-local's PTY still counts it as the shell's (a group whose
//! leader descends from the session leader only through processes of the leader's group, i.e. the
//! runner), so Tier 0 and the signal guards hold.
//!
//! A send is a `SendRequest` (`#[non_exhaustive]`: text, keys, submit, timeout,
//! ignore_silence, wait_for, max_output_bytes, progress); the session runs over
//! `TerminalProcess`, so the request never crosses the remote wire.

mod framing;
mod input;
mod parser;
mod scrollback;
mod session;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conch_confine::{ConfinedSubject, Confinement, SandboxRelease};
use conch_dialect::pwsh;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{
    CommandLine, Dialect, Error, ErrorCode, ErrorReason, Result, Sandbox, SandboxPolicy,
    Subprocess, TerminalBackend, TerminalOpenSpec, TerminalSession, TerminalSize,
    TerminalSpawnSpec,
};
use conch_sync::LockExt;
use serde::Deserialize;

/// Plugin name.
pub const NAME: &str = "terminal-bash";

/// OSC number of the private prompt marker.
const MARKER_OSC: &str = "7770";

/// How a bash session starts (`bash --norc --noprofile -c LOCALE_START bash`): when the
/// environment names no locale (MCP clients start servers without `LANG`), it picks the
/// first UTF-8 locale the shell's world has, tested by setting it and measuring a
/// two-byte character (one character only under UTF-8), so non-ASCII text is text, not
/// octal escapes and line-editor redraws. C.UTF-8 is built into glibc 2.35 and later and
/// into musl; `C.utf8` is its other spelling; en_US.UTF-8 is the last resort. An explicit
/// `LANG`, `LC_CTYPE` or `LC_ALL` is kept. Then it execs the interactive shell in the same
/// process (the session's leader stays the same pid).
const LOCALE_START: &str = concat!(
    "if [[ -z ${LC_ALL-}${LC_CTYPE-}${LANG-} ]]; then ",
    "for l in C.UTF-8 C.utf8 en_US.UTF-8; do { LC_CTYPE=$l; } 2>/dev/null; x=$'\\xc3\\xa9'; ",
    "if [[ ${#x} == 1 ]]; then export LANG=$l; break; fi; done; unset LC_CTYPE x l; fi\n",
    // +H: no history expansion, so a `!` typed is a `!` from the first prompt on.
    "exec \"$0\" --norc --noprofile +H -i",
);
/// Columns of a session opened with no size (the [`TerminalSize`] default).
pub(crate) const DEFAULT_COLS: u16 = 200;
/// The largest rows or columns a session may have (the screen model holds rows × columns
/// cells).
pub const MAX_SIZE: u16 = 1000;

/// Validated backend config (all timings in milliseconds).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TerminalShellConfig {
    /// How often readiness is re-checked.
    pub poll_interval_ms: u64,
    /// Earliest exact stdin-wait probe after a send (probes then follow output quiet).
    pub exact_probe_after_ms: u64,
    /// Output silence, with the foreground not busy on the CPU, that counts as inferred idle.
    pub idle_silence_ms: u64,
    /// Absolute per-send (and startup) deadline.
    pub timeout_ms: u64,
    /// Grace between TERM/HUP and KILL at close.
    pub dispose_grace_ms: u64,
    /// Retained scrollback lines.
    pub scrollback_lines: usize,
    /// Retained scrollback bytes.
    pub scrollback_max_bytes: usize,
    /// Largest delta or page returned.
    pub max_read_bytes: usize,
    /// The bash executable.
    pub bash: String,
    /// Default working directory (default: the subprocess provider's default directory).
    pub cwd: Option<PathBuf>,
    /// The shell sessions run: `bash` or `pwsh` (PowerShell 7).
    pub shell_dialect: Dialect,
    /// The pwsh executable (`shell_dialect: pwsh`): a name looked up on the provider's PATH,
    /// or a path.
    pub pwsh: String,
    /// The TERM bash sessions get (a terminfo name; pwsh sessions keep `dumb`, which their
    /// line reading relies on).
    pub term: String,
    /// Rows of a session opened without a size.
    pub rows: u16,
    /// Columns of a session opened without a size.
    pub cols: u16,
}

impl Default for TerminalShellConfig {
    fn default() -> Self {
        Self {
            poll_interval_ms: 50,
            exact_probe_after_ms: 0,
            idle_silence_ms: 3000,
            timeout_ms: 30_000,
            dispose_grace_ms: 3000,
            scrollback_lines: 10_000,
            scrollback_max_bytes: 4 * 1024 * 1024,
            max_read_bytes: 256 * 1024,
            bash: "bash".into(),
            cwd: None,
            shell_dialect: Dialect::Bash,
            pwsh: "pwsh".into(),
            term: "xterm-256color".into(),
            rows: TerminalSize::default().rows,
            cols: TerminalSize::default().cols,
        }
    }
}

/// Checks a TERM value: a terminfo name, so it can never smuggle a path or a control
/// character into the environment.
fn term_issue(term: &str) -> Option<&'static str> {
    let ok = !term.is_empty()
        && term.len() <= 64
        && term.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    (!ok).then_some("must be a terminfo name (letters, digits, `.`, `_`, `+`, `-`; 1 to 64)")
}

/// 16 hex digits for a private in-band marker (prompt markers, command delimiters), which
/// the commands it frames must not be able to guess.
pub(crate) fn marker_nonce() -> String {
    conch_nonce::random_hex::<8>()
}

/// Checks a terminal size: 1 to [`MAX_SIZE`] rows and columns.
pub(crate) fn size_issue(rows: u16, cols: u16) -> Option<String> {
    let bad = |n: u16| n == 0 || n > MAX_SIZE;
    (bad(rows) || bad(cols))
        .then(|| format!("rows and cols must be 1 to {MAX_SIZE} (got {rows} rows, {cols} cols)"))
}

impl PluginConfig for TerminalShellConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("poll_interval_ms", self.poll_interval_ms)?;
        ConfigIssue::positive("idle_silence_ms", self.idle_silence_ms)?;
        ConfigIssue::positive("timeout_ms", self.timeout_ms)?;
        ConfigIssue::positive("scrollback_lines", self.scrollback_lines as u64)?;
        ConfigIssue::positive("scrollback_max_bytes", self.scrollback_max_bytes as u64)?;
        ConfigIssue::at_least("max_read_bytes", self.max_read_bytes as u64, 64)?;
        if self.bash.is_empty() {
            return Err(ConfigIssue::new("bash", "must name an executable"));
        }
        if self.pwsh.is_empty() {
            return Err(ConfigIssue::new("pwsh", "must name an executable"));
        }
        if let Some(why) = term_issue(&self.term) {
            return Err(ConfigIssue::new("term", why));
        }
        if let Some(why) = size_issue(self.rows, self.cols) {
            return Err(ConfigIssue::new("rows", why));
        }
        Ok(())
    }
}

/// What a dialect's shell does on a terminal that the session must allow for.
pub(crate) trait OnTerminal {
    /// The shell asks the terminal where the cursor is and waits for the answer (.NET does,
    /// before every prompt), so the session answers like a terminal would.
    fn answers_cursor_queries(self) -> bool;

    /// The shell runs its commands in its own process group (pwsh starts them through .NET,
    /// without job control), so the foreground group is always the shell's: a signal meant
    /// for a command reaches the shell too, and an interrupt cannot tell the two apart by
    /// group. pwsh ignores a SIGINT at its prompt, so an interrupt may be repeated until the
    /// prompt is back; bash would keep it pending in readline and eat the next line.
    fn commands_share_its_group(self) -> bool;
}

impl OnTerminal for Dialect {
    fn answers_cursor_queries(self) -> bool {
        self == Dialect::Pwsh
    }

    fn commands_share_its_group(self) -> bool {
        self == Dialect::Pwsh
    }
}

/// The terminal backend over a subprocess provider's `spawn_terminal`.
#[derive(Debug)]
pub struct TerminalShell {
    config: TerminalShellConfig,
    subprocess: Arc<dyn Subprocess>,
    /// The sandbox every shell is wrapped through, and the policy it runs under.
    confinement: Option<Confinement>,
    /// How the sessions' capped output is kept whole (see `session::Spills`).
    spills: Arc<session::Spills>,
}

impl TerminalShell {
    /// A backend whose shells run unconfined.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: TerminalShellConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        config.check(NAME)?;
        let spills = Arc::new(session::Spills::new(Arc::clone(&subprocess)));
        Ok(Self { config, subprocess, confinement: None, spills })
    }

    /// A backend whose every shell is wrapped through `sandbox` under `policy` (the mode
    /// every session it opens reports).
    ///
    /// # Errors
    /// Invalid config.
    pub fn sandboxed(
        config: TerminalShellConfig,
        subprocess: Arc<dyn Subprocess>,
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
    ) -> Result<Self> {
        config.check(NAME)?;
        let confinement = Confinement::new(sandbox, policy, NAME, "open", ConfinedSubject::Shell);
        let spills = Arc::new(session::Spills::new(Arc::clone(&subprocess)));
        Ok(Self { config, subprocess, confinement: Some(confinement), spills })
    }

    /// Puts the sandbox runner in front of the shell's command line (argv, cwd and env
    /// travel through `wrap` so the runner can place them: bwrap changes directory inside
    /// its mounts), with the guard that frees what the runner made and whether a runner
    /// stands in front at all.
    ///
    /// # Errors
    /// The sandbox's `sandbox_unavailable` (any other wrap error is reported as that too:
    /// the shell cannot run confined, and it never runs unconfined instead).
    fn confine(
        &self,
        mut tspec: TerminalSpawnSpec,
    ) -> Result<(TerminalSpawnSpec, Option<SandboxRelease>, bool)> {
        let Some(c) = &self.confinement else {
            return Ok((tspec, None, false));
        };
        let command = CommandLine::new(std::mem::take(&mut tspec.argv))
            .with_cwd(tspec.cwd.take())
            .with_env(std::mem::take(&mut tspec.env));
        let wrapped = c.wrap(c.policy(), command)?;
        tspec.argv = wrapped.command.argv;
        tspec.cwd = wrapped.command.cwd;
        tspec.env = wrapped.command.env;
        Ok((tspec, Some(wrapped.release), wrapped.runner))
    }
}

impl TerminalShell {
    /// The argv and variables that start the session's shell with the prompt marker
    /// `payload`.
    fn shell_command(
        &self,
        payload: &str,
        nonce: &str,
        term: &str,
    ) -> (Vec<String>, Vec<(&'static str, String)>) {
        match self.config.shell_dialect {
            Dialect::Bash => {
                // \[ \] keep readline's width math right; PROMPT_COMMAND re-asserts PS1 before
                // every prompt so a user's PS1 change cannot break readiness, and ends a
                // pending frame.
                let ps1 = format!("\\[\\e]{payload}\\a\\]\\$ ");
                // A short `bash -c` that picks the locale in the shell's own world, then
                // execs the interactive shell in the same process (see [`LOCALE_START`]).
                let argv = vec![
                    self.config.bash.clone(),
                    "--norc".into(),
                    "--noprofile".into(),
                    "-c".into(),
                    LOCALE_START.into(),
                    self.config.bash.clone(),
                ];
                let env = vec![
                    ("PS1", ps1.clone()),
                    ("PS2", "> ".into()),
                    ("PROMPT_COMMAND", conch_dialect::bash::prompt_command(&ps1)),
                    (conch_dialect::bash::BOOT_VAR, conch_dialect::bash::prompt_boot(&ps1, nonce)),
                    ("TERM", term.into()),
                    ("NO_COLOR", "1".into()),
                    ("PAGER", "cat".into()),
                    ("GIT_PAGER", "cat".into()),
                    ("HISTFILE", "/dev/null".into()),
                    // Framed command lines start with a space and stay out of the history.
                    ("HISTCONTROL", "ignorespace".into()),
                    ("INPUTRC", "/dev/null".into()),
                ];
                (argv, env)
            }
            Dialect::Pwsh => {
                let argv = vec![
                    self.config.pwsh.clone(),
                    "-NoLogo".into(),
                    "-NoProfile".into(),
                    "-NoExit".into(),
                    "-EncodedCommand".into(),
                    pwsh::encode_command(&pwsh::session_script(payload)),
                ];
                let env = pwsh::ENV_OVERRIDES.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
                (argv, env)
            }
        }
    }

    /// A spawn error as the user should read it: a missing pwsh by name.
    fn spawn_error(&self, e: Error) -> Error {
        if self.config.shell_dialect == Dialect::Pwsh
            && e.reason() == Some(ErrorReason::MissingProgram)
        {
            return missing_pwsh(&self.config.pwsh);
        }
        e
    }
}

fn missing_pwsh(program: &str) -> Error {
    Error::new(ErrorCode::SpawnFailed, pwsh::missing_program(program))
        .with_provider(NAME)
        .with_operation("open")
}

#[async_trait]
impl TerminalBackend for TerminalShell {
    fn type_name(&self) -> &'static str {
        self.config.shell_dialect.name()
    }

    fn dialect(&self) -> Dialect {
        self.config.shell_dialect
    }

    async fn open(&self, spec: TerminalOpenSpec) -> Result<Arc<dyn TerminalSession>> {
        // A relative cwd is relative to the configured one; the subprocess provider checks
        // that it exists, in its own world, and resolves what is still relative there.
        let cwd = match (spec.cwd, &self.config.cwd) {
            (Some(c), Some(base)) if c.is_relative() => Some(base.join(c)),
            (Some(c), _) => Some(c),
            (None, base) => base.clone(),
        };
        let size =
            spec.size.unwrap_or(TerminalSize { rows: self.config.rows, cols: self.config.cols });
        if let Some(why) = size_issue(size.rows, size.cols) {
            return Err(Error::invalid(why).with_provider(NAME).with_operation("open"));
        }
        let term = match (&spec.term, self.config.shell_dialect) {
            (Some(_), Dialect::Pwsh) => {
                return Err(Error::invalid(
                    "pwsh sessions keep TERM=dumb (their line reading relies on it); open \
                     without `term`",
                )
                .with_provider(NAME)
                .with_operation("open"));
            }
            (Some(t), Dialect::Bash) => t.clone(),
            (None, _) => self.config.term.clone(),
        };
        if let Some(why) = term_issue(&term) {
            return Err(Error::invalid(format!("term {term:?} {why}"))
                .with_provider(NAME)
                .with_operation("open"));
        }
        let nonce = marker_nonce();
        let payload = format!("{MARKER_OSC};{nonce}");
        let (argv, env) = self.shell_command(&payload, &nonce, &term);
        let mut tspec = TerminalSpawnSpec::in_default_dir(argv);
        tspec.cwd = cwd;
        tspec.size = size;
        for (k, v) in env {
            tspec.env.insert(k.into(), Some(v));
        }
        // The managed snapshot is trusted and goes last; the provider's scrub removed any
        // ambient CONCH_* before it.
        for (k, v) in spec.managed_env {
            tspec.env.insert(k, Some(v));
        }
        // Under a sandbox the runner is what gets spawned, and a missing pwsh would show only
        // as the runner's exit; say what is missing instead, as the unconfined open does.
        if self.config.shell_dialect == Dialect::Pwsh
            && self.confinement.is_some()
            && self.subprocess.which(&self.config.pwsh).await?.is_none()
        {
            return Err(missing_pwsh(&self.config.pwsh));
        }
        // Held by the session (dropped with it), or dropped here when the open fails.
        // `runner`: a runner stands in front of the shell, so the shell's exit may be its refusal.
        let (tspec, release, runner) = self.confine(tspec)?;
        let sandbox = self.confinement.as_ref().map(|c| c.policy().mode);
        // A spawn error stays the provider's (a missing cwd is refused the same way with or
        // without a sandbox); a runner that starts but cannot confine is caught below.
        let process =
            self.subprocess.spawn_terminal(tspec).await.map_err(|e| self.spawn_error(e))?;
        let shared = session::start(
            process,
            self.config.clone(),
            self.config.shell_dialect,
            &payload,
            &nonce,
            size,
            Arc::clone(&self.spills),
        );
        *shared.restore.locked() = spec.restore;
        let motd = match session::await_first_prompt(&shared, &spec.cancel).await {
            Ok(m) => m,
            Err(e) => {
                // Roll back the private session before reporting.
                let process = Arc::clone(&shared.process);
                let s = session::ShellSession {
                    shared,
                    motd: String::new(),
                    sandbox,
                    release: std::sync::Mutex::new(None),
                };
                let _ = s.close().await;
                // A runner that refused to confine exits before the shell starts; say so
                // rather than report a shell that died at startup. Whether it refused is the
                // sandbox's verdict on the exit and what it printed.
                if let (Some(c), Some(status)) = (&self.confinement, process.try_status()) {
                    c.verdict(c.policy(), &status, e.message(), runner)?;
                }
                return Err(e);
            }
        };
        Ok(Arc::new(session::ShellSession {
            shared,
            motd,
            sandbox,
            release: std::sync::Mutex::new(release),
        }))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: TerminalShellConfig = ctx.config()?;
    // The sandbox is optional, so it is not in `requires`; it is built before this plugin
    // anyway, because the sandbox providers require no seam and the plan builds them in its
    // first round, while this plugin waits for the subprocess seam.
    let backend = match ctx.sandbox() {
        None => TerminalShell::new(config, ctx.subprocess()?),
        Some(sandbox) => {
            let policy = ctx.sandbox_policy().ok_or_else(|| {
                ctx.locate(Error::new(
                    ErrorCode::SeamUnbound,
                    format!(
                        "{NAME} would wrap its shells through the bound sandbox ({}), but the \
                         composition has no `sandbox-policy` plugin to say under which mode; \
                         add `sandbox-policy`",
                        sandbox.provider_name()
                    ),
                ))
            })?;
            TerminalShell::sandboxed(config, ctx.subprocess()?, sandbox, policy.as_ref().clone())
        }
    }
    .map_err(|e| ctx.locate(e))?;
    // At shutdown (after the terminals service closed the sessions), the staging directory
    // goes even while something still holds the backend.
    let spills = Arc::clone(&backend.spills);
    Ok(PluginOutput::seam(SeamHandle::TerminalBackend(Arc::new(backend)))
        .with_teardown(move || Box::pin(async move { spills.remove() })))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::TerminalBackend),
    requires: &[SeamId::Subprocess],
    description: "bash (or pwsh, shell_dialect: pwsh) on a PTY with prompt-marker and exact stdin-wait readiness",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
