//! Behaviour tests for the job registry, driven by fake producers that are real tokio tasks
//! controlled through channels (no sleeps for synchronisation).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conch_seams::{
    Error, ErrorCode, JobHooks, JobOutput, JobRead, JobRun, JobSettlement, JobStart, JobStatus,
    Jobs, Notice, Owner,
};
use futures::FutureExt;
use tokio::sync::{Notify, oneshot};

use crate::{JobRegistry, NoticeRoute, RoutingSink};

/// A generous bound for waits that are expected to finish promptly.
const LONG: Duration = Duration::from_secs(30);

/// What the fake producer does when its cancel hook is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnCancel {
    /// Stops and settles as killed.
    SettleKilled,
    /// Returns Ok but keeps running until the test finishes it.
    Ignore,
    /// The cancel hook errs (the signal could not be delivered).
    Throw,
}

/// Output a test can append to: `read` drains what is new, `snapshot` shows everything.
#[derive(Debug, Default)]
struct FakeOutput {
    pending: Mutex<String>,
    all: Mutex<String>,
    released: AtomicBool,
}

impl FakeOutput {
    fn push(&self, text: &str) {
        self.pending.lock().unwrap().push_str(text);
        self.all.lock().unwrap().push_str(text);
    }
}

#[async_trait::async_trait]
impl JobOutput for FakeOutput {
    fn read(&self) -> JobRead {
        JobRead { text: std::mem::take(&mut *self.pending.lock().unwrap()), ..JobRead::default() }
    }

    fn snapshot(&self) -> JobRead {
        JobRead { text: self.all.lock().unwrap().clone(), ..JobRead::default() }
    }

