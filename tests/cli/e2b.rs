//! The real `conch e2b` on 127.0.0.1: the access token checked before anything runs, the
//! loopback rule, a sandbox composition's confinement, and, when `CONCH_E2B_PYTHON` names a
//! venv with the `e2b` SDK (tests/e2b/setup.sh), the SDK's own public API driving it
//! (`tests/e2b/sdk_checks.py`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{conch, listening_address};

/// Every wait here is for an event (a line, a response, an exit), bounded by this.
const LIMIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "e2b-test-token-0123456789";
const API_KEY: &str = "e2b-test-api-key-0123456789";

/// A running `conch e2b`, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// `conch [extra] e2b --port 0 [flags]` in `dir`.
    fn start(dir: &Path, extra: &[&str], flags: &[&str]) -> Self {
        Self::start_with(dir, extra, flags, &[])
    }

    /// As [`Server::start`], with `env` set for the server.
    fn start_with(dir: &Path, extra: &[&str], flags: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, extra, flags, env, "e2b envd listening on ")
    }

    /// `conch [extra] e2b --port 0 --api-key KEY --sandboxes-dir SANDBOXES` in `dir`.
    fn start_api(dir: &Path, extra: &[&str], sandboxes: &Path) -> Self {
        let flags = ["--api-key", API_KEY, "--sandboxes-dir", sandboxes.to_str().unwrap()];
        Self::spawn(dir, extra, &flags, &[], "e2b sandbox API listening on ")
    }

    fn spawn(
        dir: &Path,
        extra: &[&str],
        flags: &[&str],
        env: &[(&str, &str)],
        listening: &str,
    ) -> Self {
        let mut child = conch()
            .envs(env.iter().copied())
            .current_dir(dir)
            // The SDK runs every command as `bash -l`: a home of its own keeps this machine's
            // dotfiles out (root's runs `pyenv init`, whose rehash lock a stopped login shell
            // can leave behind, and every later login shell then waits on it).
            .env("HOME", dir)
            .args(extra)
            .args(["e2b", "--host", "127.0.0.1", "--port", "0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn conch e2b");
        let addr = listening_address(&mut child, listening);
        Self { child, addr }
    }

    /// One request (`Connection: close`): the status and the body.
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }
}

impl Drop for Server {
    /// SIGTERM first, so a failed test leaves no sandbox's process behind; SIGKILL if the
    /// server does not stop within [`LIMIT`].
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).stderr(Stdio::null()).status();
        if term.is_ok_and(|s| s.success()) {
            let deadline = std::time::Instant::now() + LIMIT;
            while std::time::Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Connect stream request: one envelope around `json`.
fn envelope(json: &str) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(json.len()).unwrap().to_be_bytes());
    out.extend_from_slice(json.as_bytes());
    out
}

