//! The files sandbox suite: escapes a sandboxed files provider must refuse, judged by their
//! effects on disk outside the sandbox (the file outside unchanged or absent) and by each
//! refusal's code (`sandbox_denied`) and marker ([`SANDBOX_MARKER`]).
//!
//! Each case takes the provider and the policy it enforces, and owns that policy's workspace
//! root (the factory makes a fresh one per case): the cases make `.git` there. The rooms the
//! cases set up (directories, symlinks, the files outside) are made with `std::fs`, so the
//! provider's world must be this machine. Cases for another mode than the policy's skip.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use conch_seams::files::{Files, SANDBOX_MARKER, WriteSpec, write_all};
use conch_seams::{ErrorCode, SandboxMode, SandboxPolicy, WriteMode};

use crate::files::raw_archive;
use crate::{Outcome, mark_token, skip};

/// A case's room: a directory inside the workspace root and one outside every writable root.
#[derive(Debug)]
pub struct Room {
    /// The policy's workspace root.
    pub root: PathBuf,
    /// A fresh directory inside it.
    pub inside: PathBuf,
    /// A fresh directory outside every writable root, holding `keep` ("outside").
    pub outside: tempfile::TempDir,
}

impl Room {
    /// Makes the room, or skips when the policy is not `mode`.
    pub fn new(policy: &SandboxPolicy, mode: SandboxMode) -> Result<Self, crate::Skip> {
        if policy.mode != mode {
            return Err(crate::Skip { reason: format!("needs a {mode} policy") });
        }
        let root = policy.workspace_root.clone();
        let inside = root.join(format!("room-{}", mark_token()));
        std::fs::create_dir_all(&inside).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let out = outside.path();
        assert!(
            !policy.writable_roots.iter().chain([&root]).any(|r| out.starts_with(r)),
            "the outside directory {} lies in a writable root",
            out.display()
        );
        std::fs::write(out.join("keep"), "outside").unwrap();
        Ok(Self { root, inside, outside })
    }

    /// The outside directory.
    pub fn out(&self) -> &Path {
        self.outside.path()
    }

    /// Panics unless the outside directory still holds exactly `keep` = "outside".
    pub fn assert_outside_untouched(&self, what: &str) {
        let mut names: Vec<_> = std::fs::read_dir(self.out())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["keep"], "{what}: something appeared outside the sandbox");
        assert_eq!(std::fs::read_to_string(self.out().join("keep")).unwrap(), "outside", "{what}");
    }
}

/// Panics unless `r` is a marked `sandbox_denied`.
pub fn assert_denied<T: std::fmt::Debug>(what: &str, r: conch_seams::Result<T>) {
    match r {
        Ok(v) => panic!("{what}: allowed ({v:?})"),
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::SandboxDenied, "{what}: {e}");
            assert!(e.message().starts_with(SANDBOX_MARKER), "{what}: no marker: {e}");
        }
    }
}

async fn import(files: &dyn Files, dest: &Path, bytes: &[u8]) -> conch_seams::Result<u64> {
    let mut sink = files.import_tar(dest).await?;
    sink.write(bytes).await?;
    sink.finish().await
}

/// Every kind of write aimed at `path` (a file that must not appear, or change), each of which
/// must be denied. `src` is a file inside the root to rename there.
pub async fn deny_every_write(files: &dyn Files, what: &str, path: &Path, src: &Path) {
    for (mode, atomic) in [
        (WriteMode::Create, false),
        (WriteMode::Truncate, false),
        (WriteMode::Append, false),
        (WriteMode::Truncate, true),
    ] {
        let mut spec = WriteSpec::new(path, mode);
        if atomic {
            spec = spec.atomic();
        }
        assert_denied(
            &format!("{what}: write {mode:?} atomic={atomic}"),
            write_all(files, spec, b"escaped").await,
        );
    }
    let spec = WriteSpec::new(path.join("deeper/f"), WriteMode::Create).with_parents();
    assert_denied(&format!("{what}: write with parents"), write_all(files, spec, b"x").await);
    assert_denied(&format!("{what}: make_dir"), files.make_dir(path, false).await);
    assert_denied(&format!("{what}: make_dir -p"), files.make_dir(&path.join("d"), true).await);
    assert_denied(&format!("{what}: rename to"), files.rename(src, path, true).await);
    assert_denied(&format!("{what}: remove"), files.remove(path, true).await);
    let tar = raw_archive(b"planted", tar::EntryType::Regular, b"", b"x");
    assert_denied(&format!("{what}: import_tar"), import(files, path, &tar).await);
}

