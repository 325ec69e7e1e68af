//! The file tools (`tool-files`) over real files: `files-local` for what they do, and
//! `files-sandbox` for what a sandbox refuses.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use conch_registry::Runtime;
use conch_seams::files::SANDBOX_MARKER;
use conch_seams::{Error, ErrorCode, Owner, ToolOutput};
use conch_tools::{EDIT_MAX_BYTES, LIST_MAX_ENTRIES, READ_MAX_BYTES};
use serde_json::{Value, json};

use crate::{owner, runtime};

/// `files-local` rooted at `root`, and the file tools.
fn local(root: &Path) -> Runtime {
    runtime(&format!(
        "plugins:\n  files-local:\n    root: {}\n  tool-files: {{}}\n",
        root.display()
    ))
}

async fn ok(rt: &Runtime, o: &Arc<Owner>, tool: &str, args: Value) -> ToolOutput {
    rt.call(o, tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"))
}

async fn fail(rt: &Runtime, o: &Arc<Owner>, tool: &str, args: Value) -> Error {
    match rt.call(o, tool, args).await {
        Ok(out) => panic!("{tool} succeeded: {}", out.text),
        Err(e) => e,
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---- file_read ----

#[tokio::test]
async fn read_numbers_lines_and_pages_by_offset_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\n\nfour\nfive").unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    // Relative to the provider's root; every line, the last without a newline.
    let out = ok(&rt, &o, "file_read", json!({"path": "a.txt"})).await;
    assert_eq!(out.text, "     1\tone\n     2\ttwo\n     3\t\n     4\tfour\n     5\tfive\n");
    let s = out.structured.unwrap();
    assert_eq!(s["path"], dir.path().join("a.txt").display().to_string());
    assert_eq!((s["first_line"].as_u64(), s["lines"].as_u64()), (Some(1), Some(5)));
    assert_eq!(s["next_offset"], Value::Null);
    assert_eq!(s["stopped"], "end");
    // A window in the middle says where to continue.
    let abs = dir.path().join("a.txt");
    let out = ok(&rt, &o, "file_read", json!({"path": abs, "offset": 2, "limit": 2})).await;
    assert_eq!(
        out.text,
        "     2\ttwo\n     3\t\n[showed lines 2-3; the file has more (it is 18 bytes); continue \
         with offset 4]"
    );
    assert_eq!(out.structured.unwrap()["next_offset"], 4);
    // The window that reaches the end exactly has no note.
    let out = ok(&rt, &o, "file_read", json!({"path": "a.txt", "offset": 4, "limit": 2})).await;
    assert_eq!(out.text, "     4\tfour\n     5\tfive\n");
    rt.shutdown().await;
}

#[tokio::test]
async fn read_refuses_bad_offsets_and_limits_and_says_how_long_the_file_is() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "1\n2\n3\n").unwrap();
    std::fs::write(dir.path().join("empty"), "").unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let e = fail(&rt, &o, "file_read", json!({"path": "a.txt", "offset": 9})).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("`offset` 9 is past the end of"), "{e}");
    assert!(e.message().contains("which has 3 lines"), "{e}");
    for (arg, v) in [("offset", 0), ("limit", 0)] {
        let e = fail(&rt, &o, "file_read", json!({"path": "a.txt", arg: v})).await;
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains(&format!("`{arg}` must be at least 1")), "{e}");
    }
    let e = fail(&rt, &o, "file_read", json!({"path": "a.txt", "lines": 3})).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("expected one of `limit`, `offset`, `path`"), "{e}");
    let e = fail(&rt, &o, "file_read", json!({"path": ""})).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let out = ok(&rt, &o, "file_read", json!({"path": "empty"})).await;
    assert_eq!(out.text, format!("[{} is empty]", dir.path().join("empty").display()));
    let e = fail(&rt, &o, "file_read", json!({"path": "missing"})).await;
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    assert!(e.message().contains("missing"), "names the path: {e}");
    let e = fail(&rt, &o, "file_read", json!({"path": "."})).await;
    assert_eq!(e.code(), ErrorCode::IsADirectory, "{e}");
    rt.shutdown().await;
}

