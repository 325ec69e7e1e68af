//! bash-sandbox and the bash tool's sandbox surface, tested without a confining runner:
//! `sandbox-none` is a real sandbox provider that runs only danger-full-access and refuses
//! confining modes, so these tests cover what does not depend on a runner (the shared
//! executor path, the unavailable path, the schema and the escalation flow). The runner
//! suites (escapes, denials) come with sandbox-landlock and sandbox-bwrap.

use std::sync::Arc;
use std::time::Duration;

use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_sandbox::SandboxNone;
use conch_provider_shell::{BashLocal, BashLocalConfig};
use conch_seams::{
    ErrorCode, SandboxMode, SandboxPolicy, ShellExecRequest, ShellExecutor, ShellProcessStatus,
};
use serde_json::json;

use crate::{owner, runtime};

fn sandboxed(mode: SandboxMode) -> Arc<BashLocal> {
    let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
    let policy = SandboxPolicy::new(mode, std::env::temp_dir());
    Arc::new(
        BashLocal::sandboxed(BashLocalConfig::default(), sub, Arc::new(SandboxNone), policy)
            .unwrap(),
    )
}

/// Under danger-full-access, bash-sandbox must be bash-local: the whole shell suite, over
/// the same code path with the (pass-through) wrap in it.
mod danger_full_access_is_bash_local {
    use super::*;

    fn make() -> Arc<BashLocal> {
        sandboxed(SandboxMode::DangerFullAccess)
    }

    conch_conformance::shell_suite!(make);
}

#[tokio::test]
async fn results_carry_the_sandbox_facts_and_the_executor_reports_its_mode() {
    let exec = sandboxed(SandboxMode::DangerFullAccess);
    assert_eq!(exec.provider_name(), "bash-sandbox");
    assert_eq!(exec.sandbox_mode(), Some(SandboxMode::DangerFullAccess));
    assert!(exec.capabilities().sandboxed);
    let spec = exec.resolve(ShellExecRequest::new("echo hi")).unwrap();
    assert_eq!(spec.sandbox.as_ref().map(|p| p.mode), Some(SandboxMode::DangerFullAccess));
    let r = exec.run(spec).await.unwrap();
    assert_eq!(r.output.text, "hi\n");
    let info = r.sandbox.expect("a sandboxed result says what the sandbox did");
    assert_eq!(info.mode, SandboxMode::DangerFullAccess);
    assert!(!info.denied() && !info.runner_failed() && !info.escalated);
}

#[tokio::test]
async fn an_unsandboxed_executor_refuses_a_confining_mode_it_cannot_apply() {
    let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
    let local = BashLocal::new(BashLocalConfig::default(), sub).unwrap();
    assert_eq!(local.sandbox_mode(), None);
    let mut req = ShellExecRequest::new("true");
    req.sandbox_mode = Some(SandboxMode::WorkspaceWrite);
    assert_eq!(local.resolve(req).unwrap_err().code(), ErrorCode::Unsupported);
}

#[tokio::test]
async fn a_mode_the_sandbox_cannot_enforce_is_unavailable_in_the_foreground_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let exec = sandboxed(SandboxMode::WorkspaceWrite);
    let spec = exec.resolve(ShellExecRequest::new(format!("touch {}", marker.display()))).unwrap();
    let e =
        tokio::time::timeout(Duration::from_secs(30), exec.run(spec)).await.unwrap().unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
    assert!(e.message().contains("workspace-write"), "{e}");
    assert!(!marker.exists(), "the command must not run unconfined");
}

#[tokio::test]
async fn in_the_background_it_is_a_killed_handle_with_runner_failed_and_no_hang() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let exec = sandboxed(SandboxMode::ReadOnly);
    let spec = exec.resolve(ShellExecRequest::new(format!("touch {}", marker.display()))).unwrap();
    let p = exec.start(spec).await;
    tokio::time::timeout(Duration::from_secs(30), p.wait()).await.expect("settles at once");
    assert_eq!(p.status(), ShellProcessStatus::Killed);
    let info = p.sandbox().unwrap();
    assert!(info.runner_failed(), "{info:?}");
    assert_eq!(info.mode, SandboxMode::ReadOnly);
    let text = p.read_output().text;
    assert!(
        text.contains("sandbox-none") && text.contains("read-only mode"),
        "the output says why: {text:?}"
    );
    assert!(!marker.exists());
}

const SANDBOX_NONE: &str = "plugins:
  subprocess-local: {}
  sandbox-none: {}
  sandbox-policy: {mode: workspace-write}
  bash-sandbox: {}
  jobs: {}
  tool-bash: {}
  tool-jobs: {}
";

fn props(rt: &conch_registry::Runtime) -> Vec<String> {
    let schema = rt.tool("bash").unwrap().input_schema();
    schema["properties"].as_object().unwrap().keys().cloned().collect()
}

