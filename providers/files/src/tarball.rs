//! Tar out and tar in, streamed: each runs on a blocking thread of its own that meets the
//! caller through a bounded channel ([`CHANNEL_DEPTH`] chunks of at most [`CHUNK`] bytes), so
//! neither archive is ever whole in memory.
//!
//! Export walks the tree in sorted order and appends each entry under its path relative to
//! the exported directory; symlinks are stored as links, never followed.
//!
//! Import never calls the `tar` crate's unpack: it reads each entry and makes it itself.
//! 1. The destination is made (checked like any `make_dir`) and opened, and every entry is
//!    then placed relative to that descriptor.
//! 2. A name with a root, a prefix or any `..` component is refused; `.` components are
//!    dropped, and the destination's own entry (`./`) is skipped.
//! 3. Each parent is walked one component at a time with `openat2(RESOLVE_BENEATH |
//!    RESOLVE_NO_SYMLINKS)`, made when missing: an entry below a symlink (one an earlier entry
//!    made, or one that was there) is refused, so nothing is written through a symlink.
//! 4. Under a policy every made entry and directory is checked against the read-only paths.
//! 5. Files are made fresh (an existing file or symlink in the way is unlinked first, then
//!    `O_CREAT | O_EXCL | O_NOFOLLOW`), so a hard link in the way is replaced, not written
//!    through; directories' modes are applied last, deepest first, so a read-only directory
//!    does not stop its own content; symlinks are made with their target as data.
//!
//! Hard links, devices and FIFOs are refused. An archive that ends without its end-of-archive
//! block is reported as truncated.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use conch_seams::files::{ByteStream, TarSink};
use conch_seams::{Error, ErrorCode, Result};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};
use tokio::sync::mpsc;

use crate::guard::{Intent, Loc, sys};
use crate::ops::Fs;

/// The most bytes one chunk of an exported archive holds.
pub(crate) const CHUNK: usize = 256 << 10;

/// How many chunks wait in a channel at most.
pub(crate) const CHANNEL_DEPTH: usize = 8;

fn join_error(provider: &'static str, op: &'static str, e: &tokio::task::JoinError) -> Error {
    Error::new(ErrorCode::Internal, format!("{op}: its blocking thread failed: {e}"))
        .with_provider(provider)
        .with_operation(op)
}

/// Writes the archive into the channel in chunks of [`CHUNK`].
struct ChanWriter {
    tx: mpsc::Sender<Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl ChanWriter {
    fn push(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the archive's reader left"))
    }
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.push()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

/// An exported archive's chunks, as the thread makes them.
#[derive(Debug)]
pub(crate) struct TarOut {
    rx: mpsc::Receiver<Result<Vec<u8>>>,
}

#[async_trait]
impl ByteStream for TarOut {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        self.rx.recv().await.transpose()
    }
}

/// Starts exporting `path` (a directory's tree, or one file).
/// A hidden directory in the tree is archived empty, a hidden file not at all.
pub(crate) async fn export(
    provider: &'static str,
    path: PathBuf,
    hidden: Option<crate::guard::Hidden>,
) -> Result<TarOut> {
    let p = path.clone();
    let meta = crate::run_blocking(provider, "export_tar", move || {
        std::fs::symlink_metadata(&p).map_err(|e| Error::fs("export_tar", &p, e))
    })
    .await?;
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    tokio::task::spawn_blocking(move || {
        let failed = tx.clone();
        let mut builder = tar::Builder::new(ChanWriter { tx, buf: Vec::with_capacity(CHUNK) });
        builder.follow_symlinks(false);
        let result = (|| {
            if meta.is_dir() {
                append_tree(&mut builder, &path, Path::new(""), hidden.as_ref())?;
            } else {
                let name = path.file_name().map(PathBuf::from).unwrap_or_default();
                builder.append_path_with_name(&path, name).map_err(|e| (path.clone(), e))?;
            }
            let mut w = builder.into_inner().map_err(|e| (path.clone(), e))?;
            w.flush().map_err(|e| (path.clone(), e))
        })();
        if let Err((at, e)) = result
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let err = Error::fs("export_tar", &at, e)
                .with_provider(provider)
                .with_operation("export_tar");
            let _ = failed.blocking_send(Err(err));
        }
    });
    Ok(TarOut { rx })
}

