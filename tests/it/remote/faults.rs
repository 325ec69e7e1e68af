//! Fault injection: real processes on a real daemon, reached through a TCP proxy inside the
//! test that cuts, swallows or freezes what it forwards on command. Only 127.0.0.1.
//!
//! Nothing here sleeps to synchronise: the proxy acts at points the test observes (a read
//! offset, an armed response), waits are on events with generous bounds, and the only
//! polling is of `/proc` for pids the daemon must reap, in a bounded loop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conch_conformance::{pid_gone, within};
use conch_frontend_sandboxd::rxp::{self, ServerConfig, State};
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_remote::{RemoteConfig, RemoteSubprocess};
use conch_seams::{
    Error, ErrorCode, ErrorReason, OutputSpec, Process, SpawnSpec, StdinSpec, StreamId, Subprocess,
};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::Daemon;

// ---------------------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1:0 in front of a daemon. Every accepted connection gets one
/// upstream connection; the test can cut all live ones at once, swallow chosen HTTP
/// responses (the daemon did the work, the client never hears), freeze forwarding
/// (a peer that neither answers nor closes), or go away for good.
pub(super) struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    accept: AbortHandle,
}

#[derive(Default)]
struct ProxyShared {
    links: Mutex<HashMap<u64, Link>>,
    next_id: AtomicU64,
    /// Responses still to swallow, to requests whose request line contains the pattern.
    swallow: Mutex<(String, usize)>,
    swallowed: AtomicUsize,
    /// While set, nothing is forwarded in either direction (connections stay open).
    frozen: AtomicBool,
    /// While set, the same for stream connections only (HTTP calls still pass).
    streams_frozen: AtomicBool,
    thaw: tokio::sync::Notify,
}

struct Link {
    state: Arc<LinkState>,
    task: AbortHandle,
}

#[derive(Default)]
struct LinkState {
    /// The connection was upgraded to the stream connection (`GET /v1/ws`).
    ws: AtomicBool,
    /// The latest HTTP request line the client sent on this connection.
    request: Mutex<String>,
}

/// What one `cut_all` cut.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cut {
    pub(super) links: usize,
    pub(super) ws: usize,
}

const METHODS: [&[u8]; 4] = [b"GET /", b"POST /", b"PUT /", b"DELETE /"];

impl LinkState {
    /// Notes the request line when `chunk` starts a request (reqwest does not pipeline, so a
    /// request head starts a read; a JSON body never starts with a method).
    fn saw(&self, chunk: &[u8]) {
        if METHODS.iter().any(|m| chunk.starts_with(m)) {
            let end = chunk.windows(2).position(|w| w == b"\r\n").unwrap_or(chunk.len());
            let line = String::from_utf8_lossy(&chunk[..end]).into_owned();
            if line.starts_with("GET /v1/ws") {
                self.ws.store(true, Ordering::SeqCst);
            }
            *self.request.lock().unwrap() = line;
        }
    }
}

