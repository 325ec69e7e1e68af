//! The seven terminal tools over the `Terminals` service, and background sends as `pty-send` jobs.
//!
//! Background sends are `pty-send` jobs. Every result is capped at `max_result_bytes`, cut on
//! code-point boundaries.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamId, register_plugin,
};
use conch_seams::{
    Error, ErrorCode, Interrupted, JobHooks, JobOutput, JobRead, JobSettlement, JobStart,
    JobStatus, Jobs, Key, OMITTED_NOTE, OpenRequest, Result, SendOutcome, SendRequest, SendSettle,
    SessionStatus, Signal, TerminalInfo, TerminalSize, Terminals, Tool, ToolContext, ToolOutput,
    ToolRef,
};
use conch_sync::LockExt;
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::args::{parse_args, schema_of};

/// tool-terminal config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TerminalToolsConfig {
    /// Offer `run_in_background` on terminal_send.
    pub enable_run_in_background: bool,
    /// Cap on every rendered result, in bytes (at least 64).
    pub max_result_bytes: usize,
    /// Output a terminal_send returns when the call gives no `max_output_bytes` (at least
    /// 64; never more than `max_result_bytes`): the newest output is kept, and a note names
    /// a spill with all of it where the shell's world keeps one.
    pub send_output_bytes: usize,
}

impl Default for TerminalToolsConfig {
    fn default() -> Self {
        Self {
            enable_run_in_background: true,
            max_result_bytes: 262_144,
            send_output_bytes: 65_536,
        }
    }
}

impl PluginConfig for TerminalToolsConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::at_least("max_result_bytes", self.max_result_bytes as u64, 64)?;
        ConfigIssue::at_least("send_output_bytes", self.send_output_bytes as u64, 64)
    }
}

/// The longest `timeout_ms` a send may ask for (10 minutes).
const MAX_SEND_TIMEOUT_MS: u64 = 600_000;

/// Caps `body` so that `body + suffix` fits in `max` bytes, on a code-point boundary and,
/// where the kept part has a line break, at the start of a line. The newest output (the
/// tail, where the prompt is) is what survives.
pub(crate) fn cap_result(body: &str, suffix: &str, max: usize) -> String {
    if body.len() + suffix.len() <= max {
        return format!("{body}{suffix}");
    }
    let note = "[result truncated; older output via terminal_read]\n";
    let mid = "[result truncated mid-line; older output via terminal_read]\n";
    let room = max.saturating_sub(suffix.len() + mid.len());
    match conch_output::tail_lines_utf8(body, room) {
        (tail, false) => format!("{note}{tail}{suffix}"),
        (tail, true) => format!("{mid}{tail}{suffix}"),
    }
}

pub(crate) fn status_json(s: &SessionStatus) -> serde_json::Value {
    match s {
        SessionStatus::Running => serde_json::json!({ "state": "running" }),
        SessionStatus::Exited(e) => {
            serde_json::json!({ "state": "exited", "code": e.code, "signal": e.signal })
        }
        SessionStatus::Lost { code, message } => {
            serde_json::json!({ "state": "lost", "code": code.as_str(), "message": message })
        }
    }
}

fn status_text(s: &SessionStatus) -> String {
    match s {
        SessionStatus::Running => "running".into(),
        SessionStatus::Exited(e) => match (e.code, &e.signal) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(sig)) => format!("exited by signal {sig}"),
            (None, None) => "exited".into(),
        },
        SessionStatus::Lost { code, message } => format!("lost ({code}: {message})"),
    }
}

/// The error a foreground send reports when its call was cancelled.
fn interrupted_error(i: &Interrupted) -> Error {
    let what = if i.still_running {
        "send cancelled; SIGINT delivered to the foreground group, but the command still runs \
         (it ignored or trapped SIGINT): text sent next goes to it; stop it with \
         terminal_signal (SIGTERM or SIGKILL) or terminal_close"
    } else if i.typed {
        "send cancelled; SIGINT delivered to the foreground group"
    } else {
        "send cancelled before any text was typed"
    };
    Error::new(ErrorCode::Cancelled, what).with_context("output", i.delta.clone())
}

fn info_json(i: &TerminalInfo) -> serde_json::Value {
    serde_json::json!({
        "session_id": i.id,
        "name": i.name,
        "type": i.type_name,
        "status": status_json(&i.status),
        "sandbox": sandbox_json(i.sandbox),
    })
}

/// A session's sandbox mode for the model: the mode's name, or null when the shell runs
/// unconfined (no sandbox bound), so every listed session says which it is.
fn sandbox_json(mode: Option<conch_seams::SandboxMode>) -> serde_json::Value {
    mode.map_or(serde_json::Value::Null, |m| m.as_str().into())
}

