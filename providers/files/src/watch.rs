//! Directory watches through inotify (nix's binding), one inotify instance and one thread per
//! watch.
//!
//! 1. The watched directory gets a watch, and for a recursive watch so does every directory
//!    beneath it (symlinks are never followed: `IN_DONT_FOLLOW`, `IN_ONLYDIR`).
//! 2. The thread reads events (a blocking read) and turns them into the seam's
//!    [`WatchEvent`]s, queued in a bounded channel ([`QUEUE`]); when the consumer falls that
//!    far behind, events are dropped and the next one delivered is [`WatchEvent::Overflow`]
//!    (as for the kernel's own queue overflow). Reads and opens are not reported.
//! 3. A directory created in (or moved into) a recursive watch gets its watch at once, and
//!    what it already holds by then is reported as created, so entries made right after the
//!    directory are not lost in the gap before its watch existed (one made inside that gap
//!    may be reported twice).
//! 4. A rename is two kernel events joined by a cookie: a `from` half is held until its `to`
//!    half (one [`WatchEvent::Renamed`] with both paths, and watched directories beneath it
//!    renamed in place). A `from` without its `to` within [`RENAME_GRACE`] was a move out of
//!    the watch: a rename to `None` (and the watches beneath it are dropped).
//! 5. The watched directory's own removal ends the stream after its `Removed` event. Dropping
//!    the stream removes the top watch, whose `IN_IGNORED` wakes the thread to end.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::files::{WatchEvent, WatchStream};
use conch_seams::{Error, ErrorCode, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tokio::sync::mpsc;

use crate::guard::sys;

/// How many events wait for the consumer at most.
pub(crate) const QUEUE: usize = 4096;

/// How long a rename's `from` half waits for its `to` half.
pub(crate) const RENAME_GRACE: Duration = Duration::from_millis(100);

fn mask() -> F {
    F::IN_CREATE
        | F::IN_DELETE
        | F::IN_MODIFY
        | F::IN_ATTRIB
        | F::IN_MOVED_FROM
        | F::IN_MOVED_TO
        | F::IN_DELETE_SELF
        | F::IN_ONLYDIR
        | F::IN_DONT_FOLLOW
}

/// The thread's state: which watch is which directory.
struct Tracker {
    ino: Arc<Inotify>,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    top: WatchDescriptor,
    root: PathBuf,
    recursive: bool,
    /// Directories a recursive watch does not descend into.
    hidden: Option<crate::guard::Hidden>,
    /// A `from` half waiting for its `to`: cookie, path, was a directory.
    pending: Option<(u32, PathBuf, bool)>,
    out: Vec<WatchEvent>,
}

impl Tracker {
    /// Watches `dir` and (recursive) every directory beneath it; with `report`, every entry
    /// found beneath it is reported as created.
    fn add_tree(&mut self, dir: &Path, report: bool) {
        if self.hidden.as_ref().is_some_and(|h| h.hides(dir)) {
            return;
        }
        let Ok(wd) = self.ino.add_watch(dir, mask()) else { return };
        self.dirs.insert(wd, dir.to_owned());
        if !self.recursive {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let path = dir.join(name);
            let Ok(m) = std::fs::symlink_metadata(&path) else { continue };
            if report {
                self.out.push(WatchEvent::Created { path: path.clone() });
            }
            if m.is_dir() {
                self.add_tree(&path, report);
            }
        }
    }

    /// Drops the watches of `dir` and everything beneath it (it left the watch).
    fn drop_tree(&mut self, dir: &Path) {
        let gone: Vec<WatchDescriptor> =
            self.dirs.iter().filter(|(_, p)| p.starts_with(dir)).map(|(wd, _)| *wd).collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = self.ino.rm_watch(wd);
        }
    }

    /// Renames the watched directories at or beneath `from` to lie beneath `to`.
    fn move_tree(&mut self, from: &Path, to: &Path) {
        for p in self.dirs.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }

    fn flush_pending(&mut self) {
        if let Some((_, from, is_dir)) = self.pending.take() {
            if is_dir {
                self.drop_tree(&from);
            }
            self.out.push(WatchEvent::Renamed { from: Some(from), to: None });
        }
    }

    /// Turns one kernel event into the seam's; true when the watch ended.
    fn event(&mut self, ev: InotifyEvent) -> bool {
        if ev.mask.contains(F::IN_Q_OVERFLOW) {
            self.out.push(WatchEvent::Overflow);
            return false;
        }
        if ev.mask.contains(F::IN_IGNORED) {
            self.dirs.remove(&ev.wd);
            return ev.wd == self.top;
        }
        let Some(dir) = self.dirs.get(&ev.wd) else { return false };
        let path = match &ev.name {
            Some(name) => dir.join(name),
            None => dir.clone(),
        };
        let is_dir = ev.mask.contains(F::IN_ISDIR);
        if ev.mask.contains(F::IN_MOVED_TO) {
            match self.pending.take() {
                Some((cookie, from, _)) if cookie == ev.cookie => {
                    if is_dir {
                        self.move_tree(&from, &path);
                    }
                    self.out.push(WatchEvent::Renamed { from: Some(from), to: Some(path) });
                }
                other => {
                    self.pending = other;
                    self.flush_pending();
                    if is_dir && self.recursive {
                        self.add_tree(&path, false);
                    }
                    self.out.push(WatchEvent::Renamed { from: None, to: Some(path) });
                }
            }
            return false;
        }
        self.flush_pending();
        if ev.mask.contains(F::IN_MOVED_FROM) {
            self.pending = Some((ev.cookie, path, is_dir));
        } else if ev.mask.contains(F::IN_CREATE) {
            self.out.push(WatchEvent::Created { path: path.clone() });
            if is_dir && self.recursive {
                self.add_tree(&path, true);
            }
        } else if ev.mask.contains(F::IN_DELETE) {
            self.out.push(WatchEvent::Removed { path });
        } else if ev.mask.contains(F::IN_DELETE_SELF) {
            // A subdirectory's removal is reported by its parent.
            if ev.wd == self.top {
                self.out.push(WatchEvent::Removed { path: self.root.clone() });
            }
        } else if ev.mask.intersects(F::IN_MODIFY | F::IN_ATTRIB) {
            self.out.push(WatchEvent::Modified { path });
        }
        false
    }
}