#[tokio::test]
async fn read_pages_through_a_large_file_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.txt");
    let content: String = (1..=12_345).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&path, &content).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let mut seen = Vec::new();
    let mut offset = 1;
    let mut calls = 0;
    loop {
        let out = ok(&rt, &o, "file_read", json!({"path": path, "offset": offset})).await;
        calls += 1;
        let s = out.structured.unwrap();
        for l in out.text.lines().filter(|l| !l.starts_with('[')) {
            let (n, text) = l.split_once('\t').unwrap();
            assert_eq!(n.trim().parse::<usize>().unwrap(), seen.len() + 1);
            seen.push(text.to_string());
        }
        match s["next_offset"].as_u64() {
            Some(next) => {
                assert!(out.text.ends_with(&format!("continue with offset {next}]")), "{s}");
                assert_eq!(next, seen.len() as u64 + 1);
                offset = next;
            }
            None => break,
        }
    }
    assert_eq!(calls, 7, "2000 lines a call by default");
    assert_eq!(seen.len(), 12_345);
    assert_eq!(seen.join("\n") + "\n", content);
    rt.shutdown().await;
}

#[tokio::test]
async fn read_stops_at_the_byte_cap_and_names_the_offset_that_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.txt");
    let line = "x".repeat(1500);
    let content: String = (0..1000).map(|_| format!("{line}\n")).collect();
    std::fs::write(&path, &content).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_read", json!({"path": path})).await;
    assert!(out.text.len() <= READ_MAX_BYTES, "{}", out.text.len());
    let s = out.structured.unwrap();
    assert_eq!(s["stopped"], "cap");
    let shown = s["lines"].as_u64().unwrap();
    assert!(shown > 100 && shown < 1000, "{shown}");
    let note = out.text.lines().last().unwrap();
    assert_eq!(
        note,
        format!(
            "[output limit of {READ_MAX_BYTES} bytes reached after lines 1-{shown}; continue \
             with offset {}]",
            shown + 1
        )
    );
    let out =
        ok(&rt, &o, "file_read", json!({"path": path, "offset": shown + 1, "limit": 1})).await;
    assert_eq!(out.text.lines().next().unwrap(), format!("{:>6}\t{line}", shown + 1));
    rt.shutdown().await;
}

#[tokio::test]
async fn read_cuts_long_lines_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.txt");
    let long = "y".repeat(3 << 20);
    std::fs::write(&path, format!("{long}\nafter\n")).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_read", json!({"path": path})).await;
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(
        lines[0],
        format!("     1\t{} [line cut: showing 2000 of its {} bytes]", "y".repeat(2000), 3 << 20)
    );
    assert_eq!(lines[1], "     2\tafter");
    assert_eq!(lines[2], "[1 line longer than 2000 bytes was cut]");
    assert_eq!(lines.len(), 3);
    assert_eq!(out.structured.unwrap()["cut_lines"], 1);
    rt.shutdown().await;
}

#[tokio::test]
async fn read_refuses_binary_files_with_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let nul = dir.path().join("nul.bin");
    std::fs::write(&nul, b"text\0more").unwrap();
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9\n").unwrap();
    // Past the sniffed 8 KiB, bytes that are not UTF-8 are shown as U+FFFD.
    let late = dir.path().join("late.txt");
    let mut bytes = "a\n".repeat(5000).into_bytes();
    bytes.extend_from_slice(b"caf\xe9\n");
    std::fs::write(&late, &bytes).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let e = fail(&rt, &o, "file_read", json!({"path": nul})).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        e.message(),
        format!(
            "{} is a binary file (9 bytes; a NUL byte at offset 4 in its first 8192 bytes): \
             file_read shows text only",
            nul.display()
        )
    );
    let e = fail(&rt, &o, "file_read", json!({"path": latin1})).await;
    assert!(e.message().contains("(5 bytes; bytes that are not UTF-8 at offset 3"), "{e}");
    let out = ok(&rt, &o, "file_read", json!({"path": late, "offset": 5001})).await;
    assert_eq!(out.text, "  5001\tcaf\u{fffd}\n");
    rt.shutdown().await;
}

// ---- file_write ----

