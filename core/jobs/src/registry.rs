//! [`JobRegistry`]: preflight and slot reservation, id minting, the exact-owner fence, and
//! awaited owner and service teardown.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use conch_seams::{
    Error, ErrorCode, JobHooks, JobInfo, JobRead, JobRun, JobStart, Jobs, Owner, Result,
};
use conch_sync::LockExt;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::job::{Job, JobSpec};

/// The provider name errors are tagged with.
pub const PROVIDER: &str = "jobs";

/// The in-process job registry behind the jobs seam.
///
/// Owners are fenced by [`Owner::key`], never by session id. Each owner may have at most
/// `cap` running jobs (records that settled do not count); the cap is checked, and a slot
/// reserved, before the producer runs, so there is no queue and concurrent starts cannot
/// overshoot it.
pub struct JobRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    cap: usize,
    /// Set once by `shutdown`; also shared with every job so notices stop during teardown.
    disposing: Arc<AtomicBool>,
    state: Mutex<State>,
    /// Signalled whenever a slot reservation is released, so teardown can wait for starts
    /// whose producer is still running before it takes its snapshot of the jobs.
    reservations_changed: Notify,
}

#[derive(Default)]
struct State {
    /// The last number minted per kind.
    next: HashMap<String, u64>,
    jobs: HashMap<String, Arc<Job>>,
    /// Slots held by starts whose producer is running, per owner key.
    reserved: HashMap<u64, usize>,
    /// Owners that already carry this registry's dispose hook.
    hooked: HashSet<u64>,
}

impl State {
    fn active_for(&self, owner_key: u64) -> usize {
        let running =
            self.jobs.values().filter(|j| j.owner_key == owner_key && j.is_running()).count();
        running + self.reserved.get(&owner_key).copied().unwrap_or(0)
    }

    fn reserved_total(&self, owner_key: Option<u64>) -> usize {
        match owner_key {
            Some(key) => self.reserved.get(&key).copied().unwrap_or(0),
            None => self.reserved.values().sum(),
        }
    }

    fn release(&mut self, owner_key: u64) {
        if let Some(n) = self.reserved.get_mut(&owner_key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.reserved.remove(&owner_key);
            }
        }
    }
}

impl fmt::Debug for JobRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let jobs = self.inner.lock().jobs.len();
        f.debug_struct("JobRegistry")
            .field("cap", &self.inner.cap)
            .field("jobs", &jobs)
            .field("disposing", &self.inner.disposing.load(Ordering::Acquire))
            .finish()
    }
}

/// Active jobs one owner may have at once, unless the `jobs` plugin's `cap_per_owner` says
/// otherwise.
pub const DEFAULT_JOB_CAP: usize = 10;

impl Default for JobRegistry {
    /// A registry with the default per-owner cap ([`DEFAULT_JOB_CAP`]).
    fn default() -> Self {
        Self::with_cap(DEFAULT_JOB_CAP)
    }
}

impl JobRegistry {
    /// A registry allowing `cap_per_owner` running jobs per owner.
    pub fn new(cap_per_owner: usize) -> Arc<Self> {
        Arc::new(Self::with_cap(cap_per_owner))
    }

    fn with_cap(cap: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                cap,
                disposing: Arc::new(AtomicBool::new(false)),
                state: Mutex::new(State::default()),
                reservations_changed: Notify::new(),
            }),
        }
    }

    /// The per-owner cap on running jobs.
    pub fn cap(&self) -> usize {
        self.inner.cap
    }

    fn lookup(&self, owner: &Owner, id: &str, operation: &'static str) -> Result<Arc<Job>> {
        let st = self.inner.lock();
        match st.jobs.get(id) {
            None => Err(Error::new(
                ErrorCode::NotFound,
                format!("no job with id {id}; use job_list to see your jobs"),
            )
            .with_provider(PROVIDER)
            .with_operation(operation)),
            Some(job) if job.owner_key != owner.key() => Err(Error::new(
                ErrorCode::ForeignOwner,
                format!("job {id} belongs to another owner"),
            )
            .with_provider(PROVIDER)
            .with_operation(operation)),
            Some(job) => Ok(Arc::clone(job)),
        }
    }

    /// The job with this id, whoever owns it (tests use it to await the notice step).
    #[cfg(test)]
    pub(crate) fn job(&self, id: &str) -> Option<Arc<Job>> {
        self.inner.lock().jobs.get(id).map(Arc::clone)
    }
}

