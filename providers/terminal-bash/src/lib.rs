//! `terminal-bash`: the bash terminal backend. Starts bash on a PTY with a controlled
//! startup (no rc files, a private OSC prompt marker) and answers each send with a
//! readiness result: prompt or exact stdin-wait probe (stdin_read), output silence
//! (inferred_idle), deadline (timeout), or shell exit (session_exit).
//!
//! When the composition binds a sandbox, the shell's whole command line (argv, cwd, env) is
//! wrapped through it under the `sandbox-policy` default before the PTY spawn, so the session
//! and everything typed into it run confined, in a mode fixed for the session's lifetime.

mod framing;
mod parser;
mod scrollback;
mod session;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    CommandLine, ConfigIssue, Error, ErrorCode, PluginConfig, Result, Sandbox, SandboxPolicy,
    SandboxRelease, ShellDialect, Subprocess, TerminalBackend, TerminalOpenSpec, TerminalSession,
    TerminalSpawnSpec,
};
use serde::Deserialize;

/// Plugin name.
pub const NAME: &str = "terminal-bash";

/// OSC number of the private prompt marker.
const MARKER_OSC: &str = "7770";

/// Validated backend config (all timings in milliseconds).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TerminalBashConfig {
    /// How often readiness is re-checked.
    pub poll_interval_ms: u64,
    /// Earliest exact stdin-wait probe after a send (probes then follow output quiet).
    pub exact_probe_after_ms: u64,
    /// Output silence that counts as inferred idle.
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
    /// Default working directory (default: the process cwd).
    pub cwd: Option<PathBuf>,
}

impl Default for TerminalBashConfig {
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
        }
    }
}

impl PluginConfig for TerminalBashConfig {
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
        Ok(())
    }
}

/// The bash terminal backend over a subprocess provider's `spawn_terminal`.
#[derive(Debug)]
pub struct TerminalBash {
    config: TerminalBashConfig,
    subprocess: Arc<dyn Subprocess>,
    /// The sandbox every shell is wrapped through, and the policy it runs under.
    confinement: Option<(Arc<dyn Sandbox>, SandboxPolicy)>,
}

impl TerminalBash {
    /// A backend whose shells run unconfined.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: TerminalBashConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        config.check(NAME)?;
        Ok(Self { config, subprocess, confinement: None })
    }

    /// A backend whose every shell is wrapped through `sandbox` under `policy` (the mode
    /// every session it opens reports).
    ///
    /// # Errors
    /// Invalid config.
    pub fn sandboxed(
        config: TerminalBashConfig,
        subprocess: Arc<dyn Subprocess>,
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
    ) -> Result<Self> {
        config.check(NAME)?;
        Ok(Self { config, subprocess, confinement: Some((sandbox, policy)) })
    }

    /// Puts the sandbox runner in front of the shell's command line (argv, cwd and env
    /// travel through `wrap` so the runner can place them: bwrap changes directory inside
    /// its mounts).
    ///
    /// # Errors
    /// The sandbox's `sandbox_unavailable` (any other wrap error is reported as that too:
    /// the shell cannot run confined, and it never runs unconfined instead).
    fn confine(
        &self,
        mut tspec: TerminalSpawnSpec,
    ) -> Result<(TerminalSpawnSpec, Option<SandboxRelease>)> {
        let Some((sandbox, policy)) = &self.confinement else {
            return Ok((tspec, None));
        };
        let command = CommandLine::new(std::mem::take(&mut tspec.argv))
            .with_cwd(tspec.cwd.take())
            .with_env(std::mem::take(&mut tspec.env));
        let wrapped = sandbox.wrap(policy, command).map_err(|e| {
            if e.code() == ErrorCode::SandboxUnavailable {
                e
            } else {
                unavailable(format!(
                    "{} cannot run the shell under {} mode: {e}",
                    sandbox.provider_name(),
                    policy.mode
                ))
            }
        })?;
        let release = SandboxRelease::new(Arc::clone(sandbox), wrapped.clone());
        tspec.argv = wrapped.argv;
        tspec.cwd = wrapped.cwd;
        tspec.env = wrapped.env;
        Ok((tspec, Some(release)))
    }
}

fn unavailable(message: String) -> Error {
    Error::new(ErrorCode::SandboxUnavailable, message).with_provider(NAME).with_operation("open")
}

