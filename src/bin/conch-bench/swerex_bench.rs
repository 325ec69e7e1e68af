//! `conch bench --suite swerex`: SWE-ReX's two hot calls through `conch swerex-remote` next to
//! swe-rex 1.4.0's own server, both started here on loopback and timed in alternation:
//! `run_in_session` of `echo x` with `check: "raise"` (goal: at least 20x faster than
//! swe-rex's) and `execute` of `["true"]` (goal: within 1.2x of swe-rex's). Each request is a
//! new connection, as SWE-ReX's client makes them (`force_close=True`).
//!
//! swe-rex's server is the `swerex-remote` that `CONCH_SWEREX_SERVER` names
//! (`tests/swerex/setup.sh VENV SDIST SERVER_VENV` makes one in `SERVER_VENV/bin`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail, ensure};
use serde_json::{Value, json};

use crate::floors::{Goal, LoopbackServer as Server, Row, paired, render};

const KEY: &str = "conch-bench-swerex-key";

impl Server {
    /// conch, which names its address on its first stderr line.
    fn conch(conch: &Path) -> anyhow::Result<Self> {
        let mut command = Command::new(conch);
        command.args(["swerex-remote", "--host", "127.0.0.1", "--port", "0", "--auth-token", KEY]);
        Self::start(command, "swerex-remote listening on ")
    }

    /// swe-rex's own server on a free port, ready once `/is_alive` answers.
    fn swerex(program: &str) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // Without TERM, as in the containers SWE-ReX starts it in: with one, bash 5.2's
        // bracketed paste leaves `\r\n` around its session output.
        let child = Command::new(program)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--auth-token", KEY])
            .env_remove("TERM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let mut server = Self { child, addr: format!("127.0.0.1:{port}") };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = server.call("GET", "/is_alive", "") {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("{program} exited ({status}) before answering /is_alive");
            }
            ensure!(std::time::Instant::now() < deadline, "{program} never answered /is_alive");
            // Polling a server that has no readiness line is the only way to know it is up.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One request on a new connection: the status and the JSON body.
    fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<(u16, Value)> {
        let mut s = TcpStream::connect(&self.addr)?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nX-API-Key: {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        s.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let raw = String::from_utf8_lossy(&raw);
        let (head, rest) = raw.split_once("\r\n\r\n").ok_or_else(|| anyhow!("no HTTP head"))?;
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            // One chunk holds these small bodies.
            rest.split("\r\n").nth(1).unwrap_or_default().to_string()
        } else {
            rest.to_string()
        };
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, v) = self.call("POST", path, &body.to_string())?;
        ensure!(status == 200, "{path} answered {status}: {v}");
        Ok(v)
    }
}

/// Runs both servers and renders the table (or JSON).
///
/// # Errors
/// Without `CONCH_SWEREX_SERVER`, or when a server fails to start or answers wrongly.
pub(crate) async fn run(iterations: usize, as_json: bool, conch: &Path) -> anyhow::Result<String> {
    let program = std::env::var("CONCH_SWEREX_SERVER").map_err(|_| {
        anyhow!(
            "set CONCH_SWEREX_SERVER to swe-rex 1.4.0's swerex-remote (tests/swerex/setup.sh VENV SDIST SERVER_VENV makes one in SERVER_VENV/bin)"
        )
    })?;
    let n = iterations.max(1);
    let ours = Server::conch(conch)?;
    let theirs = Server::swerex(&program)?;
    for s in [&ours, &theirs] {
        s.post("/create_session", &json!({"session": "default", "session_type": "bash"}))?;
    }
    let run =
        json!({"command": "echo x", "action_type": "bash", "check": "raise", "session": "default"});
    let exec = json!({"command": ["true"], "shell": false});
    let once = |s: &Server, path: &str, body: &Value| -> anyhow::Result<()> {
        let v = s.post(path, body)?;
        let ok = if path == "/run_in_session" { v["output"] == "x\n" } else { v["exit_code"] == 0 };
        ensure!(ok, "{path}: unexpected answer {v}");
        Ok(())
    };
    let mut rows = Vec::new();
    for (path, body, label, floor_name, goal) in [
        (
            "/run_in_session",
            &run,
            "run_in_session(\"echo x\", check=raise), conch",
            "swe-rex 1.4.0's own server",
            Goal::Ratio(1.0 / 20.0),
        ),
        (
            "/execute",
            &exec,
            "execute([\"true\"]), conch",
            "swe-rex 1.4.0's own server",
            Goal::Ratio(1.2),
        ),
    ] {
        // A warm-up call each: the first pays for lazy setup on both sides.
        once(&theirs, path, body)?;
        once(&ours, path, body)?;
        let (floor, measured) =
            paired(n, || async { once(&theirs, path, body) }, || async { once(&ours, path, body) })
                .await?;
        rows.push(Row { path: label, unit: "ms", measured, floor: Some(floor), floor_name, goal });
    }
    render(&rows, n, as_json)
}
