//! Two subprocess-local runtimes in one process never touch each other's processes or exit
//! statuses (issue 22, item 1). The test binaries run many runtimes at once, and so will
//! embedders: one runtime's kills, terminal teardowns, shutdown sweeps and reaper passes must
//! reach only what that runtime started.
//!
//! Each runtime runs its own tokio runtime on its own thread (as separate tests do) and, for
//! many rounds, spawns PTY and pipe children with known exit codes, kills some, tears some
//! terminals down, and shuts its whole provider down while the other one is mid-round. A
//! long-lived witness of each side (a PTY and a pipe child) must survive every round of the
//! other side, and every child that was left alone must report exactly its own exit code.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conch_conformance::{start_time, within};
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_seams::{
    ExitStatus, OutputSpec, Process, SpawnSpec, StreamId, Subprocess, TerminalProcess,
    TerminalSpawnSpec,
};

const ROUNDS: usize = 25;

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// Reads a terminal to EOF.
async fn drain(t: &dyn TerminalProcess) -> String {
    let mut out = Vec::new();
    while let Some(chunk) = within("terminal output", t.read_chunk()).await.expect("read") {
        out.extend_from_slice(&chunk);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn code(status: &ExitStatus) -> Option<i32> {
    status.signal.is_none().then_some(status.code).flatten()
}

/// One round of one side: PTYs and pipes that exit by themselves with their own codes, a PTY
/// and a pipe that are killed, and (when `shutdown`) the whole provider shut down at the end.
async fn round(side: &str, round: usize, p: &LocalSubprocess) {
    let tmp = std::env::temp_dir();
    let mut terminals = Vec::new();
    let mut pipes = Vec::new();
    for i in 0..3 {
        let want = (round * 7 + i) % 100 + 1;
        let t = p
            .spawn_terminal(TerminalSpawnSpec::new(
                sh(&format!("echo {side}-{round}-{i}; exit {want}")),
                &tmp,
            ))
            .await
            .expect("spawn_terminal");
        terminals.push((t, want));
        let spec = SpawnSpec::new(sh(&format!("echo {side}; exit {want}")), &tmp)
            .with_stdout(OutputSpec::Collect { max_bytes: 4096, spill_cap: 0 });
        pipes.push((p.spawn(spec).await.expect("spawn"), want));
    }
    // Victims: killed by this side while the other side runs its own round.
    let victim_t =
        p.spawn_terminal(TerminalSpawnSpec::new(sh("exec sleep 600"), &tmp)).await.unwrap();
    let victim_p = p.spawn(SpawnSpec::new(sh("sleep 600"), &tmp)).await.unwrap();
    for (t, want) in &terminals {
        let text = drain(t.as_ref()).await;
        let status = within("terminal exit", t.wait()).await.unwrap();
        assert_eq!(
            code(&status),
            Some(i32::try_from(*want).unwrap()),
            "{side} round {round}: a PTY child that exits by itself reports its own code \
             (got {status:?}, output {text:?})"
        );
    }
    for (proc, want) in &pipes {
        let status = within("pipe exit", proc.wait()).await.unwrap();
        let out = proc.collected(StreamId::Stdout).map(|c| c.text).unwrap_or_default();
        assert_eq!(
            code(&status),
            Some(i32::try_from(*want).unwrap()),
            "{side} round {round}: a pipe child that exits by itself reports its own code \
             (got {status:?}, output {out:?})"
        );
        assert_eq!(out.trim(), side);
    }
    let report = within("terminate", victim_t.terminate(Duration::from_millis(200)))
        .await
        .expect("terminate");
    assert!(report.survivors.is_empty(), "{report:?}");
    victim_p.kill().await.expect("the kill is delivered");
    let status = within("killed pipe", victim_p.wait()).await.unwrap();
    assert!(status.signal.is_some(), "{side} round {round}: the killed child: {status:?}");
}

/// A long-lived child of one side, checked after every round of the other side.
struct Witness {
    pty: Arc<dyn TerminalProcess>,
    pipe: Arc<dyn Process>,
    pids: [(i32, u64); 2],
}

impl Witness {
    async fn start(p: &LocalSubprocess) -> Self {
        let tmp = std::env::temp_dir();
        let pty = p.spawn_terminal(TerminalSpawnSpec::new(sh("exec cat"), &tmp)).await.unwrap();
        let pipe = p.spawn(SpawnSpec::new(sh("exec sleep 600"), &tmp)).await.unwrap();
        let pid = |id: Option<u32>| i32::try_from(id.unwrap()).unwrap();
        let (a, b) = (pid(pty.pid()), pid(pipe.pid()));
        let pids = [(a, start_time(a).unwrap()), (b, start_time(b).unwrap())];
        Self { pty, pipe, pids }
    }

    fn assert_alive(&self, what: &str) {
        assert!(self.pty.try_status().is_none(), "{what}: the PTY witness lost its status");
        assert!(self.pipe.try_status().is_none(), "{what}: the pipe witness lost its status");
        for (pid, start) in self.pids {
            assert_eq!(start_time(pid), Some(start), "{what}: witness {pid} was killed");
        }
    }
}

/// One side: `ROUNDS` rounds on a fresh provider each (every round ends with the provider's
/// shutdown, whose sweep runs while the other side spawns), then checks its witness.
fn side(name: &'static str, other_busy: Arc<AtomicBool>, mine_busy: Arc<AtomicBool>) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let keeper = LocalSubprocess::new(LocalConfig::default());
        let witness = Witness::start(&keeper).await;
        mine_busy.store(true, Ordering::Release);
        for r in 0..ROUNDS {
            let p = LocalSubprocess::new(LocalConfig::default());
            round(name, r, &p).await;
            within("shutdown", p.shutdown()).await;
            witness.assert_alive(&format!("{name} after its own round {r}"));
        }
        mine_busy.store(false, Ordering::Release);
        // The other side may still be running rounds; our witness must outlive them all.
        within("the other side to finish", async {
            while other_busy.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        witness.assert_alive(&format!("{name} after both sides' rounds"));
        within("keeper shutdown", keeper.shutdown()).await;
        for (pid, start) in witness.pids {
            assert_ne!(start_time(pid), Some(start), "{name}: its own shutdown stops its witness");
        }
    });
}

#[test]
fn two_runtimes_in_one_process_never_touch_each_others_processes() {
    let a_busy = Arc::new(AtomicBool::new(true));
    let b_busy = Arc::new(AtomicBool::new(true));
    let a = {
        let (o, m) = (Arc::clone(&b_busy), Arc::clone(&a_busy));
        std::thread::spawn(move || side("a", o, m))
    };
    let b = {
        let (o, m) = (Arc::clone(&a_busy), Arc::clone(&b_busy));
        std::thread::spawn(move || side("b", o, m))
    };
    let ra = a.join();
    let rb = b.join();
    if let Err(e) = ra {
        std::panic::resume_unwind(e);
    }
    if let Err(e) = rb {
        std::panic::resume_unwind(e);
    }
}
