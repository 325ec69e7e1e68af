//! Bytes a terminal holds that their reader has not taken yet, in either direction.
//!
//! A task parked in `read`/`pselect` on a terminal with input queued is not waiting for input:
//! the kernel is about to wake it with what was just typed. Without this check, a probe taken
//! in the instant between a write and the shell's wakeup would report a stdin wait for a line
//! that has not even been read. Likewise output the program wrote before it blocked, still on
//! its way to the master's reader, means the wait cannot be reported yet.
//!
//! Bytes written to one side of a PTY first sit in the other side's flip buffer, which a
//! kernel worker moves to the line discipline later (tens of milliseconds later on a loaded
//! machine); `FIONREAD` does not count them. `poll` on the receiving side runs that pending
//! move before it answers (n_tty's poll flushes the buffer work when it sees no input), so
//! each check polls first and then counts: exact, not a race against the worker.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

nix::ioctl_read_bad!(fionread, libc::FIONREAD, libc::c_int);

/// Bytes queued for reading on the terminal `tty` (its slave device), when it can be asked.
pub(crate) fn pending_input(tty: &Path) -> Option<usize> {
    // O_NOCTTY: looking must never make the terminal ours.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(tty)
        .ok()?;
    // Moves typed bytes still in the flip buffer to the line discipline, where FIONREAD sees
    // them; the answer itself is not needed.
    let _ = readable(f.as_fd());
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD stores one int through the pointer, which points at `n` on our stack,
    // and the fd stays open for the call.
    unsafe { fionread(f.as_raw_fd(), &mut n) }.ok()?;
    usize::try_from(n).ok()
}

/// True when `fd` (a PTY side) has bytes to read, after the kernel moved whatever was still
/// in its flip buffer (see the module docs). Never blocks.
pub(crate) fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN))
}
