//! Sandbox providers (issue 12, in progress): `sandbox-policy`, the default policy a
//! composition gives (mode and workspace root), and `sandbox-none`, which confines nothing
//! and refuses confining modes. The runners (`sandbox-landlock`, `sandbox-bwrap`) and the
//! `conch sandbox-exec` helper land here next.

mod none;
mod policy;

pub use none::{NONE_NAME, SandboxNone};
pub use policy::{POLICY_NAME, PolicyConfig};

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
