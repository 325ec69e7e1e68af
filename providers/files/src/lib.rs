//! The files seam over the host filesystem: `files-local` (unconfined) and `files-sandbox`
//! (every write held to the composition's sandbox policy). One implementation serves both; the
//! local provider is the sandboxed one without a guard (`guard.rs`), and so is `files-sandbox`
//! in danger-full-access mode.
//!
//! Every operation's syscalls run on tokio's blocking pool ([`spawn_blocking`]), never on the
//! runtime's worker threads (a dropped atomic writer's cleanup too, when a runtime is there);
//! tar out and tar in each run on a blocking thread of their own that meets the caller through
//! a bounded channel, so no archive is ever whole in memory; a watch runs on an inotify
//! thread of its own.
//!
//! - Reads (`stat`, `read`, `list`, `export_tar`, `watch`) are allowed everywhere the
//!   confined shell reads: everywhere but the policy's hidden paths (`guard.rs`).
//! - Writes (`write` and its atomic temp file, `make_dir`, both ends of `rename`, `remove`,
//!   every `import_tar` entry) go through `guard::locate`, which under a policy resolves the
//!   parent beneath a writable root with `openat2` and checks read-only paths by identity at
//!   the moment of use; the operation then acts on that directory descriptor. See
//!   `guard.rs` for the steps and the holes.
//! - An atomic write goes to an unguessable temp file in the target's directory, is fsynced
//!   and renamed over the target on finish; dropped unfinished, the temp file is removed.
//!
//! Linux only (`openat2`, `renameat2`, inotify): elsewhere the crate is empty.
//!
//! [`spawn_blocking`]: tokio::task::spawn_blocking

#![cfg(target_os = "linux")]

mod guard;
mod ops;
mod tarball;
mod watch;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use conch_registry::{
    BuildContext, ConfigIssue, PluginConfig, PluginEntry, PluginOutput, SeamHandle, SeamId,
    register_plugin,
};
use conch_seams::files::{
    ByteStream, FileChunk, FileStat, FileWriter, Files, FilesCapabilities, ListSpec, Listing,
    TarSink, WatchStream, WriteSpec,
};
use conch_seams::{Error, ErrorCode, Result, SandboxPolicy};
use serde::Deserialize;

use crate::guard::Guard;
use crate::ops::{Atomic, Fs, Opened};

/// Plugin name of the unconfined provider.
pub const LOCAL_NAME: &str = "files-local";

/// Plugin name of the provider confined by the composition's sandbox policy.
pub const SANDBOX_NAME: &str = "files-sandbox";

/// Config of both plugins.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// The directory relative paths start from (absolute). Empty: the process's working
    /// directory at build for `files-local`, the policy's workspace root for `files-sandbox`.
    pub root: PathBuf,
}

impl PluginConfig for FilesConfig {
    fn validate(&self) -> std::result::Result<(), ConfigIssue> {
        if !self.root.as_os_str().is_empty() && !self.root.is_absolute() {
            return Err(ConfigIssue::new("root", "must be an absolute path"));
        }
        Ok(())
    }
}

/// The host filesystem as a [`Files`] provider, with or without a sandbox policy.
#[derive(Debug, Clone)]
pub struct HostFiles {
    name: &'static str,
    fs: Arc<Fs>,
}

impl HostFiles {
    /// `files-local`: unconfined, relative paths against `default_dir` (absolute).
    pub fn local(default_dir: impl Into<PathBuf>) -> Self {
        Self { name: LOCAL_NAME, fs: Arc::new(Fs { default_dir: default_dir.into(), guard: None }) }
    }

    /// `files-sandbox`: writes held to `policy` (danger-full-access holds nothing).
    pub fn sandboxed(default_dir: impl Into<PathBuf>, policy: &SandboxPolicy) -> Self {
        Self {
            name: SANDBOX_NAME,
            fs: Arc::new(Fs { default_dir: default_dir.into(), guard: Guard::for_policy(policy) }),
        }
    }

    /// Runs `f` on the blocking pool, naming this provider and `op` in its error.
    async fn blocking<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Fs) -> Result<T> + Send + 'static,
    {
        let fs = Arc::clone(&self.fs);
        run_blocking(self.name, op, move || f(&fs)).await
    }
}