impl ProxyShared {
    /// True when this response must be swallowed (and its connection cut).
    fn swallow_now(&self, link: &LinkState) -> bool {
        if link.ws.load(Ordering::SeqCst) {
            return false;
        }
        let mut s = self.swallow.lock().unwrap();
        if s.1 > 0 && link.request.lock().unwrap().contains(s.0.as_str()) {
            s.1 -= 1;
            self.swallowed.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    }

    async fn unfrozen(&self, link: &LinkState) {
        loop {
            let notified = self.thaw.notified();
            let held = self.frozen.load(Ordering::SeqCst)
                || (link.ws.load(Ordering::SeqCst) && self.streams_frozen.load(Ordering::SeqCst));
            if !held {
                return;
            }
            notified.await;
        }
    }
}

impl Proxy {
    pub(super) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared::default());
        let s = Arc::clone(&shared);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = s.next_id.fetch_add(1, Ordering::SeqCst);
                let state = Arc::new(LinkState::default());
                // Registered under the lock, so the link's own removal comes after.
                let mut links = s.links.lock().unwrap();
                let task =
                    tokio::spawn(link(Arc::clone(&s), id, client, upstream, Arc::clone(&state)));
                links.insert(id, Link { state, task: task.abort_handle() });
            }
        })
        .abort_handle();
        Self { addr, shared, accept }
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts every live connection (both sides see the socket close mid-whatever).
    pub(super) fn cut_all(&self) -> Cut {
        let links: Vec<Link> = self.shared.links.lock().unwrap().drain().map(|(_, l)| l).collect();
        let mut cut = Cut::default();
        for l in links {
            l.task.abort();
            cut.links += 1;
            if l.state.ws.load(Ordering::SeqCst) {
                cut.ws += 1;
            }
        }
        cut
    }

    /// The daemon's answers to the next `n` requests whose request line contains
    /// `pattern` are dropped and their connections cut: the work is done, the client
    /// does not know.
    pub(super) fn swallow_responses(&self, pattern: &str, n: usize) {
        *self.shared.swallow.lock().unwrap() = (pattern.to_owned(), n);
    }

    pub(super) fn swallowed(&self) -> usize {
        self.shared.swallowed.load(Ordering::SeqCst)
    }

    /// Stops forwarding without closing anything: a daemon that hangs, or a network that
    /// drops every packet.
    fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// Holds every stream connection, present and future, where it stands.
    fn freeze_streams(&self) {
        self.shared.streams_frozen.store(true, Ordering::SeqCst);
    }

    /// Forwards again what was held.
    fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::SeqCst);
        self.shared.streams_frozen.store(false, Ordering::SeqCst);
        self.shared.thaw.notify_waiters();
    }

    /// Stops accepting and cuts everything: the daemon is unreachable for good.
    fn shutdown(&self) -> Cut {
        self.accept.abort();
        self.cut_all()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
        self.thaw();
    }
}

const BUF: usize = 64 << 10;

