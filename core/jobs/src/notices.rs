//! How a front end routes job-completion notices to its model: into the current turn while the
//! owner is mid-turn, otherwise as a follow-up turn of their own, within a wake budget that only a
//! genuinely user-authored message restores (so settling jobs cannot keep an idle model busy).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use conch_seams::{Notice, NoticeSink};
use conch_sync::LockExt;

/// How many consecutive job-completion turns an idle owner may be woken for.
pub const DEFAULT_WAKE_BUDGET: u32 = 3;

/// How a notice reaches the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeRoute {
    /// Added to the current turn's inbox.
    Inject,
    /// Starts a new follow-up turn.
    Followup,
}

impl NoticeRoute {
    /// The lowercase name (`inject`, `followup`).
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeRoute::Inject => "inject",
            NoticeRoute::Followup => "followup",
        }
    }
}

/// A notice sink that routes each notice (busy → inject; idle with budget → follow-up,
/// spending one wake; idle without budget → inject) and keeps the routed notices until taken.
#[derive(Debug)]
pub struct RoutingSink {
    /// Turns in progress: concurrent calls each hold one, so the owner is busy until the
    /// last of them ends.
    busy: AtomicU32,
    wake_budget: AtomicU32,
    notices: Mutex<Vec<(NoticeRoute, Notice)>>,
}

impl Default for RoutingSink {
    fn default() -> Self {
        Self {
            busy: AtomicU32::new(0),
            wake_budget: AtomicU32::new(DEFAULT_WAKE_BUDGET),
            notices: Mutex::new(Vec::new()),
        }
    }
}

/// One turn of the owner; it is busy while any guard lives.
#[derive(Debug)]
pub struct TurnGuard<'a> {
    sink: &'a RoutingSink,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.sink.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl RoutingSink {
    /// Marks the owner as mid-turn (notices are injected then) until the guard drops.
    /// Guards nest and overlap: concurrent calls each hold one.
    pub fn begin_turn(&self) -> TurnGuard<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        TurnGuard { sink: self }
    }

    /// Whether the owner is mid-turn (some [`TurnGuard`] is alive).
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    /// Claims a genuinely user-authored message: the only thing that restores the wake budget.
    pub fn claim_user_message(&self) {
        self.wake_budget.store(DEFAULT_WAKE_BUDGET, Ordering::Release);
    }

    /// Remaining follow-up wakes.
    pub fn wake_budget(&self) -> u32 {
        self.wake_budget.load(Ordering::Acquire)
    }

    /// Takes every notice routed so far, with its route.
    pub fn take(&self) -> Vec<(NoticeRoute, Notice)> {
        std::mem::take(&mut *self.notices.locked())
    }

    fn route(&self) -> NoticeRoute {
        if self.is_busy() {
            NoticeRoute::Inject
        } else if self
            .wake_budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(1))
            .is_ok()
        {
            NoticeRoute::Followup
        } else {
            NoticeRoute::Inject
        }
    }
}

impl NoticeSink for RoutingSink {
    fn deliver(&self, notice: Notice) {
        let route = self.route();
        self.notices.locked().push((route, notice));
    }
}