/// How long a background send without `timeout_ms` may wait for readiness (a day: in
/// practice, until the prompt is back, the session ends, or job_kill).
const BACKGROUND_SEND_LIMIT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The line that ends a settled send's result; when a full-screen program holds the alternate
/// screen, its drawing is not in the output, so the result says where to look.
fn send_suffix(s: &SendSettle) -> String {
    format!(
        "\n[wait_reason: {}; session: {}{}]",
        s.wait_reason.as_str(),
        status_text(&s.session_status),
        if s.full_screen {
            "; a full-screen program holds the screen: terminal_read view \"screen\" shows it"
        } else {
            ""
        }
    )
}

/// Renders a settled send: its output within `output_max` bytes, the whole within `max`.
fn render_send(id: &str, s: &SendSettle, output_max: usize, max: usize) -> ToolOutput {
    let suffix = send_suffix(s);
    // The backend's note on output it cut names the spill holding all of it: capped again
    // here, the note stays first (the cap would otherwise take it with the oldest lines).
    let (note, body) = match s.delta.split_once('\n') {
        Some((first, rest)) if first.starts_with(OMITTED_NOTE) => (&s.delta[..=first.len()], rest),
        _ => ("", s.delta.as_str()),
    };
    let room = max.saturating_sub(note.len());
    let text = format!("{note}{}", cap_result(&cap_result(body, "", output_max), &suffix, room));
    let output_len = text.len() - suffix.len();
    ToolOutput {
        structured: Some(serde_json::json!({
            "session_id": id,
            "output": &text[..output_len],
            "wait_reason": s.wait_reason.as_str(),
            "session_status": status_json(&s.session_status),
            "full_screen": s.full_screen,
        })),
        text,
    }
}

/// A result the model reads as prose, with the same facts as structured data.
fn prose(text: &str, value: serde_json::Value, max: usize) -> ToolOutput {
    ToolOutput { text: cap_result(text, "", max), structured: Some(value) }
}

/// One session as a line of prose: `pty-1 "main" (bash, running, sandbox: workspace-write)`.
fn info_text(i: &TerminalInfo) -> String {
    let name = i.name.as_ref().map(|n| format!(" \"{n}\"")).unwrap_or_default();
    format!(
        "{}{name} ({}, {}, {})",
        i.id,
        i.type_name,
        status_text(&i.status),
        sandbox_text(i.sandbox)
    )
}

fn sandbox_text(mode: Option<conch_seams::SandboxMode>) -> String {
    mode.map_or("unconfined".into(), |m| format!("sandbox: {}", m.as_str()))
}

/// Shared state of the seven tools.
#[derive(Debug)]
struct Ctx {
    terminals: Arc<dyn Terminals>,
    jobs: Option<Arc<dyn Jobs>>,
    shell_env: Arc<conch_env::ShellEnv>,
    config: TerminalToolsConfig,
}

impl Ctx {
    /// The jobs seam, when `run_in_background` is offered on terminal_send.
    fn background(&self) -> Result<&Arc<dyn Jobs>> {
        if !self.config.enable_run_in_background {
            return Err(Error::invalid("run_in_background is disabled in this composition"));
        }
        self.jobs.as_ref().ok_or_else(|| {
            Error::new(ErrorCode::Unsupported, "run_in_background needs the jobs plugin")
        })
    }
}

/// A tool's schema without `run_in_background` when this composition cannot honour it.
fn offered_schema(mut schema: serde_json::Value, ctx: &Ctx) -> serde_json::Value {
    if ctx.background().is_err()
        && let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut())
    {
        props.remove("run_in_background");
    }
    schema
}

/// The tools outside this plugin that tool `name` points the model to: `terminal_send`'s
/// background jobs are read with `job_output`.
fn refers_to(name: &str, ctx: &Ctx) -> Vec<ToolRef> {
    if name != "terminal_send" || ctx.background().is_err() {
        return Vec::new();
    }
    vec![ToolRef {
        tool: "job_output".into(),
        because: "terminal_send offers run_in_background; add `tool-jobs: {}` to the \
                  composition, or set `enable_run_in_background: false` on `tool-terminal`"
            .into(),
    }]
}

