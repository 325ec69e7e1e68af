//! `sandbox-bwrap`: confines a command with bubblewrap (mount, pid and network namespaces),
//! with the `sandbox-exec` helper chained inside for what bubblewrap leaves open.
//!
//! The wrapped command line is
//! `bwrap --die-with-parent --unshare-pid [--unshare-net] --cap-drop ALL --ro-bind / /
//! --dev /dev --proc /proc (--bind R R)* (--ro-bind P P)* [--chdir cwd] --
//! <helper> sandbox-exec --policy <json> --runner bwrap -- argv...`:
//!
//! - `/` read-only, each writable root bound writable, each directory between a root and a
//!   read-only path bound onto itself, then each existing read-only path bound read-only
//!   (a mount point cannot be renamed or removed, so `.git` and `.git/hooks` cannot be
//!   swapped out for fresh writable ones);
//! - a fresh `/dev` (no raw disks) and a `/proc` of the new pid namespace (conch's and other
//!   processes' `/proc/<pid>/environ` are not there);
//! - `--unshare-pid --die-with-parent`: when the command's init exits or conch dies,
//!   everything in the namespace is killed, `setsid`/`nohup` daemons included;
//! - `--unshare-net` without network: only a private loopback exists;
//! - each pathname unix socket bound outside the roots when the command is wrapped is passed
//!   to the helper (`--cover`), which covers it with `/dev/null` in a mount namespace of
//!   its own (see `mounts.rs` for the limits of that snapshot);
//! - `--cap-drop ALL` (as root `--cap-add CAP_SETPCAP` too, so that the helper can clear the
//!   bounding set before it drops that last capability); bubblewrap itself sets
//!   `no_new_privs`;
//! - the helper inside closes inherited descriptors above 2 (bubblewrap passes them on),
//!   leaves the caller's session (not `--new-session`, which would also take a sandboxed
//!   terminal's controlling PTY away; see `exec::leave_callers_session`), drops
//!   capabilities again and applies Landlock and seccomp as a second layer (FIFOs on
//!   read-only binds, signal scoping, no `chown`/xattr writes).
//!
//! `/tmp` stays the host's, read-only: a command that needs a scratch directory gets one by
//! making it a writable root (the policy's `writable_roots`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::{
    CommandLine, Enforcement, Error, ErrorCode, ExitStatus, Result, Sandbox, SandboxCapabilities,
    SandboxInfo, SandboxMode, SandboxPolicy, SandboxVerdict,
};
use serde::Deserialize;

use crate::exec::Runner;
use crate::landlock::{check, classify, helper_argv, resolve_helper, validate_helper};

/// Plugin name.
pub const BWRAP_NAME: &str = "sandbox-bwrap";

/// `sandbox-bwrap` config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BwrapConfig {
    /// The bubblewrap binary: a path, or a name looked up on PATH when built.
    pub bwrap: PathBuf,
    /// A binary implementing the `sandbox-exec` subcommand (absolute); empty: the running
    /// executable (the `conch` binary).
    pub helper: PathBuf,
    /// Where each command's private `TMPDIR` is made (absolute; empty: the system temp
    /// directory). `conch e2b --api-key` puts it in the hidden sandboxes directory.
    pub tmp_dir: PathBuf,
}

impl Default for BwrapConfig {
    fn default() -> Self {
        Self { bwrap: PathBuf::from("bwrap"), helper: PathBuf::new(), tmp_dir: PathBuf::new() }
    }
}

impl PluginConfig for BwrapConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if self.bwrap.as_os_str().is_empty() {
            return Err(ConfigIssue::new("bwrap", "must name the bubblewrap binary"));
        }
        crate::landlock::validate_tmp_dir(&self.tmp_dir)?;
        validate_helper(&self.helper)
    }
}

/// The bubblewrap runner.
#[derive(Debug)]
pub struct BwrapSandbox {
    helper: PathBuf,
    /// The resolved bwrap binary, or why it cannot be used (probed once at build).
    bwrap: std::result::Result<PathBuf, String>,
    /// Each confined command's private TMPDIR.
    tmp: crate::tmp::PrivateTmp,
}

/// The namespace and capability flags every wrapped command gets (also what the probe
/// starts, so a build on a machine that blocks them reports it).
const BASE_FLAGS: &[&str] = &["--die-with-parent", "--unshare-pid", "--cap-drop", "ALL"];

