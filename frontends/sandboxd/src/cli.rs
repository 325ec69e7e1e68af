//! The `conch sandboxd` command's flags and its serving loop; the binary only builds the
//! composition in between and supplies the stop signal.

use std::future::Future;
use std::net::{AddrParseError, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conch_seams::{Files, Subprocess};

use crate::rxp::{self, ServerConfig};

// Not a doc comment: it would replace the subcommand's help line (see `defer` on the CLI's
// `Command`).
// The daemon's flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the first stderr line says
    /// which).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// File holding the bearer token clients must send (required on every address, loopback
    /// too, unless the token is in `CONCH_TOKEN` or --insecure-no-auth is given).
    #[arg(long, env = "CONCH_TOKEN_FILE")]
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
    /// Stop (and exit 0) once no RXP client has made a request or sent a heartbeat for this
    /// many ms, counted from the start until the first: a provisioned sandbox whose maker
    /// died ends by itself (its container with it). 0: never.
    #[arg(long, default_value_t = 0)]
    pub idle_exit_ms: u64,
    /// Also serve SWE-ReX's API (what `swerex-remote` serves) on this port of the same
    /// address, from the same composition, with the token as its `X-API-Key` (an image's
    /// command: `conch image build`).
    #[arg(long)]
    pub swerex_port: Option<u16>,
    /// Also serve E2B's envd on this port of the same address, from the same composition,
    /// with the token as its access token (`X-Access-Token`).
    #[arg(long)]
    pub envd_port: Option<u16>,
}

/// The environment variable that may hold the token itself (a container's way), instead
/// of `--token-file`; the file wins when both are given.
pub const TOKEN_ENV: &str = "CONCH_TOKEN";

/// Why the daemon did not start or stopped serving. The binary prints each with its source
/// chain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// `--listen` is not an `IP:PORT`.
    #[error("--listen {listen}: expected IP:PORT")]
    Listen {
        /// The flag's value.
        listen: String,
        /// What the parser said.
        source: AddrParseError,
    },
    /// A token and `--insecure-no-auth` were both given.
    #[error("give either a token (--token-file or CONCH_TOKEN) or --insecure-no-auth, not both")]
    TwoAuths,
    /// Neither way of authenticating was given.
    #[error(
        "give --token-file PATH (the bearer token clients must send), the token itself in \
         CONCH_TOKEN, or --insecure-no-auth on a loopback address"
    )]
    NoAuth,
    /// `--insecure-no-auth` off loopback.
    #[error("--insecure-no-auth is only allowed on a loopback address, not {0}; give --token-file")]
    NoAuthOffLoopback(SocketAddr),
    /// The token file could not be read.
    #[error("reading --token-file {}", path.display())]
    ReadToken {
        /// The flag's value.
        path: PathBuf,
        /// The read's error.
        source: std::io::Error,
    },
    /// The token is too short to be a secret.
    #[error(
        "the token in {} is {len} characters; use at least 16 random ones \
         (e.g. `head -c 32 /dev/urandom | base64 > {}`)",
        path.display(),
        path.display()
    )]
    ShortToken {
        /// The flag's value.
        path: PathBuf,
        /// The trimmed token's length.
        len: usize,
    },
    /// The token in `CONCH_TOKEN` is too short to be a secret.
    #[error(
        "the token in {TOKEN_ENV} is {len} characters; use at least 16 random ones \
         (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    ShortEnvToken {
        /// The trimmed token's length.
        len: usize,
    },
    /// The address could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The bind's error.
        source: std::io::Error,
    },
    /// The listener failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The flags, checked: where to listen and how the daemon runs (its token included).
#[derive(Debug)]
pub struct Listen {
    addr: SocketAddr,
    cfg: ServerConfig,
}

impl Listen {
    /// The address RXP listens on (the other protocols listen on its IP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token clients must send (`None`: `--insecure-no-auth` on loopback).
    pub fn token(&self) -> Option<&str> {
        self.cfg.token.as_deref()
    }
}

impl Args {
    /// Checks the address and the authentication flags and reads the token file, before
    /// anything is built.
    ///
    /// # Errors
    /// A malformed address, a missing, doubled or off-loopback authentication choice, and a
    /// token file that cannot be read or holds fewer than 16 characters.
    pub fn check(&self) -> Result<Listen, DaemonError> {
        let addr: SocketAddr = self
            .listen
            .parse()
            .map_err(|source| DaemonError::Listen { listen: self.listen.clone(), source })?;
        let from_env = std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty());
        let token = match (&self.token_file, from_env, self.insecure_no_auth) {
            (Some(_), _, true) | (None, Some(_), true) => return Err(DaemonError::TwoAuths),
            (Some(path), _, false) => Some(read_token(path)?),
            (None, Some(token), false) => Some(checked(token, None)?),
            (None, None, true) if rxp::is_loopback(&addr) => None,
            (None, None, true) => return Err(DaemonError::NoAuthOffLoopback(addr)),
            (None, None, false) => return Err(DaemonError::NoAuth),
        };
        let cfg = ServerConfig {
            token,
            lease: Duration::from_millis(self.lease_ms.max(1)),
            max_procs: self.max_procs.max(1),
            retain_bytes: self.retain_bytes,
            heartbeat: Duration::from_millis(self.heartbeat_ms.max(10)),
            idle_exit: (self.idle_exit_ms > 0).then(|| Duration::from_millis(self.idle_exit_ms)),
            ..ServerConfig::default()
        };
        Ok(Listen { addr, cfg })
    }
}

fn read_token(path: &PathBuf) -> Result<String, DaemonError> {
    let token = std::fs::read_to_string(path)
        .map_err(|source| DaemonError::ReadToken { path: path.clone(), source })?;
    checked(token, Some(path))
}

/// The token trimmed, when it is long enough to be a secret; `file` is where it was read
/// (`None`: [`TOKEN_ENV`]).
fn checked(token: String, file: Option<&PathBuf>) -> Result<String, DaemonError> {
    let token = token.trim().to_owned();
    let len = token.len();
    match file {
        _ if len >= 16 => Ok(token),
        Some(path) => Err(DaemonError::ShortToken { path: path.clone(), len }),
        None => Err(DaemonError::ShortEnvToken { len }),
    }
}

/// Binds, prints `listening on <addr>` as the first stderr line, and serves `sub` (and
/// `files`, when the composition has a files provider) over RXP/1 until the future that `stop` returns resolves, then kills and reaps every process it
/// holds.
///
/// `stop` is called after the bind and before that line, so a signal handler it installs
/// is in place by the time a script that waited for the line sends a signal.
///
/// # Errors
/// The bind or the listener failed.
pub async fn run<S>(
    listen: Listen,
    sub: Arc<dyn Subprocess>,
    files: Option<Arc<dyn Files>>,
    stop: impl FnOnce() -> S,
) -> Result<(), DaemonError>
where
    S: Future<Output = ()> + Send + 'static,
{
    let Listen { addr, cfg } = listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })?;
    let bound = listener.local_addr()?;
    let signal = stop();
    // The first stderr line, which scripts and tests wait for.
    eprintln!("listening on {bound}");
    let files_provider = files.as_ref().map_or("none", |f| f.provider_name());
    let state = rxp::State::with_files(Arc::clone(&sub), files, cfg);
    tracing::info!(
        provider = sub.provider_name(),
        files = files_provider,
        auth = if state.has_token() { "bearer" } else { "none (loopback)" },
        "conch sandboxd serving RXP/1"
    );
    let stop = async {
        signal.await;
        tracing::info!("shutting down: stopping every process");
    };
    rxp::serve(listener, state, stop).await?;
    Ok(())
}
