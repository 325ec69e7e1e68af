//! `terminal-bash`: the bash terminal backend. Starts bash on a PTY with a controlled
//! startup (no rc files, a private OSC prompt marker) and answers each send with a
//! readiness result: prompt or exact stdin-wait probe (stdin_read), output silence
//! (inferred_idle), deadline (timeout), or shell exit (session_exit).

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
    ConfigIssue, PluginConfig, Result, ShellDialect, Subprocess, TerminalBackend, TerminalOpenSpec,
    TerminalSession, TerminalSpawnSpec,
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
}

impl TerminalBash {
    /// A backend.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: TerminalBashConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        config.check(NAME)?;
        Ok(Self { config, subprocess })
    }
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
        let process = self.subprocess.spawn_terminal(tspec).await?;
        let shared = session::start(process, self.config.clone(), &payload);
        let motd = match session::await_first_prompt(&shared, &spec.cancel).await {
            Ok(m) => m,
            Err(e) => {
                // Roll back the private session before reporting.
                let s = session::BashSession { shared, motd: String::new() };
                let _ = s.close().await;
                return Err(e);
            }
        };
        Ok(Arc::new(session::BashSession { shared, motd }))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: TerminalBashConfig = ctx.config()?;
    let backend = TerminalBash::new(config, ctx.subprocess()?).map_err(|e| ctx.locate(e))?;
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
