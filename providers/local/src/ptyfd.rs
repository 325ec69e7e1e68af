//! A terminal's descriptors on the async runtime: the PTY master, non-blocking, and the
//! leader's pidfd. With them a terminal costs no thread: its reads, writes and reaping are
//! readiness waits on tokio's reactor, so 1,000 terminals cost what one does plus their fds.
//!
//! # Invariants
//! - One descriptor per master: portable-pty opens the pair, [`master`] duplicates the master
//!   (close-on-exec) and makes it non-blocking, and portable-pty's own is closed once the
//!   leader runs. Every read, write and ioctl (foreground group, resize) goes through it.
//!   (`O_NONBLOCK` belongs to the open file description, so a blocking reader or writer of
//!   portable-pty's on the same master would break; none is taken.)
//! - A master read that returns 0 or fails with anything but `EAGAIN`/`EINTR` is EOF: Linux
//!   says `EIO` once every slave fd is closed, and only after the queued output was read.
//! - The leader is reaped by pid (`waitpid(pid, WNOHANG)`) once its pidfd is readable, never
//!   by `-1`, so no other child is taken from its owner (see `reaper`).
//! - The leader is started by `posix_spawn` ([`spawn_session`]), which glibc runs as a
//!   `vfork`-style clone: the child shares this process's memory until its exec, so a start
//!   costs the same whatever this process holds. A `fork` copies the page tables, and
//!   portable-pty's child then closed every descriptor by listing them: with 1,000 terminals
//!   open the two made an open 6.6 times dearer than among the first 100 (26.5 ms against
//!   4.0 ms, `conch bench --suite scale`).
//!
//! Honest limits: without `pidfd_open` (Linux before 5.3) a thread per terminal waits for its
//! leader instead. Outside glibc there is no `closefrom` spawn action: the leader then starts
//! with only the descriptors not marked close-on-exec, and every descriptor this crate opens is.
//! The child's descriptor table is still a copy of this process's: a spawn pays for copying
//! and closing the descriptors open here, in proportion to their number (two per terminal).
//! A terminal belongs to the runtime that opened it: its descriptors are registered with that
//! runtime's reactor and its reaping task runs there, so once that runtime shuts down its reads
//! fail and `wait` no longer ends (the process-wide reaper still collects the leader's zombie).
//! The leader opens the slave by its path (`/dev/pts/N`): where a PTY has no such path (a
//! devpts mount the process cannot see), opening a terminal is a spawn error.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use conch_seams::ExitStatus;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A non-blocking duplicate of the master `fd`, registered with the current runtime's reactor
/// for reads only: a writer waits on a registration of its own, made only when the PTY is
/// full (see [`write_all`]).
///
/// # Errors
/// The dup, the flag change or the registration failed (no runtime, too many fds).
pub(crate) fn master(fd: RawFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the caller holds the master (the PTY pair) open for the duration of the call;
    // the borrow ends here, and the duplicate is close-on-exec from birth.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    let flags = OFlag::from_bits_truncate(fcntl(&owned, FcntlArg::F_GETFL)?);
    fcntl(&owned, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    register(owned, Interest::READABLE)
}

/// Registers `fd` with the current runtime's reactor; an error, not a panic, without one.
fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other("no async runtime to register the descriptor with"));
    }
    // SAFETY: an `OwnedFd` is open, owned by the `AsyncFd` from here on, and always returns
    // the same descriptor from `as_raw_fd`.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}

/// What one read of the master gave.
pub(crate) enum Read {
    Bytes(Vec<u8>),
    Eof,
}

