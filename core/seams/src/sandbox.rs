//! The sandbox seam: confines an exact command line under a policy, and the approval seam
//! that decides whether a confined command may run again with wider permissions.
//!
//! A sandbox never runs anything itself: [`Sandbox::wrap`] turns a command line into another
//! one (a runner in front of the exact argv) that the caller spawns through its subprocess
//! seam, so the same wrapping serves one-shot calls, background jobs and terminals.

use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;

use crate::{EnvOverlay, Error, ErrorCode, ExitStatus, Result, tail_utf8};

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
}

impl SandboxPolicy {
    /// A policy for `mode` rooted at `workspace_root`: no extra roots, no network, and the
    /// workspace's `.git/hooks` and `.git/config` kept read-only.
    pub fn new(mode: SandboxMode, workspace_root: impl Into<PathBuf>) -> Self {
        let workspace_root = workspace_root.into();
        let read_only_paths =
            vec![workspace_root.join(".git/hooks"), workspace_root.join(".git/config")];
        Self { mode, workspace_root, writable_roots: Vec::new(), network: false, read_only_paths }
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
    /// `TMPDIR`). Callers hold a [`SandboxRelease`] so every path calls this exactly once.
    /// No default: a wrapper that forgot it would leak what its inner runner made.
    fn release(&self, wrapped: &CommandLine);
}

/// Calls [`Sandbox::release`] for one wrapped command when dropped: hold it as long as the
/// command (a one-shot run, a background process, a terminal session) may still run.
#[derive(Debug)]
pub struct SandboxRelease {
    sandbox: std::sync::Arc<dyn Sandbox>,
    wrapped: CommandLine,
}

impl SandboxRelease {
    /// Releases `wrapped` through `sandbox` on drop.
    pub fn new(sandbox: std::sync::Arc<dyn Sandbox>, wrapped: CommandLine) -> Self {
        Self { sandbox, wrapped }
    }
}

impl Drop for SandboxRelease {
    fn drop(&mut self) {
        self.sandbox.release(&self.wrapped);
    }
}

/// How much of a command's output tail a sandbox classifier sees (cut by [`tail_utf8`]).
pub const CLASSIFY_TAIL_BYTES: usize = 4096;

/// What a [`Confinement`] confines, in its errors' words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfinedSubject {
    /// One command (a shell executor's call).
    Command,
    /// A terminal session's shell.
    Shell,
}

/// A bound sandbox with the default policy its caller's commands run under: the one place
/// that wraps a command line, reports what cannot run confined as `sandbox_unavailable`,
/// hands out the [`SandboxRelease`] guard and judges whether a runner refused.
///
/// Errors carry the caller's provider name and operation, so they read as the caller's own.
#[derive(Clone, Debug)]
pub struct Confinement {
    sandbox: std::sync::Arc<dyn Sandbox>,
    policy: SandboxPolicy,
    provider: &'static str,
    operation: &'static str,
    subject: ConfinedSubject,
}

/// A command line [`Confinement::wrap`] made ready to spawn.
#[derive(Debug)]
#[non_exhaustive]
pub struct Wrapped {
    /// What to spawn.
    pub command: CommandLine,
    /// A runner stands in front of the command (a mode that confines nothing passes it
    /// through unchanged, and then it fails as the unconfined command would).
    pub runner: bool,
    /// Frees what the runner made for the command; hold it while the command may run.
    pub release: SandboxRelease,
}

