//! Where a write may land: every mutating operation first turns its path into a [`Loc`], an
//! open directory descriptor and one final name, and then acts only through `*at` calls on
//! that descriptor, so what was checked is what is used.
//!
//! Without confinement (`files-local`, and `files-sandbox` in danger-full-access) the parent is
//! opened as the host resolves it. Under a workspace-write policy:
//! 1. The path must lie lexically beneath a writable root (the longest that matches); the
//!    root itself is never a target (it cannot be removed, renamed or replaced).
//! 2. The parent is opened with `openat2(root_fd, rel, RESOLVE_BENEATH |
//!    RESOLVE_NO_MAGICLINKS)`: the kernel refuses `..` above the root, absolute symlinks,
//!    relative symlinks that climb out and `/proc/self/root`-style magic links, at the moment
//!    of use. A directory swapped for a symlink after this point changes nothing: the
//!    descriptor names the directory that was resolved.
//! 3. Read-only paths are compared by identity, not by spelling, as they resolve now: the
//!    parent and each of its ancestors (walked up through `..` on descriptors) must not be a
//!    read-only path; (parent, final name) must not be a read-only path's (parent, name), so a
//!    missing `.git/hooks` cannot be created; the target itself must not be one (a hard link
//!    to `.git/config` included); and a removal or rename must not take a read-only path's
//!    ancestor (`.git`) away.
//!
//! Hidden paths (the policy's `hidden_paths`, covered in the confined shell's view, and
//! `/proc`, which is the server's here and the command's own in its view) are refused to
//! reads and writes alike: the path as spelled and as it resolves now (symlinks
//! followed) must not lie in one, unless it lies in a writable root beneath it. A listing,
//! tar export or recursive watch that reaches a hidden directory shows the directory and
//! never descends into it; a hidden file is left out. A `read` or `stat` then checks that
//! what it opened is what the checked resolution names with no symlink followed
//! (`resolve_visible`, `check_opened`), and a `list` walks by descriptors from such a
//! resolution (`open_dir_checked`), so a directory
//! swapped for a symlink around the call is caught. Hole, stated: tar export and watch act
//! by path after their check, so such a swap racing them can show names (and, for a tar
//! export, contents) under a hidden path.
//!
//! In read-only mode every write is denied. Every denial is `sandbox_denied`, its message
//! starting with the shell's marker for a file denial
//! (`[sandbox: file access denied under workspace-write mode]`) and naming the path and why.
//!
//! Holes, stated: a hard link inside a root to a file outside it is written through (as the
//! confined shell would); a path that reaches a root only through a symlink outside it is
//! refused (the roots are matched as spelled); a directory moved out of a root by someone
//! unconfined while a write holds its descriptor receives that write.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use conch_seams::sandbox::denial_marker;
use conch_seams::{Error, ErrorCode, Result, SandboxMode, SandboxPolicy};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat, openat2};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

/// What an operation does to its target, for the read-only checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Intent {
    /// Creates or writes the target.
    Write,
    /// Removes or renames the target (so also whatever it holds).
    Destroy,
}

/// A checked place: the parent directory, held open, and the final name in it.
#[derive(Debug)]
pub(crate) struct Loc {
    /// The parent directory (`O_PATH`).
    pub dir: OwnedFd,
    /// The final component.
    pub name: OsString,
    /// The absolute path, for messages and results.
    pub path: PathBuf,
}

/// The confinement a `files-sandbox` enforces (absent for `files-local`).
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    mode: SandboxMode,
    roots: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    hidden: Vec<PathBuf>,
}

/// A directory held open, and the symlink-free path it was opened by.
#[derive(Debug)]
pub(crate) struct OpenDir {
    /// The directory (`O_RDONLY | O_DIRECTORY`).
    pub fd: OwnedFd,
    /// Where it was, with no symlink in the path.
    pub path: PathBuf,
}

/// The hidden paths and the writable roots, as they resolve now.
#[derive(Clone, Debug)]
pub(crate) struct Hidden {
    hidden: Vec<PathBuf>,
    roots: Vec<PathBuf>,
}

impl Hidden {
    /// The hidden path that covers `resolved` (absolute, symlink-free), unless a writable root
    /// beneath that path holds it.
    fn covering(&self, resolved: &Path) -> Option<&Path> {
        self.hidden.iter().map(PathBuf::as_path).find(|h| {
            resolved.starts_with(h)
                && !self
                    .roots
                    .iter()
                    .any(|r| r.starts_with(h) && r.as_path() != *h && resolved.starts_with(r))
        })
    }

