//! A private `TMPDIR` for each command a runner confines in workspace-write mode.
//!
//! Tools write temporary files (`mktemp`, compilers, package managers) wherever `TMPDIR`
//! points, and the shared `/tmp` is not writable in the sandbox unless it is a root. Making
//! it writable would let a command plant files other users' programs read; instead every
//! wrapped command gets a fresh 0700 directory of its own, added to its policy as one more
//! writable root and named in its `TMPDIR`.
//!
//! The directories live under one 0700 parent per runner, made by the first wrap. A
//! command's directory is removed when its caller releases it (`Sandbox::release`, through
//! the `conch_confine::SandboxRelease` the shell and terminal providers hold while the command,
//! background process or session may run), and the parent with whatever is left when the runner is
//! dropped (the runtime's teardown). Read-only mode gets none: there nothing is writable
//! but the terminal.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use conch_seams::{CommandLine, Error, ErrorCode, Result, SandboxMode, SandboxPolicy};
use conch_sync::LockExt;

/// One runner's private temporary directories.
#[derive(Debug, Default)]
pub(crate) struct PrivateTmp {
    /// Where the parent is made (`None`: the system temp directory).
    base: Option<PathBuf>,
    parent: Mutex<Option<PathBuf>>,
    next: AtomicU64,
}

impl PrivateTmp {
    /// Private directories whose parent is made in `base` (empty: the system temp directory).
    pub(crate) fn in_dir(base: PathBuf) -> Self {
        let base = (!base.as_os_str().is_empty()).then_some(base);
        Self { base, parent: Mutex::new(None), next: AtomicU64::new(0) }
    }
}

impl PrivateTmp {
    /// For a workspace-write `policy`: makes a fresh directory, adds it to the policy as a
    /// writable root and points `command`'s `TMPDIR` at it. Other modes pass through.
    pub(crate) fn give(
        &self,
        provider: &'static str,
        policy: &SandboxPolicy,
        command: &mut CommandLine,
    ) -> Result<SandboxPolicy> {
        if policy.mode != SandboxMode::WorkspaceWrite {
            return Ok(policy.clone());
        }
        let failed = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorCode::SandboxUnavailable,
                format!("{provider}: cannot make the command's private TMPDIR ({what}): {e}"),
            )
            .with_provider(provider)
        };
        let parent = {
            let mut guard = self.parent.locked();
            match &*guard {
                Some(p) => p.clone(),
                None => {
                    let base = self.base.clone().unwrap_or_else(std::env::temp_dir);
                    let p = make_parent(&base).map_err(|e| failed("its parent directory", e))?;
                    *guard = Some(p.clone());
                    p
                }
            }
        };
        let dir = parent.join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
        private_dir(&dir).map_err(|e| failed(&dir.display().to_string(), e))?;
        command.env.insert("TMPDIR".into(), Some(dir.to_string_lossy().into_owned()));
        Ok(policy.clone().with_writable_root(dir))
    }
}

impl PrivateTmp {
    /// Removes the private TMPDIR `wrapped` was given, if it is one of this runner's (the
    /// command has finished; see `Sandbox::release`).
    pub(crate) fn release(&self, wrapped: &CommandLine) {
        let Some(Some(dir)) = wrapped.env.get("TMPDIR") else { return };
        let dir = PathBuf::from(dir);
        let parent = self.parent.locked().clone();
        if parent.is_some_and(|p| dir.parent() == Some(p.as_path())) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if let Some(p) = self.parent.locked().take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// A 0700 directory that did not exist before (never an existing one another user made).
fn private_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

fn make_parent(base: &std::path::Path) -> std::io::Result<PathBuf> {
    let pid = std::process::id();
    let mut last = None;
    for attempt in 0..16u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = base.join(format!("conch-sandbox-tmp-{pid}-{nanos:x}{attempt}"));
        match private_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no name")))
}