/// As root, bubblewrap's `--cap-drop ALL` empties the capability sets but leaves the
/// bounding set (it relies on securebits), and without `CAP_SETPCAP` the helper cannot clear
/// it. Keeping `CAP_SETPCAP` for the helper lets it clear the bounding set, and
/// `CAP_SYS_ADMIN` lets it make the mount namespace in which it covers unix sockets; it
/// drops both before anything untrusted runs. (Not as root, bubblewrap's user namespace
/// leaves the helper none, and it covers the sockets in a nested user namespace.)
const ROOT_FLAGS: &[&str] = &["--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_SYS_ADMIN"];

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn flags() -> Vec<&'static str> {
    let mut out = BASE_FLAGS.to_vec();
    if running_as_root() {
        out.extend(ROOT_FLAGS);
    }
    out
}

impl BwrapSandbox {
    /// A runner using `bwrap` (a path or a name on PATH) and `helper`; checks now that
    /// bubblewrap can start a sandbox here.
    pub fn new(bwrap: &Path, helper: PathBuf) -> Self {
        Self { helper, bwrap: probe(bwrap), tmp: crate::tmp::PrivateTmp::default() }
    }

    /// Makes each command's private `TMPDIR` in `dir` (empty: the system temp directory).
    #[must_use]
    pub fn with_tmp_dir(mut self, dir: PathBuf) -> Self {
        self.tmp = crate::tmp::PrivateTmp::in_dir(dir);
        self
    }
}

fn resolve(bwrap: &Path) -> Option<PathBuf> {
    if bwrap.components().count() > 1 {
        return bwrap.is_file().then(|| bwrap.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bwrap)).find(|p| p.is_file())
}