fn append_tree(
    builder: &mut tar::Builder<ChanWriter>,
    dir: &Path,
    rel: &Path,
    hidden: Option<&crate::guard::Hidden>,
) -> std::result::Result<(), (PathBuf, io::Error)> {
    let mut names: Vec<OsString> = std::fs::read_dir(dir)
        .and_then(|it| it.map(|e| e.map(|e| e.file_name())).collect())
        .map_err(|e| (dir.to_owned(), e))?;
    names.sort();
    let resolved = hidden.and_then(|_| std::fs::canonicalize(dir).ok());
    for name in names {
        let (full, name_rel) = (dir.join(&name), rel.join(&name));
        let Ok(m) = std::fs::symlink_metadata(&full) else { continue };
        let is_hidden = hidden.is_some_and(|h| h.hides_in(resolved.as_deref(), &name));
        if is_hidden && !m.is_dir() {
            continue;
        }
        builder.append_path_with_name(&full, &name_rel).map_err(|e| (full.clone(), e))?;
        if m.is_dir() && !is_hidden {
            append_tree(builder, &full, &name_rel, hidden)?;
        }
    }
    Ok(())
}

/// Reads the archive from the channel; remembers whether it reached the end of the input.
struct ChanReader {
    rx: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    at: usize,
    ended: bool,
}

impl Read for ChanReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at >= self.pending.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.pending = chunk;
                    self.at = 0;
                }
                None => {
                    self.ended = true;
                    return Ok(0);
                }
            }
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// An archive being unpacked by its thread.
#[derive(Debug)]
pub(crate) struct TarIn {
    provider: &'static str,
    tx: Option<mpsc::Sender<Vec<u8>>>,
    task: Option<tokio::task::JoinHandle<Result<u64>>>,
}

impl TarIn {
    async fn outcome(&mut self) -> Result<u64> {
        self.tx = None;
        match self.task.take() {
            Some(task) => match task.await {
                Ok(r) => r.map_err(|e| e.with_provider(self.provider).with_operation("import_tar")),
                Err(e) => Err(join_error(self.provider, "import_tar", &e)),
            },
            None => Err(Error::new(ErrorCode::Internal, "import_tar: the unpacking already ended")
                .with_provider(self.provider)),
        }
    }
}

#[async_trait]
impl TarSink for TarIn {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(data.to_vec()).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The thread stopped reading: it failed, and says why.
        match self.outcome().await {
            Err(e) => Err(e),
            Ok(_) => {
                Err(Error::new(ErrorCode::InvalidArgument, "import_tar: data after the archive")
                    .with_provider(self.provider))
            }
        }
    }

    async fn finish(mut self: Box<Self>) -> Result<u64> {
        self.outcome().await
    }
}

/// Starts unpacking into `dest` (made when missing).
pub(crate) async fn import(provider: &'static str, fs: Arc<Fs>, dest: PathBuf) -> Result<TarIn> {
    let f = Arc::clone(&fs);
    let d = dest.clone();
    let root = crate::run_blocking(provider, "import_tar", move || f.open_dest(&d)).await?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(CHANNEL_DEPTH);
    let task = tokio::task::spawn_blocking(move || {
        let mut reader = ChanReader { rx, pending: Vec::new(), at: 0, ended: false };
        let result = unpack(&fs, &root, &dest, &mut reader);
        if result.is_ok() {
            // What follows the end-of-archive blocks is padding: read it so the sender
            // never fails for it.
            let mut sink = [0u8; 4096];
            while reader.read(&mut sink).is_ok_and(|n| n > 0) {}
        }
        result
    });
    Ok(TarIn { provider, tx: Some(tx), task: Some(task) })
}

fn refused(entry: &Path, why: &str) -> Error {
    Error::new(
        ErrorCode::InvalidArgument,
        format!("import_tar: entry {} refused: {why}", entry.display()),
    )
}