pub async fn writes_inside_the_roots_succeed(files: &dyn Files, policy: &SandboxPolicy) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let f = room.inside.join("a/b.txt");
    write_all(files, WriteSpec::new(&f, WriteMode::Create).with_parents(), b"in").await.unwrap();
    write_all(files, WriteSpec::new(&f, WriteMode::Truncate).atomic(), b"in2").await.unwrap();
    files.rename(&f, &room.inside.join("c.txt"), false).await.unwrap();
    files.make_dir(&room.inside.join("x/y"), true).await.unwrap();
    let tar = raw_archive(b"t/f", tar::EntryType::Regular, b"", b"x");
    import(files, &room.inside.join("imp"), &tar).await.unwrap();
    files.remove(&room.inside.join("x"), true).await.unwrap();
    assert_eq!(std::fs::read_to_string(room.inside.join("c.txt")).unwrap(), "in2");
    assert_eq!(std::fs::read_to_string(room.inside.join("imp/t/f")).unwrap(), "x");
    // Reads are allowed everywhere.
    assert_eq!(files.read(&room.out().join("keep"), 0, 100).await.unwrap().data, b"outside");
    Ok(())
}

pub async fn writes_outside_the_roots_are_denied(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    deny_every_write(files, "outside", &room.out().join("new"), &src).await;
    deny_every_write(files, "outside keep", &room.out().join("keep"), &src).await;
    // Out of the sandbox by rename from outside, or of an outside file inward.
    assert_denied(
        "rename outside in",
        files.rename(&room.out().join("keep"), &room.inside.join("stolen"), false).await,
    );
    assert_denied("remove outside dir", files.remove(room.out(), true).await);
    room.assert_outside_untouched("outside the roots");
    assert_eq!(std::fs::read_to_string(&src).unwrap(), "src");
    // A denial names the path and why.
    let target = room.out().join("named");
    let e = write_all(files, WriteSpec::new(&target, WriteMode::Create), b"x").await.unwrap_err();
    let m = e.message();
    assert!(m.contains(&target.display().to_string()), "names the path: {m}");
    assert!(m.contains("outside the writable roots"), "says why: {m}");
    Ok(())
}

pub async fn an_absolute_symlink_out_is_never_followed(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    symlink(room.out(), room.inside.join("dir-out")).unwrap();
    symlink(room.out().join("keep"), room.inside.join("file-out")).unwrap();
    deny_every_write(files, "through dir-out", &room.inside.join("dir-out/new"), &src).await;
    deny_every_write(files, "through dir-out to keep", &room.inside.join("dir-out/keep"), &src)
        .await;
    for (mode, atomic) in
        [(WriteMode::Truncate, false), (WriteMode::Append, false), (WriteMode::Truncate, true)]
    {
        let mut spec = WriteSpec::new(room.inside.join("file-out"), mode);
        if atomic {
            spec = spec.atomic();
        }
        assert_denied("write a final symlink out", write_all(files, spec, b"escaped").await);
    }
    room.assert_outside_untouched("absolute symlink");
    // The links themselves are inside the root: removing one removes the link only.
    files.remove(&room.inside.join("dir-out"), true).await.unwrap();
    room.assert_outside_untouched("removing the link");
    Ok(())
}

pub async fn a_relative_symlink_out_is_never_followed(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    // Enough `..` to reach `/` from inside, then down to the outside directory.
    let ups = room.inside.components().count();
    let rel: PathBuf = std::iter::repeat_n(Path::new(".."), ups)
        .collect::<PathBuf>()
        .join(room.out().strip_prefix("/").unwrap());
    std::fs::create_dir(room.inside.join("sub")).unwrap();
    symlink(&rel, room.inside.join("sub/up")).unwrap();
    symlink(Path::new("..").join(&rel), room.inside.join("sub/up2")).unwrap();
    assert!(room.inside.join("sub/up/keep").exists(), "the link does point out");
    deny_every_write(files, "relative link out", &room.inside.join("sub/up/new"), &src).await;
    deny_every_write(files, "relative link out to keep", &room.inside.join("sub/up/keep"), &src)
        .await;
    let tar = raw_archive(b"up/planted", tar::EntryType::Regular, b"", b"x");
    assert!(import(files, &room.inside.join("sub"), &tar).await.is_err(), "import through up");
    room.assert_outside_untouched("relative symlink");
    Ok(())
}

