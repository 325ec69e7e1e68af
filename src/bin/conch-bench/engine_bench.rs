//! `conch bench --suite engine`: sandboxes on the local Docker engine (`provision-docker`),
//! create to first command, next to a bare `docker run` of the same image in the same run.
//!
//! - Cold, N = 1: building the `docker` composition's runtime (a container made, started and
//!   answering, the client connected) and its `bash` tool running `true`, next to
//!   `docker run --rm IMAGE true` (goal: at most 1.5x).
//! - Warm, N = 1: the same from a filled pool (`pool`), the container already started
//!   (goal: at most 50 ms).
//! - N = 20 at once, cold and warm: until all twenty ran their first command, next to twenty
//!   `docker run --rm IMAGE true` at once (cold goal: 1.5x; warm is reported).
//! - The memory of an idle sandbox (the engine's own count for the container), reported.
//!
//! The image is `CONCH_BENCH_IMAGE`, else `conch-sandbox:latest` (`conch image build`); a
//! machine without an engine or the image fails the suite, saying which.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use conch_config::Composition;
use conch_env::ShellEnv;
use conch_registry::Runtime;
use serde_json::json;

use crate::bench::ms;
use crate::floors::{Goal, Row, median, owner, render};

fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker").args(args).output().context("running the docker CLI")?;
    if !out.status.success() {
        bail!("docker {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The `docker` composition on `image`, with a pool of `pool`.
fn composition(image: &str, pool: usize) -> anyhow::Result<Composition> {
    Ok(Composition::load("docker")
        .map_err(|e| anyhow!("{e}"))?
        .with_setting("provision-docker", "image", image)
        .with_setting("provision-docker", "pool", pool))
}

/// Builds a runtime (its sandbox made) and runs `true` through its bash tool; the runtime.
async fn first_command(c: &Composition) -> anyhow::Result<Runtime> {
    let c = c.clone();
    let runtime =
        tokio::task::spawn_blocking(move || Runtime::build(&c, ShellEnv::from_process_env()))
            .await?
            .map_err(|e| anyhow!("{e}"))?;
    let o = owner();
    let out =
        runtime.call(&o, "bash", json!({"command": "true"})).await.map_err(|e| anyhow!("{e}"))?;
    o.dispose().await;
    if out.structured.as_ref().and_then(|s| s["exit_code"].as_i64()) != Some(0) {
        bail!("`true` in a sandbox did not exit 0: {}", out.text);
    }
    Ok(runtime)
}

/// `n` at once of `f`; the time until all are done.
async fn all_at_once<F, Fut>(n: usize, f: F) -> anyhow::Result<(Duration, Vec<Runtime>)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<Runtime>>> + Send + 'static,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..n).map(|_| tokio::spawn(f())).collect();
    let mut kept = Vec::new();
    for t in tasks {
        if let Some(r) = t.await?? {
            kept.push(r);
        }
    }
    Ok((start.elapsed(), kept))
}

async fn shut(runtimes: Vec<Runtime>) {
    futures::future::join_all(runtimes.iter().map(Runtime::shutdown)).await;
}

/// Waits until `n` warm containers wait in the pool (their owner label is `pool`).
async fn pool_filled(n: usize) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let ids = docker(&["ps", "-q", "--filter", "label=conch.owner=pool"])?;
        if ids.lines().count() >= n {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the pool never reached {n} warm containers");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the suite and renders the table (or JSON).
///
/// # Errors
/// No engine, no image, or a sandbox that fails.
pub(crate) async fn run(iterations: usize, as_json: bool) -> anyhow::Result<String> {
    let n = iterations.clamp(1, 10);
    let image =
        std::env::var("CONCH_BENCH_IMAGE").unwrap_or_else(|_| "conch-sandbox:latest".into());
    docker(&["image", "inspect", "--format", "{{.Id}}", &image])
        .with_context(|| format!("no image {image}: run `conch image build` first"))?;
    let bare = |image: String| async move {
        tokio::task::spawn_blocking(move || docker(&["run", "--rm", &image, "true"])).await??;
        Ok::<_, anyhow::Error>(None)
    };
    let cold = composition(&image, 0)?;
    let mut rows = Vec::new();

    // N = 1, cold, alternating with the floor.
    let (mut floor, mut measured) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        bare(image.clone()).await?;
        floor.push(t.elapsed());
        let t = Instant::now();
        let r = first_command(&cold).await?;
        measured.push(t.elapsed());
        r.shutdown().await;
    }
    rows.push(Row {
        path: "create to first command, cold, N = 1",
        unit: "ms",
        measured: median(measured),
        floor: Some(median(floor.clone())),
        floor_name: "`docker run --rm IMAGE true`",
        goal: Goal::Ratio(1.5),
    });

    // N = 1, warm: a pool of one, refilled between rounds.
    let warm = composition(&image, 1)?;
    let r = first_command(&warm).await?; // fills the pool
    r.shutdown().await;
    let mut measured = Vec::new();
    for _ in 0..n {
        pool_filled(1).await?;
        let t = Instant::now();
        let r = first_command(&warm).await?;
        measured.push(t.elapsed());
        r.shutdown().await;
    }
    rows.push(Row {
        path: "create to first command, warm pool, N = 1",
        unit: "ms",
        measured: median(measured),
        floor: Some(median(floor)),
        floor_name: "`docker run --rm IMAGE true`",
        goal: Goal::AtMostMs(50.0),
    });

    // N = 20 at once.
    let (floor20, _) = all_at_once(20, || bare(image.clone())).await?;
    let c = Arc::new(cold);
    let (cold20, runtimes) = all_at_once(20, || {
        let c = Arc::clone(&c);
        async move { first_command(&c).await.map(Some) }
    })
    .await?;
    // An idle sandbox's memory, while twenty are up.
    let ids = docker(&["ps", "-q", "--filter", "label=conch.managed"])?;
    let first = ids.lines().next().unwrap_or_default().to_owned();
    let usage = docker(&["stats", "--no-stream", "--format", "{{.MemUsage}}", &first])?;
    shut(runtimes).await;
    rows.push(Row {
        path: "create to first command, cold, N = 20 at once",
        unit: "ms",
        measured: ms(cold20),
        floor: Some(ms(floor20)),
        floor_name: "20 `docker run --rm IMAGE true` at once",
        goal: Goal::Ratio(1.5),
    });
    let warm20 = Arc::new(composition(&image, 20)?);
    let r = first_command(&warm20).await?;
    r.shutdown().await;
    pool_filled(20).await?;
    let (w20, runtimes) = all_at_once(20, || {
        let c = Arc::clone(&warm20);
        async move { first_command(&c).await.map(Some) }
    })
    .await?;
    shut(runtimes).await;
    conch_provider_docker::provision::drain_pools().await;
    rows.push(Row {
        path: "create to first command, warm pool, N = 20 at once",
        unit: "ms",
        measured: ms(w20),
        floor: Some(ms(floor20)),
        floor_name: "20 `docker run --rm IMAGE true` at once",
        goal: Goal::Report,
    });
    rows.push(Row {
        path: "memory of an idle sandbox (the engine's count)",
        unit: "MiB",
        measured: mib(&usage).unwrap_or(f64::NAN),
        floor: None,
        floor_name: "",
        goal: Goal::Report,
    });
    render(&rows, n, as_json)
}

/// `12.3MiB / 23.4GiB` → 12.3.
fn mib(usage: &str) -> Option<f64> {
    let used = usage.split('/').next()?.trim();
    let (num, unit) = used.split_at(used.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "KiB" | "kB" => v / 1024.0,
        "MiB" | "MB" => v,
        "GiB" | "GB" => v * 1024.0,
        _ => v / (1024.0 * 1024.0),
    })
}
