//! This process as a child subreaper, and the one reaper of the zombies that brings.
//!
//! With `PR_SET_CHILD_SUBREAPER`, a process orphaned anywhere below a spawn of this provider
//! (`(setsid cmd &)`, `(nohup cmd &)`, a parent that exited first) is reparented here rather
//! than to init, so it stays findable as ours and its zombie becomes ours to collect. Nobody
//! waits for those, so one process-wide thread reaps them, woken by SIGCHLD.
//!
//! # Invariants
//! - Never steal a child someone waits for. `waitpid(-1)` would reap tokio's and the pty
//!   waiter's children under them (and a `WNOWAIT` peek shows one zombie at a time, so an
//!   owned one not yet waited for would hide the rest), so zombies are found per pid
//!   (`/proc/self/task/*/children`) and only pids nobody owns are reaped, by pid. Every spawn of this crate registers its child as
//!   owned under the lock the reaper decides under, from before the fork until the owner has
//!   reaped it ([`owning`]), so there is no instant at which an owned child looks unowned.
//! - Zombies known to be ours are reaped at once: processes [`claim`]ed by a stop (see
//!   `procfs::stop`) and children seen alive carrying this process's tag. A zombie child in
//!   this process's own process group is never reaped: every spawn of this crate starts a
//!   new group (and its descendants stay out of ours), so it is a child of other code here
//!   (a `std::process::Command` with default settings), whose owner may wait only after
//!   reading its pipes to EOF. Any other unowned zombie child (a process that was reparented
//!   here and died unseen) is reaped after [`UNCLAIMED_GRACE`]. The hole: other code that
//!   puts its children in a group or session of their own and leaves one a zombie for that
//!   long loses its exit status to this reaper.
//! - Set up once per process however many providers exist ([`init`] is idempotent), before
//!   the first spawn of any of them.
//!
//! A burst of deaths is gathered for 5 ms (`COALESCE`) into one look. Nobody waits for the thread
//! to start, because its first look, made once it listens, sees what died before. Orphans land on
//! the main thread's `children` list (the kernel hands them to the subreaper's first live thread),
//! so the clean-call orphan look reads that one file. With the subreaper, a reaped spawn's
//! leftovers outside its group can only be under an unowned child, so a clean call skips the full
//! scan.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use conch_sync::LockExt;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::procfs::{self, ProcId, Tag};

/// How long an unowned zombie child nobody claimed may wait for its own parent code to reap
/// it before the reaper does.
const UNCLAIMED_GRACE: Duration = Duration::from_secs(5);
/// Without SIGCHLD delivery (the signal driver could not start), how often to look anyway.
const FALLBACK_POLL: Duration = Duration::from_secs(1);
/// After a SIGCHLD, how long to gather more before looking: a burst of deaths (an owner's
/// teardown) then costs one look, and a lone call's exit is not raced for the CPU by it.
/// Reaping is not urgent: a zombie counts as gone everywhere liveness is asked.
const COALESCE: Duration = Duration::from_millis(5);

static REAPER: OnceLock<Reaper> = OnceLock::new();

#[derive(Debug)]
struct Reaper {
    /// This process's tag: every provider's and spawn's id lives under it.
    tag: String,
    /// The kernel accepted `PR_SET_CHILD_SUBREAPER`.
    subreaper: bool,
    state: Mutex<State>,
    /// Looks for orphans: the last one, and whether a caller is about to make one.
    orphans: Mutex<Looks>,
    /// Woken when a look ends (or a caller that was to make one gave up).
    looked: tokio::sync::Notify,
}

/// The orphan looks that [`orphans_possible_since`] callers share.
#[derive(Debug, Default)]
struct Looks {
    /// The last look: when it began, and what it found.
    last: Option<(Instant, bool)>,
    /// A caller has taken the next look on itself and is letting the other ready tasks
    /// ask first.
    pending: bool,
    /// Looks made so far.
    made: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Direct children someone waits for (tokio, the pty waiter): pid → start time.
    owned: HashMap<i32, Option<u64>>,
    /// Processes of our trees: reaped as soon as they are zombie children of ours.
    ours: HashSet<ProcId>,
    /// Live unowned children already read for the tag.
    classified: HashSet<ProcId>,
    /// Unclaimed zombie children, with when each was first seen.
    unclaimed: HashMap<ProcId, Instant>,
}

