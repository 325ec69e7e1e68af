//! `conch sandboxd`: hosts one subprocess provider's world over RXP/1, and the composition's
//! files provider when it has one (`files.rs`: ranged reads, offset-addressed uploads,
//! staged tar exports; watches ride the WebSocket in `ws.rs`).
//!
//! # Invariants
//! - No process lifetime depends on a request or a connection: starts, kills and teardowns
//!   run in tasks of their own that finish even when the request that asked is dropped;
//!   output is retained per stream whether or not anybody is attached.
//! - Every process belongs to the client that started it (the `x-conch-client` header);
//!   another client's ids are `not_found`, never reachable.
//! - Leases: a client whose last request or heartbeat is older than `lease` loses every
//!   process and terminal it holds (trees killed, output released).
//! - What a client loses (by `leave` or its lease) stays readable and attachable, stopped,
//!   for one more lease: an attach that was on its way when the teardown began still gets
//!   the output, the exit and the settlement instead of `not_found`. It no longer counts
//!   against `--max-procs`.
//! - The token is compared in constant time and never logged.
//!
//! Beyond each client window, the daemon asks the hosted provider for `replay_bytes`
//! (`--retain-bytes`), so spills appear exactly as locally while a reconnecting client can still be
//! replayed what it missed.

mod api;
mod files;
mod ws;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conch_output::{Collector, CollectorConfig};
use conch_seams::{
    Error, ErrorCode, Files, OutputSpec, Process, Result, SignalDelivery, Subprocess,
    TerminalProcess,
};
use conch_sync::LockExt;
use tokio::sync::watch;

use conch_provider_remote_proto::{self as proto, Capabilities, Info, Limits};

pub use api::router;
pub use files::MAX_TRANSFERS;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Bearer token; `None` only on loopback with `--insecure-no-auth`.
    pub token: Option<String>,
    /// A client silent this long loses its processes.
    pub lease: Duration,
    /// Live processes and terminals per client.
    pub max_procs: usize,
    /// Output bytes retained per stream for replay.
    pub retain_bytes: usize,
    /// Server heartbeat interval.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Largest WebSocket message.
    pub max_frame_bytes: usize,
    /// Stop serving once no client has made a request or sent a heartbeat for this long
    /// (counted from the start until the first one): a provisioned sandbox whose maker died
    /// ends by itself. `None`: serve until told to stop.
    pub idle_exit: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            token: None,
            lease: Duration::from_secs(30),
            max_procs: 256,
            retain_bytes: 4 << 20,
            heartbeat: Duration::from_secs(5),
            max_body_bytes: 8 << 20,
            max_frame_bytes: 1 << 20,
            idle_exit: None,
        }
    }
}

/// A process or terminal the daemon holds for a client.
#[derive(Debug)]
pub(crate) enum Held {
    Proc(ProcEntry),
    Term(TermEntry),
}

#[derive(Debug)]
pub(crate) struct ProcEntry {
    pub(crate) proc: Arc<dyn Process>,
    /// Stdin bytes accepted so far; the lock also serialises writes.
    pub(crate) stdin: tokio::sync::Mutex<u64>,
    pub(crate) collected: [bool; 2],
}

#[derive(Debug)]
pub(crate) struct TermEntry {
    pub(crate) term: Arc<dyn TerminalProcess>,
    /// What the PTY printed, retained by offset; a reader task feeds it.
    pub(crate) out: Arc<Collector>,
    pub(crate) progress: watch::Sender<u64>,
    pub(crate) input: tokio::sync::Mutex<u64>,
    /// The last signal operation and its answer (a resend gets the same answer).
    pub(crate) last_signal: tokio::sync::Mutex<Option<(u64, Option<SignalDelivery>)>>,
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) held: Held,
}

#[derive(Debug)]
struct ClientState {
    last_seen: Instant,
    entries: HashMap<String, Arc<Entry>>,
    /// Stopped entries kept readable after a leave or a lease expiry, with when they went.
    retired: HashMap<String, (Instant, Arc<Entry>)>,
}

impl ClientState {
    fn new() -> Self {
        Self { last_seen: Instant::now(), entries: HashMap::new(), retired: HashMap::new() }
    }
}

