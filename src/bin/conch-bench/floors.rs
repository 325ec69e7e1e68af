//! `conch bench --suite floors`: every latency and throughput goal of conch next to the
//! physical floor measured in the same run (raw spawn, raw PTY, raw pipe), with the ratio
//! and whether the goal is met. `--json` prints the same rows as JSON.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure};
use conch_jobs::RoutingSink;
use conch_registry::Runtime;
use conch_seams::{NoticeSink, Owner, Probe, StdinWait, TerminalProcess, TerminalSpawnSpec};
use serde_json::json;

/// A goal: what must hold for a row to count as met.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Goal {
    /// measured <= this many ms.
    AtMostMs(f64),
    /// measured <= this, in the row's unit.
    AtMost(f64),
    /// measured <= floor + this many ms.
    FloorPlusMs(f64),
    /// measured / floor <= this.
    Ratio(f64),
    /// measured <= this times the floor plus this many ms.
    RatioPlusMs(f64, f64),
    /// measured / floor >= this (a rate held to a share of its floor's).
    AtLeastRatio(f64),
    /// No goal: the row is reported next to its floor.
    Report,
}

impl Goal {
    fn text(self, unit: &str) -> String {
        match self {
            Goal::AtMostMs(ms) => format!("<= {ms} ms"),
            Goal::AtMost(v) => format!("<= {v} {unit}"),
            Goal::FloorPlusMs(ms) => format!("<= floor + {ms} ms"),
            Goal::Ratio(r) => format!("<= {r:.2}x floor"),
            Goal::RatioPlusMs(r, ms) => format!("<= {r}x floor + {ms} ms"),
            Goal::AtLeastRatio(r) => format!(">= {r:.2}x floor"),
            Goal::Report => "no goal".to_string(),
        }
    }

    fn met(self, measured: f64, floor: Option<f64>) -> bool {
        match (self, floor) {
            (Goal::AtMostMs(ms), _) => measured <= ms,
            (Goal::AtMost(v), _) => measured <= v,
            (Goal::FloorPlusMs(ms), Some(f)) => measured <= f + ms,
            (Goal::Ratio(r), Some(f)) => f > 0.0 && measured / f <= r,
            (Goal::RatioPlusMs(r, ms), Some(f)) => measured <= f * r + ms,
            (Goal::AtLeastRatio(r), Some(f)) => f > 0.0 && measured / f >= r,
            (Goal::Report, _) => true,
            (_, None) => false,
        }
    }
}

pub(crate) struct Row {
    pub(crate) path: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) measured: f64,
    pub(crate) floor: Option<f64>,
    pub(crate) floor_name: &'static str,
    pub(crate) goal: Goal,
}

pub(crate) fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

/// The median of `n` timed runs of `f`, in milliseconds.
pub(crate) async fn timed<F, Fut>(n: usize, f: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    Ok(crate::bench::ms(crate::bench::timed(n, f).await?.median))
}

/// Times a floor and a measured path in alternation, `n` of each, and returns both medians:
/// the machine's drift over the run (frequency, neighbours) then weighs on both alike.
pub(crate) async fn paired<F, Fut, G, Gut>(
    n: usize,
    mut floor: F,
    mut measured: G,
) -> anyhow::Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
    G: FnMut() -> Gut,
    Gut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        floor().await?;
        a.push(t.elapsed());
        let t = Instant::now();
        measured().await?;
        b.push(t.elapsed());
    }
    Ok((median(a), median(b)))
}

pub(crate) fn owner() -> Arc<Owner> {
    Owner::new("bench", Arc::new(RoutingSink::default()) as Arc<dyn NoticeSink>)
}

/// A server the benchmarks started on loopback, killed when dropped.
#[derive(Debug)]
pub(crate) struct LoopbackServer {
    pub(crate) child: std::process::Child,
    pub(crate) addr: String,
}

