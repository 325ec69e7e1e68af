//! Process-tree snapshots and teardown with PID + start-time identity, read from /proc.

use std::collections::HashMap;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A process identity that survives pid reuse: pid plus start time (clock ticks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ident {
    pub(crate) pid: i32,
    start: u64,
}

struct Stat {
    ppid: i32,
    state: char,
    start: u64,
}

fn stat(pid: i32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parens: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')' : state(3) ppid(4) ... starttime is field 22 → index 19 here.
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// True while the identified process exists and is not a zombie.
pub(crate) fn alive(id: Ident) -> bool {
    matches!(stat(id.pid), Some(s) if s.start == id.start && s.state != 'Z' && s.state != 'X')
}

/// The identity of `pid` now.
pub(crate) fn ident(pid: i32) -> Option<Ident> {
    stat(pid).map(|s| Ident { pid, start: s.start })
}

/// Every live descendant of `root`, children before their parents.
pub(crate) fn descendants(root: i32) -> Vec<Ident> {
    let mut children: HashMap<i32, Vec<(i32, u64)>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(s) = stat(pid)
                && s.state != 'Z'
            {
                children.entry(s.ppid).or_default().push((pid, s.start));
            }
        }
    }
    let mut out = Vec::new();
    fn walk(p: i32, children: &HashMap<i32, Vec<(i32, u64)>>, out: &mut Vec<Ident>, depth: usize) {
        if depth > 64 {
            return;
        }
        for &(c, start) in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            walk(c, children, out, depth + 1);
            out.push(Ident { pid: c, start });
        }
    }
    walk(root, &children, &mut out, 0);
    out
}

fn signal(id: Ident, sig: Signal) {
    // Identity check first so a reused pid is never signalled.
    if alive(id) {
        let _ = kill(Pid::from_raw(id.pid), sig);
    }
}

async fn wait_all_gone(ids: &[Ident], limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if ids.iter().all(|i| !alive(*i)) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Tears down every descendant of `root` (not `root` itself): snapshot children-first, TERM,
/// wait up to `grace`, rescan for forks made meanwhile, KILL, then verify. Returns the pids
/// still alive (empty on success).
pub(crate) async fn kill_descendants(root: i32, grace: Duration) -> Vec<i32> {
    let first = descendants(root);
    for id in &first {
        signal(*id, Signal::SIGTERM);
        signal(*id, Signal::SIGCONT);
    }
    wait_all_gone(&first, grace).await;
    let mut all = first;
    for id in descendants(root) {
        if !all.contains(&id) {
            all.push(id);
        }
    }
    for id in &all {
        signal(*id, Signal::SIGKILL);
    }
    wait_all_gone(&all, Duration::from_secs(10)).await;
    all.iter().filter(|i| alive(**i)).map(|i| i.pid).collect()
}