#[test]
fn the_access_token_is_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], &["--access-token", TOKEN]);
    let marker = dir.path().join("ran");
    let start = format!(
        r#"{{"process":{{"cmd":"/bin/sh","args":["-c","touch {}"]}},"stdin":false}}"#,
        marker.display()
    );
    let stream = [("Content-Type", "application/connect+json")];
    for token in [None, Some("wrong-token"), Some("")] {
        let mut headers = stream.to_vec();
        if let Some(t) = token {
            headers.push(("X-Access-Token", t));
        }
        let (status, body) =
            server.call("POST", "/process.Process/Start", &headers, &envelope(&start));
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(body.contains("\"unauthenticated\""), "{body}");
        let (status, _) = server.call("GET", "/files?path=/etc/hostname", &headers[1..], b"");
        assert_eq!(status, 401, "{token:?}");
    }
    assert!(!marker.exists(), "a refused request ran nothing");
    // The health check needs no token, as envd's does.
    assert_eq!(server.call("GET", "/health", &[], b"").0, 204);
    let unary = [("Content-Type", "application/json"), ("X-Access-Token", TOKEN)];
    let (status, body) = server.call("POST", "/process.Process/List", &unary, b"{}");
    assert_eq!((status, body.as_str()), (200, r#"{"processes":[]}"#));
    // A method envd lacks is not found; a body that is not JSON is invalid.
    let (status, body) = server.call("POST", "/process.Process/Nope", &unary, b"{}");
    assert_eq!(status, 404, "{body}");
    let (status, body) = server.call("POST", "/filesystem.Filesystem/Stat", &unary, b"{");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_argument"), "{body}");
}

#[test]
fn no_token_is_allowed_on_loopback_only() {
    let out = conch()
        .args(["e2b", "--host", "0.0.0.0", "--port", "0"])
        .env_remove("CONCH_E2B_ACCESS_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");
}

/// The checks in `tests/e2b/sdk_checks.py`, each of which must report `ok`.
const SDK_CHECKS: &[&str] = &[
    "run_streams",
    "exit_code",
    "envs_and_cwd",
    "timeout_stops_the_tree",
    "broken_utf8",
    "many_lines_exact",
    "a_slow_reader_loses_nothing",
    "background_kill_leaves_nothing",
    "connect_and_stdin",
    "close_stdin",
    "list",
    "pty",
    "files_roundtrip",
    "files_tree",
    "watch_dir",
    "envd_semantics_kept",
    "watch_sees_the_file_itself_written",
    "connect_replay_with_conch_header",
    "keepalives_at_the_asked_interval",
    "async",
];

/// Runs `sdk_checks.py` against `server` with the SDK's debug mode; `None` when no SDK venv.
fn sdk_checks(server: &Server, scratch: &Path, checks: &[&str]) -> Option<String> {
    let Ok(python) = std::env::var("CONCH_E2B_PYTHON") else {
        println!(
            "SKIP: CONCH_E2B_PYTHON is not set (.ci/run sets it; tests/e2b/setup.sh makes the venv)"
        );
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/sdk_checks.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(scratch)
        .args(checks)
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", format!("http://{}", server.addr))
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_ACCESS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    let err = err.join().unwrap();
    assert!(status.success(), "the SDK checks failed ({status:?}) after:\n{out}\nstderr:\n{err}");
    Some(out)
}

#[test]
fn the_e2b_sdk_drives_conch() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], &[]);
    let Some(out) = sdk_checks(&server, dir.path(), &[]) else { return };
    let passed: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
    assert_eq!(passed, SDK_CHECKS, "every check ran and passed:\n{out}");
}

#[test]
fn under_a_sandbox_composition_the_sdk_cannot_write_outside_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--composition", "sandbox"], &[]);
    let target = outside.path().join("escaped");
    let Ok(python) = std::env::var("CONCH_E2B_PYTHON") else {
        println!("SKIP: CONCH_E2B_PYTHON is not set (.ci/run sets it)");
        return;
    };
    let script = r#"
import sys
from e2b import Sandbox, CommandExitException
target = sys.argv[1]
sbx = Sandbox.create()
try:
    sbx.files.write(target, "x")
except Exception as e:
    print("write refused:", type(e).__name__, e)
else:
    raise SystemExit("files.write outside the workspace succeeded")
try:
    sbx.commands.run(f"echo x > {target}")
except CommandExitException as e:
    print("command refused:", e.exit_code)
else:
    raise SystemExit("a command wrote outside the workspace")
sbx.files.write("inside.txt", "ok")
print("inside:", sbx.files.read("inside.txt"))
"#;
    let out = Command::new(python)
        .args(["-c", script])
        .arg(&target)
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", format!("http://{}", server.addr))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("write refused:") && text.contains("command refused:"), "{text}");
    assert!(text.contains("inside: ok"), "{text}");
    assert!(text.contains("sandbox"), "the denial says it is the sandbox's: {text}");
    assert!(!target.exists(), "nothing appeared outside the workspace");
    assert_eq!(std::fs::read_to_string(dir.path().join("inside.txt")).unwrap(), "ok");
}

#[test]
fn a_cut_upload_is_answered_with_an_error_and_a_bad_body_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], &[]);
    let target = dir.path().join("kept.txt");
    let path = format!("/files?path={}", target.display());
    let raw = [("Content-Type", "application/octet-stream")];
    let (status, body) = server.call("POST", &path, &raw, b"old content\n");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"type\":\"file\""), "{body}");
    // A body that promises a megabyte and stops after a thousand bytes: the server answers
    // the cut body with an error once it gave the upload up.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n",
        server.addr
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&[b'x'; 1000]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // Written in place, as envd writes: what arrived is there, and nothing else appeared.
    let left = std::fs::read(&target).unwrap();
    assert!(left.len() <= 1000 && left.iter().all(|b| *b == b'x'), "{} bytes", left.len());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // A body that says gzip and is not, and a download of what is not there.
    let gz = [("Content-Type", "application/octet-stream"), ("Content-Encoding", "gzip")];
    let (status, body) = server.call("POST", &path, &gz, b"not gzip at all");
    assert_eq!(status, 400, "{body}");
    let missing = format!("/files?path={}", dir.path().join("missing").display());
    let (status, body) = server.call("GET", &missing, &[], b"");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"code\":404"), "{body}");
}