fn validate(start: &JobStart) -> Result<()> {
    let mut chars = start.kind.chars();
    let kind_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !kind_ok {
        return Err(Error::invalid(format!(
            "job kind {:?} is invalid: use a lowercase letter then lowercase letters, digits or '-'",
            start.kind
        )));
    }
    if start.label.trim().is_empty() {
        return Err(Error::invalid("job label is empty"));
    }
    if start.output_cap == 0 {
        return Err(Error::invalid("job output_cap must be greater than 0"));
    }
    Ok(())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Every check that must pass before the producer runs, then a reserved slot.
    fn preflight(self: &Arc<Self>, owner: &Owner, start: &JobStart) -> Result<Reservation> {
        let mut st = self.lock();
        // Checked under the state lock: `shutdown` flips the flag under it too, so a start
        // either reserves before shutdown looks at reservations or is refused here.
        if self.disposing.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::Disposing, "job registry is shutting down"));
        }
        validate(start)?;
        if !owner.is_live() {
            return Err(Error::new(ErrorCode::Disposing, "owner is not live"));
        }
        let key = owner.key();
        if st.active_for(key) >= self.cap {
            return Err(Error::new(
                ErrorCode::LimitExceeded,
                format!(
                    "owner already has the maximum of {} running jobs; wait for one to finish or kill one",
                    self.cap
                ),
            ));
        }
        // The hook goes on before the slot is reserved, so a disposal that starts while the
        // producer is running waits for this start and then stops what it produced.
        if !st.hooked.contains(&key) {
            let weak = Arc::downgrade(self);
            let kept = owner.on_dispose(move || {
                Box::pin(async move {
                    if let Some(inner) = weak.upgrade() {
                        inner.dispose_owner(key).await;
                    }
                })
            });
            if !kept {
                return Err(Error::new(ErrorCode::Disposing, "owner is not live"));
            }
            st.hooked.insert(key);
        }
        *st.reserved.entry(key).or_default() += 1;
        Ok(Reservation { inner: Arc::clone(self), owner_key: key, armed: true })
    }

    /// Turns a reservation whose producer started into a record and its settlement task.
    fn register(
        &self,
        mut reservation: Reservation,
        owner: &Arc<Owner>,
        start: JobStart,
        hooks: JobHooks,
    ) -> Arc<Job> {
        let JobHooks { cancel, done, output } = hooks;
        let job = {
            let mut st = self.lock();
            st.release(reservation.owner_key);
            reservation.armed = false;
            let n = {
                let n = st.next.entry(start.kind.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let id = format!("{}-{n}", start.kind);
            let job = Arc::new(Job::new(JobSpec {
                id: id.clone(),
                kind: start.kind,
                n,
                label: start.label,
                output_cap: start.output_cap,
                owner: Arc::downgrade(owner),
                owner_key: owner.key(),
                cancel,
                output,
                service_disposing: Arc::clone(&self.disposing),
            }));
            st.jobs.insert(id, Arc::clone(&job));
            job
        };
        self.reservations_changed.notify_waiters();
        let for_task = Arc::clone(&job);
        let handle = tokio::spawn(async move {
            let settlement = done.await;
            if for_task.commit(settlement) {
                // Waiters were released by the commit; give them a turn before deciding on
                // the notice, so a `job_output` with `wait: true` that reads the final output
                // marks the job reported and the owner is not told the same result twice.
                // (Best effort on a multi-threaded runtime; a duplicate notice is harmless.)
                tokio::task::yield_now().await;
                for_task.finish();
            }
        });
        job.set_task(handle.abort_handle());
        job
    }

    /// Waits until no start matching `owner_key` (or any, for `None`) holds a reservation,
    /// then returns the matching jobs. Callers make sure no new reservation can appear
    /// (the owner is not live, or the registry is disposing), so the snapshot is complete.
    async fn quiet_snapshot(&self, owner_key: Option<u64>) -> Vec<Arc<Job>> {
        loop {
            let notified = self.reservations_changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a release between the check and the await
            // still wakes us.
            notified.as_mut().enable();
            {
                let st = self.lock();
                if st.reserved_total(owner_key) == 0 {
                    return st
                        .jobs
                        .values()
                        .filter(|j| owner_key.is_none_or(|k| j.owner_key == k))
                        .map(Arc::clone)
                        .collect();
                }
            }
            notified.await;
        }
    }

    /// The quiescence protocol: request cancel on every job, await every settlement, then
    /// delete the records.
    async fn teardown(&self, jobs: Vec<Arc<Job>>) {
        // Every cancel is requested before any is awaited to settle; one that could not be
        // delivered has force-failed its record, so the wait below does not hang on it.
        let cancels = futures::future::join_all(jobs.iter().map(|j| j.request_cancel())).await;
        for (job, r) in jobs.iter().zip(cancels) {
            if let Err(e) = r {
                tracing::warn!(job = %job.id, error = %e, "teardown could not deliver a job's cancellation; its work may be orphaned");
            }
        }
        for job in &jobs {
            job.finished().await;
        }
        {
            let mut st = self.lock();
            for job in &jobs {
                st.jobs.remove(&job.id);
                job.abort_task();
            }
        }
        // Nobody can address these records any more, so nothing can read their output.
        for job in &jobs {
            if let Err(e) = job.release_output().await {
                tracing::warn!(job = %job.id, error = %e, "teardown could not release a job's output");
            }
        }
    }

    async fn dispose_owner(&self, owner_key: u64) {
        let span =
            tracing::debug_span!("jobs_dispose", owner = owner_key, jobs = tracing::field::Empty);
        async {
            let jobs = self.quiet_snapshot(Some(owner_key)).await;
            tracing::Span::current().record("jobs", jobs.len());
            self.teardown(jobs).await;
            self.lock().hooked.remove(&owner_key);
        }
        .instrument(span)
        .await;
    }
}

/// A slot held for a start whose producer is running; dropping it (the producer failed, or
/// the caller abandoned the start) gives the slot back.
struct Reservation {
    inner: Arc<Inner>,
    owner_key: u64,
    armed: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.armed {
            self.inner.lock().release(self.owner_key);
            self.inner.reservations_changed.notify_waiters();
        }
    }
}

