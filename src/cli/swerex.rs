//! `conch swerex-remote` (also `conch` run under the name `swerex-remote`): SWE-ReX's server
//! flags (`--host`, `--port`, `--auth-token`), the composition built, and its terminals,
//! shell, files and subprocess seams served as SWE-ReX's API until SIGTERM or SIGINT.

use anyhow::{Context, bail};

/// The composition served when `--composition` is not given.
pub const COMPOSITION: &str = "swerex";

// Not a doc comment: it would replace the subcommand's help line (see `defer` on the CLI's
// `Command`).
// swe-rex's `swerex.server` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the first stderr line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The key clients send as `X-API-Key`. Empty turns authentication off, which is
    /// allowed on a loopback host only.
    #[arg(long, required = true)]
    pub auth_token: String,
}

/// Runs the API until SIGTERM or SIGINT, then closes every session.
pub async fn run(args: Args, composition: &str) -> anyhow::Result<()> {
    let ip: std::net::IpAddr = args
        .host
        .parse()
        .with_context(|| format!("--host {}: expected an IP address", args.host))?;
    if args.auth_token.is_empty() && !ip.is_loopback() {
        bail!(
            "an empty --auth-token turns authentication off, which is allowed on a loopback --host only"
        );
    }
    let runtime = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let seams = seams_of(&runtime, composition)?;
    let listener = tokio::net::TcpListener::bind((ip, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    eprintln!("swerex-remote listening on {addr}");
    tracing::info!(%addr, composition, "serving SWE-ReX's API");
    let api = conch_frontend_swerex::Api::new(seams, args.auth_token);
    let stop = super::interrupt();
    conch_frontend_swerex::serve(listener, api, async move {
        stop.await;
    })
    .await?;
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// The seams SWE-ReX's API needs from `runtime` (terminals, shell, files, subprocess).
pub(super) fn seams_of(
    runtime: &conch_registry::Runtime,
    composition: &str,
) -> anyhow::Result<conch_frontend_swerex::Seams> {
    let s = runtime.seams();
    let need = |what: &str, plugins: &str| {
        anyhow::anyhow!(
            "composition {composition} binds no {what}, which swerex-remote needs ({plugins}); \
             the swerex and swerex-sandbox compositions have every one"
        )
    };
    Ok(conch_frontend_swerex::Seams {
        terminals: s
            .terminals
            .clone()
            .ok_or_else(|| need("terminals service", "terminal-bash and terminals"))?,
        shell: s
            .shell
            .clone()
            .ok_or_else(|| need("shell executor", "bash-local or bash-sandbox"))?,
        files: s
            .files
            .clone()
            .ok_or_else(|| need("files provider", "files-local or files-sandbox"))?,
        subprocess: s
            .subprocess
            .clone()
            .ok_or_else(|| need("subprocess provider", "subprocess-local"))?,
    })
}
