//! The `landlock` runner's mount layer: a private mount namespace in which everything
//! outside the writable roots is read-only, the read-only paths under a root are read-only
//! mount points, the pathname unix sockets outside the roots are masked, and `/dev/pts` is
//! a devpts instance of the sandbox's own ([`private_devpts`]). Each hidden path is covered
//! (a directory by an empty read-only tmpfs, a file by `/dev/null`), with the writable roots
//! beneath it bound back from descriptors opened before the cover.
//!
//! Landlock decides opens, creates, renames and unlinks, but it has no right for `chmod`,
//! `utime` or file flags, and before ABI 9 none for connecting to a pathname unix socket.
//! A read-only mount closes the first group for every file type (`chmod_common`,
//! `utimes` and `chown` all ask the mount for write access), which matters most as root:
//! root owns `/etc/shadow` and `/dev/sda`, and ownership is all `chmod` checks. Read-only
//! mount points for `.git/hooks` and `.git/config` also let Landlock grant each root
//! whole, so new files can be created directly in a git workspace.
//!
//! Invariants:
//! - Nothing done here is visible outside: the namespace is entered first and `/` is made a
//!   recursive slave before any mount is made, so mounts never propagate to the host.
//! - A failure before the first mount falls back to Landlock alone ([`Layer::Unavailable`]
//!   with the reason, reported by the runner); a failure after it ends the helper
//!   (fail closed: a half-built view is never run in).
//! - The command cannot undo the layer: every capability is dropped afterwards, and a
//!   Landlock domain may not mount or unmount.
//!
//! Limits: sockets are found in `/proc/net/unix` when the command starts; a socket bound
//! later (or bound with a relative path, or in another network namespace) is not masked;
//! Landlock ABI 9 (`ResolveUnix`) closes this for good where the kernel has it.
//!
//! The mount namespace is made directly, or in a user namespace; where neither is possible,
//! Landlock confines alone. `read_only_points` sorts the read-only paths for both runners: existing
//! ones become mount points, a worktree's `.git` file becomes one, and missing ones under a
//! directory are left to Landlock.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What the mount layer did.
#[derive(Debug, PartialEq, Eq)]
pub enum Layer {
    /// The private read-only view is in place.
    Applied,
    /// No mount namespace could be made; Landlock alone confines (the reason says why).
    Unavailable(String),
}

/// Whether this process can make the layer (a mount namespace, directly or in a user
/// namespace): enters a namespace, so call it only from a throwaway process (the helper's
/// `--probe`).
pub fn probe() -> Layer {
    match enter_namespace() {
        Ok(()) => Layer::Applied,
        Err(why) => Layer::Unavailable(why),
    }
}

/// How a policy's read-only paths are kept under a mount layer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadOnlyPoints {
    /// Existing paths under a root to make read-only mount points: the read-only paths that
    /// exist, and for a missing one whose nearest existing ancestor is a file (a worktree's
    /// `.git` file), that file (nothing can be created under it while it cannot be replaced).
    pub mount: Vec<PathBuf>,
    /// Missing paths under an existing directory below a root: no mount point can exist for
    /// them, so Landlock must keep them from being created.
    pub missing: Vec<PathBuf>,
}

/// Sorts `read_only` paths (absolute) for the `writable` roots.
pub(crate) fn read_only_points(writable: &[PathBuf], read_only: &[PathBuf]) -> ReadOnlyPoints {
    let roots: Vec<PathBuf> =
        writable.iter().filter_map(|r| std::fs::canonicalize(r).ok()).collect();
    let below_root = |p: &Path| roots.iter().any(|r| p.starts_with(r) && p != r.as_path());
    let mut out = ReadOnlyPoints::default();
    for p in read_only {
        if p.symlink_metadata().is_ok() {
            if let Ok(p) = std::fs::canonicalize(p)
                && below_root(&p)
                && !out.mount.contains(&p)
            {
                out.mount.push(p);
            }
            continue;
        }
        let Some(existing) = p.ancestors().skip(1).find(|a| a.symlink_metadata().is_ok()) else {
            continue;
        };
        let Ok(existing) = std::fs::canonicalize(existing) else { continue };
        if !below_root(&existing) {
            // Directly in a root (a workspace without `.git`) or outside every root.
            continue;
        }
        if existing.is_dir() {
            out.missing.push(p.clone());
        } else if !out.mount.contains(&existing) {
            out.mount.push(existing);
        }
    }
    out
}

