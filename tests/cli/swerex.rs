//! The real `conch swerex-remote` on 127.0.0.1, driven over HTTP as SWE-ReX's client drives
//! it: what SWE-ReX's own suite does not cover (auth before anything runs, a session that
//! survives a timeout and an interrupt, nothing left after `/close`, a custom PS1, request-id
//! replay, confinement under a sandbox composition), and, when `CONCH_SWEREX_PYTHON` names a
//! venv with swe-rex 1.4.0, SWE-ReX's own suite (`swerex_suite_passes_against_conch`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{conch, listening_address, pid_gone};

const KEY: &str = "swerex-test-key-0123456789";
/// Every wait here is for an event (a line, a response), bounded by this.
const LIMIT: Duration = Duration::from_secs(60);

/// A running `conch swerex-remote`, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        Self::start_in(conch(), extra)
    }

    /// `command` (a `conch` command with its directory set) serving the API.
    fn start_in(command: Command, extra: &[&str]) -> Self {
        Self::spawn(command, extra, true)
    }

    /// `command` (`conch` with its directory set, or conch under the name `swerex-remote`)
    /// serving the API; `subcommand` types `swerex-remote` after `extra`.
    fn spawn(mut command: Command, extra: &[&str], subcommand: bool) -> Self {
        command.args(extra);
        if subcommand {
            command.arg("swerex-remote");
        }
        let mut child = command
            .args(["--host", "127.0.0.1", "--port", "0", "--auth-token", KEY])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn conch swerex-remote");
        let addr = listening_address(&mut child, "swerex-remote listening on ");
        Self { child, addr }
    }

    /// One request (`Connection: close`): the status and the body as JSON.
    fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut req =
            format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        let body = if chunked { dechunk(rest) } else { rest.to_string() };
        (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, &[("X-API-Key", KEY)], &body.to_string())
    }

    /// A request that must succeed.
    fn ok(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    /// A request that must fail with the exception `class`.
    fn raises(&self, path: &str, body: Value, class: &str) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 511, "{path}: {v}");
        assert_eq!(v["swerexception"]["class_path"], class, "{v}");
        v["swerexception"].clone()
    }

    fn run(&self, command: &str) -> Value {
        self.ok("/run_in_session", json!({"command": command, "action_type": "bash"}))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[test]
fn the_key_is_checked_before_anything_runs() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let body = json!({"command": format!("touch {}", marker.display()), "shell": true}).to_string();
    // Every path, known or not, with any method: no key is 403, a wrong one 401.
    for path in ["/is_alive", "/", "//execute", "/execute", "/nowhere", "/close"] {
        let (status, v) = server.call("POST", path, &[], &body);
        assert_eq!(status, 403, "{path}: {v}");
        let (status, v) = server.call("GET", path, &[("X-API-Key", "wrong")], "");
        assert_eq!(status, 401, "{path}: {v}");
    }
    let (status, _) = server.call("POST", "/execute", &[("X-API-Key", &KEY[1..])], &body);
    assert_eq!(status, 401, "a key of another length");
    assert!(!marker.exists(), "a refused request ran nothing");
    let (status, v) = server.call("POST", "/execute", &[("X-API-Key", KEY)], &body);
    assert_eq!((status, &v["exit_code"]), (200, &json!(0)), "{v}");
    assert!(marker.exists(), "the right key runs it");
}

