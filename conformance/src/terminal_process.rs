//! Cases for `Subprocess::spawn_terminal` and the `TerminalProcess` seam: real processes on
//! real pseudo-terminals, waiting on events (output, exit, observations) with generous
//! deadlines instead of fixed sleeps. Every case skips (visibly) on a provider without
//! terminals; probe cases also need `stdin_probe`.
//!
//! Effects are judged from outside the provider: `/proc` here is the test's oracle, read on
//! the machine the processes run on (a remote provider under test runs on loopback).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use conch_seams::{
    ErrorCode, ErrorReason, ExitStatus, ForegroundTarget, Probe, Signal, StdinWait, Subprocess,
    TerminalProcess, TerminalSize, TerminalSpawnSpec,
};

use crate::{Outcome, PATIENCE, detach, pid_gone, pid_in, skip, within};

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn tmp() -> std::path::PathBuf {
    std::env::temp_dir()
}

/// Skips when the provider has no terminals.
fn terminals(p: &dyn Subprocess) -> Outcome {
    if p.capabilities().terminals { Ok(()) } else { skip("the provider has no terminals") }
}

/// Skips when the provider has no terminals or no stdin probe.
fn probing(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    if p.capabilities().stdin_probe { Ok(()) } else { skip("the provider has no stdin probe") }
}

async fn open(p: &dyn Subprocess, a: &[&str]) -> Arc<dyn TerminalProcess> {
    within("spawn_terminal", p.spawn_terminal(TerminalSpawnSpec::new(argv(a), tmp())))
        .await
        .unwrap_or_else(|e| panic!("spawn_terminal {a:?}: {e}"))
}

/// Reads until `pred` holds for the accumulated text, or EOF (the bool).
async fn read_until(t: &dyn TerminalProcess, pred: impl Fn(&str) -> bool) -> (String, bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut out = Vec::new();
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if pred(&text) {
            return (text, false);
        }
        match tokio::time::timeout_at(deadline, t.read_chunk()).await {
            Ok(Ok(Some(chunk))) => out.extend_from_slice(&chunk),
            Ok(Ok(None)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Err(e)) => panic!("read_chunk failed (not EOF): {e}"),
            Err(_) => panic!("deadline waiting for output; got {text:?}"),
        }
    }
}

async fn read_to_eof(t: &dyn TerminalProcess) -> String {
    let (text, eof) = read_until(t, |_| false).await;
    assert!(eof);
    text
}

async fn wait(t: &dyn TerminalProcess) -> ExitStatus {
    within("terminal exit", t.wait()).await.expect("the provider keeps track of its terminal")
}

/// Polls `f` until it holds (true) or patience runs out (false).
async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn stdin(t: &dyn TerminalProcess) -> StdinWait {
    t.observe(Probe::Stdin).await.expect("observe").stdin
}

async fn foreground(t: &dyn TerminalProcess) -> Option<i32> {
    t.observe(Probe::Foreground).await.expect("observe").foreground
}

fn pid_of(t: &dyn TerminalProcess) -> i32 {
    i32::try_from(t.pid().expect("pid")).unwrap()
}

/// True when `pid` no longer names a process, or names one that is not a zombie.
fn not_a_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat[stat.rfind(')').unwrap() + 1..].split_whitespace().next() != Some("Z"),
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned()
}

fn syscall_line(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default().trim().to_owned()
}

/// Pulls the last `KEY=<number>` out of output.
fn number_after(out: &str, key: &str) -> i32 {
    out.rsplit(key)
        .next()
        .filter(|_| out.contains(key))
        .and_then(|rest| {
            rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
        })
        .unwrap_or_else(|| panic!("no {key}<n> in {out:?}"))
}

async fn await_gone(what: &str, pid: i32) {
    assert!(eventually(|| async move { pid_gone(pid) }).await, "{what}: pid {pid} is still alive");
}