    async fn release(&self) -> conch_seams::Result<()> {
        self.released.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// The test's handles on one fake producer.
struct Producer {
    /// The registry called `run`.
    ran: Arc<AtomicBool>,
    /// How many times the cancel hook was called.
    cancels: Arc<AtomicUsize>,
    finish: Option<oneshot::Sender<JobSettlement>>,
    /// Fires when the producer's `done` resolves (the settlement task then commits, or
    /// ignores, in the same poll).
    observed: Option<oneshot::Receiver<()>>,
    output: Arc<FakeOutput>,
}

impl Producer {
    /// Makes the producer task settle.
    fn finish(&mut self, settlement: JobSettlement) {
        self.finish.take().unwrap().send(settlement).unwrap();
    }

    /// Waits until the registry has been handed the producer's settlement.
    async fn observed(&mut self) {
        self.observed.take().unwrap().await.unwrap();
    }
}

struct Fake {
    on_cancel: OnCancel,
    output: bool,
}

impl Fake {
    fn start(self) -> (JobRun, Producer) {
        let ran = Arc::new(AtomicBool::new(false));
        let cancels = Arc::new(AtomicUsize::new(0));
        let output = Arc::new(FakeOutput::default());
        let (finish_tx, finish_rx) = oneshot::channel::<JobSettlement>();
        let (observed_tx, observed_rx) = oneshot::channel();
        let producer = Producer {
            ran: Arc::clone(&ran),
            cancels: Arc::clone(&cancels),
            finish: Some(finish_tx),
            observed: Some(observed_rx),
            output: Arc::clone(&output),
        };
        let Fake { on_cancel, output: with_output } = self;
        let run: JobRun = Box::new(move || {
            ran.store(true, Ordering::SeqCst);
            async move {
                let stop = Arc::new(Notify::new());
                let (done_tx, done_rx) = oneshot::channel();
                let stop_for_task = Arc::clone(&stop);
                // The producer is its own task, as a background process watcher would be.
                tokio::spawn(async move {
                    let settlement = tokio::select! {
                        r = finish_rx => r.unwrap_or_else(|_| failed("test dropped the producer")),
                        () = stop_for_task.notified(), if on_cancel == OnCancel::SettleKilled => {
                            JobSettlement { status: JobStatus::Killed, detail: Some("signal: SIGKILL".into()) }
                        }
                    };
                    let _ = done_tx.send(settlement);
                });
                let cancel = move || {
                    cancels.fetch_add(1, Ordering::SeqCst);
                    if on_cancel == OnCancel::Throw {
                        return futures::future::ready(Err(Error::internal("kill(2) failed")))
                            .boxed();
                    }
                    stop.notify_one();
                    futures::future::ready(Ok(())).boxed()
                };
                let done = async move {
                    let settlement = done_rx.await.unwrap_or_else(|_| failed("producer task vanished"));
                    let _ = observed_tx.send(());
                    settlement
                };
                Ok(JobHooks {
                    cancel: Box::new(cancel),
                    done: done.boxed(),
                    output: with_output.then_some(output as Arc<dyn JobOutput>),
                })
            }
            .boxed()
        });
        (run, producer)
    }
}

fn producer(on_cancel: OnCancel) -> (JobRun, Producer) {
    Fake { on_cancel, output: true }.start()
}

/// A run closure that records whether it was called and then fails like a spawn error.
fn failing_run(called: &Arc<AtomicBool>) -> JobRun {
    let called = Arc::clone(called);
    Box::new(move || {
        called.store(true, Ordering::SeqCst);
        async { Err(Error::new(ErrorCode::SpawnFailed, "no such program")) }.boxed()
    })
}

/// Wraps a run so it signals `entered` and then blocks until `gate` opens.
fn gated(run: JobRun, entered: oneshot::Sender<()>, gate: oneshot::Receiver<()>) -> JobRun {
    Box::new(move || {
        async move {
            let _ = entered.send(());
            let _ = gate.await;
            run().await
        }
        .boxed()
    })
}

fn failed(detail: &str) -> JobSettlement {
    JobSettlement { status: JobStatus::Failed, detail: Some(detail.into()) }
}

fn completed(detail: &str) -> JobSettlement {
    JobSettlement { status: JobStatus::Completed, detail: Some(detail.into()) }
}

fn new_owner(session: &str) -> (Arc<Owner>, Arc<RoutingSink>) {
    let sink = Arc::new(RoutingSink::default());
    let owner = Owner::new(session, Arc::clone(&sink) as Arc<dyn conch_seams::NoticeSink>);
    (owner, sink)
}

fn bash(label: &str) -> JobStart {
    JobStart::new("bash", label)
}

/// Waits until the job's notice step (sent, skipped or suppressed) is over.
async fn notice_step(reg: &JobRegistry, id: &str) {
    let job = reg.job(id).unwrap();
    job.finished().await;
}

/// Starts a job, completes it with `detail`, and waits for its notice step.
async fn run_to_completion(reg: &JobRegistry, owner: &Arc<Owner>, detail: &str) -> String {
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(owner, bash("build"), run).await.unwrap().id;
    p.finish(completed(detail));
    notice_step(reg, &id).await;
    id
}

#[tokio::test]
async fn ids_count_from_one_per_kind() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let mut keep = Vec::new();
    let mut ids = Vec::new();
    for kind in ["bash", "bash", "agent", "bash", "agent"] {
        let (run, p) = producer(OnCancel::SettleKilled);
        ids.push(reg.start(&owner, JobStart::new(kind, "x"), run).await.unwrap().id);
        keep.push(p);
    }
    assert_eq!(ids, ["bash-1", "bash-2", "agent-1", "bash-3", "agent-2"]);

    // Numbering belongs to the registry, not the process.
    let other = JobRegistry::new(10);
    let (run, _p) = producer(OnCancel::SettleKilled);
    assert_eq!(other.start(&owner, bash("x"), run).await.unwrap().id, "bash-1");
}

#[tokio::test]
async fn a_started_job_is_running_with_its_request_fields() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, p) = producer(OnCancel::SettleKilled);
    let info = reg.start(&owner, bash("npm test"), run).await.unwrap();
    assert!(p.ran.load(Ordering::SeqCst));
    assert_eq!(info.kind, "bash");
    assert_eq!(info.label, "npm test");
    assert_eq!(info.status, JobStatus::Running);
    assert_eq!(info.detail, None);
    assert_eq!(info.output_cap, 64_000);
    assert!(!info.cancel_requested);
    assert_eq!(reg.get(&owner, &info.id).unwrap().id, info.id);
}

