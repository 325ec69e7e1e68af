//! The `conch` binary driven as a user would: call, batch, tools, check, env scrub.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn conch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_conch"));
    c.env_remove("CONCH_HOME");
    // One spill home for this test binary's conch processes: the ones these tests kill on
    // purpose leave their marks there, not in the machine's shared home, where any conch
    // the user starts would sweep after them.
    c.env("CONCH_PLUGINS__SUBPROCESS_LOCAL__SPILL_DIR", test_spill_dir());
    c
}

/// Under cargo's per-target temp dir: kept across runs, where the spill limits bound it.
fn test_spill_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-spills")
}

/// The address a server `child` names on the stderr line starting with `prefix` (then its
/// stderr is drained, so the server never blocks on it); panics with what it printed when
/// no such line comes within 60 s.
fn listening_address(child: &mut std::process::Child, prefix: &str) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("the server's stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(a) = line.strip_prefix(prefix) {
                    return a.trim().to_string();
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => panic!("no `{prefix}` line; stderr:\n{seen}"),
        }
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run_batch(lines: &[&str]) -> Vec<serde_json::Value> {
    run_batch_in("standard", lines)
}

fn run_batch_in(composition: &str, lines: &[&str]) -> Vec<serde_json::Value> {
    batch_text(composition, &[], lines).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Runs `conch batch` with extra ambient `env` and returns its stdout.
fn batch_text(composition: &str, env: &[(&str, &str)], lines: &[&str]) -> String {
    let mut child = conch()
        .envs(env.iter().copied())
        .args(["--composition", composition, "batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "batch exits 0");
    text(&out)
}

#[test]
fn call_bash_prints_the_tool_result() {
    let out = conch().args(["call", "bash", r#"{"command":"echo hello"}"#]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(text(&out), "hello\n");
}

#[test]
fn call_with_bad_arguments_exits_non_zero_with_a_typed_error() {
    let out = conch().args(["call", "bash", r#"{"comand":"echo"}"#]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error[invalid_argument]"), "{err}");
    assert!(err.contains("comand"), "{err}");
}

#[test]
fn call_file_write_then_file_read_and_edit_work_in_the_directory_conch_runs_in() {
    let dir = tempfile::tempdir().unwrap();
    let call = |tool: &str, args: serde_json::Value| {
        conch().current_dir(dir.path()).args(["call", tool, &args.to_string()]).output().unwrap()
    };
    let path = dir.path().join("notes/a.txt");
    let args = serde_json::json!({"path": "notes/a.txt", "content": "one\ntwo\n"});
    let out = call("file_write", args.clone());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error[not_found]: "), "{err}");
    assert!(err.trim_end().ends_with("pass create_dirs: true to create missing directories"));
    let mut args = args;
    args["create_dirs"] = true.into();
    let out = call("file_write", args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text(&out), format!("created {} (8 bytes written)\n", path.display()));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
    let out = call("file_read", serde_json::json!({"path": "notes/a.txt"}));
    assert_eq!(text(&out), "     1\tone\n     2\ttwo\n");
    let edit = serde_json::json!({"path": path, "old_string": "two", "new_string": "2"});
    let out = call("file_edit", edit);
    assert_eq!(
        text(&out),
        format!("edited {}: replaced 1 occurrence\n     1\tone\n     2\t2\n", path.display())
    );
    let out = call("file_read", serde_json::json!({"path": "notes/a.txt", "offset": 5}));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error[invalid_argument]: "), "{err}");
    assert!(err.contains("`offset` 5 is past the end of"), "{err}");
}

#[test]
fn tools_lists_names_and_schemas() {
    let out = conch().arg("tools").output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        v.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "bash",
            "file_read",
            "file_write",
            "file_edit",
            "file_list",
            "job_output",
            "job_list",
            "job_kill"
        ]
    );
    assert_eq!(v[0]["input_schema"]["properties"]["command"]["type"], "string");
    assert!(v[0]["input_schema"]["required"].as_array().unwrap().iter().any(|r| r == "command"));
}

#[test]
fn batch_runs_calls_in_one_runtime_as_one_owner() {
    let results = run_batch(&[
        r#"{"tool":"bash","args":{"command":"echo bg; exit 2","run_in_background":true}}"#,
        r#"{"tool":"job_output","args":{"job_id":"bash-1","wait":true,"timeout_ms":30000}}"#,
        r#"{"tool":"job_list","args":{}}"#,
        "not json",
        r#"{"tool":"nope","args":{}}"#,
    ]);
    assert_eq!(results.len(), 5);
    assert_eq!(results[0]["structured"]["job_id"], "bash-1");
    assert_eq!(results[1]["structured"]["status"], "completed");
    assert_eq!(results[1]["structured"]["output"], "bg\n");
    assert_eq!(results[1]["structured"]["detail"], "exit code: 2");
    assert!(results[2]["text"].as_str().unwrap().contains("bash-1"));
    assert_eq!(results[3]["error"]["code"], "invalid_argument");
    assert_eq!(results[4]["error"]["code"], "not_found");
}

#[test]
fn check_accepts_good_and_rejects_bad_compositions() {
    let out = conch().args(["check", "standard"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Without a FILE it checks the `--composition` one, like every other command.
    let out = conch().args(["--composition", "terminal", "check"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text(&out).starts_with("ok: embedded:terminal "), "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "plugins:\n  subprocess-local: {}\n  bash-local: { timeout_ms: soon }\n")
        .unwrap();
    let out = conch().args(["check", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("timeout_ms"), "{err}");
    assert!(err.starts_with("error[invalid_composition]"), "{err}");
}

#[test]
fn env_overrides_reach_plugin_config() {
    let out = conch()
        .env("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "250")
        .args(["call", "bash", r#"{"command":"sleep 100"}"#])
        .output()
        .unwrap();
    assert!(text(&out).contains("[timed out after 250ms]"), "{}", text(&out));
    let out = conch()
        .env("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MSS", "250")
        .args(["check", "standard"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "an unknown key from the environment is rejected too");
}

#[test]
fn env_override_errors_name_the_key_and_the_variable() {
    let out = conch()
        .env("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "soon")
        .args(["check", "standard"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error[invalid_composition]: embedded:standard: plugin `bash-local`: key `plugins.bash-local.timeout_ms` (from environment variable CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS): invalid type: found string \"soon\", expected u64\n"
    );
    // A range check on an env value says where the value came from too.
    let out = conch()
        .env("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "0")
        .args(["check", "standard"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error[invalid_composition]: embedded:standard: plugin `bash-local`: key `plugins.bash-local.timeout_ms` (from environment variable CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS): must be greater than 0\n"
    );
}

#[test]
fn env_overrides_for_plugins_outside_the_composition_are_ignored() {
    let standard = concat!(env!("CARGO_MANIFEST_DIR"), "/compositions/standard.yaml");
    let out = conch()
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", "http://x")
        .env("CONCH_PLUGINS__TERMINAL_BASH__TIMEOUT_MS", "soon")
        .args(["check", standard])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text(&out).starts_with("ok: "), "{}", text(&out));
    let out = conch()
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__URL", "http://x")
        .args(["--composition", "standard", "call", "bash", r#"{"command":"echo ok"}"#])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text(&out), "ok\n");
    // A typo'd plugin name inside a composition file stays an error.
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "plugins:\n  subprocess-local: {}\n  bash-locl: {}\n").unwrap();
    let out = conch().args(["check", typo.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error[provider_not_found]"), "{err}");
    assert!(err.contains("unknown plugin `bash-locl` (did you mean `bash-local`?)"), "{err}");
}

/// The error examples of docs/compositions.md, each a `$ command` line followed by what it
/// prints on stderr, are exactly what the binary prints. They run in /tmp in the doc; here in
/// a private directory holding the same files.
#[test]
fn documented_error_examples_are_what_the_binary_prints() {
    let doc = include_str!("../../docs/compositions.md");
    let start = doc.find("Errors are typed").expect("docs/compositions.md has the error examples");
    let block = doc[start..].split("```").nth(1).expect("a fenced block follows");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let files = [
        ("bad.yaml", "plugins: { subprocess-local: {}, bash-local: { timeout_ms: soon } }\n"),
        ("typo.yaml", "plugins: { subprocess-local: {}, bash-locl: {} }\n"),
        ("alone.yaml", "plugins: { bash-local: {} }\n"),
        ("two.yaml", "plugins: { subprocess-local: {}, bash-local: {}, pwsh-local: {} }\n"),
        (
            "dup.yaml",
            "plugins: { subprocess-local: {}, bash-local: {}, tool-bash: {}, bash-local: {} }\n",
        ),
        (
            "slow.yaml",
            "plugins: { subprocess-local: {}, bash-local: { timeout_ms: 700000 }, tool-bash: {} }\n",
        ),
        ("notools.yaml", "plugins: { subprocess-local: {}, bash-local: {} }\n"),
    ];
    for (name, yaml) in files {
        assert!(doc.contains(&format!("`{}`", yaml.trim())), "docs/compositions.md shows {name}");
        std::fs::write(root.join(name), yaml).unwrap();
    }
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_conch")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
    let mut checked = 0;
    for pair in lines.chunks(2) {
        let [cmd, want] = pair else { panic!("a command without output: {pair:?}") };
        let cmd = cmd.strip_prefix("$ ").expect("command lines start with `$ `");
        let cmd = cmd.replace("/tmp/", &format!("{}/", root.display()));
        let out = Command::new("sh")
            .env_remove("CONCH_HOME")
            .env("PATH", &path)
            .args(["-c", &cmd])
            .output()
            .unwrap();
        let got =
            String::from_utf8_lossy(&out.stderr).replace(&format!("{}/", root.display()), "/tmp/");
        assert_eq!(got.trim_end(), *want, "docs/compositions.md example `{cmd}`");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} examples");
}

#[test]
fn ambient_credentials_and_managed_names_never_reach_commands() {
    let out = conch()
        .env("AWS_SECRET_ACCESS_KEY", "leak1")
        .env("github_token", "leak2")
        .env("DB_PASSWORD", "leak3")
        .env("CONCH_SESSION_ID", "leak4")
        .env("CONCH_HOME", "/tmp/conch-cli-home")
        .env("PLAIN_VALUE", "kept")
        .args(["call", "bash", r#"{"command":"env"}"#])
        .output()
        .unwrap();
    let env = text(&out);
    for leak in ["leak1", "leak2", "leak3", "leak4"] {
        assert!(!env.contains(leak), "{leak} leaked:\n{env}");
    }
    assert!(env.contains("PLAIN_VALUE=kept"));
    assert!(env.contains("CONCH_SESSION_ID=cli"), "the managed snapshot is injected");
    assert!(env.contains("CONCH_HOME=/tmp/conch-cli-home"));
    assert!(env.contains("TERM=dumb"));
}

#[test]
fn terminal_batch_reaches_stdin_read_keeps_state_and_interrupts() {
    let results = run_batch_in(
        "terminal",
        &[
            r#"{"tool":"terminal_open","args":{"name":"main"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"cd /tmp; export CLI_V=kept"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"python3 -c 'input(\"name? \")'"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"conch"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"read -p 'go? ' x"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"y"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo $CLI_V $(pwd)"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"sleep 1000","run_in_background":true}}"#,
            r#"{"tool":"job_kill","args":{"job_id":"pty-send-1"}}"#,
            r#"{"tool":"job_output","args":{"job_id":"pty-send-1","wait":true,"timeout_ms":30000}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo alive"}}"#,
            r#"{"tool":"terminal_list","args":{}}"#,
            r#"{"tool":"terminal_close","args":{"session_id":"pty-1"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo gone"}}"#,
        ],
    );
    assert_eq!(results.len(), 14, "{results:#?}");
    assert_eq!(results[0]["structured"]["session_id"], "pty-1", "{:?}", results[0]);
    assert_eq!(results[0]["structured"]["name"], "main");
    for i in [1, 2, 3, 4, 5, 6, 10] {
        assert_eq!(
            results[i]["structured"]["wait_reason"], "stdin_read",
            "call {i}: {:?}",
            results[i]
        );
    }
    assert!(results[2]["structured"]["output"].as_str().unwrap().contains("name? "));
    assert!(results[6]["structured"]["output"].as_str().unwrap().contains("kept /tmp"));
    assert_eq!(results[7]["structured"]["job_id"], "pty-send-1");
    assert_eq!(results[9]["structured"]["status"], "killed", "{:?}", results[9]);
    assert!(results[10]["structured"]["output"].as_str().unwrap().contains("alive"));
    assert!(
        results[11]["text"].as_str().unwrap_or_default().contains("pty-1")
            || results[11]["structured"].to_string().contains("pty-1"),
        "{:?}",
        results[11]
    );
    assert_eq!(results[12]["ok"], true, "{:?}", results[12]);
    assert_eq!(results[13]["error"]["code"], "not_found", "{:?}", results[13]);
}

#[test]
fn minimal_composition_is_a_persistent_bash() {
    let results = run_batch_in(
        "minimal",
        &[
            r#"{"tool":"bash","args":{"command":"cd /tmp && export PV=1"}}"#,
            r#"{"tool":"bash","args":{"command":"echo $PV; pwd"}}"#,
        ],
    );
    assert_eq!(results[1]["text"], "1\n/tmp\n", "{results:?}");
}

#[test]
fn bash_returns_when_the_shell_exits_and_reports_what_it_stopped() {
    // The one-shot call must not wait for a background child holding its output.
    let out = run_batch(&[
        r#"{"tool":"bash","args":{"command":"sleep 1000 & echo started","timeout_ms":600000}}"#,
        r#"{"tool":"bash","args":{"command":"sleep 1000 & echo $!","run_in_background":true}}"#,
        r#"{"tool":"job_output","args":{"job_id":"bash-1","wait":true,"timeout_ms":60000}}"#,
    ]);
    let text = out[0]["text"].as_str().unwrap();
    assert!(text.starts_with("started\n"), "{text}");
    assert!(text.contains("[stopped 1 background process that outlived"), "{text}");
    assert!(text.contains("sleep (held the output open)"), "{text}");
    assert!(text.contains("run_in_background"), "the note says what to do instead: {text}");
    let left = &out[0]["structured"]["leftovers"];
    assert_eq!(left.as_array().map(Vec::len), Some(1), "{left}");
    assert_eq!(left[0]["name"], "sleep");
    let pid = left[0]["pid"].as_u64().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z"), "sleep {pid} was stopped: {stat}");
    let job = out[2]["text"].as_str().unwrap();
    assert!(job.contains("stopped 1 process that outlived the shell"), "{job}");
}

#[test]
fn terminal_and_persistent_shells_get_the_managed_env_and_not_ambient_secrets() {
    let env = [("CONCH_SESSION_ID", "leak4"), ("DB_PASSWORD", "leak3")];
    let run = |composition: &str, lines: &[&str]| batch_text(composition, &env, lines);
    let cmd = "echo \"sid=$CONCH_SESSION_ID shell=$CONCH_SHELL pw=${DB_PASSWORD:-none}\"";
    let send = serde_json::json!({"tool":"terminal_send","args":{"session_id":"pty-1","text":cmd}});
    let out = run("terminal", &[r#"{"tool":"terminal_open","args":{}}"#, &send.to_string()]);
    assert!(out.contains("sid=cli shell=1 pw=none"), "{out}");
    let call = serde_json::json!({"tool":"bash","args":{"command":cmd}});
    let out = run("minimal", &[&call.to_string()]);
    assert!(out.contains("sid=cli shell=1 pw=none"), "{out}");
}

#[test]
fn regression_10_a_child_cannot_read_the_secrets_of_conch_through_proc() {
    use std::os::unix::process::CommandExt;
    // Run conch as an unprivileged user (as root, as `nobody`), so the check is the one
    // same-user children face; root could read anything anyway.
    let mut c = conch();
    let as_root = nix_uid_is_root();
    if as_root {
        c.uid(65534).gid(65534).env("HOME", "/tmp");
    }
    let probe = "cat /proc/$PPID/environ >/dev/null 2>&1 && echo readable || echo closed; \
                 tr '\\0' '\\n' </proc/$PPID/environ 2>/dev/null | grep -c CONCH_TEST_SECRET_KEY";
    let out = c
        .current_dir("/tmp")
        .env("CONCH_TEST_SECRET_KEY", "hunter2")
        .env("CONCH_PLUGINS__BASH_LOCAL__CWD", "/tmp")
        .args(["call", "bash", &serde_json::json!({ "command": probe }).to_string()])
        .output()
        .unwrap();
    let stdout = text(&out);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.starts_with("closed\n"),
        "the parent's environ is closed to its child: {stdout}"
    );
    assert!(!stdout.contains("hunter2"));
}

/// True when the tests run as root (then conch is run as `nobody` above).
fn nix_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// True when `/proc/<pid>` is gone or a zombie.
fn pid_gone(pid: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').is_none_or(|i| stat[i + 1..].trim_start().starts_with('Z'))
}

/// The pid a detached process wrote to `path` (it wrote it before conch could stop it).
fn pid_in(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.trim().parse().unwrap_or_else(|_| panic!("a pid in {}: {text:?}", path.display()))
}

#[test]
fn detached_processes_outlive_neither_their_call_nor_their_session_nor_conch() {
    // Neither in the call's group nor holding its output: only ancestry ties it to the call.
    let cmd = "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!";
    let call = serde_json::json!({"command": cmd}).to_string();
    let out = conch().args(["call", "bash", &call]).output().unwrap();
    let text = text(&out);
    let pid: u64 = text.lines().next().and_then(|l| l.parse().ok()).expect("a pid");
    let stopped =
        format!("[stopped 1 background process that outlived the command's shell: {pid} ");
    assert!(text.contains(&stopped), "{text}");
    assert!(!text.contains("held the output"), "{text}");
    assert!(pid_gone(pid), "the detached {pid} outlived its call");

    let dir = tempfile::tempdir().unwrap();
    let pidfile = |n: &str| dir.path().join(n);
    let send = |id: &str, text: &str| {
        serde_json::json!({"tool":"terminal_send","args":{"session_id":id,"text":text}}).to_string()
    };
    // The subshell exits at once; the send returns once the pid is written.
    let detach = |id: &str, how: &str, name: &str| {
        let f = pidfile(name).display().to_string();
        send(
            id,
            &format!(
                "({how} sh -c 'echo $$ > {f}; exec sleep 1000' >/dev/null 2>&1 </dev/null &); \
                 while [ ! -s {f} ]; do sleep 0.01; done"
            ),
        )
    };
    let (a, b) = (pidfile("a").display().to_string(), pidfile("b").display().to_string());
    // Computed markers: the echoed command line cannot be mistaken for the answer.
    let check = format!(
        "for p in $(cat {a} {b}); do grep -qv ') Z' /proc/$p/stat 2>/dev/null && \
         echo ALIVE$((1+1))=$p; done; echo $((6*7))checked"
    );
    let lines = [
        r#"{"tool":"terminal_open","args":{}}"#.to_string(),
        detach("pty-1", "setsid", "a"),
        detach("pty-1", "nohup", "b"),
        r#"{"tool":"terminal_close","args":{"session_id":"pty-1"}}"#.to_string(),
        r#"{"tool":"terminal_open","args":{}}"#.to_string(),
        send("pty-2", &check),
        // Left open: conch's own teardown must take what it detached along.
        detach("pty-2", "setsid", "c"),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let results = run_batch_in("terminal", &lines);
    assert!(results.iter().all(|r| r["ok"] == true), "{results:?}");
    assert_eq!(results[3]["structured"]["survivors"], serde_json::json!([]), "{results:?}");
    let checked = results[5]["structured"]["output"].as_str().unwrap_or_default();
    assert!(checked.contains("42checked") && !checked.contains("ALIVE2="), "close left: {checked}");
    let c = pid_in(&pidfile("c"));
    assert!(pid_gone(c), "the detached {c} outlived conch");
}
mod conformance;
mod e2b;
mod engine;
mod logs;
mod mcp;
mod remote;
mod remote_files;
mod schemas;
mod swerex;

/// `conch sandbox-exec` is the runners' helper: it confines before it execs (a write inside
/// the root lands, one outside does not) and fails closed on a bad policy.
#[test]
fn sandbox_exec_confines_then_execs() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let policy = serde_json::json!({ "mode": "workspace-write", "workspace_root": root.path() });
    let script = format!(
        "echo in > {}/in; echo out > {}/out; echo done",
        root.path().display(),
        outside.path().display()
    );
    let out = conch()
        .args(["sandbox-exec", "--policy", &policy.to_string(), "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(text(&out).contains("done"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(root.path().join("in")).unwrap(), "in\n");
    assert!(!outside.path().join("out").exists(), "wrote outside the root");
    let bad = conch().args(["sandbox-exec", "--policy", "{", "--", "true"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(125), "{}", String::from_utf8_lossy(&bad.stderr));
}

/// `conch-bench` is the helper of the sandbox runners its runtimes build (they default to the
/// running executable), as `conch` is: its `sandbox` suite confines through it.
#[test]
fn conch_bench_is_its_own_sandbox_helper() {
    let bench = || Command::new(env!("CARGO_BIN_EXE_conch-bench"));
    let root = tempfile::tempdir().unwrap();
    let policy = serde_json::json!({ "mode": "workspace-write", "workspace_root": root.path() });
    let script = format!("echo in > {}/in; echo done", root.path().display());
    let out = bench()
        .args(["sandbox-exec", "--policy", &policy.to_string(), "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(text(&out).contains("done"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(root.path().join("in")).unwrap(), "in\n");
    let bad = bench().args(["sandbox-exec", "--policy", "{", "--", "true"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(125), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn check_accepts_both_pwsh_compositions_on_a_machine_without_pwsh() {
    let empty = tempfile::tempdir().unwrap();
    for (name, tools) in [
        (
            "pwsh",
            "file_read, file_write, file_edit, file_list, job_output, job_list, job_kill, pwsh",
        ),
        ("pwsh-minimal", "pwsh"),
    ] {
        // Checking builds the composition; nothing in it starts pwsh.
        let out = conch().env("PATH", empty.path()).args(["check", name]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text(&out), format!("ok: embedded:{name} (tools: {tools})\n"));
        let file = format!("{}/compositions/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        let out = conch().args(["check", &file]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn calling_pwsh_where_there_is_none_is_a_clear_spawn_failed() {
    // An empty PATH for everything conch starts: no pwsh, whatever this machine has.
    let empty = tempfile::tempdir().unwrap();
    for composition in ["pwsh", "pwsh-minimal"] {
        let out = conch()
            .env("PATH", empty.path())
            .args(["--composition", composition, "call", "pwsh", r#"{"command":"'hi'"}"#])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{composition}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("error[spawn_failed]: PowerShell 7 (`pwsh`) was not found on PATH"),
            "{composition}: {err}"
        );
        assert_eq!(text(&out), "", "nothing ran: {composition}");
    }
}

/// A background send whose command ignores SIGINT: killing the job cannot stop the command,
/// and the job says so (instead of a plain "SIGINT delivered"); SIGKILL through
/// terminal_signal then gives the shell back.
#[test]
fn a_killed_send_whose_command_ignores_sigint_says_it_still_runs() {
    let results = run_batch_in(
        "terminal",
        &[
            r#"{"tool":"terminal_open","args":{}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"bash -c 'trap \"\" INT; echo st''arted; exec sleep 1000'","run_in_background":true}}"#,
            r#"{"tool":"job_output","args":{"job_id":"pty-send-1","wait":true,"timeout_ms":1500}}"#,
            r#"{"tool":"job_kill","args":{"job_id":"pty-send-1"}}"#,
            r#"{"tool":"job_output","args":{"job_id":"pty-send-1","wait":true,"timeout_ms":30000}}"#,
            r#"{"tool":"terminal_signal","args":{"session_id":"pty-1","signal":"SIGKILL"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo $((6*7))"}}"#,
        ],
    );
    assert_eq!(results.len(), 7, "{results:#?}");
    // The output streams while the send runs (each byte is read once, by whichever read
    // came after it arrived).
    let running = &results[2]["structured"];
    assert_eq!(running["status"], "running", "{running}");
    let done = &results[4]["structured"];
    let both =
        format!("{}{}", running["output"].as_str().unwrap(), done["output"].as_str().unwrap());
    assert!(both.contains("\nstarted\n"), "{both}");
    assert_eq!(done["status"], "killed", "{done}");
    assert_eq!(done["detail"], "SIGINT delivered; the command still runs", "{done}");
    assert!(done["output"].as_str().unwrap().contains("the command still runs"), "{done}");
    assert_eq!(results[6]["structured"]["wait_reason"], "stdin_read", "{:?}", results[6]);
    assert!(results[6]["structured"]["output"].as_str().unwrap().contains("42"));
}

/// `conch` with its spill home under `dir` (isolated from other runs of the suite).
fn conch_spilling_in(dir: &std::path::Path) -> Command {
    let mut c = conch();
    c.env("CONCH_PLUGINS__SUBPROCESS_LOCAL__SPILL_DIR", dir);
    c
}

#[test]
fn a_spill_path_a_call_prints_stays_readable_after_conch_exits() {
    let dir = tempfile::tempdir().unwrap();
    let out = conch_spilling_in(dir.path())
        .args(["call", "bash", r#"{"command":"seq 1 200000"}"#])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = text(&out);
    let first = text.lines().next().unwrap_or_default();
    let path = first
        .strip_prefix("[output truncated; full output: ")
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or_else(|| panic!("a spill is named: {first}"));
    // The process that wrote it is gone; the path still holds the whole output.
    let spill = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(spill.lines().count(), 200_000);
    assert!(spill.ends_with("199999\n200000\n"));
}

#[test]
fn call_waits_for_the_background_job_it_started_and_prints_its_end() {
    let out = conch()
        .args([
            "call",
            "bash",
            r#"{"command":"sleep 0.3; echo from-the-job","run_in_background":true}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        text(&out),
        "started background job bash-1; read its output with job_output and stop it with job_kill\n\
         job bash-1 (sleep 0.3; echo from-the-job) completed\n\
         [job bash-1: completed]\n\
         from-the-job\n"
    );
    let out = conch()
        .args([
            "call",
            "bash",
            r#"{"command":"echo json-job; exit 3","run_in_background":true}"#,
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(text(&out).trim()).unwrap();
    assert_eq!(v["jobs"][0]["job_id"], "bash-1");
    assert_eq!(v["jobs"][0]["structured"]["status"], "completed");
    assert_eq!(v["jobs"][0]["structured"]["detail"], "exit code: 3");
    assert_eq!(v["jobs"][0]["structured"]["output"], "json-job\n");
    assert_eq!(v["notices"][0]["source_id"], "bash-1");
    // A long job's output is rendered as job_output renders it: the spill is named.
    let out = conch()
        .args(["call", "bash", r#"{"command":"seq 1 300000","run_in_background":true}"#])
        .output()
        .unwrap();
    let text = text(&out);
    assert!(text.contains("\n[output truncated; full output: "), "{}", &text[..400]);
    assert!(text.ends_with("299999\n300000\n"));
}

/// Starts `conch <args>`, waits until `ready` is a line of its stdout and `pidfile` holds a
/// pid, sends `signal`, and returns its exit code and the rest of stdout.
fn interrupt_when(
    args: &[&str],
    stdin: &str,
    ready: &str,
    pidfile: &str,
    signal: &str,
) -> (Option<i32>, String) {
    let mut child = conch()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut lines, &mut line).unwrap() > 0,
            "{ready} never came"
        );
        if line.contains(ready) {
            break;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(pidfile).unwrap_or_default().trim().is_empty() {
        assert!(std::time::Instant::now() < deadline, "{pidfile} never held a pid");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let kill = Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
    drop(input);
    (child.wait().unwrap().code(), rest)
}

#[test]
fn sigterm_or_sigint_stops_what_a_call_or_a_batch_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = |n: &str| dir.path().join(n).display().to_string();
    // A call waiting on its background job.
    let bg = format!("sleep 7781 & echo $! > {}; wait", pidfile("call"));
    let args = serde_json::json!({"command": bg, "run_in_background": true}).to_string();
    let (code, _) = interrupt_when(
        &["call", "bash", &args],
        "",
        "started background job",
        &pidfile("call"),
        "-TERM",
    );
    assert_eq!(code, Some(143));
    let pid = pid_in(std::path::Path::new(&pidfile("call")));
    assert!(pid_gone(pid), "the call's job's sleep {pid} was stopped");
    // A batch in the middle of a foreground call, with a background job running too.
    let job = format!("sleep 7782 & echo $! > {}; wait", pidfile("job"));
    let fg = format!(
        "while [ ! -s {} ]; do sleep 0.01; done; sleep 7783 & echo $! > {}; wait",
        pidfile("job"),
        pidfile("fg")
    );
    let lines = format!(
        "{}\n{}\n",
        serde_json::json!({"tool":"bash","args":{"command":job,"run_in_background":true}}),
        serde_json::json!({"tool":"bash","args":{"command":fg}}),
    );
    // Signalled once line 2's call is surely in flight (its sleep is running).
    let (code, rest) = interrupt_when(&["batch"], &lines, "bash-1", &pidfile("fg"), "-INT");
    assert_eq!(code, Some(130));
    // The call in flight on line 2 gets its line: cancelled.
    let v: serde_json::Value =
        serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{rest:?}: {e}"));
    assert_eq!(v["error"]["code"], "cancelled", "{v}");
    for name in ["job", "fg"] {
        let pid = pid_in(std::path::Path::new(&pidfile(name)));
        assert!(pid_gone(pid), "the batch's {name} sleep {pid} was stopped");
    }
}

#[test]
fn batch_answers_a_line_that_is_not_utf8_and_goes_on() {
    let mut child =
        conch().arg("batch").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"\xef\xbb\xbf{\"tool\":\"bash\",\"args\":{\"command\":\"echo a\"}}\n")
            .unwrap();
        stdin.write_all(b"\xff\xfe\n").unwrap();
        stdin
            .write_all(b"{\"tool\":\"bash\",\"args\":{\"command\":\"echo z\"},\"id\":3}\r\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> =
        text(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["text"], "a\n", "a leading byte-order mark is not part of the call");
    assert_eq!(lines[1]["error"]["code"], "invalid_argument");
    let message = lines[1]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("line 2 is not UTF-8 text"), "{message}");
    assert_eq!(
        (&lines[2]["text"], &lines[2]["id"]),
        (&serde_json::json!("z\n"), &serde_json::json!(3))
    );
}

#[test]
fn call_arguments_that_are_not_json_get_a_typed_error() {
    let out = conch().args(["call", "bash", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error[invalid_argument]: the arguments must be a JSON object"),
        "{err}"
    );
    let out = conch().args(["call", "bash", "nope", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(text(&out).trim()).unwrap();
    assert_eq!(v["error"]["code"], "invalid_argument");
}

#[test]
fn what_a_killed_conch_left_running_is_stopped_by_the_next_conch() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // A grandchild of the job's shell: nothing of the killed conch's own machinery remains
    // to stop it.
    let cmd = format!("sleep 7777 & echo $! > {}; wait", pidfile.display());
    let line = serde_json::json!({"tool":"bash","args":{"command":cmd,"run_in_background":true}});
    let mut batch = conch_spilling_in(dir.path())
        .arg("batch")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = batch.stdin.take().unwrap();
    writeln!(stdin, "{line}").unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(batch.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.contains("bash-1"), "{first}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_to_string(&pidfile).unwrap_or_default().trim().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the job wrote its pid");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let pid = pid_in(&pidfile);
    batch.kill().unwrap();
    batch.wait().unwrap();
    drop(stdin);
    assert!(!pid_gone(pid), "SIGKILL gave conch no chance to stop its job's sleep");
    // The next conch sharing the spill home stops it before it exits.
    let out = conch_spilling_in(dir.path())
        .args(["call", "bash", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(pid_gone(pid), "the killed run's sleep {pid} was stopped by the next run");
}

#[test]
fn batch_answers_every_input_line_in_order_with_its_id_and_line_number() {
    let results = run_batch(&[
        r#"{"tool":"bash","args":{"command":"echo one"},"id":"a"}"#,
        "",
        "   ",
        r#"{"tool":"bash","args":{"command":"echo two"},"id":{"n":7}}"#,
        "{not json",
        r#"{"tool":"bash","args":{"command":"echo x"},"id":3,"extra":1}"#,
        r#"{"args":{},"id":null}"#,
        r#"[1]"#,
        r#"{"tool":"bash","args":{"command":"echo last"}}"#,
    ]);
    assert_eq!(results.len(), 9, "one output line per input line: {results:?}");
    assert_eq!(results[0]["text"], "one\n");
    assert_eq!(results[0]["id"], "a");
    for (i, blank) in [(1, 2), (2, 3)] {
        assert_eq!(results[i]["error"]["code"], "invalid_argument", "{}", results[i]);
        let message = results[i]["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("line {blank} is blank")), "{message}");
    }
    assert_eq!(results[3]["text"], "two\n");
    assert_eq!(results[3]["id"], serde_json::json!({"n": 7}));
    let message = results[4]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("line 5 is not JSON: "), "{message}");
    assert!(results[4].get("id").is_none());
    let message = results[5]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("line 6: unknown key `extra`"), "{message}");
    assert_eq!(results[5]["id"], 3, "the id of a refused call is echoed too");
    assert!(results[6]["error"]["message"].as_str().unwrap().starts_with("line 7: `tool`"));
    assert_eq!(results[6]["id"], serde_json::Value::Null);
    assert!(results[6].as_object().unwrap().contains_key("id"), "a null id is echoed");
    assert!(results[7]["error"]["message"].as_str().unwrap().starts_with("line 8: "));
    assert_eq!(results[8]["text"], "last\n");
    assert!(results[8].get("id").is_none(), "no id, none echoed");
}

#[test]
fn a_key_repeated_in_a_call_is_refused_by_name_and_nothing_runs() {
    // Plain JSON parsing keeps the last of two keys: the harness would log one command and
    // run another.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let line = format!(
        r#"{{"tool":"bash","args":{{"command":"touch {}","command":"touch {}"}},"id":1}}"#,
        a.display(),
        b.display()
    );
    let results = run_batch(&[&line, r#"{"tool":"bash","id":1,"id":2,"args":{"command":"true"}}"#]);
    for (i, key) in [(0, "command"), (1, "id")] {
        assert_eq!(results[i]["error"]["code"], "invalid_argument", "{}", results[i]);
        let message = results[i]["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("line {}: duplicate key `{key}`", i + 1)),
            "{message}"
        );
    }
    let out = conch()
        .args([
            "call",
            "bash",
            &format!(r#"{{"command":"touch {}","command":"true"}}"#, a.display()),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid arguments: duplicate key `command`"), "{err}");
    assert!(!a.exists() && !b.exists(), "nothing ran");
}

#[test]
fn check_refuses_a_composition_without_tools_and_places_a_duplicate_key() {
    let dir = tempfile::tempdir().unwrap();
    for (name, yaml) in
        [("empty.yaml", "plugins: {}\n"), ("exec.yaml", "plugins:\n  subprocess-local: {}\n")]
    {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        let out = conch().args(["check", path.to_str().unwrap()]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error[invalid_composition]: "), "{err}");
        assert!(err.contains("the composition has no tools"), "{err}");
        assert!(err.contains("tool-bash, "), "{err}");
    }
    let path = dir.path().join("dup.yaml");
    std::fs::write(
        &path,
        "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  tool-bash: {}\n  bash-local: {}\n",
    )
    .unwrap();
    let out = conch().args(["check", path.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.ends_with("duplicate key `bash-local` at line 5 column 3\n"), "{err}");
}

#[test]
fn spill_dir_must_be_absolute_and_is_made_when_missing() {
    let out = conch()
        .env("CONCH_PLUGINS__SUBPROCESS_LOCAL__SPILL_DIR", "spills")
        .args(["call", "bash", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spill_dir") && err.contains("must be an absolute path"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let deeper = dir.path().join("not/yet");
    let out = conch_spilling_in(&deeper)
        .args(["call", "bash", r#"{"command":"seq 1 200000"}"#])
        .output()
        .unwrap();
    let text = text(&out);
    let home = deeper.join(format!("conch-spills-{}", nix_uid()));
    assert!(
        text.starts_with(&format!("[output truncated; full output: {}/", home.display())),
        "{}",
        &text[..200]
    );
}

/// This process's effective uid, from /proc.
fn nix_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn bench_json_is_the_chosen_suite_and_an_unknown_suite_is_refused() {
    for (suite, rows) in [("oneshot", 2), ("terminal", 4)] {
        let out = conch()
            .args(["bench", "--suite", suite, "--iterations", "2", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["suite"], suite, "{v}");
        // What the machine runs that shows in tail rows (DAMON, where it is on), as text.
        let notes = v["machine_notes"].as_array().unwrap();
        assert!(notes.iter().all(|n| n.as_str().is_some_and(|n| n.starts_with("DAMON"))), "{v}");
        let damon_on = std::fs::read_dir("/sys/kernel/mm/damon/admin/kdamonds")
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| {
                std::fs::read_to_string(d.path().join("state")).is_ok_and(|s| s.trim() == "on")
            });
        assert_eq!(notes.len(), usize::from(damon_on), "{v}");
        let got = v["rows"].as_array().unwrap();
        assert_eq!(got.len(), rows, "{v}");
        assert!(got.iter().all(|r| r["median_ms"].as_f64().is_some_and(|m| m > 0.0)), "{v}");
    }
    let out = conch().args(["bench", "--suite", "termnal"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("possible values: oneshot, terminal, floors, remote, sandbox"), "{err}");
}

/// The scale suite holds 1,000 terminals and 1,000 jobs in one runtime and 100 clients on a
/// daemon. Its timings are the bench's to judge; what is asserted here is what holds however
/// loaded the machine is: every row is measured, no thread per terminal, and nothing the
/// runtime or the daemon started is left once they tear down.
#[test]
fn the_scale_bench_holds_1000_terminals_without_a_thread_each_and_leaves_nothing() {
    let bench = std::path::Path::new(env!("CARGO_BIN_EXE_conch-bench"));
    let out = Command::new(bench)
        .args(["--suite", "scale", "--iterations", "1", "--json"])
        .args(["--conch", env!("CARGO_BIN_EXE_conch")])
        .env("CONCH_PLUGINS__SUBPROCESS_LOCAL__SPILL_DIR", test_spill_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let row = |path: &str| {
        let r = rows.iter().find(|r| r["path"] == path).unwrap_or_else(|| panic!("{path}: {v}"));
        r["measured"].as_f64().unwrap()
    };
    for r in rows {
        assert!(r["measured"].as_f64().is_some_and(f64::is_finite), "{r}");
    }
    assert!(row("threads with 1,000 terminals open") <= 64.0, "{v}");
    for gone in [
        "terminal leaders alive after teardown",
        "job processes alive after teardown",
        "daemon, 100 clients: errors",
        "daemon, 100 clients: processes left",
    ] {
        assert_eq!(row(gone), 0.0, "{gone}: {v}");
    }
    // The leaders it counted were there to count.
    let leaders = rows.iter().find(|r| r["path"] == "terminal leaders alive after teardown");
    assert_eq!(leaders.unwrap()["floor"].as_f64(), Some(1000.0), "{v}");
}

#[test]
fn bench_runs_conch_bench_next_to_conch_else_on_path_else_says_what_to_build() {
    // The benchmarks are a binary of their own; `conch bench` execs it with its flags.
    // Next to `conch` (as cargo builds them): the global `--composition` reaches the
    // oneshot suite, and its refusal and exit code come back unchanged.
    let out = conch().args(["--composition", "nosuch", "bench", "--iterations", "1"]).output();
    let out = out.unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: composition `nosuch` not found"), "{err}");

    // A `conch` alone in its directory (a hard link: the running executable's own path is
    // where the sibling is looked for, and a symlink would resolve back to target/).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (alone, path_dir) = (dir.path().join("alone"), dir.path().join("path"));
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::create_dir_all(&path_dir).unwrap();
    let lone = alone.join("conch");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_conch"), &lone).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_conch"), &lone).unwrap();
    }
    let run = |path: &str, args: &[&str]| {
        Command::new(&lone)
            .env_remove("CONCH_HOME")
            .env("CONCH_PLUGINS__SUBPROCESS_LOCAL__SPILL_DIR", test_spill_dir())
            .env("PATH", path)
            .args(args)
            .output()
            .unwrap()
    };
    let oneshot = ["bench", "--suite", "oneshot", "--iterations", "1", "--json"];
    // Neither next to it nor on PATH: a typed error that names what to build.
    let out = run(path_dir.to_str().unwrap(), &oneshot);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error[not_found]: `conch bench` runs the `conch-bench` binary")
            && err.contains(&format!("neither next to {} nor on PATH", lone.display()))
            && err.contains("--bin conch-bench`"),
        "{err}"
    );
    // On PATH, a stand-in that prints what it was given: every flag spelled out, and the
    // running `conch` (whose `conch call` the floors suite times); its exit code comes back.
    let stand_in = path_dir.join("conch-bench");
    std::fs::write(&stand_in, "#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit 3\n").unwrap();
    std::fs::set_permissions(&stand_in, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let args = ["--composition", "minimal", "bench", "--suite", "floors", "--log-format", "json"];
    let out = run(path_dir.to_str().unwrap(), &args);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let lone_arg = lone.display().to_string();
    let want = [
        "--composition",
        "minimal",
        "--log-format",
        "json",
        "--suite",
        "floors",
        "--iterations",
        "50",
        "--conch",
        &lone_arg,
    ];
    assert_eq!(text(&out).lines().collect::<Vec<_>>(), want);
    // The real one on PATH: its report is the command's.
    std::fs::remove_file(&stand_in).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_conch-bench"), &stand_in).unwrap();
    let path = format!("{}:{}", path_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = run(&path, &oneshot);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&v["suite"], &v["iterations"]), (&"oneshot".into(), &1.into()), "{v}");
}
