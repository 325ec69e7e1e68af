//! Process-group tree kill with a liveness proof read from /proc.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How often the group is probed while waiting for it to disappear.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// After KILL, how long to keep proving the group is gone before giving up.
const AFTER_KILL_LIMIT: Duration = Duration::from_secs(30);

/// True while any non-zombie process has process group `pgid`. Zombies have no
/// executable work left, so they count as gone; this matters where nobody reaps orphans.
pub fn group_alive(pgid: i32) -> bool {
    // No member at all (not even a zombie): skip the /proc scan.
    if killpg(Pid::from_raw(pgid), None) == Err(nix::errno::Errno::ESRCH) {
        return false;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        // Without /proc fall back to the kernel's view (zombies count as alive there).
        return killpg(Pid::from_raw(pgid), None).is_ok();
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else { continue };
        let Some(fields) = crate::probe::stat_fields(&stat) else { continue };
        let state = fields.first().copied().unwrap_or("");
        let pgrp: i32 = fields.get(2).and_then(|f| f.parse().ok()).unwrap_or(0);
        if pgrp == pgid && state != "Z" && state != "X" {
            return true;
        }
    }
    false
}

/// Probes until group `pgid` is gone (true) or `limit` passed (false).
pub(crate) async fn wait_gone(pgid: i32, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// TERM the group, wait up to `grace` for it to disappear, KILL, then keep probing until
/// it is gone. Returns true once the group is proven gone.
pub async fn kill_tree(pgid: i32, grace: Duration) -> bool {
    let pg = Pid::from_raw(pgid);
    if killpg(pg, Signal::SIGTERM).is_err() {
        return !group_alive(pgid);
    }
    // Stopped members cannot act on TERM until continued.
    let _ = killpg(pg, Signal::SIGCONT);
    if wait_gone(pgid, grace).await {
        return true;
    }
    let _ = killpg(pg, Signal::SIGKILL);
    wait_gone(pgid, AFTER_KILL_LIMIT).await
}
