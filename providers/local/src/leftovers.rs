//! Processes a command left behind: members of its process group that outlived the direct
//! child, and any process (even one that escaped with `setsid`) still holding one of its
//! output pipes. Both are found from /proc and stopped TERM → grace → KILL.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::Duration;

use conch_seams::Leftover;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How often the set is rescanned while it is being stopped.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// After KILL, how long to keep proving the set is gone before giving up.
const AFTER_KILL_LIMIT: Duration = Duration::from_secs(30);

/// The inode of a pipe end (both ends of a pipe share it).
pub(crate) fn pipe_inode(fd: impl AsFd) -> Option<u64> {
    nix::sys::stat::fstat(fd).ok().map(|s| s.st_ino)
}

/// One live process found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    pid: i32,
    /// Start time in clock ticks: (pid, start) names one process even across pid reuse.
    start: u64,
    name: String,
    in_group: bool,
    held_output: bool,
}

/// Parses `/proc/<pid>/stat` into (name, state, pgrp, start time).
fn stat(pid: &str) -> Option<(String, char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let name = text.get(text.find('(')? + 1..text.rfind(')')?)?.to_string();
    let fields = crate::probe::stat_fields(&text)?;
    // After comm: state (field 3), pgrp (field 5), starttime (field 22).
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((name, state, pgrp, start))
}

fn holds_pipe(pid: &str, inodes: &[u64]) -> bool {
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

/// Every live (non-zombie) process in group `pgid` or holding one of `inodes`, except us.
fn scan(pgid: i32, inodes: &[u64]) -> Vec<Found> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str() else { continue };
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some((comm, state, pgrp, start)) = stat(pid) else { continue };
        if state == 'Z' || state == 'X' {
            continue;
        }
        let in_group = pgrp == pgid;
        let held_output = !inodes.is_empty() && holds_pipe(pid, inodes);
        if in_group || held_output {
            let Ok(pid) = pid.parse() else { continue };
            out.push(Found { pid, start, name: comm, in_group, held_output });
        }
    }
    out
}

/// Stops every process in group `pgid` or holding one of `inodes`: TERM (and CONT, so
/// stopped ones can act on it), rescanning for new members, then KILL once `grace` has
/// passed. Returns each process stopped, in pid order.
pub(crate) async fn stop(pgid: i32, inodes: &[u64], grace: Duration) -> Vec<Leftover> {
    let term_until = tokio::time::Instant::now() + grace;
    let kill_until = term_until + AFTER_KILL_LIMIT;
    let mut seen: BTreeMap<(i32, u64), Leftover> = BTreeMap::new();
    loop {
        let found = scan(pgid, inodes);
        if found.is_empty() {
            break;
        }
        let now = tokio::time::Instant::now();
        if now >= kill_until {
            break;
        }
        let killing = now >= term_until;
        for f in &found {
            let pid = Pid::from_raw(f.pid);
            let first = !seen.contains_key(&(f.pid, f.start));
            let entry = seen.entry((f.pid, f.start)).or_insert_with(|| Leftover {
                pid: f.pid.unsigned_abs(),
                name: f.name.clone(),
                held_output: false,
            });
            entry.held_output |= f.held_output;
            if killing {
                let _ = kill(pid, Signal::SIGKILL);
            } else if first {
                let _ = kill(pid, Signal::SIGTERM);
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
        if killing && found.iter().any(|f| f.in_group) {
            // Reaches members forked between the scan and the signals.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    let mut out: Vec<Leftover> = seen.into_values().collect();
    out.sort_by_key(|l| l.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_names_with_spaces_and_parens() {
        let me = std::process::id().to_string();
        let (name, state, pgrp, start) = stat(&me).expect("own stat");
        assert!(!name.is_empty());
        assert!(matches!(state, 'R' | 'S' | 'D'), "{state}");
        assert_eq!(pgrp, nix::unistd::getpgrp().as_raw());
        assert!(start > 0);
    }
}
