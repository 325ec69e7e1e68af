//! Sandboxed terminals: `terminal_suite!` for terminal-bash with its shell wrapped through
//! `sandbox-landlock` and `sandbox-bwrap` (over subprocess-local, with the
//! `conch-sandbox-exec-test` helper), in workspace-write mode.
//!
//! The policy's root is the system temp directory: the suite's cases make their scratch
//! directories (cwd targets, pid files of detached processes) with `tempfile`, so that is
//! where the confined shell must be able to write; everything else stays read-only.

use std::sync::Arc;

use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_sandbox::{BwrapSandbox, LandlockSandbox};
use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};
use conch_seams::{Sandbox, SandboxMode, SandboxPolicy, Subprocess};

/// The helper binary cargo builds for this package's tests.
fn helper() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_conch-sandbox-exec-test").into()
}

fn backend(sandbox: Arc<dyn Sandbox>) -> Arc<TerminalShell> {
    let sub: Arc<dyn Subprocess> = Arc::new(LocalSubprocess::new(LocalConfig::default()));
    let config = TerminalShellConfig {
        idle_silence_ms: 1000,
        dispose_grace_ms: 500,
        ..TerminalShellConfig::default()
    };
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, std::env::temp_dir());
    Arc::new(TerminalShell::sandboxed(config, sub, sandbox, policy).unwrap())
}

mod landlock {
    use super::*;

    fn make() -> Arc<TerminalShell> {
        backend(Arc::new(LandlockSandbox::new(helper())))
    }

    conch_conformance::terminal_suite!(make);
}

mod bwrap {
    use super::*;

    fn make() -> Arc<TerminalShell> {
        backend(Arc::new(BwrapSandbox::new(std::path::Path::new("bwrap"), helper())))
    }

    conch_conformance::terminal_suite!(make);
}

/// The terminal tools over a composition that binds `sandbox-landlock` and a workspace-write
/// policy: the effects outside decide (the file in /etc is absent, the one in the root has
/// its bytes), shell state persists across sends inside the sandbox, and the session's mode
/// is in `terminal_open`'s and `terminal_list`'s results.
mod tools {
    use conch_registry::Runtime;
    use conch_seams::ToolOutput;
    use serde_json::{Value, json};

    use super::helper;
    use crate::{owner, runtime};

    /// terminal-bash is listed before the sandbox plugins on purpose: the wrap must not
    /// depend on the order the composition names them in.
    fn sandboxed(root: &std::path::Path) -> Runtime {
        runtime(&format!(
            "plugins:\n  subprocess-local: {{}}\n  terminal-bash: {{ idle_silence_ms: 1000, dispose_grace_ms: 500 }}\n  sandbox-landlock: {{ helper: '{}' }}\n  sandbox-policy: {{ mode: workspace-write, workspace_root: '{}' }}\n  terminals: {{}}\n  jobs: {{}}\n  tool-terminal: {{}}\n  tool-jobs: {{}}\n",
            helper().display(),
            root.display()
        ))
    }

