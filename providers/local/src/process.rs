//! One spawned local process: stream pumps, exit watcher, kill escalation. Its tree is its
//! process group, the holders of its output pipes, and every process carrying its id
//! (detached ones included).
//!
//! A spawn runs in a new process group with its cwd resolved and checked here, and its environment
//! built as scrub, then overlay, then the spawn id. Streams are collected merged or separate. The
//! process settles as `AfterExit` says: at EOF of its streams (`WaitForEof`), or, for shell calls
//! (`StopLeftovers`), once the shell exited, the drain passed and every leftover was stopped: group
//! members, output-pipe holders (found by pipe inode in `/proc/*/fd`) and processes carrying the
//! id; a kill's stopped processes outside the group are leftovers too. After a kill, settlement is
//! bounded even when an escaped process holds a pipe, and waits for the kill to finish. `release`
//! keeps the spills, since results may have named them.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_output::{Collector, CollectorConfig, SpillRegistry, SpillRoot};
use conch_seams::{
    AfterExit, CollectedOutput, Error, ErrorCode, ExitStatus, Leftover, OutputSpec, Process,
    Result, SpawnSpec, SpillRef, StdinSpec, StreamId, StreamRead,
};
use conch_sync::LockExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::procfs::{self, Tag, Targets};
use crate::{NAME, reaper, signals};

/// How long a kill waits for the group to go by itself at the first signal before it scans
/// for what is left (the waits double from 1 ms up to this).
const QUICK_KILL_WAIT: Duration = Duration::from_millis(16);
/// After a kill proved the group gone, how long pipes may stay open before their holders
/// (escaped via setsid) are looked for and stopped.
const KILLED_DRAIN: Duration = Duration::from_millis(100);
/// After leftovers were stopped, how long the pumps may take to see EOF before the streams
/// are sealed anyway (a holder we cannot see, e.g. another user's process).
const SEAL_LIMIT: Duration = Duration::from_secs(1);

/// Shared state of one process.
#[derive(Debug)]
pub(crate) struct Inner {
    pid: u32,
    /// The child's start time, read while tokio had not reaped it yet: after the reap its
    /// pid (and so its group id) may be recycled.
    leader_start: Option<u64>,
    grace: Duration,
    /// The id in every descendant's environment: finds what left the group and the pipes.
    tag: Tag,
    stdout: Option<Arc<Collector>>,
    stderr: Option<Arc<Collector>>,
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    /// Set when the child exited (before streams drained).
    exited: watch::Sender<Option<ExitStatus>>,
    /// Set when the child exited and every collected stream reached EOF.
    settled: watch::Sender<Option<ExitStatus>>,
    kill_started: AtomicBool,
    /// Set once [`Inner::surely_quiet`] proved the tree gone: nothing is left that could
    /// start a new member, so the proof holds from then on.
    quiet: AtomicBool,
    /// Set when a started kill has finished and recorded what it stopped.
    kill_done: watch::Sender<bool>,
    group_gone: watch::Sender<bool>,
    /// Inodes of the collected output pipes, to find processes still holding them.
    pipe_inodes: Vec<u64>,
    leftovers: Mutex<Vec<Leftover>>,
    /// Pumps still reading (each decrements at EOF).
    open_pumps: watch::Sender<usize>,
    /// Bumped after every push into a collector and at sealing: wakes `readable` waiters.
    progress: watch::Sender<u64>,
}