/// Makes this process a child subreaper and starts the reaper, once. Returns this process's
/// tag, under which every spawn id lives.
pub(crate) fn init() -> &'static str {
    &REAPER
        .get_or_init(|| {
            // Nobody waits for the thread to listen: its first look, after it listens and
            // once this is set, sees every zombie of a death it could not hear.
            let started =
                std::thread::Builder::new().name("conch-reaper".into()).spawn(run).is_ok();
            // Adopting orphans nobody would reap is worse than leaving them to init: without
            // the reaper (or the prctl) they are still found by tag, and init collects them.
            #[cfg(any(target_os = "linux", target_os = "android"))]
            let subreaper = started && nix::sys::prctl::set_child_subreaper(true).is_ok();
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            let subreaper = false;
            Reaper {
                tag: format!("c{:016x}", random()),
                subreaper,
                state: Mutex::default(),
                orphans: Mutex::default(),
                looked: tokio::sync::Notify::new(),
            }
        })
        .tag
}

/// 64 random bits: `RandomState` is seeded from the OS once per process.
fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// A direct child registered as owned; dropping it (after its owner reaped it) ends that.
#[derive(Debug)]
pub(crate) struct Owned {
    pid: i32,
    /// The child's start time, read while it could not have been reaped yet.
    pub(crate) start: Option<u64>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(r) = REAPER.get() {
            let mut st = r.state.locked();
            if st.owned.get(&self.pid) == Some(&self.start) {
                st.owned.remove(&self.pid);
            }
        }
    }
}

/// Runs `open` with no spawn of this process's providers in flight: every spawn forks under
/// the reaper's lock (see [`owning`]), and so does this. A PTY's descriptors are made without
/// `O_CLOEXEC` and marked close-on-exec a step later (`portable-pty` calls `openpty(3)`, then
/// `fcntl`); a pipe child forked between the two would keep the other end of that PTY open
/// for its whole life (a `sleep 600` delayed a PTY's EOF by that long). A fork by code outside
/// the providers is not covered; without the reaper nothing is.
pub(crate) fn without_spawns<T>(open: impl FnOnce() -> T) -> T {
    init();
    let Some(r) = REAPER.get() else { return open() };
    let _st = r.state.locked();
    open()
}

/// Runs `spawn` (one fork) and registers the child it made as owned, both under the reaper's
/// lock, so the reaper never sees that child unregistered.
pub(crate) fn owning<T, E>(
    spawn: impl FnOnce() -> Result<T, E>,
    pid_of: impl FnOnce(&T) -> Option<u32>,
) -> (Result<T, E>, Option<Owned>) {
    init();
    let Some(r) = REAPER.get() else { return (spawn(), None) };
    let mut st = r.state.locked();
    let spawned = spawn();
    let owned =
        spawned.as_ref().ok().and_then(pid_of).and_then(|p| i32::try_from(p).ok()).map(|pid| {
            // The child is unreaped (its owner has not waited yet): the start is its own.
            let start = procfs::ident(pid).map(|id| id.start);
            st.owned.insert(pid, start);
            Owned { pid, start }
        });
    (spawned, owned)
}

/// Marks `id` as a process of our trees: if it dies as a child of ours, it is reaped at once.
pub(crate) fn claim(id: ProcId) {
    if let Some(r) = REAPER.get() {
        r.state.locked().ours.insert(id);
    }
}

