//! `files-remote` against a real daemon on 127.0.0.1 hosting `files-local` (or
//! `files-sandbox`): what the protocol promises beyond the conformance suite (which
//! `tests/it/remote.rs` instantiates): exact resume of reads and uploads across cut
//! connections, refusals before anything happens, typed denials, watches on the WebSocket.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use conch_conformance::within;
use conch_frontend_sandboxd::rxp::ServerConfig;
use conch_provider_files::HostFiles;
use conch_provider_remote::{RemoteFiles, RemoteSubprocess};
use conch_seams::files::{MAX_READ_CHUNK, SANDBOX_MARKER, read_all, write_all};
use conch_seams::{ErrorCode, Files, SandboxMode, SandboxPolicy, WatchEvent, WriteMode, WriteSpec};
use sha2::{Digest as _, Sha256};

use super::Daemon;
use super::faults::{Proxy, client_via};

/// A daemon hosting `files` beside subprocess-local.
fn daemon(files: HostFiles) -> Daemon {
    let cfg = ServerConfig { heartbeat: Duration::from_millis(500), ..ServerConfig::default() };
    Daemon::start_hosting("127.0.0.1:0", cfg, Some(Arc::new(files)))
}

/// A client built off the test's runtime thread (`connect` blocks on the info call).
async fn client(d: &Daemon) -> (Arc<RemoteSubprocess>, RemoteFiles) {
    let cfg = d.client_config();
    let sub = tokio::task::spawn_blocking(move || RemoteSubprocess::connect(&cfg))
        .await
        .unwrap()
        .unwrap();
    let files = RemoteFiles::new(&sub);
    (Arc::new(sub), files)
}

/// A daemon hosting `files-local` in `dir`, and a client reaching it through a proxy that can
/// cut, delay or swallow its traffic. Keep the subprocess: dropping it stops the client.
async fn proxied(dir: &Path) -> (Daemon, Proxy, Arc<RemoteSubprocess>, RemoteFiles) {
    let d = daemon(HostFiles::local(dir));
    let proxy = Proxy::start(d.addr).await;
    let sub = client_via(&d, &proxy, |_| {}).await;
    let files = RemoteFiles::new(&sub);
    (d, proxy, sub, files)
}

/// Deterministic pseudo-random bytes (xorshift), so a test needs no RNG crate.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

