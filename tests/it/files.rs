//! The files suite for `files-local` and `files-sandbox` (danger-full-access, and
//! workspace-write with the scratch directory inside the root); the files sandbox suite for
//! `files-sandbox` built from the `sandbox` composition (its policy, a fresh workspace root
//! per case) and in read-only mode; and the same escapes tried through `bash-sandbox` under
//! both runners, which must refuse them too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use conch_config::Composition;
use conch_env::ShellEnv;
use conch_provider_files::HostFiles;
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_sandbox::{BwrapSandbox, LandlockSandbox};
use conch_provider_shell::{BashLocal, BashLocalConfig};
use conch_registry::Runtime;
use conch_seams::files::Files;
use conch_seams::{Sandbox, SandboxMode, SandboxPolicy, ShellExecRequest, ShellExecutor};

fn local() -> (Arc<dyn Files>, PathBuf, tempfile::TempDir) {
    let t = tempfile::tempdir().unwrap();
    (Arc::new(HostFiles::local(t.path())), t.path().to_owned(), t)
}

mod files_local {
    use super::*;
    conch_conformance::files_suite!(local);
}

mod files_sandbox_danger_full_access {
    use super::*;
    conch_conformance::files_suite!(|| {
        let t = tempfile::tempdir().unwrap();
        let policy = SandboxPolicy::new(SandboxMode::DangerFullAccess, "/nonexistent-root");
        let files: Arc<dyn Files> = Arc::new(HostFiles::sandboxed(t.path(), &policy));
        (files, t.path().to_owned(), t)
    });
}

mod files_sandbox_workspace_write {
    use super::*;
    conch_conformance::files_suite!(|| {
        let t = tempfile::tempdir().unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, t.path());
        let files: Arc<dyn Files> = Arc::new(HostFiles::sandboxed(t.path(), &policy));
        (files, t.path().join("scratch"), t)
    });
}

/// The embedded `sandbox` composition (which binds `files-sandbox`), rooted at `root` in
/// `mode`.
fn sandbox_composition(root: &Path, mode: SandboxMode) -> Runtime {
    let yaml = conch::EMBEDDED.iter().find(|(n, _)| *n == "sandbox").unwrap().1;
    assert!(
        yaml.contains("\n  files-sandbox: {}\n"),
        "the sandbox composition binds files-sandbox"
    );
    let composition = Composition::from_yaml("sandbox.yaml", yaml)
        .unwrap()
        .with_setting("sandbox-policy", "workspace_root", root.display().to_string())
        .with_setting("sandbox-policy", "mode", mode.as_str());
    conch::link_all();
    Runtime::build(&composition, ShellEnv::new("/tmp/conch-test-home".into()))
        .unwrap_or_else(|e| panic!("the sandbox composition with files-sandbox builds: {e}"))
}

/// files-sandbox from the composition, its policy, and what keeps both alive.
fn from_composition(
    mode: SandboxMode,
) -> (Arc<dyn Files>, SandboxPolicy, (Runtime, tempfile::TempDir)) {
    let t = tempfile::tempdir().unwrap();
    let rt = sandbox_composition(t.path(), mode);
    let files = rt.seams().files.clone().expect("files-sandbox is bound");
    assert_eq!(files.provider_name(), "files-sandbox");
    // The policy the `sandbox` composition's entry describes, at this root.
    let policy = SandboxPolicy::new(mode, t.path());
    (files, policy, (rt, t))
}

mod files_sandbox_escapes {
    use super::*;
    conch_conformance::files_sandbox_suite!(|| from_composition(SandboxMode::WorkspaceWrite));
}

mod files_sandbox_read_only {
    use super::*;
    conch_conformance::files_sandbox_suite!(@cases || from_composition(SandboxMode::ReadOnly);
        read_only_mode_refuses_every_write);
}

