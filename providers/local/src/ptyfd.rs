//! A terminal's descriptors on the async runtime: the PTY master, non-blocking, and the
//! leader's pidfd. With them a terminal costs no thread: its reads, writes and reaping are
//! readiness waits on tokio's reactor, so 1,000 terminals cost what one does plus their fds.
//!
//! # Invariants
//! - `O_NONBLOCK` belongs to the open file description, which a `dup` shares: once the master
//!   is made non-blocking here, nothing may read or write it through portable-pty's blocking
//!   reader or writer (neither is taken). Its ioctls (resize, foreground group) are unaffected.
//! - A master read that returns 0 or fails with anything but `EAGAIN`/`EINTR` is EOF: Linux
//!   says `EIO` once every slave fd is closed, and only after the queued output was read.
//! - The leader is reaped by pid (`waitpid(pid, WNOHANG)`) once its pidfd is readable, never
//!   by `-1`, so no other child is taken from its owner (see `reaper`).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use conch_seams::ExitStatus;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A non-blocking duplicate of the master `fd`, registered with the current runtime's reactor
/// for reads and writes.
///
/// # Errors
/// The dup, the flag change or the registration failed (no runtime, too many fds).
pub(crate) fn master(fd: RawFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the caller holds the master (the PTY pair) open for the duration of the call;
    // the borrow ends here, and the duplicate is close-on-exec from birth.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    let flags = OFlag::from_bits_truncate(fcntl(&owned, FcntlArg::F_GETFL)?);
    fcntl(&owned, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    register(owned, Interest::READABLE | Interest::WRITABLE)
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
    let mut buf = vec![0u8; max];
    loop {
        let mut ready = io.readable().await?;
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

/// Writes all of `data` to the master, waiting for room on the reactor (a program that does
/// not read fills the PTY; the wait then holds no thread).
///
/// # Errors
/// The PTY refused the write (`EIO` once the terminal is gone), or the reactor is gone.
pub(crate) async fn write_all(io: &AsyncFd<OwnedFd>, data: &[u8]) -> io::Result<()> {
    let mut rest = data;
    while !rest.is_empty() {
        let mut ready = io.writable().await?;
        match ready.try_io(|fd| nix::unistd::write(fd.get_ref(), rest).map_err(io::Error::from)) {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => rest = &rest[n..],
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
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
            Ok(WaitStatus::Exited(_, code)) => {
                return ExitStatus { code: Some(code), signal: None };
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return ExitStatus { code: None, signal: Some(crate::signals::name(sig as i32)) };
            }
            Err(Errno::EINTR) => {}
            // Still alive (a spurious wake) or a state not asked for.
            Ok(_) => ready.clear_ready(),
            Err(_) => return ExitStatus::default(),
        }
    }
}
