//! The plugin registry: plugins register with `inventory`; a composition picks them; the
//! registry checks exactly-one-provider-per-seam and builds a [`Runtime`] in dependency order.
//!
//! `plan` resolves a composition without constructing anything: it reports an unknown plugin (with
//! a suggestion), a duplicate seam or a missing seam, and orders the plugins by dependency.
//! `Runtime` holds the seams and tools and tears plugins down in reverse order, awaited.
//! `BuildContext::config` deserializes and validates (`PluginConfig::validate`) every plugin's
//! config, so a bad value names file, plugin and key the same way everywhere.
#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use conch_config::{Composition, CompositionError};
use conch_env::ShellEnv;
use conch_seams::{
    Approval, Error, ErrorCode, Files, Jobs, Owner, Provisioner, Sandbox, SandboxPolicy,
    ShellExecutor, Subprocess, TerminalBackend, Terminals, Tool, ToolContext, ToolOutput,
};
use conch_sync::LockExt;
use futures::future::BoxFuture;
use tracing::Instrument;

pub use config::{ConfigIssue, NoConfig, PluginConfig};
pub use inventory;
pub use policy::{PolicyConfig, SANDBOX_POLICY};

mod config;
mod policy;

/// The seams a plugin can provide or require.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SeamId {
    /// `Subprocess`.
    Subprocess,
    /// `ShellExecutor`.
    Shell,
    /// `Jobs`.
    Jobs,
    /// `Sandbox`.
    Sandbox,
    /// `TerminalBackend`.
    TerminalBackend,
    /// `Terminals` (the owner-scoped session service).
    Terminals,
    /// `Approval` (escalation decisions).
    Approval,
    /// `Files` (the world's filesystem).
    Files,
    /// `Provisioner` (sandboxes made on an engine).
    Provisioner,
}

impl SeamId {
    /// The seam's name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            SeamId::Subprocess => "subprocess",
            SeamId::Shell => "shell",
            SeamId::Jobs => "jobs",
            SeamId::Sandbox => "sandbox",
            SeamId::TerminalBackend => "terminal-backend",
            SeamId::Terminals => "terminals",
            SeamId::Approval => "approval",
            SeamId::Files => "files",
            SeamId::Provisioner => "provisioner",
        }
    }
}

impl fmt::Display for SeamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A built seam implementation.
#[derive(Clone, Debug)]
pub enum SeamHandle {
    /// A subprocess provider.
    Subprocess(Arc<dyn Subprocess>),
    /// A shell executor.
    Shell(Arc<dyn ShellExecutor>),
    /// A jobs registry.
    Jobs(Arc<dyn Jobs>),
    /// A sandbox.
    Sandbox(Arc<dyn Sandbox>),
    /// A terminal backend.
    TerminalBackend(Arc<dyn TerminalBackend>),
    /// A terminals service.
    Terminals(Arc<dyn Terminals>),
    /// An approver.
    Approval(Arc<dyn Approval>),
    /// A files provider.
    Files(Arc<dyn Files>),
    /// A provisioner.
    Provisioner(Arc<dyn Provisioner>),
}

impl SeamHandle {
    fn id(&self) -> SeamId {
        match self {
            SeamHandle::Subprocess(_) => SeamId::Subprocess,
            SeamHandle::Shell(_) => SeamId::Shell,
            SeamHandle::Jobs(_) => SeamId::Jobs,
            SeamHandle::Sandbox(_) => SeamId::Sandbox,
            SeamHandle::TerminalBackend(_) => SeamId::TerminalBackend,
            SeamHandle::Terminals(_) => SeamId::Terminals,
            SeamHandle::Approval(_) => SeamId::Approval,
            SeamHandle::Files(_) => SeamId::Files,
            SeamHandle::Provisioner(_) => SeamId::Provisioner,
        }
    }
}

/// Async teardown run when the runtime shuts down (reverse build order).
pub type Teardown = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// What a plugin's factory returns.
#[derive(Default)]
pub struct PluginOutput {
    /// The seam it provides (must match its entry's `provides`).
    pub seam: Option<SeamHandle>,
    /// Tools it contributes.
    pub tools: Vec<Arc<dyn Tool>>,
    /// What the runtime runs at shutdown, in reverse build order (`None` once taken).
    pub teardown: Option<Teardown>,
}

