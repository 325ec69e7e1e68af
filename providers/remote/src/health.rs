//! What the client knows about its daemon: reachable, known to be gone, or replaced.
//!
//! Silence (a hung daemon, a black-holed network) proves nothing: the daemon may answer
//! again, so only `give_up_ms` of it fails calls. A refused connection is different: the
//! host answered that nothing listens at the daemon's address, so the daemon process is
//! gone (its processes with it, as far as this client can reach them). Control calls and
//! the stream connection both report what each attempt met, and both act on the verdict.
//!
//! # Invariants
//! - The daemon is *known gone* once every attempt for [`GONE_AFTER`], and at least
//!   [`GONE_ATTEMPTS`] of them, was refused (or reset while connecting) with nothing
//!   reached in between; any attempt that reaches a daemon clears it. Pending waits and
//!   calls then fail `remote_unavailable` with reason `REMOTE_GONE` (not retryable), within
//!   seconds instead of after `give_up_ms`.
//! - A daemon that answers with another boot id, or refuses the client for good
//!   (`unauthenticated` on the stream), makes the provider *dead*: that never clears, and
//!   every later call fails with that error at once.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use conch_seams::{Error, ErrorBody, ErrorCode, ErrorReason};
use conch_sync::LockExt;
use tokio::sync::watch;

use super::conn::{self, Mirrors};

/// How long attempts must have been refused, without one reaching a daemon, before the
/// daemon counts as gone: long enough that a listener being rebound does not count, short
/// enough that calls learn it well within five seconds.
pub(crate) const GONE_AFTER: Duration = Duration::from_millis(1000);

/// The fewest refused attempts that make the daemon known gone.
pub(crate) const GONE_ATTEMPTS: u32 = 3;

/// The longest pause between attempts while they are being refused (and the daemon is not
/// yet known gone), whatever `reconnect_max_backoff_ms` says: a refusal costs one round
/// trip, and the verdict should not wait for a long backoff.
pub(crate) const REFUSED_RETRY: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
struct State {
    /// When the current run of refused attempts began, and how many it holds.
    refused: Option<(Instant, u32)>,
    /// Set while the daemon is known gone (cleared when an attempt reaches a daemon).
    gone: Option<ErrorBody>,
    /// Set for good: the daemon was replaced or refused this client.
    dead: Option<ErrorBody>,
}

/// The shared verdict on the daemon (see the module invariants).
#[derive(Debug)]
pub(crate) struct Health {
    base: String,
    mirrors: Mirrors,
    state: Mutex<State>,
    /// Bumped whenever the daemon becomes gone or dead, so waiting callers stop at once.
    verdicts: watch::Sender<u64>,
}

/// What an attempt met, as far as the verdict is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Nothing listens: the connection was refused, or reset before it was set up.
    Refused,
    /// Anything else that failed (timeouts, cuts, closed connections): proves nothing.
    Failed,
}

impl Health {
    pub(crate) fn new(base: String, mirrors: Mirrors) -> Arc<Self> {
        Arc::new(Self {
            base,
            mirrors,
            state: Mutex::new(State::default()),
            verdicts: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// The error a call fails with right now, if the daemon is dead.
    pub(crate) fn dead(&self) -> Option<Error> {
        self.lock().dead.clone().map(Error::from_body)
    }

    /// The error a call fails with right now, if the daemon is dead or known gone.
    pub(crate) fn verdict(&self) -> Option<Error> {
        let st = self.lock();
        st.dead.clone().or_else(|| st.gone.clone()).map(Error::from_body)
    }

    /// Resolves once a verdict (gone or dead) is reached after this call.
    pub(crate) fn changed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.verdicts.subscribe();
        async move {
            rx.borrow_and_update();
            let _ = rx.changed().await;
        }
    }

    /// An attempt reached a daemon (any answer): it is not gone.
    pub(crate) fn reached(&self) {
        let mut st = self.lock();
        st.refused = None;
        st.gone = None;
    }

    /// Records a failed attempt; returns the verdict error when the daemon is known gone
    /// (now, or already).
    pub(crate) fn failed(&self, attempt: Attempt, why: &str) -> Option<Error> {
        let newly_gone = {
            let mut st = self.lock();
            if let Some(dead) = &st.dead {
                return Some(Error::from_body(dead.clone()));
            }
            if attempt != Attempt::Refused {
                // A run of refusals is broken by anything else: a daemon that black-holes or
                // cuts is not known to be gone.
                st.refused = None;
                return st.gone.clone().map(Error::from_body);
            }
            let (since, n) = {
                let run = st.refused.get_or_insert((Instant::now(), 0));
                run.1 += 1;
                *run
            };
            if st.gone.is_some() {
                return st.gone.clone().map(Error::from_body);
            }
            if since.elapsed() < GONE_AFTER || n < GONE_ATTEMPTS {
                return None;
            }
            let e = gone(&self.base, since.elapsed(), why);
            st.gone = Some(e.to_body());
            e
        };
        // Loud only when work is lost: at build, the error itself says it all.
        if conn::live(&self.mirrors).is_empty() {
            tracing::debug!(cause = %why, "sandbox daemon refuses connections; known gone");
        } else {
            tracing::warn!(cause = %why, "sandbox daemon refuses connections; failing pending calls");
        }
        self.fail_pending(&newly_gone);
        self.verdicts.send_modify(|n| *n += 1);
        Some(newly_gone)
    }

    /// True while attempts are being refused but the verdict is not in yet (retries then
    /// come at most [`REFUSED_RETRY`] apart).
    pub(crate) fn refusing(&self) -> bool {
        let st = self.lock();
        st.refused.is_some() && st.gone.is_none()
    }

    /// Fails every unfinished wait with `e` (ids started later are failed by the stream
    /// connection when it next gives up or finds the daemon gone).
    pub(crate) fn fail_pending(&self, e: &Error) {
        for m in conn::live(&self.mirrors) {
            if !m.finished() {
                m.fail(e);
            }
        }
    }

    /// The daemon was replaced or refused this client for good: every wait fails with `e`
    /// and so does every later call.
    pub(crate) fn die(&self, e: &Error) {
        {
            let mut st = self.lock();
            if st.dead.is_some() {
                return;
            }
            st.dead = Some(e.to_body());
        }
        for m in conn::live(&self.mirrors) {
            m.fail(e);
        }
        self.verdicts.send_modify(|n| *n += 1);
    }

    /// Records `e` from a control call: a daemon that says it restarted, or another daemon
    /// at its address, kills the provider.
    pub(crate) fn answered_with(&self, e: &Error) {
        if matches!(e.reason(), Some(ErrorReason::BootChanged | ErrorReason::RemoteGone)) {
            self.die(e);
        }
    }
}

/// The error of a daemon known to be gone.
fn gone(base: &str, refused_for: Duration, why: &str) -> Error {
    Error::new(
        ErrorCode::RemoteUnavailable,
        format!(
            "the sandbox daemon at {base} is gone: every connection for {} ms was refused \
             (nothing listens there), so the processes it ran cannot be reached; start the \
             daemon again and rebuild the runtime",
            refused_for.as_millis()
        ),
    )
    .with_reason(ErrorReason::RemoteGone)
    .with_context("last cause", why.to_owned())
    .with_provider(super::NAME)
}

/// Whether a connection error means nothing listens (refused, or reset while connecting).
pub(crate) fn is_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}
