//! `sandbox-policy`: the composition's default sandbox policy as a seam of its own, so the
//! sandboxed executors and terminal backends read one value instead of each its own config.

use std::path::PathBuf;
use std::sync::Arc;

use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{ConfigIssue, PluginConfig, Result, SandboxMode, SandboxPolicy};
use serde::Deserialize;

/// Plugin name.
pub const POLICY_NAME: &str = "sandbox-policy";

/// Config: the default mode and workspace root, plus what widens or narrows them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `read-only`, `workspace-write` or `danger-full-access`.
    pub mode: String,
    /// The writable workspace (absolute); empty means the directory conch was started in.
    pub workspace_root: PathBuf,
    /// More writable roots in workspace-write mode (absolute).
    pub writable_roots: Vec<PathBuf>,
    /// Allow the network.
    pub network: bool,
    /// Let commands write the workspace's `.git/hooks` and `.git/config` (they run or
    /// configure code outside the sandbox later, so they are read-only by default).
    pub writable_git_config: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::WorkspaceWrite.as_str().into(),
            workspace_root: PathBuf::new(),
            writable_roots: Vec::new(),
            network: false,
            writable_git_config: false,
        }
    }
}

impl PluginConfig for PolicyConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if SandboxMode::parse(&self.mode).is_none() {
            return Err(ConfigIssue::new(
                "mode",
                "must be read-only, workspace-write or danger-full-access",
            ));
        }
        if !self.workspace_root.as_os_str().is_empty() && !self.workspace_root.is_absolute() {
            return Err(ConfigIssue::new("workspace_root", "must be an absolute path"));
        }
        if self.writable_roots.iter().any(|r| !r.is_absolute()) {
            return Err(ConfigIssue::new("writable_roots", "every root must be an absolute path"));
        }
        Ok(())
    }
}

impl PolicyConfig {
    /// The policy this config describes; an empty root is `cwd`.
    pub fn policy(&self, cwd: PathBuf) -> SandboxPolicy {
        let mode = SandboxMode::parse(&self.mode).unwrap_or(SandboxMode::WorkspaceWrite);
        let root = if self.workspace_root.as_os_str().is_empty() {
            cwd
        } else {
            self.workspace_root.clone()
        };
        let mut policy = SandboxPolicy::new(mode, root).with_network(self.network);
        for r in &self.writable_roots {
            policy = policy.with_writable_root(r.clone());
        }
        if self.writable_git_config {
            policy = policy.with_read_only_paths(Vec::new());
        }
        policy
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PolicyConfig = ctx.config()?;
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    Ok(PluginOutput::seam(SeamHandle::SandboxPolicy(Arc::new(config.policy(cwd)))))
}

register_plugin!(PluginEntry {
    name: POLICY_NAME,
    provides: Some(SeamId::SandboxPolicy),
    requires: &[],
    description: "the default sandbox policy (mode, workspace root, network) for sandboxed providers",
    build,
});
