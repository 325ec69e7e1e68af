//! Text retainers: keep the head, the tail, or both ends of a text stream within a byte
//! budget, in bounded memory, with an exact count of what was left out.
//!
//! # Budget and marker
//! `max_bytes` bounds the *content* kept. The head+tail marker line (and the newline that
//! may be inserted before it) is not counted against the budget and not counted as kept
//! text, so `total_bytes == kept content bytes + omitted_bytes` holds exactly; the marker
//! only adds its own short, fixed-shape length on top of `max_bytes`.
//!
//! The retainers count what they omit exactly; terminal-bash keeps each send's output in a tail
//! retainer.

use crate::utf8::{tail_utf8, truncate_utf8};

/// Which part of a long text a [`TextRetainer`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The first `max_bytes` (cut on a char boundary).
    Head,
    /// The last `max_bytes` (cut on a char boundary).
    Tail,
    /// Half the budget from the head, the rest from the tail, joined by a marker line.
    HeadTail,
}

/// What a retainer kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    /// The kept text (for head+tail with omissions, including the marker line).
    pub text: String,
    /// Exact byte count of everything pushed.
    pub total_bytes: u64,
    /// Exact byte count left out: `total_bytes` minus kept content bytes (marker excluded).
    pub omitted_bytes: u64,
}

/// The marker line that stands in for omitted bytes, e.g. `[... 1234 bytes omitted ...]`.
pub fn format_retention_notice(omitted_bytes: u64) -> String {
    format!("[... {omitted_bytes} bytes omitted ...]")
}

/// Retains part of a text stream pushed in pieces, in memory bounded by the budget.
#[derive(Clone, Debug)]
pub struct TextRetainer {
    strategy: Strategy,
    max_bytes: usize,
    /// Head budget: `max_bytes` for Head, half of it for HeadTail, 0 for Tail.
    head_limit: usize,
    /// A prefix of the stream, at most `head_limit` bytes.
    head: String,
    /// Set once a byte did not fit the head; from then on the head is final, which keeps it
    /// a true prefix (a later, smaller char must not slip in after a skipped one).
    head_full: bool,
    /// The end of the stream after the head, allowed to grow to a few budgets before it is
    /// compacted so that many small pushes do not each pay for a memmove.
    tail: String,
    total: u64,
}

impl TextRetainer {
    /// A retainer keeping at most `max_bytes` of content.
    pub fn new(strategy: Strategy, max_bytes: usize) -> Self {
        let head_limit = match strategy {
            Strategy::Head => max_bytes,
            Strategy::Tail => 0,
            Strategy::HeadTail => max_bytes / 2,
        };
        Self {
            strategy,
            max_bytes,
            head_limit,
            head: String::new(),
            head_full: false,
            tail: String::new(),
            total: 0,
        }
    }

    /// The tail budget: whatever the head left unused, so head+tail can hold any text of up
    /// to `max_bytes` whole even when the head stopped short at a char boundary.
    fn tail_budget(&self) -> usize {
        match self.strategy {
            Strategy::Head => 0,
            Strategy::Tail | Strategy::HeadTail => self.max_bytes - self.head.len(),
        }
    }

    /// Appends text.
    pub fn push(&mut self, text: &str) {
        self.total += text.len() as u64;
        let mut rest = text;
        if !self.head_full {
            let taken = truncate_utf8(rest, self.head_limit - self.head.len());
            self.head.push_str(taken);
            rest = &rest[taken.len()..];
            if !rest.is_empty() {
                self.head_full = true;
            }
        }
        if rest.is_empty() || self.strategy == Strategy::Head {
            return;
        }
        let budget = self.tail_budget();
        if rest.len() >= budget {
            // The last `budget` bytes all come from this piece.
            self.tail.clear();
            self.tail.push_str(tail_utf8(rest, budget));
        } else {
            self.tail.push_str(rest);
            if self.tail.len() > budget.saturating_mul(2) {
                let cut = self.tail.len() - tail_utf8(&self.tail, budget).len();
                self.tail.drain(..cut);
            }
        }
    }

    /// Exact byte count pushed so far.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Bytes of memory the retainer holds (string capacities), for the boundedness tests.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.head.capacity() + self.tail.capacity()
    }

    /// The retained text and exact accounting.
    pub fn finish(self) -> Retained {
        let budget = self.tail_budget();
        let tail = tail_utf8(&self.tail, budget);
        let kept = (self.head.len() + tail.len()) as u64;
        let omitted_bytes = self.total - kept;
        let text = match self.strategy {
            Strategy::Head => self.head,
            Strategy::Tail => tail.to_owned(),
            Strategy::HeadTail if omitted_bytes == 0 => {
                // Nothing dropped: head and tail are adjacent, so they are the whole text.
                let mut text = self.head;
                text.push_str(tail);
                text
            }
            Strategy::HeadTail => {
                let notice = format_retention_notice(omitted_bytes);
                let mut text =
                    String::with_capacity(self.head.len() + notice.len() + tail.len() + 2);
                text.push_str(&self.head);
                // The marker gets a line of its own so it cannot be read as part of the text.
                if !self.head.is_empty() && !self.head.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&notice);
                text.push('\n');
                text.push_str(tail);
                text
            }
        };
        Retained { text, total_bytes: self.total, omitted_bytes }
    }
}