fn file_sha(path: &Path) -> Vec<u8> {
    sha(&std::fs::read(path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_advertises_its_files_provider_and_serves_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(HostFiles::local(dir.path()));
    let (sub, files) = client(&d).await;
    let caps = sub.info().capabilities.files.clone().expect("files advertised");
    assert_eq!(caps.provider, "files-local");
    assert_eq!(caps.default_dir, dir.path());
    assert_eq!(files.default_dir(), dir.path());
    // A relative path lands in the daemon provider's default directory.
    let stat = write_all(&files, WriteSpec::new("a.txt", WriteMode::Create), b"abc").await.unwrap();
    assert_eq!(stat.path, dir.path().join("a.txt"));
    assert_eq!(stat.size, 3);
    assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"abc");
    let err =
        write_all(&files, WriteSpec::new("a.txt", WriteMode::Create), b"x").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists, "{err}");
    let err = files.stat(Path::new("nope")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.message().contains("nope"), "names the path: {err}");
    files.make_dir(Path::new("d/e"), true).await.unwrap();
    files.rename(Path::new("a.txt"), Path::new("d/e/b.txt"), false).await.unwrap();
    let listing = files.list(conch_seams::ListSpec::new(dir.path()).with_depth(3)).await.unwrap();
    let names: Vec<PathBuf> = listing.entries.iter().map(|e| e.path.clone()).collect();
    assert_eq!(
        names,
        vec![dir.path().join("d"), dir.path().join("d/e"), dir.path().join("d/e/b.txt")]
    );
    let err = files.remove(Path::new("d"), false).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::DirectoryNotEmpty, "{err}");
    // A path that is not UTF-8 cannot cross as JSON: refused here, naming it.
    let odd = std::ffi::OsStr::from_bytes(b"odd-\xff");
    let err = files.stat(Path::new(odd)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.message().contains("odd-"), "{err}");
    // A tar export, unpacked by a tar import elsewhere: the same tree.
    let mut out = files.export_tar(Path::new("d")).await.unwrap();
    let mut sink = files.import_tar(Path::new("copy")).await.unwrap();
    while let Some(chunk) = out.next_chunk().await.unwrap() {
        sink.write(&chunk).await.unwrap();
    }
    assert!(sink.finish().await.unwrap() >= 1);
    let copied = dir.path().join("copy");
    let found = walk(&copied);
    assert!(found.iter().any(|p| p.ends_with("e/b.txt")), "{found:?}");
    let b = found.iter().find(|p| p.ends_with("e/b.txt")).unwrap();
    assert_eq!(std::fs::read(b).unwrap(), b"abc");
    files.remove(Path::new("d"), true).await.unwrap();
    assert!(!dir.path().join("d").exists());
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_a_files_provider_answers_unsupported() {
    let d = Daemon::start(ServerConfig::default());
    let (sub, files) = client(&d).await;
    assert!(sub.info().capabilities.files.is_none());
    let err = files.stat(Path::new("/tmp")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    // The daemon's own answer, typed, for a client that asks anyway.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/files/stat", d.url()))
        .header("x-conch-client", "raw")
        .json(&serde_json::json!({"path": "/tmp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 501);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported", "{body}");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_before_any_file_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServerConfig { token: Some("files-s3cret-token".into()), ..ServerConfig::default() };
    let d = Daemon::start_hosting("127.0.0.1:0", cfg, Some(Arc::new(HostFiles::local(dir.path()))));
    let http = reqwest::Client::new();
    for token in [Some("wrong-token-0123456789"), None] {
        let mut req = http
            .post(format!("{}/v1/files/mkdir", d.url()))
            .header("x-conch-client", "raw")
            .json(&serde_json::json!({"path": dir.path().join("made"), "parents": false}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthenticated", "{body}");
        let resp = http
            .put(format!("{}/v1/files/uploads/u1?offset=0", d.url()))
            .header("x-conch-client", "raw")
            .body(vec![0u8; 1000])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
    }
    assert!(!dir.path().join("made").exists(), "nothing was made");
    let err = super::with_token(Some("wrong-token-0123456789"), || {
        RemoteSubprocess::connect(&d.client_config())
    })
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_at_the_wrong_offset_is_refused_with_where_the_upload_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(HostFiles::local(dir.path()));
    let http = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", d.url())).header("x-conch-client", "raw").json(&body).send()
    };
    let target = dir.path().join("t.bin");
    let open = serde_json::json!({"id": "u1", "kind": {"kind": "write",
        "spec": {"path": target, "mode": "create", "atomic": true}}});
    let r: serde_json::Value =
        post("/v1/files/uploads", open.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(r, serde_json::json!({"id": "u1", "next_offset": 0, "created": true}));
    let put = |offset: u64, body: &'static [u8]| {
        http.put(format!("{}/v1/files/uploads/u1?offset={offset}", d.url()))
            .header("x-conch-client", "raw")
            .body(body)
            .send()
    };
    let r: serde_json::Value = put(0, b"hello ").await.unwrap().json().await.unwrap();
    assert_eq!(r["next_offset"], 6);
    // The same chunk again (its answer was lost, say): refused, nothing written twice.
    let resp = put(0, b"hello ").await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    assert_eq!(body["error"]["context"], serde_json::json!([["next_offset", "6"]]), "{body}");
    let resp = put(9, b"x").await.unwrap();
    assert_eq!(resp.status(), 400);
    // Opening the same id again answers where it is.
    let r: serde_json::Value = post("/v1/files/uploads", open).await.unwrap().json().await.unwrap();
    assert_eq!(r, serde_json::json!({"id": "u1", "next_offset": 6, "created": false}));
    put(6, b"world").await.unwrap();
    // Atomic: nothing visible before the finish.
    assert!(!target.exists());
    let resp = post("/v1/files/uploads/u1/finish", serde_json::json!({"size": 10})).await.unwrap();
    assert_eq!(resp.status(), 400, "a finish short of what was accepted is refused");
    let done: serde_json::Value =
        post("/v1/files/uploads/u1/finish", serde_json::json!({"size": 11}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(done["stat"]["size"], 11, "{done}");
    let again: serde_json::Value =
        post("/v1/files/uploads/u1/finish", serde_json::json!({"size": 11}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(again, done, "a repeated finish gets the same answer");
    assert_eq!(std::fs::read(&target).unwrap(), b"hello world");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_atomic_upload_leaves_the_target_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("keep.txt");
    std::fs::write(&target, b"old").unwrap();
    let d = daemon(HostFiles::local(dir.path()));
    let (_sub, files) = client(&d).await;
    let mut w = files.write(WriteSpec::new(&target, WriteMode::Truncate).atomic()).await.unwrap();
    w.write(&pattern(3 << 20, 7)).await.unwrap();
    drop(w);
    // The client's DELETE reaches the daemon, which drops the writer: its temp goes.
    within("the abandoned temp file to go", async {
        while std::fs::read_dir(dir.path()).unwrap().count() > 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A 64 MiB file read through a proxy that cuts the connection between ranges and drops the
/// daemon's answers mid-range: every range is asked again at its offset, and the bytes are
/// exactly the file's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_mid_file_resumes_at_the_exact_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 20, 11);
    let path = dir.path().join("big.bin");
    std::fs::write(&path, &data).unwrap();
    let (d, proxy, _sub, files) = proxied(dir.path()).await;
    let mut got = Sha256::new();
    let mut offset = 0u64;
    let mut cuts = 0;
    loop {
        if offset > 0 && offset.is_multiple_of(16 << 20) {
            cuts += proxy.cut_all().links;
        }
        if offset == 8 << 20 || offset == 40 << 20 {
            proxy.swallow_responses("POST /v1/files/read", 1);
        }
        let chunk = files.read(&path, offset, MAX_READ_CHUNK).await.unwrap();
        got.update(&chunk.data);
        offset += chunk.data.len() as u64;
        if chunk.eof {
            break;
        }
    }
    assert_eq!(offset, data.len() as u64);
    assert_eq!(got.finalize().to_vec(), sha(&data));
    assert_eq!(proxy.swallowed(), 2, "both armed answers were dropped, and asked again");
    assert!(cuts >= 3, "connections were cut between ranges ({cuts})");
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A 96 MiB upload through a proxy that drops the daemon's answers to chunks (the chunk
/// landed, the client does not know) and cuts every connection while chunks are on the
/// wire (the daemon keeps exactly what reached the writer): the file is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_mid_chunk_resumes_exactly_and_lands_every_byte_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = Arc::new(pattern(96 << 20, 13));
    let target = dir.path().join("up.bin");
    let (d, proxy, _sub, files) = proxied(dir.path()).await;
    let files = Arc::new(files);
    proxy.swallow_responses("PUT /v1/files/uploads", 2);
    let writer = {
        let (files, data, target) = (Arc::clone(&files), Arc::clone(&data), target.clone());
        tokio::spawn(async move {
            let mut w = files.write(WriteSpec::new(&target, WriteMode::Create)).await?;
            for piece in data.chunks(24 << 20) {
                w.write(piece).await?;
            }
            w.finish().await
        })
    };
    // Cut whenever the file on the daemon grew past the next mark: bytes are on the wire.
    let mut cuts = 0;
    for mark in [20u64 << 20, 50 << 20, 80 << 20] {
        within("the upload to pass a mark", async {
            while std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0) < mark {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        cuts += proxy.cut_all().links;
    }
    let stat = within("the upload", writer).await.unwrap().unwrap();
    assert_eq!(stat.size, data.len() as u64);
    assert_eq!(file_sha(&target), sha(&data), "every byte once, in order");
    assert_eq!(proxy.swallowed(), 2, "both armed answers were dropped");
    assert!(cuts >= 3, "{cuts}");
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A tar export read through a proxy that drops an answer: the archive resumes at its
/// offset and unpacks to the same tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tar_export_cut_midway_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..4u64 {
        std::fs::write(src.join(format!("f{i}")), pattern(5 << 20, i + 1)).unwrap();
    }
    let (d, proxy, _sub, files) = proxied(dir.path()).await;
    let local = HostFiles::local(dir.path());
    let mut out = files.export_tar(&src).await.unwrap();
    let mut sink = local.import_tar(&dir.path().join("dst")).await.unwrap();
    let mut n = 0;
    while let Some(chunk) = out.next_chunk().await.unwrap() {
        n += 1;
        if n == 1 {
            proxy.swallow_responses("GET /v1/files/exports", 1);
        }
        sink.write(&chunk).await.unwrap();
    }
    sink.finish().await.unwrap();
    assert_eq!(proxy.swallowed(), 1);
    for i in 0..4u64 {
        let got = std::fs::read(dir.path().join(format!("dst/f{i}"))).unwrap();
        assert_eq!(sha(&got), sha(&pattern(5 << 20, i + 1)), "f{i}");
    }
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_under_a_sandboxed_daemon_keeps_its_code_and_marker() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, &work);
    let d = daemon(HostFiles::sandboxed(&work, &policy));
    let (sub, files) = client(&d).await;
    assert_eq!(sub.info().capabilities.files.as_ref().unwrap().provider, "files-sandbox");
    write_all(&files, WriteSpec::new("inside.txt", WriteMode::Create), b"ok").await.unwrap();
    let denied = outside.join("nope.txt");
    let err =
        write_all(&files, WriteSpec::new(&denied, WriteMode::Create), b"no").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxDenied, "{err}");
    assert!(err.message().starts_with(SANDBOX_MARKER), "{err}");
    assert!(!denied.exists());
    let err = files.make_dir(&outside.join("d"), false).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxDenied, "{err}");
    assert!(err.message().starts_with(SANDBOX_MARKER), "{err}");
    // Reads are allowed everywhere, as the confined shell reads everywhere.
    std::fs::write(outside.join("r.txt"), b"readable").unwrap();
    assert_eq!(read_all(&files, &outside.join("r.txt"), 100).await.unwrap(), b"readable");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_arrive_in_order_over_the_websocket() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(HostFiles::local(dir.path()));
    let (_sub, files) = client(&d).await;
    assert!(files.capabilities().watch, "files-local watches, and the client says so");
    let mut w = files.watch(dir.path(), false).await.unwrap();
    let a = dir.path().join("a.txt");
    std::fs::write(&a, b"1").unwrap();
    let first = within("the first event", w.next_event()).await.unwrap().unwrap();
    assert_eq!(first, WatchEvent::Created { path: a.clone() });
    std::fs::remove_file(&a).unwrap();
    loop {
        match within("the removal", w.next_event()).await.unwrap().unwrap() {
            WatchEvent::Removed { path } => {
                assert_eq!(path, a);
                break;
            }
            WatchEvent::Modified { path } => assert_eq!(path, a),
            other => panic!("unexpected {other:?}"),
        }
    }
    let err = files.watch(&dir.path().join("missing"), false).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// The shipped remote composition's files seam is `files-remote` over its remote-sandbox's
/// connection: one client identity for processes and files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_composition_binds_files_remote_over_the_same_connection() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(HostFiles::local(dir.path()));
    conch::link_all();
    let yaml = format!("plugins:\n  remote-sandbox:\n    url: {}\n  files-remote: {{}}\n", d.url());
    let rt = tokio::task::spawn_blocking(move || {
        let c = conch_config::Composition::from_yaml("comp.yaml", &yaml).unwrap();
        conch_registry::Runtime::build(&c, conch_env::ShellEnv::new("/tmp/conch-test-home".into()))
    })
    .await
    .unwrap()
    .unwrap();
    let files = rt.seams().files.clone().expect("a files seam");
    assert_eq!(files.provider_name(), "files-remote");
    write_all(files.as_ref(), WriteSpec::new("r.txt", WriteMode::Create), b"via runtime")
        .await
        .unwrap();
    assert_eq!(std::fs::read(dir.path().join("r.txt")).unwrap(), b"via runtime");
    rt.shutdown().await;
    // Over another subprocess provider it has no connection to share: refused, clearly.
    conch::link_all();
    let c = conch_config::Composition::from_yaml(
        "comp.yaml",
        "plugins:\n  subprocess-local: {}\n  files-remote: {}\n",
    )
    .unwrap();
    let err =
        conch_registry::Runtime::build(&c, conch_env::ShellEnv::new("/tmp/conch-test-home".into()))
            .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidComposition, "{err}");
    assert!(err.to_string().contains("subprocess-local"), "{err}");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A mkdir, rename and remove whose answers are lost (the work done, the client not told)
/// are resent with the same operation id: the daemon answers the first run's result, so
/// the caller sees success, not `already_exists` or `not_found` from a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_metadata_operations_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let (d, proxy, _sub, files) = proxied(dir.path()).await;
    proxy.swallow_responses("POST /v1/files/mkdir", 1);
    files.make_dir(Path::new("m"), false).await.unwrap();
    proxy.swallow_responses("POST /v1/files/rename", 1);
    files.rename(Path::new("m"), Path::new("n"), false).await.unwrap();
    proxy.swallow_responses("POST /v1/files/remove", 1);
    files.remove(Path::new("n"), false).await.unwrap();
    // An upload's open and finish too: a `create` write is opened once, finished once.
    proxy.swallow_responses("POST /v1/files/uploads", 2);
    let stat =
        write_all(&files, WriteSpec::new("c.txt", WriteMode::Create), b"once").await.unwrap();
    assert_eq!(stat.size, 4);
    assert_eq!(std::fs::read(dir.path().join("c.txt")).unwrap(), b"once");
    assert_eq!(proxy.swallowed(), 5, "every armed answer was lost, and the call resent");
    assert!(!dir.path().join("m").exists() && !dir.path().join("n").exists());
    // A fresh operation id runs again: the error is the second run's own.
    let err = files.remove(Path::new("n"), false).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// A watch lives on the stream connection: when it is cut, the client subscribes again and,
/// once the daemon confirmed it, reports an overflow (what changed meanwhile was not seen),
/// then every change again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_a_cut_connection_with_an_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let (d, proxy, _sub, files) = proxied(dir.path()).await;
    let mut w = files.watch(dir.path(), false).await.unwrap();
    std::fs::write(dir.path().join("a"), b"1").unwrap();
    let first = within("the first event", w.next_event()).await.unwrap().unwrap();
    assert_eq!(first, WatchEvent::Created { path: dir.path().join("a") });
    let cut = proxy.cut_all();
    assert!(cut.ws >= 1, "the stream connection was cut");
    loop {
        let ev = within("the overflow", w.next_event()).await.unwrap().unwrap();
        if ev == WatchEvent::Overflow {
            break;
        }
        // Whatever of `a` was still on its way before the cut.
        assert!(matches!(ev, WatchEvent::Modified { .. }), "{ev:?}");
    }
    // The overflow comes once the watch is in place again: the next change is reported.
    let b = dir.path().join("b");
    std::fs::write(&b, b"2").unwrap();
    let ev = within("an event after the reconnect", w.next_event()).await.unwrap().unwrap();
    assert_eq!(ev, WatchEvent::Created { path: b });
    drop(proxy);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// An upload nobody uses for a lease is discarded: its writer is dropped unfinished, so an
/// atomic write's temporary file goes and the target stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_unused_for_a_lease_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("kept.txt");
    std::fs::write(&target, b"old").unwrap();
    let cfg = ServerConfig { lease: Duration::from_millis(300), ..ServerConfig::default() };
    let d = Daemon::start_hosting("127.0.0.1:0", cfg, Some(Arc::new(HostFiles::local(dir.path()))));
    let http = reqwest::Client::new();
    let open = serde_json::json!({"id": "u1", "kind": {"kind": "write",
        "spec": {"path": target, "mode": "truncate", "atomic": true}}});
    let r = http
        .post(format!("{}/v1/files/uploads", d.url()))
        .header("x-conch-client", "quiet")
        .json(&open)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .put(format!("{}/v1/files/uploads/u1?offset=0", d.url()))
        .header("x-conch-client", "quiet")
        .body(vec![7u8; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "the target and its temp");
    // The client goes quiet; the daemon's lease check drops the writer and its temp.
    within("the temp file to go after the lease", async {
        while std::fs::read_dir(dir.path()).unwrap().count() > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    let r = http
        .put(format!("{}/v1/files/uploads/u1?offset={}", d.url(), 1 << 20))
        .header("x-conch-client", "quiet")
        .body(vec![7u8; 10])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the upload is gone");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

/// Files share remote-sandbox's verdicts: a restarted daemon (new boot id) refuses file
/// calls `BOOT_CHANGED`, not retryable, and nothing is written in the new world.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_fails_file_calls_boot_changed() {
    let dir = tempfile::tempdir().unwrap();
    let first = daemon(HostFiles::local(dir.path()));
    let addr = first.addr;
    let (_sub, files) = client(&first).await;
    files.stat(dir.path()).await.unwrap();
    tokio::task::spawn_blocking(move || first.stop()).await.unwrap();
    let cfg = ServerConfig { heartbeat: Duration::from_millis(500), ..ServerConfig::default() };
    let second =
        Daemon::start_hosting(&addr.to_string(), cfg, Some(Arc::new(HostFiles::local(dir.path()))));
    let err = within("a write on the restarted daemon", async {
        write_all(&files, WriteSpec::new("new.txt", WriteMode::Create), b"x").await
    })
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert_eq!(err.reason(), Some(conch_seams::ErrorReason::BootChanged), "{err}");
    assert!(!err.retryable(), "{err}");
    assert!(!dir.path().join("new.txt").exists(), "nothing was written in the new world");
    tokio::task::spawn_blocking(move || second.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_spill_keeps_cut_output_on_the_daemon_without_a_files_provider() {
    use conch_seams::{Subprocess as _, World};
    // A terminal's cut output is kept by the daemon's subprocess provider: it needs no files
    // provider, crosses in several chunks, and is named in the daemon's world.
    let d = Daemon::start(ServerConfig::default());
    let (sub, _) = client(&d).await;
    let text = pattern(9 << 20, 7);
    let kept = sub.keep_spill(text.clone()).await.expect("the daemon keeps it").expect("a spill");
    assert_eq!(kept.world, World::Remote { name: d.url() });
    assert_eq!(file_sha(&kept.path), sha(&text), "the spill holds the text exactly");
    // Past the spill cap no spill is kept, and nothing is sent.
    let over =
        vec![b'x'; usize::try_from(conch_provider_remote_proto::MAX_SPILL_UPLOAD).unwrap() + 1];
    assert_eq!(sub.keep_spill(over).await.expect("an answer"), None);
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_upload_past_the_spill_cap_is_refused_and_keeps_nothing() {
    let d = Daemon::start(ServerConfig::default());
    let http = reqwest::Client::new();
    let url = d.url();
    let open = serde_json::json!({"id": "s1", "kind": {"kind": "spill"}});
    let r: serde_json::Value = http
        .post(format!("{url}/v1/files/uploads"))
        .header("x-conch-client", "raw")
        .json(&open)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r, serde_json::json!({"id": "s1", "next_offset": 0, "created": true}));
    let cap = conch_provider_remote_proto::MAX_SPILL_UPLOAD;
    let chunk = 4u64 << 20;
    let mut offset = 0;
    let refused = loop {
        let resp = http
            .put(format!("{url}/v1/files/uploads/s1?offset={offset}"))
            .header("x-conch-client", "raw")
            .body(vec![b'y'; usize::try_from(chunk).unwrap()])
            .send()
            .await
            .unwrap();
        if !resp.status().is_success() {
            break resp;
        }
        let r: serde_json::Value = resp.json().await.unwrap();
        offset = r["next_offset"].as_u64().unwrap();
        assert!(offset <= cap, "accepted {offset} bytes, past the cap");
    };
    assert_eq!(offset, cap, "everything up to the cap was accepted");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("spill upload"), "{body}");
    // The upload ended with that error; its finish says so, and no spill is named.
    let resp = http
        .post(format!("{url}/v1/files/uploads/s1/finish"))
        .header("x-conch-client", "raw")
        .json(&serde_json::json!({"size": cap}))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}
