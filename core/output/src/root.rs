//! The private directory that one owner's spills live under, made only when the first spill
//! needs it: a call whose output fits in memory touches no disk at all.
//!
//! Two kinds: a *temporary* root ([`SpillRoot::new`]) is a fresh randomly named directory that
//! [`SpillRoot::remove`] deletes with every spill in it; a *persistent* root
//! ([`SpillRoot::persistent`]) is a directory its owner named, whose spills outlive the owner
//! (someone else bounds them: in `subprocess-local`, the spill home's later sweeps), so
//! `remove` only deletes it when it is empty.

use std::fs::Permissions;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Mutex;

use conch_sync::LockExt;

/// Where a root's directory comes from.
#[derive(Debug)]
enum Place {
    /// A fresh private directory under this parent.
    Temporary(PathBuf),
    /// Exactly this directory (its parent exists and is private).
    Persistent(PathBuf),
}

/// A lazily created private (0700) spill directory.
#[derive(Debug)]
pub struct SpillRoot {
    place: Place,
    /// `None` until the first spill asks; then the directory, or `Some(None)` when it could
    /// not be made (the spills then go beside it, into the parent).
    dir: Mutex<Option<Option<PathBuf>>>,
}

impl SpillRoot {
    /// A temporary root under `parent` (`None`: [`std::env::temp_dir`]); nothing is created
    /// yet.
    pub fn new(parent: Option<PathBuf>) -> Self {
        let parent = parent.unwrap_or_else(std::env::temp_dir);
        Self { place: Place::Temporary(parent), dir: Mutex::new(None) }
    }

    /// A persistent root at `dir`, whose parent must exist; nothing is created yet.
    pub fn persistent(dir: PathBuf) -> Self {
        Self { place: Place::Persistent(dir), dir: Mutex::new(None) }
    }

    /// True for a root whose spills outlive it.
    pub fn is_persistent(&self) -> bool {
        matches!(self.place, Place::Persistent(_))
    }

    /// Where a spill goes: the private directory, made on the first call; the parent when it
    /// cannot be made (each spill is in its own private directory either way).
    pub fn dir(&self) -> PathBuf {
        let mut dir = self.dir.locked();
        let made = dir.get_or_insert_with(|| match &self.place {
            Place::Temporary(parent) => tempfile::Builder::new()
                .prefix("conch-")
                .permissions(Permissions::from_mode(0o700))
                .tempdir_in(parent)
                .ok()
                .map(tempfile::TempDir::keep),
            Place::Persistent(path) => match std::fs::DirBuilder::new().mode(0o700).create(path) {
                Ok(()) => Some(path.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(path.clone()),
                Err(_) => None,
            },
        });
        made.clone().unwrap_or_else(|| match &self.place {
            Place::Temporary(parent) => parent.clone(),
            // Beside a persistent root is another owner's home: use the system's temp dir.
            Place::Persistent(_) => std::env::temp_dir(),
        })
    }

    /// The private directory, if one was made.
    pub fn made(&self) -> Option<PathBuf> {
        self.dir.locked().clone().flatten()
    }

    /// A temporary root: deletes the directory and every spill in it, if it was made. A
    /// persistent root: deletes the directory only if it holds no spill. A later spill makes
    /// a new one either way.
    pub fn remove(&self) {
        let made = self.dir.locked().take().flatten();
        if let Some(dir) = made {
            // Best effort: nothing useful can be done if removal fails.
            match self.place {
                Place::Temporary(_) => {
                    let _ = std::fs::remove_dir_all(dir);
                }
                Place::Persistent(_) => {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }
}