/// Creates a missing `.git/hooks` read-only path in an existing `.git` directory, empty, as
/// `git init` would: a path that exists can be a read-only mount point, so the runners can
/// grant the rest of the workspace whole (a missing one leaves Landlock granting the root's
/// entries one by one, which refuses new files directly in the root).
pub(crate) fn create_missing_hooks(read_only: &[PathBuf]) {
    for p in read_only {
        let is_hooks = p.file_name().is_some_and(|n| n == "hooks")
            && p.parent().and_then(Path::file_name).is_some_and(|n| n == ".git");
        let parent_is_dir =
            p.parent().is_some_and(|d| d.symlink_metadata().is_ok_and(|m| m.is_dir()));
        if is_hooks && parent_is_dir && p.symlink_metadata().is_err() {
            let _ = std::fs::create_dir(p);
        }
    }
}

/// Builds the view for `writable` roots, with `protected` (the existing read-only paths under
/// them: [`ReadOnlyPoints::mount`]) as read-only mount points and `hidden` covered.
pub fn apply(
    writable: &[PathBuf],
    protected: &[PathBuf],
    hidden: &[PathBuf],
) -> Result<Layer, String> {
    let roots: Vec<PathBuf> =
        writable.iter().filter_map(|r| std::fs::canonicalize(r).ok()).collect();
    let sockets = unix_sockets();
    if let Err(why) = enter_namespace() {
        return Ok(Layer::Unavailable(why));
    }
    if let Err(why) = mount(None, Path::new("/"), libc::MS_REC | libc::MS_SLAVE) {
        return Ok(Layer::Unavailable(format!("cannot make / private: {why}")));
    }
    // From here on a failure is fatal: the view may be half built.
    let covers = hide(hidden, &roots)?;
    for root in &roots {
        bind(root, root)?;
    }
    // Each directory between a root and a read-only path becomes a mount point (a mount
    // point cannot be renamed or removed, so `mv .git .git-old` cannot swap in a fresh
    // writable `.git`), then the read-only path itself.
    let mut points: Vec<PathBuf> = Vec::new();
    for p in protected {
        let root = roots.iter().find(|r| p.starts_with(r)).cloned().unwrap_or_default();
        for a in p.ancestors().skip(1) {
            if a.starts_with(&root) && a != root && !points.iter().any(|x| x == a) {
                points.push(a.to_path_buf());
            }
        }
    }
    points.sort_by_key(|a| a.components().count());
    for a in &points {
        if a.is_dir() {
            bind(a, a)?;
        }
    }
    for p in protected {
        bind(p, p)?;
    }
    let writable_at = |m: &Path| {
        roots.iter().any(|r| m.starts_with(r)) && !protected.iter().any(|p| m.starts_with(p))
    };
    let outside: Vec<PathBuf> = sockets.into_iter().filter(|s| !writable_at(s)).collect();
    cover_sockets(&outside)?;
    for point in mount_points()? {
        if !writable_at(&point) {
            remount_read_only(&point)?;
        }
    }
    // A cover under a root stays read-only too: what is written there would vanish.
    for c in &covers {
        remount_read_only(c)?;
        if !is_read_only(c)? {
            return Err(format!("{} is still writable after remounting", c.display()));
        }
    }
    reenter_cwd()?;
    // Fail closed if the view is not what it must be. (A policy whose root is `/` itself
    // makes everything writable but the read-only paths.)
    let whole_tree = roots.iter().any(|r| r == Path::new("/"));
    if !whole_tree && !is_read_only(Path::new("/"))? {
        return Err("/ is still writable after remounting".into());
    }
    for p in protected {
        if !is_read_only(p)? {
            return Err(format!("{} is still writable after remounting", p.display()));
        }
    }
    Ok(Layer::Applied)
}

