//! The blocking half of every operation: plain syscalls, run on tokio's blocking pool by the
//! async front in `lib.rs`, never on the runtime's worker threads.
//!
//! Reads (stat, read, list) go through the host's own path resolution: a sandboxed provider
//! reads everywhere, as its confined shell does. Every write first becomes a checked
//! [`Loc`](crate::guard::Loc) and then acts through `*at` calls on its directory descriptor,
//! never following a final symlink where that would change what is written (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`). A write to an existing symlink is redirected to the link's target,
//! which is located and checked again like any other path (at most [`MAX_HOPS`] times).

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use conch_seams::files::{FileChunk, FileKind, FileStat, ListSpec, Listing, MAX_READ_CHUNK};
use conch_seams::{Error, ErrorCode, Result, WriteMode};
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, readlinkat, renameat, renameat2};
use nix::sys::stat::{Mode, fchmod, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::guard::{Guard, Hidden, Intent, Loc, OpenDir, is_dir, locate, sys};

/// How many symlinks a write follows before it gives up (as the kernel's `ELOOP`).
pub(crate) const MAX_HOPS: usize = 40;

/// The permission bits a created file gets unless the request sets them.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o644;

/// The filesystem as one provider sees it: where relative paths start and what confines
/// writes.
#[derive(Debug)]
pub(crate) struct Fs {
    pub default_dir: PathBuf,
    pub guard: Option<Guard>,
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

fn modified_ms(m: &std::fs::Metadata) -> i64 {
    m.mtime().saturating_mul(1000).saturating_add(m.mtime_nsec() / 1_000_000)
}

/// A [`FileStat`] from metadata already taken (`lstat` or `fstat`).
pub(crate) fn stat_of(path: &Path, m: &std::fs::Metadata) -> FileStat {
    let stat = FileStat::new(
        path.to_owned(),
        kind_of(m.file_type()),
        m.len(),
        m.permissions().mode() & 0o7777,
        modified_ms(m),
    );
    if m.file_type().is_symlink()
        && let Ok(target) = std::fs::read_link(path)
    {
        return stat.with_symlink_target(target);
    }
    stat
}

fn file_kind_at(dir: &OwnedFd, name: &OsStr) -> Option<u32> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok().map(|s| s.st_mode & libc::S_IFMT)
}

/// An open write target: the file, and for an atomic write where it goes on finish.
#[derive(Debug)]
pub(crate) struct Opened {
    pub file: File,
    pub path: PathBuf,
    pub atomic: Option<Atomic>,
}

/// An atomic write's temporary file and target, in one held directory.
#[derive(Debug)]
pub(crate) struct Atomic {
    pub loc: Loc,
    pub temp: String,
    /// Bits to set before the rename (the replaced file's, or the request's).
    pub mode: Option<u32>,
    /// Refuse to replace an existing target (create mode).
    pub no_replace: bool,
}

impl Fs {
    /// `path` made absolute against the default directory.
    pub(crate) fn abs(&self, path: &Path) -> PathBuf {
        if path.is_absolute() { path.to_owned() } else { self.default_dir.join(path) }
    }

    fn locate(&self, what: &str, path: &Path, intent: Intent) -> Result<Loc> {
        locate(self.guard.as_ref(), what, path, intent)
    }

    /// Denies a read of a hidden path (see `guard.rs`).
    pub(crate) fn visible(&self, what: &str, path: &Path, follow: bool) -> Result<()> {
        self.guard.as_ref().map_or(Ok(()), |g| g.check_visible(what, path, follow))
    }

    /// The guard and the checked resolution of `path` a read compares its file with, when
    /// something is hidden; a hidden path is denied.
    fn resolve_visible(
        &self,
        what: &str,
        path: &Path,
        follow: bool,
    ) -> Result<Option<(&Guard, PathBuf)>> {
        let Some(g) = &self.guard else { return Ok(None) };
        Ok(g.resolve_visible(what, path, follow)?.map(|r| (g, r)))
    }

    /// The hidden paths a walk must not descend into, as they resolve now.
    pub(crate) fn hidden(&self) -> Option<Hidden> {
        self.guard.as_ref().and_then(Guard::hidden)
    }

    pub(crate) fn stat(&self, path: &Path) -> Result<FileStat> {
        let checked = self.resolve_visible("stat", path, false)?;
        let m = std::fs::symlink_metadata(path).map_err(|e| Error::fs("stat", path, e))?;
        if let Some((g, resolved)) = &checked {
            g.check_opened("stat", path, resolved, &m, false)?;
        }
        Ok(stat_of(path, &m))
    }

    pub(crate) fn read(&self, path: &Path, offset: u64, max: usize) -> Result<FileChunk> {
        let checked = self.resolve_visible("read", path, true)?;
        // Non-blocking, so a FIFO cannot hold a blocking thread until a writer comes.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::fs("read", path, e))?;
        let m = file.metadata().map_err(|e| Error::fs("read", path, e))?;
        if let Some((g, resolved)) = &checked {
            g.check_opened("read", path, resolved, &m, true)?;
            // The host's devices (a console's screen, a disk) are the server's, not what the
            // confined command sees in its own `/dev`.
            let device = m.file_type().is_char_device() || m.file_type().is_block_device();
            if device && !is_harmless_device(&m) {
                return Err(crate::guard::denied(
                    g.mode(),
                    "read",
                    path,
                    "a device file is not read through the file tools",
                ));
            }
        }
        if m.is_dir() {
            return Err(Error::fs(
                "read",
                path,
                std::io::Error::from(std::io::ErrorKind::IsADirectory),
            ));
        }
        if m.file_type().is_fifo() || m.file_type().is_socket() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("read {}: not a regular file (a FIFO or socket)", path.display()),
            ));
        }
        let size = m.len();
        let want = max.min(MAX_READ_CHUNK);
        let mut data = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match file.read_at(&mut data[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::fs("read", path, e)),
            }
        }
        data.truncate(got);
        // A file that grew while it was read is at its end when the read came up short.
        let eof = offset + got as u64 >= size || got < want;
        Ok(FileChunk::new(data, size.max(offset + got as u64), eof))
    }

    pub(crate) fn list(&self, spec: &ListSpec, path: &Path) -> Result<Listing> {
        if spec.depth == 0 {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("list {}: depth must be at least 1", path.display()),
            ));
        }
        let mut entries = Vec::new();
        if let (Some(g), Some(hidden)) = (&self.guard, self.hidden()) {
            // By descriptor from a checked, symlink-free resolution (a file there fails its
            // `O_DIRECTORY` open as `not_a_directory`): a directory swapped for a symlink into
            // a hidden path during the walk is never followed.
            let top = g.open_dir_checked("list", path)?;
            let truncated = walk_at(&top, path, spec.depth, spec.limit, &hidden, &mut entries)?;
            return Ok(Listing::new(entries, truncated));
        }
        let m = std::fs::metadata(path).map_err(|e| Error::fs("list", path, e))?;
        if !m.is_dir() {
            return Err(Error::fs(
                "list",
                path,
                std::io::Error::from(std::io::ErrorKind::NotADirectory),
            ));
        }
        let truncated = walk(path, spec.depth, spec.limit, &mut entries)?;
        Ok(Listing::new(entries, truncated))
    }

    /// Opens a write: checks, follows an existing final symlink to its target, and opens the
    /// file (or, atomic, a fresh temporary file beside it).
    pub(crate) fn open_write(
        &self,
        path: &Path,
        mode: WriteMode,
        atomic: bool,
        permissions: Option<u32>,
        parents: bool,
    ) -> Result<Opened> {
        if atomic && mode == WriteMode::Append {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("write {}: an append cannot be atomic", path.display()),
            ));
        }
        if let Some(bits) = permissions
            && bits > 0o7777
        {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("write {}: permissions {bits:o} are more than 0o7777", path.display()),
            ));
        }
        let mut path = path.to_owned();
        if parents && let Some(parent) = path.parent() {
            self.make_dir(parent, true)?;
        }
        let mut hops = 0;
        let loc = loop {
            let loc = self.locate("write", &path, Intent::Write)?;
            if mode == WriteMode::Create || file_kind_at(&loc.dir, &loc.name) != Some(libc::S_IFLNK)
            {
                break loc;
            }
            hops += 1;
            if hops > MAX_HOPS {
                return Err(sys("write", &path, Errno::ELOOP));
            }
            let target =
                readlinkat(&loc.dir, loc.name.as_os_str()).map_err(|e| sys("write", &path, e))?;
            path = match path.parent() {
                Some(parent) => parent.join(target),
                None => PathBuf::from(target),
            };
        };
        let existing = fstatat(&loc.dir, loc.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        if atomic {
            if let Some(st) = &existing {
                if mode == WriteMode::Create {
                    return Err(sys("write", &path, Errno::EEXIST));
                }
                if is_dir(st) {
                    return Err(sys("write", &path, Errno::EISDIR));
                }
            }
            let temp = format!(
                ".{}.{}.conch-tmp",
                loc.name.to_string_lossy(),
                conch_nonce::random_hex::<8>()
            );
            let fd = openat(
                &loc.dir,
                temp.as_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(DEFAULT_FILE_MODE),
            )
            .map_err(|e| sys("write", &path, e))?;
            let keep = existing.map(|st| st.st_mode & 0o7777);
            return Ok(Opened {
                file: File::from(fd),
                path: path.clone(),
                atomic: Some(Atomic {
                    loc,
                    temp,
                    mode: permissions.or(keep),
                    no_replace: mode == WriteMode::Create,
                }),
            });
        }
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        flags |= match mode {
            WriteMode::Create => OFlag::O_EXCL,
            WriteMode::Truncate => OFlag::O_TRUNC,
            WriteMode::Append => OFlag::O_APPEND,
        };
        let fd = openat(
            &loc.dir,
            loc.name.as_os_str(),
            flags,
            Mode::from_bits_truncate(permissions.unwrap_or(DEFAULT_FILE_MODE)),
        )
        .map_err(|e| sys("write", &path, e))?;
        if existing.is_none()
            && let Some(bits) = permissions
        {
            // Exact bits asked for, whatever the umask took away.
            fchmod(fd.as_fd(), Mode::from_bits_truncate(bits))
                .map_err(|e| sys("write", &path, e))?;
        }
        Ok(Opened { file: File::from(fd), path, atomic: None })
    }

    pub(crate) fn make_dir(&self, path: &Path, parents: bool) -> Result<()> {
        if !parents {
            let loc = self.locate("make_dir", path, Intent::Write)?;
            return mkdirat(&loc.dir, loc.name.as_os_str(), Mode::from_bits_truncate(0o777))
                .map_err(|e| sys("make_dir", path, e));
        }
        // Each missing level is made through its own checked location, top down.
        let levels: Vec<&Path> = path.ancestors().collect();
        for level in levels.into_iter().rev() {
            if level.parent().is_none() || std::fs::metadata(level).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let loc = self.locate("make_dir", level, Intent::Write)?;
            match mkdirat(&loc.dir, loc.name.as_os_str(), Mode::from_bits_truncate(0o777)) {
                Ok(()) => {}
                Err(Errno::EEXIST)
                    if fstatat(&loc.dir, loc.name.as_os_str(), AtFlags::empty())
                        .is_ok_and(|s| is_dir(&s)) => {}
                Err(Errno::EEXIST) => return Err(sys("make_dir", level, Errno::ENOTDIR)),
                Err(e) => return Err(sys("make_dir", level, e)),
            }
        }
        Ok(())
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path, overwrite: bool) -> Result<()> {
        let a = self.locate("rename", from, Intent::Destroy)?;
        let b = self.locate("rename", to, Intent::Destroy)?;
        let flags = if overwrite { RenameFlags::empty() } else { RenameFlags::RENAME_NOREPLACE };
        match renameat2(&a.dir, a.name.as_os_str(), &b.dir, b.name.as_os_str(), flags) {
            Ok(()) => Ok(()),
            // A filesystem without RENAME_NOREPLACE: check, then rename (a race remains there).
            Err(Errno::EINVAL) if !overwrite => {
                if file_kind_at(&b.dir, &b.name).is_some() {
                    return Err(sys("rename", to, Errno::EEXIST));
                }
                renameat(&a.dir, a.name.as_os_str(), &b.dir, b.name.as_os_str())
                    .map_err(|e| sys("rename", from, e))
            }
            Err(e @ (Errno::EEXIST | Errno::ENOTEMPTY)) => Err(sys("rename", to, e)),
            Err(e) => Err(sys("rename", from, e)),
        }
    }

    pub(crate) fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        let loc = self.locate("remove", path, Intent::Destroy)?;
        match file_kind_at(&loc.dir, &loc.name) {
            None => Err(sys("remove", path, Errno::ENOENT)),
            Some(libc::S_IFDIR) if recursive => remove_tree(&loc.dir, &loc.name, path),
            Some(libc::S_IFDIR) => {
                unlinkat(&loc.dir, loc.name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .map_err(|e| sys("remove", path, e))
            }
            Some(_) => unlinkat(&loc.dir, loc.name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                .map_err(|e| sys("remove", path, e)),
        }
    }

    /// Makes `dest` (with its parents) and opens it for an import, checked like a `make_dir`;
    /// under a policy never through a final symlink.
    pub(crate) fn open_dest(&self, dest: &Path) -> Result<OwnedFd> {
        self.make_dir(dest, true)?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        if self.guard.is_none() {
            return nix::fcntl::open(dest, flags, Mode::empty())
                .map_err(|e| sys("import_tar", dest, e));
        }
        let loc = self.locate("import_tar", dest, Intent::Write)?;
        openat(&loc.dir, loc.name.as_os_str(), flags | OFlag::O_NOFOLLOW, Mode::empty())
            .map_err(|e| sys("import_tar", dest, e))
    }

    /// Makes a temp file the target: fsync, bits, rename (never replacing in create mode).
    pub(crate) fn finish_atomic(file: &File, a: &Atomic, path: &Path) -> Result<()> {
        file.sync_all().map_err(|e| Error::fs("write", path, e))?;
        if let Some(bits) = a.mode {
            fchmod(file.as_fd(), Mode::from_bits_truncate(bits))
                .map_err(|e| sys("write", path, e))?;
        }
        let flags = if a.no_replace { RenameFlags::RENAME_NOREPLACE } else { RenameFlags::empty() };
        let renamed =
            renameat2(&a.loc.dir, a.temp.as_str(), &a.loc.dir, a.loc.name.as_os_str(), flags);
        let renamed = match renamed {
            Err(Errno::EINVAL) if a.no_replace => {
                // No RENAME_NOREPLACE here: a hard link never replaces, then drop the temp name.
                nix::unistd::linkat(
                    &a.loc.dir,
                    a.temp.as_str(),
                    &a.loc.dir,
                    a.loc.name.as_os_str(),
                    AtFlags::empty(),
                )
                .and_then(|()| unlinkat(&a.loc.dir, a.temp.as_str(), UnlinkatFlags::NoRemoveDir))
            }
            other => other,
        };
        if let Err(e) = renamed {
            let _ = unlinkat(&a.loc.dir, a.temp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(sys("write", path, e));
        }
        Ok(())
    }
}

/// `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random` and `/dev/urandom` (by device number:
/// major 1, minors 3, 5, 7, 8 and 9), which hold nothing of anyone's.
fn is_harmless_device(m: &std::fs::Metadata) -> bool {
    let rdev = m.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    m.file_type().is_char_device() && major == 1 && matches!(minor, 3 | 5 | 7 | 8 | 9)
}

/// Depth-first, each directory's entries sorted by name, so the result is sorted by path with
/// a directory before what it holds. Returns whether the limit cut it short.
fn walk(dir: &Path, depth: u32, limit: usize, out: &mut Vec<FileStat>) -> Result<bool> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::fs("list", dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::fs("list", dir, e))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue; // gone since the directory was read
        };
        if out.len() >= limit {
            return Ok(true);
        }
        out.push(stat_of(&path, &m));
        if depth > 1 && m.is_dir() && walk(&path, depth - 1, limit, out)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// [`walk`] through descriptors: `dir` (opened from a checked resolution, shown as `shown`)
