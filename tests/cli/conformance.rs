//! `conch conformance` run by the real binary against the shipped compositions: every case
//! of every suite is listed (run, or skipped with a reason), in the order of the suites'
//! one case list, and the run exits 0. The deliberately broken provider lives in the
//! `conch-broken-test` binary, tested from `tests/it/conformance_command.rs`.

use std::process::Output;

use conch_conformance::cases;

use super::conch;

/// Every (suite, case) the command lists for `--suite all`, in order.
fn every_case() -> Vec<(&'static str, &'static str)> {
    let mut all = Vec::new();
    let mut add = |suite, names: Vec<&'static str>| {
        all.extend(names.into_iter().map(|n| (suite, n)));
    };
    add("subprocess", cases::SUBPROCESS.iter().map(|c| c.name).collect());
    add("terminal-process", cases::TERMINAL_PROCESS.iter().map(|c| c.name).collect());
    add("shell", cases::SHELL.iter().map(|c| c.name).collect());
    add("terminal", cases::TERMINAL.iter().map(|c| c.name).collect());
    add("sandbox", cases::SANDBOX.iter().map(|c| c.name).collect());
    add("files", cases::FILES.iter().map(|c| c.name).collect());
    all
}

fn run(composition: &str, env: &[(String, String)], args: &[&str]) -> Output {
    conch()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .args(["--composition", composition, "conformance"])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `--json` on `composition`, checks exit 0 and one row per case in order, and returns
/// the rows. `unbound` suites must be all SKIP with the composition's reason; the others
/// must have run (nothing FAIL, at least one PASS).
fn passes(composition: &str, env: &[(String, String)], unbound: &[&str]) -> Vec<serde_json::Value> {
    let out = run(composition, env, &["--json"]);
    let text = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("--json prints one JSON object ({e}): {text}\n{}", stderr(&out))
    });
    let rows = v["rows"].as_array().unwrap().clone();
    let failed: Vec<&serde_json::Value> = rows.iter().filter(|r| r["result"] == "FAIL").collect();
    assert!(failed.is_empty(), "{composition}: failed cases: {failed:#?}");
    assert_eq!(out.status.code(), Some(0), "{composition}: {}", stderr(&out));
    let listed: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["suite"].as_str().unwrap(), r["case"].as_str().unwrap())).collect();
    assert_eq!(listed, every_case(), "{composition}: one row per case, in order");
    for suite in ["subprocess", "terminal-process", "shell", "terminal", "sandbox", "files"] {
        let of: Vec<&serde_json::Value> = rows.iter().filter(|r| r["suite"] == suite).collect();
        if unbound.contains(&suite) {
            for r in &of {
                assert_eq!(r["result"], "SKIP", "{r}");
                assert!(r["message"].as_str().unwrap().contains("composition binds no"), "{r}");
            }
        } else {
            assert!(
                of.iter().any(|r| r["result"] == "PASS"),
                "{composition}: {suite} ran: {of:#?}"
            );
        }
    }
    for r in &rows {
        assert!(r["ms"].is_u64(), "{r}");
        if r["result"] == "SKIP" {
            assert!(!r["message"].as_str().unwrap_or("").is_empty(), "a skip says why: {r}");
        }
    }
    assert_eq!(v["failed"], 0);
    assert_eq!(
        v["passed"].as_u64().unwrap() + v["skipped"].as_u64().unwrap(),
        rows.len() as u64,
        "{v}"
    );
    rows
}

#[test]
fn standard_lists_every_case_in_a_table_and_passes() {
    let out = run("standard", &[], &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("conformance of embedded:standard"), "{text}");
    assert!(
        lines[0].contains("subprocess: subprocess-local") && lines[0].contains("shell: bash-local")
    );
    let rows: Vec<Vec<&str>> = lines
        .iter()
        .filter(|l| {
            l.split_whitespace().nth(2).is_some_and(|r| ["PASS", "FAIL", "SKIP"].contains(&r))
        })
        .map(|l| l.split_whitespace().collect())
        .collect();
    let listed: Vec<(&str, &str)> = rows.iter().map(|r| (r[0], r[1])).collect();
    assert_eq!(listed, every_case(), "one row per case, in order:\n{text}");
    for r in &rows {
        assert_ne!(r[2], "FAIL", "{r:?}");
        assert!(r[3].parse::<u64>().is_ok(), "milliseconds: {r:?}");
        if ["terminal", "sandbox"].contains(&r[0]) {
            assert_eq!(r[2..5], ["SKIP", "0", "composition"], "{r:?}");
        }
    }
    let summary = lines.last().unwrap();
    assert!(
        summary.contains(" passed, 0 failed, ") && summary.contains(" skipped in "),
        "{summary}"
    );
}

#[test]
fn terminal_runs_the_terminal_suites_and_passes() {
    let rows = passes("terminal", &[], &["shell", "sandbox"]);
    let pass =
        |suite: &str| rows.iter().filter(|r| r["suite"] == suite && r["result"] == "PASS").count();
    assert_eq!(pass("terminal"), cases::TERMINAL.len(), "every terminal case ran here");
    assert!(pass("terminal-process") > 0);
}