#[tokio::test]
async fn write_creates_then_replaces_atomically_keeping_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_write", json!({"path": "f.txt", "content": "first\n"})).await;
    let path = dir.path().join("f.txt");
    assert_eq!(out.text, format!("created {} (6 bytes written)", path.display()));
    let s = out.structured.unwrap();
    assert_eq!((s["created"].as_bool(), s["bytes"].as_u64()), (Some(true), Some(6)));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "first\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    // A reader that opened the old file keeps the old content whole: the new one was
    // renamed over it, never written into it.
    let mut old = std::fs::File::open(&path).unwrap();
    let out = ok(&rt, &o, "file_write", json!({"path": path, "content": "second, longer\n"})).await;
    assert_eq!(out.text, format!("replaced {} (15 bytes written)", path.display()));
    assert_eq!(out.structured.unwrap()["created"], false);
    let mut was = String::new();
    std::io::Read::read_to_string(&mut old, &mut was).unwrap();
    assert_eq!(was, "first\n");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "second, longer\n");
    assert_eq!(mode(&path), 0o640);
    assert_eq!(names_in(dir.path()), ["f.txt"], "no temporary file left behind");
    // Empty content is a write too.
    ok(&rt, &o, "file_write", json!({"path": path, "content": ""})).await;
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    rt.shutdown().await;
}

#[tokio::test]
async fn write_makes_parents_only_with_create_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let e = fail(&rt, &o, "file_write", json!({"path": "a/b/c.txt", "content": "x"})).await;
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    assert!(e.message().ends_with("pass create_dirs: true to create missing directories"), "{e}");
    assert!(names_in(dir.path()).is_empty(), "nothing made");
    let args = json!({"path": "a/b/c.txt", "content": "x", "create_dirs": false});
    assert_eq!(fail(&rt, &o, "file_write", args).await.code(), ErrorCode::NotFound);
    let args = json!({"path": "a/b/c.txt", "content": "x", "create_dirs": true});
    let out = ok(&rt, &o, "file_write", args).await;
    assert!(out.text.starts_with("created "), "{}", out.text);
    assert_eq!(std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(), "x");
    let e = fail(&rt, &o, "file_write", json!({"path": "a", "content": "x"})).await;
    assert_eq!(e.code(), ErrorCode::IsADirectory, "{e}");
    let e = fail(&rt, &o, "file_write", json!({"path": "a/b/c.txt"})).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("missing field `content`"), "{e}");
    rt.shutdown().await;
}

#[tokio::test]
async fn write_through_a_symlink_writes_its_target() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("target.txt"), "old").unwrap();
    std::os::unix::fs::symlink("target.txt", dir.path().join("link")).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_write", json!({"path": "link", "content": "new"})).await;
    assert!(out.text.starts_with("replaced "), "{}", out.text);
    assert!(std::fs::symlink_metadata(dir.path().join("link")).unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(dir.path().join("target.txt")).unwrap(), "new");
    rt.shutdown().await;
}

// ---- file_edit ----

#[tokio::test]
async fn edit_replaces_one_exact_string_and_shows_the_lines_around_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.rs");
    let content: String = (1..=12).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&path, &content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o751)).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let args = json!({"path": "e.rs", "old_string": "line 6\n", "new_string": "six\nSIX\n"});
    let out = ok(&rt, &o, "file_edit", args).await;
    assert_eq!(
        out.text,
        format!(
            "edited {}: replaced 1 occurrence\n     3\tline 3\n     4\tline 4\n     5\tline 5\n     \
             6\tsix\n     7\tSIX\n     8\tline 7\n     9\tline 8\n    10\tline 9\n",
            path.display()
        )
    );
    let s = out.structured.unwrap();
    assert_eq!(s["replacements"], 1);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), content.replace("line 6\n", "six\nSIX\n"));
    assert_eq!(mode(&path), 0o751, "the mode survives the atomic replace");
    assert_eq!(names_in(dir.path()), ["e.rs"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn edit_refuses_absent_empty_unchanged_and_ambiguous_strings_and_leaves_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.txt");
    let content = "a = 1\nb = 1\nc = 1\n";
    std::fs::write(&path, content).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let edit = |old: &str, new: &str| json!({"path": path, "old_string": old, "new_string": new});
    let e = fail(&rt, &o, "file_edit", edit("d = 1", "d = 2")).await;
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().starts_with("`old_string` does not occur in "), "{e}");
    let e = fail(&rt, &o, "file_edit", edit("", "x")).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("`old_string` is empty"), "{e}");
    let e = fail(&rt, &o, "file_edit", edit("a = 1", "a = 1")).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("`new_string` is the same as `old_string`"), "{e}");
    let e = fail(&rt, &o, "file_edit", edit("= 1", "= 2")).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        e.message(),
        format!(
            "`old_string` occurs 3 times in {} (at lines 1, 2, 3); add surrounding text to make \
             it unique, or pass replace_all: true to replace every one",
            path.display()
        )
    );
    let mut args = edit("= 1", "= 2");
    args["replace_all"] = json!(false);
    assert_eq!(fail(&rt, &o, "file_edit", args).await.code(), ErrorCode::InvalidArgument);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), content, "untouched by refusals");
    let e =
        fail(&rt, &o, "file_edit", json!({"path": "nope", "old_string": "a", "new_string": "b"}))
            .await;
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().contains("nope does not exist"), "{e}");
    let e = fail(&rt, &o, "file_edit", json!({"path": ".", "old_string": "a", "new_string": "b"}))
        .await;
    assert_eq!(e.code(), ErrorCode::IsADirectory);
    // replace_all replaces every one.
    let mut args = edit("= 1", "= 2");
    args["replace_all"] = json!(true);
    let out = ok(&rt, &o, "file_edit", args).await;
    assert!(out.text.starts_with(&format!("edited {}: replaced 3 occurrences\n", path.display())));
    assert!(out.text.ends_with("     1\ta = 2\n     2\tb = 2\n     3\tc = 2\n"), "{}", out.text);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a = 2\nb = 2\nc = 2\n");
    rt.shutdown().await;
}

