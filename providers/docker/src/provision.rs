//! `provision-docker`: one container of the conch image per sandbox, made through the Docker
//! Engine API, reached by its address on a network of conch's own, removed when done.
//!
//! Steps, and why:
//! - Two networks, made on first use: `conch-sandbox-bridge` (outbound traffic allowed) and
//!   `conch-sandbox-none` (`internal`: no route out). Both turn inter-container traffic off
//!   (`enable_icc=false`), so a sandbox cannot reach another's daemon, while this host reaches
//!   each by its address on the bridge. No port is published, so nothing listens on the
//!   host's interfaces. They are made under a lock every maker on the machine takes
//!   (`conch-makers/networks.lock`): the engine's own name check is not atomic, and makers
//!   starting together on a fresh engine each made one.
//! - A container gets a fresh 32-hex-digit token (`CONCH_TOKEN`), the image's command with
//!   `--idle-exit-ms <lease_ms>`, `AutoRemove`, every capability dropped,
//!   `no-new-privileges`, and the limits asked for (CPUs, memory without swap, pids). Its
//!   labels say whose it is: `conch.owner`, and its maker (`conch.maker`: a file under the
//!   temporary directory's `conch-makers/` that the making process holds locked until it
//!   exits).
//! - `create` returns once the daemon's `/health` answers on the container's address; a
//!   container that exits or never answers within `start_timeout_ms` is removed and its
//!   last log lines are the error.
//! - A maker killed with `-9` leaves its containers running, but not for long: the daemon in
//!   each exits once no client was heard for `lease_ms` (the client heartbeats every few
//!   seconds), and `AutoRemove` deletes the container. Every provider also reaps at build
//!   time: a container labelled `conch.managed` whose maker is gone (its lock file free or
//!   missing) is removed, which also covers a paused container whose daemon cannot count.
//!
//! - With `pool: N`, N started containers wait in this process for the next create of the
//!   same settings (an E2B sandbox API server's sandboxes share one pool; a one-shot `conch
//!   call` makes one sandbox and gains nothing). The first create fills it; each take tops it
//!   up. A keeper renews each warm container's idle lease, so when this process dies they
//!   end within the lease; a front end that stops calls [`drain_pools`]. A warm container's
//!   `conch.owner` label is `pool` (labels are fixed at creation), and a request that sets
//!   environment or labels is always made cold.
//!
//! Limits: the addresses are the bridge's, so the engine must run on this machine (not a
//! remote `DOCKER_HOST` or a VM such as Docker Desktop's). Under `network: none` nothing
//! leaves the machine, but this host's own services stay reachable on its addresses (an
//! internal network drops forwarded traffic only, and the daemon must be reachable from
//! here): bind a host service to 127.0.0.1 to keep it from sandboxes. The workspace bind,
//! when set, is shared by every sandbox of the provider.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{Error, ErrorCode, Provisioned, Provisioner, Result, SandboxRequest};
use conch_sync::LockExt;
use futures::StreamExt as _;
use serde::Deserialize;

use crate::image::{self, PORTS, engine};

/// Plugin name.
pub const NAME: &str = "provision-docker";

/// The label every container this provider makes carries.
pub const MANAGED: &str = "conch.managed";
/// Whose sandbox a container is.
pub const OWNER: &str = "conch.owner";
/// Which process made it: the path of the lock file that process holds.
pub const MAKER: &str = "conch.maker";

/// Whether a sandbox may reach anything outside this machine's bridge.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// Outbound traffic allowed (a bridge with NAT).
    #[default]
    Bridge,
    /// Nothing leaves the machine (an internal network; this host's own services stay
    /// reachable on its addresses).
    None,
}

impl Network {
    fn name(self) -> &'static str {
        match self {
            Network::Bridge => "conch-sandbox-bridge",
            Network::None => "conch-sandbox-none",
        }
    }
}