impl Inner {
    /// Starts the TERM → grace → KILL escalation once.
    pub(crate) fn request_kill(self: &Arc<Self>) {
        if self.kill_started.swap(true, Ordering::AcqRel) {
            return;
        }
        // Signalled here, not in the task below: an owner's teardown requests a thousand
        // kills in one pass, and a signal sent from a task waits in the run queue behind
        // the exits of the jobs killed before it.
        procfs::signal_group(self.group(), nix::sys::signal::Signal::SIGTERM);
        let me = Arc::clone(self);
        // The span lasts until the tree is proven gone (or the kill gave up on survivors).
        let span = tracing::debug_span!("kill", pid = self.pid);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // Most kills end here: the group goes at the first signal, and with nothing
                // orphaned the whole tree is proven gone without a scan of every process.
                let mut pause = Duration::from_millis(1);
                while pause <= QUICK_KILL_WAIT {
                    tokio::time::sleep(pause).await;
                    if me.surely_quiet().await {
                        me.group_gone.send_replace(true);
                        me.kill_done.send_replace(true);
                        return;
                    }
                    pause *= 2;
                }
                // The child is its own group leader, so its pid is the pgid.
                let mut tree = me.tree(&[]);
                // Nobody needs the group's own members listed: the group is signalled at once.
                tree.unreported = true;
                tree.report_pipes = &me.pipe_inodes;
                let report = procfs::stop(&tree, nix::sys::signal::Signal::SIGTERM, me.grace).await;
                // What had left the group escaped the kill's own reach: report it, as the pipe
                // holders found after a kill are.
                me.record(report.stopped.into_iter().filter(|s| !s.grouped));
                if report.survivors.is_empty() {
                    me.group_gone.send_replace(true);
                } else {
                    tracing::warn!(
                        survivors = report.survivors.len(),
                        "a kill left processes alive"
                    );
                }
                me.kill_done.send_replace(true);
            },
            span,
        ));
    }

    /// The child's group: it is its own group leader, so its pid is the group id.
    fn group(&self) -> procfs::Group {
        procfs::Group {
            pgid: i32::try_from(self.pid).unwrap_or(i32::MAX),
            leader_start: self.leader_start,
        }
    }

    /// True when nothing of the tree can be left once the child is reaped and the pipes are
    /// closed: the group has no member at all, and no orphan exists that the rest could be
    /// under (see [`reaper::orphans_possible`]). False means "look", not "something is left".
    async fn surely_quiet(&self) -> bool {
        if self.quiet.load(Ordering::Acquire) {
            return true;
        }
        let pgid = nix::unistd::Pid::from_raw(self.group().pgid);
        let gone = nix::sys::signal::killpg(pgid, None) == Err(nix::errno::Errno::ESRCH);
        // The orphan look must begin after the group was seen gone: its members were
        // reaped by then, so whatever they left was already reparented here. A look begun
        // earlier (another kill's, shared through the cache) may predate a member's death
        // and miss the orphan it left.
        let checked = std::time::Instant::now();
        let quiet = gone && !reaper::orphans_possible_since(checked).await;
        if quiet {
            self.quiet.store(true, Ordering::Release);
        }
        quiet
    }

    /// The group, the processes carrying the tag, and holders of `pipes`.
    fn tree<'a>(&'a self, pipes: &'a [u64]) -> Targets<'a> {
        Targets {
            group: Some(self.group()),
            pipe_inodes: pipes,
            tagged: Some(&self.tag),
            within: Some(self.group().pgid),
            ..Targets::default()
        }
    }

    pub(crate) async fn wait_settled(&self) -> ExitStatus {
        wait_status(&self.settled).await
    }

    pub(crate) async fn wait_exited(&self) -> ExitStatus {
        wait_status(&self.exited).await
    }

    /// Stops what is left in the group, on the pipes or carrying the tag, and records it.
    async fn stop_leftovers(&self, pipes_open: bool) {
        let inodes: &[u64] = if pipes_open { &self.pipe_inodes } else { &[] };
        let targets = self.tree(inodes);
        let report = procfs::stop(&targets, nix::sys::signal::Signal::SIGTERM, self.grace).await;
        self.record(report.stopped.into_iter());
    }

    /// Adds stopped processes to the leftovers, each once (a kill and the leftover stop may
    /// both reach one).
    fn record(&self, stopped: impl Iterator<Item = procfs::Stopped>) {
        let mut left = self.leftovers.locked();
        for s in stopped {
            let pid = s.id.pid.unsigned_abs();
            match left.iter_mut().find(|l| l.pid == pid) {
                Some(l) => l.held_output |= s.held_output,
                None => left.push(Leftover { pid, name: s.name, held_output: s.held_output }),
            }
        }
    }

    /// The part of settlement after the direct child exited: streams reach EOF, or the
    /// processes keeping them open are stopped as `after_exit` and kills require.
    async fn settle_streams(&self, after_exit: AfterExit, pumps: Vec<JoinHandle<()>>) {
        match after_exit {
            AfterExit::StopLeftovers { drain } => {
                let deadline = tokio::time::Instant::now() + drain;
                // Leftovers get `drain` to finish; a kill request ends the drain early.
                let mut gone = self.group_gone.subscribe();
                let finished = async {
                    let _ = drain_pumps(&self.open_pumps, None).await;
                    // The pipes are closed; wait for the rest of the tree, if any.
                    if !self.surely_quiet().await {
                        procfs::wait_quiet(&self.tree(&[]), drain).await;
                    }
                };
                let killed = async {
                    let _ = gone.wait_for(|g| *g).await;
                };
                let was_killed = tokio::select! {
                    () = finished => false,
                    () = killed => true,
                    () = tokio::time::sleep_until(deadline) => false,
                };
                if was_killed {
                    // The group is proven gone; its pipe ends close with it, and the pumps
                    // see EOF a moment later. Only a pipe still open after that has a holder
                    // outside the group worth the scan of every process's fds.
                    drain_pumps(&self.open_pumps, Some(KILLED_DRAIN)).await;
                }
                // Closed pipes have no holders: only an open one is worth an fd scan.
                let pipes_open = *self.open_pumps.borrow() > 0;
                if pipes_open || !self.surely_quiet().await {
                    self.stop_leftovers(pipes_open).await;
                }
            }
            _ => {
                let mut gone = self.group_gone.subscribe();
                tokio::select! {
                    _ = drain_pumps(&self.open_pumps, None) => return,
                    _ = gone.wait_for(|g| *g) => {}
                }
                // Killed and the group is gone, but something outside it holds a pipe.
                if drain_pumps(&self.open_pumps, Some(KILLED_DRAIN)).await {
                    return;
                }
                self.stop_leftovers(true).await;
            }
        }
        if !drain_pumps(&self.open_pumps, Some(SEAL_LIMIT)).await {
            for p in &pumps {
                p.abort();
            }
        }
        for p in pumps {
            let _ = p.await;
        }
    }

    /// Seals every collected stream once the process settled: the spills are final from
    /// here on, which is when the spill registry may evict them.
    fn seal_streams(&self) {
        for sink in [&self.stdout, &self.stderr].into_iter().flatten() {
            sink.seal();
        }
        self.progress.send_modify(|n| *n += 1);
    }

    pub(crate) async fn wait_group_gone(&self) {
        let mut rx = self.group_gone.subscribe();
        loop {
            if *rx.borrow_and_update() || !procfs::group_alive(self.group()) {
                return;
            }
            // Either the kill task reports, or we re-probe: a group can also empty by itself.
            let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        }
    }
}

