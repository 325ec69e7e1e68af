//! The confinement protocol against a runner that refuses everything.

use conch_seams::{SandboxCapabilities, SandboxMode};

use super::*;

/// Refuses every wrap the way an unusable runner does, and judges every exit a refusal.
#[derive(Debug)]
struct Refusing;

impl Sandbox for Refusing {
    fn provider_name(&self) -> &'static str {
        "refusing"
    }
    fn capabilities(&self) -> SandboxCapabilities {
        SandboxCapabilities::default()
    }
    fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine> {
        if policy.mode.confines() {
            return Err(Error::invalid("a relative root"));
        }
        Ok(command)
    }
    fn classify(&self, policy: &SandboxPolicy, _: &ExitStatus, _: &str) -> SandboxInfo {
        SandboxInfo::new(policy.mode).with_verdict(SandboxVerdict::RunnerFailed)
    }
    fn release(&self, _: &CommandLine) {}
}

fn confinement(subject: ConfinedSubject) -> Confinement {
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/w");
    Confinement::new(Arc::new(Refusing), policy, "caller", "run", subject)
}

#[test]
fn a_refused_runner_is_reported_with_its_own_line() {
    let c = confinement(ConfinedSubject::Command);
    let line = "conch-sandbox: unavailable: landlock is not enabled in this kernel";
    let e = c.verdict(c.policy(), &ExitStatus::code(126), &format!("{line}\n"), true);
    let e = e.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
    assert_eq!(e.provider(), "caller");
    assert!(e.message().ends_with(line), "{e}");
    assert!(e.message().contains("confine the command"), "{e}");
}

#[test]
fn only_a_runner_put_in_front_can_have_refused() {
    let c = confinement(ConfinedSubject::Shell);
    let info = c.verdict(c.policy(), &ExitStatus::code(126), "x", false).unwrap();
    assert_eq!(info.verdict, SandboxVerdict::Clean);
}

#[test]
fn any_wrap_error_is_sandbox_unavailable_in_the_callers_words() {
    let c = confinement(ConfinedSubject::Shell);
    let e = c.wrap(c.policy(), CommandLine::new(vec!["bash".into()])).unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
    assert!(e.message().starts_with("refusing cannot run the shell under workspace-write"), "{e}");
    let full = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/w");
    let w = c.wrap(&full, CommandLine::new(vec!["bash".into()])).unwrap();
    assert!(!w.runner, "passed through unchanged: no runner in front");
}

#[test]
fn the_classifier_tail_is_cut_on_a_char_boundary() {
    let text = format!("é{}", "x".repeat(CLASSIFY_TAIL_BYTES - 1));
    assert_eq!(tail_utf8(&text, CLASSIFY_TAIL_BYTES).len(), CLASSIFY_TAIL_BYTES - 1);
    assert_eq!(tail_utf8("short", CLASSIFY_TAIL_BYTES), "short");
}
