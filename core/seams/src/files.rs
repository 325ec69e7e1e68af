//! The files seam: the world's filesystem, in the world's own paths, under the world's policy.
//!
//! A relative path is resolved against [`Files::default_dir`]; every path a result carries is
//! absolute. Reads and writes move bytes in bounded chunks with caller-owned offsets, so a
//! 1 GiB file never sits whole in memory and a provider that crosses a network can resume a
//! cut transfer exactly. A sandboxed provider refuses what its confined shell could not do
//! with [`ErrorCode::SandboxDenied`](crate::ErrorCode::SandboxDenied), the message starting
//! with [`SANDBOX_MARKER`]; every other refusal has its own code (`not_found`,
//! `not_a_directory`, `is_a_directory`, `already_exists`, `permission_denied`, `too_large`,
//! `directory_not_empty`).

use std::fmt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::Result;

/// What a sandbox denial's message starts with: the first words of the marker a shell result
/// carries for a file denial ([`denial_marker`](crate::sandbox::denial_marker)`("file access",
/// mode)`, which goes on ` under <mode> mode]`).
pub const SANDBOX_MARKER: &str = "[sandbox: file access denied";

/// The most bytes one [`Files::read`] returns, whatever the caller asks.
pub const MAX_READ_CHUNK: usize = 8 << 20;

/// What a path names, without following a final symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (its target is in [`FileStat::symlink_target`]).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl FileKind {
    /// The stable spelling (`file`, `directory`, `symlink`, `other`).
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One filesystem object's facts (`lstat`: a symlink is described, not followed).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FileStat {
    /// The absolute path, as resolved against the default directory (not canonicalised).
    pub path: PathBuf,
    /// What it is.
    pub kind: FileKind,
    /// Its size in bytes (a symlink's is its target's length).
    pub size: u64,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Last modification, in milliseconds since the Unix epoch (negative before it).
    pub modified_ms: i64,
    /// A symlink's target, as written in the link.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub symlink_target: Option<PathBuf>,
}

impl FileStat {
    /// A stat for `path` of `kind`, `size` bytes, `mode`, modified at `modified_ms`.
    pub fn new(path: PathBuf, kind: FileKind, size: u64, mode: u32, modified_ms: i64) -> Self {
        Self { path, kind, size, mode, modified_ms, symlink_target: None }
    }

    /// Records a symlink's target.
    #[must_use]
    pub fn with_symlink_target(mut self, target: PathBuf) -> Self {
        self.symlink_target = Some(target);
        self
    }
}

/// One chunk of a file, read at a caller-owned offset.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileChunk {
    /// The bytes from the offset asked for (at most the bytes asked for and
    /// [`MAX_READ_CHUNK`]).
    pub data: Vec<u8>,
    /// The file's size when it was read.
    pub size: u64,
    /// True when `data` reaches the end of the file.
    pub eof: bool,
}

impl FileChunk {
    /// A chunk of `data` from a file of `size` bytes.
    pub fn new(data: Vec<u8>, size: u64, eof: bool) -> Self {
        Self { data, size, eof }
    }
}

/// What a write does with a file that exists (and one that does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum WriteMode {
    /// Create a new file; `already_exists` if the path exists.
    Create,
    /// Create the file or replace its content.
    Truncate,
    /// Create the file or add to its end.
    Append,
}

/// A write request: where, how and with which permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct WriteSpec {
    /// The file (relative paths are resolved against the default directory).
    pub path: PathBuf,
    /// Create, truncate or append.
    pub mode: WriteMode,
    /// Write to a temporary file beside the target and rename it over the target when the
    /// writer finishes, so readers see the old content or the new, never a mix; a writer
    /// dropped unfinished leaves the target as it was. Not with [`WriteMode::Append`].
    #[cfg_attr(feature = "serde", serde(default))]
    pub atomic: bool,
    /// Permission bits for a file this write creates (default `0o644`, less the umask where
    /// the world has one); an atomic replace keeps the replaced file's bits unless set.
    #[cfg_attr(feature = "serde", serde(default))]
    pub permissions: Option<u32>,
    /// Create missing parent directories.
    #[cfg_attr(feature = "serde", serde(default))]
    pub create_parents: bool,
}

