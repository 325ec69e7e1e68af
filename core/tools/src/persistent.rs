//! The persistent shell tool (`bash`): one PTY session per owner, calls serialised, each
//! command run through the backend's framing so only its own output and exit status come
//! back. The tool holds no shell syntax: the terminal backend's dialect frames the command
//! and names the tool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{
    CommandEnd, ConfigIssue, Error, ErrorCode, OpenRequest, Owner, PluginConfig, Result,
    ShellDialect, Terminals, Tool, ToolContext, ToolOutput,
};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::args::{parse_args, schema_of};

/// tool-bash-persistent config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PersistentBashConfig {
    /// Default per-command timeout.
    pub timeout_ms: u64,
    /// Largest per-command timeout.
    pub max_timeout_ms: u64,
    /// Cap on returned output (tail kept).
    pub max_output_bytes: usize,
}

impl Default for PersistentBashConfig {
    fn default() -> Self {
        Self { timeout_ms: 120_000, max_timeout_ms: 600_000, max_output_bytes: 64_000 }
    }
}

impl PluginConfig for PersistentBashConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if self.timeout_ms == 0 || self.max_timeout_ms < self.timeout_ms {
            return Err(ConfigIssue::new("timeout_ms", "must be > 0 and <= max_timeout_ms"));
        }
        Ok(())
    }
}

/// Arguments of the persistent `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PersistentBashArgs {
    /// The command; cwd, exported variables and functions persist to the next call.
    pub command: String,
    /// Timeout in milliseconds (default 120000, max 600000); on timeout the shell is reset.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

type Slot = Arc<tokio::sync::Mutex<Option<String>>>;

/// The persistent shell tool.
#[derive(Debug)]
pub struct PersistentBashTool {
    terminals: Arc<dyn Terminals>,
    shell_env: Arc<conch_env::ShellEnv>,
    config: PersistentBashConfig,
    sessions: Arc<Mutex<HashMap<u64, Slot>>>,
    dialect: ShellDialect,
    description: String,
}

/// `text`, then `note` on a line of its own.
fn with_note(text: &str, note: &str) -> String {
    let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
    format!("{text}{sep}{note}")
}

impl PersistentBashTool {
    /// A tool over the terminals service, speaking the default backend's dialect.
    pub fn new(
        terminals: Arc<dyn Terminals>,
        shell_env: Arc<conch_env::ShellEnv>,
        config: PersistentBashConfig,
    ) -> Self {
        let dialect = terminals.dialect();
        let description = format!(
            "Run a command in your persistent {} shell: cwd, exported variables and functions \
             persist between calls; calls run one at a time. A non-zero exit is shown as [exit \
             code: N]. On timeout or interruption the shell is reset and the next call starts \
             fresh. Interactive programs that wait for input return their partial output and \
             reset the shell.",
            dialect.name
        );
        Self {
            terminals,
            shell_env,
            config,
            sessions: Arc::new(Mutex::new(HashMap::new())),
            dialect,
            description,
        }
    }

    fn slot(&self, owner: &Arc<Owner>) -> Slot {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(&owner.key()) {
            return Arc::clone(s);
        }
        let slot: Slot = Arc::new(tokio::sync::Mutex::new(None));
        map.insert(owner.key(), Arc::clone(&slot));
        drop(map);
        // The terminals service closes the owner's sessions itself; only forget the slot.
        let key = owner.key();
        let sessions = Arc::clone(&self.sessions);
        owner.on_dispose(move || {
            Box::pin(async move {
                sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            })
        });
        slot
    }

    async fn reset(&self, owner: &Owner, session: &mut Option<String>) {
        if let Some(id) = session.take() {
            let _ = self.terminals.close(owner, &id).await;
        }
    }

    fn invalid(&self, why: &str) -> Error {
        Error::invalid(format!("invalid arguments for `{}`: {why}", self.dialect.name))
    }
}

