//! `conch image build` on the real Docker engine: the image builds offline, its one process
//! serves RXP, SWE-ReX's API and envd as a non-root user, the seam suites pass inside it as
//! they do locally (python3 cases skip: the image has none), SWE-ReX's own
//! `DockerDeployment` starts it unmodified, and `docker stop` ends it cleanly.
//!
//! Every test skips visibly (`SKIP <test>: …`) when no Docker engine answers. The engine is
//! inspected with the docker CLI (test-side tooling); conch itself speaks the Engine API.

use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::conch;

/// The image these tests build, once per test binary run (the previous run's is replaced).
const IMAGE: &str = "conch-sandbox-test:ci";
const TOKEN: &str = "engine-test-token-0123456789abcdef";
/// Every wait here is for a state (health, an answer, an exit), bounded by this.
const LIMIT: Duration = Duration::from_secs(90);

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().expect("run the docker CLI")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// Whether an engine answers; otherwise prints the skip line for `test`.
fn engine(test: &str) -> bool {
    let up = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !up {
        println!("SKIP {test}: no Docker engine answers (`docker version` failed)");
    }
    up
}

/// Builds [`IMAGE`] with this build's conch, once; the build's stdout.
fn image() -> &'static str {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT.get_or_init(|| {
        // The last run's image goes first, so runs do not pile images up.
        let _ = docker(&["rmi", "-f", IMAGE, "conch-sandbox-test:latest"]);
        let out = conch()
            .args(["image", "build", "--repo", "conch-sandbox-test", "--tag", "ci"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        stdout(&out)
    })
}

/// A container of [`IMAGE`], removed when dropped.
struct Container {
    name: String,
}