/// Defines one terminal tool. `{shell}` in the description becomes the backend dialect's
/// name, so the words match the shell the sessions really run.
macro_rules! tool {
    ($ty:ident, $name:literal, $args:ty, $desc:literal) => {
        #[derive(Debug)]
        struct $ty(Arc<Ctx>, String, serde_json::Value);

        impl $ty {
            fn new(ctx: Arc<Ctx>) -> Self {
                let description = $desc.replace("{shell}", ctx.terminals.dialect().name());
                // Built once: what is offered depends on the composition, not on the call.
                let schema = offered_schema(schema_of::<$args>(), &ctx);
                Self(ctx, description, schema)
            }
        }

        #[async_trait]
        impl Tool for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn description(&self) -> &str {
                &self.1
            }

            fn input_schema(&self) -> serde_json::Value {
                self.2.clone()
            }

            fn refers_to(&self) -> Vec<ToolRef> {
                refers_to($name, &self.0)
            }

            async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
                if args.get("run_in_background").is_some() {
                    // Withheld (see `offered_schema`): say why rather than "unknown field".
                    self.0.background()?;
                }
                let args: $args = parse_args($name, args, &self.2)?;
                self.run(ctx, args).await
            }
        }
    };
}

/// Arguments of `terminal_open`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct OpenArgs {
    /// Backend type (`bash` or `pwsh`; default: the composition's backend).
    #[serde(default, rename = "type")]
    type_name: Option<String>,
    /// Optional name, unique among your sessions.
    #[serde(default)]
    name: Option<String>,
    /// Working directory.
    #[serde(default)]
    cwd: Option<String>,
    /// Terminal rows (default: the composition's, 24 unless configured).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    rows: Option<u16>,
    /// Terminal columns (default: the composition's, 200 unless configured).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    cols: Option<u16>,
    /// TERM for the shell and its programs, a terminfo name (default: the composition's,
    /// xterm-256color unless configured; pwsh sessions keep dumb).
    #[serde(default)]
    term: Option<String>,
}

/// The size asked for: both of rows and cols, or neither.
fn requested_size(
    tool: &str,
    rows: Option<u16>,
    cols: Option<u16>,
) -> Result<Option<TerminalSize>> {
    match (rows, cols) {
        (Some(rows), Some(cols)) => Ok(Some(TerminalSize { rows, cols })),
        (None, None) => Ok(None),
        _ => Err(Error::invalid(format!(
            "invalid arguments for `{tool}`: give both rows and cols, or neither"
        ))),
    }
}

tool!(
    OpenTool,
    "terminal_open",
    OpenArgs,
    "Open a persistent terminal session ({shell} on a PTY). State (cwd, variables, running \
     programs) persists across terminal_send calls. rows and cols set the terminal size \
     (change it later with terminal_resize); term sets TERM. Close the session with \
     terminal_close when done."
);

impl OpenTool {
    async fn run(&self, ctx: &ToolContext, a: OpenArgs) -> Result<ToolOutput> {
        let mut req = OpenRequest::default();
        req.type_name = a.type_name;
        req.name = a.name;
        req.cwd = a.cwd.map(PathBuf::from);
        req.size = requested_size("terminal_open", a.rows, a.cols)?;
        req.term = a.term;
        req.managed_env = self.0.shell_env.snapshot(ctx.owner.session_id());
        let info = self.0.terminals.open(&ctx.owner, req, ctx.cancel.clone()).await?;
        let v = serde_json::json!({
            "session_id": info.id, "name": info.name, "type": info.type_name, "motd": info.motd,
            "sandbox": sandbox_json(info.sandbox),
        });
        let name = info.name.as_ref().map(|n| format!(", name \"{n}\"")).unwrap_or_default();
        let mut text = format!(
            "Opened terminal session {} ({}{name}, {}); type into it with terminal_send.",
            info.id,
            info.type_name,
            sandbox_text(info.sandbox)
        );
        if !info.motd.trim().is_empty() {
            text.push('\n');
            text.push_str(info.motd.trim_end());
        }
        Ok(prose(&text, v, self.0.config.max_result_bytes))
    }
}

