//! The spill home: one private directory per user under which every local provider of every
//! conch process keeps its spills, so that a path a result names stays readable after the
//! process that wrote it exits (`conch call` runs one process per tool call), and a later
//! run can both bound what earlier runs left and clean up after one that was killed.
//!
//! # Layout
//! - `<parent>/conch-spills-<euid>/` (0700, owned by the effective user, never a symlink;
//!   `<parent>` is `spill_dir` or the system temp dir).
//! - `live/<id>`: one lock file per living provider (`<id>` is the provider's id, unique per
//!   process and provider, and the prefix of every `CONCH_CALL_ID` its spawns carry). The
//!   provider holds an exclusive `flock` on it for its whole life; the file is made under a
//!   dot name, locked, then renamed into place, so no other process ever sees it unlocked
//!   while its owner lives. A clean shutdown deletes it.
//! - `<id>/conch-spill-*/stream-*`: that provider's spills (each in its own 0700 directory,
//!   0600 files, as the collector makes them).
//!
//! # Who may delete what
//! - A provider's spills belong to it while its `live/<id>` is locked: others never touch them,
//!   and its own [`SpillRegistry`](conch_output::SpillRegistry) bounds them.
//! - Once the owner is gone (no `live/<id>`, or one that can be locked), its spills are left
//!   to later runs: every sweep ([`Home::evict_dead`]) deletes the dead spills older than
//!   `max_spill_age_ms`, then the oldest ones until the dead spills and the sweeping
//!   provider's own total fit `max_spill_total_bytes`, and removes directories left empty.
//! - A `live/<id>` that can be locked belongs to a process that died without shutting down
//!   (SIGKILL, a crash). [`Home::crashed`] hands it, locked, to the caller, which stops what
//!   still carries that id and then deletes it ([`Crashed::done`]).
//!
//! # Limits
//! - The disk bound is per run, not global: each living provider keeps up to its own
//!   `max_spill_total_bytes`, and dead ones are cut back to the sweeper's limit.
//! - When the home cannot be used (another user owns the path, it is a symlink, or its mode
//!   lets others in), the provider falls back to a private directory of its own that goes
//!   with it at shutdown, as before, and says so in a warning.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};

/// The per-user spill home (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Home {
    path: PathBuf,
}

/// A provider's mark in `live/`, locked for as long as this value lives.
#[derive(Debug)]
pub(crate) struct LiveMark {
    path: PathBuf,
    _lock: Flock<File>,
}

impl LiveMark {
    /// Clean shutdown: the provider stopped what it started, so nobody needs to sweep it.
    pub(crate) fn retire(self) {
        // Deleted while still locked: no sweeper can take it for a crashed one in between.
        let _ = fs::remove_file(&self.path);
    }
}

/// A provider that died without shutting down, held locked until [`Crashed::done`].
#[derive(Debug)]
pub(crate) struct Crashed {
    /// Its id: every process it started carries it (or an id under it).
    pub(crate) id: String,
    path: PathBuf,
    _lock: Flock<File>,
}

