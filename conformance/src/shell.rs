//! Cases for the `ShellExecutor` seam. Each case runs its command in the executor's dialect:
//! the bash text, or the PowerShell 7 text that means the same (see [`script`]); a case whose
//! script exists in one dialect only says so with a `SKIP` line in the other.

use std::collections::BTreeMap;
use std::time::Duration;

use conch_seams::{Dialect, ErrorCode, ShellExecRequest, ShellExecutor, ShellProcessStatus};
use tokio_util::sync::CancellationToken;

use crate::{Outcome, pid_gone, skip, within};

/// True when the executor speaks PowerShell.
pub fn is_pwsh(p: &dyn ShellExecutor) -> bool {
    p.dialect() == Dialect::Pwsh
}

/// The command for `p`'s dialect: `bash`, or `pwsh` for PowerShell 7.
pub fn script(p: &dyn ShellExecutor, bash: &str, pwsh: &str) -> String {
    if is_pwsh(p) { pwsh.to_string() } else { bash.to_string() }
}

/// How long a case's timeout gives bash to start and write its first line before the
/// timeout is what it tests: a sandbox runner (bubblewrap, the Landlock helper) takes a few
/// hundred milliseconds to start it on a loaded machine (300 ms was too little in a soak with
/// two busy loops beside the suite). That is the premise of those cases, not the behaviour
/// under test (each such case takes this long).
const FIRST_LINE_MS: u64 = 2_000;

/// A foreground timeout that leaves room for the shell to start first: pwsh takes a
/// second or more before it runs anything, bash milliseconds.
fn after_startup(p: &dyn ShellExecutor, bash_ms: u64) -> u64 {
    if is_pwsh(p) { bash_ms.max(20_000) } else { bash_ms }
}

async fn run(p: &dyn ShellExecutor, req: ShellExecRequest) -> conch_seams::ShellRunResult {
    let spec = p.resolve(req).expect("resolve");
    within("foreground run", p.run(spec)).await.expect("run succeeds for a real command")
}

pub async fn run_returns_output_and_zero_exit(p: &dyn ShellExecutor) -> Outcome {
    let cmd = script(
        p,
        "echo hello; echo oops >&2",
        "[Console]::Out.WriteLine('hello'); [Console]::Error.WriteLine('oops')",
    );
    let r = run(p, ShellExecRequest::new(cmd)).await;
    assert_eq!(r.status.code, Some(0));
    assert_eq!(r.output.text, "hello\noops\n", "stdout and stderr are merged in order");
    assert!(!r.timed_out && !r.aborted);
    assert_eq!(r.output.total_bytes, 11);
    assert_eq!(r.output.omitted_bytes, 0);
    Ok(())
}

pub async fn nonzero_exit_is_a_result(p: &dyn ShellExecutor) -> Outcome {
    let r =
        run(p, ShellExecRequest::new(script(p, "echo partial; exit 7", "'partial'; exit 7"))).await;
    assert_eq!(r.status.code, Some(7));
    assert_eq!(r.output.text, "partial\n");
    let r = run(p, ShellExecRequest::new("conch-no-such-command-xyz")).await;
    // bash's code for a missing command is 127; pwsh's, for the failed statement, 1.
    assert_eq!(
        r.status.code,
        Some(if is_pwsh(p) { 1 } else { 127 }),
        "command not found is the shell's answer, not an infrastructure error: {r:?}"
    );
    assert!(r.output.text.contains("conch-no-such-command-xyz"), "{r:?}");
    Ok(())
}

pub async fn terminal_overrides_are_applied(p: &dyn ShellExecutor) -> Outcome {
    let cmd = script(
        p,
        "echo $NO_COLOR $TERM $PAGER $GIT_PAGER",
        "\"$env:NO_COLOR $env:TERM $env:PAGER $env:GIT_PAGER\"",
    );
    let r = run(p, ShellExecRequest::new(cmd)).await;
    assert_eq!(r.output.text, "1 dumb cat cat\n");
    Ok(())
}

