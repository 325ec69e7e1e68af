//! The root filesystem of the conch image, as a tar stream: the host's own shell tools and
//! the shared libraries they load, plus the conch binary and a non-root user.
//!
//! Steps, and why:
//! - Each program is found in the host's system directories (`/usr/bin`, `/bin`, `/usr/sbin`,
//!   `/sbin`; never `/usr/local`, whose contents are nobody's package). A program the host
//!   lacks is left out and named in the result, so the image says what it has.
//! - A path is copied with every symlink on the way to it (`/bin` → `usr/bin`, `sh` → `dash`,
//!   `libc.so.6` → its versioned file), as links, so the image resolves names as the host
//!   does.
//! - The libraries come from `ldd` (the host's own dynamic loader answers), which lists the
//!   whole closure, the loader itself included. That is why the host's programs are used and
//!   not a distribution's: nothing is downloaded, and the libraries are the ones these
//!   binaries were built against.
//! - Everything is owned by root and dated 0, except `/home/conch`, `/workspace` (uid and gid
//!   1000, the `conch` user the image runs as) and `/tmp` (1777).
//!
//! Limits: the host must be glibc-based with `ldd` on PATH (the image holds the host's libc,
//! so it runs wherever the host's programs do); programs that load plugins at run time
//! (`dlopen`: NSS modules other than `files`, gconv) find only what `ldd` listed, and the
//! only locale is C.UTF-8. There is no python3 (cases that need one skip, saying so).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use conch_seams::{Error, ErrorCode, Result};

/// The uid and gid the image runs as.
pub const USER_ID: u32 = 1000;

/// The programs a conch sandbox offers, when the host has them: a shell, the tools commands
/// and models reach for, and `ps`/`kill` for the processes they start.
pub const PROGRAMS: &[&str] = &[
    "bash",
    "sh",
    "dash",
    "env",
    "cat",
    "ls",
    "cp",
    "mv",
    "rm",
    "mkdir",
    "rmdir",
    "ln",
    "chmod",
    "chown",
    "touch",
    "head",
    "tail",
    "wc",
    "sort",
    "uniq",
    "cut",
    "tr",
    "tee",
    "sleep",
    "echo",
    "printf",
    "true",
    "false",
    "test",
    "[",
    "pwd",
    "basename",
    "dirname",
    "readlink",
    "realpath",
    "stat",
    "date",
    "id",
    "whoami",
    "hostname",
    "uname",
    "grep",
    "egrep",
    "fgrep",
    "sed",
    "awk",
    "mawk",
    "gawk",
    "find",
    "xargs",
    "tar",
    "gzip",
    "gunzip",
    "zcat",
    "ps",
    "kill",
    "pkill",
    "pgrep",
    "timeout",
    "nohup",
    "setsid",
    "diff",
    "cmp",
    "patch",
    "which",
    "mktemp",
    "seq",
    "od",
    "base64",
    "sha256sum",
    "md5sum",
    "du",
    "df",
    "nproc",
    "yes",
    "paste",
    "join",
    "comm",
    "split",
    "tac",
    "nl",
    "shuf",
    "truncate",
    "sync",
    "install",
    "dd",
    "less",
    "more",
    "clear",
    "tput",
    "stty",
    "tty",
    "expr",
    "sha1sum",
    "cksum",
    "fold",
    "expand",
    "unexpand",
    "numfmt",
];

/// Trees copied whole when present: the terminal descriptions (so `tput`, `clear` and
/// full-screen programs work under the TERM values the terminal backend sets) and the C.UTF-8
/// locale (which the backend gives a shell that has none; glibc loads it from here).
const TREES: &[&str] = &["/lib/terminfo", "/usr/share/terminfo", "/usr/lib/locale/C.utf8"];

const SYSTEM_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/sbin"];

/// What one path of the image is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// A directory: its mode and owner.
    Dir { mode: u32, owner: u32 },
    /// The host file at this path, copied with its mode.
    HostFile,
    /// A symlink with this target, as the host has it.
    Link(PathBuf),
    /// A file made for the image.
    Made { mode: u32, data: Vec<u8> },
    /// A file copied from elsewhere on the host.
    Copied { from: PathBuf, mode: u32 },
}

/// The image's tree, before it is written.
#[derive(Debug, Default)]
pub struct Rootfs {
    entries: BTreeMap<PathBuf, Entry>,
    /// Programs of [`PROGRAMS`] the host does not have.
    missing: Vec<&'static str>,
    /// ELF files whose libraries are still to be listed.
    pending_elf: Vec<PathBuf>,
}