/// Arguments of `terminal_send`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SendArgs {
    /// The session id from terminal_open (`pty-N`), or the name given there.
    session_id: String,
    /// Text typed literally (UTF-8; default empty): tabs, `!`, quotes and line breaks arrive
    /// as text and never trigger completion or history. Several lines run in order; `\r\n`,
    /// `\r` and `\n` are each one line end.
    #[serde(default)]
    text: String,
    /// Keys pressed after the text, in order: Enter, Tab, BTab, Esc, Backspace, Delete, Up,
    /// Down, Left, Right, Home, End, PageUp, PageDown, or Control plus a key as C-a .. C-z,
    /// C-\, C-], C-@ (C-c interrupts, C-d ends input).
    #[serde(default)]
    keys: Option<Vec<String>>,
    /// Press Enter after the text and keys (default true, false when keys are given).
    #[serde(default)]
    submit: Option<bool>,
    /// Wait up to this many milliseconds (1 to 600000) for the prompt, a program waiting
    /// for input, or wait_for; output silence does not end the wait. The command keeps
    /// running when it returns. Without it, output silence (inferred_idle, 3 s by default)
    /// or the backend's deadline (30 s by default) also ends a send.
    #[serde(default)]
    #[schemars(range(min = 1, max = 600_000))]
    timeout_ms: Option<u64>,
    /// A regular expression (Rust syntax, multi-line: ^ and $ match at each line): return
    /// as soon as the output matches (wait_reason matched). The output includes the echo
    /// of the typed line, so anchor a pattern the command line itself contains (^ready$).
    /// Silence does not end the wait.
    #[serde(default)]
    wait_for: Option<String>,
    /// Most bytes of output returned (at least 64; default 65536): the newest are kept, and
    /// the first line names a file with all of it where one could be kept.
    #[serde(default)]
    #[schemars(range(min = 64))]
    max_output_bytes: Option<usize>,
    /// Return at once with a job id; read the result with job_output. The job shows output
    /// as it arrives and completes when the prompt is back, a program waits for input, the
    /// session ends, or timeout_ms passes; silence keeps it running.
    #[serde(default)]
    run_in_background: Option<bool>,
}

tool!(
    SendTool,
    "terminal_send",
    SendArgs,
    "Type text into a terminal session and wait until it is reasonable to look again. Text \
     is typed literally, lines run in order, and Enter is pressed after it unless submit is \
     false; press keys (C-c, Tab, Up, Esc...) with keys. To just wait for a running command, \
     send no text with submit false and a timeout_ms. wait_reason says why it returned: \
     stdin_read (a prompt or a program is waiting for input), inferred_idle (output went \
     quiet and the program uses no CPU; it may still be running), matched (wait_for \
     appeared), timeout (the command may still run), or session_exit. It never means the \
     command finished unless the prompt returned. The output is line by line as the \
     terminal shows it (carriage-return redraws and backspaces applied); what a full-screen \
     program (vim, less, top) draws is left out (full_screen says one holds the screen): \
     read it with terminal_read view \"screen\"."
);

/// A background send's output: what arrived so far (the newest `cap` bytes), then the
/// rendered result once the send settled.
struct SendOutput {
    stream: Mutex<SendStream>,
}

#[derive(Default)]
struct SendStream {
    /// The retained text: the newest bytes of everything pushed.
    text: String,
    /// Bytes pushed in all (the retained text ends there).
    total: u64,
    /// How far consuming reads got.
    read_to: u64,
    cap: usize,
}

impl SendOutput {
    fn new(cap: usize) -> Self {
        Self { stream: Mutex::new(SendStream { cap, ..SendStream::default() }) }
    }

    fn push(&self, piece: &str) {
        let mut g = self.stream.locked();
        g.total += piece.len() as u64;
        g.text.push_str(piece);
        if g.text.len() > g.cap {
            g.text = conch_output::tail_utf8(&g.text, g.cap).to_string();
        }
    }
}

#[async_trait::async_trait]
impl JobOutput for SendOutput {
    fn read(&self) -> JobRead {
        let mut g = self.stream.locked();
        let start = g.total - g.text.len() as u64;
        let skipped = start.saturating_sub(g.read_to);
        let from = usize::try_from(g.read_to.saturating_sub(start)).unwrap_or(usize::MAX);
        let text = g.text.get(from..).unwrap_or_default().to_string();
        g.read_to = g.total;
        JobRead { text, lossy: skipped > 0, skipped_bytes: skipped, ..JobRead::default() }
    }

    fn snapshot(&self) -> JobRead {
        let g = self.stream.locked();
        let skipped = g.total - g.text.len() as u64;
        JobRead {
            text: g.text.clone(),
            lossy: skipped > 0,
            skipped_bytes: skipped,
            ..JobRead::default()
        }
    }

    async fn release(&self) -> Result<()> {
        Ok(())
    }
}

/// The key names [`key_from_name`] accepts, for errors.
const KEY_NAMES: &str = "Enter, Tab, BTab, Esc, Backspace, Delete, Up, Down, Left, \
    Right, Home, End, PageUp, PageDown, C-a .. C-z, C-\\, C-], C-@";