#[tokio::test]
async fn another_owner_with_the_same_session_id_is_refused_as_foreign() {
    let reg = JobRegistry::new(10);
    let (alice, _) = new_owner("shared-session");
    let (impostor, _) = new_owner("shared-session");
    let (run, p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&alice, bash("x"), run).await.unwrap().id;

    let foreign = |r: Result<(), Error>| assert_eq!(r.unwrap_err().code(), ErrorCode::ForeignOwner);
    foreign(reg.get(&impostor, &id).map(drop));
    foreign(reg.wait(&impostor, &id, LONG).await.map(drop));
    foreign(reg.read_output(&impostor, &id).map(drop));
    foreign(reg.peek_output(&impostor, &id).map(drop));
    foreign(reg.kill(&impostor, &id).await.map(drop));
    assert!(reg.list(&impostor).is_empty());
    assert_eq!(p.cancels.load(Ordering::SeqCst), 0, "a foreign kill must not reach the producer");
    assert_eq!(reg.get(&alice, &id).unwrap().status, JobStatus::Running);
}

#[tokio::test]
async fn an_unknown_id_is_not_found_and_points_at_job_list() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    for err in [
        reg.get(&owner, "bash-9").unwrap_err(),
        reg.wait(&owner, "bash-9", LONG).await.unwrap_err(),
        reg.read_output(&owner, "bash-9").unwrap_err(),
        reg.peek_output(&owner, "bash-9").unwrap_err(),
        reg.kill(&owner, "bash-9").await.unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert!(err.message().contains("job_list"), "{err}");
    }
}

#[tokio::test]
async fn list_shows_only_the_callers_jobs_in_id_order() {
    let reg = JobRegistry::new(20);
    let (owner, _) = new_owner("s");
    let (other, _) = new_owner("s");
    let mut keep = Vec::new();
    for _ in 0..11 {
        let (run, p) = producer(OnCancel::SettleKilled);
        reg.start(&owner, bash("x"), run).await.unwrap();
        keep.push(p);
    }
    let (run, p) = producer(OnCancel::SettleKilled);
    reg.start(&owner, JobStart::new("agent", "x"), run).await.unwrap();
    keep.push(p);
    let (run, p) = producer(OnCancel::SettleKilled);
    let others = reg.start(&other, bash("x"), run).await.unwrap().id;
    keep.push(p);

    let ids: Vec<String> = reg.list(&owner).into_iter().map(|j| j.id).collect();
    let mut expected = vec!["agent-1".to_string()];
    expected.extend((1..=11).map(|n| format!("bash-{n}")));
    assert_eq!(ids, expected);
    assert_eq!(reg.list(&other).into_iter().map(|j| j.id).collect::<Vec<_>>(), [others]);
}

#[tokio::test]
async fn the_cap_is_enforced_before_the_producer_runs() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let mut keep = Vec::new();
    for _ in 0..10 {
        let (run, p) = producer(OnCancel::SettleKilled);
        reg.start(&owner, bash("x"), run).await.unwrap();
        keep.push(p);
    }
    let (run, eleventh) = producer(OnCancel::SettleKilled);
    let err = reg.start(&owner, bash("x"), run).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LimitExceeded);
    assert!(err.message().contains("10"), "{err}");
    assert!(!eleventh.ran.load(Ordering::SeqCst), "the 11th producer must not run");

    // The cap is per owner.
    let (other, _) = new_owner("s");
    let (run, _p) = producer(OnCancel::SettleKilled);
    reg.start(&other, bash("x"), run).await.unwrap();

    // A settled job no longer counts.
    keep[0].finish(completed("exit code: 0"));
    reg.wait(&owner, "bash-1", LONG).await.unwrap();
    let (run, _p) = producer(OnCancel::SettleKilled);
    assert_eq!(reg.start(&owner, bash("x"), run).await.unwrap().id, "bash-12");
}

#[tokio::test]
async fn the_default_registry_caps_at_ten() {
    assert_eq!(JobRegistry::default().cap(), crate::DEFAULT_JOB_CAP);
}

#[tokio::test]
async fn concurrent_starts_cannot_exceed_the_cap() {
    let reg = JobRegistry::new(1);
    let (owner, _) = new_owner("s");
    let (entered_tx, entered_rx) = oneshot::channel();
    let (gate_tx, gate_rx) = oneshot::channel();
    let (run, _first) = producer(OnCancel::SettleKilled);
    let first = tokio::spawn({
        let reg = Arc::clone(&reg);
        let owner = Arc::clone(&owner);
        async move { reg.start(&owner, bash("first"), gated(run, entered_tx, gate_rx)).await }
    });
    entered_rx.await.unwrap();

    // The first producer is still running: its reserved slot already counts.
    let (run, second) = producer(OnCancel::SettleKilled);
    assert_eq!(
        reg.start(&owner, bash("second"), run).await.unwrap_err().code(),
        ErrorCode::LimitExceeded
    );
    assert!(!second.ran.load(Ordering::SeqCst));

    gate_tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap().id, "bash-1");
    let (run, _third) = producer(OnCancel::SettleKilled);
    assert_eq!(
        reg.start(&owner, bash("third"), run).await.unwrap_err().code(),
        ErrorCode::LimitExceeded
    );
}