/// Whether `composition`'s sandbox can confine on this machine: one confined call.
pub(super) fn sandbox_works(composition: &str) -> bool {
    let out = conch()
        .args(["--composition", composition, "call", "bash", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    if !out.status.success() {
        println!(
            "SKIP conformance of {composition}: its runner cannot confine here: {}",
            stderr(&out)
        );
    }
    out.status.success()
}

#[test]
fn sandbox_compositions_pass_where_their_runner_confines() {
    for composition in ["sandbox", "sandbox-bwrap"] {
        if !sandbox_works(composition) {
            continue;
        }
        let rows = passes(composition, &[], &["terminal"]);
        // The shell suite runs inside the sandbox, with the temp dir as the workspace root.
        let shell_pass = rows.iter().filter(|r| r["suite"] == "shell" && r["result"] == "PASS");
        assert!(shell_pass.count() > 10, "{composition}: {rows:#?}");
        let confined = rows.iter().any(|r| {
            r["suite"] == "sandbox"
                && r["case"] == "writes_outside_the_root_are_denied"
                && r["result"] == "PASS"
        });
        assert!(confined, "{composition}: the runner was judged, not skipped: {rows:#?}");
    }
}

#[test]
fn the_remote_composition_passes_against_a_real_daemon() {
    let daemon = super::remote::Daemon::start();
    let rows = passes("remote-sandbox", &daemon.env(), &["terminal", "sandbox"]);
    assert!(rows.iter().any(|r| r["suite"] == "shell" && r["result"] == "PASS"));
    // The files suite ran over files-remote, on the daemon's files-local.
    assert!(rows.iter().any(|r| r["suite"] == "files" && r["result"] == "PASS"));
    // The processes ran on the daemon: its log names the spawns it hosted.
    daemon.stderr_with("spawn{program=");
}

#[test]
fn a_suite_the_composition_does_not_bind_is_an_error_naming_what_provides_it() {
    let out = run("standard", &[], &["--suite", "terminal"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("composition binds no terminal seam"), "{err}");
    assert!(err.contains("terminal-bash"), "names the plugin that provides it: {err}");
    assert!(stdout(&out).is_empty(), "no table: {}", stdout(&out));
    let out = run("terminal", &[], &["--suite", "shell"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("bash-local"), "{}", stderr(&out));
}

#[test]
fn one_suite_and_a_case_filter_run_only_those_cases() {
    let out = run("standard", &[], &["--suite", "shell", "--case", "long_command", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        v["rows"].as_array().unwrap().iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["a_long_command_runs_as_its_short_self", "a_long_command_exits_with_its_code"]
    );
}

/// A shell whose program is not installed here (pwsh on a machine without PowerShell) has
/// nothing to judge: its suite is skipped with the provider's own reason (exit 2 when it was
/// the suite asked for) instead of 25 failures that all say the same thing.
#[test]
fn a_shell_that_cannot_start_here_is_skipped_with_its_reason() {
    if conch_conformance::pwsh_on_path().is_ok() {
        println!(
            "SKIP a_shell_that_cannot_start_here_is_skipped_with_its_reason: pwsh is installed"
        );
        return;
    }
    let only = run("pwsh", &[], &["--suite", "shell"]);
    assert_eq!(only.status.code(), Some(2), "{}", stderr(&only));
    let err = stderr(&only);
    assert!(
        err.contains("pwsh-local cannot start here") && err.contains("not found on PATH"),
        "{err}"
    );
    let all = run("pwsh", &[], &["--json"]);
    assert_eq!(all.status.code(), Some(0), "{}", stderr(&all));
    let report: serde_json::Value = serde_json::from_str(&stdout(&all)).unwrap();
    let shell: Vec<&serde_json::Value> =
        report["rows"].as_array().unwrap().iter().filter(|r| r["suite"] == "shell").collect();
    assert_eq!(shell.len(), cases::SHELL.len());
    for row in shell {
        assert_eq!(row["result"], "SKIP", "{row}");
        assert!(row["message"].as_str().unwrap().contains("cannot start here"), "{row}");
    }
}

/// `--suite files` on a composition that binds a files provider: every files case runs and
/// passes, for files-local and for files-sandbox (workspace-write, its root made the temp
/// directory as for the shell suite).
#[test]
fn the_files_suite_passes_for_files_local_and_files_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    for (name, yaml) in [
        ("files-local", "plugins:\n  files-local: {}\n"),
        (
            "files-sandbox",
            "plugins:\n  sandbox-policy:\n    mode: workspace-write\n  files-sandbox: {}\n",
        ),
    ] {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let out = run(path.to_str().unwrap(), &[], &["--suite", "files", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name}: {e}: {}", stderr(&out)));
        assert_eq!(out.status.code(), Some(0), "{name}: {v:#}\n{}", stderr(&out));
        assert_eq!(v["providers"]["files"], name);
        let rows = v["rows"].as_array().unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r["case"].as_str().unwrap()).collect();
        let want: Vec<&str> = cases::FILES.iter().map(|c| c.name).collect();
        assert_eq!(names, want, "{name}: every files case, in order");
        assert!(rows.iter().all(|r| r["result"] == "PASS"), "{name}: {rows:#?}");
    }
    let out = run("minimal", &[], &["--suite", "files"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("composition binds no files seam") && err.contains("files-local"),
        "{err}"
    );
}