fn unpack(fs: &Fs, root: &OwnedFd, dest: &Path, reader: &mut ChanReader) -> Result<u64> {
    let mut archive = tar::Archive::new(&mut *reader);
    let mut count = 0u64;
    let mut dir_modes: Vec<(Vec<OsString>, u32)> = Vec::new();
    let entries = archive.entries().map_err(|e| Error::fs("import_tar", dest, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::fs("import_tar", dest, e))?;
        let raw = PathBuf::from(OsStr::from_bytes(&entry.path_bytes()));
        let mut parts = Vec::new();
        for c in raw.components() {
            match c {
                Component::Normal(n) => parts.push(n.to_owned()),
                Component::CurDir => {}
                Component::ParentDir => return Err(refused(&raw, "it has a `..` component")),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(refused(&raw, "its name is absolute"));
                }
            }
        }
        let Some((name, parents)) = parts.split_last() else { continue };
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        let target = dest.join(parts.iter().collect::<PathBuf>());
        let dir = walk_dirs(fs, root, dest, parents, &raw)?;
        let loc = Loc { dir, name: name.clone(), path: target.clone() };
        if let Some(g) = &fs.guard {
            g.check_read_only("import_tar", &loc, Intent::Write)?;
        }
        let existing = fstatat(&loc.dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|s| s.st_mode & libc::S_IFMT);
        let clear = |what: &str| -> Result<()> {
            match existing {
                Some(libc::S_IFDIR) => Err(sys(what, &target, Errno::EISDIR)),
                Some(_) => unlinkat(&loc.dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| sys(what, &target, e)),
                None => Ok(()),
            }
        };
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                clear("import_tar")?;
                let fd = openat(
                    &loc.dir,
                    name.as_os_str(),
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|e| sys("import_tar", &target, e))?;
                let mut file = File::from(fd);
                io::copy(&mut entry, &mut file).map_err(|e| Error::fs("import_tar", &target, e))?;
                fchmod(&file, Mode::from_bits_truncate(mode))
                    .map_err(|e| sys("import_tar", &target, e))?;
            }
            tar::EntryType::Directory => {
                match existing {
                    Some(libc::S_IFDIR) => {}
                    Some(_) => return Err(sys("import_tar", &target, Errno::EEXIST)),
                    None => mkdirat(&loc.dir, name.as_os_str(), Mode::from_bits_truncate(0o700))
                        .map_err(|e| sys("import_tar", &target, e))?,
                }
                dir_modes.push((parts.clone(), mode));
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| refused(&raw, "a symlink without a target"))?;
                clear("import_tar")?;
                symlinkat(OsStr::from_bytes(&link), &loc.dir, name.as_os_str())
                    .map_err(|e| sys("import_tar", &target, e))?;
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(refused(
                    &raw,
                    &format!("{other:?} entries are not unpacked (only files, dirs, symlinks)"),
                ));
            }
        }
        count += 1;
    }

    if reader.ended_early() {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "import_tar {}: the archive is truncated (no end-of-archive block)",
                dest.display()
            ),
        ));
    }
    // Deepest first, so a directory made read-only does not stop its own content's modes.
    dir_modes.sort_by_key(|d| std::cmp::Reverse(d.0.len()));
    for (parts, mode) in dir_modes {
        let rel: PathBuf = parts.iter().collect();
        let path = dest.join(&rel);
        let fd = beneath(root, &rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(|e| sys("import_tar", &path, e))?;
        fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| sys("import_tar", &path, e))?;
    }
    Ok(count)
}

impl ChanReader {
    /// True when the input ended before the archive's end block was read.
    fn ended_early(&self) -> bool {
        self.ended
    }
}

/// Opens `rel` beneath `dir`, refusing every symlink on the way.
fn beneath(dir: &OwnedFd, rel: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    crate::guard::openat2_retrying(dir, rel, how)
}

/// Opens (making what is missing) the directories `parents` beneath `root`, one at a time,
/// never through a symlink.
fn walk_dirs(
    fs: &Fs,
    root: &OwnedFd,
    dest: &Path,
    parents: &[OsString],
    raw: &Path,
) -> Result<OwnedFd> {
    let mut cur = beneath(root, Path::new("."), OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map_err(|e| sys("import_tar", dest, e))?;
    let mut at = dest.to_owned();
    for part in parents {
        at.push(part);
        let opened = match beneath(&cur, Path::new(part), OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Err(Errno::ENOENT) => {
                let loc = Loc { dir: cur, name: part.clone(), path: at.clone() };
                if let Some(g) = &fs.guard {
                    g.check_read_only("import_tar", &loc, Intent::Write)?;
                }
                match mkdirat(&loc.dir, part.as_os_str(), Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(sys("import_tar", &at, e)),
                }
                cur = loc.dir;
                beneath(&cur, Path::new(part), OFlag::O_PATH | OFlag::O_DIRECTORY)
            }
            other => other,
        };
        cur = match opened {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::EXDEV) => {
                return Err(refused(raw, &format!("{} is a symlink", at.display())));
            }
            Err(e) => return Err(sys("import_tar", &at, e)),
        };
    }
    Ok(cur)
}