#[async_trait]
impl TerminalBackend for TerminalBash {
    fn type_name(&self) -> &'static str {
        "bash"
    }

    fn dialect(&self) -> ShellDialect {
        ShellDialect::BASH
    }

    async fn open(&self, spec: TerminalOpenSpec) -> Result<Arc<dyn TerminalSession>> {
        // A relative cwd is relative to the configured one; the subprocess provider checks
        // that it exists, in its own world, and resolves what is still relative there.
        let cwd = match (spec.cwd, &self.config.cwd) {
            (Some(c), Some(base)) if c.is_relative() => Some(base.join(c)),
            (Some(c), _) => Some(c),
            (None, base) => base.clone(),
        };
        let payload = format!("{MARKER_OSC};{}", conch_seams::terminal::marker_nonce());
        // \[ \] keep readline's width math right; PROMPT_COMMAND re-asserts PS1 before every
        // prompt so a user's PS1 change cannot break readiness, and ends a pending frame.
        let ps1 = format!("\\[\\e]{payload}\\a\\]\\$ ");
        let mut tspec = TerminalSpawnSpec::in_default_dir(vec![
            self.config.bash.clone(),
            "--norc".into(),
            "--noprofile".into(),
            "-i".into(),
        ]);
        tspec.cwd = cwd;
        for (k, v) in [
            ("PS1", ps1.clone()),
            ("PS2", "> ".into()),
            ("PROMPT_COMMAND", framing::prompt_command(&ps1)),
            ("TERM", "dumb".into()),
            ("NO_COLOR", "1".into()),
            ("PAGER", "cat".into()),
            ("GIT_PAGER", "cat".into()),
            ("HISTFILE", "/dev/null".into()),
            // Framed command lines start with a space and stay out of the history.
            ("HISTCONTROL", "ignorespace".into()),
            ("INPUTRC", "/dev/null".into()),
        ] {
            tspec.env.insert(k.into(), Some(v));
        }
        // The managed snapshot is trusted and goes last; the provider's scrub removed any
        // ambient CONCH_* before it.
        for (k, v) in spec.managed_env {
            tspec.env.insert(k, Some(v));
        }
        // Held by the session (dropped with it), or dropped here when the open fails.
        let (tspec, release) = self.confine(tspec)?;
        let sandbox = self.confinement.as_ref().map(|(_, p)| p.mode);
        // A spawn error stays the provider's (a missing cwd is refused the same way with or
        // without a sandbox); a runner that starts but cannot confine is caught below.
        let process = self.subprocess.spawn_terminal(tspec).await?;
        let shared = session::start(process, self.config.clone(), &payload);
        let motd = match session::await_first_prompt(&shared, &spec.cancel).await {
            Ok(m) => m,
            Err(e) => {
                // Roll back the private session before reporting.
                let process = Arc::clone(&shared.process);
                let s = session::BashSession {
                    shared,
                    motd: String::new(),
                    sandbox,
                    release: std::sync::Mutex::new(None),
                };
                let _ = s.close().await;
                // A runner that refused to confine exits before bash starts; say so rather
                // than report a shell that died at startup. Whether it refused is the
                // sandbox's verdict on the exit and what it printed.
                let refused = match (&self.confinement, process.try_status()) {
                    (Some((sb, policy)), Some(status)) => {
                        sb.classify(policy, &status, e.message()).runner_failed
                    }
                    _ => false,
                };
                if refused {
                    return Err(unavailable(format!(
                        "the sandbox runner could not confine the shell (it did not run): {}",
                        e.message()
                    )));
                }
                return Err(e);
            }
        };
        Ok(Arc::new(session::BashSession {
            shared,
            motd,
            sandbox,
            release: std::sync::Mutex::new(release),
        }))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: TerminalBashConfig = ctx.config()?;
    // The sandbox is optional, so it is not in `requires`; it is built before this plugin
    // anyway, because the sandbox providers require no seam and the plan builds them in its
    // first round, while this plugin waits for the subprocess seam.
    let backend = match ctx.sandbox() {
        None => TerminalBash::new(config, ctx.subprocess()?),
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
            TerminalBash::sandboxed(config, ctx.subprocess()?, sandbox, policy.as_ref().clone())
        }
    }
    .map_err(|e| ctx.locate(e))?;
    Ok(PluginOutput::seam(SeamHandle::TerminalBackend(Arc::new(backend))))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::TerminalBackend),
    requires: &[SeamId::Subprocess],
    description: "bash on a PTY with prompt-marker and exact stdin-wait readiness",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
