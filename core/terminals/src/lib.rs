//! The `terminals` provider: [`TerminalService`], the owner-scoped registry of persistent
//! PTY sessions over one [`TerminalBackend`].
//!
//! The service owns identity (opaque `pty-N` ids and optional owner-unique names), the
//! exact-owner fence, the one-send-per-session slot and the lifecycle:
//! reserve → initialize → publish → rollback for opens, close-after-quiescence for closes,
//! and owner/service disposal that aborts unpublished setups, awaits their rollback, then
//! closes what was published. The backend owns everything about the PTY itself.
//!
//! Every refusal carries a typed [`ErrorReason`] (`NO_SESSION`, `FOREIGN_SESSION`,
//! `DUPLICATE_NAME`, `SEND_ACTIVE`, `OWNER_NOT_LIVE`, `SERVICE_DISPOSING`, `NO_BACKEND`,
//! `BAD_NAME`) beside its [`ErrorCode`]; callers match on it, never on the message (which
//! shows it in front for humans).
//!
//! A failed close keeps the record, so the close can be retried.
#![deny(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    CloseReport, CommandOutcome, Dialect, Error, ErrorCode, ErrorReason, OpenRequest, Owner,
    Result, ScreenView, ScrollbackPage, SendOutcome, SendRequest, SendSlot, Signal, SignalDelivery,
    TerminalBackend, TerminalInfo, TerminalOpenSpec, TerminalSession, TerminalSize, Terminals,
};
use conch_sync::LockExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Plugin name.
pub const NAME: &str = "terminals";

/// Longest accepted session name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// `terminals` plugin config (no keys yet; unknown keys are rejected).
pub type TerminalsConfig = conch_registry::NoConfig;

/// One published session.
struct Record {
    id: String,
    owner_key: u64,
    name: Option<String>,
    type_name: String,
    motd: String,
    session: Arc<dyn TerminalSession>,
    /// The single send slot.
    sending: AtomicBool,
    /// Serializes closes so a retry never races a close in flight.
    closing: tokio::sync::Mutex<()>,
}

impl Record {
    fn info(&self) -> TerminalInfo {
        TerminalInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            type_name: self.type_name.clone(),
            motd: self.motd.clone(),
            status: self.session.status(),
            sandbox: self.session.sandbox_mode(),
        }
    }
}

/// An open that reserved its id and name but has not published yet.
#[derive(Clone)]
struct Pending {
    owner_key: u64,
    name: Option<String>,
    /// Aborts the backend's setup.
    abort: CancellationToken,
    /// Cancelled once the setup either published or finished rolling back.
    settled: CancellationToken,
}

#[derive(Default)]
struct State {
    next: u64,
    disposing: bool,
    sessions: HashMap<String, Arc<Record>>,
    pending: HashMap<String, Pending>,
    hooked: HashSet<u64>,
}

impl State {
    fn name_taken(&self, owner_key: u64, name: &str) -> bool {
        self.sessions.values().any(|r| r.owner_key == owner_key && r.name.as_deref() == Some(name))
            || self
                .pending
                .values()
                .any(|p| p.owner_key == owner_key && p.name.as_deref() == Some(name))
    }
}

struct Inner {
    backend: Arc<dyn TerminalBackend>,
    state: Mutex<State>,
}

/// The terminals service over one backend.
#[derive(Clone)]
pub struct TerminalService {
    inner: Arc<Inner>,
}

impl fmt::Debug for TerminalService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("TerminalService")
            .field("backend", &self.inner.backend.type_name())
            .field("sessions", &st.sessions.len())
            .field("pending", &st.pending.len())
            .field("disposing", &st.disposing)
            .finish()
    }
}

fn err(code: ErrorCode, reason: ErrorReason, message: impl fmt::Display) -> Error {
    Error::new(code, message.to_string()).with_reason(reason).with_provider(NAME)
}

fn validate_name(name: &str) -> Result<()> {
    let ok_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars {
        return Err(err(
            ErrorCode::InvalidArgument,
            ErrorReason::BadName,
            format!(
                "session name {name:?} must be 1-{MAX_NAME_LEN} characters of letters, digits, `-`, `_` or `.`"
            ),
        ));
    }
    if is_session_id(name) {
        return Err(err(
            ErrorCode::InvalidArgument,
            ErrorReason::BadName,
            format!("session name {name:?} looks like a session id; pty-N is reserved for ids"),
        ));
    }
    Ok(())
}

