//! Named bash sessions: each is a persistent shell on the terminals service, owned by the
//! front end's one owner.
//!
//! - A plain `BashAction` is checked with `bash -n` first (a syntax error is
//!   `BashIncorrectSyntaxError` and nothing runs, as swe-rex does), then runs as one framed
//!   command ([`conch_seams::SendSlot::run_command`]): its own output and exit status come
//!   back through markers a custom PS1, `set -e` or conda cannot break. A deadline or a wait
//!   for terminal input stops the command (interrupt, then kill) and the session goes on at its
//!   prompt; the error carries what the command printed (`extra_info.output`).
//! - An interactive action (`is_interactive_command` / `is_interactive_quit`) is typed as a
//!   line and returns when one of its `expect` patterns (regexes, as in swe-rex) appears, when
//!   the shell's own prompt comes back, or when the program waits for input: with no
//!   patterns that is the answer (a REPL at its prompt); with patterns none of which
//!   appeared it is `CommandTimeoutError` at once instead of at the deadline.
//! - An interrupt presses Ctrl-C (what swe-rex sends) until the shell's prompt or a pattern
//!   comes back, `n_retry` times; then the foreground command's group is killed.
//! - One action runs at a time per session (later ones wait their turn).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conch_seams::{
    CommandEnd, Key, OpenRequest, Owner, SendOutcome, SendRequest, SendSettle, Signal, SpawnSpec,
    StdinSpec, StopCause, StreamId, Subprocess, Terminals, WaitReason,
};
use conch_sync::LockExt;
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use crate::error::{Raised, class};
use crate::models::{
    BashAction, Check, CreateSession, CreateSessionResponse, InterruptAction, Observation,
};

/// What swe-rex reports as `expect_string` when its prompt (not a pattern) ended a command.
const PROMPT_EXPECT: &str = "SHELLPS1PREFIX";
/// A `timeout: null` action waits this long (swe-rex: forever).
const NO_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long an interrupt's last resort (killing the foreground command) waits for the prompt.
const KILL_SETTLE: Duration = Duration::from_secs(5);
/// Largest command the syntax check reads (bash's own limits are far above any real one).
const MAX_CHECK_OUTPUT: usize = 64 * 1024;

fn seconds(t: f64) -> Duration {
    if t.is_finite() && t > 0.0 { Duration::from_secs_f64(t.min(1e9)) } else { Duration::ZERO }
}

/// One named session: its terminal id and the lock that runs its actions one at a time.
#[derive(Debug)]
struct Named {
    id: String,
    turn: AsyncMutex<()>,
}

/// The named sessions of one API.
#[derive(Debug)]
pub(crate) struct Sessions {
    terminals: Arc<dyn Terminals>,
    subprocess: Arc<dyn Subprocess>,
    owner: Arc<Owner>,
    named: std::sync::Mutex<HashMap<String, Arc<Named>>>,
    /// Creation and close of names, one at a time (an open takes a while).
    lifecycle: AsyncMutex<()>,
}