/// False only when no process a reaped spawn left behind can exist outside its group: this
/// process is a subreaper, so every such process is under an orphan reparented here, and no
/// live child here is one nobody owns. A cheap look (this process's children) that lets a
/// clean call skip scanning every process.
pub(crate) fn orphans_possible() -> bool {
    let Some(r) = REAPER.get().filter(|r| r.subreaper) else { return true };
    look(r)
}

/// [`orphans_possible`] for a caller whose tree was already proven gone at `since`: an orphan
/// of that tree was reparented here before its ancestor died, so any look that began at or
/// after `since` answers for it.
///
/// Looks are shared, because an owner's teardown asks a thousand times within a few
/// milliseconds and each look lists every child of this process (the kernel formats the
/// whole list each time). A caller that finds no look to use takes the next one on itself
/// and first yields, so that every task made ready at the same moment asks before the look
/// begins and is answered by it; the others wait for it to end rather than look themselves.
pub(crate) async fn orphans_possible_since(since: Instant) -> bool {
    let Some(r) = REAPER.get().filter(|r| r.subreaper) else { return true };
    loop {
        let ended = r.looked.notified();
        tokio::pin!(ended);
        {
            let mut looks = r.orphans.locked();
            if let Some((began, answer)) = looks.last
                && began >= since
            {
                return answer;
            }
            if !looks.pending {
                looks.pending = true;
                break;
            }
            // Registered under the lock, so the end of the pending look cannot be missed.
            ended.as_mut().enable();
        }
        ended.await;
    }
    // Dropped before it looked (its caller gave up the wait), the turn passes on.
    let turn = Turn(r);
    tokio::task::yield_now().await;
    let answer = look(r);
    drop(turn);
    answer
}

/// The look a caller of [`orphans_possible_since`] took on itself; ending it, looked or not,
/// lets the waiting callers go on.
struct Turn(&'static Reaper);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.orphans.locked().pending = false;
        self.0.looked.notify_waiters();
    }
}

/// One look at the main thread's children for a live one nobody owns; recorded as the last.
fn look(r: &Reaper) -> bool {
    let Ok(me) = i32::try_from(std::process::id()) else { return true };
    let began = Instant::now();
    // Orphans are adopted by the main thread: only its list can hold one.
    let kids = procfs::adopted();
    let answer = {
        let st = r.state.locked();
        kids.into_iter().any(|pid| {
            // An owned pid is a child someone waits for; its pid cannot name an orphan until
            // that child is reaped and unregistered.
            if st.owned.contains_key(&pid) {
                return false;
            }
            procfs::stat(pid).is_some_and(|s| s.ppid == me && s.live())
        })
    };
    let mut looks = r.orphans.locked();
    looks.made += 1;
    // A look that began later (another thread's) is the better answer to keep.
    if looks.last.is_none_or(|(b, _)| b <= began) {
        looks.last = Some((began, answer));
    }
    answer
}

/// The roots under which a process a spawn started can be, besides that spawn's own tree:
/// the children nobody owns on the list orphans are adopted to (the main thread's: orphans,
/// and children of other code on that thread). `None` when this process is no subreaper: a
/// process can then be anywhere.
pub(crate) fn orphan_roots() -> Option<Vec<i32>> {
    let r = REAPER.get().filter(|r| r.subreaper)?;
    let kids = procfs::adopted();
    let st = r.state.locked();
    Some(kids.into_iter().filter(|pid| !st.owned.contains_key(pid)).collect())
}

fn run() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let Ok(runtime) = runtime else {
        REAPER.wait();
        loop {
            pass();
            std::thread::sleep(FALLBACK_POLL);
        }
    };
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigchld = signal(SignalKind::child()).ok();
        // Listening now; the first look must also see what died before.
        REAPER.wait();
        loop {
            let next = pass();
            match &mut sigchld {
                // SIGCHLD comes with every death of a child, reparented ones included; the
                // timer only serves zombies still in their grace.
                Some(rx) => {
                    let woke = match next {
                        Some(d) => tokio::time::timeout(d, rx.recv()).await.is_ok(),
                        None => rx.recv().await.is_some(),
                    };
                    if woke {
                        tokio::time::sleep(COALESCE).await;
                    }
                }
                None => tokio::time::sleep(next.unwrap_or(FALLBACK_POLL)).await,
            }
        }
    });
}

