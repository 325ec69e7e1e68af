//! `sandbox-landlock`: confines a command with the `sandbox-exec` helper (Landlock +
//! seccomp, see [`crate::exec`]) in front of its exact argv.
//!
//! At build it asks the helper (`sandbox-exec --probe`) once what it can enforce here.

use std::path::PathBuf;
use std::sync::Arc;

use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{
    CommandLine, Denial, Enforcement, Error, ErrorCode, ExitStatus, Result, Sandbox,
    SandboxCapabilities, SandboxInfo, SandboxMode, SandboxPolicy, SandboxVerdict,
};
use serde::Deserialize;

use crate::exec::{Runner, SUBCOMMAND, landlock_abi};

/// Plugin name.
pub const LANDLOCK_NAME: &str = "sandbox-landlock";

/// `sandbox-landlock` config.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LandlockConfig {
    /// A binary implementing the `sandbox-exec` subcommand (absolute); empty: the running
    /// executable (the `conch` binary).
    pub helper: PathBuf,
    /// Where each command's private `TMPDIR` is made (absolute; empty: the system temp
    /// directory). `conch e2b --api-key` puts it in the hidden sandboxes directory.
    pub tmp_dir: PathBuf,
}

impl PluginConfig for LandlockConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        validate_tmp_dir(&self.tmp_dir)?;
        validate_helper(&self.helper)
    }
}

pub(crate) fn validate_tmp_dir(dir: &std::path::Path) -> std::result::Result<(), ConfigIssue> {
    if !dir.as_os_str().is_empty() && !dir.is_absolute() {
        return Err(ConfigIssue::new("tmp_dir", "must be an absolute path"));
    }
    Ok(())
}

pub(crate) fn validate_helper(helper: &std::path::Path) -> std::result::Result<(), ConfigIssue> {
    if !helper.as_os_str().is_empty() && !helper.is_absolute() {
        return Err(ConfigIssue::new("helper", "must be an absolute path"));
    }
    Ok(())
}

/// The helper path a config names, or the running executable.
pub(crate) fn resolve_helper(helper: &std::path::Path) -> Result<PathBuf> {
    if !helper.as_os_str().is_empty() {
        return Ok(helper.to_path_buf());
    }
    std::env::current_exe().map_err(|e| {
        Error::new(
            ErrorCode::SandboxUnavailable,
            format!("cannot find the running executable for the sandbox helper: {e}"),
        )
    })
}

/// The Landlock runner.
#[derive(Debug)]
pub struct LandlockSandbox {
    helper: PathBuf,
    /// The kernel's ABI, or why there is no Landlock (probed once at build).
    abi: std::result::Result<i32, String>,
    /// Why the helper cannot build its read-only mount layer here (`None`: it can).
    mount_layer: Option<String>,
    /// Each confined command's private TMPDIR.
    tmp: crate::tmp::PrivateTmp,
}

impl LandlockSandbox {
    /// A runner using `helper` (a binary with the `sandbox-exec` subcommand); probes the
    /// kernel now, and asks the helper whether it can build its mount layer (user and
    /// kernel permitting: the answer differs between root, a user with user namespaces
    /// and a container without either).
    pub fn new(helper: PathBuf) -> Self {
        let abi = landlock_abi();
        let mount_layer = if abi.is_ok() { probe_mount_layer(&helper) } else { None };
        Self { helper, abi, mount_layer, tmp: crate::tmp::PrivateTmp::default() }
    }

    /// Makes each command's private `TMPDIR` in `dir` (empty: the system temp directory).
    #[must_use]
    pub fn with_tmp_dir(mut self, dir: PathBuf) -> Self {
        self.tmp = crate::tmp::PrivateTmp::in_dir(dir);
        self
    }

    fn enforcement(&self) -> Enforcement {
        match (&self.abi, &self.mount_layer) {
            (Ok(abi), None) => Enforcement::new(format!(
                "landlock ABI {abi} + seccomp + read-only mount namespace"
            )),
            (Ok(abi), Some(why)) => {
                Enforcement::new(format!("landlock ABI {abi} + seccomp")).without_mount_layer(why)
            }
            (Err(_), _) => Enforcement::new("none (no landlock)"),
        }
    }
}

