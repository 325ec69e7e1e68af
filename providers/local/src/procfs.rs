//! The one reader of `/proc`: stat parsing, process identity (pid + start time), group,
//! session and descendant membership, pipe holders, and the single TERM → grace → KILL
//! escalation loop every kill path in this crate uses.
//!
//! # Invariants
//! - A process is named by [`ProcId`] (pid and start time in clock ticks); a per-process
//!   signal is sent only right after the identity was re-read, so a recycled pid is not
//!   signalled (the remaining window is the instant between that read and the `kill`).
//!   Group-wide signals rely on the kernel keeping a group id reserved while any member
//!   lives; they are sent only while the scan finds members.
//! - Zombies count as gone: they have no work left, and where nobody reaps orphans they would
//!   otherwise keep a "live" group forever.
//! - [`stop`] never trusts one snapshot: every round rescans, so processes forked while the
//!   set is being stopped are found, and a process once targeted stays targeted even after
//!   it leaves the group or is reparented away.
//! - A spawn of this process that has not exec'd yet (a direct child running this
//!   executable) is never taken for a pipe holder: until its exec it holds a copy of every
//!   descriptor of this process, so it would pass for a holder of every call's output and be
//!   stopped at birth by any concurrent kill.
//! - A [`Tag`] is read from `/proc/<pid>/environ`, which holds the environment the process
//!   was exec'd with: it survives setsid and double forks, but not a process that execs with
//!   a cleared or rewritten environment, one that overwrites its environment block in place,
//!   or one this user may not inspect (another user, a set-uid program). An environment that
//!   reads empty (a process mid-exec) is no answer: a scan that met one is not taken as proof
//!   that nothing is left, for up to a second per process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How often a set being stopped (or a group being waited for) is rescanned, at most.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// The first rescan comes this soon; the gap doubles up to [`PROBE_INTERVAL`], so a set
/// that goes at once is seen gone at once, and a stubborn one costs few scans.
const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// After KILL, how long to keep proving a set is gone before reporting survivors.
pub(crate) const AFTER_KILL_LIMIT: Duration = Duration::from_secs(30);

/// One process identity that survives pid reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ProcId {
    pub(crate) pid: i32,
    /// Start time in clock ticks since boot (field 22 of stat).
    pub(crate) start: u64,
}

/// The fields of `/proc/<pid>/stat` that conch uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) pid: i32,
    pub(crate) comm: String,
    pub(crate) state: char,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    pub(crate) session: i32,
    /// The controlling terminal's device number (0: none).
    pub(crate) tty_nr: u64,
    pub(crate) start: u64,
    /// CPU time used so far, user plus system (clock ticks).
    pub(crate) ticks: u64,
    /// A kernel thread (`PF_KTHREAD` in the flags): it has no environment, ever.
    pub(crate) kernel: bool,
}

impl Stat {
    pub(crate) fn id(&self) -> ProcId {
        ProcId { pid: self.pid, start: self.start }
    }

