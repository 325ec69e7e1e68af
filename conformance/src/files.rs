//! The files suite: every operation of the files seam and every error code it promises, on
//! one provider. Each case takes the provider and a base directory in its world where it may
//! make scratch space (it makes `conch-files-<case>-<token>` there, through the seam, and
//! removes it when it passes); a sandboxed provider's base must lie inside a writable root.
//!
//! The cases judge through the seam itself (stat, read, list), so they hold for a provider
//! whose world is another machine. Watch cases skip (as a value) when
//! `capabilities().watch` is false; they wait on the events, never on a clock.

use std::path::{Path, PathBuf};

use conch_seams::files::{
    FileKind, Files, ListSpec, MAX_READ_CHUNK, WatchEvent, WriteSpec, read_all, write_all,
};
use conch_seams::{ErrorCode, WriteMode};
use sha2::{Digest, Sha256};

use crate::{Outcome, mark_token, skip, within};

/// Makes this case's scratch directory under `base`, through the seam.
pub async fn scratch(files: &dyn Files, base: &Path, case: &str) -> PathBuf {
    let dir = base.join(format!("conch-files-{case}-{}", mark_token()));
    files.make_dir(&dir, true).await.unwrap_or_else(|e| panic!("scratch {}: {e}", dir.display()));
    dir
}

async fn put(files: &dyn Files, path: &Path, data: &[u8]) {
    write_all(files, WriteSpec::new(path, WriteMode::Truncate), data)
        .await
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

async fn get(files: &dyn Files, path: &Path) -> Vec<u8> {
    read_all(files, path, 1 << 20).await.unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

async fn code_of<T: std::fmt::Debug>(
    what: &str,
    r: impl std::future::Future<Output = conch_seams::Result<T>>,
) -> ErrorCode {
    match r.await {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e.code(),
    }
}

async fn done(files: &dyn Files, dir: &Path) {
    files.remove(dir, true).await.unwrap_or_else(|e| panic!("cleanup {}: {e}", dir.display()));
}

/// A symlink, made through an import (the seam has no symlink call): `name` -> `target`.
pub async fn symlink(files: &dyn Files, dir: &Path, name: &str, target: &str) {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, name, target).unwrap();
    let bytes = b.into_inner().unwrap();
    let mut sink = files.import_tar(dir).await.unwrap();
    sink.write(&bytes).await.unwrap();
    sink.finish().await.unwrap_or_else(|e| panic!("symlink {name} -> {target}: {e}"));
}

pub async fn stat_describes_files_dirs_and_symlinks(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "stat").await;
    let f = dir.join("f.txt");
    write_all(files, WriteSpec::new(&f, WriteMode::Create).with_permissions(0o640), b"12345")
        .await
        .unwrap();
    let st = files.stat(&f).await.unwrap();
    assert_eq!((st.kind, st.size, st.mode, &st.path), (FileKind::File, 5, 0o640, &f), "{st:?}");
    assert!(st.modified_ms > 0 && st.symlink_target.is_none(), "{st:?}");
    assert_eq!(files.stat(&dir).await.unwrap().kind, FileKind::Directory);
    symlink(files, &dir, "link", "f.txt").await;
    let l = files.stat(&dir.join("link")).await.unwrap();
    assert_eq!(l.kind, FileKind::Symlink, "stat does not follow a final symlink: {l:?}");
    assert_eq!(l.symlink_target.as_deref(), Some(Path::new("f.txt")), "{l:?}");
    assert_eq!(l.size, 5, "a symlink's size is its target's length: {l:?}");
    // A relative path is resolved against the default directory.
    if let Ok(rel) = f.strip_prefix(files.default_dir()) {
        assert_eq!(files.stat(rel).await.unwrap().path, f);
    }
    assert_eq!(code_of("stat missing", files.stat(&dir.join("nope"))).await, ErrorCode::NotFound);
    assert_eq!(
        code_of("stat under a file", files.stat(&f.join("x"))).await,
        ErrorCode::NotADirectory
    );
    done(files, &dir).await;
    Ok(())
}

