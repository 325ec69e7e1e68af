//! One bash-on-a-PTY session: output pump, readiness tiers, signals, teardown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conch_seams::{
    CloseReport, Error, ErrorCode, Result, ScrollbackPage, SendSettle, SessionStatus,
    TerminalProcess, TerminalSession, WaitReason,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::parser::{Event, Parser};
use crate::scrollback::Scrollback;
use crate::{NAME, TerminalBashConfig, proctree};

/// Consecutive positive probe samples required before trusting Tier 1.
const STABLE_SAMPLES: u32 = 3;
/// How long a send right after terminal_signal waits for the signalled command's own prompt,
/// so that prompt is not taken as the send's result.
const SIGNAL_SETTLE: Duration = Duration::from_millis(1_000);

/// Waits for a state change or one poll interval; false once `deadline` has passed.
async fn pause(
    notified: tokio::sync::futures::Notified<'_>,
    poll: Duration,
    deadline: Instant,
) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    tokio::select! {
        () = notified => {}
        () = tokio::time::sleep(poll.min(deadline - now)) => {}
    }
    true
}

#[derive(Debug)]
struct State {
    parser: Parser,
    scrollback: Scrollback,
    /// Output of the active send (None when no send is active).
    op: Option<String>,
    op_truncated: bool,
    last_output: Instant,
    /// Accepted prompts so far (marker followed by printable text).
    prompts: u64,
    marker_armed: bool,
    eof: bool,
    /// Prompt count and time of the last signal delivered while bash was not at its prompt.
    signalled: Option<(u64, Instant)>,
}

/// Shared between the session handle and its output pump.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) process: Arc<dyn TerminalProcess>,
    config: TerminalBashConfig,
    state: Mutex<State>,
    changed: Notify,
    closing: AtomicBool,
    close_lock: tokio::sync::Mutex<Option<CloseReport>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ingest(&self, chunk: &[u8]) {
        let mut st = self.lock();
        let events = st.parser.feed(chunk);
        st.last_output = Instant::now();
        for ev in events {
            match ev {
                Event::Marker => st.marker_armed = true,
                Event::Text(t) => {
                    // A marker counts as a prompt only once printable prompt text follows it.
                    if st.marker_armed && t.chars().any(|c| !c.is_whitespace()) {
                        st.marker_armed = false;
                        st.prompts += 1;
                    }
                    st.scrollback.push(&t);
                    let cap = self.config.max_read_bytes;
                    let mut truncated = false;
                    if let Some(op) = st.op.as_mut() {
                        op.push_str(&t);
                        if op.len() > cap * 2 {
                            let keep = conch_output::tail_utf8(op, cap).to_string();
                            *op = keep;
                            truncated = true;
                        }
                    }
                    if truncated {
                        st.op_truncated = true;
                    }
                }
            }
        }
        drop(st);
        self.changed.notify_waiters();
    }

    fn status(&self) -> SessionStatus {
        match self.process.try_status() {
            Some(s) => SessionStatus::Exited { code: s.code, signal: s.signal },
            None => SessionStatus::Running,
        }
    }

    fn shell_pid(&self) -> i32 {
        self.process.pid().map_or(-1, |p| p as i32)
    }

    fn shell_owns_foreground(&self) -> bool {
        self.process.foreground_pgid() == Some(self.shell_pid())
    }
}

/// Starts the output pump for a freshly spawned shell.
pub(crate) fn start(
    process: Arc<dyn TerminalProcess>,
    config: TerminalBashConfig,
    marker: &str,
) -> Arc<Shared> {
    let shared = Arc::new(Shared {
        process,
        state: Mutex::new(State {
            parser: Parser::new(marker),
            scrollback: Scrollback::new(config.scrollback_lines, config.scrollback_max_bytes),
            op: Some(String::new()),
            op_truncated: false,
            last_output: Instant::now(),
            prompts: 0,
            marker_armed: false,
            eof: false,
            signalled: None,
        }),
        config,
        changed: Notify::new(),
        closing: AtomicBool::new(false),
        close_lock: tokio::sync::Mutex::new(None),
    });
    let pump = Arc::clone(&shared);
    tokio::spawn(async move {
        while let Some(chunk) = pump.process.read_chunk().await {
            pump.ingest(&chunk);
        }
        pump.lock().eof = true;
        pump.changed.notify_waiters();
        // EOF alone is not exit: wait for the reaper so session_exit carries the status.
        pump.process.wait().await;
        pump.changed.notify_waiters();
    });
    shared
}

