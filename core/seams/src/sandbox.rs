//! The sandbox seam: confines an exact command line under a policy, and the approval seam
//! that decides whether a confined command may run again with wider permissions.
//!
//! A sandbox never runs anything itself: [`Sandbox::wrap`] turns a command line into another
//! one (a runner in front of the exact argv) that the caller spawns through its subprocess
//! seam, so the same wrapping serves one-shot calls, background jobs and terminals.

use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;

use crate::{EnvOverlay, ExitStatus, Result};

/// The three policy modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum SandboxMode {
    /// Reads anywhere, writes nowhere (except /dev/null and the terminal).
    ReadOnly,
    /// Writes only under the workspace root and the policy's extra writable roots.
    WorkspaceWrite,
    /// No confinement.
    DangerFullAccess,
}

impl SandboxMode {
    /// The kebab-case name used in configs and results.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::DangerFullAccess => "danger-full-access",
        }
    }

    /// Parses the kebab-case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read-only" => Some(SandboxMode::ReadOnly),
            "workspace-write" => Some(SandboxMode::WorkspaceWrite),
            "danger-full-access" => Some(SandboxMode::DangerFullAccess),
            _ => None,
        }
    }

    /// True for the modes that confine anything.
    pub fn confines(self) -> bool {
        self != SandboxMode::DangerFullAccess
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A complete per-call policy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SandboxPolicy {
    /// The confinement commands run under.
    pub mode: SandboxMode,
    /// Root of the writable workspace (workspace-write).
    pub workspace_root: PathBuf,
    /// More roots writable in workspace-write mode.
    #[cfg_attr(feature = "serde", serde(default))]
    pub writable_roots: Vec<PathBuf>,
    /// Network allowed. Off means no network at all (no TCP, UDP or other IP sockets).
    #[cfg_attr(feature = "serde", serde(default))]
    pub network: bool,
    /// Paths under the writable roots that stay read-only anyway (by default the
    /// workspace's `.git/hooks` and `.git/config`, which run or configure code outside the
    /// sandbox later).
    #[cfg_attr(feature = "serde", serde(default))]
    pub read_only_paths: Vec<PathBuf>,
    /// Paths the sandbox can neither read nor write: a directory shows as an empty read-only
    /// one, a file as an empty or unreadable one. A writable root beneath one stays whole. A
    /// path that does not exist when a command starts hides nothing from it.
    #[cfg_attr(feature = "serde", serde(default))]
    pub hidden_paths: Vec<PathBuf>,
}

impl SandboxPolicy {
    /// A policy for `mode` rooted at `workspace_root`: no extra roots, no network, and the
    /// workspace's `.git/hooks` and `.git/config` kept read-only.
    pub fn new(mode: SandboxMode, workspace_root: impl Into<PathBuf>) -> Self {
        let workspace_root = workspace_root.into();
        let read_only_paths =
            vec![workspace_root.join(".git/hooks"), workspace_root.join(".git/config")];
        Self {
            mode,
            workspace_root,
            writable_roots: Vec::new(),
            network: false,
            read_only_paths,
            hidden_paths: Vec::new(),
        }
    }

    /// Adds a writable root.
    #[must_use]
    pub fn with_writable_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.writable_roots.push(root.into());
        self
    }

    /// Allows or forbids the network.
    #[must_use]
    pub fn with_network(mut self, network: bool) -> Self {
        self.network = network;
        self
    }

    /// Replaces the read-only paths under the writable roots.
    #[must_use]
    pub fn with_read_only_paths(mut self, paths: Vec<PathBuf>) -> Self {
        self.read_only_paths = paths;
        self
    }

    /// Replaces the hidden paths.
    #[must_use]
    pub fn with_hidden_paths(mut self, paths: Vec<PathBuf>) -> Self {
        self.hidden_paths = paths;
        self
    }

    /// Every root writable in this policy's mode (none in read-only).
    pub fn writable(&self) -> Vec<PathBuf> {
        match self.mode {
            SandboxMode::WorkspaceWrite => std::iter::once(self.workspace_root.clone())
                .chain(self.writable_roots.iter().cloned())
                .collect(),
            SandboxMode::ReadOnly | SandboxMode::DangerFullAccess => Vec::new(),
        }
    }
}

