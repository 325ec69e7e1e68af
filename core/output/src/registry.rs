//! The spill registry: every spill of one owner (a subprocess provider) with its size and
//! last-write time, held in memory so a total size cap and an age limit can be enforced
//! without ever scanning the spill directory.
//!
//! # Eviction policy
//! - A collector given a registry registers its spill when it creates it and reports every
//!   append, its seal, and its abandonment or discard; the registry's total is the sum of
//!   the bytes written to every registered spill.
//! - Only a *final* spill can be evicted: its collector sealed it (the stream ended; in
//!   `subprocess-local` the seal comes once the process settled) or was dropped, so nothing
//!   writes it again. A spill still being written is never evicted, whatever the total.
//! - Age counts from a spill's last write, and sealing counts as a write, so every finished
//!   output is kept for the full `max_age` after it ended.
//! - Past `max_total_bytes`, final spills are evicted least recently written first until the
//!   total is back under the cap or no final spill is left. Checked when a spill is created,
//!   when an append takes the total past the cap, when a spill becomes final, and on every
//!   [`SpillRegistry::sweep`]. Since every one of those events enforces the cap, spills that
//!   are still being written are what can keep the total above it: they count, so they push
//!   older final spills out, and a stream that alone outgrows the cap keeps its spill (up to
//!   its own `spill_cap`) while it is written and loses it the moment it becomes final.
//! - Final spills older than `max_age` are evicted when a spill becomes final and on every
//!   sweep; the owner sweeps on its own schedule (the local provider on each spawn and
//!   periodically).
//! - Eviction flags the spill before it deletes the file and its private directory; from
//!   then on the collector publishes no path and reports the spill as evicted, so an evicted
//!   spill is never handed out as the complete output again. A path published before the
//!   eviction (an earlier result) simply stops existing: it cannot be taken back.
//!
//! Collectors call in while holding their own lock, and the registry never takes a
//! collector's lock (the lock order is collector, then registry); eviction only flips the
//! shared flag and deletes files, which nothing writes any more.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use conch_sync::LockExt;

/// Default total of all spills of one registry (1 GiB).
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1024 * 1024 * 1024;
/// Default age limit of a final spill (24 h).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// The limits a [`SpillRegistry`] enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpillLimits {
    /// Largest total of all spills before final ones are evicted.
    pub max_total_bytes: u64,
    /// How long a final spill is kept after its last write.
    pub max_age: Duration,
}

impl Default for SpillLimits {
    fn default() -> Self {
        Self { max_total_bytes: DEFAULT_MAX_TOTAL_BYTES, max_age: DEFAULT_MAX_AGE }
    }
}

/// The in-memory record of one owner's spills (see the module docs for the policy).
///
/// Shared behind `Arc` by the owner and every collector it hands out.
#[derive(Debug)]
pub struct SpillRegistry {
    limits: SpillLimits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Bytes written to every registered spill.
    total: u64,
    entries: BTreeMap<u64, Entry>,
    evicted: u64,
}

#[derive(Debug)]
struct Entry {
    ticket: Arc<Ticket>,
    size: u64,
    last_write: Instant,
    /// Nothing writes it any more: sealed, or its collector is gone.
    final_: bool,
    path: PathBuf,
    dir: PathBuf,
}

/// A collector's handle on its registered spill.
#[derive(Debug)]
pub(crate) struct Ticket {
    id: u64,
    /// Set (before the file is deleted) when the registry evicted the spill.
    evicted: AtomicBool,
}

impl Ticket {
    /// True once the spill was evicted: its path must not be published again.
    pub(crate) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }
}

/// A spill picked for eviction, deleted after the registry lock is released.
struct Victim {
    path: PathBuf,
    dir: PathBuf,
}

impl SpillRegistry {
    /// An empty registry enforcing `limits`.
    pub fn new(limits: SpillLimits) -> Self {
        Self { limits, state: Mutex::default() }
    }

