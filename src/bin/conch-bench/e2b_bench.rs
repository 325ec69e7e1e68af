//! `conch bench --suite e2b`: the e2b SDK's two hot paths through `conch e2b`, next to the
//! same work through conch's own tools and seams in this process, in one run:
//! `commands.run("true")` next to the `bash` tool running `true`, and a 50 MiB
//! `files.write` + `files.read` next to the same bytes written and read through the files
//! seam (`files-local`). The goals bound what the SDK's path (Python, HTTP, Connect framing,
//! base64, multipart) may add: a run at most 10 ms over the tool (a Nagle stall on the SDK's
//! kept connection once cost 40 ms a call). The 50 MiB row has none: its floor (page cache
//! and writeback) moves 60-120 ms between runs here, so it is reported next to it.
//!
//! A third row times the SDK's API mode (`conch e2b --api-key`): `Sandbox.create()` + `kill()`
//! (a workspace, a runtime built from the composition, an envd and a token; then every
//! process stopped, the runtime torn down and the workspace removed), next to building and
//! shutting down the same composition's runtime in process. It is reported, with no goal.
//!
//! The SDK side runs in the Python that `CONCH_E2B_PYTHON` names (`tests/e2b/setup.sh VENV`
//! makes one), which times each call itself and prints the samples as JSON.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use conch_seams::{Files, WriteMode, WriteSpec};
use serde_json::json;

use crate::floors::{Goal, LoopbackServer as Server, Row, owner, render};

/// The file moved each way.
const FILE_BYTES: usize = 50 << 20;

/// Times the SDK's calls; prints `{"run": [ms...], "files": [ms...]}`.
const SDK_SCRIPT: &str = r#"
import json, os, sys, time
from e2b import Sandbox
n, rounds, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sbx = Sandbox.create()
data = os.urandom(50 << 20)
sbx.commands.run("true")
run = []
for _ in range(n):
    t = time.perf_counter()
    sbx.commands.run("true")
    run.append((time.perf_counter() - t) * 1000)
files = []
for _ in range(rounds):
    t = time.perf_counter()
    sbx.files.write(path, data)
    back = sbx.files.read(path, format="bytes")
    files.append((time.perf_counter() - t) * 1000)
    assert len(back) == len(data)
print(json.dumps({"run": run, "files": files}))
"#;

/// Times `Sandbox.create()` + `kill()` in API mode; prints `{"lifecycle": [ms...]}`.
const SDK_LIFECYCLE_SCRIPT: &str = r#"
import json, sys, time
from e2b import Sandbox
n = int(sys.argv[1])
Sandbox.create().kill()
samples = []
for _ in range(n):
    t = time.perf_counter()
    Sandbox.create().kill()
    samples.append((time.perf_counter() - t) * 1000)
print(json.dumps({"lifecycle": samples}))
"#;

/// The API key of the bench's own server.
const BENCH_KEY: &str = "conch-bench-key";

impl Server {
    /// `conch e2b --api-key` on loopback, in `dir`, its workspaces in `dir/sandboxes`.
    fn e2b_api(conch: &Path, dir: &Path) -> anyhow::Result<Self> {
        let sandboxes = dir.join("sandboxes");
        std::fs::create_dir_all(&sandboxes)?;
        let mut command = Command::new(conch);
        command.current_dir(dir).env("HOME", dir).args(["e2b", "--host", "127.0.0.1"]);
        command.args(["--port", "0", "--api-key", BENCH_KEY, "--sandboxes-dir"]).arg(&sandboxes);
        Self::start(command, "e2b sandbox API listening on ")
    }

    /// `conch e2b` on loopback, in `dir`.
    fn e2b(conch: &Path, dir: &Path) -> anyhow::Result<Self> {
        let mut command = Command::new(conch);
        command
            .current_dir(dir)
            // The SDK runs commands as `bash -l`; the machine's dotfiles are not conch's cost.
            .env("HOME", dir)
            .args(["e2b", "--host", "127.0.0.1", "--port", "0"]);
        Self::start(command, "e2b envd listening on ")
    }
}

