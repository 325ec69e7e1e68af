//! Terminal backend cases. The factory must build a backend whose idle window
//! (`idle_silence_ms`) is at most a few seconds and whose send deadline is at least 20 s,
//! so readiness tiers can be told apart without slowing the suite down.
//!
//! Each case types its commands in the backend's dialect: bash, or the PowerShell 7 text
//! that means the same (`script`).

use std::sync::Arc;

use conch_seams::{
    Dialect, ErrorCode, ExitStatus, SendOutcome, SendRequest, SendSettle, SessionStatus, Signal,
    TerminalBackend, TerminalOpenSpec, TerminalSession, WaitReason,
};
use tokio_util::sync::CancellationToken;

pub use crate::workload_send::*;
use crate::{Outcome, skip, within};

pub use crate::workload_screen::*;
pub use crate::workload_shell::*;

/// True when the backend's sessions run PowerShell.
fn is_pwsh(p: &dyn TerminalBackend) -> bool {
    p.dialect() == Dialect::Pwsh
}

/// The text to type for `p`'s dialect: `bash`, or `pwsh` for PowerShell 7.
fn script(p: &dyn TerminalBackend, bash: &str, pwsh: &str) -> String {
    if is_pwsh(p) { pwsh.to_string() } else { bash.to_string() }
}

/// A PowerShell single-quoted literal of `text`.
fn pwsh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

async fn open(p: &dyn TerminalBackend) -> Arc<dyn TerminalSession> {
    within("terminal open", p.open(TerminalOpenSpec::default())).await.expect("open a session")
}

/// Opens a session whose environment carries [`crate::MARK_VAR`]`=token`, which every
/// process it starts inherits.
async fn open_marked(p: &dyn TerminalBackend, token: &str) -> Arc<dyn TerminalSession> {
    let mut spec = TerminalOpenSpec::default();
    spec.managed_env.insert(crate::MARK_VAR.into(), token.into());
    within("terminal open", p.open(spec)).await.expect("open a session")
}

async fn send(s: &dyn TerminalSession, text: &str) -> SendSettle {
    match within(text, s.send(SendRequest::line(text), CancellationToken::new()))
        .await
        .unwrap_or_else(|e| panic!("send {text:?}: {e}"))
    {
        SendOutcome::Ready(settle) => settle,
        SendOutcome::Interrupted(i) => panic!("send {text:?} was interrupted: {i:?}"),
    }
}

async fn close(s: &dyn TerminalSession) {
    let report = within("terminal close", s.close()).await.expect("close");
    assert!(report.survivors.is_empty(), "{report:?}");
}

pub async fn echo_returns_at_the_prompt_as_stdin_read(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    assert_eq!(s.status(), SessionStatus::Running);
    let r = send(s.as_ref(), &script(p, "echo conch-$((40+2))", "\"conch-$(40+2)\"")).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(r.delta.contains("conch-42"), "{r:?}");
    assert_eq!(r.session_status, SessionStatus::Running);
    close(s.as_ref()).await;
    Ok(())
}