/// `pty-N`: the shape of registry-issued ids.
fn is_session_id(s: &str) -> bool {
    s.strip_prefix("pty-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// The record if it exists and belongs to `owner_key`; `id` may also be one of the
    /// owner's session names (names are owner-unique and never look like ids).
    fn owned(&self, owner_key: u64, id: &str) -> Result<Arc<Record>> {
        let st = self.lock();
        let by_name = || {
            st.sessions.values().find(|r| r.owner_key == owner_key && r.name.as_deref() == Some(id))
        };
        let found =
            st.sessions.get(id).or_else(|| if is_session_id(id) { None } else { by_name() });
        match found {
            Some(r) if r.owner_key == owner_key => Ok(Arc::clone(r)),
            Some(_) => Err(err(
                ErrorCode::ForeignOwner,
                ErrorReason::ForeignSession,
                format!("terminal session `{id}` belongs to another agent"),
            )),
            None if st.pending.contains_key(id) => Err(err(
                ErrorCode::NotFound,
                ErrorReason::NoSession,
                format!("terminal session `{id}` is still starting"),
            )),
            None => Err(err(
                ErrorCode::NotFound,
                ErrorReason::NoSession,
                format!("no terminal session `{id}`; terminal_list shows your sessions"),
            )),
        }
    }

    /// Closes a record and removes it only once the backend reported quiescence.
    async fn close_record(&self, record: &Arc<Record>) -> Result<CloseReport> {
        let span = tracing::debug_span!("terminal_close", session = %record.id);
        self.close_record_inner(record).instrument(span).await
    }

    async fn close_record_inner(&self, record: &Arc<Record>) -> Result<CloseReport> {
        let _serial = record.closing.lock().await;
        if !self.lock().sessions.contains_key(&record.id) {
            // A concurrent close finished first: the session is already quiescent and gone.
            return Err(err(
                ErrorCode::NotFound,
                ErrorReason::NoSession,
                format!("terminal session `{}` was already closed", record.id),
            ));
        }
        let report = record.session.close().await?;
        let mut st = self.lock();
        if st.sessions.get(&record.id).is_some_and(|r| Arc::ptr_eq(r, record)) {
            st.sessions.remove(&record.id);
        }
        Ok(report)
    }

    /// Aborts the owner's (or everyone's) unpublished setups and awaits their rollback,
    /// repeating until none remain, then closes the published sessions.
    async fn dispose_where(&self, matches: impl Fn(u64) -> bool) {
        self.dispose_where_inner(matches)
            .instrument(tracing::debug_span!("terminals_dispose"))
            .await;
    }

    async fn dispose_where_inner(&self, matches: impl Fn(u64) -> bool) {
        loop {
            let settled: Vec<CancellationToken> = {
                let st = self.lock();
                st.pending
                    .values()
                    .filter(|p| matches(p.owner_key))
                    .map(|p| {
                        p.abort.cancel();
                        p.settled.clone()
                    })
                    .collect()
            };
            if settled.is_empty() {
                break;
            }
            for s in settled {
                s.cancelled().await;
            }
        }
        let records: Vec<Arc<Record>> = {
            let st = self.lock();
            st.sessions.values().filter(|r| matches(r.owner_key)).map(Arc::clone).collect()
        };
        let closes = records.iter().map(|r| async move {
            // One retry: teardown escalates anyway, and a second pass catches late forks.
            if self.close_record(r).await.is_err() {
                let _ = self.close_record(r).await;
            }
        });
        futures::future::join_all(closes).await;
        // Nobody can address these records any more; drop what could not be proven closed.
        let mut st = self.lock();
        st.sessions.retain(|_, r| !matches(r.owner_key));
    }
}

impl TerminalService {
    /// A service over `backend`.
    pub fn new(backend: Arc<dyn TerminalBackend>) -> Self {
        Self { inner: Arc::new(Inner { backend, state: Mutex::new(State::default()) }) }
    }

    /// Reserves an id (and name) for `owner`, installing the owner's disposal hook once.
    fn reserve(&self, owner: &Arc<Owner>, name: Option<&str>) -> Result<(String, Pending)> {
        let mut st = self.inner.lock();
        if st.disposing {
            return Err(err(
                ErrorCode::Disposing,
                ErrorReason::ServiceDisposing,
                "the terminals service is shutting down",
            ));
        }
        if !owner.is_live() {
            return Err(err(
                ErrorCode::Disposing,
                ErrorReason::OwnerNotLive,
                "this agent is being disposed",
            ));
        }
        let key = owner.key();
        if let Some(name) = name
            && st.name_taken(key, name)
        {
            return Err(err(
                ErrorCode::AlreadyExists,
                ErrorReason::DuplicateName,
                format!("you already have a terminal session named {name:?}"),
            ));
        }
        if !st.hooked.contains(&key) {
            let weak = Arc::downgrade(&self.inner);
            let kept = owner.on_dispose(move || {
                Box::pin(async move {
                    if let Some(inner) = weak.upgrade() {
                        inner.dispose_where(|k| k == key).await;
                        inner.lock().hooked.remove(&key);
                    }
                })
            });
            if !kept {
                return Err(err(
                    ErrorCode::Disposing,
                    ErrorReason::OwnerNotLive,
                    "this agent is being disposed",
                ));
            }
            st.hooked.insert(key);
        }
        st.next += 1;
        let id = format!("pty-{}", st.next);
        let pending = Pending {
            owner_key: key,
            name: name.map(str::to_owned),
            abort: CancellationToken::new(),
            settled: CancellationToken::new(),
        };
        st.pending.insert(id.clone(), pending.clone());
        Ok((id, pending))
    }
}

/// The reserved send slot of one session.
struct Slot {
    record: Arc<Record>,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").field("session", &self.record.id).finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.record.sending.store(false, Ordering::Release);
    }
}