#[tokio::test]
async fn a_failed_producer_registers_nothing_and_frees_its_slot() {
    let reg = JobRegistry::new(1);
    let (owner, _) = new_owner("s");
    let called = Arc::new(AtomicBool::new(false));
    let err = reg.start(&owner, bash("x"), failing_run(&called)).await.unwrap_err();
    assert!(called.load(Ordering::SeqCst));
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "the producer's own error comes back");
    assert!(reg.list(&owner).is_empty());

    // The slot is free and no id was spent on the failure.
    let (run, _p) = producer(OnCancel::SettleKilled);
    assert_eq!(reg.start(&owner, bash("x"), run).await.unwrap().id, "bash-1");
}

#[tokio::test]
async fn an_abandoned_start_frees_its_slot() {
    let reg = JobRegistry::new(1);
    let (owner, _) = new_owner("s");
    let (entered_tx, _entered_rx) = oneshot::channel();
    let (_gate_tx, gate_rx) = oneshot::channel();
    let (run, _p) = producer(OnCancel::SettleKilled);
    let mut start = Box::pin(reg.start(&owner, bash("x"), gated(run, entered_tx, gate_rx)));
    assert!(futures::poll!(start.as_mut()).is_pending());
    drop(start);

    let (run, _p) = producer(OnCancel::SettleKilled);
    assert_eq!(reg.start(&owner, bash("x"), run).await.unwrap().id, "bash-1");
}

#[tokio::test]
async fn invalid_requests_are_refused_before_the_producer_runs() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let mut zero_cap = bash("x");
    zero_cap.output_cap = 0;
    for start in [
        JobStart::new("", "x"),
        JobStart::new("Bash", "x"),
        JobStart::new("1bash", "x"),
        JobStart::new("-bash", "x"),
        JobStart::new("ba sh", "x"),
        JobStart::new("bash", ""),
        JobStart::new("bash", "   "),
        zero_cap,
    ] {
        let called = Arc::new(AtomicBool::new(false));
        let err = reg.start(&owner, start.clone(), failing_run(&called)).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{start:?}");
        assert!(!called.load(Ordering::SeqCst), "{start:?}");
    }
    let (run, _p) = producer(OnCancel::SettleKilled);
    assert_eq!(
        reg.start(&owner, JobStart::new("sub-agent2", "x"), run).await.unwrap().id,
        "sub-agent2-1"
    );
}

#[tokio::test]
async fn a_disposed_owner_cannot_start_jobs() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    owner.dispose().await;
    let called = Arc::new(AtomicBool::new(false));
    let err = reg.start(&owner, bash("x"), failing_run(&called)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Disposing);
    assert_eq!(err.message(), "owner is not live");
    assert!(!called.load(Ordering::SeqCst));
}

#[tokio::test]
async fn settlement_commits_the_producers_result() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.finish(completed("exit code: 2"));
    let info = reg.wait(&owner, &id, LONG).await.unwrap();
    assert_eq!(info.status, JobStatus::Completed);
    assert_eq!(info.detail.as_deref(), Some("exit code: 2"));
    assert!(!info.cancel_requested);
}

#[tokio::test]
async fn elapsed_time_freezes_at_settlement() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.finish(completed("exit code: 0"));
    let first = reg.wait(&owner, &id, LONG).await.unwrap().elapsed_ms;
    std::thread::sleep(Duration::from_millis(5)); // lets wall time move; not synchronisation
    assert_eq!(reg.get(&owner, &id).unwrap().elapsed_ms, first);
}