pub async fn reads_are_chunked_at_caller_offsets(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "read").await;
    let f = dir.join("ten");
    put(files, &f, b"0123456789").await;
    let c = files.read(&f, 0, 4).await.unwrap();
    assert_eq!((c.data.as_slice(), c.size, c.eof), (&b"0123"[..], 10, false));
    let c = files.read(&f, 4, 100).await.unwrap();
    assert_eq!((c.data.as_slice(), c.eof), (&b"456789"[..], true));
    let c = files.read(&f, 10, 4).await.unwrap();
    assert!(c.data.is_empty() && c.eof, "at the end: {c:?}");
    let c = files.read(&f, 99, 4).await.unwrap();
    assert!(c.data.is_empty() && c.eof, "past the end: {c:?}");
    // Through a symlink, the target is read.
    symlink(files, &dir, "via", "ten").await;
    assert_eq!(files.read(&dir.join("via"), 8, 9).await.unwrap().data, b"89");
    assert_eq!(code_of("read a dir", files.read(&dir, 0, 1)).await, ErrorCode::IsADirectory);
    assert_eq!(
        code_of("read missing", files.read(&dir.join("no"), 0, 1)).await,
        ErrorCode::NotFound
    );
    // read_all refuses past its limit with too_large.
    assert_eq!(code_of("read_all", read_all(files, &f, 5)).await, ErrorCode::TooLarge);
    done(files, &dir).await;
    Ok(())
}

pub async fn write_modes_create_truncate_and_append(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "write").await;
    let f = dir.join("f");
    write_all(files, WriteSpec::new(&f, WriteMode::Create), b"one").await.unwrap();
    assert_eq!(
        code_of("create over a file", files.write(WriteSpec::new(&f, WriteMode::Create))).await,
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        code_of(
            "atomic create over a file",
            files.write(WriteSpec::new(&f, WriteMode::Create).atomic())
        )
        .await,
        ErrorCode::AlreadyExists
    );
    write_all(files, WriteSpec::new(&f, WriteMode::Append), b"+two").await.unwrap();
    assert_eq!(get(files, &f).await, b"one+two");
    let st = write_all(files, WriteSpec::new(&f, WriteMode::Truncate), b"3").await.unwrap();
    assert_eq!((st.size, st.kind), (1, FileKind::File));
    assert_eq!(get(files, &f).await, b"3");
    // Append creates a missing file.
    write_all(files, WriteSpec::new(dir.join("new"), WriteMode::Append), b"a").await.unwrap();
    assert_eq!(get(files, &dir.join("new")).await, b"a");
    // An append cannot be atomic.
    assert_eq!(
        code_of("atomic append", files.write(WriteSpec::new(&f, WriteMode::Append).atomic())).await,
        ErrorCode::InvalidArgument
    );
    // Default bits are 0o644 less the umask: never more, never executable.
    let mode = files.stat(&dir.join("new")).await.unwrap().mode;
    assert_eq!(mode & !0o644, 0, "default mode {mode:o}");
    assert_eq!(
        code_of("write a dir", files.write(WriteSpec::new(&dir, WriteMode::Truncate))).await,
        ErrorCode::IsADirectory
    );
    done(files, &dir).await;
    Ok(())
}

pub async fn write_permissions_and_parents(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "perms").await;
    let deep = dir.join("a/b/c.sh");
    assert_eq!(
        code_of("no parents", files.write(WriteSpec::new(&deep, WriteMode::Create))).await,
        ErrorCode::NotFound
    );
    let spec = WriteSpec::new(&deep, WriteMode::Create).with_parents().with_permissions(0o750);
    write_all(files, spec, b"#!/bin/sh\n").await.unwrap();
    assert_eq!(files.stat(&deep).await.unwrap().mode, 0o750);
    assert_eq!(files.stat(&dir.join("a/b")).await.unwrap().kind, FileKind::Directory);
    // A file where a parent should be.
    assert_eq!(
        code_of(
            "file as parent",
            files.write(WriteSpec::new(deep.join("x"), WriteMode::Create).with_parents())
        )
        .await,
        ErrorCode::NotADirectory
    );
    done(files, &dir).await;
    Ok(())
}

