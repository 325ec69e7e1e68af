//! A large file through the real `conch sandboxd` binary (a composition with `files-local`)
//! and `files-remote`: written in chunks and read back by range, with the bytes checked by
//! SHA-256 and the memory of the daemon process (its `VmRSS`) and of this client bounded
//! while the file passes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;

use conch_provider_remote::{RemoteConfig, RemoteFiles, RemoteSubprocess};
use conch_seams::files::MAX_READ_CHUNK;
use conch_seams::{Files, Subprocess as _, WriteMode, WriteSpec};
use sha2::{Digest as _, Sha256};

use super::conch;

/// The file's size: 1 GiB.
const SIZE: u64 = 1 << 30;
/// How much a side's resident memory may grow while the file passes.
const RSS_BOUND: u64 = 100 << 20;
/// What the client writes per call.
const PIECE: usize = 4 << 20;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Resident memory of `pid`, in bytes (`VmRSS` of `/proc/<pid>/status`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Piece `i` of the file: a fixed pseudo-random block with its index in front, so every
/// piece differs and making them costs nothing.
fn piece(block: &[u8], i: u64) -> Vec<u8> {
    let mut p = block.to_vec();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

fn block() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(PIECE);
    while out.len() < PIECE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(PIECE);
    out
}

#[test]
fn a_gigabyte_round_trips_through_the_daemon_with_flat_memory_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let token = "files-big-test-token-0123456789";
    std::fs::write(dir.path().join("token"), token).unwrap();
    let composition = dir.path().join("daemon.yaml");
    std::fs::write(
        &composition,
        format!(
            "plugins:\n  subprocess-local: {{}}\n  files-local:\n    root: {}\n",
            work.display()
        ),
    )
    .unwrap();
    let mut child = conch()
        .arg("--composition")
        .arg(&composition)
        .args(["sandboxd", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(dir.path().join("token"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The daemon logs to stderr for as long as it runs: drain it (a closed pipe would end
    // it), and hand over the first line, which names the address.
    let (tx, rx) = std::sync::mpsc::channel();
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let daemon = Killed(child);
    let first = rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
    let addr =
        first.trim().strip_prefix("listening on ").expect("the first line names the address");
    let pid = daemon.0.id();
    let cfg = RemoteConfig {
        url: format!("http://{addr}"),
        token: Some(token.into()),
        ..RemoteConfig::default()
    };
    let sub = Arc::new(RemoteSubprocess::connect(&cfg).unwrap());
    let files = RemoteFiles::new(&sub);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let block = block();
    let me = std::process::id();
    rt.block_on(async {
        let path = Path::new("big.bin");
        // Warm both sides up (allocator arenas, buffers) before the baseline.
        let mut w = files.write(WriteSpec::new("warm.bin", WriteMode::Create)).await.unwrap();
        for i in 0..4 {
            w.write(&piece(&block, i)).await.unwrap();
        }
        w.finish().await.unwrap();
        let mut r = 0;
        while !files.read(Path::new("warm.bin"), r, MAX_READ_CHUNK).await.unwrap().eof {
            r += MAX_READ_CHUNK as u64;
        }
        let (daemon_base, client_base) = (rss(pid), rss(me));
        let (mut daemon_peak, mut client_peak) = (daemon_base, client_base);

        let mut sent = Sha256::new();
        let mut w = files.write(WriteSpec::new(path, WriteMode::Create).atomic()).await.unwrap();
        for i in 0..SIZE / PIECE as u64 {
            let p = piece(&block, i);
            sent.update(&p);
            w.write(&p).await.unwrap();
            daemon_peak = daemon_peak.max(rss(pid));
            client_peak = client_peak.max(rss(me));
        }
        let stat = w.finish().await.unwrap();
        assert_eq!(stat.size, SIZE);
        assert_eq!(stat.path, work.join("big.bin"));

        let mut got = Sha256::new();
        let mut offset = 0u64;
        loop {
            let chunk = files.read(path, offset, MAX_READ_CHUNK).await.unwrap();
            got.update(&chunk.data);
            offset += chunk.data.len() as u64;
            daemon_peak = daemon_peak.max(rss(pid));
            client_peak = client_peak.max(rss(me));
            if chunk.eof {
                break;
            }
        }
        assert_eq!(offset, SIZE);
        assert_eq!(got.finalize(), sent.finalize(), "the bytes read back are the bytes written");
        eprintln!(
            "1 GiB round trip: daemon VmRSS {} -> peak {} MiB, client {} -> peak {} MiB",
            daemon_base >> 20,
            daemon_peak >> 20,
            client_base >> 20,
            client_peak >> 20
        );
        assert!(
            daemon_peak - daemon_base < RSS_BOUND,
            "the daemon grew {} MiB while 1 GiB passed",
            (daemon_peak - daemon_base) >> 20
        );
        assert!(
            client_peak - client_base < RSS_BOUND,
            "the client grew {} MiB while 1 GiB passed",
            (client_peak - client_base) >> 20
        );
        sub.shutdown().await;
    });
    drop(daemon);
}
