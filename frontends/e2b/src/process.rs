//! envd's process service (`/process.Process/*`) over the subprocess seam.
//!
//! Steps, and why:
//! - `Start` spawns through [`Subprocess::spawn`] (pipes) or [`Subprocess::spawn_terminal`]
//!   (a PTY) and registers the process under its pid before the first message, so a
//!   `Connect`, `SendInput` or `SendSignal` racing the stream finds it. A process belongs to
//!   the table, not to the stream that started it: a client that drops the stream leaves it
//!   running, as envd does.
//! - Output is read by offset from the seam's collectors (pipes) or from a bounded log the
//!   PTY's pump fills, so every stream that follows a process reads at its own pace and a
//!   `Connect` can start where it likes: at the live end (envd's behaviour, the default) or,
//!   with `X-Conch-Replay: all`, at the oldest byte still kept.
//! - A follower that fell behind the pipe collector's memory window reads the gap from the
//!   stream's spill file through the files seam, so a slow client loses nothing while the
//!   spill is kept.
//! - `SendSignal` (SIGTERM or SIGKILL) stops the whole tree through the seam (TERM, grace,
//!   KILL for pipes; HUP, grace, KILL for a PTY), where envd signals only the leader.
//! - `Connect-Timeout-Ms` on `Start` is the process's own limit, as in envd: past it the tree
//!   is stopped and the end says why. The server adds no limit of its own.
//! - The end event always carries `exitCode` and `exited`, zero or not.
//! - A finished process leaves the table: `kill`, input and resizes find it no more (as in
//!   envd), and a late `Connect` gets its start and its end, kept for the last [`KEPT_ENDED`].
//!   Its output goes with the last follower's handle.
//!
//! Limits: a PTY's log keeps the newest [`PTY_LOG_BYTES`]; a pipe follower can be as far
//! behind as the stream's spill reaches ([`SPILL_CAP`], within the provider's spill limits).
//! A follower further behind than what is kept ends its stream with `data_loss`, naming the
//! bytes lost: never a silent gap.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conch_confine::{Confinement, SandboxRelease};
use conch_seams::{
    CommandLine, ExitStatus, Files, OutputSpec, Process, SpawnSpec, StdinSpec, StreamId,
    Subprocess, TerminalProcess, TerminalSize, TerminalSpawnSpec,
};
use conch_sync::LockExt;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::connect::{CallOptions, Code, RpcError, Stream, idle, until};
use crate::proto::{self, ProcessConfig, Selector, Signal};

/// The largest data event's payload.
const CHUNK: usize = 64 << 10;
/// Output of each pipe kept in memory.
pub const MEMORY_BYTES: usize = 4 << 20;
/// The largest spill of one pipe stream: a follower can be this far behind and lose nothing.
pub const SPILL_CAP: u64 = 256 << 20;
/// Output of a PTY kept for followers.
pub const PTY_LOG_BYTES: usize = 4 << 20;
/// Finished processes that `Connect` still finds.
pub const KEPT_ENDED: usize = 64;
/// TERM (or HUP) to KILL when a tree is stopped.
const GRACE: Duration = Duration::from_secs(2);

/// How a process ended, as envd's `EndEvent` says it.
#[derive(Clone, Debug)]
struct End {
    exit_code: i32,
    exited: bool,
    status: String,
    error: Option<String>,
}

impl End {
    fn of(status: &ExitStatus, error: Option<String>) -> Self {
        match (status.code, status.signal.as_deref()) {
            (Some(c), _) => {
                Self { exit_code: c, exited: true, status: format!("exit status {c}"), error }
            }
            (None, Some(sig)) => Self {
                exit_code: -1,
                exited: false,
                status: format!("signal: {}", signal_words(sig)),
                error,
            },
            (None, None) => Self {
                exit_code: -1,
                exited: false,
                status: "unknown".into(),
                error: error.or_else(|| Some("the exit status is unknown".into())),
            },
        }
    }

    fn lost(e: &conch_seams::Error) -> Self {
        Self::of(&ExitStatus::default(), Some(format!("the process was lost: {e}")))
    }

