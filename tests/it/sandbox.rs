//! The sandbox suite for both runners (`sandbox-landlock`, `sandbox-bwrap`), spawning
//! through subprocess-local with the `conch-sandbox-exec-test` helper binary, plus the
//! runner-specific cases: unavailable runners and the helper's fail-closed exit.

use std::sync::Arc;

use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_sandbox::{BwrapSandbox, LandlockSandbox};
use conch_seams::{CommandLine, ErrorCode, Sandbox, SandboxMode, SandboxPolicy, Subprocess};

/// The helper binary cargo builds for this package's tests.
fn helper() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_conch-sandbox-exec-test").into()
}

fn local() -> Arc<dyn Subprocess> {
    Arc::new(LocalSubprocess::new(LocalConfig::default()))
}

mod landlock {
    use super::*;
    conch_conformance::sandbox_suite!(|| (
        Arc::new(LandlockSandbox::new(helper())) as Arc<dyn Sandbox>,
        local()
    ));
}

mod bwrap {
    use super::*;
    conch_conformance::sandbox_suite!(|| (
        Arc::new(BwrapSandbox::new(std::path::Path::new("bwrap"), helper())) as Arc<dyn Sandbox>,
        local()
    ));
}

#[test]
fn a_missing_bwrap_builds_but_refuses_to_wrap_with_what_to_do() {
    let sandbox = BwrapSandbox::new(std::path::Path::new("/nonexistent/bwrap"), helper());
    let caps = sandbox.capabilities();
    assert_eq!(caps.modes, vec![SandboxMode::DangerFullAccess], "{caps:?}");
    assert!(!caps.pid_isolation && !caps.network_control);
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/tmp");
    let err = sandbox.wrap(&policy, CommandLine::new(vec!["true".into()])).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
    assert!(err.to_string().contains("apt-get install bubblewrap"), "{err}");
    // danger-full-access needs no runner.
    let dfa = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/tmp");
    assert!(sandbox.wrap(&dfa, CommandLine::new(vec!["true".into()])).is_ok());
}

#[test]
fn the_helper_refuses_a_bad_command_line_without_running_anything() {
    let out = std::process::Command::new(helper())
        .args(["sandbox-exec", "--policy", "{not json", "--", "touch", "/tmp/conch-never"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("conch-sandbox: usage:"));
}

#[test]
fn the_helper_reports_a_missing_program_like_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, dir.path());
    let json = serde_json::to_string(&policy).unwrap();
    let out = std::process::Command::new(helper())
        .args(["sandbox-exec", "--policy", &json, "--", "/nonexistent/conch-no-such"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("conch-no-such"));
}