/// Provider config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// The image (built by `conch image build`).
    pub image: String,
    /// CPUs a sandbox may use (fractions allowed); unset: no limit.
    pub cpus: Option<f64>,
    /// Memory a sandbox may use, in MiB (no swap beyond it); unset: no limit.
    pub memory_mb: Option<u64>,
    /// Processes a sandbox may hold at once; unset: no limit.
    pub pids: Option<i64>,
    /// `bridge` (outbound allowed) or `none` (no route out).
    pub network: Network,
    /// A host directory bound at `/workspace` in every sandbox; unset: each sandbox has its
    /// own, gone with it.
    pub workspace: Option<PathBuf>,
    /// A sandbox whose daemon heard no client this long exits and is removed.
    pub lease_ms: u64,
    /// How long a new sandbox may take to answer.
    pub start_timeout_ms: u64,
    /// Started containers kept ready in this process, shared by every runtime of the same
    /// settings (an E2B sandbox API server's sandboxes, say); filled after the first create.
    pub pool: usize,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            image: format!("{}:latest", image::REPO),
            cpus: None,
            memory_mb: None,
            pids: None,
            network: Network::Bridge,
            workspace: None,
            lease_ms: 30_000,
            start_timeout_ms: 60_000,
            pool: 0,
        }
    }
}

impl PluginConfig for DockerConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if self.image.is_empty() {
            return Err(ConfigIssue::new("image", "is required (see `conch image build`)"));
        }
        if let Some(c) = self.cpus
            && !(c > 0.0 && c.is_finite())
        {
            return Err(ConfigIssue::new("cpus", "must be a positive number"));
        }
        if let Some(w) = &self.workspace
            && !w.is_absolute()
        {
            return Err(ConfigIssue::new("workspace", "must be an absolute host path"));
        }
        ConfigIssue::at_least("lease_ms", self.lease_ms, 1000)?;
        ConfigIssue::positive("start_timeout_ms", self.start_timeout_ms)
    }
}

/// Sandboxes as containers on the local Docker engine.
///
/// Each call connects afresh: the provider is used from more than one runtime (the
/// registry's build runs its calls on a runtime of their own), and a pooled connection
/// dies with the runtime that drove it.
#[derive(Debug)]
pub struct DockerProvisioner {
    config: DockerConfig,
    /// The containers this provider made and has not removed.
    made: Mutex<BTreeSet<String>>,
    maker: String,
}

impl DockerProvisioner {
    /// A provisioner on the local engine (`DOCKER_HOST`, else the local socket).
    pub fn new(config: DockerConfig) -> Self {
        Self { config, made: Mutex::default(), maker: maker_mark() }
    }

    fn docker(&self) -> Result<Docker> {
        crate::connect()
    }

    /// Removes every managed container whose maker is gone; how many it removed.
    ///
    /// # Errors
    /// `connection_failed` when the engine does not answer.
    pub async fn reap(&self) -> Result<usize> {
        let filters = HashMap::from([("label", vec![MANAGED.to_owned()])]);
        let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let list = self.docker()?.list_containers(Some(options)).await.map_err(engine)?;
        let mut reaped = 0;
        for c in list {
            let Some(id) = c.id else { continue };
            let maker = c.labels.as_ref().and_then(|l| l.get(MAKER)).cloned().unwrap_or_default();
            if !maker_alive(&maker) {
                tracing::info!(container = %id, %maker, "reaping a sandbox whose maker is gone");
                self.remove(&id).await?;
                reaped += 1;
            }
        }
        Ok(reaped)
    }

    fn spec(&self) -> Spec {
        Spec { config: self.config.clone(), maker: self.maker.clone() }
    }

    /// This provider's pool, when its config asks for one.
    fn pool(&self) -> Option<Arc<Pool>> {
        let target = self.config.pool;
        (target > 0).then(|| {
            let key = self.spec().key();
            let mut pools = POOLS.locked();
            Arc::clone(
                pools.entry(key).or_insert_with(|| Arc::new(Pool { target, ..Pool::default() })),
            )
        })
    }
}

#[async_trait]
impl Provisioner for DockerProvisioner {
    fn provider_name(&self) -> &'static str {
        NAME
    }

    async fn create(&self, request: SandboxRequest) -> Result<Provisioned> {
        // A warm container fits a request that sets nothing of its own at start.
        if let Some(pool) = self.pool()
            && request.env.is_empty()
            && request.labels.is_empty()
        {
            while let Some(warm) = pool.take() {
                if health(&format!("{}:{}", warm.ip, PORTS[0])).await {
                    self.made.locked().insert(warm.id.clone());
                    pool.refill(self.spec());
                    return Ok(warm.provisioned());
                }
                // Gone meanwhile (its lease ran out, say): never handed out.
                let _ = self.remove(&warm.id).await;
            }
            pool.refill(self.spec());
        }
        let warm = self.spec().make(&request).await?;
        self.made.locked().insert(warm.id.clone());
        Ok(warm.provisioned())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let r = remove(&self.docker()?, id).await;
        self.made.locked().remove(id);
        r
    }

    async fn shutdown(&self) {
        let made: Vec<String> = self.made.locked().iter().cloned().collect();
        for id in made {
            if let Err(e) = self.remove(&id).await {
                tracing::warn!(container = %id, "removing a sandbox at shutdown: {e}");
            }
        }
    }
}