    /// The limits it enforces.
    pub fn limits(&self) -> SpillLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Sizes stay consistent enough to go on with after a panic elsewhere; refusing every
        // later spill over it would be worse.
        self.state.locked()
    }

    /// Bytes held by registered spills right now.
    pub fn total_bytes(&self) -> u64 {
        self.lock().total
    }

    /// How many spills are registered right now.
    pub fn spill_count(&self) -> usize {
        self.lock().entries.len()
    }

    /// How many spills this registry has evicted so far.
    pub fn evicted_count(&self) -> u64 {
        self.lock().evicted
    }

    /// Evicts final spills past the age limit, then enforces the total cap.
    pub fn sweep(&self) {
        self.sweep_at(Instant::now());
    }

    /// [`SpillRegistry::sweep`] as if it were `now` (tests look into the future with it).
    pub(crate) fn sweep_at(&self, now: Instant) {
        let victims = {
            let mut s = self.lock();
            let mut v = self.expire(&mut s, now);
            v.extend(self.over_cap(&mut s));
            v
        };
        remove(victims);
    }

    /// Registers a new spill that already holds `size` bytes.
    pub(crate) fn register(&self, path: PathBuf, dir: PathBuf, size: u64) -> Arc<Ticket> {
        let (ticket, victims) = {
            let mut s = self.lock();
            let id = s.next_id;
            s.next_id += 1;
            let ticket = Arc::new(Ticket { id, evicted: AtomicBool::new(false) });
            let entry = Entry {
                ticket: Arc::clone(&ticket),
                size,
                last_write: Instant::now(),
                final_: false,
                path,
                dir,
            };
            s.entries.insert(id, entry);
            s.total += size;
            (ticket, self.over_cap(&mut s))
        };
        remove(victims);
        ticket
    }

    /// `n` more bytes were appended to the spill.
    pub(crate) fn grew(&self, ticket: &Ticket, n: u64) {
        let victims = {
            let mut s = self.lock();
            let Some(e) = s.entries.get_mut(&ticket.id) else { return };
            e.size += n;
            e.last_write = Instant::now();
            s.total += n;
            // The common case, under the cap, costs one comparison.
            if s.total <= self.limits.max_total_bytes {
                return;
            }
            self.over_cap(&mut s)
        };
        remove(victims);
    }

    /// Nothing writes the spill any more (sealed, or its collector was dropped).
    pub(crate) fn finalized(&self, ticket: &Ticket) {
        let now = Instant::now();
        let victims = {
            let mut s = self.lock();
            let Some(e) = s.entries.get_mut(&ticket.id) else { return };
            e.final_ = true;
            // The seal is the last write: a finished output gets the whole age limit.
            e.last_write = now;
            let mut v = self.expire(&mut s, now);
            v.extend(self.over_cap(&mut s));
            v
        };
        remove(victims);
    }

    /// The collector deleted the spill itself (abandoned or discarded): stop counting it.
    pub(crate) fn forget(&self, ticket: &Ticket) {
        let mut s = self.lock();
        if let Some(e) = s.entries.remove(&ticket.id) {
            s.total -= e.size;
        }
    }

    /// Final spills whose last write is at least `max_age` before `now`.
    fn expire(&self, s: &mut State, now: Instant) -> Vec<Victim> {
        let old: Vec<u64> = s
            .entries
            .iter()
            .filter(|(_, e)| {
                e.final_ && now.saturating_duration_since(e.last_write) >= self.limits.max_age
            })
            .map(|(id, _)| *id)
            .collect();
        old.into_iter().filter_map(|id| evict(s, id)).collect()
    }

    /// Final spills to evict until the total is within the cap (see the module docs).
    fn over_cap(&self, s: &mut State) -> Vec<Victim> {
        let cap = self.limits.max_total_bytes;
        if s.total <= cap {
            return Vec::new();
        }
        let mut order: Vec<(Instant, u64)> =
            s.entries.iter().filter(|(_, e)| e.final_).map(|(id, e)| (e.last_write, *id)).collect();
        // Ids break ties in creation order.
        order.sort_unstable();
        let mut victims = Vec::new();
        for (_, id) in order {
            if s.total <= cap {
                break;
            }
            victims.extend(evict(s, id));
        }
        victims
    }
}

/// Drops entry `id` from the books and flags its ticket; the file goes in [`remove`].
fn evict(s: &mut State, id: u64) -> Option<Victim> {
    let e = s.entries.remove(&id)?;
    s.total -= e.size;
    s.evicted += 1;
    // Flagged before the file is deleted, so a collector that sees the file gone also sees
    // the flag and reports the eviction instead of a path.
    e.ticket.evicted.store(true, Ordering::Release);
    Some(Victim { path: e.path, dir: e.dir })
}

/// Deletes evicted spills: the file, then its private directory.
fn remove(victims: Vec<Victim>) {
    for v in victims {
        // Best effort, as every spill removal: the spill is already off the books and its
        // path is never published again either way.
        let _ = fs::remove_file(&v.path);
        let _ = fs::remove_dir(&v.dir);
    }
}
