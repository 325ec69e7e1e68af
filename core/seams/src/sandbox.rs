//! The sandbox seam: wraps an exact argv under a policy.

use std::fmt;
use std::path::PathBuf;

use crate::Result;

/// The three policy modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxMode {
    /// Reads anywhere, writes nowhere (except /dev/null and the tty).
    ReadOnly,
    /// Writes only under the workspace root.
    WorkspaceWrite,
    /// No confinement.
    DangerFullAccess,
}

impl SandboxMode {
    /// The kebab-case name used in configs and results.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::DangerFullAccess => "danger-full-access",
        }
    }
}

/// A complete per-call policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// Mode.
    pub mode: SandboxMode,
    /// Root of the writable workspace.
    pub workspace_root: PathBuf,
}

/// Sandbox facts reported with a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The mode in force.
    pub mode: SandboxMode,
    /// The command hit a denial.
    pub denied: bool,
    /// The runner could not be launched (background only; foreground errors instead).
    pub runner_failed: bool,
}

/// The sandbox seam.
///
/// # Contract
/// `wrap` returns an argv that runs `argv` confined by `policy`, or an error; it never
/// returns an unconfined argv for a confining mode.
pub trait Sandbox: Send + Sync + fmt::Debug + 'static {
    /// Provider name.
    fn provider_name(&self) -> &'static str;
    /// Wraps argv.
    ///
    /// # Errors
    /// `sandbox_denied` or `unsupported` when the policy cannot be enforced.
    fn wrap(&self, policy: &SandboxPolicy, argv: Vec<String>) -> Result<Vec<String>>;
}