#[test]
fn conch_named_swerex_remote_is_that_server_and_a_composition_without_sessions_is_refused() {
    // An image links the binary under swe-rex's name; SWE-ReX's deployments run it with
    // swe-rex's flags.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("swerex-remote");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_conch"), &link).unwrap();
    let server = Server::spawn(Command::new(&link), &[], false);
    let (status, v) = server.call("GET", "/", &[("X-API-Key", KEY)], "");
    assert_eq!((status, v), (200, json!({"message": "hello world"})));
    drop(server);
    let out = conch()
        .args(["--composition", "standard", "swerex-remote", "--port", "0", "--auth-token", KEY])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("binds no terminals service") && err.contains("swerex-sandbox"), "{err}");
    let out = conch()
        .args(["swerex-remote", "--host", "0.0.0.0", "--port", "0", "--auth-token", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback --host only"), "no open server without a key: {err}");
}

#[test]
fn a_session_survives_a_timeout_and_an_interrupt_with_its_state() {
    let server = Server::start(&[]);
    server.ok("/create_session", json!({}));
    server.run("cd /tmp && export KEPT=yes");
    // The deadline stops the command and says what it printed; the shell goes on.
    let e = server.raises(
        "/run_in_session",
        json!({"command": "echo started; sleep 30", "action_type": "bash", "timeout": 0.5}),
        "swerex.exceptions.CommandTimeoutError",
    );
    assert_eq!(e["extra_info"]["output"], "started\n", "{e}");
    assert_eq!(e["extra_info"]["stopped"], true, "{e}");
    let r = server.run("echo $PWD $KEPT");
    assert_eq!(r["output"], "/tmp yes\n", "{r}");
    // An interactive program that ignores Ctrl-C is killed by the interrupt.
    let r = server.ok(
        "/run_in_session",
        json!({"command": "python3 -c 'import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(\"up\", flush=True); time.sleep(60)'",
               "action_type": "bash", "is_interactive_command": true, "expect": ["up"], "timeout": 30}),
    );
    assert_eq!(r["expect_string"], "up", "{r}");
    let r = server.ok("/run_in_session", json!({"action_type": "bash_interrupt"}));
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = server.run("echo $PWD $KEPT");
    assert_eq!(r["output"], "/tmp yes\n", "the same shell: {r}");
    // A command that waits for terminal input is reported at once, not at its deadline.
    let started = std::time::Instant::now();
    let e = server.raises(
        "/run_in_session",
        json!({"command": "read -r x </dev/tty; echo got $x", "action_type": "bash", "timeout": 50}),
        "swerex.exceptions.CommandTimeoutError",
    );
    assert_eq!(e["extra_info"]["reason"], "waiting_for_input", "{e}");
    assert!(started.elapsed() < Duration::from_secs(45), "not at the deadline");
    assert_eq!(server.run("echo $KEPT")["output"], "yes\n");
}

#[test]
fn nothing_a_session_started_survives_close() {
    let server = Server::start(&[]);
    server.ok("/create_session", json!({"session": "a"}));
    server.ok("/create_session", json!({"session": "b"}));
    let pid = |session: &str, cmd: &str| -> u64 {
        let r = server.ok(
            "/run_in_session",
            json!({"command": cmd, "session": session, "action_type": "bash"}),
        );
        // An interactive shell announces the job (`[1] PID`) first, as swe-rex's does.
        let last = r["output"].as_str().unwrap().lines().last().unwrap_or_default().to_string();
        last.trim().parse().unwrap_or_else(|_| panic!("{r}"))
    };
    let bg = pid("a", "sleep 600 & echo $!");
    // `setsid` forks (its caller leads a job's group), so the sleeper writes its own pid.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pid");
    let f = file.display();
    pid(
        "b",
        &format!(
            "setsid bash -c 'echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 600' </dev/null & echo 0"
        ),
    );
    let deadline = std::time::Instant::now() + LIMIT;
    let detached: u64 = loop {
        if let Ok(t) = std::fs::read_to_string(&file) {
            break t.trim().parse().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the detached sleeper never wrote its pid");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!pid_gone(bg) && !pid_gone(detached));
    // Closing one session stops its processes and leaves the other's.
    server.ok("/close_session", json!({"session": "a"}));
    assert!(pid_gone(bg), "the closed session's background job is gone");
    assert!(!pid_gone(detached), "the other session is untouched");
    server.raises(
        "/run_in_session",
        json!({"command": "true", "session": "a", "action_type": "bash"}),
        "swerex.exceptions.SessionDoesNotExistError",
    );
    server.ok("/close", json!({}));
    assert!(pid_gone(detached), "/close stops even a detached process of a session");
    // The server goes on serving after /close, as swe-rex's does.
    server.ok("/create_session", json!({"session": "a"}));
    assert_eq!(
        server.ok(
            "/run_in_session",
            json!({"command": "echo again", "session": "a", "action_type": "bash"})
        )["output"],
        "again\n"
    );
}

#[test]
fn a_custom_prompt_or_the_marker_text_cannot_break_a_session() {
    let server = Server::start(&[]);
    server.ok("/create_session", json!({}));
    // What breaks swe-rex's own server: a PS1 of one's own (conda sets one), and output
    // holding the text its prompt is matched on.
    server.run("PS1='(base) \\u$ '; PROMPT_COMMAND='echo prompt-noise'; PS2=''");
    let r = server.run("echo SHELLPS1PREFIX; echo after");
    assert_eq!(r["output"], "SHELLPS1PREFIX\nafter\n", "{r}");
    let r = server.ok(
        "/run_in_session",
        json!({"command": "set -e; false", "action_type": "bash", "check": "silent"}),
    );
    assert_eq!(r["exit_code"], 1, "set -e does not end the shell: {r}");
    assert_eq!(server.run("echo alive")["output"], "alive\n");
    // A syntax error runs nothing.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let e = server.raises(
        "/run_in_session",
        json!({"command": format!("touch {}; (", marker.display()), "action_type": "bash"}),
        "swerex.exceptions.BashIncorrectSyntaxError",
    );
    assert!(e["extra_info"]["bash_stderr"].as_str().unwrap().contains("syntax error"), "{e}");
    assert!(!marker.exists(), "nothing ran");
    // A startup file is sourced in the session's shell (a conda activation sets a PS1 too).
    let rc = dir.path().join("rc");
    std::fs::write(&rc, "export FROM_RC=yes\nPS1='(conda) $ '\necho sourced\n").unwrap();
    let r = server.ok(
        "/create_session",
        json!({"session": "rc", "startup_source": [rc.display().to_string()]}),
    );
    assert!(r["output"].as_str().unwrap().contains("sourced"), "{r}");
    let r = server.ok(
        "/run_in_session",
        json!({"command": "echo $FROM_RC", "session": "rc", "action_type": "bash"}),
    );
    assert_eq!(r["output"], "yes\n", "{r}");
}

#[test]
fn a_resent_request_id_answers_without_running_again() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let body = json!({"command": format!("echo $$ >> {}; cat {}", log.display(), log.display()), "shell": true}).to_string();
    let headers = [("X-API-Key", KEY), ("X-Request-ID", "req-1")];
    let (s1, first) = server.call("POST", "/execute", &headers, &body);
    let (s2, again) = server.call("POST", "/execute", &headers, &body);
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first, again, "the same answer");
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "it ran once");
    let (_, other) =
        server.call("POST", "/execute", &[("X-API-Key", KEY), ("X-Request-ID", "req-2")], &body);
    assert_eq!(other["stdout"].as_str().unwrap().lines().count(), 2, "a new id runs: {other}");
    // A client that goes away mid-call, then retries with the same id (as SWE-ReX's client
    // does after a dropped connection), gets the first attempt's answer; it ran once, whole.
    let started = dir.path().join("started");
    let slow = json!({"command": format!("touch {}; sleep 0.5; echo $$ >> {}; cat {}", started.display(), log.display(), log.display()), "shell": true}).to_string();
    {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        let req = format!(
            "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nX-Request-ID: req-3\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{slow}",
            slow.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let deadline = std::time::Instant::now() + LIMIT;
        while !started.exists() {
            assert!(std::time::Instant::now() < deadline, "the first attempt never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Dropped here, with the command running.
    }
    let (status, retried) =
        server.call("POST", "/execute", &[("X-API-Key", KEY), ("X-Request-ID", "req-3")], &slow);
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["stdout"].as_str().unwrap().lines().count(), 3, "{retried}");
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3, "it ran once");
}

