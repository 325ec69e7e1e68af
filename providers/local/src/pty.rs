//! One process on a local PTY: reads, writes and reaping on the async runtime, readiness
//! observations, foreground signals, teardown and shutdown.
//!
//! A terminal holds no thread: portable-pty opens the PTY, `posix_spawn` starts the leader
//! (no fork: see [`crate::ptyfd`]), and from then on the master is a non-blocking descriptor
//! and the leader a pidfd on tokio's reactor. `read_chunk` reads the master directly (the
//! caller's pace is the back-pressure: a PTY nobody reads fills, and its program blocks),
//! `write` waits for room on the reactor, and a task awaits the pidfd and reaps the leader by
//! pid. Where `pidfd_open` is missing (Linux before 5.3), a thread waits instead, as a
//! fallback. Every process operation (foreground lookup, probe, signals, teardown) runs here,
//! in the world the terminal lives in, through [`crate::procfs`].
//!
//! `spawn_terminal` validates the cwd first and drops the slave in the parent. The foreground is
//! read via the master; the probe runs on request, inline. `terminate`
//! stops descendants and processes carrying the terminal's id children first while the frozen
//! leader is spared, then the leader (HUP, grace, KILL), then whatever still carries the id; it
//! does so also after the leader exited. The shutdown sweep stops a terminal's session and id.

use std::fmt;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::{
    Error, ErrorCode, ExitStatus, ForegroundTarget, Probe, Result, SignalDelivery, StdinWait,
    TeardownReport, TerminalObservation, TerminalProcess, TerminalSize, TerminalSpawnSpec,
};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use portable_pty::{PtySize, native_pty_system};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::probe::{self, StdinMatch};
use crate::procfs::{self, Tag, Targets};
use crate::{NAME, reaper, resolve_on_path, signals};

/// Operation name in spawn errors.
const OP: &str = "spawn_terminal";
/// The most one read from the master takes.
const READ_BUF: usize = 64 * 1024;
/// How long a hung-up terminal gets to exit by itself before it is killed (shutdown).
const HANGUP_GRACE: Duration = Duration::from_secs(1);
/// How long a killed leader may take to be reaped before teardown reports it.
const REAP_LIMIT: Duration = Duration::from_secs(30);

/// Shared state of one terminal. The reaping task holds a strong reference until the
/// leader is reaped, so a live terminal stays reachable for `shutdown` even after every
/// caller handle is dropped.
pub(crate) struct TermInner {
    pid: u32,
    /// The leader's start time, so a recycled pid is never taken for it (read while the
    /// leader is unreaped, so it is the leader's own).
    start: Option<u64>,
    /// The master, non-blocking: every read, write and ioctl goes through it (portable-pty's
    /// own descriptor is closed after the spawn: one fd fewer per terminal, and every spawn
    /// copies and closes each fd this process holds).
    io: AsyncFd<OwnedFd>,
    /// One reader at a time, so chunks come out in the order they were read.
    reading_slot: tokio::sync::Mutex<()>,
    /// One writer at a time, so two writes never interleave; held by a write until its last
    /// byte is in (by the task it hands an unfinished rest to, if it was cancelled).
    writing_slot: Arc<tokio::sync::Mutex<()>>,
    /// The master reported EOF: every later read is EOF too.
    eof: AtomicBool,
    status: watch::Sender<Option<ExitStatus>>,
    /// The slave's path, which the stdin probe compares fds against.
    tty: PathBuf,
    /// A read syscall is under way: bytes may have left the kernel and not be counted yet.
    in_read: AtomicBool,
    /// Bytes handed out by `read_chunk` so far.
    delivered: AtomicU64,
    /// The id in every descendant's environment: finds what detached (setsid, nohup).
    tag: Tag,
}

