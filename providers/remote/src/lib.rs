//! The `remote-sandbox` provider: the subprocess seam, served by a `conch sandboxd`
//! (`conch_frontend_sandboxd`), spoken to in RXP/1 (`conch_provider_remote_proto`). A client
//! only: the daemon's HTTP server (axum) is not linked here.
//!
//! Control calls go over HTTP (`http`); output and events stream over one WebSocket
//! (`conn`) into per-process replicas (`mirror`), so reads are local and keep the local
//! semantics (offsets, `lossy`, retained tails), while everything that touches processes
//! (spawn, signals, tree kill, the stdin-wait probe, teardown) runs on the daemon.
//!
//! # Invariants
//! - The daemon's `GET /v1/info` is checked when the provider is built: protocol, the
//!   capabilities this client relies on (leases, offset-addressed stdin, resumable
//!   streams), and the `boot_id` every later connection must match.
//! - Nothing waits forever on a daemon that went away: control calls give up after
//!   `give_up_ms` as `remote_unavailable`, and so do pending waits once the stream
//!   connection has been down that long. A daemon known to be gone (its address refuses
//!   connections) or replaced (another boot id) fails them within seconds instead, not
//!   retryable (`health`).
//! - Kill, release and closing stdin wait for the daemon's answer: one that could not be
//!   delivered is the caller's error, never assumed done.
//! - The token is never logged or shown (`Debug` redacts it).
//!
//! `files.rs` is `files-remote`, the files seam of the daemon's composition over this
//! provider's connection.
//!
//! `tests/it/remote.rs` runs all four conformance suites over `remote-sandbox` against an
//! in-process daemon; `tests/it/remote/` holds the daemon's promises, fault injection, client
//! error paths (wiremock) and security tests.

mod conn;
mod files;
mod health;
mod http;
mod input;
mod mirror;
mod process;
mod provisioned;
mod terminal;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{
    Error, ErrorCode, ErrorReason, OutputSpec, Process, Result, SpawnSpec, SpillRef, StdinSpec,
    Subprocess, SubprocessCapabilities, TerminalProcess, TerminalSpawnSpec,
};
use conch_sync::LockExt;
use reqwest::Method;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use files::{FILES_NAME, RemoteFiles};
pub use process::RemoteProcess;
pub use provisioned::{PROVISIONED_NAME, ProvisionedConfig};
pub use terminal::RemoteTerminal;

use conch_provider_remote_proto::{self as proto, Info, Started, Stream};
use conn::{Cmd, Dial, Mirrors};
use health::Health;
use http::Http;
use mirror::Mirror;

/// Plugin name.
pub const NAME: &str = "remote-sandbox";

/// Terminal output the client replica keeps in memory: the terminal backend reads it as it
/// arrives, so this only has to cover a reader that falls behind.
const TERMINAL_RETAIN: usize = 8 << 20;

/// Provider config.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// The daemon's base URL, `http://HOST:PORT` (plain HTTP; see docs/remote.md for TLS).
    pub url: String,
    /// File holding the bearer token (trailing whitespace ignored).
    pub token_file: Option<PathBuf>,
    /// The token itself; meant for `CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN`, not for files.
    pub token: Option<String>,
    /// Connecting (and the build-time `info` call) gives up after this long.
    pub connect_timeout_ms: u64,
    /// Client heartbeat interval on the stream connection.
    pub heartbeat_ms: u64,
    /// Longest wait between reconnect attempts and retries.
    pub reconnect_max_backoff_ms: u64,
    /// How long the daemon may be unreachable before pending calls fail
    /// `remote_unavailable`.
    pub give_up_ms: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            token_file: None,
            token: None,
            connect_timeout_ms: 5000,
            heartbeat_ms: 5000,
            reconnect_max_backoff_ms: 2000,
            give_up_ms: 30_000,
        }
    }
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("url", &self.url)
            .field("token_file", &self.token_file)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("reconnect_max_backoff_ms", &self.reconnect_max_backoff_ms)
            .field("give_up_ms", &self.give_up_ms)
            .finish()
    }
}

