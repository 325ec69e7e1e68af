//! `conch e2b`: E2B's envd (the protocol the `e2b` SDK speaks to a sandbox) served from this
//! composition's subprocess and files seams until SIGTERM or SIGINT; with `--api-key`, E2B's
//! sandbox API too, each sandbox a world of its own built from the composition.
//! `docs/e2b.md` says how to point the SDK at it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use conch_config::Composition;
use conch_env::ShellEnv;
use conch_frontend_e2b::sandboxes::{Settings, World, WorldError, WorldSpec, Worlds};
use conch_registry::Runtime;

/// envd's own port, where the SDK's debug mode looks (`E2B_DEBUG=true`).
pub const PORT: u16 = 49983;

// Not a doc comment: it would replace the subcommand's help line (see `defer` on the CLI's
// `Command`).
// `conch e2b`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the first stderr line says which).
    #[arg(long, default_value_t = PORT)]
    pub port: u16,
    /// The sandbox's access token, checked on every request as `X-Access-Token`. Without
    /// one every request is admitted (the SDK's debug mode sends none), which is allowed on
    /// a loopback host only.
    #[arg(long, env = "CONCH_E2B_ACCESS_TOKEN", conflicts_with = "api_key")]
    pub access_token: Option<String>,
    /// Serve E2B's sandbox API too, checking this key as `X-API-Key`: `Sandbox.create()`
    /// makes a sandbox of its own, with its own workspace, processes and access token.
    #[arg(long, env = "CONCH_E2B_API_KEY")]
    pub api_key: Option<String>,
    /// Where sandbox workspaces are made, one directory each (default: a private directory
    /// of this server's, removed when it stops).
    #[arg(long, requires = "api_key")]
    pub sandboxes_dir: Option<PathBuf>,
    /// How many sandboxes may live at once.
    #[arg(long, default_value_t = 16, requires = "api_key")]
    pub max_sandboxes: usize,
}

/// Serves envd (or the sandbox API) until SIGTERM or SIGINT, then stops everything it started.
pub async fn run(args: Args, composition: &str) -> anyhow::Result<()> {
    let ip: std::net::IpAddr = args
        .host
        .parse()
        .with_context(|| format!("--host {}: expected an IP address", args.host))?;
    if let Some(key) = args.api_key.clone() {
        if key.is_empty() {
            bail!("--api-key is empty: give the key clients send as X-API-Key (E2B_API_KEY)");
        }
        if args.max_sandboxes == 0 {
            bail!("--max-sandboxes 0 would refuse every sandbox: give at least 1");
        }
        if std::env::var("CONCH_E2B_API_KEY").ok().as_deref() != Some(key.as_str()) {
            eprintln!(
                "warning: --api-key on the command line can be read by every process on this \
                 machine (ps), sandboxed commands under the sandbox composition included; pass \
                 it as CONCH_E2B_API_KEY instead"
            );
        }
        return run_api(args, key, ip, composition).await;
    }
    let token = args.access_token.filter(|t| !t.is_empty());
    if token.is_none() && !ip.is_loopback() {
        bail!(
            "without --access-token every request is admitted, which is allowed on a loopback --host only"
        );
    }
    let runtime = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let seams = seams_of(&runtime, composition, None)?;
    let listener = listen(ip, args.port, &args.host).await?;
    let addr = listener.local_addr()?;
    eprintln!("e2b envd listening on {addr}");
    tracing::info!(%addr, composition, "serving E2B's envd");
    let envd = conch_frontend_e2b::Envd::new(seams, token);
    let stop = super::interrupt();
    conch_frontend_e2b::serve(listener, envd, async move {
        stop.await;
    })
    .await?;
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn listen(
    ip: std::net::IpAddr,
    port: u16,
    host: &str,
) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind((ip, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))
}

/// The seams envd needs from `runtime`, and the composition's sandbox as a `Confinement`.
pub(super) fn seams_of(
    runtime: &Runtime,
    composition: &str,
    default_cwd: Option<PathBuf>,
) -> anyhow::Result<conch_frontend_e2b::Seams> {
    let s = runtime.seams();
    let need = |what: &str, plugins: &str| {
        anyhow::anyhow!(
            "composition {composition} binds no {what}, which e2b needs ({plugins}); the \
             standard, sandbox and remote-sandbox compositions have both"
        )
    };
    let confinement = match (s.sandbox.clone(), runtime.sandbox_policy()) {
        (Some(sandbox), Some(policy)) => Some(conch_confine::Confinement::new(
            sandbox,
            (*policy).clone(),
            "e2b",
            "Start",
            conch_confine::ConfinedSubject::Command,
        )),
        (Some(_), None) => bail!(
            "composition {composition} binds a sandbox but no sandbox-policy entry, so e2b \
             cannot tell what its processes may do"
        ),
        (None, _) => None,
    };
    Ok(conch_frontend_e2b::Seams {
        subprocess: s
            .subprocess
            .clone()
            .ok_or_else(|| need("subprocess provider", "subprocess-local or remote-sandbox"))?,
        files: s
            .files
            .clone()
            .ok_or_else(|| need("files provider", "files-local, files-sandbox or files-remote"))?,
        confinement,
        defaults: conch_frontend_e2b::ProcessDefaults { cwd: default_cwd, env: Vec::new() },
    })
}

/// Each sandbox's world: the composition rebuilt with its workspace as the files root and
/// the sandbox policy's workspace.
struct CompositionWorlds {
    composition: Composition,
    name: String,
    sandboxed: bool,
    /// Each world is a container the composition's provisioner makes (`remote-provisioned`):
    /// its workspace is the container's `/workspace`, and the network its `network` setting.
    provisioned: bool,
    /// Under a sandbox composition: its own hidden paths and the sandboxes directory, so no
    /// sandbox's commands or files reach another's workspace.
    hidden: Vec<PathBuf>,
    /// The sandboxes directory.
    dir: PathBuf,
}