/// Runs `helper sandbox-exec --probe`; `Some(why)` when the mount layer is unavailable.
fn probe_mount_layer(helper: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new(helper)
        .args([SUBCOMMAND, crate::exec::PROBE])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let report = out.map_err(|e| e.to_string()).and_then(|o| {
        serde_json::from_slice::<crate::exec::ProbeReport>(&o.stdout).map_err(|e| e.to_string())
    });
    match report {
        Ok(r) => r.mount_layer_unavailable,
        Err(e) => Some(format!("the helper {} did not answer its probe: {e}", helper.display())),
    }
}

/// The helper command line:
/// `[helper, sandbox-exec, --policy, json, --runner, r, (--cover, socket)*, --, argv...]`.
pub(crate) fn helper_argv(
    helper: &std::path::Path,
    runner: Runner,
    policy: &SandboxPolicy,
    cover: &[std::path::PathBuf],
    argv: &[String],
) -> Result<Vec<String>> {
    let json = serde_json::to_string(policy)
        .map_err(|e| Error::new(ErrorCode::Internal, format!("policy does not serialise: {e}")))?;
    let mut out = vec![
        helper.to_string_lossy().into_owned(),
        SUBCOMMAND.to_string(),
        "--policy".into(),
        json,
        "--runner".into(),
        runner.as_str().into(),
    ];
    for sock in cover {
        out.extend(["--cover".into(), sock.to_string_lossy().into_owned()]);
    }
    out.push("--".into());
    out.extend(argv.iter().cloned());
    Ok(out)
}

/// Rejects relative roots and an empty argv.
pub(crate) fn check(policy: &SandboxPolicy, command: &CommandLine) -> Result<()> {
    if command.argv.is_empty() {
        return Err(Error::new(ErrorCode::InvalidArgument, "empty argv"));
    }
    for p in policy.writable().iter().chain(&policy.read_only_paths) {
        if !p.is_absolute() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("sandbox path {} is not absolute", p.display()),
            ));
        }
    }
    Ok(())
}

impl Sandbox for LandlockSandbox {
    fn provider_name(&self) -> &'static str {
        LANDLOCK_NAME
    }

    fn capabilities(&self) -> SandboxCapabilities {
        let mut caps = SandboxCapabilities::default();
        caps.modes = vec![SandboxMode::DangerFullAccess];
        if let Ok(abi) = self.abi {
            caps.modes.extend([SandboxMode::ReadOnly, SandboxMode::WorkspaceWrite]);
            // TCP rules need ABI 4; the seccomp socket filter covers the rest.
            caps.network_control = abi >= 4;
            caps.signal_scoping = abi >= 6;
        }
        caps.pid_isolation = false;
        caps.enforcement = self.enforcement();
        caps
    }

    fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine> {
        if !policy.mode.confines() {
            return Ok(command);
        }
        check(policy, &command)?;
        if let Err(why) = &self.abi {
            return Err(Error::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "{LANDLOCK_NAME}: {why}; use sandbox-bwrap or run on a kernel with landlock"
                ),
            )
            .with_provider(LANDLOCK_NAME));
        }
        if policy.network {
            // Allowed network needs nothing; off needs TCP rules (ABI 4).
        } else if self.abi.as_ref().is_ok_and(|abi| *abi < 4) {
            return Err(Error::new(
                ErrorCode::SandboxUnavailable,
                format!("{LANDLOCK_NAME}: this kernel's landlock cannot deny TCP (ABI 4 needed); use sandbox-bwrap"),
            )
            .with_provider(LANDLOCK_NAME));
        }
        let mut command = command;
        if self.mount_layer.is_none() {
            crate::mounts::create_missing_hooks(&policy.read_only_paths);
        }
        let policy = self.tmp.give(LANDLOCK_NAME, policy, &mut command)?;
        let argv = helper_argv(&self.helper, Runner::Landlock, &policy, &[], &command.argv)?;
        Ok(CommandLine::new(argv).with_cwd(command.cwd).with_env(command.env))
    }

    fn classify(
        &self,
        policy: &SandboxPolicy,
        exit: &ExitStatus,
        output_tail: &str,
    ) -> SandboxInfo {
        classify(policy, exit, output_tail, &self.enforcement())
    }

    fn release(&self, wrapped: &CommandLine) {
        self.tmp.release(wrapped);
    }
}