/// What a container is made of: the provider's settings, for a cold create or the pool.
#[derive(Clone, Debug)]
struct Spec {
    config: DockerConfig,
    maker: String,
}

/// A started container whose daemon answered.
#[derive(Clone, Debug)]
struct Warm {
    id: String,
    ip: String,
    token: String,
}

impl Warm {
    fn provisioned(&self) -> Provisioned {
        let [rxp, swerex, envd] = PORTS;
        let ip = &self.ip;
        let mut p = Provisioned::new(self.id.clone(), format!("http://{ip}:{rxp}"), &self.token);
        p.swerex_url = Some(format!("http://{ip}:{swerex}"));
        p.envd_url = Some(format!("http://{ip}:{envd}"));
        p.workspace = PathBuf::from("/workspace");
        p
    }
}

impl Spec {
    /// The pool these settings share in this process (settings, its size among them, not
    /// owners, decide).
    fn key(&self) -> String {
        let c = &self.config;
        format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}",
            c.image, c.cpus, c.memory_mb, c.pids, c.network, c.workspace, c.lease_ms, c.pool
        )
    }

    /// Makes, starts and waits for one container; removes it again when it does not answer.
    async fn make(&self, request: &SandboxRequest) -> Result<Warm> {
        let docker = crate::connect()?;
        let network = network(&docker, self.config.network).await?;
        let token = conch_nonce::random_hex::<16>();
        let mut env = vec![format!("CONCH_TOKEN={token}")];
        env.extend(request.env.iter().map(|(k, v)| format!("{k}={v}")));
        let mut labels: HashMap<String, String> = request.labels.clone().into_iter().collect();
        labels.insert(MANAGED.into(), "true".into());
        labels.insert(OWNER.into(), request.owner.clone());
        labels.insert(MAKER.into(), self.maker.clone());
        let c = &self.config;
        let host = HostConfig {
            auto_remove: Some(true),
            network_mode: Some(network.clone()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            nano_cpus: c.cpus.map(|n| (n * 1e9) as i64),
            memory: c.memory_mb.map(|m| i64::try_from(m << 20).unwrap_or(i64::MAX)),
            memory_swap: c.memory_mb.map(|m| i64::try_from(m << 20).unwrap_or(i64::MAX)),
            pids_limit: c.pids,
            binds: c.workspace.as_ref().map(|w| vec![format!("{}:/workspace", w.display())]),
            ..HostConfig::default()
        };
        let body = ContainerCreateBody {
            image: Some(c.image.clone()),
            env: Some(env),
            labels: Some(labels),
            cmd: Some(image::command(Some(c.lease_ms))),
            host_config: Some(host),
            ..ContainerCreateBody::default()
        };
        let name = format!("conch-{}", conch_nonce::random_hex::<6>());
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = docker.create_container(Some(options), body).await.map_err(|e| {
            let e = engine(e);
            if e.code() == ErrorCode::NotFound {
                Error::new(
                    ErrorCode::NotFound,
                    format!(
                        "no image {} on this engine; build it with `conch image build`",
                        c.image
                    ),
                )
                .with_provider(NAME)
            } else {
                e
            }
        })?;
        let id = created.id;
        let started = async {
            docker.start_container(&id, None).await.map_err(engine)?;
            let inspect = docker.inspect_container(&id, None).await.map_err(engine)?;
            let ip = inspect
                .network_settings
                .and_then(|n| n.networks)
                .and_then(|mut n| n.remove(&network))
                .and_then(|e| e.ip_address)
                .filter(|ip| !ip.is_empty())
                .ok_or_else(|| {
                    Error::internal(format!("container {id} has no address on {network}"))
                })?;
            answers(&docker, &id, &ip, Duration::from_millis(c.start_timeout_ms)).await?;
            Ok::<_, Error>(ip)
        };
        match started.await {
            Ok(ip) => Ok(Warm { id, ip, token }),
            Err(e) => {
                let _ = remove(&docker, &id).await;
                Err(e)
            }
        }
    }
}

