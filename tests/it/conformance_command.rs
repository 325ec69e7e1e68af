//! `conch conformance` against a deliberately broken provider: the `conch-broken-test`
//! binary is the conch CLI (`conch::cli::main`) linked with a `subprocess-broken` plugin,
//! as a provider author would build it. The run must fail, name the case, and keep going.

use std::process::Output;

fn conch_broken(yaml: &str, args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_conch-broken-test"))
        .arg("--composition")
        .arg(&path)
        .arg("conformance")
        .args(args)
        .output()
        .unwrap();
    (out, dir)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A provider whose spawns leak a `CONCH_*` name fails exactly the scrub case, and the run
/// exits 1 naming it; every other case of the suite still runs and passes.
#[test]
fn a_provider_that_leaks_an_env_name_fails_the_run_naming_the_case() {
    let yaml = "plugins:\n  subprocess-broken: {}\n  bash-local: {}\n  jobs: {}\n  tool-bash: {}\n  \
                tool-jobs: {}\n";
    let (out, _dir) = conch_broken(yaml, &["--suite", "subprocess"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().next().unwrap().contains("subprocess: subprocess-broken"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split_whitespace().nth(2).is_some_and(|r| ["PASS", "FAIL", "SKIP"].contains(&r))
        })
        .collect();
    let expected = conch_conformance::cases::SUBPROCESS.len()
        + conch_conformance::cases::TERMINAL_PROCESS.len();
    assert_eq!(rows.len(), expected, "every case of the suite ran: {text}");
    let failed: Vec<&&str> = rows.iter().filter(|l| l.contains(" FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{text}");
    let row = failed[0];
    assert!(
        row.starts_with("subprocess ") && row.contains("ambient_managed_env_is_scrubbed"),
        "{row}"
    );
    assert!(row.contains("managed name leaked: CONCH_BROKEN_LEAK=1"), "the panic message: {row}");
    assert!(row.contains("(at conformance/src/subprocess.rs:"), "where it failed: {row}");
    assert!(text.contains("1 failed"), "{text}");
    assert!(text.contains("FAILED subprocess::ambient_managed_env_is_scrubbed"), "{text}");
}

/// A case that never finishes fails at the deadline instead of stopping the run.
#[test]
fn a_case_that_hangs_fails_at_the_case_timeout() {
    let yaml = "plugins:\n  subprocess-broken: { leak_env: false, hang_which: sh }\n";
    let args = [
        "--suite",
        "subprocess",
        "--case",
        "which_resolves_on_path",
        "--case-timeout-ms",
        "1000",
        "--json",
    ];
    let (out, _dir) = conch_broken(yaml, &args);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["case"], "which_resolves_on_path");
    assert_eq!(rows[0]["result"], "FAIL");
    assert_eq!(rows[0]["message"], "did not finish within 1000 ms");
    assert!(rows[0]["ms"].as_u64().unwrap() >= 1000, "{v}");
    assert_eq!((v["passed"].as_u64(), v["failed"].as_u64()), (Some(0), Some(1)));
}

/// The same provider without its defects passes: the failures above are the defects'.
#[test]
fn the_provider_without_its_defects_passes() {
    let yaml = "plugins:\n  subprocess-broken: { leak_env: false }\n";
    let (out, _dir) = conch_broken(yaml, &["--suite", "subprocess", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], 0, "{v:#}");
    assert_eq!(out.status.code(), Some(0));
}
