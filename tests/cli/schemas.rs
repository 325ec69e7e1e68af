//! Every tool schema of every embedded composition is in the plain subset of JSON Schema
//! that clients with a narrower dialect (Gemini function declarations, OpenAPI 3.0) accept,
//! and says what the tools really accept.

use serde_json::Value;

use super::{conch, remote::Daemon, text};

/// Keywords a narrow client rejects or drops.
const BANNED: &[&str] =
    &["$ref", "$defs", "definitions", "$schema", "oneOf", "anyOf", "allOf", "const", "format"];

const TYPES: &[&str] = &["string", "integer", "number", "boolean", "array", "object"];

/// Checks one (sub)schema at `at`, recursively.
fn check_schema(at: &str, schema: &Value) {
    let obj = schema.as_object().unwrap_or_else(|| panic!("{at}: not an object: {schema}"));
    for key in BANNED {
        assert!(!obj.contains_key(*key), "{at}: `{key}` in {schema}");
    }
    let ty = obj.get("type").and_then(Value::as_str);
    let ty = ty.unwrap_or_else(|| panic!("{at}: `type` is not one plain string: {schema}"));
    assert!(TYPES.contains(&ty), "{at}: type `{ty}`");
    if let Some(d) = obj.get("description") {
        let d = d.as_str().unwrap_or_else(|| panic!("{at}: description is not a string"));
        assert!(!d.contains('\n'), "{at}: description has a hard line break: {d:?}");
    }
    if let Some(values) = obj.get("enum") {
        assert_eq!(ty, "string", "{at}: enums are of strings");
        let values = values.as_array().unwrap();
        assert!(!values.is_empty() && values.iter().all(Value::is_string), "{at}: {values:?}");
    }
    if let Some(d) = obj.get("default") {
        assert!(!d.is_null(), "{at}: a null default");
    }
    match ty {
        "object" => {
            assert_eq!(obj.get("additionalProperties"), Some(&Value::Bool(false)), "{at}");
            let props = obj["properties"].as_object().unwrap_or_else(|| panic!("{at}: properties"));
            for r in obj.get("required").and_then(Value::as_array).into_iter().flatten() {
                let r = r.as_str().unwrap();
                assert!(props.contains_key(r), "{at}: required `{r}` is not a property");
            }
            for (name, p) in props {
                check_schema(&format!("{at}.{name}"), p);
            }
        }
        "array" => check_schema(&format!("{at}[]"), &obj["items"]),
        _ => {}
    }
}

