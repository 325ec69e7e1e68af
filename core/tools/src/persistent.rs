//! The persistent `bash` tool: one PTY session per owner, calls serialised, each command
//! wrapped in random start/end markers so only its own output and exit status come back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{
    Error, ErrorCode, OpenRequest, Owner, Result, Terminals, Tool, ToolContext, ToolOutput,
    WaitReason,
};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

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

/// The persistent bash tool.
#[derive(Debug)]
pub struct PersistentBashTool {
    terminals: Arc<dyn Terminals>,
    shell_env: Arc<conch_env::ShellEnv>,
    config: PersistentBashConfig,
    sessions: Arc<Mutex<HashMap<u64, Slot>>>,
}

const TAG: &str = "__CONCH_PB";

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The single line typed into the shell. The markers are printed with `%s` pieces so the
/// echoed command line itself never contains a complete marker; `eval` keeps state changes
/// (cd, export) in the shell while stdin stays the terminal.
fn wrap(command: &str, nonce: &str) -> String {
    format!(
        " printf '\\n%s_START_%s__\\n' {TAG} {nonce}; eval \"$(printf %s '{}' | base64 -d)\"; __conch_rc=$?; printf '\\n%s_END_%s:%s__\\n' {TAG} {nonce} \"$__conch_rc\"",
        b64(command.as_bytes())
    )
}

/// Extracts `(output, exit code)` once the end marker arrived, or the partial output.
fn extract(acc: &str, nonce: &str) -> (String, Option<i32>) {
    let start = format!("{TAG}_START_{nonce}__\n");
    let end = format!("\n{TAG}_END_{nonce}:");
    let body = match acc.find(&start) {
        Some(i) => &acc[i + start.len()..],
        // The send's delta keeps only its tail, so a long output can lose the start marker;
        // the end marker (with the status) still delimits the command's output.
        None if acc.contains(&end) => acc,
        None => return (String::new(), None),
    };
    match body.find(&end) {
        Some(j) => {
            let code = body[j + end.len()..].split("__").next().and_then(|c| c.trim().parse().ok());
            (body[..j].to_string(), code.or(Some(-1)))
        }
        None => (body.to_string(), None),
    }
}

impl PersistentBashTool {
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
}