/// Waits for the first accepted prompt; returns the MOTD (output before it).
pub(crate) async fn await_first_prompt(
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
) -> Result<String> {
    let deadline = Instant::now() + Duration::from_millis(shared.config.timeout_ms);
    loop {
        let notified = shared.changed.notified();
        // Cancellation first: an aborted setup must not publish even if the prompt raced it.
        if cancel.is_cancelled() {
            return Err(
                Error::new(ErrorCode::Cancelled, "terminal open was cancelled").with_provider(NAME)
            );
        }
        {
            let mut st = shared.lock();
            if st.prompts > 0 {
                let text = st.op.take().unwrap_or_default();
                // The MOTD is what came before the prompt text itself.
                let motd = match text.rfind('\n') {
                    Some(i) => text[..=i].to_string(),
                    None => String::new(),
                };
                return Ok(motd);
            }
            if st.eof {
                let out = st.op.take().unwrap_or_default();
                return Err(Error::new(
                    ErrorCode::SpawnFailed,
                    format!("bash exited during startup: {out}"),
                )
                .with_provider(NAME));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::new(
                ErrorCode::Timeout,
                "bash did not show its prompt before timeout_ms",
            )
            .with_provider(NAME));
        }
        tokio::select! {
            () = notified => {}
            () = cancel.cancelled() => {}
            () = tokio::time::sleep(deadline - now) => {}
        }
    }
}

/// The session handle handed to the terminals service.
#[derive(Debug)]
pub(crate) struct BashSession {
    pub(crate) shared: Arc<Shared>,
    pub(crate) motd: String,
}

impl BashSession {
    /// After a signal to a foreground command, waits (bounded) until the command's own
    /// prompt arrived with bash back in the foreground. A command that survives the signal
    /// (it trapped it) costs one bounded wait.
    async fn settle_signal(&self, cancel: &CancellationToken) {
        let sh = &self.shared;
        let Some((before, at)) = sh.lock().signalled.take() else { return };
        let deadline = at + SIGNAL_SETTLE;
        let poll = Duration::from_millis(sh.config.poll_interval_ms);
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof) = {
                let st = sh.lock();
                (st.prompts, st.eof)
            };
            if (prompts > before && sh.shell_owns_foreground()) || eof || cancel.is_cancelled() {
                return;
            }
            if !pause(notified, poll, deadline).await {
                return;
            }
        }
    }

    async fn readiness(
        &self,
        start_prompts: u64,
        cancel: &CancellationToken,
    ) -> Option<WaitReason> {
        let sh = &self.shared;
        let cfg = &sh.config;
        let started = Instant::now();
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let idle = Duration::from_millis(cfg.idle_silence_ms);
        let probe_after = Duration::from_millis(cfg.exact_probe_after_ms);
        let poll = Duration::from_millis(cfg.poll_interval_ms);
        let mut stable = 0;
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof, last_output) = {
                let st = sh.lock();
                (st.prompts, st.eof, st.last_output)
            };
            // Tier 0: our own prompt, accepted only while bash owns the foreground group.
            if prompts > start_prompts && sh.shell_owns_foreground() {
                return Some(WaitReason::StdinRead);
            }
            if eof && sh.process.try_status().is_some() {
                return Some(WaitReason::SessionExit);
            }
            if cancel.is_cancelled() {
                return None;
            }
            let elapsed = started.elapsed();
            if elapsed >= timeout {
                return Some(WaitReason::Timeout);
            }
            // Tier 1: an exact stdin-wait observation, stable over several samples.
            if elapsed >= probe_after && !eof {
                if sh.process.stdin_wait_probe() {
                    stable += 1;
                    if stable >= STABLE_SAMPLES {
                        return Some(WaitReason::StdinRead);
                    }
                } else {
                    stable = 0;
                }
            }
            // Tier 2: output silence.
            if last_output.elapsed() >= idle && elapsed >= idle {
                return Some(WaitReason::InferredIdle);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(poll) => {}
                () = cancel.cancelled() => {}
            }
        }
    }

    /// Cancellation: a real SIGINT to the foreground group (works even when the application
    /// disabled ISIG), holding the send until the shell's prompt is back or the grace ends.
    /// The line may still be queued for readline or between readline and the new job when we
    /// first look, so every group that takes the foreground before the shell settles gets
    /// its own SIGINT.
    async fn interrupt(&self, start_prompts: u64) {
        let sh = &self.shared;
        let shell = sh.shell_pid();
        let deadline = Instant::now() + Duration::from_millis(sh.config.dispose_grace_ms);
        let poll = Duration::from_millis(sh.config.poll_interval_ms);
        let mut signalled: Vec<i32> = Vec::new();
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof) = {
                let st = sh.lock();
                (st.prompts, st.eof)
            };
            let fg = sh.process.foreground_pgid();
            // Settled means bash is back at its prompt AND blocked reading the terminal: a
            // SIGINT that reached readline before it read the queued line leaves that line to
            // run next, and readline only blocks once no input is pending.
            if eof
                || (prompts > start_prompts && fg == Some(shell) && sh.process.stdin_wait_probe())
            {
                return;
            }
            if let Some(pg) = fg
                && !signalled.contains(&pg)
            {
                let _ = sh.process.signal_group(pg, nix::sys::signal::Signal::SIGINT as i32);
                signalled.push(pg);
            }
            if !pause(notified, poll, deadline).await {
                return;
            }
        }
    }

    fn take_delta(&self) -> String {
        let mut st = self.shared.lock();
        let mut out = st.op.take().unwrap_or_default();
        let cap = self.shared.config.max_read_bytes;
        let truncated = std::mem::take(&mut st.op_truncated) || out.len() > cap;
        if truncated {
            out = format!("[earlier output omitted]\n{}", conch_output::tail_utf8(&out, cap));
        }
        out
    }

    async fn write(&self, data: &[u8]) -> Result<()> {
        self.shared.process.write(data).await
    }
}

