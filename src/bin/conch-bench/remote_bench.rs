//! `conch bench --suite remote`: the same tool calls on the local world and on a remote one
//! (a `conch sandboxd` on loopback, started in this process over a fresh `subprocess-local`),
//! in alternation, so the local numbers are the floor the remote ones are held to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, ensure};
use conch_frontend_sandboxd::rxp::{self, ServerConfig};
use conch_registry::Runtime;
use serde_json::json;

use crate::floors::{
    Goal, Row, background_job, e, median, open_session, owner, paired, render, terminal_send, timed,
};

/// One background job that prints 1 GiB.
const GIB_JOB: &str = "head -c 1073741824 /dev/zero";

/// An in-process daemon on 127.0.0.1 with a fresh token.
pub(crate) struct Daemon {
    url: String,
    token: String,
    host: Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Daemon {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let host = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
        let sub = host.seams().subprocess.clone().ok_or_else(|| anyhow!("no subprocess seam"))?;
        let files = host.seams().files.clone();
        let token = conch_provider_remote_proto::random_id();
        let state = rxp::State::with_files(
            sub,
            files,
            ServerConfig { token: Some(token.clone()), ..ServerConfig::default() },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(rxp::serve(listener, state, async move {
            let _ = rx.await;
        }));
        Ok(Self { url, token, host, stop: Some(tx), served })
    }

    /// The embedded composition `name`, pointed at this daemon.
    pub(crate) fn runtime(&self, name: &str) -> anyhow::Result<Runtime> {
        let yaml = conch::EMBEDDED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, y)| *y)
            .ok_or_else(|| anyhow!("no embedded composition {name}"))?;
        let default_url = "url: http://127.0.0.1:7070";
        ensure!(yaml.contains(default_url), "{name} names no default url");
        let yaml =
            yaml.replace(default_url, &format!("url: {}\n    token: \"{}\"", self.url, self.token));
        conch::build_runtime_from_yaml(
            &format!("bench:{name}"),
            &yaml,
            conch_env::ShellEnv::from_process_env(),
        )
        .map_err(|e| anyhow!("{e}"))
    }

    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.served.await.context("the daemon task")??;
        self.host.shutdown().await;
        Ok(())
    }
}

/// Resident memory of this process in MiB (client and daemon both live here).
pub(crate) fn rss_mib() -> f64 {
    status_kb("self", "VmRSS:") / 1024.0
}

/// A field of `/proc/<pid>/status` in kB (0 when unreadable); `pid` may be `self`.
pub(crate) fn status_kb(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// Runs `f` while sampling resident memory; returns its result and the growth over the
/// starting value at the highest sample, in MiB.
pub(crate) async fn with_peak_rss<T>(
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, f64)> {
    let base = rss_mib();
    let peak = Arc::new(AtomicU64::new(base.to_bits()));
    let sampler = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                let now = rss_mib();
                let _ = peak.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    (now > f64::from_bits(p)).then_some(now.to_bits())
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let r = f.await;
    sampler.abort();
    Ok((r?, f64::from_bits(peak.load(Ordering::Relaxed)) - base))
}

/// Runs every local-vs-remote measurement and renders the table (or JSON).
///
/// # Errors
/// When a runtime or the daemon cannot be built or a measured call fails.
pub(crate) async fn run(iterations: usize, as_json: bool) -> anyhow::Result<String> {
    let n = iterations.max(1);
    let daemon = Daemon::start().await?;
    let mut rows = Vec::new();
    let o = owner();

    let local = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
    let remote = daemon.runtime("remote-sandbox")?;
    let (l, r) = paired(
        n,
        || async {
            let out = local.call(&o, "bash", json!({"command": "true"})).await.map_err(e)?;
            ensure!(out.text.is_empty(), "unexpected output {:?}", out.text);
            Ok(())
        },
        || async {
            let out = remote.call(&o, "bash", json!({"command": "true"})).await.map_err(e)?;
            ensure!(out.text.is_empty(), "unexpected output {:?}", out.text);
            Ok(())
        },
    )
    .await?;
    rows.push(Row {
        path: "one-shot bash tool `true`, remote",
        unit: "ms",
        measured: r,
        floor: Some(l),
        floor_name: "the same call, local",
        goal: Goal::RatioPlusMs(2.0, 1.0),
    });

    let local_t = conch::build_runtime("terminal").map_err(|e| anyhow!("{e}"))?;
    let remote_t = daemon.runtime("remote-terminal")?;
    let (lid, rid) = (open_session(&local_t, &o).await?, open_session(&remote_t, &o).await?);
    let (l, r) = paired(
        n,
        || terminal_send(&local_t, &o, &lid, "echo x"),
        || terminal_send(&remote_t, &o, &rid, "echo x"),
    )
    .await?;
    rows.push(Row {
        path: "terminal_send `echo x`, remote",
        unit: "ms",
        measured: r,
        floor: Some(l),
        floor_name: "the same call, local",
        goal: Goal::RatioPlusMs(2.0, 1.0),
    });
    let (mut l, mut r) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        for (rt, id, v) in [(&local_t, &lid, &mut l), (&remote_t, &rid, &mut r)] {
            let t0 = Instant::now();
            terminal_send(rt, &o, id, "read -p 'v? ' v").await?;
            v.push(t0.elapsed());
            terminal_send(rt, &o, id, "y").await?;
        }
    }
    rows.push(Row {
        path: "time to stdin_read `read -p`, remote",
        unit: "ms",
        measured: median(r),
        floor: Some(median(l)),
        floor_name: "the same call, local",
        goal: Goal::RatioPlusMs(2.0, 1.0),
    });

    // Throughput: remote must keep at least half the local rate, so the time ratio is <= 2.
    let k = n.clamp(1, 3);
    let (local_gib, local_mem) =
        with_peak_rss(timed(k, || background_job(&local, &o, GIB_JOB))).await?;
    let (remote_gib, remote_mem) =
        with_peak_rss(timed(k, || background_job(&remote, &o, GIB_JOB))).await?;
    rows.push(Row {
        path: "1 GiB through a background job, remote",
        unit: "ms",
        measured: remote_gib,
        floor: Some(local_gib),
        floor_name: "the same job, local",
        goal: Goal::Ratio(2.0),
    });
    // "Flat" memory: what the process (client and daemon) grows by while a GiB streams
    // through stays a small constant (queues, windows, replay bytes), not the output's size.
    rows.push(Row {
        path: "peak memory growth during those jobs, remote",
        unit: "MiB",
        measured: remote_mem,
        floor: Some(local_mem.max(0.001)),
        floor_name: "the same jobs, local",
        goal: Goal::AtMost(64.0),
    });

    o.dispose().await;
    for rt in [&local, &remote, &local_t, &remote_t] {
        rt.shutdown().await;
    }
    daemon.stop().await?;
    render(&rows, n, as_json)
}