    /// Whether `path` is hidden as it resolves now: a walk shows a hidden directory without
    /// descending into it, and leaves a hidden file out.
    /// A final symlink is the entry itself, not what it names.
    pub(crate) fn hides(&self, path: &Path) -> bool {
        self.covering(&resolve_now(path, false)).is_some()
    }

    /// [`Hidden::hides`] for the entry `name` of a directory that resolves to `dir` (one
    /// resolution per directory walked, not one per entry).
    pub(crate) fn hides_in(&self, dir: Option<&Path>, name: &OsStr) -> bool {
        dir.is_some_and(|d| self.covering(&d.join(name)).is_some())
    }
}

/// `path` cleaned lexically (`.` dropped, `..` taking the previous name).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `path` as it resolves now: its nearest existing ancestor resolved, the rest appended
/// (with `follow` false, the last component is kept as it is, as `lstat` takes it).
fn resolve_now(path: &Path, follow: bool) -> PathBuf {
    let path = lexical(path);
    let (base, last) = match (follow, path.parent(), path.file_name()) {
        (false, Some(p), Some(n)) => (p.to_owned(), Some(n.to_owned())),
        _ => (path.clone(), None),
    };
    let mut rest: Vec<OsString> = Vec::new();
    let mut cur = base.as_path();
    loop {
        if let Ok(mut c) = std::fs::canonicalize(cur) {
            c.extend(rest.iter().rev());
            if let Some(l) = &last {
                c.push(l);
            }
            return c;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(p), Some(n)) => {
                rest.push(n.to_owned());
                cur = p;
            }
            _ => return path,
        }
    }
}

/// A `sandbox_denied` error for `path`, marked as a shell result's file denial is
/// (`[sandbox: file access denied under <mode> mode]`).
pub(crate) fn denied(mode: SandboxMode, what: &str, path: &Path, why: &str) -> Error {
    Error::new(
        ErrorCode::SandboxDenied,
        format!("{} {what} {}: {why}", denial_marker("file access", mode), path.display()),
    )
}

/// An errno as the seam's error for `what` on `path`.
pub(crate) fn sys(what: &str, path: &Path, errno: Errno) -> Error {
    Error::fs(what, path, std::io::Error::from(errno))
}

type Id = (u64, u64);

fn id(st: &FileStat) -> Id {
    (st.st_dev, st.st_ino)
}

/// Whether a stat describes a directory.
pub(crate) fn is_dir(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// A read-only path as it resolves now: its own identity (when it exists), its parent's, and
/// every ancestor's above that.
struct Resolved<'a> {
    path: &'a Path,
    own: Option<Id>,
    parent: Option<Id>,
    name: Option<&'a OsStr>,
    ancestors: Vec<Id>,
}

fn stat_follow(path: &Path) -> Option<Id> {
    nix::sys::stat::stat(path).ok().map(|s| id(&s))
}

fn resolve_read_only(path: &Path) -> Resolved<'_> {
    let own = nix::sys::stat::lstat(path).ok().map(|s| id(&s));
    let parent = path.parent().and_then(stat_follow);
    let ancestors = path.ancestors().skip(1).filter_map(stat_follow).collect();
    Resolved { path, own, parent, name: path.file_name(), ancestors }
}

impl Guard {
    /// The guard for `policy`, or `None` when it does not confine writes.
    pub(crate) fn for_policy(policy: &SandboxPolicy) -> Option<Self> {
        match policy.mode {
            SandboxMode::DangerFullAccess => None,
            mode => Some(Self {
                mode,
                roots: policy.writable(),
                read_only: policy.read_only_paths.clone(),
                // The server's own `/proc` (its command line, environment and memory, and
                // every other process's) is not the confined command's: the runners give
                // it a `/proc` of its own.
                hidden: policy
                    .hidden_paths
                    .iter()
                    .cloned()
                    .chain([PathBuf::from("/proc")])
                    .collect(),
            }),
        }
    }

