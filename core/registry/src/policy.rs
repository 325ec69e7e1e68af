//! The composition's default sandbox policy: its `sandbox-policy` entry, read by the registry
//! as configuration and handed to the plugins that confine (`BuildContext::sandbox_policy`),
//! not built as a seam. The entry is still listed under `plugins:` and registered by
//! `providers/sandbox` as a plugin that provides nothing, so compositions, `conch plugins`
//! and the unknown-plugin listing read as before.

use std::path::PathBuf;
use std::sync::Arc;

use conch_config::Composition;
use conch_env::ShellEnv;
use conch_seams::{SandboxMode, SandboxPolicy};
use serde::Deserialize;

use crate::{BuildContext, ConfigIssue, PluginConfig, RegistryError, Seams};

/// The composition entry that holds the default policy.
pub const SANDBOX_POLICY: &str = "sandbox-policy";

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
    /// Paths commands and file tools can neither read nor write (absolute); a writable root
    /// beneath one stays whole.
    pub hidden_paths: Vec<PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::WorkspaceWrite.as_str().into(),
            workspace_root: PathBuf::new(),
            writable_roots: Vec::new(),
            network: false,
            writable_git_config: false,
            hidden_paths: Vec::new(),
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
        if self.hidden_paths.iter().any(|r| !r.is_absolute()) {
            return Err(ConfigIssue::new("hidden_paths", "every path must be absolute"));
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
        policy.with_hidden_paths(self.hidden_paths.clone())
    }
}

/// The composition's default policy, when it has a `sandbox-policy` entry.
///
/// # Errors
/// A bad entry, naming file, entry and key as a plugin's bad config would.
pub(crate) fn default_policy(
    composition: &Composition,
    seams: &Seams,
    shell_env: &Arc<ShellEnv>,
) -> Result<Option<Arc<SandboxPolicy>>, RegistryError> {
    if !composition.plugins().iter().any(|p| p == SANDBOX_POLICY) {
        return Ok(None);
    }
    let ctx = BuildContext {
        plugin: SANDBOX_POLICY,
        composition,
        seams,
        shell_env,
        sandbox_policy: None,
    };
    let config: PolicyConfig =
        ctx.config().map_err(|e| crate::build_error(composition, SANDBOX_POLICY, e))?;
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    Ok(Some(Arc::new(config.policy(cwd))))
}