/// A local process handle.
#[derive(Debug)]
pub struct LocalProcess {
    pub(crate) inner: Arc<Inner>,
}

/// Where a process's spills go and who accounts for them.
#[derive(Debug)]
pub(crate) struct SpillPlace<'a> {
    /// The provider's private spill root, made by the first spill.
    pub(crate) root: &'a Arc<SpillRoot>,
    /// The provider's registry, which enforces the total and age limits.
    pub(crate) registry: &'a Arc<SpillRegistry>,
}

/// `text` as a sealed spill under `spills` (see `Subprocess::keep_spill`); `None` when it is
/// over the default spill cap or the spill could not be written.
pub(crate) fn keep_spill(text: &[u8], spills: &SpillPlace<'_>) -> Option<SpillRef> {
    let mut cfg = CollectorConfig::new(0, CollectorConfig::default().spill_cap);
    cfg.root = Some(Arc::clone(spills.root));
    cfg.registry = Some(Arc::clone(spills.registry));
    let c = Collector::new(cfg);
    c.push(text);
    c.seal();
    c.summary().spill
}

fn collector(
    spec: &OutputSpec,
    replay_bytes: usize,
    spills: &SpillPlace<'_>,
) -> Option<Arc<Collector>> {
    match spec {
        OutputSpec::Collect { max_bytes, spill_cap } => {
            Some(Arc::new(Collector::new(CollectorConfig {
                max_bytes: *max_bytes,
                replay_bytes,
                spill_cap: *spill_cap,
                spill_dir: None,
                root: Some(Arc::clone(spills.root)),
                registry: Some(Arc::clone(spills.registry)),
            })))
        }
        _ => None,
    }
}

