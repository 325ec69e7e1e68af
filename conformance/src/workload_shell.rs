//! Model-workload cases for the persistent shell's framed commands (`run_command`) and the
//! shell's startup (issue 23): what a model actually types into a shell it keeps. Each case
//! checks that the shell's state (cwd, exports, functions) survives what used to reset it.
//! bash only: the pwsh dialect has its own framing (these cases skip there).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conch_seams::{
    CommandEnd, CommandOutcome, Dialect, ExitStatus, SendRequest, SessionStatus, StopCause,
    TerminalBackend, TerminalOpenSpec, TerminalSession, WaitReason,
};
use tokio_util::sync::CancellationToken;

use crate::{Outcome, skip, terminal_tail, within};

/// Deadline of a framed command that should end by itself.
const LONG: Duration = Duration::from_secs(20);

fn bash_only(p: &dyn TerminalBackend) -> Outcome {
    if p.dialect() != Dialect::Bash {
        return skip("the workload cases type bash");
    }
    Ok(())
}

async fn open_with(p: &dyn TerminalBackend, env: &[(&str, &str)]) -> Arc<dyn TerminalSession> {
    let mut spec = TerminalOpenSpec::default();
    for (k, v) in env {
        spec.managed_env.insert((*k).into(), (*v).into());
    }
    within("terminal open", p.open(spec)).await.expect("open a session")
}

async fn run(s: &dyn TerminalSession, command: &str, timeout: Duration) -> CommandOutcome {
    within(command, s.run_command(command, timeout, CancellationToken::new()))
        .await
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"))
}

/// Runs `command`, which must end by itself with `code`; returns its output.
async fn ran(s: &dyn TerminalSession, command: &str, code: i32) -> String {
    let o = run(s, command, LONG).await;
    assert_eq!(o.end, CommandEnd::Exited(code), "{command}: {o:?}");
    o.output
}

/// Sets a cwd, an export and a function, for [`assert_state`].
async fn set_state(s: &dyn TerminalSession, dir: &std::path::Path) {
    let cmd =
        format!("cd '{}' && export WL_VAR=kept && wl_fn() {{ echo fn-kept; }}", dir.display());
    ran(s, &cmd, 0).await;
}

/// A bash session whose cwd (a fresh directory, returned with it), an export and a function
/// are set, for the cases that prove the state survives.
async fn stateful(p: &dyn TerminalBackend) -> (tempfile::TempDir, Arc<dyn TerminalSession>) {
    let dir = tempfile::tempdir().unwrap();
    let s = open_with(p, &[]).await;
    set_state(s.as_ref(), dir.path()).await;
    (dir, s)
}

async fn assert_state(s: &dyn TerminalSession, dir: &std::path::Path, after: &str) {
    let out = ran(s, "pwd -P; echo $WL_VAR; wl_fn", 0).await;
    let real = std::fs::canonicalize(dir).unwrap();
    assert_eq!(out, format!("{}\nkept\nfn-kept\n", real.display()), "state after {after}");
}

async fn close(s: &dyn TerminalSession) {
    let report = within("terminal close", s.close()).await.expect("close");
    assert!(report.survivors.is_empty(), "{report:?}");
}

