//! Cases for the `Subprocess` seam.

use std::time::Duration;

use conch_seams::{
    AfterExit, ErrorCode, ErrorReason, OutputSpec, Process, SpawnSpec, StdinSpec, StreamId,
    Subprocess, TerminalSpawnSpec,
};
use tokio_util::sync::CancellationToken;

use crate::{Outcome, detach, pid_gone, pid_in, skip, within};

fn argv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

fn collect() -> OutputSpec {
    OutputSpec::Collect { max_bytes: 1 << 20, spill_cap: 1 << 24 }
}

fn tmp() -> std::path::PathBuf {
    std::env::temp_dir()
}

async fn stdout_of(p: &dyn Subprocess, spec: SpawnSpec) -> (String, conch_seams::ExitStatus) {
    let proc = p.spawn(spec).await.expect("spawn");
    let status =
        within("process exit", proc.wait()).await.expect("the provider keeps track of its process");
    let r = proc.read(StreamId::Stdout, 0, 1 << 20).expect("stdout is collected");
    (String::from_utf8(r.data).expect("utf8"), status)
}

pub async fn spawn_captures_stdout(p: &dyn Subprocess) -> Outcome {
    let (out, status) =
        stdout_of(p, SpawnSpec::new(argv(&["echo", "hello"]), tmp()).with_stdout(collect())).await;
    assert_eq!(out, "hello\n");
    assert_eq!(status.code, Some(0), "echo exits 0");
    assert!(status.signal.is_none());
    Ok(())
}

pub async fn nonzero_exit_is_data_not_error(p: &dyn Subprocess) -> Outcome {
    let (_, status) =
        stdout_of(p, SpawnSpec::new(argv(&["sh", "-c", "exit 3"]), tmp()).with_stdout(collect()))
            .await;
    assert_eq!(status.code, Some(3), "exit code is reported as data");
    Ok(())
}

pub async fn death_by_signal_is_reported(p: &dyn Subprocess) -> Outcome {
    let (_, status) = stdout_of(
        p,
        SpawnSpec::new(argv(&["sh", "-c", "kill -9 $$"]), tmp()).with_stdout(collect()),
    )
    .await;
    assert_eq!(status.code, None);
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"));
    Ok(())
}

pub async fn missing_executable_is_spawn_failure(p: &dyn Subprocess) -> Outcome {
    let err = p
        .spawn(SpawnSpec::new(argv(&["/nonexistent/conch-no-such-binary"]), tmp()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("conch-no-such-binary"), "message names the program: {err}");
    assert_eq!(err.reason(), Some(ErrorReason::MissingProgram), "typed, so executors can say more");
    // A bare name missing from the child's PATH is the same typed miss.
    let err =
        p.spawn(SpawnSpec::new(argv(&["conch-no-such-binary-on-path"]), tmp())).await.unwrap_err();
    assert_eq!(
        (err.code(), err.reason()),
        (ErrorCode::SpawnFailed, Some(ErrorReason::MissingProgram))
    );
    Ok(())
}

pub async fn missing_cwd_is_spawn_failure(p: &dyn Subprocess) -> Outcome {
    let err = p.spawn(SpawnSpec::new(argv(&["true"]), "/nonexistent/conch-dir")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("/nonexistent/conch-dir"), "{err}");
    Ok(())
}

pub async fn empty_argv_is_invalid(p: &dyn Subprocess) -> Outcome {
    let err = p.spawn(SpawnSpec::new(Vec::new(), tmp())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    Ok(())
}

pub async fn argv_is_not_shell_interpreted(p: &dyn Subprocess) -> Outcome {
    let (out, _) = stdout_of(
        p,
        SpawnSpec::new(argv(&["echo", "$HOME; ls | wc", "*"]), tmp()).with_stdout(collect()),
    )
    .await;
    assert_eq!(out, "$HOME; ls | wc *\n");
    Ok(())
}

pub async fn cwd_is_respected(p: &dyn Subprocess) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) =
        stdout_of(p, SpawnSpec::new(argv(&["pwd", "-P"]), dir.path()).with_stdout(collect())).await;
    assert_eq!(out.trim_end(), dir.path().canonicalize().unwrap().display().to_string());
    Ok(())
}