/// The marker a model reads where the sandbox denied `what` (`file access`, `network
/// access`) under `mode`: `[sandbox: file access denied under workspace-write mode]`. Shell
/// results and the files seam's refusals carry the same words.
pub fn denial_marker(what: &str, mode: SandboxMode) -> String {
    format!("[sandbox: {what} denied under {mode} mode]")
}

/// A command line before or after wrapping: what a subprocess seam spawns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommandLine {
    /// `argv[0]` is the executable; no shell interpretation.
    pub argv: Vec<String>,
    /// Working directory (`None`: the subprocess provider's default).
    pub cwd: Option<PathBuf>,
    /// Environment overlay applied after the scrub.
    pub env: EnvOverlay,
}

impl CommandLine {
    /// A command line with no cwd and no overlay.
    pub fn new(argv: Vec<String>) -> Self {
        Self { argv, cwd: None, env: EnvOverlay::new() }
    }

    /// Sets the working directory.
    #[must_use]
    pub fn with_cwd(mut self, cwd: Option<PathBuf>) -> Self {
        self.cwd = cwd;
        self
    }

    /// Sets the environment overlay.
    #[must_use]
    pub fn with_env(mut self, env: EnvOverlay) -> Self {
        self.env = env;
        self
    }
}

/// What a sandbox provider can enforce on this machine (probed when it is built).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SandboxCapabilities {
    /// Modes it can enforce (danger-full-access is always possible).
    pub modes: Vec<SandboxMode>,
    /// It can take the network away.
    pub network_control: bool,
    /// The command runs in a pid namespace of its own: nothing it starts outlives it, and
    /// it cannot see or signal processes outside.
    pub pid_isolation: bool,
    /// Signals to processes outside the sandbox are denied (without a pid namespace).
    pub signal_scoping: bool,
    /// How it enforces.
    pub enforcement: Enforcement,
}

/// How a sandbox enforces its modes on this machine, as its provider states it. Its
/// `Display` (which is also its wire form) is the words a reader sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enforcement {
    /// The mechanisms in the provider's words (`landlock ABI 7 + seccomp`), or why there are
    /// none (`none (no landlock)`).
    pub mechanism: String,
    /// Why there is no read-only mount layer here, when there is none: chmod and utime
    /// outside the roots are then not denied, new entries cannot be created directly in a git
    /// workspace's root, and new terminals (ptys) cannot be opened.
    pub no_mount_layer: Option<String>,
}

impl Enforcement {
    /// Enforcement by `mechanism`, with nothing missing.
    pub fn new(mechanism: impl Into<String>) -> Self {
        Self { mechanism: mechanism.into(), no_mount_layer: None }
    }

    /// The same mechanism without a mount layer, for the reason `why`.
    #[must_use]
    pub fn without_mount_layer(mut self, why: impl Into<String>) -> Self {
        self.no_mount_layer = Some(why.into());
        self
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.mechanism)?;
        if let Some(why) = &self.no_mount_layer {
            write!(
                f,
                "; no mount layer ({why}): chmod and utime outside the roots are not denied, new \
                 entries cannot be created directly in a git workspace's root, and new terminals \
                 (ptys) cannot be opened"
            )?;
        }
        Ok(())
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Enforcement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Words only: what a reader saw, kept as the mechanism.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Enforcement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        <String as serde::Deserialize>::deserialize(d).map(Enforcement::new)
    }
}

/// Which kind of access a denial was about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Denial {
    /// A file or directory access.
    File,
    /// A network access.
    Network,
}

/// What the sandbox did to a command, as its classifier judged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum SandboxVerdict {
    /// The command ran and hit no denial (or ran unconfined).
    Clean,
    /// The command hit a denial, of this kind when known.
    Denied(Option<Denial>),
    /// The runner could not confine the command, which never ran (in the background; a
    /// foreground call errors instead).
    RunnerFailed,
}

/// Sandbox facts reported with a result.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The mode in force.
    pub mode: SandboxMode,
    /// What the sandbox did.
    pub verdict: SandboxVerdict,
    /// How the policy was enforced, when confined.
    pub enforcement: Option<Enforcement>,
    /// The command ran again outside the sandbox after an approved escalation.
    pub escalated: bool,
}