#[tokio::test]
async fn settlement_is_first_wins() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (run, mut p) = producer(OnCancel::Throw);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    assert_eq!(reg.kill(&owner, &id).await.unwrap_err().code(), ErrorCode::Internal);
    assert_eq!(reg.get(&owner, &id).unwrap().status, JobStatus::Failed);

    // The producer settles later; the force-failed record does not change.
    p.finish(completed("exit code: 0"));
    p.observed().await;
    let info = reg.get(&owner, &id).unwrap();
    assert_eq!(info.status, JobStatus::Failed);
    assert!(info.detail.unwrap().contains("cancellation failed"));
    assert_eq!(sink.take().len(), 1, "one settlement, one notice");
}

/// A producer whose world was lost settles `lost`: the record and the completion notice
/// say so by status, with the cause as detail, not as a `killed` whose reason hides in text.
#[tokio::test]
async fn a_job_whose_world_was_lost_is_lost_in_its_record_and_notice() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (run, mut p) = producer(OnCancel::Ignore);
    let id = reg.start(&owner, bash("sleep 30"), run).await.unwrap().id;
    let why = "remote_unavailable: REMOTE_GONE: the sandbox daemon is gone";
    p.finish(JobSettlement { status: JobStatus::Lost, detail: Some(why.into()) });
    let info = reg.wait(&owner, &id, LONG).await.unwrap();
    assert_eq!(info.status, JobStatus::Lost);
    assert_eq!(info.status.as_str(), "lost");
    assert_eq!(info.detail.as_deref(), Some(why));
    assert_eq!(reg.list(&owner)[0].status, JobStatus::Lost);
    notice_step(&reg, &id).await;
    let notices = sink.take();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].1.text, format!("job bash-1 (sleep 30) lost: {why}"));
}

#[tokio::test]
async fn killing_a_settled_job_is_a_no_op() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.finish(completed("exit code: 0"));
    reg.wait(&owner, &id, LONG).await.unwrap();
    let info = reg.kill(&owner, &id).await.unwrap();
    assert_eq!(info.status, JobStatus::Completed);
    assert!(!info.cancel_requested);
    assert_eq!(p.cancels.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_wait_that_times_out_returns_running_without_killing() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;

    // This timeout is the behaviour under test, not a synchronisation sleep.
    let info = reg.wait(&owner, &id, Duration::from_millis(20)).await.unwrap();
    assert_eq!(info.status, JobStatus::Running);
    assert!(!info.cancel_requested);
    assert_eq!(p.cancels.load(Ordering::SeqCst), 0);

    p.finish(completed("exit code: 0"));
    assert_eq!(reg.wait(&owner, &id, LONG).await.unwrap().status, JobStatus::Completed);
}

#[tokio::test]
async fn kill_returns_cancellation_requested_then_the_job_settles_killed() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (run, p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("sleep 100"), run).await.unwrap().id;

    let info = reg.kill(&owner, &id).await.unwrap();
    assert_eq!(p.cancels.load(Ordering::SeqCst), 1, "the cancel hook is called immediately");
    assert_eq!(info.status, JobStatus::Running, "requested is not stopped");
    assert!(info.cancel_requested);

    let info = reg.wait(&owner, &id, LONG).await.unwrap();
    assert_eq!(info.status, JobStatus::Killed);
    assert!(info.cancel_requested);
    notice_step(&reg, &id).await;
    let notices = sink.take();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].1.text, "job bash-1 (sleep 100) killed: signal: SIGKILL");
}

#[tokio::test]
async fn a_throwing_cancel_hook_force_fails_the_job_as_possibly_orphaned() {
    let reg = JobRegistry::new(1);
    let (owner, sink) = new_owner("s");
    let (run, p) = producer(OnCancel::Throw);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;

    // The caller is told the kill was not delivered, with the producer's code.
    let err = reg.kill(&owner, &id).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Internal);
    assert_eq!(
        err.to_string(),
        "the kill of job bash-1 could not be delivered: kill(2) failed; job: marked failed; \
         its work may still run"
    );
    let info = reg.get(&owner, &id).unwrap();
    assert_eq!(p.cancels.load(Ordering::SeqCst), 1);
    assert_eq!(info.status, JobStatus::Failed);
    assert!(info.cancel_requested);
    let detail = info.detail.unwrap();
    assert!(detail.contains("cancellation failed: kill(2) failed"), "{detail}");
    assert!(detail.contains("work may be orphaned"), "{detail}");

    // Waiters are released even though the producer never settled.
    assert_eq!(reg.wait(&owner, &id, LONG).await.unwrap().status, JobStatus::Failed);
    let notices = sink.take();
    assert_eq!(notices.len(), 1);
    assert!(
        notices[0].1.text.starts_with("job bash-1 (x) failed: cancellation failed"),
        "{:?}",
        notices[0]
    );

    // The force-failed record no longer holds a slot.
    let (run, _p) = producer(OnCancel::SettleKilled);
    reg.start(&owner, bash("x"), run).await.unwrap();
}