pub async fn prompt_marker_never_reaches_output(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let cmds = if is_pwsh(p) {
        // pwsh's prompt is a function the backend owns (see the pwsh dialect); output that
        // leaves the cursor mid-line is the case a prompt must cope with there.
        ["$true", "'a'; 'b'", "Write-Host -NoNewline 'no newline'", "'after'"]
    } else {
        ["true", "echo a; echo b", "PS1='custom> '", "echo after"]
    };
    for cmd in cmds {
        let r = send(s.as_ref(), cmd).await;
        assert_eq!(r.wait_reason, WaitReason::StdinRead, "{cmd}: {r:?}");
        assert!(!r.delta.contains('\u{1b}') && !r.delta.contains('\u{7}'), "{cmd}: {r:?}");
    }
    let page = s.read(0, 100);
    assert!(!page.text.contains('\u{1b}'), "{page:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn state_persists_across_sends(p: &dyn TerminalBackend) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let s = open(p).await;
    let cd = format!("cd '{}'", dir.path().display());
    send(
        s.as_ref(),
        &script(p, &cd, &format!("Set-Location {}", pwsh_quote(&dir.path().display().to_string()))),
    )
    .await;
    let set = script(
        p,
        "export CONCH_CONFORMANCE_VAR=persisted",
        "$env:CONCH_CONFORMANCE_VAR = 'persisted'",
    );
    send(s.as_ref(), &set).await;
    let show = script(
        p,
        "pwd; echo $CONCH_CONFORMANCE_VAR",
        "(Get-Location).Path; $env:CONCH_CONFORMANCE_VAR",
    );
    let r = send(s.as_ref(), &show).await;
    let real = std::fs::canonicalize(dir.path()).unwrap();
    assert!(r.delta.contains(&*real.to_string_lossy()), "{r:?}");
    assert!(r.delta.contains("persisted"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn open_honours_cwd_and_rejects_a_missing_one(p: &dyn TerminalBackend) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TerminalOpenSpec::default();
    spec.cwd = Some(dir.path().to_path_buf());
    let s = within("open in cwd", p.open(spec)).await.unwrap();
    let r = send(s.as_ref(), &script(p, "pwd", "(Get-Location).Path")).await;
    let real = std::fs::canonicalize(dir.path()).unwrap();
    assert!(r.delta.contains(&*real.to_string_lossy()), "{r:?}");
    close(s.as_ref()).await;

    let mut spec = TerminalOpenSpec::default();
    spec.cwd = Some(dir.path().join("missing"));
    let e = within("open in a missing cwd", p.open(spec)).await.unwrap_err();
    assert!(
        matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::SpawnFailed),
        "a missing cwd is refused, never replaced by $HOME: {e}"
    );
    Ok(())
}

pub async fn a_program_reading_stdin_is_stdin_read(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    // The native reader is python3; a world without it (a minimal image) cannot show one.
    let probe = script(
        p,
        "command -v python3 || echo no-such-program",
        "(Get-Command python3 -ErrorAction SilentlyContinue).Source; 'no-such-program'",
    );
    if !send(s.as_ref(), &probe).await.delta.lines().any(|l| l.trim_start().starts_with('/')) {
        close(s.as_ref()).await;
        return skip("python3 is not on the session's PATH");
    }
    // A native program reading the terminal (in pwsh too), then the shell's own reader.
    let python = script(p, "python3 -c 'print(\"ready\"); input()'", "python3 -c \"input()\"");
    let r = send(s.as_ref(), &python).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(!r.at_prompt, "a program's input wait is not the shell's prompt: {r:?}");
    let r = send(s.as_ref(), "an answer").await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "the prompt came back: {r:?}");
    assert!(r.at_prompt, "the shell's prompt ended it: {r:?}");
    let r = send(s.as_ref(), &script(p, "read -p 'name? ' n", "$n = Read-Host 'name?'")).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    // Read-Host puts `: ` after its prompt.
    assert!(r.delta.contains(&script(p, "name? ", "name?: ")), "{r:?}");
    send(s.as_ref(), "conch").await;
    let r = send(s.as_ref(), &script(p, "echo \"got $n\"", "\"got $n\"")).await;
    assert!(r.delta.contains("got conch"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// The shell's own silent read (no prompt text, nothing after the echoed line) is a stdin
/// wait too: the first sample of a line the shell runs is put off until more output comes, and
/// none comes here.
pub async fn a_silent_read_by_the_shell_itself_is_stdin_read(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    for i in 0..3 {
        let r = send(s.as_ref(), &script(p, "read v", "$v = Read-Host")).await;
        assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
        assert!(!r.at_prompt, "a read, not the prompt: {r:?}");
        send(s.as_ref(), &format!("answer-{i}")).await;
        let r = send(s.as_ref(), &script(p, "echo \"got $v\"", "\"got $v\"")).await;
        assert!(r.delta.contains(&format!("got answer-{i}")), "{r:?}");
    }
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_quick_send_never_returns_before_the_shell_read_it(
    p: &dyn TerminalBackend,
) -> Outcome {
    // Sends return within milliseconds; each must still carry its own command's output, not
    // an early "stdin_read" seen while the shell had not yet picked the line up.
    for round in 0..3 {
        let s = open(p).await;
        for i in 0..20 {
            let cmd =
                script(p, &format!("echo r{round}-$(({i}+1))"), &format!("\"r{round}-$({i}+1)\""));
            let r = send(s.as_ref(), &cmd).await;
            assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
            assert!(r.delta.contains(&format!("r{round}-{}\n", i + 1)), "send {i}: {r:?}");
        }
        close(s.as_ref()).await;
    }
    Ok(())
}

pub async fn output_written_before_a_blocking_read_is_all_in_the_result(
    p: &dyn TerminalBackend,
) -> Outcome {
    let s = open(p).await;
    // The program blocks right after a burst of output: readiness must not beat the output.
    for _ in 0..5 {
        let cmd = script(p, "seq 1 20000; read -p 'last? ' x", "1..20000; $x = Read-Host 'last?'");
        let r = send(s.as_ref(), &cmd).await;
        assert_eq!(r.wait_reason, WaitReason::StdinRead, "{:?}", r.wait_reason);
        assert!(
            r.delta.ends_with(&script(p, "19999\n20000\nlast? ", "19999\n20000\nlast?: ")),
            "{:?}",
            &r.delta[r.delta.len().saturating_sub(40)..]
        );
        send(s.as_ref(), "y").await;
    }
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_program_reading_dev_tty_is_stdin_read(p: &dyn TerminalBackend) -> Outcome {
    // Stdin is /dev/null; the program asks the terminal itself, as less, ssh and sudo do.
    let s = open(p).await;
    let cmd = script(
        p,
        "bash -c 'exec 3</dev/tty; read -r -u 3 x; echo \"tty said $x\"' </dev/null",
        // pwsh has no `<`; bash points its own stdin at /dev/null.
        "bash -c 'exec 0</dev/null 3</dev/tty; read -r -u 3 x; echo tty said $x'",
    );
    let r = send(s.as_ref(), &cmd).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "a read of /dev/tty is a stdin wait: {r:?}");
    let r = send(s.as_ref(), "hello").await;
    assert!(r.delta.contains("tty said hello"), "{r:?}");
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_silent_program_is_inferred_idle_not_stdin_read(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let r = send(s.as_ref(), &script(p, "sleep 1000", "Start-Sleep 1000")).await;
    assert_eq!(r.wait_reason, WaitReason::InferredIdle, "sleep never reads stdin: {r:?}");
    let d = s.signal(Signal::Int).await.expect("SIGINT the foreground group");
    // pwsh runs commands in its own group, so there the shell's group gets it (and pwsh
    // stops the command).
    assert!(d.pgid > 0 && d.leader == is_pwsh(p), "sleep's group, not the shell's: {d:?}");
    let r = send(s.as_ref(), &script(p, "echo usable", "'usable'")).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(r.delta.contains("usable"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_cancelled_send_interrupts_the_foreground(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    // Whether the cancel lands before or after sleep starts, sleep must not keep running.
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let sleep = script(p, "sleep 1000", "Start-Sleep 1000");
    let out =
        within("cancelled send", s.send(SendRequest::line(sleep.as_str()), cancel)).await.unwrap();
    assert!(
        matches!(&out, SendOutcome::Interrupted(i) if i.typed),
        "the partial outcome is a value: {out:?}"
    );
    let r = send(s.as_ref(), &script(p, "echo back", "'back'")).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(r.delta.contains("back"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// Sends `text` in the background, waits until its command printed `marker` once more (the
/// command runs), cancels the send and returns how it ended.
async fn cancel_once_running(
    s: &Arc<dyn TerminalSession>,
    text: &str,
    marker: &str,
) -> SendOutcome {
    let seen = s.read(0, 10_000).text.matches(marker).count();
    let cancel = CancellationToken::new();
    let running = {
        let (s, text, cancel) = (Arc::clone(s), text.to_string(), cancel.clone());
        tokio::spawn(async move { s.send(SendRequest::line(text.as_str()), cancel).await })
    };
    within(&format!("the command to print {marker:?}"), async {
        while s.read(0, 10_000).text.matches(marker).count() == seen {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    cancel.cancel();
    within("the interrupted send", running).await.unwrap().unwrap()
}

/// A SIGINT can be lost when it lands while a command is starting: between bash's fork and
/// the child's exec the child still has the shell's SIGINT handler, which only sets a flag.
/// A command that ignores SIGINT while it starts, then runs with the default, stands in for
/// that window: the cancelled send must still stop it (the foreground command gets another
/// SIGINT), and the next send must run at the prompt rather than be typed into it.
pub async fn a_sigint_lost_while_the_command_started_is_sent_again(
    p: &dyn TerminalBackend,
) -> Outcome {
    if is_pwsh(p) {
        return skip("the stand-in for bash's fork-to-exec window is a bash script");
    }
    let s = open(p).await;
    let out = cancel_once_running(
        &s,
        "bash -c 'trap \"\" INT; echo ig''noring; sleep 0.2; trap - INT; exec sleep 1000'",
        "\nignoring",
    )
    .await;
    assert!(matches!(out, SendOutcome::Interrupted(_)), "{out:?}");
    let r = send(s.as_ref(), "echo $((6*7))").await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "the command still runs: {r:?}");
    assert!(r.delta.contains("42\n"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// A command that ignores SIGINT outlives a cancelled send, and the outcome says so rather
/// than report it stopped; a command that dies of SIGINT is reported stopped.
pub async fn an_interrupt_says_whether_the_command_still_runs(p: &dyn TerminalBackend) -> Outcome {
    if is_pwsh(p) {
        return skip("the command is a bash script");
    }
    let s = open(p).await;
    for (script, survives) in [
        ("bash -c 'trap \"\" INT; echo st''arted; exec sleep 1000'", true),
        ("bash -c 'echo st''arted; exec sleep 1000'", false),
    ] {
        let out = cancel_once_running(&s, script, "\nstarted").await;
        let SendOutcome::Interrupted(i) = out else { panic!("{out:?}") };
        assert!(i.typed, "{i:?}");
        assert_eq!(i.still_running, survives, "{script}: {i:?}");
        if survives {
            // Stop it, as the outcome tells the caller to, before the next script.
            s.signal(Signal::Kill).await.expect("SIGKILL the command in the foreground");
            let r = send(s.as_ref(), "echo $((6*7))").await;
            assert!(r.delta.contains("42\n"), "the shell is back: {r:?}");
        }
    }
    close(s.as_ref()).await;
    Ok(())
}

pub async fn an_interrupted_command_leaves_no_sigint_for_the_shell(
    p: &dyn TerminalBackend,
) -> Outcome {
    if is_pwsh(p) {
        // The hazard is readline's: a SIGINT kept pending eats the next line. pwsh ignores a
        // SIGINT at its prompt (the pwsh-specific cases interrupt it there).
        return skip("bash's readline hazard (pwsh ignores SIGINT at its prompt)");
    }
    let s = open(p).await;
    // The shell reports any SIGINT that reaches it, and renders its prompt slowly, so it owns
    // the foreground for a while after the command died and before its prompt is back.
    send(s.as_ref(), "trap 'echo SHELL_GOT_$((1))INT' INT").await;
    send(s.as_ref(), "PROMPT_COMMAND=\"for ((i=0;i<100000;i++)); do :; done; $PROMPT_COMMAND\"")
        .await;
    // The command prints the marker itself, so the cancel comes once it runs. (A builtin's
    // marker, as in `echo started; sleep 1000`, can come while the shell has not started
    // `sleep` yet: a cancel then interrupts the shell itself, as Ctrl-C would, and that is
    // right, since the shell is what runs.)
    let out =
        cancel_once_running(&s, "bash -c 'echo st''arted; exec sleep 1000'", "\nstarted").await;
    assert!(matches!(out, SendOutcome::Interrupted(_)), "{out:?}");
    let r = send(s.as_ref(), "echo $((6*7))").await;
    assert!(r.delta.contains("42\n"), "the next line arrives whole: {r:?}");
    let all = s.read(0, 1000).text;
    assert!(!all.contains("SHELL_GOT_1INT"), "only the command was interrupted: {all}");
    close(s.as_ref()).await;
    Ok(())
}

/// A foreground that computes without printing (a program starting up on a loaded machine,
/// the shell itself in a loop) is busy, not idle: the send waits for what it does next.
/// Each computes for 2 to 3 s, longer than the bash factories' idle window.
pub async fn a_busy_silent_foreground_is_not_idle(p: &dyn TerminalBackend) -> Outcome {
    if is_pwsh(p) {
        return skip("the busy loops are bash");
    }
    let s = open(p).await;
    let r = send(
        s.as_ref(),
        "bash -c 'end=$((SECONDS+3)); while ((SECONDS<end)); do :; done; read -p \"done? \" x'",
    )
    .await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "a program computing is busy: {r:?}");
    assert!(r.delta.ends_with("done? "), "{r:?}");
    send(s.as_ref(), "y").await;
    let r = send(s.as_ref(), "end=$((SECONDS+3)); while ((SECONDS<end)); do :; done; echo sp''un")
        .await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "the shell computing is busy: {r:?}");
    assert!(r.delta.contains("spun\n"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// Text typed while the shell is still busy with earlier text (here the aftermath of an
/// interrupted command, 1 to 2 s of prompt work: longer than the bash factories' close
/// grace, so the cancelled send returns before the prompt) gets its own prompt, never the
/// earlier text's.
pub async fn a_send_typed_while_the_shell_is_busy_gets_its_own_prompt(
    p: &dyn TerminalBackend,
) -> Outcome {
    if is_pwsh(p) {
        return skip("the slow prompt is bash's PROMPT_COMMAND");
    }
    let s = open(p).await;
    // Slow only after a command that SIGINT killed (status 130).
    send(
        s.as_ref(),
        "PROMPT_COMMAND=\"if ((\\$? == 130)); then s=\\$SECONDS; while ((SECONDS-s<2)); do :; \
         done; fi; $PROMPT_COMMAND\"",
    )
    .await;
    let out =
        cancel_once_running(&s, "bash -c 'echo st''arted; exec sleep 1000'", "\nstarted").await;
    assert!(matches!(out, SendOutcome::Interrupted(_)), "{out:?}");
    // The output comes a moment after the line runs, so it cannot arrive together with the
    // earlier prompt and hide a send that returned at that prompt.
    let r = send(s.as_ref(), "sleep 0.3; echo $((6*7))").await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(r.delta.contains("42\n"), "its own prompt, not the interrupted command's: {r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// A shell started from the session with PROMPT_COMMAND but without the helpers' text (a
/// wrapper that passes on only some variables) still puts the prompt marker back into a PS1
/// that something changed. (Its prompts are a program's input waits, not the session shell's
/// prompt, either way.)
pub async fn a_nested_shell_without_the_helpers_text_gets_its_ps1_put_back(
    p: &dyn TerminalBackend,
) -> Outcome {
    if is_pwsh(p) {
        return skip("the prompt hook is bash's PROMPT_COMMAND");
    }
    let s = open(p).await;
    let r = send(s.as_ref(), "env -u __conch_boot bash --norc --noprofile").await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "the nested shell's prompt: {r:?}");
    let r = send(s.as_ref(), "PS1='nested> '; echo changed").await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    // The prompt after the change is the marked one again, not `nested> `.
    assert!(r.delta.contains("changed\n") && !r.delta.ends_with("nested> "), "{r:?}");
    let r = send(s.as_ref(), "exit").await;
    assert!(r.at_prompt, "the session's own shell again: {r:?}");
    let r = send(s.as_ref(), "echo outer").await;
    assert!(r.at_prompt && r.delta.contains("outer"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn close_works_while_the_shell_runs_a_loop(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let r = send(
        s.as_ref(),
        &script(p, "while true; do sleep 1; done", "while ($true) { Start-Sleep 1 }"),
    )
    .await;
    assert_eq!(r.wait_reason, WaitReason::InferredIdle, "{r:?}");
    close(s.as_ref()).await;
    assert!(matches!(s.status(), SessionStatus::Exited(_)), "{:?}", s.status());
    Ok(())
}

pub async fn exit_is_session_exit_with_the_code(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let r = send(s.as_ref(), "exit 7").await;
    assert_eq!(r.wait_reason, WaitReason::SessionExit, "{r:?}");
    assert_eq!(r.session_status, SessionStatus::Exited(ExitStatus::code(7)));
    let report = within("close after exit", s.close()).await.unwrap();
    assert_eq!(report.root_exit, SessionStatus::Exited(ExitStatus::code(7)));
    Ok(())
}

pub async fn sigkill_at_the_shell_is_rejected(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let e = s.signal(Signal::Kill).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert_eq!(
        send(s.as_ref(), &script(p, "echo alive", "'alive'")).await.wait_reason,
        WaitReason::StdinRead
    );
    close(s.as_ref()).await;
    Ok(())
}

pub async fn close_leaves_no_descendant_even_one_ignoring_term(p: &dyn TerminalBackend) -> Outcome {
    let token = crate::mark_token();
    let s = open_marked(p, &token).await;
    // The shell and what it started, found by the mark they inherited (from outside any pid
    // namespace the session's processes live in).
    let before = if is_pwsh(p) {
        send(s.as_ref(), "$p = Start-Process -FilePath sleep -ArgumentList '1000' -PassThru").await;
        crate::await_marked(&token, |m| {
            m.iter().any(|x| x.comm == "sleep") && m.iter().any(|x| x.comm == "pwsh")
        })
        .await
    } else {
        send(s.as_ref(), "sleep 1000 & echo BG=$!").await;
        send(s.as_ref(), "bash -c 'trap \"\" TERM; sleep 1000 & wait' & echo STUBBORN=$!").await;
        crate::await_marked(&token, |m| {
            m.iter().filter(|x| x.comm == "sleep").count() >= 2
                && m.iter().any(|x| x.comm == "bash")
        })
        .await
    };
    close(s.as_ref()).await;
    for m in &before {
        assert!(crate::gone(m.pid, m.start), "{} ({}) survived close", m.pid, m.comm);
    }
    assert!(matches!(s.status(), SessionStatus::Exited(_)), "{:?}", s.status());
    Ok(())
}

pub async fn scrollback_pages_backward(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let rows = script(
        p,
        "for i in $(seq 1 60); do echo row$i; done",
        "1..60 | ForEach-Object { \"row$_\" }",
    );
    send(s.as_ref(), &rows).await;
    let newest = s.read(0, 10);
    assert_eq!(newest.line_end, newest.total_lines, "{newest:?}");
    assert!(newest.total_lines >= 60, "{newest:?}");
    assert_eq!(newest.line_end - newest.line_begin, 10, "{newest:?}");
    let older = s.read(10, 10);
    assert_eq!(older.line_end, newest.line_begin, "{older:?}");
    assert!(older.text.contains("row5"), "{older:?}");
    let all = s.read(0, 10_000);
    assert!(all.text.contains("row1\n") && all.text.contains("row60"), "{all:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn utf8_output_arrives_intact(p: &dyn TerminalBackend) -> Outcome {
    let s = open(p).await;
    let cmd = script(
        p,
        "printf 'h\\303\\251llo w\\303\\266rld \\342\\234\\223\\n'",
        "\"h$([char]0xe9)llo w$([char]0xf6)rld $([char]0x2713)\"",
    );
    let r = send(s.as_ref(), &cmd).await;
    assert!(r.delta.contains("héllo wörld ✓\n"), "{r:?}");
    assert!(!r.delta.contains('\r'), "CRLF became one newline: {r:?}");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_cancelled_open_is_rolled_back(p: &dyn TerminalBackend) -> Outcome {
    let mut spec = TerminalOpenSpec::default();
    spec.cancel = CancellationToken::new();
    spec.cancel.cancel();
    let e = within("cancelled open", p.open(spec)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Cancelled, "{e}");
    Ok(())
}

pub async fn close_stops_processes_that_detached_with_setsid_and_nohup(
    p: &dyn TerminalBackend,
) -> Outcome {
    let token = crate::mark_token();
    let s = open_marked(p, &token).await;
    let check = script(
        p,
        "command -v setsid >/dev/null || echo NO-SETSID",
        "if (-not (Get-Command setsid -CommandType Application -ErrorAction Ignore)) { 'NO-SETSID' }",
    );
    let r = send(s.as_ref(), &check).await;
    if r.delta.contains("\nNO-SETSID") {
        close(s.as_ref()).await;
        return skip("needs the setsid utility");
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("setsid"), dir.path().join("nohup"));
    // The subshells exit at once: neither process is the shell's descendant any more (under
    // pwsh, a bash runs the same subshell).
    for (how, pidfile) in [("setsid", &a), ("nohup", &b)] {
        let sub = format!("({})", crate::detach(how, pidfile));
        let cmd = script(p, &sub, &format!("bash -c {}", pwsh_quote(&sub)));
        send(s.as_ref(), &cmd).await;
    }
    // Found by the mark they inherited, so pids inside a pid namespace do not matter.
    let detached =
        crate::await_marked(&token, |m| m.iter().filter(|x| x.comm == "sleep").count() >= 2).await;
    close(s.as_ref()).await;
    for m in detached.iter().filter(|m| m.comm == "sleep") {
        assert!(crate::gone(m.pid, m.start), "the detached {} survived close", m.pid);
    }
    Ok(())
}
