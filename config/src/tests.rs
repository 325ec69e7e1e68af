//! Unit tests for composition loading.

use super::*;

#[derive(Debug, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
struct Cfg {
    timeout_ms: u64,
    name: Option<String>,
}

/// A plugin config with no keys (as the registry's `NoConfig`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoKeys {}

#[test]
fn embedded_standard_loads_and_lists_plugins() {
    let c = Composition::from_yaml("embedded:standard", EMBEDDED[0].1).unwrap();
    assert_eq!(
        c.plugins(),
        [
            "bash-local",
            "files-local",
            "jobs",
            "subprocess-local",
            "tool-bash",
            "tool-files",
            "tool-jobs"
        ]
    );
}

#[test]
fn duplicate_yaml_keys_are_rejected_with_the_file_name() {
    let err = Composition::from_yaml("dup.yaml", "plugins:\n  jobs: {}\n  jobs: {}\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("dup.yaml: "), "{msg}");
    assert!(msg.contains("duplicate"), "{msg}");
}

#[test]
fn a_duplicate_key_is_reported_at_its_own_line() {
    let yaml = "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  tool-bash: {}\n  bash-local:\n    timeout_ms: 5\n";
    let msg = Composition::from_yaml("dup.yaml", yaml).unwrap_err().to_string();
    assert!(msg.starts_with("dup.yaml: "), "{msg}");
    assert!(msg.contains("duplicate key `bash-local`"), "{msg}");
    assert!(msg.contains("line 5"), "{msg}");
    // Nested and flow mappings too.
    let yaml = "plugins:\n  p: { a: 1,\n       a: 2 }\n";
    let msg = Composition::from_yaml("dup.yaml", yaml).unwrap_err().to_string();
    assert!(msg.contains("duplicate key `a`") && msg.contains("line 3"), "{msg}");
}

#[test]
fn unknown_top_level_key_is_rejected() {
    let err = Composition::from_yaml("x.yaml", "plugins: {}\nplugns: {}\n").unwrap_err();
    assert_eq!(err.to_string(), "x.yaml: key `plugns`: unknown key; expected one of `plugins`");
}

#[test]
fn unknown_config_field_names_file_plugin_and_key() {
    let c = Composition::from_yaml("bad.yaml", "plugins:\n  p:\n    timeout_mss: 5\n").unwrap();
    let err = c.plugin_config::<Cfg>("p").unwrap_err().to_string();
    assert!(err.starts_with("bad.yaml: plugin `p`: "), "{err}");
    assert!(err.contains("timeout_mss"), "{err}");
}

#[test]
fn wrong_type_names_the_key() {
    let c = Composition::from_yaml("bad.yaml", "plugins:\n  p:\n    timeout_ms: soon\n").unwrap();
    let err = c.plugin_config::<Cfg>("p").unwrap_err().to_string();
    assert_eq!(
        err,
        "bad.yaml: plugin `p`: key `plugins.p.timeout_ms`: invalid type: found string \"soon\", expected u64"
    );
}

#[test]
fn unknown_config_field_is_named_by_its_full_key() {
    let c = Composition::from_yaml("bad.yaml", "plugins:\n  bash-local:\n    timeout_mss: 5\n")
        .unwrap();
    let err = c.plugin_config::<Cfg>("bash-local").unwrap_err().to_string();
    assert_eq!(
        err,
        "bad.yaml: plugin `bash-local`: key `plugins.bash-local.timeout_mss`: unknown key; expected one of `timeout_ms`, `name`"
    );
    let err = c.plugin_config::<NoKeys>("bash-local").unwrap_err().to_string();
    assert_eq!(
        err,
        "bad.yaml: plugin `bash-local`: key `plugins.bash-local.timeout_mss`: unknown key; none are accepted here"
    );
}

#[test]
fn a_scalar_plugin_entry_is_an_error_not_defaults() {
    let c = Composition::from_yaml("s.yaml", "plugins:\n  p: 5\n").unwrap();
    let err = c.plugin_config::<Cfg>("p").unwrap_err().to_string();
    assert!(err.starts_with("s.yaml: plugin `p`: key `plugins.p`: invalid type: found "), "{err}");
}

#[test]
fn empty_and_null_entries_mean_defaults() {
    let c = Composition::from_yaml("e.yaml", "plugins:\n  a: {}\n  b:\n  c: { timeout_ms: 7 }\n")
        .unwrap();
    assert_eq!(c.plugin_config::<Cfg>("a").unwrap(), Cfg::default());
    assert_eq!(c.plugin_config::<Cfg>("b").unwrap(), Cfg::default());
    assert_eq!(c.plugin_config::<Cfg>("c").unwrap(), Cfg { timeout_ms: 7, name: None });
}

#[test]
fn bad_plugin_names_are_rejected() {
    let err = Composition::from_yaml("n.yaml", "plugins:\n  Bad_Name: {}\n").unwrap_err();
    assert!(err.to_string().contains("Bad_Name"), "{err}");
}

#[test]
fn unknown_selector_lists_embedded_names() {
    let err = Composition::load("no-such-composition").unwrap_err();
    assert!(err.to_string().contains("standard"), "{err}");
    assert!(!err.to_string().contains("did you mean"), "nothing is close: {err}");
    let err = Composition::load("termnal").unwrap_err().to_string();
    assert!(
        err.starts_with("composition `termnal` not found (did you mean `terminal`?): "),
        "{err}"
    );
}

fn with_env(yaml: &str, env: &[(&str, &str)]) -> Result<Composition, CompositionError> {
    let env: Vec<(String, String)> =
        env.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
    Composition::from_figment("c.yaml".into(), Figment::from(StrictYaml::string(yaml)), &env)
}

#[test]
fn env_overrides_reach_the_plugin_and_win_over_the_file() {
    let c = with_env(
        "plugins:\n  bash-local: { timeout_ms: 5 }\n",
        &[("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "7"), ("conch_plugins__bash_local__name", "x")],
    )
    .unwrap();
    let cfg = c.plugin_config::<Cfg>("bash-local").unwrap();
    assert_eq!(cfg, Cfg { timeout_ms: 7, name: Some("x".into()) });
}

#[test]
fn env_errors_name_the_key_and_the_variable() {
    let yaml = "plugins:\n  bash-local: { timeout_ms: 5 }\n  jobs:\n";
    let c = with_env(yaml, &[("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "soon")]).unwrap();
    assert_eq!(
        c.plugin_config::<Cfg>("bash-local").unwrap_err().to_string(),
        "c.yaml: plugin `bash-local`: key `plugins.bash-local.timeout_ms` (from environment variable CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS): invalid type: found string \"soon\", expected u64"
    );
    // An entry that is empty in the file gets its keys from the environment alone.
    let c = with_env(yaml, &[("CONCH_PLUGINS__JOBS__TIMEOUT_MSS", "1")]).unwrap();
    assert_eq!(
        c.plugin_config::<Cfg>("jobs").unwrap_err().to_string(),
        "c.yaml: plugin `jobs`: key `plugins.jobs.timeout_mss` (from environment variable CONCH_PLUGINS__JOBS__TIMEOUT_MSS): unknown key; expected one of `timeout_ms`, `name`"
    );
    // A bad value in the file is not blamed on an unrelated variable.
    let c = with_env(
        "plugins:\n  bash-local: { timeout_ms: soon }\n",
        &[("CONCH_PLUGINS__BASH_LOCAL__NAME", "x")],
    )
    .unwrap();
    assert_eq!(
        c.plugin_config::<Cfg>("bash-local").unwrap_err().to_string(),
        "c.yaml: plugin `bash-local`: key `plugins.bash-local.timeout_ms`: invalid type: found string \"soon\", expected u64"
    );
}

#[test]
fn validation_issues_name_the_full_key_and_an_env_origin() {
    let issue = || "must be greater than 0".to_string();
    let c = with_env("plugins:\n  p: {}\n", &[]).unwrap();
    assert_eq!(
        c.config_issue("p", "timeout_ms", issue()).to_string(),
        "c.yaml: plugin `p`: key `plugins.p.timeout_ms`: must be greater than 0"
    );
    let c = with_env("plugins:\n  p: {}\n", &[("CONCH_PLUGINS__P__TIMEOUT_MS", "0")]).unwrap();
    assert_eq!(
        c.config_issue("p", "timeout_ms", issue()).to_string(),
        "c.yaml: plugin `p`: key `plugins.p.timeout_ms` (from environment variable CONCH_PLUGINS__P__TIMEOUT_MS): must be greater than 0"
    );
}

#[test]
fn env_overrides_for_plugins_outside_the_composition_are_ignored() {
    let c = with_env(
        "plugins:\n  jobs: {}\n",
        &[
            ("CONCH_PLUGINS__REMOTE_SANDBOX__URL", "http://x"),
            ("CONCH_PLUGINS__JOBS__TIMEOUT_MS", "3"),
            ("CONCH_PLUGINS__", "x"),
            ("CONCH_PLUGINS____A", "x"),
            ("CONCH_OTHER", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.plugins(), ["jobs"]);
    assert_eq!(c.plugin_config::<Cfg>("jobs").unwrap().timeout_ms, 3);
    // ... but a misspelled plugin in the file is still listed, for the registry to reject.
    let c = with_env("plugins:\n  bash-locl: {}\n", &[]).unwrap();
    assert_eq!(c.plugins(), ["bash-locl"]);
}

#[test]
fn a_setting_wins_over_file_and_env_and_skips_unlisted_plugins() {
    let c = with_env(
        "plugins:\n  bash-local: { timeout_ms: 5, name: file }\n  jobs:\n",
        &[("CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS", "7")],
    )
    .unwrap()
    .with_setting("bash-local", "timeout_ms", 9)
    .with_setting("jobs", "name", "set")
    .with_setting("tool-bash", "name", "ignored");
    let cfg = c.plugin_config::<Cfg>("bash-local").unwrap();
    assert_eq!(cfg, Cfg { timeout_ms: 9, name: Some("file".into()) }, "other keys stay");
    // An entry empty in the file gets the setting.
    assert_eq!(c.plugin_config::<Cfg>("jobs").unwrap().name.as_deref(), Some("set"));
    assert_eq!(c.plugins(), ["bash-local", "jobs"], "no plugin is added");
}

#[test]
fn edit_distance_counts_single_edits_and_suggestions_need_closeness() {
    assert_eq!(edit_distance("bash-locl", "bash-local"), 1);
    assert_eq!(edit_distance("jobs", "jobs"), 0);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(did_you_mean("termnal", &["standard", "terminal"]), " (did you mean `terminal`?)");
    assert_eq!(did_you_mean("zzzzzzzz", &["standard", "terminal"]), "");
    assert_eq!(did_you_mean("", &["standard-long-name"]), "");
}
