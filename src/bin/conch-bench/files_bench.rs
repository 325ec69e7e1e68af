//! `conch bench --suite files`: the files seam next to floors measured in the same run.
//!
//! - 1 GiB written through `files-local` next to `cp` of a 1 GiB file, and read back next
//!   to `cat FILE > /dev/null` (goal: at most 1.2x each). Both sides use the same
//!   directory, a fresh target per round, and a source already in the page cache.
//! - The same GiB written and read through `files-remote` (a `conch sandboxd` on loopback in
//!   this process, hosting `files-local`) next to `files-local` (goal: at least half the
//!   local rate, so a time ratio of at most 2), and the process's peak memory growth while
//!   it streams (client and daemon both live here; goal: flat, at most 64 MiB).
//! - A small-file `file_edit` round trip, remote next to local (goal: at most 2x + 1 ms).
//! - For context, no goal: the remote read next to 1 GiB over one plain loopback TCP
//!   connection, the transport's own floor (a local read copies the page cache once; a remote
//!   one at least three times, two of them in the kernel).
//!
//! Every file lives in `/dev/shm` when it is a tmpfs with 4 GiB free (else the system's
//! temporary directory), and the table's first line says which: see [`memory_dir`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, anyhow, ensure};
use conch_registry::Runtime;
use conch_seams::{Files, WriteMode, WriteSpec};
use serde_json::json;

use crate::floors::{Goal, Row, e, median, owner, paired, render, timed};
use crate::remote_bench::{Daemon, with_peak_rss};

const GIB: u64 = 1 << 30;
const CHUNK: usize = conch_seams::files::MAX_READ_CHUNK;

fn files_of(rt: &Runtime, what: &str) -> anyhow::Result<Arc<dyn Files>> {
    rt.seams().files.clone().ok_or_else(|| anyhow!("{what} has no files seam"))
}

/// Writes 1 GiB to `path` through the seam, one chunk-sized buffer at a time.
async fn write_gib(files: &dyn Files, path: &Path) -> anyhow::Result<()> {
    let buf = vec![b'x'; CHUNK];
    let mut w = files.write(WriteSpec::new(path, WriteMode::Truncate)).await.map_err(e)?;
    for _ in 0..GIB / CHUNK as u64 {
        w.write(&buf).await.map_err(e)?;
    }
    let st = w.finish().await.map_err(e)?;
    ensure!(st.size == GIB, "wrote {} bytes, not 1 GiB", st.size);
    Ok(())
}

/// Reads all of `path` through the seam in the largest chunks it gives.
async fn read_gib(files: &dyn Files, path: &Path) -> anyhow::Result<()> {
    let mut offset = 0u64;
    loop {
        let chunk = files.read(path, offset, CHUNK).await.map_err(e)?;
        offset += chunk.data.len() as u64;
        if chunk.eof {
            break;
        }
        ensure!(!chunk.data.is_empty(), "an empty read before the end at {offset}");
    }
    ensure!(offset == GIB, "read {offset} bytes, not 1 GiB");
    Ok(())
}

/// Runs `sh -c script` and fails unless it exits 0.
async fn sh(script: &str) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .status()
        .await
        .with_context(|| format!("running {script}"))?;
    ensure!(status.success(), "{script} exited {status}");
    Ok(())
}

/// Times `f` once per round after `prepare` (untimed, so a write always makes a fresh file);
/// returns the median in ms. Without a preparation step, `floors::timed` is the one to use.
async fn rounds<P, PF, F, FF>(n: usize, mut prepare: P, mut f: F) -> anyhow::Result<f64>
where
    P: FnMut() -> PF,
    PF: Future<Output = anyhow::Result<()>>,
    F: FnMut() -> FF,
    FF: Future<Output = anyhow::Result<()>>,
{
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        prepare().await?;
        let t0 = Instant::now();
        f().await?;
        v.push(t0.elapsed());
    }
    Ok(median(v))
}

fn quoted(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// One `file_edit` that swaps `from` for `to` in `path`.
async fn edit(
    rt: &Runtime,
    o: &Arc<conch_seams::Owner>,
    path: &str,
    from: &str,
    to: &str,
) -> anyhow::Result<()> {
    let args = json!({"path": path, "old_string": from, "new_string": to});
    rt.call(o, "file_edit", args).await.map_err(e)?;
    Ok(())
}

/// 1 GiB through one plain TCP connection on loopback, in chunk-sized writes from memory to a
/// reader that discards it: the transport's own cost, two copies through the kernel.
async fn loopback_gib() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sender = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await?;
        let buf = vec![b'x'; CHUNK];
        for _ in 0..GIB / CHUNK as u64 {
            sock.write_all(&buf).await?;
        }
        sock.shutdown().await
    });
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    sender.await.context("the sender task")??;
    ensure!(got == GIB, "received {got} bytes, not 1 GiB");
    Ok(())
}

/// A tmpfs with room for the suite's files (3 GiB at most at once), when there is one.
///
/// On a disk, a 1 GiB write's time is the kernel's dirty-page throttling as much as the
/// writer's: `cp`'s own floor moved from 304 to 1,084 ms between runs minutes apart, and a
/// ratio of two such numbers said nothing about conch. In memory both sides pay for copies
/// only, which is what the files seam adds.
fn memory_dir() -> Option<&'static Path> {
    let shm = Path::new("/dev/shm");
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(shm)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let avail: u64 = text.lines().nth(1)?.trim().parse().ok()?;
    (out.status.success() && avail >= 4 * GIB).then_some(shm)
}