    fn event(&self) -> Value {
        let mut end =
            json!({"exitCode": self.exit_code, "exited": self.exited, "status": self.status});
        if let Some(e) = &self.error {
            end["error"] = json!(e);
        }
        json!({"event": {"end": end}})
    }
}

/// How Go's `ProcessState` (and so envd's `status`) words a signal.
fn signal_words(name: &str) -> String {
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    match bare {
        "KILL" => "killed".into(),
        "TERM" => "terminated".into(),
        "INT" => "interrupt".into(),
        "HUP" => "hangup".into(),
        "QUIT" => "quit".into(),
        "ABRT" => "aborted".into(),
        "SEGV" => "segmentation fault".into(),
        "PIPE" => "broken pipe".into(),
        "ALRM" => "alarm clock".into(),
        "USR1" => "user defined signal 1".into(),
        "USR2" => "user defined signal 2".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// A PTY's output, the newest [`PTY_LOG_BYTES`] of it, by offset.
#[derive(Debug, Default)]
struct LogState {
    /// Offset of `buf[0]`.
    start: u64,
    buf: Vec<u8>,
    eof: bool,
}

#[derive(Debug)]
struct PtyLog {
    state: Mutex<LogState>,
    /// Bumped on every append and at EOF.
    grew: watch::Sender<u64>,
}

impl PtyLog {
    fn new() -> Self {
        Self { state: Mutex::new(LogState::default()), grew: watch::Sender::new(0) }
    }

    fn append(&self, data: &[u8]) {
        let mut s = self.state.locked();
        s.buf.extend_from_slice(data);
        // Trimmed in halves, so the copy is paid once per PTY_LOG_BYTES, not per chunk.
        if s.buf.len() > 2 * PTY_LOG_BYTES {
            let cut = s.buf.len() - PTY_LOG_BYTES;
            s.buf.drain(..cut);
            s.start += cut as u64;
        }
        drop(s);
        self.grew.send_modify(|n| *n += 1);
    }

    fn close(&self) {
        self.state.locked().eof = true;
        self.grew.send_modify(|n| *n += 1);
    }

    /// Bytes from `offset`, the next offset, and whether the log is finished and read to its
    /// end; `Err` with the bytes lost when `offset` is older than the oldest kept.
    fn read(&self, offset: u64) -> Result<(Vec<u8>, u64, bool), u64> {
        let s = self.state.locked();
        if offset < s.start {
            return Err(s.start - offset);
        }
        let end = s.start + s.buf.len() as u64;
        let from = offset.min(end);
        let i = usize::try_from(from - s.start).unwrap_or(usize::MAX).min(s.buf.len());
        let j = (i + CHUNK).min(s.buf.len());
        let next = s.start + j as u64;
        Ok((s.buf[i..j].to_vec(), next, s.eof && next == end))
    }

    fn end(&self) -> u64 {
        let s = self.state.locked();
        s.start + s.buf.len() as u64
    }

    /// The offset of the oldest byte kept.
    fn start(&self) -> u64 {
        self.state.locked().start
    }
}

#[derive(Debug)]
enum Io {
    Pipe { process: Arc<dyn Process>, stdin: bool },
    Pty { term: Arc<dyn TerminalProcess>, log: Arc<PtyLog> },
}

/// One process the service knows.
#[derive(Debug)]
struct Entry {
    pid: u32,
    tag: Option<String>,
    config: ProcessConfig,
    io: Io,
    /// Set once, when the process settled.
    end: watch::Sender<Option<End>>,
    /// Why the service stopped the process (its timeout), recorded before the stop.
    stopped_because: Mutex<Option<String>>,
    /// Frees what a sandbox runner made for the process, once the entry is forgotten.
    _release: Option<SandboxRelease>,
}

impl Entry {
    fn info(&self) -> Value {
        let mut info = json!({"config": self.config, "pid": self.pid});
        if let Some(t) = &self.tag {
            info["tag"] = json!(t);
        }
        info
    }

    /// Stops the whole tree; returns once the seam took the request.
    async fn stop(&self, grace: Duration) -> Result<(), RpcError> {
        match &self.io {
            Io::Pipe { process, .. } => process.kill().await.map_err(RpcError::from),
            Io::Pty { term, .. } => {
                let term = Arc::clone(term);
                // `terminate` waits for the tree to be gone; the caller only asked to stop it.
                tokio::spawn(async move {
                    if let Err(e) = term.terminate(grace).await {
                        tracing::warn!("stopping a PTY process: {e}");
                    }
                });
                Ok(())
            }
        }
    }
}

/// What is kept of a finished process: what `Connect` answers (its start and its end).
#[derive(Clone, Debug)]
struct Ended {
    pid: u32,
    tag: Option<String>,
    end: End,
}

#[derive(Debug, Default)]
struct Table {
    live: HashMap<u32, Arc<Entry>>,
    /// Newest last; no output (its collectors go with the last follower).
    ended: VecDeque<Ended>,
    /// Ids for processes whose provider exposes no pid.
    next_id: u32,
}

/// The process service's state.
#[derive(Debug)]
pub(crate) struct Processes {
    subprocess: Arc<dyn Subprocess>,
    files: Arc<dyn Files>,
    /// The composition's sandbox and default policy, which every process starts under.
    confinement: Option<Confinement>,
    defaults: ProcessDefaults,
    table: Mutex<Table>,
    stop: CancellationToken,
}

/// What a process gets when its `Start` does not say: a sandbox's home and environment.
#[derive(Clone, Debug, Default)]
pub struct ProcessDefaults {
    /// The working directory of a process started without `cwd` (`None`: the subprocess
    /// provider's default directory).
    pub cwd: Option<std::path::PathBuf>,
    /// Variables every process gets; a `Start`'s own `envs` override them.
    pub env: Vec<(String, String)>,
}

/// What a selector found.
#[derive(Debug)]
enum Found {
    Live(Arc<Entry>),
    Ended(Ended),
}

fn not_found(selector: Option<&Selector>) -> RpcError {
    match selector.map(|s| (s.pid, s.tag.as_deref())) {
        Some((Some(pid), _)) => RpcError::not_found(format!("process with pid {pid} not found")),
        Some((None, Some(tag))) => {
            RpcError::not_found(format!("process with tag {tag:?} not found"))
        }
        _ => RpcError::not_found("process not found"),
    }
}

/// Where a follower starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum From {
    /// The first byte (a process just started), or the oldest still kept.
    Oldest,
    /// What is produced from now on (envd's `Connect`).
    Live,
}

impl Processes {
    pub(crate) fn new(
        subprocess: Arc<dyn Subprocess>,
        files: Arc<dyn Files>,
        confinement: Option<Confinement>,
        defaults: ProcessDefaults,
    ) -> Arc<Self> {
        Arc::new(Self {
            subprocess,
            files,
            confinement,
            defaults,
            table: Mutex::new(Table { next_id: 1 << 30, ..Table::default() }),
            stop: CancellationToken::new(),
        })
    }

    /// Stops every live process tree and waits for each to settle (the server's shutdown).
    pub(crate) async fn shutdown(&self) {
        self.stop.cancel();
        let live: Vec<Arc<Entry>> = self.table.locked().live.values().cloned().collect();
        for e in &live {
            if let Err(err) = e.stop(Duration::from_millis(200)).await {
                tracing::warn!(pid = e.pid, "stopping a process at shutdown: {}", err.message);
            }
        }
        for e in live {
            let mut rx = e.end.subscribe();
            let _ = rx.wait_for(Option::is_some).await;
        }
    }

    /// A running process, as envd finds one for input, signals and resizes: a finished one
    /// is `not_found` (the SDK's `kill` then answers False).
    fn find_live(&self, selector: Option<&Selector>) -> Result<Arc<Entry>, RpcError> {
        match self.find(selector)? {
            Found::Live(e) => Ok(e),
            Found::Ended(_) => Err(not_found(selector)),
        }
    }

    /// A running process, or what is kept of a finished one.
    fn find(&self, selector: Option<&Selector>) -> Result<Found, RpcError> {
        let Some(sel) = selector else {
            return Err(RpcError::invalid("the request names no process (pid or tag)"));
        };
        let t = self.table.locked();
        let found =
            match (sel.pid, sel.tag.as_deref()) {
                (Some(pid), _) => t.live.get(&pid).cloned().map(Found::Live).or_else(|| {
                    t.ended.iter().rev().find(|e| e.pid == pid).cloned().map(Found::Ended)
                }),
                (None, Some(tag)) => {
                    let tagged = |t: &Option<String>| t.as_deref() == Some(tag);
                    t.live.values().find(|e| tagged(&e.tag)).cloned().map(Found::Live).or_else(
                        || t.ended.iter().rev().find(|e| tagged(&e.tag)).cloned().map(Found::Ended),
                    )
                }
                (None, None) => return Err(RpcError::invalid("the selector names no pid or tag")),
            };
        found.ok_or_else(|| not_found(selector))
    }

    /// Registers a started process and starts the task that records its end.
    fn register(
        self: &Arc<Self>,
        pid: Option<u32>,
        tag: Option<String>,
        config: ProcessConfig,
        io: Io,
        release: Option<SandboxRelease>,
    ) -> Result<Arc<Entry>, Arc<Entry>> {
        let mut t = self.table.locked();
        let pid = pid.unwrap_or_else(|| {
            t.next_id += 1;
            t.next_id
        });
        let entry = Arc::new(Entry {
            pid,
            tag,
            config,
            io,
            end: watch::Sender::new(None),
            stopped_because: Mutex::new(None),
            _release: release,
        });
        // Checked under the table's lock, which `shutdown` takes after cancelling: a process
        // registered after its sweep would outlive the server's (or the sandbox's) teardown.
        if self.stop.is_cancelled() {
            return Err(entry);
        }
        // A recycled pid: the finished process that had it is no longer findable by pid.
        t.ended.retain(|e| e.pid != pid);
        t.live.insert(pid, Arc::clone(&entry));
        drop(t);
        let me = Arc::clone(self);
        let watched = Arc::clone(&entry);
        tokio::spawn(async move { me.settle(watched).await });
        Ok(entry)
    }

    /// Waits for `entry`'s end, records it and moves the entry to the finished ones.
    async fn settle(self: Arc<Self>, entry: Arc<Entry>) {
        let end = match &entry.io {
            Io::Pipe { process, .. } => match process.wait().await {
                Ok(s) => End::of(&s, None),
                Err(e) => End::lost(&e),
            },
            Io::Pty { term, log } => {
                // The pump marks EOF; the exit comes from the seam.
                let mut grew = log.grew.subscribe();
                while !log.state.locked().eof {
                    if grew.changed().await.is_err() {
                        break;
                    }
                }
                match term.wait().await {
                    Ok(s) => End::of(&s, None),
                    Err(e) => End::lost(&e),
                }
            }
        };
        // The service's own reason for stopping it, recorded before the stop, comes first.
        let because = entry.stopped_because.locked().clone();
        let end = End { error: because.or(end.error.clone()), ..end };
        // Out of the live table before the end is told: a client that saw the end never
        // finds the process in `List`. Only the end is kept: the output goes with the last
        // follower's handle (a spill file stays, under the provider's spill limits).
        {
            let mut t = self.table.locked();
            if t.live.get(&entry.pid).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                t.live.remove(&entry.pid);
            }
            t.ended.push_back(Ended { pid: entry.pid, tag: entry.tag.clone(), end: end.clone() });
            let over = t.ended.len().saturating_sub(KEPT_ENDED);
            t.ended.drain(..over);
        }
        entry.end.send_replace(Some(end));
    }

    /// `Start`: spawns the process and follows it from its first byte.
    pub(crate) async fn start(
        self: &Arc<Self>,
        message: Value,
        opts: CallOptions,
    ) -> Result<axum::response::Response, RpcError> {
        let req: proto::StartRequest = proto::decode(message)?;
        let config = req.process.unwrap_or_default();
        if config.cmd.is_empty() {
            return Err(RpcError::invalid("process.cmd is empty"));
        }
        let mut argv = vec![config.cmd.clone()];
        argv.extend(config.args.iter().cloned());
        let mut line = CommandLine::new(argv);
        line.cwd = config
            .cwd
            .as_deref()
            .filter(|c| !c.is_empty())
            .map(|c| proto::resolve_path(self.files.default_dir(), c))
            .or_else(|| self.defaults.cwd.clone());
        let mut env: std::collections::BTreeMap<&str, &str> =
            self.defaults.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.extend(config.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        line.env = env.into_iter().map(|(k, v)| (k.to_owned(), Some(v.to_owned()))).collect();
        // Under a sandbox composition every process runs behind its runner, as the shell's
        // commands do; one that cannot run confined does not run at all.
        let (line, release) = match &self.confinement {
            Some(c) => {
                let w = c.wrap(c.policy(), line)?;
                (w.command, Some(w.release))
            }
            None => (line, None),
        };
        let entry = match req.pty {
            Some(pty) => {
                let size = terminal_size(pty.size.unwrap_or_default())?;
                let mut spec = TerminalSpawnSpec::in_default_dir(line.argv);
                spec.cwd = line.cwd;
                spec.env = line.env;
                spec.size = size;
                let term = self.subprocess.spawn_terminal(spec).await?;
                let log = Arc::new(PtyLog::new());
                tokio::spawn(pump(Arc::clone(&term), Arc::clone(&log)));
                self.register(term.pid(), req.tag, config, Io::Pty { term, log }, release)
            }
            None => {
                let stdin = req.stdin.unwrap_or(true);
                let collect = OutputSpec::Collect { max_bytes: MEMORY_BYTES, spill_cap: SPILL_CAP };
                let mut spec = SpawnSpec::in_default_dir(line.argv)
                    .with_cwd(line.cwd)
                    .with_stdin(if stdin { StdinSpec::Pipe } else { StdinSpec::Null })
                    .with_stdout(collect.clone())
                    .with_stderr(collect)
                    .with_grace(GRACE);
                spec.env = line.env;
                let process = self.subprocess.spawn(spec).await?;
                self.register(process.pid(), req.tag, config, Io::Pipe { process, stdin }, release)
            }
        };
        let entry = match entry {
            Ok(e) => e,
            Err(late) => {
                if let Err(e) = late.stop(Duration::ZERO).await {
                    tracing::warn!(
                        pid = late.pid,
                        "stopping a process started during shutdown: {}",
                        e.message
                    );
                }
                return Err(RpcError::new(
                    Code::Unavailable,
                    "the sandbox is shutting down: the process was stopped",
                ));
            }
        };
        if let Some(limit) = opts.timeout.filter(|t| !t.is_zero()) {
            self.limit(Arc::clone(&entry), limit);
        }
        // The process's limit is the stream's too; the stream itself adds none.
        Ok(self.follow(entry, From::Oldest, CallOptions { timeout: None, ..opts }))
    }

    /// Stops `entry`'s tree once `limit` passed, unless it ended first.
    fn limit(&self, entry: Arc<Entry>, limit: Duration) {
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut end = entry.end.subscribe();
            tokio::select! {
                () = tokio::time::sleep(limit) => {}
                _ = end.wait_for(Option::is_some) => return,
                () = stop.cancelled() => return,
            }
            *entry.stopped_because.locked() = Some(format!(
                "the call's timeout (Connect-Timeout-Ms: {}) passed: the process tree was stopped",
                limit.as_millis()
            ));
            if let Err(e) = entry.stop(Duration::ZERO).await {
                tracing::warn!(
                    pid = entry.pid,
                    "stopping a process past its timeout: {}",
                    e.message
                );
            }
        });
    }

    /// `Connect`: follows a known process, from now on (or from the oldest kept byte when
    /// the client asks with `X-Conch-Replay: all`).
    pub(crate) fn connect(
        self: &Arc<Self>,
        message: Value,
        opts: CallOptions,
        replay: bool,
    ) -> Result<axum::response::Response, RpcError> {
        let req: proto::ProcessRequest = proto::decode(message)?;
        match self.find(req.process.as_ref())? {
            Found::Live(entry) => {
                let from = if replay { From::Oldest } else { From::Live };
                Ok(self.follow(entry, from, opts))
            }
            // As envd answers a late `Connect`: the start and the kept end, no output.
            Found::Ended(ended) => {
                let (stream, response) = Stream::open();
                tokio::spawn(async move {
                    if stream.send(&json!({"event": {"start": {"pid": ended.pid}}})).await
                        && stream.send(&ended.end.event()).await
                    {
                        stream.end(None).await;
                    }
                });
                Ok(response)
            }
        }
    }

    fn follow(&self, entry: Arc<Entry>, from: From, opts: CallOptions) -> axum::response::Response {
        let (stream, response) = Stream::open();
        let files = Arc::clone(&self.files);
        tokio::spawn(async move {
            let follower = Follower::new(&entry, from, files);
            follower.run(entry, stream, opts).await;
        });
        response
    }

    /// `List`: the processes still running.
    pub(crate) fn list(&self) -> Value {
        let t = self.table.locked();
        let mut live: Vec<&Arc<Entry>> = t.live.values().collect();
        live.sort_by_key(|e| e.pid);
        json!({"processes": live.iter().map(|e| e.info()).collect::<Vec<_>>()})
    }

    /// `SendInput`: bytes to a piped stdin or to a PTY.
    pub(crate) async fn send_input(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::SendInputRequest = proto::decode(message)?;
        let entry = self.find_live(req.process.as_ref())?;
        let input = req.input.unwrap_or_default();
        match (&entry.io, input.stdin, input.pty) {
            (Io::Pipe { stdin: false, .. }, Some(_), _) => Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "process {} was started without stdin (start it with stdin=True)",
                    entry.pid
                ),
            )),
            (Io::Pipe { process, .. }, Some(data), _) => {
                process.write_stdin(&data).await.map_err(RpcError::from)?;
                Ok(json!({}))
            }
            (Io::Pty { term, .. }, _, Some(data)) => {
                term.write(&data).await.map_err(RpcError::from)?;
                Ok(json!({}))
            }
            (Io::Pipe { .. }, None, Some(_)) => Err(RpcError::invalid(format!(
                "process {} has no PTY: send its input as stdin",
                entry.pid
            ))),
            (Io::Pty { .. }, Some(_), None) => Err(RpcError::invalid(format!(
                "process {} runs on a PTY: send its input as pty",
                entry.pid
            ))),
            (_, None, None) => Err(RpcError::invalid("the input holds neither stdin nor pty")),
        }
    }

    /// `SendSignal`: SIGTERM or SIGKILL stops the process's whole tree.
    pub(crate) async fn send_signal(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::SendSignalRequest = proto::decode(message)?;
        let entry = self.find_live(req.process.as_ref())?;
        let grace = match req.signal {
            Signal::Unspecified => return Err(RpcError::invalid("the signal is unspecified")),
            Signal::Term => GRACE,
            Signal::Kill => Duration::ZERO,
        };
        entry.stop(grace).await?;
        Ok(json!({}))
    }

    /// `CloseStdin`: EOF on a piped stdin.
    pub(crate) async fn close_stdin(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::ProcessRequest = proto::decode(message)?;
        let entry = self.find_live(req.process.as_ref())?;
        match &entry.io {
            Io::Pipe { process, .. } => process.close_stdin().await.map_err(RpcError::from)?,
            Io::Pty { .. } => {
                return Err(RpcError::invalid(format!(
                    "process {} runs on a PTY, which has no stdin to close: send Ctrl-D (0x04)",
                    entry.pid
                )));
            }
        }
        Ok(json!({}))
    }

    /// `Update`: a PTY's size.
    pub(crate) async fn update(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::UpdateRequest = proto::decode(message)?;
        let entry = self.find_live(req.process.as_ref())?;
        let Some(size) = req.pty.and_then(|p| p.size) else {
            return Ok(json!({}));
        };
        let size = terminal_size(size)?;
        match &entry.io {
            Io::Pty { term, .. } => term.resize(size).await.map_err(RpcError::from)?,
            Io::Pipe { .. } => {
                return Err(RpcError::invalid(format!(
                    "process {} has no PTY to resize",
                    entry.pid
                )));
            }
        }
        Ok(json!({}))
    }
}

