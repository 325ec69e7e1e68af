//! Real PTY tests for `subprocess-local`: real processes on real pseudo-terminals, waiting
//! on events (output, exit, probe) with generous deadlines instead of fixed sleeps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_seams::{
    ErrorCode, ExitStatus, Subprocess, TerminalProcess, TerminalSize, TerminalSpawnSpec,
};

/// Upper bound for anything a test waits on; generous for loaded CI machines.
const DEADLINE: Duration = Duration::from_secs(10);

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn tmp() -> PathBuf {
    std::env::temp_dir()
}

fn provider() -> LocalSubprocess {
    LocalSubprocess::new(LocalConfig::default())
}

async fn open(p: &LocalSubprocess, a: &[&str]) -> Arc<dyn TerminalProcess> {
    p.spawn_terminal(TerminalSpawnSpec::new(argv(a), tmp())).await.expect("spawn_terminal")
}

/// Reads until `pred` holds for the accumulated text, EOF, or the deadline.
async fn read_until(t: &dyn TerminalProcess, pred: impl Fn(&str) -> bool) -> (String, bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut out = Vec::new();
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if pred(&text) {
            return (text, false);
        }
        match tokio::time::timeout_at(deadline, t.read_chunk()).await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            Ok(None) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Err(_) => panic!("deadline waiting for output; got {text:?}"),
        }
    }
}

/// Reads everything up to EOF.
async fn read_to_eof(t: &dyn TerminalProcess) -> String {
    let (text, eof) = read_until(t, |_| false).await;
    assert!(eof);
    text
}

async fn wait(t: &dyn TerminalProcess) -> ExitStatus {
    tokio::time::timeout(DEADLINE, t.wait()).await.expect("terminal exits in time")
}

/// Polls `f` until it holds or the deadline passes.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn pid_of(t: &dyn TerminalProcess) -> i32 {
    i32::try_from(t.pid().expect("pid")).unwrap()
}

/// True when `pid` no longer names a process, or names one that is not a zombie.
fn not_a_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            rest.split_whitespace().next() != Some("Z")
        }
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned()
}

fn syscall_line(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default().trim().to_owned()
}

async fn kill_and_reap(t: &dyn TerminalProcess) -> ExitStatus {
    t.signal_group(pid_of(t), libc_sigkill()).expect("kill the leader's group");
    wait(t).await
}

fn libc_sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities_report_terminals() {
    assert!(provider().capabilities().terminals);
}

