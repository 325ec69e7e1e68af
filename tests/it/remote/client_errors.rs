//! The client's HTTP error paths, against wiremock standing in for a proxy or a broken
//! daemon (never for a conforming one: conformance runs against a real `sandboxd`).
//!
//! What they prove: a refused token is `unauthenticated` and never retried; 429/503 without
//! a typed body are retried with backoff and end as `remote_unavailable` after the give-up
//! deadline, or succeed once the server recovers; an answer that is not RXP/1 is a
//! `protocol` error naming the endpoint; a daemon speaking another protocol or lacking a
//! capability is refused when the provider is built, also through a composition.

use std::time::{Duration, Instant};

use conch_env::ShellEnv;
use conch_provider_remote::{RemoteConfig, RemoteSubprocess};
use conch_provider_remote_proto::{self as proto, Capabilities, Info, Limits, Started};
use conch_seams::{Error, ErrorCode, SpawnSpec, Subprocess, SubprocessCapabilities};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A valid `GET /v1/info` answer, as a conforming daemon would give it.
fn info() -> Info {
    let mut subprocess = SubprocessCapabilities::default();
    subprocess.terminals = true;
    subprocess.group_liveness = true;
    subprocess.stdin_probe = true;
    Info {
        protocol: proto::PROTOCOL.into(),
        boot_id: "mock-boot-1".into(),
        server: "conch-sandboxd mock".into(),
        provider: "subprocess-local".into(),
        capabilities: Capabilities {
            subprocess,
            leases: true,
            stdin_offsets: true,
            resume: true,
            files: None,
        },
        limits: Limits {
            max_body_bytes: 1 << 20,
            max_frame_bytes: 1 << 20,
            max_procs: 16,
            retain_bytes: 1 << 20,
            lease_ms: 30_000,
            heartbeat_ms: 5000,
        },
    }
}

fn config(server: &MockServer) -> RemoteConfig {
    RemoteConfig {
        url: server.uri(),
        token: Some("client-token".into()),
        connect_timeout_ms: 3000,
        heartbeat_ms: 500,
        reconnect_max_backoff_ms: 100,
        give_up_ms: 3000,
        ..RemoteConfig::default()
    }
}

/// `connect` blocks its thread on the info call; the mock server runs on the test runtime.
async fn connect(cfg: RemoteConfig) -> Result<RemoteSubprocess, Error> {
    tokio::task::spawn_blocking(move || RemoteSubprocess::connect(&cfg)).await.unwrap()
}

async fn connect_err(cfg: RemoteConfig) -> Error {
    match connect(cfg).await {
        Ok(_) => panic!("connect should have failed"),
        Err(e) => e,
    }
}

async fn mount_info(server: &MockServer, info: &Info) {
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(200).set_body_json(info))
        .mount(server)
        .await;
}

/// A mock daemon whose info is valid, and a client connected to it.
async fn connected(give_up_ms: u64) -> (MockServer, RemoteSubprocess) {
    let server = MockServer::start().await;
    mount_info(&server, &info()).await;
    let client = connect(RemoteConfig { give_up_ms, ..config(&server) }).await.unwrap();
    (server, client)
}

async fn requests_to(server: &MockServer, verb: &str, p: &str) -> Vec<wiremock::Request> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == verb && r.url.path() == p)
        .collect()
}

fn sleeper() -> SpawnSpec {
    SpawnSpec::new(vec!["sleep".into(), "1000".into()], "/tmp")
}

async fn spawn_err(client: &RemoteSubprocess) -> Error {
    match client.spawn(sleeper()).await {
        Ok(_) => panic!("spawn should have failed"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_at_connect_is_unauthenticated_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(401))
        .expect(1)
        .mount(&server)
        .await;
    let err = connect_err(config(&server)).await;
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("GET /v1/info"), "names the call: {msg}");
    assert!(msg.contains("token"), "says what to fix: {msg}");
    assert!(!msg.contains("client-token"), "never shows the token: {msg}");
    let sent = requests_to(&server, "GET", "/v1/info").await;
    assert_eq!(
        sent[0].headers.get("authorization").and_then(|v| v.to_str().ok()),
        Some("Bearer client-token"),
        "the token travels as a bearer header"
    );
}

/// A token the daemon accepted at connect and refuses later: a running daemon's token never
/// changes, so another daemon answers at the address (see `replaced` in http.rs). Gone, for
/// good, and not retried; never `unauthenticated`, which would send the user to fix a token
/// that was right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_on_a_later_call_is_another_daemon_and_not_retried() {
    let (server, client) = connected(3000).await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(401))
        .expect(1)
        .mount(&server)
        .await;
    let err = spawn_err(&client).await;
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert_eq!(err.reason(), Some(conch_seams::ErrorReason::RemoteGone), "{err}");
    assert!(err.to_string().contains("POST /v1/procs"), "names the call: {err}");
    assert!(err.to_string().contains("accepted before"), "says what happened: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_401_body_keeps_the_daemons_message() {
    let (server, client) = connected(3000).await;
    let body = proto::ErrorReply {
        error: Error::new(ErrorCode::Unauthenticated, "the bearer token is wrong").to_body(),
    };
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(401).set_body_json(&body))
        .expect(1)
        .mount(&server)
        .await;
    let err = spawn_err(&client).await;
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert!(err.to_string().contains("the bearer token is wrong"), "{err}");
}