    async fn call(
        rt: &Runtime,
        o: &std::sync::Arc<conch_seams::Owner>,
        tool: &str,
        args: Value,
    ) -> Value {
        let out: ToolOutput =
            rt.call(o, tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"));
        out.structured.unwrap()
    }

    /// The persistent `bash` tool rides on the same sandboxed sessions: a write outside the
    /// root fails (judged by the file), one inside lands, and the shell's state carries over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_persistent_bash_tool_runs_inside_the_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("escaped");
        let rt = runtime(&format!(
            "plugins:\n  subprocess-local: {{}}\n  terminal-bash: {{}}\n  sandbox-landlock: {{ helper: '{}' }}\n  sandbox-policy: {{ mode: workspace-write, workspace_root: '{}' }}\n  terminals: {{}}\n  tool-bash-persistent: {{}}\n",
            helper().display(),
            root.display()
        ));
        let (o, _) = owner("s");
        let bash = |command: String| {
            let (rt, o) = (&rt, &o);
            async move {
                let out = rt.call(o, "bash", json!({ "command": command })).await.unwrap();
                out.text
            }
        };
        let text = bash(format!("touch '{}'; echo status=$?", target.display())).await;
        assert!(text.contains("status=1"), "touch ran and failed: {text}");
        assert!(!target.exists(), "the persistent shell wrote outside the root");
        bash(format!("cd '{}' && export KEPT=yes && printf in > f", root.display())).await;
        assert_eq!(std::fs::read_to_string(root.join("f")).unwrap(), "in");
        let text = bash("echo $KEPT $(pwd)".into()).await;
        assert!(text.contains(&format!("yes {}", root.display())), "{text}");
        o.dispose().await;
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sandboxed_terminal_confines_writes_keeps_state_and_shows_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        let outside = std::path::Path::new("/etc/conch-x");
        assert!(!outside.exists(), "a leftover {} would hide the result", outside.display());
        let rt = sandboxed(&root);
        let (o, _) = owner("s");
        let opened = call(&rt, &o, "terminal_open", json!({})).await;
        assert_eq!(opened["sandbox"], "workspace-write", "{opened}");
        let id = opened["session_id"].as_str().unwrap().to_string();
        let send = |text: String| {
            let (rt, o, id) = (&rt, &o, id.clone());
            async move { call(rt, o, "terminal_send", json!({"session_id": id, "text": text})).await }
        };

        // The command runs (its own error shows) and the file stays absent.
        let r = send(format!("touch {} ; echo touch-status=$?", outside.display())).await;
        let out = r["output"].as_str().unwrap();
        assert!(out.contains("touch-status=1"), "touch ran and failed: {r}");
        assert!(!outside.exists(), "the sandboxed shell wrote {}", outside.display());

        // A write inside the root succeeds, with the bytes the shell wrote.
        send(format!("cd '{}' && printf inside > f", root.display())).await;
        assert_eq!(std::fs::read_to_string(root.join("f")).unwrap(), "inside");

        // cd and export persist across sends inside the sandbox.
        send("cd sub".into()).await;
        send("export CONCH_SANDBOX_VAR=kept".into()).await;
        let r = send("echo \"$CONCH_SANDBOX_VAR $(pwd)\"".into()).await;
        let want = format!("kept {}", root.join("sub").display());
        assert!(r["output"].as_str().unwrap().contains(&want), "{r}");

        let list = call(&rt, &o, "terminal_list", json!({})).await;
        assert_eq!(list["sessions"][0]["session_id"], id.as_str(), "{list}");
        assert_eq!(list["sessions"][0]["sandbox"], "workspace-write", "{list}");
        call(&rt, &o, "terminal_close", json!({"session_id": id})).await;
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unsandboxed_session_lists_a_null_sandbox() {
        let rt = runtime(
            "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  tool-terminal: {}\n",
        );
        let (o, _) = owner("s");
        let opened = call(&rt, &o, "terminal_open", json!({})).await;
        assert_eq!(opened["sandbox"], Value::Null, "{opened}");
        let list = call(&rt, &o, "terminal_list", json!({})).await;
        assert_eq!(list["sessions"][0]["sandbox"], Value::Null, "{list}");
        assert!(list["sessions"][0].as_object().unwrap().contains_key("sandbox"), "{list}");
        let id = opened["session_id"].as_str().unwrap();
        call(&rt, &o, "terminal_close", json!({"session_id": id})).await;
        rt.shutdown().await;
    }

    #[test]
    fn a_bound_sandbox_without_a_policy_fails_the_build_naming_sandbox_policy() {
        let yaml = format!(
            "plugins:\n  subprocess-local: {{}}\n  sandbox-landlock: {{ helper: '{}' }}\n  terminal-bash: {{}}\n",
            helper().display()
        );
        let e = conch::build_runtime_from_yaml(
            "t.yaml",
            &yaml,
            conch_env::ShellEnv::new("/tmp/conch-test-home".into()),
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`sandbox-policy`") && msg.contains("terminal-bash"), "{msg}");
    }

    /// A runner that cannot confine makes the open fail as `sandbox_unavailable`, promptly,
    /// and no session is published.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unavailable_runner_fails_the_open_without_a_hang() {
        let rt = runtime(
            "plugins:\n  subprocess-local: {}\n  sandbox-bwrap: { bwrap: /nonexistent/bwrap }\n  sandbox-policy: { mode: workspace-write, workspace_root: /tmp }\n  terminal-bash: {}\n  terminals: {}\n  tool-terminal: {}\n",
        );
        let (o, _) = owner("s");
        let e = conch_conformance::within("open", rt.call(&o, "terminal_open", json!({})))
            .await
            .unwrap_err();
        assert_eq!(e.code(), conch_seams::ErrorCode::SandboxUnavailable, "{e}");
        let list = call(&rt, &o, "terminal_list", json!({})).await;
        assert_eq!(list["sessions"], json!([]), "{list}");
        rt.shutdown().await;
    }
}
