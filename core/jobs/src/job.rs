//! One job record: its immutable identity, its first-wins lifecycle state, and the settlement
//! phases that waiters (released at commit) and teardown (released after the notice step)
//! observe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use conch_seams::{
    Error, JobCancel, JobInfo, JobOutput, JobRead, JobSettlement, JobStatus, Notice, Owner, Result,
};
use conch_sync::LockExt;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// How far a job has got through settlement. Ordered, so waiters can ask for "at least".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// The producer has not settled and nothing force-failed the record.
    Running,
    /// The terminal state is committed; `wait` callers are released from here.
    Settled,
    /// The completion notice step is over (sent, skipped as reported, or suppressed);
    /// teardown waits for this so no notice is still in flight once it returns.
    Finished,
}

/// Mutable lifecycle state, guarded by one mutex so a commit is all-or-nothing.
#[derive(Debug)]
struct JobState {
    status: JobStatus,
    detail: Option<String>,
    cancel_requested: bool,
    /// Frozen settlement instant, so `elapsed_ms` stops counting once the job is over.
    settled_at: Option<Instant>,
    /// A consuming read after settlement, or the notice itself, already told the owner.
    reported: bool,
}

/// Everything fixed at registration, grouped so `Job::new` stays readable.
pub(crate) struct JobSpec {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) n: u64,
    pub(crate) label: String,
    pub(crate) output_cap: usize,
    pub(crate) owner: Weak<Owner>,
    pub(crate) owner_key: u64,
    pub(crate) cancel: JobCancel,
    pub(crate) output: Option<Arc<dyn JobOutput>>,
    /// The registry's shutdown flag: notices are not sent into a harness that is tearing down.
    pub(crate) service_disposing: Arc<AtomicBool>,
}

/// One registered job.
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) kind: String,
    /// The per-kind sequence number, kept so listing sorts `bash-2` before `bash-10`.
    pub(crate) n: u64,
    label: String,
    output_cap: usize,
    pub(crate) owner_key: u64,
    /// Weak so a record never keeps a dropped agent alive just to notify it.
    owner: Weak<Owner>,
    started: Instant,
    cancel: JobCancel,
    output: Option<Arc<dyn JobOutput>>,
    service_disposing: Arc<AtomicBool>,
    state: Mutex<JobState>,
    phase: watch::Sender<Phase>,
    /// The settlement task, aborted when the record is deleted so a producer whose cancel
    /// failed (and may never settle) does not pin the record in memory forever.
    task: Mutex<Option<AbortHandle>>,
}