impl fmt::Debug for PluginOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginOutput")
            .field("seam", &self.seam)
            .field("tools", &self.tools.iter().map(|t| t.name()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PluginOutput {
    /// Provides a seam.
    pub fn seam(seam: SeamHandle) -> Self {
        Self { seam: Some(seam), ..Self::default() }
    }

    /// Contributes tools.
    pub fn tools(tools: Vec<Arc<dyn Tool>>) -> Self {
        Self { tools, ..Self::default() }
    }

    /// Adds a teardown.
    #[must_use]
    pub fn with_teardown(
        mut self,
        t: impl FnOnce() -> BoxFuture<'static, ()> + Send + 'static,
    ) -> Self {
        self.teardown = Some(Box::new(t));
        self
    }
}

/// A registered plugin.
#[derive(Debug)]
pub struct PluginEntry {
    /// Name used in compositions.
    pub name: &'static str,
    /// The seam it provides, if any.
    pub provides: Option<SeamId>,
    /// Seams it needs.
    pub requires: &'static [SeamId],
    /// One-line description.
    pub description: &'static str,
    /// Builds the plugin.
    pub build: fn(&BuildContext<'_>) -> Result<PluginOutput, Error>,
}

inventory::collect!(PluginEntry);

/// Registers a [`PluginEntry`] (a thin wrapper over `inventory::submit!`).
#[macro_export]
macro_rules! register_plugin {
    ($entry:expr) => {
        $crate::inventory::submit! { $entry }
    };
}

/// The seams built so far.
#[derive(Clone, Debug, Default)]
pub struct Seams {
    /// Subprocess provider.
    pub subprocess: Option<Arc<dyn Subprocess>>,
    /// Shell executor.
    pub shell: Option<Arc<dyn ShellExecutor>>,
    /// Jobs registry.
    pub jobs: Option<Arc<dyn Jobs>>,
    /// The sandbox runner commands are wrapped through, when the composition binds one.
    pub sandbox: Option<Arc<dyn Sandbox>>,
    /// Terminal backend.
    pub terminal_backend: Option<Arc<dyn TerminalBackend>>,
    /// Terminals service.
    pub terminals: Option<Arc<dyn Terminals>>,
    /// Who decides escalations out of the sandbox, when the composition binds one.
    pub approval: Option<Arc<dyn Approval>>,
    /// The world's filesystem.
    pub files: Option<Arc<dyn Files>>,
    /// Who makes the sandbox the world runs in, when the composition binds one.
    pub provisioner: Option<Arc<dyn Provisioner>>,
}

impl Seams {
    fn insert(&mut self, h: SeamHandle) {
        match h {
            SeamHandle::Subprocess(x) => self.subprocess = Some(x),
            SeamHandle::Shell(x) => self.shell = Some(x),
            SeamHandle::Jobs(x) => self.jobs = Some(x),
            SeamHandle::Sandbox(x) => self.sandbox = Some(x),
            SeamHandle::TerminalBackend(x) => self.terminal_backend = Some(x),
            SeamHandle::Terminals(x) => self.terminals = Some(x),
            SeamHandle::Approval(x) => self.approval = Some(x),
            SeamHandle::Files(x) => self.files = Some(x),
            SeamHandle::Provisioner(x) => self.provisioner = Some(x),
        }
    }
}

/// What a factory sees.
#[derive(Debug)]
pub struct BuildContext<'a> {
    plugin: &'static str,
    composition: &'a Composition,
    seams: &'a Seams,
    shell_env: &'a Arc<ShellEnv>,
    /// The composition's default sandbox policy (its `sandbox-policy` entry), when it has one.
    sandbox_policy: Option<&'a Arc<SandboxPolicy>>,
}

fn unbound(plugin: &str, seam: SeamId) -> Error {
    Error::new(
        ErrorCode::SeamUnbound,
        format!("plugin `{plugin}` requires the {seam} seam, which is not built"),
    )
}

impl BuildContext<'_> {
    /// This plugin's config: deserialized, then validated by [`PluginConfig::validate`].
    ///
    /// # Errors
    /// `invalid_composition` naming file, plugin and key.
    pub fn config<T: PluginConfig>(&self) -> Result<T, Error> {
        let config: T = self.composition.plugin_config(self.plugin).map_err(|e| {
            Error::new(ErrorCode::InvalidComposition, e.to_string()).with_provider("registry")
        })?;
        // Through the composition rather than `PluginConfig::check`, so that a bad value set
        // by an environment override names its variable.
        config.validate().map_err(|issue| {
            let e = self.composition.config_issue(self.plugin, issue.key, issue.problem);
            Error::new(ErrorCode::InvalidComposition, e.to_string())
        })?;
        Ok(config)
    }

    /// Prefixes an error with the composition's source, so it names the file too.
    pub fn locate(&self, error: Error) -> Error {
        error.prefixed(self.composition.source_name())
    }

    /// The subprocess seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn subprocess(&self) -> Result<Arc<dyn Subprocess>, Error> {
        self.seams.subprocess.clone().ok_or_else(|| unbound(self.plugin, SeamId::Subprocess))
    }

    /// The shell seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn shell(&self) -> Result<Arc<dyn ShellExecutor>, Error> {
        self.seams.shell.clone().ok_or_else(|| unbound(self.plugin, SeamId::Shell))
    }

    /// The jobs seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn jobs(&self) -> Result<Arc<dyn Jobs>, Error> {
        self.seams.jobs.clone().ok_or_else(|| unbound(self.plugin, SeamId::Jobs))
    }

    /// The sandbox seam, when present.
    pub fn sandbox(&self) -> Option<Arc<dyn Sandbox>> {
        self.seams.sandbox.clone()
    }

    /// The sandbox seam, required.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn sandbox_required(&self) -> Result<Arc<dyn Sandbox>, Error> {
        self.seams.sandbox.clone().ok_or_else(|| unbound(self.plugin, SeamId::Sandbox))
    }

    /// The approval seam, when present.
    pub fn approval(&self) -> Option<Arc<dyn Approval>> {
        self.seams.approval.clone()
    }

    /// The files seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn files(&self) -> Result<Arc<dyn Files>, Error> {
        self.seams.files.clone().ok_or_else(|| unbound(self.plugin, SeamId::Files))
    }

    /// The provisioner seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn provisioner(&self) -> Result<Arc<dyn Provisioner>, Error> {
        self.seams.provisioner.clone().ok_or_else(|| unbound(self.plugin, SeamId::Provisioner))
    }

    /// The composition's default sandbox policy, when it has a `sandbox-policy` entry.
    pub fn sandbox_policy(&self) -> Option<Arc<SandboxPolicy>> {
        self.sandbox_policy.cloned()
    }

    /// The terminal backend seam.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn terminal_backend(&self) -> Result<Arc<dyn TerminalBackend>, Error> {
        self.seams
            .terminal_backend
            .clone()
            .ok_or_else(|| unbound(self.plugin, SeamId::TerminalBackend))
    }

    /// The terminals service.
    ///
    /// # Errors
    /// `seam_unbound`.
    pub fn terminals(&self) -> Result<Arc<dyn Terminals>, Error> {
        self.seams.terminals.clone().ok_or_else(|| unbound(self.plugin, SeamId::Terminals))
    }

    /// The composition's source name (for error messages).
    pub fn source_name(&self) -> &str {
        self.composition.source_name()
    }

    /// The managed CONCH_* facts.
    pub fn shell_env(&self) -> Arc<ShellEnv> {
        Arc::clone(self.shell_env)
    }
}