    /// Not a zombie or dead entry.
    pub(crate) fn live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// The process flag that marks a kernel thread (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses one stat line. The comm may contain spaces and parens, so fields are split after
/// the last `)`: state (3), ppid (4), pgrp (5), session (6), tty_nr (7), flags (9),
/// utime (14), stime (15), starttime (22).
pub(crate) fn parse_stat(pid: i32, text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let f: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    Some(Stat {
        pid,
        comm,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        tty_nr: f.get(4)?.parse::<i64>().ok()?.try_into().unwrap_or(0),
        start: f.get(19)?.parse().ok()?,
        ticks: f.get(11)?.parse::<u64>().ok()?.saturating_add(f.get(12)?.parse().ok()?),
        kernel: f.get(6)?.parse::<u64>().ok()? & PF_KTHREAD != 0,
    })
}

/// Reads a stat file (`/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat`).
pub(crate) fn read_stat(path: &Path, pid: i32) -> Option<Stat> {
    parse_stat(pid, &read(path).ok()?)
}

/// Reads a small `/proc` file whole. Unlike `fs::read_to_string` it asks no size first:
/// `/proc` files report 0, so that `statx` is a wasted syscall on every hot-path read.
pub(crate) fn read(path: impl AsRef<Path>) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = Vec::with_capacity(512);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        let len = buf.len();
        let spare = buf.capacity() - len;
        buf.resize(len + spare, 0);
        match file.read(&mut buf[len..]) {
            Ok(0) => {
                buf.truncate(len);
                break;
            }
            Ok(n) => buf.truncate(len + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => buf.truncate(len),
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The stat of `pid` now.
pub(crate) fn stat(pid: i32) -> Option<Stat> {
    read_stat(Path::new(&format!("/proc/{pid}/stat")), pid)
}

/// Every process visible now (zombies included), except entries that vanished mid-scan.
pub(crate) fn all() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(stat)
        .collect()
}

/// `root` and its descendants, found through `/proc/<pid>/task/<tid>/children` rather than
/// a scan of every process. `None` when the kernel has no children files, or past 4,096
/// processes (a caller then scans every process: a partial tree must not pass for the whole).
pub(crate) fn tree(root: i32) -> Option<Vec<Stat>> {
    const MAX: usize = 4096;
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([root]);
    let mut seen = HashSet::new();
    while let Some(pid) = queue.pop_front() {
        if out.len() >= MAX {
            return None;
        }
        if !seen.insert(pid) {
            continue;
        }
        let Some(s) = stat(pid) else { continue };
        out.push(s);
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            match read(t.path().join("children")) {
                Ok(list) => {
                    queue.extend(list.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && out.len() == 1 => {
                    return None;
                }
                Err(_) => {}
            }
        }
    }
    Some(out)
}

/// Pids of the processes adopted by this process as a subreaper (zombies included), and
/// the direct children of its main thread.
///
/// The kernel hands an orphan to the first live thread of the subreaper, which is the main
/// thread while it lives (it runs `main` for as long as conch does), so adopted processes
/// are on that one thread's list: one read instead of one per thread. Where the main thread
/// has no `children` file or has exited, every thread's list is read ([`children`]).
pub(crate) fn adopted() -> Vec<i32> {
    let me = std::process::id();
    let all_threads = || i32::try_from(me).map(children).unwrap_or_default();
    let Ok(text) = read(format!("/proc/{me}/task/{me}/children")) else { return all_threads() };
    let kids: Vec<i32> = text.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    // An embedder's main thread may have exited (a zombie thread): its children went to
    // another thread, where orphans now go too. Its list is then empty, so only an empty list
    // costs the look at its state.
    let main_gone = kids.is_empty()
        && read_stat(Path::new(&format!("/proc/{me}/task/{me}/stat")), 0).is_none_or(|s| !s.live());
    if main_gone { all_threads() } else { kids }
}

/// Pids of the children of `pid` (every thread's), zombies included. Falls back to a full
/// scan where the kernel has no `children` files.
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut found = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = read(t.path().join("children")) {
                found = true;
                out.extend(text.split_whitespace().filter_map(|n| n.parse::<i32>().ok()));
            }
        }
    }
    if !found {
        out = all().into_iter().filter(|s| s.ppid == pid).map(|s| s.pid).collect();
    }
    out
}

/// Marks the process tree of one spawn: every process whose environment carries `id` in
/// [`conch_env::CALL_ID_VAR`], or an id under it (`id.<more>`), and which started no
/// earlier than `since` (the spawn's own start time; older processes cannot be its
/// descendants, and are not read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) id: String,
    pub(crate) since: u64,
}

impl Tag {
    /// True when one space-separated `value` of the variable names this tag or one under it.
    fn in_value(&self, value: &[u8]) -> bool {
        let id = self.id.as_bytes();
        value.split(|b| *b == b' ').any(|t| {
            t.strip_prefix(id).is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'.'))
        })
    }

    /// True when an environment block (`NUL`-separated `NAME=value` entries) carries the tag.
    fn in_environ(&self, environ: &[u8]) -> bool {
        let name = conch_env::CALL_ID_VAR.as_bytes();
        environ.split(|b| *b == 0).any(|entry| {
            entry
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(b"="))
                .is_some_and(|value| self.in_value(value))
        })
    }
}

/// Whether `s` carries `tag`: `None` when the answer is not known yet (the environment was
/// empty, as it can be mid-exec, or the process went away while being read).
pub(crate) fn carries(s: &Stat, tag: &Tag) -> Option<bool> {
    match std::fs::read(format!("/proc/{}/environ", s.pid)) {
        Ok(env) if env.is_empty() => None,
        // The environment read is the process's only if the pid still names it.
        Ok(env) => stat(s.pid).filter(|now| now.start == s.start).map(|_| tag.in_environ(&env)),
        // Not ours to inspect (another user, a set-uid program): not ours to find either.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some(false),
        Err(_) => None,
    }
}

/// How long a process whose tag cannot be read yet is waited for before it counts as untagged.
/// An environment reads empty for the instant of an exec (between the new image replacing
/// the old and its environment being laid out), and for good when a process was started
/// with none (`env -i`); the first must not let a tagged process slip past a stop, the second
/// must not hold a stop for long.
const UNKNOWN_LIMIT: Duration = Duration::from_secs(1);

/// Remembers tag answers per process for one scan loop: an exec'd environment does not change,
/// so each process is read once.
///
/// An unknown answer (see [`carries`]) is no answer: the process counts as untagged for this
/// scan, but [`TagCache::unsure`] says so, and the loop scans again rather than conclude that
/// nothing is left. A process still unknown after [`UNKNOWN_LIMIT`] counts as untagged for good.
#[derive(Debug)]
pub(crate) struct TagCache {
    known: HashMap<ProcId, bool>,
    /// Processes whose answer was unknown, with when that was first seen.
    unknown: HashMap<ProcId, std::time::Instant>,
    /// Whether the current scan met an unknown answer still worth waiting for.
    unsure: bool,
    read: fn(&Stat, &Tag) -> Option<bool>,
}