/// Reads what the master holds, waiting for it on the reactor; `mark` runs right before each
/// read syscall and `done(n)` right after one that returned `n > 0` bytes, so a caller can count
/// bytes in flight between the kernel and its own counters.
///
/// # Errors
/// The reactor is gone (the runtime that opened the terminal shut down).
pub(crate) async fn read(
    io: &AsyncFd<OwnedFd>,
    max: usize,
    mark: impl Fn(bool),
    done: impl Fn(usize),
) -> io::Result<Read> {
    // Allocated once there is something to read: an idle terminal's pending read holds none.
    let mut buf = Vec::new();
    loop {
        let mut ready = io.readable().await?;
        if buf.is_empty() {
            buf = vec![0u8; max];
        }
        mark(true);
        let got =
            ready.try_io(|fd| nix::unistd::read(fd.get_ref(), &mut buf).map_err(io::Error::from));
        match got {
            Ok(Ok(n)) if n > 0 => {
                done(n);
                mark(false);
                buf.truncate(n);
                // One chunk per read: keep what it holds, not the whole buffer.
                buf.shrink_to_fit();
                return Ok(Read::Bytes(buf));
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => mark(false),
            // Readiness was stale: wait again.
            Err(_would_block) => mark(false),
            // 0 or EIO (every slave fd closed), or anything else the blocking reader also
            // took as the end.
            Ok(_) => {
                mark(false);
                return Ok(Read::Eof);
            }
        }
    }
}

/// Writes all of `data` to the master from `*written` on, counting what went in `written`.
/// When the PTY is full (a program that does not read), it waits for room on the reactor
/// through a duplicate of the master registered for writes until then (the wait holds no
/// thread).
///
/// The master itself is registered for reads only: with write interest, every read the
/// program makes of its input frees room, which the kernel reports as the master becoming
/// writable, and the reactor woke a worker thread for each (bash reads typed text a byte at a
/// time: 19 wake-ups for one short bracketed-paste line, measured with `perf sched`).
///
/// # Errors
/// The PTY refused the write (`EIO` once the terminal is gone), or the reactor is gone. Where
/// no descriptor is left for the duplicate, the wait is a retry every millisecond.
pub(crate) async fn write_all(
    io: &AsyncFd<OwnedFd>,
    data: &[u8],
    written: &mut usize,
) -> io::Result<()> {
    // Made at the first `EAGAIN`, dropped (deregistered) when the write is done.
    let mut room: Option<AsyncFd<OwnedFd>> = None;
    while let Some(rest) = data.get(*written..).filter(|r| !r.is_empty()) {
        match nix::unistd::write(io.get_ref(), rest).map_err(io::Error::from) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let waiter = match room.take() {
                    Some(w) => Some(w),
                    None => {
                        io.get_ref().try_clone().and_then(|d| register(d, Interest::WRITABLE)).ok()
                    }
                };
                if let Some(w) = waiter {
                    // Registration reports the current state, so room freed between the write
                    // above and here is not missed; a stale report only costs another try.
                    w.writable().await?.clear_ready();
                    room = Some(w);
                } else {
                    // No descriptor left for the duplicate (the process is at its limit):
                    // try again a little later rather than fail a write that only waits.
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The terminal's foreground process group (`tcgetpgrp` on the master); `None` when it has
/// none.
pub(crate) fn foreground(io: &AsyncFd<OwnedFd>) -> Option<i32> {
    nix::unistd::tcgetpgrp(io.get_ref()).ok().map(Pid::as_raw).filter(|pg| *pg > 0)
}

nix::ioctl_write_ptr_bad!(set_winsize, libc::TIOCSWINSZ, libc::winsize);

/// Sets the terminal's size (the kernel sends SIGWINCH to its foreground group).
///
/// # Errors
/// The ioctl failed (the PTY is gone).
pub(crate) fn resize(io: &AsyncFd<OwnedFd>, rows: u16, cols: u16) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: the descriptor is open for the call (owned by `io`), and `size` is a valid
    // winsize for TIOCSWINSZ to read.
    unsafe { set_winsize(io.get_ref().as_raw_fd(), &size) }.map_err(io::Error::from)?;
    Ok(())
}

/// True when the master has output to read, after the kernel moved its flip buffer (see
/// `ttyq`). Never blocks.
pub(crate) fn readable(io: &AsyncFd<OwnedFd>) -> bool {
    crate::ttyq::readable(io.get_ref().as_fd())
}

/// The pidfd of `pid` (a child of ours not reaped yet), registered with the current runtime's
/// reactor: readable once the child exited.
///
/// # Errors
/// `pidfd_open` is missing (Linux before 5.3, or a seccomp filter) or failed, or the
/// registration failed.
pub(crate) fn pidfd(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor (close-on-exec)
    // or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    register(owned, Interest::READABLE)
}

/// Waits for the child behind `pidfd` to exit and reaps it by pid.
pub(crate) async fn reap(pidfd: AsyncFd<OwnedFd>, pid: u32) -> ExitStatus {
    let Ok(raw) = i32::try_from(pid) else { return ExitStatus::default() };
    loop {
        let Ok(mut ready) = pidfd.readable().await else {
            // The reactor is gone with its runtime; the process-wide reaper collects the
            // zombie once the owned registration ends.
            return ExitStatus::default();
        };
        match waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG)) {
            Ok(ws) => match ended(ws) {
                Some(status) => return status,
                // Still alive (a spurious wake) or a state not asked for.
                None => ready.clear_ready(),
            },
            Err(Errno::EINTR) => {}
            Err(_) => return ExitStatus::default(),
        }
    }
}

/// Starts `path` (argv `argv`, exactly the environment `env`, in `cwd`) as the leader of a new
/// session whose controlling terminal is the PTY slave `tty`, on stdin, stdout and stderr.
///
/// The child gets default signal dispositions and an empty mask, calls `setsid`, changes
/// directory, opens `tty` (a session leader's first terminal open without `O_NOCTTY` makes
/// it the controlling terminal), and (on glibc) closes every other descriptor before its exec;
/// elsewhere only the close-on-exec ones go.
///
/// # Errors
/// A NUL byte in an argument or the environment, or the spawn's own error (the exec's errno:
/// glibc reports it from the child).
pub(crate) fn spawn_session(
    path: &Path,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
    tty: &Path,
) -> io::Result<u32> {
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument or variable")
        })
    };
    let path = c(path.as_os_str().as_bytes())?;
    let cwd = c(cwd.as_os_str().as_bytes())?;
    let tty = c(tty.as_os_str().as_bytes())?;
    let argv = argv.iter().map(|a| c(a.as_bytes())).collect::<io::Result<Vec<_>>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let ptrs = |v: &[CString]| -> Vec<*mut libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr().cast_mut())
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect()
    };
    let (argv_p, envp_p) = (ptrs(&argv), ptrs(&envp));
    let check =
        |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) };
    let mut actions = SpawnActions::new()?;
    let mut attr = SpawnAttr::new()?;
    let fa = &mut actions.0;
    let at = &mut attr.0;
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer passed is to a live CString or array of this frame, NUL-terminated
    // where the call requires it; the file actions and attributes were initialised above and are
    // destroyed by their guards.
    unsafe {
        check(libc::posix_spawn_file_actions_addchdir_np(fa, cwd.as_ptr()))?;
        check(libc::posix_spawn_file_actions_addopen(fa, 0, tty.as_ptr(), libc::O_RDWR, 0))?;
        check(libc::posix_spawn_file_actions_adddup2(fa, 0, 1))?;
        check(libc::posix_spawn_file_actions_adddup2(fa, 0, 2))?;
        #[cfg(target_env = "gnu")]
        check(libc::posix_spawn_file_actions_addclosefrom_np(fa, 3))?;
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        check(libc::posix_spawnattr_setsigdefault(at, &all))?;
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        check(libc::posix_spawnattr_setsigmask(at, &none))?;
        // The flags are small constants of mixed C types in the bindings.
        let flags = i32::from(libc::POSIX_SPAWN_SETSID)
            | libc::POSIX_SPAWN_SETSIGDEF
            | libc::POSIX_SPAWN_SETSIGMASK;
        let flags = libc::c_short::try_from(flags).map_err(|_| io::Error::other("spawn flags"))?;
        check(libc::posix_spawnattr_setflags(at, flags))?;
        check(libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            fa,
            at,
            argv_p.as_ptr(),
            envp_p.as_ptr(),
        ))?;
    }
    u32::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// File actions, destroyed when dropped.