#[async_trait]
impl SendSlot for Slot {
    async fn send(
        self: Box<Self>,
        req: SendRequest,
        cancel: CancellationToken,
    ) -> Result<SendOutcome> {
        // `self` (and so the slot) lives until the send returns or is dropped. The text's
        // length only: what is typed can hold anything.
        let span = tracing::debug_span!(
            "terminal_send",
            session = %self.record.id,
            bytes = req.text.len(),
            keys = req.keys.len()
        );
        self.record.session.send(req, cancel).instrument(span).await
    }

    async fn run_command(
        self: Box<Self>,
        command: String,
        timeout: std::time::Duration,
        cancel: CancellationToken,
    ) -> Result<CommandOutcome> {
        let span = tracing::debug_span!("terminal_command", session = %self.record.id, bytes = command.len());
        self.record.session.run_command(&command, timeout, cancel).instrument(span).await
    }
}

#[async_trait]
impl Terminals for TerminalService {
    fn dialect(&self) -> Dialect {
        self.inner.backend.dialect()
    }

    async fn open(
        &self,
        owner: &Arc<Owner>,
        req: OpenRequest,
        cancel: CancellationToken,
    ) -> Result<TerminalInfo> {
        let backend_type = self.inner.backend.type_name();
        if let Some(t) = req.type_name.as_deref()
            && t != backend_type
        {
            return Err(err(
                ErrorCode::NotFound,
                ErrorReason::NoBackend,
                format!("no terminal backend of type {t:?}; this runtime offers {backend_type:?}"),
            ));
        }
        if let Some(name) = req.name.as_deref() {
            validate_name(name)?;
        }
        let (id, pending) = self.reserve(owner, req.name.as_deref())?;
        let mut spec = TerminalOpenSpec::default();
        spec.cwd = req.cwd;
        spec.size = req.size;
        spec.term = req.term;
        spec.managed_env = req.managed_env;
        spec.restore = req.restore;
        spec.cancel = pending.abort.clone();

        // Initialize, forwarding the caller's and the owner's cancellation into the setup.
        let opened = {
            let fut = self.inner.backend.open(spec);
            tokio::pin!(fut);
            let mut forwarded = false;
            loop {
                tokio::select! {
                    r = &mut fut => break r,
                    () = cancel.cancelled(), if !forwarded => {
                        forwarded = true;
                        pending.abort.cancel();
                    }
                    () = owner.cancel_token().cancelled(), if !forwarded => {
                        forwarded = true;
                        pending.abort.cancel();
                    }
                }
            }
        };

        // Publish, or roll back what the backend made. The pending entry stays until the
        // rollback finished, so a disposal that saw it awaits the rollback too.
        let session = match opened {
            Ok(session) => session,
            Err(e) => {
                self.inner.lock().pending.remove(&id);
                pending.settled.cancel();
                return Err(e);
            }
        };
        let published = {
            let mut st = self.inner.lock();
            if st.disposing {
                Err(err(
                    ErrorCode::Disposing,
                    ErrorReason::ServiceDisposing,
                    "the terminals service shut down while the session was starting",
                ))
            } else if !owner.is_live() {
                Err(err(
                    ErrorCode::Disposing,
                    ErrorReason::OwnerNotLive,
                    "this agent was disposed while the session was starting",
                ))
            } else if pending.abort.is_cancelled() {
                Err(Error::new(ErrorCode::Cancelled, "terminal_open was cancelled")
                    .with_provider(NAME))
            } else {
                let record = Arc::new(Record {
                    id: id.clone(),
                    owner_key: owner.key(),
                    name: pending.name.clone(),
                    type_name: backend_type.to_owned(),
                    motd: session.motd(),
                    session: Arc::clone(&session),
                    sending: AtomicBool::new(false),
                    closing: tokio::sync::Mutex::new(()),
                });
                let info = record.info();
                st.pending.remove(&id);
                st.sessions.insert(id.clone(), record);
                Ok(info)
            }
        };
        if published.is_err() {
            // The session never became visible, so nobody else will close it.
            let _ = session.close().await;
            self.inner.lock().pending.remove(&id);
        }
        pending.settled.cancel();
        published
    }