/// Covers each existing `hidden` path (a directory with an empty tmpfs, anything else with
/// `/dev/null`), then binds back each writable root beneath one, through a descriptor opened
/// before the cover (the path then names the cover). Returns the covered directories.
fn hide(hidden: &[PathBuf], roots: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut covers = Vec::new();
    for h in hidden {
        let h = match std::fs::canonicalize(h) {
            Ok(h) => h,
            // Nothing there now: nothing to hide from this command.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot resolve the hidden path {}: {e}", h.display())),
        };
        let is_dir = std::fs::metadata(&h)
            .map_err(|e| format!("cannot stat the hidden path {}: {e}", h.display()))?
            .is_dir();
        if !is_dir {
            mount(Some(Path::new("/dev/null")), &h, libc::MS_BIND)
                .map_err(|e| format!("cannot hide {}: {e}", h.display()))?;
            continue;
        }
        let mut inner = Vec::new();
        for r in roots.iter().filter(|r| r.starts_with(&h) && *r != &h) {
            let fd = std::fs::File::open(r)
                .map_err(|e| format!("cannot hold the root {}: {e}", r.display()))?;
            inner.push((r, fd));
        }
        mount_fs("tmpfs", &h, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, "mode=0755")
            .map_err(|e| format!("cannot hide {}: {e}", h.display()))?;
        for (r, fd) in inner {
            std::fs::create_dir_all(r)
                .map_err(|e| format!("cannot make {} in the cover: {e}", r.display()))?;
            let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            bind(&source, r)?;
        }
        covers.push(h);
    }
    Ok(covers)
}

/// Mounts a devpts instance of the sandbox's own on `/dev/pts` and points `/dev/ptmx` at it,
/// as bubblewrap does: the command can still make terminals (`script`, python's `pty`), and
/// no other terminal of the machine is there to be named. The command's own controlling
/// terminal (`own`, a standard descriptor on it), hidden by the new instance, is bound onto
/// `/dev/console` so that `tty` still names it.
///
/// Returns false, having changed nothing, when no devpts can be mounted here: `/dev/pts`
/// then stays the machine's, and Landlock grants only the own terminal in it.
pub(crate) fn private_devpts(own: Option<i32>) -> Result<bool, String> {
    let pts = Path::new("/dev/pts");
    if !pts.is_dir() {
        return Ok(false);
    }
    // Held by path before the new instance hides it: a descriptor inherited from before the
    // namespace names a mount of the caller's namespace, which cannot be bound from here.
    let own_in_pts = own
        .and_then(|fd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok())
        .filter(|p| p.starts_with(pts))
        .and_then(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(p)
                .ok()
        });
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
    if mount_fs("devpts", pts, "devpts", flags, "newinstance,ptmxmode=0666,mode=620").is_err() {
        return Ok(false);
    }
    // From here on a failure is fatal (the view is half built).
    let ptmx = Path::new("/dev/ptmx");
    if ptmx.symlink_metadata().is_ok_and(|m| m.file_type().is_char_device()) {
        // A symlink (`pts/ptmx`) already leads to the new instance.
        bind(&pts.join("ptmx"), ptmx)?;
    }
    let console = Path::new("/dev/console");
    if let Some(held) = &own_in_pts
        && console.symlink_metadata().is_ok()
    {
        let source = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        mount(Some(&source), console, libc::MS_BIND)
            .map_err(|e| format!("cannot bind the own terminal onto /dev/console: {e}"))?;
    }
    Ok(true)
}

fn mount_fs(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> std::io::Result<()> {
    let target_c = cstring(target).map_err(std::io::Error::other)?;
    let [source_c, fstype_c, data_c] =
        [source, fstype, data].map(|s| CString::new(s).map_err(std::io::Error::other));
    let (source_c, fstype_c, data_c) = (source_c?, fstype_c?, data_c?);
    // SAFETY: valid NUL-terminated strings that outlive the call; devpts takes its options
    // as a string.
    let r = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            fstype_c.as_ptr(),
            flags,
            data_c.as_ptr().cast(),
        )
    };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Inside bubblewrap (whose mounts are the rest of the layer): covers `sockets` in a mount