impl Sessions {
    pub(crate) fn new(
        terminals: Arc<dyn Terminals>,
        subprocess: Arc<dyn Subprocess>,
        owner: Arc<Owner>,
    ) -> Self {
        Self {
            terminals,
            subprocess,
            owner,
            named: std::sync::Mutex::new(HashMap::new()),
            lifecycle: AsyncMutex::new(()),
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Named>, Raised> {
        let named = self.named.locked();
        named.get(name).cloned().ok_or_else(|| {
            Raised::new(class::NO_SESSION, format!("session {name:?} does not exist"))
        })
    }

    pub(crate) async fn create(&self, req: CreateSession) -> Result<CreateSessionResponse, Raised> {
        if req.session_type != "bash" {
            return Err(Raised::new(
                class::VALUE,
                format!("unknown session type: {:?}", req.session_type),
            ));
        }
        let _turn = self.lifecycle.lock().await;
        if self.get(&req.session).is_ok() {
            return Err(Raised::new(
                class::SESSION_EXISTS,
                format!("session {} already exists", req.session),
            ));
        }
        let info = self
            .terminals
            .open(&self.owner, OpenRequest::default(), CancellationToken::new())
            .await
            .map_err(shell_error)?;
        let named = Arc::new(Named { id: info.id, turn: AsyncMutex::new(()) });
        let output = match self.source(&named, info.motd, &req).await {
            Ok(output) => output,
            Err(e) => {
                let _ = self.terminals.close(&self.owner, &named.id).await;
                return Err(e);
            }
        };
        self.named.locked().insert(req.session, named);
        Ok(CreateSessionResponse { output, session_type: "bash" })
    }

    /// Sources each `startup_source` file in the new shell itself, so what it sets (a conda
    /// env, a PS1) stays; the framing does not depend on the prompt it leaves. Returns the
    /// output so far after `motd`.
    async fn source(
        &self,
        named: &Named,
        mut output: String,
        req: &CreateSession,
    ) -> Result<String, Raised> {
        for path in &req.startup_source {
            let line = format!("source {}", quote(path));
            let ran = self.run_framed(named, &line, seconds(req.startup_timeout)).await?;
            output.push_str(&ran.output);
            if !matches!(ran.end, CommandEnd::Exited(_)) {
                return Err(Raised::new(
                    class::TIMEOUT,
                    format!("sourcing {path:?} did not finish within startup_timeout"),
                )
                .with("output", output));
            }
        }
        Ok(output)
    }

    /// Closes one session: every process it started is stopped before this returns.
    pub(crate) async fn close(&self, name: &str) -> Result<(), Raised> {
        let _turn = self.lifecycle.lock().await;
        let named = self.get(name)?;
        self.named.locked().remove(name);
        self.close_terminal(&named).await
    }

    async fn close_terminal(&self, named: &Named) -> Result<(), Raised> {
        let report = self.terminals.close(&self.owner, &named.id).await.map_err(shell_error)?;
        if report.survivors.is_empty() {
            Ok(())
        } else {
            Err(Raised::new(
                class::SWEREX,
                format!("processes {:?} survived closing the session", report.survivors),
            ))
        }
    }

    /// Closes every session.
    pub(crate) async fn close_all(&self) -> Result<(), Raised> {
        let _turn = self.lifecycle.lock().await;
        let all: Vec<Arc<Named>> = {
            let mut named = self.named.locked();
            named.drain().map(|(_, n)| n).collect()
        };
        let mut first = Ok(());
        for n in all {
            let r = self.close_terminal(&n).await;
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    async fn run_framed(
        &self,
        named: &Named,
        command: &str,
        timeout: Duration,
    ) -> Result<conch_seams::CommandOutcome, Raised> {
        let slot = self.terminals.reserve_send(&self.owner, &named.id).map_err(shell_error)?;
        slot.run_command(command.to_string(), timeout, CancellationToken::new())
            .await
            .map_err(shell_error)
    }

    async fn send(&self, named: &Named, req: SendRequest) -> Result<SendSettle, Raised> {
        let slot = self.terminals.reserve_send(&self.owner, &named.id).map_err(shell_error)?;
        match slot.send(req, CancellationToken::new()).await.map_err(shell_error)? {
            SendOutcome::Ready(s) => Ok(s),
            // Never cancelled here; an interruption would be the shell's doing.
            SendOutcome::Interrupted(i) => {
                Err(Raised::new(class::SWEREX, "the send was interrupted").with("output", i.delta))
            }
        }
    }

    /// The shell of `name` exited: the session is gone.
    async fn forget(&self, name: &str, named: &Named, output: String) -> Raised {
        self.named.locked().remove(name);
        let _ = self.terminals.close(&self.owner, &named.id).await;
        Raised::new(
            class::NO_SESSION,
            format!("the shell of session {name:?} exited; create the session again"),
        )
        .with("output", output)
    }

    pub(crate) async fn run(&self, a: BashAction) -> Result<Observation, Raised> {
        let named = self.get(&a.session)?;
        let _turn = named.turn.lock().await;
        if a.is_interactive_command || a.is_interactive_quit {
            return self.run_interactive(&named, a).await;
        }
        self.check_syntax(&a.command).await?;
        let timeout = a.timeout.map_or(NO_TIMEOUT, seconds);
        let ran = self.run_framed(&named, &a.command, timeout).await?;
        let output = whole_output(&ran).await;
        let code = match ran.end {
            CommandEnd::Exited(code) => code,
            CommandEnd::SessionExited => return Err(self.forget(&a.session, &named, output).await),
            CommandEnd::Stopped(StopCause::WaitingForInput) | CommandEnd::WaitingForInput => {
                let stopped = matches!(ran.end, CommandEnd::Stopped(_));
                return Err(Raised::new(
                    class::TIMEOUT,
                    format!(
                        "command {:?} waited for input on the terminal{}",
                        a.command,
                        if stopped { " and was stopped" } else { "" }
                    ),
                )
                .with("output", output)
                .with("reason", "waiting_for_input")
                .with("stopped", stopped));
            }
            CommandEnd::Stopped(_) | CommandEnd::TimedOut | CommandEnd::Cancelled => {
                let stopped = matches!(ran.end, CommandEnd::Stopped(_));
                return Err(timed_out(&a, output).with("stopped", stopped));
            }
        };
        if a.check == Check::Raise && code != 0 {
            let mut msg = format!(
                "Command {:?} failed with exit code {code}. Here is the output:\n{output:?}",
                a.command
            );
            if !a.error_msg.is_empty() {
                msg = format!("{}: {msg}", a.error_msg);
            }
            return Err(Raised::new(class::NON_ZERO, msg)
                .with("output", output)
                .with("exit_code", code));
        }
        let exit_code = (a.check != Check::Ignore).then_some(code);
        Ok(Observation {
            output,
            exit_code,
            expect_string: PROMPT_EXPECT.into(),
            session_type: "bash",
            ..Observation::default()
        })
    }

    /// `bash -n` on the command, in the session's world, before anything runs.
    async fn check_syntax(&self, command: &str) -> Result<(), Raised> {
        let spec = SpawnSpec::in_default_dir(vec!["bash".into(), "-n".into()])
            .with_stdin(StdinSpec::bytes(command.as_bytes().to_vec()))
            .with_stdout(conch_seams::OutputSpec::Collect {
                max_bytes: MAX_CHECK_OUTPUT,
                spill_cap: 0,
            })
            .with_stderr(conch_seams::OutputSpec::Collect {
                max_bytes: MAX_CHECK_OUTPUT,
                spill_cap: 0,
            });
        let p = self.subprocess.spawn(spec).await.map_err(shell_error)?;
        let status = p.wait().await.map_err(shell_error)?;
        if status.code == Some(0) {
            return Ok(());
        }
        let out = p.collected(StreamId::Stdout).map(|c| c.text).unwrap_or_default();
        let err = p.collected(StreamId::Stderr).map(|c| c.text).unwrap_or_default();
        let code = status.code.map_or_else(|| "killed".to_string(), |c| c.to_string());
        Err(Raised::new(
            class::SYNTAX,
            format!(
                "Error (exit code {code}) while checking bash command \n{command:?}\n---- Stderr ----\n{err}\n---- Stdout ----\n{out}"
            ),
        )
        .with("bash_stdout", out)
        .with("bash_stderr", err))
    }

    async fn run_interactive(&self, named: &Named, a: BashAction) -> Result<Observation, Raised> {
        let patterns = Patterns::new(&a.expect)?;
        let mut req = SendRequest::line(a.command.clone());
        req.timeout = Some(a.timeout.map_or(NO_TIMEOUT, seconds));
        req.ignore_silence = true;
        req.wait_for = patterns.union();
        let s = self.send(named, req).await?;
        let (output, expect_string) = before_match(&s, &patterns);
        let output = strip_echo(&output, &a.command);
        let expect_string = match (s.wait_reason, s.at_prompt) {
            (WaitReason::Matched, _) | (WaitReason::StdinRead, true) => expect_string,
            // A program reads the terminal: with no patterns, that is the answer.
            (WaitReason::StdinRead, false) if patterns.is_empty() => String::new(),
            (WaitReason::StdinRead, false) => {
                return Err(Raised::new(
                    class::TIMEOUT,
                    format!(
                        "{:?} is waiting for input and printed none of the expected patterns {:?}",
                        a.command, a.expect
                    ),
                )
                .with("output", output)
                .with("reason", "waiting_for_input"));
            }
            (WaitReason::SessionExit, _) => {
                return Err(self.forget(&a.session, named, output).await);
            }
            _ => return Err(timed_out(&a, output)),
        };
        Ok(Observation {
            output,
            exit_code: Some(0),
            expect_string,
            session_type: "bash",
            ..Observation::default()
        })
    }

    pub(crate) async fn interrupt(&self, a: InterruptAction) -> Result<Observation, Raised> {
        let named = self.get(&a.session)?;
        let _turn = named.turn.lock().await;
        let patterns = Patterns::new(&a.expect)?;
        let mut output = String::new();
        let wait = seconds(a.timeout).max(Duration::from_millis(10));
        for _ in 0..a.n_retry.max(1) {
            let mut req = SendRequest::typed("", false);
            req.keys = vec![Key::Ctrl(b'c')];
            req.timeout = Some(wait);
            req.ignore_silence = true;
            req.wait_for = patterns.union();
            let s = self.send(&named, req).await?;
            let (before, expect_string) = before_match(&s, &patterns);
            if s.wait_reason == WaitReason::SessionExit {
                output.push_str(&s.delta);
                return Err(self.forget(&a.session, &named, output).await);
            }
            if s.wait_reason == WaitReason::Matched || s.at_prompt {
                output.push_str(&before);
                return Ok(interrupted(output, expect_string));
            }
            output.push_str(&s.delta);
        }
        // Ctrl-C did not bring the shell back (a pager, a program that ignores it): kill the
        // foreground command's group, as swe-rex's `kill -9 %1` does.
        match self.terminals.signal(&self.owner, &named.id, Signal::Kill).await {
            Ok(_) => {}
            // The shell itself holds the terminal: nothing to kill.
            Err(e) if e.code() == conch_seams::ErrorCode::InvalidArgument => {}
            Err(e) => return Err(shell_error(e)),
        }
        let mut req = SendRequest::typed("", false);
        req.timeout = Some(KILL_SETTLE);
        req.ignore_silence = true;
        let s = self.send(&named, req).await?;
        output.push_str(strip_prompt(&s.delta));
        if s.wait_reason == WaitReason::StdinRead {
            return Ok(interrupted(output, PROMPT_EXPECT.into()));
        }
        Err(Raised::new(class::SWEREX, "Failed to interrupt session").with("output", output))
    }
}

/// swe-rex's `CommandTimeoutError` for `a`, with what it printed.
fn timed_out(a: &BashAction, output: String) -> Raised {
    Raised::new(
        class::TIMEOUT,
        format!(
            "timeout after {} seconds while running command {:?}",
            a.timeout.unwrap_or(f64::INFINITY),
            a.command
        ),
    )
    .with("output", output)
    .with("reason", "timeout")
}

/// Largest output an observation carries; past it, the newest bytes with a note in front.
const MAX_OUTPUT: u64 = 64 << 20;

/// A framed command's whole output: the retained tail, or, when earlier output was cut from
/// it, the spill that holds all of it (read here: the sessions run in this process's world).
/// When there is no spill, or it is over [`MAX_OUTPUT`], the tail with a note saying so.
async fn whole_output(ran: &conch_seams::CommandOutcome) -> String {
    if ran.omitted_bytes == 0 {
        return ran.output.clone();
    }
    if let Some(spill) = &ran.spill
        && spill.world == conch_seams::World::Local
        && let Ok(meta) = tokio::fs::metadata(&spill.path).await
        && meta.len() <= MAX_OUTPUT
        && let Ok(bytes) = tokio::fs::read(&spill.path).await
    {
        return String::from_utf8_lossy(&bytes).into_owned();
    }
    let whole = ran
        .spill
        .as_ref()
        .map_or(String::new(), |s| format!("; full output: {}", s.path.display()));
    format!("[{} earlier bytes omitted{whole}]\n{}", ran.omitted_bytes, ran.output)
}

/// A terminals or subprocess error as the client sees it: a session that is gone is
/// `SessionDoesNotExistError`, anything else `SwerexException`, with conch's code in
/// `extra_info.conch_code` (never a file error: these are not about files).
fn shell_error(e: conch_seams::Error) -> Raised {
    let class = if e.code() == conch_seams::ErrorCode::NotFound {
        class::NO_SESSION
    } else {
        class::SWEREX
    };
    Raised::new(class, e.to_string()).with("conch_code", e.code().as_str())
}

fn interrupted(output: String, expect_string: String) -> Observation {
    Observation {
        output: output.trim().to_string(),
        exit_code: Some(0),
        expect_string,
        session_type: "bash",
        ..Observation::default()
    }
}

/// An action's `expect` regexes.
struct Patterns(Vec<(String, regex::Regex)>);

impl Patterns {
    fn new(expect: &[String]) -> Result<Self, Raised> {
        let mut out = Vec::with_capacity(expect.len());
        for e in expect {
            let re = regex::RegexBuilder::new(e).multi_line(true).build().map_err(|err| {
                Raised::new(
                    class::VALUE,
                    format!("expect pattern {e:?} is not a valid regex: {err}"),
                )
            })?;
            out.push((e.clone(), re));
        }
        Ok(Self(out))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// One pattern matching any of them (`None`: no patterns).
    fn union(&self) -> Option<String> {
        (!self.0.is_empty())
            .then(|| self.0.iter().map(|(e, _)| format!("(?:{e})")).collect::<Vec<_>>().join("|"))
    }

    /// The pattern whose match ends first in `text` (as a stream matcher would have seen
    /// it), and where that match starts.
    fn first_match(&self, text: &str) -> Option<(String, usize)> {
        self.0
            .iter()
            .filter_map(|(e, re)| re.find(text).map(|m| (m.end(), m.start(), e)))
            .min_by_key(|(end, _, _)| *end)
            .map(|(_, start, e)| (e.clone(), start))
    }
}

/// A settled send's output before what ended it (the matched pattern, or the shell's prompt),
/// and swe-rex's `expect_string` for it: the pattern, or its prompt's name.
fn before_match(s: &SendSettle, patterns: &Patterns) -> (String, String) {
    if s.wait_reason == WaitReason::Matched
        && let Some((e, start)) = patterns.first_match(&s.delta)
    {
        return (s.delta[..start].to_string(), e);
    }
    if s.at_prompt {
        return (strip_prompt(&s.delta).to_string(), PROMPT_EXPECT.into());
    }
    (s.delta.clone(), String::new())
}

/// `delta` without the shell's prompt at its end (the managed PS1 shows `$ ` or `# `).
fn strip_prompt(delta: &str) -> &str {
    delta.strip_suffix("$ ").or_else(|| delta.strip_suffix("# ")).unwrap_or(delta)
}

/// The output of a typed line without the terminal's echo of it (swe-rex strips it too).
fn strip_echo(delta: &str, command: &str) -> String {
    let t = delta.trim_start();
    let t = t.strip_prefix(command.trim_end()).unwrap_or(t);
    t.trim().to_string()
}

/// `s` as one single-quoted shell word.
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
