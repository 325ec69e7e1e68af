//! `approval-allowlist`: approves escalations whose command a composition listed, by prefix
//! or by a regex over the whole command; everything else is denied.
//!
//! `prefixes` approve simple commands, without shell operators, at a word boundary; `patterns` are
//! regexes over the whole command.

use std::sync::Arc;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{Approval, ApprovalDecision, EscalationRequest, Result};
use regex::Regex;
use serde::Deserialize;

/// Plugin name.
pub const ALLOWLIST_NAME: &str = "approval-allowlist";

/// Characters that let a command that starts with an allowed prefix run something else
/// (`git status; rm -rf ~`, `git log $(…)`, `ls > ~/.bashrc`, a second line).
const SHELL_CONTROL: &[char] = &[';', '&', '|', '<', '>', '`', '$', '\n', '\r', '(', ')'];

/// Config: which escalated commands are approved.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AllowlistConfig {
    /// A simple command (no `; & | < > $ ( )` backtick or line break) that starts with one
    /// of these, followed by the end or whitespace, is approved: `git push` approves
    /// `git push origin main` but not `git pushx` or `git push; rm x`.
    pub prefixes: Vec<String>,
    /// Regexes (Rust `regex` syntax) that must match the whole command, operators included.
    pub patterns: Vec<String>,
}

