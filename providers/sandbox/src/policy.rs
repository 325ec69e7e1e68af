//! `sandbox-policy`: the composition's default sandbox policy. It is configuration, not a
//! seam: the registry reads the entry (`conch_registry::PolicyConfig`) and hands the policy to
//! the plugins that confine. This registration only keeps the name listed with the plugins,
//! where compositions write it.

use conch_registry::{BuildContext, PluginEntry, PluginOutput, register_plugin};
use conch_seams::Result;

/// Plugin name.
pub const POLICY_NAME: &str = conch_registry::SANDBOX_POLICY;

/// Config: the default mode and workspace root, plus what widens or narrows them.
pub use conch_registry::PolicyConfig;

/// Nothing to build: the registry has already read and checked the entry.
fn build(_: &BuildContext<'_>) -> Result<PluginOutput> {
    Ok(PluginOutput::default())
}

register_plugin!(PluginEntry {
    name: POLICY_NAME,
    provides: None,
    requires: &[],
    description: "the default sandbox policy (mode, workspace root, network) for sandboxed providers",
    build,
});