fn median(mut v: Vec<f64>) -> anyhow::Result<f64> {
    if v.is_empty() {
        bail!("no samples");
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// The SDK's samples, in milliseconds.
fn sdk_samples(
    python: &str,
    addr: &str,
    n: usize,
    rounds: usize,
    path: &Path,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let out = Command::new(python)
        .args(["-c", SDK_SCRIPT, &n.to_string(), &rounds.to_string()])
        .arg(path)
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", format!("http://{addr}"))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {python}"))?;
    if !out.status.success() {
        bail!("the SDK's timing script failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("the SDK's samples")?;
    let list = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    Ok((list("run"), list("files")))
}

/// The SDK's create + kill samples, in milliseconds.
fn sdk_lifecycle(python: &str, addr: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let url = format!("http://{addr}");
    let out = Command::new(python)
        .args(["-c", SDK_LIFECYCLE_SCRIPT, &n.to_string()])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", BENCH_KEY)
        .env_remove("E2B_DEBUG")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {python}"))?;
    if !out.status.success() {
        bail!("the SDK's lifecycle script failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("the SDK's samples")?;
    Ok(v["lifecycle"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
        .unwrap_or_default())
}

async fn seam_round(files: &dyn Files, path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let spec = WriteSpec::new(path, WriteMode::Truncate).atomic();
    let mut w = files.write(spec).await.map_err(|e| anyhow!("{e}"))?;
    for piece in data.chunks(4 << 20) {
        w.write(piece).await.map_err(|e| anyhow!("{e}"))?;
    }
    w.finish().await.map_err(|e| anyhow!("{e}"))?;
    let mut offset = 0u64;
    loop {
        let c = files.read(path, offset, 4 << 20).await.map_err(|e| anyhow!("{e}"))?;
        offset += c.data.len() as u64;
        if c.eof || c.data.is_empty() {
            break;
        }
    }
    anyhow::ensure!(offset == data.len() as u64, "read back {offset} bytes");
    Ok(())
}

/// Runs the suite and renders the table (or JSON).
///
/// # Errors
/// Without `CONCH_E2B_PYTHON`, or when the server, the SDK or a measured call fails.
pub(crate) async fn run(iterations: usize, as_json: bool, conch: &Path) -> anyhow::Result<String> {
    let python = std::env::var("CONCH_E2B_PYTHON").map_err(|_| {
        anyhow!(
            "set CONCH_E2B_PYTHON to a python with the e2b SDK (tests/e2b/setup.sh VENV makes one)"
        )
    })?;
    let n = iterations.max(1);
    let rounds = (n / 10).clamp(3, 10);
    let dir = tempfile::tempdir().context("a scratch directory")?;
    let server = Server::e2b(conch, dir.path())?;
    let (sdk_run, sdk_files) =
        sdk_samples(&python, &server.addr, n, rounds, &dir.path().join("sdk.bin"))?;
    drop(server);
    let lives = (n / 5).clamp(3, 40);
    let api = Server::e2b_api(conch, dir.path())?;
    let sdk_lives = sdk_lifecycle(&python, &api.addr, lives)?;
    drop(api);
    let mut builds = Vec::with_capacity(lives);
    for _ in 0..lives {
        let t = std::time::Instant::now();
        let r = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
        r.shutdown().await;
        builds.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    let runtime = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
    let who = owner();
    let args = json!({"command": "true"});
    let once = || async {
        // A non-zero exit would be data, not an error: `true` printing nothing is the check.
        let out = runtime.call(&who, "bash", args.clone()).await.map_err(|e| anyhow!("{e}"))?;
        anyhow::ensure!(out.text.is_empty(), "the bash tool said: {}", out.text);
        Ok::<_, anyhow::Error>(())
    };
    once().await?;
    let mut tool = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        once().await?;
        tool.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let files: Arc<dyn Files> = runtime
        .seams()
        .files
        .clone()
        .ok_or_else(|| anyhow!("the standard composition binds no files provider"))?;
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 7 + i / 4096) as u8).collect();
    let target = dir.path().join("seam.bin");
    let mut seam = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        seam_round(files.as_ref(), &target, &data).await?;
        seam.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    who.dispose().await;
    runtime.shutdown().await;

    let rows = vec![
        Row {
            path: "commands.run(\"true\") through the e2b SDK",
            unit: "ms",
            measured: median(sdk_run)?,
            floor: Some(median(tool)?),
            floor_name: "the bash tool running true, in process",
            goal: Goal::FloorPlusMs(10.0),
        },
        Row {
            path: "50 MiB files.write + files.read through the e2b SDK",
            unit: "ms",
            measured: median(sdk_files)?,
            floor: Some(median(seam)?),
            floor_name: "the same bytes through the files seam, in process",
            goal: Goal::Report,
        },
        Row {
            path: "Sandbox.create() + kill() through the e2b SDK (API mode)",
            unit: "ms",
            measured: median(sdk_lives)?,
            floor: Some(median(builds)?),
            floor_name: "building and shutting down the standard runtime, in process",
            goal: Goal::Report,
        },
    ];
    render(&rows, n, as_json)
}
