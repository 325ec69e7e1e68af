//! Approval providers for escalations: `approval-deny` (refuses everything and says how to
//! allow), `approval-allowlist` (command prefixes and whole-command regexes from the
//! composition) and `approval-prompt` (asks a person on conch's controlling terminal).
//!
//! Each one provides the approval seam. None of them approves by default: a provider that
//! cannot decide (no rule matched, no terminal, no answer in time) denies and says why.

mod allowlist;
mod deny;
mod prompt;

pub use allowlist::{ALLOWLIST_NAME, AllowlistApproval, AllowlistConfig};
pub use deny::{DENY_NAME, DenyApproval};
pub use prompt::{PROMPT_NAME, PromptApproval, PromptConfig};

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