impl WriteSpec {
    /// A write of `path` in `mode`: in place, default permissions, parents must exist.
    pub fn new(path: impl Into<PathBuf>, mode: WriteMode) -> Self {
        Self { path: path.into(), mode, atomic: false, permissions: None, create_parents: false }
    }

    /// Replaces atomically (see [`WriteSpec::atomic`]).
    #[must_use]
    pub fn atomic(mut self) -> Self {
        self.atomic = true;
        self
    }

    /// Sets the permission bits.
    #[must_use]
    pub fn with_permissions(mut self, bits: u32) -> Self {
        self.permissions = Some(bits);
        self
    }

    /// Creates missing parents.
    #[must_use]
    pub fn with_parents(mut self) -> Self {
        self.create_parents = true;
        self
    }
}

/// A directory listing request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ListSpec {
    /// The directory.
    pub path: PathBuf,
    /// How deep to go: 1 lists the directory's own entries, 2 their children too, and so
    /// on (0 is refused). Symlinked directories are listed, never entered.
    pub depth: u32,
    /// The most entries returned; the listing says when it stopped there.
    pub limit: usize,
}

impl ListSpec {
    /// The most entries a listing returns unless asked for fewer.
    pub const DEFAULT_LIMIT: usize = 10_000;

    /// The entries of `path`, one level deep, up to [`ListSpec::DEFAULT_LIMIT`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), depth: 1, limit: Self::DEFAULT_LIMIT }
    }

    /// Lists `depth` levels.
    #[must_use]
    pub fn with_depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }

    /// Returns at most `limit` entries.
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// A directory's entries, sorted by path (a directory before what it holds).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Listing {
    /// The entries (never the listed directory itself).
    pub entries: Vec<FileStat>,
    /// True when entries were left out because the limit was reached.
    pub truncated: bool,
}

impl Listing {
    /// A listing of `entries`.
    pub fn new(entries: Vec<FileStat>, truncated: bool) -> Self {
        Self { entries, truncated }
    }
}

/// What happened to a watched path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
pub enum WatchEvent {
    /// `path` was created.
    Created {
        /// The absolute path.
        path: PathBuf,
    },
    /// `path`'s content or metadata changed.
    Modified {
        /// The absolute path.
        path: PathBuf,
    },
    /// `path` was removed.
    Removed {
        /// The absolute path.
        path: PathBuf,
    },
    /// `from` was renamed to `to` (either is `None` when it lies outside the watch).
    Renamed {
        /// The old path, when it was inside the watch.
        from: Option<PathBuf>,
        /// The new path, when it is inside the watch.
        to: Option<PathBuf>,
    },
    /// Events were dropped (the consumer fell behind): rescan what matters.
    Overflow,
}

/// The bytes of a file being written, in order. Dropping a writer unfinished abandons it:
/// an atomic write leaves the target untouched; an in-place write keeps what was written.
#[async_trait]
pub trait FileWriter: Send + fmt::Debug {
    /// Appends `data` to what this writer has written.
    async fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Ends the write and returns the file's facts. An atomic write's temporary file is
    /// flushed to disk and then renamed over the target, so after a crash the target holds
    /// the old content or the new; an in-place write is left to the kernel's writeback, as
    /// `cp` and a shell redirection leave theirs.
    async fn finish(self: Box<Self>) -> Result<FileStat>;
}

/// A byte stream out of the world (a tar archive), in order; `None` after its last chunk.
#[async_trait]
pub trait ByteStream: Send + fmt::Debug {
    /// The next chunk, or `None` at the end.
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>>;
}

/// A tar archive being unpacked into the world. Dropping it unfinished stops the unpacking;
/// what was unpacked stays.
#[async_trait]
pub trait TarSink: Send + fmt::Debug {
    /// Feeds the next bytes of the archive.
    async fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Ends the archive (a truncated archive is an error) and returns how many entries were
    /// unpacked.
    async fn finish(self: Box<Self>) -> Result<u64>;
}