/// The soak once saw the retries' last try cut by the deadline on a loaded machine, and the
/// error then named only the timeout: what the daemon last answered (a 503) was lost. A
/// daemon that answers 503 once and then hangs forces that order every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cut_by_the_deadline_still_names_the_daemons_last_answer() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(503).set_body_string("upstream busy"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(503).set_delay(Duration::from_secs(3600)))
        .with_priority(2)
        .mount(&server)
        .await;
    let cfg = RemoteConfig { connect_timeout_ms: 1500, ..config(&server) };
    let err = connect_err(cfg).await;
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("timed out"), "the last try was cut by the deadline: {msg}");
    assert!(msg.contains("the daemon's last answer before it: HTTP 503"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_at_connect_is_retried_then_remote_unavailable() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(503).set_body_string("upstream busy"))
        .mount(&server)
        .await;
    // Room for a few answers on a loaded machine (600 ms once let a slow 503 miss the
    // deadline, and the error named the timeout instead).
    let cfg = RemoteConfig { connect_timeout_ms: 3000, ..config(&server) };
    let started = Instant::now();
    let err = connect_err(cfg).await;
    let took = started.elapsed();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert!(err.to_string().contains("503"), "names the last cause: {err}");
    // The build-time limit is connect_timeout_ms, and the message says so (it used to name
    // give_up_ms and its default).
    let msg = err.to_string();
    assert!(msg.contains("within connect_timeout_ms (3000 ms; gave up after "), "{msg}");
    assert!(!msg.contains("give_up_ms"), "{msg}");
    let tries = requests_to(&server, "GET", "/v1/info").await.len();
    assert!(tries > 1, "retried: {tries} request(s)");
    assert!(took < Duration::from_secs(15), "gave up after the deadline, not later: {took:?}");
}

/// Nothing listens at the URL: the build fails at once, saying so, not after
/// `connect_timeout_ms` (a minute here) with a `(<daemon>)` placeholder in the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_at_connect_is_said_plainly_without_waiting_for_the_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let cfg =
        RemoteConfig { url: url.clone(), connect_timeout_ms: 60_000, ..RemoteConfig::default() };
    let err = tokio::time::timeout(Duration::from_secs(60), connect_err(cfg))
        .await
        .expect("hang guard: the build waited out connect_timeout_ms");
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert_eq!(err.reason(), Some(conch_seams::ErrorReason::RemoteGone), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("nothing listens at {url}")), "{msg}");
    assert!(msg.contains("conch sandboxd"), "says what should be there: {msg}");
    assert!(!msg.contains("<daemon>"), "{msg}");
}