impl Confinement {
    /// `sandbox` under the default `policy`, for `provider`'s `operation` on `subject`.
    pub fn new(
        sandbox: std::sync::Arc<dyn Sandbox>,
        policy: SandboxPolicy,
        provider: &'static str,
        operation: &'static str,
        subject: ConfinedSubject,
    ) -> Self {
        Self { sandbox, policy, provider, operation, subject }
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &std::sync::Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// The default policy.
    pub fn policy(&self) -> &SandboxPolicy {
        &self.policy
    }

    /// The default policy confines and the sandbox gives its commands a pid namespace.
    pub fn pid_isolated(&self) -> bool {
        self.policy.mode.confines() && self.sandbox.capabilities().pid_isolation
    }

    /// A `sandbox_unavailable` error in the caller's name.
    pub fn unavailable(&self, message: impl Into<String>) -> Error {
        Error::new(ErrorCode::SandboxUnavailable, message)
            .with_provider(self.provider)
            .with_operation(self.operation)
    }

    /// Wraps `command` under `policy` (the default or a per-call one).
    ///
    /// # Errors
    /// `sandbox_unavailable`: the sandbox's own, or any other wrap error reported as that
    /// (the command cannot run confined, and it never runs unconfined instead).
    pub fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<Wrapped> {
        let original = command.argv.clone();
        let command = self.sandbox.wrap(policy, command).map_err(|e| {
            if e.code() == ErrorCode::SandboxUnavailable {
                e
            } else {
                let what = match self.subject {
                    ConfinedSubject::Command => "this command",
                    ConfinedSubject::Shell => "the shell",
                };
                self.unavailable(format!(
                    "{} cannot run {what} under {} mode: {e}",
                    self.sandbox.provider_name(),
                    policy.mode
                ))
            }
        })?;
        let runner = command.argv != original;
        let release = SandboxRelease::new(std::sync::Arc::clone(&self.sandbox), command.clone());
        Ok(Wrapped { command, runner, release })
    }

    /// A wrapped command line whose runner could not be spawned, as `sandbox_unavailable`.
    pub fn launch_failed(&self, error: &Error) -> Error {
        self.unavailable(format!("the sandbox runner could not be launched: {error}"))
    }

    /// The sandbox's verdict on a command that ran wrapped under `policy` and left `status`
    /// and `output` (only its tail is looked at); `runner` as [`Wrapped::runner`] said, since
    /// only a runner that was put in front can have refused.
    pub fn classify(
        &self,
        policy: &SandboxPolicy,
        status: &ExitStatus,
        output: &str,
        runner: bool,
    ) -> SandboxInfo {
        let info = self.sandbox.classify(policy, status, tail_utf8(output, CLASSIFY_TAIL_BYTES));
        if info.runner_failed() && !runner {
            return info.with_verdict(SandboxVerdict::Clean);
        }
        info
    }

    /// [`Confinement::classify`], with a runner that refused reported as the error it is in
    /// the foreground: `sandbox_unavailable` quoting what the runner printed (the command
    /// never ran, so that is all of `output`).
    ///
    /// # Errors
    /// `sandbox_unavailable` when the runner refused.
    pub fn verdict(
        &self,
        policy: &SandboxPolicy,
        status: &ExitStatus,
        output: &str,
        runner: bool,
    ) -> Result<SandboxInfo> {
        let info = self.classify(policy, status, output, runner);
        if info.runner_failed() {
            return Err(self.refused(output));
        }
        Ok(info)
    }

    /// The error for a runner that refused to confine, quoting what it printed.
    pub fn refused(&self, output: &str) -> Error {
        let what = match self.subject {
            ConfinedSubject::Command => "the command",
            ConfinedSubject::Shell => "the shell",
        };
        self.unavailable(format!(
            "the sandbox runner could not confine {what} (it did not run): {}",
            output.trim()
        ))
    }

    /// Facts for a command under `policy` whose runner failed (in the background).
    pub fn runner_failed(&self, policy: &SandboxPolicy) -> SandboxInfo {
        SandboxInfo::new(policy.mode).with_verdict(SandboxVerdict::RunnerFailed)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Refuses every wrap the way an unusable runner does, and judges every exit a refusal.
    #[derive(Debug)]
    struct Refusing;

    impl Sandbox for Refusing {
        fn provider_name(&self) -> &'static str {
            "refusing"
        }
        fn capabilities(&self) -> SandboxCapabilities {
            SandboxCapabilities::default()
        }
        fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine> {
            if policy.mode.confines() {
                return Err(Error::invalid("a relative root"));
            }
            Ok(command)
        }
        fn classify(&self, policy: &SandboxPolicy, _: &ExitStatus, _: &str) -> SandboxInfo {
            SandboxInfo::new(policy.mode).with_verdict(SandboxVerdict::RunnerFailed)
        }
        fn release(&self, _: &CommandLine) {}
    }

    fn confinement(subject: ConfinedSubject) -> Confinement {
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/w");
        Confinement::new(std::sync::Arc::new(Refusing), policy, "caller", "run", subject)
    }

    #[test]
    fn a_refused_runner_is_reported_with_its_own_line() {
        let c = confinement(ConfinedSubject::Command);
        let line = "conch-sandbox: unavailable: landlock is not enabled in this kernel";
        let e = c.verdict(c.policy(), &ExitStatus::code(126), &format!("{line}\n"), true);
        let e = e.unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
        assert_eq!(e.provider(), "caller");
        assert!(e.message().ends_with(line), "{e}");
        assert!(e.message().contains("confine the command"), "{e}");
    }

    #[test]
    fn only_a_runner_put_in_front_can_have_refused() {
        let c = confinement(ConfinedSubject::Shell);
        let info = c.verdict(c.policy(), &ExitStatus::code(126), "x", false).unwrap();
        assert_eq!(info.verdict, SandboxVerdict::Clean);
    }

    #[test]
    fn any_wrap_error_is_sandbox_unavailable_in_the_callers_words() {
        let c = confinement(ConfinedSubject::Shell);
        let e = c.wrap(c.policy(), CommandLine::new(vec!["bash".into()])).unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxUnavailable);
        assert!(
            e.message().starts_with("refusing cannot run the shell under workspace-write"),
            "{e}"
        );
        let full = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/w");
        let w = c.wrap(&full, CommandLine::new(vec!["bash".into()])).unwrap();
        assert!(!w.runner, "passed through unchanged: no runner in front");
    }

    #[test]
    fn the_classifier_tail_is_cut_on_a_char_boundary() {
        let text = format!("é{}", "x".repeat(CLASSIFY_TAIL_BYTES - 1));
        assert_eq!(tail_utf8(&text, CLASSIFY_TAIL_BYTES).len(), CLASSIFY_TAIL_BYTES - 1);
        assert_eq!(tail_utf8("short", CLASSIFY_TAIL_BYTES), "short");
    }
}