fn terminal_size(size: proto::PtySize) -> Result<TerminalSize, RpcError> {
    match (u16::try_from(size.cols), u16::try_from(size.rows)) {
        (Ok(cols), Ok(rows)) if cols > 0 && rows > 0 => Ok(TerminalSize { cols, rows }),
        _ => Err(RpcError::invalid(format!(
            "pty.size {}x{} (cols x rows) is not a terminal size",
            size.cols, size.rows
        ))),
    }
}

/// Moves a PTY's output into its log until EOF.
async fn pump(term: Arc<dyn TerminalProcess>, log: Arc<PtyLog>) {
    loop {
        match term.read_chunk().await {
            Ok(Some(chunk)) => log.append(&chunk),
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("reading a PTY: {e}");
                break;
            }
        }
    }
    log.close();
}

/// A follower that fell further behind than the output kept for it.
fn fell_behind(stream: &str, lost: u64) -> RpcError {
    RpcError::new(
        Code::DataLoss,
        format!(
            "this stream fell {lost} bytes of {stream} behind the output the server keeps (the \
             newest {} MiB in memory, and the whole stream while its spill file is kept): they \
             are gone, so the stream ends here rather than skip them",
            MEMORY_BYTES >> 20
        ),
    )
}

/// Which output a data event carries.
#[derive(Clone, Copy, Debug)]
enum Output {
    Stdout,
    Stderr,
    Pty,
}