fn probe(bwrap: &Path) -> std::result::Result<PathBuf, String> {
    let Some(path) = resolve(bwrap) else {
        return Err(format!(
            "bubblewrap ({}) is not installed; install bubblewrap (apt-get install bubblewrap)",
            bwrap.display()
        ));
    };
    let out = std::process::Command::new(&path)
        .args(flags())
        .args([
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(path),
        Ok(o) => Err(format!(
            "{} cannot create a sandbox here ({}); allow unprivileged user namespaces \
             (sysctl kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0) or run as root",
            path.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!(
            "{} cannot be started: {e}; install bubblewrap (apt-get install bubblewrap)",
            path.display()
        )),
    }
}

impl Sandbox for BwrapSandbox {
    fn provider_name(&self) -> &'static str {
        BWRAP_NAME
    }

    fn capabilities(&self) -> SandboxCapabilities {
        let mut caps = SandboxCapabilities::default();
        caps.modes = vec![SandboxMode::DangerFullAccess];
        match &self.bwrap {
            Ok(_) => {
                caps.modes.extend([SandboxMode::ReadOnly, SandboxMode::WorkspaceWrite]);
                caps.network_control = true;
                caps.pid_isolation = true;
                caps.signal_scoping = true;
                caps.enforcement =
                    Enforcement::new("bubblewrap namespaces + landlock/seccomp helper");
            }
            Err(why) => caps.enforcement = Enforcement::new(format!("none ({why})")),
        }
        caps
    }

    fn wrap(&self, policy: &SandboxPolicy, command: CommandLine) -> Result<CommandLine> {
        if !policy.mode.confines() {
            return Ok(command);
        }
        check(policy, &command)?;
        let bwrap = self.bwrap.as_ref().map_err(|why| {
            Error::new(ErrorCode::SandboxUnavailable, format!("{BWRAP_NAME}: {why}"))
                .with_provider(BWRAP_NAME)
        })?;
        let mut command = command;
        crate::mounts::create_missing_hooks(&policy.read_only_paths);
        let policy = &self.tmp.give(BWRAP_NAME, policy, &mut command)?;
        let mut argv: Vec<String> = vec![bwrap.to_string_lossy().into_owned()];
        argv.extend(flags().into_iter().map(String::from));
        if !policy.network {
            argv.push("--unshare-net".into());
        }
        let bind = |argv: &mut Vec<String>, flag: &str, p: &Path| {
            let p = p.to_string_lossy().into_owned();
            argv.extend([flag.to_string(), p.clone(), p]);
        };
        argv.extend(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"].map(String::from));
        // Covered before the roots are bound, so a root beneath a hidden path is bound back
        // into the cover (bwrap makes its mount point there).
        let covers = hidden_covers(&policy.hidden_paths)?;
        for (path, is_dir) in &covers {
            if *is_dir {
                argv.extend(["--tmpfs".to_string(), path.to_string_lossy().into_owned()]);
            } else {
                argv.extend(["--ro-bind".to_string(), "/dev/null".to_string()]);
                argv.push(path.to_string_lossy().into_owned());
            }
        }
        for root in policy.writable() {
            // A missing root cannot be bound; it would stop bwrap (and the command) entirely.
            if root.exists() {
                bind(&mut argv, "--bind", &root);
            }
        }
        let writable = policy.writable();
        let points = crate::mounts::read_only_points(&writable, &policy.read_only_paths);
        let protected: Vec<&PathBuf> = points.mount.iter().collect();
        // Each directory between a root and a read-only path becomes a mount point of its
        // own (bound writable onto itself): a mount point cannot be renamed or removed, so
        // `mv .git .git-old && mkdir -p .git/hooks` cannot swap a fresh `.git` in.
        let mut ancestors: Vec<&Path> = Vec::new();
        for p in &protected {
            for a in p.ancestors().skip(1) {
                let under_root = writable.iter().any(|r| a.starts_with(r) && a != r.as_path());
                if under_root && !ancestors.contains(&a) {
                    ancestors.push(a);
                }
            }
        }
        ancestors.sort_by_key(|a| a.components().count());
        for a in ancestors {
            if a.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                bind(&mut argv, "--bind", a);
            }
        }
        for p in protected {
            bind(&mut argv, "--ro-bind", p);
        }
        // The pathname unix sockets bound now outside the roots (a docker.sock): a read-only
        // bind does not stop a connect, so the helper covers them with /dev/null inside (a
        // bwrap bind would fail the whole command if one vanished before bwrap ran, and
        // without network the sandbox's /proc lists none of the host's). `/dev` and `/proc`
        // are fresh in the sandbox.
        let cover: Vec<PathBuf> = crate::mounts::unix_sockets()
            .into_iter()
            .filter(|s| !s.starts_with("/dev") && !s.starts_with("/proc"))
            .filter(|s| !writable.iter().any(|r| s.starts_with(r)))
            .collect();
        for (path, is_dir) in &covers {
            if *is_dir {
                argv.extend(["--remount-ro".to_string(), path.to_string_lossy().into_owned()]);
            }
        }
        if let Some(cwd) = &command.cwd {
            argv.extend(["--chdir".to_string(), cwd.to_string_lossy().into_owned()]);
        }
        argv.push("--".into());
        argv.extend(helper_argv(&self.helper, Runner::Bwrap, policy, &cover, &command.argv)?);
        Ok(CommandLine::new(argv).with_cwd(command.cwd).with_env(command.env))
    }

    fn classify(
        &self,
        policy: &SandboxPolicy,
        exit: &ExitStatus,
        output_tail: &str,
    ) -> SandboxInfo {
        let info = classify(policy, exit, output_tail, &Enforcement::new("bubblewrap"));
        // bwrap reports its own setup failures as `bwrap: ...` with exit 1.
        if policy.mode.confines() && exit.code == Some(1) && output_tail.starts_with("bwrap: ") {
            return info.with_verdict(SandboxVerdict::RunnerFailed);
        }
        info
    }

    fn release(&self, wrapped: &CommandLine) {
        self.tmp.release(wrapped);
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BwrapConfig = ctx.config()?;
    let helper = resolve_helper(&config.helper)?;
    let runner = BwrapSandbox::new(&config.bwrap, helper).with_tmp_dir(config.tmp_dir);
    Ok(PluginOutput::seam(SeamHandle::Sandbox(Arc::new(runner))))
}

register_plugin!(PluginEntry {
    name: BWRAP_NAME,
    provides: Some(SeamId::Sandbox),
    requires: &[],
    description: "confines commands with bubblewrap namespaces and the `sandbox-exec` helper inside",
    build,
});

/// The existing hidden paths as they resolve now, each with whether it is a directory (an
/// empty tmpfs covers it) or not (`/dev/null` does). A missing one hides nothing.
fn hidden_covers(hidden: &[PathBuf]) -> Result<Vec<(PathBuf, bool)>> {
    let mut out = Vec::new();
    for h in hidden {
        match std::fs::canonicalize(h).and_then(|c| Ok((std::fs::metadata(&c)?.is_dir(), c))) {
            Ok((is_dir, c)) => out.push((c, is_dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::new(
                    ErrorCode::SandboxUnavailable,
                    format!("{BWRAP_NAME}: cannot resolve the hidden path {}: {e}", h.display()),
                )
                .with_provider(BWRAP_NAME));
            }
        }
    }
    Ok(out)
}
