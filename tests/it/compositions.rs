//! Every shipped composition resolves; every resolution error is clear and typed.

use conch_config::Composition;
use conch_env::ShellEnv;
use conch_registry::{RegistryError, Runtime};
use conch_seams::ErrorCode;

fn build(yaml: &str) -> Result<Runtime, RegistryError> {
    conch::link_all();
    let c = Composition::from_yaml("comp.yaml", yaml)?;
    Runtime::build(&c, ShellEnv::new("/tmp/conch-test-home".into()))
}

fn err(yaml: &str) -> RegistryError {
    build(yaml).expect_err("composition must be rejected")
}

#[test]
fn registered_plugins_are_exactly_the_expected_set() {
    conch::link_all();
    let names: Vec<&str> = conch::plugins().unwrap().iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "approval-allowlist",
            "approval-deny",
            "approval-prompt",
            "bash-local",
            "bash-sandbox",
            "files-local",
            "files-remote",
            "files-sandbox",
            "jobs",
            "provision-docker",
            "pwsh-local",
            "pwsh-sandbox",
            "remote-provisioned",
            "remote-sandbox",
            "sandbox-bwrap",
            "sandbox-landlock",
            "sandbox-none",
            "sandbox-policy",
            "subprocess-local",
            "terminal-bash",
            "terminals",
            "test-second-subprocess",
            "tool-bash",
            "tool-bash-persistent",
            "tool-files",
            "tool-jobs",
            "tool-pwsh",
            "tool-pwsh-persistent",
            "tool-terminal"
        ]
    );
}

/// Compositions whose build needs a world beyond this process: a daemon (`remote-*`) or a
/// container engine (`docker`).
fn elsewhere(name: &str) -> bool {
    name.starts_with("remote-") || name.starts_with("docker")
}

#[tokio::test]
async fn every_shipped_composition_builds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compositions");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let c = Composition::from_yaml(
            &path.display().to_string(),
            &std::fs::read_to_string(&path).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        if path.file_name().and_then(|n| n.to_str()).is_some_and(elsewhere) {
            // Building one connects to a daemon (or makes a container); here it must plan
            // (every plugin known, every seam bound). The remote tests build them against a
            // real daemon, the engine tests (tests/cli/engine.rs) on a real Docker engine.
            conch_registry::plan(&c).unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
            continue;
        }
        let rt = Runtime::build(&c, ShellEnv::new("/tmp/conch-test-home".into()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!rt.tools().is_empty(), "{} exposes tools", path.display());
        rt.shutdown().await;
        seen += 1;
    }
    assert!(seen >= 1, "found compositions in {}", dir.display());
}

/// Every tool name any tool's description or schema mentions, and whether it says
/// `run_in_background` in its description without offering it.
fn dangling_mentions(rt: &Runtime) -> Vec<String> {
    const NAMES: [&str; 9] = [
        "job_output",
        "job_list",
        "job_kill",
        "terminal_open",
        "terminal_send",
        "terminal_read",
        "terminal_signal",
        "terminal_list",
        "terminal_close",
    ];
    let mut bad = Vec::new();
    for t in rt.tools() {
        let schema = t.input_schema();
        let text = format!("{} {}", t.description(), schema);
        for name in NAMES {
            if text.contains(name) && rt.tool(name).is_none() {
                bad.push(format!("{} mentions {name}", t.name()));
            }
        }
        if t.description().contains("run_in_background")
            && schema["properties"].get("run_in_background").is_none()
        {
            bad.push(format!("{} describes run_in_background without offering it", t.name()));
        }
    }
    bad
}