#[test]
fn files_local_builds_from_a_composition_with_its_root() {
    let t = tempfile::tempdir().unwrap();
    let yaml = format!("plugins:\n  files-local:\n    root: {}\n", t.path().display());
    let rt = crate::runtime(&yaml);
    let files = rt.seams().files.clone().expect("files-local is bound");
    assert_eq!((files.provider_name(), files.default_dir()), ("files-local", t.path()));
    let bad = conch::build_runtime_from_yaml(
        "bad.yaml",
        "plugins:\n  files-local:\n    root: relative\n",
        ShellEnv::new("/tmp/conch-test-home".into()),
    );
    let Err(err) = bad else { panic!("a relative root is refused") };
    let err = err.to_string();
    assert!(err.contains("root") && err.contains("absolute"), "{err}");
}

#[test]
fn files_sandbox_without_a_policy_says_what_it_needs() {
    let built = conch::build_runtime_from_yaml(
        "nopolicy.yaml",
        "plugins:\n  files-sandbox: {}\n",
        ShellEnv::new("/tmp/conch-test-home".into()),
    );
    let Err(err) = built else { panic!("files-sandbox needs sandbox-policy") };
    let err = err.to_string();
    assert!(err.contains("sandbox-policy"), "{err}");
}

/// The helper binary the runners exec.
fn helper() -> PathBuf {
    env!("CARGO_BIN_EXE_conch-sandbox-exec-test").into()
}

/// The escapes the files sandbox suite tries, as shell commands run in the room (`$R` the
/// workspace root, `$I` a directory inside it, `$O` one outside), each with what must hold
/// afterwards.
const SHELL_ESCAPES: &[(&str, &str)] = &[
    ("write outside", "echo x > \"$O/new\""),
    ("overwrite outside", "echo x > \"$O/keep\""),
    ("mkdir outside", "mkdir \"$O/new\""),
    ("rename outside in", "mv \"$O/keep\" \"$I/stolen\""),
    ("absolute symlink out", "ln -s \"$O\" \"$I/out\" && echo x > \"$I/out/new\""),
    ("final symlink out", "ln -s \"$O/keep\" \"$I/fk\" && echo x > \"$I/fk\""),
    ("`..` out", "echo x > \"$I/../..$O/new\""),
    ("/proc/self/root", "echo x > \"/proc/self/root$O/new\""),
    ("a hook", "echo x > \"$R/.git/hooks/pre-commit\""),
    ("a hook via a symlink", "ln -s .git/hooks \"$R/hk\" && echo x > \"$R/hk/pre-commit\""),
    ("the config", "echo x >> \"$R/.git/config\""),
    ("rename .git", "mv \"$R/.git\" \"$R/git-old\""),
    ("remove .git", "rm -rf \"$R/.git\""),
];

/// Panics unless nothing the escapes aim at changed.
fn assert_room_intact(root: &Path, out: &Path, what: &str) {
    let mut names: Vec<_> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["keep"], "{what}: something appeared outside");
    assert_eq!(std::fs::read_to_string(out.join("keep")).unwrap(), "outside", "{what}");
    assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]\n", "{what}");
    let hooks: Vec<_> = std::fs::read_dir(root.join(".git/hooks"))
        .unwrap_or_else(|e| panic!("{what}: .git/hooks: {e}"))
        .collect();
    assert!(hooks.is_empty(), "{what}: a hook was written");
}

/// Every shell escape, through `bash-sandbox` over `sandbox`, must leave the room intact;
/// the same escapes through files-sandbox are refused (the files sandbox suite).
async fn the_shell_refuses_the_escapes(sandbox: Arc<dyn Sandbox>) {
    let caps = sandbox.capabilities();
    if !caps.modes.contains(&SandboxMode::WorkspaceWrite) {
        crate_visible_skip(&format!(
            "{} cannot confine here ({}): the shell half of the files escape comparison",
            sandbox.provider_name(),
            caps.enforcement
        ));
        return;
    }
    for (what, script) in SHELL_ESCAPES {
        let root = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let inside = root.path().join("in");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(root.path().join(".git/hooks")).unwrap();
        std::fs::write(root.path().join(".git/config"), "[core]\n").unwrap();
        std::fs::write(out.path().join("keep"), "outside").unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, root.path());
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let shell =
            BashLocal::sandboxed(BashLocalConfig::default(), sub, Arc::clone(&sandbox), policy)
                .unwrap();
        let script = format!(
            "R={}; I={}; O={}; {script}",
            root.path().display(),
            inside.display(),
            out.path().display()
        );
        let spec = shell.resolve(ShellExecRequest::new(script)).unwrap();
        let r = shell.run(spec).await.unwrap();
        assert_room_intact(
            root.path(),
            out.path(),
            &format!("{}: {what}", sandbox.provider_name()),
        );
        assert!(!r.status.success(), "{what}: the shell reported success: {}", r.output.text);
        // The same escape through files-sandbox, in a room of the same shape.
        files_refuses(what, root.path(), &inside, out.path()).await;
    }
}