/// A directory watch's events, in order; `None` once the watch ended (its directory removed,
/// or the provider shut down).
#[async_trait]
pub trait WatchStream: Send + fmt::Debug {
    /// The next event.
    async fn next_event(&mut self) -> Result<Option<WatchEvent>>;
}

/// What a files provider can do here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FilesCapabilities {
    /// [`Files::watch`] works (otherwise it fails `unsupported`).
    pub watch: bool,
}

impl FilesCapabilities {
    /// Capabilities with `watch` set as given.
    pub fn new(watch: bool) -> Self {
        Self { watch }
    }
}

/// The world's filesystem.
///
/// Every method resolves a relative path against [`Files::default_dir`]. Nothing here
/// follows a symlink out of what the provider's policy allows: a sandboxed provider resolves
/// each path beneath its roots, at the moment of use.
#[async_trait]
pub trait Files: Send + Sync + fmt::Debug + 'static {
    /// The plugin name, for errors and logs.
    fn provider_name(&self) -> &'static str;

    /// What this provider can do.
    fn capabilities(&self) -> FilesCapabilities;

    /// The absolute directory relative paths are resolved against.
    fn default_dir(&self) -> &Path;

    /// Facts about `path`, without following a final symlink.
    async fn stat(&self, path: &Path) -> Result<FileStat>;

    /// Up to `max_bytes` (and at most [`MAX_READ_CHUNK`]) of the file at `path` from
    /// `offset` (symlinks followed). An offset at or past the end reads nothing, with `eof`.
    async fn read(&self, path: &Path, offset: u64, max_bytes: usize) -> Result<FileChunk>;

    /// Starts a write; the bytes go through the returned writer.
    async fn write(&self, spec: WriteSpec) -> Result<Box<dyn FileWriter>>;

    /// The entries under a directory.
    async fn list(&self, spec: ListSpec) -> Result<Listing>;

    /// Makes a directory (with its missing parents when `parents`; then an existing
    /// directory is no error).
    async fn make_dir(&self, path: &Path, parents: bool) -> Result<()>;

    /// Renames `from` to `to`; an existing `to` is replaced only when `overwrite` (a
    /// directory only by an empty one's rules, as `rename(2)` has them).
    async fn rename(&self, from: &Path, to: &Path, overwrite: bool) -> Result<()>;

    /// Removes a file, symlink (not its target) or empty directory; a directory with
    /// content only when `recursive`.
    async fn remove(&self, path: &Path, recursive: bool) -> Result<()>;

    /// A tar archive of the tree at `path` (symlinks stored as links, never followed).
    async fn export_tar(&self, path: &Path) -> Result<Box<dyn ByteStream>>;

    /// Unpacks a tar archive into the directory `path` (made when missing). Every entry
    /// lands beneath `path`: absolute names and `..` are refused, and no entry is written
    /// through a symlink.
    async fn import_tar(&self, path: &Path) -> Result<Box<dyn TarSink>>;

    /// Watches a directory (its subdirectories too when `recursive`); `unsupported` when
    /// [`FilesCapabilities::watch`] is false.
    async fn watch(&self, path: &Path, recursive: bool) -> Result<Box<dyn WatchStream>>;
}

/// Writes all of `data` to `spec`'s file: one writer, one finish.
pub async fn write_all(files: &dyn Files, spec: WriteSpec, data: &[u8]) -> Result<FileStat> {
    let mut writer = files.write(spec).await?;
    for chunk in data.chunks(MAX_READ_CHUNK) {
        writer.write(chunk).await?;
    }
    writer.finish().await
}

/// Reads the whole file at `path`, refusing with `too_large` past `limit` bytes.
pub async fn read_all(files: &dyn Files, path: &Path, limit: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let chunk = files.read(path, out.len() as u64, MAX_READ_CHUNK).await?;
        if chunk.size > limit || (out.len() + chunk.data.len()) as u64 > limit {
            return Err(crate::Error::new(
                crate::ErrorCode::TooLarge,
                format!("{} is {} bytes, more than {limit}", path.display(), chunk.size),
            ));
        }
        out.extend_from_slice(&chunk.data);
        if chunk.eof || chunk.data.is_empty() {
            return Ok(out);
        }
    }
}
