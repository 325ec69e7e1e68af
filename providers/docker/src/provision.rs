//! `provision-docker`: one container of the conch image per sandbox, made through the Docker
//! Engine API, reached by its address on a network of conch's own, removed when done.
//!
//! Steps, and why:
//! - Two networks, made on first use: `conch-sandbox-bridge` (outbound traffic allowed) and
//!   `conch-sandbox-none` (`internal`: no route out). Both turn inter-container traffic off
//!   (`enable_icc=false`), so a sandbox cannot reach another's daemon, while this host reaches
//!   each by its address on the bridge. No port is published, so nothing listens on the
//!   host's interfaces.
//! - A container gets a fresh 32-hex-digit token (`CONCH_TOKEN`), the image's command with
//!   `--idle-exit-ms <lease_ms>`, `AutoRemove`, every capability dropped,
//!   `no-new-privileges`, and the limits asked for (CPUs, memory without swap, pids). Its
//!   labels say whose it is: `conch.owner`, and its maker (`conch.maker` = boot id, pid and
//!   the pid's start time).
//! - `create` returns once the daemon's `/health` answers on the container's address; a
//!   container that exits or never answers within `start_timeout_ms` is removed and its
//!   last log lines are the error.
//! - A maker killed with `-9` leaves its containers running, but not for long: the daemon in
//!   each exits once no client was heard for `lease_ms` (the client heartbeats every few
//!   seconds), and `AutoRemove` deletes the container. Every provider also reaps at build
//!   time: a container labelled `conch.managed` whose maker is gone (another boot, or a pid
//!   that is not running or started at another time) is removed, which also covers a
//!   paused container whose daemon cannot count.
//!
//! Limits: the addresses are the bridge's, so the engine must run on this machine (not a
//! remote `DOCKER_HOST` or a VM such as Docker Desktop's). Under `network: none` nothing
//! leaves the machine, but this host's own services stay reachable on its addresses (an
//! internal network drops forwarded traffic only, and the daemon must be reachable from
//! here): bind a host service to 127.0.0.1 to keep it from sandboxes. The workspace bind,
//! when set, is shared by every sandbox of the provider.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder,
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
/// Which process made it: `<boot id>/<pid>/<start time>`.
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
        Self { config, made: Mutex::default(), maker: maker_of(std::process::id()) }
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

    async fn network(&self) -> Result<String> {
        let net = self.config.network;
        let name = net.name().to_owned();
        let docker = self.docker()?;
        if docker.inspect_network(&name, None).await.is_ok() {
            return Ok(name);
        }
        let request = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            internal: Some(net == Network::None),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.enable_icc".to_owned(),
                "false".to_owned(),
            )])),
            labels: Some(HashMap::from([(MANAGED.to_owned(), "true".to_owned())])),
            ..NetworkCreateRequest::default()
        };
        match docker.create_network(request).await {
            Ok(_) => Ok(name),
            // Made meanwhile by another provider.
            Err(_) if docker.inspect_network(&name, None).await.is_ok() => Ok(name),
            Err(e) => Err(engine(e)),
        }
    }

    /// Waits until the daemon answers at `ip`, or the container ended, or time ran out.
    async fn answers(&self, id: &str, ip: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_millis(self.config.start_timeout_ms);
        let addr = format!("{ip}:{}", PORTS[0]);
        loop {
            if health(&addr).await {
                return Ok(());
            }
            let state = self.docker()?.inspect_container(id, None).await.map_err(engine)?.state;
            let running = state.as_ref().and_then(|s| s.running).unwrap_or(false);
            if !running || Instant::now() >= deadline {
                let logs = self.last_logs(id).await;
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

    async fn last_logs(&self, id: &str) -> String {
        let options = LogsOptionsBuilder::new().stdout(true).stderr(true).tail("5").build();
        let mut out = String::new();
        let Ok(docker) = self.docker() else { return out };
        let mut logs = docker.logs(id, Some(options));
        while let Some(Ok(line)) = logs.next().await {
            out.push_str(&line.to_string());
        }
        out.trim().replace('\n', " | ")
    }
}

#[async_trait]
impl Provisioner for DockerProvisioner {
    fn provider_name(&self) -> &'static str {
        NAME
    }

    async fn create(&self, request: SandboxRequest) -> Result<Provisioned> {
        let network = self.network().await?;
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
        let created = self.docker()?.create_container(Some(options), body).await.map_err(|e| {
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
        self.made.locked().insert(id.clone());
        let started = async {
            self.docker()?.start_container(&id, None).await.map_err(engine)?;
            let inspect = self.docker()?.inspect_container(&id, None).await.map_err(engine)?;
            let ip = inspect
                .network_settings
                .and_then(|n| n.networks)
                .and_then(|mut n| n.remove(&network))
                .and_then(|e| e.ip_address)
                .filter(|ip| !ip.is_empty())
                .ok_or_else(|| {
                    Error::internal(format!("container {id} has no address on {network}"))
                })?;
            self.answers(&id, &ip).await?;
            Ok::<_, Error>(ip)
        };
        let ip = match started.await {
            Ok(ip) => ip,
            Err(e) => {
                let _ = self.remove(&id).await;
                return Err(e);
            }
        };
        let [rxp, swerex, envd] = PORTS;
        let mut p = Provisioned::new(id, format!("http://{ip}:{rxp}"), token);
        p.swerex_url = Some(format!("http://{ip}:{swerex}"));
        p.envd_url = Some(format!("http://{ip}:{envd}"));
        p.workspace = PathBuf::from("/workspace");
        Ok(p)
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        let r = self.docker()?.remove_container(id, Some(options)).await.map_err(engine);
        self.made.locked().remove(id);
        match r {
            // Gone already (AutoRemove, or removed meanwhile): what was asked holds.
            Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::AlreadyExists) => Ok(()),
            other => other,
        }
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

/// `GET /health` on `addr` answered 200.
async fn health(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /health HTTP/1.0\r\n\r\n").await.ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt).await.ok().flatten().unwrap_or(false)
}

/// `<boot id>/<pid>/<start time>` of `pid`, so a recycled pid is never taken for its maker.
fn maker_of(pid: u32) -> String {
    format!("{}/{pid}/{}", boot_id(), start_time(pid).unwrap_or_default())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_owned()
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in ticks since boot.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: count fields after its last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process a `conch.maker` label names still runs on this machine.
fn maker_alive(label: &str) -> bool {
    let mut parts = label.split('/');
    let (Some(boot), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else { return false };
    boot == boot_id() && start_time(pid).is_some_and(|s| s.to_string() == start)
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
    fn this_process_is_alive_and_a_recycled_pid_is_not() {
        assert!(maker_alive(&maker_of(std::process::id())));
        let mine = maker_of(std::process::id());
        let (boot, rest) = mine.split_once('/').unwrap();
        let pid = rest.split('/').next().unwrap();
        assert!(!maker_alive(&format!("{boot}/{pid}/1")), "another start time");
        assert!(!maker_alive(&format!("other-boot/{pid}/{}", rest.rsplit('/').next().unwrap())));
        assert!(!maker_alive("garbage"));
    }
}