/// is read by its descriptor, each entry is looked at in it without following a symlink, and
/// only real directories are descended into, so nothing the walk reads can be swapped. A
/// hidden directory is listed and not descended into; a hidden file is not listed.
fn walk_at(
    dir: &OpenDir,
    shown: &Path,
    depth: u32,
    limit: usize,
    hidden: &Hidden,
    out: &mut Vec<FileStat>,
) -> Result<bool> {
    let dup = dir.fd.try_clone().map_err(|e| Error::fs("list", shown, e))?;
    let mut d = Dir::from_fd(dup).map_err(|e| sys("list", shown, e))?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| sys("list", shown, e))?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(std::ffi::OsString::from(
                <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n),
            ));
        }
    }
    drop(d);
    names.sort();
    for name in names {
        let path = shown.join(&name);
        // The entry itself (a symlink as such), in this very directory.
        let Ok(entry) = openat(
            &dir.fd,
            name.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue; // gone since the directory was read
        };
        let Ok(m) = File::from(entry).metadata() else { continue };
        let is_hidden = hidden.hides_in(Some(&dir.path), &name);
        if is_hidden && !m.is_dir() {
            continue;
        }
        if out.len() >= limit {
            return Ok(true);
        }
        out.push(stat_of(&path, &m));
        if depth > 1 && m.is_dir() && !is_hidden {
            let Ok(fd) = openat(
                &dir.fd,
                name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) else {
                continue; // replaced since it was looked at: not followed
            };
            let child = OpenDir { fd, path: dir.path.join(&name) };
            if walk_at(&child, &path, depth - 1, limit, hidden, out)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Removes the directory `name` in `parent` and everything in it, descending only through
/// real directories (`O_NOFOLLOW`): a symlink inside is removed, never followed.
fn remove_tree(parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<()> {
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| sys("remove", path, e))?;
    let dup = fd.try_clone().map_err(|e| Error::fs("remove", path, e))?;
    let mut dir = Dir::from_fd(dup).map_err(|e| sys("remove", path, e))?;
    let mut children = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| sys("remove", path, e))?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            children.push(std::ffi::OsString::from(
                <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n),
            ));
        }
    }
    drop(dir);
    for child in children {
        let child_path = path.join(&child);
        match file_kind_at(&fd, &child) {
            None => {}
            Some(libc::S_IFDIR) => remove_tree(&fd, &child, &child_path)?,
            Some(_) => unlinkat(&fd, child.as_os_str(), UnlinkatFlags::NoRemoveDir)
                .or_else(|e| if e == Errno::ENOENT { Ok(()) } else { Err(e) })
                .map_err(|e| sys("remove", &child_path, e))?,
        }
    }
    unlinkat(parent, name, UnlinkatFlags::RemoveDir).map_err(|e| sys("remove", path, e))
}