pub async fn managed_env_wins_over_caller_env(p: &dyn ShellExecutor) -> Outcome {
    let mut req = ShellExecRequest::new(script(
        p,
        "echo $CONCH_SESSION_ID $TERM $OTHER",
        "\"$env:CONCH_SESSION_ID $env:TERM $env:OTHER\"",
    ));
    req.env.insert("CONCH_SESSION_ID".into(), Some("spoofed".into()));
    req.env.insert("TERM".into(), Some("xterm".into()));
    req.env.insert("OTHER".into(), Some("caller".into()));
    let mut managed = BTreeMap::new();
    managed.insert("CONCH_SESSION_ID".to_string(), "trusted".to_string());
    let r = run(p, req.with_managed_env(managed)).await;
    assert_eq!(
        r.output.text, "trusted xterm caller\n",
        "managed beats caller, caller beats overrides"
    );
    Ok(())
}

pub async fn timeout_kills_and_reports_timed_out(p: &dyn ShellExecutor) -> Outcome {
    let ms = after_startup(p, FIRST_LINE_MS);
    let cmd = script(p, "echo started; sleep 1000", "'started'; Start-Sleep 1000");
    let r = run(p, ShellExecRequest::new(cmd).with_timeout_ms(ms)).await;
    assert!(r.timed_out, "timeout was the first cause");
    assert!(!r.aborted, "timed_out and aborted are exclusive");
    assert_eq!(r.timeout_ms, ms);
    assert!(r.status.signal.is_some(), "the tree was killed by a signal: {r:?}");
    assert_eq!(r.output.text, "started\n", "partial output is kept");
    Ok(())
}

pub async fn abort_kills_and_reports_aborted(p: &dyn ShellExecutor) -> Outcome {
    let cancel = CancellationToken::new();
    let cmd = script(p, "echo go; sleep 1000", "'go'; Start-Sleep 1000");
    let spec = p.resolve(ShellExecRequest::new(cmd).with_cancel(cancel.clone())).unwrap();
    let run = p.run(spec);
    let trigger = async {
        // Give the spawn a head start so the usual path (kill a live tree) is exercised; an
        // abort that lands before the spawn is reported the same way.
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    };
    let (r, ()) = within("aborted run", async { tokio::join!(run, trigger) }).await;
    let r = r.unwrap();
    assert!(r.aborted, "abort was the first cause");
    assert!(!r.timed_out);
    assert_ne!(r.status.code, Some(0), "sleep 1000 did not finish normally");
    Ok(())
}

pub async fn already_aborted_request_does_not_run(p: &dyn ShellExecutor) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let cancel = CancellationToken::new();
    cancel.cancel();
    let cmd = script(
        p,
        &format!("touch {}", marker.display()),
        &format!("New-Item -ItemType File -Path '{}'", marker.display()),
    );
    let r = run(p, ShellExecRequest::new(cmd).with_cancel(cancel)).await;
    assert!(r.aborted);
    assert!(!marker.exists(), "an already-aborted request must not start the command");
    Ok(())
}