fn spawn_failed(message: String) -> Error {
    Error::new(ErrorCode::SpawnFailed, message).with_provider(NAME).with_operation("spawn")
}

fn pump(
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    sink: Arc<Collector>,
    open: watch::Sender<usize>,
    progress: watch::Sender<u64>,
) -> JoinHandle<()> {
    open.send_modify(|n| *n += 1);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    sink.push(&buf[..n]);
                    // Only a waiting reader is woken; with none this is a counter bump.
                    progress.send_modify(|v| *v += 1);
                }
            }
        }
        // Sealing waits for settlement (`Inner::seal_streams`): only then is the spill final.
        open.send_modify(|n| *n -= 1);
    })
}

/// Waits until `tx` holds a status.
async fn wait_status(tx: &watch::Sender<Option<ExitStatus>>) -> ExitStatus {
    let mut rx = tx.subscribe();
    match rx.wait_for(Option::is_some).await {
        Ok(s) => s.clone().unwrap_or_default(),
        Err(_) => ExitStatus::default(),
    }
}

/// Waits until no pump is still reading (at most `limit`); true when all reached EOF.
async fn drain_pumps(open: &watch::Sender<usize>, limit: Option<Duration>) -> bool {
    let mut rx = open.subscribe();
    let all = async {
        let _ = rx.wait_for(|n| *n == 0).await;
    };
    match limit {
        None => {
            all.await;
            true
        }
        Some(l) => tokio::time::timeout(l, all).await.is_ok(),
    }
}

pub(crate) fn to_exit(status: std::process::ExitStatus) -> ExitStatus {
    ExitStatus { code: status.code(), signal: status.signal().map(signals::name) }
}

/// The directory a child starts in: `cwd` resolved against this process's directory, which
/// must exist (checked here, in the world the child runs in).
pub(crate) fn resolve_cwd(cwd: Option<&Path>, op: &'static str) -> Result<std::path::PathBuf> {
    let failed = |message: String| {
        Error::new(ErrorCode::SpawnFailed, message).with_provider(NAME).with_operation(op)
    };
    let dir = match cwd {
        Some(c) if c.is_absolute() => c.to_path_buf(),
        _ => {
            let here = std::env::current_dir()
                .map_err(|e| failed(format!("cannot read the current directory: {e}")))?;
            cwd.map_or(here.clone(), |c| here.join(c))
        }
    };
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(failed(format!("working directory `{}` is not a directory", dir.display()))
            .with_reason(conch_seams::ErrorReason::WorkdirNotDirectory)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(failed(format!("working directory `{}` does not exist", dir.display()))
                .with_reason(conch_seams::ErrorReason::MissingWorkdir))
        }
        // A path through a file (`/etc/passwd/x`), or one this user may not look into.
        Err(e) => Err(failed(format!("working directory `{}` is unusable: {e}", dir.display()))
            .with_reason(conch_seams::ErrorReason::MissingWorkdir)),
    }
}