impl Rootfs {
    /// The host's programs (those of [`PROGRAMS`] it has) with their libraries, the conch
    /// binary at `/usr/local/bin/conch` (and `swerex-remote`, a link to it), and the user.
    ///
    /// # Errors
    /// `io` when a host file cannot be read, `unsupported` when `ldd` cannot be run.
    pub fn from_host(conch: &Path) -> Result<Self> {
        let mut fs = Self::default();
        // The merged-/usr links (`/bin` → `usr/bin`, …) as the host has them, and `/bin/sh`
        // by that name: SWE-ReX's deployments run `/bin/sh -c …` in the image.
        for top in ["/bin", "/sbin", "/lib", "/lib64", "/bin/sh"] {
            if Path::new(top).exists() {
                fs.add_host_path(Path::new(top))?;
            }
        }
        for name in PROGRAMS {
            match SYSTEM_DIRS.iter().map(|d| Path::new(d).join(name)).find(|p| p.exists()) {
                Some(path) => fs.add_host_path(&path)?,
                None => fs.missing.push(name),
            }
        }
        for tree in TREES {
            fs.add_host_tree(Path::new(tree))?;
        }
        fs.add_conch(conch)?;
        fs.add_libraries()?;
        fs.add_user();
        Ok(fs)
    }

    /// Programs of [`PROGRAMS`] the host does not have (left out of the image).
    pub fn missing(&self) -> &[&'static str] {
        &self.missing
    }

    fn dir(&mut self, path: &Path, mode: u32, owner: u32) {
        self.entries.insert(path.to_path_buf(), Entry::Dir { mode, owner });
    }

    /// Records every directory above `path` (root-owned, 0755) unless already there.
    fn parents(&mut self, path: &Path) {
        for p in path.ancestors().skip(1) {
            if p == Path::new("/") {
                break;
            }
            self.entries.entry(p.to_path_buf()).or_insert(Entry::Dir { mode: 0o755, owner: 0 });
        }
    }

