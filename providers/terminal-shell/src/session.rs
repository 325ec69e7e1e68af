//! One shell-on-a-PTY session (bash, or pwsh): output pump, readiness tiers, framed
//! commands, signals, teardown. Every process operation goes through the [`TerminalProcess`] seam, so the
//! session works the same whether the PTY is local or in another world.
//!
//! # Output
//! Every chunk the pump reads goes three ways, under one lock, in order: the parser's event
//! stream drives readiness (prompt marker, echo, framing markers); its line rendering (CR
//! overwrites and backspace applied, alternate-screen drawing left out) is what sends return
//! and the scrollback keeps; and a `vt100` screen model of the terminal's size is what
//! [`TerminalSession::screen`] shows, a full-screen program's screen included. `vt100` was
//! chosen for its small dependency tree (vte, itoa, unicode-width), its screen API (rows as
//! text, cursor, alternate screen, resize) and a speed on par with the alternatives measured
//! (about 10 MB/s on this class of machine, like avt and within 1.5× of
//! alacritty_terminal, whose crate also brings an event loop and PTY layer not used here).
//! A resize reaches both models before the PTY, so what the program redraws after its
//! SIGWINCH is laid out at the new size.
//!
//! # Invariants
//! - A prompt counts (Tier 0) only once printable text follows our private marker *and* the
//!   provider observes bash's own group in the foreground.
//! - Silence (Tier 2) counts only while no output the terminal produced waits unread.
//! - The stdin-wait probe (Tier 1) counts only after [`TIER1_CONFIRMATIONS`] consecutive
//!   positive samples with no output between them, and only once every byte the terminal
//!   produced before the sample was taken in; "unavailable" is never taken as waiting.
//! - A lost transport is an error (`connection_failed`), never a session exit.
//! - A send's own limits (`SendRequest`): its deadline replaces the configured one; with
//!   `ignore_silence` or `wait_for`, Tier 2 never ends it; a `wait_for` match ends it
//!   before any tier (`matched`); its output cap bounds the retained delta (newest kept).
//!
//! The tier 1 probe runs from the moment output goes quiet: back to back for the first
//! `DENSE_PROBE_WINDOW` (within a budget per wait, yielding the CPU between samples, and never
//! while output the terminal wrote waits unread: the pump's ingest wakes the wait then), then
//! with a growing gap. An interrupt sends
//! SIGINT to each command group that takes the foreground, again every `COMMAND_REINTERRUPT_GAP`
//! while one still holds it, since a SIGINT landing between bash's fork and the child's exec is
//! lost. The shell's own group gets one only while no command was seen, never while readline may
//! still be reading a framed line (it would keep the signal for its next read and run the line
//! unstopped), and again every `REINTERRUPT_GAP` while its prompt is not back; a framed command
//! whose shell stays busy gets a second round before the session is given up.
//! `Interrupted::still_running` tells the caller when a command outlived the grace. TERM
//! (`xterm-256color` by default, config `term` or `TerminalOpenSpec::term`) and the size at open
//! travel in the spawn spec; `resize` updates the line and screen models, then the PTY
//! (`TerminalProcess::resize`).
//!
//! The screen model's callbacks answer the terminal queries of a bash session's programs
//! (cursor position, status, device attributes, colours).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conch_output::{Collector, Strategy, TextRetainer};
use conch_seams::{
    CloseReport, CommandEnd, CommandOutcome, Dialect, Error, ErrorBody, ErrorCode,
    ForegroundTarget, Interrupted, OMITTED_NOTE, Probe, Result, SandboxMode, ScreenView,
    ScrollbackPage, SendOutcome, SendProgress, SendRequest, SendSettle, SessionStatus, ShellState,
    Signal, SignalDelivery, SpillRef, StdinWait, StopCause, Subprocess, TerminalObservation,
    TerminalProcess, TerminalSession, TerminalSize, WaitReason,
};
use conch_sync::LockExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::framing::{self, FrameScanner};
use crate::input::{self, Modes};
use crate::parser::{Event, Parser};
use crate::scrollback::Scrollback;
use crate::{NAME, OnTerminal, TerminalShellConfig};

/// Consecutive positive probe samples before an interrupt counts as settled.
const STABLE_SAMPLES: u32 = 3;
/// Positive Tier 1 samples, with no output between them, before readiness is reported.
const TIER1_CONFIRMATIONS: u32 = 2;
/// After a write that produced no output at all, how long before Tier 1 is trusted anyway
/// (input read with echo off, by a program that prints nothing).
const TIER1_BLIND: Duration = Duration::from_millis(50);
/// How much of the typed text's start has to come back as echo.
const ECHO_PREFIX_CHARS: usize = 24;
/// The shortest timed gap between two Tier 1 probes (inside [`DENSE_PROBE_WINDOW`] they run
/// back to back instead).
const MIN_PROBE_GAP: Duration = Duration::from_millis(1);
/// For this long after output went quiet, probes stay at most [`FAST_PROBE_GAP`] apart:
/// programs that wait for input (an interpreter, a password prompt) mostly get there within
/// it, and a long silent command pays the fast rate only once per send.
const FAST_PROBE_WINDOW: Duration = Duration::from_secs(1);
/// The widest gap between probes inside [`FAST_PROBE_WINDOW`].
const FAST_PROBE_GAP: Duration = Duration::from_millis(4);
/// The gap before the confirming sample, once one sample saw a wait.
const CONFIRM_GAP: Duration = Duration::from_millis(2);
/// For this long after output went quiet, Tier 1 probes run back to back (each a few `/proc`
/// reads) while the foreground is not runnable: a program about to wait for input (`read -p`,
/// an interpreter's prompt) mostly blocks within it, and is seen about when it does rather
/// than a timer tick later. A runnable foreground is left the CPU (on a busy core, back-to-back
/// samples would delay the very program they wait for: a `terminal_send` p99 of 3.8 ms instead
/// of 0.9 ms with 1,000 sessions open).
const DENSE_PROBE_WINDOW: Duration = Duration::from_millis(3);
/// The most back-to-back probes one wait makes: a command whose output comes in short bursts
/// must not keep a probe running in every gap between them.
const DENSE_PROBE_BUDGET: u32 = 200;
/// How long a send right after terminal_signal waits for the signalled command's own prompt,
/// so that prompt is not taken as the send's result.
const SIGNAL_SETTLE: Duration = Duration::from_millis(1_000);
/// How long close waits for the shell to be reaped after teardown said it exited.
const REAP_LIMIT: Duration = Duration::from_secs(30);
/// Between repeated interrupts of the shell's own group while its prompt is not back: a
/// SIGINT that arrived while it was still reading the line may have reached no command.
const REINTERRUPT_GAP: Duration = Duration::from_millis(250);
/// Between SIGINTs to a command group that still holds the foreground: one that landed
/// between bash's fork and the child's exec met the shell's handler, which only sets a flag,
/// and was lost. (A command that trapped the first one gets a second, as from a user pressing
/// Ctrl-C again.)
const COMMAND_REINTERRUPT_GAP: Duration = Duration::from_millis(500);

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

/// The error every operation on a session whose world was lost gets: `connection_failed`,
/// never a session exit, carrying the cause's reason (so a world that restarted or is gone
/// is not retryable) and naming the cause's code.
fn lost(cause: &ErrorBody) -> Error {
    let e = Error::new(
        ErrorCode::ConnectionFailed,
        format!("the terminal's world was lost ({}): {}", cause.code, cause.message),
    )
    .with_provider(NAME);
    match cause.reason {
        Some(r) => e.with_reason(r),
        None => e,
    }
}

struct State {
    parser: Parser,
    scrollback: Scrollback,
    /// The terminal's screen as a person sees it.
    screen: vt100::Parser<Answers>,
    /// Output of the active send (None when no send is active): the newest bytes, bounded.
    op: Option<TextRetainer>,
    /// The same output in full, staged in a spill once it passes its memory bound (see
    /// [`Spills`]).
    op_spill: Option<Collector>,
    /// Where in the line rendering's current line the active op began (`None` once a line
    /// ended after that, or when the op began on a fresh line).
    op_from: Option<usize>,
    /// The frame of the active framed command, if any.
    frame: Option<FrameScanner>,
    last_output: Instant,
    /// Accepted prompts so far (marker followed by printable text).
    prompts: u64,
    marker_armed: bool,
    eof: bool,
    /// Set when reading the terminal failed for a reason other than EOF, or an operation
    /// found the world unreachable (`remote_unavailable`).
    lost: Option<ErrorBody>,
    /// Bytes taken in from `read_chunk` so far (compared with the provider's count).
    ingested: u64,
    /// The echo the current op waits for, and whether it came.
    echo: Option<Echo>,
    echo_seen: bool,
    /// Prompt count and time of the last signal delivered while bash was not at its prompt.
    signalled: Option<(u64, Instant)>,
    /// The prompt count that what was typed last waits to exceed: until a prompt beyond it
    /// came, the shell is busy with that text.
    prompts_at_write: Option<u64>,
    /// Cursor position answers written or about to be: until the shell took them, its read
    /// of the terminal is a wait for the answer, not for input.
    answers_in_flight: u32,
    /// Terminal modes the foreground program set (bracketed paste, cursor keys).
    modes: Modes,
    /// The active send's `wait_for` pattern and the output it is matched against.
    watch: Option<Watch>,
    /// The active send's `wait_for` pattern matched.
    matched: bool,
    /// Sees the active send's output as it arrives.
    progress: Option<Progress>,
    /// Which readiness tier ended the last wait, and what it saw (shown by `Debug`, so a
    /// result that came early says why).
    last_ready: Option<ReadyTrace>,
}

