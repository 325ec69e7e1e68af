//! `subprocess-local`: the local execution world. Spawns argv with tokio::process in its own
//! process group, collects streams with the shared retention rules, and kills trees
//! (TERM → grace → KILL) with a /proc group-liveness proof. Terminals run on portable-pty
//! PTYs with an exact Linux stdin-wait probe for readiness and teardown of the leader's
//! tree by pid + start time.
//!
//! Every child carries a per-spawn id in its environment ([`conch_env::CALL_ID_VAR`]) that
//! its descendants inherit, and the process is a child subreaper (`reaper`), so what a call
//! or a terminal started is found and stopped with it even after it detached.
//!
//! This is the only crate in the workspace that touches processes, signals and `/proc`;
//! `procfs` is the one module that reads `/proc`.
//!
//! Spills (complete copies of long collected streams) live under one private 0700 directory
//! per provider inside the per-user spill home (`home`), and outlive the provider: a path a
//! result names stays readable after the process exits, until a later run's sweep evicts it
//! by the same limits. The home also marks each living provider, so the next conch to start
//! stops what a killed one left running. A [`SpillRegistry`] holds every
//! spill's size and last write in memory and bounds them: past `max_spill_total_bytes`
//! finished spills (the stream ended and the process settled) are evicted least recently
//! written first, and a finished spill older than `max_spill_age_ms` is evicted by the
//! sweep that runs on each spawn and periodically. A spill still being written is never
//! evicted; one stream larger than the whole cap keeps its spill (up to its own
//! `spill_cap`) while it runs and loses it as soon as it settles. Reads report an evicted
//! spill as such (`spill_evicted`), never by its path.
//!
//! The crate is `cfg(unix)`; nix, libc and portable-pty are Unix target dependencies. The provider
//! makes the conch process non-dumpable, so children cannot read its environment through `/proc`,
//! and resolves bare program names on the child's PATH so std can use posix_spawn. A spawn whose
//! program is missing fails `spawn_failed` with reason `MISSING_PROGRAM` (pipes and PTYs alike).
//!
//! Every spawn gets an id `<process>.<provider>.<n>` in `CONCH_CALL_ID`, set after the overlay so
//! config cannot replace it, which every descendant inherits: it survives setsid, nohup and double
//! forks, so it is what finds a call's or a session's detached processes. A cgroup would be
//! tighter, but is not writable everywhere; the environment is, for same-user processes. The holes
//! are listed at `procfs`'s `Tag`.
//!
//! A provider's spill directory is a persistent `SpillRoot`, made by the first spill, so calls
//! whose output fits in memory touch no disk. Shutdown finally stops every process still carrying
//! the provider's id (a `WaitForEof` spawn's detached orphans).
#![cfg(unix)]

mod home;
mod probe;
mod process;
mod procfs;
mod pty;
mod ptyfd;
mod reaper;
mod signals;
mod ttyq;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use conch_output::{SpillLimits, SpillRegistry, SpillRoot};
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{
    Process, Result, SpawnSpec, SpillRef, Subprocess, SubprocessCapabilities, TerminalProcess,
    TerminalSpawnSpec,
};
use conch_sync::LockExt;
use serde::Deserialize;

pub use process::LocalProcess;
pub use pty::LocalTerminal;

/// Plugin name.
pub const NAME: &str = "subprocess-local";

/// Slowest age sweep: a spill outlives its age limit by at most this much (or by half the
/// limit, when that is shorter).
const MAX_SWEEP_PERIOD: Duration = Duration::from_secs(60);
/// Fastest age sweep, so a tiny age limit does not turn the sweeper into a busy loop.
const MIN_SWEEP_PERIOD: Duration = Duration::from_millis(10);
/// How long what shutdown finds still carrying this provider's id gets after TERM.
const SWEEP_GRACE: Duration = Duration::from_secs(1);

/// Numbers the providers of this process, so each has its own id under the process's.
static PROVIDERS: AtomicU64 = AtomicU64::new(0);

/// Provider config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// The directory the per-user spill home `conch-spills-<euid>` is made in (default: the
    /// system temp dir).
    pub spill_dir: Option<PathBuf>,
    /// Total bytes of all this provider's spill files (default 1 GiB). Past it, finished
    /// spills are evicted, least recently written first; a spill still being written never
    /// is.
    pub max_spill_total_bytes: u64,
    /// How long a finished spill is kept after its last write, in milliseconds (default
    /// 24 h).
    pub max_spill_age_ms: u64,
}