    /// The mode this guard holds to.
    pub(crate) fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// The hidden paths as they resolve now (`None`: nothing is hidden).
    pub(crate) fn hidden(&self) -> Option<Hidden> {
        if self.hidden.is_empty() {
            return None;
        }
        let now = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| lexical(p));
        Some(Hidden {
            hidden: self.hidden.iter().map(now).collect(),
            roots: self.roots.iter().map(now).collect(),
        })
    }

    /// Denies `path` when it lies in a hidden path, as spelled or as it resolves now (with
    /// `follow`, through a final symlink too).
    pub(crate) fn check_visible(&self, what: &str, path: &Path, follow: bool) -> Result<()> {
        self.resolve_visible(what, path, follow).map(drop)
    }

    /// `path` resolved once (with `follow`, through a final symlink), denied when it lies in
    /// a hidden path as spelled or as resolved; the resolution returned is the one checked,
    /// for the caller to open with no symlink followed (another resolution could meet a
    /// symlink this one did not). `None`: nothing is hidden.
    pub(crate) fn resolve_visible(
        &self,
        what: &str,
        path: &Path,
        follow: bool,
    ) -> Result<Option<PathBuf>> {
        let Some(hidden) = self.hidden() else { return Ok(None) };
        let spelled = Hidden {
            hidden: self.hidden.iter().map(|p| lexical(p)).collect(),
            roots: self.roots.iter().map(|p| lexical(p)).collect(),
        };
        let resolved = resolve_now(path, follow);
        let found = spelled
            .covering(&lexical(path))
            .or_else(|| hidden.covering(&resolved))
            .map(Path::to_path_buf)
            .or_else(|| {
                // A final symlink into a hidden path is refused even where it is not followed.
                if follow {
                    None
                } else {
                    hidden.covering(&resolve_now(path, true)).map(Path::to_path_buf)
                }
            });
        match found {
            Some(h) => Err(denied(
                self.mode,
                what,
                path,
                &format!("it is hidden from the sandbox (under {})", h.display()),
            )),
            None => Ok(Some(resolved)),
        }
    }

    /// Denies `opened` (what opening `path` found, through a final symlink with `follow`)
    /// unless `resolved`, the resolution [`Guard::resolve_visible`] checked, opened now with
    /// no symlink anywhere, is that very file. A directory swapped for a symlink into a
    /// hidden path around the open is caught: the file opened then is not the one the
    /// checked path names, and a file in a hidden path has no other name outside one.
    pub(crate) fn check_opened(
        &self,
        what: &str,
        path: &Path,
        resolved: &Path,
        opened: &std::fs::Metadata,
        follow: bool,
    ) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
        if !follow {
            flags |= OFlag::O_NOFOLLOW;
        }
        let same = open_symlink_free(resolved, flags)
            .and_then(|fd| fstat(fd.as_fd()))
            .is_ok_and(|st| (st.st_dev, st.st_ino) == (opened.dev(), opened.ino()));
        if same { Ok(()) } else { Err(self.swapped(what, path)) }
    }

    /// Opens the directory `path` for reading from the one resolution of it that is checked
    /// against the hidden paths, with no symlink followed, so the directory read is the one
    /// the check saw.
    pub(crate) fn open_dir_checked(&self, what: &str, path: &Path) -> Result<OpenDir> {
        let resolved = match self.resolve_visible(what, path, true)? {
            Some(r) => r,
            None => resolve_now(path, true),
        };
        match open_symlink_free(&resolved, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        {
            Ok(fd) => Ok(OpenDir { fd, path: resolved }),
            Err(Errno::ELOOP) => Err(self.swapped(what, path)),
            Err(e) => Err(sys(what, path, e)),
        }
    }

    /// The denial of a path that changed under the call.
    fn swapped(&self, what: &str, path: &Path) -> Error {
        denied(
            self.mode,
            what,
            path,
            "it changed while it was opened (a directory swapped for a symlink); try again",
        )
    }

    /// The writable root `path` lies beneath (the longest), and the rest of the path.
    fn root_of<'p>(&self, path: &'p Path) -> Option<(&PathBuf, &'p Path)> {
        self.roots
            .iter()
            .filter_map(|r| path.strip_prefix(r).ok().map(|rest| (r, rest)))
            .max_by_key(|(r, _)| r.as_os_str().len())
    }

    fn locate(&self, what: &str, path: &Path, intent: Intent) -> Result<Loc> {
        if self.mode == SandboxMode::ReadOnly {
            return Err(denied(self.mode, what, path, "the sandbox is read-only"));
        }
        let Some((root, rel)) = self.root_of(path) else {
            return Err(denied(self.mode, what, path, "outside the writable roots"));
        };
        self.check_visible(what, path, false)?;
        let (parent_rel, name) = match (rel.parent(), rel.components().next_back()) {
            (Some(p), Some(Component::Normal(n))) => (p, n.to_owned()),
            (_, None) => {
                return Err(denied(self.mode, what, path, "it is a writable root itself"));
            }
            _ => return Err(denied(self.mode, what, path, "its last component is not a name")),
        };
        let root_fd = open(
            root.as_path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| sys(what, root, e))?;
        let rel_parent: &Path =
            if parent_rel.as_os_str().is_empty() { Path::new(".") } else { parent_rel };
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let dir = match openat2_retrying(&root_fd, rel_parent, how) {
            Ok(fd) => fd,
            // EAGAIN after the retries: the kernel could not tell that a `..` stayed inside.
            Err(Errno::EXDEV | Errno::ELOOP | Errno::EAGAIN) => {
                return Err(denied(
                    self.mode,
                    what,
                    path,
                    "it resolves outside the writable roots (through a symlink or `..`)",
                ));
            }
            Err(Errno::ENOSYS) => {
                return Err(denied(
                    self.mode,
                    what,
                    path,
                    "this kernel has no openat2 to resolve it safely",
                ));
            }
            Err(e) => return Err(sys(what, path.parent().unwrap_or(path), e)),
        };
        let loc = Loc { dir, name, path: path.to_owned() };
        self.check_read_only(what, &loc, intent)?;
        Ok(loc)
    }

    /// Denies `loc` when it is, is under, or (for a destroy) holds a read-only path.
    pub(crate) fn check_read_only(&self, what: &str, loc: &Loc, intent: Intent) -> Result<()> {
        if self.read_only.is_empty() {
            return Ok(());
        }
        let resolved: Vec<Resolved<'_>> =
            self.read_only.iter().map(|p| resolve_read_only(p)).collect();
        let deny = |r: &Resolved<'_>, how: &str| {
            denied(
                self.mode,
                what,
                &loc.path,
                &format!("{how} read-only path {}", r.path.display()),
            )
        };
        // The parent and its ancestors, up to the filesystem root.
        let mut cur = fstat(loc.dir.as_fd()).map_err(|e| sys(what, &loc.path, e))?;
        let parent_id = id(&cur);
        let mut fd: Option<OwnedFd> = None;
        loop {
            if let Some(r) = resolved.iter().find(|r| r.own == Some(id(&cur))) {
                return Err(deny(r, "it lies under the"));
            }
            let up = openat(
                fd.as_ref().map_or(loc.dir.as_fd(), |f| f.as_fd()),
                "..",
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| sys(what, &loc.path, e))?;
            let next = fstat(up.as_fd()).map_err(|e| sys(what, &loc.path, e))?;
            if id(&next) == id(&cur) {
                break;
            }
            cur = next;
            fd = Some(up);
        }
        if let Some(r) = resolved
            .iter()
            .find(|r| r.parent == Some(parent_id) && r.name == Some(loc.name.as_os_str()))
        {
            return Err(deny(r, "it is the"));
        }
        if let Ok(target) = fstatat(&loc.dir, loc.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            if let Some(r) = resolved.iter().find(|r| r.own == Some(id(&target))) {
                return Err(deny(r, "it is the"));
            }
            if intent == Intent::Destroy
                && is_dir(&target)
                && let Some(r) = resolved.iter().find(|r| r.ancestors.contains(&id(&target)))
            {
                return Err(deny(r, "it holds the"));
            }
        }
        Ok(())
    }
}