impl Crashed {
    /// Its processes were stopped: delete the mark so no later run sweeps it again.
    pub(crate) fn done(self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn private_dir(path: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // What is there now must be ours alone: a directory (not a link to one), owned by us,
    // closed to everyone else. /tmp is shared, so another user may have made the name first.
    let meta = fs::symlink_metadata(path)?;
    let euid = euid();
    if meta.file_type().is_symlink() {
        return Err(io::Error::other(format!("{} is a symbolic link", path.display())));
    }
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", path.display())));
    }
    if meta.uid() != euid {
        return Err(io::Error::other(format!(
            "{} belongs to uid {}, not {euid}",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "{} has mode {:o}; only its owner may have access",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

/// This process's effective user id.
fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Takes the exclusive lock on `file` without waiting: `None` while someone else holds it.
fn try_lock(file: File) -> Option<Flock<File>> {
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

impl Home {
    /// The home under `parent`, made private if it does not exist yet; an error says why it
    /// cannot be used.
    pub(crate) fn open(parent: &Path) -> io::Result<Self> {
        // A configured parent that does not exist yet is made (private, like the home).
        fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot make {}: {e}", parent.display()))
        })?;
        let path = parent.join(format!("conch-spills-{}", euid()));
        private_dir(&path)?;
        private_dir(&path.join("live"))?;
        Ok(Self { path })
    }

    /// The directory a provider's spills go in (made by its first spill).
    pub(crate) fn spill_dir(&self, id: &str) -> PathBuf {
        self.path.join(id)
    }

    /// Marks provider `id` as living until the returned mark is retired or dropped.
    pub(crate) fn register(&self, id: &str) -> io::Result<LiveMark> {
        let live = self.path.join("live");
        let staging = live.join(format!(".{id}"));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staging)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| io::Error::from(e))?;
        // Locked before it gets the name sweepers look at.
        let path = live.join(id);
        fs::rename(&staging, &path)?;
        Ok(LiveMark { path, _lock: lock })
    }

    /// True when provider `id` is alive (its mark exists and is locked by someone).
    fn alive(&self, id: &str) -> bool {
        let mark = self.path.join("live").join(id);
        match File::open(&mark) {
            // Locking it would make it look alive to others for a moment; only test.
            Ok(file) => try_lock(file).is_none(),
            Err(_) => false,
        }
    }

    /// Marks of providers that died without shutting down, each locked for the caller.
    pub(crate) fn crashed(&self, own: &str) -> Vec<Crashed> {
        let live = self.path.join("live");
        let Ok(entries) = fs::read_dir(&live) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Some(id) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if id == own || id.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(file) = OpenOptions::new().read(true).open(&path) else { continue };
            if let Some(lock) = try_lock(file) {
                out.push(Crashed { id, path, _lock: lock });
            }
        }
        out
    }

    /// Bounds the spills of providers that are gone (see the module docs): deletes those
    /// older than `max_age`, then the oldest until they and `own_total` fit `max_total`.
    /// Returns how many spills it deleted.
    pub(crate) fn evict_dead(
        &self,
        own: &str,
        max_total: u64,
        max_age: Duration,
        own_total: u64,
    ) -> usize {
        let Ok(entries) = fs::read_dir(&self.path) else { return 0 };
        let now = SystemTime::now();
        let mut spills: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let mut dead_dirs = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if id == own || id == "live" || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if self.alive(id) {
                continue;
            }
            let dir = entry.path();
            // Only real directories and regular files: a link planted in the home is never
            // followed, so nothing outside it is ever deleted (`DirEntry::file_type` and
            // `symlink_metadata` do not follow links).
            for spill in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !spill.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                for file in fs::read_dir(spill.path()).into_iter().flatten().flatten() {
                    if let Ok(meta) = fs::symlink_metadata(file.path())
                        && meta.file_type().is_file()
                    {
                        let written = meta.modified().unwrap_or(now);
                        spills.push((written, meta.len(), file.path()));
                    }
                }
            }
            dead_dirs.push(dir);
        }
        let mut deleted = 0;
        let delete = |path: &Path| {
            let _ = fs::remove_file(path);
            if let Some(dir) = path.parent() {
                let _ = fs::remove_dir(dir);
            }
        };
        // Oldest first: age goes first, then the total.
        spills.sort();
        let mut total = own_total + spills.iter().map(|(_, len, _)| len).sum::<u64>();
        for (written, len, path) in &spills {
            let old = now.duration_since(*written).unwrap_or_default() > max_age;
            if !old && total <= max_total {
                break;
            }
            delete(path);
            total = total.saturating_sub(*len);
            deleted += 1;
        }
        for dir in dead_dirs {
            // Spill directories left empty (by this sweep or a crash mid-spill), then the
            // provider's directory itself; a non-empty one stays.
            for spill in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let _ = fs::remove_dir(spill.path());
            }
            let _ = fs::remove_dir(&dir);
        }
        deleted
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_home_others_can_enter_or_that_is_a_link_is_refused() {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join(format!("conch-spills-{}", euid()));
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let e = Home::open(parent.path()).unwrap_err().to_string();
        assert!(e.contains("mode 755; only its owner may have access"), "{e}");
        fs::remove_dir(&path).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &path).unwrap();
        let e = Home::open(parent.path()).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
    }

    #[test]
    fn eviction_never_follows_a_link_out_of_the_home() {
        let parent = tempfile::tempdir().unwrap();
        let home = Home::open(parent.path()).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let precious = outside.path().join("precious.txt");
        fs::write(&precious, vec![b'x'; 4096]).unwrap();
        // A dead run's directory whose "spill directory" is a link to elsewhere, and one whose
        // "spill file" is a link.
        let run = home.spill_dir("c0.0");
        fs::create_dir(&run).unwrap();
        std::os::unix::fs::symlink(outside.path(), run.join("conch-spill-a")).unwrap();
        fs::create_dir(run.join("conch-spill-b")).unwrap();
        std::os::unix::fs::symlink(&precious, run.join("conch-spill-b").join("stream-b")).unwrap();
        // A zero cap and age would delete every spill it found.
        home.evict_dead("me", 0, Duration::ZERO, 0);
        assert!(precious.is_file(), "nothing outside the home is deleted");
    }

    #[test]
    fn a_mark_is_alive_while_held_and_crashed_once_dropped_unretired() {
        let parent = tempfile::tempdir().unwrap();
        let home = Home::open(parent.path()).unwrap();
        let mode = fs::metadata(&home.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let held = home.register("a.0").unwrap();
        let dropped = home.register("b.0").unwrap();
        let retired = home.register("c.0").unwrap();
        assert!(home.alive("a.0") && home.alive("b.0"));
        drop(dropped);
        retired.retire();
        let crashed: Vec<String> = home.crashed("x").into_iter().map(|c| c.id).collect();
        // Only the mark whose holder went without retiring it; never a living one.
        assert_eq!(crashed, ["b.0"]);
        assert!(home.alive("a.0") && !home.alive("b.0") && !home.alive("c.0"));
        for c in home.crashed("x") {
            c.done();
        }
        assert!(home.crashed("x").is_empty());
        drop(held);
    }
}