/// Forwards one connection until either side closes, a response is swallowed, or the task is
/// aborted (a cut); the sockets close when it ends.
async fn link(
    shared: Arc<ProxyShared>,
    id: u64,
    client: TcpStream,
    upstream: SocketAddr,
    state: Arc<LinkState>,
) {
    if let Ok(up) = TcpStream::connect(upstream).await {
        let _ = (client.set_nodelay(true), up.set_nodelay(true));
        let (mut cr, mut cw) = client.into_split();
        let (mut ur, mut uw) = up.into_split();
        let to_daemon = async {
            let mut buf = vec![0; BUF];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(_) => return,
                };
                // Classify first, so a stream connection is held from its upgrade on.
                state.saw(&buf[..n]);
                shared.unfrozen(&state).await;
                if uw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            // The client half-closed: pass it on and let the answer finish.
            let _ = uw.shutdown().await;
            std::future::pending::<()>().await;
        };
        let to_client = async {
            let mut buf = vec![0; BUF];
            loop {
                let n = match ur.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                shared.unfrozen(&state).await;
                if shared.swallow_now(&state) || cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = to_daemon => {}
            () = to_client => {}
        }
    }
    shared.links.lock().unwrap().remove(&id);
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A client of `d` that reaches it only through `proxy`.
pub(super) async fn client_via(
    d: &Daemon,
    proxy: &Proxy,
    tune: impl FnOnce(&mut RemoteConfig),
) -> Arc<RemoteSubprocess> {
    let mut cfg = d.client_config();
    cfg.url = proxy.url();
    tune(&mut cfg);
    // `connect` blocks its thread on the info call, which the proxy (on this runtime) serves.
    let c = tokio::task::spawn_blocking(move || RemoteSubprocess::connect(&cfg)).await.unwrap();
    Arc::new(c.unwrap())
}

fn bash(script: &str) -> SpawnSpec {
    SpawnSpec::new(vec!["bash".into(), "-c".into(), script.into()], "/tmp")
}

fn collect(max_bytes: usize) -> OutputSpec {
    // No spill: what the daemon can replay is exactly its memory (see each test).
    OutputSpec::Collect { max_bytes, spill_cap: 0 }
}

/// Everything `stream` holds from offset 0, read until sealed; panics on any loss.
async fn read_to_end(p: &dyn Process, stream: StreamId) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = 0;
    for _ in 0..100_000 {
        within("readable", p.readable(stream, offset)).await.unwrap();
        let r = p.read(stream, offset, 1 << 20).unwrap();
        assert!(!r.lossy, "{stream:?} lost bytes at {offset}");
        out.extend_from_slice(&r.data);
        offset = r.next_offset;
        if r.sealed && r.data.is_empty() {
            return out;
        }
    }
    panic!("{stream:?} never sealed");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A deterministic, non-repeating chunk (xorshift seeded by its index).
fn chunk(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

/// Waits, polling `/proc` in a bounded loop, until every pid is gone (or a zombie).
async fn all_gone(pids: &[i32], bound: Duration) -> Result<(), Vec<i32>> {
    let deadline = Instant::now() + bound;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|p| !pid_gone(*p)).collect();
        if alive.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(alive);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect_unavailable(what: &str, r: Result<impl std::fmt::Debug, Error>) {
    match r {
        Err(e) => assert_eq!(e.code(), ErrorCode::RemoteUnavailable, "{what}: {e}"),
        Ok(v) => panic!("{what}: expected remote_unavailable, got {v:?}"),
    }
}

/// The daemon is known gone: `remote_unavailable` with reason `REMOTE_GONE`, not retryable
/// (nothing but a new daemon and a rebuilt runtime can help).
fn expect_gone(what: &str, r: Result<impl std::fmt::Debug, Error>) {
    match r {
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::RemoteUnavailable, "{what}: {e}");
            assert_eq!(e.reason(), Some(ErrorReason::RemoteGone), "{what}: {e}");
            assert!(!e.retryable(), "{what}: a gone daemon is not retryable: {e}");
            assert_eq!(e.to_json()["retryable"], false, "{what}");
        }
        Ok(v) => panic!("{what}: expected remote_unavailable (REMOTE_GONE), got {v:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Output across cuts
// ---------------------------------------------------------------------------------------

/// 200 MB of random output, checksummed by the child itself, read through a proxy that cuts
/// every connection six times mid-stream: the client's bytes hash to the child's sha256,
/// nothing lost, nothing duplicated, no read lossy.
///
/// Retention, decided so that this is about correctness and not timing: the child is never
/// back-pressured (rule 3), so during a cut and the reconnect the daemon can run ahead of
/// the client by an amount that depends only on scheduling. The daemon therefore retains the
/// whole stream in memory (`retain_bytes` 256 MiB beyond the window, no spill): any byte the
/// client misses is still replayable, and a lossy read or a wrong hash is a defect. The
/// client's replica keeps no spill, so its window (64 MiB) is sized for this test's reader
/// falling behind the connection task on a loaded machine, not for the cuts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cut_six_times_mid_stream_arrives_exactly_once() {
    const TOTAL: u64 = 200_000_000;
    const WINDOW: usize = 64 << 20;
    const CUT_EVERY: u64 = 30_000_000;
    let d = Daemon::start(ServerConfig {
        retain_bytes: 256 << 20,
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let proxy = Proxy::start(d.addr).await;
    let client = client_via(&d, &proxy, |_| {}).await;
    let script = format!("head -c {TOTAL} /dev/urandom | tee >(sha256sum >&2)");
    let mut spec = bash(&script);
    spec.stdout = collect(WINDOW);
    spec.stderr = collect(4096);
    let p = client.spawn(spec).await.unwrap();

    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    let mut cuts = Vec::new();
    let read_all = async {
        // Bounded: every turn makes progress or ends (a turn reads at least one byte).
        for _ in 0..10_000_000 {
            p.readable(StreamId::Stdout, offset).await.unwrap();
            let r = p.read(StreamId::Stdout, offset, 4 << 20).unwrap();
            assert!(!r.lossy, "lossy read at {offset} (start {})", r.start_offset);
            assert_eq!(r.start_offset, offset, "a read starts where the last one ended");
            hasher.update(&r.data);
            offset = r.next_offset;
            while (cuts.len() as u64 + 1) * CUT_EVERY <= offset.min(TOTAL - 1) {
                cuts.push((offset, proxy.cut_all()));
            }
            if r.sealed && r.data.is_empty() {
                return;
            }
        }
        panic!("stdout never sealed");
    };
    tokio::time::timeout(Duration::from_secs(600), read_all)
        .await
        .unwrap_or_else(|_| panic!("200 MB did not arrive in 600 s; read {offset}"));
    let status = within("settlement", p.wait()).await.unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    let stderr = read_to_end(p.as_ref(), StreamId::Stderr).await;
    let stderr = String::from_utf8_lossy(&stderr);
    let expected = stderr.split_whitespace().next().unwrap_or_default().to_owned();

    assert_eq!(offset, TOTAL, "every byte arrived once (cuts: {cuts:?})");
    assert_eq!(hex(&hasher.finalize()), expected, "the bytes are the child's (cuts: {cuts:?})");
    eprintln!("cuts (reader offset, what was cut): {cuts:?}");
    let ws_cuts = cuts.iter().filter(|(_, c)| c.ws > 0).count();
    assert!(cuts.len() >= 6 && ws_cuts >= 5, "the stream connection was cut mid-stream: {cuts:?}");
    let c = p.collected(StreamId::Stdout).unwrap();
    assert_eq!(c.total_bytes, TOTAL);
    drop(p);
    within("leave", client.shutdown()).await;
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// The client falls behind the daemon's memory on purpose: its stream connections are held
/// while the child writes 100 MB and exits (stdin, over HTTP, is the gate). On release the
/// client resumes from offset 0, which only the daemon's complete spill still holds: every
/// byte is had exactly once, with no gap: from the client's reads, or, where this reader fell
/// behind the client's window (the client has no flow control, so on a loaded machine the
/// replay can outrun it), from the complete spill that the lossy read names.
///
/// Retention: the daemon's memory is the window (32 MiB) plus `retain_bytes` (4 MiB), well
/// under the 100 MB the child writes before the client may read a byte, so the replay
/// cannot come from memory; the spill cap (128 MiB) holds the whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_far_behind_is_replayed_from_the_daemons_spill_exactly_once() {
    const TOTAL: u64 = 100_000_000;
    const WINDOW: usize = 32 << 20;
    const RETAIN: usize = 4 << 20;
    const _: () = assert!((WINDOW + RETAIN) as u64 * 2 < TOTAL);
    let d = Daemon::start(ServerConfig {
        retain_bytes: RETAIN,
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let proxy = Proxy::start(d.addr).await;
    // Waits must outlive the hold: giving up is not what this test is about.
    let client = client_via(&d, &proxy, |c| c.give_up_ms = 120_000).await;
    proxy.freeze_streams();
    let script = format!("read _; head -c {TOTAL} /dev/urandom | tee >(sha256sum >&2)");
    let mut spec = bash(&script);
    spec.stdin = StdinSpec::Pipe;
    spec.stdout = OutputSpec::Collect { max_bytes: WINDOW, spill_cap: 128 << 20 };
    spec.stderr = collect(4096);
    let p = client.spawn(spec).await.unwrap();
    let leader = p.pid().unwrap() as i32;
    within("the gate", p.write_stdin(b"go\n")).await.unwrap();
    p.close_stdin().await.unwrap();
    // The child wrote everything and exited while the client could read nothing.
    all_gone(&[leader], Duration::from_secs(120)).await.expect("the writer finished");
    assert_eq!(p.collected(StreamId::Stdout).unwrap().total_bytes, 0, "nothing arrived yet");
    proxy.thaw();

    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    let mut spilled = false;
    let mut from_spill = 0u64;
    let read_all = async {
        for _ in 0..10_000_000 {
            p.readable(StreamId::Stdout, offset).await.unwrap();
            let r = p.read(StreamId::Stdout, offset, 4 << 20).unwrap();
            if r.lossy {
                // The replay can outrun this reader (a loaded machine): the client has no flow
                // control, so its window moves on, as a local collector's does. The contract
                // is then that the read names the complete spill holding the skipped bytes;
                // on loopback the daemon's spill is a file on this machine.
                let spill = r.spill.as_ref().expect("a lossy read names the complete spill");
                let gap = r.start_offset - offset;
                let mut f = std::fs::File::open(&spill.path).expect("the named spill exists");
                std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(offset)).unwrap();
                let mut skipped = vec![0; usize::try_from(gap).unwrap()];
                std::io::Read::read_exact(&mut f, &mut skipped).expect("the spill holds the gap");
                hasher.update(&skipped);
                from_spill += gap;
                offset = r.start_offset;
            }
            assert_eq!(r.start_offset, offset, "a read starts where the last one ended");
            spilled |= r.spill.is_some();
            hasher.update(&r.data);
            offset = r.next_offset;
            if r.sealed && r.data.is_empty() {
                return;
            }
        }
        panic!("stdout never sealed");
    };
    tokio::time::timeout(Duration::from_secs(600), read_all)
        .await
        .unwrap_or_else(|_| panic!("100 MB did not arrive in 600 s; read {offset}"));
    let status = within("settlement", p.wait()).await.unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    let stderr = read_to_end(p.as_ref(), StreamId::Stderr).await;
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(offset, TOTAL, "every byte arrived once");
    assert_eq!(
        hex(&hasher.finalize()),
        stderr.split_whitespace().next().unwrap_or_default(),
        "the bytes are the child's"
    );
    assert!(spilled, "the daemon had a complete spill to replay from");
    eprintln!("bytes read from the named spill after the reader fell behind: {from_spill}");
    drop(p);
    within("leave", client.shutdown()).await;
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 2. Stdin across cuts
// ---------------------------------------------------------------------------------------

/// Stdin written in chunks while the proxy swallows the daemon's answers to stdin writes
/// (the bytes were typed, the client does not know and resends) and cuts every connection
/// between writes: the child counts and hashes what it got, and it is each byte once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_resent_across_cuts_is_typed_once() {
    const CHUNKS: u64 = 120;
    const LEN: usize = 48 << 10;
    let d = Daemon::start(ServerConfig {
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let proxy = Proxy::start(d.addr).await;
    let client = client_via(&d, &proxy, |_| {}).await;
    let mut spec = bash("tee >(wc -c >&2) | sha256sum");
    spec.stdin = StdinSpec::Pipe;
    spec.stdout = collect(4096);
    spec.stderr = collect(4096);
    let p = client.spawn(spec).await.unwrap();

    let mut expected = Sha256::new();
    let mut armed = 0;
    let mut cut = Cut::default();
    for i in 0..CHUNKS {
        let data = chunk(i, LEN);
        match i % 3 {
            // The daemon types this chunk; its answer never reaches the client.
            0 => {
                proxy.swallow_responses("/stdin", 1);
                armed += 1;
            }
            // Every pooled HTTP connection and the stream connection die between writes.
            1 => {
                let c = proxy.cut_all();
                cut.links += c.links;
                cut.ws += c.ws;
            }
            _ => {}
        }
        within("write_stdin", p.write_stdin(&data)).await.unwrap();
        expected.update(&data);
    }
    assert_eq!(proxy.swallowed(), armed, "every armed answer was swallowed, and resent");
    assert!(cut.links > 0, "connections were cut: {cut:?}");
    p.close_stdin().await.unwrap();
    let status = within("settlement", p.wait()).await.unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    let out = read_to_end(p.as_ref(), StreamId::Stdout).await;
    let count = read_to_end(p.as_ref(), StreamId::Stderr).await;
    let count = String::from_utf8_lossy(&count).trim().to_owned();
    assert_eq!(count, (CHUNKS * LEN as u64).to_string(), "bytes the child read");
    let out = String::from_utf8_lossy(&out);
    assert_eq!(
        out.split_whitespace().next().unwrap_or_default(),
        hex(&expected.finalize()),
        "the child read each chunk once, in order"
    );
    drop(p);
    within("leave", client.shutdown()).await;
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 3. The daemon dies or hangs mid-call
// ---------------------------------------------------------------------------------------

/// A daemon whose runtime can be dropped on the spot: no shutdown, no kills, no goodbye;
/// its sockets simply close (as when its host dies). Its processes are left running, as
/// they would be; the test cleans them up by pid.
struct Doomed {
    addr: SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Doomed {
    fn start(cfg: ServerConfig) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let (up_tx, up_rx) = std::sync::mpsc::channel::<Arc<State>>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
                let state = State::new(sub, cfg);
                up_tx.send(Arc::clone(&state)).unwrap();
                tokio::select! {
                    r = rxp::serve(listener, state, std::future::pending()) => r.unwrap(),
                    _ = killed => {}
                }
            });
            // Every task (connections, pumps, watchers) is dropped where it stands.
            rt.shutdown_background();
        });
        drop(up_rx.recv().unwrap());
        Self { addr, kill: Some(kill), thread: Some(thread) }
    }

    fn client_config(&self) -> RemoteConfig {
        RemoteConfig {
            url: format!("http://{}", self.addr),
            heartbeat_ms: 500,
            reconnect_max_backoff_ms: 200,
            ..RemoteConfig::default()
        }
    }

    fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Kills a process group the test is responsible for (left behind on purpose).
fn kill_group(pgid: i32) {
    let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
}

/// Slack on top of `give_up` for detection and scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(2500);

/// A daemon about to die, a client of it with `give_up`, and a `sleep 1000` it runs (with
/// the sleeper's pid).
async fn doomed_with_a_sleeper(
    give_up: Duration,
) -> (Doomed, Arc<RemoteSubprocess>, Arc<dyn Process>, i32) {
    let d = Doomed::start(ServerConfig {
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let mut cfg = d.client_config();
    cfg.give_up_ms = give_up.as_millis() as u64;
    let client = tokio::task::spawn_blocking(move || RemoteSubprocess::connect(&cfg))
        .await
        .unwrap()
        .unwrap();
    let client = Arc::new(client);
    let mut spec = SpawnSpec::new(vec!["sleep".into(), "1000".into()], "/tmp");
    spec.stdout = collect(4096);
    let p = client.spawn(spec).await.unwrap();
    let pid = p.pid().unwrap() as i32;
    (d, client, p, pid)
}

/// The daemon dies while the client waits on a process and while it makes a control call:
/// both end in `remote_unavailable` within `give_up_ms` (plus scheduling slack), not a hang
/// and not a fake exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_dies_mid_wait_gives_remote_unavailable_within_give_up() {
    const GIVE_UP: Duration = Duration::from_millis(2000);
    let (mut d, client, p, pid) = doomed_with_a_sleeper(GIVE_UP).await;

    let waiting = {
        let p = Arc::clone(&p);
        tokio::spawn(async move { p.wait().await })
    };
    // The wait is pending on a live connection (the process runs for 1000 s).
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());

    tokio::task::spawn_blocking(move || {
        d.kill();
        d
    })
    .await
    .unwrap();
    let killed = Instant::now();
    let waited = tokio::time::timeout(GIVE_UP + SLACK, waiting)
        .await
        .unwrap_or_else(|_| {
            panic!("wait() still pending {:?} after the daemon died", GIVE_UP + SLACK)
        })
        .unwrap();
    let wait_took = killed.elapsed();
    expect_unavailable("wait", waited);

    let call = Instant::now();
    let spawned = tokio::time::timeout(GIVE_UP + SLACK, client.spawn(bash("true")))
        .await
        .expect("spawn still pending after give_up");
    expect_unavailable("spawn", spawned.map(|p| p.pid()));
    let call_took = call.elapsed();

    kill_group(pid);
    assert!(all_gone(&[pid], Duration::from_secs(30)).await.is_ok(), "cleanup of {pid}");
    assert!(wait_took <= GIVE_UP + SLACK, "wait failed after {wait_took:?}");
    assert!(call_took <= GIVE_UP + SLACK, "spawn failed after {call_took:?}");
}

/// A daemon that died (its address refuses every reconnect) is known gone: the pending wait,
/// a new spawn, a kill and a `which` all fail `remote_unavailable` with reason `REMOTE_GONE`,
/// not retryable. `give_up_ms` is a minute here, and the waits are bounded by it only as a
/// hang guard: a failure without that reason is what silence would give, so the test
/// proves the refusals were recognised rather than how fast. (The wait used to run out
/// `give_up_ms`, a kill was fire-and-forget and `which` read the loss as "not found".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_known_gone_fails_waits_and_calls_without_waiting_for_give_up() {
    const GIVE_UP: Duration = Duration::from_secs(60);
    let (mut d, client, p, pid) = doomed_with_a_sleeper(GIVE_UP).await;
    assert!(client.which("sh").await.unwrap().is_some(), "which answers while the daemon is up");
    let waiting = {
        let p = Arc::clone(&p);
        tokio::spawn(async move { p.wait().await })
    };

    tokio::task::spawn_blocking(move || {
        d.kill();
        d
    })
    .await
    .unwrap();
    let waited = tokio::time::timeout(GIVE_UP, waiting).await.expect("hang guard").unwrap();
    expect_gone("wait", waited);
    let spawned = tokio::time::timeout(GIVE_UP, client.spawn(bash("true"))).await;
    expect_gone("spawn", spawned.expect("hang guard").map(|p| p.pid()));
    // A kill that cannot be delivered is the caller's error, never assumed done.
    expect_gone("kill", tokio::time::timeout(GIVE_UP, p.kill()).await.expect("hang guard"));
    // A lost daemon is not "program not found".
    expect_gone("which", tokio::time::timeout(GIVE_UP, client.which("sh")).await.expect("guard"));

    kill_group(pid);
    assert!(all_gone(&[pid], Duration::from_secs(30)).await.is_ok(), "cleanup of {pid}");
}

/// The daemon stops answering without closing anything (a hung host, a black-holed
/// network): heartbeats detect it, and pending waits fail `remote_unavailable` after
/// two heartbeat intervals plus `give_up_ms`, however long one reconnect attempt may take
/// (`connect_timeout_ms` is set far longer here on purpose).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_hangs_mid_wait_gives_remote_unavailable_within_give_up() {
    const GIVE_UP: Duration = Duration::from_millis(2000);
    let server_hb = Duration::from_millis(300);
    let d = Daemon::start(ServerConfig { heartbeat: server_hb, ..ServerConfig::default() });
    let proxy = Proxy::start(d.addr).await;
    let client = client_via(&d, &proxy, |c| {
        c.give_up_ms = GIVE_UP.as_millis() as u64;
        c.connect_timeout_ms = 30_000;
    })
    .await;
    let mut spec = bash("echo up; exec sleep 1000");
    spec.stdout = collect(4096);
    let p = client.spawn(spec).await.unwrap();
    let pid = p.pid().unwrap() as i32;
    // Output arrived, so the stream connection is up: what follows is a live connection
    // going silent (dead-peer detection), then reconnect attempts that hang in the
    // handshake.
    within("first output", p.readable(StreamId::Stdout, 0)).await.unwrap();
    let waiting = {
        let p = Arc::clone(&p);
        tokio::spawn(async move { p.wait().await })
    };

    proxy.freeze();
    let frozen = Instant::now();
    let bound = server_hb * 2 + GIVE_UP + SLACK;
    let waited = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("wait() still pending {bound:?} after the daemon hung"))
        .unwrap();
    let took = frozen.elapsed();
    // Silence proves nothing: it is the give_up window, retryable, never `REMOTE_GONE`.
    match &waited {
        Err(e) => {
            assert_eq!(e.reason(), None, "{e}");
            assert!(e.retryable(), "{e}");
        }
        Ok(v) => panic!("wait: expected remote_unavailable, got {v:?}"),
    }
    expect_unavailable("wait", waited);
    assert!(took >= GIVE_UP, "silence waited out give_up_ms, not less: {took:?}");
    assert!(took <= bound, "wait failed after {took:?}");

    // The daemon itself is fine: stopping it reaps what the lost client left.
    drop(proxy);
    drop(p);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
    assert!(pid_gone(pid), "{pid} survived the daemon's shutdown");
}

// ---------------------------------------------------------------------------------------
// 4. A client that vanishes
// ---------------------------------------------------------------------------------------

/// A client cut off for good (no leave, no heartbeats) loses its processes when its lease
/// runs out: the daemon kills each as a tree, a background child included, while the
/// client's own waits end in `remote_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_client_has_its_process_trees_reaped_after_the_lease() {
    let d = Daemon::start(ServerConfig {
        lease: Duration::from_secs(1),
        heartbeat: Duration::from_millis(250),
        ..ServerConfig::default()
    });
    let proxy = Proxy::start(d.addr).await;
    let client = client_via(&d, &proxy, |c| {
        c.heartbeat_ms = 250;
        c.give_up_ms = 2000;
    })
    .await;
    let mut tree = bash("sleep 1000 & echo $!; wait");
    tree.stdout = collect(4096);
    let tree = client.spawn(tree).await.unwrap();
    let plain = client.spawn(SpawnSpec::new(vec!["sleep".into(), "1000".into()], "/tmp")).await;
    let plain = plain.unwrap();
    // The background child's pid, as the tree's leader printed it.
    let mut offset = 0;
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        within("the child's pid", tree.readable(StreamId::Stdout, offset)).await.unwrap();
        let r = tree.read(StreamId::Stdout, offset, 4096).unwrap();
        assert!(!(r.sealed && r.data.is_empty()), "the tree ended early");
        line.extend_from_slice(&r.data);
        offset = r.next_offset;
    }
    let child: i32 = String::from_utf8_lossy(&line).trim().parse().unwrap();
    let pids = [tree.pid().unwrap() as i32, child, plain.pid().unwrap() as i32];
    assert!(pids.iter().all(|p| !pid_gone(*p)), "all alive before the cut: {pids:?}");
    assert_eq!(d.state.live_count(), 2);

    proxy.shutdown();
    let cut = Instant::now();
    // Lease 1 s, checked every 250 ms, then a tree kill: well inside 30 s even when loaded.
    if let Err(alive) = all_gone(&pids, Duration::from_secs(30)).await {
        panic!("survivors {alive:?} of {pids:?} after {:?}", cut.elapsed());
    }
    assert_eq!(d.state.live_count(), 0, "the daemon holds nothing for the vanished client");
    expect_unavailable("wait", within("wait", tree.wait()).await);
    drop((tree, plain));
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A connection that came up and was cut again starts its reconnect backoff over: thirteen
/// cuts in a row each resume within moments, where a backoff that kept doubling from
/// 25 ms would wait 102 s before the last reconnect (past the 30 s patience of a wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cut_is_followed_by_a_prompt_reconnect() {
    let d = Daemon::start(ServerConfig {
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let proxy = Proxy::start(d.addr).await;
    let client = client_via(&d, &proxy, |c| {
        c.reconnect_max_backoff_ms = 120_000;
        c.give_up_ms = 300_000;
    })
    .await;
    let mut spec = SpawnSpec::new(vec!["cat".into()], "/tmp");
    spec.stdin = StdinSpec::Pipe;
    spec.stdout = collect(1 << 16);
    let p = client.spawn(spec).await.unwrap();
    let mut offset = 0;
    for i in 0..13 {
        let cut = proxy.cut_all();
        assert!(cut.links > 0, "round {i}: something was cut");
        let line = format!("round {i}\n");
        within("write_stdin", p.write_stdin(line.as_bytes())).await.unwrap();
        // The echo comes back only over a new stream connection.
        let mut got = Vec::new();
        while got.len() < line.len() {
            within(&format!("round {i}'s echo after a cut"), p.readable(StreamId::Stdout, offset))
                .await
                .unwrap();
            let r = p.read(StreamId::Stdout, offset, 1 << 16).unwrap();
            assert!(!r.lossy);
            got.extend_from_slice(&r.data);
            offset = r.next_offset;
        }
        assert_eq!(String::from_utf8_lossy(&got), line);
    }
    p.close_stdin().await.unwrap();
    within("settlement", p.wait()).await.unwrap();
    drop(p);
    within("leave", client.shutdown()).await;
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}