/// Parses a key name (case-sensitive words as in [`KEY_NAMES`]; `C-x` also as `^X`).
fn key_from_name(name: &str) -> Option<Key> {
    Some(match name {
        "Enter" => Key::Enter,
        "Tab" => Key::Tab,
        "BTab" => Key::BackTab,
        "Esc" => Key::Esc,
        "Backspace" => Key::Backspace,
        "Delete" => Key::Delete,
        "Up" => Key::Up,
        "Down" => Key::Down,
        "Right" => Key::Right,
        "Left" => Key::Left,
        "Home" => Key::Home,
        "End" => Key::End,
        "PageUp" => Key::PageUp,
        "PageDown" => Key::PageDown,
        _ => {
            let rest = name.strip_prefix("C-").or_else(|| name.strip_prefix('^'))?;
            let &[c] = rest.as_bytes() else { return None };
            let c = c.to_ascii_lowercase();
            if !(c.is_ascii_lowercase() || matches!(c, b'\\' | b']' | b'@')) {
                return None;
            }
            Key::Ctrl(c)
        }
    })
}

/// Validates the key names of a send.
fn parse_keys(names: &[String]) -> Result<Vec<Key>> {
    names
        .iter()
        .map(|n| {
            key_from_name(n).ok_or_else(|| {
                Error::invalid(format!(
                    "invalid arguments for `terminal_send`: unknown key {n:?} (keys: {KEY_NAMES})"
                ))
            })
        })
        .collect()
}

impl SendTool {
    async fn run(&self, ctx: &ToolContext, a: SendArgs) -> Result<ToolOutput> {
        let keys = parse_keys(a.keys.as_deref().unwrap_or_default())?;
        if a.timeout_ms.is_some_and(|t| !(1..=MAX_SEND_TIMEOUT_MS).contains(&t)) {
            return Err(Error::invalid(
                "invalid arguments for `terminal_send`: timeout_ms must be 1 to 600000",
            ));
        }
        if a.max_output_bytes.is_some_and(|m| m < 64) {
            return Err(Error::invalid(
                "invalid arguments for `terminal_send`: max_output_bytes must be at least 64",
            ));
        }
        let max = self.0.config.max_result_bytes;
        let background = a.run_in_background.unwrap_or(false);
        let mut req = SendRequest::typed(a.text.clone(), a.submit.unwrap_or(keys.is_empty()));
        req.keys = keys;
        req.timeout = a.timeout_ms.map(std::time::Duration::from_millis);
        // An explicit deadline or pattern is the model saying how long to wait: silence
        // must not cut it short. A background send completes at readiness, never at silence.
        req.ignore_silence = a.timeout_ms.is_some() || background;
        req.wait_for = a.wait_for;
        // The result is capped again when rendered; the backend keeps only what can show.
        let output = a.max_output_bytes.unwrap_or(self.0.config.send_output_bytes).min(max);
        req.max_output_bytes = Some(output);
        if !background {
            let slot = self.0.terminals.reserve_send(&ctx.owner, &a.session_id)?;
            return match slot.send(req, ctx.cancel.clone()).await? {
                SendOutcome::Ready(settle) => Ok(render_send(&a.session_id, &settle, output, max)),
                SendOutcome::Interrupted(i) => Err(interrupted_error(&i)),
            };
        }
        let jobs = self.0.background()?;
        // The exclusive send slot is taken before the job id exists, so no other send can
        // slip in between publication and the write.
        let slot = self.0.terminals.reserve_send(&ctx.owner, &a.session_id)?;
        let mut start = JobStart::new("pty-send", format!("{}: {}", a.session_id, a.text));
        start.output_cap = max;
        let output_cap = output;
        if req.timeout.is_none() {
            // Until readiness, however long it takes (job_kill stops it).
            req.timeout = Some(BACKGROUND_SEND_LIMIT);
        }
        let info = jobs
            .start(
                &ctx.owner,
                start,
                Box::new(move || {
                    Box::pin(async move {
                        let cancel = CancellationToken::new();
                        let output = Arc::new(SendOutput::new(output_cap));
                        let out2 = Arc::clone(&output);
                        let sink = Arc::clone(&output);
                        req.progress = Some(Arc::new(move |piece: &str| sink.push(piece)));
                        let c2 = cancel.clone();
                        let task = tokio::spawn(async move {
                            let r = slot.send(req, c2).await;
                            let (rendered, settlement) = match r {
                                Ok(SendOutcome::Ready(s)) => (
                                    send_suffix(&s),
                                    JobSettlement {
                                        status: JobStatus::Completed,
                                        detail: Some(format!(
                                            "wait_reason: {}",
                                            s.wait_reason.as_str()
                                        )),
                                    },
                                ),
                                Ok(SendOutcome::Interrupted(i)) => (
                                    format!("\n[{}]", interrupted_error(&i).message()),
                                    JobSettlement {
                                        status: JobStatus::Killed,
                                        detail: Some(
                                            if i.still_running {
                                                "SIGINT delivered; the command still runs"
                                            } else if i.typed {
                                                "SIGINT delivered"
                                            } else {
                                                "cancelled before any text was typed"
                                            }
                                            .into(),
                                        ),
                                    },
                                ),
                                // The session's world went away: the send's fate is unknown.
                                Err(e)
                                    if matches!(
                                        e.code(),
                                        ErrorCode::RemoteUnavailable | ErrorCode::ConnectionFailed
                                    ) =>
                                {
                                    (
                                        format!("\n[{e}]"),
                                        JobSettlement {
                                            status: JobStatus::Lost,
                                            detail: Some(format!("{}: {e}", e.code())),
                                        },
                                    )
                                }
                                Err(e) => (
                                    format!("\n[{e}]"),
                                    JobSettlement {
                                        status: JobStatus::Failed,
                                        detail: Some(e.code().to_string()),
                                    },
                                ),
                            };
                            // The output itself streamed in already: what is left is how it
                            // ended.
                            out2.push(&rendered);
                            settlement
                        });
                        Ok(JobHooks {
                            // A local token: cancelling it is delivered at once.
                            cancel: Box::new(move || {
                                cancel.cancel();
                                Box::pin(async { Ok(()) })
                            }),
                            done: Box::pin(async move {
                                task.await.unwrap_or(JobSettlement {
                                    status: JobStatus::Failed,
                                    detail: Some("send task panicked".into()),
                                })
                            }),
                            output: Some(output),
                        })
                    })
                }),
            )
            .await?;
        Ok(ToolOutput {
            text: format!(
                "started background job {} on {}; read its output with job_output (wait: true \
                 waits for the prompt)",
                info.id, a.session_id
            ),
            structured: Some(serde_json::json!({ "job_id": info.id, "session_id": a.session_id })),
        })
    }
}

