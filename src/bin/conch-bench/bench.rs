//! `conch bench`: one-shot bash tool latency next to raw `bash -c true` spawn latency,
//! measured in the same run so the overhead conch adds is visible.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conch_jobs::RoutingSink;
use conch_registry::Runtime;
use conch_seams::{NoticeSink, Owner};

pub(crate) struct Stats {
    pub(crate) median: Duration,
    p95: Duration,
    min: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats { median: at(0.5), p95: at(0.95), min: v[0] }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the benchmark and returns the report.
///
/// # Errors
/// When a measured command fails.
pub(crate) async fn run(
    runtime: &Runtime,
    iterations: usize,
    json: bool,
) -> anyhow::Result<String> {
    let mut raw = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let status = tokio::process::Command::new("bash").args(["-c", "true"]).status().await?;
        anyhow::ensure!(status.success(), "bash -c true failed");
        raw.push(t.elapsed());
    }
    let owner = Owner::new("bench", Arc::new(RoutingSink::default()) as Arc<dyn NoticeSink>);
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
    let mut out = table(
        "oneshot",
        iterations,
        &[("raw bash -c true", &r), ("bash tool (one-shot)", &t)],
        json,
    )?;
    if !json {
        writeln!(out, "overhead (median): {:.3} ms", ms(t.median) - ms(r.median))?;
    }
    Ok(out)
}

pub(crate) async fn timed<F, Fut>(n: usize, mut f: F) -> anyhow::Result<Stats>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await?;
        v.push(t.elapsed());
    }
    Ok(stats(v))
}

/// The rows as a table, or as one JSON object (`{"suite", "iterations", "machine_notes",
/// "rows": [{"path", "min_ms", "median_ms", "p95_ms"}]}`), with what the machine runs that
/// shows in tail rows ([`crate::floors::machine_notes`]).
fn table(
    suite: &str,
    iterations: usize,
    rows: &[(&str, &Stats)],
    json: bool,
) -> anyhow::Result<String> {
    let notes = crate::floors::machine_notes();
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(path, st)| {
                serde_json::json!({
                    "path": path, "min_ms": ms(st.min), "median_ms": ms(st.median),
                    "p95_ms": ms(st.p95),
                })
            })
            .collect();
        let v = serde_json::json!({
            "suite": suite, "iterations": iterations, "machine_notes": notes, "rows": rows,
        });
        return Ok(format!("{v}\n"));
    }
    let mut s = String::new();
    writeln!(s, "iterations: {iterations}")?;
    for n in &notes {
        writeln!(s, "machine: {n}")?;
    }
    writeln!(s, "{:<34} {:>10} {:>10} {:>10}", "measurement", "min ms", "median ms", "p95 ms")?;
    for (name, st) in rows {
        writeln!(
            s,
            "{:<34} {:>10.3} {:>10.3} {:>10.3}",
            name,
            ms(st.min),
            ms(st.median),
            ms(st.p95)
        )?;
    }
    Ok(s)
}

/// The terminal benchmark: raw PTY roundtrip, terminal_send roundtrip, persistent bash call,
/// and time-to-stdin_read for `read -p`.
///
/// # Errors
/// When a runtime cannot be built or a measured call fails.
pub(crate) async fn run_terminal(iterations: usize, json: bool) -> anyhow::Result<String> {
    use conch_seams::TerminalSpawnSpec;
    let terminal = conch::build_runtime("terminal").map_err(|e| anyhow::anyhow!("{e}"))?;
    let minimal = conch::build_runtime("minimal").map_err(|e| anyhow::anyhow!("{e}"))?;
    let owner = Owner::new("bench", Arc::new(RoutingSink::default()) as Arc<dyn NoticeSink>);

    // Raw PTY: `cat` on a PTY through the subprocess seam; write a line, wait for it back.
    let sub =
        terminal.seams().subprocess.clone().ok_or_else(|| anyhow::anyhow!("no subprocess seam"))?;
    let cat = sub
        .spawn_terminal(TerminalSpawnSpec::new(vec!["cat".into()], std::env::temp_dir()))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let raw = timed(iterations, || {
        let cat = Arc::clone(&cat);
        async move {
            cat.write(b"x\r").await.map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut seen = Vec::new();
            // The tty echoes the line and cat prints it again: two x's mean the roundtrip is done.
            while seen.iter().filter(|b| **b == b'x').count() < 2 {
                match cat.read_chunk().await.map_err(|e| anyhow::anyhow!("{e}"))? {
                    Some(c) => seen.extend(c),
                    None => anyhow::bail!("cat exited"),
                }
            }
            Ok(())
        }
    })
    .await?;
    cat.terminate(Duration::from_secs(1)).await.map_err(|e| anyhow::anyhow!("{e}"))?;

    let open = terminal
        .call(&owner, "terminal_open", serde_json::json!({}))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let id = open
        .structured
        .as_ref()
        .and_then(|s| s["session_id"].as_str())
        .unwrap_or_default()
        .to_string();
    let send = |text: &'static str| {
        let (terminal, owner, id) = (&terminal, &owner, id.clone());
        async move {
            let r = terminal
                .call(owner, "terminal_send", serde_json::json!({"session_id": id, "text": text}))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let reason = r
                .structured
                .as_ref()
                .and_then(|s| s["wait_reason"].as_str())
                .unwrap_or("")
                .to_string();
            anyhow::ensure!(reason == "stdin_read", "unexpected wait_reason {reason}");
            // A roundtrip counts only if the command's own output came back with it.
            let output = r.structured.as_ref().and_then(|s| s["output"].as_str()).unwrap_or("");
            anyhow::ensure!(
                text != "echo x" || output.contains("\nx\n"),
                "echo x returned without its output: {output:?}"
            );
            Ok(())
        }
    };
    let term = timed(iterations, || send("echo x")).await?;
    let mut read_p = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        send("read -p 'value? ' v").await?;
        read_p.push(t.elapsed());
        send("y").await?;
    }
    let read_p = stats(read_p);
    let persistent = timed(iterations, || {
        let (minimal, owner) = (&minimal, &owner);
        async move {
            let out = minimal
                .call(owner, "bash", serde_json::json!({"command": "echo x"}))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(out.text == "x\n", "unexpected output {:?}", out.text);
            Ok(())
        }
    })
    .await?;
    owner.dispose().await;
    terminal.shutdown().await;
    minimal.shutdown().await;
    table(
        "terminal",
        iterations,
        &[
            ("raw PTY echo x roundtrip (cat)", &raw),
            ("terminal_send `echo x`", &term),
            ("persistent bash `echo x`", &persistent),
            ("time to stdin_read (`read -p`)", &read_p),
        ],
        json,
    )
}
