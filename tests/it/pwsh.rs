//! PowerShell 7: pwsh-local, pwsh-sandbox, the `pwsh` tool and the persistent `pwsh`.
//!
//! The first tests run everywhere: what conch does when pwsh is missing, and how the tools
//! are put together. The rest need a real `pwsh` on PATH (never a stand-in): they return at
//! once without one, and `skipped_cases_are_reported` prints the one visible line
//! `skipped: pwsh not found on PATH (N cases)`.

use std::sync::Arc;

use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_sandbox::SandboxNone;
use conch_provider_shell::{PwshLocal, PwshLocalConfig};
use conch_registry::Runtime;
use conch_seams::{
    ErrorCode, SandboxMode, SandboxPolicy, ShellExecRequest, ShellExecutor, ShellProcessStatus,
};
use serde_json::{Value, json};

use crate::{owner, runtime};

/// The exact words for a pwsh missing from PATH.
const MISSING: &str = "PowerShell 7 (`pwsh`) was not found on PATH";

fn local() -> Arc<LocalSubprocess> {
    Arc::new(LocalSubprocess::new(LocalConfig::default()))
}

/// A request whose shell is looked up on a PATH with nothing on it, so pwsh is missing
/// whether or not this machine has one.
fn without_pwsh(command: &str) -> ShellExecRequest {
    let mut req = ShellExecRequest::new(command);
    req.env.insert("PATH".into(), Some("/nonexistent/conch-empty-path".into()));
    req
}