/// Started containers waiting to be handed out, shared by every provider of the same
/// settings in this process. A keeper task sends each a request every third of its lease,
/// so a warm container stays up while this process lives and ends by itself after it.
#[derive(Debug, Default)]
struct Pool {
    target: usize,
    warm: Mutex<VecDeque<Warm>>,
    filling: std::sync::atomic::AtomicBool,
    kept: std::sync::atomic::AtomicBool,
    /// Drained: nothing is added any more (a container made meanwhile is removed).
    closed: std::sync::atomic::AtomicBool,
}

/// Every pool of this process, by [`Spec::key`].
static POOLS: Mutex<BTreeMap<String, Arc<Pool>>> = Mutex::new(BTreeMap::new());

/// Where pools are filled and kept: a runtime of their own that lives as long as the
/// process, because a provider's calls may run on a runtime that ends after them (the
/// registry's build makes one per call).
fn pool_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("conch-pool")
            .enable_all()
            .build()
            .inspect_err(|e| tracing::warn!("no runtime for the warm pool: {e}"))
            .ok()
    })
    .as_ref()
}

impl Pool {
    fn take(&self) -> Option<Warm> {
        self.warm.locked().pop_front()
    }

    /// Tops the pool up to its target from a task of its own (one at a time), and starts
    /// its keeper once.
    fn refill(self: &Arc<Self>, spec: Spec) {
        use std::sync::atomic::Ordering;
        let Some(rt) = pool_runtime() else { return };
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if !self.kept.swap(true, Ordering::AcqRel) {
            let pool = Arc::downgrade(self);
            let every = Duration::from_millis(spec.config.lease_ms / 3);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(pool) = pool.upgrade() else { return };
                    let warm: Vec<Warm> = pool.warm.locked().iter().cloned().collect();
                    for w in warm {
                        keep_alive(&w).await;
                    }
                }
            });
        }
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(self);
        rt.spawn(async move {
            while pool.warm.locked().len() < pool.target {
                match spec.make(&SandboxRequest::new("pool")).await {
                    Ok(w) if pool.closed.load(Ordering::Acquire) => {
                        if let Ok(docker) = crate::connect() {
                            let _ = remove(&docker, &w.id).await;
                        }
                        break;
                    }
                    Ok(w) => pool.warm.locked().push_back(w),
                    Err(e) => {
                        tracing::warn!("filling the warm pool: {e}");
                        break;
                    }
                }
            }
            pool.filling.store(false, Ordering::Release);
        });
    }
}

/// Removes every warm container of every pool in this process, and stops the pools from
/// making more (a front end stopping). A fill under way is waited for (its container is
/// removed when it lands).
pub async fn drain_pools() {
    use std::sync::atomic::Ordering;
    let pools: Vec<Arc<Pool>> = POOLS.locked().values().cloned().collect();
    let Ok(docker) = crate::connect() else { return };
    for pool in pools {
        pool.closed.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(60);
        while pool.filling.load(Ordering::Acquire) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let warm: Vec<Warm> = pool.warm.locked().drain(..).collect();
        for w in warm {
            let _ = remove(&docker, &w.id).await;
        }
    }
}

/// A request to a warm container's daemon, which renews its idle lease.
async fn keep_alive(w: &Warm) {
    let addr = format!("{}:{}", w.ip, PORTS[0]);
    let auth = format!("authorization: Bearer {}\r\nx-conch-client: pool\r\n", w.token);
    let _ = status_of(&addr, "/v1/info", &auth, Duration::from_secs(2)).await;
}

/// Conch's network for `net`, made on first use.
///
/// The engine's own check for a name in use is not atomic: makers that start together each
/// made one (30 `conch-sandbox-bridge` networks were seen on a fresh engine), which used up
/// its address pools and left the name ambiguous. So the network is made under a lock that
/// every maker on this machine takes, and the duplicates an earlier race left are removed
/// (all but the one with the smallest id, which every maker picks alike).
async fn network(docker: &Docker, net: Network) -> Result<String> {
    network_named(docker, net.name(), net == Network::None).await
}