impl Container {
    /// Starts one with `args` before the image (publishing every port on 127.0.0.1).
    fn run(tag: &str, args: &[&str]) -> Self {
        image();
        let name = format!("conch-test-{}-{tag}", std::process::id());
        let _ = docker(&["rm", "-f", &name]);
        let mut all = vec!["run", "-d", "--name", &name, "--label", "conch.test=engine"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-p", "127.0.0.1::7070", "-p", "127.0.0.1::8000"]);
        all.extend_from_slice(&["-p", "127.0.0.1::49983", "-e"]);
        let token = format!("CONCH_TOKEN={TOKEN}");
        all.push(&token);
        all.push(IMAGE);
        let out = docker(&all);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Self { name }
    }

    fn inspect(&self, format: &str) -> String {
        stdout(&docker(&["inspect", "-f", format, &self.name]))
    }

    /// The host address the container's `port` is published on.
    fn addr(&self, port: u16) -> String {
        let out = docker(&["port", &self.name, &format!("{port}/tcp")]);
        stdout(&out).lines().next().unwrap_or_default().to_owned()
    }

    /// Waits until the engine's health check says healthy.
    fn healthy(&self) {
        let start = Instant::now();
        loop {
            let state = self.inspect("{{.State.Health.Status}}");
            if state == "healthy" {
                return;
            }
            assert!(
                start.elapsed() < LIMIT && state != "unhealthy",
                "{state}: {}",
                self.inspect("{{json .State.Health}}")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn exec(&self, env: &[&str], argv: &[&str]) -> Output {
        let mut all = vec!["exec"];
        for e in env {
            all.extend_from_slice(&["-e", e]);
        }
        all.push(&self.name);
        all.extend_from_slice(argv);
        docker(&all)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
    }
}

/// One HTTP/1.0 request to `addr`: the status and the body.
fn http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn post_json(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}content-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn the_image_serves_rxp_swerex_and_envd_as_a_non_root_user() {
    if !engine("the_image_serves_rxp_swerex_and_envd_as_a_non_root_user") {
        return;
    }
    let built = image();
    assert!(built.contains("tagged conch-sandbox-test:ci"), "{built}");
    assert!(built.contains("tagged conch-sandbox-test:latest"), "{built}");
    let c = Container::run("serve", &[]);
    c.healthy();
    assert_eq!(c.inspect("{{.Config.User}}"), "1000:1000");

    // RXP, through conch's own remote-sandbox client: commands and files.
    let rxp = format!("http://{}", c.addr(7070));
    let remote = |tool: &str, args: &str| {
        let out = conch()
            .args(["--composition", "remote-sandbox", "call", tool, args])
            .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", &rxp)
            .env("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = remote("bash", r#"{"command":"id -un; id -u; pwd; echo $HOME; echo one > f.txt"}"#);
    assert!(out.starts_with("conch\n1000\n/workspace\n/home/conch\n"), "{out}");
    assert!(remote("file_read", r#"{"path":"f.txt"}"#).contains("one"));
    let wrong = conch()
        .args(["--composition", "remote-sandbox", "call", "bash", r#"{"command":"true"}"#])
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", &rxp)
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN", "wrong-token-0123456789")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("unauthenticated"), "{wrong:?}");

    // SWE-ReX's API on 8000, the same token as its key, the same world.
    let swerex = c.addr(8000);
    let cmd = r#"{"command":"cat f.txt; id -u","shell":true}"#;
    let (status, body) = post_json(&swerex, "/execute", &format!("x-api-key: {TOKEN}\r\n"), cmd);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["stdout"], "one\n1000\n", "{v}");
    let (status, _) = post_json(&swerex, "/execute", "x-api-key: wrong\r\n", cmd);
    assert!(status == 401 || status == 403, "{status}");

    // envd on 49983: its health, and its token checked.
    let envd = c.addr(49983);
    let (status, _) = http(&envd, &format!("GET /health HTTP/1.0\r\nHost: {envd}\r\n\r\n"));
    assert!((200..300).contains(&status), "{status}");
    let (status, _) = post_json(&envd, "/files?path=x", "", "");
    assert_eq!(status, 401, "envd without the token");

    // `docker stop` is SIGTERM to conch (pid 1): it stops everything and exits 0.
    let stop = docker(&["stop", "-t", "30", &c.name]);
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0", "{}", c.inspect("{{json .State}}"));
}

#[test]
fn the_seam_suites_pass_inside_a_container_as_they_do_locally() {
    if !engine("the_seam_suites_pass_inside_a_container_as_they_do_locally") {
        return;
    }
    let c = Container::run("suites", &[]);
    c.healthy();
    let env = ["CONCH_PLUGINS__REMOTE_SANDBOX__URL=http://127.0.0.1:7070"];
    let token = format!("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN={TOKEN}");
    // Over the container's own daemon: the shell suite (remote-sandbox binds bash-local over
    // it) and the subprocess, terminal-process, terminal and files suites (remote-terminal).
    for composition in ["remote-sandbox", "remote-terminal"] {
        let out = c.exec(
            &[env[0], &token],
            &["conch", "--composition", composition, "conformance", "--json"],
        );
        let text = stdout(&out);
        let report: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{composition}: {e}: {text}"));
        let rows = report["rows"].as_array().unwrap();
        let failed: Vec<_> = rows.iter().filter(|r| r["result"] == "FAIL").collect();
        assert!(failed.is_empty(), "{composition}: {failed:#?}");
        let passed = rows.iter().filter(|r| r["result"] == "PASS").count();
        assert!(passed >= 90, "{composition}: only {passed} passed");
        // The only world-made skips are python3's: the image has none.
        for r in rows.iter().filter(|r| r["result"] == "SKIP") {
            let why = r["message"].as_str().unwrap_or_default();
            assert!(
                !why.contains("not installed") || why.contains("python3") || why.contains("vim"),
                "{composition}: {r}"
            );
        }
        assert!(out.status.success(), "{composition}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn swe_rex_docker_deployment_starts_the_image_unmodified() {
    let test = "swe_rex_docker_deployment_starts_the_image_unmodified";
    if !engine(test) {
        return;
    }
    let Ok(python) = std::env::var("CONCH_SWEREX_PYTHON") else {
        println!("SKIP {test}: CONCH_SWEREX_PYTHON is not set (.ci/run sets it)");
        return;
    };
    image();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/engine/swerex_docker.py");
    let out = Command::new(python).args([script, IMAGE]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for step in ["ok session", "ok state", "ok execute", "ok stopped"] {
        assert!(text.contains(step), "{step}: {text}");
    }
    // Its container was started with --rm and stopped: nothing of this image is left.
    let left =
        docker(&["ps", "-a", "--filter", &format!("ancestor={IMAGE}"), "--format", "{{.Names}}"]);
    let left: Vec<_> = stdout(&left)
        .lines()
        .filter(|n| !n.starts_with("conch-test-"))
        .map(str::to_owned)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