#[tokio::test]
async fn no_tool_text_mentions_a_tool_or_argument_the_composition_lacks() {
    let without_jobs = [
        "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  tool-bash: {}\n",
        "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  tool-terminal: {}\n",
        "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  jobs: {}\n  tool-jobs: {}\n  \
         tool-bash:\n    enable_run_in_background: false\n",
    ];
    let mut yamls: Vec<String> = without_jobs.iter().map(|s| (*s).to_string()).collect();
    yamls.extend(
        conch::EMBEDDED.iter().filter(|(n, _)| !elsewhere(n)).map(|(_, y)| (*y).to_string()),
    );
    for yaml in &yamls {
        let rt = build(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        assert_eq!(dangling_mentions(&rt), Vec::<String>::new(), "{yaml}");
        rt.shutdown().await;
    }
    // Without jobs, the shell tools do not offer run_in_background at all.
    let rt = build(without_jobs[0]).unwrap();
    let bash = rt.tool("bash").unwrap();
    assert!(bash.input_schema()["properties"].get("run_in_background").is_none());
    assert!(!bash.description().contains("job"), "{}", bash.description());
    rt.shutdown().await;
}

#[test]
fn a_tool_pointing_to_a_tool_the_composition_lacks_is_refused_naming_the_fix() {
    // The jobs seam without its tools: background jobs could start but never be read.
    for (yaml, tool, plugin) in [
        (
            "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  jobs: {}\n  tool-bash: {}\n",
            "bash",
            "tool-bash",
        ),
        (
            "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  jobs: {}\n  \
             tool-terminal: {}\n",
            "terminal_send",
            "tool-terminal",
        ),
    ] {
        let e = err(yaml);
        assert_eq!(e.code(), ErrorCode::InvalidComposition, "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "comp.yaml: tool `{tool}` (plugin `{plugin}`) points the model to `job_output`"
            )),
            "{msg}"
        );
        assert!(msg.contains("add `tool-jobs: {}`"), "{msg}");
        assert!(msg.contains("enable_run_in_background: false"), "{msg}");
    }
}

#[tokio::test]
async fn standard_has_bash_and_job_tools_in_dependency_order() {
    let rt = crate::standard();
    let names: Vec<&str> = rt.tools().iter().map(|t| t.name()).collect();
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
    let plan =
        conch_registry::plan(&Composition::from_yaml("s", conch::EMBEDDED[0].1).unwrap()).unwrap();
    let order = plan.names();
    let pos = |n: &str| order.iter().position(|x| *x == n).unwrap();
    assert!(pos("subprocess-local") < pos("bash-local"));
    assert!(pos("bash-local") < pos("tool-bash"));
    assert!(pos("jobs") < pos("tool-jobs"));
    rt.shutdown().await;
}

#[test]
fn unknown_plugin_is_named_with_a_suggestion() {
    let e = err("plugins:\n  subprocess-local: {}\n  bash-locl: {}\n");
    assert_eq!(e.code(), ErrorCode::ProviderNotFound);
    let msg = e.to_string();
    assert!(msg.contains("comp.yaml"), "{msg}");
    assert!(msg.contains("`bash-locl`"), "{msg}");
    assert!(msg.contains("did you mean `bash-local`"), "{msg}");
    assert!(msg.contains("available: approval-allowlist, approval-deny"), "{msg}");
    assert!(
        msg.contains("bash-local, bash-sandbox, files-local, files-remote, files-sandbox, jobs"),
        "{msg}"
    );
}

// A second real subprocess provider, registered only in this test binary, so a composition
// can name two providers of one seam.
fn build_second(
    _: &conch_registry::BuildContext<'_>,
) -> conch_seams::Result<conch_registry::PluginOutput> {
    Ok(conch_registry::PluginOutput::seam(conch_registry::SeamHandle::Subprocess(
        std::sync::Arc::new(conch_provider_local::LocalSubprocess::new(Default::default())),
    )))
}

conch_registry::register_plugin!(conch_registry::PluginEntry {
    name: "test-second-subprocess",
    provides: Some(conch_registry::SeamId::Subprocess),
    requires: &[],
    description: "test-only second subprocess provider",
    build: build_second,
});

#[test]
fn two_providers_of_one_seam_are_both_named() {
    let e = err("plugins:\n  subprocess-local: {}\n  test-second-subprocess: {}\n");
    assert_eq!(e.code(), ErrorCode::DuplicateProvider);
    let msg = e.to_string();
    assert!(
        msg.contains("`subprocess-local`") && msg.contains("`test-second-subprocess`"),
        "{msg}"
    );
    assert!(msg.contains("subprocess seam"), "{msg}");
}

#[test]
fn bash_and_pwsh_executors_together_are_a_duplicate_shell_naming_both() {
    for yaml in [
        "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  pwsh-local: {}\n",
        "plugins:\n  subprocess-local: {}\n  pwsh-local: {}\n  bash-local: {}\n  tool-bash: {}\n",
    ] {
        let e = err(yaml);
        assert_eq!(e.code(), ErrorCode::DuplicateProvider, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("`bash-local`") && msg.contains("`pwsh-local`"), "{msg}");
        assert!(msg.contains("shell seam") && msg.contains("keep exactly one"), "{msg}");
    }
}

