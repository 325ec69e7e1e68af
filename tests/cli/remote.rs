//! The real `conch sandboxd` binary on 127.0.0.1 driven by the real `conch` CLI through the
//! `remote-sandbox` and `remote-terminal` compositions, as docs/remote.md shows it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::{conch, pid_gone};

/// Everything here waits on events (lines, EOF, exit) bounded by this.
const LIMIT: Duration = Duration::from_secs(60);

/// A running `conch sandboxd`, killed when dropped (even when the test failed).
pub(crate) struct Daemon {
    child: Child,
    addr: String,
    pub(crate) token: String,
    token_file: PathBuf,
    /// Everything the daemon wrote to stderr so far, and a signal for each new line.
    stderr: Arc<(Mutex<String>, Condvar)>,
    /// Fires once the daemon's stderr reached EOF (it exited).
    stderr_closed: mpsc::Receiver<()>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts the daemon on an ephemeral loopback port with a token file and debug logging,
    /// and returns once its first stderr line named the address.
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token = format!("tok-{}-{}", std::process::id(), "s3cr3t-never-logged-0123456789");
        std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
        Self::spawn("127.0.0.1:0", dir, token)
    }

    /// A daemon on `listen` with the token file in `dir`, hosting `standard` with its
    /// `files-local` rooted in `dir/files`, so the remote compositions' `files-remote` works.
    fn spawn(listen: &str, dir: tempfile::TempDir, token: String) -> Self {
        let token_file = dir.path().join("token");
        let composition = dir.path().join("daemon.yaml");
        let standard = conch::EMBEDDED.iter().find(|(n, _)| *n == "standard").unwrap().1;
        let root = dir.path().join("files");
        std::fs::create_dir_all(&root).unwrap();
        assert!(standard.contains("\n  files-local: {}\n"), "standard binds files-local");
        let yaml = standard.replace(
            "\n  files-local: {}\n",
            &format!("\n  files-local:\n    root: {}\n", root.display()),
        );
        std::fs::write(&composition, yaml).unwrap();
        let mut child = conch()
            .arg("--composition")
            .arg(&composition)
            .args(["sandboxd", "--listen", listen, "--token-file"])
            .arg(&token_file)
            .env("CONCH_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new((Mutex::new(String::new()), Condvar::new()));
        let (first_tx, first_rx) = mpsc::channel();
        let (closed_tx, stderr_closed) = mpsc::channel();
        {
            let pipe = child.stderr.take().unwrap();
            let stderr = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut lines = BufReader::new(pipe);
                let mut first = true;
                loop {
                    let mut line = String::new();
                    match lines.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if first {
                        let _ = first_tx.send(line.clone());
                        first = false;
                    }
                    stderr.0.lock().unwrap().push_str(&line);
                    stderr.1.notify_all();
                }
                let _ = closed_tx.send(());
            });
        }
        let mut daemon = Self {
            child,
            addr: String::new(),
            token,
            token_file,
            stderr,
            stderr_closed,
            _dir: dir,
        };
        let first = first_rx.recv_timeout(LIMIT).expect("the daemon's first stderr line");
        daemon.addr = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("first line names the address: {first:?}"))
            .to_owned();
        daemon
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The overrides that point a remote composition at this daemon.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CONCH_PLUGINS__REMOTE_SANDBOX__URL".into(), self.url()),
            (
                "CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN_FILE".into(),
                self.token_file.display().to_string(),
            ),
        ]
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.0.lock().unwrap().clone()
    }

    /// The daemon's stderr once it holds `needle`: its reader thread reads the pipe on its own
    /// schedule, and a line the daemon wrote before a client finished may not be read yet.
    /// Panics with what it holds when the line has not come within `LIMIT`.
    pub(crate) fn stderr_with(&self, needle: &str) -> String {
        let (text, line) = &*self.stderr;
        let held = line
            .wait_timeout_while(text.lock().unwrap(), LIMIT, |t| !t.contains(needle))
            .unwrap()
            .0;
        assert!(held.contains(needle), "no {needle:?} in the daemon's stderr:\n{held}");
        held.clone()
    }

    /// SIGKILL: the daemon dies on the spot (a crash, the OOM killer), with no teardown;
    /// what it ran is left behind. Returns once it exited.
    fn kill9(&mut self) {
        let status =
            Command::new("kill").args(["-KILL", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        self.stderr_closed.recv_timeout(LIMIT).expect("the daemon exits after SIGKILL");
        self.child.wait().unwrap();
    }

    /// A new daemon on this (killed) one's address with the same token: a restart, so the
    /// same URL with a new boot id.
    fn restart(mut self) -> Self {
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().unwrap());
        Self::spawn(&self.addr, dir, self.token.clone())
    }

    /// SIGTERM, then waits for the daemon to close its stderr and exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let status =
            Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        self.stderr_closed.recv_timeout(LIMIT).expect("the daemon exits after SIGTERM");
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `conch batch` whose stdin stays open: lines are sent and answers read one by one.
struct Batch {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Batch {
    fn start(composition: &str, env: &[(String, String)]) -> Self {
        let mut child = conch()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(["--composition", composition, "batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, lines }
    }

    fn call(&mut self, line: &str) -> serde_json::Value {
        self.send(line);
        self.answer()
    }

    /// Sends a line without waiting for its answer.
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next answer line.
    fn answer(&mut self) -> serde_json::Value {
        let answer = self.lines.recv_timeout(LIMIT).expect("an answer line");
        serde_json::from_str(&answer).unwrap()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `lines` through `conch batch` to the end and returns the answers.
fn batch(composition: &str, env: &[(String, String)], lines: &[String]) -> Vec<serde_json::Value> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    super::batch_text(composition, &env, &lines)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn call(tool: &str, args: serde_json::Value) -> String {
    serde_json::json!({"tool": tool, "args": args}).to_string()
}

/// The fields of one answer that must not depend on where the process ran.
fn meaning(v: &serde_json::Value) -> serde_json::Value {
    let s = &v["structured"];
    serde_json::json!({
        "ok": v["ok"],
        "error": v["error"]["code"],
        "exit_code": s["exit_code"],
        "status": s["status"],
        "output": s["output"],
        "detail": s["detail"],
        "job_id": s["job_id"],
        "session_id": s["session_id"],
        "name": s["name"],
        "wait_reason": s["wait_reason"],
        "session_status": s["session_status"],
        "survivors": s["survivors"],
    })
}

#[test]
fn remote_batches_answer_as_the_local_ones_do() {
    let daemon = Daemon::start();
    let env = daemon.env();
    let oneshot = [
        call("bash", serde_json::json!({"command": "uname -a"})),
        call("bash", serde_json::json!({"command": "echo hello; echo oops >&2; exit 3"})),
        call("bash", serde_json::json!({"command": "cd /tmp && pwd"})),
        call(
            "bash",
            serde_json::json!({"command": "sleep 0.2; echo bg-done", "run_in_background": true}),
        ),
        call(
            "job_output",
            serde_json::json!({"job_id": "bash-1", "wait": true, "timeout_ms": 30000}),
        ),
        call("bash", serde_json::json!({"command": "sleep 1000", "run_in_background": true})),
        call("job_kill", serde_json::json!({"job_id": "bash-2"})),
        call(
            "job_output",
            serde_json::json!({"job_id": "bash-2", "wait": true, "timeout_ms": 30000}),
        ),
    ];
    let local = batch("standard", &[], &oneshot);
    let remote = batch("remote-sandbox", &env, &oneshot);
    assert_eq!(local.len(), oneshot.len(), "{local:#?}");
    assert_eq!(remote.len(), oneshot.len(), "{remote:#?}");
    for (i, (l, r)) in local.iter().zip(&remote).enumerate() {
        if i == 6 {
            // job_kill answers once the kill was delivered, with the job's state then: still
            // running, or already settled (killed). Which one depends on timing on either
            // side (remote delivery is a round trip); the settled state is call 7's.
            for answer in [l, r] {
                let s = &answer["structured"];
                let valid = (s["result"] == "cancellation requested" && s["status"] == "running")
                    || (s["result"] == "job has settled" && s["status"] == "killed");
                assert!(valid, "call 6: {answer:#?}");
            }
            continue;
        }
        assert_eq!(meaning(r), meaning(l), "call {i}: remote {r:#?}\nlocal {l:#?}");
    }
    // The one-shot texts are the command's output, byte for byte.
    for i in 0..3 {
        assert_eq!(remote[i]["text"], local[i]["text"], "call {i}");
    }
    assert_eq!(remote[1]["text"], "hello\noops\n[exit code: 3]", "{:?}", remote[1]);
    assert_eq!(remote[4]["structured"]["output"], "bg-done\n");
    assert_eq!(remote[7]["structured"]["status"], "killed", "{:?}", remote[7]);

    let terminal = [
        call("terminal_open", serde_json::json!({"name": "main"})),
        call(
            "terminal_send",
            serde_json::json!({"session_id": "pty-1", "text": "cd /tmp; export A=kept"}),
        ),
        call(
            "terminal_send",
            serde_json::json!({"session_id": "pty-1", "text": "read -p 'name? ' n"}),
        ),
        call("terminal_send", serde_json::json!({"session_id": "pty-1", "text": "conch"})),
        call(
            "terminal_send",
            serde_json::json!({"session_id": "pty-1", "text": "echo $n $A $PWD"}),
        ),
        call("terminal_close", serde_json::json!({"session_id": "pty-1"})),
    ];
    let local = batch("terminal", &[], &terminal);
    let remote = batch("remote-terminal", &env, &terminal);
    assert_eq!(remote.len(), terminal.len(), "{remote:#?}");
    for (i, (l, r)) in local.iter().zip(&remote).enumerate() {
        assert_eq!(meaning(r), meaning(l), "call {i}: remote {r:#?}\nlocal {l:#?}");
    }
    for (i, r) in remote.iter().enumerate().take(5).skip(1) {
        assert_eq!(r["structured"]["wait_reason"], "stdin_read", "call {i}: {r:?}");
    }
    assert!(remote[2]["structured"]["output"].as_str().unwrap().contains("name? "));
    assert!(
        remote[4]["structured"]["output"].as_str().unwrap().contains("conch kept /tmp"),
        "{:?}",
        remote[4]
    );
    assert_eq!(remote[5]["structured"]["survivors"], serde_json::json!([]), "{:?}", remote[5]);
}

#[test]
fn a_wrong_token_fails_the_cli_as_unauthenticated_and_no_token_is_logged() {
    let daemon = Daemon::start();
    let out = conch()
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", daemon.url())
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN", "not-the-token-at-all-0000")
        .args(["--composition", "remote-sandbox", "call", "bash", r#"{"command":"echo no"}"#])
        .output()
        .unwrap();
    // Regression: a runtime that failed to build printed `error: ...` without its code.
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error[unauthenticated]: "), "{err}");
    assert!(err.contains("wrong or missing token"), "{err}");
    assert!(err.contains("the bearer token is wrong"), "the daemon's reason: {err}");
    assert!(err.contains("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN"), "{err}");
    assert!(!err.contains("not-the-token-at-all"), "the given token is not echoed: {err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("no"), "nothing ran");

    // The right token, given as the variable, works; the daemon, at debug level, logs the
    // connection but never the token.
    let out = conch()
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", daemon.url())
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN", &daemon.token)
        .args(["--composition", "remote-sandbox", "call", "bash", r#"{"command":"echo yes"}"#])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "yes\n");
    let log = daemon.stderr_with("stream connection open");
    assert!(log.contains("DEBUG"), "debug logging is on: {log}");
    assert!(!log.contains(&daemon.token), "the token leaked into the daemon's log:\n{log}");
    assert!(!log.contains("s3cr3t"), "part of the token leaked:\n{log}");
}

/// Both sides at debug: the client logs its tool call and the spawn it asked for, the daemon
/// the spawn it ran; neither logs the token or the managed environment the spawn carried.
#[test]
fn client_and_daemon_debug_logs_show_the_spawn_and_no_token_or_managed_value() {
    let daemon = Daemon::start();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let home = format!("/tmp/conch-home-{}-{nanos}", std::process::id());
    let out = conch()
        .envs(daemon.env().iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("CONCH_LOG", "debug")
        .env("CONCH_HOME", &home)
        .args([
            "--composition",
            "remote-sandbox",
            "call",
            "bash",
            r#"{"command":"echo $CONCH_HOME"}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{home}\n"), "the value was live");
    let client = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(client.contains("tool_call{tool=\"bash\"}"), "{client}");
    assert!(client.contains("spawn{program=\"bash\" remote=true pid="), "{client}");
    // The daemon's log is read once it has written the spawn (the call returned first).
    let log = daemon.stderr_with("spawn{program=\"bash\" pid=");
    for (side, text) in [("client", &client), ("daemon", &log)] {
        assert!(!text.contains(&daemon.token), "the token leaked into the {side}'s log:\n{text}");
        assert!(!text.contains("s3cr3t"), "part of the token leaked into the {side}'s log");
        assert!(!text.contains(&home), "CONCH_HOME leaked into the {side}'s log:\n{text}");
    }
}

#[test]
fn sigterm_stops_the_daemon_and_what_it_still_runs() {
    let mut daemon = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut env = daemon.env();
    // The client outlives the daemon here; its own teardown should not wait 30 s for it.
    env.push(("CONCH_PLUGINS__REMOTE_SANDBOX__GIVE_UP_MS".into(), "2000".into()));
    let mut client = Batch::start("remote-sandbox", &env);
    let started = client.call(&call(
        "bash",
        serde_json::json!({
            "command": format!("echo $BASHPID > {}; exec sleep 1000", pidfile.display()),
            "run_in_background": true,
        }),
    ));
    assert_eq!(started["structured"]["job_id"], "bash-1", "{started:?}");
    // Waits in the sandbox until the job wrote its pid.
    let f = pidfile.display();
    let waited = client.call(&call(
        "bash",
        serde_json::json!({"command": format!("while [ ! -s {f} ]; do sleep 0.01; done; cat {f}")}),
    ));
    let pid: u64 = waited["text"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a pid: {waited:?}\n{}", daemon.stderr()));
    assert!(!pid_gone(pid), "the background sleep {pid} runs");
    let status = daemon.terminate();
    assert!(status.success(), "the daemon exits 0 on SIGTERM: {status:?}\n{}", daemon.stderr());
    assert!(pid_gone(pid), "the daemon left {pid} running");
    let log = daemon.stderr();
    assert!(log.contains("shutting down: stopping every process"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    drop(client);
}

/// Asserts `answer` is the error of a daemon that is gone or was replaced: `remote_unavailable`
/// (or, for a terminal session that lost its world, `connection_failed`) with a reason that
/// says so, and not retryable: nothing can succeed before the runtime is rebuilt.
fn expect_world_gone(what: &str, answer: &serde_json::Value, reasons: &[&str]) {
    assert_eq!(answer["ok"], false, "{what}: {answer:?}");
    let e = &answer["error"];
    assert!(
        ["remote_unavailable", "connection_failed"].contains(&e["code"].as_str().unwrap_or("")),
        "{what}: {answer:?}"
    );
    assert!(reasons.contains(&e["reason"].as_str().unwrap_or("")), "{what}: {answer:?}");
    assert_eq!(e["retryable"], false, "{what}: {answer:?}");
}

/// Kills (SIGKILL) a process group this test left behind on purpose.
fn kill_group(pgid: u64) {
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
}

/// `kill -9` of the daemon while a foreground `sleep 30` runs and a background job waits:
/// the running call, the next call and the job all end as `remote_unavailable` with reason
/// `REMOTE_GONE`, not retryable, and the job is `lost`. `give_up_ms` is ten minutes, far
/// beyond the 60 s an answer is awaited here, so only the refused reconnects can have ended
/// the call: the reason proves it. (The call used to fail after `give_up_ms`, retryable, and
/// the job settled `killed` with the reason only in its text.)
#[test]
fn a_killed_daemon_is_known_gone_for_the_running_call_the_next_one_and_the_job() {
    let mut daemon = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("started");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let bg_pid = dir.path().join("bg");
    let mut env = daemon.env();
    env.push(("CONCH_PLUGINS__REMOTE_SANDBOX__GIVE_UP_MS".into(), "600000".into()));
    let mut client = Batch::start("remote-sandbox", &env);
    let started = client.call(&call(
        "bash",
        serde_json::json!({
            "command": format!("echo $$ > {}; exec sleep 1000", bg_pid.display()),
            "run_in_background": true,
        }),
    ));
    assert_eq!(started["structured"]["job_id"], "bash-1", "{started:?}");
    // The foreground call says (through the fifo, which blocks it until this side reads)
    // that it runs, then sleeps.
    let (bg, f) = (bg_pid.display(), fifo.display());
    client.send(&call(
        "bash",
        serde_json::json!({
            "command": format!(
                "while [ ! -s {bg} ]; do sleep 0.01; done; echo $BASHPID $(cat {bg}) > {f}; sleep 30"
            ),
        }),
    ));
    let (tx, rx) = mpsc::channel();
    let reader = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read_to_string(reader));
    });
    let pids = rx.recv_timeout(LIMIT).expect("the call runs").unwrap();
    let pids: Vec<u64> = pids.split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{pids:?}");

    daemon.kill9();
    let running = client.answer();
    expect_world_gone("the running call", &running, &["REMOTE_GONE"]);
    let msg = running["error"]["message"].as_str().unwrap();
    assert!(msg.contains("is gone") && msg.contains("refused"), "{msg}");
    let next = client.call(&call("bash", serde_json::json!({"command": "echo again"})));
    expect_world_gone("the next call", &next, &["REMOTE_GONE"]);

    // The job settles when its own stream learns the world is gone, which may come just
    // after the calls did: its output is awaited, then the list agrees.
    let wait = serde_json::json!({"job_id": "bash-1", "wait": true});
    let output = client.call(&call("job_output", wait));
    assert_eq!(output["structured"]["status"], "lost", "{output:?}");
    let detail = output["structured"]["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("remote_unavailable: REMOTE_GONE: "), "{output:?}");
    assert!(output["text"].as_str().unwrap().starts_with("[job bash-1: lost; "), "{output:?}");
    let listed = client.call(&call("job_list", serde_json::json!({})));
    let jobs = listed["structured"]["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(jobs.len(), 1, "{listed:?}");
    assert_eq!(jobs[0]["status"], "lost", "{listed:?}");

    drop(client);
    for pid in pids {
        kill_group(pid);
    }
}

/// A daemon that restarts (same URL, new boot id) under an open terminal session: opening
/// another fails `BOOT_CHANGED`, not retryable, the session's next send fails not retryable
/// either (typing into a lost world could run the command twice), and `terminal_list`
/// shows the session `lost` instead of `running`.
#[test]
fn a_restarted_daemon_leaves_the_terminal_session_lost_and_errors_not_retryable() {
    let mut daemon = Daemon::start();
    let mut client = Batch::start("remote-terminal", &daemon.env());
    let opened = client.call(&call("terminal_open", serde_json::json!({"name": "main"})));
    assert_eq!(opened["structured"]["session_id"], "pty-1", "{opened:?}");
    let shell = client.call(&call(
        "terminal_send",
        serde_json::json!({"session_id": "pty-1", "text": "echo shell=$$"}),
    ));
    let out = shell["structured"]["output"].as_str().unwrap_or_default().to_owned();
    let shell_pid: u64 = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("shell="))
        .find_map(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the shell's pid: {shell:?}"));

    daemon.kill9();
    let daemon = daemon.restart();
    let another = client.call(&call("terminal_open", serde_json::json!({"name": "other"})));
    expect_world_gone("opening another session", &another, &["BOOT_CHANGED"]);
    let send = client.call(&call(
        "terminal_send",
        serde_json::json!({"session_id": "pty-1", "text": "echo again"}),
    ));
    expect_world_gone("a send to the lost session", &send, &["BOOT_CHANGED", "REMOTE_GONE"]);
    let listed = client.call(&call("terminal_list", serde_json::json!({})));
    let sessions = listed["structured"]["sessions"].as_array().cloned().unwrap_or_default();
    assert_eq!(sessions.len(), 1, "{listed:?}");
    assert_eq!(sessions[0]["status"]["state"], "lost", "{listed:?}");
    assert_eq!(sessions[0]["status"]["code"], "remote_unavailable", "{listed:?}");

    drop(client);
    drop(daemon);
    kill_group(shell_pid);
}

#[test]
fn sandboxd_help_describes_the_daemon_and_not_the_benchmarks() {
    // Regression: the `bench` doc comment had slid onto `sandboxd`.
    let out = conch().args(["sandboxd", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.starts_with("Serve this composition's subprocess provider"), "{help}");
    assert!(!help.contains("Benchmarks"), "{help}");
    // Regression: the help said the token was required off loopback only, while the daemon
    // refuses to start without one on loopback too unless told --insecure-no-auth.
    assert!(help.contains("required on every address, loopback too"), "{help}");
    assert!(!help.contains("required off loopback"), "{help}");
    let dir = tempfile::tempdir().unwrap();
    let out = conch()
        .args(["sandboxd", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "no token and no --insecure-no-auth: refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token-file") && err.contains("--insecure-no-auth"), "{err}");
    let out = conch().args(["bench", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Benchmarks"));
}

/// A terminal send cut to its `max_output_bytes` names a spill that holds all of its output,
/// through the tool as through the backend, in a local terminal and over `remote-terminal`
/// (where the spill is on the daemon). The tool's own cap once dropped the note that names it.
#[test]
fn a_cut_terminal_send_names_a_spill_holding_all_of_it_locally_and_on_the_daemon() {
    let daemon = Daemon::start();
    let lines = [
        call("terminal_open", serde_json::json!({"name": "main"})),
        call(
            "terminal_send",
            serde_json::json!({"session_id": "pty-1", "text": "seq 1 30000", "max_output_bytes": 4096}),
        ),
        call("terminal_close", serde_json::json!({"session_id": "pty-1"})),
    ];
    for (composition, env) in [("terminal", Vec::new()), ("remote-terminal", daemon.env())] {
        let out = batch(composition, &env, &lines);
        let text = out[1]["text"].as_str().unwrap_or_else(|| panic!("{composition}: {:?}", out[1]));
        let first = text.lines().next().unwrap_or_default();
        let path = first
            .strip_prefix("[earlier output omitted; full output: ")
            .and_then(|p| p.strip_suffix(']'))
            .unwrap_or_else(|| panic!("{composition}: the note names a spill: {first:?}"));
        // The daemon runs on this machine, so its world's paths are readable here.
        let whole = std::fs::read_to_string(path).expect("the spill is readable");
        let numbers: String = (1..=30_000).map(|i| format!("{i}\n")).collect();
        assert!(whole.contains(&numbers), "{composition}: all of it is in the spill");
        let output = out[1]["structured"]["output"].as_str().unwrap();
        assert!(output.starts_with(first), "{composition}: the structured output has the note");
        assert!(output.len() <= 4096 + first.len() + 1, "{composition}: capped: {}", output.len());
        assert!(output.contains("29999\n30000\n"), "{composition}: the newest output is kept");
    }
}