impl Default for LocalConfig {
    fn default() -> Self {
        let limits = SpillLimits::default();
        Self {
            spill_dir: None,
            max_spill_total_bytes: limits.max_total_bytes,
            max_spill_age_ms: u64::try_from(limits.max_age.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl LocalConfig {
    /// The spill registry's limits.
    pub fn spill_limits(&self) -> SpillLimits {
        SpillLimits {
            max_total_bytes: self.max_spill_total_bytes,
            max_age: Duration::from_millis(self.max_spill_age_ms),
        }
    }
}

impl PluginConfig for LocalConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        // A relative directory would put the spill home wherever conch was started, so the
        // bounds and the killed-run sweep would only see runs started in the same place.
        if let Some(dir) = &self.spill_dir
            && !dir.is_absolute()
        {
            return Err(ConfigIssue::new(
                "spill_dir",
                format!("must be an absolute path, not {:?}", dir.display().to_string()),
            ));
        }
        // Zero would evict every finished spill the moment it ends, including the one a
        // result is about to name; small limits are the way to ask for little disk use.
        ConfigIssue::positive("max_spill_total_bytes", self.max_spill_total_bytes)?;
        ConfigIssue::positive("max_spill_age_ms", self.max_spill_age_ms)
    }
}

/// The local subprocess provider.
#[derive(Debug)]
pub struct LocalSubprocess {
    live: Mutex<Vec<Weak<process::Inner>>>,
    terminals: Mutex<Vec<Weak<pty::TermInner>>>,
    /// The private 0700 directory every spill of this provider lives under, made by the
    /// first spill: in the spill home, where it outlives the provider; without a usable
    /// home, a temporary one removed at shutdown (or drop).
    spill_root: Arc<SpillRoot>,
    /// The per-user spill home, when it could be used.
    home: Option<home::Home>,
    /// This provider's mark in the home, retired at shutdown (or drop).
    mark: Mutex<Option<home::LiveMark>>,
    /// The sweep of a crashed run's processes this provider started, awaited at shutdown.
    crash_sweep: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// This provider's id: every spawn's id is `<id>.<n>`, so shutdown finds them all.
    id: String,
    spawns: AtomicU64,
    /// Every spill of this provider with its size and last write: the total cap and the age
    /// limit are enforced here, without scanning `spill_root`.
    spills: Arc<SpillRegistry>,
    /// The periodic age sweep, started with the first collecting spawn.
    sweeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Makes this process non-dumpable (once): its `/proc/<pid>/environ`, `mem` and the like
/// then stay closed to processes of the same user, so a child cannot read back the
/// credentials the environment scrub kept from it through its parent. Children are
/// dumpable again after their own exec, so the stdin-wait probe still reads their `/proc`.
fn harden_self() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(target_os = "linux")]
        {
            // Best effort: a failure leaves the process as it was, which is no worse.
            let _ = nix::sys::prctl::set_dumpable(false);
        }
    });
}

