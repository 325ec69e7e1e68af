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

/// The helper takes the command out of the caller's terminal session (no `TIOCSTI` into
/// conch's terminal), on both paths a one-shot spawn can take, and keeps the terminal of a
/// session it leads (a sandboxed terminal). `script` gives the run a PTY as controlling
/// terminal; field 7 of `/proc/self/stat` is the controlling terminal (0: none).
#[test]
fn the_helper_leaves_the_callers_terminal_but_keeps_its_own() {
    let have = |p: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("script") || !have("python3") {
        println!(
            "SKIP the_helper_leaves_the_callers_terminal_but_keeps_its_own: needs script(1) and python3"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, dir.path());
    let inner = dir.path().join("inner.sh");
    std::fs::write(
        &inner,
        r#"awk '{print "control", $7}' /proc/self/stat
# A process group leader that is not the session leader (how subprocess-local starts it).
python3 -c 'import os,sys; os.setpgid(0,0); os.execvp(sys.argv[1], sys.argv[1:])' \
  "$H" sandbox-exec --policy "$P" -- awk '{print "leader", $7}' /proc/self/stat </dev/null
# A plain member of the caller's session.
"$H" sandbox-exec --policy "$P" -- awk '{print "member", $7}' /proc/self/stat </dev/null
# The session leader of the PTY (a sandboxed terminal).
exec "$H" sandbox-exec --policy "$P" -- awk '{print "terminal", $7}' /proc/self/stat
"#,
    )
    .unwrap();
    let out = std::process::Command::new("script")
        .args(["-qec", &format!("exec sh {}", inner.display()), "/dev/null"])
        .env("H", helper())
        .env("P", serde_json::to_string(&policy).unwrap())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let tty = |label: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{label} ")))
            .unwrap_or_else(|| panic!("no {label} line in {text:?}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_ne!(tty("control"), 0, "the setup gives the run a terminal: {text}");
    assert_eq!(tty("leader"), 0, "a group leader kept the caller's terminal: {text}");
    assert_eq!(tty("member"), 0, "a session member kept the caller's terminal: {text}");
    assert_eq!(tty("terminal"), tty("control"), "the session leader lost its PTY: {text}");
}

/// bash-sandbox confined for real (workspace-write) keeps every shell contract: the shell
/// suite runs over each runner. The workspace root is `/tmp`, where the suite's commands
/// make their temporary directories; spills are written by conch, outside the sandbox.
mod bash_sandbox {
    use super::*;
    use conch_provider_shell::{BashLocal, BashLocalConfig};

    fn policy() -> SandboxPolicy {
        SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/tmp")
    }

    mod over_landlock {
        use super::*;

        fn make() -> Arc<BashLocal> {
            let sandbox = Arc::new(LandlockSandbox::new(helper()));
            Arc::new(
                BashLocal::sandboxed(BashLocalConfig::default(), local(), sandbox, policy())
                    .unwrap(),
            )
        }

        conch_conformance::shell_suite!(make);
    }

    mod over_bwrap {
        use super::*;

        fn make() -> Arc<BashLocal> {
            let sandbox = Arc::new(BwrapSandbox::new(std::path::Path::new("bwrap"), helper()));
            Arc::new(
                BashLocal::sandboxed(BashLocalConfig::default(), local(), sandbox, policy())
                    .unwrap(),
            )
        }

        conch_conformance::shell_suite!(make);
    }
}

/// A runner that cannot launch, for real: bubblewrap missing, or the helper binary gone.
/// Foreground calls fail `sandbox_unavailable` and run nothing; background calls settle at
/// once as killed, with `runner_failed`; neither hangs.
mod unavailable_runners {
    use std::time::Duration;

    use conch_provider_shell::{BashLocal, BashLocalConfig};
    use conch_seams::{ShellExecRequest, ShellExecutor, ShellProcessStatus};

    use super::*;

    fn executors(root: &std::path::Path) -> Vec<(&'static str, BashLocal)> {
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, root);
        let missing_bwrap: Arc<dyn Sandbox> =
            Arc::new(BwrapSandbox::new(std::path::Path::new("/nonexistent/bwrap"), helper()));
        let missing_helper: Arc<dyn Sandbox> =
            Arc::new(LandlockSandbox::new("/nonexistent/conch-helper".into()));
        [("missing bwrap", missing_bwrap), ("missing helper", missing_helper)]
            .into_iter()
            .map(|(what, sandbox)| {
                let exec = BashLocal::sandboxed(
                    BashLocalConfig::default(),
                    local(),
                    sandbox,
                    policy.clone(),
                )
                .unwrap();
                (what, exec)
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreground_is_sandbox_unavailable_and_background_is_runner_failed() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let marker = root.join("ran");
        for (what, exec) in executors(&root) {
            let cmd = format!("touch {}", marker.display());
            let spec = exec.resolve(ShellExecRequest::new(cmd.clone())).unwrap();
            let err = tokio::time::timeout(Duration::from_secs(30), exec.run(spec))
                .await
                .expect("no hang")
                .unwrap_err();
            assert_eq!(err.code(), conch_seams::ErrorCode::SandboxUnavailable, "{what}: {err}");
            let spec = exec.resolve(ShellExecRequest::new(cmd)).unwrap();
            let p = exec.start(spec).await;
            tokio::time::timeout(Duration::from_secs(30), p.wait()).await.expect("no hang");
            assert_eq!(p.status(), ShellProcessStatus::Killed, "{what}");
            let info = p.sandbox().expect("sandbox facts");
            assert!(info.runner_failed(), "{what}: {info:?}");
            assert!(!marker.exists(), "{what}: the command ran unconfined");
        }
    }
}

/// A helper that fails closed, as `sandbox-exec` does on a kernel without Landlock: one
/// `conch-sandbox: unavailable:` line and exit 126, the command never started. Run for real
/// (a script in place of the helper), so the executors' reading of the runner's verdict is
/// exercised on this kernel, which has Landlock.
mod refusing_helper {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use conch_provider_shell::{BashLocal, BashLocalConfig};
    use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};
    use conch_seams::{
        ErrorCode, ShellExecRequest, ShellExecutor, ShellProcessStatus, TerminalBackend,
        TerminalOpenSpec,
    };

    use super::*;

    const LINE: &str = "conch-sandbox: unavailable: landlock is not enabled in this kernel";

    fn refusing(dir: &std::path::Path) -> Arc<dyn Sandbox> {
        let helper = dir.join("refuse");
        std::fs::write(&helper, format!("#!/bin/sh\necho '{LINE}' >&2\nexit 126\n")).unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Arc::new(LandlockSandbox::new(helper))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bash_sandbox_reports_the_refusal_and_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let marker = root.join("ran");
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &root);
        let exec =
            BashLocal::sandboxed(BashLocalConfig::default(), local(), refusing(&root), policy)
                .unwrap();
        let cmd = format!("touch {}", marker.display());
        let spec = exec.resolve(ShellExecRequest::new(cmd.clone())).unwrap();
        let err = exec.run(spec).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
        assert!(err.message().contains(LINE), "{err}");
        let p = exec.start(exec.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
        tokio::time::timeout(Duration::from_secs(30), p.wait()).await.expect("no hang");
        assert!(p.sandbox().unwrap().runner_failed(), "{:?}", p.sandbox());
        assert_eq!(p.status(), ShellProcessStatus::Killed);
        assert!(!marker.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminal_open_fails_as_sandbox_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &root);
        let backend = TerminalShell::sandboxed(
            TerminalShellConfig::default(),
            local(),
            refusing(&root),
            policy,
        )
        .unwrap();
        let open = backend.open(TerminalOpenSpec::default());
        let opened = tokio::time::timeout(Duration::from_secs(30), open).await.expect("no hang");
        let Err(err) = opened else { panic!("a refused shell opened") };
        assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
    }
}

/// The helper as an ordinary user: without `CAP_SYS_ADMIN` it builds its mount layer inside
/// a user namespace, so `chmod` of the user's own file outside the roots is still refused
/// (ownership is all `chmod` checks, so only the read-only view stops it) while writes in
/// the root work. Needs root to become uid 65534 (`setpriv`); otherwise it says it skipped.
mod as_an_ordinary_user {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::Command;

    const NOBODY: u32 = 65534;

    fn chown(path: &std::path::Path) {
        let ok = Command::new("chown")
            .arg(format!("{NOBODY}:{NOBODY}"))
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown {}", path.display());
    }

    #[test]
    fn the_mount_layer_holds_in_a_user_namespace() {
        let root_user = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
        if !root_user || !setpriv {
            println!(
                "SKIP as_an_ordinary_user: needs root and setpriv to run the helper as uid {NOBODY}"
            );
            return;
        }
        // Everything the ordinary user needs, in directories it may enter.
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let helper = base.join("helper");
        std::fs::copy(super::helper(), &helper).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        for d in [&root, &outside] {
            std::fs::create_dir(d).unwrap();
            chown(d);
        }
        let victim = outside.join("mine");
        std::fs::write(&victim, "orig").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        chown(&victim);
        let as_nobody = |args: &[&str]| {
            let out = Command::new("setpriv")
                .args([
                    format!("--reuid={NOBODY}"),
                    format!("--regid={NOBODY}"),
                    "--clear-groups".into(),
                ])
                .arg(&helper)
                .arg("sandbox-exec")
                .args(args)
                .current_dir(&root)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), text)
        };
        let (code, probe) = as_nobody(&["--probe"]);
        assert_eq!(code, Some(0), "{probe}");
        let report: serde_json::Value = serde_json::from_str(probe.trim()).unwrap();
        if let Some(why) = report["mount_layer_unavailable"].as_str() {
            println!("SKIP as_an_ordinary_user: no user namespace here ({why})");
            return;
        }
        let policy = serde_json::to_string(&conch_seams::SandboxPolicy::new(
            conch_seams::SandboxMode::WorkspaceWrite,
            &root,
        ))
        .unwrap();
        let script = format!(
            "id -u; echo inside > new && cat new; chmod 0777 '{}'; echo \"chmod=$?\"",
            victim.display()
        );
        let (code, out) = as_nobody(&["--policy", &policy, "--", "bash", "-c", &script]);
        assert_eq!(code, Some(0), "{out}");
        assert!(out.starts_with(&format!("{NOBODY}\n")), "ran as the user: {out}");
        assert!(out.contains("inside\n"), "writes in the root work: {out}");
        assert!(out.contains("chmod=1") && out.contains("Read-only file system"), "{out}");
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "the user's own file outside the root was chmodded: {out}");
        assert_eq!(std::fs::read_to_string(root.join("new")).unwrap(), "inside\n");
    }
}