/// A tool that points the model to a tool the composition lacks ([`RegistryError::MissingTool`]).
#[derive(Debug)]
pub struct MissingTool {
    /// Composition source.
    pub source_name: String,
    /// The referring tool.
    pub tool: String,
    /// Its plugin.
    pub plugin: String,
    /// The tool it points to.
    pub missing: String,
    /// Why it points there, and how to do without it.
    pub because: String,
}

/// Registry resolution errors.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The composition could not be loaded or a config is bad.
    #[error(transparent)]
    Composition(#[from] CompositionError),
    /// A plugin name is not registered.
    #[error("{source_name}: unknown plugin `{name}`{suggestion}; available: {available}")]
    UnknownPlugin {
        /// Composition source.
        source_name: String,
        /// The unknown name.
        name: String,
        /// ` (did you mean `x`?)` or empty.
        suggestion: String,
        /// Every registered name.
        available: String,
    },
    /// Two plugins provide one seam.
    #[error(
        "{source_name}: plugins `{first}` and `{second}` both provide the {seam} seam; keep exactly one"
    )]
    DuplicateSeam {
        /// Composition source.
        source_name: String,
        /// The seam provided twice.
        seam: SeamId,
        /// One provider.
        first: String,
        /// The other.
        second: String,
    },
    /// One name registered twice in the binary.
    #[error("plugin `{0}` is registered twice in this binary")]
    DuplicateRegistration(String),
    /// A required seam has no provider.
    #[error(
        "{source_name}: plugin `{requirer}` requires the {seam} seam, but no plugin in the composition provides it (add one of: {candidates})"
    )]
    MissingSeam {
        /// Composition source.
        source_name: String,
        /// Who needs it.
        requirer: String,
        /// The seam nobody provides.
        seam: SeamId,
        /// Plugins that provide it.
        candidates: String,
    },
    /// A plugin that confines through the sandbox seam has no default policy to do it under.
    #[error(
        "{source_name}: plugin `{requirer}` requires the composition's default sandbox policy, but the composition has no `{SANDBOX_POLICY}` entry (add one)"
    )]
    MissingPolicy {
        /// Composition source.
        source_name: String,
        /// Who needs it.
        requirer: String,
    },
    /// A plugin's config was rejected (the message names file, plugin and key).
    #[error("{0}")]
    Config(Box<Error>),
    /// A tool points the model to a tool the composition does not offer.
    #[error(
        "{}: tool `{}` (plugin `{}`) points the model to `{}`, which no plugin in the composition offers: {}",
        .0.source_name, .0.tool, .0.plugin, .0.missing, .0.because
    )]
    MissingTool(Box<MissingTool>),
    /// A plugin factory failed.
    #[error("{source_name}: plugin `{plugin}` failed to build: {error}")]
    Build {
        /// Composition source.
        source_name: String,
        /// The plugin whose factory failed.
        plugin: String,
        /// What it reported.
        error: Box<Error>,
    },
}