pub async fn atomic_replace_shows_old_or_new_never_a_mix(
    files: &dyn Files,
    base: &Path,
) -> Outcome {
    let dir = scratch(files, base, "atomic").await;
    let f = dir.join("cfg");
    write_all(files, WriteSpec::new(&f, WriteMode::Create).with_permissions(0o600), b"old")
        .await
        .unwrap();
    let mut w = files.write(WriteSpec::new(&f, WriteMode::Truncate).atomic()).await.unwrap();
    w.write(b"new ").await.unwrap();
    assert_eq!(get(files, &f).await, b"old", "a reader sees the old content until finish");
    w.write(b"content").await.unwrap();
    assert_eq!(get(files, &f).await, b"old");
    let st = w.finish().await.unwrap();
    assert_eq!(get(files, &f).await, b"new content");
    assert_eq!(st.mode, 0o600, "an atomic replace keeps the replaced file's bits: {st:?}");
    let names: Vec<_> = files.list(ListSpec::new(&dir)).await.unwrap().entries;
    assert_eq!(names.len(), 1, "no temp file left: {names:?}");
    // An atomic create of a new file.
    let g = dir.join("fresh");
    write_all(files, WriteSpec::new(&g, WriteMode::Create).atomic(), b"x").await.unwrap();
    assert_eq!(get(files, &g).await, b"x");
    done(files, &dir).await;
    Ok(())
}

