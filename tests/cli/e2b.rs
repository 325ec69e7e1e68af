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
        let addr = listening_address(&mut child, "e2b envd listening on ");
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
    fn drop(&mut self) {
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
    assert!(status.success(), "the SDK checks failed after:\n{out}\nstderr:\n{err}");
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