impl PluginConfig for RemoteConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if self.url.is_empty() {
            return Err(ConfigIssue::new(
                "url",
                "is required: the daemon's address, e.g. http://127.0.0.1:7070",
            ));
        }
        if !self.url.starts_with("http://") {
            return Err(ConfigIssue::new(
                "url",
                "must start with http:// (this build speaks plain HTTP; put TLS in a tunnel or \
                 proxy in front of the daemon)",
            ));
        }
        ConfigIssue::positive("connect_timeout_ms", self.connect_timeout_ms)?;
        ConfigIssue::at_least("heartbeat_ms", self.heartbeat_ms, 10)?;
        ConfigIssue::positive("reconnect_max_backoff_ms", self.reconnect_max_backoff_ms)?;
        ConfigIssue::positive("give_up_ms", self.give_up_ms)
    }
}

/// What processes and terminals of one provider share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) http: Http,
    dial: Dial,
    info: Info,
    mirrors: Mirrors,
    watches: conn::Watches,
    conn: Mutex<Option<mpsc::UnboundedSender<Cmd>>>,
    stop: CancellationToken,
    /// The verdict on the daemon (gone, or dead for good once replaced or refusing us).
    health: Arc<Health>,
}

impl Shared {
    fn check_alive(&self) -> Result<()> {
        match self.health.dead() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends a command to the stream connection, starting it on first use.
    fn command(&self, cmd: Cmd) {
        let mut conn = self.conn.locked();
        if conn.as_ref().is_none_or(mpsc::UnboundedSender::is_closed) {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(conn::run(
                self.dial.clone(),
                Arc::clone(&self.mirrors),
                Arc::clone(&self.watches),
                rx,
                self.stop.clone(),
                Arc::clone(&self.health),
            ));
            *conn = Some(tx);
        }
        if let Some(tx) = conn.as_ref() {
            let _ = tx.send(cmd);
        }
    }

    /// Registers `mirror` (so a connect attaches it), asks the daemon to start it with
    /// `req` at `path`, and attaches it; a refused start leaves nothing registered.
    async fn start(
        &self,
        mirror: &Arc<Mirror>,
        path: &str,
        req: &(impl serde::Serialize + Sync),
    ) -> Result<Started> {
        conn::lock(&self.mirrors).insert(mirror.id.clone(), Arc::downgrade(mirror));
        match self.http.call(Method::POST, path, Some(req), Duration::ZERO).await {
            Ok(started) => {
                mirror.mark_started();
                self.command(Cmd::Attach(mirror.id.clone()));
                Ok(started)
            }
            Err(e) => {
                conn::lock(&self.mirrors).remove(&mirror.id);
                Err(e)
            }
        }
    }

    /// A handle was dropped: stop streaming its id, and once it finished let the daemon
    /// forget it (what still runs stays under the daemon until shutdown or lease expiry).
    pub(crate) fn forget(self: &Arc<Self>, mirror: &Mirror, path: &str) {
        conn::lock(&self.mirrors).remove(&mirror.id);
        if self.stop.is_cancelled() {
            return;
        }
        self.command(Cmd::Detach(mirror.id.clone()));
        if mirror.finished()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (me, path) = (Arc::clone(self), path.to_owned());
            rt.spawn(async move {
                let _: Result<serde_json::Value> =
                    me.http.call(Method::DELETE, &path, None::<&()>, Duration::ZERO).await;
            });
        }
    }