pub async fn a_dropped_atomic_writer_leaves_the_target_and_no_temp(
    files: &dyn Files,
    base: &Path,
) -> Outcome {
    let dir = scratch(files, base, "dropped").await;
    let f = dir.join("keep");
    put(files, &f, b"original").await;
    let mut w = files.write(WriteSpec::new(&f, WriteMode::Truncate).atomic()).await.unwrap();
    w.write(b"half").await.unwrap();
    assert_eq!(files.list(ListSpec::new(&dir)).await.unwrap().entries.len(), 2, "temp beside");
    drop(w);
    // The temp file's removal is asynchronous to the drop: wait for it.
    within("the abandoned temp file to go", async {
        while files.list(ListSpec::new(&dir)).await.unwrap().entries.len() != 1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(get(files, &f).await, b"original");
    // A new file abandoned before finish never appears.
    let mut w =
        files.write(WriteSpec::new(dir.join("never"), WriteMode::Create).atomic()).await.unwrap();
    w.write(b"x").await.unwrap();
    drop(w);
    assert_eq!(code_of("abandoned", files.stat(&dir.join("never"))).await, ErrorCode::NotFound);
    done(files, &dir).await;
    Ok(())
}

pub async fn list_is_sorted_with_depth_and_limit(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "list").await;
    for p in ["b/y", "b/x", "a", "c/d/e"] {
        write_all(files, WriteSpec::new(dir.join(p), WriteMode::Create).with_parents(), b"1")
            .await
            .unwrap();
    }
    symlink(files, &dir, "l", "b").await;
    let rel = |l: &conch_seams::files::Listing| -> Vec<String> {
        l.entries.iter().map(|e| e.path.strip_prefix(&dir).unwrap().display().to_string()).collect()
    };
    let one = files.list(ListSpec::new(&dir)).await.unwrap();
    assert_eq!(rel(&one), ["a", "b", "c", "l"]);
    assert!(!one.truncated);
    let all = files.list(ListSpec::new(&dir).with_depth(9)).await.unwrap();
    assert_eq!(
        rel(&all),
        ["a", "b", "b/x", "b/y", "c", "c/d", "c/d/e", "l"],
        "sorted, a directory before its content, the symlinked dir not entered"
    );
    let two = files.list(ListSpec::new(&dir).with_depth(2)).await.unwrap();
    assert_eq!(rel(&two), ["a", "b", "b/x", "b/y", "c", "c/d", "l"]);
    let cut = files.list(ListSpec::new(&dir).with_depth(9).with_limit(3)).await.unwrap();
    assert_eq!((rel(&cut), cut.truncated), (vec!["a".into(), "b".into(), "b/x".into()], true));
    let exact = files.list(ListSpec::new(&dir).with_limit(4)).await.unwrap();
    assert!(!exact.truncated, "exactly the limit is not truncated");
    assert_eq!(
        code_of("depth 0", files.list(ListSpec::new(&dir).with_depth(0))).await,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code_of("list a file", files.list(ListSpec::new(dir.join("a")))).await,
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code_of("list missing", files.list(ListSpec::new(dir.join("zz")))).await,
        ErrorCode::NotFound
    );
    done(files, &dir).await;
    Ok(())
}

pub async fn make_dir_with_and_without_parents(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "mkdir").await;
    files.make_dir(&dir.join("one"), false).await.unwrap();
    assert_eq!(
        code_of("exists", files.make_dir(&dir.join("one"), false)).await,
        ErrorCode::AlreadyExists
    );
    files.make_dir(&dir.join("one"), true).await.unwrap();
    assert_eq!(
        code_of("missing parent", files.make_dir(&dir.join("x/y"), false)).await,
        ErrorCode::NotFound
    );
    files.make_dir(&dir.join("x/y/z"), true).await.unwrap();
    assert_eq!(files.stat(&dir.join("x/y/z")).await.unwrap().kind, FileKind::Directory);
    put(files, &dir.join("file"), b"").await;
    assert_eq!(
        code_of("under a file", files.make_dir(&dir.join("file/sub"), true)).await,
        ErrorCode::NotADirectory
    );
    done(files, &dir).await;
    Ok(())
}

pub async fn rename_overwrites_only_when_asked(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "rename").await;
    let (a, b) = (dir.join("a"), dir.join("b"));
    put(files, &a, b"A").await;
    put(files, &b, b"B").await;
    assert_eq!(
        code_of("no overwrite", files.rename(&a, &b, false)).await,
        ErrorCode::AlreadyExists
    );
    assert_eq!((get(files, &a).await, get(files, &b).await), (b"A".to_vec(), b"B".to_vec()));
    files.rename(&a, &b, true).await.unwrap();
    assert_eq!(get(files, &b).await, b"A");
    assert_eq!(code_of("gone", files.stat(&a)).await, ErrorCode::NotFound);
    files.rename(&b, &dir.join("c"), false).await.unwrap();
    assert_eq!(code_of("missing from", files.rename(&b, &a, false)).await, ErrorCode::NotFound);
    // A directory moves whole; replacing a non-empty directory is refused.
    write_all(files, WriteSpec::new(dir.join("d1/f"), WriteMode::Create).with_parents(), b"1")
        .await
        .unwrap();
    write_all(files, WriteSpec::new(dir.join("d2/f"), WriteMode::Create).with_parents(), b"2")
        .await
        .unwrap();
    assert_eq!(
        code_of("over a full dir", files.rename(&dir.join("d1"), &dir.join("d2"), true)).await,
        ErrorCode::DirectoryNotEmpty
    );
    files.rename(&dir.join("d1"), &dir.join("d3"), false).await.unwrap();
    assert_eq!(get(files, &dir.join("d3/f")).await, b"1");
    done(files, &dir).await;
    Ok(())
}