/// One look at this process's children: classifies new live ones, reaps the zombies that are
/// ours to reap, and returns how long until an unclaimed one's grace ends.
fn pass() -> Option<Duration> {
    let r = REAPER.get()?;
    let me = i32::try_from(std::process::id()).ok()?;
    let ours = Tag { id: r.tag.clone(), since: 0 };
    let kids = procfs::children(me);
    let own_group = nix::unistd::getpgrp().as_raw();
    let mut st = r.state.locked();
    let now = Instant::now();
    let mut next: Option<Duration> = None;
    let mut present = HashSet::new();
    for pid in kids {
        // An owned pid is a child someone waits for (its pid cannot name another process
        // until that child is reaped and unregistered): nothing to read.
        if st.owned.contains_key(&pid) {
            continue;
        }
        let Some(s) = procfs::stat(pid).filter(|s| s.ppid == me) else { continue };
        let id = s.id();
        present.insert(id);
        if s.live() {
            // A reparented orphan: read its tag once, while it still has an environment.
            if !st.classified.contains(&id)
                && let Some(tagged) = procfs::carries(&s, &ours)
            {
                st.classified.insert(id);
                if tagged {
                    st.ours.insert(id);
                }
            }
            continue;
        }
        // A child of other code here (our trees never join this process's group).
        if s.pgrp == own_group && !st.ours.contains(&id) {
            continue;
        }
        let reap = st.ours.contains(&id) || {
            let first = *st.unclaimed.entry(id).or_insert(now);
            let left = UNCLAIMED_GRACE.saturating_sub(now.duration_since(first));
            if !left.is_zero() {
                next = Some(next.map_or(left, |n| n.min(left)));
            }
            left.is_zero()
        };
        if reap {
            // This exact pid, never -1: only a zombie nobody owns is collected.
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            st.ours.remove(&id);
            st.unclaimed.remove(&id);
        }
    }
    st.classified.retain(|id| present.contains(id));
    st.unclaimed.retain(|id, _| present.contains(id));
    // Claimed processes that died elsewhere (reaped by their own parents) are forgotten.
    st.ours.retain(|id| procfs::stat(id.pid).is_some_and(|s| s.start == id.start));
    next
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{REAPER, init, orphans_possible_since};
    use conch_sync::LockExt;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn askers_at_one_moment_share_a_look_and_a_dropped_turn_passes_on() {
        init();
        let r = REAPER.get().filter(|r| r.subreaper).expect("this process became a subreaper");
        let limit = Duration::from_secs(30);

        // A caller that took the next look and was dropped before making it (its wait was
        // given up) must not leave the others waiting for a look nobody makes.
        let since = Instant::now();
        let mut taker = Box::pin(orphans_possible_since(since));
        assert!(futures::poll!(taker.as_mut()).is_pending(), "the taker yields before looking");
        assert!(r.orphans.locked().pending, "the next look is taken");
        let waiter = tokio::spawn(orphans_possible_since(since));
        drop(taker);
        tokio::time::timeout(limit, waiter)
            .await
            .expect("the waiter is answered after the taker was dropped")
            .expect("the waiter did not panic");

        // A burst of askers, each asking about the moment it asks: fewer looks than askers.
        let before = r.orphans.locked().made;
        let askers = 200;
        let asks: Vec<_> =
            (0..askers).map(|_| tokio::spawn(orphans_possible_since(Instant::now()))).collect();
        for ask in asks {
            tokio::time::timeout(limit, ask).await.expect("every asker is answered").unwrap();
        }
        let made = r.orphans.locked().made - before;
        // Unshared, about every other asker made a look of its own (115 of 200 measured);
        // shared, a handful.
        assert!(made >= 1 && made <= askers / 8, "{made} looks served {askers} askers");
    }
}