impl Default for TagCache {
    fn default() -> Self {
        Self::reading(carries)
    }
}

impl TagCache {
    /// A cache that asks `read` for each answer (tests feed the unknown answers of an exec).
    fn reading(read: fn(&Stat, &Tag) -> Option<bool>) -> Self {
        Self { known: HashMap::new(), unknown: HashMap::new(), unsure: false, read }
    }

    /// Starts a scan: forgets whether the last one was unsure.
    fn begin_scan(&mut self) {
        self.unsure = false;
    }

    /// True when this scan met a process whose tag could not be read yet.
    fn unsure(&self) -> bool {
        self.unsure
    }

    /// True when `s` carries `tag` (read once per process, unknown answers read again).
    pub(crate) fn carries(&mut self, s: &Stat, tag: &Tag) -> bool {
        if s.start < tag.since || s.kernel {
            return false;
        }
        if let Some(known) = self.known.get(&s.id()) {
            return *known;
        }
        if let Some(answer) = (self.read)(s, tag) {
            self.known.insert(s.id(), answer);
            self.unknown.remove(&s.id());
            return answer;
        }
        let first = *self.unknown.entry(s.id()).or_insert_with(std::time::Instant::now);
        if first.elapsed() < UNKNOWN_LIMIT {
            self.unsure = true;
        } else {
            self.known.insert(s.id(), false);
        }
        false
    }
}

/// Pids whose process group is `pgid` (zombies included).
pub(crate) fn group_members(pgid: i32) -> Vec<i32> {
    all().into_iter().filter(|s| s.pgrp == pgid).map(|s| s.pid).collect()
}

/// One of our process groups: its id is the pid of the process that made it, so once that
/// leader is reaped and the group has emptied, the kernel may hand the id to a stranger's
/// new group. The leader's start time tells the two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) pgid: i32,
    /// The leader's start time, read while it was unreaped (`None`: unknown).
    pub(crate) leader_start: Option<u64>,
}

impl Group {
    /// True when a process other than our leader now owns the id: the group we made is
    /// gone for good, and everything in "the group" now is a stranger's.
    fn recycled(&self, procs: &[Stat]) -> bool {
        self.leader_start
            .is_some_and(|start| procs.iter().any(|s| s.pid == self.pgid && s.start != start))
    }
}

/// Signals `group` (and continues it, so stopped members can act on the signal) unless its
/// id names another process now; true when the signal was sent.
pub(crate) fn signal_group(group: Group, sig: Signal) -> bool {
    let ours = stat(group.pgid).is_none_or(|s| group.leader_start.is_none_or(|t| s.start == t));
    if ours {
        let _ = killpg(Pid::from_raw(group.pgid), sig);
        let _ = killpg(Pid::from_raw(group.pgid), Signal::SIGCONT);
    }
    ours
}

/// True while any non-zombie process is in `group` (and the id is still ours).
pub(crate) fn group_alive(group: Group) -> bool {
    // No member at all (not even a zombie): no scan needed.
    if killpg(Pid::from_raw(group.pgid), None) == Err(Errno::ESRCH) {
        return false;
    }
    if !Path::new("/proc/self").exists() {
        // Without /proc fall back to the kernel's view (zombies count as alive there).
        return killpg(Pid::from_raw(group.pgid), None).is_ok();
    }
    let procs = all();
    !group.recycled(&procs) && procs.iter().any(|s| s.pgrp == group.pgid && s.live())
}

/// True while the identified process exists and is not a zombie.
pub(crate) fn alive(id: ProcId) -> bool {
    stat(id.pid).is_some_and(|s| s.start == id.start && s.live())
}

/// The identity of `pid` now.
pub(crate) fn ident(pid: i32) -> Option<ProcId> {
    stat(pid).map(|s| s.id())
}

/// Sends `sig` to `id` only if that exact process is still there.
fn signal_id(id: ProcId, sig: Signal) {
    if alive(id) {
        let _ = kill(Pid::from_raw(id.pid), sig);
    }
}

/// The inode of a pipe end (both ends of a pipe share it).
pub(crate) fn pipe_inode(fd: impl AsFd) -> Option<u64> {
    nix::sys::stat::fstat(fd).ok().map(|s| s.st_ino)
}

/// True when `s` holds one of the pipes `inodes` as a process of its own: a spawn of this
/// process that has not exec'd yet never does (see [`unexeced_spawn`]).
fn holds_pipe_itself(s: &Stat, me: i32, inodes: &[u64]) -> bool {
    !inodes.is_empty() && holds_pipe(s.pid, inodes) && !unexeced_spawn(s, me)
}

/// True when `s` is a fork of this process that has not exec'd yet: a spawn in flight, for
/// this call or any other. Until its exec closes the CLOEXEC descriptors it holds a copy of
/// every descriptor of this process, every call's output pipes among them, so it would pass
/// for a holder of each (and be stopped at birth by any call stopping its holders). It is
/// still matched by what it really is (a call's group, session or tag).
fn unexeced_spawn(s: &Stat, me: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    static OWN_EXE: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let exe = |path: &str| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    s.ppid == me
        && OWN_EXE
            .get_or_init(|| exe("/proc/self/exe"))
            .is_some_and(|own| exe(&format!("/proc/{}/exe", s.pid)) == Some(own))
}