    fn new_id(&self, kind: &str) -> String {
        static IDS: AtomicU64 = AtomicU64::new(0);
        format!("{kind}{}", IDS.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// The remote-sandbox subprocess provider.
#[derive(Debug)]
pub struct RemoteSubprocess {
    shared: Arc<Shared>,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl RemoteSubprocess {
    /// Connects to the daemon `cfg.url` names: reads its `info` (blocking the calling
    /// thread up to `connect_timeout_ms`) and checks protocol and capabilities.
    ///
    /// # Errors
    /// `remote_unavailable` when the daemon cannot be reached, `unauthenticated` for a wrong
    /// token, `unsupported` when it lacks a capability, `io` for an unreadable token file.
    pub fn connect(cfg: &RemoteConfig) -> Result<Self> {
        let token = match (&cfg.token, &cfg.token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| Error::io(format!("reading token_file {}", path.display()), e))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let base = cfg.url.trim_end_matches('/').to_owned();
        let client_id = proto::random_id();
        let mirrors = Mirrors::default();
        let mut http = Http {
            client: http_client(cfg)?,
            base: base.clone(),
            token: token.clone(),
            client_id: client_id.clone(),
            boot_id: None,
            give_up: ms(cfg.give_up_ms),
            give_up_setting: "give_up_ms",
            max_backoff: ms(cfg.reconnect_max_backoff_ms),
            health: Health::new(base.clone(), Arc::clone(&mirrors)),
        };
        let info = fetch_info(cfg, &http)?;
        http.boot_id = Some(info.boot_id.clone());
        let dial = Dial {
            ws_url: format!("ws://{}/v1/ws", base.trim_start_matches("http://")),
            token,
            client_id,
            boot_id: info.boot_id.clone(),
            base,
            connect_timeout: ms(cfg.connect_timeout_ms),
            heartbeat: ms(cfg.heartbeat_ms),
            max_backoff: ms(cfg.reconnect_max_backoff_ms),
            give_up: ms(cfg.give_up_ms),
            max_frame: usize::try_from(info.limits.max_frame_bytes)
                .unwrap_or(usize::MAX)
                .max(1 << 20),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                dial,
                info,
                health: Arc::clone(&http.health),
                http,
                mirrors,
                watches: conn::Watches::default(),
                conn: Mutex::new(None),
                stop: CancellationToken::new(),
            }),
        })
    }

    /// What the daemon said about itself when the provider was built.
    pub fn info(&self) -> &Info {
        &self.shared.info
    }
}

fn http_client(cfg: &RemoteConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(ms(cfg.connect_timeout_ms))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| Error::internal(format!("building the HTTP client failed: {e}")))
}

/// Runs `f` to completion on a current-thread runtime of a thread of its own: a plugin's
/// build is synchronous and runs inside async code, which must not block on a runtime.
/// `what` names the call in its errors.
pub(crate) fn on_own_runtime<T: Send + 'static>(
    what: &'static str,
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io(format!("starting a runtime for {what}"), e))?
            .block_on(f)
    })
    .join()
    .map_err(|_| Error::internal(format!("{what} panicked")))?
}

/// `GET /v1/info` from a thread of its own (see [`on_own_runtime`]), then the checks.
fn fetch_info(cfg: &RemoteConfig, http: &Http) -> Result<Info> {
    let mut http = http.clone();
    http.client = http_client(cfg)?;
    http.give_up = ms(cfg.connect_timeout_ms);
    http.give_up_setting = "connect_timeout_ms";
    // A verdict of its own: what the build-time call meets says nothing about later ones.
    http.health = Health::new(http.base.clone(), Mirrors::default());
    let info = on_own_runtime("the info call", async move {
        http.call::<Info>(Method::GET, "/v1/info", None::<&()>, Duration::ZERO).await
    })
    .map_err(|e| info_failed(cfg, e))?;
    if info.protocol != proto::PROTOCOL {
        return Err(Error::new(
            ErrorCode::Unsupported,
            format!(
                "the daemon at {} speaks {}, this client {}; run a matching conch sandboxd",
                cfg.url,
                info.protocol,
                proto::PROTOCOL
            ),
        )
        .with_provider(NAME));
    }
    let c = &info.capabilities;
    for (has, what) in
        [(c.leases, "leases"), (c.stdin_offsets, "stdin_offsets"), (c.resume, "resume")]
    {
        if !has {
            return Err(Error::new(
                ErrorCode::Unsupported,
                format!(
                    "the daemon at {} lacks the `{what}` capability this client needs; \
                     run a conch sandboxd that has it",
                    cfg.url
                ),
            )
            .with_provider(NAME));
        }
    }
    Ok(info)
}

