//! Logs on stderr through `CONCH_LOG` and `--log-format`: the spans of tool calls, spawns,
//! kills, sends and teardown appear, and neither a managed `CONCH_*` value nor a token nor
//! the command text does (the values are made unique, so any occurrence is a leak).

use std::process::Output;

use super::conch;

/// A value nothing else on the machine contains.
fn unique(what: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn debug_logs_show_the_spans_and_no_managed_value_token_or_command() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(unique("home"));
    let token = unique("fake-token");
    let marker = unique("marker");
    let args =
        format!(r#"{{"command":"echo $CONCH_HOME; echo {marker}; sleep 100","timeout_ms":1000}}"#);
    let out = conch()
        .env("CONCH_LOG", "debug")
        .env("CONCH_HOME", &home)
        .env("MY_SERVICE_TOKEN", &token)
        .env("CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN", &token)
        .args(["call", "bash", &args])
        .output()
        .unwrap();
    let (text, log) = (stdout(&out), stderr(&out));
    // The managed value was live in the command, so a leak would have had it to leak.
    assert!(text.contains(&home.display().to_string()), "{text}");
    assert!(text.contains("[timed out after 1000ms]"), "{text}");
    for span in [
        "tool_call{tool=\"bash\"",
        "spawn{program=\"bash\" pid=",
        "kill{pid=",
        "owner_dispose{",
        "runtime_shutdown{",
        "teardown{plugin=\"subprocess-local\"}",
        "subprocess_shutdown",
    ] {
        assert!(log.contains(span), "no {span} in the log:\n{log}");
    }
    assert!(log.contains("DEBUG") && log.contains(" INFO "), "{log}");
    assert!(!log.contains(&home.display().to_string()), "CONCH_HOME leaked into the log:\n{log}");
    assert!(!log.contains(&token), "the token leaked into the log:\n{log}");
    assert!(!log.contains(&marker), "the command text reached the log:\n{log}");
}

#[test]
fn json_logs_carry_the_terminal_and_job_spans_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(unique("home"));
    let token = unique("fake-token");
    let lines = [
        r#"{"tool":"terminal_open","args":{"name":"t"}}"#,
        r#"{"tool":"terminal_send","args":{"session_id":"t","text":"echo home=$CONCH_HOME"}}"#,
        r#"{"tool":"terminal_send","args":{"session_id":"t","text":"sleep 100","run_in_background":true}}"#,
        r#"{"tool":"job_kill","args":{"job_id":"pty-send-1"}}"#,
        r#"{"tool":"job_output","args":{"job_id":"pty-send-1","wait":true,"timeout_ms":30000}}"#,
        r#"{"tool":"terminal_close","args":{"session_id":"t"}}"#,
    ];
    let mut child = conch()
        .env("CONCH_LOG", "debug")
        .env("CONCH_HOME", &home)
        .env("SOME_API_KEY", &token)
        .args(["--log-format", "json", "--composition", "terminal", "batch"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let answers: Vec<serde_json::Value> =
        stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(answers.iter().all(|a| a["ok"] == true), "{answers:#?}");
    let shown = answers[1]["structured"]["output"].as_str().unwrap();
    assert!(shown.contains(&format!("home={}", home.display())), "{shown}");
    let log = stderr(&out);
    let mut names = std::collections::BTreeSet::new();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line is one JSON object ({e}): {line}"));
        assert!(v["level"].is_string() && v["target"].is_string(), "{v}");
        for span in v["spans"].as_array().into_iter().flatten().chain(v.get("span")) {
            names.insert(span["name"].as_str().unwrap_or("").to_owned());
        }
    }
    for span in [
        "tool_call",
        "spawn_terminal",
        "terminal_send",
        "job_kill",
        "terminal_close",
        "terminal_terminate",
        "owner_dispose",
        "jobs_dispose",
        "terminals_dispose",
        "runtime_shutdown",
    ] {
        assert!(names.contains(span), "no {span} span in {names:?}:\n{log}");
    }
    assert!(!log.contains(&home.display().to_string()), "CONCH_HOME leaked:\n{log}");
    assert!(!log.contains(&token), "the key leaked:\n{log}");
    assert!(!log.contains("echo home="), "typed text reached the log:\n{log}");
}

#[test]
fn the_default_level_logs_nothing_for_a_clean_call_and_a_bad_filter_says_so() {
    let out = conch()
        .env_remove("CONCH_LOG")
        .args(["call", "bash", r#"{"command":"echo ok"}"#])
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "ok\n");
    assert_eq!(stderr(&out), "", "warn is the default level: nothing to say");
    let out = conch()
        .env("CONCH_LOG", "=[not a filter")
        .args(["call", "bash", r#"{"command":"echo ok"}"#])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(stdout(&out), "ok\n");
    let log = stderr(&out);
    assert!(log.contains("CONCH_LOG=") && log.contains("is not a valid filter"), "{log}");
}