/// True when `pid` has an open fd on one of the pipes `inodes`.
fn holds_pipe(pid: i32, inodes: &[u64]) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    dir.flatten().any(|e| {
        std::fs::read_link(e.path()).ok().is_some_and(|target| {
            let t = target.to_string_lossy();
            t.strip_prefix("pipe:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|ino| inodes.contains(&ino))
        })
    })
}

/// Live descendants of `root` in `procs`, children before their parents (not `root`).
fn descendants(root: ProcId, procs: &[Stat]) -> Vec<ProcId> {
    if !procs.iter().any(|s| s.id() == root) {
        // The anchor is gone: its children were reparented and are no longer findable.
        return Vec::new();
    }
    let mut children: HashMap<i32, Vec<&Stat>> = HashMap::new();
    for s in procs.iter().filter(|s| s.live()) {
        children.entry(s.ppid).or_default().push(s);
    }
    fn walk(pid: i32, children: &HashMap<i32, Vec<&Stat>>, out: &mut Vec<ProcId>, depth: usize) {
        // Bounded: a pid loop cannot exist, but a scan taken mid-fork could look like one.
        if depth > 256 {
            return;
        }
        for c in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            walk(c.pid, children, out, depth + 1);
            out.push(c.id());
        }
    }
    let mut out = Vec::new();
    walk(root.pid, &children, &mut out, 0);
    out
}

/// What [`stop`] targets; a process matching any field is stopped.
#[derive(Clone, Debug, Default)]
pub(crate) struct Targets<'a> {
    /// Every member of this process group (also signalled as a group, which reaches
    /// members forked after the scan), for as long as the id is still ours.
    pub(crate) group: Option<Group>,
    /// Every process holding one of these pipes (found by inode, even after `setsid`).
    pub(crate) pipe_inodes: &'a [u64],
    /// Every descendant of this process (not the process itself).
    pub(crate) descendants_of: Option<ProcId>,
    /// Every member of this session, for as long as the id is still ours (a session id is
    /// its leader's pid, recycled like a group id: `pgid` here is the session id).
    pub(crate) session: Option<Group>,
    /// Nobody needs to know which processes were stopped: a group target is then signalled
    /// at once, before any scan (the report lists only what later scans found).
    pub(crate) unreported: bool,
    /// Every process carrying this tag, wherever it went (setsid, nohup, double forks); with
    /// `within`, wherever a process of the spawn can go (see [`scan`]).
    pub(crate) tagged: Option<&'a Tag>,
    /// Never matched or signalled, whatever else says (a leader frozen while its tree goes).
    pub(crate) spare: Option<ProcId>,
    /// Pipes whose holders are not targeted for holding them, but reported as holders when
    /// matched otherwise (checked once per process: a kill need not scan every process's
    /// fds to say truthfully that what it stopped held the output).
    pub(crate) report_pipes: &'a [u64],
    /// Every match is in the tree of this pid (a spawn's leader) or under an orphan: look
    /// only there ([`scan`]) instead of at every process.
    pub(crate) within: Option<i32>,
}

/// True when [`scan`] looks within one spawn rather than at every process.
fn scoped(targets: &Targets<'_>) -> bool {
    targets.within.is_some() && targets.pipe_inodes.is_empty()
}

/// The processes a look for `targets` reads: every process, or, when the targets lie
/// `within` one spawn and this process is a subreaper, that spawn's tree and the trees of
/// this process's unowned children. With the subreaper, a process a spawn started is either
/// still below its leader or was reparented here (to the main thread) when its parent died:
/// nowhere else (holders of target pipes excepted: a descriptor can be handed to anyone, so
/// those are looked for everywhere). The leader's tree is walked first and the orphans read
/// after, so a process reparented here meanwhile is on one list or the other; one reparented
/// mid-walk to a subreaper inside the tree (bubblewrap's pid 1) can sit under a node already
/// walked, so an empty scoped look counts only when the next one is empty too ([`scoped`]).
/// Not looked for: a process some other service started with the tag in its environment
/// (an `at` job, `systemd-run`), outside both. So a teardown costs its own tree, not
/// the machine's process count, and 1,000 terminals closing at once do not each read 1,000
/// trees.
fn scan(targets: &Targets<'_>) -> Vec<Stat> {
    // A pipe's holder may have been handed the descriptor by anyone (over a socket).
    let Some(leader) = targets.within.filter(|_| scoped(targets)) else { return all() };
    let Some(orphans) = crate::reaper::orphan_roots() else { return all() };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for root in std::iter::once(leader).chain(orphans) {
        let Some(found) = tree(root) else { return all() };
        out.extend(found.into_iter().filter(|s| seen.insert(s.pid)));
    }
    out
}