#[tokio::test]
async fn only_a_confining_executor_advertises_escalation() {
    let unconfined = crate::standard();
    let p = props(&unconfined);
    assert!(p.contains(&"command".to_string()));
    assert!(!p.contains(&"sandbox_permissions".to_string()), "{p:?}");
    assert!(!p.contains(&"justification".to_string()), "{p:?}");
    let schema = unconfined.tool("bash").unwrap().input_schema().to_string();
    assert!(!schema.contains("require_escalated"), "{schema}");
    // Not advertised means not accepted either.
    let (o, _) = owner("s");
    let e = unconfined
        .call(&o, "bash", json!({"command": "true", "sandbox_permissions": "require_escalated", "justification": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    unconfined.shutdown().await;

    let confined = runtime(&format!("{SANDBOX_NONE}  approval-deny: {{}}\n"));
    let p = props(&confined);
    assert!(
        p.contains(&"sandbox_permissions".to_string()) && p.contains(&"justification".to_string()),
        "{p:?}"
    );
    let schema = confined.tool("bash").unwrap().input_schema().to_string();
    assert!(schema.contains("require_escalated"), "{schema}");
    assert!(confined.tool("bash").unwrap().description().contains("workspace-write"));
    confined.shutdown().await;
}

#[tokio::test]
async fn an_escalation_needs_a_justification_and_an_approver() {
    let rt = runtime(SANDBOX_NONE);
    let (o, _) = owner("s");
    let e = rt
        .call(&o, "bash", json!({"command": "true", "sandbox_permissions": "require_escalated"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("justification"), "{e}");
    let e = rt
        .call(
            &o,
            "bash",
            json!({"command": "true", "sandbox_permissions": "widen", "justification": "x"}),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("sandbox_permissions"), "{e}");
    let e = rt
        .call(&o, "bash", json!({"command": "true", "sandbox_permissions": "require_escalated", "justification": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::PermissionDenied);
    assert!(e.message().contains("no approval provider in this composition"), "{e}");
    rt.shutdown().await;
}

#[tokio::test]
async fn approval_deny_refuses_with_its_reason_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log");
    let rt = runtime(&format!("{SANDBOX_NONE}  approval-deny: {{}}\n"));
    let (o, _) = owner("s");
    let command = format!("echo escalated >> {}", file.display());
    let e = rt
        .call(&o, "bash", json!({"command": command, "sandbox_permissions": "require_escalated", "justification": "needs it"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::PermissionDenied);
    assert!(e.message().contains("escalation denied by approval-deny"), "{e}");
    assert!(e.message().contains("denies every escalation"), "{e}");
    assert!(!file.exists(), "a denied escalation runs nothing");
    rt.shutdown().await;
}

#[tokio::test]
async fn approval_allowlist_reruns_the_command_once_outside_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log");
    std::fs::write(&file, "seed\n").unwrap();
    let command = format!("echo escalated >> {}", file.display());
    let yaml = format!(
        "{SANDBOX_NONE}  approval-allowlist:\n    patterns: ['echo escalated >> {}']\n",
        file.display()
    );
    let rt = runtime(&yaml);
    let (o, _) = owner("s");
    // The plain call cannot run: sandbox-none cannot enforce workspace-write.
    let e = rt.call(&o, "bash", json!({"command": command})).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "seed\n", "nothing ran unconfined");
    // The escalated call is approved by the pattern and runs exactly once.
    let out = rt
        .call(&o, "bash", json!({"command": command, "sandbox_permissions": "require_escalated", "justification": "append to the log"}))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "seed\nescalated\n", "one run, one line");
    let s = &out.structured.unwrap()["sandbox"];
    assert_eq!(s["escalated"], true, "{s}");
    assert_eq!(s["mode"], "danger-full-access", "{s}");
    assert!(
        out.text.contains("[ran outside the sandbox after an approved escalation]"),
        "{}",
        out.text
    );
    // A command no rule matches is refused with the approver's reason.
    let e = rt
        .call(&o, "bash", json!({"command": format!("{command}; id"), "sandbox_permissions": "require_escalated", "justification": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::PermissionDenied);
    assert!(e.message().contains("no rule of approval-allowlist matched"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "seed\nescalated\n");
    rt.shutdown().await;
}

#[tokio::test]
async fn bash_sandbox_needs_a_sandbox_and_a_policy() {
    conch::link_all();
    for yaml in [
        "plugins:\n  subprocess-local: {}\n  sandbox-policy: {}\n  bash-sandbox: {}\n",
        "plugins:\n  subprocess-local: {}\n  sandbox-none: {}\n  bash-sandbox: {}\n",
    ] {
        let c = conch_config::Composition::from_yaml("t.yaml", yaml).unwrap();
        let e = conch_registry::plan(&c).unwrap_err().to_string();
        assert!(e.contains("bash-sandbox") && e.contains("requires"), "{e}");
    }
}

#[tokio::test]
async fn a_background_job_whose_runner_failed_settles_killed_and_says_why() {
    let rt = runtime(SANDBOX_NONE);
    let (o, _) = owner("s");
    let out = crate::tools::call(
        &rt,
        &o,
        "bash",
        json!({"command": "echo never", "run_in_background": true}),
    )
    .await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let args = json!({"job_id": id, "wait": true, "timeout_ms": 30000});
    let out = crate::tools::call(&rt, &o, "job_output", args).await;
    let s = out.structured.unwrap();
    assert_eq!(s["status"], "killed", "{s}");
    assert!(s["detail"].as_str().unwrap().starts_with("sandbox unavailable"), "{s}");
    assert!(!s["output"].as_str().unwrap().contains("never"), "{s}");
    rt.shutdown().await;
}