#[tokio::test]
async fn edit_refuses_binary_non_utf8_and_too_large_files() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("b.bin");
    std::fs::write(&bin, b"a\0b").unwrap();
    let late = dir.path().join("late.txt");
    let mut bytes = "a\n".repeat(5000).into_bytes();
    bytes.extend_from_slice(b"\xff\n");
    std::fs::write(&late, &bytes).unwrap();
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "a".repeat(EDIT_MAX_BYTES as usize + 1)).unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let edit = |p: &Path| json!({"path": p, "old_string": "a", "new_string": "c"});
    let e = fail(&rt, &o, "file_edit", edit(&bin)).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("is a binary file (3 bytes; a NUL byte at offset 1)"), "{e}");
    let e = fail(&rt, &o, "file_edit", edit(&late)).await;
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("is not UTF-8 text (bytes that are not UTF-8 at offset 10000)"));
    let e = fail(&rt, &o, "file_edit", edit(&big)).await;
    assert_eq!(e.code(), ErrorCode::TooLarge);
    assert_eq!(
        e.message(),
        format!(
            "{} is {} bytes; file_edit edits files up to {EDIT_MAX_BYTES} bytes (8 MiB)",
            big.display(),
            EDIT_MAX_BYTES + 1
        )
    );
    assert_eq!(std::fs::read(&bin).unwrap(), b"a\0b");
    assert_eq!(std::fs::read(&late).unwrap(), bytes);
    rt.shutdown().await;
}

// ---- file_list ----

#[tokio::test]
async fn list_shows_type_size_and_name_to_the_depth_asked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/deep/deeper")).unwrap();
    std::fs::write(root.join("README"), "12345").unwrap();
    std::fs::write(root.join("src/lib.rs"), "fn x() {}\n").unwrap();
    std::fs::write(root.join("src/deep/deeper/z"), "").unwrap();
    std::os::unix::fs::symlink("src", root.join("link")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    let rt = local(root);
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_list", json!({"path": "."})).await;
    assert_eq!(
        out.text,
        "file                 5  README\n\
         directory            -  empty/\n\
         symlink              -  link -> src\n\
         directory            -  src/\n"
    );
    let s = out.structured.unwrap();
    assert_eq!(s["depth"], 1);
    assert_eq!(s["truncated"], false);
    assert_eq!(
        s["entries"][0],
        json!({"name": "README", "type": "file", "size": 5, "symlink_target": null})
    );
    let out = ok(&rt, &o, "file_list", json!({"path": root.join("src"), "depth": 2})).await;
    assert_eq!(
        out.text,
        "directory            -  deep/\n\
         directory            -  deep/deeper/\n\
         file                10  lib.rs\n"
    );
    let out = ok(&rt, &o, "file_list", json!({"path": "src", "depth": 5})).await;
    assert!(out.text.contains("  deep/deeper/z\n"), "{}", out.text);
    let out = ok(&rt, &o, "file_list", json!({"path": "empty"})).await;
    assert_eq!(out.text, format!("[{} is empty]", root.join("empty").display()));
    for depth in [0, 6] {
        let e = fail(&rt, &o, "file_list", json!({"path": ".", "depth": depth})).await;
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains(&format!("`depth` must be 1 to 5, not {depth}")), "{e}");
    }
    let e = fail(&rt, &o, "file_list", json!({"path": "README"})).await;
    assert_eq!(e.code(), ErrorCode::NotADirectory, "{e}");
    let e = fail(&rt, &o, "file_list", json!({"path": "gone"})).await;
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    rt.shutdown().await;
}

