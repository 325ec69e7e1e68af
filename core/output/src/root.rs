//! The private directory that one owner's spills live under, made only when the first spill
//! needs it: a call whose output fits in memory touches no disk at all.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// A lazily created private (0700) spill directory under `parent`.
#[derive(Debug)]
pub struct SpillRoot {
    parent: PathBuf,
    /// `None` until the first spill asks; then the directory, or `Some(None)` when it could
    /// not be made (the spills then go beside it, into `parent`).
    dir: Mutex<Option<Option<PathBuf>>>,
}

impl SpillRoot {
    /// A root under `parent` (`None`: [`std::env::temp_dir`]); nothing is created yet.
    pub fn new(parent: Option<PathBuf>) -> Self {
        Self { parent: parent.unwrap_or_else(std::env::temp_dir), dir: Mutex::new(None) }
    }

    /// Where a spill goes: the private directory, made on the first call; the parent when it
    /// cannot be made (each spill is in its own private directory either way).
    pub fn dir(&self) -> PathBuf {
        let mut dir = self.dir.lock().unwrap_or_else(PoisonError::into_inner);
        let made = dir.get_or_insert_with(|| {
            tempfile::Builder::new()
                .prefix("conch-")
                .permissions(Permissions::from_mode(0o700))
                .tempdir_in(&self.parent)
                .ok()
                .map(tempfile::TempDir::keep)
        });
        made.clone().unwrap_or_else(|| self.parent.clone())
    }

    /// The private directory, if one was made.
    pub fn made(&self) -> Option<PathBuf> {
        self.dir.lock().unwrap_or_else(PoisonError::into_inner).clone().flatten()
    }

    /// Deletes the private directory and every spill in it, if it was made. A later spill
    /// makes a new one.
    pub fn remove(&self) {
        let made = self.dir.lock().unwrap_or_else(PoisonError::into_inner).take().flatten();
        if let Some(dir) = made {
            // Best effort: nothing useful can be done if removal fails.
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