impl LoopbackServer {
    /// Starts `command` (a `conch` server listening on port 0) quietly, and waits for the
    /// stderr line starting with `prefix` that names its address.
    ///
    /// # Errors
    /// It could not start, or exited before naming its address.
    pub(crate) fn start(mut command: std::process::Command, prefix: &str) -> anyhow::Result<Self> {
        use std::process::Stdio;
        let program = command.get_program().to_owned();
        let mut child = command
            .env("CONCH_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow!("starting {}: {e}", program.display()))?;
        let addr = listening_address(&mut child, prefix)?;
        Ok(Self { child, addr })
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address a server `child` names on the stderr line starting with `prefix`; its stderr
/// is then drained on a thread, so the server never blocks on it.
///
/// # Errors
/// The server exited (or closed stderr) before naming its address.
pub(crate) fn listening_address(
    child: &mut std::process::Child,
    prefix: &str,
) -> anyhow::Result<String> {
    use std::io::BufRead;
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("the server's stderr is not piped"))?;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(a) = l.strip_prefix(prefix) {
                    break a.trim().to_string();
                }
            }
            _ => anyhow::bail!("the server exited before printing `{prefix}`"),
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok(addr)
}

pub(crate) fn e(err: conch_seams::Error) -> anyhow::Error {
    anyhow!("{err}")
}

/// Samples the probe without pause until `pred` holds (the floor: when the program waits).
async fn until_waiting(
    t: &dyn TerminalProcess,
    pred: impl Fn(&conch_seams::TerminalObservation) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let obs = t.observe(Probe::Stdin).await.map_err(e)?;
        if obs.stdin == StdinWait::Waiting && pred(&obs) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the raw terminal never waited for input");
        tokio::task::yield_now().await;
    }
}

/// Reads a terminal until its accumulated output contains `needle`.
async fn read_until(t: &dyn TerminalProcess, needle: &str) -> anyhow::Result<()> {
    let mut seen = String::new();
    while !seen.contains(needle) {
        match t.read_chunk().await.map_err(e)? {
            Some(c) => seen.push_str(&String::from_utf8_lossy(&c)),
            None => bail!("the raw terminal exited"),
        }
    }
    Ok(())
}

/// bash on a PTY through the subprocess seam, with no terminal service above it: the floor
/// of a round trip (`round_trip`) and of a wait for input seen by a busy probe (`read_p`).
pub(crate) struct RawBash(Arc<dyn TerminalProcess>);

impl RawBash {
    pub(crate) async fn round_trip(&self) -> anyhow::Result<()> {
        self.0.write(b"echo x\r").await.map_err(e)?;
        // The prompt comes after the command's output (bracketed-paste codes may sit between).
        read_until(self.0.as_ref(), "RAW$ ").await
    }

    /// The time from writing `read -p` to the probe seeing bash wait; then answers it.
    pub(crate) async fn read_p(&self) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        self.0.write(b"read -p 'v? ' v\r").await.map_err(e)?;
        read_until(self.0.as_ref(), "v? ").await?;
        until_waiting(self.0.as_ref(), |o| o.leader_owns_foreground).await?;
        let took = t0.elapsed();
        self.0.write(b"y\r").await.map_err(e)?;
        read_until(self.0.as_ref(), "RAW$ ").await?;
        until_waiting(self.0.as_ref(), |o| o.leader_owns_foreground).await?;
        Ok(took)
    }

    pub(crate) async fn close(self) -> anyhow::Result<()> {
        self.0.terminate(Duration::from_secs(1)).await.map_err(e)?;
        Ok(())
    }
}

/// Starts [`RawBash`] on `rt`'s subprocess seam and waits for its first prompt.
pub(crate) async fn raw_bash(rt: &Runtime) -> anyhow::Result<RawBash> {
    let sub = rt.seams().subprocess.clone().ok_or_else(|| anyhow!("no subprocess seam"))?;
    let mut spec = TerminalSpawnSpec::in_default_dir(
        ["bash", "--norc", "--noprofile", "-i"].iter().map(|s| (*s).to_string()).collect(),
    );
    spec.env.insert("PS1".into(), Some("RAW$ ".into()));
    let raw = sub.spawn_terminal(spec).await.map_err(e)?;
    read_until(raw.as_ref(), "RAW$ ").await?;
    Ok(RawBash(raw))
}