/// Runs `f` on tokio's blocking pool; its error names `provider` and `op`.
pub(crate) async fn run_blocking<T, F>(provider: &'static str, op: &'static str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.with_provider(provider).with_operation(op)),
        Err(e) => {
            Err(Error::new(ErrorCode::Internal, format!("{op}: its blocking task failed: {e}"))
                .with_provider(provider)
                .with_operation(op))
        }
    }
}

#[async_trait]
impl Files for HostFiles {
    fn provider_name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> FilesCapabilities {
        FilesCapabilities::new(true)
    }

    fn default_dir(&self) -> &Path {
        &self.fs.default_dir
    }

    async fn stat(&self, path: &Path) -> Result<FileStat> {
        let path = self.fs.abs(path);
        self.blocking("stat", move |fs| fs.stat(&path)).await
    }

    async fn read(&self, path: &Path, offset: u64, max_bytes: usize) -> Result<FileChunk> {
        let path = self.fs.abs(path);
        self.blocking("read", move |fs| fs.read(&path, offset, max_bytes)).await
    }

    async fn write(&self, spec: WriteSpec) -> Result<Box<dyn FileWriter>> {
        let path = self.fs.abs(&spec.path);
        let opened = self
            .blocking("write", move |fs| {
                fs.open_write(&path, spec.mode, spec.atomic, spec.permissions, spec.create_parents)
            })
            .await?;
        let Opened { file, path, atomic } = opened;
        Ok(Box::new(HostWriter {
            provider: self.name,
            file: Arc::new(file),
            path,
            atomic,
            buf: Vec::new(),
        }))
    }

    async fn list(&self, spec: ListSpec) -> Result<Listing> {
        let path = self.fs.abs(&spec.path);
        self.blocking("list", move |fs| fs.list(&spec, &path)).await
    }

    async fn make_dir(&self, path: &Path, parents: bool) -> Result<()> {
        let path = self.fs.abs(path);
        self.blocking("make_dir", move |fs| fs.make_dir(&path, parents)).await
    }

    async fn rename(&self, from: &Path, to: &Path, overwrite: bool) -> Result<()> {
        let (from, to) = (self.fs.abs(from), self.fs.abs(to));
        self.blocking("rename", move |fs| fs.rename(&from, &to, overwrite)).await
    }

    async fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        let path = self.fs.abs(path);
        self.blocking("remove", move |fs| fs.remove(&path, recursive)).await
    }

    async fn export_tar(&self, path: &Path) -> Result<Box<dyn ByteStream>> {
        let path = self.fs.abs(path);
        self.fs.visible("export_tar", &path, false)?;
        let stream = tarball::export(self.name, path, self.fs.hidden()).await?;
        Ok(Box::new(stream))
    }

    async fn import_tar(&self, path: &Path) -> Result<Box<dyn TarSink>> {
        let path = self.fs.abs(path);
        let sink = tarball::import(self.name, Arc::clone(&self.fs), path).await?;
        Ok(Box::new(sink))
    }

    async fn watch(&self, path: &Path, recursive: bool) -> Result<Box<dyn WatchStream>> {
        let path = self.fs.abs(path);
        self.fs.visible("watch", &path, true)?;
        let stream = watch::watch(self.name, path, recursive, self.fs.hidden()).await?;
        Ok(Box::new(stream))
    }
}

/// A write in progress: the open file (or atomic temp file) and where it goes.
#[derive(Debug)]
struct HostWriter {
    provider: &'static str,
    file: Arc<File>,
    path: PathBuf,
    /// Taken on finish; still here on drop means abandoned.
    atomic: Option<Atomic>,
    /// The staging buffer each chunk is copied into for the blocking write.
    buf: Vec<u8>,
}