/// What `terminal_read` returns.
#[derive(Debug, Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ReadView {
    /// Retained lines, paged backward from the newest.
    Scrollback,
    /// The visible screen as a person sees it.
    Screen,
}

/// Arguments of `terminal_read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// The session id (`pty-N`), or the name given at terminal_open.
    session_id: String,
    /// `scrollback` (default): retained lines, paged with offset_lines and max_lines.
    /// `screen`: the visible screen as a person sees it (a full-screen program's included),
    /// trailing blanks trimmed.
    #[serde(default)]
    view: Option<ReadView>,
    /// How many lines back from the newest the page ends (default 0).
    #[serde(default)]
    offset_lines: Option<usize>,
    /// Lines per page, at least 1 (default 200).
    #[serde(default)]
    #[schemars(range(min = 1))]
    max_lines: Option<usize>,
}

tool!(
    ReadTool,
    "terminal_read",
    ReadArgs,
    "Read a terminal session: its retained scrollback (the default), paging backward from the \
     newest line, where truncated means older output was dropped from retention or the page \
     was cut; or, with view \"screen\", the visible screen as a person would see it (what vim, \
     less or top show), with the cursor position and whether a full-screen program holds the \
     alternate screen."
);

impl ReadTool {
    async fn run(&self, ctx: &ToolContext, a: ReadArgs) -> Result<ToolOutput> {
        if a.view == Some(ReadView::Screen) {
            if a.offset_lines.is_some() || a.max_lines.is_some() {
                return Err(Error::invalid(
                    "invalid arguments for `terminal_read`: offset_lines and max_lines page the \
                     scrollback; the screen view takes neither",
                ));
            }
            let v = self.0.terminals.screen(&ctx.owner, &a.session_id)?;
            let suffix = format!(
                "\n[screen {}x{}; cursor at row {}, col {}{}]",
                v.size.rows,
                v.size.cols,
                v.cursor.0,
                v.cursor.1,
                if v.alternate { "; full-screen program (alternate screen)" } else { "" }
            );
            let text = cap_result(&v.text, &suffix, self.0.config.max_result_bytes);
            let body = &text[..text.len() - suffix.len()];
            return Ok(ToolOutput {
                structured: Some(serde_json::json!({
                    "view": "screen", "text": body, "rows": v.size.rows, "cols": v.size.cols,
                    "cursor": { "row": v.cursor.0, "col": v.cursor.1 },
                    "alternate_screen": v.alternate, "truncated": body.len() < v.text.len(),
                })),
                text,
            });
        }
        if a.max_lines == Some(0) {
            return Err(Error::invalid(
                "invalid arguments for `terminal_read`: max_lines must be at least 1",
            ));
        }
        let p = self.0.terminals.read(
            &ctx.owner,
            &a.session_id,
            a.offset_lines.unwrap_or(0),
            a.max_lines.unwrap_or(200),
        )?;
        let offset = a.offset_lines.unwrap_or(0);
        let suffix = if p.text.is_empty() && offset > 0 && p.line_begin == p.line_end {
            // Paged past the oldest retained line: say so rather than return a bare empty page.
            format!(
                "[offset_lines {offset} is past the oldest retained line; {} of {} lines are \
                 retained{}]",
                p.total_lines - p.line_end,
                p.total_lines,
                if p.line_end > 0 { "; older output was dropped from retention" } else { "" }
            )
        } else {
            format!(
                "\n[lines {}..{} of {}{}]",
                p.line_begin,
                p.line_end,
                p.total_lines,
                if p.truncated { "; truncated" } else { "" }
            )
        };
        let text = cap_result(&p.text, &suffix, self.0.config.max_result_bytes);
        let body = &text[..text.len() - suffix.len()];
        Ok(ToolOutput {
            structured: Some(serde_json::json!({
                "text": body, "total_lines": p.total_lines, "line_begin": p.line_begin,
                "line_end": p.line_end, "truncated": p.truncated || body.len() < p.text.len(),
            })),
            text,
        })
    }
}