pub async fn env_overlay_sets_and_unsets(p: &dyn Subprocess) -> Outcome {
    let spec = SpawnSpec::new(
        argv(&["sh", "-c", "echo ${CONCH_CONF_A-unset} ${HOME-unset} ${MY_API_TOKEN-unset}"]),
        tmp(),
    )
    .with_stdout(collect())
    .with_env("CONCH_CONF_A", Some("a".into()))
    .with_env("HOME", None)
    .with_env("MY_API_TOKEN", Some("forwarded".into()));
    let (out, _) = stdout_of(p, spec).await;
    assert_eq!(out, "a unset forwarded\n", "overlay applies after the scrub and can unset");
    Ok(())
}

pub async fn ambient_managed_env_is_scrubbed(p: &dyn Subprocess) -> Outcome {
    // Whatever the test runner's environment holds, no CONCH_* or credential-shaped name
    // may reach the child unless the overlay puts it there (or it is the provider's own
    // per-spawn mark).
    let (out, _) = stdout_of(p, SpawnSpec::new(argv(&["env"]), tmp()).with_stdout(collect())).await;
    for line in out.lines() {
        let name = line.split('=').next().unwrap_or("").to_ascii_uppercase();
        if name == conch_env::CALL_ID_VAR {
            continue;
        }
        assert!(!name.starts_with("CONCH_"), "managed name leaked: {line}");
        for pat in ["KEY", "PASSWORD", "SECRET", "TOKEN"] {
            assert!(!name.contains(pat), "credential-shaped name leaked: {name}");
        }
    }
    assert!(out.lines().any(|l| l.starts_with("PATH=")), "ordinary values such as PATH are kept");
    Ok(())
}

pub async fn merged_stderr_keeps_arrival_order(p: &dyn Subprocess) -> Outcome {
    let spec = SpawnSpec::new(argv(&["sh", "-c", "echo a; echo b >&2; echo c; echo d >&2"]), tmp())
        .with_stdout(collect())
        .with_stderr(OutputSpec::MergeIntoStdout);
    let (out, _) = stdout_of(p, spec).await;
    assert_eq!(out, "a\nb\nc\nd\n");
    Ok(())
}

pub async fn separate_stderr_is_collected_apart(p: &dyn Subprocess) -> Outcome {
    let spec = SpawnSpec::new(argv(&["sh", "-c", "echo out; echo err >&2"]), tmp())
        .with_stdout(collect())
        .with_stderr(collect());
    let proc = p.spawn(spec).await.unwrap();
    within("exit", proc.wait()).await.expect("the provider keeps track of its process");
    assert_eq!(proc.read(StreamId::Stdout, 0, 100).unwrap().data, b"out\n");
    assert_eq!(proc.read(StreamId::Stderr, 0, 100).unwrap().data, b"err\n");
    let s = proc.collected(StreamId::Stderr).unwrap();
    assert_eq!(s.total_bytes, 4);
    Ok(())
}

pub async fn stdin_bytes_reach_the_child(p: &dyn Subprocess) -> Outcome {
    let spec = SpawnSpec::new(argv(&["cat"]), tmp())
        .with_stdin(StdinSpec::bytes(b"xyz".to_vec()))
        .with_stdout(collect());
    let (out, status) = stdout_of(p, spec).await;
    assert_eq!(out, "xyz");
    assert!(status.success());
    Ok(())
}