#[tokio::test]
async fn a_missing_pwsh_is_spawn_failed_saying_so_in_the_foreground_and_background() {
    let exec = PwshLocal::new(PwshLocalConfig::default(), local()).unwrap();
    let err = exec.run(exec.resolve(without_pwsh("'hi'")).unwrap()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().starts_with(MISSING), "{err}");
    let proc = exec.start(exec.resolve(without_pwsh("'hi'")).unwrap()).await;
    proc.wait().await;
    assert_eq!(proc.status(), ShellProcessStatus::Killed);
    assert!(proc.read_output().text.starts_with(MISSING), "{:?}", proc.snapshot());
    // A missing workdir is still the workdir's error, not pwsh's.
    let err = exec
        .run(exec.resolve(without_pwsh("'hi'").with_workdir("/nonexistent/conch-wd")).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/conch-wd"), "{err}");
}

#[tokio::test]
async fn a_missing_pwsh_under_a_sandbox_is_named_before_any_runner_starts() {
    let cfg = PwshLocalConfig { pwsh: "conch-no-such-pwsh".into(), ..Default::default() };
    let policy = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/tmp");
    let exec = PwshLocal::sandboxed(cfg, local(), Arc::new(SandboxNone), policy).unwrap();
    assert_eq!(exec.provider_name(), "pwsh-sandbox");
    let err = exec.run(exec.resolve(ShellExecRequest::new("'hi'")).unwrap()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(
        err.to_string().starts_with("PowerShell 7 (`conch-no-such-pwsh`) was not found on PATH"),
        "{err}"
    );
}

fn pwsh_runtime(pwsh: &str) -> Runtime {
    runtime(&format!(
        "plugins:\n  subprocess-local: {{}}\n  pwsh-local: {{ pwsh: {pwsh} }}\n  jobs: {{}}\n  tool-pwsh: {{}}\n  tool-jobs: {{}}\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pwsh_tool_reports_a_missing_pwsh_as_spawn_failed_and_its_job_as_killed() {
    let rt = pwsh_runtime("conch-no-such-pwsh");
    let (o, _) = owner("s");
    let want = "PowerShell 7 (`conch-no-such-pwsh`) was not found on PATH";
    let err = rt.call(&o, "pwsh", json!({"command": "'hi'"})).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().starts_with(want), "{err}");
    let started =
        rt.call(&o, "pwsh", json!({"command": "'hi'", "run_in_background": true})).await.unwrap();
    let id = started.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("pwsh-"), "jobs are named after the dialect: {id}");
    let out = rt.call(&o, "job_output", json!({"job_id": id, "wait": true})).await.unwrap();
    let s = out.structured.unwrap();
    assert_eq!(s["status"], "killed", "{s}");
    assert!(s["output"].as_str().unwrap().starts_with(want), "{s}");
    // The job's detail (and so its completion notice) says why, not just "killed".
    assert!(s["detail"].as_str().unwrap().starts_with(want), "{s}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_persistent_pwsh_reports_a_missing_pwsh_as_spawn_failed() {
    let rt = runtime(
        "plugins:\n  subprocess-local: {}\n  terminal-bash: { shell_dialect: pwsh, pwsh: conch-no-such-pwsh }\n  terminals: {}\n  tool-pwsh-persistent: {}\n",
    );
    let (o, _) = owner("s");
    let err = rt.call(&o, "pwsh", json!({"command": "'hi'"})).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(
        err.to_string().starts_with("PowerShell 7 (`conch-no-such-pwsh`) was not found on PATH"),
        "{err}"
    );
    rt.shutdown().await;
}

#[test]
fn pwsh_and_bash_resolve_a_call_to_the_same_directory_and_environment() {
    // One executor in two flavours: the working directory (configured, joined, or the
    // provider's default) and the environment layering come from the same code.
    let cwd = Some(std::path::PathBuf::from("/srv/work"));
    let bash = conch_provider_shell::BashLocal::new(
        conch_provider_shell::BashLocalConfig { cwd: cwd.clone(), ..Default::default() },
        local(),
    )
    .unwrap();
    let pwsh = PwshLocal::new(PwshLocalConfig { cwd, ..Default::default() }, local()).unwrap();
    for workdir in [None, Some("sub"), Some("/abs")] {
        let req = |cmd: &str| {
            let mut r = ShellExecRequest::new(cmd).with_timeout_ms(5000);
            r.workdir = workdir.map(Into::into);
            r.env.insert("CALLER".into(), Some("x".into()));
            r
        };
        let (b, p) = (bash.resolve(req("true")).unwrap(), pwsh.resolve(req("$true")).unwrap());
        assert_eq!(b.cwd, p.cwd, "{workdir:?}");
        assert_eq!(
            (b.timeout, b.output_max_bytes, b.spill_cap, b.grace),
            (p.timeout, p.output_max_bytes, p.spill_cap, p.grace)
        );
        for (k, v) in &b.env {
            assert_eq!(p.env.get(k), Some(v), "{k}: bash's layering holds for pwsh");
        }
        assert_eq!(p.env.get("POWERSHELL_TELEMETRY_OPTOUT"), Some(&Some("1".into())));
    }
    // A NUL cannot travel in any command line: refused before anything runs, in both.
    for exec in [&bash as &dyn ShellExecutor, &pwsh] {
        let err = exec.resolve(ShellExecRequest::new("echo a\0b")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.message().contains("NUL"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parse_exit_status_reads_real_bash_results_of_both_tools() {
    // The renderers are the same for every dialect; here they render real bash runs (the
    // pwsh runs are among the gated cases below).
    use conch_tools::{RenderedExit, parse_exit_status};
    let rt = crate::standard();
    let (o, _) = owner("s");
    for (cmd, want) in [
        ("echo ok", Some(RenderedExit::Code(0))),
        ("echo '[exit code: 9]'", Some(RenderedExit::Code(0))),
        ("printf partial; exit 3", Some(RenderedExit::Code(3))),
        ("kill -KILL $$", Some(RenderedExit::Signal("SIGKILL".into()))),
    ] {
        let out = rt.call(&o, "bash", json!({"command": cmd})).await.unwrap();
        assert_eq!(parse_exit_status(&out.text), want, "{cmd}: {:?}", out.text);
    }
    rt.shutdown().await;
    let rt = runtime(conch::EMBEDDED.iter().find(|(n, _)| *n == "minimal").unwrap().1);
    for (cmd, want) in [
        ("echo ok", Some(RenderedExit::Code(0))),
        ("false", Some(RenderedExit::Code(1))),
        ("exit 4", Some(RenderedExit::Code(4))),
        ("sleep 100", None),
    ] {
        let args = json!({"command": cmd, "timeout_ms": 1500});
        let out = rt.call(&o, "bash", args).await.unwrap();
        assert_eq!(parse_exit_status(&out.text), want, "{cmd}: {:?}", out.text);
    }
    rt.shutdown().await;
}

/// Real-pwsh cases: each returns at once without `pwsh` on PATH, and the suite says so once.
macro_rules! pwsh_cases {
    ($($(#[doc = $doc:literal])* async fn $name:ident() $body:block)*) => {
        const CASES: usize = [$(stringify!($name)),*].len();

        #[test]
        fn skipped_cases_are_reported() {
            conch_conformance::report_gate(conch_conformance::pwsh_on_path(), CASES);
        }

        $(
            $(#[doc = $doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if conch_conformance::pwsh_on_path().is_err() {
                    return;
                }
                $body
            }
        )*
    };
}

/// The embedded one-shot pwsh composition.
fn one_shot() -> Runtime {
    runtime(conch::EMBEDDED.iter().find(|(n, _)| *n == "pwsh").unwrap().1)
}

/// The embedded persistent pwsh composition.
fn persistent() -> Runtime {
    runtime(conch::EMBEDDED.iter().find(|(n, _)| *n == "pwsh-minimal").unwrap().1)
}

async fn pwsh(rt: &Runtime, o: &Arc<conch_seams::Owner>, command: &str) -> conch_seams::ToolOutput {
    rt.call(o, "pwsh", json!({"command": command}))
        .await
        .unwrap_or_else(|e| panic!("pwsh {command:?}: {e}"))
}

fn exit_code(out: &conch_seams::ToolOutput) -> Value {
    out.structured.as_ref().map_or(Value::Null, |s| s["exit_code"].clone())
}

pwsh_cases! {
    /// `$LASTEXITCODE` of a failing native command is the exit code; a later success is 0;
    /// a failing cmdlet is 1; `exit N` is N.
    async fn the_exit_code_is_what_a_powershell_user_expects() {
        use conch_tools::{RenderedExit, parse_exit_status};
        let rt = one_shot();
        let (o, _) = owner("s");
        for (cmd, code) in [
            ("sh -c 'exit 5'", 5),
            ("sh -c 'exit 5'; 'after'", 0),
            ("sh -c 'exit 5'; exit $LASTEXITCODE", 5),
            ("Get-Item /nonexistent/conch", 1),
            ("exit 7", 7),
            ("'fine'", 0),
            ("$ErrorActionPreference", 0),
        ] {
            let out = pwsh(&rt, &o, cmd).await;
            assert_eq!(exit_code(&out), json!(code), "{cmd}: {}", out.text);
            assert_eq!(parse_exit_status(&out.text), Some(RenderedExit::Code(code)), "{cmd}");
        }
        let out = pwsh(&rt, &o, "$ErrorActionPreference").await;
        assert_eq!(out.text, "Continue\n", "left as pwsh sets it");
        rt.shutdown().await;
    }

    /// A thrown error ends the command with 1 and its message; nothing after it runs.
    async fn a_thrown_error_exits_1_with_its_message() {
        let rt = one_shot();
        let (o, _) = owner("s");
        let out = pwsh(&rt, &o, "'before'; throw 'conch-boom'; 'after'").await;
        assert_eq!(exit_code(&out), json!(1), "{}", out.text);
        assert!(out.text.starts_with("before\n") && out.text.contains("conch-boom"), "{}", out.text);
        assert!(!out.text.contains("after"), "{}", out.text);
        assert!(!out.text.contains('\u{1b}'), "plain text: {:?}", out.text);
        let out = pwsh(&rt, &o, "Get-Item /nonexistent/conch -ErrorAction Stop; 'after'").await;
        assert_eq!(exit_code(&out), json!(1), "{}", out.text);
        assert!(!out.text.contains("after"), "{}", out.text);
        let out = pwsh(&rt, &o, "if (").await;
        assert_eq!(exit_code(&out), json!(1), "{}", out.text);
        assert!(out.text.starts_with("ParserError: line 1, column"), "{}", out.text);
        rt.shutdown().await;
    }

    /// Progress records never reach the output, so they cannot garble it.
    async fn write_progress_does_not_garble_the_output() {
        let rt = one_shot();
        let (o, _) = owner("s");
        let cmd = "1..3 | ForEach-Object { Write-Progress -Activity work -Status \"step $_\" \
                   -PercentComplete ($_ * 30); \"line $_\" }; Write-Progress -Activity work -Completed";
        let out = pwsh(&rt, &o, cmd).await;
        assert_eq!(out.text, "line 1\nline 2\nline 3\n");
        let rt2 = persistent();
        let out = pwsh(&rt2, &o, cmd).await;
        assert_eq!(out.text, "line 1\nline 2\nline 3\n");
        rt.shutdown().await;
        rt2.shutdown().await;
    }

    /// Any command text reaches pwsh unchanged: quotes of every kind, `$`, backticks,
    /// newlines, non-ASCII and astral characters.
    async fn command_text_reaches_pwsh_byte_for_byte() {
        let rt = one_shot();
        let (o, _) = owner("s");
        let text = "it's \"q\" ‘s’ $x `t é 😀 𝄞";
        let cmd = format!("[Console]::Out.Write(@'\n{text}\n'@)");
        assert_eq!(pwsh(&rt, &o, &cmd).await.text, text);
        rt.shutdown().await;
    }

    /// The working directory is canonical, the same one bash reports.
    async fn the_working_directory_is_canonical_like_bash() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let rt = one_shot();
        let (o, _) = owner("s");
        let args = json!({"command": "(Get-Location).Path", "workdir": link});
        let out = rt.call(&o, "pwsh", args).await.unwrap();
        let canonical = real.canonicalize().unwrap();
        assert_eq!(out.text.trim_end(), canonical.display().to_string());
        let bash = crate::standard();
        let args = json!({"command": "pwd -P", "workdir": link});
        assert_eq!(bash.call(&o, "bash", args).await.unwrap().text, out.text);
        rt.shutdown().await;
        bash.shutdown().await;
    }

    /// `$env:` variables, the location and functions persist between persistent calls.
    async fn persistent_pwsh_keeps_env_location_and_functions() {
        let dir = tempfile::tempdir().unwrap();
        let rt = persistent();
        let (o, _) = owner("s");
        let set = format!(
            "$env:CONCH_KEPT = 'kept'; Set-Location '{}'; function Get-Conch {{ 'fn' }}",
            dir.path().display()
        );
        assert_eq!(pwsh(&rt, &o, &set).await.text, "");
        let out = pwsh(&rt, &o, "\"$env:CONCH_KEPT $((Get-Location).Path) $(Get-Conch)\"").await;
        let real = dir.path().canonicalize().unwrap();
        assert_eq!(out.text, format!("kept {} fn\n", real.display()));
        // Children see the variable too.
        assert_eq!(pwsh(&rt, &o, "sh -c 'echo $CONCH_KEPT'").await.text, "kept\n");
        rt.shutdown().await;
    }

    /// The persistent pwsh reports statuses as the one-shot tool does, and survives them.
    async fn persistent_pwsh_statuses_and_resets() {
        let rt = persistent();
        let (o, _) = owner("s");
        assert_eq!(pwsh(&rt, &o, "sh -c 'exit 4'").await.text, "[exit code: 4]");
        let out = pwsh(&rt, &o, "throw 'conch-boom'").await;
        assert!(out.text.contains("conch-boom") && out.text.ends_with("[exit code: 1]"), "{}", out.text);
        let out = pwsh(&rt, &o, "if (").await;
        assert!(out.text.starts_with("ParserError: line 1") && out.text.ends_with("[exit code: 1]"), "{}", out.text);
        assert_eq!(pwsh(&rt, &o, "$ErrorActionPreference = 'Stop'; 'set'").await.text, "set\n");
        let out = pwsh(&rt, &o, "Get-Item /nonexistent/conch; 'after'").await;
        assert!(!out.text.contains("after") && out.text.ends_with("[exit code: 1]"), "{}", out.text);
        let out = pwsh(&rt, &o, "exit 3").await;
        assert_eq!(out.text, "[exit code: 3]\n[the shell exited; the next call starts a fresh shell]");
        assert_eq!(pwsh(&rt, &o, "$ErrorActionPreference").await.text, "Continue\n", "fresh shell");
        let args = json!({"command": "Start-Sleep 100", "timeout_ms": 2000});
        let out = rt.call(&o, "pwsh", args).await.unwrap();
        assert_eq!(out.text, "[timed out after 2000ms; the shell was reset and the next call starts fresh]");
        assert_eq!(pwsh(&rt, &o, "'again'").await.text, "again\n");
        rt.shutdown().await;
    }

    /// pwsh-sandbox confines pwsh as bash-sandbox confines bash, and marks its denials.
    async fn pwsh_sandbox_confines_pwsh_under_landlock() {
        use conch_provider_sandbox::LandlockSandbox;
        use conch_seams::Sandbox;
        let sandbox = LandlockSandbox::new(env!("CARGO_BIN_EXE_conch-sandbox-exec-test").into());
        if !sandbox.capabilities().modes.contains(&SandboxMode::WorkspaceWrite) {
            println!("SKIP pwsh_sandbox_confines_pwsh_under_landlock: no Landlock here");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, root.path());
        let exec =
            PwshLocal::sandboxed(PwshLocalConfig::default(), local(), Arc::new(sandbox), policy)
                .unwrap();
        let inside = root.path().join("ok.txt");
        let cmd = format!("Set-Content -LiteralPath '{}' -Value ok; 'wrote'", inside.display());
        let req = ShellExecRequest::new(cmd).with_workdir(root.path());
        let r = exec.run(exec.resolve(req).unwrap()).await.unwrap();
        assert_eq!((r.status.code, r.output.text.as_str()), (Some(0), "wrote\n"), "{r:?}");
        assert_eq!(std::fs::read_to_string(&inside).unwrap(), "ok\n");
        let req = ShellExecRequest::new("Set-Content -LiteralPath /etc/conch-pwsh-x -Value x")
            .with_workdir(root.path());
        let r = exec.run(exec.resolve(req).unwrap()).await.unwrap();
        assert_eq!(r.status.code, Some(1), "{r:?}");
        let info = r.sandbox.clone().expect("sandbox facts");
        assert!(info.denied(), "the denial is marked: {r:?}");
        assert!(!std::path::Path::new("/etc/conch-pwsh-x").exists());
    }

    /// Read-Host in a pwsh terminal is a stdin wait, and the answer reaches it.
    async fn read_host_is_stdin_read_in_a_pwsh_terminal() {
        let rt = runtime(
            "plugins:\n  subprocess-local: {}\n  terminal-bash: { shell_dialect: pwsh, idle_silence_ms: 20000 }\n  terminals: {}\n  tool-terminal: {}\n",
        );
        let (o, _) = owner("s");
        let open = rt.call(&o, "terminal_open", json!({})).await.unwrap();
        let s = open.structured.unwrap();
        assert_eq!(s["type"], "pwsh", "{s}");
        let id = s["session_id"].as_str().unwrap().to_string();
        let send = |text: &str| {
            let args = json!({"session_id": id, "text": text});
            let rt = &rt;
            let o = &o;
            async move { rt.call(o, "terminal_send", args).await.unwrap().structured.unwrap() }
        };
        let r = send("$n = Read-Host 'name?'").await;
        assert_eq!(r["wait_reason"], "stdin_read", "{r}");
        assert!(r["output"].as_str().unwrap().contains("name?: "), "{r}");
        let r = send("conch").await;
        assert_eq!(r["wait_reason"], "stdin_read", "{r}");
        let r = send("\"got $n\"").await;
        assert!(r["output"].as_str().unwrap().contains("got conch\n"), "{r}");
        // A SIGINT at pwsh's prompt is harmless: the next line runs whole.
        rt.call(&o, "terminal_signal", json!({"session_id": id, "signal": "SIGINT"})).await.unwrap();
        let r = send("\"still $(6*7)\"").await;
        assert!(r["output"].as_str().unwrap().contains("still 42\n"), "{r}");
        rt.call(&o, "terminal_close", json!({"session_id": id})).await.unwrap();
        rt.shutdown().await;
    }
}