pub async fn remove_is_recursive_only_when_asked(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "remove").await;
    write_all(files, WriteSpec::new(dir.join("t/u/v"), WriteMode::Create).with_parents(), b"1")
        .await
        .unwrap();
    // A tree holding a symlink to a directory outside it: the link goes, the target stays.
    write_all(files, WriteSpec::new(dir.join("keep/k"), WriteMode::Create).with_parents(), b"k")
        .await
        .unwrap();
    symlink(files, &dir.join("t"), "out", "../keep").await;
    assert_eq!(
        code_of("non-empty", files.remove(&dir.join("t"), false)).await,
        ErrorCode::DirectoryNotEmpty
    );
    files.remove(&dir.join("t"), true).await.unwrap();
    assert_eq!(code_of("removed", files.stat(&dir.join("t"))).await, ErrorCode::NotFound);
    assert_eq!(get(files, &dir.join("keep/k")).await, b"k", "a symlink's target is not removed");
    symlink(files, &dir, "lk", "keep").await;
    files.remove(&dir.join("lk"), false).await.unwrap();
    assert_eq!(files.stat(&dir.join("keep")).await.unwrap().kind, FileKind::Directory);
    files.remove(&dir.join("keep/k"), false).await.unwrap();
    files.remove(&dir.join("keep"), false).await.unwrap();
    assert_eq!(
        code_of("missing", files.remove(&dir.join("keep"), true)).await,
        ErrorCode::NotFound
    );
    done(files, &dir).await;
    Ok(())
}

/// All of a byte stream.
async fn drain(mut s: Box<dyn conch_seams::files::ByteStream>) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = s.next_chunk().await.unwrap() {
        out.extend_from_slice(&chunk);
    }
    out
}

pub async fn tar_round_trip_keeps_modes_symlinks_and_nesting(
    files: &dyn Files,
    base: &Path,
) -> Outcome {
    let dir = scratch(files, base, "tar").await;
    let src = dir.join("src");
    for (p, mode, data) in
        [("run.sh", 0o755, &b"#!/bin/sh\n"[..]), ("a/b/c.txt", 0o600, b"deep"), ("a/e", 0o644, b"")]
    {
        let spec =
            WriteSpec::new(src.join(p), WriteMode::Create).with_parents().with_permissions(mode);
        write_all(files, spec, data).await.unwrap();
    }
    files.make_dir(&src.join("empty"), false).await.unwrap();
    symlink(files, &src.join("a"), "to-c", "b/c.txt").await;
    let archive = drain(files.export_tar(&src).await.unwrap()).await;
    let dst = dir.join("dst");
    let mut sink = files.import_tar(&dst).await.unwrap();
    for chunk in archive.chunks(1000) {
        sink.write(chunk).await.unwrap();
    }
    let n = sink.finish().await.unwrap();
    let listing = |root: PathBuf| async move {
        files
            .list(ListSpec::new(&root).with_depth(9))
            .await
            .unwrap()
            .entries
            .into_iter()
            .map(|e| {
                let rel = e.path.strip_prefix(&root).unwrap().to_owned();
                (rel, e.kind, e.mode, e.size, e.symlink_target)
            })
            .collect::<Vec<_>>()
    };
    let (want, got) = (listing(src.clone()).await, listing(dst.clone()).await);
    assert_eq!(got, want, "the imported tree is the exported one");
    assert_eq!(n, want.len() as u64, "every entry counted");
    for p in ["run.sh", "a/b/c.txt", "a/e"] {
        assert_eq!(get(files, &dst.join(p)).await, get(files, &src.join(p)).await, "{p}");
    }
    assert_eq!(get(files, &dst.join("a/to-c")).await, b"deep", "the link resolves inside");
    done(files, &dir).await;
    Ok(())
}

/// A one-entry archive whose name is written raw (builders refuse bad names).
pub fn raw_archive(name: &[u8], kind: tar::EntryType, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, data).unwrap();
    b.into_inner().unwrap()
}