/// Signals the model may send.
#[derive(Debug, Deserialize, JsonSchema, Clone, Copy)]
enum SignalName {
    /// Interrupt, as Ctrl-C would.
    #[serde(rename = "SIGINT")]
    Int,
    /// Ask to terminate (a program may catch it).
    #[serde(rename = "SIGTERM")]
    Term,
    /// Kill (rejected when the shell itself is in the foreground).
    #[serde(rename = "SIGKILL")]
    Kill,
    /// Stop (suspend).
    #[serde(rename = "SIGTSTP")]
    Tstp,
    /// Hang up.
    #[serde(rename = "SIGHUP")]
    Hup,
}

/// Arguments of `terminal_signal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SignalArgs {
    /// The session id (`pty-N`), or the name given at terminal_open.
    session_id: String,
    /// The signal for the terminal's current foreground process group: SIGINT (interrupt),
    /// SIGTERM (terminate), SIGKILL (kill; rejected when the shell itself is in the
    /// foreground), SIGTSTP (suspend) or SIGHUP (hang up).
    signal: SignalName,
}

tool!(
    SignalTool,
    "terminal_signal",
    SignalArgs,
    "Send a signal to the foreground process group of a terminal session (for example SIGINT \
     to interrupt a running command). SIGKILL at the shell itself is rejected: use terminal_close."
);

impl SignalTool {
    async fn run(&self, ctx: &ToolContext, a: SignalArgs) -> Result<ToolOutput> {
        let signal = match a.signal {
            SignalName::Int => Signal::Int,
            SignalName::Term => Signal::Term,
            SignalName::Kill => Signal::Kill,
            SignalName::Tstp => Signal::Tstp,
            SignalName::Hup => Signal::Hup,
        };
        let d = self.0.terminals.signal(&ctx.owner, &a.session_id, signal).await?;
        Ok(prose(
            &format!(
                "Sent {} to the foreground process group {} of {}.",
                signal.as_str(),
                d.pgid,
                a.session_id
            ),
            serde_json::json!({
                "delivered": true, "signal": signal.as_str(), "target_pgid": d.pgid,
            }),
            self.0.config.max_result_bytes,
        ))
    }
}

/// Arguments of `terminal_resize`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ResizeArgs {
    /// The session id (`pty-N`), or the name given at terminal_open.
    session_id: String,
    /// New rows.
    #[schemars(range(min = 1, max = 1000))]
    rows: u16,
    /// New columns.
    #[schemars(range(min = 1, max = 1000))]
    cols: u16,
}

tool!(
    ResizeTool,
    "terminal_resize",
    ResizeArgs,
    "Change a terminal session's rows and columns. The program in the foreground is told \
     (SIGWINCH) and sees the new size (stty size, tput cols); full-screen programs redraw."
);