/// [`network`] by name; `internal` has no route out.
async fn network_named(docker: &Docker, name: &str, internal: bool) -> Result<String> {
    let name = name.to_owned();
    if docker.inspect_network(&name, None).await.is_ok() {
        return Ok(name);
    }
    let _lock = networks_lock().await;
    let ids = networks_named(docker, &name).await?;
    for extra in ids.iter().skip(1) {
        // One a container still uses stays, and the name stays ambiguous: said below.
        let _ = docker.remove_network(extra).await;
    }
    if docker.inspect_network(&name, None).await.is_ok() {
        return Ok(name);
    }
    if ids.len() > 1 {
        return Err(Error::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "{} networks are named {name} on the Docker engine and some are in use; remove \
                 the extra ones (`docker network ls --filter name={name}`)",
                ids.len()
            ),
        )
        .with_provider(NAME));
    }
    let request = NetworkCreateRequest {
        name: name.clone(),
        driver: Some("bridge".into()),
        internal: Some(internal),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_owned(),
            "false".to_owned(),
        )])),
        labels: Some(HashMap::from([(MANAGED.to_owned(), "true".to_owned())])),
        ..NetworkCreateRequest::default()
    };
    docker.create_network(request).await.map_err(engine)?;
    Ok(name)
}

/// The ids of conch's networks named exactly `name`, smallest first.
async fn networks_named(docker: &Docker, name: &str) -> Result<Vec<String>> {
    let filters =
        HashMap::from([("name", vec![name.to_owned()]), ("label", vec![MANAGED.to_owned()])]);
    let options = ListNetworksOptionsBuilder::new().filters(&filters).build();
    // The name filter matches a part of the name: keep the exact ones.
    let mut ids: Vec<String> = docker
        .list_networks(Some(options))
        .await
        .map_err(engine)?
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .filter_map(|n| n.id)
        .collect();
    ids.sort();
    Ok(ids)
}

/// The lock makers on this machine hold while they look for and make a network (released
/// when the file drops). Without it (the directory cannot be written) a maker goes on
/// unlocked, as before.
async fn networks_lock() -> Option<std::fs::File> {
    let path = makers_dir().join("networks.lock");
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(path.parent()?).ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .inspect_err(|e| tracing::warn!(path = %path.display(), "no networks lock: {e}"))
            .ok()?;
        file.lock().ok()?;
        Some(file)
    })
    .await
    .ok()
    .flatten()
}

/// Waits until the daemon answers at `ip`, or the container ended, or `limit` passed.
async fn answers(docker: &Docker, id: &str, ip: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let addr = format!("{ip}:{}", PORTS[0]);
    loop {
        if health(&addr).await {
            return Ok(());
        }
        let state = docker.inspect_container(id, None).await.map_err(engine)?.state;
        let running = state.as_ref().and_then(|s| s.running).unwrap_or(false);
        if !running || Instant::now() >= deadline {
            let logs = last_logs(docker, id).await;
            let code = if running { ErrorCode::Timeout } else { ErrorCode::SpawnFailed };
            return Err(Error::new(
                code,
                format!(
                    "the sandbox container {id} {} at {addr}; its last output: {logs}",
                    if running { "never answered" } else { "exited before it answered" }
                ),
            )
            .with_provider(NAME));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn last_logs(docker: &Docker, id: &str) -> String {
    let options = LogsOptionsBuilder::new().stdout(true).stderr(true).tail("5").build();
    let mut out = String::new();
    let mut logs = docker.logs(id, Some(options));
    while let Some(Ok(line)) = logs.next().await {
        out.push_str(&line.to_string());
    }
    out.trim().replace('\n', " | ")
}

/// Removes container `id` (a gone one is no error).
async fn remove(docker: &Docker, id: &str) -> Result<()> {
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    match docker.remove_container(id, Some(options)).await.map_err(engine) {
        // Gone already (AutoRemove, or removed meanwhile): what was asked holds.
        Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::AlreadyExists) => Ok(()),
        other => other,
    }
}

/// `GET /health` on `addr` answered 200.
async fn health(addr: &str) -> bool {
    status_of(addr, "/health", "", Duration::from_secs(1)).await == Some(200)
}

/// The status code of one HTTP/1.0 `GET path` to `addr` with `headers` (each ending in
/// CRLF), or `None` when no answer came within `limit`.
async fn status_of(addr: &str, path: &str, headers: &str, limit: Duration) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n{headers}\r\n").as_bytes()).await.ok()?;
        // `HTTP/1.x NNN`: the status line's first twelve bytes.
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..]).ok()?.parse().ok()
    };
    tokio::time::timeout(limit, ask).await.ok().flatten()
}