impl LocalSubprocess {
    /// A provider with the given config. Makes this process non-dumpable (see the environment
    /// policy in docs/tools.md).
    pub fn new(config: LocalConfig) -> Self {
        harden_self();
        let spills = Arc::new(SpillRegistry::new(config.spill_limits()));
        // Before any spawn: orphans of every call reparent here from the start.
        let process = reaper::init();
        let n = PROVIDERS.fetch_add(1, Ordering::Relaxed);
        let id = format!("{process}.{n}");
        let parent = config.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
        let opened = home::Home::open(&parent).and_then(|h| h.register(&id).map(|m| (h, m)));
        let (home, mark, spill_root) = match opened {
            Ok((h, m)) => {
                let root = SpillRoot::persistent(h.spill_dir(&id));
                (Some(h), Some(m), root)
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the spill home in {} cannot be used: this run's spills go in a private \
                     directory of the system temp dir, removed when it shuts down",
                    parent.display()
                );
                (None, None, SpillRoot::new(None))
            }
        };
        Self {
            live: Mutex::default(),
            terminals: Mutex::default(),
            spill_root: Arc::new(spill_root),
            home,
            mark: Mutex::new(mark),
            crash_sweep: Mutex::default(),
            id,
            spawns: AtomicU64::new(0),
            spills,
            sweeper: Mutex::default(),
        }
    }

    /// Before something that may add spills: frees what the limits no longer allow, and makes
    /// sure the age sweep runs.
    fn make_spill_room(&self) {
        self.spills.sweep();
        self.ensure_sweeper();
    }

    /// Where this provider's spills go, and the registry that bounds them.
    fn spill_place(&self) -> process::SpillPlace<'_> {
        process::SpillPlace { root: &self.spill_root, registry: &self.spills }
    }

    /// Starts the periodic age sweep unless it runs already. Growth, seals and spawns
    /// enforce the limits too; the sweep is what frees the disk of an idle provider.
    fn ensure_sweeper(&self) {
        let mut sweeper = self.sweeper.locked();
        if sweeper.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let period = (self.spills.limits().max_age / 2).clamp(MIN_SWEEP_PERIOD, MAX_SWEEP_PERIOD);
        // Weak, so the task never keeps a dropped provider's registry alive.
        let registry = Arc::downgrade(&self.spills);
        let home = self.home.clone();
        let id = self.id.clone();
        *sweeper = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is now: a run's first collecting spawn also bounds what earlier
            // runs left in the home.
            loop {
                tick.tick().await;
                let Some(registry) = registry.upgrade() else { return };
                registry.sweep();
                if let Some(home) = &home {
                    let bound = bound_ended_runs(home, &id, &registry);
                    // Not kept across the await: a dropped provider's registry goes.
                    drop(registry);
                    bound.await;
                }
            }
        }));
    }

    fn stop_sweeper(&self) {
        if let Some(h) = self.sweeper.locked().take() {
            h.abort();
        }
    }

    /// A new spawn's id, under this provider's.
    fn next_id(&self) -> String {
        format!("{}.{}", self.id, self.spawns.fetch_add(1, Ordering::Relaxed))
    }

    /// A temporary spill root goes with every spill in it; a persistent one only when empty
    /// (its spills outlive the provider, bounded by later runs' sweeps).
    fn remove_spills(&self) {
        self.spill_root.remove();
    }

    /// Once per process, at its first spawn: stops what a run that died without shutting
    /// down (SIGKILL, a crash) left running, found by that run's id, and forgets the run.
    fn sweep_crashed_runs(&self) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let Some(home) = &self.home else { return };
        ONCE.call_once(|| {
            let crashed = home.crashed(&self.id);
            if crashed.is_empty() {
                return;
            }
            let task = tokio::spawn(async move {
                for run in crashed {
                    let tag = procfs::Tag { id: run.id.clone(), since: 0 };
                    let targets = procfs::Targets { tagged: Some(&tag), ..Default::default() };
                    let report =
                        procfs::stop(&targets, nix::sys::signal::Signal::SIGTERM, SWEEP_GRACE)
                            .await;
                    // Housekeeping after another run, not a problem of this one: shown
                    // from CONCH_LOG=info on.
                    if !report.stopped.is_empty() {
                        tracing::info!(
                            run = %run.id,
                            stopped = report.stopped.len(),
                            "stopped processes a killed conch run left behind"
                        );
                    }
                    if report.survivors.is_empty() {
                        run.done();
                    }
                }
            });
            *self.crash_sweep.locked() = Some(task);
        });
    }

    fn track_terminal(&self, inner: &Arc<pty::TermInner>) {
        let mut live = self.terminals.locked();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(inner));
    }

    fn track(&self, inner: &Arc<process::Inner>) {
        let mut live = self.live.locked();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(inner));
    }
}

