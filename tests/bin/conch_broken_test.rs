//! `conch` with one more plugin, built only for the tests: what a provider author builds to
//! run `conch conformance` against their own provider (the CLI of `conch::cli` plus their
//! plugin), with a provider that is wrong on purpose.
//!
//! `subprocess-broken` is subprocess-local with two configurable defects, so the tests can
//! show that the conformance run catches them and names the case:
//! - `leak_env` (default true): every spawn's environment gets `CONCH_BROKEN_LEAK=1`, a
//!   managed-looking name the scrub must never let through (`ambient_managed_env_is_scrubbed`);
//! - `hang_which`: `which` of this program never answers (a case that hangs).
//!
//! A broken provider lives here rather than behind a cargo feature of `conch`: features unify
//! across everything one cargo invocation builds, so `cargo test --workspace` would have put it
//! into `target/debug/conch` and its `plugins` list; this package is never published.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_registry::{
    BuildContext, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    Process, Result, SpawnSpec, Subprocess, SubprocessCapabilities, TerminalProcess,
    TerminalSpawnSpec,
};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct BrokenConfig {
    leak_env: bool,
    hang_which: Option<String>,
}

impl Default for BrokenConfig {
    fn default() -> Self {
        Self { leak_env: true, hang_which: None }
    }
}

impl PluginConfig for BrokenConfig {}

#[derive(Debug)]
struct Broken {
    inner: LocalSubprocess,
    config: BrokenConfig,
}

#[async_trait]
impl Subprocess for Broken {
    fn provider_name(&self) -> &'static str {
        "subprocess-broken"
    }

    fn capabilities(&self) -> SubprocessCapabilities {
        self.inner.capabilities()
    }

    async fn keep_spill(&self, text: Vec<u8>) -> Result<Option<conch_seams::SpillRef>> {
        self.inner.keep_spill(text).await
    }

    async fn which(&self, program: &str) -> Result<Option<PathBuf>> {
        if self.config.hang_which.as_deref() == Some(program) {
            std::future::pending::<()>().await;
        }
        self.inner.which(program).await
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        let spec = if self.config.leak_env {
            spec.with_env("CONCH_BROKEN_LEAK", Some("1".into()))
        } else {
            spec
        };
        self.inner.spawn(spec).await
    }

    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        self.inner.spawn_terminal(spec).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BrokenConfig = ctx.config()?;
    let provider = Arc::new(Broken { inner: LocalSubprocess::new(LocalConfig::default()), config });
    let for_teardown = Arc::clone(&provider);
    Ok(PluginOutput::seam(SeamHandle::Subprocess(provider))
        .with_teardown(move || Box::pin(async move { for_teardown.shutdown().await })))
}

register_plugin!(PluginEntry {
    name: "subprocess-broken",
    provides: Some(SeamId::Subprocess),
    requires: &[],
    description: "TEST ONLY: subprocess-local with defects (leaks an env name, hangs in which)",
    build,
});

fn main() -> ExitCode {
    conch::cli::main()
}
