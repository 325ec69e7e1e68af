//! Directory watches through inotify (the `notify` crate, which adds watches for directories
//! created inside a recursive watch).
//!
//! The watcher's thread turns each event into the seam's [`WatchEvent`] and queues it in a
//! bounded channel ([`QUEUE`]); when the consumer falls that far behind, events are dropped and
//! the next one delivered is [`WatchEvent::Overflow`]. Reads and opens are not reported.
//!
//! inotify reports a rename as two halves joined by a cookie. A `from` half is held until its
//! `to` half arrives (one [`WatchEvent::Renamed`] with both paths) or another event does; a
//! `from` whose `to` never comes (a move out of the watch) is delivered as a rename to `None`
//! once the stream has waited [`RENAME_GRACE`] for its other half. The watched directory's own
//! removal ends the stream after its `Removed` event.
//!
//! A limit, stated: a directory created inside a recursive watch is watched from the moment
//! the watcher has added it, so what is created in it before that (right after its own
//! `Created` event) may go unreported.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::files::{WatchEvent, WatchStream};
use conch_seams::{Error, ErrorCode, Result};
use conch_sync::LockExt;
use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// How many events wait for the consumer at most.
pub(crate) const QUEUE: usize = 4096;

/// How long an unpaired rename's `from` half waits for its `to` half.
pub(crate) const RENAME_GRACE: Duration = Duration::from_millis(100);

/// The watcher thread's rename bookkeeping.
#[derive(Debug, Default)]
struct Pairing {
    /// A `from` half waiting for its `to`: (cookie, path).
    pending: Option<(usize, PathBuf)>,
    /// The cookie of a `to` half that took its `from`: the combined event follows.
    paired: Option<(usize, PathBuf)>,
}

#[derive(Debug)]
struct Shared {
    pairing: Mutex<Pairing>,
    overflow: AtomicBool,
}

/// A watch's events.
pub(crate) struct Watch {
    rx: mpsc::Receiver<WatchEvent>,
    shared: Arc<Shared>,
    root: PathBuf,
    ended: bool,
    /// Kept for as long as the stream lives: dropping it ends the watch.
    _watcher: notify::RecommendedWatcher,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("root", &self.root).field("ended", &self.ended).finish()
    }
}

fn send(tx: &mpsc::Sender<WatchEvent>, shared: &Shared, ev: WatchEvent) {
    if tx.try_send(ev).is_err() {
        shared.overflow.store(true, Ordering::SeqCst);
    }
}

/// Turns one `notify` event into the seam's, in order.
fn translate(tx: &mpsc::Sender<WatchEvent>, shared: &Shared, event: notify::Event) {
    let tracker = event.tracker();
    let first = event.paths.first().cloned();
    let mut pairing = shared.pairing.locked();
    match event.kind {
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
            // A `from` without a cookie is the watched directory's own move: its parent
            // reports the rename.
            let (Some(t), Some(path)) = (tracker, first) else { return };
            if let Some((_, prev)) = pairing.pending.replace((t, path)) {
                send(tx, shared, WatchEvent::Renamed { from: Some(prev), to: None });
            }
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            let Some(to) = first else { return };
            match (tracker, pairing.pending.take()) {
                (Some(t), Some((c, from))) if t == c => pairing.paired = Some((t, from)),
                (_, other) => {
                    pairing.pending = other;
                    send(tx, shared, WatchEvent::Renamed { from: None, to: Some(to) });
                }
            }
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            if let (Some((c, from)), Some(t)) = (pairing.paired.take(), tracker)
                && c == t
            {
                let to = event.paths.get(1).cloned();
                send(tx, shared, WatchEvent::Renamed { from: Some(from), to });
            }
        }
        kind => {
            if let Some((_, from)) = pairing.pending.take() {
                send(tx, shared, WatchEvent::Renamed { from: Some(from), to: None });
            }
            let make: fn(PathBuf) -> WatchEvent = match kind {
                EventKind::Create(_) => |path| WatchEvent::Created { path },
                EventKind::Remove(_) => |path| WatchEvent::Removed { path },
                EventKind::Modify(_) => |path| WatchEvent::Modified { path },
                EventKind::Other if event.need_rescan() => {
                    send(tx, shared, WatchEvent::Overflow);
                    return;
                }
                _ => return,
            };
            for path in event.paths {
                send(tx, shared, make(path));
            }
        }
    }
}

/// Starts watching the directory `path`.
pub(crate) async fn watch(provider: &'static str, path: PathBuf, recursive: bool) -> Result<Watch> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let shared = Arc::new(Shared {
        pairing: Mutex::new(Pairing::default()),
        overflow: AtomicBool::new(false),
    });
    let s = Arc::clone(&shared);
    let p = path.clone();
    let watcher = crate::run_blocking(provider, "watch", move || {
        let m = std::fs::metadata(&p).map_err(|e| Error::fs("watch", &p, e))?;
        if !m.is_dir() {
            return Err(Error::fs(
                "watch",
                &p,
                std::io::Error::from(std::io::ErrorKind::NotADirectory),
            ));
        }
        let mut watcher =
            notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
                Ok(ev) => translate(&tx, &s, ev),
                Err(e) => tracing::debug!(error = %e, "inotify watch error"),
            })
            .map_err(|e| watch_error(&p, e))?;
        let mode = if recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
        watcher.watch(&p, mode).map_err(|e| watch_error(&p, e))?;
        Ok(watcher)
    })
    .await?;
    Ok(Watch { rx, shared, root: path, ended: false, _watcher: watcher })
}

fn watch_error(path: &std::path::Path, e: notify::Error) -> Error {
    match e.kind {
        notify::ErrorKind::Io(io) => Error::fs("watch", path, io),
        notify::ErrorKind::PathNotFound => {
            Error::fs("watch", path, std::io::Error::from(std::io::ErrorKind::NotFound))
        }
        other => Error::new(ErrorCode::Io, format!("watch {}: {other:?}", path.display())),
    }
}

#[async_trait]
impl WatchStream for Watch {
    async fn next_event(&mut self) -> Result<Option<WatchEvent>> {
        if self.ended {
            return Ok(None);
        }
        loop {
            if self.shared.overflow.swap(false, Ordering::SeqCst) {
                return Ok(Some(WatchEvent::Overflow));
            }
            let waiting = self.shared.pairing.locked().pending.is_some();
            let next = if waiting {
                match tokio::time::timeout(RENAME_GRACE, self.rx.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        if let Some((_, from)) = self.shared.pairing.locked().pending.take() {
                            return Ok(Some(WatchEvent::Renamed { from: Some(from), to: None }));
                        }
                        continue;
                    }
                }
            } else {
                self.rx.recv().await
            };
            let Some(ev) = next else {
                self.ended = true;
                return Ok(None);
            };
            if matches!(&ev, WatchEvent::Removed { path } if *path == self.root) {
                self.ended = true;
            }
            return Ok(Some(ev));
        }
    }
}