#[async_trait]
impl Jobs for JobRegistry {
    async fn start(&self, owner: &Arc<Owner>, start: JobStart, run: JobRun) -> Result<JobInfo> {
        let reservation = self
            .inner
            .preflight(owner, &start)
            .map_err(|e| e.with_provider(PROVIDER).with_operation("start"))?;
        // The producer's own error goes back unchanged; the reservation drops with it.
        let hooks = run().await?;
        let job = self.inner.register(reservation, owner, start, hooks);
        Ok(job.info())
    }

    fn get(&self, owner: &Owner, id: &str) -> Result<JobInfo> {
        Ok(self.lookup(owner, id, "get")?.info())
    }

    async fn wait(&self, owner: &Owner, id: &str, timeout: Duration) -> Result<JobInfo> {
        let job = self.lookup(owner, id, "wait")?;
        job.wait_settled(timeout).await;
        Ok(job.info())
    }

    fn read_output(&self, owner: &Owner, id: &str) -> Result<(JobInfo, JobRead)> {
        let job = self.lookup(owner, id, "read_output")?;
        // The record is taken before the read: if it was settled then, this read returns the
        // rest of the output, so the result counts as reported.
        let info = job.info();
        let read = job.read();
        job.mark_reported_if_settled(&info);
        Ok((info, read))
    }

    fn peek_output(&self, owner: &Owner, id: &str) -> Result<(JobInfo, JobRead)> {
        let job = self.lookup(owner, id, "peek_output")?;
        let info = job.info();
        Ok((info, job.snapshot()))
    }

    async fn kill(&self, owner: &Owner, id: &str) -> Result<JobInfo> {
        let job = self.lookup(owner, id, "kill")?;
        let span = tracing::debug_span!("job_kill", job = id);
        job.request_cancel().instrument(span).await.map_err(|e| {
            // The producer's code and reason stay, so the caller can tell a lost world
            // from a refused signal.
            e.prefixed(format!("the kill of job {id} could not be delivered"))
                .with_context("job", "marked failed; its work may still run")
        })?;
        Ok(job.info())
    }

    fn list(&self, owner: &Owner) -> Vec<JobInfo> {
        let mut jobs: Vec<Arc<Job>> = {
            let st = self.inner.lock();
            st.jobs.values().filter(|j| j.owner_key == owner.key()).map(Arc::clone).collect()
        };
        jobs.sort_by(|a, b| (&a.kind, a.n).cmp(&(&b.kind, b.n)));
        jobs.iter().map(|j| j.info()).collect()
    }

    /// Refuses new starts, waits for starts whose producer is running, requests cancel on
    /// every job, awaits every settlement, then deletes the records. A producer whose cancel
    /// returned `Ok` but which never settles keeps this waiting (see the seam contract).
    async fn shutdown(&self) {
        {
            let _st = self.inner.lock();
            self.inner.disposing.store(true, Ordering::Release);
        }
        let span =
            tracing::debug_span!("jobs_dispose", owner = "all", jobs = tracing::field::Empty);
        async {
            let jobs = self.inner.quiet_snapshot(None).await;
            tracing::Span::current().record("jobs", jobs.len());
            self.inner.teardown(jobs).await;
        }
        .instrument(span)
        .await;
    }
}