/// namespace of the helper's own. Fails when there are sockets to cover and no namespace
/// can be made (the command would reach them).
pub fn cover_in_new_namespace(sockets: &[PathBuf]) -> Result<(), String> {
    if sockets.is_empty() {
        return Ok(());
    }
    enter_namespace()
        .map_err(|why| format!("cannot cover the unix sockets outside the roots: {why}"))?;
    mount(None, Path::new("/"), libc::MS_REC | libc::MS_SLAVE)
        .map_err(|e| format!("cannot make / private: {e}"))?;
    cover_sockets(sockets)?;
    reenter_cwd()
}

/// After mounts changed: the working directory still names the directory on the mount it
/// was entered through (read-only, or covered), so it is entered again through the new view.
fn reenter_cwd() -> Result<(), String> {
    if let Ok(cwd) = std::env::current_dir() {
        std::env::set_current_dir(&cwd)
            .map_err(|e| format!("cannot re-enter {}: {e}", cwd.display()))?;
    }
    Ok(())
}

/// Covers each path that is still a socket with `/dev/null` (a connect then meets a
/// character device and is refused). A listing entry may name a path from another mount
/// namespace, or a socket removed since it was listed: what is not a socket here now is
/// left alone.
fn cover_sockets(sockets: &[PathBuf]) -> Result<(), String> {
    for sock in sockets {
        if !is_socket(sock) {
            continue;
        }
        match mount(Some(Path::new("/dev/null")), sock, libc::MS_BIND) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(format!("cannot cover the unix socket {}: {e}", sock.display())),
        }
    }
    Ok(())
}

/// A new mount namespace: directly with `CAP_SYS_ADMIN`, else inside a new user namespace
/// that maps only the caller's own uid and gid (so files keep their owners; others' files
/// show as the overflow id).
fn enter_namespace() -> Result<(), String> {
    // SAFETY: unshare with flags only; the helper is single-threaded (a requirement for
    // CLONE_NEWUSER, met because it runs before any runtime or thread starts).
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0 {
        return Ok(());
    }
    let direct = std::io::Error::last_os_error();
    // SAFETY: as above.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        let userns = std::io::Error::last_os_error();
        return Err(format!("no mount namespace ({direct}) and no user namespace ({userns})"));
    }
    // In a fresh user namespace with nothing mapped yet: a failure now cannot fall back,
    // since this process already lost its identity; report it as fatal to the caller by
    // exiting through the helper's unavailable path.
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))
    };
    let mapped = write("/proc/self/setgroups", "deny".into())
        .and_then(|()| write("/proc/self/uid_map", format!("{uid} {uid} 1")))
        .and_then(|()| write("/proc/self/gid_map", format!("{gid} {gid} 1")));
    if let Err(why) = mapped {
        eprintln!("{} unavailable: user namespace set-up failed: {why}", crate::exec::MARKER);
        std::process::exit(crate::exec::UNAVAILABLE);
    }
    Ok(())
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", path.display()))
}

fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> std::io::Result<()> {
    let target_c = cstring(target).map_err(std::io::Error::other)?;
    let source_c = source.map(cstring).transpose().map_err(std::io::Error::other)?;
    // SAFETY: valid NUL-terminated strings (or null) that outlive the call; no data argument.
    let r = unsafe {
        libc::mount(
            source_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target_c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

fn bind(source: &Path, target: &Path) -> Result<(), String> {
    mount(Some(source), target, libc::MS_BIND | libc::MS_REC)
        .map_err(|e| format!("cannot bind {}: {e}", target.display()))
}

fn statvfs_flags(path: &Path) -> Result<libc::c_ulong, std::io::Error> {
    let c = cstring(path).map_err(std::io::Error::other)?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid path and a buffer of the right type for statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    Ok(unsafe { st.assume_init() }.f_flag)
}

fn is_read_only(path: &Path) -> Result<bool, String> {
    statvfs_flags(path)
        .map(|f| f & libc::ST_RDONLY != 0)
        .map_err(|e| format!("cannot check {}: {e}", path.display()))
}

/// Remounts the mount at `point` read-only, keeping its other per-mount flags (a user
/// namespace may not clear `nosuid`, `nodev`, `noexec` or the atime flags it inherited).
fn remount_read_only(point: &Path) -> Result<(), String> {
    let flags = match statvfs_flags(point) {
        Ok(f) => f,
        // Not reachable by path (under a directory this process cannot search, or shadowed
        // away): a path the command cannot name either.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EACCES | libc::ENOTDIR)) => {
            return Ok(());
        }
        Err(e) => return Err(format!("cannot check {}: {e}", point.display())),
    };
    let keep = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st, _)| flags & st != 0)
    .fold(0, |acc, (_, ms)| acc | ms);
    match mount(None, point, libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | keep) {
        Ok(()) => Ok(()),
        // A path listed in mountinfo that is not a mount point in this view (another mount
        // covers it): what the command sees there is the covering mount, remounted on its
        // own line.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(format!("cannot make {} read-only: {e}", point.display())),
    }
}

/// The mount points of this namespace, parents first.
fn mount_points() -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mut out: Vec<PathBuf> =
        text.lines().filter_map(|l| l.split(' ').nth(4)).map(unescape).collect();
    out.sort_by_key(|p| p.components().count());
    out.dedup();
    Ok(out)
}

/// Decodes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = bytes[i + 1..i + 4].iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// True when `path` itself (not a link's target) is a socket.
pub(crate) fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// The absolute paths of the bound pathname unix sockets this network namespace lists.
pub(crate) fn unix_sockets() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/net/unix") else { return Vec::new() };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            // Seven fixed fields, then the path (which may contain spaces).
            let mut rest = line.trim_start();
            for _ in 0..7 {
                let end = rest.find(' ')?;
                rest = rest[end..].trim_start();
            }
            rest.starts_with('/').then(|| PathBuf::from(rest))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/x\\134y"), PathBuf::from("/x\\y"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape("/end\\04"), PathBuf::from("/end\\04"));
    }

    #[test]
    fn read_only_points_mount_what_exists_and_guard_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let roots = vec![root.clone()];
        let ro = |r: &Path| vec![r.join(".git/hooks"), r.join(".git/config")];
        // No .git: nothing to keep.
        assert_eq!(read_only_points(&roots, &ro(&root)), ReadOnlyPoints::default());
        // A .git directory with config but no hooks: config mounted, hooks guarded.
        std::fs::create_dir(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/config"), "").unwrap();
        let points = read_only_points(&roots, &ro(&root));
        assert_eq!(points.mount, vec![root.join(".git/config")]);
        assert_eq!(points.missing, vec![root.join(".git/hooks")]);
        // ... until the hooks directory is made, as the runners do.
        create_missing_hooks(&ro(&root));
        assert!(root.join(".git/hooks").is_dir());
        let points = read_only_points(&roots, &ro(&root));
        assert_eq!(points.mount, vec![root.join(".git/hooks"), root.join(".git/config")]);
        assert!(points.missing.is_empty());
        // A worktree's .git file is itself the mount point.
        let wt = tempfile::tempdir().unwrap();
        let wt_root = std::fs::canonicalize(wt.path()).unwrap();
        std::fs::write(wt_root.join(".git"), "gitdir: /x\n").unwrap();
        let points = read_only_points(std::slice::from_ref(&wt_root), &ro(&wt_root));
        assert_eq!(points.mount, vec![wt_root.join(".git")]);
        assert!(points.missing.is_empty());
        // create_missing_hooks makes nothing under a file, nor outside a .git directory.
        create_missing_hooks(&[wt_root.join(".git/hooks"), wt_root.join("hooks")]);
        assert!(!wt_root.join("hooks").exists());
    }

    #[test]
    fn the_socket_listing_finds_a_bound_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("with space.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(unix_sockets().contains(&path), "{:?}", unix_sockets());
    }
}