impl RegistryError {
    /// Stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RegistryError::Composition(_) | RegistryError::Config(_) => {
                ErrorCode::InvalidComposition
            }
            RegistryError::UnknownPlugin { .. } => ErrorCode::ProviderNotFound,
            RegistryError::DuplicateSeam { .. } | RegistryError::DuplicateRegistration(_) => {
                ErrorCode::DuplicateProvider
            }
            RegistryError::MissingSeam { .. } | RegistryError::MissingPolicy { .. } => {
                ErrorCode::SeamUnbound
            }
            RegistryError::MissingTool(_) => ErrorCode::InvalidComposition,
            RegistryError::Build { error, .. } => error.code(),
        }
    }
}

impl From<RegistryError> for Error {
    fn from(e: RegistryError) -> Self {
        let code = e.code();
        Error::new(code, e.to_string()).with_provider("registry")
    }
}

/// Every registered plugin, sorted by name.
///
/// # Errors
/// `DuplicateRegistration` when two entries share a name.
pub fn plugins() -> Result<Vec<&'static PluginEntry>, RegistryError> {
    let mut all: Vec<&'static PluginEntry> = inventory::iter::<PluginEntry>.into_iter().collect();
    all.sort_by_key(|e| e.name);
    for w in all.windows(2) {
        if w[0].name == w[1].name {
            return Err(RegistryError::DuplicateRegistration(w[0].name.into()));
        }
    }
    Ok(all)
}

fn suggest(name: &str, entries: &[&'static PluginEntry]) -> String {
    let names: Vec<&str> = entries.iter().map(|e| e.name).collect();
    conch_config::did_you_mean(name, &names)
}

/// The resolution plan: entries in build order.
#[derive(Debug)]
pub struct Plan {
    order: Vec<&'static PluginEntry>,
}

impl Plan {
    /// Plugin names in build order.
    pub fn names(&self) -> Vec<&'static str> {
        self.order.iter().map(|e| e.name).collect()
    }
}