#[test]
fn under_a_sandbox_composition_every_endpoint_is_confined() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let target = outside.path().join("escaped");
    // The sandbox's workspace is the directory conch runs in.
    let mut command = conch();
    command.current_dir(work.path());
    let server = Server::start_in(command, &["--composition", "swerex-sandbox"]);
    let t = target.display().to_string();
    let r = server.ok("/execute", json!({"command": format!("echo x > {t}"), "shell": true}));
    assert_ne!(r["exit_code"], 0, "{r}");
    let e = server.raises(
        "/write_file",
        json!({"path": t, "content": "x"}),
        "builtins.PermissionError",
    );
    assert!(e["message"].as_str().unwrap().contains("sandbox"), "{e}");
    server.ok("/create_session", json!({}));
    let r = server.ok(
        "/run_in_session",
        json!({"command": format!("echo x > {t}"), "action_type": "bash", "check": "silent"}),
    );
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(!target.exists(), "nothing was written outside the workspace");
    // Inside the workspace all three work.
    let inside = work.path().join("in.txt").display().to_string();
    server.ok("/write_file", json!({"path": inside, "content": "a\r\nb"}));
    assert_eq!(
        server.ok("/read_file", json!({"path": inside}))["content"],
        "a\nb",
        "universal newlines"
    );
    assert_eq!(server.run(&format!("cat {inside} | wc -l"))["output"], "1\n");
}

