//! `approval-deny`: the default approver, which refuses every escalation and names the
//! providers that would allow some.

use std::sync::Arc;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, NoConfig, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{Approval, ApprovalDecision, EscalationRequest, Result};

/// Plugin name.
pub const DENY_NAME: &str = "approval-deny";

/// Refuses every escalation, naming the provider that would allow some.
#[derive(Debug, Default)]
pub struct DenyApproval;

#[async_trait]
impl Approval for DenyApproval {
    fn provider_name(&self) -> &'static str {
        DENY_NAME
    }

    async fn approve_escalation(&self, _request: &EscalationRequest) -> Result<ApprovalDecision> {
        // The reason reaches the model, and through it the person: it says this is a policy
        // of the composition, not a judgement of the command, and what would change it.
        Ok(ApprovalDecision::Denied {
            reason: format!(
                "this composition denies every escalation ({DENY_NAME}); to allow some, use \
                 approval-allowlist (command prefixes or patterns) or approval-prompt (ask on \
                 the terminal) instead"
            ),
        })
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _: NoConfig = ctx.config()?;
    Ok(PluginOutput::seam(SeamHandle::Approval(Arc::new(DenyApproval))))
}

register_plugin!(PluginEntry {
    name: DENY_NAME,
    provides: Some(SeamId::Approval),
    requires: &[],
    description: "refuses every sandbox escalation and says how to allow some",
    build,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_request_is_denied_with_a_way_out() {
        let req = EscalationRequest::new(
            "touch /etc/x",
            "needed",
            conch_seams::EscalationPermissions::RequireEscalated,
            "s1",
        );
        match DenyApproval.approve_escalation(&req).await.unwrap() {
            ApprovalDecision::Denied { reason } => {
                assert!(reason.contains("denies every escalation"), "{reason}");
                assert!(reason.contains("approval-allowlist"), "{reason}");
            }
            ApprovalDecision::Approved => panic!("approval-deny approved"),
        }
    }
}
