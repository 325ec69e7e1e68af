//! The client's replica of one remote process or terminal: its output by absolute offset and
//! what the server said about it (exit, settlement, spill state).
//!
//! # Invariants
//! - A byte is stored at most once: a frame's bytes below the replica's total are dropped
//!   (a resend after a reconnect), so nothing is duplicated.
//! - Bytes the server announced lost (`gap`), or that a frame skipped, count in the total
//!   and make reads from before them `lossy`, as bytes dropped from memory do locally.
//! - A stream is sealed only by the server's `eof`; a lost connection never looks like EOF.
//!   Once the provider gives up, every wait fails with the recorded error instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use conch_output::{Collector, CollectorConfig};
use conch_seams::{Error, ErrorBody, ExitStatus, Leftover, Result, SpillRef, World};
use conch_sync::LockExt;
use tokio::sync::watch;

use conch_provider_remote_proto::{ServerMsg, SpillState, Stream};

/// What the server said about one id.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    pub(crate) exited: Option<ExitStatus>,
    pub(crate) settled: Option<(ExitStatus, Vec<Leftover>)>,
    pub(crate) group_gone: bool,
    pub(crate) spill: BTreeMap<Stream, SpillState>,
    /// Bytes announced lost per stream.
    pub(crate) lost: BTreeMap<Stream, u64>,
    /// Set when the provider gave up on the server (or the server changed): every wait
    /// that has not been satisfied fails with it.
    pub(crate) failed: Option<ErrorBody>,
}

/// One remote id's replica.
#[derive(Debug)]
pub(crate) struct Mirror {
    pub(crate) id: String,
    streams: Vec<(Stream, Collector)>,
    facts: Mutex<Facts>,
    bump: watch::Sender<u64>,
    /// Whose filesystem the server's spill paths belong to.
    world: String,
    /// Set once the daemon confirmed the start. A (re)connect attaches only started ids:
    /// an attach that overtook its own start would be answered `not_found` and fail the id
    /// for good.
    started: AtomicBool,
}

impl Mirror {
    /// A replica with one collector per stream, each keeping `max_bytes` in memory.
    pub(crate) fn new(id: String, world: String, streams: &[(Stream, usize)]) -> Self {
        let streams = streams
            .iter()
            // No client-side spill: the complete stream lives in the server's spill.
            .map(|&(s, max)| (s, Collector::new(CollectorConfig::new(max, 0))))
            .collect();
        Self {
            id,
            streams,
            facts: Mutex::default(),
            bump: watch::Sender::new(0),
            world,
            started: AtomicBool::new(false),
        }
    }

    /// The daemon confirmed the start: from now on a (re)connect attaches this id.
    pub(crate) fn mark_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// True once the daemon confirmed the start.
    pub(crate) fn is_started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    pub(crate) fn facts(&self) -> MutexGuard<'_, Facts> {
        self.facts.locked()
    }

    pub(crate) fn stream(&self, s: Stream) -> Option<&Collector> {
        self.streams.iter().find(|(x, _)| *x == s).map(|(_, c)| c)
    }

    fn changed(&self) {
        self.bump.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Next offset per stream: where a (re)attach resumes.
    pub(crate) fn offsets(&self) -> BTreeMap<Stream, u64> {
        self.streams.iter().map(|(s, c)| (*s, c.total_bytes())).collect()
    }

    /// True when nothing more can arrive for this id.
    pub(crate) fn finished(&self) -> bool {
        self.finished_in(&self.facts())
    }

    /// [`Mirror::finished`] for a caller that already holds the facts (inside `until`).
    pub(crate) fn finished_in(&self, f: &Facts) -> bool {
        let sealed = self.streams.iter().all(|(_, c)| c.is_sealed());
        f.failed.is_some()
            || (sealed
                && if self.streams.iter().any(|(s, _)| *s == Stream::Pty) {
                    f.exited.is_some()
                } else {
                    f.group_gone
                })
    }

    /// Takes in the bytes of one data frame at `offset`.
    pub(crate) fn data(&self, stream: Stream, offset: u64, bytes: &[u8]) {
        let Some(c) = self.stream(stream) else { return };
        let total = c.total_bytes();
        let end = offset + bytes.len() as u64;
        if end <= total {
            return;
        }
        if offset > total {
            // Bytes the server never announced: count them lost rather than shift offsets.
            c.skip(offset - total);
            *self.facts().lost.entry(stream).or_default() += offset - total;
            c.push(bytes);
        } else {
            let fresh = usize::try_from(total - offset).unwrap_or(usize::MAX);
            c.push(&bytes[fresh..]);
        }
        self.changed();
    }

    /// Takes in one server message about this id.
    pub(crate) fn message(&self, msg: ServerMsg) {
        match msg {
            ServerMsg::Gap { stream, to, .. } => {
                if let Some(c) = self.stream(stream) {
                    let total = c.total_bytes();
                    if to > total {
                        c.skip(to - total);
                        *self.facts().lost.entry(stream).or_default() += to - total;
                    }
                }
            }
            ServerMsg::Eof { stream, at, .. } => {
                if let Some(c) = self.stream(stream) {
                    let total = c.total_bytes();
                    if at > total {
                        c.skip(at - total);
                        *self.facts().lost.entry(stream).or_default() += at - total;
                    }
                    c.seal();
                }
            }
            ServerMsg::Spill { stream, state, .. } => {
                self.facts().spill.insert(stream, state);
            }
            ServerMsg::Exited { status, .. } => {
                self.facts().exited.get_or_insert(status);
            }
            ServerMsg::Settled { status, leftovers, .. } => {
                let mut f = self.facts();
                f.exited.get_or_insert_with(|| status.clone());
                f.settled = Some((status, leftovers));
            }
            ServerMsg::GroupGone { .. } => self.facts().group_gone = true,
            ServerMsg::Error { error, .. } => {
                // An error about one id ends it: the server cannot stream it any more.
                self.facts().failed.get_or_insert(error);
            }
            ServerMsg::Hello { .. }
            | ServerMsg::Hb
            | ServerMsg::Watching { .. }
            | ServerMsg::FileEvent { .. }
            | ServerMsg::WatchEnd { .. } => return,
        }
        self.changed();
    }

    /// Fails every wait still pending (the server is gone or changed).
    pub(crate) fn fail(&self, error: &Error) {
        self.facts().failed.get_or_insert_with(|| error.to_body());
        self.changed();
    }

    /// The server's spill for `stream`, as a path in the server's world.
    pub(crate) fn spill(&self, stream: Stream) -> (Option<SpillRef>, bool) {
        let f = self.facts();
        let Some(s) = f.spill.get(&stream) else { return (None, false) };
        let spill = s.spill.as_ref().map(|r| SpillRef {
            world: World::Remote { name: self.world.clone() },
            path: r.path.clone(),
        });
        (spill, s.evicted)
    }

    /// Waits until `f` has an answer. `f` sees the facts first, so something that happened
    /// before a failure is still reported.
    /// `f` runs under the facts lock: it must use the `Facts` it is given, never `facts()`.
    pub(crate) async fn until<T>(&self, f: impl Fn(&Self, &Facts) -> Option<T>) -> Result<T> {
        let mut rx = self.bump.subscribe();
        loop {
            {
                let facts = self.facts();
                if let Some(v) = f(self, &facts) {
                    return Ok(v);
                }
                if let Some(e) = &facts.failed {
                    return Err(Error::from_body(e.clone()));
                }
            }
            // The sender lives in `self`, so this only waits.
            let _ = rx.changed().await;
        }
    }
}