impl ResizeTool {
    async fn run(&self, ctx: &ToolContext, a: ResizeArgs) -> Result<ToolOutput> {
        let size =
            requested_size("terminal_resize", Some(a.rows), Some(a.cols))?.unwrap_or_default();
        self.0.terminals.resize(&ctx.owner, &a.session_id, size).await?;
        Ok(prose(
            &format!(
                "Resized terminal session {} to {} rows and {} columns; its foreground program \
                 was told (SIGWINCH).",
                a.session_id, a.rows, a.cols
            ),
            serde_json::json!({ "session_id": a.session_id, "rows": a.rows, "cols": a.cols }),
            self.0.config.max_result_bytes,
        ))
    }
}

/// Arguments naming one session.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    /// The session id (`pty-N`), or the name given at terminal_open.
    session_id: String,
}

tool!(
    CloseTool,
    "terminal_close",
    SessionArgs,
    "Close a terminal session: stops every process it started (detached ones, e.g. with \
     setsid or nohup, included) and returns once they are gone."
);

impl CloseTool {
    async fn run(&self, ctx: &ToolContext, a: SessionArgs) -> Result<ToolOutput> {
        let r = self.0.terminals.close(&ctx.owner, &a.session_id).await?;
        let gone = if r.survivors.is_empty() {
            "every process it started is gone".to_string()
        } else {
            let pids: Vec<String> = r.survivors.iter().map(u32::to_string).collect();
            format!("still alive after teardown: pid {}", pids.join(", "))
        };
        Ok(prose(
            &format!(
                "Closed terminal session {}: its shell {}; {gone}.",
                a.session_id,
                status_text(&r.root_exit)
            ),
            serde_json::json!({
                "session_id": a.session_id, "closed": true,
                "root_exit": status_json(&r.root_exit), "survivors": r.survivors,
            }),
            self.0.config.max_result_bytes,
        ))
    }
}

/// Arguments of `terminal_list` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {}

tool!(ListTool, "terminal_list", ListArgs, "List your open terminal sessions.");

impl ListTool {
    async fn run(&self, ctx: &ToolContext, _: ListArgs) -> Result<ToolOutput> {
        let infos = self.0.terminals.list(&ctx.owner);
        let list: Vec<serde_json::Value> = infos.iter().map(info_json).collect();
        let text = if infos.is_empty() {
            "No open terminal sessions.".to_string()
        } else {
            let lines: Vec<String> = infos.iter().map(info_text).collect();
            format!("{} open terminal session(s):\n{}", infos.len(), lines.join("\n"))
        };
        Ok(prose(&text, serde_json::json!({ "sessions": list }), self.0.config.max_result_bytes))
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: TerminalToolsConfig = ctx.config()?;
    let shared = Arc::new(Ctx {
        terminals: ctx.terminals()?,
        jobs: ctx.jobs().ok(),
        shell_env: ctx.shell_env(),
        config,
    });
    Ok(PluginOutput::tools(vec![
        Arc::new(OpenTool::new(Arc::clone(&shared))),
        Arc::new(SendTool::new(Arc::clone(&shared))),
        Arc::new(ReadTool::new(Arc::clone(&shared))),
        Arc::new(ResizeTool::new(Arc::clone(&shared))),
        Arc::new(SignalTool::new(Arc::clone(&shared))),
        Arc::new(ListTool::new(Arc::clone(&shared))),
        Arc::new(CloseTool::new(shared)),
    ]))
}

register_plugin!(PluginEntry {
    name: "tool-terminal",
    provides: None,
    requires: &[SeamId::Terminals],
    description: "terminal_open/send/read/resize/signal/list/close over the terminals service",
    build,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_result_respects_the_byte_cap_on_char_boundaries() {
        let body = "é".repeat(100);
        let out = cap_result(&body, "\n[x]", 64);
        assert!(out.len() <= 64, "{}", out.len());
        assert!(out.ends_with("\n[x]"));
        assert!(out.contains("[result truncated"));
        assert_eq!(cap_result("ok", "!", 64), "ok!");
    }

    #[test]
    fn key_names_parse_to_keys() {
        assert_eq!(key_from_name("C-c"), Some(Key::Ctrl(b'c')));
        assert_eq!(key_from_name("^D"), Some(Key::Ctrl(b'd')));
        assert_eq!(key_from_name("C-\\"), Some(Key::Ctrl(b'\\')));
        assert_eq!(key_from_name("C-@"), Some(Key::Ctrl(b'@')));
        assert_eq!(key_from_name("Tab"), Some(Key::Tab));
        assert_eq!(key_from_name("BTab"), Some(Key::BackTab));
        assert_eq!(key_from_name("C-cc"), None);
        assert_eq!(key_from_name("C-1"), None);
        assert_eq!(key_from_name("enter"), None);
    }
}