/// Opens a session through `terminal_open`; its id.
pub(crate) async fn open_session(rt: &Runtime, o: &Arc<Owner>) -> anyhow::Result<String> {
    let open = rt.call(o, "terminal_open", json!({})).await.map_err(e)?;
    let id = open.structured.as_ref().and_then(|s| s["session_id"].as_str()).unwrap_or_default();
    ensure!(!id.is_empty(), "terminal_open returned no session id: {}", open.text);
    Ok(id.to_string())
}

/// Runs `command` as a background job through the bash tool and waits for it through
/// `job_output`; an error unless it completed.
pub(crate) async fn background_job(
    rt: &Runtime,
    o: &Arc<Owner>,
    command: &str,
) -> anyhow::Result<()> {
    let out = rt.call(o, "bash", json!({"command": command, "run_in_background": true}));
    let out = out.await.map_err(e)?;
    let id = out.structured.as_ref().and_then(|s| s["job_id"].as_str()).unwrap_or_default();
    let args = json!({"job_id": id, "wait": true, "timeout_ms": 600_000});
    let done = rt.call(o, "job_output", args).await.map_err(e)?;
    let status = done.structured.as_ref().and_then(|s| s["status"].as_str()).unwrap_or("");
    ensure!(status == "completed", "the job ended {status}: {}", done.text);
    Ok(())
}

/// One `bash -c true` process, spawned raw: the floor of the `conch call` rows.
pub(crate) async fn bash_true() -> anyhow::Result<()> {
    let s = tokio::process::Command::new("bash").args(["-c", "true"]).status().await?;
    ensure!(s.success(), "bash -c true failed");
    Ok(())
}