#[tokio::test]
async fn notices_are_injected_while_busy_and_follow_up_while_idle_with_budget() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");

    let turn = sink.begin_turn();
    let id = run_to_completion(&reg, &owner, "exit code: 2").await;
    assert_eq!(
        sink.take(),
        [(
            NoticeRoute::Inject,
            Notice {
                source_id: id.clone(),
                text: format!("job {id} (build) completed: exit code: 2")
            }
        )]
    );

    drop(turn);
    let mut routes = Vec::new();
    for _ in 0..4 {
        run_to_completion(&reg, &owner, "exit code: 0").await;
        routes.extend(sink.take().into_iter().map(|(r, _)| r));
    }
    assert_eq!(
        routes,
        [NoticeRoute::Followup, NoticeRoute::Followup, NoticeRoute::Followup, NoticeRoute::Inject],
        "three wakes, then the budget is spent"
    );

    sink.claim_user_message();
    run_to_completion(&reg, &owner, "exit code: 0").await;
    assert_eq!(
        sink.take().into_iter().map(|(r, _)| r).collect::<Vec<_>>(),
        [NoticeRoute::Followup]
    );
}

#[tokio::test]
async fn no_notice_is_sent_when_the_settled_output_was_already_read() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.output.push("all done\n");
    p.finish(completed("exit code: 0"));

    // What job_output with wait: true does: wait, then a consuming read.
    assert_eq!(reg.wait(&owner, &id, LONG).await.unwrap().status, JobStatus::Completed);
    let (info, read) = reg.read_output(&owner, &id).unwrap();
    assert_eq!(info.status, JobStatus::Completed);
    assert_eq!(read.text, "all done\n");

    notice_step(&reg, &id).await;
    assert!(sink.take().is_empty());
}

#[tokio::test]
async fn a_read_while_running_does_not_suppress_the_notice() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (run, mut p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.output.push("partial");
    assert_eq!(reg.read_output(&owner, &id).unwrap().1.text, "partial");
    p.finish(completed("exit code: 0"));
    notice_step(&reg, &id).await;
    assert_eq!(sink.take().len(), 1);
}

#[tokio::test]
async fn read_output_consumes_and_peek_output_does_not() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, p) = producer(OnCancel::SettleKilled);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    p.output.push("a");
    assert_eq!(reg.peek_output(&owner, &id).unwrap().1.text, "a");
    assert_eq!(reg.peek_output(&owner, &id).unwrap().1.text, "a");
    assert_eq!(reg.read_output(&owner, &id).unwrap().1.text, "a");
    assert_eq!(reg.read_output(&owner, &id).unwrap().1.text, "");
    p.output.push("b");
    assert_eq!(reg.read_output(&owner, &id).unwrap().1.text, "b");
    assert_eq!(reg.peek_output(&owner, &id).unwrap().1.text, "ab");
}

#[tokio::test]
async fn a_job_without_output_reads_empty() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, _p) = Fake { on_cancel: OnCancel::SettleKilled, output: false }.start();
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    assert_eq!(reg.read_output(&owner, &id).unwrap().1, JobRead::default());
    assert_eq!(reg.peek_output(&owner, &id).unwrap().1, JobRead::default());
}

#[tokio::test]
async fn overlapping_turns_keep_the_owner_busy_until_the_last_ends() {
    let (_owner, sink) = new_owner("s");
    let a = sink.begin_turn();
    let b = sink.begin_turn();
    drop(a);
    assert!(sink.is_busy(), "one call ending must not make a still-busy owner idle");
    drop(b);
    assert!(!sink.is_busy());
}