pub async fn framed_stdin_readers_get_end_of_file_and_keep_the_shell(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let (dir, s) = stateful(p).await;
    // Each returns at once with what end of file means to it, as in the one-shot tool.
    for (cmd, code, out) in [
        ("cat; echo cat=$?", 0, "cat=0\n"),
        ("read line; echo read=$? \"[$line]\"", 0, "read=1 []\n"),
        ("read -t 2 x; echo read-t=$?", 0, "read-t=1\n"),
        ("head -c 5; echo head=$?", 0, "head=0\n"),
    ] {
        let started = Instant::now();
        assert_eq!(ran(s.as_ref(), cmd, code).await, out, "{cmd}");
        assert!(started.elapsed() < Duration::from_secs(10), "{cmd} waited for input");
        assert_state(s.as_ref(), dir.path(), cmd).await;
    }
    // An interpreter reading its input sees end of file (python3 where the world has it).
    let o = run(s.as_ref(), "command -v python3 >/dev/null && python3 -c 'input()'", LONG).await;
    assert_eq!(o.end, CommandEnd::Exited(1), "{o:?}");
    assert_state(s.as_ref(), dir.path(), "python3 -c 'input()'").await;
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_framed_timeout_stops_the_command_and_keeps_the_shell(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let (dir, s) = stateful(p).await;
    let o = run(s.as_ref(), "echo part; sleep 100", Duration::from_millis(800)).await;
    let screen = terminal_tail(s.as_ref());
    assert_eq!(o.end, CommandEnd::Stopped(StopCause::Timeout), "{o:?}\n{screen}");
    assert_eq!((o.output.as_str(), o.omitted_bytes), ("part\n", 0), "{o:?}\n{screen}");
    assert_state(s.as_ref(), dir.path(), "a timeout").await;
    // A builtin loop runs in the shell's own group: the interrupt reaches the shell.
    let o = run(s.as_ref(), "while :; do :; done", Duration::from_millis(800)).await;
    assert_eq!(
        o.end,
        CommandEnd::Stopped(StopCause::Timeout),
        "{o:?}\n{}",
        terminal_tail(s.as_ref())
    );
    assert_state(s.as_ref(), dir.path(), "a timed-out loop").await;
    // A SIGINT may reach no command: readline keeps one that lands as it finishes reading
    // the line, and bash then runs a builtin loop as if none came. A loop whose trap takes
    // the first interrupt stands for that: it gets another.
    let o =
        run(s.as_ref(), "trap 'trap - INT' INT; while :; do :; done", Duration::from_millis(800))
            .await;
    assert_eq!(
        o.end,
        CommandEnd::Stopped(StopCause::Timeout),
        "{o:?}\n{}",
        terminal_tail(s.as_ref())
    );
    assert_state(s.as_ref(), dir.path(), "a loop that took the first interrupt").await;
    // A program that ignores the interrupt is killed; the shell stays.
    let cmd = "bash -c 'trap \"\" INT; sleep 100'";
    let o = run(s.as_ref(), cmd, Duration::from_millis(800)).await;
    assert_eq!(
        o.end,
        CommandEnd::Stopped(StopCause::Timeout),
        "{o:?}\n{}",
        terminal_tail(s.as_ref())
    );
    assert_state(s.as_ref(), dir.path(), "a timed-out program ignoring SIGINT").await;
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_framed_terminal_reader_is_stopped_and_the_shell_kept(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let (dir, s) = stateful(p).await;
    // A password prompt reads the terminal itself, not stdin: it is stopped, not answered.
    let o = run(s.as_ref(), "printf 'Password: '; read -r x < /dev/tty", LONG).await;
    assert_eq!(o.end, CommandEnd::Stopped(StopCause::WaitingForInput), "{o:?}");
    assert_eq!(o.output, "Password: ", "{o:?}");
    assert_state(s.as_ref(), dir.path(), "a /dev/tty reader").await;
    close(s.as_ref()).await;
    Ok(())
}

pub async fn exec_bash_and_prompt_command_assignments_keep_the_framing(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let (dir, s) = stateful(p).await;
    // direnv, conda and starship assign PROMPT_COMMAND; replacing it must not lose frames.
    assert_eq!(ran(s.as_ref(), "PROMPT_COMMAND='wl_hook=ran'; echo set", 0).await, "set\n");
    assert_eq!(ran(s.as_ref(), "echo $wl_hook", 0).await, "ran\n", "the user's hook runs");
    assert_state(s.as_ref(), dir.path(), "a PROMPT_COMMAND assignment").await;
    // An interrupted line ends through the prompt hook, which is back in place.
    let o = run(s.as_ref(), "PROMPT_COMMAND=true; sleep 100", Duration::from_millis(800)).await;
    assert_eq!(o.end, CommandEnd::Stopped(StopCause::Timeout), "{o:?}");
    assert_eq!(ran(s.as_ref(), "false", 1).await, "");
    // `exec bash` replaces the shell: exports and cwd carry over (functions do not, as in
    // any terminal), and framing, errexit emulation and later calls work in the new shell.
    let o = run(s.as_ref(), "exec bash", LONG).await;
    assert_eq!(o.end, CommandEnd::Exited(0), "{o:?}");
    let real = std::fs::canonicalize(dir.path()).unwrap();
    let out = ran(s.as_ref(), "pwd -P; echo $WL_VAR", 0).await;
    assert_eq!(out, format!("{}\nkept\n", real.display()));
    assert_eq!(ran(s.as_ref(), "set -e; echo step; false; echo no", 1).await, "step\n");
    assert_eq!(ran(s.as_ref(), "echo \"a!b\"", 0).await, "a!b\n", "history expansion is off");
    assert_eq!(s.status(), SessionStatus::Running);
    close(s.as_ref()).await;
    Ok(())
}

pub async fn exit_with_a_background_job_ends_at_once_and_lists_it(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let s = open_with(p, &[]).await;
    let started = Instant::now();
    let o = run(s.as_ref(), "sleep 300 & exit 7", LONG).await;
    assert_eq!(o.end, CommandEnd::SessionExited, "{o:?}");
    assert_eq!(o.session_status, SessionStatus::Exited(ExitStatus::code(7)), "{o:?}");
    assert!(o.output.contains("stopped its background jobs:"), "{o:?}");
    assert!(o.output.contains("sleep 300 &"), "the job is named: {o:?}");
    // Well within the job's life: nothing waited for it.
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let report = within("close after exit", s.close()).await.unwrap();
    assert_eq!(report.root_exit, SessionStatus::Exited(ExitStatus::code(7)));
    // With an EXIT trap of the user's in place of the framing's, the job keeps the terminal
    // open; the shell's end is still seen at once, and close stops the job.
    let s = open_with(p, &[]).await;
    let started = Instant::now();
    let o = run(s.as_ref(), "trap 'echo bye' EXIT; sleep 300 & exit 4", LONG).await;
    assert_eq!(o.end, CommandEnd::SessionExited, "{o:?}");
    assert_eq!(o.session_status, SessionStatus::Exited(ExitStatus::code(4)), "{o:?}");
    assert!(o.output.ends_with("bye\n"), "{o:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    close(s.as_ref()).await;
    Ok(())
}

pub async fn history_expansion_is_off(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let s = open_with(p, &[]).await;
    let text = "echo \"a!b\"; echo done";
    let r = match within(text, s.send(SendRequest::line(text), CancellationToken::new()))
        .await
        .unwrap()
    {
        conch_seams::SendOutcome::Ready(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    assert!(r.delta.contains("a!b\ndone\n"), "both ran: {r:?}");
    assert!(!r.delta.contains("event not found"), "{r:?}");
    assert_eq!(ran(s.as_ref(), "echo 'x!!y' \"!$\"", 0).await, "x!!y !$\n");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn a_shell_without_a_locale_gets_a_utf8_one(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    // What an MCP client that starts servers without LANG gives the shell: no locale. (Set
    // empty, the way an open spec can say "none"; empty counts as unset for the C library.)
    let s = open_with(p, &[("LANG", ""), ("LC_ALL", ""), ("LC_CTYPE", "")]).await;
    let out = ran(s.as_ref(), "x=$'\\xc3\\xa9'; echo ${#x} $LANG", 0).await;
    assert!(out.starts_with("1 ") && out.to_lowercase().contains("utf"), "{out:?}");
    // Typed non-ASCII echoes as itself, and the prompt brings no line-editor padding.
    let text = "echo 你好";
    let r = match within(text, s.send(SendRequest::line(text), CancellationToken::new()))
        .await
        .unwrap()
    {
        conch_seams::SendOutcome::Ready(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(r.delta.contains("echo 你好\n你好\n"), "{r:?}");
    assert!(!r.delta.contains("\\344") && !r.delta.contains("    "), "{r:?}");
    assert_eq!(ran(s.as_ref(), "echo 你好", 0).await, "你好\n");
    close(s.as_ref()).await;
    // A locale the environment names is kept, and none is added.
    let s = open_with(p, &[("LANG", ""), ("LC_ALL", ""), ("LC_CTYPE", "C")]).await;
    assert_eq!(ran(s.as_ref(), "echo \"[$LANG] $LC_CTYPE\"", 0).await, "[] C\n");
    close(s.as_ref()).await;
    Ok(())
}

pub async fn set_x_traces_only_the_command(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let s = open_with(p, &[]).await;
    let out = ran(s.as_ref(), "set -x; echo traced", 0).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "one trace line and the output: {out:?}");
    assert!(lines[0].ends_with("+ echo traced") && lines[1] == "traced", "{out:?}");
    // Still on in the next call, traced the same way, and nothing of the framing shows.
    let out = ran(s.as_ref(), "echo again", 0).await;
    assert!(out.ends_with("+ echo again\nagain\n") && !out.contains("conch"), "{out:?}");
    let out = ran(s.as_ref(), "set +x; echo quiet", 0).await;
    assert!(out.ends_with("quiet\n") && !out.contains("conch"), "{out:?}");
    assert_eq!(ran(s.as_ref(), "echo quiet", 0).await, "quiet\n");
    // The traps the framing set are its own: the user's shell has none until it sets one.
    assert_eq!(ran(s.as_ref(), "trap -p; trap", 0).await, "");
    assert_eq!(
        ran(s.as_ref(), "trap 'echo bye' USR1; trap -p", 0).await,
        "trap -- 'echo bye' SIGUSR1\n"
    );
    close(s.as_ref()).await;
    Ok(())
}

/// A shell that replaces one the backend could not get back (the persistent tool's reset)
/// starts with the working directory and exported variables the last finished command
/// left, and says so when it cannot return to that directory.
pub async fn a_replacement_shell_gets_the_cwd_and_exports_its_predecessor_left(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().unwrap();
    let s = open_with(p, &[]).await;
    // A value no quoting may break: spaces, both quotes, a newline, non-ASCII.
    let cmd = format!(
        "cd '{}' && export WL_VAR=$'a \"b\" \\'c\\'\\nd \u{e9}' && WL_LOCAL=no",
        dir.path().display()
    );
    let o = run(s.as_ref(), &cmd, LONG).await;
    assert_eq!(o.end, CommandEnd::Exited(0), "{o:?}");
    let state = o.state.clone().expect("the shell reports its state at its prompt");
    assert!(state.exports && state.dialect == Dialect::Bash, "{state:?}");
    // Reported when it changes, not after every command.
    let o = run(s.as_ref(), "true", LONG).await;
    assert!(o.state.is_none(), "{o:?}");
    close(s.as_ref()).await;

    let mut spec = TerminalOpenSpec::default();
    spec.restore = Some(state);
    let s = within("terminal open", p.open(spec)).await.expect("open a session");
    let out = ran(s.as_ref(), "pwd -P; printf '%s|' \"$WL_VAR\" \"${WL_LOCAL-unset}\"", 0).await;
    let real = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(out, format!("{}\na \"b\" 'c'\nd \u{e9}|unset|", real.display()));
    close(s.as_ref()).await;

    // A directory that is gone by then: the replacement says where it is instead.
    let gone = tempfile::tempdir().unwrap();
    let s = open_with(p, &[]).await;
    let o =
        run(s.as_ref(), &format!("cd '{}' && export WL_VAR=2", gone.path().display()), LONG).await;
    let state = o.state.clone().expect("a changed state is reported");
    close(s.as_ref()).await;
    drop(gone);
    let mut spec = TerminalOpenSpec::default();
    spec.restore = Some(state);
    let s = within("terminal open", p.open(spec)).await.expect("open a session");
    let out = ran(s.as_ref(), "echo $WL_VAR", 0).await;
    assert!(
        out.starts_with("[could not return to the working directory the shell had; it is in ")
            && out.ends_with("]\n2\n"),
        "{out:?}"
    );
    close(s.as_ref()).await;
    Ok(())
}