fn tools(composition: &str, env: &[(String, String)]) -> Vec<Value> {
    let out = conch()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .args(["--composition", composition, "tools"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{composition}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str::<Value>(&text(&out)).unwrap().as_array().unwrap().clone()
}

#[test]
fn every_tool_schema_of_every_embedded_composition_is_plain() {
    // The remote compositions connect at build: give them a real daemon.
    let daemon = Daemon::start();
    let mut seen = 0;
    for (name, _) in conch::EMBEDDED {
        let mut env = if name.starts_with("remote-") { daemon.env() } else { Vec::new() };
        if *name == "docker" {
            // Its runtime is a container: the engine tests' image, or a visible skip.
            if !crate::engine::engine(
                "every_tool_schema_of_every_embedded_composition_is_plain (docker)",
            ) {
                continue;
            }
            crate::engine::image();
            let image = crate::engine::IMAGE.to_string();
            env.push(("CONCH_PLUGINS__PROVISION_DOCKER__IMAGE".to_string(), image));
        }
        let listed = tools(name, &env);
        assert!(!listed.is_empty(), "{name} has tools");
        for tool in listed {
            let at = format!("{name}/{}", tool["name"].as_str().unwrap());
            let description = tool["description"].as_str().unwrap();
            assert!(!description.contains('\n'), "{at}: {description:?}");
            check_schema(&at, &tool["input_schema"]);
            seen += 1;
        }
    }
    assert!(seen >= 30, "{seen} tools checked");
}

/// The sandbox composition's escalation fields (an enum) are plain too, and offered there.
#[test]
fn the_sandboxed_bash_offers_escalation_as_a_plain_enum() {
    let listed = tools("sandbox", &[]);
    let bash = listed.iter().find(|t| t["name"] == "bash").unwrap();
    let p = &bash["input_schema"]["properties"];
    assert_eq!(p["sandbox_permissions"]["type"], "string", "{p}");
    assert_eq!(p["sandbox_permissions"]["enum"], serde_json::json!(["require_escalated"]));
    assert_eq!(p["justification"]["type"], "string", "{p}");
    // Elsewhere they are not offered.
    let listed = tools("standard", &[]);
    let p = &listed[0]["input_schema"]["properties"];
    assert!(p.get("sandbox_permissions").is_none() && p.get("justification").is_none());
}

fn call(composition: &str, tool: &str, args: &str) -> (Option<i32>, String, String) {
    let out = conch().args(["--composition", composition, "call", tool, args]).output().unwrap();
    (out.status.code(), text(&out), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn property<'a>(listed: &'a [Value], tool: &str, prop: &str) -> &'a Value {
    let t = listed.iter().find(|t| t["name"] == tool).unwrap();
    &t["input_schema"]["properties"][prop]
}

#[test]
fn timeout_ms_minimum_is_what_the_tools_accept_and_a_clamp_is_reported() {
    let standard = tools("standard", &[]);
    assert_eq!(property(&standard, "bash", "timeout_ms")["minimum"], 1);
    let (code, _, err) = call("standard", "bash", r#"{"command":"true","timeout_ms":0}"#);
    assert_eq!(code, Some(1));
    assert!(err.starts_with("error[invalid_argument]"), "{err}");
    // Above the limit: run with the limit, and say so.
    let (code, out, _) = call("standard", "bash", r#"{"command":"echo hi","timeout_ms":9999999}"#);
    assert_eq!(code, Some(0));
    assert_eq!(out, "[timeout_ms 9999999 is above the limit; used 600000]\nhi\n");
    let (_, out, _) = call("standard", "bash", r#"{"command":"echo hi","timeout_ms":600000}"#);
    assert_eq!(out, "hi\n", "at the limit: no note");

    let minimal = tools("minimal", &[]);
    assert_eq!(property(&minimal, "bash", "timeout_ms")["minimum"], 1);
    let (code, _, err) = call("minimal", "bash", r#"{"command":"true","timeout_ms":0}"#);
    assert_eq!(code, Some(1), "{err}");
    let (_, out, _) = call("minimal", "bash", r#"{"command":"echo hi","timeout_ms":9999999}"#);
    assert_eq!(out, "[timeout_ms 9999999 is above the limit; used 600000]\nhi\n");

    // job_output's wait accepts 0 (look without waiting), as its schema says.
    assert_eq!(property(&standard, "job_output", "timeout_ms")["minimum"], 0);
}

#[test]
fn job_output_reports_a_clamped_wait() {
    let results = super::run_batch(&[
        r#"{"tool":"bash","args":{"command":"echo done","run_in_background":true}}"#,
        r#"{"tool":"job_output","args":{"job_id":"bash-1","wait":true,"timeout_ms":700000}}"#,
    ]);
    let text = results[1]["text"].as_str().unwrap();
    assert!(
        text.starts_with("[timeout_ms 700000 is above the limit; used 600000]\n[job bash-1: "),
        "{text}"
    );
}

#[test]
fn terminal_read_max_lines_zero_is_refused_as_its_schema_says() {
    let terminal = tools("terminal", &[]);
    assert_eq!(property(&terminal, "terminal_read", "max_lines")["minimum"], 1);
    assert_eq!(property(&terminal, "terminal_read", "offset_lines")["minimum"], 0);
    let results = super::run_batch_in(
        "terminal",
        &[
            r#"{"tool":"terminal_open","args":{}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo one"}}"#,
            r#"{"tool":"terminal_read","args":{"session_id":"pty-1","max_lines":0}}"#,
            r#"{"tool":"terminal_read","args":{"session_id":"pty-1","max_lines":1}}"#,
        ],
    );
    assert_eq!(results[2]["ok"], false, "{}", results[2]);
    assert_eq!(results[2]["error"]["code"], "invalid_argument");
    assert!(
        results[2]["error"]["message"].as_str().unwrap().contains("max_lines must be at least 1")
    );
    assert_eq!(results[3]["ok"], true, "{}", results[3]);
}

#[test]
fn terminal_size_view_and_term_are_in_the_schemas_and_do_what_they_say() {
    let terminal = tools("terminal", &[]);
    assert_eq!(
        property(&terminal, "terminal_read", "view")["enum"],
        serde_json::json!(["scrollback", "screen"])
    );
    for (tool, prop) in [
        ("terminal_open", "rows"),
        ("terminal_open", "cols"),
        ("terminal_resize", "rows"),
        ("terminal_resize", "cols"),
    ] {
        assert_eq!(property(&terminal, tool, prop)["minimum"], 1, "{tool}.{prop}");
        assert_eq!(property(&terminal, tool, prop)["maximum"], 1000, "{tool}.{prop}");
    }
    assert_eq!(property(&terminal, "terminal_open", "term")["type"], "string");
    let results = super::run_batch_in(
        "terminal",
        &[
            r#"{"tool":"terminal_open","args":{"rows":12,"cols":70,"term":"xterm"}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"echo $TERM $(stty size)"}}"#,
            r#"{"tool":"terminal_resize","args":{"session_id":"pty-1","rows":20,"cols":90}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"printf 'ab\\bX\\n'; stty size"}}"#,
            r#"{"tool":"terminal_read","args":{"session_id":"pty-1","view":"screen"}}"#,
            r#"{"tool":"terminal_open","args":{"rows":12}}"#,
            r#"{"tool":"terminal_read","args":{"session_id":"pty-1","view":"screen","max_lines":3}}"#,
        ],
    );
    let out = |i: usize| results[i]["text"].as_str().unwrap_or_default().to_string();
    assert!(out(1).contains("\nxterm 12 70\n"), "{}", results[1]);
    assert_eq!(results[2]["ok"], true, "{}", results[2]);
    assert!(out(3).contains("\naX\n20 90\n"), "{}", results[3]);
    let screen = &results[4]["structured"];
    assert_eq!(
        (screen["rows"].as_u64(), screen["cols"].as_u64()),
        (Some(20), Some(90)),
        "{screen}"
    );
    assert_eq!(screen["alternate_screen"], false, "{screen}");
    assert!(screen["text"].as_str().unwrap().contains("\naX\n20 90\n"), "{screen}");
    assert!(out(4).ends_with("; cursor at row 5, col 2]"), "{}", out(4));
    assert_eq!(results[5]["error"]["code"], "invalid_argument", "{}", results[5]);
    assert_eq!(results[6]["error"]["code"], "invalid_argument", "{}", results[6]);
}

#[test]
fn an_unknown_field_lists_only_the_fields_the_composition_offers() {
    let (code, _, err) = call("standard", "bash", r#"{"command":"true","timeout":5}"#);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(
            "unknown field `timeout`, expected one of `command`, `description`, \
             `run_in_background`, `timeout_ms`, `workdir`"
        ),
        "{err}"
    );
    assert!(!err.contains("sandbox_permissions") && !err.contains("justification"), "{err}");
    // Withheld fields get their own reason.
    let (_, _, err) = call("standard", "bash", r#"{"command":"true","justification":"x"}"#);
    assert!(err.contains("apply only under a sandboxed executor"), "{err}");
    // terminal_send without the jobs plugin does not offer run_in_background at all.
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("nojobs.yaml");
    std::fs::write(
        &yaml,
        "plugins: { subprocess-local: {}, terminal-bash: {}, terminals: {}, tool-terminal: {} }\n",
    )
    .unwrap();
    let yaml = yaml.to_str().unwrap();
    let listed = tools(yaml, &[]);
    assert!(property(&listed, "terminal_send", "run_in_background").is_null());
    let (_, _, err) = call(yaml, "terminal_send", r#"{"session_id":"x","text":"y","wat":1}"#);
    assert!(
        err.contains(
            "expected one of `keys`, `max_output_bytes`, `session_id`, `submit`, `text`, \
             `timeout_ms`, `wait_for`\n"
        ),
        "{err}"
    );
}

#[test]
fn terminal_send_offers_keys_waits_and_an_output_cap_with_their_bounds() {
    let terminal = tools("terminal", &[]);
    assert_eq!(property(&terminal, "terminal_send", "keys")["items"]["type"], "string");
    assert_eq!(property(&terminal, "terminal_send", "timeout_ms")["minimum"], 1);
    assert_eq!(property(&terminal, "terminal_send", "timeout_ms")["maximum"], 600_000);
    assert_eq!(property(&terminal, "terminal_send", "max_output_bytes")["minimum"], 64);
    assert_eq!(property(&terminal, "terminal_send", "wait_for")["type"], "string");
    let (_, _, err) =
        call("terminal", "terminal_send", r#"{"session_id":"x","timeout_ms":600001}"#);
    assert!(err.contains("timeout_ms"), "{err}");
}

#[test]
fn a_send_to_a_full_screen_program_says_where_its_screen_is() {
    if !std::path::Path::new("/usr/bin/vim").exists() {
        println!("SKIP a_send_to_a_full_screen_program_says_where_its_screen_is: no /usr/bin/vim");
        return;
    }
    let results = super::run_batch_in(
        "terminal",
        &[
            r#"{"tool":"terminal_open","args":{"rows":10,"cols":40}}"#,
            r#"{"tool":"terminal_send","args":{"session_id":"pty-1","text":"/usr/bin/vim -u NONE -i NONE -N -n"}}"#,
            r#"{"tool":"terminal_read","args":{"session_id":"pty-1","view":"screen"}}"#,
        ],
    );
    let send = &results[1]["structured"];
    assert_eq!(send["full_screen"], true, "{}", results[1]);
    assert!(!send["output"].as_str().unwrap().contains('~'), "{}", results[1]);
    assert!(
        results[1]["text"].as_str().unwrap().ends_with("terminal_read view \"screen\" shows it]"),
        "{}",
        results[1]
    );
    let screen = &results[2]["structured"];
    assert_eq!(screen["alternate_screen"], true, "{screen}");
    assert!(
        screen["text"].as_str().unwrap().lines().filter(|l| *l == "~").count() >= 5,
        "{screen}"
    );
}