/// A command's private TMPDIR goes when the command does: a one-shot call's when the call
/// returns, a background command's when it settles, a sandboxed terminal's when it closes.
/// Judged by the directory each command printed.
mod private_tmpdirs_are_released {
    use std::time::Duration;

    use conch_provider_shell::{BashLocal, BashLocalConfig};
    use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};
    use conch_seams::{ShellExecRequest, ShellExecutor, TerminalBackend, TerminalOpenSpec};
    use tokio_util::sync::CancellationToken;

    use super::*;

    fn tmpdir_in(text: &str) -> std::path::PathBuf {
        let line = text.lines().find_map(|l| l.strip_prefix("TMP=")).unwrap_or_else(|| {
            panic!("no TMP= line in {text:?}");
        });
        std::path::PathBuf::from(line.trim())
    }

    async fn until_gone(dir: &std::path::Path) {
        conch_conformance::within(&format!("{} to be removed", dir.display()), async {
            while dir.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn for_one_shot_background_and_terminal_commands() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &root);
        let sandbox: Arc<dyn Sandbox> = Arc::new(LandlockSandbox::new(helper()));
        let exec = BashLocal::sandboxed(
            BashLocalConfig::default(),
            local(),
            Arc::clone(&sandbox),
            policy.clone(),
        )
        .unwrap();

        // One-shot: gone when the call returns.
        let spec =
            exec.resolve(ShellExecRequest::new("echo TMP=$TMPDIR; touch $TMPDIR/x")).unwrap();
        let out = exec.run(spec).await.unwrap();
        assert_eq!(out.status.code, Some(0), "{}", out.output.text);
        let dir = tmpdir_in(&out.output.text);
        assert!(!dir.exists(), "{} outlived its call", dir.display());

        // Background: there while it runs, gone once it settles.
        let spec = exec
            .resolve(ShellExecRequest::new(
                "echo TMP=$TMPDIR; touch $TMPDIR/x; mkfifo $TMPDIR/gate; cat $TMPDIR/gate",
            ))
            .unwrap();
        let p = exec.start(spec).await;
        let mut text = String::new();
        let dir = conch_conformance::within("the background TMP= line", async {
            loop {
                text.push_str(&p.read_output().text);
                if let Some(l) = text.lines().find_map(|l| l.strip_prefix("TMP=")) {
                    break std::path::PathBuf::from(l.trim());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let gate = dir.join("gate");
        conch_conformance::within("the gate FIFO", async {
            while !gate.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(dir.join("x").exists(), "the running command's TMPDIR is kept");
        std::fs::write(&gate, "go\n").unwrap();
        conch_conformance::within("the background command", p.wait()).await;
        until_gone(&dir).await;

        // Terminal: gone when the session closes.
        let backend = TerminalShell::sandboxed(
            TerminalShellConfig::default(),
            local(),
            Arc::clone(&sandbox),
            policy,
        )
        .unwrap();
        let session = backend.open(TerminalOpenSpec::default()).await.unwrap();
        let settle = session
            .send(conch_seams::SendRequest::line("echo TMP=$TMPDIR"), CancellationToken::new())
            .await
            .unwrap();
        let text = match settle {
            conch_seams::SendOutcome::Ready(s) => s.delta,
            other => panic!("{other:?}"),
        };
        let dir = tmpdir_in(&text);
        assert!(dir.exists(), "the open session's TMPDIR is kept");
        session.close().await.unwrap();
        until_gone(&dir).await;
    }
}

/// A workspace root of `/` (conch started in `/`, as in a container whose WORKDIR is `/`)
/// makes everything writable but the read-only paths: the landlock runner runs the command
/// instead of refusing because `/` stayed writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_root_of_slash_runs_the_command() {
    let sandbox = LandlockSandbox::new(helper());
    if !sandbox.capabilities().modes.contains(&SandboxMode::WorkspaceWrite) {
        println!("SKIP a_workspace_root_of_slash_runs_the_command: no landlock here");
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("written");
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/");
    let line = CommandLine::new(vec![
        "bash".into(),
        "-c".into(),
        format!("echo ran > '{}'; echo ok", target.display()),
    ])
    .with_cwd(Some("/".into()));
    let wrapped = sandbox.wrap(&policy, line).unwrap();
    let out = std::process::Command::new(&wrapped.argv[0])
        .args(&wrapped.argv[1..])
        .current_dir("/")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(text, "ok\n");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "ran\n");
}