/// What ended a wait for readiness, for diagnosis.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code, reason = "read through Debug only")]
struct ReadyTrace {
    tier: &'static str,
    /// The prompt count then, and the count the wait had to exceed.
    prompts: u64,
    start_prompts: u64,
    /// Time since the wait began.
    after: Duration,
    echo_seen: bool,
}

/// A send's progress callback (opaque to `Debug`).
#[derive(Clone)]
struct Progress(SendProgress);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// A send's `wait_for`: the pattern, and the newest output it is matched against (bounded
/// by [`WATCH_WINDOW`], so a match must fit in it).
#[derive(Debug)]
struct Watch {
    pattern: regex::Regex,
    window: String,
}

/// The most recent output a `wait_for` pattern is matched against.
const WATCH_WINDOW: usize = 64 * 1024;

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("prompts", &self.prompts)
            .field("ingested", &self.ingested)
            .field("eof", &self.eof)
            .field("last_ready", &self.last_ready)
            .finish_non_exhaustive()
    }
}

/// A `vt100` screen model of `size` (no scrollback of its own: the line rendering keeps it).
fn screen_model(size: TerminalSize, answers: bool) -> vt100::Parser<Answers> {
    let n = |v: u16| std::num::NonZeroU16::new(v).unwrap_or(std::num::NonZeroU16::MIN);
    let answers = Answers { enabled: answers, out: Vec::new() };
    vt100::Parser::new_with_callbacks(n(size.rows), n(size.cols), 0, answers)
}

/// Answers a program's terminal queries as a terminal would, from the screen model at the
/// moment of the query: the cursor position (`CSI 6 n`), status (`CSI 5 n`), device
/// attributes (`CSI c`, `CSI > c`) and the default colours (`OSC 10/11 ; ?`). Full-screen
/// programs ask at startup; vim, for one, waits for the answers when it exits (reading the
/// terminal, so text typed then is taken as the answer and lost).
#[derive(Debug)]
struct Answers {
    /// False where the parser answers instead (pwsh's cursor requests).
    enabled: bool,
    out: Vec<u8>,
}

impl vt100::Callbacks for Answers {
    fn unhandled_csi(
        &mut self,
        screen: &mut vt100::Screen,
        i1: Option<u8>,
        i2: Option<u8>,
        params: &[&[u16]],
        c: char,
    ) {
        if !self.enabled || i2.is_some() {
            return;
        }
        let first = params.first().and_then(|p| p.first()).copied().unwrap_or(0);
        match (i1, c, first) {
            (None, 'n', 6) => {
                let (row, col) = screen.cursor_position();
                self.out.extend(format!("\x1b[{};{}R", row + 1, col + 1).bytes());
            }
            (None, 'n', 5) => self.out.extend(b"\x1b[0n"),
            // A VT100 with advanced video; secondary: VT100, firmware 10.
            (None, 'c', 0) => self.out.extend(b"\x1b[?1;2c"),
            (Some(b'>'), 'c', 0) => self.out.extend(b"\x1b[>0;10;1c"),
            _ => {}
        }
    }

    fn unhandled_osc(&mut self, _: &mut vt100::Screen, params: &[&[u8]]) {
        if !self.enabled {
            return;
        }
        // Light grey on black.
        let colour = match params {
            [b"10", b"?"] => "10;rgb:c0c0/c0c0/c0c0",
            [b"11", b"?"] => "11;rgb:0000/0000/0000",
            _ => return,
        };
        self.out.extend(format!("\x1b]{colour}\x1b\\").bytes());
    }
}

impl State {
    /// The op's part of the line the cursor is on (all of it once the op saw a line end).
    fn op_live(&self) -> String {
        let live = self.parser.live_line();
        match self.op_from {
            Some(from) => live.chars().skip(from).collect(),
            None => live,
        }
    }

    /// Ends the active send's own state (its start column, `wait_for` pattern and match);
    /// returns its progress callback.
    fn end_send(&mut self) -> Option<Progress> {
        self.op_from = None;
        self.watch = None;
        self.matched = false;
        self.progress.take()
    }

    /// The visible screen, trailing blanks trimmed.
    fn screen_view(&self) -> ScreenView {
        let screen = self.screen.screen();
        let (rows, cols) = screen.size();
        let mut lines: Vec<String> =
            screen.rows(0, cols.get()).map(|r| r.trim_end().to_string()).collect();
        while lines.last().is_some_and(String::is_empty) {
            lines.pop();
        }
        ScreenView {
            text: lines.join("\n"),
            size: TerminalSize { rows: rows.get(), cols: cols.get() },
            cursor: screen.cursor_position(),
            alternate: screen.alternate_screen(),
        }
    }

    /// Starts an op whose own prompt is the first beyond `floor` (at least the current
    /// count, see [`ShellSession::owed_prompt`]); returns the count it waits to exceed.
    fn begin_op(&mut self, cap: usize, floor: Option<u64>, spill: Collector) -> u64 {
        self.op = Some(TextRetainer::new(Strategy::Tail, cap));
        self.op_spill = Some(spill);
        self.op_from = Some(self.parser.live_column());
        self.last_output = Instant::now();
        self.echo = None;
        let start = floor.map_or(self.prompts, |f| f.max(self.prompts));
        self.prompts_at_write = Some(start);
        start
    }

    /// The shell is running what was last typed (no prompt came after it).
    fn busy(&self) -> bool {
        self.prompts_at_write.is_some_and(|w| self.prompts <= w)
    }

    /// Expects the echo of `typed` (its first printable stretch) in the coming output.
    fn expect_echo(&mut self, typed: &str) {
        let start: String = typed
            .trim_start()
            .chars()
            .take_while(|c| !c.is_control())
            .take(ECHO_PREFIX_CHARS)
            .collect();
        self.echo = (!start.is_empty()).then(|| Echo { expect: start, window: String::new() });
        self.echo_seen = false;
    }
}

/// Tells a busy foreground from an idle one across samples: a program still computing (or
/// starting up on a loaded machine, waiting for a CPU) prints nothing for a while, but is
/// not idle.
#[derive(Debug, Default)]
struct CpuWatch {
    /// The previous sample's foreground group and its CPU time.
    last: Option<(Option<i32>, u64)>,
}

impl CpuWatch {
    /// True when `obs` finds the foreground busy (see [`conch_seams::ForegroundCpu`]), or
    /// its CPU time changed since the previous sample of the same group.
    fn busy(&mut self, obs: &conch_seams::TerminalObservation) -> bool {
        let Some(cpu) = obs.cpu else {
            self.last = None;
            return false;
        };
        let before = self.last.replace((obs.foreground, cpu.ticks));
        cpu.busy || before.is_some_and(|(fg, t)| fg == obs.foreground && t != cpu.ticks)
    }
}

/// Watching for the echo of typed text: proof the reader of the terminal took the input.
#[derive(Debug)]
struct Echo {
    expect: String,
    window: String,
}