/// This process's maker mark: the path of a file it holds locked until it exits (the lock
/// goes with the process, however it ends). A file lock, not a pid: a pid is reused, and
/// whether a process lives is the subprocess provider's world to read.
fn maker_mark() -> String {
    static MARK: std::sync::OnceLock<(String, Option<std::fs::File>)> = std::sync::OnceLock::new();
    let (path, _held) = MARK.get_or_init(|| {
        let dir = makers_dir();
        // The pid only names it (for people and tests); the lock is what counts.
        let path =
            dir.join(format!("{}-{}.lock", std::process::id(), conch_nonce::random_hex::<8>()));
        let held = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::File::create(&path))
            .and_then(|f| f.try_lock().map_err(std::io::Error::from).map(|()| f))
            .inspect_err(|e| tracing::warn!(path = %path.display(), "no maker lock: {e}"))
            .ok();
        (path.display().to_string(), held)
    });
    path.clone()
}

/// Where makers keep their locks: one directory per machine and user.
fn makers_dir() -> PathBuf {
    std::env::temp_dir().join("conch-makers")
}

/// Whether the maker a `conch.maker` label names still runs: its lock file is held. A
/// label of another form, or a file that is gone or free, is a dead maker (its file is
/// removed then).
fn maker_alive(label: &str) -> bool {
    let path = std::path::Path::new(label);
    if path.parent() != Some(makers_dir().as_path()) {
        return false;
    }
    let Ok(file) = std::fs::File::open(path) else { return false };
    match file.try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => true,
        _ => {
            let _ = std::fs::remove_file(path);
            false
        }
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: DockerConfig = ctx.config()?;
    let provisioner = Arc::new(DockerProvisioner::new(config));
    // The reaper's pass, on a runtime of its own: build runs outside any async context the
    // plugin may block.
    let reaping = Arc::clone(&provisioner);
    let reaped = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting a runtime for the reaper", e))?;
        rt.block_on(reaping.reap())
    })
    .join()
    .map_err(|_| Error::internal("the reaper panicked"))?;
    if let Err(e) = reaped {
        return Err(ctx.locate(e));
    }
    let for_teardown = Arc::clone(&provisioner);
    Ok(PluginOutput::seam(SeamHandle::Provisioner(provisioner))
        .with_teardown(move || Box::pin(async move { for_teardown.shutdown().await })))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Provisioner),
    requires: &[],
    description: "sandboxes as containers of the conch image on the local Docker engine",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_free_or_foreign_mark_is_not() {
        assert!(maker_alive(&maker_mark()), "this process holds its mark");
        // A mark nobody holds: a maker that died (its lock went with it).
        let dead = makers_dir().join("dead-maker-test.lock");
        std::fs::write(&dead, b"").unwrap();
        assert!(!maker_alive(&dead.display().to_string()));
        assert!(!dead.exists(), "a dead maker's mark is removed");
        assert!(!maker_alive("/etc/passwd"), "not a mark");
        assert!(!maker_alive("garbage"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn makers_starting_together_make_one_network_and_remove_what_a_race_left() {
        let docker = match crate::connect() {
            Ok(d) if d.ping().await.is_ok() => d,
            _ => {
                eprintln!("skipped: no Docker engine answers here (network race test)");
                return;
            }
        };
        let name = format!("conch-test-net-{}", conch_nonce::random_hex::<6>());
        let made =
            futures::future::join_all((0..8).map(|_| network_named(&docker, &name, true))).await;
        let left = networks_named(&docker, &name).await.expect("list networks");
        for id in &left {
            let _ = docker.remove_network(id).await;
        }
        assert!(made.iter().all(Result::is_ok), "{made:?}");
        assert_eq!(left.len(), 1, "eight makers at once made {} networks", left.len());

        // What makers without the lock left: the engine's own name check is not atomic.
        let raw = || NetworkCreateRequest {
            name: name.clone(),
            internal: Some(true),
            labels: Some(HashMap::from([(MANAGED.to_owned(), "true".to_owned())])),
            ..NetworkCreateRequest::default()
        };
        let _ = futures::future::join_all((0..4).map(|_| docker.create_network(raw()))).await;
        let raced = networks_named(&docker, &name).await.expect("list networks").len();
        let got = network_named(&docker, &name, true).await;
        let left = networks_named(&docker, &name).await.expect("list networks");
        for id in &left {
            let _ = docker.remove_network(id).await;
        }
        if raced < 2 {
            eprintln!("the engine made no duplicate this time; the removal was not exercised");
        }
        assert_eq!(got.ok(), Some(name.clone()));
        assert_eq!(left.len(), 1, "{raced} raced networks left {}", left.len());
    }
}