/// Checks a composition against the registered plugins without building anything.
///
/// # Errors
/// Unknown plugin, duplicate seam provider, missing seam.
pub fn plan(composition: &Composition) -> Result<Plan, RegistryError> {
    let all = plugins()?;
    let source_name = composition.source_name().to_string();
    let mut chosen = Vec::new();
    for name in composition.plugins() {
        let Some(entry) = all.iter().find(|e| e.name == name) else {
            return Err(RegistryError::UnknownPlugin {
                source_name,
                name: name.clone(),
                suggestion: suggest(name, &all),
                available: all.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
            });
        };
        chosen.push(*entry);
    }
    let mut providers: BTreeMap<SeamId, &'static str> = BTreeMap::new();
    for e in &chosen {
        if let Some(seam) = e.provides
            && let Some(first) = providers.insert(seam, e.name)
        {
            return Err(RegistryError::DuplicateSeam {
                source_name,
                seam,
                first: first.into(),
                second: e.name.into(),
            });
        }
    }
    for e in &chosen {
        for seam in e.requires {
            if !providers.contains_key(seam) {
                let candidates: Vec<&str> =
                    all.iter().filter(|c| c.provides == Some(*seam)).map(|c| c.name).collect();
                return Err(RegistryError::MissingSeam {
                    source_name,
                    requirer: e.name.into(),
                    seam: *seam,
                    candidates: if candidates.is_empty() {
                        "none registered".into()
                    } else {
                        candidates.join(", ")
                    },
                });
            }
        }
    }
    // Whatever confines through the sandbox seam wraps under the composition's default policy.
    if !composition.plugins().iter().any(|p| p == SANDBOX_POLICY)
        && let Some(e) = chosen.iter().find(|e| e.requires.contains(&SeamId::Sandbox))
    {
        return Err(RegistryError::MissingPolicy { source_name, requirer: e.name.into() });
    }
    // Dependency order: repeatedly take plugins whose required seams are already provided.
    // Every requirement has a provider (checked above), so a stall means a cycle.
    let mut order = Vec::new();
    let mut built: BTreeSet<SeamId> = BTreeSet::new();
    let mut pending = chosen;
    while !pending.is_empty() {
        let (ready, rest): (Vec<_>, Vec<_>) =
            pending.into_iter().partition(|e| e.requires.iter().all(|s| built.contains(s)));
        if ready.is_empty() {
            let e = rest[0];
            let seam = e
                .requires
                .iter()
                .copied()
                .find(|s| !built.contains(s))
                .unwrap_or(SeamId::Subprocess);
            return Err(RegistryError::MissingSeam {
                source_name,
                requirer: e.name.into(),
                seam,
                candidates: "a provider that does not depend on it (dependency cycle)".into(),
            });
        }
        for e in &ready {
            if let Some(s) = e.provides {
                built.insert(s);
            }
        }
        order.extend(ready);
        pending = rest;
    }
    Ok(Plan { order })
}

/// A plugin's build error as the registry reports it.
fn build_error(composition: &Composition, plugin: &str, error: Error) -> RegistryError {
    match error.code() {
        // A config error already names the file, plugin and key.
        ErrorCode::InvalidComposition => RegistryError::Config(Box::new(error)),
        _ => RegistryError::Build {
            source_name: composition.source_name().into(),
            plugin: plugin.into(),
            error: Box::new(error),
        },
    }
}

