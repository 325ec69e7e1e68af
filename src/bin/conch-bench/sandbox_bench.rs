//! `conch bench --suite sandbox`: the per-call cost of confinement, bash-sandbox under each
//! runner next to bash-local running the same `true`, in alternation in one run.

use anyhow::{anyhow, ensure};
use conch_registry::Runtime;
use serde_json::json;

use crate::floors::{Goal, Row, e, owner, paired, render};

/// The embedded `standard` composition with bash-local swapped for bash-sandbox under
/// `runner` (workspace-write, rooted at the current directory).
fn sandboxed(runner: &str) -> anyhow::Result<Runtime> {
    let yaml = format!(
        "plugins:\n  subprocess-local: {{}}\n  {runner}: {{}}\n  sandbox-policy: {{ mode: workspace-write }}\n  bash-sandbox: {{}}\n  jobs: {{}}\n  tool-bash: {{}}\n  tool-jobs: {{}}\n"
    );
    conch::build_runtime_from_yaml(
        &format!("bench:{runner}"),
        &yaml,
        conch_env::ShellEnv::from_process_env(),
    )
    .map_err(|e| anyhow!("{e}"))
}

/// Runs the measurements and renders the table (or JSON).
///
/// # Errors
/// When a runtime cannot be built or a measured call fails (a runner unavailable here).
pub(crate) async fn run(iterations: usize, as_json: bool) -> anyhow::Result<String> {
    let n = iterations.max(1);
    let o = owner();
    let local = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
    let mut rows = Vec::new();
    for (runner, path) in [
        ("sandbox-landlock", "bash-sandbox `true`, sandbox-landlock"),
        ("sandbox-bwrap", "bash-sandbox `true`, sandbox-bwrap"),
    ] {
        let confined = sandboxed(runner)?;
        let (l, s) = paired(
            n,
            || async {
                let out = local.call(&o, "bash", json!({"command": "true"})).await.map_err(e)?;
                ensure!(out.text.is_empty(), "unexpected output {:?}", out.text);
                Ok(())
            },
            || async {
                let out = confined.call(&o, "bash", json!({"command": "true"})).await.map_err(e)?;
                ensure!(out.text.is_empty(), "unexpected output {:?}", out.text);
                Ok(())
            },
        )
        .await?;
        rows.push(Row {
            path,
            unit: "ms",
            measured: s,
            floor: Some(l),
            floor_name: "bash-local `true`",
            goal: Goal::Report,
        });
        confined.shutdown().await;
    }
    o.dispose().await;
    local.shutdown().await;
    render(&rows, n, as_json)
}