#[async_trait]
impl Tool for PersistentBashTool {
    fn name(&self) -> &'static str {
        "bash"
    }

    fn description(&self) -> &'static str {
        "Run a command in your persistent bash shell: cwd, exported variables and functions \
         persist between calls; calls run one at a time. A non-zero exit is shown as [exit \
         code: N]. On timeout or interruption the shell is reset and the next call starts fresh. \
         Interactive programs that wait for input return their partial output and reset the shell."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<PersistentBashArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: PersistentBashArgs = parse_args("bash", args)?;
        if args.command.trim().is_empty() {
            return Err(Error::invalid("invalid arguments for `bash`: command is empty"));
        }
        let timeout_ms = match args.timeout_ms {
            Some(0) => {
                return Err(Error::invalid(
                    "invalid arguments for `bash`: timeout_ms must be greater than 0",
                ));
            }
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
        let nonce = conch_seams::terminal::marker_nonce();
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let mut acc = String::new();
        let mut first = true;
        let outcome: std::result::Result<Option<i32>, &'static str> = loop {
            let cancel = CancellationToken::new();
            let guard = {
                let cancel = cancel.clone();
                let caller = ctx.cancel.clone();
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(left) => cancel.cancel(),
                        () = caller.cancelled() => cancel.cancel(),
                        () = cancel.cancelled() => {}
                    }
                })
            };
            let text = if first { wrap(&args.command, &nonce) } else { String::new() };
            let r = match self.terminals.reserve_send(&ctx.owner, &id) {
                Ok(s) => s.send(text, first, cancel.clone()).await,
                Err(e) => Err(e),
            };
            cancel.cancel();
            guard.abort();
            first = false;
            match r {
                Ok(settle) => {
                    acc.push_str(&settle.delta);
                    let (_, code) = extract(&acc, &nonce);
                    if code.is_some() {
                        break Ok(code);
                    }
                    match settle.wait_reason {
                        WaitReason::SessionExit => {
                            break Err("[shell exited; the next call starts a fresh shell]");
                        }
                        WaitReason::StdinRead => {
                            break Err(
                                "[command is waiting for input; the shell was reset — use the terminal tools for interactive programs]",
                            );
                        }
                        WaitReason::InferredIdle | WaitReason::Timeout => {
                            if Instant::now() >= deadline {
                                break Err("timeout");
                            }
                        }
                    }
                }
                Err(e) if e.code() == ErrorCode::Cancelled => {
                    if let Some((_, partial)) = e
                        .context()
                        .iter()
                        .find(|(k, _)| *k == conch_seams::terminal::SEND_OUTPUT_CONTEXT)
                    {
                        acc.push_str(partial);
                    }
                    if ctx.cancel.is_cancelled() {
                        self.reset(&ctx.owner, &mut session).await;
                        return Err(Error::new(
                            ErrorCode::Cancelled,
                            "the bash tool call was aborted",
                        ));
                    }
                    break Err("timeout");
                }
                Err(e) => {
                    self.reset(&ctx.owner, &mut session).await;
                    return Err(e);
                }
            }
        };
        let (mut out, _) = extract(&acc, &nonce);
        if out.len() > self.config.max_output_bytes {
            out = format!(
                "[output truncated to its last {} bytes]\n{}",
                self.config.max_output_bytes,
                conch_output::tail_utf8(&out, self.config.max_output_bytes)
            );
        }
        let text = match outcome {
            Ok(Some(0)) => out,
            Ok(Some(code)) => format!(
                "{out}{}[exit code: {code}]",
                if out.is_empty() || out.ends_with('\n') { "" } else { "\n" }
            ),
            Ok(None) => out,
            Err(note) => {
                self.reset(&ctx.owner, &mut session).await;
                let note = if note == "timeout" {
                    format!("[timed out after {timeout_ms}ms; the shell was reset]")
                } else {
                    note.to_string()
                };
                format!(
                    "{out}{}{note}",
                    if out.is_empty() || out.ends_with('\n') { "" } else { "\n" }
                )
            }
        };
        Ok(ToolOutput::text(text))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PersistentBashConfig = ctx.config()?;
    if config.timeout_ms == 0 || config.max_timeout_ms < config.timeout_ms {
        return Err(Error::new(
            ErrorCode::InvalidComposition,
            format!(
                "{}: plugin `tool-bash-persistent`: key `timeout_ms`: must be > 0 and <= max_timeout_ms",
                ctx.source_name()
            ),
        ));
    }
    let tool = PersistentBashTool {
        terminals: ctx.terminals()?,
        shell_env: ctx.shell_env(),
        config,
        sessions: Arc::new(Mutex::new(HashMap::new())),
    };
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
    fn base64_matches_known_vectors() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn the_echoed_wrapper_never_contains_a_whole_marker() {
        let w = wrap("echo hi", "abc");
        assert!(!w.contains("__CONCH_PB_START_abc__"));
        assert!(!w.contains("__CONCH_PB_END_abc:"));
    }

    #[test]
    fn extract_returns_output_between_markers_and_the_status() {
        let acc =
            format!("# {}\n\n{TAG}_START_n1__\nhello\n\n{TAG}_END_n1:3__\n# ", wrap("x", "n1"));
        assert_eq!(extract(&acc, "n1"), ("hello\n".to_string(), Some(3)));
        let cut = format!("[earlier output omitted]\n99\n100\n\n{TAG}_END_n1:0__\n# ");
        assert_eq!(
            extract(&cut, "n1"),
            ("[earlier output omitted]\n99\n100\n".to_string(), Some(0))
        );
        let partial = format!("\n{TAG}_START_n1__\nName? ");
        assert_eq!(extract(&partial, "n1"), ("Name? ".to_string(), None));
    }
}