/// The daemon's state.
#[derive(Debug)]
pub struct State {
    pub(crate) sub: Arc<dyn Subprocess>,
    pub(crate) cfg: ServerConfig,
    pub(crate) boot_id: String,
    /// The hosted files provider (when the composition has one) and its transfers.
    pub(crate) files: files::FilesHost,
    clients: Mutex<HashMap<String, ClientState>>,
    /// When a client last made a request or sent a heartbeat (the start until then).
    last_activity: Mutex<Instant>,
    /// Set when `idle_exit` passed with no client: the server stops.
    idle: watch::Sender<bool>,
    /// Set once shutdown began: no new work.
    closing: watch::Sender<bool>,
}

impl State {
    /// State hosting `sub`; call [`State::run_leases`] (or [`serve`]) to enforce leases.
    pub fn new(sub: Arc<dyn Subprocess>, cfg: ServerConfig) -> Arc<Self> {
        Self::with_files(sub, None, cfg)
    }

    /// State hosting `sub` and, when given, a files provider for `/v1/files` (without one
    /// those endpoints answer `unsupported`).
    pub fn with_files(
        sub: Arc<dyn Subprocess>,
        files: Option<Arc<dyn Files>>,
        cfg: ServerConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            sub,
            cfg,
            boot_id: proto::random_id(),
            files: files::FilesHost::new(files),
            clients: Mutex::default(),
            last_activity: Mutex::new(Instant::now()),
            idle: watch::Sender::new(false),
            closing: watch::Sender::new(false),
        })
    }

    /// What `GET /v1/info` says.
    pub fn info(&self) -> Info {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Info {
            protocol: proto::PROTOCOL.into(),
            boot_id: self.boot_id.clone(),
            server: format!("conch-sandboxd {}", env!("CARGO_PKG_VERSION")),
            provider: self.sub.provider_name().into(),
            capabilities: Capabilities {
                subprocess: self.sub.capabilities(),
                leases: true,
                stdin_offsets: true,
                resume: true,
                files: self.files.files.as_ref().map(|f| proto::FilesInfo {
                    provider: f.provider_name().into(),
                    watch: f.capabilities().watch,
                    default_dir: f.default_dir().to_path_buf(),
                    max_chunk_bytes: self.cfg.max_body_bytes as u64,
                }),
            },
            limits: Limits {
                max_body_bytes: self.cfg.max_body_bytes as u64,
                max_frame_bytes: self.cfg.max_frame_bytes as u64,
                max_procs: self.cfg.max_procs as u64,
                retain_bytes: self.cfg.retain_bytes as u64,
                lease_ms: ms(self.cfg.lease),
                heartbeat_ms: ms(self.cfg.heartbeat),
            },
        }
    }

    /// Live processes and terminals over every client (retired ones not counted).
    pub fn live_count(&self) -> usize {
        self.lock().values().map(|c| c.entries.len()).sum()
    }

    /// True when requests must carry the bearer token.
    pub fn has_token(&self) -> bool {
        self.cfg.token.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClientState>> {
        self.clients.locked()
    }

    /// Renews `client`'s lease.
    pub(crate) fn touch(&self, client: &str) {
        *self.last_activity.locked() = Instant::now();
        let mut clients = self.lock();
        match clients.get_mut(client) {
            Some(c) => c.last_seen = Instant::now(),
            None => {
                clients.insert(client.to_owned(), ClientState::new());
            }
        }
    }

    pub(crate) fn get(&self, client: &str, id: &str) -> Result<Arc<Entry>> {
        let clients = self.lock();
        let c = clients.get(client);
        let live = c.and_then(|c| c.entries.get(id));
        live.or_else(|| c.and_then(|c| c.retired.get(id).map(|(_, e)| e))).cloned().ok_or_else(
            || Error::new(ErrorCode::NotFound, format!("no process `{id}` for this client")),
        )
    }

    /// Reserves a slot for a new id: `Ok(Some(entry))` when the id already exists.
    fn existing_or_room(&self, client: &str, id: &str) -> Result<Option<Arc<Entry>>> {
        if *self.closing.borrow() {
            return Err(Error::new(ErrorCode::Disposing, "the daemon is shutting down"));
        }
        let clients = self.lock();
        let Some(c) = clients.get(client) else { return Ok(None) };
        if let Some(e) = c.entries.get(id) {
            return Ok(Some(Arc::clone(e)));
        }
        if c.entries.len() >= self.cfg.max_procs {
            return Err(Error::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this client holds {} processes and terminals, the daemon's limit \
                     (--max-procs); wait for or kill some",
                    c.entries.len()
                ),
            ));
        }
        Ok(None)
    }

    fn insert(&self, client: &str, entry: Arc<Entry>) -> Arc<Entry> {
        let mut clients = self.lock();
        let c = clients.entry(client.to_owned()).or_insert_with(ClientState::new);
        // A concurrent start of the same id won: keep the first, the caller stops its own.
        Arc::clone(c.entries.entry(entry.id.clone()).or_insert(entry))
    }

    pub(crate) fn remove(&self, client: &str, id: &str) -> Option<Arc<Entry>> {
        let mut clients = self.lock();
        let c = clients.get_mut(client)?;
        let retired = c.retired.remove(id).map(|(_, e)| e);
        c.entries.remove(id).or(retired)
    }

    /// Moves everything `client` holds to its retired entries and returns it.
    fn retire_client(&self, client: &str) -> Vec<Arc<Entry>> {
        let mut clients = self.lock();
        let Some(c) = clients.get_mut(client) else { return Vec::new() };
        let now = Instant::now();
        let taken: Vec<Arc<Entry>> = c.entries.drain().map(|(_, e)| e).collect();
        for e in &taken {
            c.retired.insert(e.id.clone(), (now, Arc::clone(e)));
        }
        taken
    }

    /// Starts a process for `client` (idempotent by id).
    pub(crate) async fn start_proc(
        self: &Arc<Self>,
        client: &str,
        req: proto::StartProc,
    ) -> Result<(Arc<Entry>, bool)> {
        if let Some(e) = self.existing_or_room(client, &req.id)? {
            return Ok((e, false));
        }
        let mut spec = req.spec;
        let collected = [spec.stdout.clone(), spec.stderr.clone()]
            .map(|s| matches!(s, OutputSpec::Collect { .. }));
        // The server keeps `retain_bytes` more per stream in memory, so a reconnecting
        // client can be replayed what it missed; windows and spills stay the client's.
        spec.replay_bytes = self.cfg.retain_bytes;
        let proc = self.sub.spawn(spec).await?;
        let entry = Arc::new(Entry {
            id: req.id,
            held: Held::Proc(ProcEntry {
                proc: Arc::clone(&proc),
                stdin: tokio::sync::Mutex::new(0),
                collected,
            }),
        });
        let kept = self.insert(client, Arc::clone(&entry));
        if !Arc::ptr_eq(&kept, &entry) {
            // A start that lost the race for its id: the hosted provider is local, so these
            // only fail if it is broken, which the log records.
            if let Err(e) = proc.kill().await {
                tracing::warn!(error = %e, "stopping a duplicate start failed");
            }
            if let Err(e) = proc.release().await {
                tracing::warn!(error = %e, "releasing a duplicate start failed");
            }
            return Ok((kept, false));
        }
        Ok((entry, true))
    }

    /// Starts a terminal for `client` (idempotent by id).
    pub(crate) async fn start_term(
        self: &Arc<Self>,
        client: &str,
        req: proto::StartTerm,
    ) -> Result<(Arc<Entry>, bool)> {
        if let Some(e) = self.existing_or_room(client, &req.id)? {
            return Ok((e, false));
        }
        let term = self.sub.spawn_terminal(req.spec).await?;
        let out = Arc::new(Collector::new(CollectorConfig::new(self.cfg.retain_bytes, 0)));
        let progress = watch::Sender::new(0u64);
        // Reads the PTY for as long as it has output, attached client or not.
        {
            let (term, out, progress) = (Arc::clone(&term), Arc::clone(&out), progress.clone());
            tokio::spawn(async move {
                loop {
                    match term.read_chunk().await {
                        Ok(Some(chunk)) => out.push(&chunk),
                        Ok(None) | Err(_) => break,
                    }
                    progress.send_modify(|n| *n += 1);
                }
                out.seal();
                progress.send_modify(|n| *n += 1);
            });
        }
        let entry = Arc::new(Entry {
            id: req.id,
            held: Held::Term(TermEntry {
                term: Arc::clone(&term),
                out,
                progress,
                input: tokio::sync::Mutex::new(0),
                last_signal: tokio::sync::Mutex::new(None),
            }),
        });
        let kept = self.insert(client, Arc::clone(&entry));
        if !Arc::ptr_eq(&kept, &entry) {
            let _ = term.terminate(Duration::from_secs(1)).await;
            return Ok((kept, false));
        }
        Ok((entry, true))
    }

    /// Kills everything `client` holds, awaiting each teardown; the entries stay readable
    /// (retired) for one more lease.
    pub(crate) async fn drop_client(&self, client: &str) {
        self.files.drop_client(client);
        let entries = self.retire_client(client);
        futures::future::join_all(entries.iter().map(|e| stop(e))).await;
    }

    /// Enforces leases until the state is closed.
    pub async fn run_leases(self: Arc<Self>) {
        let period = (self.cfg.lease / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut closing = self.closing.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = closing.wait_for(|c| *c) => return,
            }
            if let Some(idle) = self.cfg.idle_exit
                && self.last_activity.locked().elapsed() > idle
            {
                tracing::info!(
                    idle_ms = idle.as_millis(),
                    "no client for the idle limit; stopping"
                );
                self.idle.send_replace(true);
                return;
            }
            let lease = self.cfg.lease;
            self.files.sweep(lease);
            let mut expired = Vec::new();
            {
                let mut clients = self.lock();
                for (k, c) in clients.iter_mut() {
                    c.retired.retain(|_, (when, _)| when.elapsed() <= lease);
                    if c.last_seen.elapsed() > lease && !c.entries.is_empty() {
                        expired.push((k.clone(), c.entries.len()));
                    }
                }
                // A client that is silent and holds nothing is forgotten.
                clients.retain(|_, c| {
                    c.last_seen.elapsed() <= lease || !c.entries.is_empty() || !c.retired.is_empty()
                });
            }
            for (client, n) in expired {
                tracing::info!(client = %client, processes = n, "lease expired; stopping its processes");
                let me = Arc::clone(&self);
                tokio::spawn(async move { me.drop_client(&client).await });
            }
        }
    }

    /// Refuses new work, kills and reaps every process, then shuts the provider down.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        let all: Vec<String> = self.lock().keys().cloned().collect();
        futures::future::join_all(all.iter().map(|c| self.drop_client(c))).await;
        self.files.clear();
        self.sub.shutdown().await;
    }

    pub(crate) fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }
}