/// Shared between the session handle and its output pump.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) process: Arc<dyn TerminalProcess>,
    config: TerminalShellConfig,
    state: Mutex<State>,
    changed: Notify,
    closing: AtomicBool,
    close_lock: tokio::sync::Mutex<Option<CloseReport>>,
    /// The framing helpers were typed into this shell (by its first framed command).
    framing_ready: AtomicBool,
    /// The dialect of the shell the session runs.
    dialect: Dialect,
    /// The session's private nonce (the prompt marker's, and the fresh-shell marker's).
    nonce: String,
    /// State a replaced shell left, typed with the first framed command.
    pub(crate) restore: Mutex<Option<ShellState>>,
    /// How capped output is kept whole.
    spills: Arc<Spills>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Records which tier ended a wait for readiness (see [`ReadyTrace`]).
    fn trace_ready(&self, tier: &'static str, start_prompts: u64, started: Instant, echo: bool) {
        let mut st = self.lock();
        st.last_ready = Some(ReadyTrace {
            tier,
            prompts: st.prompts,
            start_prompts,
            after: started.elapsed(),
            echo_seen: echo,
        });
    }

    /// Takes in a chunk of output; returns the answers to cursor position requests in it,
    /// which the caller writes to the terminal (counted in flight until it has).
    fn ingest(&self, chunk: &[u8]) -> Vec<u8> {
        let mut answers = Vec::new();
        let mut st = self.lock();
        st.ingested += chunk.len() as u64;
        st.modes.feed(chunk);
        let events = st.parser.feed(chunk);
        let mut progressed = String::new();
        st.screen.process(chunk);
        answers.append(&mut st.screen.callbacks_mut().out);
        st.last_output = Instant::now();
        let lines = st.parser.take_lines();
        if !lines.is_empty() {
            st.scrollback.push_lines(&lines);
            let streaming = st.progress.is_some();
            let from = st.op_from.take();
            let st = &mut *st;
            if let Some(op) = st.op.as_mut() {
                let mine = match from {
                    // The op's first line starts where the op began (after the prompt).
                    Some(from) => {
                        let first_end = lines.find('\n').map_or(lines.len(), |i| i + 1);
                        let first = lines[..first_end].chars().skip(from);
                        std::borrow::Cow::Owned(first.chain(lines[first_end..].chars()).collect())
                    }
                    None => std::borrow::Cow::Borrowed(lines.as_str()),
                };
                op.push(&mine);
                if let Some(c) = &st.op_spill {
                    c.push(mine.as_bytes());
                }
                if streaming {
                    progressed.push_str(&mine);
                }
            }
        }
        for ev in events {
            match ev {
                Event::Marker => st.marker_armed = true,
                Event::CursorQuery { row, col } => {
                    answers.extend_from_slice(format!("\x1b[{row};{col}R").as_bytes());
                }
                Event::Text(t) => {
                    // A marker counts as a prompt only once printable prompt text follows it.
                    if st.marker_armed && t.chars().any(|c| !c.is_whitespace()) {
                        st.marker_armed = false;
                        st.prompts += 1;
                    }
                    // Matched against the text as the program printed it, so a pattern sees a
                    // line still being written (a prompt waiting on its input).
                    if let Some(w) = st.watch.as_mut() {
                        w.window.push_str(&t);
                        if w.pattern.is_match(&w.window) {
                            st.watch = None;
                            st.matched = true;
                        } else if w.window.len() > WATCH_WINDOW {
                            w.window = conch_output::tail_utf8(&w.window, WATCH_WINDOW).to_string();
                        }
                    }
                    if let Some(frame) = st.frame.as_mut() {
                        frame.push(&t);
                    }
                    if let Some(echo) = st.echo.as_mut() {
                        echo.window.push_str(&t);
                        if echo.window.contains(&echo.expect) {
                            st.echo = None;
                            st.echo_seen = true;
                        } else {
                            let keep = conch_output::tail_utf8(&echo.window, echo.expect.len() * 2)
                                .to_string();
                            echo.window = keep;
                        }
                    }
                }
            }
        }
        if !answers.is_empty() {
            st.answers_in_flight += 1;
        }
        let progress = st.progress.clone().filter(|_| !progressed.is_empty());
        drop(st);
        // Outside the lock: the callback is the caller's code.
        if let Some(Progress(p)) = progress {
            p(&progressed);
        }
        self.changed.notify_waiters();
        answers
    }

    fn status(&self) -> SessionStatus {
        if let Some(s) = self.process.try_status() {
            return SessionStatus::Exited(s);
        }
        match &self.lock().lost {
            Some(b) => SessionStatus::Lost {
                code: b.code,
                message: Error::from_body(b.clone()).to_string(),
            },
            None => SessionStatus::Running,
        }
    }

    /// Records `e` as the session's loss when it says the world is unreachable, so the
    /// session reads as lost from the failed operation on, not only once the output pump
    /// noticed.
    fn note_loss(&self, e: &Error) {
        if e.code() == ErrorCode::RemoteUnavailable {
            self.lock().lost.get_or_insert_with(|| e.to_body());
        }
        self.changed.notify_waiters();
    }

    async fn observe(&self, probe: Probe) -> Result<conch_seams::TerminalObservation> {
        self.process.observe(probe).await
    }

    /// The active op's output, ended: its finished lines and its part of the current one.
    fn take_op(&self) -> (String, u64, Option<Collector>) {
        let mut st = self.lock();
        let live = st.op_live();
        let progress = st.end_send().filter(|_| st.op.is_some() && !live.is_empty());
        let r = st
            .op
            .take()
            .map(|mut op| {
                op.push(&live);
                op.finish()
            })
            .unwrap_or_default();
        let spill = st.op_spill.take();
        drop(st);
        // Sealed outside the lock: it flushes the spill file.
        if let Some(c) = &spill {
            c.push(live.as_bytes());
            c.seal();
        }
        // The line still being written streams too, as the send ends (outside the lock: the
        // callback is the caller's code).
        if let Some(Progress(p)) = progress {
            p(&live);
        }
        (r.text, r.omitted_bytes, spill)
    }
}

/// How a session's capped output is kept whole: an op's text is staged in a private spill on
/// this machine once it passes its memory bound, and a result that cut it hands the staged
/// text (or the command's part of it) to the subprocess provider, which keeps it as a spill
/// in the shell's own world ([`Subprocess::keep_spill`]), so the path the model gets is one
/// its commands can open, for as long as the one-shot tool's spills. Staged files are deleted
/// as soon as they are handed over or not needed, and all of them with the backend.
#[derive(Debug)]
pub(crate) struct Spills {
    root: Arc<conch_output::SpillRoot>,
    registry: Arc<conch_output::SpillRegistry>,
    keeper: Arc<dyn Subprocess>,
}

impl Spills {
    pub(crate) fn new(keeper: Arc<dyn Subprocess>) -> Self {
        Self {
            root: Arc::new(conch_output::SpillRoot::new(None)),
            registry: Arc::new(conch_output::SpillRegistry::new(
                conch_output::SpillLimits::default(),
            )),
            keeper,
        }
    }

    /// Hands the staged text (through `cut`) to the provider to keep; the staged file goes
    /// either way. `None`: nothing was staged (the text fit in memory), it outgrew the spill
    /// cap, or the provider keeps no spills.
    async fn keep(&self, staged: Collector, cut: impl Fn(&str) -> String) -> Option<SpillRef> {
        let whole = staged.summary().spill;
        let text = whole.and_then(|w| std::fs::read(&w.path).ok());
        staged.discard_spill();
        let text = cut(&String::from_utf8_lossy(&text?));
        self.keeper.keep_spill(text.into_bytes()).await.ok().flatten()
    }

    /// A collector that keeps the last `max_bytes` in memory and spills the whole text once
    /// it passes them.
    fn collector(&self, max_bytes: usize) -> Collector {
        let mut cfg = conch_output::CollectorConfig::new(max_bytes, SPILL_CAP);
        cfg.root = Some(Arc::clone(&self.root));
        cfg.registry = Some(Arc::clone(&self.registry));
        Collector::new(cfg)
    }

    /// Deletes every spill and the directory that holds them.
    pub(crate) fn remove(&self) {
        self.root.remove();
    }
}

