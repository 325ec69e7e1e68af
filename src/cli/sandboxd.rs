//! `conch sandboxd`: the daemon side of the remote substrate.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use conch_provider_remote::server::{self, ServerConfig};

/// The daemon's flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the first stderr line says
    /// which).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// File holding the bearer token clients must send (required on every address, loopback
    /// too, unless --insecure-no-auth is given).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Accept requests without a token (an explicit opt-in); only allowed on a loopback
    /// address.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// A client silent this long (ms) loses its processes.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Live processes and terminals per client.
    #[arg(long, default_value_t = 256)]
    pub max_procs: usize,
    /// Output bytes kept in memory per stream, beyond what the client asked to keep, and per
    /// terminal, for replay after a reconnect (older bytes come from the stream's spill
    /// while it has one; past both, the client is told of a gap).
    #[arg(long, default_value_t = 4 << 20)]
    pub retain_bytes: usize,
    /// Server heartbeat interval (ms).
    #[arg(long, default_value_t = 5000)]
    pub heartbeat_ms: u64,
}

fn read_token(path: &PathBuf) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("reading --token-file {}", path.display()))?;
    let token = token.trim().to_owned();
    if token.len() < 16 {
        bail!(
            "the token in {} is {} characters; use at least 16 random ones \
             (e.g. `head -c 32 /dev/urandom | base64 > {}`)",
            path.display(),
            token.len(),
            path.display()
        );
    }
    Ok(token)
}

/// Runs the daemon until SIGTERM or SIGINT, then kills and reaps every process it holds.
pub async fn run(args: Args, composition: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}: expected IP:PORT", args.listen))?;
    let token = match (&args.token_file, args.insecure_no_auth) {
        (Some(_), true) => bail!("give either --token-file or --insecure-no-auth, not both"),
        (Some(path), false) => Some(read_token(path)?),
        (None, true) if server::is_loopback(&addr) => None,
        (None, true) => bail!(
            "--insecure-no-auth is only allowed on a loopback address, not {addr}; \
             give --token-file"
        ),
        (None, false) => bail!(
            "give --token-file PATH (the bearer token clients must send), or \
             --insecure-no-auth on a loopback address"
        ),
    };
    let runtime = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(sub) = runtime.seams().subprocess.clone() else {
        bail!("composition {composition} binds no subprocess provider for the daemon to host");
    };
    if sub.provider_name() == conch_provider_remote::client::NAME {
        bail!("the daemon cannot host remote-sandbox itself; use a local composition");
    }
    let cfg = ServerConfig {
        token,
        lease: Duration::from_millis(args.lease_ms.max(1)),
        max_procs: args.max_procs.max(1),
        retain_bytes: args.retain_bytes,
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(10)),
        ..ServerConfig::default()
    };
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    // Installed before the line below, so a SIGTERM sent once it is seen is never met by
    // the default action (see `interrupt`).
    let signal = super::interrupt();
    // The first stderr line, which scripts and tests wait for.
    eprintln!("listening on {bound}");
    let state = server::State::new(Arc::clone(&sub), cfg);
    tracing::info!(
        provider = sub.provider_name(),
        auth = if state.has_token() { "bearer" } else { "none (loopback)" },
        "conch sandboxd serving RXP/1"
    );
    let stop = async {
        signal.await;
        tracing::info!("shutting down: stopping every process");
    };
    server::serve(listener, state, stop).await?;
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
