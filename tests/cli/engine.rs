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
pub(crate) const IMAGE: &str = "conch-sandbox-test:ci";
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
pub(crate) fn engine(test: &str) -> bool {
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
pub(crate) fn image() -> &'static str {
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
fn the_seam_suites_pass_inside_a_provisioned_container_as_they_do_locally() {
    if !engine("the_seam_suites_pass_inside_a_provisioned_container_as_they_do_locally") {
        return;
    }
    // A container as provision-docker makes it (capabilities dropped, no-new-privileges,
    // the idle exit armed), kept by its agent while the suites run in it.
    let mut agent = Agent::start(&[]);
    assert_eq!(agent.bash("echo up"), "up\n");
    let id = sandboxes_of(&agent.owner()).pop().unwrap();
    // Over the container's own daemon: the shell suite (remote-sandbox binds bash-local over
    // it) and the subprocess, terminal-process, terminal and files suites (remote-terminal).
    // The token the provisioner gave the container, read from its config; no shell runs
    // the suites (one would add PWD to their environment, which the daemon's children, the
    // container's own, do not have).
    let env = stdout(&docker(&["inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", &id]));
    let token = env.lines().find_map(|l| l.strip_prefix("CONCH_TOKEN=")).unwrap().to_owned();
    let token = format!("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN={token}");
    for composition in ["remote-sandbox", "remote-terminal"] {
        let out = docker(&[
            "exec",
            "-e",
            "CONCH_PLUGINS__REMOTE_SANDBOX__URL=http://127.0.0.1:7070",
            "-e",
            &token,
            &id,
            "conch",
            "--composition",
            composition,
            "conformance",
            "--json",
        ]);
        let text = stdout(&out);
        let report: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{composition}: {e}: {text}"));
        let rows = report["rows"].as_array().unwrap();
        let failed: Vec<_> = rows.iter().filter(|r| r["result"] == "FAIL").collect();
        assert!(failed.is_empty(), "{composition}: {failed:#?}");
        let passed = rows.iter().filter(|r| r["result"] == "PASS").count();
        assert!(passed >= 90, "{composition}: only {passed} passed");
        // The only world-made skips are python3's and vim's: the image has neither.
        for r in rows.iter().filter(|r| r["result"] == "SKIP") {
            let why = r["message"].as_str().unwrap_or_default();
            assert!(
                !why.contains("not installed") || why.contains("python3") || why.contains("vim"),
                "{composition}: {r}"
            );
        }
        assert!(out.status.success(), "{composition}: {}", String::from_utf8_lossy(&out.stderr));
    }
    agent.finish();
}

#[test]
fn a_workspace_bind_is_the_sandboxes_workspace() {
    if !engine("a_workspace_bind_is_the_sandboxes_workspace") {
        return;
    }
    let host = tempfile::Builder::new()
        .prefix("conch-engine-ws-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    // The sandbox's user is uid 1000: it may write here.
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(host.path().join("from-host"), "host\n").unwrap();
    let ws = host.path().display().to_string();
    let mut a = Agent::start(&[("CONCH_PLUGINS__PROVISION_DOCKER__WORKSPACE", &ws)]);
    let out = a.bash("cat /workspace/from-host; echo sandbox > /workspace/from-sandbox");
    assert_eq!(out, "host\n");
    a.finish();
    assert_eq!(std::fs::read_to_string(host.path().join("from-sandbox")).unwrap(), "sandbox\n");
}

#[test]
fn swe_rex_docker_deployment_starts_the_image_unmodified() {
    let steps = ["ok session", "ok state", "ok execute", "ok stopped"];
    let test = "swe_rex_docker_deployment_starts_the_image_unmodified";
    if peer_script(test, "CONCH_SWEREX_PYTHON", "swerex_docker.py", &steps).is_none() {
        return;
    }
    // Its container was started with --rm and stopped: nothing of this image is left but
    // what other tests made (theirs carry conch.managed, or the conch-test- prefix).
    let left = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("ancestor={IMAGE}"),
        "--format",
        "{{.Names}} {{.Label \"conch.managed\"}}",
    ]);
    let left: Vec<_> = stdout(&left)
        .lines()
        .filter(|l| !l.starts_with("conch-test-") && !l.ends_with(" true"))
        .map(str::to_owned)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A `conch --composition docker batch` process (one runtime, so one container of
/// [`IMAGE`]), driven one JSON line at a time.
struct Agent {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Agent {
    fn start(env: &[(&str, &str)]) -> Self {
        use std::io::BufRead as _;
        image();
        let mut child = conch()
            .args(["--composition", "docker", "batch"])
            .env("CONCH_PLUGINS__PROVISION_DOCKER__IMAGE", IMAGE)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { stdin: child.stdin.take(), child, lines }
    }

    /// Sends one call and waits for its result line.
    fn call(&mut self, tool: &str, args: serde_json::Value) -> serde_json::Value {
        use std::io::Write as _;
        let line = serde_json::json!({"tool": tool, "args": args});
        writeln!(self.stdin.as_mut().unwrap(), "{line}").unwrap();
        let got = self.lines.recv_timeout(LIMIT).expect("a result line");
        serde_json::from_str(&got).unwrap()
    }

    fn bash(&mut self, command: &str) -> String {
        let r = self.call("bash", serde_json::json!({ "command": command }));
        assert_eq!(r["ok"], true, "{command}: {r}");
        r["text"].as_str().unwrap_or_default().to_owned()
    }

    /// Its sandbox's label (`conch-<pid>`).
    fn owner(&self) -> String {
        format!("conch-{}", self.child.id())
    }

    /// Closes stdin and waits for the batch to end (its container removed first).
    fn finish(mut self) {
        self.stdin = None;
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The containers labelled as `owner`'s sandbox (`docker ps -a`).
fn sandboxes_of(owner: &str) -> Vec<String> {
    let out = docker(&["ps", "-aq", "--filter", &format!("label=conch.owner={owner}")]);
    stdout(&out).lines().map(str::to_owned).collect()
}

/// The warm containers (owner `pool`) that the process `pid` made.
fn pool_of(pid: u32) -> Vec<String> {
    let out = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=conch.owner=pool",
        "--format",
        "{{.ID}} {{.Label \"conch.maker\"}}",
    ]);
    stdout(&out)
        .lines()
        .filter(|l| l.contains(&format!("/conch-makers/{pid}-")))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The address of `owner`'s sandbox on its network.
fn address_of(owner: &str) -> String {
    let id = sandboxes_of(owner).pop().expect("a sandbox");
    stdout(&docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &id,
    ]))
}

/// Waits until `owner` has no container left (created, running or exited).
fn until_gone(owner: &str, limit: Duration) {
    let start = Instant::now();
    while !sandboxes_of(owner).is_empty() {
        assert!(
            start.elapsed() < limit,
            "{owner}'s sandbox is still there: {:?}",
            sandboxes_of(owner)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn twenty_agents_each_get_a_container_of_their_own_and_leave_none() {
    if !engine("twenty_agents_each_get_a_container_of_their_own_and_leave_none") {
        return;
    }
    image();
    // All twenty start at once (each builds its runtime: a container made and answering).
    let agents: Vec<Agent> = (0..20).map(|_| Agent::start(&[])).collect();
    let mut agents: Vec<Agent> = std::thread::scope(|s| {
        let handles: Vec<_> = agents
            .into_iter()
            .enumerate()
            .map(|(i, mut a)| {
                s.spawn(move || {
                    // A file and a process (a background job) of its own, both named for it.
                    a.bash(&format!("echo {i} > /workspace/mine-{i}"));
                    let job = serde_json::json!({"command": format!("sleep 300{i}"),
                        "run_in_background": true});
                    let r = a.call("bash", job);
                    assert_eq!(r["ok"], true, "{r}");
                    a
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let owners: Vec<String> = agents.iter().map(Agent::owner).collect();
    for o in &owners {
        assert_eq!(sandboxes_of(o).len(), 1, "{o} has one container");
    }
    // Every agent sees its own file and process, and none of the others'.
    let neighbour = address_of(&owners[1]);
    for (i, a) in agents.iter_mut().enumerate() {
        let files = a.bash("ls /workspace");
        assert_eq!(files.trim(), format!("mine-{i}"), "agent {i}");
        // The background job's process is up (the call returned once it started).
        let procs = a.bash("ps -eo args | grep '^sleep' || true");
        assert_eq!(procs.trim(), format!("sleep 300{i}"), "agent {i}");
    }
    // Nor can one reach another's daemon: the networks carry no traffic between sandboxes.
    let reach = agents[0].bash(&format!(
        "timeout 3 bash -c 'exec 3<>/dev/tcp/{neighbour}/7070' 2>/dev/null; echo rc=$?"
    ));
    assert!(!reach.contains("rc=0"), "agent 0 reached agent 1's daemon: {reach}");
    // Each batch ends: its container is removed before the process exits.
    std::thread::scope(|s| {
        for a in agents.drain(..) {
            s.spawn(move || a.finish());
        }
    });
    for o in &owners {
        assert!(sandboxes_of(o).is_empty(), "{o}: {:?}", sandboxes_of(o));
    }
}

#[test]
fn a_maker_killed_with_9_leaves_no_container_past_its_lease() {
    if !engine("a_maker_killed_with_9_leaves_no_container_past_its_lease") {
        return;
    }
    let mut a = Agent::start(&[("CONCH_PLUGINS__PROVISION_DOCKER__LEASE_MS", "2000")]);
    assert_eq!(a.bash("echo up"), "up\n");
    let owner = a.owner();
    assert_eq!(sandboxes_of(&owner).len(), 1);
    // SIGKILL: no teardown runs. The daemon hears no client for the lease, exits, and the
    // engine removes the container (AutoRemove).
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    until_gone(&owner, Duration::from_secs(30));
}

#[test]
fn a_paused_orphan_is_reaped_by_the_next_provisioner() {
    if !engine("a_paused_orphan_is_reaped_by_the_next_provisioner") {
        return;
    }
    let mut a = Agent::start(&[]);
    assert_eq!(a.bash("echo up"), "up\n");
    let owner = a.owner();
    let id = sandboxes_of(&owner).pop().unwrap();
    // Paused, its daemon cannot count its lease; its maker then dies without a teardown.
    assert!(docker(&["pause", &id]).status.success());
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert_eq!(sandboxes_of(&owner).len(), 1, "still there, paused");
    // The next provisioner's build removes what a dead maker left.
    let mut b = Agent::start(&[]);
    assert_eq!(b.bash("echo next"), "next\n");
    until_gone(&owner, Duration::from_secs(30));
    b.finish();
}

#[test]
fn a_container_killed_paused_or_cut_off_mid_call_fails_typed_within_give_up() {
    if !engine("a_container_killed_paused_or_cut_off_mid_call_fails_typed_within_give_up") {
        return;
    }
    for how in ["kill", "pause", "disconnect"] {
        let give_up = [("CONCH_PLUGINS__REMOTE_PROVISIONED__GIVE_UP_MS", "3000")];
        let mut a = Agent::start(&give_up);
        assert_eq!(a.bash("echo up"), "up\n");
        let owner = a.owner();
        let id = sandboxes_of(&owner).pop().unwrap();
        // A call in flight, then the container goes away under it.
        let line = serde_json::json!({"tool": "bash", "args": {"command": "sleep 60"}});
        {
            use std::io::Write as _;
            writeln!(a.stdin.as_mut().unwrap(), "{line}").unwrap();
        }
        let ran = Instant::now();
        let cut = match how {
            "disconnect" => docker(&["network", "disconnect", "-f", "conch-sandbox-bridge", &id]),
            _ => docker(&[how, &id]),
        };
        assert!(cut.status.success(), "{how}: {cut:?}");
        let got = a.lines.recv_timeout(LIMIT).expect("an answer, not a hang");
        let r: serde_json::Value = serde_json::from_str(&got).unwrap();
        assert_eq!(r["ok"], false, "{how}: {r}");
        assert_eq!(r["error"]["code"], "remote_unavailable", "{how}: {r}");
        // give_up_ms (3 s) bounds it, well short of the command's 60 s.
        assert!(ran.elapsed() < Duration::from_secs(30), "{how}: {:?}", ran.elapsed());
        if how == "pause" {
            assert!(docker(&["unpause", &id]).status.success());
        }
        a.finish();
        until_gone(&owner, Duration::from_secs(30));
    }
}

#[test]
fn a_daemon_restart_inside_the_container_is_told_by_its_boot_id() {
    if !engine("a_daemon_restart_inside_the_container_is_told_by_its_boot_id") {
        return;
    }
    let mut a = Agent::start(&[]);
    assert_eq!(a.bash("echo up"), "up\n");
    let owner = a.owner();
    let id = sandboxes_of(&owner).pop().unwrap();
    assert!(docker(&["restart", "-t", "1", &id]).status.success());
    // The restarted daemon answers with another boot id (BOOT_CHANGED); or, when the
    // restart gave the container another address and the old one went to another
    // container, another daemon refuses the token there (REMOTE_GONE). Either way every
    // call now fails for good.
    let r = a.call("bash", serde_json::json!({"command": "echo again"}));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "remote_unavailable", "{r}");
    assert_eq!(r["error"]["retryable"], false, "{r}");
    let reason = r["error"]["reason"].as_str().unwrap_or_default();
    assert!(reason == "BOOT_CHANGED" || reason == "REMOTE_GONE", "{r}");
    a.finish();
    until_gone(&owner, Duration::from_secs(30));
}

#[test]
fn limits_and_the_network_policy_hold_inside_the_sandbox() {
    if !engine("limits_and_the_network_policy_hold_inside_the_sandbox") {
        return;
    }
    // An address off this machine that answers here (a package registry the machine uses):
    // bridge reaches it, none must not.
    use std::net::ToSocketAddrs as _;
    let outside = ["pypi.org:443", "crates.io:443", "deb.debian.org:80"]
        .iter()
        .filter_map(|h| h.to_socket_addrs().ok()?.find(|a| a.is_ipv4()))
        .find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(3)).is_ok());
    let reach = |a: &mut Agent, to: std::net::SocketAddr| {
        a.bash(&format!(
            "timeout 3 bash -c 'exec 3<>/dev/tcp/{}/{}' 2>/dev/null; echo rc=$?",
            to.ip(),
            to.port()
        ))
    };
    let limits = [
        ("CONCH_PLUGINS__PROVISION_DOCKER__PIDS", "64"),
        ("CONCH_PLUGINS__PROVISION_DOCKER__MEMORY_MB", "256"),
        ("CONCH_PLUGINS__PROVISION_DOCKER__CPUS", "0.5"),
    ];
    let mut a = Agent::start(&limits);
    assert_eq!(a.bash("echo up"), "up\n", "the runtime (and its sandbox) is built");
    let id = sandboxes_of(&a.owner()).pop().unwrap();
    let inspect = |f: &str| stdout(&docker(&["inspect", "-f", f, &id]));
    assert_eq!(inspect("{{.HostConfig.PidsLimit}}"), "64");
    assert_eq!(inspect("{{.HostConfig.Memory}}"), (256u64 << 20).to_string());
    assert_eq!(inspect("{{.HostConfig.NanoCpus}}"), "500000000");
    assert_eq!(inspect("{{.HostConfig.CapDrop}}"), "[ALL]");
    assert_eq!(inspect("{{.HostConfig.SecurityOpt}}"), "[no-new-privileges]");
    // What a command holds: no capability at all, as uid 1000, and no way to gain one.
    let held = a.bash("id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status");
    assert_eq!(
        held.split_whitespace().collect::<Vec<_>>(),
        ["1000", "CapPrm:", "0000000000000000", "CapEff:", "0000000000000000", "NoNewPrivs:", "1"],
        "{held}"
    );
    // The pid limit is the kernel's: a burst of processes past it is refused.
    let burst =
        a.bash("for i in $(seq 100); do sleep 5 & done 2>&1 | grep -c 'retry\\|fork' ; wait; true");
    assert_ne!(burst.trim(), "0", "forks were refused past the limit: {burst}");
    let Some(outside) = outside else {
        println!(
            "SKIP limits_and_the_network_policy_hold_inside_the_sandbox (network part): nothing off this machine answers"
        );
        a.finish();
        return;
    };
    assert_eq!(reach(&mut a, outside).trim(), "rc=0", "bridge: {outside} answers");
    a.finish();
    let mut b = Agent::start(&[("CONCH_PLUGINS__PROVISION_DOCKER__NETWORK", "none")]);
    let r = reach(&mut b, outside);
    assert!(!r.contains("rc=0"), "network none reached {outside}: {r}");
    b.finish();
}

/// `conch --composition docker e2b --api-key` on loopback with `env` set, and the e2b SDK's
/// Python (`None`, a skip line printed, without an engine or `CONCH_E2B_PYTHON`).
struct E2bApi {
    server: std::process::Child,
    url: String,
    python: String,
}

const E2B_KEY: &str = "engine-e2b-key-0123456789";

impl E2bApi {
    fn start(test: &str, env: &[(&str, &str)]) -> Option<Self> {
        if !engine(test) {
            return None;
        }
        let Ok(python) = std::env::var("CONCH_E2B_PYTHON") else {
            println!("SKIP {test}: CONCH_E2B_PYTHON is not set (.ci/run sets it)");
            return None;
        };
        image();
        let mut server = conch()
            .args(["--composition", "docker", "e2b", "--host", "127.0.0.1", "--port", "0"])
            .env("CONCH_E2B_API_KEY", E2B_KEY)
            .env("CONCH_PLUGINS__PROVISION_DOCKER__IMAGE", IMAGE)
            .envs(env.iter().copied())
            .args(["--api-key", E2B_KEY])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let addr = super::listening_address(&mut server, "e2b sandbox API listening on ");
        Some(Self { server, url: format!("http://{addr}"), python })
    }

    /// Runs the SDK's Python with `args`, in the SDK's sandbox API mode; asserts it exited 0
    /// and returns its stdout.
    fn sdk(&self, args: &[&str]) -> String {
        let out = Command::new(&self.python)
            .args(args)
            .env("E2B_API_URL", &self.url)
            .env("E2B_SANDBOX_URL", &self.url)
            .env("E2B_API_KEY", E2B_KEY)
            .env_remove("E2B_DEBUG")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    }
}

impl Drop for E2bApi {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[test]
fn the_e2b_sdk_gets_a_container_per_sandbox_from_the_sandbox_api() {
    let test = "the_e2b_sdk_gets_a_container_per_sandbox_from_the_sandbox_api";
    let Some(api) = E2bApi::start(test, &[]) else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/engine/e2b_containers.py");
    let text = api.sdk(&[script]);
    for step in
        ["ok hosts", "ok user", "ok apart", "ok networks", "killed a", "killed b", "killed c"]
    {
        assert!(text.contains(step), "{step}: {text}");
    }
    // A killed sandbox's container is gone with it.
    for line in text.lines().filter_map(|l| l.strip_prefix("sandbox ")) {
        let id = line.split_whitespace().nth(1).unwrap();
        until_gone(&format!("e2b-{id}"), Duration::from_secs(30));
    }
}

#[test]
fn a_warm_pool_hands_out_started_containers_and_is_drained_at_stop() {
    let test = "a_warm_pool_hands_out_started_containers_and_is_drained_at_stop";
    let pool = [("CONCH_PLUGINS__PROVISION_DOCKER__POOL", "2")];
    let Some(mut api) = E2bApi::start(test, &pool) else { return };
    let sdk = |code: &str| api.sdk(&["-c", code]);
    // The first create is cold and starts the pool filling.
    sdk("from e2b import Sandbox; Sandbox.create()");
    let maker = api.server.id();
    let warm = || pool_of(maker).len();
    let start = Instant::now();
    while warm() < 2 {
        assert!(start.elapsed() < LIMIT, "the pool never filled: {}", warm());
        std::thread::sleep(Duration::from_millis(100));
    }
    let pooled: std::collections::BTreeSet<String> = pool_of(maker).into_iter().collect();
    // The next one is a warm container (its hostname is its id), and works as any.
    let out = sdk("from e2b import Sandbox; s = Sandbox.create(); \
         print(s.commands.run('hostname; echo warm-$((6*7)); id -u').stdout, end=''); s.kill()");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1..], ["warm-42", "1000"], "{out}");
    assert!(pooled.iter().any(|id| id.starts_with(lines[0])), "{} not in {pooled:?}", lines[0]);
    // SIGTERM: the server kills its sandboxes and drains the pool.
    let pid = maker.to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(api.server.wait().unwrap().success());
    assert!(pool_of(maker).is_empty(), "drained: {:?}", pool_of(maker));
}

/// The documents of a YAML file under `deploy/`, as JSON values.
fn manifests(path: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize as _;
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(path);
    let text = std::fs::read_to_string(&file).unwrap();
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

/// What the Kubernetes manifests say about the image is what the image is: its name, the
/// ports its command serves, its health path, its user and its token variable. (No cluster
/// runs here; this keeps the files true to the image the other tests run.)
#[test]
fn the_kubernetes_manifests_match_the_image() {
    use conch_provider_docker::image::{PORTS, REPO};
    let version = env!("CARGO_PKG_VERSION");
    for file in ["kubernetes/conch-sandbox.yaml", "agent-sandbox/conch-sandbox.yaml"] {
        let docs = manifests(file);
        let pods: Vec<&serde_json::Value> = docs
            .iter()
            .filter_map(|d| match d["kind"].as_str() {
                Some("Deployment") => Some(&d["spec"]["template"]["spec"]),
                Some("SandboxTemplate") => Some(&d["spec"]["podTemplate"]["spec"]),
                _ => None,
            })
            .collect();
        assert_eq!(pods.len(), 1, "{file}: one pod spec");
        let c = &pods[0]["containers"][0];
        assert_eq!(c["image"], format!("{REPO}:{version}"), "{file}");
        let ports: Vec<u64> = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_u64().unwrap())
            .collect();
        assert_eq!(ports, PORTS.map(u64::from), "{file}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health", "{file}");
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], PORTS[0], "{file}");
        assert_eq!(c["securityContext"]["runAsUser"], 1000, "{file}");
        assert_eq!(c["env"][0]["name"], "CONCH_TOKEN", "{file}");
        assert_eq!(pods[0]["automountServiceAccountToken"], false, "{file}");
    }
    let agent = manifests("agent-sandbox/conch-sandbox.yaml");
    let kinds: Vec<&str> = agent.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["SandboxTemplate", "SandboxWarmPool", "SandboxClaim"]);
    for d in &agent {
        assert_eq!(d["apiVersion"], "extensions.agents.x-k8s.io/v1alpha1");
    }
    assert_eq!(agent[1]["spec"]["sandboxTemplateRef"]["name"], agent[0]["metadata"]["name"]);
}

#[test]
fn the_engine_bench_reports_its_rows() {
    if !engine("the_engine_bench_reports_its_rows") {
        return;
    }
    image();
    let bench = std::path::Path::new(env!("CARGO_BIN_EXE_conch-bench"));
    let child = Command::new(bench)
        .args(["--suite", "engine", "--iterations", "1", "--json"])
        .env("CONCH_BENCH_IMAGE", IMAGE)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let paths: Vec<&str> = rows.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(paths.len(), 5, "{paths:?}");
    for r in rows {
        let m = r["measured"].as_f64().unwrap_or(f64::NAN);
        assert!(m.is_finite() && m > 0.0, "{r}");
    }
    assert!(pool_of(pid).is_empty(), "the bench drained its pool: {:?}", pool_of(pid));
}

#[test]
fn mini_swe_agents_swerex_docker_environment_runs_on_the_image() {
    let steps = ["ok execute", "ok cwd", "ok submitted", "ok stopped"];
    let test = "mini_swe_agents_swerex_docker_environment_runs_on_the_image";
    peer_script(test, "CONCH_MINISWE_PYTHON", "mini_swe_agent.py", &steps);
}

/// Runs a peer's own client, `tests/engine/SCRIPT IMAGE`, with the Python that `var` names,
/// and checks it printed every one of `steps`; its stdout. `None` (a skip line printed)
/// without an engine or without `var`.
fn peer_script(test: &str, var: &str, script: &str, steps: &[&str]) -> Option<String> {
    if !engine(test) {
        return None;
    }
    let Ok(python) = std::env::var(var) else {
        println!("SKIP {test}: {var} is not set (.ci/run sets it)");
        return None;
    };
    image();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engine").join(script);
    let out = Command::new(python).arg(script).arg(IMAGE).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for step in steps {
        assert!(text.contains(step), "{step}: {text}");
    }
    Some(text)
}
