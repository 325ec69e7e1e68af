//! Service-logic tests over an in-process backend whose sessions record what was done to
//! them; the real-PTY behaviour is covered by the integration tests (tests/it/terminals.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conch_seams::{CommandEnd, ExitStatus, Notice, NoticeSink, SessionStatus, WaitReason};
use tokio::sync::Notify;

use super::*;

#[derive(Debug, Default)]
struct Counters {
    opened: AtomicUsize,
    closed: AtomicUsize,
    rolled_back_setups: AtomicUsize,
    failing_closes: AtomicUsize,
}

/// A backend whose `open` can be held until released (to test unpublished setup).
#[derive(Debug, Default)]
struct TestBackend {
    counters: Arc<Counters>,
    hold_open: AtomicBool,
    release: Notify,
    entered: Notify,
    last: Mutex<Option<Arc<TestSession>>>,
}

#[derive(Debug)]
struct TestSession {
    counters: Arc<Counters>,
    closed: AtomicBool,
    in_send: Notify,
}

#[async_trait]
impl TerminalSession for TestSession {
    fn motd(&self) -> String {
        "welcome".into()
    }
    async fn send(&self, req: SendRequest, cancel: CancellationToken) -> Result<SendOutcome> {
        let text = req.text;
        if text == "block" {
            self.in_send.notify_one();
            cancel.cancelled().await;
        }
        Ok(SendOutcome::Ready(conch_seams::SendSettle {
            delta: text,
            wait_reason: WaitReason::StdinRead,
            at_prompt: true,
            session_status: self.status(),
            full_screen: false,
        }))
    }
    async fn run_command(
        &self,
        command: &str,
        _timeout: Duration,
        _cancel: CancellationToken,
    ) -> Result<CommandOutcome> {
        Ok(CommandOutcome {
            output: command.to_owned(),
            omitted_bytes: 0,
            end: CommandEnd::Exited(0),
            session_status: self.status(),
            state: None,
            spill: None,
        })
    }
    fn read(&self, _offset: usize, _max: usize) -> ScrollbackPage {
        ScrollbackPage {
            text: "line".into(),
            total_lines: 1,
            line_begin: 0,
            line_end: 1,
            truncated: false,
        }
    }
    fn screen(&self) -> Option<conch_seams::ScreenView> {
        None
    }
    async fn resize(&self, _size: conch_seams::TerminalSize) -> Result<()> {
        Err(Error::new(ErrorCode::Unsupported, "this terminal cannot be resized"))
    }
    async fn signal(&self, signal: Signal) -> Result<SignalDelivery> {
        if signal == Signal::Kill {
            return Err(Error::invalid("use close"));
        }
        Ok(SignalDelivery { pgid: 42, leader: false })
    }
    fn status(&self) -> SessionStatus {
        if self.closed.load(Ordering::Acquire) {
            SessionStatus::Exited(ExitStatus::signal("SIGHUP"))
        } else {
            SessionStatus::Running
        }
    }
    async fn close(&self) -> Result<CloseReport> {
        // Each armed failure makes one close report a survivor, like a teardown that
        // could not prove quiescence.
        if self
            .counters
            .failing_closes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::internal("survivors: 1234"));
        }
        self.closed.store(true, Ordering::Release);
        self.counters.closed.fetch_add(1, Ordering::AcqRel);
        Ok(CloseReport { root_exit: self.status(), survivors: Vec::new() })
    }
    fn sandbox_mode(&self) -> Option<conch_seams::SandboxMode> {
        None
    }
}

#[async_trait]
impl TerminalBackend for TestBackend {
    fn type_name(&self) -> &'static str {
        "bash"
    }
    fn dialect(&self) -> Dialect {
        Dialect::Bash
    }
    async fn open(&self, spec: TerminalOpenSpec) -> Result<Arc<dyn TerminalSession>> {
        if self.hold_open.load(Ordering::Acquire) {
            self.entered.notify_one();
            tokio::select! {
                () = self.release.notified() => {}
                () = spec.cancel.cancelled() => {
                    // Rollback takes a moment; the service must await it.
                    tokio::task::yield_now().await;
                    self.counters.rolled_back_setups.fetch_add(1, Ordering::AcqRel);
                    return Err(Error::new(ErrorCode::Cancelled, "setup aborted"));
                }
            }
        }
        self.counters.opened.fetch_add(1, Ordering::AcqRel);
        let session = Arc::new(TestSession {
            counters: Arc::clone(&self.counters),
            closed: AtomicBool::new(false),
            in_send: Notify::new(),
        });
        *self.last.lock().unwrap() = Some(Arc::clone(&session));
        Ok(session)
    }
}