/// The build-time `info` call's error in a builder's words: nothing listening is not a
/// daemon that went away, and a server that does not speak RXP/1 is not a sandboxd.
fn info_failed(cfg: &RemoteConfig, e: Error) -> Error {
    if e.reason() == Some(ErrorReason::RemoteGone) {
        return Error::new(
            ErrorCode::RemoteUnavailable,
            format!(
                "nothing listens at {}: every connection was refused; is `conch sandboxd` \
                 running there?",
                cfg.url
            ),
        )
        .with_reason(ErrorReason::RemoteGone)
        .with_provider(NAME);
    }
    if e.code() == ErrorCode::Protocol {
        return Error::new(
            ErrorCode::Protocol,
            format!(
                "the server at {} is not a conch sandboxd (its answer to GET /v1/info is not \
                 RXP/1); check `url`",
                cfg.url
            ),
        )
        .with_context("answer", e.message().to_owned())
        .with_provider(NAME);
    }
    e
}

fn kept(out: &OutputSpec) -> Option<usize> {
    match out {
        OutputSpec::Collect { max_bytes, .. } => Some(*max_bytes),
        OutputSpec::Null | OutputSpec::MergeIntoStdout => None,
        _ => None,
    }
}

#[async_trait]
impl Subprocess for RemoteSubprocess {
    fn provider_name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> SubprocessCapabilities {
        // Whatever the hosted provider can prove, it proves on the daemon.
        self.shared.info.capabilities.subprocess
    }

    /// Sent to the daemon as a spill upload, kept there by its subprocess provider: the path
    /// is in the daemon's world.
    async fn keep_spill(&self, text: Vec<u8>) -> Result<Option<SpillRef>> {
        files::keep_spill(&self.shared, &text).await
    }

    async fn which(&self, program: &str) -> Result<Option<PathBuf>> {
        self.shared.check_alive()?;
        let path = format!("/v1/which?program={}", query_escape(program));
        let w = self
            .shared
            .http
            .call::<proto::Which>(Method::GET, &path, None::<&()>, Duration::ZERO)
            .await?;
        Ok(w.path.map(PathBuf::from))
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        // The program's name only: the rest of argv and the environment can hold secrets.
        let span = tracing::debug_span!(
            "spawn",
            program = program_name(&spec.argv),
            remote = true,
            pid = tracing::field::Empty
        );
        let p = self.spawn_process(spec).instrument(span.clone()).await?;
        if let Some(pid) = p.pid() {
            span.record("pid", pid);
        }
        Ok(p)
    }

    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        let span = tracing::debug_span!(
            "spawn_terminal",
            program = program_name(&spec.argv),
            remote = true,
            pid = tracing::field::Empty
        );
        let t = self.spawn_term(spec).instrument(span.clone()).await?;
        if let Some(pid) = t.pid() {
            span.record("pid", pid);
        }
        Ok(t)
    }

    async fn shutdown(&self) {
        let shared = &self.shared;
        if shared.stop.is_cancelled() {
            return;
        }
        // The daemon stops and reaps everything this client holds before it answers; the
        // settlements it streams meanwhile reach the replicas.
        let left: Result<serde_json::Value> =
            shared.http.call(Method::POST, "/v1/leave", None::<&()>, Duration::from_secs(30)).await;
        if let Err(e) = &left {
            tracing::warn!(error = %e, "the sandbox daemon did not confirm the teardown");
        }
        let pending: Vec<Arc<Mirror>> =
            conn::lock(&shared.mirrors).values().filter_map(std::sync::Weak::upgrade).collect();
        let all_done = futures::future::join_all(
            pending.iter().map(|m| m.until(|m, f| m.finished_in(f).then_some(()))),
        );
        let _ = tokio::time::timeout(Duration::from_secs(2), all_done).await;
        shared.stop.cancel();
        let e = Error::new(ErrorCode::Disposing, "the remote-sandbox provider was shut down")
            .with_provider(NAME);
        for m in pending {
            if !m.finished() {
                m.fail(&e);
            }
        }
    }
}