async fn import_bytes(files: &dyn Files, dest: &Path, bytes: &[u8]) -> conch_seams::Result<u64> {
    let mut sink = files.import_tar(dest).await?;
    sink.write(bytes).await?;
    sink.finish().await
}

pub async fn tar_import_refuses_slips(files: &dyn Files, base: &Path) -> Outcome {
    let dir = scratch(files, base, "slip").await;
    let dest = dir.join("dest");
    let outside = dir.join("outside");
    files.make_dir(&outside, false).await.unwrap();
    let evil = dir.join("evil");
    let abs = outside.join("abs");
    for (what, bytes) in [
        ("..", raw_archive(b"../evil", tar::EntryType::Regular, b"", b"x")),
        ("a/../..", raw_archive(b"a/../../evil", tar::EntryType::Regular, b"", b"x")),
        (
            "absolute",
            raw_archive(abs.as_os_str().as_encoded_bytes(), tar::EntryType::Regular, b"", b"x"),
        ),
    ] {
        let r = import_bytes(files, &dest, &bytes).await;
        assert!(r.is_err(), "{what}: imported {r:?}");
        assert_eq!(code_of("evil", files.stat(&evil)).await, ErrorCode::NotFound, "{what}");
        assert_eq!(code_of("abs", files.stat(&abs)).await, ErrorCode::NotFound, "{what}");
    }
    // A symlink entry, then an entry below it: the second is refused.
    let mut two =
        raw_archive(b"out", tar::EntryType::Symlink, outside.as_os_str().as_encoded_bytes(), b"");
    two.truncate(two.len() - 1024); // drop the end blocks to append one more entry
    two.extend(raw_archive(b"out/planted", tar::EntryType::Regular, b"", b"x"));
    let r = import_bytes(files, &dest, &two).await;
    assert!(r.is_err(), "an entry below a symlink was imported: {r:?}");
    assert_eq!(
        code_of("planted", files.stat(&outside.join("planted"))).await,
        ErrorCode::NotFound,
        "nothing was written through the symlink"
    );
    // A file entry over an existing symlink replaces the link, never writes through it.
    symlink(files, &dest, "f", "../outside/target").await;
    put(files, &outside.join("target"), b"untouched").await;
    import_bytes(files, &dest, &raw_archive(b"f", tar::EntryType::Regular, b"", b"new"))
        .await
        .unwrap();
    assert_eq!(get(files, &outside.join("target")).await, b"untouched");
    assert_eq!(files.stat(&dest.join("f")).await.unwrap().kind, FileKind::File);
    // A truncated archive is an error.
    let mut cut = raw_archive(b"c", tar::EntryType::Regular, b"", &[7u8; 2000]);
    cut.truncate(1000);
    assert!(import_bytes(files, &dest, &cut).await.is_err(), "a truncated archive");
    done(files, &dir).await;
    Ok(())
}

/// Deterministic bytes for block `i` of a large file.
fn block(i: u64, len: usize) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(i.to_le_bytes());
    let seed = h.finalize();
    (0..len).map(|j| seed[j % 32] ^ (j as u8)).collect()
}

pub async fn a_large_file_streams_both_ways(files: &dyn Files, base: &Path) -> Outcome {
    const BLOCK: usize = 1 << 20;
    const BLOCKS: u64 = 64;
    let dir = scratch(files, base, "large").await;
    let f = dir.join("big.bin");
    let mut w = files.write(WriteSpec::new(&f, WriteMode::Create)).await.unwrap();
    let mut sent = Sha256::new();
    for i in 0..BLOCKS {
        let b = block(i, BLOCK);
        sent.update(&b);
        w.write(&b).await.unwrap();
    }
    let tail = b"and one more";
    sent.update(tail);
    w.write(tail).await.unwrap();
    let size = BLOCKS * BLOCK as u64 + tail.len() as u64;
    assert_eq!(w.finish().await.unwrap().size, size);
    let mut got = Sha256::new();
    let mut offset = 0u64;
    loop {
        let c = files.read(&f, offset, usize::MAX).await.unwrap();
        assert!(c.data.len() <= MAX_READ_CHUNK, "a chunk over the cap: {}", c.data.len());
        got.update(&c.data);
        offset += c.data.len() as u64;
        if c.eof {
            break;
        }
        assert!(!c.data.is_empty(), "an empty chunk before the end");
    }
    assert_eq!(offset, size);
    assert_eq!(got.finalize(), sent.finalize(), "sha256 of what was read back");
    done(files, &dir).await;
    Ok(())
}