#[tokio::test]
async fn owner_disposal_cancels_awaits_settlement_then_deletes_records() {
    let reg = JobRegistry::new(10);
    let (owner, sink) = new_owner("s");
    let (bystander, _) = new_owner("s");
    let (run, mut p) = producer(OnCancel::Ignore);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    let (run, other) = producer(OnCancel::SettleKilled);
    let other_id = reg.start(&bystander, bash("y"), run).await.unwrap().id;

    let mut dispose = Box::pin(owner.dispose());
    assert!(futures::poll!(dispose.as_mut()).is_pending());
    assert_eq!(p.cancels.load(Ordering::SeqCst), 1);
    // Let every other task run: the producer ignores the cancel, so disposal keeps waiting.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(futures::poll!(dispose.as_mut()).is_pending());
    let info = reg.get(&owner, &id).unwrap();
    assert_eq!(info.status, JobStatus::Running);
    assert!(info.cancel_requested);

    assert!(!p.output.released.load(Ordering::SeqCst), "output stays while the job lives");
    p.finish(JobSettlement { status: JobStatus::Killed, detail: None });
    dispose.await;
    assert_eq!(reg.get(&owner, &id).unwrap_err().code(), ErrorCode::NotFound);
    assert!(reg.list(&owner).is_empty());
    assert!(p.output.released.load(Ordering::SeqCst), "a deleted record releases its output");
    assert!(sink.take().is_empty(), "a disposed owner is not notified");

    // Another owner's jobs are untouched, even with the same session id.
    assert_eq!(reg.get(&bystander, &other_id).unwrap().status, JobStatus::Running);
    assert_eq!(other.cancels.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn owner_disposal_waits_for_an_in_flight_start_and_stops_its_job() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    // A first job puts the registry's dispose hook on the owner.
    let (run, _first) = producer(OnCancel::SettleKilled);
    reg.start(&owner, bash("first"), run).await.unwrap();

    let (entered_tx, entered_rx) = oneshot::channel();
    let (gate_tx, gate_rx) = oneshot::channel();
    let (run, second) = producer(OnCancel::SettleKilled);
    let start = tokio::spawn({
        let reg = Arc::clone(&reg);
        let owner = Arc::clone(&owner);
        async move { reg.start(&owner, bash("second"), gated(run, entered_tx, gate_rx)).await }
    });
    entered_rx.await.unwrap();

    let mut dispose = Box::pin(owner.dispose());
    assert!(futures::poll!(dispose.as_mut()).is_pending());
    gate_tx.send(()).unwrap();
    let id = start.await.unwrap().unwrap().id;
    dispose.await;
    assert_eq!(
        second.cancels.load(Ordering::SeqCst),
        1,
        "the job born during disposal was stopped"
    );
    assert_eq!(reg.get(&owner, &id).unwrap_err().code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn teardown_does_not_wait_for_a_producer_whose_cancel_failed() {
    let reg = JobRegistry::new(10);
    let (owner, _) = new_owner("s");
    let (run, p) = producer(OnCancel::Throw);
    let id = reg.start(&owner, bash("x"), run).await.unwrap().id;
    // The producer never settles; the force-failed record lets disposal finish anyway.
    owner.dispose().await;
    assert_eq!(p.cancels.load(Ordering::SeqCst), 1);
    assert_eq!(reg.get(&owner, &id).unwrap_err().code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn shutdown_cancels_and_awaits_every_job_then_rejects_new_starts() {
    let reg = JobRegistry::new(10);
    let (alice, _) = new_owner("a");
    let (bob, _) = new_owner("b");
    let (run, a) = producer(OnCancel::SettleKilled);
    reg.start(&alice, bash("x"), run).await.unwrap();
    let (run, mut b) = producer(OnCancel::Ignore);
    reg.start(&bob, bash("y"), run).await.unwrap();

    let mut shutdown = Box::pin(reg.shutdown());
    assert!(futures::poll!(shutdown.as_mut()).is_pending());
    assert_eq!(a.cancels.load(Ordering::SeqCst), 1);
    assert_eq!(b.cancels.load(Ordering::SeqCst), 1);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(futures::poll!(shutdown.as_mut()).is_pending(), "bob's producer has not settled");
    b.finish(JobSettlement { status: JobStatus::Killed, detail: None });
    shutdown.await;
    assert!(reg.list(&alice).is_empty());
    assert!(reg.list(&bob).is_empty());

    let called = Arc::new(AtomicBool::new(false));
    let err = reg.start(&alice, bash("x"), failing_run(&called)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Disposing);
    assert!(!called.load(Ordering::SeqCst));

    // Owner disposal after shutdown finds nothing left to do.
    alice.dispose().await;
}