impl Targets<'_> {
    /// Live processes in `procs` that match, except this process and `spare`, with whether
    /// each holds a target pipe. `desc` is the descendant set when `descendants_of` is set.
    fn matching<'p>(
        &self,
        procs: &'p [Stat],
        desc: &HashSet<ProcId>,
        tags: &mut TagCache,
        also: &BTreeMap<ProcId, Stopped>,
    ) -> Vec<(ProcId, &'p Stat, bool)> {
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        tags.begin_scan();
        let group = self.live_group(procs);
        // A session id is its leader's pid, recycled like a group id.
        let session = self.session.filter(|g| !g.recycled(procs)).map(|g| g.pgid);
        let mut out = Vec::new();
        for s in procs.iter().filter(|s| s.live() && s.pid != me) {
            let id = s.id();
            if self.spare == Some(id) {
                continue;
            }
            let held = holds_pipe_itself(s, me, self.pipe_inodes);
            let matched = group == Some(s.pgrp)
                || session == Some(s.session)
                || desc.contains(&id)
                || held
                || self.tagged.is_some_and(|t| tags.carries(s, t));
            if matched || also.contains_key(&id) {
                out.push((id, s, held));
            }
        }
        out
    }

    /// The group id to match and signal as a group while it is still ours: once the id names
    /// a stranger's group, nothing is matched or signalled by group.
    fn live_group(&self, procs: &[Stat]) -> Option<i32> {
        self.group.filter(|g| !g.recycled(procs)).map(|g| g.pgid)
    }
}

/// True when no live process matches `targets`, and none might (a tag not readable yet).
fn quiet(targets: &Targets<'_>, tags: &mut TagCache) -> bool {
    let looks = if scoped(targets) { 2 } else { 1 };
    (0..looks).all(|_| {
        let procs = scan(targets);
        let desc = targets.descendants_of.map(|root| descendants(root, &procs)).unwrap_or_default();
        let desc: HashSet<ProcId> = desc.into_iter().collect();
        targets.matching(&procs, &desc, tags, &BTreeMap::new()).is_empty() && !tags.unsure()
    })
}

/// Probes until no live process matches `targets` (true) or `limit` passed (false).
pub(crate) async fn wait_quiet(targets: &Targets<'_>, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut tags = TagCache::default();
    loop {
        if quiet(targets, &mut tags) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// How deep each process of `procs` sits in their tree (init's children are 1), so sorting
/// deepest first signals every child before its parent, wherever it was reparented.
fn depths(procs: &[Stat]) -> HashMap<i32, usize> {
    let parent: HashMap<i32, i32> = procs.iter().map(|s| (s.pid, s.ppid)).collect();
    let mut out = HashMap::new();
    for s in procs {
        let (mut at, mut depth) = (s.pid, 0usize);
        // Bounded: a scan taken mid-fork could look like a loop.
        while let Some(&up) = parent.get(&at) {
            depth += 1;
            if up <= 1 || depth > 256 {
                break;
            }
            at = up;
        }
        out.insert(s.pid, depth);
    }
    out
}

/// One process [`stop`] signalled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stopped {
    pub(crate) id: ProcId,
    pub(crate) name: String,
    /// It held one of the target (or reported) pipes.
    pub(crate) held_output: bool,
    /// It was in the target group when first found.
    pub(crate) grouped: bool,
}

/// What [`stop`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StopReport {
    /// Every process signalled, in pid order.
    pub(crate) stopped: Vec<Stopped>,
    /// Processes still alive when the KILL phase ran out (empty: all proven gone).
    pub(crate) survivors: Vec<ProcId>,
}

/// Stops every live process matching `targets`: `first` (TERM or HUP, plus CONT so stopped
/// processes can act on it) once per process, rescanning for new matches, then KILL for
/// whatever is left once `grace` has passed, until the set is proven gone or
/// [`AFTER_KILL_LIMIT`] runs out. Children are signalled before their parents.
pub(crate) async fn stop(targets: &Targets<'_>, first: Signal, grace: Duration) -> StopReport {
    stop_reading(targets, first, grace, TagCache::default()).await
}