/// The classifier both runners share: a non-zero exit with a permission-style message in
/// the output tail is a denial; the helper's own `unavailable` line is a runner failure.
pub(crate) fn classify(
    policy: &SandboxPolicy,
    exit: &ExitStatus,
    output_tail: &str,
    enforcement: &Enforcement,
) -> SandboxInfo {
    let mut info = SandboxInfo::new(policy.mode);
    if !policy.mode.confines() {
        return info;
    }
    info.enforcement = Some(enforcement.clone());
    if exit.code == Some(0) {
        return info;
    }
    if exit.code == Some(crate::exec::UNAVAILABLE)
        && output_tail.contains(&format!("{} unavailable:", crate::exec::MARKER))
    {
        return info.with_verdict(SandboxVerdict::RunnerFailed);
    }
    let network = [
        "Network is unreachable",
        "Address family not supported",
        "Could not resolve host",
        "Temporary failure in name resolution",
        "Connection refused",
    ];
    // EBUSY: renaming a read-only bind's mount point (bwrap); EXDEV: Landlock refuses a
    // link or rename that would widen a file's rights. "Access to the path" is how .NET
    // (PowerShell's cmdlets) words an EACCES.
    let file = [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
        "Device or resource busy",
        "Invalid cross-device link",
        "Access to the path",
    ];
    let has = |needles: &[&str]| needles.iter().any(|n| output_tail.contains(n));
    // "Permission denied"/"Operation not permitted" from connect/bind are network denials
    // (Landlock answers a TCP connect with EACCES); tools usually name the operation.
    let lower = output_tail.to_ascii_lowercase();
    let connect_denied = has(&file)
        && ["connect", "socket", "bind", "/dev/tcp", "/dev/udp", "network", "sendto"]
            .iter()
            .any(|w| lower.contains(w));
    // With the network allowed, a refused or unreachable connection is the world's answer,
    // not the sandbox's.
    if !policy.network && (has(&network) || connect_denied) {
        info.with_verdict(SandboxVerdict::Denied(Some(Denial::Network)))
    } else if has(&file) {
        info.with_verdict(SandboxVerdict::Denied(Some(Denial::File)))
    } else {
        info
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: LandlockConfig = ctx.config()?;
    let helper = resolve_helper(&config.helper)?;
    let runner = LandlockSandbox::new(helper).with_tmp_dir(config.tmp_dir);
    Ok(PluginOutput::seam(SeamHandle::Sandbox(Arc::new(runner))))
}

register_plugin!(PluginEntry {
    name: LANDLOCK_NAME,
    provides: Some(SeamId::Sandbox),
    requires: &[],
    description: "confines commands with Landlock + seccomp through the `sandbox-exec` helper",
    build,
});

#[cfg(test)]
mod tests {
    use conch_seams::{Enforcement, ExitStatus, SandboxMode, SandboxPolicy};

    use super::classify;

    #[test]
    fn only_the_runners_exit_with_its_marker_counts_as_a_runner_failure() {
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/w");
        let out = "conch-sandbox: unavailable: landlock is not enabled in this kernel\n";
        let info = classify(
            &policy,
            &ExitStatus::code(crate::exec::UNAVAILABLE),
            out,
            &Enforcement::new("x"),
        );
        assert!(info.runner_failed() && !info.denied(), "{info:?}");
        // A command's own 126 (a file that is not executable) is data, not a runner failure.
        let own = "bash: ./x: Permission denied\n";
        assert!(
            !classify(&policy, &ExitStatus::code(126), own, &Enforcement::new("x")).runner_failed()
        );
        assert!(
            !classify(&policy, &ExitStatus::code(1), out, &Enforcement::new("x")).runner_failed()
        );
    }

    #[test]
    fn a_denial_in_powershells_words_is_a_file_denial() {
        // What Set-Content prints for EACCES (an UnauthorizedAccessException), exit 1.
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, "/w");
        let out = "Set-Content: Access to the path '/etc/conch-x' is denied.\n";
        let info = classify(&policy, &ExitStatus::code(1), out, &Enforcement::new("x"));
        assert!(info.denied() && info.denial() == Some(conch_seams::Denial::File), "{info:?}");
        assert!(
            !classify(&policy, &ExitStatus::code(0), out, &Enforcement::new("x")).denied(),
            "recovered: no mark"
        );
    }
}