impl Job {
    pub(crate) fn new(spec: JobSpec) -> Self {
        Self {
            id: spec.id,
            kind: spec.kind,
            n: spec.n,
            label: spec.label,
            output_cap: spec.output_cap,
            owner_key: spec.owner_key,
            owner: spec.owner,
            started: Instant::now(),
            cancel: spec.cancel,
            output: spec.output,
            service_disposing: spec.service_disposing,
            state: Mutex::new(JobState {
                status: JobStatus::Running,
                detail: None,
                cancel_requested: false,
                settled_at: None,
                reported: false,
            }),
            phase: watch::channel(Phase::Running).0,
            task: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JobState> {
        self.state.locked()
    }

    /// The public record as of now.
    pub(crate) fn info(&self) -> JobInfo {
        let st = self.lock();
        let end = st.settled_at.unwrap_or_else(Instant::now);
        JobInfo {
            id: self.id.clone(),
            kind: self.kind.clone(),
            label: self.label.clone(),
            status: st.status,
            detail: st.detail.clone(),
            output_cap: self.output_cap,
            cancel_requested: st.cancel_requested,
            elapsed_ms: u64::try_from(end.duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.lock().status == JobStatus::Running
    }

    pub(crate) fn set_task(&self, handle: AbortHandle) {
        *self.task.locked() = Some(handle);
    }

    /// Stops the settlement task if it is still waiting on the producer.
    pub(crate) fn abort_task(&self) {
        if let Some(handle) = self.task.locked().take() {
            handle.abort();
        }
    }

    /// Commits a terminal state if none is committed yet, then releases waiters.
    /// Returns whether this call won (first-wins: every later settlement is ignored).
    pub(crate) fn commit(&self, settlement: JobSettlement) -> bool {
        {
            let mut st = self.lock();
            if st.status != JobStatus::Running {
                return false;
            }
            // A producer reporting `Running` as its settlement broke the contract; recording
            // it as failed keeps the record terminal instead of running forever.
            let (status, detail) = if settlement.status == JobStatus::Running {
                (JobStatus::Failed, Some("producer settled without a terminal status".to_string()))
            } else {
                (settlement.status, settlement.detail)
            };
            st.status = status;
            st.detail = detail;
            st.settled_at = Some(Instant::now());
        }
        // Released only after the state lock is dropped, so a woken waiter reads the
        // committed record.
        self.phase.send_replace(Phase::Settled);
        true
    }

    /// The notice step after a winning commit: notifies the owner unless the settled job
    /// was already reported, the owner is gone or disposing, or the registry is shutting
    /// down. Then marks the job finished for teardown.
    pub(crate) fn finish(&self) {
        let notice = {
            let mut st = self.lock();
            if st.reported {
                None
            } else {
                st.reported = true;
                let mut text = format!("job {} ({}) {}", self.id, self.label, st.status.as_str());
                if let Some(detail) = &st.detail {
                    text.push_str(": ");
                    text.push_str(detail);
                }
                Some(Notice { source_id: self.id.clone(), text })
            }
        };
        if let Some(notice) = notice
            && !self.service_disposing.load(Ordering::Acquire)
            && let Some(owner) = self.owner.upgrade()
            && owner.is_live()
        {
            owner.notify(notice);
        }
        self.phase.send_replace(Phase::Finished);
    }

    /// Marks the job reported if `info` (taken before a consuming read) was settled.
    pub(crate) fn mark_reported_if_settled(&self, info: &JobInfo) {
        if info.status != JobStatus::Running {
            self.lock().reported = true;
        }
    }

    /// Requests cancellation of a running job; a settled job is left alone. A cancel hook
    /// that errs (the request could not be delivered) force-fails the record, since the
    /// registry can no longer vouch for the work, and the error is returned so the caller
    /// is told rather than left to assume the kill happened.
    pub(crate) async fn request_cancel(&self) -> Result<()> {
        {
            let mut st = self.lock();
            if st.status != JobStatus::Running {
                return Ok(());
            }
            st.cancel_requested = true;
        }
        // Called without the state lock: producer code must be free to look at the job.
        let delivered = (self.cancel)().await;
        if let Err(e) = &delivered {
            self.force_fail(e);
        }
        delivered
    }

    fn force_fail(&self, err: &Error) {
        let settlement = JobSettlement {
            status: JobStatus::Failed,
            detail: Some(format!("cancellation failed: {err}; work may be orphaned")),
        };
        if self.commit(settlement) {
            self.finish();
        }
    }

    /// Waits up to `timeout` for the terminal state to be committed.
    pub(crate) async fn wait_settled(&self, timeout: Duration) {
        let mut rx = self.phase.subscribe();
        // The sender lives in `self`, so `wait_for` cannot see it closed; a timeout is the
        // ordinary "still running" answer.
        let _ = tokio::time::timeout(timeout, rx.wait_for(|p| *p >= Phase::Settled)).await;
    }

    /// Waits until the notice step is over. Has no deadline: a producer whose cancel
    /// returned but which never settles keeps this waiting, because teardown cannot tell a
    /// slow stop from an ineffective one.
    pub(crate) async fn finished(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p == Phase::Finished).await;
    }

    /// Consuming read through the producer's output hook (empty without one).
    pub(crate) fn read(&self) -> JobRead {
        self.output.as_ref().map(|o| o.read()).unwrap_or_default()
    }

    /// The record is deleted: the producer may drop retained output (spill files).
    ///
    /// # Errors
    /// The producer could not deliver the release (its world is unreachable).
    pub(crate) async fn release_output(&self) -> Result<()> {
        match &self.output {
            Some(o) => o.release().await,
            None => Ok(()),
        }
    }

    /// Non-consuming snapshot through the producer's output hook (empty without one).
    pub(crate) fn snapshot(&self) -> JobRead {
        self.output.as_ref().map(|o| o.snapshot()).unwrap_or_default()
    }
}
