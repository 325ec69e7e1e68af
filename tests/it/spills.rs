//! Spill limits over real processes: `subprocess-local`'s total cap and age limit evict
//! finished spills oldest first, never one a live process still writes, and the tools then
//! say the full output is gone instead of naming a path.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use conch_registry::Runtime;
use conch_seams::{ErrorCode, JobStatus, Owner};
use serde_json::json;

use crate::owner;
use crate::tools::{call, eventually};

/// The job_output line for a read whose spill was evicted: what memory no longer holds is
/// counted, and the full output is said to be gone.
const EVICTED: &str = "earlier bytes omitted; the full output was evicted from the spill \
                       directory (spill limits)]";
/// Bytes each job writes: well past bash-local's 64 000-byte tail, so every job spills.
const JOB_BYTES: u64 = 200_000;

/// A runtime whose spills live under `parent`, with these `subprocess-local` limits.
fn limited(parent: &Path, limits: &str) -> Runtime {
    crate::runtime(&format!(
        "plugins:\n  subprocess-local: {{ spill_dir: {parent:?}, {limits} }}\n  bash-local: {{}}\n  jobs: {{}}\n  tool-bash: {{}}\n  tool-jobs: {{}}\n"
    ))
}

/// A command writing `bytes` bytes of `c`.
fn writes(bytes: u64, c: char) -> String {
    format!("head -c {bytes} /dev/zero | tr '\\0' {c}")
}

async fn start_job(rt: &Runtime, o: &Arc<Owner>, command: &str) -> String {
    let out = call(rt, o, "bash", json!({"command": command, "run_in_background": true})).await;
    out.structured.unwrap()["job_id"].as_str().unwrap().to_string()
}

async fn settle(rt: &Runtime, o: &Owner, id: &str) {
    let jobs = rt.seams().jobs.clone().unwrap();
    let info = conch_conformance::within("the job to settle", async {
        loop {
            let info = jobs.wait(o, id, Duration::from_secs(60)).await.unwrap();
            if info.status != JobStatus::Running {
                return info;
            }
        }
    })
    .await;
    assert_eq!(info.status, JobStatus::Completed, "{info:?}");
}