/// Runs the suite and renders the table (or JSON).
///
/// # Errors
/// When a runtime or the daemon cannot be built, or a measured operation fails.
pub(crate) async fn run(iterations: usize, as_json: bool) -> anyhow::Result<String> {
    let n = iterations.clamp(1, 5);
    let dir = match memory_dir() {
        Some(shm) => tempfile::tempdir_in(shm),
        None => tempfile::tempdir(),
    }
    .context("a scratch directory")?;
    let path = |name: &str| -> PathBuf { dir.path().join(name) };
    let (src, by_seam, by_tool) = (path("source"), path("seam"), path("tool"));
    let mut rows = Vec::new();

    let local = conch::build_runtime("standard").map_err(|e| anyhow!("{e}"))?;
    let files = files_of(&local, "the standard composition")?;
    write_gib(files.as_ref(), &src).await?;
    // The source in the page cache before anything is timed.
    sh(&format!("cat {} > /dev/null", quoted(&src))).await?;

    let gone = |p: PathBuf| {
        move || {
            let p = p.clone();
            async move {
                match tokio::fs::remove_file(&p).await {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err.into()),
                    _ => Ok(()),
                }
            }
        }
    };
    let cp = format!("cp {} {}", quoted(&src), quoted(&by_tool));
    let floor_w = rounds(n, gone(by_tool.clone()), || sh(&cp)).await?;
    let seam_w = rounds(n, gone(by_seam.clone()), || write_gib(files.as_ref(), &by_seam)).await?;
    rows.push(Row {
        path: "1 GiB written through files-local",
        unit: "ms",
        measured: seam_w,
        floor: Some(floor_w),
        floor_name: "`cp` of a 1 GiB file",
        goal: Goal::Ratio(1.2),
    });
    let cat = format!("cat {} > /dev/null", quoted(&by_seam));
    let (floor_r, seam_r) = paired(n, || sh(&cat), || read_gib(files.as_ref(), &by_seam)).await?;
    rows.push(Row {
        path: "1 GiB read through files-local",
        unit: "ms",
        measured: seam_r,
        floor: Some(floor_r),
        floor_name: "`cat` of the same file to /dev/null",
        goal: Goal::Ratio(1.2),
    });

    let daemon = Daemon::start().await?;
    let remote = daemon.runtime("remote-sandbox")?;
    let rfiles = files_of(&remote, "the remote-sandbox composition")?;
    let remote_w =
        rounds(n, gone(by_seam.clone()), || write_gib(rfiles.as_ref(), &by_seam)).await?;
    let local_w = rounds(n, gone(by_seam.clone()), || write_gib(files.as_ref(), &by_seam)).await?;
    rows.push(Row {
        path: "1 GiB written through files-remote",
        unit: "ms",
        measured: remote_w,
        floor: Some(local_w),
        floor_name: "the same write, files-local",
        goal: Goal::Ratio(2.0),
    });
    let (remote_r, grown) = with_peak_rss(timed(n, || read_gib(rfiles.as_ref(), &by_seam))).await?;
    let local_r = timed(n, || read_gib(files.as_ref(), &by_seam)).await?;
    rows.push(Row {
        path: "1 GiB read through files-remote",
        unit: "ms",
        measured: remote_r,
        floor: Some(local_r),
        floor_name: "the same read, files-local",
        goal: Goal::Ratio(2.0),
    });
    // Not a goal of its own: what any remote read pays before conch does anything.
    let tcp = timed(n, loopback_gib).await?;
    rows.push(Row {
        path: "1 GiB read through files-remote, next to raw TCP",
        unit: "ms",
        measured: remote_r,
        floor: Some(tcp),
        floor_name: "1 GiB over one loopback TCP connection",
        goal: Goal::Report,
    });
    let (_, grown_w) = with_peak_rss(write_gib(rfiles.as_ref(), &by_seam)).await?;
    rows.push(Row {
        path: "peak memory growth while 1 GiB goes each way, remote",
        unit: "MiB",
        measured: grown.max(grown_w),
        floor: None,
        floor_name: "",
        goal: Goal::AtMost(64.0),
    });
    tokio::fs::remove_file(&by_seam).await.ok();
    tokio::fs::remove_file(&src).await.ok();

    // A small source file, edited back and forth.
    let small = path("small.rs");
    let text: String = (0..200).map(|i| format!("let line_{i} = {i};\n")).collect();
    tokio::fs::write(&small, text).await?;
    let small = small.display().to_string();
    let o = owner();
    // In alternation: local turns 100 into 101, remote turns it back.
    let (a, b) = ("let line_100 = 100;", "let line_100 = 101;");
    let (l, r) =
        paired(n.max(5), || edit(&local, &o, &small, a, b), || edit(&remote, &o, &small, b, a))
            .await?;
    rows.push(Row {
        path: "file_edit of a 200-line file, remote",
        unit: "ms",
        measured: r,
        floor: Some(l),
        floor_name: "the same edit, local",
        goal: Goal::RatioPlusMs(2.0, 1.0),
    });

    o.dispose().await;
    for rt in [&local, &remote] {
        rt.shutdown().await;
    }
    daemon.stop().await?;
    let scratch = dir.path().parent().unwrap_or(dir.path()).display().to_string();
    let out = render(&rows, n, as_json)?;
    if as_json {
        let mut v: serde_json::Value = serde_json::from_str(&out)?;
        v["scratch"] = json!(scratch);
        return Ok(format!("{v}\n"));
    }
    Ok(format!("scratch directory: {scratch}\n{out}"))
}