#[tokio::test(flavor = "multi_thread")]
async fn output_then_eof_then_exit_code_without_zombie() {
    let p = provider();
    let t = open(&p, &["/bin/sh", "-c", "echo hello; exit 3"]).await;
    let pid = pid_of(t.as_ref());
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains("hello"), "{text:?}");
    let status = wait(t.as_ref()).await;
    assert_eq!(status, ExitStatus { code: Some(3), signal: None });
    assert_eq!(t.try_status(), Some(status));
    assert!(not_a_zombie(pid), "the leader was reaped");
    // After EOF every further read is EOF too.
    assert_eq!(t.read_chunk().await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_cwd_is_spawn_failed() {
    let p = provider();
    let err = p
        .spawn_terminal(TerminalSpawnSpec::new(argv(&["sh"]), "/nonexistent/conch-no-dir"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("/nonexistent/conch-no-dir"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_program_is_spawn_failed() {
    let p = provider();
    let err = p
        .spawn_terminal(TerminalSpawnSpec::new(argv(&["conch-no-such-program-xyz"]), tmp()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("command not found"), "{err}");
    let err = p
        .spawn_terminal(TerminalSpawnSpec::new(argv(&["./conch-no-such-program-xyz"]), tmp()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_argv_is_invalid_argument() {
    let p = provider();
    let err = p.spawn_terminal(TerminalSpawnSpec::new(Vec::new(), tmp())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn overlay_is_applied_after_the_scrub() {
    let p = provider();
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
}

#[tokio::test(flavor = "multi_thread")]
async fn child_env_is_exactly_the_scrubbed_map() {
    let p = provider();
    let t = open(&p, &["env", "-0"]).await;
    let text = read_to_eof(t.as_ref()).await;
    assert!(wait(t.as_ref()).await.success());
    let mut names: Vec<&str> = text
        .split('\0')
        .filter_map(|entry| entry.trim_start_matches(['\r', '\n']).split_once('='))
        .map(|(k, _)| k)
        .collect();
    names.sort_unstable();
    names.dedup();
    let expected = conch_env::child_env(&Default::default());
    for name in &names {
        assert!(!conch_env::is_scrubbed(name), "{name} must be scrubbed");
        // portable-pty always exports SHELL; everything else comes from the scrubbed map.
        assert!(*name == "SHELL" || expected.contains_key(*name), "unexpected {name}");
    }
    for name in expected.keys() {
        assert!(names.contains(&name.as_str()), "{name} missing from the child env");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cwd_is_honoured() {
    let p = provider();
    let dir = std::env::temp_dir().join(format!("conch-pty-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let t = p.spawn_terminal(TerminalSpawnSpec::new(argv(&["pwd"]), &dir)).await.unwrap();
    let text = read_to_eof(t.as_ref()).await;
    assert!(text.contains(dir.to_str().unwrap()), "{text:?}");
    wait(t.as_ref()).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn initial_size_and_resize_reach_the_tty() {
    let p = provider();
    let mut spec = TerminalSpawnSpec::new(
        argv(&["sh", "-c", "stty size; echo ready; read x; stty size"]),
        tmp(),
    );
    spec.size = TerminalSize { rows: 30, cols: 90 };
    let t = p.spawn_terminal(spec).await.unwrap();
    let (text, _) = read_until(t.as_ref(), |s| s.contains("ready")).await;
    assert!(text.contains("30 90"), "{text:?}");
    t.resize(TerminalSize { rows: 40, cols: 100 }).unwrap();
    t.write(b"\n").await.unwrap();
    let (text, _) = read_until(t.as_ref(), |s| s.contains("40 100")).await;
    assert!(text.contains("40 100"), "{text:?}");
    assert!(wait(t.as_ref()).await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn write_then_read_roundtrip_with_cat() {
    let p = provider();
    let t = open(&p, &["cat"]).await;
    t.write(b"abc\n").await.unwrap();
    // The line discipline echoes the input and cat prints it back: "abc" twice.
    let (text, eof) = read_until(t.as_ref(), |s| s.matches("abc").count() >= 2).await;
    assert!(!eof && text.matches("abc").count() >= 2, "{text:?}");
    // ^D on an empty line is EOF for cat.
    t.write(&[4]).await.unwrap();
    read_to_eof(t.as_ref()).await;
    assert!(wait(t.as_ref()).await.success());
}

/// Spawns `a`, waits until the foreground group's stdin wait is seen, then kills it.
async fn assert_probe_sees_wait(a: &[&str]) {
    let p = provider();
    let t = open(&p, a).await;
    let pid = pid_of(t.as_ref());
    let seen = eventually(|| t.stdin_wait_probe()).await;
    let fg = t.foreground_pgid();
    println!("{a:?}: pid {pid} fg {fg:?} comm {} syscall {}", comm(pid), syscall_line(pid));
    assert!(seen, "{a:?} waits on stdin (syscall {})", syscall_line(pid));
    assert_eq!(fg, Some(pid), "the leader owns the foreground");
    let status = kill_and_reap(t.as_ref()).await;
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_python_input_read() {
    assert_probe_sees_wait(&["python3", "-c", "input()"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_python_select() {
    assert_probe_sees_wait(&[
        "python3",
        "-c",
        "import select,sys; select.select([sys.stdin],[],[])",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_python_poll() {
    assert_probe_sees_wait(&[
        "python3",
        "-c",
        "import select; p=select.poll(); p.register(0, select.POLLIN); p.poll()",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_python_epoll() {
    assert_probe_sees_wait(&[
        "python3",
        "-c",
        "import select; e=select.epoll(); e.register(0, select.EPOLLIN); e.poll()",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_a_worker_thread_reading() {
    // The main thread parks in futex; only the worker task is in read(0).
    assert_probe_sees_wait(&[
        "python3",
        "-c",
        "import threading,sys; t=threading.Thread(target=sys.stdin.readline); t.start(); t.join()",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_sees_interactive_bash_prompt() {
    assert_probe_sees_wait(&["bash", "--norc", "--noprofile", "-i"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_follows_the_foreground_job() {
    // Bash at its prompt waits on the tty; once `sleep` owns the foreground, nothing in
    // the foreground group reads it.
    let p = provider();
    let t = open(&p, &["bash", "--norc", "--noprofile", "-i"]).await;
    let bash = pid_of(t.as_ref());
    assert!(eventually(|| t.stdin_wait_probe()).await, "bash prompt is a stdin wait");
    t.write(b"sleep 30\n").await.unwrap();
    assert!(
        eventually(|| t.foreground_pgid().is_some_and(|g| g != bash && comm(g) == "sleep")).await,
        "sleep takes the foreground"
    );
    for _ in 0..10 {
        assert!(!t.stdin_wait_probe(), "sleep does not wait on stdin");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.shutdown().await;
    assert!(t.try_status().is_some(), "shutdown reaped bash");
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_is_false_for_sleep_and_group_kill_reports_signal() {
    let p = provider();
    let t = open(&p, &["sh", "-c", "echo started; exec sleep 30"]).await;
    let pid = pid_of(t.as_ref());
    read_until(t.as_ref(), |s| s.contains("started")).await;
    assert!(eventually(|| comm(pid) == "sleep" && t.foreground_pgid() == Some(pid)).await);
    for _ in 0..10 {
        assert!(!t.stdin_wait_probe(), "sleep never waits on stdin ({})", syscall_line(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = kill_and_reap(t.as_ref()).await;
    assert_eq!(status, ExitStatus { code: None, signal: Some("SIGKILL".into()) });
    assert!(not_a_zombie(pid));
}

#[tokio::test(flavor = "multi_thread")]
async fn signal_group_rejects_foreign_and_missing_groups() {
    let p = provider();
    let t = open(&p, &["sleep", "30"]).await;
    // No pid ever reaches this value (pid_max is at most 2^22).
    let err = t.signal_group(2_000_000_000, libc_sigkill()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    // Our own group exists but is not in the terminal's session.
    let ours = nix::unistd::getpgrp().as_raw();
    let err = t.signal_group(ours, 0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let err = t.signal_group(0, libc_sigkill()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    let err = t.signal_group(pid_of(t.as_ref()), 9999).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    // Signal 0 is an existence check on a real group.
    t.signal_group(pid_of(t.as_ref()), 0).unwrap();
    let status = kill_and_reap(t.as_ref()).await;
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"));
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_kills_live_terminals() {
    let p = provider();
    let t = open(&p, &["sleep", "1000"]).await;
    let pid = pid_of(t.as_ref());
    tokio::time::timeout(DEADLINE, p.shutdown()).await.expect("shutdown in time");
    let status = wait(t.as_ref()).await;
    assert!(!status.success(), "{status:?}");
    assert!(status.signal.is_some(), "{status:?}");
    assert!(not_a_zombie(pid));
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_kills_dropped_terminals_and_their_jobs() {
    let p = provider();
    // A background job in another group of the same session, and a leader that ignores HUP.
    let t = open(
        &p,
        &[
            "bash",
            "--norc",
            "--noprofile",
            "-c",
            "set -m; sleep 1000 & echo job=$!; trap '' HUP; wait",
        ],
    )
    .await;
    let leader = pid_of(t.as_ref());
    let (text, _) =
        read_until(t.as_ref(), |s| s.split("job=").nth(1).is_some_and(|r| r.contains('\n'))).await;
    let job: i32 = text
        .split("job=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("job pid");
    drop(t);
    tokio::time::timeout(DEADLINE, p.shutdown()).await.expect("shutdown in time");
    assert!(not_a_zombie(leader), "leader reaped");
    assert!(
        eventually(|| {
            std::fs::read_to_string(format!("/proc/{job}/stat")).map_or(true, |s| {
                let rest = &s[s.rfind(')').unwrap() + 1..];
                matches!(rest.split_whitespace().next(), Some("Z" | "X"))
            })
        })
        .await,
        "background job {job} is gone"
    );
}

/// Spawns `a`, waits until its leader is parked in syscall `nr`, then checks that the
/// probe never reports a stdin wait: the wait is real but not on the terminal's fd 0.
async fn assert_probe_misses(a: &[&str], nr: &str) {
    let p = provider();
    let t = open(&p, a).await;
    let pid = pid_of(t.as_ref());
    read_until(t.as_ref(), |s| s.contains("ready")).await;
    assert!(
        eventually(|| syscall_line(pid).split_whitespace().next() == Some(nr)).await,
        "{a:?} parks in syscall {nr} (saw {})",
        syscall_line(pid)
    );
    for _ in 0..10 {
        assert!(!t.stdin_wait_probe(), "{a:?}: {} is not a tty stdin wait", syscall_line(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_and_reap(t.as_ref()).await;
}

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread")]
async fn probe_misses_waits_on_other_fds() {
    let pre = "import os,select; r,w=os.pipe(); print('ready', flush=True); ";
    let read = format!("{pre}os.read(r, 1)");
    let poll = format!("{pre}p=select.poll(); p.register(r, select.POLLIN); p.poll()");
    let poll_out = format!("{pre}p=select.poll(); p.register(0, select.POLLPRI); p.poll()");
    let select = format!("{pre}select.select([r],[],[])");
    let epoll = format!("{pre}e=select.epoll(); e.register(r, select.EPOLLIN); e.poll()");
    let pipe_stdin = format!("{pre}os.dup2(r, 0); os.read(0, 1)");
    for (code, nr) in [
        (&read, "0"),
        (&poll, "7"),
        (&poll_out, "7"),
        (&select, "270"),
        (&epoll, "232"),
        (&pipe_stdin, "0"),
    ] {
        assert_probe_misses(&["python3", "-c", code], nr).await;
    }
}
