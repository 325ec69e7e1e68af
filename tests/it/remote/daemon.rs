//! Daemon promises: auth before anything runs, shutdown reaps, leave retires.

use conch_conformance::{pid_gone, within};
use conch_frontend_sandboxd::rxp::ServerConfig;
use conch_seams::{ErrorCode, ErrorReason, SpawnSpec, Subprocess};

use super::{Daemon, with_token};

fn sleeper() -> SpawnSpec {
    SpawnSpec::new(vec!["sleep".into(), "1000".into()], "/tmp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_token_is_refused_before_anything_runs() {
    let d = Daemon::start(ServerConfig {
        token: Some("s3cret-token".into()),
        ..ServerConfig::default()
    });
    for token in [Some("wrong-token"), None] {
        let err = with_token(token, || {
            conch_provider_remote::RemoteSubprocess::connect(&d.client_config())
        })
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
        assert!(!err.to_string().contains("s3cret-token"), "the token is not echoed: {err}");
    }
    assert_eq!(d.state.live_count(), 0, "nothing was started");
    let ok = with_token(Some("s3cret-token"), || d.client());
    let p = ok.spawn(sleeper()).await.unwrap();
    assert_eq!(d.state.live_count(), 1);
    p.kill().await.unwrap();
    within("kill", p.wait()).await.unwrap();
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_daemon_kills_and_reaps_every_process() {
    let d = Daemon::start(ServerConfig::default());
    let client = d.client();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let p = client.spawn(sleeper()).await.unwrap();
        pids.push(p.pid().unwrap() as i32);
    }
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
    for pid in pids {
        assert!(pid_gone(pid), "{pid} survived the daemon's shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_still_learns_how_its_processes_ended() {
    let d = Daemon::start(ServerConfig::default());
    let client = d.client();
    let p = client.spawn(sleeper()).await.unwrap();
    let pid = p.pid().unwrap() as i32;
    // `shutdown` is the client's leave: the daemon stops everything, and the handle still
    // gets its settlement even though its entry is no longer live.
    within("leave", client.shutdown()).await;
    assert!(pid_gone(pid));
    assert!(p.try_status().is_some(), "settled after leave");
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_is_a_typed_boot_change_not_a_fresh_start() {
    let first = Daemon::start(ServerConfig::default());
    let addr = first.addr;
    let client = first.client();
    let p = client.spawn(sleeper()).await.unwrap();
    let pid = p.pid().unwrap() as i32;
    tokio::task::spawn_blocking(move || first.stop()).await.unwrap();
    assert!(pid_gone(pid), "the first daemon took its process with it");
    // Another daemon on the same address: same URL, new boot id.
    let second = Daemon::start_at(&addr.to_string(), ServerConfig::default());
    // A control call names the boot id it knew: refused, typed, nothing started.
    let err = within("a spawn on the restarted daemon", client.spawn(sleeper())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert_eq!(err.reason(), Some(ErrorReason::BootChanged), "{err}");
    assert!(err.to_string().contains("restarted"), "{err}");
    // Nothing can succeed until the runtime is rebuilt: not retryable (it used to say so).
    assert!(!err.retryable(), "{err}");
    assert_eq!(err.to_json()["retryable"], false);
    assert_eq!(second.state.live_count(), 0, "nothing ran on the new daemon");
    // Reads of the old process say what happened, or carry its settlement from before.
    if let Err(e) = within("wait on the old process", p.wait()).await {
        assert_eq!(e.code(), ErrorCode::RemoteUnavailable, "{e}");
    }
    tokio::task::spawn_blocking(move || second.stop()).await.unwrap();
}

/// Another daemon with another token at the address a client knew (a container's address
/// reused by the next container, found by the engine tests): its refusal of the token is
/// the first daemon being gone, typed `REMOTE_GONE`, never `unauthenticated` (which says
/// the configured token is wrong, and it was not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_daemon_at_the_address_is_gone_not_a_wrong_token() {
    let cfg = |token: &str| ServerConfig { token: Some(token.into()), ..ServerConfig::default() };
    let first = Daemon::start(cfg("first-token-0123456789"));
    let addr = first.addr;
    let client = super::with_token(Some("first-token-0123456789"), || first.client());
    within("a call on the first daemon", client.which("sh")).await.unwrap();
    tokio::task::spawn_blocking(move || first.stop()).await.unwrap();
    let second = Daemon::start_at(&addr.to_string(), cfg("second-token-0123456789"));
    let err = within("a spawn on the other daemon", client.spawn(sleeper())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert_eq!(err.reason(), Some(ErrorReason::RemoteGone), "{err}");
    assert!(err.to_string().contains("another daemon answers there"), "{err}");
    assert!(!err.retryable(), "{err}");
    // The verdict holds for every later call, which fails at once.
    let again = within("a second call", client.which("sh")).await.unwrap_err();
    assert_eq!(again.reason(), Some(ErrorReason::RemoteGone), "{again}");
    assert_eq!(second.state.live_count(), 0, "nothing ran on the other daemon");
    tokio::task::spawn_blocking(move || second.stop()).await.unwrap();
}

/// A settled process's complete spill outlives the client's handle, as a local one does: a
/// result that said `full output: <path>` stays true after the handle is dropped (the
/// client's DELETE), until the daemon's spill limits reclaim it. (The daemon used to release
/// the output on DELETE, so the path named in a bash result vanished right after the call.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_process_keeps_its_spill_after_the_handle_is_dropped() {
    use conch_seams::{OutputSpec, StreamId};
    let d = Daemon::start(ServerConfig::default());
    let client = d.client();
    let mut spec =
        SpawnSpec::new(vec!["sh".into(), "-c".into(), "head -c 200000 /dev/zero".into()], "/tmp");
    spec.stdout = OutputSpec::Collect { max_bytes: 1000, spill_cap: 1 << 24 };
    let p = client.spawn(spec).await.unwrap();
    within("the process", p.wait()).await.unwrap();
    // With the group's end known too, the client's drop forgets the id at once (DELETE);
    // otherwise it detaches and the daemon retires the entry after its lease.
    within("the group's end", p.wait_group_gone()).await.unwrap();
    let spill = p.collected(StreamId::Stdout).and_then(|c| c.spill).expect("a complete spill");
    assert_eq!(std::fs::metadata(&spill.path).unwrap().len(), 200_000);
    drop(p);
    within("the daemon to forget the handle", async {
        while d.state.live_count() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    // The old behaviour deleted the file within milliseconds of the DELETE; watch for it.
    for _ in 0..100 {
        assert!(spill.path.exists(), "the spill named in the result was deleted");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}