#[test]
fn a_shell_tool_refuses_an_executor_of_the_other_dialect() {
    let e = err("plugins:\n  subprocess-local: {}\n  bash-local: {}\n  tool-pwsh: {}\n");
    assert_eq!(e.code(), ErrorCode::InvalidComposition, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("`tool-pwsh` runs pwsh commands"), "{msg}");
    assert!(msg.contains("`bash-local` speaks bash") && msg.contains("use tool-bash"), "{msg}");
    let e = err("plugins:\n  subprocess-local: {}\n  pwsh-local: {}\n  tool-bash: {}\n");
    assert!(e.to_string().contains("use tool-pwsh"), "{e}");
    let e = err(
        "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  tool-pwsh-persistent: {}\n",
    );
    assert_eq!(e.code(), ErrorCode::InvalidComposition, "{e}");
    assert!(e.to_string().contains("`shell_dialect: pwsh`"), "{e}");
    let e = err(
        "plugins:\n  subprocess-local: {}\n  terminal-bash: { shell_dialect: zsh }\n  terminals: {}\n",
    );
    assert_eq!(e.code(), ErrorCode::InvalidComposition, "{e}");
    assert!(e.to_string().contains("plugins.terminal-bash.shell_dialect"), "{e}");
    // Refused when the config is parsed, naming what is accepted.
    assert!(e.to_string().contains("unknown variant `zsh`; expected one of `bash`, `pwsh`"), "{e}");
}

#[tokio::test]
async fn the_pwsh_compositions_build_without_pwsh_and_speak_pwsh() {
    for (name, tools) in [
        (
            "pwsh",
            &[
                "file_read",
                "file_write",
                "file_edit",
                "file_list",
                "job_output",
                "job_list",
                "job_kill",
                "pwsh",
            ][..],
        ),
        ("pwsh-minimal", &["pwsh"][..]),
    ] {
        let yaml = conch::EMBEDDED.iter().find(|(n, _)| *n == name).unwrap().1;
        let rt = build(yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        let names: Vec<&str> = rt.tools().iter().map(|t| t.name()).collect();
        assert_eq!(names, tools, "{name}");
        let pwsh = rt.tool("pwsh").unwrap();
        let description = pwsh.description();
        assert!(description.contains("PowerShell 7 (pwsh)"), "{description}");
        assert!(!description.contains("bash"), "pwsh wording only: {description}");
        let schema = pwsh.input_schema().to_string();
        assert!(!schema.contains("bash"), "{schema}");
        rt.shutdown().await;
    }
}

#[test]
fn duplicate_yaml_key_is_rejected() {
    let e = err("plugins:\n  jobs: {}\n  jobs: {}\n");
    assert_eq!(e.code(), ErrorCode::InvalidComposition);
    assert!(e.to_string().contains("duplicate"), "{e}");
}

#[test]
fn missing_required_seam_names_the_requirer() {
    let e = err("plugins:\n  bash-local: {}\n  tool-bash: {}\n");
    assert_eq!(e.code(), ErrorCode::SeamUnbound);
    let msg = e.to_string();
    assert!(msg.contains("`bash-local` requires the subprocess seam"), "{msg}");
    assert!(msg.contains("subprocess-local"), "suggests the provider: {msg}");
}

#[test]
fn bad_config_value_names_file_plugin_and_key() {
    let e = err("plugins:\n  subprocess-local: {}\n  bash-local: { timeout_ms: soon }\n");
    assert_eq!(e.code(), ErrorCode::InvalidComposition);
    let msg = e.to_string();
    assert!(msg.contains("comp.yaml"), "{msg}");
    assert!(msg.contains("bash-local"), "{msg}");
    assert!(msg.contains("timeout_ms"), "{msg}");
}

#[test]
fn unknown_config_field_is_rejected() {
    let e = err("plugins:\n  subprocess-local: {}\n  bash-local: { timeout: 5 }\n");
    assert_eq!(e.code(), ErrorCode::InvalidComposition);
    assert!(e.to_string().contains("timeout"), "{e}");
}

#[test]
fn out_of_range_config_value_names_the_key() {
    let e = err("plugins:\n  subprocess-local: {}\n  bash-local: { timeout_ms: 700000 }\n");
    assert_eq!(e.code(), ErrorCode::InvalidComposition);
    assert!(e.to_string().contains("max_timeout_ms"), "{e}");
}