async fn next(w: &mut Box<dyn conch_seams::files::WatchStream>, what: &str) -> WatchEvent {
    within(what, w.next_event()).await.unwrap().unwrap_or_else(|| panic!("{what}: watch ended"))
}

/// Waits for the first event that satisfies `want`, skipping others (a write may report
/// several modifications).
async fn until(
    w: &mut Box<dyn conch_seams::files::WatchStream>,
    what: &str,
    want: impl Fn(&WatchEvent) -> bool,
) -> WatchEvent {
    within(what, async {
        loop {
            let ev = next(w, what).await;
            if want(&ev) {
                return ev;
            }
        }
    })
    .await
}

pub async fn watch_reports_created_modified_renamed_removed(
    files: &dyn Files,
    base: &Path,
) -> Outcome {
    if !files.capabilities().watch {
        return skip(format!("{} cannot watch", files.provider_name()));
    }
    let dir = scratch(files, base, "watch").await;
    files.make_dir(&dir.join("sub"), false).await.unwrap();
    let mut w = files.watch(&dir, true).await.unwrap();
    let f = dir.join("sub/f");
    put(files, &f, b"1").await;
    until(&mut w, "created", |e| *e == WatchEvent::Created { path: f.clone() }).await;
    write_all(files, WriteSpec::new(&f, WriteMode::Append), b"2").await.unwrap();
    until(&mut w, "modified", |e| *e == WatchEvent::Modified { path: f.clone() }).await;
    let g = dir.join("g");
    files.rename(&f, &g, false).await.unwrap();
    until(&mut w, "renamed", |e| {
        *e == WatchEvent::Renamed { from: Some(f.clone()), to: Some(g.clone()) }
    })
    .await;
    files.remove(&g, false).await.unwrap();
    until(&mut w, "removed", |e| *e == WatchEvent::Removed { path: g.clone() }).await;
    // A directory made after the watch began is watched too, with nothing made in it lost.
    files.make_dir(&dir.join("later"), false).await.unwrap();
    let h = dir.join("later/h");
    put(files, &h, b"x").await;
    until(&mut w, "created in a new dir", |e| *e == WatchEvent::Created { path: h.clone() }).await;
    // A subdirectory's removal is reported too.
    files.remove(&dir.join("sub"), false).await.unwrap();
    until(&mut w, "dir removed", |e| *e == WatchEvent::Removed { path: dir.join("sub") }).await;
    assert_eq!(
        code_of("watch missing", files.watch(&dir.join("nope"), false)).await,
        ErrorCode::NotFound
    );
    // A move out of the watch is a rename to nowhere.
    let away = dir.with_extension("away");
    files.rename(&h, &away, false).await.unwrap();
    until(&mut w, "moved out", |e| *e == WatchEvent::Renamed { from: Some(h.clone()), to: None })
        .await;
    files.remove(&away, false).await.unwrap();
    // The watched directory's removal ends the stream.
    done(files, &dir).await;
    until(&mut w, "the root removed", |e| *e == WatchEvent::Removed { path: dir.clone() }).await;
    let end = within("the watch to end", w.next_event()).await.unwrap();
    assert_eq!(end, None, "the stream ends after its directory's removal");
    Ok(())
}
