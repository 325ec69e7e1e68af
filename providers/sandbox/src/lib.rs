//! Sandbox providers (issue 12, in progress): `sandbox-policy`, the default policy a
//! composition gives (mode and workspace root). The runners (`sandbox-landlock`,
//! `sandbox-bwrap`) and the `conch sandbox-exec` helper land here next.

mod policy;

pub use policy::{POLICY_NAME, PolicyConfig};

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