impl fmt::Debug for TermInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TermInner")
            .field("pid", &self.pid)
            .field("tty", &self.tty)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl TermInner {
    /// The session id, which is also the leader's pgid (the child ran `setsid`).
    fn sid(&self) -> i32 {
        i32::try_from(self.pid).unwrap_or(i32::MAX)
    }

    fn is_leader(&self, id: procfs::ProcId) -> bool {
        id.pid == self.sid() && self.start.is_none_or(|s| s == id.start)
    }

    fn foreground_pgid(&self) -> Option<i32> {
        crate::ptyfd::foreground(&self.io)
    }

    /// True when `pg` is the shell's own group rather than a command's: the session leader's
    /// group, or the group of a shell that a sandbox runner starts below the leader. In a pid
    /// namespace (bubblewrap) the shell cannot see the session's group and makes one of its
    /// own; its leader then descends from the session leader only through processes of the
    /// leader's group (the runner). A command always has a shell as its parent: the leader
    /// itself, or a shell in a group of its own, so neither shape passes for the shell.
    /// Reads at most a few `/proc/<pid>/stat` files, and none when the leader's group owns
    /// the foreground.
    fn shell_group(&self, pg: i32) -> bool {
        let sid = self.sid();
        if pg == sid {
            return true;
        }
        let Some(leader) = procfs::stat(pg) else { return false };
        if leader.pgrp != pg || leader.session != sid || leader.ppid == sid {
            return false;
        }
        let mut pid = leader.ppid;
        // A runner is a short chain (bwrap: its namespace init); a bound keeps a pathological
        // tree from costing more than a few reads.
        for _ in 0..4 {
            let Some(s) = procfs::stat(pid) else { return false };
            if s.pgrp != sid || s.session != sid {
                return false;
            }
            if s.ppid == sid {
                return true;
            }
            pid = s.ppid;
        }
        false
    }

    /// Output the terminal's programs wrote that nobody has read yet, including bytes still
    /// in the master's flip buffer (see `ttyq`).
    fn output_in_flight(&self) -> bool {
        crate::ptyfd::readable(&self.io)
    }

    async fn wait_exit(&self, limit: Duration) -> Option<ExitStatus> {
        let mut rx = self.status.subscribe();
        let waited = tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(s)) => s.clone(),
            _ => None,
        }
    }

    async fn wait_status(&self) -> ExitStatus {
        let mut rx = self.status.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(s) => s.clone().unwrap_or_default(),
            Err(_) => ExitStatus::default(),
        }
    }

    /// Processes carrying the terminal's id, except `spare`.
    fn tagged(&self, spare: Option<procfs::ProcId>) -> Targets<'_> {
        Targets { tagged: Some(&self.tag), spare, within: Some(self.sid()), ..Targets::default() }
    }

    /// Shutdown: hangs up every member of the terminal's session (its jobs in other groups
    /// too) and every process carrying its id (those that detached), gives them
    /// [`HANGUP_GRACE`], KILLs what is left until none is left, then waits for the leader to
    /// be reaped.
    pub(crate) async fn shutdown(&self) {
        // A reaped leader's pid can be recycled; once it names another process (another
        // start time), the session id may be a stranger's: sweep only by id.
        let recycled = procfs::ident(self.sid()).is_some_and(|id| !self.is_leader(id));
        let mut targets = self.tagged(None);
        targets.session =
            (!recycled).then_some(procfs::Group { pgid: self.sid(), leader_start: self.start });
        // Stopped members cannot act on HUP until continued; `stop` sends CONT too.
        procfs::stop(&targets, Signal::SIGHUP, HANGUP_GRACE).await;
        let _ = self.wait_exit(REAP_LIMIT).await;
    }

    /// Stops what still carries the terminal's id once the leader is gone, and reports it
    /// with the leader's exit.
    async fn sweep_after(&self, status: ExitStatus, grace: Duration) -> TeardownReport {
        let report = procfs::stop(&self.tagged(None), Signal::SIGTERM, grace).await;
        TeardownReport { leader: Some(status), survivors: survivor_pids(&report) }
    }

    /// Teardown for [`TerminalProcess::terminate`]: descendants and everything carrying the
    /// terminal's id first (children first) while the leader is alive to anchor the tree,
    /// then the leader (HUP: interactive shells ignore TERM), then whatever still carries
    /// the id.
    async fn terminate(&self, grace: Duration) -> TeardownReport {
        let reaped = self.status.borrow().clone();
        if let Some(status) = reaped {
            // The leader is reaped, but what it left behind (detached or reparented) still
            // carries its id.
            return self.sweep_after(status, grace).await;
        }
        if let Some(leader) = procfs::ident(self.sid()).filter(|id| self.is_leader(*id)) {
            // Freeze the leader first: a shell running a loop would fork a new child for
            // every one stopped, and the sweep would never end. It carries the id too, so it
            // is spared until its turn.
            let pid = Pid::from_raw(leader.pid);
            let _ = kill(pid, Signal::SIGSTOP);
            let mut tree = self.tagged(Some(leader));
            tree.descendants_of = Some(leader);
            let report = procfs::stop(&tree, Signal::SIGTERM, grace).await;
            if !report.survivors.is_empty() {
                // Leave the shell as it was, so a retry (or the user) finds it running.
                let _ = kill(pid, Signal::SIGCONT);
                return TeardownReport { leader: None, survivors: survivor_pids(&report) };
            }
        }
        // Only signal the leader's group by id while the leader is unreaped: its pid (and so
        // the group id) cannot be recycled before the reaping task collects it.
        if self.status.borrow().is_none() {
            let leader = procfs::Group { pgid: self.sid(), leader_start: self.start };
            let group = Targets {
                group: Some(leader),
                unreported: true,
                within: Some(self.sid()),
                ..Targets::default()
            };
            procfs::stop(&group, Signal::SIGHUP, grace).await;
        }
        match self.wait_exit(REAP_LIMIT).await {
            // Anything the leader started on its way out (a HUP handler) goes too.
            Some(status) => self.sweep_after(status, grace).await,
            None => TeardownReport { leader: None, survivors: vec![self.pid] },
        }
    }

    fn observe(&self, probe_stdin: Probe) -> TerminalObservation {
        // Read before the sample: output counted as delivered here was written before it.
        let delivered_bytes = self.delivered.load(Ordering::Acquire);
        let output_pending = self.in_read.load(Ordering::Acquire);
        let foreground = self.foreground_pgid();
        let (stdin, cpu) = match (probe_stdin, foreground) {
            (Probe::Foreground, _) => (StdinWait::NotProbed, None),
            // No foreground group: nothing can be waiting on the terminal.
            (Probe::Stdin, None) => (StdinWait::NotWaiting, None),
            (Probe::Stdin, Some(pg)) => {
                let tty = self.tty.as_path();
                let s = probe::sample_foreground(self.sid(), pg, StdinMatch::Tty(tty));
                let stdin = match s.stdin {
                    // Typed input is still queued: the waiter is about to wake with it.
                    StdinWait::Waiting
                        if crate::ttyq::pending_input(tty).is_some_and(|n| n > 0) =>
                    {
                        StdinWait::NotWaiting
                    }
                    seen => seen,
                };
                (stdin, s.cpu)
            }
        };
        TerminalObservation {
            foreground,
            leader_owns_foreground: foreground.is_some_and(|pg| self.shell_group(pg)),
            stdin,
            delivered_bytes,
            // Anything being read from the master while the sample ran is pending too, and
            // so is what the programs wrote that nobody has read yet (before a waiter
            // blocked, or while the reader fell behind).
            output_pending: output_pending
                || self.in_read.load(Ordering::Acquire)
                || (probe_stdin == Probe::Stdin && self.output_in_flight()),
            cpu,
        }
    }

    fn signal_foreground(
        &self,
        signal: conch_seams::Signal,
        target: ForegroundTarget,
    ) -> Result<Option<SignalDelivery>> {
        let op = |e: Error| e.with_provider(NAME).with_operation("signal_foreground");
        let Some(sig) = signals::to_nix(signal) else {
            return Err(op(Error::new(
                ErrorCode::Unsupported,
                format!("{signal} cannot be delivered by this provider"),
            )));
        };
        // The foreground group of our own pty is in our session by definition, so no other
        // process group can be reached through this.
        let Some(pgid) = self.foreground_pgid() else {
            return Err(op(Error::new(
                ErrorCode::NotFound,
                "cannot find the terminal's foreground process group",
            )));
        };
        let leader = self.shell_group(pgid);
        if leader && target == ForegroundTarget::NotLeader {
            return Ok(None);
        }
        killpg(Pid::from_raw(pgid), sig).map_err(|e| {
            let code = match e {
                Errno::ESRCH => ErrorCode::NotFound,
                Errno::EPERM => ErrorCode::PermissionDenied,
                _ => ErrorCode::Io,
            };
            op(Error::new(code, format!("signal process group {pgid}: {e}")))
        })?;
        Ok(Some(SignalDelivery { pgid, leader }))
    }
}