/// Spawns `spec`.
pub(crate) fn spawn(spec: SpawnSpec, spills: &SpillPlace<'_>, id: String) -> Result<LocalProcess> {
    let Some(program) = spec.argv.first() else {
        return Err(Error::invalid("argv is empty").with_provider(NAME).with_operation("spawn"));
    };
    let cwd = resolve_cwd(spec.cwd.as_deref(), "spawn")?;
    if matches!(spec.stdout, OutputSpec::MergeIntoStdout) {
        return Err(Error::invalid("stdout cannot merge into itself").with_provider(NAME));
    }
    let mut env = conch_env::child_env(&spec.env);
    // After the overlay: the provider's own mark, which no caller's config may replace.
    env.insert(conch_env::CALL_ID_VAR.into(), conch_env::call_id_value(&id));
    // Resolved here on the child's own PATH, as execvp would: std spawns an absolute path
    // with posix_spawn (vfork-fast) but falls back to fork + exec for a bare name once the
    // environment sets PATH. argv[0] stays what the caller wrote (`$0` of `bash -c`).
    let resolved = if program.contains('/') {
        None
    } else {
        crate::resolve_on_path(program, env.get("PATH").map(String::as_str))
    };
    let mut cmd = match &resolved {
        Some(path) => {
            let mut c = tokio::process::Command::new(path);
            c.arg0(program);
            c
        }
        None => tokio::process::Command::new(program),
    };
    cmd.args(&spec.argv[1..])
        .current_dir(&cwd)
        .env_clear()
        .envs(&env)
        .process_group(0)
        .kill_on_drop(false);

    let stdout_sink = collector(&spec.stdout, spec.replay_bytes, spills);
    let stderr_sink = collector(&spec.stderr, spec.replay_bytes, spills);
    let merged = matches!(spec.stderr, OutputSpec::MergeIntoStdout) && stdout_sink.is_some();
    // A merged stream uses one OS pipe for both fds, so interleaving is the child's order.
    let mut merged_reader: Option<std::io::PipeReader> = None;
    if merged {
        let (r, w) = std::io::pipe().map_err(|e| Error::io("create output pipe", e))?;
        let w2 = w.try_clone().map_err(|e| Error::io("clone output pipe", e))?;
        cmd.stdout(Stdio::from(OwnedFd::from(w))).stderr(Stdio::from(OwnedFd::from(w2)));
        merged_reader = Some(r);
    } else {
        cmd.stdout(if stdout_sink.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stderr(if stderr_sink.is_some() { Stdio::piped() } else { Stdio::null() });
    }
    cmd.stdin(match spec.stdin {
        StdinSpec::Null => Stdio::null(),
        _ => Stdio::piped(),
    });

    let (spawned, owned) = reaper::owning(|| cmd.spawn(), tokio::process::Child::id);
    // Dropping the command closes the parent's copies of the merged pipe's write end.
    drop(cmd);
    let mut child = spawned.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            spawn_failed(format!("command not found: `{program}`: {e}"))
                .with_reason(conch_seams::ErrorReason::MissingProgram)
        } else {
            spawn_failed(format!("cannot execute: `{program}`: {e}"))
        }
    })?;
    let pid = child.id().unwrap_or(0);

    let mut pumps = Vec::new();
    let open_pumps = watch::Sender::new(0usize);
    let progress = watch::Sender::new(0u64);
    let mut pipe_inodes = Vec::new();
    if let Some(r) = merged_reader {
        pipe_inodes.extend(procfs::pipe_inode(&r));
        let fd = OwnedFd::from(r);
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .map_err(|e| Error::io("register output pipe", e))?;
        if let Some(sink) = &stdout_sink {
            pumps.push(pump(rx, Arc::clone(sink), open_pumps.clone(), progress.clone()));
        }
    } else {
        if let (Some(out), Some(sink)) = (child.stdout.take(), &stdout_sink) {
            pipe_inodes.extend(procfs::pipe_inode(&out));
            pumps.push(pump(out, Arc::clone(sink), open_pumps.clone(), progress.clone()));
        }
        if let (Some(err), Some(sink)) = (child.stderr.take(), &stderr_sink) {
            pipe_inodes.extend(procfs::pipe_inode(&err));
            pumps.push(pump(err, Arc::clone(sink), open_pumps.clone(), progress.clone()));
        }
    }
    let mut stdin = child.stdin.take();
    if let StdinSpec::Bytes { data: bytes } = spec.stdin.clone()
        && let Some(mut w) = stdin.take()
    {
        tokio::spawn(async move {
            // A child that exits without reading gives EPIPE; that is its choice.
            let _ = w.write_all(&bytes).await;
            let _ = w.shutdown().await;
        });
    }

    let leader_start = owned.as_ref().and_then(|o| o.start);
    let inner = Arc::new(Inner {
        pid,
        leader_start,
        grace: spec.grace,
        // Every descendant started after the child did.
        tag: Tag { id, since: leader_start.unwrap_or(0) },
        stdout: stdout_sink,
        stderr: stderr_sink,
        stdin: tokio::sync::Mutex::new(stdin),
        exited: watch::Sender::new(None),
        settled: watch::Sender::new(None),
        kill_started: AtomicBool::new(false),
        quiet: AtomicBool::new(false),
        kill_done: watch::Sender::new(false),
        group_gone: watch::Sender::new(false),
        pipe_inodes,
        leftovers: Mutex::new(Vec::new()),
        open_pumps,
        progress,
    });

    let me = Arc::clone(&inner);
    let cancel = spec.cancel;
    let after_exit = spec.after_exit;
    tokio::spawn(async move {
        let status = tokio::select! {
            s = child.wait() => s,
            () = cancel.cancelled() => {
                me.request_kill();
                child.wait().await
            }
        };
        // Reaped: the pid is no longer tokio's to wait for.
        drop(owned);
        let status = status.map(to_exit).unwrap_or_default();
        me.exited.send_replace(Some(status.clone()));
        // Cancellation after exit (while streams still drain) must still reach the group;
        // watched here rather than by a task of its own, which every exit would wake.
        let settle = me.settle_streams(after_exit, pumps);
        tokio::pin!(settle);
        let mut cancel_seen = false;
        loop {
            tokio::select! {
                () = &mut settle => break,
                () = cancel.cancelled(), if !cancel_seen => {
                    cancel_seen = true;
                    me.request_kill();
                }
            }
        }
        // A kill's leftovers (what had left the group) are final at settlement too.
        if me.kill_started.load(Ordering::Acquire) {
            let _ = me.kill_done.subscribe().wait_for(|d| *d).await;
        }
        me.seal_streams();
        me.settled.send_replace(Some(status));
    });
    Ok(LocalProcess { inner })
}