#[test]
fn a_reader_behind_an_evicted_spill_gets_an_error_not_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    // 8 MB of spills in all: a 21 MB output's spill is evicted as soon as it is final.
    let env = [("CONCH_PLUGINS__SUBPROCESS_LOCAL__MAX_SPILL_TOTAL_BYTES", "8000000")];
    let server = Server::start_with(dir.path(), &[], &[], &env);
    let Some(out) = sdk_checks(&server, dir.path(), &["evicted_spill_is_an_error_not_a_gap"])
    else {
        return;
    };
    assert_eq!(out.trim(), "ok evicted_spill_is_an_error_not_a_gap");
}

/// The checks in `tests/e2b/api_checks.py` that run on every composition.
const API_CHECKS: &[&str] = &[
    "lifecycle",
    "sandboxes_are_apart",
    "kill_leaves_nothing",
    "kill_during_uploads_leaves_nothing",
    "timeout_ends_it",
    "set_timeout_moves_the_end",
    "bad_api_key",
    "unserved_asks_are_refused",
    "async",
];

/// Runs `tests/e2b/api_checks.py` against `server` in the SDK's sandbox API mode.
fn api_checks(server: &Server, sandboxes: &Path, checks: &[&str]) -> Option<String> {
    api_checks_with(server, sandboxes, checks, &[])
}

/// As [`api_checks`], with `env` set for the checks.
fn api_checks_with(
    server: &Server,
    sandboxes: &Path,
    checks: &[&str],
    env: &[(&str, &str)],
) -> Option<String> {
    let Ok(python) = std::env::var("CONCH_E2B_PYTHON") else {
        println!(
            "SKIP: CONCH_E2B_PYTHON is not set (.ci/run sets it; tests/e2b/setup.sh makes the venv)"
        );
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/api_checks.py");
    let url = format!("http://{}", server.addr);
    let out = Command::new(python)
        .arg(script)
        .arg(sandboxes)
        .args(checks)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", API_KEY)
        .envs(env.iter().copied())
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_ACCESS_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the SDK's API checks failed after:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(text)
}

fn passed(out: &str) -> Vec<&str> {
    out.lines().filter_map(|l| l.strip_prefix("ok ")).collect()
}

#[test]
fn the_e2b_sdk_drives_the_sandbox_api() {
    let dir = tempfile::tempdir().unwrap();
    let sandboxes = tempfile::tempdir().unwrap();
    let server = Server::start_api(dir.path(), &[], sandboxes.path());
    let Some(out) = api_checks(&server, sandboxes.path(), &[]) else { return };
    assert_eq!(passed(&out), API_CHECKS, "every check ran and passed:\n{out}");
}

#[test]
fn under_sandbox_compositions_sandboxes_cannot_reach_each_other() {
    for composition in ["sandbox", "sandbox-bwrap"] {
        if !super::conformance::sandbox_works(composition) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let sandboxes = tempfile::tempdir().unwrap();
        let server =
            Server::start_api(dir.path(), &["--composition", composition], sandboxes.path());
        let checks = [
            "lifecycle",
            "sandboxes_are_apart",
            "kill_during_uploads_leaves_nothing",
            "confined_apart",
        ];
        // Under bubblewrap each command has a pid namespace of its own (`ps` sees its tree).
        let pid_isolated = if composition == "sandbox-bwrap" { "1" } else { "0" };
        let env = [("CONCH_E2B_PID_ISOLATED", pid_isolated)];
        let Some(out) = api_checks_with(&server, sandboxes.path(), &checks, &env) else { return };
        assert_eq!(passed(&out), checks, "{composition}:\n{out}");
    }
}

/// Whether `pid` runs nothing any more (a zombie counts as gone).
fn zombie_or_gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.rsplit(')').next().unwrap().split_whitespace().next() == Some("Z"))
}