impl PluginConfig for AllowlistConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if let Some(i) = self.prefixes.iter().position(|p| p.trim().is_empty()) {
            return Err(ConfigIssue::new("prefixes", format!("prefixes[{i}] is empty")));
        }
        if let Some((i, p)) =
            self.prefixes.iter().enumerate().find(|(_, p)| p.contains(SHELL_CONTROL))
        {
            return Err(ConfigIssue::new(
                "prefixes",
                format!(
                    "prefixes[{i}] ({p:?}) holds a shell operator; a prefix approves simple \
                     commands only, use patterns for the rest"
                ),
            ));
        }
        for (i, p) in self.patterns.iter().enumerate() {
            anchored(p).map_err(|e| {
                ConfigIssue::new(
                    "patterns",
                    format!("patterns[{i}] ({p:?}) is not a valid regex: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

/// The pattern made to match a whole command, whatever anchors its author wrote.
fn anchored(pattern: &str) -> std::result::Result<Regex, regex::Error> {
    Regex::new(pattern)?;
    Regex::new(&format!("^(?:{pattern})$"))
}

/// Approves the commands its rules list.
#[derive(Debug)]
pub struct AllowlistApproval {
    prefixes: Vec<String>,
    patterns: Vec<Regex>,
}

impl AllowlistApproval {
    /// An approver for `config`.
    ///
    /// # Errors
    /// Invalid config (an empty prefix, a prefix with a shell operator, a bad regex), naming
    /// the key.
    pub fn new(config: AllowlistConfig) -> Result<Self> {
        config.check(ALLOWLIST_NAME)?;
        let patterns = config
            .patterns
            .iter()
            .map(|p| anchored(p))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| conch_seams::Error::invalid(e.to_string()))?;
        Ok(Self { prefixes: config.prefixes, patterns })
    }

    /// The rule that approves `command`, if any.
    fn matching_rule(&self, command: &str) -> Option<String> {
        let simple = !command.contains(SHELL_CONTROL);
        if simple {
            let command = command.trim_start();
            for p in &self.prefixes {
                let at_boundary = command.strip_prefix(p.as_str()).is_some_and(|rest| {
                    rest.is_empty()
                        || rest.starts_with(char::is_whitespace)
                        || p.ends_with(char::is_whitespace)
                });
                if at_boundary {
                    return Some(format!("prefix {p:?}"));
                }
            }
        }
        self.patterns
            .iter()
            .find(|r| r.is_match(command))
            .map(|r| format!("pattern {:?}", r.as_str()))
    }
}

#[async_trait]
impl Approval for AllowlistApproval {
    fn provider_name(&self) -> &'static str {
        ALLOWLIST_NAME
    }

    async fn approve_escalation(&self, request: &EscalationRequest) -> Result<ApprovalDecision> {
        Ok(match self.matching_rule(&request.command) {
            Some(_) => ApprovalDecision::Approved,
            None => ApprovalDecision::Denied {
                reason: format!(
                    "no rule of {ALLOWLIST_NAME} matched the command ({} prefixes, {} patterns; \
                     a prefix approves only simple commands, without shell operators)",
                    self.prefixes.len(),
                    self.patterns.len()
                ),
            },
        })
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: AllowlistConfig = ctx.config()?;
    let approval = AllowlistApproval::new(config).map_err(|e| ctx.locate(e))?;
    Ok(PluginOutput::seam(SeamHandle::Approval(Arc::new(approval))))
}

register_plugin!(PluginEntry {
    name: ALLOWLIST_NAME,
    provides: Some(SeamId::Approval),
    requires: &[],
    description: "approves sandbox escalations whose command matches a listed prefix or regex",
    build,
});

#[cfg(test)]
mod tests {
    use conch_seams::ErrorCode;

    use super::*;

    fn approver(prefixes: &[&str], patterns: &[&str]) -> AllowlistApproval {
        AllowlistApproval::new(AllowlistConfig {
            prefixes: prefixes.iter().map(|s| (*s).to_string()).collect(),
            patterns: patterns.iter().map(|s| (*s).to_string()).collect(),
        })
        .unwrap()
    }

    async fn decide(a: &AllowlistApproval, command: &str) -> ApprovalDecision {
        let req = EscalationRequest::new(
            command,
            "why",
            conch_seams::EscalationPermissions::RequireEscalated,
            "s",
        );
        a.approve_escalation(&req).await.unwrap()
    }

    #[tokio::test]
    async fn a_prefix_approves_at_a_word_boundary_only() {
        let a = approver(&["git push"], &[]);
        assert_eq!(decide(&a, "git push").await, ApprovalDecision::Approved);
        assert_eq!(decide(&a, "git push origin main").await, ApprovalDecision::Approved);
        assert_eq!(decide(&a, "  git push\torigin").await, ApprovalDecision::Approved);
        for denied in ["git pushx", "git pul", "echo git push", "sudo git push"] {
            assert!(
                matches!(decide(&a, denied).await, ApprovalDecision::Denied { .. }),
                "{denied}"
            );
        }
    }

    #[tokio::test]
    async fn a_prefix_never_approves_a_command_with_shell_operators() {
        let a = approver(&["git status"], &[]);
        for chained in [
            "git status; rm -rf ~",
            "git status && curl x",
            "git status | sh",
            "git status > ~/.bashrc",
            "git status $(touch /x)",
            "git status `id`",
            "git status\nrm x",
        ] {
            match decide(&a, chained).await {
                ApprovalDecision::Denied { reason } => {
                    assert!(reason.contains("no rule"), "{reason}");
                }
                ApprovalDecision::Approved => panic!("approved {chained:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_pattern_must_match_the_whole_command() {
        let a = approver(&[], &[r"echo \w+ >> /tmp/[a-z]+\.log", "make( -j[0-9]+)?"]);
        assert_eq!(decide(&a, "echo hi >> /tmp/x.log").await, ApprovalDecision::Approved);
        assert_eq!(decide(&a, "make -j4").await, ApprovalDecision::Approved);
        assert_eq!(decide(&a, "make").await, ApprovalDecision::Approved);
        for denied in ["make -j4; rm x", "xmake", "echo hi >> /tmp/x.log && id"] {
            assert!(
                matches!(decide(&a, denied).await, ApprovalDecision::Denied { .. }),
                "{denied}"
            );
        }
    }

    #[tokio::test]
    async fn nothing_is_approved_without_rules() {
        let a = approver(&[], &[]);
        match decide(&a, "true").await {
            ApprovalDecision::Denied { reason } => {
                assert!(reason.contains("no rule of approval-allowlist matched"), "{reason}");
            }
            ApprovalDecision::Approved => panic!("approved without rules"),
        }
    }

    #[test]
    fn config_errors_name_the_key() {
        let bad = |prefixes: &[&str], patterns: &[&str]| {
            AllowlistApproval::new(AllowlistConfig {
                prefixes: prefixes.iter().map(|s| (*s).to_string()).collect(),
                patterns: patterns.iter().map(|s| (*s).to_string()).collect(),
            })
            .unwrap_err()
        };
        let e = bad(&[], &["ok", "(unclosed"]);
        assert_eq!(e.code(), ErrorCode::InvalidComposition);
        assert!(e.message().contains("plugins.approval-allowlist.patterns"), "{e}");
        assert!(e.message().contains("patterns[1]"), "{e}");
        let e = bad(&[" "], &[]);
        assert!(e.message().contains("plugins.approval-allowlist.prefixes"), "{e}");
        let e = bad(&["git status;"], &[]);
        assert!(
            e.message().contains("prefixes[0]") && e.message().contains("shell operator"),
            "{e}"
        );
    }
}
