//! How much typed input a terminal holds that nobody has read yet (`FIONREAD` on the slave).
//!
//! A task parked in `read`/`pselect` on a terminal with input queued is not waiting for input:
//! the kernel is about to wake it with what was just typed. Without this check, a probe taken
//! in the instant between a write and the shell's wakeup would report a stdin wait for a line
//! that has not even been read.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

nix::ioctl_read_bad!(fionread, libc::FIONREAD, libc::c_int);

/// Bytes queued for reading on the terminal `tty` (its slave device), when it can be asked.
pub(crate) fn pending_input(tty: &Path) -> Option<usize> {
    // O_NOCTTY: looking must never make the terminal ours.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(tty)
        .ok()?;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD stores one int through the pointer, which points at `n` on our stack,
    // and the fd stays open for the call.
    unsafe { fionread(f.as_raw_fd(), &mut n) }.ok()?;
    usize::try_from(n).ok()
}