/// One `conch call bash '{"command":"true"}'` process of the binary `conch`.
pub(crate) async fn conch_call_true(conch: &std::path::Path) -> anyhow::Result<()> {
    let s = tokio::process::Command::new(conch)
        .args(["call", "bash", r#"{"command":"true"}"#])
        .stdout(std::process::Stdio::null())
        .status()
        .await?;
    ensure!(s.success(), "{} call failed", conch.display());
    Ok(())
}

pub(crate) async fn terminal_send(
    rt: &Runtime,
    o: &Arc<Owner>,
    id: &str,
    text: &str,
) -> anyhow::Result<()> {
    let r =
        rt.call(o, "terminal_send", json!({"session_id": id, "text": text})).await.map_err(e)?;
    let reason = r.structured.as_ref().and_then(|s| s["wait_reason"].as_str()).unwrap_or("");
    ensure!(reason == "stdin_read", "terminal_send {text:?} returned {reason}");
    Ok(())
}

/// Runs every measurement and renders the table (or JSON); `conch` is the binary whose
/// `conch call` process is timed.
///
/// # Errors
/// When a runtime cannot be built or a measured call fails.
pub(crate) async fn run(
    iterations: usize,
    as_json: bool,
    conch: &std::path::Path,
) -> anyhow::Result<String> {
    let n = iterations.max(1);
    let mut rows = Vec::new();

    // One-shot: the bash tool vs a raw spawn of `bash -c true`.
    let standard = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
    let o = owner();
    let (raw, tool) = paired(n, bash_true, || async {
        let out = standard.call(&o, "bash", json!({"command": "true"})).await.map_err(e)?;
        ensure!(out.text.is_empty(), "unexpected output {:?}", out.text);
        Ok(())
    })
    .await?;
    rows.push(Row {
        path: "one-shot bash tool `true`",
        unit: "ms",
        measured: tool,
        floor: Some(raw),
        floor_name: "raw bash -c true",
        goal: Goal::Ratio(1.10),
    });

    // The whole CLI process vs a bash process.
    let conch_call = || conch_call_true(conch);
    let (bash_start, call) = paired(n, bash_true, conch_call).await?;
    rows.push(Row {
        path: "`conch call bash true` process",
        unit: "ms",
        measured: call,
        floor: Some(bash_start),
        floor_name: "raw bash -c true",
        goal: Goal::Ratio(1.5),
    });
    // What any launcher process pays: its own exec plus the bash it runs (`timeout` is a
    // small C program that forks, execs and waits). Shown so the ratio above can be read
    // against what a separate process can reach at all.
    let (launcher, call2) = paired(
        n,
        || async {
            let s = tokio::process::Command::new("timeout")
                .args(["60", "bash", "-c", "true"])
                .status()
                .await?;
            ensure!(s.success(), "timeout 60 bash -c true failed");
            Ok(())
        },
        conch_call,
    )
    .await?;
    rows.push(Row {
        path: "`conch call bash true` process (vs launcher)",
        unit: "ms",
        measured: call2,
        floor: Some(launcher),
        // Same goal, against the floor a separate process can reach.
        floor_name: "timeout 60 bash -c true",
        goal: Goal::Ratio(1.5),
    });

    // Terminals: raw PTY floors through the subprocess seam, then the tools.
    let terminal = conch::build_runtime("terminal").map_err(|e| anyhow!("{e}"))?;
    let minimal = conch::build_runtime("minimal").map_err(|e| anyhow!("{e}"))?;
    let raw = raw_bash(&terminal).await?;
    let mut read_p_floor = Vec::new();
    let mut python_floor = Vec::new();
    for _ in 0..n {
        read_p_floor.push(raw.read_p().await?);
        let t0 = Instant::now();
        raw.0.write(b"python3 -c 'input()'\r").await.map_err(e)?;
        until_waiting(raw.0.as_ref(), |o| !o.leader_owns_foreground).await?;
        python_floor.push(t0.elapsed());
        raw.0.write(b"x\r").await.map_err(e)?;
        read_until(raw.0.as_ref(), "RAW$ ").await?;
        until_waiting(raw.0.as_ref(), |o| o.leader_owns_foreground).await?;
    }
    raw.close().await?;

    let id = open_session(&terminal, &o).await?;
    let mut read_p = Vec::new();
    let mut python = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        terminal_send(&terminal, &o, &id, "read -p 'v? ' v").await?;
        read_p.push(t0.elapsed());
        terminal_send(&terminal, &o, &id, "y").await?;
        let t0 = Instant::now();
        terminal_send(&terminal, &o, &id, "python3 -c 'input()'").await?;
        python.push(t0.elapsed());
        terminal_send(&terminal, &o, &id, "x").await?;
    }
    let (echo, persistent) = paired(
        n,
        || terminal_send(&terminal, &o, &id, "echo x"),
        || async {
            let out = minimal.call(&o, "bash", json!({"command": "echo x"})).await.map_err(e)?;
            ensure!(out.text == "x\n", "unexpected output {:?}", out.text);
            Ok(())
        },
    )
    .await?;
    let read_p_floor = median(read_p_floor);
    rows.push(Row {
        path: "time to stdin_read, `read -p`",
        unit: "ms",
        measured: median(read_p),
        floor: Some(read_p_floor),
        floor_name: "raw PTY: bash blocks in read",
        goal: Goal::AtMostMs(5.0),
    });
    rows.push(Row {
        path: "time to stdin_read, `python3 -c 'input()'`",
        unit: "ms",
        measured: median(python),
        floor: Some(median(python_floor)),
        floor_name: "raw PTY: python blocks in read",
        goal: Goal::FloorPlusMs(5.0),
    });
    rows.push(Row {
        path: "persistent bash `echo x`",
        unit: "ms",
        measured: persistent,
        floor: Some(echo),
        floor_name: "terminal_send `echo x`",
        goal: Goal::Ratio(2.0),
    });

    // Teardown of an owner with 100 live background jobs.
    let many = conch::build_runtime_from_yaml(
        "bench:many-jobs",
        "plugins:\n  subprocess-local: {}\n  bash-local: {}\n  jobs: { cap_per_owner: 100 }\n  tool-bash: {}\n  tool-jobs: {}\n",
        conch_env::ShellEnv::from_process_env(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let mut teardown = Vec::new();
    for _ in 0..n.clamp(1, 3) {
        let jo = owner();
        for _ in 0..100 {
            let args = json!({"command": "exec sleep 1000", "run_in_background": true});
            many.call(&jo, "bash", args).await.map_err(e)?;
        }
        let t0 = Instant::now();
        jo.dispose().await;
        teardown.push(t0.elapsed());
    }
    rows.push(Row {
        path: "teardown with 100 live background jobs",
        unit: "ms",
        measured: median(teardown),
        floor: None,
        floor_name: "-",
        goal: Goal::AtMostMs(20.0),
    });

    // 1 GiB through a background job vs a raw pipe.
    const GIB: &str = "1073741824";
    let pipe = timed(n.clamp(1, 3), || async {
        // The floor: the same writer into a plain pipe, drained by a blocking reader.
        tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
            use std::io::Read;
            let mut child = std::process::Command::new("head")
                .args(["-c", GIB, "/dev/zero"])
                .stdout(std::process::Stdio::piped())
                .spawn()?;
            let mut out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0u64;
            loop {
                let k = out.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                total += k as u64;
            }
            child.wait()?;
            ensure!(total == 1 << 30, "read {total} bytes");
            Ok(())
        })
        .await?
    })
    .await?;
    let gib = format!("head -c {GIB} /dev/zero");
    let job = timed(n.clamp(1, 3), || background_job(&many, &o, &gib)).await?;
    rows.push(Row {
        path: "1 GiB through a background job",
        unit: "ms",
        measured: job,
        floor: Some(pipe),
        floor_name: "raw pipe read",
        goal: Goal::Ratio(1.10),
    });

    o.dispose().await;
    for rt in [&standard, &terminal, &minimal, &many] {
        rt.shutdown().await;
    }
    render(&rows, n, as_json)
}

/// What this machine runs that takes CPU in bursts no benchmark asked for, and so shows in
/// tail rows: today, DAMON's kernel threads (`kdamond`), which a machine may run for proactive
/// reclaim. Seen on one machine kind: a scan every 500 ms that held a CPU for 4 to 10 ms.
pub(crate) fn machine_notes() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/damon/admin/kdamonds") else {
        return Vec::new();
    };
    let on: Vec<String> = dir
        .flatten()
        .filter(|d| std::fs::read_to_string(d.path().join("state")).is_ok_and(|s| s.trim() == "on"))
        .map(|d| {
            let sample = d.path().join("contexts/0/monitoring_attrs/intervals/sample_us");
            let every = std::fs::read_to_string(sample)
                .map_or_else(|_| String::new(), |us| format!(", sampling every {} us", us.trim()));
            format!("kdamond {}{every}", d.file_name().to_string_lossy())
        })
        .collect();
    if on.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "DAMON is on ({}): its scans take a CPU in bursts, which can show in tail rows",
        on.join("; ")
    )]
}

