//! Runs one case at a time outside `cargo test` (for `conch conformance`): each in a tokio
//! task of its own, so a failing case (a panic) is caught as the task's `JoinError` and
//! reported with its message and where it was raised, and bounded by a deadline, so a case
//! that hangs fails instead of stopping the run.
//!
//! `run_case` runs one case in a tokio task of its own with a deadline: a panic is caught as the
//! task's `JoinError`, and a panic hook, installed on first use, records where it was raised and
//! keeps case panics off stderr (other panics go to the previous hook). `same_world` checks that a
//! subprocess provider's processes are visible in this process's `/proc` (same boot id and pid
//! namespace), which the cases need.

use std::future::Future;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use conch_seams::{OutputSpec, SpawnSpec, StreamId, Subprocess};
use conch_sync::LockExt;

use crate::Outcome;

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It held.
    Pass,
    /// It failed: the panic message and where it was raised, or the deadline it ran past.
    Fail(String),
    /// It could not be checked here, and why.
    Skip(String),
}

impl Verdict {
    /// `PASS`, `FAIL` or `SKIP`.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail(_) => "FAIL",
            Verdict::Skip(_) => "SKIP",
        }
    }

    /// The failure message or skip reason.
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Pass => None,
            Verdict::Fail(m) | Verdict::Skip(m) => Some(m),
        }
    }
}

tokio::task_local! {
    /// Set while a case's own task runs: where its panic was raised, filled by the hook.
    static PANIC_SITE: Arc<Mutex<Option<String>>>;
}

/// Installs (once) a panic hook that, for a panic raised in a case's own task, records the
/// location and prints nothing (the message goes into the report instead); any other panic
/// goes to the hook that was there before.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let site = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            let in_case = PANIC_SITE
                .try_with(|slot| {
                    *slot.locked() = site.clone();
                })
                .is_ok();
            if !in_case {
                previous(info);
            }
        }));
    });
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked with a non-string payload".to_owned()
    }
}

/// Runs `case` in a task of its own and judges it: `Ok` passes, `Err(Skip)` skips, a panic
/// fails with its message (and location), and running past `limit` fails (the task is
/// aborted; what it started is for the caller to stop, e.g. by shutting its providers down).
/// Returns the verdict and how long the case ran.
pub async fn run_case<F>(limit: Duration, case: F) -> (Verdict, Duration)
where
    F: Future<Output = Outcome> + Send + 'static,
{
    install_panic_hook();
    let site = Arc::new(Mutex::new(None));
    let started = Instant::now();
    let mut task = tokio::spawn(PANIC_SITE.scope(Arc::clone(&site), case));
    let joined = tokio::time::timeout(limit, &mut task).await;
    let took = started.elapsed();
    let verdict = match joined {
        Ok(Ok(Ok(()))) => Verdict::Pass,
        Ok(Ok(Err(skip))) => Verdict::Skip(skip.reason),
        Ok(Err(e)) if e.is_panic() => {
            let text = panic_text(e.into_panic().as_ref());
            match site.locked().take() {
                Some(at) => Verdict::Fail(format!("{text} (at {at})")),
                None => Verdict::Fail(text),
            }
        }
        Ok(Err(e)) => Verdict::Fail(format!("the case's task ended without a result: {e}")),
        Err(_) => {
            task.abort();
            Verdict::Fail(format!("did not finish within {} ms", limit.as_millis()))
        }
    };
    (verdict, took)
}

/// Checks that `sub` runs its processes where this process can judge them: the cases read
/// `/proc` here as their oracle (pids, process groups, what survived), so the provider's
/// processes must be on this machine (same boot) and in this pid namespace. A remote sandbox
/// qualifies when its daemon runs here (on loopback).
///
/// # Errors
/// Why the provider's world is not this one, or why that could not be told.
pub async fn same_world(sub: &dyn Subprocess) -> Result<(), String> {
    let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned());
    let boot = read("/proc/sys/kernel/random/boot_id")
        .map_err(|e| format!("cannot read this machine's boot id: {e}"))?;
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map_err(|e| format!("cannot read this process's pid namespace: {e}"))?
        .display()
        .to_string();
    let script = "cat /proc/sys/kernel/random/boot_id; readlink /proc/self/ns/pid";
    let spec = SpawnSpec::new(vec!["sh".into(), "-c".into(), script.into()], std::env::temp_dir())
        .with_stdout(OutputSpec::Collect { max_bytes: 4096, spill_cap: 1 << 16 })
        .with_stderr(OutputSpec::MergeIntoStdout);
    let look = async {
        let proc = sub.spawn(spec).await.map_err(|e| e.to_string())?;
        proc.wait().await.map_err(|e| e.to_string())?;
        let out = proc.read(StreamId::Stdout, 0, 4096).map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8_lossy(&out.data).into_owned())
    };
    let out = tokio::time::timeout(crate::PATIENCE, look)
        .await
        .map_err(|_| {
            format!("{} did not run `sh -c` within {:?}", sub.provider_name(), crate::PATIENCE)
        })?
        .map_err(|e| format!("{} could not run `sh -c`: {e}", sub.provider_name()))?;
    let mut lines = out.lines().map(str::trim);
    let (their_boot, their_ns) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    if their_boot != boot {
        return Err(format!(
            "{} runs its processes on another machine (boot id {their_boot:?}, here {boot:?})",
            sub.provider_name()
        ));
    }
    if their_ns != ns {
        return Err(format!(
            "{} runs its processes in another pid namespace ({their_ns:?}, here {ns:?})",
            sub.provider_name()
        ));
    }
    Ok(())
}
