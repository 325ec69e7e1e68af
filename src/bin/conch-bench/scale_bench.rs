//! `conch bench --suite scale`: one runtime holding 1,000 terminals and 1,000 background jobs
//! (what opening, sending and teardown cost as the count grows, and how many threads the
//! process needs for them), the latency and throughput floors a busy runtime must keep
//! (`terminal_send` against a raw PTY round trip, 1 GB one-shot and background against
//! `head | cat`, time to `stdin_read`, the `conch call` process against `bash -c true`), and
//! a guard on the daemon with 100 clients at once. `--json` prints the same rows as JSON.
//!
//! It reads `/proc` for measurements only: this process's threads, memory and CPU time, its
//! direct children (the terminals' and jobs' leaders, checked gone after teardown), and the
//! daemon's memory and children.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use conch_registry::Runtime;
use conch_seams::Owner;
use serde_json::json;

use crate::floors::{
    Goal, LoopbackServer, Row, background_job, bash_true, conch_call_true, e, median, open_session,
    owner, paired, render, terminal_send,
};
use crate::remote_bench::status_kb;

/// Sessions and jobs held at once.
const N: usize = 1_000;
/// The size of the one-shot and background transfers, as the floor writes it.
const GB: &str = "1000000000";
/// Clients of the daemon guard, each with [`CLIENT_JOBS`] jobs and one terminal.
const CLIENTS: usize = 100;
const CLIENT_JOBS: usize = 10;

const YAML: &str = "plugins:
  subprocess-local: {}
  bash-local: {}
  terminal-bash:
    poll_interval_ms: 50
    exact_probe_after_ms: 0
    idle_silence_ms: 3000
    timeout_ms: 30000
    dispose_grace_ms: 3000
  terminals: {}
  jobs: { cap_per_owner: 1000 }
  tool-bash: {}
  tool-terminal: {}
  tool-jobs: {}
";

fn build(yaml: &str, name: &str) -> anyhow::Result<Runtime> {
    conch::build_runtime_from_yaml(name, yaml, conch_env::ShellEnv::from_process_env())
        .map_err(|e| anyhow!("{e}"))
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(Iterator::count).unwrap_or(0)
}

/// This process's user + system CPU time, in clock ticks (100 per second on Linux).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime); `after` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// A process as (pid, start time): a recycled pid is not taken for it.
type Proc = (String, String);

fn start_of(pid: &str) -> Option<(String, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Some((f.get(19)?.to_string(), f.first()?.chars().next()?))
}

/// The live direct children of `pid` (every thread's list).
fn children(pid: &str) -> HashSet<Proc> {
    let mut out = HashSet::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for t in tasks.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in list.split_whitespace() {
            if let Some((start, state)) = start_of(c)
                && state != 'Z'
            {
                out.insert((c.to_string(), start));
            }
        }
    }
    out
}

/// Those of `procs` still alive (a zombie is gone).
fn alive(procs: &HashSet<Proc>) -> usize {
    procs
        .iter()
        .filter(|(pid, start)| start_of(pid).is_some_and(|(s, st)| &s == start && st != 'Z'))
        .count()
}

