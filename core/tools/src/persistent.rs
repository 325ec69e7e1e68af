//! The persistent shell tools (`bash` from `tool-bash-persistent`, `pwsh` from
//! `tool-pwsh-persistent`): one PTY session per owner, calls serialised (a tokio mutex per
//! owner, first come first served; [`Tool::serial`] tells front ends that receive calls
//! together to start them in arrival order), each command run through the backend's framing
//! so only its own output and exit status come back. A command the backend stopped (timeout,
//! terminal input) keeps the shell; any other unfinished end resets it. The tool holds no shell syntax: the terminal backend's dialect frames the command
//! and names the tool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamId, register_plugin,
};
use conch_seams::{
    CommandEnd, CommandOutcome, Dialect, Error, ErrorCode, OpenRequest, Owner, Result, ShellState,
    StopCause, Terminals, Tool, ToolContext, ToolOutput,
};
use conch_sync::LockExt;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::args::{parse_args, schema_of};

/// tool-bash-persistent config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PersistentShellConfig {
    /// Default per-command timeout.
    pub timeout_ms: u64,
    /// Largest per-command timeout.
    pub max_timeout_ms: u64,
    /// Cap on returned output (tail kept).
    pub max_output_bytes: usize,
}

impl Default for PersistentShellConfig {
    fn default() -> Self {
        Self { timeout_ms: 120_000, max_timeout_ms: 600_000, max_output_bytes: 64_000 }
    }
}

impl PluginConfig for PersistentShellConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("timeout_ms", self.timeout_ms)?;
        ConfigIssue::timeout_within_max(
            self.timeout_ms,
            self.max_timeout_ms,
            Self::default().timeout_ms,
        )
    }
}

/// Arguments of the persistent `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PersistentShellArgs {
    /// The command; cwd, exported variables and functions persist to the next call.
    pub command: String,
    /// Timeout in milliseconds, at least 1 (the tool states its default and limit).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

/// One owner's shell: its session, and the state the last command that finished at the prompt
/// left, which a replacement shell gets (a reset keeps the working directory and exports).
#[derive(Debug, Default)]
struct Shell {
    session: Option<String>,
    state: Option<ShellState>,
}

type Slot = Arc<tokio::sync::Mutex<Shell>>;

/// The persistent shell tool.
#[derive(Debug)]
pub struct PersistentShellTool {
    terminals: Arc<dyn Terminals>,
    shell_env: Arc<conch_env::ShellEnv>,
    config: PersistentShellConfig,
    sessions: Arc<Mutex<HashMap<u64, Slot>>>,
    dialect: Dialect,
    description: String,
    schema: serde_json::Value,
}

/// What a reset says of the next call's shell, after "the shell was reset".
fn next_shell(kept: Option<bool>) -> &'static str {
    match kept {
        None => " and the next call starts fresh",
        Some(true) => {
            ": the next call starts a new shell with the working directory and exported \
             variables of the last command that finished (functions, aliases and unexported \
             variables are gone)"
        }
        Some(false) => {
            ": the next call starts a new shell in the working directory of the last command \
             that finished (its exported variables, functions and aliases are gone)"
        }
    }
}

/// `text`, then `note` on a line of its own.
fn with_note(text: &str, note: &str) -> String {
    let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
    format!("{text}{sep}{note}")
}