impl Worlds for CompositionWorlds {
    fn build(&self, spec: &WorldSpec) -> Result<World, WorldError> {
        let ws = spec.workspace.display().to_string();
        let mut c = self
            .composition
            .clone()
            .with_setting("sandbox-policy", "workspace_root", &ws)
            .with_setting("files-local", "root", &ws)
            .with_setting("files-sandbox", "root", &ws);
        if self.sandboxed {
            // Each command's private TMPDIR is made in the hidden directory too, so another
            // sandbox's running commands' TMPDIRs are out of sight (its own is bound back).
            c = c
                .with_setting("sandbox-policy", "hidden_paths", &self.hidden)
                .with_setting("sandbox-landlock", "tmp_dir", &self.dir)
                .with_setting("sandbox-bwrap", "tmp_dir", &self.dir);
        }
        if self.provisioned {
            c = c.with_setting("remote-provisioned", "owner", format!("e2b-{}", spec.id));
            if let Some(net) = spec.internet {
                c = c.with_setting(
                    "provision-docker",
                    "network",
                    if net { "bridge" } else { "none" },
                );
            }
        }
        match spec.internet {
            _ if self.provisioned => {}
            Some(false) if !self.sandboxed => {
                return Err(WorldError::Refused(format!(
                    "allow_internet_access: false cannot be honoured: composition {} confines \
                     nothing (serve a sandbox composition, such as sandbox or sandbox-bwrap)",
                    self.name
                )));
            }
            Some(net) if self.sandboxed => c = c.with_setting("sandbox-policy", "network", net),
            _ => {}
        }
        let runtime = Runtime::build(&c, ShellEnv::from_process_env())
            .map_err(|e| WorldError::Failed(e.to_string()))?;
        let inside = self.provisioned.then(|| PathBuf::from("/workspace"));
        let cwd = inside.clone().unwrap_or_else(|| spec.workspace.clone());
        let seams = seams_of(&runtime, &self.name, Some(cwd))
            .map_err(|e| WorldError::Failed(format!("{e:#}")))?;
        let runtime = Arc::new(runtime);
        Ok(World {
            seams,
            teardown: Box::new(move || Box::pin(async move { runtime.shutdown().await })),
            inside,
        })
    }
}

/// A directory of this server's own for sandbox workspaces, removed when dropped.
struct OwnDir(PathBuf);

impl Drop for OwnDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(dir = %self.0.display(), "removing the sandboxes directory: {e}");
        }
    }
}

async fn run_api(
    args: Args,
    api_key: String,
    ip: std::net::IpAddr,
    composition: &str,
) -> anyhow::Result<()> {
    crate::link_all();
    let loaded = Composition::load(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let plugins = loaded.plugins();
    let has = |p: &str| plugins.iter().any(|q| q == p);
    let provisioned = has("remote-provisioned");
    if !provisioned && (!has("subprocess-local") || !(has("files-local") || has("files-sandbox"))) {
        bail!(
            "--api-key makes a world per sandbox: composition {composition} must run here \
             (subprocess-local, with files-local or files-sandbox) or make a sandbox per \
             runtime (remote-provisioned, as the docker composition)"
        );
    }
    // Built once up front, so a composition that cannot build fails here, not per sandbox.
    let probe = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sandboxed = probe.seams().sandbox.is_some();
    seams_of(&probe, composition, None)?;
    probe.shutdown().await;

    let (dir, _own) = match args.sandboxes_dir {
        Some(d) => {
            std::fs::create_dir_all(&d)
                .with_context(|| format!("--sandboxes-dir {}: cannot make it", d.display()))?;
            (d.canonicalize()?, None)
        }
        None => {
            let d = tempfile::Builder::new()
                .prefix("conch-e2b-sandboxes-")
                .tempdir()
                .context("cannot make a directory for sandbox workspaces")?
                .keep();
            let d = d.canonicalize()?;
            (d.clone(), Some(OwnDir(d)))
        }
    };
    let settings = Settings { api_key, dir: dir.clone(), max_sandboxes: args.max_sandboxes };
    let mut hidden = if sandboxed {
        loaded
            .plugin_config::<conch_registry::PolicyConfig>(conch_registry::SANDBOX_POLICY)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .hidden_paths
    } else {
        Vec::new()
    };
    hidden.push(dir.clone());
    let worlds = CompositionWorlds {
        composition: loaded,
        name: composition.to_owned(),
        sandboxed,
        provisioned,
        hidden,
        dir: dir.clone(),
    };
    let sandboxes = conch_frontend_e2b::sandboxes::Sandboxes::new(settings, Box::new(worlds));
    let listener = listen(ip, args.port, &args.host).await?;
    let addr = listener.local_addr()?;
    eprintln!("e2b sandbox API listening on {addr}");
    if !sandboxed && !provisioned {
        eprintln!(
            "warning: composition {composition} confines nothing: sandboxes are apart only in \
             the API (their processes, files root and token), and a command reaches whatever \
             this server's user can; serve a sandbox composition (sandbox-bwrap) to isolate them"
        );
    }
    tracing::info!(%addr, composition, dir = %dir.display(), "serving E2B's sandbox API and envd");
    let stop = super::interrupt();
    conch_frontend_e2b::sandboxes::serve(listener, sandboxes, async move {
        stop.await;
    })
    .await?;
    // Warm containers of a `pool` setting are nobody's sandbox yet.
    conch_provider_docker::provision::drain_pools().await;
    tracing::info!("stopped");
    Ok(())
}