impl RemoteSubprocess {
    async fn spawn_process(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        self.shared.check_alive()?;
        if spec.argv.is_empty() {
            return Err(Error::invalid("argv is empty").with_provider(NAME));
        }
        let shared = &self.shared;
        let id = shared.new_id("p");
        let mut streams = Vec::new();
        if let Some(max) = kept(&spec.stdout) {
            streams.push((Stream::Stdout, max));
        }
        if let Some(max) = kept(&spec.stderr) {
            streams.push((Stream::Stderr, max));
        }
        let mirror = Arc::new(Mirror::new(id.clone(), shared.dial.base.clone(), &streams));
        let cancel = spec.cancel.clone();
        let stdin_piped = matches!(spec.stdin, StdinSpec::Pipe);
        let started = shared.start(&mirror, "/v1/procs", &proto::StartProc { id, spec }).await?;
        let done = CancellationToken::new();
        {
            // Cancellation is the same as kill, as for every provider.
            let (shared, mirror, done) = (Arc::clone(shared), Arc::clone(&mirror), done.clone());
            tokio::spawn(async move {
                let settled = mirror.until(|_, f| f.settled.as_ref().map(|_| ()));
                tokio::select! {
                    () = cancel.cancelled() => {
                        // Nobody awaits a cancellation, so an undelivered kill can only be
                        // logged here; the caller's wait reports the lost world.
                        let path = format!("/v1/procs/{}/kill", mirror.id);
                        let r: Result<serde_json::Value> =
                            shared.http.call(Method::POST, &path, None::<&()>, Duration::ZERO).await;
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "the kill a cancellation asked for was not delivered");
                        }
                    }
                    _ = settled => {}
                    () = done.cancelled() => {}
                }
            });
        }
        Ok(Arc::new(RemoteProcess {
            shared: Arc::clone(shared),
            mirror,
            pid: started.pid,
            stdin: input::Input::default(),
            stdin_piped,
            done,
        }))
    }

    async fn spawn_term(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        self.shared.check_alive()?;
        if !self.capabilities().terminals {
            return Err(Error::new(
                ErrorCode::Unsupported,
                "the daemon's provider has no terminals",
            )
            .with_provider(NAME));
        }
        let shared = &self.shared;
        let id = shared.new_id("t");
        let mirror = Arc::new(Mirror::new(
            id.clone(),
            shared.dial.base.clone(),
            &[(Stream::Pty, TERMINAL_RETAIN)],
        ));
        let started = shared.start(&mirror, "/v1/terms", &proto::StartTerm { id, spec }).await?;
        Ok(Arc::new(RemoteTerminal {
            shared: Arc::clone(shared),
            mirror,
            pid: started.pid,
            delivered: tokio::sync::Mutex::new(0),
            delivered_now: AtomicU64::new(0),
            input: input::Input::default(),
            ops: AtomicU64::new(0),
        }))
    }
}

/// The file name of argv's program, for logs.
fn program_name(argv: &[String]) -> &str {
    argv.first()
        .map(|p| std::path::Path::new(p).file_name().and_then(|n| n.to_str()).unwrap_or(p))
        .unwrap_or("")
}

impl Drop for RemoteSubprocess {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// Percent-encodes a query value.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: RemoteConfig = ctx.config()?;
    let provider = Arc::new(RemoteSubprocess::connect(&config).map_err(|e| ctx.locate(e))?);
    files::register_connection(&provider);
    let for_teardown = Arc::clone(&provider);
    Ok(PluginOutput::seam(SeamHandle::Subprocess(provider))
        .with_teardown(move || Box::pin(async move { for_teardown.shutdown().await })))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Subprocess),
    requires: &[],
    description: "processes on a remote `conch sandboxd` over HTTP + WebSocket (RXP/1)",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