/// Stops one entry: a process is killed as a tree and awaited, then its output released; a
/// terminal is torn down. A process that had already settled keeps its complete spill: a
/// result may have named it (`full output: <path>`), and it stays until the hosted
/// provider's spill limits (age, total size) reclaim it, as when a local handle is dropped.
async fn stop(e: &Entry) {
    match &e.held {
        Held::Proc(p) => {
            let settled = p.proc.try_status().is_some();
            if let Err(err) = p.proc.kill().await {
                tracing::warn!(id = %e.id, error = %err, "stopping an entry: the kill failed");
            }
            let _ = p.proc.wait().await;
            let _ = p.proc.wait_group_gone().await;
            if !settled && let Err(err) = p.proc.release().await {
                tracing::warn!(id = %e.id, error = %err, "stopping an entry: the release failed");
            }
        }
        Held::Term(t) => {
            let _ = t.term.terminate(Duration::from_secs(1)).await;
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then shuts the state down (every
/// process killed and reaped) and returns.
///
/// # Errors
/// The listener failed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let leases = tokio::spawn(Arc::clone(&state).run_leases());
    let app = router(Arc::clone(&state));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Small control answers and frames must not wait for Nagle's algorithm to meet the
    // peer's delayed ACK (40 ms a round trip on Linux loopback).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let served = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = rx.await;
    });
    let watcher = {
        let state = Arc::clone(&state);
        let mut idle = state.idle.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {}
                _ = idle.wait_for(|i| *i) => {}
            }
            // Processes first (the streams end with them), then the listener.
            state.shutdown().await;
            let _ = tx.send(());
        })
    };
    let r = served.await;
    watcher.abort();
    leases.abort();
    if r.is_err() {
        state.shutdown().await;
    }
    r
}

/// True when `addr` is a loopback address (the only place `--insecure-no-auth` is allowed).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