/// KILLs whatever is in the foreground (the leader, for these single-process terminals) and
/// waits for the exit.
async fn kill_and_reap(t: &dyn TerminalProcess) -> ExitStatus {
    let d = t.signal_foreground(Signal::Kill, ForegroundTarget::Any).await.expect("kill");
    assert!(d.is_some(), "Any reaches the leader too");
    wait(t).await
}

pub async fn output_then_eof_then_exit_code_without_zombie(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["/bin/sh", "-c", "echo hello; exit 3"]).await;
    let pid = pid_of(t.as_ref());
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("hello"), "{text:?}");
    let status = wait(t.as_ref()).await;
    assert_eq!(status, ExitStatus::code(3));
    assert_eq!(t.try_status(), Some(status));
    assert!(not_a_zombie(pid), "the leader was reaped");
    assert_eq!(t.read_chunk().await.unwrap(), None, "after EOF every read is EOF");
    Ok(())
}

pub async fn bad_cwd_is_spawn_failed(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let spec = TerminalSpawnSpec::new(argv(&["sh"]), "/nonexistent/conch-no-dir");
    let err = p.spawn_terminal(spec).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("/nonexistent/conch-no-dir"), "{err}");
    Ok(())
}

pub async fn missing_program_is_spawn_failed(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    for prog in ["conch-no-such-program-xyz", "./conch-no-such-program-xyz"] {
        let err = p.spawn_terminal(TerminalSpawnSpec::new(argv(&[prog]), tmp())).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
        assert!(err.to_string().contains("conch-no-such-program-xyz"), "names it: {err}");
        assert_eq!(err.reason(), Some(ErrorReason::MissingProgram), "typed: {err}");
    }
    Ok(())
}

pub async fn empty_argv_is_invalid_argument(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let err = p.spawn_terminal(TerminalSpawnSpec::new(Vec::new(), tmp())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    Ok(())
}

pub async fn the_default_directory_is_used_without_a_cwd(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = within("spawn", p.spawn_terminal(TerminalSpawnSpec::in_default_dir(argv(&["pwd"]))))
        .await
        .expect("a terminal without a cwd starts in the provider's default directory");
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.trim().starts_with('/'), "{text:?}");
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

pub async fn overlay_is_applied_after_the_scrub(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let mut spec = TerminalSpawnSpec::new(argv(&["sh", "-c", "echo \"foo=[$FOO]\""]), tmp());
    spec.env.insert("FOO".into(), Some("bar baz".into()));
    let t = p.spawn_terminal(spec).await.unwrap();
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("foo=[bar baz]"), "{text:?}");
    wait(t.as_ref()).await;
    // A deliberately forwarded credential-shaped name survives (the overlay wins).
    let mut spec = TerminalSpawnSpec::new(argv(&["sh", "-c", "echo \"tok=[$MY_TOKEN]\""]), tmp());
    spec.env.insert("MY_TOKEN".into(), Some("t0k".into()));
    let t = p.spawn_terminal(spec).await.unwrap();
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("tok=[t0k]"), "{text:?}");
    wait(t.as_ref()).await;
    Ok(())
}

pub async fn child_env_is_exactly_the_scrubbed_map(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["env", "-0"]).await;
    let text = read_to_eof(t.as_ref()).await;
    let status = wait(t.as_ref()).await;
    assert!(status.success(), "env -0 exited {status:?} after printing {text:?}");
    let mut names: Vec<&str> = text
        .split('\0')
        .filter_map(|entry| entry.trim_start_matches(['\r', '\n']).split_once('='))
        .map(|(k, _)| k)
        .collect();
    names.sort_unstable();
    names.dedup();
    // The world under test shares this process's ambient environment (same machine).
    let expected = conch_env::child_env(&Default::default());
    for name in &names {
        // A provider may mark its spawns with its own per-spawn id.
        if *name == conch_env::CALL_ID_VAR {
            continue;
        }
        assert!(!conch_env::is_scrubbed(name), "{name} must be scrubbed");
        // portable-pty style spawns always export SHELL; everything else is the map.
        assert!(*name == "SHELL" || expected.contains_key(*name), "unexpected {name}");
    }
    for name in expected.keys() {
        assert!(names.contains(&name.as_str()), "{name} missing from the child env");
    }
    Ok(())
}