/// A built runtime: seams, tools, and awaited teardown.
pub struct Runtime {
    source_name: String,
    seams: Seams,
    /// The composition's default sandbox policy (its `sandbox-policy` entry).
    sandbox_policy: Option<Arc<SandboxPolicy>>,
    tools: Vec<Arc<dyn Tool>>,
    teardowns: std::sync::Mutex<Vec<(&'static str, Teardown)>>,
    shell_env: Arc<ShellEnv>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("source", &self.source_name)
            .field("tools", &self.tools.iter().map(|t| t.name()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Plans and builds a composition.
    ///
    /// # Errors
    /// Any [`RegistryError`].
    pub fn build(composition: &Composition, shell_env: ShellEnv) -> Result<Self, RegistryError> {
        let plan = plan(composition)?;
        let shell_env = Arc::new(shell_env);
        let mut seams = Seams::default();
        let sandbox_policy = policy::default_policy(composition, &seams, &shell_env)?;
        let mut tools: Vec<(usize, &'static str, Arc<dyn Tool>)> = Vec::new();
        let mut teardowns = Vec::new();
        for entry in plan.order {
            let rank =
                composition.plugins().iter().position(|p| p == entry.name).unwrap_or(usize::MAX);
            let ctx = BuildContext {
                plugin: entry.name,
                composition,
                seams: &seams,
                shell_env: &shell_env,
                sandbox_policy: sandbox_policy.as_ref(),
            };
            let out = (entry.build)(&ctx).map_err(|e| build_error(composition, entry.name, e))?;
            if let Some(seam) = out.seam {
                if Some(seam.id()) != entry.provides {
                    return Err(RegistryError::Build {
                        source_name: composition.source_name().into(),
                        plugin: entry.name.into(),
                        error: Box::new(Error::internal(format!(
                            "built a {} seam it did not declare",
                            seam.id()
                        ))),
                    });
                }
                seams.insert(seam);
            }
            for t in out.tools {
                if let Some((_, _, dup)) = tools.iter().find(|(_, _, x)| x.name() == t.name()) {
                    return Err(RegistryError::Build {
                        source_name: composition.source_name().into(),
                        plugin: entry.name.into(),
                        error: Box::new(Error::new(
                            ErrorCode::DuplicateProvider,
                            format!("tool `{}` is already provided by another plugin", dup.name()),
                        )),
                    });
                }
                tools.push((rank, entry.name, t));
            }
            if let Some(t) = out.teardown {
                teardowns.push((entry.name, t));
            }
        }
        // Present tools in the composition's (sorted) plugin order, not dependency order, so
        // the listing is stable and `tool-bash` comes before `tool-jobs`.
        tools.sort_by_key(|(rank, _, _)| *rank);
        // Only now is every tool known: a model must never be pointed to one it lacks.
        for (_, plugin, t) in &tools {
            for r in t.refers_to() {
                if !tools.iter().any(|(_, _, x)| x.name() == r.tool) {
                    return Err(RegistryError::MissingTool(Box::new(MissingTool {
                        source_name: composition.source_name().into(),
                        tool: t.name().into(),
                        plugin: (*plugin).into(),
                        missing: r.tool,
                        because: r.because,
                    })));
                }
            }
        }
        let tools = tools.into_iter().map(|(_, _, t)| t).collect();
        Ok(Self {
            source_name: composition.source_name().into(),
            seams,
            sandbox_policy,
            tools,
            teardowns: std::sync::Mutex::new(teardowns),
            shell_env,
        })
    }

    /// The composition's default sandbox policy, when it has a `sandbox-policy` entry: what a
    /// front end that spawns through the subprocess seam itself wraps its commands under.
    pub fn sandbox_policy(&self) -> Option<Arc<SandboxPolicy>> {
        self.sandbox_policy.clone()
    }

    /// Where the composition came from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The built seams.
    pub fn seams(&self) -> &Seams {
        &self.seams
    }

    /// The managed env facts.
    pub fn shell_env(&self) -> &Arc<ShellEnv> {
        &self.shell_env
    }

    /// Every tool, in build order.
    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }

    /// One tool by name.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// Calls a tool as `owner` with a fresh context (cancelled when the owner is disposed).
    ///
    /// # Errors
    /// `not_found` for an unknown tool; the tool's own errors otherwise.
    pub async fn call(
        &self,
        owner: &Arc<Owner>,
        name: &str,
        args: serde_json::Value,
    ) -> Result<ToolOutput, Error> {
        self.call_with(&ToolContext::new(Arc::clone(owner)), name, args).await
    }

    /// Calls a tool with a context the front end built: its own cancellation (a child of
    /// the owner's token, see [`ToolContext::new`]) and progress sink.
    ///
    /// # Errors
    /// `not_found` for an unknown tool; the tool's own errors otherwise.
    pub async fn call_with(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: serde_json::Value,
    ) -> Result<ToolOutput, Error> {
        let Some(tool) = self.tool(name) else {
            let names: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("unknown tool `{name}`; this composition has: {}", names.join(", ")),
            ));
        };
        // The tool's name only: arguments can hold anything the model wrote.
        let span = tracing::info_span!("tool_call", tool = name, error = tracing::field::Empty);
        let result = tool.call(ctx, args).instrument(span.clone()).await;
        if let Err(e) = &result {
            span.record("error", e.code().as_str());
        }
        result
    }

    /// Runs every teardown in reverse build order and awaits each. Idempotent.
    pub async fn shutdown(&self) {
        let teardowns = std::mem::take(&mut *self.teardowns.locked());
        if teardowns.is_empty() {
            return;
        }
        async {
            for (plugin, t) in teardowns.into_iter().rev() {
                t().instrument(tracing::debug_span!("teardown", plugin)).await;
            }
        }
        .instrument(tracing::debug_span!("runtime_shutdown", source = %self.source_name))
        .await;
    }
}