/// Every limit is filled in from the executor's configuration, a timeout within the cap is
/// honoured, one past it gets the cap, and zero is refused. The values themselves are the
/// composition's (bash-local's defaults are checked in its own tests).
pub async fn resolve_fills_defaults_and_caps_timeout(p: &dyn ShellExecutor) -> Outcome {
    let spec = p.resolve(ShellExecRequest::new("true")).unwrap();
    assert!(spec.timeout > Duration::ZERO, "a default timeout: {spec:?}");
    assert!(spec.output_max_bytes > 0, "a default output bound: {spec:?}");
    let huge = u64::from(u32::MAX);
    let capped = p.resolve(ShellExecRequest::new("true").with_timeout_ms(huge)).unwrap();
    let cap = capped.timeout;
    assert!(cap >= spec.timeout && cap < Duration::from_millis(huge), "timeout is capped: {cap:?}");
    let cap_ms = u64::try_from(cap.as_millis()).unwrap();
    let beyond = p.resolve(ShellExecRequest::new("true").with_timeout_ms(cap_ms + 1)).unwrap();
    assert_eq!(beyond.timeout, cap, "one past the cap gets the cap");
    if cap_ms > 1 {
        let under = p.resolve(ShellExecRequest::new("true").with_timeout_ms(cap_ms - 1)).unwrap();
        assert_eq!(under.timeout, Duration::from_millis(cap_ms - 1), "within the cap is honoured");
    }
    let err = p.resolve(ShellExecRequest::new("true").with_timeout_ms(0)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    Ok(())
}

pub async fn resolve_rejects_an_empty_command(p: &dyn ShellExecutor) -> Outcome {
    let err = p.resolve(ShellExecRequest::new("   ")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    Ok(())
}

pub async fn a_missing_workdir_is_refused_where_the_world_is(p: &dyn ShellExecutor) -> Outcome {
    // Resolve computes no filesystem facts; the subprocess provider refuses at spawn.
    let spec = p.resolve(ShellExecRequest::new("true").with_workdir("/nonexistent/conch-wd"));
    let spec = spec.expect("resolve does not look at the filesystem");
    let err = within("run in a missing workdir", p.run(spec)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("/nonexistent/conch-wd"), "names the directory: {err}");
    // In the background the same refusal settles the process as killed, with the reason.
    let spec = p.resolve(ShellExecRequest::new("true").with_workdir("/nonexistent/conch-wd"));
    let proc = p.start(spec.unwrap()).await;
    within("background settles", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Killed);
    assert!(proc.snapshot().text.contains("/nonexistent/conch-wd"), "{:?}", proc.snapshot());
    Ok(())
}

pub async fn workdir_is_used(p: &dyn ShellExecutor) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let cmd = script(p, "pwd -P", "(Get-Location).Path");
    let r = run(p, ShellExecRequest::new(cmd).with_workdir(dir.path())).await;
    assert_eq!(r.output.text.trim_end(), dir.path().canonicalize().unwrap().display().to_string());
    Ok(())
}

pub async fn long_output_keeps_tail_and_complete_spill(p: &dyn ShellExecutor) -> Outcome {
    let cmd = script(
        p,
        "head -c 200000 /dev/zero | tr '\\0' a; echo; echo TAIL",
        "[Console]::Out.Write('a' * 200000); [Console]::Out.Write(\"`nTAIL`n\")",
    );
    let req = ShellExecRequest::new(cmd).with_output_max_bytes(1000);
    let r = run(p, req).await;
    assert_eq!(r.output.total_bytes, 200_006);
    assert!(r.output.text.ends_with("a\nTAIL\n"), "the tail is retained");
    assert_eq!(r.output.omitted_bytes, 200_006 - 1000);
    let spill = r.output.spill.expect("complete spill published").path;
    assert_eq!(std::fs::metadata(&spill).unwrap().len(), 200_006);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&spill).unwrap().permissions().mode() & 0o777, 0o600);
    Ok(())
}

