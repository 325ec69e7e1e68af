//! `subprocess-local`: the local execution world. Spawns argv with tokio::process in its own
//! process group, collects streams with the shared retention rules, and kills trees
//! (TERM → grace → KILL) with a /proc group-liveness proof. Terminals run on portable-pty
//! PTYs with an exact Linux stdin-wait probe for readiness.

mod kill;
mod leftovers;
pub mod probe;
mod process;
mod pty;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::{
    Process, Result, SpawnSpec, Subprocess, SubprocessCapabilities, TerminalProcess,
    TerminalSpawnSpec,
};
use serde::Deserialize;

pub use kill::{group_alive, kill_tree};
pub use process::LocalProcess;
pub use pty::LocalTerminal;

/// Plugin name.
pub const NAME: &str = "subprocess-local";

/// Provider config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Parent directory for private spill directories (default: the system temp dir).
    pub spill_dir: Option<PathBuf>,
}

/// The local subprocess provider.
#[derive(Debug, Default)]
pub struct LocalSubprocess {
    config: LocalConfig,
    live: Mutex<Vec<Weak<process::Inner>>>,
    terminals: Mutex<Vec<Weak<pty::TermInner>>>,
}

impl LocalSubprocess {
    /// A provider with the given config.
    pub fn new(config: LocalConfig) -> Self {
        Self { config, live: Mutex::new(Vec::new()), terminals: Mutex::new(Vec::new()) }
    }

    fn track_terminal(&self, inner: &Arc<pty::TermInner>) {
        let mut live = self.terminals.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(inner));
    }

    fn track(&self, inner: &Arc<process::Inner>) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(inner));
    }
}

/// Resolves `program` on `path_var` the way execvp would.
pub fn resolve_on_path(program: &str, path_var: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_exec(&p).then_some(p);
    }
    path_var?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| is_exec(p))
}

#[async_trait]
impl Subprocess for LocalSubprocess {
    fn provider_name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> SubprocessCapabilities {
        let mut c = SubprocessCapabilities::default();
        c.group_liveness = true;
        c.terminals = true;
        c
    }

    async fn which(&self, program: &str) -> Option<PathBuf> {
        let env = conch_env::child_env(&Default::default());
        resolve_on_path(program, env.get("PATH").map(String::as_str))
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        let p = process::spawn(spec, self.config.spill_dir.as_deref())?;
        self.track(&p.inner);
        Ok(Arc::new(p))
    }

    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        let t = pty::spawn(spec)?;
        self.track_terminal(&t.inner);
        Ok(Arc::new(t))
    }

    async fn shutdown(&self) {
        let live: Vec<Arc<process::Inner>> = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let v = live.iter().filter_map(Weak::upgrade).collect();
            live.clear();
            v
        };
        for inner in &live {
            inner.request_kill();
        }
        // Terminals are tracked while their reaper runs, so even dropped handles are found.
        let terminals: Vec<Arc<pty::TermInner>> = {
            let mut t = self.terminals.lock().unwrap_or_else(|e| e.into_inner());
            let v = t.iter().filter_map(Weak::upgrade).collect();
            t.clear();
            v
        };
        let hangups = futures::future::join_all(terminals.iter().map(|t| t.shutdown()));
        let processes = async {
            for inner in live {
                inner.wait_settled().await;
                inner.wait_group_gone().await;
            }
        };
        futures::join!(hangups, processes);
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: LocalConfig = ctx.config()?;
    let provider = Arc::new(LocalSubprocess::new(config));
    let for_teardown = Arc::clone(&provider);
    Ok(PluginOutput::seam(SeamHandle::Subprocess(provider))
        .with_teardown(move || Box::pin(async move { for_teardown.shutdown().await })))
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Subprocess),
    requires: &[],
    description: "local processes: argv spawn, env scrub, process-group tree kill",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}