/// A URL that answers HTTP but is not a sandboxd is named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_a_sandboxd_is_named_at_connect() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(404).set_body_string("<html>not found</html>"))
        .mount(&server)
        .await;
    let err = connect_err(config(&server)).await;
    assert_eq!(err.code(), ErrorCode::Protocol, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("the server at {} is not a conch sandboxd", server.uri())),
        "{msg}"
    );
    assert!(msg.contains("HTTP 404"), "names what it answered: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_on_a_later_call_is_retried_with_backoff_then_remote_unavailable() {
    let (server, client) = connected(500).await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(429))
        .mount(&server)
        .await;
    let started = Instant::now();
    let err = spawn_err(&client).await;
    let took = started.elapsed();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert!(err.to_string().contains("give_up_ms"), "says which limit ran out: {err}");
    assert!(err.retryable(), "remote_unavailable is retryable");
    let tries = requests_to(&server, "POST", "/v1/procs").await.len();
    // 25 ms doubling to 100 ms within 500 ms is about eight tries; a hot loop would be
    // hundreds.
    assert!((2..=20).contains(&tries), "retried with backoff: {tries} request(s)");
    assert!(took < Duration::from_secs(3), "gave up in time: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_that_clears_at_connect_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/info"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(3)
        .mount(&server)
        .await;
    mount_info(&server, &info()).await;
    let client = connect(config(&server)).await.unwrap();
    assert_eq!(client.info(), &info());
    assert_eq!(requests_to(&server, "GET", "/v1/info").await.len(), 4, "3 refusals and 1 answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_that_clears_on_a_later_call_succeeds_with_the_same_id() {
    let (server, client) = connected(5000).await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(429))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    let started = Started { id: "whatever".into(), pid: Some(4242), created: true };
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&started))
        .mount(&server)
        .await;
    let p = client.spawn(sleeper()).await.unwrap();
    assert_eq!(p.pid(), Some(4242));
    let sent = requests_to(&server, "POST", "/v1/procs").await;
    assert_eq!(sent.len(), 3, "2 refusals and 1 answer");
    // Retrying is safe because every try names the same client-chosen id.
    let ids: Vec<String> = sent
        .iter()
        .map(|r| serde_json::from_slice::<proto::StartProc>(&r.body).unwrap().id)
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "one id for every try: {ids:?}");
    let clients: Vec<_> = sent.iter().map(|r| r.headers.get(proto::CLIENT_HEADER)).collect();
    assert!(clients[0].is_some() && clients.iter().all(|c| *c == clients[0]), "one client id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_info_is_a_protocol_error_naming_the_endpoint() {
    let truncated = serde_json::to_string(&info()).unwrap();
    let bodies = [
        "this is not json".to_owned(),
        truncated[..truncated.len() / 2].to_owned(),
        serde_json::json!({"protocol": 1, "boot_id": []}).to_string(),
    ];
    for body in bodies {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/v1/info"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(body.clone(), "application/json"))
            .expect(1)
            .mount(&server)
            .await;
        let err = connect_err(config(&server)).await;
        assert_eq!(err.code(), ErrorCode::Protocol, "{body}: {err}");
        assert!(err.to_string().contains("GET /v1/info"), "names the endpoint: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_to_a_later_call_is_a_protocol_error_naming_the_endpoint() {
    let (server, client) = connected(3000).await;
    let started =
        serde_json::to_string(&Started { id: "p".into(), pid: Some(1), created: true }).unwrap();
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_raw(started[..started.len() - 3].to_owned(), "application/json"),
        )
        .expect(1)
        .mount(&server)
        .await;
    let err = spawn_err(&client).await;
    assert_eq!(err.code(), ErrorCode::Protocol, "{err}");
    assert!(err.to_string().contains("POST /v1/procs"), "names the endpoint: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_error_status_without_a_typed_body_is_a_protocol_error() {
    let (server, client) = connected(3000).await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(418).set_body_string("<html>teapot</html>"))
        .expect(1)
        .mount(&server)
        .await;
    let err = spawn_err(&client).await;
    assert_eq!(err.code(), ErrorCode::Protocol, "{err}");
    assert!(err.to_string().contains("POST /v1/procs"), "{err}");
    assert!(err.to_string().contains("418"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_capability_is_refused_at_connect_naming_it() {
    for cap in ["leases", "stdin_offsets", "resume"] {
        let mut i = info();
        match cap {
            "leases" => i.capabilities.leases = false,
            "stdin_offsets" => i.capabilities.stdin_offsets = false,
            _ => i.capabilities.resume = false,
        }
        let server = MockServer::start().await;
        mount_info(&server, &i).await;
        let err = connect_err(config(&server)).await;
        assert_eq!(err.code(), ErrorCode::Unsupported, "{cap}: {err}");
        assert!(err.to_string().contains(&format!("`{cap}`")), "names {cap}: {err}");
        assert!(err.to_string().contains(&server.uri()), "names the daemon: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_protocol_is_refused_at_connect_naming_both() {
    let server = MockServer::start().await;
    mount_info(&server, &Info { protocol: "rxp/2".into(), ..info() }).await;
    let err = connect_err(config(&server)).await;
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("rxp/2") && msg.contains(proto::PROTOCOL), "names both: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_the_remote_composition_against_a_daemon_without_a_capability_names_it() {
    let server = MockServer::start().await;
    let mut i = info();
    i.capabilities.stdin_offsets = false;
    mount_info(&server, &i).await;
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../compositions/remote-sandbox.yaml"
    ))
    .unwrap();
    assert!(shipped.contains("url: http://127.0.0.1:7070"), "the shipped url line changed");
    let yaml = shipped.replace("url: http://127.0.0.1:7070", &format!("url: {}", server.uri()));
    let built = tokio::task::spawn_blocking(move || {
        conch::build_runtime_from_yaml(
            "remote-sandbox.yaml",
            &yaml,
            ShellEnv::new("/tmp/conch-test-home".into()),
        )
        .map(drop)
    })
    .await
    .unwrap();
    let err = built.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("remote-sandbox.yaml"), "names the file: {msg}");
    assert!(msg.contains("plugin `remote-sandbox`"), "names the plugin: {msg}");
    assert!(msg.contains("`stdin_offsets`"), "names the capability: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_never_answers_is_remote_unavailable_in_time() {
    let (server, client) = connected(500).await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    let started = Instant::now();
    let err = spawn_err(&client).await;
    let took = started.elapsed();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert!(took < Duration::from_secs(3), "the per-try timeout is bounded too: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_hangs_late_in_the_retries_still_gives_up_at_the_deadline() {
    let (server, client) = connected(1500).await;
    // About a second of quick refusals (25 ms doubling to 100 ms), then silence.
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(11)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/procs"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    let started = Instant::now();
    let err = spawn_err(&client).await;
    let took = started.elapsed();
    assert_eq!(err.code(), ErrorCode::RemoteUnavailable, "{err}");
    assert!(requests_to(&server, "POST", "/v1/procs").await.len() > 11, "it reached the hang");
    // give_up_ms bounds the whole call, not each try.
    assert!(took < Duration::from_millis(2100), "gave up {took:?} after the start, not ~1.5 s");
}
