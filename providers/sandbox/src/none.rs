//! `sandbox-none`: a sandbox provider that confines nothing and says so. It passes a
//! danger-full-access command line through unchanged and refuses every confining mode with
//! `sandbox_unavailable`, so a composition can offer the sandboxed tool shape (policy,
//! escalation through approval) on a machine without a runner, never silently unconfined.

use std::sync::Arc;

use conch_registry::{
    BuildContext, NoConfig, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    CommandLine, Enforcement, Error, ErrorCode, ExitStatus, Result, Sandbox, SandboxCapabilities,
    SandboxInfo, SandboxMode, SandboxPolicy,
};

/// Plugin name.
pub const NONE_NAME: &str = "sandbox-none";

/// No confinement: only danger-full-access.
#[derive(Debug, Default)]
pub struct SandboxNone;

impl Sandbox for SandboxNone {
    fn provider_name(&self) -> &'static str {
        NONE_NAME
    }

    fn capabilities(&self) -> SandboxCapabilities {
        let mut caps = SandboxCapabilities::default();
        caps.modes = vec![SandboxMode::DangerFullAccess];
        caps.enforcement =
            Enforcement::new("none: only danger-full-access, which confines nothing");
        caps
    }

    fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine> {
        if policy.mode.confines() {
            return Err(Error::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "{NONE_NAME} confines nothing, so it cannot run a command under {} mode; \
                     compose sandbox-landlock or sandbox-bwrap for {} (or ask for an \
                     escalation, which runs under danger-full-access)",
                    policy.mode, policy.mode
                ),
            )
            .with_provider(NONE_NAME)
            .with_operation("wrap"));
        }
        Ok(command)
    }

    fn classify(&self, policy: &SandboxPolicy, _exit: &ExitStatus, _tail: &str) -> SandboxInfo {
        // Nothing was enforced, so nothing can have been denied by it.
        SandboxInfo::new(policy.mode)
    }

    fn release(&self, _wrapped: &CommandLine) {
        // `wrap` made nothing for the command: it is passed through unchanged.
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _: NoConfig = ctx.config()?;
    Ok(PluginOutput::seam(SeamHandle::Sandbox(Arc::new(SandboxNone))))
}

register_plugin!(PluginEntry {
    name: NONE_NAME,
    provides: Some(SeamId::Sandbox),
    requires: &[],
    description: "no confinement: runs only danger-full-access and refuses confining modes",
    build,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn danger_full_access_passes_through_and_confining_modes_are_refused() {
        let cmd = CommandLine::new(vec!["bash".into(), "-c".into(), "true".into()]);
        let full = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/w");
        assert_eq!(SandboxNone.wrap(&full, cmd.clone()).unwrap(), cmd);
        for mode in [SandboxMode::ReadOnly, SandboxMode::WorkspaceWrite] {
            let e = SandboxNone.wrap(&SandboxPolicy::new(mode, "/w"), cmd.clone()).unwrap_err();
            assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
            assert!(e.message().contains(mode.as_str()), "{e}");
        }
        assert_eq!(SandboxNone.capabilities().modes, [SandboxMode::DangerFullAccess]);
    }
}
