//! `conch sandboxd`: the daemon front end (`conch_frontend_sandboxd`) over this binary's
//! composition: the flags are checked first, then the composition is built and its
//! subprocess provider (and files provider, when it has one) served until SIGTERM or SIGINT.
//!
//! With `--swerex-port` and `--envd-port` the same runtime also serves SWE-ReX's API and
//! E2B's envd on those ports of the same address, with the same token, so one process in a
//! container answers all three protocols (the image's command, `conch image build`). One
//! signal stops all three; each stops its own processes before it drains its connections,
//! and the runtime is shut down once all three returned.

use std::net::SocketAddr;

use anyhow::{Context, bail};
use conch_frontend_sandboxd::Args;
use tokio_util::sync::CancellationToken;

/// Runs the daemon until SIGTERM or SIGINT, then kills and reaps every process it holds.
pub async fn run(args: Args, composition: &str) -> anyhow::Result<()> {
    let listen = args.check()?;
    let runtime = crate::build_runtime(composition).map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(sub) = runtime.seams().subprocess.clone() else {
        bail!("composition {composition} binds no subprocess provider for the daemon to host");
    };
    if sub.provider_name() == conch_provider_remote::NAME {
        bail!("the daemon cannot host remote-sandbox itself; use a local composition");
    }
    // The composition's files provider, when it has one (`files-local`, `files-sandbox`);
    // `files-remote` would only be this daemon again.
    let files = runtime.seams().files.clone();
    if files.as_ref().is_some_and(|f| f.provider_name() == conch_provider_remote::FILES_NAME) {
        bail!("the daemon cannot host files-remote itself; use a local composition");
    }
    // The handlers are installed before the first stderr line (see `interrupt`); one signal
    // stops every server.
    let stop = CancellationToken::new();
    let signal = super::interrupt();
    let cancel = stop.clone();
    tokio::spawn(async move {
        signal.await;
        cancel.cancel();
    });
    let ip = listen.addr().ip();
    let token = listen.token().map(str::to_owned);
    let mut others = Vec::new();
    if let Some(port) = args.swerex_port {
        let seams = super::swerex::seams_of(&runtime, composition)?;
        let listener = bind(SocketAddr::new(ip, port)).await?;
        eprintln!("swerex-remote listening on {}", listener.local_addr()?);
        let api = conch_frontend_swerex::Api::new(seams, token.clone().unwrap_or_default());
        let stop = stop.clone().cancelled_owned();
        others.push(tokio::spawn(async move {
            conch_frontend_swerex::serve(listener, api, stop).await.context("SWE-ReX's API")
        }));
    }
    if let Some(port) = args.envd_port {
        let seams = super::e2b::seams_of(&runtime, composition, None)?;
        let listener = bind(SocketAddr::new(ip, port)).await?;
        eprintln!("e2b envd listening on {}", listener.local_addr()?);
        let envd = conch_frontend_e2b::Envd::new(seams, token.clone());
        let stop = stop.clone().cancelled_owned();
        others.push(tokio::spawn(async move {
            conch_frontend_e2b::serve(listener, envd, stop).await.context("E2B's envd")
        }));
    }
    let rxp = {
        let stop = stop.clone();
        conch_frontend_sandboxd::run(listen, sub, files, move || stop.cancelled_owned()).await
    };
    // RXP ended (stopped, or failed): the others end with it.
    stop.cancel();
    let mut failed = rxp.err().map(anyhow::Error::from);
    for other in others {
        match other.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(e) => failed = failed.or(Some(anyhow::anyhow!("a server task ended: {e}"))),
        }
    }
    runtime.shutdown().await;
    tracing::info!("stopped");
    failed.map_or(Ok(()), Err)
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}