fn survivor_pids(report: &procfs::StopReport) -> Vec<u32> {
    report.survivors.iter().map(|id| id.pid.unsigned_abs()).collect()
}

/// A process on a local PTY.
#[derive(Debug)]
pub struct LocalTerminal {
    pub(crate) inner: Arc<TermInner>,
}

fn spawn_failed(message: String) -> Error {
    Error::new(ErrorCode::SpawnFailed, message).with_provider(NAME).with_operation(OP)
}

fn pty_error(what: &str, e: impl fmt::Display) -> Error {
    Error::new(ErrorCode::Io, format!("{what}: {e:#}")).with_provider(NAME)
}

/// Resolves argv[0] as execvp would in the child, whose cwd is `cwd`: a path with a slash, and
/// a relative `PATH` entry, are taken against `cwd` (the exec happens after the child's
/// `chdir`), so a miss is a `SpawnFailed` naming the program rather than an opaque errno.
fn resolve_program(program: &str, cwd: &Path, path_var: Option<&str>) -> Result<PathBuf> {
    let found = if program.contains('/') {
        let full = cwd.join(program);
        full.to_str().and_then(|p| resolve_on_path(p, None))
    } else {
        // Empty entries are skipped, as `resolve_on_path` skips them.
        path_var
            .unwrap_or_default()
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| cwd.join(d).join(program))
            .find_map(|p| p.to_str().and_then(|p| resolve_on_path(p, None)))
    };
    found.ok_or_else(|| {
        spawn_failed(format!("command not found: `{program}`"))
            .with_reason(conch_seams::ErrorReason::MissingProgram)
    })
}

