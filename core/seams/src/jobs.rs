//! The jobs seam: one background identity for any producer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::{Owner, Result, SpillRef};

/// Job lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Producer still working.
    Running,
    /// Producer finished (a non-zero exit is still completed, with detail).
    Completed,
    /// Producer failed, or teardown force-failed the record.
    Failed,
    /// Stopped by cancellation.
    Killed,
    /// The producer's world was lost (a remote daemon that restarted or went away): how the
    /// work ended is unknown; the detail says why.
    Lost,
}

impl JobStatus {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Killed => "killed",
            JobStatus::Lost => "lost",
        }
    }
}

/// How a producer settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSettlement {
    /// Terminal status (never `Running`).
    pub status: JobStatus,
    /// Short detail, such as `exit code: 2`.
    pub detail: Option<String>,
}

/// One incremental read of a producer's output as text (a background shell process, any
/// job): the text counterpart of [`crate::StreamRead`], with the same spill vocabulary.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct JobRead {
    /// New text since the previous consuming read (all retained text for a snapshot).
    pub text: String,
    /// Bytes were dropped between reads.
    pub lossy: bool,
    /// How many: output between the previous read and `text` that is not in it (it fell
    /// out of the retained window, or a remote world lost it in transport); 0 when unknown.
    pub skipped_bytes: u64,
    /// The spill file, in the world that wrote it, while it holds the complete output.
    pub spill: Option<SpillRef>,
    /// The complete spill was evicted under spill limits: renderers say it is gone instead
    /// of naming a path.
    pub spill_evicted: bool,
    /// Total bytes produced so far (0 when the producer does not count them).
    pub total_bytes: u64,
}

/// Output hooks a producer may supply.
#[async_trait]
pub trait JobOutput: Send + Sync {
    /// Consuming delta read.
    fn read(&self) -> JobRead;
    /// Non-consuming view of retained output.
    fn snapshot(&self) -> JobRead;
    /// The record is being deleted: release retained output (spill files). Reads after it
    /// may return less.
    ///
    /// # Errors
    /// The release could not be delivered (the producer's world is unreachable).
    async fn release(&self) -> Result<()>;
}

/// What a producer hands the registry once it actually started.
pub struct JobHooks {
    /// Requests cancellation and resolves once the request was delivered; an `Err` (it
    /// could not be) makes the registry force-fail the record and report the error.
    pub cancel: JobCancel,
    /// Resolves at settlement; never fails.
    pub done: BoxFuture<'static, JobSettlement>,
    /// Optional output.
    pub output: Option<Arc<dyn JobOutput>>,
}

impl fmt::Debug for JobHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHooks").field("output", &self.output.is_some()).finish_non_exhaustive()
    }
}

/// A producer's cancel hook: resolves once the cancellation request was delivered.
pub type JobCancel = Box<dyn Fn() -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// Runs the producer; called only after every preflight passed.
pub type JobRun = Box<dyn FnOnce() -> BoxFuture<'static, Result<JobHooks>> + Send>;

/// A start request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobStart {
    /// Kind, used as the id prefix (`bash` → `bash-1`).
    pub kind: String,
    /// Human label.
    pub label: String,
    /// Byte cap for any rendered output of this job.
    pub output_cap: usize,
}

impl JobStart {
    /// A request with a 64 000-byte output cap.
    pub fn new(kind: impl Into<String>, label: impl Into<String>) -> Self {
        Self { kind: kind.into(), label: label.into(), output_cap: 64_000 }
    }
}

/// A job's public record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// `<kind>-N`.
    pub id: String,
    /// The producer's kind, the `<kind>` of the id (`bash`, `pty-send`).
    pub kind: String,
    /// What the job runs, as the producer describes it for listings.
    pub label: String,
    /// Running, or how it settled.
    pub status: JobStatus,
    /// Settlement detail.
    pub detail: Option<String>,
    /// Output cap.
    pub output_cap: usize,
    /// Cancellation was requested.
    pub cancel_requested: bool,
    /// Milliseconds since start.
    pub elapsed_ms: u64,
}

/// The jobs seam.
///
/// # Contract
/// - Preflight (service live, kind/label valid, owner live, active cap) runs before the
///   producer; there is no queue.
/// - Only the exact owner can read, wait, kill or list a job (`foreign_owner`).
/// - Settlement is first-wins: state commits, waiters release, then the owner is notified.
/// - Owner disposal and `shutdown` request cancel, await every settlement, then delete.
#[async_trait]
pub trait Jobs: Send + Sync + fmt::Debug + 'static {
    /// Starts a job.
    ///
    /// # Errors
    /// `limit_exceeded`, `disposing`, `invalid_argument`, or the producer's own error.
    async fn start(&self, owner: &Arc<Owner>, start: JobStart, run: JobRun) -> Result<JobInfo>;
    /// One job's record.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`.
    fn get(&self, owner: &Owner, id: &str) -> Result<JobInfo>;
    /// Waits up to `timeout` for settlement; returns the record either way.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`.
    async fn wait(&self, owner: &Owner, id: &str, timeout: Duration) -> Result<JobInfo>;
    /// Consuming output read; marks a settled job as reported.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`.
    fn read_output(&self, owner: &Owner, id: &str) -> Result<(JobInfo, JobRead)>;
    /// Non-consuming output snapshot.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`.
    fn peek_output(&self, owner: &Owner, id: &str) -> Result<(JobInfo, JobRead)>;
    /// Requests cancellation; returns the record (usually still running) once the request
    /// was delivered.
    ///
    /// # Errors
    /// `not_found`, `foreign_owner`; the producer's error when the cancellation could not be
    /// delivered (the record is then force-failed: the work may still run).
    async fn kill(&self, owner: &Owner, id: &str) -> Result<JobInfo>;
    /// The caller's jobs, live and settled.
    fn list(&self, owner: &Owner) -> Vec<JobInfo>;
    /// Cancels and awaits every job, then deletes the records.
    async fn shutdown(&self);
}