pub(crate) fn render(rows: &[Row], iterations: usize, as_json: bool) -> anyhow::Result<String> {
    let notes = machine_notes();
    if as_json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "path": r.path,
                    "unit": r.unit,
                    "measured": r.measured,
                    "floor": r.floor,
                    "floor_is": r.floor_name,
                    "ratio": r.floor.map(|f| r.measured / f),
                    "goal": r.goal.text(r.unit),
                    "met": (!matches!(r.goal, Goal::Report)).then(|| r.goal.met(r.measured, r.floor)),
                })
            })
            .collect();
        let doc = json!({ "iterations": iterations, "machine_notes": notes, "rows": rows });
        return Ok(format!("{doc}\n"));
    }
    let mut s = String::new();
    writeln!(s, "iterations: {iterations} (medians)")?;
    for n in &notes {
        writeln!(s, "machine: {n}")?;
    }
    writeln!(
        s,
        "{:<44} {:>10} {:>10} {:>8}  {:<22} floor is",
        "path", "measured", "floor", "ratio", "goal"
    )?;
    for r in rows {
        let floor = r.floor.map_or("-".to_string(), |f| format!("{f:.3}"));
        let ratio = r.floor.map_or("-".to_string(), |f| format!("{:.2}x", r.measured / f));
        let met = match r.goal {
            Goal::Report => "",
            g if g.met(r.measured, r.floor) => "met",
            _ => "MISSED",
        };
        writeln!(
            s,
            "{:<44} {:>10.3} {:>10} {:>8}  {:<22} {}",
            r.path,
            r.measured,
            floor,
            ratio,
            format!("{} {met}", r.goal.text(r.unit)),
            r.floor_name
        )?;
    }
    Ok(s)
}