/// The `q` quantile in ms; NaN for no samples (every call failed: the row says so).
fn quantile(v: &mut [Duration], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

/// Starts a background job that lives until it is stopped (`exec sleep 1000`).
async fn start_sleeper(rt: &Runtime, o: &Arc<Owner>) -> anyhow::Result<()> {
    let args = json!({"command": "exec sleep 1000", "run_in_background": true});
    let r = rt.call(o, "bash", args).await.map_err(e)?;
    let id = r.structured.as_ref().and_then(|s| s["job_id"].as_str()).unwrap_or("");
    ensure!(!id.is_empty(), "no job started: {}", r.text);
    Ok(())
}

/// Runs every measurement and renders the table (or JSON).
///
/// # Errors
/// When a runtime or the daemon cannot be built or a measured call fails.
pub(crate) async fn run(iterations: usize, as_json: bool, conch: &Path) -> anyhow::Result<String> {
    let n = iterations.max(1);
    let mut rows = Vec::new();
    let rt = build(YAML, "bench:scale")?;
    let o = owner();

    // Throughput first, while the process's peak memory is still its own baseline.
    throughput(&rt, &o, n, &mut rows).await?;
    floors(&rt, &o, n, conch, &mut rows).await?;
    terminals(&rt, &mut rows).await?;
    jobs(&rt, &mut rows).await?;
    o.dispose().await;
    rt.shutdown().await;
    daemon(conch, &mut rows).await?;
    render(&rows, n, as_json)
}

/// 1 GB through a one-shot call and through a background job, next to the shell pipeline
/// that moves the same bytes.
async fn throughput(
    rt: &Runtime,
    o: &Arc<Owner>,
    n: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let k = n.clamp(1, 5);
    let pipe = || async {
        let s = tokio::process::Command::new("bash")
            .args(["-c", &format!("head -c {GB} /dev/zero | cat > /dev/null")])
            .status()
            .await?;
        ensure!(s.success(), "the pipeline failed");
        Ok(())
    };
    let hwm = status_kb("self", "VmHWM:");
    let (floor, oneshot) = paired(k, pipe, || async {
        let r = rt.call(o, "bash", json!({"command": format!("head -c {GB} /dev/zero")})).await;
        let r = r.map_err(e)?;
        ensure!(!r.text.is_empty(), "no output came back");
        Ok(())
    })
    .await?;
    let oneshot_mem = (status_kb("self", "VmHWM:") - hwm) / 1024.0;
    let gb = format!("head -c {GB} /dev/zero");
    let (floor2, job) = paired(k, pipe, || background_job(rt, o, &gb)).await?;
    let mem = (status_kb("self", "VmHWM:") - hwm) / 1024.0;
    let pipe_name = "head -c 1e9 /dev/zero | cat";
    rows.push(Row {
        path: "1 GB through a one-shot call",
        unit: "ms",
        measured: oneshot,
        floor: Some(floor),
        floor_name: pipe_name,
        goal: Goal::Ratio(1.10),
    });
    rows.push(Row {
        path: "1 GB through a background job",
        unit: "ms",
        measured: job,
        floor: Some(floor2),
        floor_name: pipe_name,
        goal: Goal::Ratio(1.10),
    });
    rows.push(Row {
        path: "peak memory growth, one-shot 1 GB",
        unit: "MiB",
        measured: oneshot_mem,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMost(64.0),
    });
    rows.push(Row {
        path: "peak memory growth, both 1 GB paths",
        unit: "MiB",
        measured: mem,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMost(64.0),
    });
    Ok(())
}

/// `terminal_send` and time to `stdin_read` next to the raw PTY, and the `conch call` process
/// next to `bash -c true`.
async fn floors(
    rt: &Runtime,
    o: &Arc<Owner>,
    n: usize,
    conch: &Path,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let n = n.max(20);
    let raw = crate::floors::raw_bash(rt).await?;
    let id = open_session(rt, o).await?;
    let (floor, echo) =
        paired(n, || raw.round_trip(), || terminal_send(rt, o, &id, "echo x")).await?;
    rows.push(Row {
        path: "terminal_send `echo x`",
        unit: "ms",
        measured: echo,
        floor: Some(floor),
        floor_name: "raw PTY: bash echo x to prompt",
        goal: Goal::Ratio(1.2),
    });
    let (mut floor, mut read_p) = (Vec::new(), Vec::new());
    for _ in 0..n {
        floor.push(raw.read_p().await?);
        let t0 = Instant::now();
        terminal_send(rt, o, &id, "read -p 'v? ' v").await?;
        read_p.push(t0.elapsed());
        terminal_send(rt, o, &id, "y").await?;
    }
    rows.push(Row {
        path: "time to stdin_read, `read -p`",
        unit: "ms",
        measured: median(read_p),
        floor: Some(median(floor)),
        floor_name: "raw PTY + busy probe",
        goal: Goal::AtMostMs(1.0),
    });
    raw.close().await?;

    let (bash, call) = paired(n, bash_true, || conch_call_true(conch)).await?;
    rows.push(Row {
        path: "`conch call bash true` process",
        unit: "ms",
        measured: call,
        floor: Some(bash),
        floor_name: "bash -c true",
        goal: Goal::Ratio(2.0),
    });
    let (t, v) = paired(
        n,
        || async {
            let s = tokio::process::Command::new("true").status().await?;
            ensure!(s.success(), "true failed");
            Ok(())
        },
        || async {
            let s = tokio::process::Command::new(conch)
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .status()
                .await?;
            ensure!(s.success(), "conch --version failed");
            Ok(())
        },
    )
    .await?;
    rows.push(Row {
        path: "`conch --version` process (start alone)",
        unit: "ms",
        measured: v,
        floor: Some(t),
        floor_name: "/bin/true",
        goal: Goal::Report,
    });
    Ok(())
}

/// 1,000 terminals in one runtime: open cost at 100 and at 1,000, threads, `terminal_send`
/// across all of them, idle CPU, teardown and survivors.
async fn terminals(rt: &Runtime, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let o = owner();
    let before = children("self");
    let mut opens = Vec::with_capacity(N);
    let mut ids = Vec::with_capacity(N);
    for _ in 0..N {
        let t0 = Instant::now();
        ids.push(open_session(rt, &o).await?);
        opens.push(t0.elapsed());
    }
    let threads = threads();
    let leaders: HashSet<Proc> = children("self").difference(&before).cloned().collect();
    let mut sends = Vec::with_capacity(N);
    for id in &ids {
        let t0 = Instant::now();
        terminal_send(rt, &o, id, "echo x").await?;
        sends.push(t0.elapsed());
    }
    // What 1,000 idle sessions cost: CPU over one second with nothing asked of them.
    let ticks = cpu_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_cpu = (cpu_ticks() - ticks) as f64 * 10.0;
    let t0 = Instant::now();
    o.dispose().await;
    let teardown = t0.elapsed();
    let left = alive(&leaders);

    let at100 = median(opens[..100].to_vec());
    let at1000 = median(opens[N - 100..].to_vec());
    rows.push(Row {
        path: "terminal_open, the last 100 of 1,000",
        unit: "ms",
        measured: at1000,
        floor: Some(at100),
        floor_name: "the first 100",
        goal: Goal::Ratio(1.5),
    });
    rows.push(Row {
        path: "threads with 1,000 terminals open",
        unit: "threads",
        measured: threads as f64,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMost(64.0),
    });
    rows.push(Row {
        path: "terminal_send `echo x` p50, 1,000 open",
        unit: "ms",
        measured: quantile(&mut sends, 0.5),
        floor: None,
        floor_name: "-",
        goal: Goal::Report,
    });
    rows.push(Row {
        path: "terminal_send `echo x` p99, 1,000 open",
        unit: "ms",
        measured: quantile(&mut sends, 0.99),
        floor: None,
        floor_name: "-",
        goal: Goal::AtMostMs(2.0),
    });
    rows.push(Row {
        path: "CPU while 1,000 terminals idle",
        unit: "ms/s",
        measured: idle_cpu,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMost(20.0),
    });
    rows.push(Row {
        path: "teardown of 1,000 terminals",
        unit: "ms",
        measured: teardown.as_secs_f64() * 1000.0,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMostMs(1000.0),
    });
    rows.push(Row {
        path: "terminal leaders alive after teardown",
        unit: "processes",
        measured: left as f64,
        floor: Some(leaders.len() as f64),
        floor_name: "leaders before it",
        goal: Goal::AtMost(0.0),
    });
    Ok(())
}

/// 1,000 live background jobs of one owner: start cost, memory per job, teardown, survivors.
async fn jobs(rt: &Runtime, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let o = owner();
    let before = children("self");
    let rss = status_kb("self", "VmRSS:");
    let mut starts = Vec::with_capacity(N);
    for _ in 0..N {
        let t0 = Instant::now();
        start_sleeper(rt, &o).await?;
        starts.push(t0.elapsed());
    }
    let per_job = (status_kb("self", "VmRSS:") - rss) / N as f64;
    let spawned: HashSet<Proc> = children("self").difference(&before).cloned().collect();
    let t0 = Instant::now();
    o.dispose().await;
    let teardown = t0.elapsed();
    let left = alive(&spawned);
    rows.push(Row {
        path: "background job start, 1,000 held",
        unit: "ms",
        measured: median(starts),
        floor: None,
        floor_name: "-",
        goal: Goal::Report,
    });
    rows.push(Row {
        path: "memory per live background job",
        unit: "KB",
        measured: per_job,
        floor: None,
        floor_name: "-",
        goal: Goal::Report,
    });
    rows.push(Row {
        path: "teardown of 1,000 live jobs",
        unit: "ms",
        measured: teardown.as_secs_f64() * 1000.0,
        floor: None,
        floor_name: "-",
        goal: Goal::AtMostMs(200.0),
    });
    rows.push(Row {
        path: "job processes alive after teardown",
        unit: "processes",
        measured: left as f64,
        floor: Some(spawned.len() as f64),
        floor_name: "before it",
        goal: Goal::AtMost(0.0),
    });
    Ok(())
}

/// The daemon with [`CLIENTS`] clients at once, each holding [`CLIENT_JOBS`] background jobs
/// and one terminal: errors, daemon memory per client, `terminal_send` latency against one
/// client alone, aggregate rate, and what is left once they leave.
async fn daemon(conch: &Path, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    // Per crowd client; one client alone sends ten times as many, so its rate is not one
    // hiccup's.
    const SENDS: usize = 20;
    const SOLO_SENDS: usize = 200;
    let token = conch_provider_remote_proto::random_id();
    let mut cmd = std::process::Command::new(conch);
    cmd.args(["sandboxd", "--listen", "127.0.0.1:0", "--max-procs", "64"])
        .env("CONCH_TOKEN", &token);
    let server = LoopbackServer::start(cmd, "listening on ")?;
    let pid = server.child.id().to_string();
    let yaml = conch::EMBEDDED
        .iter()
        .find(|(n, _)| *n == "remote-terminal")
        .map(|(_, y)| *y)
        .ok_or_else(|| anyhow!("no embedded remote-terminal composition"))?
        .replace(
            "url: http://127.0.0.1:7070",
            &format!("url: http://{}\n    token: \"{token}\"", server.addr),
        )
        .replace("  jobs: {}", "  jobs: {}\n  bash-local: {}\n  tool-bash: {}");
    let idle_rss = status_kb(&pid, "VmRSS:");

    // One client alone: the latency and rate the crowd is held against.
    let solo = Client::start(&yaml, 0).await?;
    let mut alone = Vec::with_capacity(SOLO_SENDS);
    let t0 = Instant::now();
    for _ in 0..SOLO_SENDS {
        let t = Instant::now();
        terminal_send(&solo.rt, &solo.o, &solo.id, "echo x").await?;
        alone.push(t.elapsed());
    }
    let solo_rate = SOLO_SENDS as f64 / t0.elapsed().as_secs_f64();
    solo.stop().await;

    let mut clients = Vec::with_capacity(CLIENTS);
    let mut errors = 0usize;
    for i in 0..CLIENTS {
        match Client::start(&yaml, CLIENT_JOBS).await {
            Ok(c) => clients.push(c),
            Err(err) => {
                errors += 1;
                tracing::warn!("client {i}: {err:#}");
            }
        }
    }
    let crowd_rss = status_kb(&pid, "VmRSS:");
    // Each client on a task of its own, as separate agents would be: the bench's workers
    // drive them in parallel rather than one task polling them all.
    let clients: Vec<Arc<Client>> = clients.into_iter().map(Arc::new).collect();
    let t0 = Instant::now();
    let runs: Vec<_> = clients
        .iter()
        .map(|c| {
            let c = Arc::clone(c);
            tokio::spawn(async move {
                let mut v = Vec::with_capacity(SENDS);
                let mut failed = 0usize;
                for _ in 0..SENDS {
                    let t = Instant::now();
                    match terminal_send(&c.rt, &c.o, &c.id, "echo x").await {
                        Ok(()) => v.push(t.elapsed()),
                        Err(_) => failed += 1,
                    }
                }
                (v, failed)
            })
        })
        .collect();
    let mut crowd = Vec::new();
    for run in runs {
        let (v, failed) = run.await?;
        crowd.extend(v);
        errors += failed;
    }
    let wall = t0.elapsed();
    let rate = crowd.len() as f64 / wall.as_secs_f64();
    for c in clients {
        let c = Arc::try_unwrap(c).map_err(|_| anyhow!("a client is still in use"))?;
        c.stop().await;
    }
    // The daemon ends a client's processes when its connection closes; wait for that, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !children(&pid).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = children(&pid).len();
    drop(server);

    let per_client = (crowd_rss - idle_rss) / CLIENTS as f64;
    let guard = [
        ("daemon, 100 clients: errors", "errors", errors as f64, None, Goal::AtMost(0.0)),
        ("daemon, 100 clients: memory per client", "KB", per_client, None, Goal::AtMost(1024.0)),
        (
            "daemon, 100 clients: terminal_send p50",
            "ms",
            quantile(&mut crowd, 0.5),
            Some(quantile(&mut alone, 0.5)),
            Goal::AtMostMs(44.0),
        ),
        (
            "daemon, 100 clients: terminal_send p99",
            "ms",
            quantile(&mut crowd, 0.99),
            Some(quantile(&mut alone, 0.99)),
            Goal::AtMostMs(120.0),
        ),
        (
            "daemon, 100 clients: aggregate send rate",
            "sends/s",
            rate,
            Some(solo_rate),
            Goal::AtLeastRatio(2.0),
        ),
        ("daemon, 100 clients: processes left", "processes", left as f64, None, Goal::AtMost(0.0)),
    ];
    for (path, unit, measured, floor, goal) in guard {
        rows.push(Row {
            path,
            unit,
            measured,
            floor,
            floor_name: if floor.is_some() { "one client alone" } else { "-" },
            goal,
        });
    }
    Ok(())
}

/// One client of the daemon guard: its own runtime (its own connection), jobs and terminal.
struct Client {
    rt: Runtime,
    o: Arc<Owner>,
    id: String,
}

impl Client {
    async fn start(yaml: &str, jobs: usize) -> anyhow::Result<Self> {
        let rt = build(yaml, "bench:scale-client")?;
        let o = owner();
        for _ in 0..jobs {
            start_sleeper(&rt, &o).await?;
        }
        let id = open_session(&rt, &o).await?;
        Ok(Self { rt, o, id })
    }

    async fn stop(self) {
        self.o.dispose().await;
        self.rt.shutdown().await;
    }
}
