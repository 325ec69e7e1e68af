//! Approval providers for escalations (issue 12, in progress): `approval-deny`,
//! `approval-allowlist` and `approval-prompt` land here.

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