pub async fn dotdot_and_proc_self_root_do_not_escape(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    let ups = room.inside.components().count();
    let dotdot: PathBuf = std::iter::once(room.inside.clone())
        .chain(std::iter::repeat_n(PathBuf::from(".."), ups))
        .collect::<PathBuf>()
        .join(room.out().strip_prefix("/").unwrap());
    deny_every_write(files, "`..` out", &dotdot.join("new"), &src).await;
    let proc_root = Path::new("/proc/self/root").join(room.out().strip_prefix("/").unwrap());
    deny_every_write(files, "/proc/self/root", &proc_root.join("new"), &src).await;
    // A magic link planted inside the root.
    symlink("/proc/self/root", room.inside.join("magic")).unwrap();
    let via = room.inside.join("magic").join(room.out().strip_prefix("/").unwrap());
    deny_every_write(files, "magic link", &via.join("new"), &src).await;
    std::os::unix::fs::symlink(
        format!("/proc/{}/cwd", std::process::id()),
        room.inside.join("cwd"),
    )
    .unwrap();
    deny_every_write(files, "a process's cwd link", &room.inside.join("cwd/new"), &src).await;
    room.assert_outside_untouched("`..` and magic links");
    Ok(())
}

fn git(root: &Path, hooks: bool) {
    std::fs::create_dir_all(root.join(".git/objects")).unwrap();
    if hooks {
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::write(root.join(".git/hooks/pre-push"), "#!/bin/sh\n").unwrap();
    }
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
}

fn assert_git_intact(root: &Path, hooks: bool, what: &str) {
    assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]\n", "{what}");
    let names: Vec<_> = match std::fs::read_dir(root.join(".git/hooks")) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    if hooks {
        assert_eq!(names, ["pre-push"], "{what}: hooks changed");
    } else {
        assert!(!root.join(".git/hooks").exists(), "{what}: .git/hooks was made");
    }
}

pub async fn git_hooks_and_config_stay_read_only(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    if !policy.read_only_paths.iter().any(|p| p.ends_with(".git/hooks")) {
        return skip("the policy keeps no .git/hooks read-only");
    }
    let root = &room.root;
    git(root, true);
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    deny_every_write(files, "a new hook", &root.join(".git/hooks/pre-commit"), &src).await;
    deny_every_write(files, "an existing hook", &root.join(".git/hooks/pre-push"), &src).await;
    deny_every_write(files, ".git/config", &root.join(".git/config"), &src).await;
    deny_every_write(files, ".git/hooks itself", &root.join(".git/hooks"), &src).await;
    // Through symlinks inside the root, relative and absolute, and a hard link.
    symlink(".git/hooks", root.join("hooks-rel")).unwrap();
    symlink(root.join(".git/hooks"), room.inside.join("hooks-abs")).unwrap();
    symlink(".git/config", root.join("config-rel")).unwrap();
    deny_every_write(files, "via a relative link", &root.join("hooks-rel/pre-commit"), &src).await;
    deny_every_write(
        files,
        "via an absolute link",
        &room.inside.join("hooks-abs/pre-commit"),
        &src,
    )
    .await;
    assert_denied(
        "config via a link",
        write_all(files, WriteSpec::new(root.join("config-rel"), WriteMode::Append), b"x").await,
    );
    std::fs::hard_link(root.join(".git/config"), room.inside.join("config-hard")).unwrap();
    assert_denied(
        "config via a hard link",
        write_all(files, WriteSpec::new(room.inside.join("config-hard"), WriteMode::Append), b"x")
            .await,
    );
    let tar = raw_archive(b".git/hooks/post-checkout", tar::EntryType::Regular, b"", b"x");
    assert_denied("import into the hooks", import(files, root, &tar).await);
    assert_git_intact(root, true, "read-only paths");
    let hook = root.join(".git/hooks/pre-commit");
    let e = write_all(files, WriteSpec::new(&hook, WriteMode::Create), b"x").await.unwrap_err();
    assert!(e.message().contains("read-only path") && e.message().contains(".git/hooks"), "{e}");
    // The rest of .git stays writable.
    write_all(files, WriteSpec::new(root.join(".git/objects/o"), WriteMode::Create), b"o")
        .await
        .unwrap();
    Ok(())
}