/// The files-sandbox half: the escape `what` through the seam, refused and without effect.
async fn files_refuses(what: &str, root: &Path, inside: &Path, out: &Path) {
    use conch_conformance::files_sandbox::assert_denied;
    use conch_seams::WriteMode;
    use conch_seams::files::{WriteSpec, write_all};
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, root);
    let files = HostFiles::sandboxed(root, &policy);
    let w = |p: PathBuf, mode| write_all(&files, WriteSpec::new(p, mode), b"x");
    let ups = inside.components().count();
    let dotdot: PathBuf = std::iter::once(inside.to_owned())
        .chain(std::iter::repeat_n(PathBuf::from(".."), ups))
        .collect::<PathBuf>()
        .join(out.strip_prefix("/").unwrap());
    let r: conch_seams::Result<()> = match what {
        "write outside" => w(out.join("new"), WriteMode::Create).await.map(drop),
        "overwrite outside" => w(out.join("keep"), WriteMode::Truncate).await.map(drop),
        "mkdir outside" => files.make_dir(&out.join("new"), false).await,
        "rename outside in" => files.rename(&out.join("keep"), &inside.join("stolen"), false).await,
        "absolute symlink out" => {
            let _ = std::fs::remove_file(inside.join("out"));
            std::os::unix::fs::symlink(out, inside.join("out")).unwrap();
            w(inside.join("out/new"), WriteMode::Create).await.map(drop)
        }
        "final symlink out" => {
            let _ = std::fs::remove_file(inside.join("fk"));
            std::os::unix::fs::symlink(out.join("keep"), inside.join("fk")).unwrap();
            w(inside.join("fk"), WriteMode::Truncate).await.map(drop)
        }
        "`..` out" => w(dotdot.join("new"), WriteMode::Create).await.map(drop),
        "/proc/self/root" => w(
            Path::new("/proc/self/root").join(out.strip_prefix("/").unwrap()).join("new"),
            WriteMode::Create,
        )
        .await
        .map(drop),
        "a hook" => w(root.join(".git/hooks/pre-commit"), WriteMode::Create).await.map(drop),
        "a hook via a symlink" => {
            let _ = std::fs::remove_file(root.join("hk"));
            std::os::unix::fs::symlink(".git/hooks", root.join("hk")).unwrap();
            w(root.join("hk/pre-commit"), WriteMode::Create).await.map(drop)
        }
        "the config" => w(root.join(".git/config"), WriteMode::Append).await.map(drop),
        "rename .git" => files.rename(&root.join(".git"), &root.join("git-old"), false).await,
        "remove .git" => files.remove(&root.join(".git"), true).await,
        other => panic!("no files-sandbox form for {other}"),
    };
    assert_denied(&format!("files-sandbox: {what}"), r);
    assert_room_intact(root, out, &format!("files-sandbox: {what}"));
}