/// The spill a job's non-consuming snapshot names, if any.
fn spill_of(rt: &Runtime, o: &Owner, id: &str) -> Option<PathBuf> {
    let jobs = rt.seams().jobs.clone().unwrap();
    jobs.peek_output(o, id).unwrap().1.spill.map(|s| s.path)
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Waits until job `id` names a spill holding `bytes` bytes (it is still running).
async fn spilled(rt: &Runtime, o: &Owner, id: &str, bytes: u64) -> PathBuf {
    let mut path = None;
    eventually("the job's spill to hold its output", || {
        path = spill_of(rt, o, id);
        path.as_deref().is_some_and(|p| len(p) == bytes)
    })
    .await;
    path.unwrap()
}

/// Asserts that `job_output` reports the job's spill as evicted, naming no path.
async fn assert_reported_evicted(rt: &Runtime, o: &Arc<Owner>, id: &str, path: &Path) {
    assert!(!path.exists(), "{path:?} was evicted");
    let out = call(rt, o, "job_output", json!({"job_id": id})).await;
    let line = out.text.lines().nth(1).unwrap_or_default();
    assert!(
        line.starts_with("[output truncated; ") && line.ends_with(EVICTED),
        "{id}: {}",
        out.text
    );
    assert!(!out.text.contains(&path.display().to_string()), "{}", out.text);
    let s = out.structured.unwrap();
    assert_eq!((s["spill_path"].clone(), s["spill_evicted"].clone()), (json!(null), json!(true)));
    assert!(!s["output"].as_str().unwrap().is_empty(), "the tail in memory is still there");
}

/// A fifo the test opens for writing to let a job waiting on it (`read < fifo`) go on.
struct Gate(PathBuf);

impl Gate {
    async fn new(rt: &Runtime, o: &Arc<Owner>, dir: &Path, name: &str) -> Self {
        let path = dir.join(name);
        call(rt, o, "bash", json!({"command": format!("mkfifo {}", path.display())})).await;
        Self(path)
    }

    /// The job's part: block until the gate opens.
    fn wait(&self) -> String {
        format!("read -r _ < {}", self.0.display())
    }

    async fn open(&self) {
        let path = self.0.clone();
        // Opening a fifo for writing blocks until the reader is there, so it runs off the
        // async threads, bounded by the test's patience.
        let opened = tokio::task::spawn_blocking(move || {
            std::fs::OpenOptions::new().write(true).open(path)?.write_all(b"go\n")
        });
        conch_conformance::within("the gate to open", opened).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_total_cap_the_oldest_finished_spill_is_evicted_first() {
    let parent = tempfile::tempdir().unwrap();
    let rt = limited(parent.path(), "max_spill_total_bytes: 500000");
    let (o, _) = owner("s");
    let mut jobs = Vec::new();
    for c in ['a', 'b', 'c'] {
        let id = start_job(&rt, &o, &writes(JOB_BYTES, c)).await;
        settle(&rt, &o, &id).await;
        let path = spill_of(&rt, &o, &id);
        jobs.push((id, path.expect("a finished job names its complete spill")));
        if jobs.len() == 2 {
            // 400 KB is within the cap: both spills stay.
            assert!(jobs.iter().all(|(_, p)| len(p) == JOB_BYTES), "{jobs:?}");
        }
    }
    // The third spill took the total past 500 KB: the oldest went, the other two stay.
    assert_reported_evicted(&rt, &o, &jobs[0].0, &jobs[0].1).await;
    for (id, path) in &jobs[1..] {
        assert_eq!(len(path), JOB_BYTES, "{path:?} is complete");
        let out = call(&rt, &o, "job_output", json!({"job_id": id})).await;
        let named = format!("[output truncated; full output: {}]", path.display());
        assert_eq!(out.text.lines().nth(1), Some(named.as_str()), "{}", out.text);
    }
    // Spawns sweep too; nothing more has to go.
    call(&rt, &o, "bash", json!({"command": "true"})).await;
    assert!(jobs[1..].iter().all(|(_, p)| len(p) == JOB_BYTES));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_a_live_process_still_writes_is_not_evicted_even_alone_over_the_cap() {
    let parent = tempfile::tempdir().unwrap();
    let rt = limited(parent.path(), "max_spill_total_bytes: 300000");
    let (o, _) = owner("s");
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(&rt, &o, dir.path(), "gate").await;
    let done = start_job(&rt, &o, &writes(JOB_BYTES, 'd')).await;
    settle(&rt, &o, &done).await;
    let done_spill = spill_of(&rt, &o, &done).unwrap();
    // 400 KB alone is past the 300 KB cap; the process then waits at the gate.
    let live =
        start_job(&rt, &o, &format!("{}; {}", writes(2 * JOB_BYTES, 'l'), gate.wait())).await;
    let live_spill = spilled(&rt, &o, &live, 2 * JOB_BYTES).await;
    // The finished spill made room; the live one is over the cap but still being written.
    assert_reported_evicted(&rt, &o, &done, &done_spill).await;
    call(&rt, &o, "bash", json!({"command": "true"})).await;
    assert_eq!(len(&live_spill), 2 * JOB_BYTES, "a sweep on spawn leaves a live spill alone");
    assert_eq!(spill_of(&rt, &o, &live).as_deref(), Some(live_spill.as_path()));
    // Settled, it can never fit under the cap and goes at once.
    gate.open().await;
    settle(&rt, &o, &live).await;
    assert_reported_evicted(&rt, &o, &live, &live_spill).await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_spills_past_the_age_limit_are_evicted_and_live_ones_are_not() {
    let parent = tempfile::tempdir().unwrap();
    let rt = limited(parent.path(), "max_spill_age_ms: 200");
    let (o, _) = owner("s");
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(&rt, &o, dir.path(), "gate").await;
    let done_gate = Gate::new(&rt, &o, dir.path(), "done-gate").await;
    let live = start_job(&rt, &o, &format!("{}; {}", writes(JOB_BYTES, 'l'), gate.wait())).await;
    let live_spill = spilled(&rt, &o, &live, JOB_BYTES).await;
    // This one waits too, so its path is known before the age limit can take it.
    let done =
        start_job(&rt, &o, &format!("{}; {}", writes(JOB_BYTES, 'd'), done_gate.wait())).await;
    let done_spill = spilled(&rt, &o, &done, JOB_BYTES).await;
    done_gate.open().await;
    settle(&rt, &o, &done).await;
    eventually("the periodic sweep to evict the aged spill", || !done_spill.exists()).await;
    // The live spill was last written before the evicted one: only liveness kept it.
    assert_eq!(len(&live_spill), JOB_BYTES);
    assert_reported_evicted(&rt, &o, &done, &done_spill).await;
    gate.open().await;
    settle(&rt, &o, &live).await;
    eventually("the settled spill to age out", || !live_spill.exists()).await;
    assert_reported_evicted(&rt, &o, &live, &live_spill).await;
    rt.shutdown().await;
}

#[test]
fn spill_limits_must_be_positive() {
    for key in ["max_spill_total_bytes", "max_spill_age_ms"] {
        let err = conch::build_runtime_from_yaml(
            "limits.yaml",
            &format!("plugins:\n  subprocess-local: {{ {key}: 0 }}\n"),
            conch_env::ShellEnv::new("/tmp/conch-test-home".into()),
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidComposition, "{err}");
        assert!(
            err.to_string()
                .contains(&format!("key `plugins.subprocess-local.{key}`: must be greater than 0")),
            "{err}"
        );
    }
}