impl Output {
    fn event(self, data: &[u8]) -> Value {
        let name = match self {
            Output::Stdout => "stdout",
            Output::Stderr => "stderr",
            Output::Pty => "pty",
        };
        json!({"event": {"data": {name: proto::b64(data)}}})
    }
}

/// One stream's reading position in one process's output.
#[derive(Debug)]
struct Follower {
    files: Arc<dyn Files>,
    out: u64,
    err: u64,
    out_done: bool,
    err_done: bool,
}

impl Follower {
    fn new(entry: &Entry, from: From, files: Arc<dyn Files>) -> Self {
        // The oldest byte still kept: the first, while a spill holds the whole stream.
        let oldest = |process: &Arc<dyn Process>, id| match process.read(id, 0, 0) {
            Ok(r) if r.lossy && r.spill.is_none() => r.start_offset,
            _ => 0,
        };
        let (out, err) = match (&entry.io, from) {
            (Io::Pipe { process, .. }, From::Oldest) => {
                (oldest(process, StreamId::Stdout), oldest(process, StreamId::Stderr))
            }
            (Io::Pty { log, .. }, From::Oldest) => (log.start(), 0),
            (Io::Pipe { process, .. }, From::Live) => (
                process.read(StreamId::Stdout, u64::MAX, 0).map(|r| r.next_offset).unwrap_or(0),
                process.read(StreamId::Stderr, u64::MAX, 0).map(|r| r.next_offset).unwrap_or(0),
            ),
            (Io::Pty { log, .. }, From::Live) => (log.end(), 0),
        };
        let pty = matches!(entry.io, Io::Pty { .. });
        Self { files, out, err, out_done: false, err_done: pty }
    }