/// What the stream and the thread share.
#[derive(Debug)]
struct Shared {
    ino: Arc<Inotify>,
    top: WatchDescriptor,
    stop: AtomicBool,
    overflow: AtomicBool,
}

/// A watch's events.
#[derive(Debug)]
pub(crate) struct Watch {
    rx: mpsc::Receiver<WatchEvent>,
    shared: Arc<Shared>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Its IN_IGNORED wakes the thread's read; already gone when the watch ended.
        let _ = self.shared.ino.rm_watch(self.shared.top);
    }
}

fn run(mut t: Tracker, shared: Arc<Shared>, tx: mpsc::Sender<WatchEvent>) {
    loop {
        if t.pending.is_some() {
            // Wait a moment for the other half of a rename before calling it a move out.
            let mut fds = [PollFd::new(t.ino.as_fd(), PollFlags::POLLIN)];
            let grace = PollTimeout::try_from(RENAME_GRACE).unwrap_or(PollTimeout::ZERO);
            if matches!(poll(&mut fds, grace), Ok(0)) {
                t.flush_pending();
            }
        }
        let mut ended = false;
        if t.out.is_empty() {
            let events = match t.ino.read_events() {
                Ok(events) => events,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "inotify read failed; the watch ends");
                    return;
                }
            };
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            for ev in events {
                ended |= t.event(ev);
            }
        }
        for ev in t.out.drain(..) {
            match tx.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    shared.overflow.store(true, Ordering::SeqCst);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
        if ended {
            return;
        }
    }
}

/// Starts watching the directory `path`.
pub(crate) async fn watch(
    provider: &'static str,
    path: PathBuf,
    recursive: bool,
    hidden: Option<crate::guard::Hidden>,
) -> Result<Watch> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let shared = crate::run_blocking(provider, "watch", move || {
        let m = std::fs::metadata(&path).map_err(|e| Error::fs("watch", &path, e))?;
        if !m.is_dir() {
            return Err(sys("watch", &path, Errno::ENOTDIR));
        }
        let ino =
            Arc::new(Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| sys("watch", &path, e))?);
        let top = ino.add_watch(path.as_path(), mask()).map_err(|e| sys("watch", &path, e))?;
        let mut t = Tracker {
            ino: Arc::clone(&ino),
            dirs: HashMap::from([(top, path.clone())]),
            top,
            root: path.clone(),
            recursive,
            hidden,
            pending: None,
            out: Vec::new(),
        };
        if recursive {
            // The top's children (the top itself is watched already).
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .map_err(|e| Error::fs("watch", &path, e))?
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            names.sort();
            for dir in names {
                t.add_tree(&dir, false);
            }
        }
        let shared = Arc::new(Shared {
            ino,
            top,
            stop: AtomicBool::new(false),
            overflow: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("conch-files-watch".into())
            .spawn(move || run(t, s, tx))
            .map_err(|e| Error::new(ErrorCode::Io, format!("watch {}: {e}", path.display())))?;
        Ok(shared)
    })
    .await?;
    Ok(Watch { rx, shared })
}

#[async_trait]
impl WatchStream for Watch {
    async fn next_event(&mut self) -> Result<Option<WatchEvent>> {
        if self.shared.overflow.swap(false, Ordering::SeqCst) {
            return Ok(Some(WatchEvent::Overflow));
        }
        Ok(self.rx.recv().await)
    }
}