fn crate_visible_skip(line: &str) {
    conch_conformance::visible_line(&format!("skipped: {line}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_refused_to_files_sandbox_are_refused_to_bash_sandbox_under_landlock() {
    the_shell_refuses_the_escapes(Arc::new(LandlockSandbox::new(helper()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_refused_to_files_sandbox_are_refused_to_bash_sandbox_under_bwrap() {
    the_shell_refuses_the_escapes(Arc::new(BwrapSandbox::new(Path::new("bwrap"), helper()))).await;
}

/// `files-sandbox` refuses what its policy hides, as the confined shell cannot see it: reads
/// and writes, spelled directly, through `..` or through a symlink; listings and tar exports
/// that reach a hidden directory show it and nothing in it; the own root beneath it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_sandbox_refuses_hidden_paths() {
    use conch_conformance::files_sandbox::assert_denied;
    use conch_seams::WriteMode;
    use conch_seams::files::{ListSpec, WriteSpec, read_all, write_all};
    let t = tempfile::tempdir().unwrap();
    let top = std::fs::canonicalize(t.path()).unwrap();
    let hidden = top.join("sandboxes");
    let ws = hidden.join("mine");
    let theirs = hidden.join("theirs");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("secret"), "their-secret").unwrap();
    let token = top.join("token");
    std::fs::write(&token, "file-secret").unwrap();
    std::os::unix::fs::symlink(theirs.join("secret"), ws.join("link")).unwrap();
    std::os::unix::fs::symlink(&hidden, top.join("dirlink")).unwrap();
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &ws)
        .with_hidden_paths(vec![hidden.clone(), token.clone()]);
    let files = HostFiles::sandboxed(&ws, &policy);
    let secret = theirs.join("secret");
    for p in [
        secret.clone(),
        ws.join("../theirs/secret"),
        ws.join("link"),
        top.join("dirlink/theirs/secret"),
        token.clone(),
    ] {
        assert_denied(&format!("read {}", p.display()), read_all(&files, &p, 1 << 20).await);
        assert_denied(&format!("stat {}", p.display()), files.stat(&p).await);
    }
    assert_denied("list hidden", files.list(ListSpec::new(&hidden)).await);
    // The server's /proc is never the sandbox's, hidden or not.
    for p in ["/proc/self/environ", "/proc/self/cmdline", "/proc/1/status"] {
        assert_denied(p, read_all(&files, Path::new(p), 1 << 20).await);
    }
    // Nor are the host's devices, but for the ones that hold nothing.
    let devices = ["/dev/tty0", "/dev/kmsg", "/dev/vda", "/dev/sda"];
    let present: Vec<&str> = devices.into_iter().filter(|d| Path::new(d).exists()).collect();
    assert!(!present.is_empty(), "none of {devices:?} on this machine");
    for d in present {
        // Refused by the guard, or by the kernel before it (a disk: `EPERM` even as root).
        let r = read_all(&files, Path::new(d), 16).await;
        assert!(
            r.as_ref().is_err_and(|e| matches!(
                e.code(),
                conch_seams::ErrorCode::SandboxDenied | conch_seams::ErrorCode::PermissionDenied
            )),
            "{d}: {r:?}"
        );
    }
    assert_eq!(read_all(&files, Path::new("/dev/null"), 16).await.unwrap(), b"");
    std::os::unix::fs::symlink("/proc/self/environ", ws.join("env")).unwrap();
    assert_denied("a link to /proc", read_all(&files, &ws.join("env"), 1 << 20).await);
    assert_denied("list theirs", files.list(ListSpec::new(top.join("dirlink/theirs"))).await);
    assert_denied("export theirs", files.export_tar(&theirs).await.map(drop));
    assert_denied("watch theirs", files.watch(&theirs, false).await.map(drop));
    let w = |p: PathBuf| write_all(&files, WriteSpec::new(p, WriteMode::Create), b"x");
    assert_denied("write into theirs", w(theirs.join("planted")).await);
    assert_denied("write into hidden", w(hidden.join("new")).await);
    assert!(!theirs.join("planted").exists() && !hidden.join("new").exists());
    // A listing from above shows the hidden directory and nothing in it.
    let listed = files.list(ListSpec::new(&top).with_depth(4)).await.unwrap();
    let names: Vec<PathBuf> = listed.entries.iter().map(|e| e.path.clone()).collect();
    assert!(names.contains(&hidden), "{names:?}");
    assert!(!names.iter().any(|p| p.starts_with(&hidden) && p != &hidden), "{names:?}");
    // So does a tar export.
    let mut tar = files.export_tar(&top).await.unwrap();
    let mut bytes = Vec::new();
    while let Some(c) = tar.next_chunk().await.unwrap() {
        bytes.extend(c);
    }
    let mut archive = tar::Archive::new(bytes.as_slice());
    let entries: Vec<PathBuf> =
        archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().into_owned()).collect();
    assert!(entries.iter().any(|p| p == Path::new("sandboxes")), "{entries:?}");
    let inside = |p: &PathBuf| p.starts_with("sandboxes") && p != Path::new("sandboxes");
    assert!(!entries.iter().any(inside), "{entries:?}");
    assert!(!entries.iter().any(|p| p == Path::new("token")), "{entries:?}");
    assert!(!names.contains(&token), "{names:?}");
    // The own root beneath the hidden directory works as ever.
    w(ws.join("own")).await.unwrap();
    assert_eq!(read_all(&files, &ws.join("own"), 100).await.unwrap(), b"x");
    assert_eq!(files.list(ListSpec::new(&ws)).await.unwrap().entries.len(), 3);
}

/// A sandbox's workspace `mine` and another's, `theirs` (holding `their-secret.txt`), both
/// in a hidden directory; and a thread that swaps `mine/d` between a real directory (holding
/// `secret.txt`) and a symlink to `theirs`, by rename, until told to stop.
struct SwapRoom {
    _t: tempfile::TempDir,
    ws: PathBuf,
    files: HostFiles,
    stop: Arc<std::sync::atomic::AtomicBool>,
    swapper: Option<std::thread::JoinHandle<u64>>,
}

impl SwapRoom {
    fn new() -> Self {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        let hidden = top.join("sandboxes");
        let ws = hidden.join("mine");
        let theirs = hidden.join("theirs");
        std::fs::create_dir_all(ws.join("d.real")).unwrap();
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::write(theirs.join("secret.txt"), "THEIR-SECRET").unwrap();
        std::fs::write(theirs.join("their-secret.txt"), "THEIR-SECRET").unwrap();
        std::fs::write(ws.join("d.real/secret.txt"), "mine").unwrap();
        std::os::unix::fs::symlink(&theirs, ws.join("d.link")).unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &ws)
            .with_hidden_paths(vec![hidden.clone()]);
        let files = HostFiles::sandboxed(&ws, &policy);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (ws, stop) = (ws.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let (d, real, link) = (ws.join("d"), ws.join("d.real"), ws.join("d.link"));
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::rename(&real, &d);
                    let _ = std::fs::rename(&d, &real);
                    let _ = std::fs::rename(&link, &d);
                    let _ = std::fs::rename(&d, &link);
                    swaps += 1;
                }
                swaps
            })
        };
        Self { _t: t, ws, files, stop, swapper: Some(swapper) }
    }

    /// Stops the swapping; how many swaps there were.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.swapper.take().unwrap().join().unwrap()
    }
}