pub async fn background_reads_are_incremental_and_consuming(p: &dyn ShellExecutor) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let cmd = script(
        p,
        &format!("echo first; while [ ! -e {} ]; do sleep 0.01; done; echo second", gate.display()),
        &format!(
            "'first'; while (-not (Test-Path -LiteralPath '{}')) {{ Start-Sleep -Milliseconds 10 }}; 'second'",
            gate.display()
        ),
    );
    let proc = p.start(p.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
    let mut seen = String::new();
    within("first line", async {
        while !seen.contains("first") {
            seen.push_str(&proc.read_output().text);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(seen, "first\n");
    assert_eq!(proc.status(), ShellProcessStatus::Running);
    assert_eq!(proc.read_output().text, "", "a consuming read never re-delivers");
    std::fs::write(&gate, b"").unwrap();
    within("background exit", proc.wait()).await;
    assert_eq!(proc.read_output().text, "second\n");
    assert_eq!(proc.status(), ShellProcessStatus::Completed);
    assert_eq!(proc.exit().and_then(|e| e.code), Some(0));
    assert_eq!(proc.snapshot().text, "first\nsecond\n", "snapshot is non-consuming");
    Ok(())
}

pub async fn background_ignores_timeout(p: &dyn ShellExecutor) -> Outcome {
    let cmd = script(p, "sleep 0.6; echo done", "Start-Sleep -Milliseconds 600; 'done'");
    let spec = p.resolve(ShellExecRequest::new(cmd).with_timeout_ms(50)).unwrap();
    let proc = p.start(spec).await;
    within("background exit", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Completed);
    assert_eq!(proc.read_output().text, "done\n");
    Ok(())
}

pub async fn background_kill_settles_as_killed(p: &dyn ShellExecutor) -> Outcome {
    let cmd = script(p, "sleep 1000", "Start-Sleep 1000");
    let proc = p.start(p.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
    assert!(
        proc.kill().await.expect("the kill is delivered"),
        "kill of a running process is accepted"
    );
    within("killed background exit", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Killed);
    assert!(
        !proc.kill().await.expect("the kill is delivered"),
        "kill after settlement reports false"
    );
    Ok(())
}

/// Skips unless the executor's dialect is bash (the case's script is).
fn bash_only(p: &dyn ShellExecutor) -> Outcome {
    if p.dialect() == Dialect::Bash { Ok(()) } else { skip("the script is bash") }
}

/// Starts `sleep 1000` to outlive the shell, holding the call's output, and prints its pid.
fn outliving_holder(p: &dyn ShellExecutor) -> String {
    script(
        p,
        "sleep 1000 & echo $!",
        "(Start-Process -FilePath sleep -ArgumentList '1000' -PassThru).Id",
    )
}

fn first_pid(out: &str) -> i32 {
    out.split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("the command printed a pid: {out:?}"))
}

async fn await_gone(what: &str, pid: i32) {
    within(what, async {
        while !pid_gone(pid) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// True under a pid-isolated executor, where a case about leftovers checks a different
/// promise: what outlived the shell is gone with the pid namespace (found by a unique
/// marker in its argv, since pids printed inside are the namespace's), not listed. Says so.
fn pid_isolated(p: &dyn ShellExecutor, case: &str) -> bool {
    let isolated = p.capabilities().pid_isolated;
    if isolated {
        // stderr: stdout may carry `conch conformance --json`.
        eprintln!(
            "NOTE {case}: pid-isolated executor: what outlives the shell ends with its pid \
             namespace and is not listed as a leftover; checked by marker instead"
        );
    }
    isolated
}

/// A `sleep` argument no other process has: `1000.<unique digits>`.
fn marker() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("1000.{}{:09}{}", std::process::id(), nanos, N.fetch_add(1, Ordering::Relaxed))
}

/// True while some process on the machine has `marker` as an argument.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
    })
}

/// Waits until no process on the machine has `marker` as an argument.
async fn await_no_process_with(what: &str, marker: &str) {
    within(what, async {
        while process_with(marker) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The isolated form of a leftover case: runs `cmd` (its `sleep 1000` made unique) in the
/// foreground or the background, and proves that nothing it started is left.
async fn isolated_leftovers_gone(p: &dyn ShellExecutor, cmd: &str, background: bool) {
    let m = marker();
    let cmd = cmd.replace("sleep 1000", &format!("sleep {m}")).replace("'1000'", &format!("'{m}'"));
    if background {
        let proc = p.start(p.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
        within("the background shell to settle", proc.wait()).await;
    } else {
        let r = run(p, ShellExecRequest::new(cmd).with_timeout_ms(600_000)).await;
        assert!(!r.aborted, "{r:?}");
    }
    await_no_process_with("what the shell left to be gone", &m).await;
}

pub async fn a_background_child_holding_the_output_does_not_hold_the_call(
    p: &dyn ShellExecutor,
) -> Outcome {
    if pid_isolated(p, "a_background_child_holding_the_output_does_not_hold_the_call") {
        isolated_leftovers_gone(p, &outliving_holder(p), false).await;
        return Ok(());
    }
    // The timeout is far beyond `within`'s patience: returning at all proves the call
    // ended with the shell rather than with the pipe.
    let r = run(p, ShellExecRequest::new(outliving_holder(p)).with_timeout_ms(600_000)).await;
    assert!(!r.timed_out && !r.aborted, "{r:?}");
    assert_eq!(r.status.code, Some(0), "bash's own exit status: {r:?}");
    let pid = first_pid(&r.output.text);
    let left = r.leftovers.iter().find(|l| l.pid as i32 == pid);
    assert!(left.is_some_and(|l| l.held_output), "sleep {pid} is reported: {:?}", r.leftovers);
    await_gone("the leftover sleep to be stopped", pid).await;
    Ok(())
}

pub async fn a_clean_command_reports_no_leftovers(p: &dyn ShellExecutor) -> Outcome {
    let r = run(p, ShellExecRequest::new(script(p, "echo one; echo two", "'one'; 'two'"))).await;
    assert_eq!(r.output.text, "one\ntwo\n");
    assert!(r.leftovers.is_empty(), "{:?}", r.leftovers);
    Ok(())
}

pub async fn the_timeout_holds_despite_an_escaped_pipe_holder(p: &dyn ShellExecutor) -> Outcome {
    let case = "the_timeout_holds_despite_an_escaped_pipe_holder";
    with_setsid(p).await?;
    // An escaped holder: out of the call's group, holding its output.
    let escaped = |arg: &str| {
        script(
            p,
            &format!("setsid sleep {arg} & echo $!; sleep 1000"),
            &format!(
                "(Start-Process -FilePath setsid -ArgumentList 'sleep','{arg}' -PassThru).Id; \
                 Start-Sleep 1000"
            ),
        )
    };
    let ms = after_startup(p, FIRST_LINE_MS);
    if pid_isolated(p, case) {
        // The timeout still holds: the call returns, and the holder goes with the namespace.
        let m = marker();
        let r = run(p, ShellExecRequest::new(escaped(&m)).with_timeout_ms(ms)).await;
        assert!(r.timed_out, "{r:?}");
        await_no_process_with("the escaped holder to be gone", &m).await;
        return Ok(());
    }
    let r = run(p, ShellExecRequest::new(escaped("1000")).with_timeout_ms(ms)).await;
    assert!(r.timed_out, "{r:?}");
    let pid = first_pid(&r.output.text);
    assert!(r.leftovers.iter().any(|l| l.pid as i32 == pid), "{:?}", r.leftovers);
    await_gone("the escaped holder to be stopped", pid).await;
    Ok(())
}

pub async fn a_background_job_ends_with_its_shell(p: &dyn ShellExecutor) -> Outcome {
    if pid_isolated(p, "a_background_job_ends_with_its_shell") {
        isolated_leftovers_gone(p, &outliving_holder(p), true).await;
        return Ok(());
    }
    let proc = p.start(p.resolve(ShellExecRequest::new(outliving_holder(p))).unwrap()).await;
    within("the background shell to settle", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Completed);
    let pid = first_pid(&proc.snapshot().text);
    assert!(proc.leftovers().iter().any(|l| l.pid as i32 == pid), "{:?}", proc.leftovers());
    await_gone("the job's leftover to be stopped", pid).await;
    Ok(())
}

/// Longer than any single argv string Linux accepts (MAX_ARG_STRLEN is 128 KiB with the
/// NUL), the size a model writes a file with in one heredoc.
const LONG: usize = 150_000;

/// `text` followed by a comment that makes the command `LONG` bytes longer without doing
/// anything, so a long command can be compared with its short self.
fn padded(text: &str) -> String {
    format!("{text}\n#{}\n", "x".repeat(LONG))
}

pub async fn a_long_heredoc_writes_its_bytes_exactly(p: &dyn ShellExecutor) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.txt");
    // Multi-byte chars everywhere, so wherever the command is cut some cut falls inside one,
    // and everything a second expansion would change: `$`, quotes, backslashes, backticks.
    let mut body = String::new();
    let mut i = 0;
    while body.len() < LONG {
        body.push_str(&format!(
            "{i}: é€😀 $HOME ${{x}} $(echo no) `no` \"dq\" 'sq' \\ \\\\ \\n \\$ ü\n"
        ));
        i += 1;
    }
    let cmd = if is_pwsh(p) {
        // A verbatim here-string holds every line up to the newline before its `'@`, so the
        // body's last newline is written after it.
        format!(
            "[System.IO.File]::WriteAllText('{}', @'\n{body}'@ + \"`n\")\n\
             -join ('a$b', 'c$d', 'e\\f', 'g\"h', 'é€😀' | ForEach-Object {{ \"$_|\" }})",
            file.display()
        )
    } else {
        format!(
            "cat > '{}' <<'EOF'\n{body}EOF\nprintf '%s|' 'a$b' \"c\\$d\" 'e\\f' \"g\\\"h\" \"é€😀\"; echo",
            file.display()
        )
    };
    let r = run(p, ShellExecRequest::new(cmd)).await;
    assert_eq!(r.status.code, Some(0), "{}", r.output.text);
    assert_eq!(r.output.text, "a$b|c$d|e\\f|g\"h|é€😀|\n", "quoting is parsed once");
    let written = std::fs::read(&file).unwrap();
    assert!(written == body.as_bytes(), "the heredoc's bytes are written exactly");
    Ok(())
}

pub async fn a_long_command_runs_as_its_short_self(p: &dyn ShellExecutor) -> Outcome {
    if is_pwsh(p) {
        // What a pwsh command could see of how it came: arguments, and the variables a long
        // one travels in, which must be gone before it runs (from pwsh and its children).
        let probe = "\"args=$($args.Count) vars=$(@(Get-ChildItem env: | Where-Object Name -like \
                     '__CONCH_*').Count)\"; sh -c 'env | grep -c __CONCH_PWSH || true'";
        let short = run(p, ShellExecRequest::new(probe)).await;
        assert_eq!(short.output.text, "args=0 vars=0\n0\n", "{short:?}");
        let long = run(p, ShellExecRequest::new(padded(probe))).await;
        assert_eq!(long.status.code, Some(0), "{long:?}");
        assert_eq!(long.output.text, short.output.text, "no helper variable left");
        return Ok(());
    }
    // What a `bash -c` command can see of how it was started: its name and arguments, `$_`,
    // stdin, the line numbers, IFS and every variable name.
    let probe = "echo \"$0 $# [$_] $LINENO\"; read -r x; echo \"read=$? [$x]\"; \
                 printf '%q\\n' \"$IFS\"; compgen -v | tr '\\n' ' '";
    let short = run(p, ShellExecRequest::new(probe)).await;
    assert!(short.output.text.starts_with("bash 0 ["), "{}", short.output.text);
    assert!(short.output.text.contains("\nread=1 []\n"), "stdin is /dev/null: {short:?}");
    let long = run(p, ShellExecRequest::new(padded(probe))).await;
    assert_eq!(long.status.code, Some(0));
    assert_eq!(long.output.text, short.output.text, "no helper variable, same $0 $# $_ stdin");
    let mut req = ShellExecRequest::new(padded("read -r x; echo \"read=$? [$x]\""));
    req.stdin = Some(b"given\n".to_vec());
    let r = run(p, req).await;
    assert_eq!(r.output.text, "read=0 [given]\n", "stdin bytes reach a long command");
    let cmd = padded("echo ${#BASH_EXECUTION_STRING}");
    let r = run(p, ShellExecRequest::new(cmd.clone())).await;
    assert_eq!(r.output.text, format!("{}\n", cmd.len()), "the execution string is the command");
    Ok(())
}

pub async fn a_long_command_exits_with_its_code(p: &dyn ShellExecutor) -> Outcome {
    // The padding is a comment in both dialects.
    let cmd = padded(&script(p, "echo partial", "'partial'"))
        + &script(p, "exit 7\necho never\n", "exit 7\n'never'\n");
    let r = run(p, ShellExecRequest::new(cmd)).await;
    assert_eq!(r.status.code, Some(7), "{}", r.output.text);
    assert_eq!(r.output.text, "partial\n");
    // The last status is the shell's: bash's subshell, or pwsh's last native command.
    let r = run(p, ShellExecRequest::new(padded(&script(p, "(exit 3)", "sh -c 'exit 3'")))).await;
    assert_eq!(r.status.code, Some(3), "the last status is the shell's: {}", r.output.text);
    Ok(())
}

/// Skips when the setsid utility is missing.
async fn with_setsid(p: &dyn ShellExecutor) -> Outcome {
    let check = script(
        p,
        "command -v setsid",
        "if (-not (Get-Command setsid -CommandType Application -ErrorAction Ignore)) { exit 1 }",
    );
    let found = run(p, ShellExecRequest::new(check)).await.status.code == Some(0);
    if found { Ok(()) } else { skip("needs the setsid utility") }
}

/// Skips when the command is not bash or the setsid utility is missing.
async fn bash_with_setsid(p: &dyn ShellExecutor) -> Outcome {
    bash_only(p)?;
    with_setsid(p).await
}

/// Neither in the call's group nor holding its output: only ancestry ties it to the call.
/// (pwsh's Start-Process refuses one file for both streams, hence `/dev/zero` for stderr.)
fn detached(p: &dyn ShellExecutor) -> String {
    script(
        p,
        "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
        "(Start-Process -FilePath setsid -ArgumentList 'sleep','1000' -RedirectStandardInput \
         /dev/null -RedirectStandardOutput /dev/null -RedirectStandardError /dev/zero -PassThru).Id",
    )
}

pub async fn a_detached_process_is_stopped_with_the_call(p: &dyn ShellExecutor) -> Outcome {
    with_setsid(p).await?;
    if pid_isolated(p, "a_detached_process_is_stopped_with_the_call") {
        isolated_leftovers_gone(p, &detached(p), false).await;
        return Ok(());
    }
    let r = run(p, ShellExecRequest::new(detached(p))).await;
    assert_eq!(r.status.code, Some(0), "{r:?}");
    let pid = first_pid(&r.output.text);
    let left = r.leftovers.iter().find(|l| l.pid as i32 == pid);
    let left = left.unwrap_or_else(|| panic!("the detached {pid} is reported: {:?}", r.leftovers));
    assert!(!left.held_output, "its output went to /dev/null: {left:?}");
    await_gone("the detached process to be stopped", pid).await;
    Ok(())
}

pub async fn a_background_jobs_detached_child_is_stopped_when_it_settles(
    p: &dyn ShellExecutor,
) -> Outcome {
    let case = "a_background_jobs_detached_child_is_stopped_when_it_settles";
    with_setsid(p).await?;
    if pid_isolated(p, case) {
        isolated_leftovers_gone(p, &detached(p), true).await;
        return Ok(());
    }
    let proc = p.start(p.resolve(ShellExecRequest::new(detached(p))).unwrap()).await;
    within("the background shell to settle", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Completed);
    let pid = first_pid(&proc.snapshot().text);
    assert!(proc.leftovers().iter().any(|l| l.pid as i32 == pid), "{:?}", proc.leftovers());
    await_gone("the job's detached child to be stopped", pid).await;
    Ok(())
}

pub async fn a_background_jobs_detached_child_is_stopped_when_it_is_killed(
    p: &dyn ShellExecutor,
) -> Outcome {
    let case = "a_background_jobs_detached_child_is_stopped_when_it_is_killed";
    bash_with_setsid(p).await?;
    if pid_isolated(p, case) {
        let m = marker();
        let cmd = format!("setsid sleep {m} >/dev/null 2>&1 </dev/null & exec sleep 1000");
        let proc = p.start(p.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
        within("the detached child to start", async {
            while !process_with(&m) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(proc.kill().await.expect("the kill is delivered"), "the job is still running");
        within("the killed job to settle", proc.wait()).await;
        assert_eq!(proc.status(), ShellProcessStatus::Killed);
        await_no_process_with("the killed job's detached child to be gone", &m).await;
        return Ok(());
    }
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let cmd = format!("{} exec sleep 1000", crate::detach("setsid", &pidfile));
    let proc = p.start(p.resolve(ShellExecRequest::new(cmd)).unwrap()).await;
    let (pid, start) = crate::pid_in(&pidfile).await;
    assert!(proc.kill().await.expect("the kill is delivered"), "the job is still running");
    within("the killed job to settle", proc.wait()).await;
    assert_eq!(proc.status(), ShellProcessStatus::Killed);
    crate::await_gone("the killed job's detached child to be stopped", pid, start).await;
    Ok(())
}