#[tokio::test]
async fn list_stops_at_its_entry_cap_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..LIST_MAX_ENTRIES + 5 {
        std::fs::write(dir.path().join(format!("f{i:05}")), "").unwrap();
    }
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let out = ok(&rt, &o, "file_list", json!({"path": "."})).await;
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines.len(), LIST_MAX_ENTRIES + 1);
    assert_eq!(
        lines[LIST_MAX_ENTRIES],
        format!(
            "[listing stopped at {LIST_MAX_ENTRIES} entries; list a subdirectory or use a lower \
             depth to see the rest]"
        )
    );
    assert_eq!(out.structured.unwrap()["truncated"], true);
    rt.shutdown().await;
}

// ---- under a sandbox ----

/// `files-sandbox` under workspace-write with `workspace` as its root.
fn sandboxed(workspace: &Path) -> Runtime {
    runtime(&format!(
        "plugins:\n  sandbox-policy:\n    mode: workspace-write\n    workspace_root: {}\n  \
         files-sandbox: {{}}\n  tool-files: {{}}\n",
        workspace.display()
    ))
}

#[tokio::test]
async fn a_sandbox_denial_keeps_its_marker_and_leaves_nothing_on_disk() {
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "keep\n").unwrap();
    let rt = sandboxed(workspace.path());
    let (o, _) = owner("s");
    // Inside the workspace, relative to it: allowed.
    ok(&rt, &o, "file_write", json!({"path": "in.txt", "content": "ok\n"})).await;
    assert_eq!(std::fs::read_to_string(workspace.path().join("in.txt")).unwrap(), "ok\n");
    let denied = [
        ("file_write", json!({"path": outside.path().join("new.txt"), "content": "x"})),
        (
            "file_write",
            json!({"path": outside.path().join("d/new.txt"), "content": "x", "create_dirs": true}),
        ),
        ("file_write", json!({"path": victim, "content": "x"})),
        ("file_edit", json!({"path": victim, "old_string": "keep", "new_string": "lost"})),
    ];
    for (tool, args) in denied {
        let e = fail(&rt, &o, tool, args.clone()).await;
        assert_eq!(e.code(), ErrorCode::SandboxDenied, "{tool} {args}: {e}");
        assert!(e.message().starts_with(SANDBOX_MARKER), "{tool} {args}: {e}");
    }
    assert_eq!(names_in(outside.path()), ["victim.txt"], "nothing made outside");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    // A symlink in the workspace does not lead a write out of it.
    std::os::unix::fs::symlink(&victim, workspace.path().join("out")).unwrap();
    let e = fail(&rt, &o, "file_write", json!({"path": "out", "content": "x"})).await;
    assert_eq!(e.code(), ErrorCode::SandboxDenied, "{e}");
    assert!(e.message().starts_with(SANDBOX_MARKER), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert_eq!(names_in(outside.path()), ["victim.txt"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_fifo_is_refused_by_name_and_never_opened() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let rt = local(dir.path());
    let (o, _) = owner("s");
    // Opening it would block until a writer came: each tool refuses before that.
    for (tool, args) in [
        ("file_read", json!({"path": "pipe"})),
        ("file_write", json!({"path": "pipe", "content": "x"})),
        ("file_edit", json!({"path": "pipe", "old_string": "a", "new_string": "b"})),
    ] {
        let e = fail(&rt, &o, tool, args).await;
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{tool}: {e}");
        assert_eq!(
            e.message(),
            format!("{} is not a regular file (a FIFO, socket or device)", fifo.display()),
            "{tool}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn an_absent_old_string_in_a_crlf_file_says_how_its_lines_end() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.txt"), "a\r\nb\r\n").unwrap();
    let rt = local(dir.path());
    let (o, _) = owner("s");
    let args = json!({"path": "w.txt", "old_string": "a\nb", "new_string": "c"});
    let e = fail(&rt, &o, "file_edit", args).await;
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().ends_with("; the file's lines end in \\r\\n"), "{e}");
    let args = json!({"path": "w.txt", "old_string": "a\r\nb", "new_string": "c"});
    ok(&rt, &o, "file_edit", args).await;
    assert_eq!(std::fs::read(dir.path().join("w.txt")).unwrap(), b"c\r\n");
    rt.shutdown().await;
}
