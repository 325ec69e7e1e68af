//! How the shell executors and `terminal-bash` confine what they spawn: one protocol over the
//! `Sandbox` seam, so both wrap, report and judge a confined command the same way.
//!
//! [`Confinement`] binds a sandbox to its caller's default policy, wraps a command line, reports
//! what cannot run confined as `sandbox_unavailable` (never running it unconfined instead), and
//! judges whether a runner refused; [`SandboxRelease`] calls [`Sandbox::release`] exactly once
//! per wrapped command. The seam's contract stays in `conch-seams`; this is mechanism.

use std::sync::Arc;

use conch_output::tail_utf8;
use conch_seams::{
    CommandLine, Error, ErrorCode, ExitStatus, Result, Sandbox, SandboxInfo, SandboxPolicy,
    SandboxVerdict,
};

/// Calls [`Sandbox::release`] for one wrapped command when dropped: hold it as long as the
/// command (a one-shot run, a background process, a terminal session) may still run.
#[derive(Debug)]
pub struct SandboxRelease {
    sandbox: Arc<dyn Sandbox>,
    wrapped: CommandLine,
}

impl SandboxRelease {
    /// Releases `wrapped` through `sandbox` on drop.
    pub fn new(sandbox: Arc<dyn Sandbox>, wrapped: CommandLine) -> Self {
        Self { sandbox, wrapped }
    }
}

impl Drop for SandboxRelease {
    fn drop(&mut self) {
        self.sandbox.release(&self.wrapped);
    }
}

/// How much of a command's output tail a sandbox classifier sees (cut on a char boundary).
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
    sandbox: Arc<dyn Sandbox>,
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
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
        provider: &'static str,
        operation: &'static str,
        subject: ConfinedSubject,
    ) -> Self {
        Self { sandbox, policy, provider, operation, subject }
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
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
        let release = SandboxRelease::new(Arc::clone(&self.sandbox), command.clone());
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

#[cfg(test)]
mod tests;