pub async fn cwd_is_honoured(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let t = p.spawn_terminal(TerminalSpawnSpec::new(argv(&["pwd"]), &real)).await.unwrap();
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains(real.to_str().unwrap()), "{text:?}");
    wait(t.as_ref()).await;
    Ok(())
}

/// A relative `PATH` entry names a directory of the terminal's cwd, where the program is
/// executed, not of the provider's own.
pub async fn a_relative_path_entry_is_a_directory_of_the_cwd(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let bin = real.join("conch-rel-bin");
    std::fs::create_dir(&bin).unwrap();
    let prog = bin.join("conch-rel-prog");
    std::fs::write(&prog, "#!/bin/sh\necho rel-ok\n").unwrap();
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = TerminalSpawnSpec::new(argv(&["conch-rel-prog"]), &real);
    spec.env.insert("PATH".into(), Some("conch-rel-bin:/usr/bin:/bin".into()));
    let t = within("spawn", p.spawn_terminal(spec))
        .await
        .expect("a program on a relative PATH entry of the cwd starts");
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("rel-ok"), "{text:?}");
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

/// An executable text file without a `#!` line runs under `/bin/sh`, as `execvp` runs it.
pub async fn a_script_without_a_shebang_runs_under_sh(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().canonicalize().unwrap().join("conch-no-shebang");
    std::fs::write(&prog, "echo \"no-shebang-ok $1\"\n").unwrap();
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let spec = TerminalSpawnSpec::new(argv(&[prog.to_str().unwrap(), "arg1"]), tmp());
    let t = within("spawn", p.spawn_terminal(spec)).await.expect("the script starts");
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("no-shebang-ok arg1"), "{text:?}");
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

pub async fn initial_size_and_resize_reach_the_tty(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let mut spec = TerminalSpawnSpec::new(
        argv(&["sh", "-c", "stty size; echo ready; read x; stty size"]),
        tmp(),
    );
    spec.size = TerminalSize { rows: 30, cols: 90 };
    let t = p.spawn_terminal(spec).await.unwrap();
    let (text, eof) = read_until(t.as_ref(), |s| s.contains("ready")).await;
    // On a failure, how the leader ended tells a kill from a status taken by someone else.
    let ended = if eof { Some(wait(t.as_ref()).await) } else { None };
    assert!(text.contains("30 90"), "{text:?} (eof: {eof}, exit: {ended:?})");
    t.resize(TerminalSize { rows: 40, cols: 100 }).await.unwrap();
    t.write(b"\n").await.unwrap();
    let (text, _) = read_until(t.as_ref(), |s| s.contains("40 100")).await;
    assert!(text.contains("40 100"), "{text:?}");
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

pub async fn write_then_read_roundtrip_with_cat(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["cat"]).await;
    t.write(b"abc\n").await.unwrap();
    // The line discipline echoes the input and cat prints it back: "abc" twice.
    let (text, eof) = read_until(t.as_ref(), |s| s.matches("abc").count() >= 2).await;
    assert!(!eof && text.matches("abc").count() >= 2, "{text:?}");
    // ^D on an empty line is EOF for cat.
    t.write(&[4]).await.unwrap();
    read_to_eof(t.as_ref()).await;
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

/// A write of more than the PTY holds goes in as the program reads it: it waits for room rather
/// than failing, and ends once every byte went in (local: the wait for room is a registration
/// of its own, made at the first `EAGAIN`).
pub async fn a_write_larger_than_the_pty_holds_ends_as_the_program_reads(
    p: &dyn Subprocess,
) -> Outcome {
    terminals(p)?;
    let t = open(
        p,
        &["sh", "-c", "stty raw -echo && echo ready && head -c 1048576 >/dev/null && echo done"],
    )
    .await;
    // Raw first: the line discipline would cut a canonical line at 4,095 bytes.
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    let data = vec![b'a'; 1 << 20];
    within("a 1 MiB write to the terminal", t.write(&data)).await.unwrap();
    let (text, eof) = read_until(t.as_ref(), |s| s.contains("done")).await;
    assert!(!eof && text.contains("done"), "head took every byte: {text:?}");
    assert!(wait(t.as_ref()).await.success());
    Ok(())
}

/// Skips when `python3` is not on the provider's PATH (a minimal image has none).
async fn python(p: &dyn Subprocess) -> Outcome {
    match p.which("python3").await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => skip("python3 is not on the provider's PATH"),
        Err(e) => panic!("which python3: {e}"),
    }
}