/// The owners here start no jobs, so no notice ever reaches their sink.
#[derive(Debug)]
struct NoNotices;

impl NoticeSink for NoNotices {
    fn deliver(&self, _notice: Notice) {}
}

fn service() -> (TerminalService, Arc<TestBackend>) {
    let backend = Arc::new(TestBackend::default());
    (TerminalService::new(Arc::clone(&backend) as Arc<dyn TerminalBackend>), backend)
}

fn owner(id: &str) -> Arc<Owner> {
    Owner::new(id, Arc::new(NoNotices))
}

/// Starts a default open on its own task (for setups held by the test backend).
fn open_in_background(
    svc: &TerminalService,
    owner: &Arc<Owner>,
) -> tokio::task::JoinHandle<Result<TerminalInfo>> {
    let (svc, owner) = (svc.clone(), Arc::clone(owner));
    tokio::spawn(
        async move { svc.open(&owner, OpenRequest::default(), CancellationToken::new()).await },
    )
}

fn named(name: &str) -> OpenRequest {
    let mut r = OpenRequest::default();
    r.name = Some(name.into());
    r
}

fn reason(e: &Error) -> &'static str {
    e.reason().map_or("", ErrorReason::as_str)
}

#[tokio::test]
async fn ids_are_pty_n_and_names_are_unique_per_owner() {
    let (svc, _) = service();
    let (a, b) = (owner("a"), owner("b"));
    let one = svc.open(&a, named("build"), CancellationToken::new()).await.unwrap();
    assert_eq!(one.id, "pty-1");
    assert_eq!(one.name.as_deref(), Some("build"));
    assert_eq!(one.motd, "welcome");
    let e = svc.open(&a, named("build"), CancellationToken::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert_eq!(reason(&e), "DUPLICATE_NAME");
    // Another owner may use the same name; ids stay globally unique.
    let other = svc.open(&b, named("build"), CancellationToken::new()).await.unwrap();
    assert_eq!(other.id, "pty-2");
    let e = svc.open(&a, named("bad name!"), CancellationToken::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = svc.open(&a, named(&"x".repeat(65)), CancellationToken::new()).await.unwrap_err();
    assert_eq!(reason(&e), "BAD_NAME");
}

#[tokio::test]
async fn names_address_the_owners_own_sessions() {
    let (svc, _) = service();
    let (a, b) = (owner("a"), owner("b"));
    svc.open(&a, named("build"), CancellationToken::new()).await.unwrap();
    let theirs = svc.open(&b, named("build"), CancellationToken::new()).await.unwrap();
    svc.open(&b, named("only-b"), CancellationToken::new()).await.unwrap();
    // Each owner's "build" is its own session.
    assert!(svc.read(&a, "build", 0, 10).is_ok());
    svc.close(&b, "build").await.unwrap();
    let left: Vec<String> = svc.list(&b).into_iter().map(|i| i.id).collect();
    assert!(!left.contains(&theirs.id), "closing b's \"build\" closed b's session: {left:?}");
    assert_eq!(svc.list(&a).len(), 1, "a's \"build\" is untouched");
    // Another owner's name is simply not a session of mine (no foreign leak of names).
    let e = svc.read(&a, "only-b", 0, 10).unwrap_err();
    assert_eq!(reason(&e), "NO_SESSION");
    let e = svc.open(&a, named("pty-7"), CancellationToken::new()).await.unwrap_err();
    assert_eq!(reason(&e), "BAD_NAME", "id-shaped names are refused");
}

#[tokio::test]
async fn unknown_type_is_no_backend() {
    let (svc, backend) = service();
    let mut req = OpenRequest::default();
    req.type_name = Some("pwsh".into());
    let e = svc.open(&owner("a"), req, CancellationToken::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert_eq!(reason(&e), "NO_BACKEND");
    assert!(e.message().contains("\"bash\""), "{e}");
    assert_eq!(backend.counters.opened.load(Ordering::Acquire), 0);
}

#[tokio::test]
async fn every_operation_is_fenced_to_the_exact_owner() {
    let (svc, _) = service();
    // Same session string, different owner object: still foreign.
    let (a, imposter) = (owner("s"), owner("s"));
    let id = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap().id;
    let foreign = |e: Error| {
        assert_eq!(e.code(), ErrorCode::ForeignOwner);
        assert_eq!(reason(&e), "FOREIGN_SESSION");
    };
    foreign(svc.reserve_send(&imposter, &id).unwrap_err());
    foreign(svc.read(&imposter, &id, 0, 10).unwrap_err());
    foreign(svc.signal(&imposter, &id, Signal::Int).await.unwrap_err());
    foreign(svc.close(&imposter, &id).await.unwrap_err());
    assert!(svc.list(&imposter).is_empty());
    assert_eq!(svc.list(&a).len(), 1);
    let e = svc.read(&a, "pty-99", 0, 10).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert_eq!(reason(&e), "NO_SESSION");
    assert_eq!(svc.signal(&a, &id, Signal::Int).await.unwrap().pgid, 42);
    let e = svc.signal(&a, &id, Signal::Kill).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    // The reason is a value; the message shows it for humans only.
    let e = svc.read(&a, "pty-99", 0, 10).unwrap_err();
    assert_eq!(e.reason(), Some(ErrorReason::NoSession));
    assert!(!e.message().starts_with("NO_SESSION"), "{}", e.message());
    assert!(e.to_string().starts_with("NO_SESSION: "), "{e}");
}

#[tokio::test]
async fn one_send_at_a_time_and_the_slot_is_released_on_drop() {
    let (svc, _) = service();
    let a = owner("a");
    let id = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap().id;
    let slot = svc.reserve_send(&a, &id).unwrap();
    let e = svc.reserve_send(&a, &id).unwrap_err();
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert_eq!(reason(&e), "SEND_ACTIVE");
    let SendOutcome::Ready(settle) =
        slot.send(SendRequest::line("hi"), CancellationToken::new()).await.unwrap()
    else {
        panic!("the test session always settles")
    };
    assert_eq!(settle.delta, "hi");
    // A framed command also holds (and releases) the one slot.
    let slot = svc.reserve_send(&a, &id).unwrap();
    assert_eq!(reason(&svc.reserve_send(&a, &id).unwrap_err()), "SEND_ACTIVE");
    let out = slot
        .run_command("pwd".into(), Duration::from_secs(1), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((out.output.as_str(), out.end), ("pwd", CommandEnd::Exited(0)));
    // Finished: the slot is free again; dropping an unused slot frees it too.
    drop(svc.reserve_send(&a, &id).unwrap());
    let slot = svc.reserve_send(&a, &id).unwrap();
    drop(slot);
    svc.reserve_send(&a, &id).unwrap();
}

#[tokio::test]
async fn a_send_in_flight_holds_the_slot() {
    let (svc, backend) = service();
    let a = owner("a");
    let id = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap().id;
    let session = backend.last.lock().unwrap().clone().unwrap();
    let slot = svc.reserve_send(&a, &id).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(slot.send(SendRequest::line("block"), cancel.clone()));
    // Wait until the send is inside the backend.
    session.in_send.notified().await;
    assert_eq!(reason(&svc.reserve_send(&a, &id).unwrap_err()), "SEND_ACTIVE");
    cancel.cancel();
    task.await.unwrap().unwrap();
    svc.reserve_send(&a, &id).unwrap();
}

#[tokio::test]
async fn close_removes_only_after_success_and_is_retryable() {
    let (svc, backend) = service();
    let a = owner("a");
    let id = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap().id;
    backend.counters.failing_closes.store(1, Ordering::Release);
    let e = svc.close(&a, &id).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Internal);
    // Still listed and addressable: the caller can retry.
    assert_eq!(svc.list(&a).len(), 1);
    let report = svc.close(&a, &id).await.unwrap();
    assert!(report.survivors.is_empty());
    assert!(svc.list(&a).is_empty());
    assert_eq!(reason(&svc.close(&a, &id).await.unwrap_err()), "NO_SESSION");
}

#[tokio::test]
async fn owner_disposal_closes_owned_sessions_only() {
    let (svc, backend) = service();
    let (a, b) = (owner("a"), owner("b"));
    for _ in 0..3 {
        svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap();
    }
    svc.open(&b, OpenRequest::default(), CancellationToken::new()).await.unwrap();
    a.dispose().await;
    assert_eq!(backend.counters.closed.load(Ordering::Acquire), 3);
    assert!(svc.list(&a).is_empty());
    assert_eq!(svc.list(&b).len(), 1);
    let e = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Disposing);
    assert_eq!(reason(&e), "OWNER_NOT_LIVE");
}

#[tokio::test]
async fn owner_disposal_aborts_unpublished_setup_and_awaits_rollback() {
    let (svc, backend) = service();
    backend.hold_open.store(true, Ordering::Release);
    let a = owner("a");
    let opening = open_in_background(&svc, &a);
    backend.entered.notified().await;
    a.dispose().await;
    // Disposal returned only after the setup rolled back.
    assert_eq!(backend.counters.rolled_back_setups.load(Ordering::Acquire), 1);
    let e = opening.await.unwrap().unwrap_err();
    assert_eq!(e.code(), ErrorCode::Cancelled);
    assert!(svc.inner.lock().pending.is_empty());
}

#[tokio::test]
async fn caller_cancellation_aborts_setup() {
    let (svc, backend) = service();
    backend.hold_open.store(true, Ordering::Release);
    let a = owner("a");
    let cancel = CancellationToken::new();
    let opening = {
        let (svc, a, cancel) = (svc.clone(), Arc::clone(&a), cancel.clone());
        tokio::spawn(async move { svc.open(&a, named("x"), cancel).await })
    };
    backend.entered.notified().await;
    cancel.cancel();
    assert_eq!(opening.await.unwrap().unwrap_err().code(), ErrorCode::Cancelled);
    // The name was released with the reservation.
    backend.hold_open.store(false, Ordering::Release);
    svc.open(&a, named("x"), CancellationToken::new()).await.unwrap();
}

#[tokio::test]
async fn a_setup_that_finishes_after_disposal_began_is_rolled_back() {
    let (svc, backend) = service();
    backend.hold_open.store(true, Ordering::Release);
    let a = owner("a");
    let opening = open_in_background(&svc, &a);
    backend.entered.notified().await;
    // The backend finishes before it notices cancellation; shutdown flips `disposing` first.
    svc.inner.lock().disposing = true;
    backend.release.notify_one();
    let e = opening.await.unwrap().unwrap_err();
    assert_eq!(reason(&e), "SERVICE_DISPOSING");
    assert_eq!(backend.counters.opened.load(Ordering::Acquire), 1);
    assert_eq!(backend.counters.closed.load(Ordering::Acquire), 1, "rolled back");
    assert!(svc.list(&a).is_empty());
}

#[tokio::test]
async fn shutdown_closes_everything_and_refuses_new_work() {
    let (svc, backend) = service();
    let (a, b) = (owner("a"), owner("b"));
    svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap();
    svc.open(&b, OpenRequest::default(), CancellationToken::new()).await.unwrap();
    backend.hold_open.store(true, Ordering::Release);
    let opening = open_in_background(&svc, &a);
    backend.entered.notified().await;
    tokio::time::timeout(Duration::from_secs(30), svc.shutdown()).await.unwrap();
    assert_eq!(backend.counters.closed.load(Ordering::Acquire), 2);
    assert_eq!(backend.counters.rolled_back_setups.load(Ordering::Acquire), 1);
    assert!(opening.await.unwrap().is_err());
    let e = svc.open(&a, OpenRequest::default(), CancellationToken::new()).await.unwrap_err();
    assert_eq!(reason(&e), "SERVICE_DISPOSING");
}