impl PersistentShellTool {
    /// A tool over the terminals service, speaking the default backend's dialect.
    pub fn new(
        terminals: Arc<dyn Terminals>,
        shell_env: Arc<conch_env::ShellEnv>,
        config: PersistentShellConfig,
    ) -> Self {
        let dialect = terminals.dialect();
        let description = format!(
            "Run a command in your persistent {display} shell: {state} persist between calls; \
             calls run one at a time, in the order they arrive. A non-zero exit is shown as \
             [exit code: N].{exit} {input} After the shell exits (`exit N` is shown as \
             [exit code: N]) the next call starts a fresh shell.",
            display = dialect.display(),
            state = dialect.persistent_state(),
            input = dialect.persistent_input(),
            exit = if dialect.exit_status().is_empty() {
                String::new()
            } else {
                format!(" {}", dialect.exit_status())
            },
        );
        let mut schema = schema_of::<PersistentShellArgs>();
        schema["title"] = format!("persistent {} arguments", dialect.name()).into();
        schema["description"] = format!("Arguments of the persistent `{}`.", dialect.name()).into();
        if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
            if let Some(command) = props.get_mut("command").and_then(|c| c.as_object_mut()) {
                command.insert(
                    "description".into(),
                    format!(
                        "The command; {} persist to the next call.",
                        dialect.persistent_state()
                    )
                    .into(),
                );
            }
            if let Some(timeout) = props.get_mut("timeout_ms").and_then(|c| c.as_object_mut()) {
                timeout.insert(
                    "description".into(),
                    format!(
                        "Timeout in milliseconds, at least 1 (default {}, limit {}; a larger \
                         value is lowered to the limit and the result says so).",
                        config.timeout_ms, config.max_timeout_ms
                    )
                    .into(),
                );
            }
        }
        Self {
            terminals,
            shell_env,
            config,
            sessions: Arc::new(Mutex::new(HashMap::new())),
            dialect,
            description,
            schema,
        }
    }

    fn slot(&self, owner: &Arc<Owner>) -> Slot {
        let mut map = self.sessions.locked();
        if let Some(s) = map.get(&owner.key()) {
            return Arc::clone(s);
        }
        let slot: Slot = Arc::new(tokio::sync::Mutex::new(Shell::default()));
        map.insert(owner.key(), Arc::clone(&slot));
        drop(map);
        // The terminals service closes the owner's sessions itself; only forget the slot.
        let key = owner.key();
        let sessions = Arc::clone(&self.sessions);
        owner.on_dispose(move || {
            Box::pin(async move {
                sessions.locked().remove(&key);
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
        Error::invalid(format!("invalid arguments for `{}`: {why}", self.dialect.name()))
    }
}

#[async_trait]
impl Tool for PersistentShellTool {
    fn name(&self) -> &str {
        self.dialect.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> serde_json::Value {
        self.schema.clone()
    }

    /// One shell per owner: its calls queue on it in arrival order.
    fn serial(&self) -> bool {
        true
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: PersistentShellArgs = parse_args(self.dialect.name(), args, &self.schema)?;
        if args.command.trim().is_empty() {
            return Err(self.invalid("command is empty"));
        }
        let timeout_ms = match args.timeout_ms {
            Some(0) => return Err(self.invalid("timeout_ms must be greater than 0")),
            Some(t) => t.min(self.config.max_timeout_ms),
            None => self.config.timeout_ms,
        };
        let slot = self.slot(&ctx.owner);
        // A call cancelled while it waits its turn never ran: it leaves the shell alone.
        let cancelled = || {
            Error::new(
                ErrorCode::Cancelled,
                format!("the {} tool call was aborted before it ran", self.dialect.name()),
            )
        };
        let mut shell = tokio::select! {
            s = slot.lock() => s,
            () = ctx.cancel.cancelled() => return Err(cancelled()),
        };
        if ctx.cancel.is_cancelled() {
            return Err(cancelled());
        }
        let Shell { session, state } = &mut *shell;
        let live = match session.as_deref() {
            Some(id) => self
                .terminals
                .list(&ctx.owner)
                .iter()
                .any(|i| i.id == id && i.status == conch_seams::SessionStatus::Running),
            None => false,
        };
        if !live {
            self.reset(&ctx.owner, session).await;
            let mut req = OpenRequest::default();
            req.managed_env = self.shell_env.snapshot(ctx.owner.session_id());
            req.restore = state.clone();
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
        let mut outcome = match ran {
            Ok(o) => o,
            Err(e) => {
                // Only a reset whose result says so hands the state on.
                *state = None;
                self.reset(&ctx.owner, session).await;
                return Err(e);
            }
        };
        if outcome.end == CommandEnd::Cancelled {
            *state = None;
            self.reset(&ctx.owner, session).await;
            return Err(Error::new(
                ErrorCode::Cancelled,
                format!("the {} tool call was aborted", self.dialect.name()),
            ));
        }
        if outcome.end == CommandEnd::SessionExited {
            // The shell is gone by its own hand: the next one starts as new shells do.
            *state = None;
        } else if let Some(s) = outcome.state.take() {
            *state = Some(s);
        }
        let kept = state.as_ref().map(|s| s.exports);
        let (mut text, reset) =
            render_outcome(outcome, timeout_ms, self.config.max_output_bytes, kept);
        let clamped =
            crate::render::timeout_clamp_note(args.timeout_ms, Duration::from_millis(timeout_ms));
        if let Some(note) = clamped {
            text = if text.is_empty() { note } else { format!("{note}\n{text}") };
        }
        if reset {
            self.reset(&ctx.owner, session).await;
        }
        Ok(ToolOutput::text(text))
    }
}

/// The note on a command that opened the terminal for input (stdin itself is empty).
const WAITED_FOR_TERMINAL: &str = "[the command waited for input on the terminal and was \
     interrupted; the shell kept its state. Commands get no input here (stdin is empty): pass \
     it in the command, with a pipe, a here-document or a non-interactive flag]";

/// A finished framed command as the model sees it: its output (the tail of at most `cap`
/// bytes, saying what was cut) and the markers of how it ended; and whether the shell must
/// be reset (it did not come back to its prompt by itself). `kept`: a reset shell's
/// replacement gets the last known state (`true`: with its exported variables). Not for
/// `Cancelled`, which is an error.
pub(crate) fn render_outcome(
    outcome: CommandOutcome,
    timeout_ms: u64,
    cap: usize,
    kept: Option<bool>,
) -> (String, bool) {
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
        let whole = match &outcome.spill {
            Some(p) => format!("; full output: {p}"),
            None => String::new(),
        };
        out = format!("[output truncated to its last {} bytes{mid}{whole}]\n{tail}", tail.len());
    }
    let exited = "[the shell exited; the next call starts a fresh shell]";
    let note = match outcome.end {
        CommandEnd::Exited(0) => return (out, false),
        CommandEnd::Exited(code) => {
            return (with_note(&out, &crate::render::exit_code_marker(code)), false);
        }
        CommandEnd::Stopped(StopCause::Timeout) => {
            let note = format!(
                "[timed out after {timeout_ms}ms; the command was stopped and the shell \
                 kept its state]"
            );
            return (with_note(&out, &note), false);
        }
        CommandEnd::Stopped(StopCause::WaitingForInput) => {
            return (with_note(&out, WAITED_FOR_TERMINAL), false);
        }
        CommandEnd::TimedOut | CommandEnd::Cancelled => {
            format!("[timed out after {timeout_ms}ms; the shell was reset{}]", next_shell(kept))
        }
        CommandEnd::SessionExited => match &outcome.session_status {
            conch_seams::SessionStatus::Exited(e) => {
                // Even `exit 0` is shown: the shell is gone, which the next call must know.
                let status = match (e.code, &e.signal) {
                    (_, Some(sig)) => Some(crate::render::signal_marker(sig)),
                    (Some(c), None) => Some(crate::render::exit_code_marker(c)),
                    (None, None) => None,
                };
                match status {
                    Some(s) => format!("{s}\n{exited}"),
                    None => exited.to_string(),
                }
            }
            conch_seams::SessionStatus::Running | conch_seams::SessionStatus::Lost { .. } => {
                exited.to_string()
            }
        },
        CommandEnd::WaitingForInput => format!(
            "[the command waited for input on the terminal; the shell was reset{}]",
            next_shell(kept)
        ),
    };
    (with_note(&out, &note), true)
}

fn build_for(ctx: &BuildContext<'_>, plugin: &str, dialect: Dialect) -> Result<PluginOutput> {
    let config: PersistentShellConfig = ctx.config()?;
    let terminals = ctx.terminals()?;
    let speaks = terminals.dialect();
    if speaks != dialect {
        return Err(ctx.locate(Error::new(
            ErrorCode::InvalidComposition,
            format!(
                "plugin `{plugin}` runs a persistent {} shell, but the terminal backend speaks \
                 {}; use tool-{}-persistent with it, or set the backend's `shell_dialect: {}`",
                dialect.name(),
                speaks.name(),
                speaks.name(),
                dialect.name()
            ),
        )));
    }
    let tool = PersistentShellTool::new(terminals, ctx.shell_env(), config);
    Ok(PluginOutput::tools(vec![Arc::new(tool)]))
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    build_for(ctx, "tool-bash-persistent", Dialect::Bash)
}

register_plugin!(PluginEntry {
    name: "tool-bash-persistent",
    provides: None,
    requires: &[SeamId::Terminals],
    description: "persistent bash: one PTY per owner, marker-delimited results",
    build,
});

fn build_pwsh(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    build_for(ctx, "tool-pwsh-persistent", Dialect::Pwsh)
}

register_plugin!(PluginEntry {
    name: "tool-pwsh-persistent",
    provides: None,
    requires: &[SeamId::Terminals],
    description: "persistent PowerShell 7: one PTY per owner (terminal-bash with shell_dialect: pwsh)",
    build: build_pwsh,
});

#[cfg(test)]
mod tests {
    use conch_seams::SessionStatus;

    use super::*;

    fn outcome(output: &str, end: CommandEnd, status: SessionStatus) -> CommandOutcome {
        CommandOutcome {
            output: output.into(),
            omitted_bytes: 0,
            end,
            session_status: status,
            state: None,
            spill: None,
        }
    }

    #[test]
    fn every_persistent_ending_renders_a_status_parse_exit_status_recovers() {
        use crate::render::{RenderedExit, parse_exit_status};
        use conch_seams::ExitStatus;
        let running = SessionStatus::Running;
        let cases = [
            (
                outcome("hi\n", CommandEnd::Exited(0), running.clone()),
                Some(RenderedExit::Code(0)),
                false,
            ),
            (
                outcome("no newline", CommandEnd::Exited(4), running.clone()),
                Some(RenderedExit::Code(4)),
                false,
            ),
            (
                outcome("", CommandEnd::SessionExited, SessionStatus::Exited(ExitStatus::code(3))),
                Some(RenderedExit::Code(3)),
                true,
            ),
            (
                outcome(
                    "x\n",
                    CommandEnd::SessionExited,
                    SessionStatus::Exited(ExitStatus {
                        code: None,
                        signal: Some("SIGKILL".into()),
                    }),
                ),
                Some(RenderedExit::Signal("SIGKILL".into())),
                true,
            ),
            (outcome("partial", CommandEnd::TimedOut, running.clone()), None, true),
            (outcome("Name? ", CommandEnd::WaitingForInput, running.clone()), None, true),
            // Output that prints a marker-like line and then more is output, not a status.
            (
                outcome("[exit code: 9]\n", CommandEnd::Exited(0), running),
                Some(RenderedExit::Code(0)),
                false,
            ),
        ];
        for (o, want, reset) in cases {
            let (text, did_reset) = render_outcome(o.clone(), 1000, 64_000, None);
            assert_eq!(parse_exit_status(&text), want, "{o:?} rendered as {text:?}");
            assert_eq!(did_reset, reset, "{o:?}");
        }
    }

    #[test]
    fn notes_go_on_a_line_of_their_own() {
        assert_eq!(with_note("", "[x]"), "[x]");
        assert_eq!(with_note("out\n", "[x]"), "out\n[x]");
        assert_eq!(with_note("out", "[x]"), "out\n[x]");
    }
}