/// Starts `sleep 1000` in `dir` through `Start` with `headers`, leaving its stream open (the
/// returned connection), and waits for its pid, which it writes to `dir/pid`.
fn start_sleeper(server: &Server, headers: &[(&str, &str)], dir: &Path) -> (i32, TcpStream) {
    let sleeper = format!(
        r#"{{"process":{{"cmd":"/bin/sh","args":["-c","echo $$ > pid; exec sleep 1000"],"cwd":"{}"}},"stdin":false}}"#,
        dir.display()
    );
    let body = envelope(&sleeper);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let mut req = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nContent-Type: application/connect+json\r\n",
        server.addr,
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let pid_file = dir.join("pid");
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        if let Ok(t) = std::fs::read_to_string(&pid_file)
            && let Ok(p) = t.trim().parse()
        {
            return (p, s);
        }
        assert!(std::time::Instant::now() < deadline, "the sleeper never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops `server` with SIGTERM and waits for its exit, which must be a success. A server
/// that drained its connections before stopping its processes waited on every open stream
/// (about a minute); an exit within half of [`LIMIT`] tells the two apart on a loaded machine.
fn terminate(server: &mut Server) {
    let term = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status();
    assert!(term.unwrap().success());
    let deadline = std::time::Instant::now() + LIMIT / 2;
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn sigterm_stops_every_process_while_its_stream_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[], &[]);
    let (pid, _stream) = start_sleeper(&server, &[], dir.path());
    assert!(!zombie_or_gone(pid), "the sleeper runs");
    terminate(&mut server);
    assert!(zombie_or_gone(pid), "the process ended with the server");
}

/// `POST /sandboxes` over raw HTTP: the new sandbox's id and envd access token.
fn create_sandbox(server: &Server) -> (String, String) {
    let headers = [("Content-Type", "application/json"), ("X-API-Key", API_KEY)];
    let (status, body) =
        server.call("POST", "/sandboxes", &headers, br#"{"templateID":"base","timeout":120}"#);
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (v["sandboxID"].as_str().unwrap().to_owned(), v["envdAccessToken"].as_str().unwrap().to_owned())
}

#[test]
fn the_api_key_and_each_sandboxs_token_are_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sandboxes = tempfile::tempdir().unwrap();
    let mut server = Server::start_api(dir.path(), &[], sandboxes.path());
    let json = ("Content-Type", "application/json");
    // Every API route refuses a missing or wrong key, and no workspace is made.
    for key in [None, Some("wrong-key"), Some("")] {
        let mut headers = vec![json];
        if let Some(k) = key {
            headers.push(("X-API-Key", k));
        }
        for (method, path) in [
            ("POST", "/sandboxes"),
            ("POST", "/v2/sandboxes"),
            ("GET", "/sandboxes"),
            ("GET", "/v2/sandboxes"),
            ("GET", "/sandboxes/x"),
            ("DELETE", "/sandboxes/x"),
            ("POST", "/sandboxes/x/timeout"),
            ("POST", "/sandboxes/x/connect"),
            ("POST", "/v2/sandboxes/x/connect"),
            ("POST", "/sandboxes/x/pause"),
        ] {
            let (status, body) =
                server.call(method, path, &headers, br#"{"templateID":"base","timeout":5}"#);
            assert_eq!(status, 401, "{key:?} {method} {path}: {body}");
        }
    }
    assert_eq!(std::fs::read_dir(sandboxes.path()).unwrap().count(), 0);
    // With the key, a route E2B has and conch does not serve is not found.
    let keyed = [json, ("X-API-Key", API_KEY)];
    let (status, body) = server.call("POST", "/sandboxes/x/pause", &keyed, b"{}");
    assert_eq!(status, 404, "{body}");

    let (a, a_token) = create_sandbox(&server);
    let (b, b_token) = create_sandbox(&server);
    assert_ne!(a_token, b_token);
    let a_dir = sandboxes.path().join(&a);
    let marker = a_dir.join("ran");
    let start = format!(
        r#"{{"process":{{"cmd":"/bin/sh","args":["-c","touch {}"]}},"stdin":false}}"#,
        marker.display()
    );
    let stream = ("Content-Type", "application/connect+json");
    // A's envd refuses no token, a wrong one and B's, before anything runs.
    for token in [None, Some("wrong-token"), Some(b_token.as_str())] {
        let mut headers = vec![stream, ("E2b-Sandbox-Id", a.as_str())];
        if let Some(t) = token {
            headers.push(("X-Access-Token", t));
        }
        let (status, body) =
            server.call("POST", "/process.Process/Start", &headers, &envelope(&start));
        assert_eq!(status, 401, "{token:?}: {body}");
    }
    assert!(!marker.exists(), "a refused request ran nothing");
    // An unknown sandbox is gone, as E2B's proxy says it; a call naming none is refused.
    let gone = [stream, ("E2b-Sandbox-Id", "nosuch"), ("X-Access-Token", a_token.as_str())];
    let (status, body) = server.call("GET", "/health", &gone, b"");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("was not found"), "{body}");
    let (status, body) = server.call("GET", "/health", &[], b"");
    assert_eq!(status, 400, "{body}");
    // With its own token, A runs it, in A's workspace.
    let own = [stream, ("E2b-Sandbox-Id", a.as_str()), ("X-Access-Token", a_token.as_str())];
    let (status, body) = server.call("POST", "/process.Process/Start", &own, &envelope(&start));
    assert_eq!(status, 200, "{body}");
    assert!(marker.exists(), "{body}");
    // A long-lived process in B, then the server stops: every sandbox is killed first.
    let b_own = [("E2b-Sandbox-Id", b.as_str()), ("X-Access-Token", b_token.as_str())];
    let (pid, _stream) = start_sleeper(&server, &b_own, &sandboxes.path().join(&b));
    assert!(!zombie_or_gone(pid), "the sleeper runs");
    terminate(&mut server);
    assert!(zombie_or_gone(pid), "the sandbox's process ended with the server");
    assert_eq!(std::fs::read_dir(sandboxes.path()).unwrap().count(), 0, "workspaces removed");
}

#[test]
fn the_e2b_bench_runs_its_three_rows() {
    let Ok(python) = std::env::var("CONCH_E2B_PYTHON") else {
        println!("SKIP: CONCH_E2B_PYTHON is not set (.ci/run sets it)");
        return;
    };
    let out = conch()
        .args(["bench", "--suite", "e2b", "--iterations", "2", "--json"])
        .env("CONCH_E2B_PYTHON", python)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{v}");
    assert!(rows.iter().all(|r| r["measured"].as_f64().is_some_and(|m| m > 0.0)), "{v}");
    assert!(rows.iter().all(|r| r["floor"].as_f64().is_some_and(|m| m > 0.0)), "{v}");
    assert!(rows[2]["path"].as_str().unwrap().contains("Sandbox.create()"), "{v}");
}

/// Reads one HTTP/1.1 response with a `Content-Length` from `s`: its head and body.
fn read_response(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).unwrap();
        assert_eq!(
            n,
            1,
            "the connection closed before a whole head: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, body)
}

#[test]
fn a_refused_request_leaves_its_connection_usable() {
    let dir = tempfile::tempdir().unwrap();
    let sandboxes = tempfile::tempdir().unwrap();
    let server = Server::start_api(dir.path(), &[], sandboxes.path());
    let (a, _) = create_sandbox(&server);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    // Refused before anything reads their bodies: a gone sandbox, a wrong token, a wrong key.
    let body =
        envelope(&format!(r#"{{"process":{{"cmd":"true"}},"pad":"{}"}}"#, "x".repeat(200_000)));
    for (path, headers) in [
        ("/process.Process/Start", "E2b-Sandbox-Id: nosuch\r\n".to_string()),
        ("/process.Process/Start", format!("E2b-Sandbox-Id: {a}\r\nX-Access-Token: wrong\r\n")),
        ("/sandboxes", "X-API-Key: wrong\r\n".to_string()),
    ] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/connect+json\r\nContent-Length: {}\r\n{headers}\r\n",
            server.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(&body).unwrap();
        let (head, _) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 4") || head.starts_with("HTTP/1.1 5"), "{head}");
    }
    // The same connection still answers.
    let req =
        format!("GET /health HTTP/1.1\r\nHost: {}\r\nE2b-Sandbox-Id: {a}\r\n\r\n", server.addr);
    s.write_all(req.as_bytes()).unwrap();
    let (head, _) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
}