    /// Adds the host's `path` with every symlink met on the way, following them to a file.
    fn add_host_path(&mut self, path: &Path) -> Result<()> {
        let mut at = PathBuf::from("/");
        let mut todo: VecDeque<OsString> = parts(path);
        let mut hops = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                at.pop();
                continue;
            }
            let next = at.join(&part);
            let meta = std::fs::symlink_metadata(&next).map_err(|e| Error::fs("read", &next, e))?;
            if meta.file_type().is_symlink() {
                hops += 1;
                if hops > 40 {
                    return Err(Error::new(
                        ErrorCode::Io,
                        format!("{}: too many levels of symbolic links", path.display()),
                    ));
                }
                let target = std::fs::read_link(&next).map_err(|e| Error::fs("read", &next, e))?;
                self.parents(&next);
                self.entries.insert(next.clone(), Entry::Link(target.clone()));
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                for p in parts(&target).into_iter().rev() {
                    todo.push_front(p);
                }
            } else if meta.is_dir() {
                self.entries
                    .entry(next.clone())
                    .or_insert(Entry::Dir { mode: meta.permissions().mode() & 0o7777, owner: 0 });
                at = next;
            } else {
                self.parents(&next);
                if !self.entries.contains_key(&next) {
                    self.entries.insert(next.clone(), Entry::HostFile);
                    if is_elf(&next) {
                        self.pending_elf.push(next.clone());
                    }
                }
                at = next;
            }
        }
        Ok(())
    }

    /// Adds every file and link under the host's directory `dir` (nothing when it is absent).
    fn add_host_tree(&mut self, dir: &Path) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        for entry in entries {
            let path = entry.map_err(|e| Error::fs("list", dir, e))?.path();
            let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::fs("read", &path, e))?;
            if meta.is_dir() {
                self.add_host_tree(&path)?;
            } else {
                self.add_host_path(&path)?;
            }
        }
        Ok(())
    }

    fn add_conch(&mut self, conch: &Path) -> Result<()> {
        let bin = Path::new("/usr/local/bin");
        self.parents(&bin.join("conch"));
        self.dir(bin, 0o755, 0);
        self.entries
            .insert(bin.join("conch"), Entry::Copied { from: conch.to_path_buf(), mode: 0o755 });
        self.entries.insert(bin.join("swerex-remote"), Entry::Link(PathBuf::from("conch")));
        self.pending_elf.push(conch.to_path_buf());
        Ok(())
    }

    /// Adds the libraries of every ELF file added so far (their closure: `ldd` lists it).
    fn add_libraries(&mut self) -> Result<()> {
        let mut seen = BTreeSet::new();
        while let Some(elf) = self.pending_elf.pop() {
            for lib in ldd(&elf)? {
                if seen.insert(lib.clone()) {
                    self.add_host_path(&lib)?;
                }
            }
        }
        Ok(())
    }

    fn add_user(&mut self) {
        let made = |text: &str| Entry::Made { mode: 0o644, data: text.as_bytes().to_vec() };
        self.dir(Path::new("/etc"), 0o755, 0);
        self.entries.insert(
            "/etc/passwd".into(),
            made(&format!(
                "root:x:0:0:root:/root:/bin/bash\n\
                 conch:x:{USER_ID}:{USER_ID}:conch:/home/conch:/bin/bash\n"
            )),
        );
        self.entries.insert("/etc/group".into(), made(&format!("root:x:0:\nconch:x:{USER_ID}:\n")));
        self.entries.insert(
            "/etc/nsswitch.conf".into(),
            made("passwd: files\ngroup: files\nhosts: files dns\n"),
        );
        self.dir(Path::new("/root"), 0o700, 0);
        self.dir(Path::new("/home"), 0o755, 0);
        self.dir(Path::new("/home/conch"), 0o755, USER_ID);
        self.dir(Path::new("/workspace"), 0o755, USER_ID);
        self.dir(Path::new("/tmp"), 0o1777, 0);
        // Where the engine mounts the kernel's filesystems at run time: empty directories.
        for mount in ["proc", "sys", "dev", "run"] {
            self.dir(&Path::new("/").join(mount), 0o755, 0);
        }
    }

    /// Writes the tree as a tar archive (paths relative to `/`, sorted, so parents come
    /// first), returning the bytes of file content it holds.
    ///
    /// # Errors
    /// `io` when a host file cannot be read or `out` cannot be written.
    pub fn write_tar(&self, out: impl Write) -> Result<u64> {
        let io = |e: std::io::Error| Error::io("writing the image's root filesystem", e);
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Deterministic);
        let mut content = 0u64;
        for (path, entry) in &self.entries {
            let name = path.strip_prefix("/").unwrap_or(path);
            let mut h = tar::Header::new_gnu();
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            match entry {
                Entry::Dir { mode, owner } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_uid(u64::from(*owner));
                    h.set_gid(u64::from(*owner));
                    h.set_size(0);
                    tar.append_data(&mut h, name, std::io::empty()).map_err(io)?;
                }
                Entry::Link(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    tar.append_link(&mut h, name, target).map_err(io)?;
                }
                Entry::Made { mode, data } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    content += data.len() as u64;
                    tar.append_data(&mut h, name, data.as_slice()).map_err(io)?;
                }
                Entry::HostFile | Entry::Copied { .. } => {
                    let (from, mode) = match entry {
                        Entry::Copied { from, mode } => (from.as_path(), Some(*mode)),
                        _ => (path.as_path(), None),
                    };
                    let file = std::fs::File::open(from).map_err(|e| Error::fs("read", from, e))?;
                    let meta = file.metadata().map_err(|e| Error::fs("read", from, e))?;
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(mode.unwrap_or(meta.mode() & 0o7777));
                    h.set_size(meta.len());
                    content += meta.len();
                    tar.append_data(&mut h, name, file).map_err(io)?;
                }
            }
        }
        tar.finish().map_err(io)?;
        Ok(content)
    }
}

/// `path`'s components after the root, as names (`.` dropped, `..` kept).
fn parts(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
        && magic == *b"\x7fELF"
}

/// The absolute paths of the libraries `elf` loads, its loader included (none for a static
/// binary), as the host's `ldd` lists them.
fn ldd(elf: &Path) -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd").arg(elf).output().map_err(|e| {
        Error::new(
            ErrorCode::Unsupported,
            format!(
                "cannot run `ldd` to list the libraries of {} ({e}); the image is built from \
                 a glibc host's own programs",
                elf.display()
            ),
        )
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2
    // (0x…)`; `linux-vdso.so.1 (0x…)` is the kernel's and has no file.
    Ok(text
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlinked_directory_and_a_link_chain_are_kept_as_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("usr/bin");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("tool"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("usr/bin", dir.path().join("bin")).unwrap();
        std::os::unix::fs::symlink("tool", real.join("alias")).unwrap();
        let mut fs = Rootfs::default();
        fs.add_host_path(&dir.path().join("bin/alias")).unwrap();
        assert_eq!(fs.entries[&dir.path().join("bin")], Entry::Link("usr/bin".into()));
        assert_eq!(fs.entries[&real.join("alias")], Entry::Link("tool".into()));
        assert_eq!(fs.entries[&real.join("tool")], Entry::HostFile);
        assert!(matches!(fs.entries[&real], Entry::Dir { .. }));
    }

    #[test]
    fn ldd_lists_the_loader_and_libc_of_a_dynamic_program() {
        let libs = ldd(Path::new("/bin/sh")).unwrap();
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "{libs:?}");
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("ld-linux")), "{libs:?}");
    }
}