/// Bounds what ended runs left in `home` by `registry`'s limits, counting the provider
/// `id`'s own total (read now), on a blocking thread: it lists and deletes files.
fn bound_ended_runs(
    home: &home::Home,
    id: &str,
    registry: &SpillRegistry,
) -> impl std::future::Future<Output = ()> + use<> {
    let limits = registry.limits();
    let own = registry.total_bytes();
    let (home, id) = (home.clone(), id.to_owned());
    async move {
        let _ = tokio::task::spawn_blocking(move || {
            home.evict_dead(&id, limits.max_total_bytes, limits.max_age, own)
        })
        .await;
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
        c.stdin_probe = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        c
    }

    async fn which(&self, program: &str) -> Result<Option<PathBuf>> {
        let env = conch_env::child_env(&Default::default());
        Ok(resolve_on_path(program, env.get("PATH").map(String::as_str)))
    }

    async fn keep_spill(&self, text: Vec<u8>) -> Result<Option<SpillRef>> {
        self.make_spill_room();
        Ok(process::keep_spill(&text, &self.spill_place()))
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>> {
        let collects =
            |o: &conch_seams::OutputSpec| matches!(o, conch_seams::OutputSpec::Collect { .. });
        let collecting = collects(&spec.stdout) || collects(&spec.stderr);
        if collecting {
            self.make_spill_room();
        }
        self.sweep_crashed_runs();
        let place = self.spill_place();
        // The program's name only: the rest of argv and the environment can hold secrets.
        let span = spawn_span("spawn", spec.argv.first());
        let _entered = span.enter();
        let p = process::spawn(spec, &place, self.next_id())
            .inspect_err(|e| tracing::debug!(error = %e.code().as_str(), "spawn failed"))?;
        if let Some(pid) = Process::pid(&p) {
            span.record("pid", pid);
        }
        self.track(&p.inner);
        Ok(Arc::new(p))
    }

    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>> {
        self.sweep_crashed_runs();
        let span = spawn_span("spawn_terminal", spec.argv.first());
        let _entered = span.enter();
        let t = pty::spawn(spec, self.next_id())
            .inspect_err(|e| tracing::debug!(error = %e.code().as_str(), "spawn failed"))?;
        if let Some(pid) = TerminalProcess::pid(&t) {
            span.record("pid", pid);
        }
        self.track_terminal(&t.inner);
        Ok(Arc::new(t))
    }

    async fn shutdown(&self) {
        let span = tracing::debug_span!("subprocess_shutdown");
        tracing::Instrument::instrument(self.shutdown_inner(), span).await;
    }
}

/// A span for one spawn: the program's file name and, once known, the pid.
fn spawn_span(name: &'static str, program: Option<&String>) -> tracing::Span {
    let program = program
        .map(|p| Path::new(p).file_name().map_or(p.as_str(), |n| n.to_str().unwrap_or("?")))
        .unwrap_or("");
    match name {
        "spawn_terminal" => {
            tracing::debug_span!("spawn_terminal", program, pid = tracing::field::Empty)
        }
        _ => tracing::debug_span!("spawn", program, pid = tracing::field::Empty),
    }
}

impl LocalSubprocess {
    async fn shutdown_inner(&self) {
        let live: Vec<Arc<process::Inner>> = {
            let mut live = self.live.locked();
            let v = live.iter().filter_map(Weak::upgrade).collect();
            live.clear();
            v
        };
        for inner in &live {
            inner.request_kill();
        }
        // Terminals are tracked while their reaper runs, so even dropped handles are found.
        let terminals: Vec<Arc<pty::TermInner>> = {
            let mut t = self.terminals.locked();
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
        // Whatever any spawn left detached, even one that settled long ago (waiting for EOF
        // stops nothing), still carries this provider's id.
        // With this process a subreaper, anything left detached is an orphan reparented here;
        // without one (or with one), the sweep only reads processes younger than this one.
        if reaper::orphans_possible() {
            let me = i32::try_from(std::process::id()).ok();
            let since = me.and_then(procfs::ident).map_or(0, |id| id.start);
            let mine = procfs::Tag { id: self.id.clone(), since };
            let targets = procfs::Targets { tagged: Some(&mine), ..procfs::Targets::default() };
            procfs::stop(&targets, nix::sys::signal::Signal::SIGTERM, SWEEP_GRACE).await;
        }
        let crash_sweep = self.crash_sweep.locked().take();
        if let Some(task) = crash_sweep {
            let _ = task.await;
        }
        self.stop_sweeper();
        // A run that spilled bounds the home before it goes, so what it leaves is within the
        // limits however soon the next run comes (its own spills count, and stay).
        if let (Some(home), Some(_)) = (&self.home, self.spill_root.made()) {
            bound_ended_runs(home, &self.id, &self.spills).await;
        }
        self.remove_spills();
        self.retire();
    }

    /// Takes this provider's mark out of the home: it stopped what it started.
    fn retire(&self) {
        if let Some(mark) = self.mark.locked().take() {
            mark.retire();
        }
    }
}

impl Drop for LocalSubprocess {
    fn drop(&mut self) {
        self.stop_sweeper();
        // A provider dropped without shutdown (tests, embedders) leaves its processes to
        // whoever holds their handles: no later run sweeps them.
        self.remove_spills();
        self.retire();
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