/// Reads racing the swap never return the hidden file's bytes (each read checks that what it
/// opened is what the path names with no symlink followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swap_racing_reads_never_reaches_a_hidden_path() {
    use conch_seams::files::read_all;
    let room = SwapRoom::new();
    let (mut leaked, mut ok, mut refused) = (0, 0, 0);
    for _ in 0..20_000 {
        match read_all(&room.files, &room.ws.join("d/secret.txt"), 100).await {
            Ok(b) if b == b"THEIR-SECRET" => leaked += 1,
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(room.stop() > 0);
    assert_eq!(leaked, 0, "reads that returned the hidden file ({ok} own, {refused} refused)");
}

/// Listings racing the swap never show a name in the hidden directory (the walk reads each
/// directory by a descriptor opened with no symlink followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swap_racing_listings_never_shows_a_hidden_name() {
    use conch_seams::files::ListSpec;
    let room = SwapRoom::new();
    let (mut leaked, mut ok, mut refused) = (0, 0, 0);
    for _ in 0..20_000 {
        match room.files.list(ListSpec::new(room.ws.join("d"))).await {
            Ok(l) if l.entries.iter().any(|e| e.path.ends_with("their-secret.txt")) => leaked += 1,
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(room.stop() > 0);
    assert_eq!(leaked, 0, "listings that showed a hidden name ({ok} own, {refused} refused)");
}
