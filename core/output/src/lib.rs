//! Output retention: a bounded tail of a byte stream in memory, a lazy spill file that holds
//! the complete stream only while it can, and head / tail / head+tail text retainers.
//!
//! Long output prefers the tail because errors and summaries tend to come last; the spill
//! keeps full retrieval possible until the stream passes the spill cap, after which it is
//! deleted rather than left behind as a file that silently lacks bytes. A [`SpillRegistry`]
//! bounds all spills of one owner by total size and age, evicting only final ones.
#![deny(missing_docs)]

mod collector;
mod registry;
mod retain;
mod root;
mod utf8;

pub use collector::{Collector, CollectorConfig};
pub use registry::{DEFAULT_MAX_AGE, DEFAULT_MAX_TOTAL_BYTES, SpillLimits, SpillRegistry};
pub use retain::{Retained, Strategy, TextRetainer, format_retention_notice};
pub use root::SpillRoot;
pub use utf8::{tail_lines_utf8, tail_utf8, truncate_utf8, utf8_tail};

#[cfg(test)]
mod tests;