    fn reserve_send(&self, owner: &Owner, id: &str) -> Result<Box<dyn SendSlot>> {
        let record = self.inner.owned(owner.key(), id)?;
        if record
            .sending
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(err(
                ErrorCode::AlreadyExists,
                ErrorReason::SendActive,
                format!(
                    "terminal session `{id}` is already running a send; wait for it (job_output) or interrupt it (terminal_signal)"
                ),
            ));
        }
        Ok(Box::new(Slot { record }))
    }

    fn read(
        &self,
        owner: &Owner,
        id: &str,
        offset_lines: usize,
        max_lines: usize,
    ) -> Result<ScrollbackPage> {
        let record = self.inner.owned(owner.key(), id)?;
        Ok(record.session.read(offset_lines, max_lines))
    }

    fn screen(&self, owner: &Owner, id: &str) -> Result<ScreenView> {
        let record = self.inner.owned(owner.key(), id)?;
        record.session.screen().ok_or_else(|| {
            Error::new(ErrorCode::Unsupported, "this terminal backend keeps no screen")
                .with_provider(NAME)
        })
    }

    async fn resize(&self, owner: &Owner, id: &str, size: TerminalSize) -> Result<()> {
        let record = self.inner.owned(owner.key(), id)?;
        record.session.resize(size).await
    }

    async fn signal(&self, owner: &Owner, id: &str, signal: Signal) -> Result<SignalDelivery> {
        let record = self.inner.owned(owner.key(), id)?;
        record.session.signal(signal).await
    }

    fn list(&self, owner: &Owner) -> Vec<TerminalInfo> {
        let mut infos: Vec<(u64, TerminalInfo)> = {
            let st = self.inner.lock();
            st.sessions
                .values()
                .filter(|r| r.owner_key == owner.key())
                .map(|r| (r.id[4..].parse().unwrap_or(u64::MAX), r.info()))
                .collect()
        };
        infos.sort_by_key(|(n, _)| *n);
        infos.into_iter().map(|(_, i)| i).collect()
    }

    async fn close(&self, owner: &Owner, id: &str) -> Result<CloseReport> {
        let record = self.inner.owned(owner.key(), id)?;
        self.inner.close_record(&record).await
    }

    async fn shutdown(&self) {
        self.inner.lock().disposing = true;
        self.inner.dispose_where(|_| true).await;
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _config: TerminalsConfig = ctx.config()?;
    let service = Arc::new(TerminalService::new(ctx.terminal_backend()?));
    let for_teardown = Arc::clone(&service);
    Ok(PluginOutput::seam(SeamHandle::Terminals(service))
        .with_teardown(move || Box::pin(async move { for_teardown.shutdown().await })))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Terminals),
    requires: &[SeamId::TerminalBackend],
    description: "owner-scoped persistent terminal sessions: pty-N ids, names, fence, one send per session, teardown",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

#[cfg(test)]
mod tests;
