//! Sandbox providers: `sandbox-policy` (the name of the composition's default policy, which the
//! registry reads as configuration), the runners `sandbox-landlock` (Landlock + seccomp through
//! the `sandbox-exec` helper) and `sandbox-bwrap` (bubblewrap namespaces with the helper inside),
//! `sandbox-none` (confines nothing and refuses confining modes), and the helper itself
//! ([`sandbox_exec_main`], behind `conch sandbox-exec`).
//!
//! Besides `providers/local`, this is the one crate that touches the OS process world: the
//! helper confines its own process before it execs the command, and `sandbox-bwrap` probes
//! bubblewrap once when it is built.
//!
//! Both runners sort the read-only paths the same way (`mounts::read_only_points`) and create a
//! missing `.git/hooks` empty, as `git init` would, so it can be held read-only while the rest of
//! the workspace is granted whole. The helper is `conch sandbox-exec` or, in tests, the
//! `conch-sandbox-exec-test` binary of `tests/`. A runner that cannot enforce here builds, reports
//! it in `capabilities()` and answers `wrap` with `sandbox_unavailable`; the helper exits 126 with
//! `conch-sandbox: unavailable: <why>` rather than run unconfined. `classify` marks a non-zero exit
//! whose output shows a file or network denial (the usual errno texts, and .NET's `Access to the
//! path`).

mod bwrap;
pub mod exec;
mod landlock;
mod mounts;
mod none;
mod policy;
mod tmp;

pub use bwrap::{BWRAP_NAME, BwrapConfig, BwrapSandbox};
pub use exec::sandbox_exec_main;
pub use landlock::{LANDLOCK_NAME, LandlockConfig, LandlockSandbox};
pub use none::{NONE_NAME, SandboxNone};
pub use policy::{POLICY_NAME, PolicyConfig};

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