/// Spawns `a`, waits until the foreground group's stdin wait is seen, then kills it.
async fn assert_probe_sees_wait(p: &dyn Subprocess, a: &[&str]) -> Outcome {
    probing(p)?;
    if a[0] == "python3" {
        python(p).await?;
    }
    let t = open(p, a).await;
    let pid = pid_of(t.as_ref());
    let seen = eventually(|| async { stdin(t.as_ref()).await == StdinWait::Waiting }).await;
    let obs = t.observe(Probe::Stdin).await.unwrap();
    assert!(seen, "{a:?} waits on stdin (syscall {})", syscall_line(pid));
    assert_eq!(obs.foreground, Some(pid), "the leader owns the foreground");
    assert!(obs.leader_owns_foreground, "{obs:?}");
    let status = kill_and_reap(t.as_ref()).await;
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"));
    p.shutdown().await;
    Ok(())
}

pub async fn probe_sees_python_input_read(p: &dyn Subprocess) -> Outcome {
    let a = ["python3", "-c", "input()"];
    assert_probe_sees_wait(p, &a).await
}

pub async fn probe_sees_python_select(p: &dyn Subprocess) -> Outcome {
    let a = ["python3", "-c", "import select,sys; select.select([sys.stdin],[],[])"];
    assert_probe_sees_wait(p, &a).await
}

pub async fn probe_sees_python_poll(p: &dyn Subprocess) -> Outcome {
    let code = "import select; p=select.poll(); p.register(0, select.POLLIN); p.poll()";
    assert_probe_sees_wait(p, &["python3", "-c", code]).await
}

pub async fn probe_sees_python_epoll(p: &dyn Subprocess) -> Outcome {
    let code = "import select; e=select.epoll(); e.register(0, select.EPOLLIN); e.poll()";
    assert_probe_sees_wait(p, &["python3", "-c", code]).await
}

pub async fn probe_sees_a_worker_thread_reading(p: &dyn Subprocess) -> Outcome {
    // The main thread parks in futex; only the worker task is in read(0).
    let code =
        "import threading,sys; t=threading.Thread(target=sys.stdin.readline); t.start(); t.join()";
    assert_probe_sees_wait(p, &["python3", "-c", code]).await
}

pub async fn probe_sees_interactive_bash_prompt(p: &dyn Subprocess) -> Outcome {
    let a = ["bash", "--norc", "--noprofile", "-i"];
    assert_probe_sees_wait(p, &a).await
}

pub async fn a_foreground_only_sample_does_not_probe(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["cat"]).await;
    let obs = t.observe(Probe::Foreground).await.unwrap();
    assert_eq!(obs.stdin, StdinWait::NotProbed, "{obs:?}");
    assert_eq!(obs.foreground, Some(pid_of(t.as_ref())));
    assert!(obs.leader_owns_foreground);
    kill_and_reap(t.as_ref()).await;
    Ok(())
}

