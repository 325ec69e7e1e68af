//! The owner (agent) scope: an exact identity that jobs and terminals are fenced by,
//! with awaited disposal and the completion-notice inbox.
//!
//! How a notice reaches the model (into the current turn, or as a turn of its own) is the
//! front end's policy, not the owner's: the owner hands every notice to its sink.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use conch_sync::LockExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A completion notice for the owner's model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The job (or other producer) id the notice is about.
    pub source_id: String,
    /// The rendered notice text.
    pub text: String,
}

/// Where notices go; the harness (CLI, MCP server) implements this and decides how each
/// reaches the model.
pub trait NoticeSink: Send + Sync + fmt::Debug {
    /// Delivers one notice.
    fn deliver(&self, notice: Notice);
}

type DisposeHook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

static NEXT_OWNER_KEY: AtomicU64 = AtomicU64::new(1);

/// One exact owner (an agent object). Two `Owner`s with the same session id are still
/// different owners: access checks compare [`Owner::key`], not the session string.
pub struct Owner {
    key: u64,
    session_id: String,
    cancel: CancellationToken,
    live: AtomicBool,
    hooks: Mutex<Vec<DisposeHook>>,
    sink: Arc<dyn NoticeSink>,
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("key", &self.key)
            .field("session_id", &self.session_id)
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

impl Owner {
    /// A new live owner for a session id, delivering notices to `sink`.
    pub fn new(session_id: impl Into<String>, sink: Arc<dyn NoticeSink>) -> Arc<Self> {
        Arc::new(Self {
            key: NEXT_OWNER_KEY.fetch_add(1, Ordering::Relaxed),
            session_id: session_id.into(),
            cancel: CancellationToken::new(),
            live: AtomicBool::new(true),
            hooks: Mutex::new(Vec::new()),
            sink,
        })
    }

    /// The unique identity used for exact-owner fences.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The session id (exported to shells as CONCH_SESSION_ID).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Cancelled when the owner starts disposing.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// False once disposal has begun.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Hands a notice (a settled job's) to the owner's sink.
    pub fn notify(&self, notice: Notice) {
        self.sink.deliver(notice);
    }

    /// Registers work to run (and await) on disposal; hooks run last-registered first.
    /// Returns false when the owner is no longer live (the hook is not kept).
    pub fn on_dispose(
        &self,
        hook: impl FnOnce() -> BoxFuture<'static, ()> + Send + 'static,
    ) -> bool {
        let mut hooks = self.hooks.locked();
        if !self.is_live() {
            return false;
        }
        hooks.push(Box::new(hook));
        true
    }

    /// Ends the owner: stops accepting work, cancels its token, then awaits every
    /// disposal hook in reverse registration order. Idempotent.
    pub async fn dispose(&self) {
        let hooks = {
            let mut hooks = self.hooks.locked();
            self.live.store(false, Ordering::Release);
            std::mem::take(&mut *hooks)
        };
        self.cancel.cancel();
        // The owner's key, not its session id: the session id is a managed CONCH_* value.
        let span = tracing::debug_span!("owner_dispose", owner = self.key(), hooks = hooks.len());
        async {
            for hook in hooks.into_iter().rev() {
                hook().await;
            }
        }
        .instrument(span)
        .await;
    }
}