pub async fn a_missing_git_hooks_cannot_be_created(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    if !policy.read_only_paths.iter().any(|p| p.ends_with(".git/hooks")) {
        return skip("the policy keeps no .git/hooks read-only");
    }
    let root = &room.root;
    git(root, false);
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    deny_every_write(files, "a missing .git/hooks", &root.join(".git/hooks"), &src).await;
    let spec = WriteSpec::new(root.join(".git/hooks/pre-commit"), WriteMode::Create).with_parents();
    assert_denied("hook with parents", write_all(files, spec, b"x").await);
    std::fs::create_dir(room.inside.join("hooks")).unwrap();
    assert_denied(
        "a directory renamed into place",
        files.rename(&room.inside.join("hooks"), &root.join(".git/hooks"), false).await,
    );
    let tar = raw_archive(b".git/hooks/pre-commit", tar::EntryType::Regular, b"", b"x");
    assert_denied("import making the hooks", import(files, root, &tar).await);
    assert_git_intact(root, false, "missing hooks");
    Ok(())
}

pub async fn git_cannot_be_renamed_or_removed(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    if policy.read_only_paths.is_empty() {
        return skip("the policy keeps no path read-only");
    }
    let root = &room.root;
    git(root, true);
    assert_denied(
        "rename .git",
        files.rename(&root.join(".git"), &root.join("git-old"), false).await,
    );
    assert_denied("remove .git", files.remove(&root.join(".git"), true).await);
    std::fs::create_dir(room.inside.join("empty")).unwrap();
    assert_denied(
        "replace .git",
        files.rename(&room.inside.join("empty"), &root.join(".git"), true).await,
    );
    assert_git_intact(root, true, "rename/remove .git");
    Ok(())
}

pub async fn the_writable_root_itself_cannot_be_removed_or_renamed(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let root = &room.root;
    assert_denied("remove the root", files.remove(root, true).await);
    assert_denied("rename the root", files.rename(root, &room.inside.join("r"), false).await);
    assert!(room.inside.exists(), "the root's content stays");
    Ok(())
}

pub async fn a_directory_swapped_for_a_symlink_never_lets_a_write_out(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::WorkspaceWrite)?;
    let d = room.inside.join("d");
    let parked = room.inside.join("d-parked");
    std::fs::create_dir(&d).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, d, parked, out) =
            (Arc::clone(&stop), d.clone(), parked.clone(), room.out().to_owned());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // The real directory steps aside and a symlink out takes its name, then back.
                std::fs::rename(&d, &parked).unwrap();
                symlink(&out, &d).unwrap();
                std::fs::remove_file(&d).unwrap();
                std::fs::rename(&parked, &d).unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let mut landed = 0;
    for i in 0..300 {
        let f = d.join(format!("f{i}"));
        let atomic = i % 2 == 0;
        let mut spec = WriteSpec::new(&f, WriteMode::Create);
        if atomic {
            spec = spec.atomic();
        }
        if write_all(files, spec, b"x").await.is_ok() {
            landed += 1;
        }
        let _ = files.make_dir(&d.join(format!("m{i}")), false).await;
        let _ = files.remove(&d.join("keep"), false).await;
    }
    stop.store(true, Ordering::SeqCst);
    let swaps = swapper.join().unwrap();
    room.assert_outside_untouched(&format!("{swaps} swaps, {landed} writes landed"));
    assert!(swaps > 0, "the swapper never ran");
    Ok(())
}

pub async fn read_only_mode_refuses_every_write(
    files: &dyn Files,
    policy: &SandboxPolicy,
) -> Outcome {
    let room = Room::new(policy, SandboxMode::ReadOnly)?;
    let src = room.inside.join("src");
    std::fs::write(&src, "src").unwrap();
    deny_every_write(files, "read-only: new", &room.inside.join("new"), &src).await;
    deny_every_write(files, "read-only: existing", &src, &room.inside.join("other")).await;
    assert_denied("read-only: rename", files.rename(&src, &room.inside.join("moved"), false).await);
    assert_eq!(std::fs::read_to_string(&src).unwrap(), "src");
    let names: Vec<_> = std::fs::read_dir(&room.inside).unwrap().collect();
    assert_eq!(names.len(), 1, "nothing new inside: {names:?}");
    room.assert_outside_untouched("read-only");
    // Reads still work.
    assert_eq!(files.read(&src, 0, 10).await.unwrap().data, b"src");
    Ok(())
}