#[async_trait]
impl TerminalSession for BashSession {
    fn motd(&self) -> String {
        self.motd.clone()
    }

    async fn send(
        &self,
        text: &str,
        submit: bool,
        cancel: CancellationToken,
    ) -> Result<SendSettle> {
        // A send cancelled before it began types nothing (a background send killed at once).
        if cancel.is_cancelled() {
            return Err(Error::new(
                ErrorCode::Cancelled,
                "send cancelled before any text was typed",
            )
            .with_provider(NAME)
            .with_context(conch_seams::terminal::SEND_OUTPUT_CONTEXT, String::new()));
        }
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::NotFound, "session is closing").with_provider(NAME));
        }
        self.settle_signal(&cancel).await;
        let start_prompts = {
            let mut st = self.shared.lock();
            st.op = Some(String::new());
            st.op_truncated = false;
            st.last_output = Instant::now();
            st.prompts
        };
        let mut bytes = text.as_bytes().to_vec();
        if submit {
            bytes.push(b'\r');
        }
        if !bytes.is_empty()
            && let Err(e) = self.write(&bytes).await
        {
            self.shared.lock().op = None;
            return Err(e);
        }
        let Some(reason) = self.readiness(start_prompts, &cancel).await else {
            self.interrupt(start_prompts).await;
            let delta = self.take_delta();
            return Err(Error::new(
                ErrorCode::Cancelled,
                "send cancelled; SIGINT delivered to the foreground group",
            )
            .with_provider(NAME)
            .with_context(conch_seams::terminal::SEND_OUTPUT_CONTEXT, delta));
        };
        // Let a racing final chunk land before taking the delta when the session ended.
        if reason == WaitReason::SessionExit {
            tokio::task::yield_now().await;
        }
        Ok(SendSettle {
            delta: self.take_delta(),
            wait_reason: reason,
            session_status: self.shared.status(),
        })
    }

    fn read(&self, offset_lines: usize, max_lines: usize) -> ScrollbackPage {
        let st = self.shared.lock();
        st.scrollback.page(offset_lines, max_lines, self.shared.config.max_read_bytes)
    }

    fn signal(&self, signal: i32) -> Result<i32> {
        let Some(pg) = self.shared.process.foreground_pgid() else {
            return Err(Error::new(
                ErrorCode::NotFound,
                "cannot find the terminal's foreground process group",
            )
            .with_provider(NAME));
        };
        if signal == nix::sys::signal::Signal::SIGKILL as i32 && pg == self.shared.shell_pid() {
            return Err(Error::invalid(
                "SIGKILL would target the shell itself; use terminal_close to end the session",
            )
            .with_provider(NAME));
        }
        self.shared.process.signal_group(pg, signal)?;
        if pg != self.shared.shell_pid() {
            let mut st = self.shared.lock();
            st.signalled = Some((st.prompts, Instant::now()));
        }
        Ok(pg)
    }

    fn status(&self) -> SessionStatus {
        self.shared.status()
    }

    async fn close(&self) -> Result<CloseReport> {
        let mut done = self.shared.close_lock.lock().await;
        if let Some(report) = done.as_ref() {
            return Ok(report.clone());
        }
        self.shared.closing.store(true, Ordering::Release);
        let grace = Duration::from_millis(self.shared.config.dispose_grace_ms);
        let shell = self.shared.shell_pid();
        let shell_id = proctree::ident(shell);
        // Descendants first, while the shell is alive to anchor the tree.
        let survivors =
            if shell > 0 { proctree::kill_descendants(shell, grace).await } else { Vec::new() };
        if !survivors.is_empty() {
            self.shared.closing.store(false, Ordering::Release);
            return Err(Error::internal(format!(
                "terminal close could not stop descendants {survivors:?}; retry terminal_close"
            ))
            .with_provider(NAME));
        }
        // Then the shell: HUP (interactive bash ignores TERM), grace, KILL.
        if let Some(id) = shell_id
            && proctree::alive(id)
        {
            let _ =
                self.shared.process.signal_group(shell, nix::sys::signal::Signal::SIGHUP as i32);
            if tokio::time::timeout(grace, self.shared.process.wait()).await.is_err() {
                let _ = self
                    .shared
                    .process
                    .signal_group(shell, nix::sys::signal::Signal::SIGKILL as i32);
            }
        }
        let Ok(status) =
            tokio::time::timeout(Duration::from_secs(30), self.shared.process.wait()).await
        else {
            self.shared.closing.store(false, Ordering::Release);
            return Err(Error::internal(
                "the shell did not exit after SIGKILL; retry terminal_close",
            )
            .with_provider(NAME));
        };
        let report = CloseReport {
            root_exit: SessionStatus::Exited { code: status.code, signal: status.signal },
            survivors: Vec::new(),
        };
        *done = Some(report.clone());
        Ok(report)
    }
}