impl SandboxInfo {
    /// Facts for a command that ran under `mode` and hit no denial.
    pub fn new(mode: SandboxMode) -> Self {
        Self { mode, verdict: SandboxVerdict::Clean, enforcement: None, escalated: false }
    }

    /// The same facts with `verdict`.
    #[must_use]
    pub fn with_verdict(mut self, verdict: SandboxVerdict) -> Self {
        self.verdict = verdict;
        self
    }

    /// The command hit a denial.
    pub fn denied(&self) -> bool {
        matches!(self.verdict, SandboxVerdict::Denied(_))
    }

    /// What kind of denial, when it hit one whose kind is known.
    pub fn denial(&self) -> Option<Denial> {
        match self.verdict {
            SandboxVerdict::Denied(kind) => kind,
            SandboxVerdict::Clean | SandboxVerdict::RunnerFailed => None,
        }
    }

    /// The runner could not confine the command.
    pub fn runner_failed(&self) -> bool {
        self.verdict == SandboxVerdict::RunnerFailed
    }
}

/// The sandbox seam.
///
/// # Contract
/// - `wrap` returns a command line that runs the given one confined by `policy`, or an
///   error (`sandbox_unavailable` when the machine cannot enforce it, with what to do); it
///   never returns an unconfined command line for a confining mode.
/// - The wrapped command keeps the original's argv exactly (no shell interpretation), its
///   cwd and its environment overlay.
/// - `classify` looks only at what the command left (exit status and the tail of its
///   output); it never guesses a denial from the command's text.
pub trait Sandbox: Send + Sync + fmt::Debug + 'static {
    /// Provider name.
    fn provider_name(&self) -> &'static str;
    /// What it can enforce here.
    fn capabilities(&self) -> SandboxCapabilities;
    /// Wraps a command line.
    ///
    /// # Errors
    /// `sandbox_unavailable` when the policy cannot be enforced on this machine;
    /// `invalid_argument` for a bad policy (a relative root).
    fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine>;
    /// What the sandbox did to a command that ran wrapped under `policy`.
    fn classify(&self, policy: &SandboxPolicy, exit: &ExitStatus, output_tail: &str)
    -> SandboxInfo;
    /// The command `wrap` returned as `wrapped` has finished and its processes are stopped
    /// (or it never started): the runner may free what it made for it (a private
    /// `TMPDIR`). Callers hold a `conch_confine::SandboxRelease` so every path calls this
    /// exactly once. No default: a wrapper that forgot it would leak what its inner runner made.
    fn release(&self, wrapped: &CommandLine);
}

/// A request to run a confined command again with wider permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EscalationRequest {
    /// The exact command (as the model wrote it).
    pub command: String,
    /// Why the model says it needs it.
    pub justification: String,
    /// What it asks for.
    pub permissions: EscalationPermissions,
    /// The owner's session id.
    pub session: String,
}

impl EscalationRequest {
    /// A request.
    pub fn new(
        command: impl Into<String>,
        justification: impl Into<String>,
        permissions: EscalationPermissions,
        session: impl Into<String>,
    ) -> Self {
        Self {
            command: command.into(),
            justification: justification.into(),
            permissions,
            session: session.into(),
        }
    }
}

/// What an escalation asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EscalationPermissions {
    /// Run the command once outside the sandbox.
    RequireEscalated,
}

impl EscalationPermissions {
    /// The snake_case name models use (`require_escalated`).
    pub fn as_str(self) -> &'static str {
        match self {
            EscalationPermissions::RequireEscalated => "require_escalated",
        }
    }
}

impl fmt::Display for EscalationPermissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The approver's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Run it with the wider permissions, once.
    Approved,
    /// Do not; the reason is shown to the model.
    Denied {
        /// The approver's reason, shown to the model.
        reason: String,
    },
}

/// The approval seam: decides escalations.
///
/// # Contract
/// Never approves by default: a provider that cannot ask (no terminal, no rule matched)
/// denies and says why.
#[async_trait]
pub trait Approval: Send + Sync + fmt::Debug + 'static {
    /// Provider name.
    fn provider_name(&self) -> &'static str;
    /// Decides one escalation.
    ///
    /// # Errors
    /// Only for infrastructure failures; a refusal is [`ApprovalDecision::Denied`].
    async fn approve_escalation(&self, request: &EscalationRequest) -> Result<ApprovalDecision>;
}
