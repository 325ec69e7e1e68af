//! `remote-provisioned`: `remote-sandbox`'s client on a sandbox the composition's
//! provisioner makes for this runtime, so one runtime is one sandbox (an MCP session, a
//! `batch` run), removed when the runtime shuts down.
//!
//! Steps, and why:
//! - The build asks the provisioner for a sandbox (owner: the config's `owner`, else
//!   `conch-<pid>`), on a runtime of its own (a build is synchronous), and connects to the
//!   endpoint it returns with its token, as `remote-sandbox` connects to a configured URL.
//!   A connect that fails removes the sandbox before the error is returned.
//! - `files-remote` finds this connection as it finds `remote-sandbox`'s.
//! - Teardown stops the client (its processes on the daemon with it), then removes the
//!   sandbox. A process that dies without a teardown leaves the sandbox to the provisioner's
//!   own bound (`provision-docker`: the daemon's idle exit and the reaper).

use std::sync::Arc;

use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{Provisioner, Result, SandboxRequest, Subprocess as _};
use serde::Deserialize;

use super::{RemoteConfig, RemoteSubprocess, files, on_own_runtime};

/// What the build's calls to the provisioner are called in their errors.
const CALL: &str = "the provisioner's call";

/// Plugin name.
pub const PROVISIONED_NAME: &str = "remote-provisioned";

/// Provider config: `remote-sandbox`'s connection settings, without an address.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProvisionedConfig {
    /// Whose sandbox it is (a label the engine shows); default `conch-<pid>`.
    pub owner: Option<String>,
    /// As `remote-sandbox`'s.
    pub connect_timeout_ms: u64,
    /// As `remote-sandbox`'s.
    pub heartbeat_ms: u64,
    /// As `remote-sandbox`'s.
    pub reconnect_max_backoff_ms: u64,
    /// As `remote-sandbox`'s.
    pub give_up_ms: u64,
}

impl Default for ProvisionedConfig {
    fn default() -> Self {
        let r = RemoteConfig::default();
        Self {
            owner: None,
            connect_timeout_ms: r.connect_timeout_ms,
            heartbeat_ms: r.heartbeat_ms,
            reconnect_max_backoff_ms: r.reconnect_max_backoff_ms,
            give_up_ms: r.give_up_ms,
        }
    }
}

impl PluginConfig for ProvisionedConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        ConfigIssue::positive("connect_timeout_ms", self.connect_timeout_ms)?;
        ConfigIssue::at_least("heartbeat_ms", self.heartbeat_ms, 10)?;
        ConfigIssue::positive("reconnect_max_backoff_ms", self.reconnect_max_backoff_ms)?;
        ConfigIssue::positive("give_up_ms", self.give_up_ms)
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: ProvisionedConfig = ctx.config()?;
    let provisioner: Arc<dyn Provisioner> = ctx.provisioner()?;
    let owner = config.owner.clone().unwrap_or_else(|| format!("conch-{}", std::process::id()));
    let making = Arc::clone(&provisioner);
    let sandbox =
        on_own_runtime(CALL, async move { making.create(SandboxRequest::new(owner)).await })
            .map_err(|e| ctx.locate(e))?;
    let remote = RemoteConfig {
        url: sandbox.rxp_url.clone(),
        token: Some(sandbox.token.clone()),
        token_file: None,
        connect_timeout_ms: config.connect_timeout_ms,
        heartbeat_ms: config.heartbeat_ms,
        reconnect_max_backoff_ms: config.reconnect_max_backoff_ms,
        give_up_ms: config.give_up_ms,
    };
    let id = sandbox.id.clone();
    let provider = match RemoteSubprocess::connect(&remote) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            let removing = Arc::clone(&provisioner);
            let _ = on_own_runtime(CALL, async move { removing.remove(&id).await });
            return Err(ctx.locate(e));
        }
    };
    tracing::info!(sandbox = %sandbox.id, url = %sandbox.rxp_url, "provisioned a sandbox");
    files::register_connection(&provider);
    let for_teardown = Arc::clone(&provider);
    Ok(PluginOutput::seam(SeamHandle::Subprocess(provider)).with_teardown(move || {
        Box::pin(async move {
            for_teardown.shutdown().await;
            if let Err(e) = provisioner.remove(&id).await {
                tracing::warn!(sandbox = %id, "removing the sandbox: {e}");
            }
        })
    }))
}

register_plugin!(PluginEntry {
    name: PROVISIONED_NAME,
    provides: Some(SeamId::Subprocess),
    requires: &[SeamId::Provisioner],
    description: "processes on a sandbox the composition's provisioner makes for this runtime \
                  (RXP/1, as remote-sandbox)",
    build,
});