/// [`stop`] with the tag answers of `tags`.
async fn stop_reading(
    targets: &Targets<'_>,
    first: Signal,
    grace: Duration,
    mut tags: TagCache,
) -> StopReport {
    let term_until = tokio::time::Instant::now() + grace;
    let kill_until = term_until + AFTER_KILL_LIMIT;
    let mut tracked: BTreeMap<ProcId, Stopped> = BTreeMap::new();
    let mut signalled: HashSet<ProcId> = HashSet::new();
    let mut first_round = true;
    let only_group = targets.pipe_inodes.is_empty()
        && targets.descendants_of.is_none()
        && targets.session.is_none()
        && targets.tagged.is_none();
    let mut survivors = Vec::new();
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    // A plain group kill reports nothing, so it need not look before it signals: the group
    // signal goes out at once (after a cheap identity check), and the common case, a group
    // that is gone a moment later, never costs a scan of every process.
    if let Some(g) = targets.group.filter(|_| only_group && targets.unreported)
        && signal_group(g, first)
    {
        first_round = false;
    }
    let mut pause = MIN_PROBE_INTERVAL;
    let mut empty_once = false;
    loop {
        // A group with no member at all, and nothing else tracked alive, needs no scan.
        if only_group
            && targets
                .group
                .is_some_and(|g| killpg(Pid::from_raw(g.pgid), None) == Err(Errno::ESRCH))
            && tracked.keys().all(|id| !alive(*id))
        {
            break;
        }
        if only_group && !first_round && tracked.is_empty() && pause < PROBE_INTERVAL {
            // Give the signalled group a moment to go before the first scan.
            tokio::time::sleep(pause).await;
            pause *= 2;
            if tokio::time::Instant::now() < term_until {
                continue;
            }
        }
        let procs = scan(targets);
        let group = targets.live_group(&procs);
        let desc = targets.descendants_of.map(|root| descendants(root, &procs)).unwrap_or_default();
        let desc: HashSet<ProcId> = desc.into_iter().collect();
        let mut live = targets.matching(&procs, &desc, &mut tags, &tracked);
        if live.is_empty() {
            // A process whose tag reads as unknown (mid-exec) may be one of ours: look again.
            if tags.unsure() {
                tokio::time::sleep(PROBE_INTERVAL).await;
                continue;
            }
            // A scoped look proves the set gone only twice in a row (see `scan`).
            if scoped(targets) && !empty_once {
                empty_once = true;
                continue;
            }
            break;
        }
        empty_once = false;
        // Children first, wherever they were reparented: deepest in the tree first.
        let depth = depths(&procs);
        live.sort_by_key(|(id, _, _)| std::cmp::Reverse(depth.get(&id.pid).copied()));
        let now = tokio::time::Instant::now();
        if now >= kill_until {
            survivors = live.iter().map(|(id, _, _)| *id).collect();
            break;
        }
        let killing = now >= term_until;
        // KILL reaches the whole group in one step, before any single member: killed one by
        // one (children first), a leader waiting on its children could see them die and exit
        // by itself in between, and report a plain exit instead of the kill. Members found by
        // this scan are recorded below all the same.
        if killing
            && let Some(g) = group
            && live.iter().any(|(_, s, _)| s.pgrp == g)
        {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        for (id, s, held) in &live {
            let entry = tracked.entry(*id).or_insert_with(|| {
                // Once dead it may be this process's zombie (reparented here): collect it.
                crate::reaper::claim(*id);
                Stopped {
                    id: *id,
                    name: s.comm.clone(),
                    held_output: holds_pipe_itself(s, me, targets.report_pipes),
                    grouped: group == Some(s.pgrp),
                }
            });
            entry.held_output |= *held;
            if killing {
                signal_id(*id, Signal::SIGKILL);
            } else if signalled.insert(*id) {
                signal_id(*id, first);
                signal_id(*id, Signal::SIGCONT);
            }
        }
        // The group signal reaches members forked between the scan and the signals. It goes
        // after the scan, so every process it stops has been recorded first.
        if let Some(g) = group
            && live.iter().any(|(_, s, _)| s.pgrp == g)
        {
            if killing {
                // Again, for members forked since the one above.
                let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
            } else if first_round {
                let _ = killpg(Pid::from_raw(g), first);
                let _ = killpg(Pid::from_raw(g), Signal::SIGCONT);
            }
        }
        first_round = false;
        tokio::time::sleep(pause.min(PROBE_INTERVAL)).await;
        pause = (pause * 2).min(PROBE_INTERVAL);
    }
    let mut stopped: Vec<Stopped> = tracked.into_values().collect();
    stopped.sort_by_key(|s| s.id.pid);
    survivors.sort();
    StopReport { stopped, survivors }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_names_with_spaces_and_parens() {
        let s = parse_stat(
            42,
            "42 (a) (b c) S 1 42 42 34816 42 4194560 0 0 0 0 5 7 0 0 20 0 1 0 777 0",
        )
        .unwrap();
        assert_eq!(s.comm, "a) (b c");
        assert_eq!(
            (s.state, s.ppid, s.pgrp, s.session, s.tty_nr, s.start, s.ticks),
            ('S', 1, 42, 42, 34816, 777, 12)
        );
        let me = i32::try_from(std::process::id()).unwrap();
        let own = stat(me).expect("own stat");
        assert!(matches!(own.state, 'R' | 'S' | 'D'), "{own:?}");
        assert_eq!(own.pgrp, nix::unistd::getpgrp().as_raw());
        assert!(own.start > 0 && alive(own.id()));
        assert!(
            !alive(ProcId { pid: me, start: own.start + 1 }),
            "a different start time is another process"
        );
    }

    #[test]
    fn an_orphan_of_a_child_spawned_on_another_thread_is_adopted_by_the_main_thread() {
        crate::reaper::init();
        // Test bodies run on harness threads, never the main one: the spawning thread is
        // not the thread the orphan lands on.
        let out = std::thread::spawn(|| {
            std::process::Command::new("bash")
                .args(["-c", "(setsid sleep 30 >/dev/null 2>&1 & echo $!)"])
                .output()
                .expect("run bash")
        })
        .join()
        .expect("spawner thread");
        let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a pid");
        let me = i32::try_from(std::process::id()).unwrap();
        // The subshell exited before bash did, so the sleep is ours by now.
        let seen = adopted().contains(&pid);
        let parent = stat(pid).map(|s| s.ppid);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        assert_eq!(parent, Some(me), "the orphan was reparented to this subreaper");
        assert!(seen, "the main thread's list holds the orphan");
    }

    #[test]
    fn a_child_of_other_code_is_not_reaped_while_its_owner_still_reads_its_pipes() {
        crate::reaper::init();
        // bash exits at once; its background sleep holds stdout past the reaper's grace,
        // and `output` waits for bash only after EOF.
        let out = std::process::Command::new("bash")
            .args(["-c", "sleep 7 & exit 3"])
            .output()
            .expect("the exit status was not stolen");
        assert_eq!(out.status.code(), Some(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(unsafe_code)] // a pre_exec hook holds the spawn before its exec
    async fn a_spawn_of_this_process_before_its_exec_does_not_hold_a_calls_pipe() {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        // Until its exec closes the CLOEXEC descriptors, every fork of this process holds a
        // copy of each of them, so a spawn for one call sits for an instant on every other
        // call's output pipe. Held at that instant here (its pre_exec blocks on a gate),
        // it must not be taken for a process holding the pipe, and stopped.
        let (out, _out_w) = std::io::pipe().expect("a call's output pipe");
        let inode = pipe_inode(&out).expect("its inode");
        let (gate_r, mut gate_w) = std::io::pipe().expect("a gate");
        let gate = gate_r.as_raw_fd();
        let me = i32::try_from(std::process::id()).unwrap();
        let spawner = std::thread::spawn(move || {
            let mut cmd = std::process::Command::new("true");
            // SAFETY: read(2) on an inherited descriptor is async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    let mut b = [0u8; 1];
                    libc::read(gate, b.as_mut_ptr().cast(), 1);
                    Ok(())
                });
            }
            cmd.spawn().and_then(|mut c| c.wait())
        });
        let mut fresh = None;
        for _ in 0..3000 {
            fresh = all().into_iter().find(|s| s.ppid == me && holds_pipe(s.pid, &[inode]));
            if fresh.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fresh = fresh.expect("the spawn, held before its exec, holds the pipe");
        let targets = Targets { pipe_inodes: &[inode], ..Targets::default() };
        let report = stop(&targets, Signal::SIGTERM, Duration::from_secs(1)).await;
        std::io::Write::write_all(&mut gate_w, b"g").expect("open the gate");
        let status = spawner.join().expect("spawner").expect("the spawn ran");
        assert!(report.stopped.is_empty(), "stopped {:?} ({fresh:?})", report.stopped);
        assert!(status.success(), "the fresh spawn was killed: {status:?}");
        drop(gate_r);
    }

    /// The pid whose tag reads as unknown (mid-exec) for its first reads, then as ours.
    static EXECING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    static EXEC_READS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    fn mid_exec_then_tagged(s: &Stat, _: &Tag) -> Option<bool> {
        use std::sync::atomic::Ordering::SeqCst;
        if s.pid != EXECING.load(SeqCst) {
            return Some(false);
        }
        (EXEC_READS.fetch_add(1, SeqCst) >= 3).then_some(true)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tagged_process_read_mid_exec_is_still_stopped() {
        use std::sync::atomic::Ordering::SeqCst;
        // A detached tagged process is found by its tag alone. Caught mid-exec, its
        // environment reads empty: that scan finding nothing else must not end the stop.
        // Registered as owned, so its status stays this test's to take.
        let (child, _owned) = crate::reaper::owning(
            || std::process::Command::new("sleep").arg("1000").spawn(),
            |c| Some(c.id()),
        );
        let mut child = child.expect("sleep");
        let pid = i32::try_from(child.id()).unwrap();
        let since = stat(pid).expect("its stat").start;
        EXECING.store(pid, SeqCst);
        let tag = Tag { id: "mid-exec".into(), since };
        let targets = Targets { tagged: Some(&tag), ..Targets::default() };
        let tags = TagCache::reading(mid_exec_then_tagged);
        let report = stop_reading(&targets, Signal::SIGTERM, Duration::from_secs(5), tags).await;
        let status = child.try_wait().expect("its status");
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            report.stopped.iter().any(|s| s.id.pid == pid),
            "the process read mid-exec was stopped: {report:?}"
        );
        assert!(status.is_some(), "the stop proved it gone before returning");
        assert!(EXEC_READS.load(SeqCst) > 3, "its tag was read until known");
        assert!(report.survivors.is_empty(), "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_process_started_with_no_environment_is_left_alone_and_does_not_hold_a_stop() {
        // Its environment reads empty for good, like one mid-exec: after a bounded wait it
        // counts as untagged, and the stop ends without touching it.
        let (child, _owned) = crate::reaper::owning(
            || std::process::Command::new("env").args(["-i", "/bin/sleep", "1000"]).spawn(),
            |c| Some(c.id()),
        );
        let mut child = child.expect("env -i sleep");
        let pid = i32::try_from(child.id()).unwrap();
        let mut id = ident(pid).expect("its identity");
        // `env` execs `sleep`: wait until the exec is done and the environment reads empty.
        while std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default() != b"sleep\n" {
            tokio::time::sleep(Duration::from_millis(5)).await;
            id = ident(pid).expect("its identity");
        }
        let tag = Tag { id: "nobody".into(), since: id.start };
        let targets = Targets { tagged: Some(&tag), ..Targets::default() };
        let report = stop(&targets, Signal::SIGTERM, Duration::from_secs(5)).await;
        let untouched = alive(id);
        let _ = child.kill();
        let _ = child.wait();
        assert!(report.stopped.iter().all(|s| s.id != id), "{report:?}");
        assert!(untouched, "the untagged process still runs");
    }

    #[test]
    fn kernel_threads_are_told_by_their_flags() {
        let line = |flags: u64| format!("7 (k) S 2 0 0 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 5 0");
        assert!(parse_stat(7, &line(0x0020_8040)).expect("a kernel thread's stat").kernel);
        assert!(!parse_stat(7, &line(0x0040_0100)).expect("a process's stat").kernel);
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(!stat(me).expect("own stat").kernel);
    }

    #[test]
    fn truncated_stat_lines_are_misses() {
        assert_eq!(parse_stat(1, "1 (init) S 0"), None);
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn a_group_id_owned_by_another_process_is_recycled_not_ours() {
        let mk = |pid, pgrp, start| Stat {
            pid,
            comm: "x".into(),
            state: 'S',
            ppid: 1,
            pgrp,
            session: pgrp,
            tty_nr: 0,
            start,
            ticks: 0,
            kernel: false,
        };
        let ours = Group { pgid: 40, leader_start: Some(100) };
        // Our leader is gone but a member it left behind still runs: still our group.
        assert!(!ours.recycled(&[mk(41, 40, 120)]));
        assert!(!ours.recycled(&[mk(40, 40, 100), mk(41, 40, 120)]));
        // The id now belongs to a newer process (pid reuse): a stranger's group.
        assert!(ours.recycled(&[mk(40, 40, 900)]));
        assert!(!Group { pgid: 40, leader_start: None }.recycled(&[mk(40, 40, 900)]));
    }

    #[test]
    fn a_tag_matches_its_id_and_ids_under_it_only() {
        let tag = Tag { id: "c1.2".into(), since: 0 };
        let env = |v: &str| format!("A=1\0CONCH_CALL_ID={v}\0B=2\0").into_bytes();
        assert!(tag.in_environ(&env("c1.2")));
        assert!(tag.in_environ(&env("c1.2.7")), "a spawn under a provider's id");
        assert!(tag.in_environ(&env("outer.0.3 c1.2.7")), "inherited outer ids come first");
        assert!(!tag.in_environ(&env("c1.20")), "another provider's id sharing a prefix");
        assert!(!tag.in_environ(&env("c1")), "the id above is not this one");
        assert!(!tag.in_environ(b"XCONCH_CALL_ID=c1.2\0"), "another variable");
        assert!(!tag.in_environ(b"CONCH_CALL_IDS=c1.2\0"), "another variable");
        assert!(!tag.in_environ(b""));
    }

    #[test]
    fn depths_order_children_before_parents_across_reparenting() {
        let mk = |pid, ppid| Stat {
            pid,
            comm: "x".into(),
            state: 'S',
            ppid,
            pgrp: pid,
            session: pid,
            tty_nr: 0,
            start: 1,
            ticks: 0,
            kernel: false,
        };
        // 10 is this process; 11 a spawn; 12 an orphan reparented to it; 13 its child.
        let procs = vec![mk(1, 0), mk(10, 1), mk(11, 10), mk(12, 10), mk(13, 12)];
        let d = depths(&procs);
        assert!(d[&13] > d[&12] && d[&12] > d[&10] && d[&11] == d[&12], "{d:?}");
    }

    #[test]
    fn descendants_come_children_first() {
        let mk = |pid, ppid, state| Stat {
            pid,
            comm: format!("p{pid}"),
            state,
            ppid,
            pgrp: 1,
            session: 1,
            tty_nr: 0,
            start: u64::try_from(pid).unwrap(),
            ticks: 0,
            kernel: false,
        };
        let procs = vec![mk(1, 0, 'S'), mk(2, 1, 'S'), mk(3, 2, 'S'), mk(4, 1, 'Z'), mk(5, 9, 'S')];
        let root = procs[0].id();
        let d: Vec<i32> = descendants(root, &procs).iter().map(|p| p.pid).collect();
        assert_eq!(d, vec![3, 2], "grandchild before child; zombies and strangers left out");
        assert!(
            descendants(ProcId { pid: 1, start: 99 }, &procs).is_empty(),
            "a gone anchor finds nothing"
        );
    }
}
