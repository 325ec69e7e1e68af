//! `conch sandboxd`: the daemon front end (`conch_frontend_sandboxd`) over this binary's
//! composition: the flags are checked first, then the composition is built and its
//! subprocess provider (and files provider, when it has one) served until SIGTERM or SIGINT.

use anyhow::bail;
use conch_frontend_sandboxd::Args;

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
    // The handlers are installed when the daemon calls this, before its first stderr line
    // (see `interrupt`), not when the future is first polled.
    let stop = || {
        let signal = super::interrupt();
        async move {
            signal.await;
        }
    };
    // The composition's files provider, when it has one (`files-local`, `files-sandbox`);
    // `files-remote` would only be this daemon again.
    let files = runtime.seams().files.clone();
    if files.as_ref().is_some_and(|f| f.provider_name() == conch_provider_remote::FILES_NAME) {
        bail!("the daemon cannot host files-remote itself; use a local composition");
    }
    conch_frontend_sandboxd::run(listen, sub, files, stop).await?;
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