impl LocalProcess {
    fn sink(&self, stream: StreamId) -> Option<&Arc<Collector>> {
        match stream {
            StreamId::Stdout => self.inner.stdout.as_ref(),
            StreamId::Stderr => self.inner.stderr.as_ref(),
        }
    }
}

#[async_trait]
impl Process for LocalProcess {
    fn pid(&self) -> Option<u32> {
        Some(self.inner.pid)
    }

    async fn wait(&self) -> Result<ExitStatus> {
        Ok(self.inner.wait_settled().await)
    }

    async fn wait_exit(&self) -> Result<ExitStatus> {
        Ok(self.inner.wait_exited().await)
    }

    fn leftovers(&self) -> Vec<Leftover> {
        self.inner.leftovers.locked().clone()
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.inner.settled.borrow().clone()
    }

    fn read(&self, stream: StreamId, offset: u64, max_bytes: usize) -> Result<StreamRead> {
        self.sink(stream).map(|s| s.read(offset, max_bytes)).ok_or_else(|| {
            Error::invalid(format!("{stream:?} is not collected")).with_provider(NAME)
        })
    }

    async fn readable(&self, stream: StreamId, offset: u64) -> Result<()> {
        let Some(sink) = self.sink(stream) else {
            return Err(Error::invalid(format!("{stream:?} is not collected")).with_provider(NAME));
        };
        // Subscribed before the check, so a push between the check and the wait still wakes.
        let mut rx = self.inner.progress.subscribe();
        loop {
            if sink.total_bytes() > offset || sink.is_sealed() {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    fn collected(&self, stream: StreamId) -> Option<CollectedOutput> {
        self.sink(stream).map(|s| s.summary())
    }

    async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        let mut guard = self.inner.stdin.lock().await;
        let Some(w) = guard.as_mut() else {
            return Err(Error::invalid("stdin is not an open pipe").with_provider(NAME));
        };
        w.write_all(data).await.map_err(|e| Error::io("write stdin", e).with_provider(NAME))?;
        w.flush().await.map_err(|e| Error::io("flush stdin", e).with_provider(NAME))
    }

    async fn close_stdin(&self) -> Result<()> {
        // Waits for a write in progress, so the close lands after every byte written.
        self.inner.stdin.lock().await.take();
        Ok(())
    }

    async fn kill(&self) -> Result<()> {
        self.inner.request_kill();
        Ok(())
    }

    async fn wait_group_gone(&self) -> Result<()> {
        self.inner.wait_group_gone().await;
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        // Nothing to free early: the spills outlive the handle on purpose (a result may have
        // named them), bounded by the spill limits, and the rest goes with the last handle.
        Ok(())
    }
}