/// Starts `path` as [`crate::ptyfd::spawn_session`] does; an executable without a `#!` line
/// (`ENOEXEC`) is run by `/bin/sh`, as `execvp` runs it.
fn spawn_leader(
    path: &Path,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
    cwd: &Path,
    tty: &Path,
) -> std::io::Result<u32> {
    match crate::ptyfd::spawn_session(path, argv, env, cwd, tty) {
        Err(e) if e.raw_os_error() == Some(Errno::ENOEXEC as i32) => {
            let mut sh = vec!["/bin/sh".to_string(), path.to_string_lossy().into_owned()];
            sh.extend(argv.iter().skip(1).cloned());
            crate::ptyfd::spawn_session(Path::new("/bin/sh"), &sh, env, cwd, tty)
        }
        other => other,
    }
}

/// Spawns `spec` on a new PTY.
pub(crate) fn spawn(spec: TerminalSpawnSpec, id: String) -> Result<LocalTerminal> {
    let Some(program) = spec.argv.first() else {
        return Err(Error::invalid("argv is empty").with_provider(NAME).with_operation(OP));
    };
    // A cwd that is not a directory is refused here, naming it (not as an exec errno).
    let cwd = crate::process::resolve_cwd(spec.cwd.as_deref(), OP)?;
    let mut env = conch_env::child_env(&spec.env);
    // After the overlay: the provider's own mark, which no caller's config may replace.
    env.insert(conch_env::CALL_ID_VAR.into(), conch_env::call_id_value(&id));
    let path = resolve_program(program, &cwd, env.get("PATH").map(String::as_str))?;

    let size =
        PtySize { rows: spec.size.rows, cols: spec.size.cols, pixel_width: 0, pixel_height: 0 };
    // No fork may see the new descriptors before they are close-on-exec.
    let pair = reaper::without_spawns(|| native_pty_system().openpty(size))
        .map_err(|e| spawn_failed(format!("cannot open a pty: {e:#}")))?;
    // Everything fallible on the master happens before the child exists.
    let io = pair
        .master
        .as_raw_fd()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        .and_then(crate::ptyfd::master)
        .map_err(|e| spawn_failed(format!("cannot put the pty on the async runtime: {e}")))?;
    let tty = pair
        .master
        .tty_name()
        .ok_or_else(|| spawn_failed("the pty has no slave path".to_string()))?;

    let (spawned, owned) =
        reaper::owning(|| spawn_leader(&path, &spec.argv, &env, &cwd, &tty), |pid| Some(*pid));
    // The parent's slave fd would keep the master from ever seeing EOF; the master lives on
    // as `io`.
    drop(pair.slave);
    drop(pair.master);
    let pid = spawned.map_err(|e| spawn_failed(format!("cannot execute `{program}`: {e}")))?;
    let start = owned.as_ref().and_then(|o| o.start);
    let inner = Arc::new(TermInner {
        pid,
        start,
        io,
        reading_slot: tokio::sync::Mutex::new(()),
        writing_slot: Arc::new(tokio::sync::Mutex::new(())),
        eof: AtomicBool::new(false),
        status: watch::Sender::new(None),
        tty,
        in_read: AtomicBool::new(false),
        delivered: AtomicU64::new(0),
        // Every descendant started after the leader did.
        tag: Tag { id, since: start.unwrap_or(0) },
    });

    let me = Arc::clone(&inner);
    // The owned registration goes with whoever waits for the leader, and ends after.
    if let Ok(pidfd) = crate::ptyfd::pidfd(pid) {
        tokio::spawn(async move {
            let status = crate::ptyfd::reap(pidfd, pid).await;
            drop(owned);
            me.status.send_replace(Some(status));
        });
        return Ok(LocalTerminal { inner });
    }
    // No pidfd (Linux before 5.3): a thread waits.
    let started = std::thread::Builder::new().name("conch-pty-wait".into()).spawn(move || {
        let status = crate::ptyfd::wait_blocking(pid);
        drop(owned);
        me.status.send_replace(Some(status));
    });
    if let Err(e) = started {
        // The closure (and with it the registration) is gone: kill and reap the child here
        // rather than leave a zombie.
        if let Ok(p) = i32::try_from(pid) {
            let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
        }
        inner.status.send_replace(Some(crate::ptyfd::wait_blocking(pid)));
        return Err(spawn_failed(format!("cannot start the pty reaper: {e}")));
    }
    Ok(LocalTerminal { inner })
}