/// SWE-ReX's own tests (from the swe-rex 1.4.0 sdist, downloaded by `.ci/run`, never
/// committed) against `conch swerex-remote`, through conch's `tests/swerex/conftest.py`.
/// Excluded by name, with the reason in docs/swerex.md: `test_interrupt_pager`.
#[test]
fn swerex_suite_passes_against_conch() {
    let (Ok(python), Ok(sdist)) =
        (std::env::var("CONCH_SWEREX_PYTHON"), std::env::var("CONCH_SWEREX_SDIST"))
    else {
        println!(
            "SKIP swerex_suite_passes_against_conch: CONCH_SWEREX_PYTHON and CONCH_SWEREX_SDIST are not set (.ci/run sets them)"
        );
        return;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let server = json!([
        env!("CARGO_BIN_EXE_conch"),
        "swerex-remote",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--auth-token",
        "{token}"
    ]);
    let out = Command::new("bash")
        .arg(root.join("tests/swerex/run.sh"))
        .args(["--deselect", "tests/test_execution.py::test_interrupt_pager"])
        .env("SWEREX_PYTHON", python)
        .env("SWEREX_SDIST_DIR", sdist)
        .env("SWEREX_SERVER", server.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run tests/swerex/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "SWE-ReX's suite failed:\n{stdout}\n{stderr}");
    // The pinned suite: every test but the excluded one passes; swe-rex's own xfail stays.
    let summary = stdout.lines().rev().find(|l| l.contains(" passed")).unwrap_or_default();
    let counts: Vec<&str> = summary.split(" in ").next().unwrap_or_default().split(", ").collect();
    assert_eq!(counts, ["52 passed", "1 deselected", "1 xfailed"], "{summary}");
}

#[test]
fn a_session_command_output_past_the_memory_cap_comes_back_whole() {
    let server = Server::start(&[]);
    server.ok("/create_session", json!({}));
    // 10.9 MB, past the 8 MiB `swerex` keeps in memory: the rest comes from the spill.
    let r = server.run("seq 1 1500000");
    let out = r["output"].as_str().unwrap();
    assert!(out.starts_with("1\n2\n3\n"), "{out:.100}");
    assert_eq!(out.lines().count(), 1_500_000);
    assert!(out.ends_with("\n1500000\n"));
}
