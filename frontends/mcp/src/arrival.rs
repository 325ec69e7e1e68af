//! Arrival order for serial tools ([`conch_seams::Tool::serial`]): rmcp runs every request
//! as its own task, so calls sent together reach a tool in whatever order the scheduler
//! picks. The transport takes a [`Ticket`] for each `tools/call` of a serial tool as the
//! request is read (in arrival order) and rides it in the request's extensions; the handler
//! waits for its turn before calling the tool. A turn ends when the ticket is dropped: when
//! its call returned, or when rmcp dropped the request without calling (so one lost request
//! never stalls the queue).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use conch_sync::LockExt;
use tokio::sync::Notify;

/// The queues of one session, one per serial tool.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    queues: Mutex<HashMap<String, Queue>>,
    turned: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    /// The next ticket to hand out.
    issued: u64,
    /// The oldest ticket not yet released: its holder's turn.
    head: u64,
    /// Released tickets beyond `head` (their requests ended out of order).
    released: BTreeSet<u64>,
}

impl Arrivals {
    /// The next place in `tool`'s queue.
    pub(crate) fn take(self: &Arc<Self>, tool: &str) -> Ticket {
        let mut queues = self.queues.locked();
        let q = queues.entry(tool.to_string()).or_default();
        let n = q.issued;
        q.issued += 1;
        Ticket(Arc::new(Place { arrivals: Arc::clone(self), tool: tool.to_string(), n }))
    }

    fn release(&self, tool: &str, n: u64) {
        let mut queues = self.queues.locked();
        if let Some(q) = queues.get_mut(tool) {
            q.released.insert(n);
            while q.released.remove(&q.head) {
                q.head += 1;
            }
        }
        drop(queues);
        self.turned.notify_waiters();
    }

    fn is_turn(&self, tool: &str, n: u64) -> bool {
        let queues = self.queues.locked();
        queues.get(tool).is_none_or(|q| q.head >= n)
    }
}

/// A call's place in its tool's queue (cloneable, as request extensions must be; the place
/// is released when the last clone is dropped).
#[derive(Clone, Debug)]
pub(crate) struct Ticket(Arc<Place>);

#[derive(Debug)]
struct Place {
    arrivals: Arc<Arrivals>,
    tool: String,
    n: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.arrivals.release(&self.tool, self.n);
    }
}

impl Ticket {
    /// Waits until every call to the same tool that arrived earlier has ended.
    pub(crate) async fn turn(&self) {
        let p = &self.0;
        loop {
            let turned = p.arrivals.turned.notified();
            if p.arrivals.is_turn(&p.tool, p.n) {
                return;
            }
            turned.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_follow_arrival_and_a_dropped_ticket_frees_its_place() {
        let a = Arc::new(Arrivals::default());
        let t0 = a.take("bash");
        let t1 = a.take("bash");
        let t2 = a.take("bash");
        let other = a.take("pwsh");
        other.turn().await;
        t0.turn().await;
        assert!(!a.is_turn("bash", 1), "t1 waits for t0");
        // A request dropped before its turn (rmcp never called it) leaves the queue.
        drop(t1);
        assert!(!a.is_turn("bash", 2), "t2 still waits for t0");
        let waiter = tokio::spawn(async move { t2.turn().await });
        drop(t0);
        waiter.await.unwrap();
    }
}