pub async fn probe_follows_the_foreground_job(p: &dyn Subprocess) -> Outcome {
    probing(p)?;
    // Bash at its prompt waits on the tty; once `sleep` owns the foreground, nothing in the
    // foreground group reads it.
    let t = open(p, &["bash", "--norc", "--noprofile", "-i"]).await;
    let bash = pid_of(t.as_ref());
    let at_prompt = eventually(|| async { stdin(t.as_ref()).await == StdinWait::Waiting }).await;
    assert!(at_prompt, "bash prompt is a stdin wait");
    t.write(b"sleep 30\n").await.unwrap();
    let sleeping = eventually(|| async {
        foreground(t.as_ref()).await.is_some_and(|g| g != bash && comm(g) == "sleep")
    })
    .await;
    assert!(sleeping, "sleep takes the foreground");
    let obs = t.observe(Probe::Stdin).await.unwrap();
    assert!(!obs.leader_owns_foreground, "{obs:?}");
    for _ in 0..10 {
        assert_eq!(stdin(t.as_ref()).await, StdinWait::NotWaiting, "sleep does not read stdin");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.shutdown().await;
    assert!(t.try_status().is_some(), "shutdown reaped bash");
    Ok(())
}

pub async fn probe_is_false_for_sleep_and_a_kill_reports_the_signal(p: &dyn Subprocess) -> Outcome {
    probing(p)?;
    let t = open(p, &["sh", "-c", "echo started; exec sleep 30"]).await;
    let pid = pid_of(t.as_ref());
    read_until(t.as_ref(), |s| s.contains("started")).await;
    let sleeping =
        eventually(|| async { comm(pid) == "sleep" && foreground(t.as_ref()).await == Some(pid) })
            .await;
    assert!(sleeping);
    for _ in 0..10 {
        let s = stdin(t.as_ref()).await;
        assert_eq!(s, StdinWait::NotWaiting, "sleep never waits on stdin ({})", syscall_line(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = kill_and_reap(t.as_ref()).await;
    assert_eq!(status, ExitStatus::signal("SIGKILL"));
    assert!(not_a_zombie(pid));
    Ok(())
}

pub async fn a_signal_reaches_the_foreground_group_not_the_leader(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["bash", "--norc", "--noprofile", "-i"]).await;
    let bash = pid_of(t.as_ref());
    // At the prompt the leader owns the foreground, so NotLeader sends nothing.
    let at_prompt = eventually(|| async { foreground(t.as_ref()).await == Some(bash) }).await;
    if !at_prompt {
        // How the leader ended (if it did) tells a kill from a hang or a stolen status.
        let fg = foreground(t.as_ref()).await;
        panic!(
            "bash {bash} never owned the foreground: now {fg:?}, its status {:?}",
            t.try_status()
        );
    }
    let none = t.signal_foreground(Signal::Kill, ForegroundTarget::NotLeader).await.unwrap();
    assert_eq!(none, None, "the leader is spared");
    assert!(t.try_status().is_none() && !pid_gone(bash), "bash is alive");
    t.write(b"sleep 1000\n").await.unwrap();
    let sleeping = eventually(|| async {
        foreground(t.as_ref()).await.is_some_and(|g| g != bash && comm(g) == "sleep")
    })
    .await;
    assert!(sleeping, "sleep takes the foreground");
    let fg = foreground(t.as_ref()).await.expect("a foreground group");
    let d = t.signal_foreground(Signal::Int, ForegroundTarget::NotLeader).await.unwrap();
    let d = d.expect("a non-leader group is in the foreground");
    assert_eq!((d.pgid, d.leader), (fg, false));
    await_gone("the interrupted sleep", fg).await;
    assert!(!pid_gone(bash), "the shell survived (its status: {:?})", t.try_status());
    t.write(b"echo after=$?\n").await.unwrap();
    let (text, _) = read_until(t.as_ref(), |s| s.contains("after=130")).await;
    assert!(text.contains("after=130"), "sleep died of SIGINT (128 + 2): {text:?}");
    let report = within("terminate", t.terminate(Duration::from_secs(2))).await.unwrap();
    assert!(report.survivors.is_empty(), "{report:?}");
    Ok(())
}

pub async fn terminate_stops_descendants_then_the_leader(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    // A TERM trapper, a setsid'd process and a grandchild: all descendants of the leader.
    let script = "trap '' TERM HUP; \
        bash -c 'trap \"\" TERM; exec sleep 1000' & echo TRAP=$!; \
        setsid sleep 1000 & echo SETSID=$!; \
        sh -c 'sleep 1000 & echo GRAND=$!; wait' & \
        echo ready; wait";
    let t = open(p, &["bash", "--norc", "--noprofile", "-c", script]).await;
    let leader = pid_of(t.as_ref());
    let (text, _) = read_until(t.as_ref(), |s| {
        s.contains("ready") && s.contains("GRAND=") && s.ends_with('\n')
    })
    .await;
    let (trap, setsid, grand) = (
        number_after(&text, "TRAP="),
        number_after(&text, "SETSID="),
        number_after(&text, "GRAND="),
    );
    let report = within("terminate", t.terminate(Duration::from_millis(500))).await.unwrap();
    assert!(report.survivors.is_empty(), "{report:?}");
    assert!(report.leader.is_some(), "the leader was stopped and reaped too: {report:?}");
    for (what, pid) in [("TERM trapper", trap), ("setsid child", setsid), ("grandchild", grand)] {
        assert!(pid_gone(pid), "the {what} {pid} survived terminate");
    }
    assert!(not_a_zombie(leader), "the leader was reaped");
    assert!(t.try_status().is_some());
    Ok(())
}

pub async fn terminate_stops_a_leader_that_keeps_forking(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    // Every child stopped is replaced at once: teardown must not chase them forever.
    let t =
        open(p, &["bash", "--norc", "--noprofile", "-c", "echo ready; while :; do sleep 1; done"])
            .await;
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    let report = within("terminate", t.terminate(Duration::from_millis(500))).await.unwrap();
    assert!(report.survivors.is_empty(), "{report:?}");
    assert!(report.leader.is_some(), "{report:?}");
    Ok(())
}

pub async fn terminate_after_the_leader_exited_reports_its_status(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["sh", "-c", "exit 4"]).await;
    read_to_eof(t.as_ref()).await;
    assert_eq!(wait(t.as_ref()).await, ExitStatus::code(4));
    let report = within("terminate", t.terminate(Duration::from_millis(200))).await.unwrap();
    assert_eq!(report.leader, Some(ExitStatus::code(4)));
    assert!(report.survivors.is_empty());
    Ok(())
}

pub async fn shutdown_kills_live_terminals(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    let t = open(p, &["sleep", "1000"]).await;
    let pid = pid_of(t.as_ref());
    within("shutdown", p.shutdown()).await;
    let status = wait(t.as_ref()).await;
    assert!(status.signal.is_some(), "{status:?}");
    assert!(not_a_zombie(pid));
    Ok(())
}

pub async fn shutdown_kills_dropped_terminals_and_their_jobs(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    // A background job in another group of the same session, and a leader that ignores HUP.
    let script = "set -m; sleep 1000 & echo job=$!; trap '' HUP; wait";
    let t = open(p, &["bash", "--norc", "--noprofile", "-c", script]).await;
    let leader = pid_of(t.as_ref());
    let (text, _) =
        read_until(t.as_ref(), |s| s.split("job=").nth(1).is_some_and(|r| r.contains('\n'))).await;
    let job = number_after(&text, "job=");
    drop(t);
    within("shutdown", p.shutdown()).await;
    assert!(not_a_zombie(leader), "leader reaped");
    await_gone("the background job", job).await;
    Ok(())
}

/// Spawns `a`, waits until its leader is parked in syscall `nr`, then checks that the probe
/// never reports a stdin wait: the wait is real but not on the terminal.
async fn assert_probe_misses(p: &dyn Subprocess, a: &[&str], nr: &str) {
    let t = open(p, a).await;
    let pid = pid_of(t.as_ref());
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    let parked =
        eventually(|| async { syscall_line(pid).split_whitespace().next() == Some(nr) }).await;
    assert!(parked, "{a:?} parks in syscall {nr} (saw {})", syscall_line(pid));
    for _ in 0..10 {
        let s = stdin(t.as_ref()).await;
        assert_eq!(s, StdinWait::NotWaiting, "{a:?}: {} is not a tty wait", syscall_line(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_and_reap(t.as_ref()).await;
}

pub async fn probe_misses_waits_on_other_fds(p: &dyn Subprocess) -> Outcome {
    probing(p)?;
    python(p).await?;
    if !cfg!(target_arch = "x86_64") {
        return skip("the oracle knows x86_64 syscall numbers only");
    }
    let pre = "import os,select; r,w=os.pipe(); print('ready', flush=True); ";
    let cases = [
        (format!("{pre}os.read(r, 1)"), "0"),
        (format!("{pre}p=select.poll(); p.register(r, select.POLLIN); p.poll()"), "7"),
        (format!("{pre}p=select.poll(); p.register(0, select.POLLPRI); p.poll()"), "7"),
        (format!("{pre}select.select([r],[],[])"), "270"),
        (format!("{pre}e=select.epoll(); e.register(r, select.EPOLLIN); e.poll()"), "232"),
        (format!("{pre}os.dup2(r, 0); os.read(0, 1)"), "0"),
    ];
    for (code, nr) in &cases {
        assert_probe_misses(p, &["python3", "-c", code], nr).await;
    }
    Ok(())
}

/// Skips without terminals or without the setsid utility.
async fn terminals_and_setsid(p: &dyn Subprocess) -> Outcome {
    terminals(p)?;
    if p.which("setsid").await.expect("which answers").is_some() {
        Ok(())
    } else {
        skip("needs the setsid utility")
    }
}

pub async fn terminate_stops_what_detached_while_the_leader_runs(p: &dyn Subprocess) -> Outcome {
    terminals_and_setsid(p).await?;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("setsid"), dir.path().join("nohup"));
    // Double forks: the subshells exit at once, so neither process is a descendant of the
    // leader any more; the leader keeps forking while it is torn down.
    let script = format!(
        "({}) ; ({}) ; echo ready; while :; do sleep 1; done",
        detach("setsid", &a),
        detach("nohup", &b)
    );
    let t = open(p, &["bash", "--norc", "--noprofile", "-c", &script]).await;
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    let detached = [pid_in(&a).await, pid_in(&b).await];
    let report = within("terminate", t.terminate(Duration::from_millis(500))).await.unwrap();
    assert!(report.survivors.is_empty(), "{report:?}");
    assert!(report.leader.is_some(), "{report:?}");
    for (pid, start) in detached {
        assert!(crate::gone(pid, start), "the detached {pid} survived terminate");
    }
    Ok(())
}

pub async fn terminate_after_the_leader_exited_stops_what_it_left_detached(
    p: &dyn Subprocess,
) -> Outcome {
    terminals_and_setsid(p).await?;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // The leader waits for the pid: a session leader's exit hangs up its foreground group,
    // which the child is still in until setsid.
    let script = format!(
        "({}) ; while [ ! -s {} ]; do sleep 0.01; done; exit 3",
        detach("setsid", &pidfile),
        pidfile.display()
    );
    let t = open(p, &["sh", "-c", &script]).await;
    read_to_eof(t.as_ref()).await;
    assert_eq!(wait(t.as_ref()).await, ExitStatus::code(3));
    let (pid, start) = pid_in(&pidfile).await;
    let report = within("terminate", t.terminate(Duration::from_millis(500))).await.unwrap();
    assert_eq!(report.leader, Some(ExitStatus::code(3)));
    assert!(report.survivors.is_empty(), "{report:?}");
    assert!(crate::gone(pid, start), "the detached {pid} survived terminate");
    Ok(())
}

pub async fn shutdown_stops_what_dropped_terminals_left_detached(p: &dyn Subprocess) -> Outcome {
    terminals_and_setsid(p).await?;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("({}) ; echo ready; exec sleep 1000", detach("setsid", &pidfile));
    let t = open(p, &["sh", "-c", &script]).await;
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    let (pid, start) = pid_in(&pidfile).await;
    drop(t);
    within("shutdown", p.shutdown()).await;
    crate::await_gone("the detached process to be stopped by shutdown", pid, start).await;
    Ok(())
}