impl Drop for Spills {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The largest output a spill holds; past it the spill is dropped and the result says the
/// rest is gone (as the one-shot tool's).
const SPILL_CAP: u64 = 64 * 1024 * 1024;

/// A framed command whose output passes this many bytes gets a spill of its own (the
/// persistent tools cap their results at 64,000 bytes by default).
const COMMAND_SPILL_AT: usize = 16 * 1024;

/// Starts the output pump for a freshly spawned shell.
pub(crate) fn start(
    process: Arc<dyn TerminalProcess>,
    config: TerminalShellConfig,
    dialect: Dialect,
    marker: &str,
    nonce: &str,
    size: conch_seams::TerminalSize,
    spills: Arc<Spills>,
) -> Arc<Shared> {
    let parser = if dialect.answers_cursor_queries() {
        Parser::new(marker).answering(size.rows, size.cols)
    } else {
        Parser::new(marker)
    }
    .with_cols(size.cols);
    let shared = Arc::new(Shared {
        process,
        state: Mutex::new(State {
            parser,
            scrollback: Scrollback::new(config.scrollback_lines, config.scrollback_max_bytes),
            screen: screen_model(size, !dialect.answers_cursor_queries()),
            op: Some(TextRetainer::new(Strategy::Tail, config.max_read_bytes)),
            op_spill: None,
            op_from: None,
            frame: None,
            last_output: Instant::now(),
            prompts: 0,
            marker_armed: false,
            eof: false,
            lost: None,
            ingested: 0,
            echo: None,
            echo_seen: false,
            signalled: None,
            prompts_at_write: None,
            answers_in_flight: 0,
            modes: Modes::default(),
            watch: None,
            matched: false,
            progress: None,
            last_ready: None,
        }),
        config,
        changed: Notify::new(),
        closing: AtomicBool::new(false),
        close_lock: tokio::sync::Mutex::new(None),
        framing_ready: AtomicBool::new(false),
        dialect,
        nonce: nonce.to_string(),
        restore: Mutex::new(None),
        spills,
    });
    let pump = Arc::clone(&shared);
    tokio::spawn(async move {
        loop {
            match pump.process.read_chunk().await {
                Ok(Some(chunk)) => {
                    let answers = pump.ingest(&chunk);
                    if !answers.is_empty() {
                        // A shell gone meanwhile needs no answer; its exit is the news.
                        let _ = pump.process.write(&answers).await;
                        pump.lock().answers_in_flight -= 1;
                        pump.changed.notify_waiters();
                    }
                }
                Ok(None) => {
                    pump.lock().eof = true;
                    pump.changed.notify_waiters();
                    // EOF alone is not exit: wait for the reaper so session_exit carries the
                    // status.
                    if let Err(e) = pump.process.wait().await {
                        pump.lock().lost.get_or_insert_with(|| e.to_body());
                    }
                    break;
                }
                Err(e) => {
                    pump.lock().lost.get_or_insert_with(|| e.to_body());
                    break;
                }
            }
        }
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
            let st = shared.lock();
            if let Some(why) = &st.lost {
                return Err(lost(why));
            }
            let ready = st.prompts > 0;
            let eof = st.eof;
            drop(st);
            if ready || eof {
                let (text, _, _) = shared.take_op();
                if ready {
                    // The MOTD is what came before the prompt text itself.
                    return Ok(match text.rfind('\n') {
                        Some(i) => text[..=i].to_string(),
                        None => String::new(),
                    });
                }
                return Err(Error::new(
                    ErrorCode::SpawnFailed,
                    format!("{} exited during startup: {text}", shared.dialect.name()),
                )
                .with_provider(NAME));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::new(
                ErrorCode::Timeout,
                format!("{} did not show its prompt before timeout_ms", shared.dialect.name()),
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

/// Why a wait for readiness ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    /// A readiness tier fired.
    Reason(WaitReason),
    /// The framed command's end marker arrived and bash is back at its prompt.
    Framed(i32),
    /// The shell's own prompt came back (Tier 0 of a plain send).
    Prompt,
    /// The cancel token fired.
    Cancelled,
}

/// What ends a wait for readiness besides the prompt, an input wait, the deadline and exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// A plain send: output silence too (Tier 2).
    Send,
    /// A send told to ignore silence (a deadline or a pattern of its own, a background send).
    UntilReady,
    /// A framed command: only its end marker and prompt.
    Framed,
}

/// How a send's text goes in ([`ShellSession::pastes`]).
#[derive(Clone, Copy, Debug)]
struct Typing {
    /// As a bracketed paste.
    paste: bool,
    /// Into readline at the shell's own prompt (false where that was not looked at).
    at_prompt: bool,
}

/// The session handle handed to the terminals service.
#[derive(Debug)]
pub(crate) struct ShellSession {
    pub(crate) shared: Arc<Shared>,
    pub(crate) motd: String,
    /// The mode the shell was wrapped under at open (`None`: unconfined).
    pub(crate) sandbox: Option<SandboxMode>,
    /// Frees what the sandbox runner made for the shell: taken by a successful close (every
    /// process of the session is stopped then), else dropped with the session.
    pub(crate) release: std::sync::Mutex<Option<conch_confine::SandboxRelease>>,
}

impl ShellSession {
    /// After a signal to a foreground command, waits (bounded) until the command's own
    /// prompt arrived with bash back in the foreground. A command that survives the signal
    /// (it trapped it) costs one bounded wait.
    async fn settle_signal(&self, cancel: &CancellationToken) -> Result<()> {
        let sh = &self.shared;
        let Some((before, at)) = sh.lock().signalled.take() else { return Ok(()) };
        let deadline = at + SIGNAL_SETTLE;
        let poll = Duration::from_millis(sh.config.poll_interval_ms);
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof) = {
                let st = sh.lock();
                if let Some(why) = &st.lost {
                    return Err(lost(why));
                }
                (st.prompts, st.eof)
            };
            if eof || cancel.is_cancelled() {
                return Ok(());
            }
            if prompts > before && sh.observe(Probe::Foreground).await?.leader_owns_foreground {
                return Ok(());
            }
            if !pause(notified, poll, deadline).await {
                return Ok(());
            }
        }
    }

    /// The prompt count this send's own prompt must exceed when text typed earlier is still
    /// owed its prompt (`None`: the next prompt is this send's). That is the case when the
    /// shell itself holds the terminal without reading it: it is still running the earlier
    /// text (or its PROMPT_COMMAND, or an interrupted command's aftermath) and prints that
    /// text's prompt before it reads what is typed now. When a command holds the terminal,
    /// the command may read the new text, so its prompt may well be this send's.
    async fn owed_prompt(&self, cancel: &CancellationToken) -> Result<Option<u64>> {
        let sh = &self.shared;
        // Where commands share the shell's group (pwsh), a busy shell group may be a command
        // that reads what is typed.
        if sh.dialect.commands_share_its_group() {
            return Ok(None);
        }
        let deadline = Instant::now() + Duration::from_millis(sh.config.timeout_ms);
        let poll = Duration::from_millis(sh.config.poll_interval_ms);
        loop {
            let notified = sh.changed.notified();
            let (awaited, ingested) = {
                let st = sh.lock();
                if let Some(why) = &st.lost {
                    return Err(lost(why));
                }
                if st.eof || !st.busy() {
                    return Ok(None);
                }
                (st.prompts_at_write, st.ingested)
            };
            let obs = sh.observe(Probe::Stdin).await?;
            if !obs.leader_owns_foreground {
                return Ok(None);
            }
            match obs.stdin {
                // Running, not reading: the earlier text's prompt comes first.
                StdinWait::NotWaiting => return Ok(awaited.map(|w| w + 1)),
                // Reading the terminal: the earlier text's prompt is in (the loop starts over
                // once it is taken in), or the shell reads without one (`read`): what is typed
                // now is its input either way.
                StdinWait::Waiting if !obs.output_pending && ingested >= obs.delivered_bytes => {
                    return Ok(None);
                }
                StdinWait::Waiting => {}
                // Nothing known: the next prompt counts, as it always did.
                StdinWait::Unavailable | StdinWait::NotProbed => return Ok(None),
            }
            // Output written before the shell blocked is still on its way: once taken in, a
            // prompt in it ends the debt.
            if cancel.is_cancelled() || !pause(notified, poll, deadline).await {
                return Ok(None);
            }
        }
    }

    /// Whether typed text goes in as a bracketed paste (see [`crate::input`]): when a
    /// line-oriented foreground program asked for pastes, or, in bash, when readline holds
    /// the terminal at the shell's prompt (no earlier text is owed a prompt and the shell owns
    /// the foreground), unless `text` is one the prompt takes as well typed
    /// ([`input::typed_at_prompt`]; `None`: always paste there). A full-screen program (on
    /// the alternate screen) gets keystrokes even when it asked for pastes: vim inserts a
    /// paste as text, so `:q!` would land in the file.
    async fn pastes(&self, floor: Option<u64>, text: Option<&str>) -> Result<Typing> {
        let sh = &self.shared;
        let (busy, asked) = {
            let st = sh.lock();
            if st.screen.screen().alternate_screen() {
                return Ok(Typing { paste: false, at_prompt: false });
            }
            (st.busy(), st.modes.paste)
        };
        // bash turns pastes on before each prompt: only its foreground tells its prompt from
        // a program of its that asked for them, and that look is needed only when the answer
        // could differ.
        let typed = text.is_some_and(input::typed_at_prompt);
        if sh.dialect != Dialect::Bash || floor.is_some() || busy || (asked && !typed) {
            return Ok(Typing { paste: asked, at_prompt: false });
        }
        let at_prompt = sh.observe(Probe::Foreground).await?.leader_owns_foreground;
        Ok(Typing { paste: if at_prompt { !typed } else { asked }, at_prompt })
    }

    /// Waits for the first readiness tier (or, for a framed command, its end marker), the
    /// deadline, or cancellation. `framed` turns the send tiers into the command's: the
    /// prompt only counts after the end marker, and silence is not an answer.
    async fn readiness(
        &self,
        start_prompts: u64,
        timeout: Duration,
        wait: Wait,
        wrote: bool,
        shell_runs_it: bool,
        cancel: &CancellationToken,
    ) -> Result<Ready> {
        let framed = wait == Wait::Framed;
        // Tier 2 ends only a plain send.
        let silence_ends = wait == Wait::Send;
        let sh = &self.shared;
        let cfg = &sh.config;
        let started = Instant::now();
        let idle = Duration::from_millis(cfg.idle_silence_ms);
        let probe_after = Duration::from_millis(cfg.exact_probe_after_ms);
        let poll = Duration::from_millis(cfg.poll_interval_ms);
        // Tier 1 confirmations so far, and the output position the first one saw.
        let mut confirmed: Option<(u32, Instant)> = None;
        let mut next_probe = started + probe_after;
        // Tier 2 counts silence from the last output or the last sample that found the
        // foreground busy, whichever came later.
        let mut cpu = CpuWatch::default();
        let mut last_busy = started;
        let mut dense_left = DENSE_PROBE_BUDGET;
        // What had been taken in when the next sample was put off until more output came (a
        // sample in the dense window found output unread, or a sample of a line the shell runs
        // was put off): once more has been, the next sample is due at once.
        let mut sample_on_output: Option<u64> = None;
        // A line typed at the shell's own prompt is run by the shell itself until it starts a
        // program, and a sample taken while the shell's group holds the foreground with its
        // cursor at the start of a line (after the echoed line, or a line of output) finds it
        // busy with the line, whose next output or prompt follows within a fraction of a
        // millisecond. Such a sample waits for more output (or the shortest gap), again after
        // each new output: taken at once, its /proc reads held up the very prompt it raced
        // (about 0.06 ms of a 0.25 ms `terminal_send` of `echo x`). A gap with no output ends
        // the putting off, as does a sample taken: text printed on the line (`read -p`'s
        // prompt) is sampled at once, and a silent wait (`read v`) is seen a gap later.
        let mut defer = shell_runs_it;
        // What had been taken in at the last sample put off.
        let mut deferred_at: Option<u64> = None;
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof, last_output, code, ingested, echo_seen, answering, line_start) = {
                let st = sh.lock();
                if let Some(why) = &st.lost {
                    return Err(lost(why));
                }
                if st.matched {
                    return Ok(Ready::Reason(WaitReason::Matched));
                }
                let code = st.frame.as_ref().and_then(FrameScanner::code);
                let answering = st.answers_in_flight > 0;
                let line_start = st.parser.at_line_start();
                (
                    st.prompts,
                    st.eof,
                    st.last_output,
                    code,
                    st.ingested,
                    st.echo_seen,
                    answering,
                    line_start,
                )
            };
            if sample_on_output.is_some_and(|n| ingested > n) {
                sample_on_output = None;
                next_probe = next_probe.min(Instant::now());
            }
            // Tier 0: our own prompt, accepted only while bash owns the foreground group. A
            // framed command's prompt counts only once its end marker came.
            let prompt_counts = !framed || code.is_some();
            if prompts > start_prompts
                && prompt_counts
                && sh.observe(Probe::Foreground).await?.leader_owns_foreground
            {
                sh.trace_ready("tier 0: prompt", start_prompts, started, echo_seen);
                return Ok(match code {
                    Some(c) if framed => Ready::Framed(c),
                    _ => Ready::Prompt,
                });
            }
            // A framed command's shell that exited is done even while something it left
            // still holds the terminal open (the close that follows stops that).
            if (eof || framed) && sh.process.try_status().is_some() {
                return Ok(Ready::Reason(WaitReason::SessionExit));
            }
            if cancel.is_cancelled() {
                return Ok(Ready::Cancelled);
            }
            let elapsed = started.elapsed();
            if elapsed >= timeout {
                return Ok(Ready::Reason(WaitReason::Timeout));
            }
            // Tier 1: an exact stdin-wait observation, confirmed by a second sample with no
            // output in between, and only once every byte the terminal produced before the
            // sample reached us (a prompt printed just before a blocking read). Once a
            // framed command's end marker is in, only its prompt is awaited. Probes start as
            // soon as output goes quiet and space out as the quiet lasts (a fraction of it,
            // capped at the poll interval), so a quick wait is seen quickly and a long
            // silent command costs few probes.
            let now = Instant::now();
            // Right after a write, the shell may still be parked where it waited before, with
            // the typed bytes not even handed to it yet (the kernel moves them to the line
            // discipline asynchronously): that is not a wait for input. A reader that takes
            // them echoes them, so Tier 1 starts once the echo of the typed text came, or
            // after a blind window for input that echoes nothing (passwords, `stty -echo`).
            let input_taken = !wrote || echo_seen || now >= started + TIER1_BLIND;
            let due = now >= next_probe && !eof && code.is_none() && input_taken && !answering;
            if due && defer {
                defer = line_start
                    && deferred_at.is_none_or(|n| ingested > n)
                    && sh.observe(Probe::Foreground).await?.leader_owns_foreground;
            }
            if due && defer {
                deferred_at = Some(ingested);
                sample_on_output = Some(ingested);
                next_probe = now + MIN_PROBE_GAP;
            } else if due {
                let obs = sh.observe(Probe::Stdin).await?;
                if cpu.busy(&obs) {
                    last_busy = now;
                }
                // A foreground that is running or waiting for a CPU is not about to be seen
                // waiting for input: sampling it back to back would only take a CPU from it.
                let runnable = obs.cpu.is_some_and(|c| c.busy);
                let complete = !obs.output_pending && ingested >= obs.delivered_bytes;
                if obs.stdin == StdinWait::Waiting && complete {
                    let (n, since) = match confirmed {
                        Some((n, since)) if since == last_output => (n + 1, since),
                        _ => (1, last_output),
                    };
                    if n >= TIER1_CONFIRMATIONS {
                        sh.trace_ready("tier 1: stdin wait", start_prompts, started, echo_seen);
                        return Ok(Ready::Reason(WaitReason::StdinRead));
                    }
                    confirmed = Some((n, since));
                } else {
                    confirmed = None;
                }
                let quiet = now.saturating_duration_since(last_output.max(started));
                // In the dense window every sample spends from one budget: output streaming in
                // chunks would otherwise bring a sample per chunk for as long as it lasts.
                if quiet < DENSE_PROBE_WINDOW && dense_left > 0 && !runnable {
                    dense_left -= 1;
                    if !complete {
                        // Output the sample found unread is the pump's to take in next: probing
                        // on would only hold the CPU it needs. Its ingest wakes this wait, and
                        // the next sample follows at once (the gap below is the fallback).
                        sample_on_output = Some(ingested);
                    } else {
                        // The next sample right away; Tier 2 cannot be due this soon after
                        // output. The thread yields its CPU first, not only the task: a task
                        // woken on this CPU (the kernel worker that moves the program's output
                        // to the master, the pump's worker thread) does not preempt a thread
                        // that never sleeps until its slice ends, which made a prompt printed
                        // during a dense window wait out the whole window (3 ms; `perf sched`,
                        // 1,000 sessions open).
                        next_probe = now;
                        std::thread::yield_now();
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
                let widest =
                    if quiet < FAST_PROBE_WINDOW { FAST_PROBE_GAP.min(poll) } else { poll };
                let mut gap = (quiet / 8).clamp(MIN_PROBE_GAP, widest.max(MIN_PROBE_GAP));
                if confirmed.is_some() {
                    gap = gap.min(CONFIRM_GAP);
                }
                next_probe = now + gap;
            }
            // Tier 2: output silence while the foreground does nothing (a framed command keeps
            // waiting for its marker). A sample taken now has the last word: a program still
            // computing, or a shell running a slow PROMPT_COMMAND, is busy, not idle.
            if silence_ends && last_output.max(last_busy).elapsed() >= idle {
                let now = Instant::now();
                let obs = sh.observe(Probe::Stdin).await?;
                // Output written but not taken in yet is the reader falling behind (a starved
                // pump on a loaded machine), not the program going quiet.
                let unread = obs.output_pending || obs.delivered_bytes > sh.lock().ingested;
                if cpu.busy(&obs) || unread {
                    last_busy = now;
                } else if sh.lock().last_output == last_output {
                    sh.trace_ready("tier 2: silence", start_prompts, started, echo_seen);
                    return Ok(Ready::Reason(WaitReason::InferredIdle));
                }
            }
            // With nothing to probe (the end marker is in, or the shell hung up), a poll tick
            // re-checks the prompt and the exit.
            let now = Instant::now();
            let probing = !eof && code.is_none();
            let probe_wake = match (probing, input_taken) {
                (true, true) => next_probe.max(now),
                // Output wakes us through `notified`; otherwise the blind window ends.
                (true, false) => (started + TIER1_BLIND).max(next_probe),
                (false, _) => now + poll,
            };
            let mut wake = (started + timeout).min(probe_wake);
            if silence_ends {
                wake = wake.min(last_output.max(last_busy) + idle);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake.into()) => {}
                () = cancel.cancelled() => {}
            }
        }
    }

    /// Cancellation: a real SIGINT to the foreground group (works even when the application
    /// disabled ISIG), holding the send until the shell's prompt is back or the grace ends.
    /// The line may still be queued for readline or between readline and the new job when we
    /// first look, so every command group that takes the foreground before the shell settles
    /// gets its own SIGINT, and the shell's own group gets one only while no command was seen.
    /// A framed bash line gets none while readline may still be reading it (see
    /// [`Self::shell_may_be_signalled`]). True when a command still held the foreground when
    /// the grace ended.
    async fn interrupt(&self, start_prompts: u64) -> Result<bool> {
        let sh = &self.shared;
        let grace = Duration::from_millis(sh.config.dispose_grace_ms);
        let deadline = Instant::now() + grace;
        let poll = Duration::from_millis(sh.config.poll_interval_ms);
        // Room for a few more tries within a short grace.
        let command_gap = COMMAND_REINTERRUPT_GAP.min(grace / 4);
        let shell_gap = REINTERRUPT_GAP.min(grace / 4);
        let mut signalled: Vec<i32> = Vec::new();
        let mut command_seen = false;
        let mut settled = 0;
        let mut last_sent: Option<Instant> = None;
        // Whether a command held the foreground at the last look.
        let mut command_holds;
        loop {
            let notified = sh.changed.notified();
            let (prompts, eof, line_unstarted) = {
                let st = sh.lock();
                if let Some(why) = &st.lost {
                    return Err(lost(why));
                }
                (st.prompts, st.eof, st.frame.as_ref().is_some_and(|f| !f.started()))
            };
            if eof {
                return Ok(false);
            }
            // Settled means bash is back at its prompt AND blocked reading the terminal: a
            // SIGINT that reached readline before it read the queued line leaves that line to
            // run next, and readline only blocks once no input is pending. The stdin probe
            // also tells a shell running a builtin loop from one reading the terminal.
            let obs = sh.observe(Probe::Stdin).await?;
            command_holds = !obs.leader_owns_foreground;
            // Stable over several samples, like Tier 1: readline can block for an instant
            // with the interrupted line still queued on the terminal, about to run.
            if prompts > start_prompts
                && obs.leader_owns_foreground
                && obs.stdin == StdinWait::Waiting
            {
                settled += 1;
                if settled >= STABLE_SAMPLES {
                    return Ok(false);
                }
            } else {
                settled = 0;
            }
            // The shell's own group gets a SIGINT only while no command group has been seen:
            // then the line may still sit in readline, and the signal discards it. Once a
            // command ran, the shell in the foreground means it is back, and a SIGINT would
            // be left pending in readline and eat the next line typed.
            let shell_may_get_one = !obs.leader_owns_foreground
                || (!command_seen
                    && self
                        .shell_may_be_signalled(line_unstarted && prompts <= start_prompts, &obs));
            // The shell's own group, signalled while no command group was seen, gets another
            // SIGINT now and then until its prompt is back: the first may have reached no
            // command (pwsh may still have been reading the line; a bash command's trap may
            // have taken it). Each is harmless at the prompt, which ends the repeats.
            let again = prompts <= start_prompts
                && obs.leader_owns_foreground
                && last_sent.is_some_and(|t| t.elapsed() >= shell_gap);
            // A command group signalled before that still holds the foreground: the signal
            // may have been lost while the command started (see COMMAND_REINTERRUPT_GAP).
            let command_again = !obs.leader_owns_foreground
                && last_sent.is_some_and(|t| t.elapsed() >= command_gap);
            if let Some(pg) = obs.foreground
                && (!signalled.contains(&pg) || again || command_again)
                && shell_may_get_one
            {
                last_sent = Some(Instant::now());
                signalled.push(pg);
                // The foreground may have changed since the sample: never let a change hand the
                // shell a signal meant for a command, and record who really got it.
                let target = if obs.leader_owns_foreground {
                    ForegroundTarget::Any
                } else {
                    ForegroundTarget::NotLeader
                };
                match sh.process.signal_foreground(Signal::Int, target).await {
                    Ok(Some(d)) => {
                        command_seen |= !d.leader;
                        if !signalled.contains(&d.pgid) {
                            signalled.push(d.pgid);
                        }
                    }
                    Ok(None) => {}
                    // Not delivered (the group changed under us, or the world did not
                    // answer): the next sample tries again rather than wait out the grace
                    // for a signal nobody got.
                    Err(_) => signalled.retain(|g| *g != pg),
                }
            }
            if !pause(notified, poll, deadline).await {
                return Ok(command_holds);
            }
        }
    }

    /// Whether bash's own group, in the foreground, may get a SIGINT now. Not while readline
    /// may be reading a framed line (`reading_line`: it was typed and has not started): a
    /// SIGINT that lands as readline takes the line is kept by readline's handler for its
    /// next read, and bash then runs the line as if none came (a builtin loop would spin on
    /// unstopped); one that lands mid-paste discards what readline read and leaves the rest
    /// of the line to run as typed keys. Once the line runs (its start marker came), or
    /// bash is blocked reading with no input queued, the signal is taken at once.
    fn shell_may_be_signalled(&self, reading_line: bool, obs: &TerminalObservation) -> bool {
        !reading_line
            || self.shared.dialect != Dialect::Bash
            || matches!(obs.stdin, StdinWait::Waiting | StdinWait::Unavailable)
    }

    /// Stops a framed command that ran past its deadline or waits for terminal input: an
    /// interrupt to its group (as Ctrl-C would), then SIGKILL to a group that ignored it.
    /// True once the shell is back at its prompt, reading, with its state; false when it
    /// could not be brought back (the caller resets the session).
    async fn stop_command(&self, start_prompts: u64) -> Result<bool> {
        if self.shared.dialect.commands_share_its_group() {
            // pwsh runs commands in its own group: an interrupt cannot tell them apart.
            return Ok(false);
        }
        if self.interrupt(start_prompts).await? {
            // A command ignored the interrupt: SIGKILL to its group only; the shell is never
            // killed.
            let target = ForegroundTarget::NotLeader;
            let _ = self.shared.process.signal_foreground(Signal::Kill, target).await?;
        } else if self.back_at_prompt(start_prompts).await? {
            return Ok(true);
        }
        // One more round: after the SIGKILL, or for a shell still busy itself (a builtin
        // loop that outlived the first round of interrupts on a loaded machine).
        if self.interrupt(start_prompts).await? {
            return Ok(false);
        }
        self.back_at_prompt(start_prompts).await
    }

    /// After a framed command's shell exited: waits until all it wrote is in, shown by the
    /// end of the terminal's output or by the exit marker the framing's EXIT trap prints
    /// last (a job the shell left behind may keep the terminal open). Bounded by the close
    /// grace, for a shell whose EXIT trap the command replaced.
    async fn await_last_words(&self) {
        let sh = &self.shared;
        let deadline = Instant::now() + Duration::from_millis(sh.config.dispose_grace_ms);
        loop {
            let notified = sh.changed.notified();
            {
                let st = sh.lock();
                let exited = st.frame.as_ref().is_some_and(FrameScanner::shell_exited);
                if st.eof || exited || st.lost.is_some() {
                    break;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(deadline - now) => {}
            }
        }
        // Let a racing final chunk land before the output is taken.
        tokio::task::yield_now().await;
    }

    /// The shell printed a prompt after `start_prompts`, owns the foreground and is not
    /// busy (a builtin loop that ran after that prompt is not a shell at its prompt). (The
    /// frame's end marker may be missing: a command that replaced PROMPT_COMMAND and was
    /// interrupted before its line ended took the hook with it; the next frame puts it back.)
    async fn back_at_prompt(&self, start_prompts: u64) -> Result<bool> {
        let (prompts, eof) = {
            let st = self.shared.lock();
            (st.prompts, st.eof)
        };
        if eof || prompts <= start_prompts {
            return Ok(false);
        }
        let obs = self.shared.observe(Probe::Stdin).await?;
        Ok(obs.leader_owns_foreground && obs.stdin != StdinWait::NotWaiting)
    }

    /// Refuses work on a session that is being closed, whose shell exited (the text would
    /// go nowhere), or whose world was lost (typing could run the command again while
    /// reporting a failure).
    fn check_open(&self) -> Result<()> {
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::NotFound, "session is closing").with_provider(NAME));
        }
        if let Some(why) = &self.shared.lock().lost {
            return Err(lost(why));
        }
        if let Some(exit) = self.shared.process.try_status() {
            let how = match (exit.code, exit.signal) {
                (Some(c), _) => format!("with code {c}"),
                (None, Some(s)) => format!("by signal {s}"),
                (None, None) => String::new(),
            };
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("the session's shell exited {how}; open a new session"),
            )
            .with_reason(conch_seams::ErrorReason::SessionExited)
            .with_provider(NAME));
        }
        Ok(())
    }

    /// Ends a failed write: no op is active any more.
    fn abandon_op(&self) {
        let mut st = self.shared.lock();
        st.op = None;
        let spill = st.op_spill.take();
        st.frame = None;
        st.end_send();
        drop(st);
        if let Some(c) = spill {
            c.discard_spill();
        }
    }

    /// The send's output, the newest kept; what was cut is named by the spill that holds all
    /// of it, when one could be kept (see [`Spills`]).
    async fn rendered_delta(&self) -> String {
        let (text, omitted, staged) = self.shared.take_op();
        let Some(staged) = staged else { return text };
        if omitted == 0 {
            staged.discard_spill();
            return text;
        }
        match self.shared.spills.keep(staged, str::to_string).await {
            Some(p) => format!("{OMITTED_NOTE}; full output: {p}]\n{text}"),
            None => format!("{OMITTED_NOTE}]\n{text}"),
        }
    }
}