struct SpawnActions(libc::posix_spawn_file_actions_t);

impl SpawnActions {
    fn new() -> io::Result<Self> {
        // SAFETY: zeroed storage is what init expects to fill.
        let mut fa = unsafe { std::mem::zeroed() };
        // SAFETY: `fa` is valid storage for the call.
        match unsafe { libc::posix_spawn_file_actions_init(&mut fa) } {
            0 => Ok(Self(fa)),
            rc => Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

impl Drop for SpawnActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// Spawn attributes, destroyed when dropped.
struct SpawnAttr(libc::posix_spawnattr_t);

impl SpawnAttr {
    fn new() -> io::Result<Self> {
        // SAFETY: zeroed storage is what init expects to fill.
        let mut at = unsafe { std::mem::zeroed() };
        // SAFETY: `at` is valid storage for the call.
        match unsafe { libc::posix_spawnattr_init(&mut at) } {
            0 => Ok(Self(at)),
            rc => Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// Waits for the child `pid` on this thread (where no pidfd can be had) and reaps it.
pub(crate) fn wait_blocking(pid: u32) -> ExitStatus {
    let Ok(raw) = i32::try_from(pid) else { return ExitStatus::default() };
    loop {
        match waitpid(Pid::from_raw(raw), None) {
            Ok(ws) => {
                if let Some(status) = ended(ws) {
                    return status;
                }
            }
            Err(Errno::EINTR) => {}
            Err(_) => return ExitStatus::default(),
        }
    }
}

/// The exit a wait status reports, if it reports one.
fn ended(ws: WaitStatus) -> Option<ExitStatus> {
    match ws {
        WaitStatus::Exited(_, code) => Some(ExitStatus { code: Some(code), signal: None }),
        WaitStatus::Signaled(_, sig, _) => {
            Some(ExitStatus { code: None, signal: Some(crate::signals::name(sig as i32)) })
        }
        _ => None,
    }
}