/// A write in progress: dropped before it finished (its caller was cancelled), it hands the
/// rest of its bytes, and the writing slot, to a task that writes them.
struct Unfinished<'a> {
    inner: &'a Arc<TermInner>,
    data: &'a [u8],
    written: usize,
    slot: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        let Some(rest) = self.data.get(self.written..).filter(|r| !r.is_empty()) else { return };
        let (inner, rest) = (Arc::clone(self.inner), rest.to_vec());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _slot = slot;
                let mut written = 0;
                let _ = crate::ptyfd::write_all(&inner.io, &rest, &mut written).await;
            });
        }
    }
}

#[async_trait]
impl TerminalProcess for LocalTerminal {
    fn pid(&self) -> Option<u32> {
        Some(self.inner.pid)
    }

    async fn read_chunk(&self) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        let _one = inner.reading_slot.lock().await;
        if inner.eof.load(Ordering::Acquire) {
            return Ok(None);
        }
        // The in-read mark goes up before each read syscall and down after the bytes are
        // counted delivered, so a sample taken while bytes are between the kernel and the
        // counter says output is pending. (A read that starts and ends within one sample can
        // still be missed by it; the confirming sample sees the count grown.)
        let read = crate::ptyfd::read(
            &inner.io,
            READ_BUF,
            |on| inner.in_read.store(on, Ordering::Release),
            |n| {
                inner.delivered.fetch_add(n as u64, Ordering::AcqRel);
            },
        )
        .await;
        match read {
            Ok(crate::ptyfd::Read::Bytes(chunk)) => Ok(Some(chunk)),
            // A local PTY has no transport to lose: the only end is EOF.
            Ok(crate::ptyfd::Read::Eof) => {
                inner.eof.store(true, Ordering::Release);
                Ok(None)
            }
            Err(e) => Err(Error::io("read from the terminal", e).with_provider(NAME)),
        }
    }

    async fn write(&self, data: &[u8]) -> Result<()> {
        // Whole writes, in the order callers asked. A write begun is finished even if the
        // caller goes away (see `Unfinished`): a cancelled send must not leave half a line in
        // the shell's input for the next send to be joined to. It runs in the caller's task
        // (no task per write; only an abandoned rest gets one).
        let slot = Arc::clone(&self.inner.writing_slot).lock_owned().await;
        let mut w = Unfinished { inner: &self.inner, data, written: 0, slot: Some(slot) };
        let done = crate::ptyfd::write_all(&self.inner.io, data, &mut w.written).await;
        // Written, or failed: nothing is left to finish.
        w.slot = None;
        done.map_err(|e| Error::io("write to the terminal", e).with_provider(NAME))
    }

    async fn observe(&self, probe: Probe) -> Result<TerminalObservation> {
        // One ioctl on the master, and with the stdin probe a few small /proc reads for the
        // foreground group's members: tens of microseconds, cheaper inline than a hop to the
        // blocking pool and back, which a readiness wait would pay per sample. The hole: a
        // read of a task's `syscall` waits out an exec in progress, and the probe's look at
        // the reader's buffer (`mem`) can fault in a page that was swapped out; either holds
        // this worker for that long.
        Ok(self.inner.observe(probe))
    }

    async fn signal_foreground(
        &self,
        signal: conch_seams::Signal,
        target: ForegroundTarget,
    ) -> Result<Option<SignalDelivery>> {
        self.inner.signal_foreground(signal, target)
    }

    async fn resize(&self, size: TerminalSize) -> Result<()> {
        crate::ptyfd::resize(&self.inner.io, size.rows, size.cols)
            .map_err(|e| pty_error("resize the terminal", e))
    }

    async fn terminate(&self, grace: Duration) -> Result<TeardownReport> {
        let span = tracing::debug_span!("terminal_terminate", pid = self.inner.pid);
        Ok(tracing::Instrument::instrument(self.inner.terminate(grace), span).await)
    }

    async fn wait(&self) -> Result<ExitStatus> {
        Ok(self.inner.wait_status().await)
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.inner.status.borrow().clone()
    }
}