#[async_trait]
impl FileWriter for HostWriter {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        // One buffer for the writer's life: a fresh allocation per chunk costs a page fault
        // per page of it (large allocations come fresh from mmap), more than the copy.
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(data);
        let (file, path) = (Arc::clone(&self.file), self.path.clone());
        let (buf, written) = run_blocking(self.provider, "write", move || {
            let r = (&*file).write_all(&buf).map_err(|e| Error::fs("write", &path, e));
            Ok((buf, r))
        })
        .await?;
        self.buf = buf;
        written
    }

    async fn finish(mut self: Box<Self>) -> Result<FileStat> {
        let (file, path, atomic) = (Arc::clone(&self.file), self.path.clone(), self.atomic.take());
        run_blocking(self.provider, "write", move || {
            // In place, the data is left to writeback, as `cp` leaves it (see
            // `FileWriter::finish`).
            if let Some(a) = &atomic {
                Fs::finish_atomic(&file, a, &path)?;
            }
            let m = file.metadata().map_err(|e| Error::fs("write", &path, e))?;
            Ok(ops::stat_of(&path, &m))
        })
        .await
    }
}

impl Drop for HostWriter {
    fn drop(&mut self) {
        let Some(a) = self.atomic.take() else { return };
        // An abandoned atomic write: remove its temp file, off the runtime's threads when
        // there is a runtime.
        let unlink = move || {
            let _ = nix::unistd::unlinkat(
                &a.loc.dir,
                a.temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(unlink)),
            Err(_) => unlink(),
        }
    }
}

fn build_local(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: FilesConfig = ctx.config()?;
    let root = if config.root.as_os_str().is_empty() {
        std::env::current_dir().map_err(|e| {
            ctx.locate(Error::new(
                ErrorCode::Io,
                format!("{LOCAL_NAME}: cannot read the working directory for `root`: {e}"),
            ))
        })?
    } else {
        config.root
    };
    Ok(PluginOutput::seam(SeamHandle::Files(Arc::new(HostFiles::local(root)))))
}

register_plugin!(PluginEntry {
    name: LOCAL_NAME,
    provides: Some(SeamId::Files),
    requires: &[],
    description: "the host filesystem, unconfined (watch through inotify)",
    build: build_local,
});

fn build_sandbox(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: FilesConfig = ctx.config()?;
    let policy = ctx.sandbox_policy().ok_or_else(|| {
        ctx.locate(Error::new(
            ErrorCode::SeamUnbound,
            format!("{SANDBOX_NAME} needs the composition's `sandbox-policy` entry"),
        ))
    })?;
    let root = if config.root.as_os_str().is_empty() {
        policy.workspace_root.clone()
    } else {
        config.root
    };
    Ok(PluginOutput::seam(SeamHandle::Files(Arc::new(HostFiles::sandboxed(root, &policy)))))
}

register_plugin!(PluginEntry {
    name: SANDBOX_NAME,
    provides: Some(SeamId::Files),
    requires: &[],
    description: "the host filesystem, writes held to the composition's sandbox policy",
    build: build_sandbox,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

#[cfg(test)]
mod tests {
    use super::*;
    use conch_seams::files::{read_all, write_all};
    use conch_seams::{SandboxMode, WriteMode};

    #[tokio::test]
    async fn a_written_file_reads_back_and_a_sandbox_write_outside_is_denied() {
        let dir = tempfile::tempdir().unwrap();
        let local = HostFiles::local(dir.path());
        write_all(&local, WriteSpec::new("a.txt", WriteMode::Create), b"hello").await.unwrap();
        assert_eq!(read_all(&local, Path::new("a.txt"), 100).await.unwrap(), b"hello");

        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &ws);
        let sandboxed = HostFiles::sandboxed(&ws, &policy);
        write_all(&sandboxed, WriteSpec::new("in.txt", WriteMode::Create), b"x").await.unwrap();
        let err = write_all(&sandboxed, WriteSpec::new("../out.txt", WriteMode::Create), b"x")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::SandboxDenied, "{err}");
        assert!(err.message().starts_with(conch_seams::files::SANDBOX_MARKER), "{err}");
        assert!(!dir.path().join("out.txt").exists());
    }

    #[tokio::test]
    async fn a_fifo_is_refused_at_once_instead_of_blocking_a_thread() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = HostFiles::local(dir.path()).read(&fifo, 0, 10).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }
}