#[async_trait]
impl Tool for PersistentBashTool {
    fn name(&self) -> &str {
        self.dialect.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<PersistentBashArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: PersistentBashArgs = parse_args(self.dialect.name, args)?;
        if args.command.trim().is_empty() {
            return Err(self.invalid("command is empty"));
        }
        let timeout_ms = match args.timeout_ms {
            Some(0) => return Err(self.invalid("timeout_ms must be greater than 0")),
            Some(t) => t.min(self.config.max_timeout_ms),
            None => self.config.timeout_ms,
        };
        let slot = self.slot(&ctx.owner);
        let mut session = slot.lock().await;
        let live = match session.as_deref() {
            Some(id) => self
                .terminals
                .list(&ctx.owner)
                .iter()
                .any(|i| i.id == id && i.status == conch_seams::SessionStatus::Running),
            None => false,
        };
        if !live {
            self.reset(&ctx.owner, &mut session).await;
            let mut req = OpenRequest::default();
            req.managed_env = self.shell_env.snapshot(ctx.owner.session_id());
            let info = self.terminals.open(&ctx.owner, req, ctx.cancel.clone()).await?;
            *session = Some(info.id);
        }
        let id = session.clone().unwrap_or_default();
        let ran = match self.terminals.reserve_send(&ctx.owner, &id) {
            Ok(s) => {
                s.run_command(args.command, Duration::from_millis(timeout_ms), ctx.cancel.clone())
                    .await
            }
            Err(e) => Err(e),
        };
        let outcome = match ran {
            Ok(o) => o,
            Err(e) => {
                self.reset(&ctx.owner, &mut session).await;
                return Err(e);
            }
        };
        let cap = self.config.max_output_bytes;
        let mut out = outcome.output;
        if out.len() > cap || outcome.omitted_bytes > 0 {
            // The backend's own tail may already start mid-line: say so, or start at a line.
            let dropped_before = outcome.omitted_bytes > 0;
            let (tail, mid_line) = if dropped_before && !out.contains('\n') {
                (conch_output::tail_utf8(&out, cap), true)
            } else if dropped_before && out.len() <= cap {
                match out.find('\n') {
                    Some(i) if i + 1 < out.len() => (&out[i + 1..], false),
                    _ => (out.as_str(), true),
                }
            } else {
                conch_output::tail_lines_utf8(&out, cap)
            };
            let mid = if mid_line { ", starting mid-line" } else { "" };
            out = format!("[output truncated to its last {} bytes{mid}]\n{tail}", tail.len());
        }
        let note = match outcome.end {
            CommandEnd::Exited(0) => return Ok(ToolOutput::text(out)),
            CommandEnd::Exited(code) => {
                return Ok(ToolOutput::text(with_note(&out, &format!("[exit code: {code}]"))));
            }
            CommandEnd::Cancelled => {
                self.reset(&ctx.owner, &mut session).await;
                return Err(Error::new(
                    ErrorCode::Cancelled,
                    format!("the {} tool call was aborted", self.dialect.name),
                ));
            }
            CommandEnd::TimedOut => {
                format!("[timed out after {timeout_ms}ms; the shell was reset]")
            }
            CommandEnd::SessionExited => match &outcome.session_status {
                conch_seams::SessionStatus::Exited(e) => match (e.code, &e.signal) {
                    (Some(c), _) => format!(
                        "[exit code: {c}]\n[the shell exited; the next call starts a fresh shell]"
                    ),
                    (None, Some(sig)) => format!(
                        "[killed by signal: {sig}]\n[the shell exited; the next call starts a fresh shell]"
                    ),
                    (None, None) => {
                        "[the shell exited; the next call starts a fresh shell]".to_string()
                    }
                },
                conch_seams::SessionStatus::Running => {
                    "[the shell exited; the next call starts a fresh shell]".to_string()
                }
            },
            CommandEnd::WaitingForInput => "[command is waiting for input; the shell was reset — \
                 use the terminal tools for interactive programs]"
                .to_string(),
        };
        self.reset(&ctx.owner, &mut session).await;
        Ok(ToolOutput::text(with_note(&out, &note)))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PersistentBashConfig = ctx.config()?;
    let tool = PersistentBashTool::new(ctx.terminals()?, ctx.shell_env(), config);
    Ok(PluginOutput::tools(vec![Arc::new(tool)]))
}

register_plugin!(PluginEntry {
    name: "tool-bash-persistent",
    provides: None,
    requires: &[SeamId::Terminals],
    description: "persistent bash: one PTY per owner, marker-delimited results",
    build,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_go_on_a_line_of_their_own() {
        assert_eq!(with_note("", "[x]"), "[x]");
        assert_eq!(with_note("out\n", "[x]"), "out\n[x]");
        assert_eq!(with_note("out", "[x]"), "out\n[x]");
    }
}
