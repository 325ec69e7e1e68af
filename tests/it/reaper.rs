//! subprocess-local as a child subreaper: orphans of its calls reparent to this process
//! rather than to init, and their zombies are reaped here.

use std::sync::Arc;
use std::time::Duration;

use conch_conformance::{start_time, within};
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_seams::{OutputSpec, SpawnSpec, StreamId, Subprocess};

/// The parent pid and state of `pid` now.
fn parent_and_state(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, state))
}

async fn run(p: &dyn Subprocess, script: &str) -> String {
    let spec = SpawnSpec::new(vec!["sh".into(), "-c".into(), script.into()], std::env::temp_dir())
        .with_stdout(OutputSpec::Collect { max_bytes: 1 << 16, spill_cap: 1 << 20 });
    let proc = p.spawn(spec).await.expect("spawn");
    within("the script to settle", proc.wait()).await.expect("the provider keeps track of it");
    proc.collected(StreamId::Stdout).expect("stdout is collected").text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_reparents_to_conch_and_its_zombie_is_reaped() {
    let p = Arc::new(LocalSubprocess::new(LocalConfig::default()));
    // Waiting for EOF stops nothing, so the orphan outlives its parent's settlement.
    let out = run(p.as_ref(), "sleep 1000 >/dev/null 2>&1 & echo $!").await;
    let pid: i32 = out.trim().parse().unwrap_or_else(|_| panic!("a pid: {out:?}"));
    let start = start_time(pid).expect("the orphan is alive");
    let me = i32::try_from(std::process::id()).unwrap();
    let reparented = within("the orphan to reparent", async {
        loop {
            match parent_and_state(pid) {
                Some((ppid, _)) if start_time(pid) == Some(start) && ppid != 1 && ppid != me => {}
                other => return other.map(|(ppid, _)| ppid),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(reparented, Some(me), "the orphan {pid} reparented to the subreaper, not init");
    // Its death makes a zombie whose parent is this process: conch must collect it.
    // Signalled only while the pid still names it (sleep's comm has no spaces to split).
    let kill = format!("[ \"$(cut -d' ' -f22 /proc/{pid}/stat)\" = {start} ] && kill -KILL {pid}");
    run(p.as_ref(), &kill).await;
    // A zombie keeps its start time: the entry vanishing means it was reaped.
    within("the zombie to be reaped", async {
        while start_time(pid) == Some(start) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    p.shutdown().await;
}
