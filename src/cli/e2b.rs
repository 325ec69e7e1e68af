//! `conch e2b`: E2B's envd (the protocol the `e2b` SDK speaks to a sandbox) served from this
//! composition's subprocess and files seams until SIGTERM or SIGINT. `docs/e2b.md` says how
//! to point the SDK at it.

use anyhow::{Context, bail};

/// envd's own port, where the SDK's debug mode looks (`E2B_DEBUG=true`).
pub const PORT: u16 = 49983;

/// `conch e2b`'s flags.
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
    #[arg(long, env = "CONCH_E2B_ACCESS_TOKEN")]
    pub access_token: Option<String>,
}

/// Serves envd until SIGTERM or SIGINT, then stops every process it started.
pub async fn run(args: Args, composition: &str) -> anyhow::Result<()> {
    let ip: std::net::IpAddr = args
        .host
        .parse()
        .with_context(|| format!("--host {}: expected an IP address", args.host))?;
    let token = args.access_token.filter(|t| !t.is_empty());
    if token.is_none() && !ip.is_loopback() {
        bail!(
            "without --access-token every request is admitted, which is allowed on a loopback --host only"
        );
    }
    let runtime = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
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
    let seams = conch_frontend_e2b::Seams {
        subprocess: s
            .subprocess
            .clone()
            .ok_or_else(|| need("subprocess provider", "subprocess-local or remote-sandbox"))?,
        files: s
            .files
            .clone()
            .ok_or_else(|| need("files provider", "files-local, files-sandbox or files-remote"))?,
        confinement,
    };
    let listener = tokio::net::TcpListener::bind((ip, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
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
