//! `conch bench`: one-shot bash tool latency next to raw `bash -c true` spawn latency,
//! measured in the same run so the overhead conch adds is visible.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conch_registry::Runtime;
use conch_seams::{CollectingSink, NoticeSink, Owner};

struct Stats {
    median: Duration,
    p95: Duration,
    min: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats { median: at(0.5), p95: at(0.95), min: v[0] }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the benchmark and returns the report.
///
/// # Errors
/// When a measured command fails.
pub(crate) async fn run(runtime: &Runtime, iterations: usize) -> anyhow::Result<String> {
    let mut raw = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let status = tokio::process::Command::new("bash").args(["-c", "true"]).status().await?;
        anyhow::ensure!(status.success(), "bash -c true failed");
        raw.push(t.elapsed());
    }
    let owner = Owner::new("bench", Arc::new(CollectingSink::default()) as Arc<dyn NoticeSink>);
    let mut tool = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let out = runtime
            .call(&owner, "bash", serde_json::json!({ "command": "true" }))
            .await
            .map_err(|e| anyhow::anyhow!("bash tool failed: {e}"))?;
        anyhow::ensure!(out.text.is_empty(), "unexpected output: {}", out.text);
        tool.push(t.elapsed());
    }
    owner.dispose().await;
    let (r, t) = (stats(raw), stats(tool));
    let mut s = String::new();
    writeln!(s, "iterations: {iterations}")?;
    writeln!(s, "{:<28} {:>10} {:>10} {:>10}", "measurement", "min ms", "median ms", "p95 ms")?;
    writeln!(
        s,
        "{:<28} {:>10.3} {:>10.3} {:>10.3}",
        "raw bash -c true",
        ms(r.min),
        ms(r.median),
        ms(r.p95)
    )?;
    writeln!(
        s,
        "{:<28} {:>10.3} {:>10.3} {:>10.3}",
        "bash tool (one-shot)",
        ms(t.min),
        ms(t.median),
        ms(t.p95)
    )?;
    writeln!(s, "overhead (median): {:.3} ms", ms(t.median) - ms(r.median))?;
    Ok(s)
}