    /// The start event, the output as it comes, keepalives in its silences, and the end.
    async fn run(mut self, entry: Arc<Entry>, stream: Stream, opts: CallOptions) {
        if !stream.send(&json!({"event": {"start": {"pid": entry.pid}}})).await {
            return;
        }
        let deadline =
            opts.timeout.filter(|t| !t.is_zero()).map(|t| tokio::time::Instant::now() + t);
        let keepalive = opts.keepalive;
        loop {
            let next = tokio::select! {
                biased;
                () = stream.closed() => return,
                () = until(deadline) => {
                    stream.end(Some(RpcError::new(Code::DeadlineExceeded, "the stream's timeout passed (Connect-Timeout-Ms)"))).await;
                    return;
                }
                next = self.next(&entry) => next,
                () = idle(keepalive) => {
                    if !stream.send(&json!({"event": {"keepalive": {}}})).await {
                        return;
                    }
                    continue;
                }
            };
            match next {
                Ok(Some((which, data))) => {
                    if !stream.send(&which.event(&data)).await {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    stream.end(Some(e)).await;
                    return;
                }
            }
        }
        let mut end = entry.end.subscribe();
        let ended = tokio::select! {
            () = stream.closed() => return,
            () = until(deadline) => {
                stream.end(Some(RpcError::new(Code::DeadlineExceeded, "the stream's timeout passed (Connect-Timeout-Ms)"))).await;
                return;
            }
            // The borrow ends inside the branch: a watch `Ref` may not cross an await.
            e = async { end.wait_for(Option::is_some).await.ok().and_then(|e| e.clone()) } => e,
        };
        match ended {
            Some(end) => {
                if stream.send(&end.event()).await {
                    stream.end(None).await;
                }
            }
            None => {
                stream
                    .end(Some(RpcError::new(Code::Internal, "the process's end was not recorded")))
                    .await;
            }
        }
    }

    /// The next piece of output, or `None` once every stream is read to its end.
    async fn next(&mut self, entry: &Entry) -> Result<Option<(Output, Vec<u8>)>, RpcError> {
        match &entry.io {
            Io::Pty { log, .. } => {
                let mut grew = log.grew.subscribe();
                loop {
                    grew.borrow_and_update();
                    let (data, next, finished) =
                        log.read(self.out).map_err(|lost| fell_behind("pty", lost))?;
                    self.out = next;
                    if !data.is_empty() {
                        return Ok(Some((Output::Pty, data)));
                    }
                    if finished {
                        return Ok(None);
                    }
                    if grew.changed().await.is_err() {
                        return Ok(None);
                    }
                }
            }
            Io::Pipe { process, .. } => loop {
                for (id, which) in
                    [(StreamId::Stdout, Output::Stdout), (StreamId::Stderr, Output::Stderr)]
                {
                    if let Some(data) = self.read(process.as_ref(), id).await? {
                        return Ok(Some((which, data)));
                    }
                }
                if self.out_done && self.err_done {
                    return Ok(None);
                }
                let (out, err) = (self.out, self.err);
                tokio::select! {
                    r = process.readable(StreamId::Stdout, out), if !self.out_done => r?,
                    r = process.readable(StreamId::Stderr, err), if !self.err_done => r?,
                }
            },
        }
    }

    /// Reads one pipe stream at its offset: bytes, or `None` (nothing new, or finished).
    async fn read(
        &mut self,
        process: &dyn Process,
        id: StreamId,
    ) -> Result<Option<Vec<u8>>, RpcError> {
        let (offset, done) = match id {
            StreamId::Stdout => (self.out, self.out_done),
            StreamId::Stderr => (self.err, self.err_done),
        };
        if done {
            return Ok(None);
        }
        let r = process.read(id, offset, CHUNK)?;
        if r.lossy && r.start_offset > offset {
            // Fell behind the memory window: the gap comes from the spill, which holds the
            // whole stream while it exists.
            if let Some(spill) = &r.spill {
                let want = usize::try_from(r.start_offset - offset).unwrap_or(CHUNK).min(CHUNK);
                match self.files.read(&spill.path, offset, want).await {
                    Ok(chunk) if !chunk.data.is_empty() => {
                        self.advance(id, offset + chunk.data.len() as u64, false);
                        return Ok(Some(chunk.data));
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("reading a spill for a follower: {e}"),
                }
            }
            // Never a silent gap: the stream ends with an error the client sees.
            let name = if id == StreamId::Stdout { "stdout" } else { "stderr" };
            return Err(fell_behind(name, r.start_offset - offset));
        }
        let finished = r.sealed && r.data.is_empty();
        self.advance(id, r.next_offset, finished);
        Ok((!r.data.is_empty()).then_some(r.data))
    }

    fn advance(&mut self, id: StreamId, to: u64, done: bool) {
        match id {
            StreamId::Stdout => {
                self.out = to;
                self.out_done = done;
            }
            StreamId::Stderr => {
                self.err = to;
                self.err_done = done;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pty_log_keeps_its_newest_bytes_and_says_what_a_late_reader_lost() {
        let log = PtyLog::new();
        log.append(b"hello ");
        assert_eq!(log.read(0), Ok((b"hello ".to_vec(), 6, false)));
        log.append(&vec![b'x'; 2 * PTY_LOG_BYTES]);
        let start = log.start();
        assert!(start > 0 && log.end() - start >= PTY_LOG_BYTES as u64);
        assert_eq!(log.read(0), Err(start), "the bytes before the oldest kept are named lost");
        let (data, next, finished) = log.read(start).unwrap();
        assert_eq!((data.len(), next, finished), (CHUNK, start + CHUNK as u64, false));
        log.close();
        let end = log.end();
        assert_eq!(log.read(end), Ok((Vec::new(), end, true)));
    }
}