pub async fn stdin_pipe_is_writable_and_closable(p: &dyn Subprocess) -> Outcome {
    let spec =
        SpawnSpec::new(argv(&["cat"]), tmp()).with_stdin(StdinSpec::Pipe).with_stdout(collect());
    let proc = p.spawn(spec).await.unwrap();
    proc.write_stdin(b"one ").await.unwrap();
    proc.write_stdin(b"two").await.unwrap();
    proc.close_stdin().await.expect("closing stdin is delivered");
    within("cat to exit after EOF", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    assert_eq!(proc.read(StreamId::Stdout, 0, 100).unwrap().data, b"one two");
    Ok(())
}

pub async fn offset_reads_are_caller_owned(p: &dyn Subprocess) -> Outcome {
    let spec =
        SpawnSpec::new(argv(&["sh", "-c", "printf 0123456789"]), tmp()).with_stdout(collect());
    let proc = p.spawn(spec).await.unwrap();
    within("exit", proc.wait()).await.expect("the provider keeps track of its process");
    let a = proc.read(StreamId::Stdout, 0, 4).unwrap();
    assert_eq!(
        (a.data.as_slice(), a.start_offset, a.next_offset, a.lossy),
        (&b"0123"[..], 0, 4, false)
    );
    let b = proc.read(StreamId::Stdout, a.next_offset, 100).unwrap();
    assert_eq!(b.data, b"456789");
    // A second reader from 0 is not affected by the first one's progress.
    let again = proc.read(StreamId::Stdout, 0, 100).unwrap();
    assert_eq!(again.data, b"0123456789");
    let end = proc.read(StreamId::Stdout, 10, 100).unwrap();
    assert!(end.data.is_empty() && end.next_offset == 10 && end.sealed);
    assert!(proc.read(StreamId::Stderr, 0, 1).is_err(), "an uncollected stream is an error");
    Ok(())
}

pub async fn stale_offset_read_is_lossy_tail(p: &dyn Subprocess) -> Outcome {
    let spec = SpawnSpec::new(
        argv(&["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; printf END"]),
        tmp(),
    )
    .with_stdout(OutputSpec::Collect { max_bytes: 1000, spill_cap: 1 << 20 });
    let proc = p.spawn(spec).await.unwrap();
    within("exit", proc.wait()).await.expect("the provider keeps track of its process");
    let r = proc.read(StreamId::Stdout, 0, 1 << 20).unwrap();
    assert!(r.lossy, "offset 0 fell out of the 1000-byte window");
    assert_eq!(r.start_offset, 100_003 - 1000);
    assert_eq!(r.data.len(), 1000);
    assert!(r.data.ends_with(b"END"));
    let spill = r.spill.expect("a complete spill is published").path;
    assert_eq!(std::fs::metadata(spill).unwrap().len(), 100_003);
    Ok(())
}

fn grandchild_pids(out: &str) -> Vec<i32> {
    out.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

pub async fn kill_terminates_group_when_children_ignore_sigterm(p: &dyn Subprocess) -> Outcome {
    let script = "trap '' TERM; (trap '' TERM; exec sleep 1000) & (trap '' TERM; while :; do sleep 1; done) & echo $!; echo ready; wait";
    let spec = SpawnSpec::new(argv(&["bash", "-c", script]), tmp())
        .with_stdout(collect())
        .with_grace(Duration::from_millis(300));
    let proc = p.spawn(spec).await.unwrap();
    // Wait (on output, not time) until the children exist.
    let out = within("the script to report readiness", async {
        loop {
            let r = proc.read(StreamId::Stdout, 0, 4096).unwrap();
            let s = String::from_utf8_lossy(&r.data).into_owned();
            if s.contains("ready") {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let pids = grandchild_pids(&out);
    assert!(!pids.is_empty(), "script printed a child pid: {out}");
    proc.kill().await.expect("the kill is delivered");
    let status = within("killed process to exit", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"), "TERM was trapped, so KILL ended it");
    within("the whole group to be gone", proc.wait_group_gone())
        .await
        .expect("the provider keeps track of its process");
    for pid in pids {
        within("grandchild to disappear", async {
            while !pid_gone(pid) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    Ok(())
}

pub async fn cancel_token_kills_the_tree(p: &dyn Subprocess) -> Outcome {
    let cancel = CancellationToken::new();
    let spec = SpawnSpec::new(argv(&["sleep", "1000"]), tmp()).with_cancel(cancel.clone());
    let proc = p.spawn(spec).await.unwrap();
    cancel.cancel();
    let status = within("cancelled process to exit", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    assert_eq!(status.signal.as_deref(), Some("SIGTERM"));
    Ok(())
}

pub async fn shutdown_reaps_everything_live(p: &dyn Subprocess) -> Outcome {
    let mut pids = Vec::new();
    let mut procs = Vec::new();
    for _ in 0..3 {
        let proc = p.spawn(SpawnSpec::new(argv(&["sleep", "1000"]), tmp())).await.unwrap();
        pids.push(proc.pid().unwrap() as i32);
        procs.push(proc);
    }
    within("shutdown", p.shutdown()).await;
    for (proc, pid) in procs.iter().zip(pids) {
        assert!(proc.try_status().is_some(), "process {pid} settled after shutdown");
        assert!(pid_gone(pid), "process {pid} is gone after shutdown");
    }
    Ok(())
}

pub async fn which_resolves_on_path(p: &dyn Subprocess) -> Outcome {
    let sh = p.which("sh").await.expect("which answers").expect("sh is on PATH");
    assert!(sh.is_absolute());
    assert!(p.which("conch-no-such-program-xyz").await.expect("which answers").is_none());
    Ok(())
}

pub async fn spawn_terminal_is_honest_about_support(p: &dyn Subprocess) -> Outcome {
    if p.capabilities().terminals {
        return skip("the provider supports terminals (the terminal-process suite covers them)");
    }
    let err = p.spawn_terminal(TerminalSpawnSpec::new(argv(&["bash"]), tmp())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    Ok(())
}

/// Waits until `pid` is gone (or a zombie nobody reaps).
async fn await_gone(what: &str, pid: i32) {
    within(what, async {
        while !pid_gone(pid) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Waits until `pid` leads a session of its own (its `setsid` ran).
async fn await_own_session(pid: i32) {
    within(&format!("{pid} to leave the group"), async {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let sid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(3))
                .and_then(|f| f.parse::<i32>().ok());
            if sid == Some(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Reads stdout until it contains `needle`.
async fn await_output(proc: &dyn Process, needle: &str) -> String {
    within(&format!("output containing {needle:?}"), async {
        loop {
            let r = proc.read(StreamId::Stdout, 0, 1 << 16).unwrap();
            let s = String::from_utf8_lossy(&r.data).into_owned();
            if s.contains(needle) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn first_pid(out: &str) -> i32 {
    out.split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("the script printed a pid: {out:?}"))
}

fn stop_leftovers(drain_ms: u64) -> AfterExit {
    AfterExit::StopLeftovers { drain: Duration::from_millis(drain_ms) }
}

fn merged(script: &str) -> SpawnSpec {
    SpawnSpec::new(argv(&["sh", "-c", script]), tmp())
        .with_stdout(collect())
        .with_stderr(OutputSpec::MergeIntoStdout)
        .with_grace(Duration::from_millis(500))
}

/// Skips without the setsid utility on the provider's PATH.
async fn has_setsid(p: &dyn Subprocess) -> Outcome {
    if p.which("setsid").await.expect("which answers").is_some() {
        Ok(())
    } else {
        skip("needs the setsid utility")
    }
}

pub async fn wait_for_eof_waits_for_descendants_holding_the_output(p: &dyn Subprocess) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script =
        format!("(while [ ! -e '{}' ]; do sleep 0.02; done; echo late) & echo early", go.display());
    let proc = p.spawn(merged(&script)).await.unwrap();
    let status = within("the direct child to exit", proc.wait_exit())
        .await
        .expect("the provider keeps track of its process");
    assert_eq!(status.code, Some(0));
    assert!(proc.try_status().is_none(), "not settled while a descendant holds stdout");
    std::fs::write(&go, b"").unwrap();
    within("settlement once the descendant finished", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    let out = proc.collected(StreamId::Stdout).unwrap();
    assert_eq!(out.text, "early\nlate\n", "the descendant's output is part of the stream");
    assert!(proc.leftovers().is_empty(), "nothing was stopped: {:?}", proc.leftovers());
    Ok(())
}

/// Shell text that waits until the background job `$!` runs `comm`, then prints its pid.
fn echo_once_execd(comm: &str) -> String {
    format!("p=$!; until [ \"$(cat /proc/$p/comm 2>/dev/null)\" = {comm} ]; do :; done; echo $p")
}

pub async fn stop_leftovers_stops_a_background_child_holding_the_output(
    p: &dyn Subprocess,
) -> Outcome {
    // The leftover is named as it is when the stop finds it: the shell exits only once its
    // child has exec'd `sleep` (on a loaded machine the fork can outlast the drain).
    let script = format!("sleep 1000 & {}", echo_once_execd("sleep"));
    let proc = p.spawn(merged(&script).with_after_exit(stop_leftovers(100))).await.unwrap();
    let status = within("settlement despite the held pipe", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    assert_eq!(status.code, Some(0), "the direct child's status is reported");
    let out = proc.collected(StreamId::Stdout).unwrap();
    let pid = first_pid(&out.text);
    let left = proc.leftovers();
    let entry = left.iter().find(|l| l.pid as i32 == pid);
    let entry = entry.unwrap_or_else(|| panic!("sleep {pid} is reported: {left:?}"));
    assert!(entry.held_output, "it held the output open: {entry:?}");
    assert_eq!(entry.name, "sleep");
    await_gone("the stopped leftover to be gone", pid).await;
    Ok(())
}

pub async fn stop_leftovers_stops_group_members_that_redirected_output(
    p: &dyn Subprocess,
) -> Outcome {
    let proc = p
        .spawn(merged("sleep 1000 >/dev/null 2>&1 & echo $!").with_after_exit(stop_leftovers(100)))
        .await
        .unwrap();
    within("settlement", proc.wait()).await.expect("the provider keeps track of its process");
    let pid = first_pid(&proc.collected(StreamId::Stdout).unwrap().text);
    let left = proc.leftovers();
    let entry = left.iter().find(|l| l.pid as i32 == pid);
    let entry = entry.unwrap_or_else(|| panic!("sleep {pid} is reported: {left:?}"));
    assert!(!entry.held_output, "its output went to /dev/null: {entry:?}");
    await_gone("the group member to be gone", pid).await;
    Ok(())
}

pub async fn stop_leftovers_reaches_a_pipe_holder_outside_the_group(p: &dyn Subprocess) -> Outcome {
    has_setsid(p).await?;
    let script = format!("setsid sleep 1000 & {}", echo_once_execd("sleep"));
    let proc = p.spawn(merged(&script).with_after_exit(stop_leftovers(100))).await.unwrap();
    within("settlement despite an escaped holder", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    let left = proc.leftovers();
    assert!(left.iter().any(|l| l.held_output && l.name == "sleep"), "{left:?}");
    for l in &left {
        await_gone("every reported leftover to be gone", l.pid as i32).await;
    }
    Ok(())
}

pub async fn stop_leftovers_escalates_to_kill_for_term_trappers(p: &dyn Subprocess) -> Outcome {
    let script = "(trap '' TERM; while :; do sleep 1; done) & echo $!";
    let proc = p.spawn(merged(script).with_after_exit(stop_leftovers(100))).await.unwrap();
    within("settlement after KILL", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    let pid = first_pid(&proc.collected(StreamId::Stdout).unwrap().text);
    assert!(proc.leftovers().iter().any(|l| l.pid as i32 == pid), "{:?}", proc.leftovers());
    await_gone("the TERM-trapping leftover to be gone", pid).await;
    Ok(())
}

pub async fn output_written_within_the_drain_is_kept(p: &dyn Subprocess) -> Outcome {
    let script = "(sleep 0.2; echo late) & echo early";
    let proc = p.spawn(merged(script).with_after_exit(stop_leftovers(20_000))).await.unwrap();
    let status =
        within("settlement", proc.wait()).await.expect("the provider keeps track of its process");
    // The status tells a shell killed at birth (the rare "fresh process gone") from lost output.
    let text = proc.collected(StreamId::Stdout).unwrap().text;
    assert_eq!(text, "early\nlate\n", "the shell ended {status:?}");
    assert!(proc.leftovers().is_empty(), "it finished by itself: {:?}", proc.leftovers());
    Ok(())
}

pub async fn kill_settles_even_when_an_escaped_process_holds_the_output(
    p: &dyn Subprocess,
) -> Outcome {
    has_setsid(p).await?;
    // Default after_exit (wait for EOF): a kill must still settle.
    let proc =
        p.spawn(merged("setsid sleep 1000 & echo $!; echo ready; sleep 1000")).await.unwrap();
    let out = await_output(proc.as_ref(), "ready").await;
    let pid = first_pid(&out);
    // `$!` is known once the child is forked, not once it ran `setsid`: until then it is
    // still a member of the group the kill signals, and would go with it unreported.
    await_own_session(pid).await;
    proc.kill().await.expect("the kill is delivered");
    within("settlement after the kill", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    assert!(proc.leftovers().iter().any(|l| l.pid as i32 == pid), "{:?}", proc.leftovers());
    await_gone("the escaped holder to be gone", pid).await;
    Ok(())
}

pub async fn stop_leftovers_stops_a_process_that_detached_and_closed_the_output(
    p: &dyn Subprocess,
) -> Outcome {
    has_setsid(p).await?;
    // Neither in the group nor holding the output: only its ancestry ties it to the call.
    let script = "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!";
    let proc = p.spawn(merged(script).with_after_exit(stop_leftovers(100))).await.unwrap();
    let status =
        within("settlement", proc.wait()).await.expect("the provider keeps track of its process");
    let out = proc.collected(StreamId::Stdout).unwrap();
    // How the shell ended tells a kill from lost output (the rare "fresh process gone").
    assert!(!out.text.trim().is_empty(), "no pid printed; the shell ended {status:?}: {out:?}");
    let pid = first_pid(&out.text);
    let left = proc.leftovers();
    let entry = left.iter().find(|l| l.pid as i32 == pid);
    let entry = entry.unwrap_or_else(|| panic!("the detached {pid} is reported: {left:?}"));
    assert!(!entry.held_output, "its output went to /dev/null: {entry:?}");
    await_gone("the detached leftover to be gone", pid).await;
    Ok(())
}

pub async fn kill_stops_what_detached_from_the_group(p: &dyn Subprocess) -> Outcome {
    has_setsid(p).await?;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("{} echo ready; exec sleep 1000", detach("setsid", &pidfile));
    let proc = p.spawn(merged(&script)).await.unwrap();
    let (pid, start) = pid_in(&pidfile).await;
    proc.kill().await.expect("the kill is delivered");
    within("settlement after the kill", proc.wait())
        .await
        .expect("the provider keeps track of its process");
    crate::await_gone("the detached process to be stopped with the tree", pid, start).await;
    Ok(())
}

pub async fn shutdown_leaves_nothing_detached_behind(p: &dyn Subprocess) -> Outcome {
    has_setsid(p).await?;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // Waiting for EOF stops nothing: the detached process outlives its settled parent.
    let spec = SpawnSpec::new(argv(&["sh", "-c", &detach("setsid", &pidfile)]), tmp());
    let proc = p.spawn(spec).await.unwrap();
    within("settlement", proc.wait()).await.expect("the provider keeps track of its process");
    let (pid, start) = pid_in(&pidfile).await;
    assert!(!crate::gone(pid, start), "nothing stopped the detached {pid} yet");
    within("shutdown", p.shutdown()).await;
    crate::await_gone("the detached process to be stopped by shutdown", pid, start).await;
    Ok(())
}