/// Opens `resolved` (absolute) with `flags`, following no symlink and no magic link on the
/// way: a component swapped for a symlink since it was resolved fails with `ELOOP`.
fn open_symlink_free(resolved: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let root =
        open(Path::new("/"), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let rel = resolved.strip_prefix("/").unwrap_or(resolved);
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2_retrying(&root, rel, how)
}

/// `openat2`, again while it fails `EAGAIN`: with `RESOLVE_BENEATH` the kernel refuses a `..`
/// it cannot prove stayed beneath when any rename ran meanwhile, anywhere on the system.
pub(crate) fn openat2_retrying(dir: &OwnedFd, rel: &Path, how: OpenHow) -> nix::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match openat2(dir, rel, how) {
            Err(Errno::EAGAIN) if tries < 100 => tries += 1,
            other => return other,
        }
    }
}

/// Opens `path`'s parent and names its final component, checked by `guard` when there is one.
pub(crate) fn locate(
    guard: Option<&Guard>,
    what: &str,
    path: &Path,
    intent: Intent,
) -> Result<Loc> {
    if let Some(g) = guard {
        return g.locate(what, path, intent);
    }
    let (Some(parent), Some(Component::Normal(name))) =
        (path.parent(), path.components().next_back())
    else {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!("{what} {}: the path names no file", path.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let dir = open(parent, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| sys(what, parent, e))?;
    Ok(Loc { dir, name: name.to_owned(), path: path.to_owned() })
}
