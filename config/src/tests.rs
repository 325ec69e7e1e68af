//! Unit tests for composition loading.

use super::*;

#[derive(Debug, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
struct Cfg {
    timeout_ms: u64,
    name: Option<String>,
}

#[test]
fn embedded_standard_loads_and_lists_plugins() {
    let c = Composition::from_yaml("embedded:standard", EMBEDDED[0].1).unwrap();
    assert_eq!(c.plugins(), ["bash-local", "jobs", "subprocess-local", "tool-bash", "tool-jobs"]);
}

#[test]
fn duplicate_yaml_keys_are_rejected_with_the_file_name() {
    let err = Composition::from_yaml("dup.yaml", "plugins:\n  jobs: {}\n  jobs: {}\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("dup.yaml: "), "{msg}");
    assert!(msg.contains("duplicate"), "{msg}");
}

#[test]
fn unknown_top_level_key_is_rejected() {
    let err = Composition::from_yaml("x.yaml", "plugins: {}\nplugns: {}\n").unwrap_err();
    assert!(err.to_string().contains("plugns"), "{err}");
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
    assert!(err.contains("timeout_ms"), "{err}");
    assert!(err.contains("soon"), "{err}");
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
}