#[async_trait]
impl TerminalSession for ShellSession {
    fn motd(&self) -> String {
        self.motd.clone()
    }

    async fn send(&self, req: SendRequest, cancel: CancellationToken) -> Result<SendOutcome> {
        // A send cancelled before it began types nothing (a background send killed at once).
        if cancel.is_cancelled() {
            return Ok(SendOutcome::Interrupted(Interrupted {
                delta: String::new(),
                typed: false,
                still_running: false,
                session_status: self.shared.status(),
            }));
        }
        // Multi-line (CRLF-safe) so `^ready$` can tell a line of output from the echoed
        // command line that contains it.
        let pattern = match req.wait_for.as_deref() {
            Some(p) => Some(
                regex::RegexBuilder::new(p)
                    .multi_line(true)
                    .crlf(true)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| {
                        Error::invalid(format!("wait_for is not a valid pattern: {e}"))
                            .with_provider(NAME)
                    })?,
            ),
            None => None,
        };
        self.check_open()?;
        self.settle_signal(&cancel).await?;
        let floor = self.owed_prompt(&cancel).await?;
        let typing = if req.text.is_empty() {
            Typing { paste: false, at_prompt: false }
        } else {
            self.pastes(floor, Some(&req.text)).await?
        };
        let paste = typing.paste;
        let cfg = &self.shared.config;
        let cap =
            req.max_output_bytes.map_or(cfg.max_read_bytes, |m| m.clamp(1, cfg.max_read_bytes));
        let spill = self.shared.spills.collector(cap);
        let (start_prompts, bytes) = {
            let mut st = self.shared.lock();
            let p = st.begin_op(cap, floor, spill);
            st.expect_echo(&req.text);
            st.watch = pattern.map(|pattern| Watch { pattern, window: String::new() });
            st.matched = false;
            st.progress = req.progress.clone().map(Progress);
            let bytes = input::encode(&req.text, &req.keys, req.submit, paste, st.modes.app_cursor);
            (p, bytes)
        };
        if !bytes.is_empty()
            && let Err(e) = self.shared.process.write(&bytes).await
        {
            self.shared.note_loss(&e);
            self.abandon_op();
            return Err(e);
        }
        let timeout = req.timeout.unwrap_or(Duration::from_millis(cfg.timeout_ms));
        let wait = if req.ignore_silence || req.wait_for.is_some() {
            Wait::UntilReady
        } else {
            Wait::Send
        };
        let shell_runs_it = typing.at_prompt && bytes.ends_with(b"\r");
        let ready = self
            .readiness(start_prompts, timeout, wait, !bytes.is_empty(), shell_runs_it, &cancel)
            .await;
        let (reason, at_prompt) = match ready {
            Ok(Ready::Reason(r)) => (r, false),
            Ok(Ready::Framed(_) | Ready::Prompt) => (WaitReason::StdinRead, true),
            Ok(Ready::Cancelled) => {
                let interrupted = self.interrupt(start_prompts).await;
                let delta = self.rendered_delta().await;
                let still_running = interrupted?;
                return Ok(SendOutcome::Interrupted(Interrupted {
                    delta,
                    typed: true,
                    still_running,
                    session_status: self.shared.status(),
                }));
            }
            Err(e) => {
                self.shared.note_loss(&e);
                self.abandon_op();
                return Err(e);
            }
        };
        // Let a racing final chunk land before taking the delta when the session ended.
        if reason == WaitReason::SessionExit {
            tokio::task::yield_now().await;
        }
        let delta = self.rendered_delta().await;
        let full_screen = self.shared.lock().screen.screen().alternate_screen();
        Ok(SendOutcome::Ready(SendSettle {
            delta,
            wait_reason: reason,
            at_prompt,
            session_status: self.shared.status(),
            full_screen,
        }))
    }

    async fn run_command(
        &self,
        command: &str,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<CommandOutcome> {
        let outcome = |output: String, omitted_bytes: u64, end: CommandEnd| CommandOutcome {
            output,
            omitted_bytes,
            end,
            session_status: self.shared.status(),
            state: None,
            spill: None,
        };
        if cancel.is_cancelled() {
            return Ok(outcome(String::new(), 0, CommandEnd::Cancelled));
        }
        self.check_open()?;
        self.settle_signal(&cancel).await?;
        let floor = self.owed_prompt(&cancel).await?;
        let nonce = crate::marker_nonce();
        let init = !self.shared.framing_ready.swap(true, Ordering::AcqRel);
        // A replaced shell's state goes with this shell's first frame, when it is text in
        // this shell's dialect.
        let dialect = self.shared.dialect;
        let restore = if init { self.shared.restore.locked().take() } else { None };
        let script = restore.as_ref().filter(|r| r.dialect == dialect).map(|r| r.script.as_str());
        let framed = dialect.framed_line(command, &nonce, init, script);
        // Pasted where readline takes pastes: it then inserts the whole line and echoes it
        // at once, where typed it echoes (and the pump takes in) one byte at a time.
        let paste = match self.shared.dialect {
            Dialect::Bash => {
                self.pastes(floor, None).await.inspect_err(|e| self.shared.note_loss(e))?.paste
            }
            Dialect::Pwsh => false,
        };
        let start_prompts = {
            let mut st = self.shared.lock();
            st.frame = Some(FrameScanner::new(&nonce, &self.shared.nonce));
            let spill = self.shared.spills.collector(COMMAND_SPILL_AT);
            let p = st.begin_op(self.shared.config.max_read_bytes, floor, spill);
            st.expect_echo(&framed);
            p
        };
        let line = crate::input::encode(&framed, &[], true, paste, false);
        if let Err(e) = self.shared.process.write(&line).await {
            self.shared.note_loss(&e);
            self.abandon_op();
            return Err(e);
        }
        let ready = match self
            .readiness(start_prompts, timeout, Wait::Framed, true, false, &cancel)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.shared.note_loss(&e);
                self.abandon_op();
                return Err(e);
            }
        };
        let stop = |cause| async move {
            match self.stop_command(start_prompts).await {
                Ok(true) => Ok(CommandEnd::Stopped(cause)),
                Ok(false) => Ok(match cause {
                    StopCause::Timeout => CommandEnd::TimedOut,
                    StopCause::WaitingForInput => CommandEnd::WaitingForInput,
                }),
                Err(e) => Err(e),
            }
        };
        let end = match ready {
            Ready::Framed(code) => Ok(CommandEnd::Exited(code)),
            Ready::Reason(WaitReason::SessionExit) => {
                self.await_last_words().await;
                Ok(CommandEnd::SessionExited)
            }
            // A framed command's prompt is `Framed`; a bare prompt cannot end one.
            Ready::Reason(WaitReason::StdinRead) | Ready::Prompt => {
                stop(StopCause::WaitingForInput).await
            }
            Ready::Reason(WaitReason::Timeout | WaitReason::InferredIdle | WaitReason::Matched) => {
                stop(StopCause::Timeout).await
            }
            Ready::Cancelled => Ok(CommandEnd::Cancelled),
        };
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                self.shared.note_loss(&e);
                self.abandon_op();
                return Err(e);
            }
        };
        // A command still running after cancellation (or one that could not be stopped) is
        // left to the caller: closing the session stops it within the close grace.
        let mut frame = self.shared.lock().frame.take();
        if frame.as_ref().is_some_and(FrameScanner::replaced_shell) {
            // `exec bash`: the new shell has the prompt hook (from the environment) but not
            // the framed commands' helpers.
            self.shared.framing_ready.store(false, Ordering::Release);
        }
        let (retained, _, op_spill) = self.shared.take_op();
        let started = frame.as_ref().is_some_and(FrameScanner::started);
        // An interrupted line ends like one the errexit emulation stopped: bash printed one
        // newline of its own.
        let scanner_errexit = frame.as_ref().is_some_and(FrameScanner::stopped_by_errexit);
        let errexit = scanner_errexit || matches!(end, CommandEnd::Stopped(_));
        let session_nonce = &self.shared.nonce;
        let body = framing::extract(&retained, &nonce, session_nonce, started, errexit);
        // The newline bash printed for an interrupt is no output either (the scanner already
        // left out the errexit emulation's).
        let interrupt_newline = if matches!(end, CommandEnd::Stopped(_)) && !scanner_errexit {
            framing::extract(&retained, &nonce, session_nonce, started, false).len() - body.len()
        } else {
            0
        };
        let body = body.to_string();
        // The state is the shell's own report at its prompt; a shell that did not get back
        // there (or was replaced) reported none.
        let state = frame
            .as_mut()
            .and_then(FrameScanner::take_state)
            .map(|(exports, script)| ShellState { dialect: self.shared.dialect, exports, script });
        let state = match end {
            CommandEnd::Exited(_) | CommandEnd::Stopped(_) => state,
            _ => None,
        };
        // Exact: the scanner counted every byte after the start marker (up to the end marker
        // when it came), even those the retained tail no longer holds.
        let total = frame.map_or(0, FrameScanner::finish).saturating_sub(interrupt_newline as u64);
        let omitted = total.saturating_sub(body.len() as u64);
        // The command's whole output, when it passed COMMAND_SPILL_AT: its part of what the
        // line printed, cut as from the retained tail.
        let cut = |full: &str| {
            framing::extract(full, &nonce, session_nonce, started, errexit).to_string()
        };
        let spill = match op_spill {
            Some(op) if total > COMMAND_SPILL_AT as u64 => self.shared.spills.keep(op, cut).await,
            Some(op) => {
                op.discard_spill();
                None
            }
            None => None,
        };
        Ok(CommandOutcome { state, spill, ..outcome(body, omitted, end) })
    }

    fn read(&self, offset_lines: usize, max_lines: usize) -> ScrollbackPage {
        let mut st = self.shared.lock();
        // The unfinished line as it stands now (not copied at every chunk: a long line being
        // drawn would cost its length each time).
        let live = st.parser.live_line();
        st.scrollback.set_live(&live);
        st.scrollback.page(offset_lines, max_lines, self.shared.config.max_read_bytes)
    }

    fn screen(&self) -> Option<ScreenView> {
        Some(self.shared.lock().screen_view())
    }

    async fn resize(&self, size: TerminalSize) -> Result<()> {
        if let Some(why) = crate::size_issue(size.rows, size.cols) {
            return Err(Error::invalid(why).with_provider(NAME).with_operation("resize"));
        }
        self.check_open()?;
        let before = {
            // The models first: what the program redraws after its SIGWINCH is laid out at
            // the new size.
            let mut st = self.shared.lock();
            let n = |v: u16| std::num::NonZeroU16::new(v).unwrap_or(std::num::NonZeroU16::MIN);
            st.screen.screen_mut().set_size(n(size.rows), n(size.cols));
            st.parser.resize(size.rows, size.cols);
            st.prompts
        };
        self.shared.process.resize(size).await.inspect_err(|e| self.shared.note_loss(e))?;
        // At its prompt, readline redraws the prompt line on SIGWINCH, marker included: the
        // next send must not take that redraw for its own prompt, so it first waits for it
        // (bounded), as after a signal.
        if self.shared.dialect == Dialect::Bash
            && self.shared.observe(Probe::Foreground).await?.leader_owns_foreground
        {
            let mut st = self.shared.lock();
            if !st.busy() {
                st.signalled = Some((before, Instant::now()));
            }
        }
        Ok(())
    }

    async fn signal(&self, signal: Signal) -> Result<SignalDelivery> {
        // The shell itself must not be SIGKILLed through here: that is what close is for.
        let target = if signal == Signal::Kill {
            ForegroundTarget::NotLeader
        } else {
            ForegroundTarget::Any
        };
        let Some(delivery) = self.shared.process.signal_foreground(signal, target).await? else {
            return Err(Error::invalid(
                "SIGKILL would target the shell itself; use terminal_close to end the session",
            )
            .with_provider(NAME));
        };
        // A signal to a command's group: the send after it must not take the prompt the
        // signalled command brings back as its own. Where commands share the shell's group
        // (pwsh), the delivery is always the leader's, so a busy shell counts instead.
        let mut st = self.shared.lock();
        if !delivery.leader || (self.shared.dialect.commands_share_its_group() && st.busy()) {
            st.signalled = Some((st.prompts, Instant::now()));
        }
        Ok(delivery)
    }

    fn status(&self) -> SessionStatus {
        self.shared.status()
    }

    fn sandbox_mode(&self) -> Option<SandboxMode> {
        self.sandbox
    }

    async fn close(&self) -> Result<CloseReport> {
        let mut done = self.shared.close_lock.lock().await;
        if let Some(report) = done.as_ref() {
            return Ok(report.clone());
        }
        self.shared.closing.store(true, Ordering::Release);
        let grace = Duration::from_millis(self.shared.config.dispose_grace_ms);
        let reopen = |e: Error| {
            self.shared.closing.store(false, Ordering::Release);
            e
        };
        let report = self.shared.process.terminate(grace).await.map_err(reopen)?;
        if !report.survivors.is_empty() || report.leader.is_none() {
            return Err(reopen(
                Error::internal(format!(
                    "terminal close could not stop {:?}; retry terminal_close",
                    report.survivors
                ))
                .with_provider(NAME),
            ));
        }
        // Teardown saw the exit; the pump's wait makes the status visible to readers too.
        let status = match tokio::time::timeout(REAP_LIMIT, self.shared.process.wait()).await {
            Ok(s) => s.map_err(reopen)?,
            Err(_) => report.leader.unwrap_or_default(),
        };
        let report =
            CloseReport { root_exit: SessionStatus::Exited(status), survivors: Vec::new() };
        drop(self.release.locked().take());
        *done = Some(report.clone());
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_screen_model_answers_queries_where_they_were_asked() {
        let mut screen = screen_model(TerminalSize { rows: 5, cols: 20 }, true);
        screen.process(b"ab\x1b[6n\r\nxyz   \x1b[6n\x1b[>c\x1b[c\x1b[5n\x1b]11;?\x07\x1b[99n");
        let answers = std::mem::take(&mut screen.callbacks_mut().out);
        assert_eq!(
            String::from_utf8(answers).unwrap(),
            "\x1b[1;3R\x1b[2;7R\x1b[>0;10;1c\x1b[?1;2c\x1b[0n\x1b]11;rgb:0000/0000/0000\x1b\\",
            "each cursor answer is the position at its own request"
        );
        // Where the parser answers (pwsh), the screen model stays silent.
        let mut quiet = screen_model(TerminalSize { rows: 5, cols: 20 }, false);
        quiet.process(b"\x1b[6n\x1b[>c");
        assert!(quiet.callbacks().out.is_empty());
    }

    #[test]
    fn the_screen_model_holds_what_a_full_screen_program_drew() {
        let model = |bytes: &[u8]| {
            let mut screen = screen_model(TerminalSize { rows: 6, cols: 30 }, true);
            screen.process(bytes);
            screen
        };
        let screen = model(b"$ vim\r\n\x1b[?1049h\x1b[H\x1b[2Jhello\r\n~\r\n~\x1b[6;1H\"f\" 1L");
        let s = screen.screen();
        assert!(s.alternate_screen());
        let rows: Vec<String> = s.rows(0, 30).map(|r| r.trim_end().to_string()).collect();
        assert_eq!(rows, ["hello", "~", "~", "", "", "\"f\" 1L"]);
    }
}
