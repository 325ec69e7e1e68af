//! The daemon's edge against a real in-process `sandboxd`, driven with raw HTTP and
//! WebSocket requests: auth before anything runs, typed 4xx bodies for every client
//! mistake, per-client isolation, and a seeded fuzz of malformed requests and frames after
//! which the daemon still serves.

use std::time::Duration;

use conch_conformance::within;
use conch_frontend_sandboxd::rxp::ServerConfig;
use conch_provider_remote_proto::{self as proto, ClientMsg, ErrorReply, ServerMsg, StartProc};
use conch_seams::{ErrorCode, OutputSpec, SpawnSpec, StdinSpec, StreamId, Subprocess};
use futures::{SinkExt as _, StreamExt as _};
use reqwest::{Method, StatusCode};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest as _};

use super::{Daemon, with_token};

const TOKEN: &str = "edge-token-0123456789";

fn daemon(max_body_bytes: usize) -> Daemon {
    Daemon::start(ServerConfig {
        token: Some(TOKEN.into()),
        max_body_bytes,
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    })
}

/// One raw HTTP identity: a token (or none) and a client id (or none).
struct Raw {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    client: Option<String>,
}

/// A response: status and body bytes.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

impl Answer {
    /// The typed error body; panics (with the body) when there is none.
    fn error(&self) -> conch_seams::ErrorBody {
        match serde_json::from_slice::<ErrorReply>(&self.body) {
            Ok(r) => r.error,
            Err(e) => panic!(
                "HTTP {} without a typed error body ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            ),
        }
    }

    fn expect(&self, status: StatusCode, code: ErrorCode) {
        assert_eq!(self.status, status, "{:?}", String::from_utf8_lossy(&self.body));
        assert_eq!(self.error().code, code, "{:?}", String::from_utf8_lossy(&self.body));
    }
}

impl Raw {
    fn new(d: &Daemon, token: Option<&str>, client: Option<&str>) -> Self {
        Self {
            http: reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap(),
            base: d.url(),
            token: token.map(str::to_owned),
            client: client.map(str::to_owned),
        }
    }

    fn ok(d: &Daemon, client: &str) -> Self {
        Self::new(d, Some(TOKEN), Some(client))
    }

    async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(c) = &self.client {
            req = req.header(proto::CLIENT_HEADER, c);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = resp.status();
        Answer { status, body: resp.bytes().await.unwrap().to_vec() }
    }

    async fn json(&self, method: Method, path: &str, body: serde_json::Value) -> Answer {
        self.send(method, path, Some(serde_json::to_vec(&body).unwrap())).await
    }
}

fn start(id: &str, argv: &[&str]) -> StartProc {
    StartProc {
        id: id.into(),
        spec: SpawnSpec::new(argv.iter().map(|s| (*s).to_owned()).collect(), "/tmp"),
    }
}

/// A WebSocket handshake with these headers; the HTTP answer when it is refused.
async fn ws(
    d: &Daemon,
    token: Option<&str>,
    client: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    tungstenite::http::Response<Option<Vec<u8>>>,
> {
    let mut req = format!("ws://{}/v1/ws", d.addr).into_client_request().unwrap();
    if let Some(t) = token {
        req.headers_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    req.headers_mut().insert(proto::CLIENT_HEADER, client.parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((s, _)) => Ok(s),
        Err(tungstenite::Error::Http(resp)) => Err(*resp),
        Err(e) => panic!("handshake failed in transport: {e}"),
    }
}

fn text(m: &ClientMsg) -> Message {
    Message::Text(serde_json::to_string(m).unwrap().into())
}

fn hello() -> Message {
    text(&ClientMsg::Hello { protocol: proto::PROTOCOL.into(), heartbeat_ms: 5000 })
}

/// The next text message from the server that is not a heartbeat (`None`: closed or
/// nothing within 5 s).
async fn next_msg<S>(s: &mut S) -> Option<ServerMsg>
where
    S: futures::Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<ServerMsg>(&t) {
                Ok(ServerMsg::Hb) => {}
                Ok(m) => return Some(m),
                Err(e) => panic!("the server sent a message RXP/1 does not define ({e}): {t}"),
            },
            Ok(Some(Ok(Message::Close(_)) | Err(_)) | None) | Err(_) => return None,
            Ok(Some(Ok(_))) => {}
        }
    }
}

async fn stop(d: Daemon) {
    tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_token_is_a_typed_401_and_nothing_runs() {
    let d = daemon(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("made-by-an-unauthenticated-request");
    let marker_s = marker.to_str().unwrap().to_owned();
    let body = start("evil", &["touch", &marker_s]);
    let refused: [Option<String>; 5] = [
        None,
        Some(String::new()),
        Some("wrong".into()),
        Some("edge-token-012345678".into()),
        Some("x".repeat(4096)),
    ];
    for token in &refused {
        let raw = Raw::new(&d, token.as_deref(), Some("intruder"));
        for (m, p) in [
            (Method::POST, "/v1/procs"),
            (Method::GET, "/v1/info"),
            (Method::GET, "/v1/procs/evil"),
            (Method::POST, "/v1/procs/evil/kill"),
            (Method::DELETE, "/v1/procs/evil"),
            (Method::POST, "/v1/leave"),
        ] {
            let a = raw.json(m.clone(), p, serde_json::json!(body)).await;
            a.expect(StatusCode::UNAUTHORIZED, ErrorCode::Unauthenticated);
            let text = String::from_utf8_lossy(&a.body);
            assert!(!text.contains(TOKEN), "{m} {p}: the real token is not echoed: {text}");
        }
        match ws(&d, token.as_deref().filter(|t| t.len() < 1024), "intruder").await {
            Ok(_) => panic!("a WebSocket without the right token was accepted"),
            Err(resp) => {
                assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
                let typed: ErrorReply = serde_json::from_slice(resp.body().as_deref().unwrap())
                    .expect("a typed body on a refused upgrade");
                assert_eq!(typed.error.code, ErrorCode::Unauthenticated);
            }
        }
    }
    // Give a wrongly started process time to show itself before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "a refused request ran its argv");
    assert_eq!(d.state.live_count(), 0, "nothing was started");

    // The same request with the right token does run: the argv above was a real one.
    let a = Raw::ok(&d, "owner").json(Method::POST, "/v1/procs", serde_json::json!(body)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    within("the marker appears", async {
        while !marker.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(d.state.live_count(), 1);
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_needs_no_token_and_says_nothing_else() {
    let d = daemon(1 << 20);
    let a = Raw::new(&d, None, None).send(Method::GET, "/health", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, b"ok");
    // `/v1/info` (limits, boot id) is not public.
    let a = Raw::new(&d, None, None).send(Method::GET, "/v1/info", None).await;
    a.expect(StatusCode::UNAUTHORIZED, ErrorCode::Unauthenticated);
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_a_typed_413_and_starts_nothing() {
    let d = daemon(2048);
    let raw = Raw::ok(&d, "big");
    let big = "y".repeat(8192);
    let a =
        raw.json(Method::POST, "/v1/procs", serde_json::json!(start("big", &["echo", &big]))).await;
    a.expect(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::LimitExceeded);
    assert!(a.error().message.contains("2048"), "names the limit: {:?}", a.error().message);
    assert_eq!(d.state.live_count(), 0);

    // Under the limit the same call works, and a too-large stdin write to it is refused
    // without touching it.
    let mut cat = start("cat", &["cat"]);
    cat.spec = cat
        .spec
        .with_stdin(StdinSpec::Pipe)
        .with_stdout(OutputSpec::Collect { max_bytes: 1 << 16, spill_cap: 0 });
    let a = raw.json(Method::POST, "/v1/procs", serde_json::json!(cat)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    let input = proto::Input { offset: 0, data: vec![b'z'; 4096], eof: false };
    let a = raw.json(Method::POST, "/v1/procs/cat/stdin", serde_json::json!(input)).await;
    a.expect(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::LimitExceeded);
    let input = proto::Input { offset: 0, data: b"small\n".to_vec(), eof: true };
    let a = raw.json(Method::POST, "/v1/procs/cat/stdin", serde_json::json!(input)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    let accepted: proto::Accepted = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(accepted.next_offset, 6, "only the small write was taken");
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_a_typed_404_not_found() {
    let d = daemon(1 << 20);
    let raw = Raw::ok(&d, "someone");
    let input = proto::Input { offset: 0, data: b"x".to_vec(), eof: false };
    let long = "n".repeat(5000);
    for id in ["nope", "p1", long.as_str()] {
        for (m, p) in [
            (Method::GET, format!("/v1/procs/{id}")),
            (Method::GET, format!("/v1/procs/{id}/read?stream=stdout")),
            (Method::POST, format!("/v1/procs/{id}/stdin")),
            (Method::POST, format!("/v1/procs/{id}/kill")),
            (Method::POST, format!("/v1/procs/{id}/release")),
            (Method::DELETE, format!("/v1/procs/{id}")),
            (Method::GET, format!("/v1/terms/{id}")),
            (Method::DELETE, format!("/v1/terms/{id}")),
        ] {
            let a = raw.json(m.clone(), &p, serde_json::json!(input)).await;
            assert_eq!(a.status, StatusCode::NOT_FOUND, "{m} {}", &p[..p.len().min(60)]);
            assert_eq!(a.error().code, ErrorCode::NotFound);
        }
    }
    // Unknown endpoints too.
    raw.send(Method::GET, "/v1/nothing-here", None)
        .await
        .expect(StatusCode::NOT_FOUND, ErrorCode::NotFound);
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_ids_are_not_found_and_untouched() {
    let d = daemon(1 << 20);
    let alice = Raw::ok(&d, "alice");
    let mallory = Raw::ok(&d, "mallory");
    let a = alice
        .json(Method::POST, "/v1/procs", serde_json::json!(start("mine", &["sleep", "1000"])))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    let input = proto::Input { offset: 0, data: b"x".to_vec(), eof: true };
    for (m, p) in [
        (Method::GET, "/v1/procs/mine"),
        (Method::GET, "/v1/procs/mine/read?stream=stdout"),
        (Method::POST, "/v1/procs/mine/stdin"),
        (Method::POST, "/v1/procs/mine/kill"),
        (Method::POST, "/v1/procs/mine/release"),
        (Method::DELETE, "/v1/procs/mine"),
    ] {
        mallory
            .json(m, p, serde_json::json!(input))
            .await
            .expect(StatusCode::NOT_FOUND, ErrorCode::NotFound);
    }
    // Starting the same id as another client makes a process of its own, not a handle on
    // alice's.
    let a =
        mallory.json(Method::POST, "/v1/procs", serde_json::json!(start("mine", &["true"]))).await;
    let started: proto::Started = serde_json::from_slice(&a.body).unwrap();
    assert!(started.created, "mallory's `mine` is mallory's");
    // Nor can a stream connection attach it.
    let mut s = ws(&d, Some(TOKEN), "mallory-ws").await.unwrap();
    s.send(hello()).await.unwrap();
    assert!(matches!(next_msg(&mut s).await, Some(ServerMsg::Hello { .. })));
    let attach = ClientMsg::Attach { id: "mine".into(), from: Default::default() };
    s.send(text(&attach)).await.unwrap();
    match next_msg(&mut s).await {
        Some(ServerMsg::Error { id, error }) => {
            assert_eq!(id.as_deref(), Some("mine"));
            assert_eq!(error.code, ErrorCode::NotFound);
        }
        other => panic!("expected not_found for another client's id, got {other:?}"),
    }
    // Alice's process still runs.
    let a = alice.send(Method::GET, "/v1/procs/mine", None).await;
    let status: proto::ProcStatus = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(status.settled, None, "untouched by mallory");
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_axum_makes_itself_are_typed_too() {
    let d = daemon(1 << 20);
    let raw = Raw::ok(&d, "someone");
    let a = raw.send(Method::DELETE, "/v1/info", None).await;
    a.expect(StatusCode::METHOD_NOT_ALLOWED, ErrorCode::InvalidArgument);
    for (path, says) in [
        ("/v1/which", "program"),
        ("/v1/procs/x/read?stream=bogus", "stream"),
        ("/v1/procs/x/read?stream=stdout&offset=-1", "offset"),
        ("/v1/procs/%FF", "UTF-8"),
        ("/v1/ws", "upgrade"),
    ] {
        let a = raw.send(Method::GET, path, None).await;
        a.expect(StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument);
        assert!(a.error().message.contains(says), "{path}: {:?}", a.error().message);
    }
    // The auth check still comes first for a malformed query on a real route.
    Raw::new(&d, None, Some("someone"))
        .send(Method::GET, "/v1/procs/x/read?stream=bogus", None)
        .await
        .expect(StatusCode::UNAUTHORIZED, ErrorCode::Unauthenticated);
    stop(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_numbers_in_a_valid_start_are_harmless() {
    let d = daemon(1 << 20);
    let raw = Raw::ok(&d, "extreme");
    let mut body = serde_json::json!(start("huge-grace", &["sleep", "1000"]));
    body["spec"]["grace_ms"] = serde_json::json!(u64::MAX);
    let a = raw.send(Method::POST, "/v1/procs", Some(serde_json::to_vec(&body).unwrap())).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    let a = raw.send(Method::POST, "/v1/procs/huge-grace/kill", None).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    // `sleep` dies of TERM, so the absurd grace never matters and settlement is prompt.
    within("settled after kill", async {
        loop {
            let a = raw.send(Method::GET, "/v1/procs/huge-grace", None).await;
            let st: proto::ProcStatus = serde_json::from_slice(&a.body).unwrap();
            if st.settled.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // A long-poll read past everything with the longest wait is capped, not a hang.
    let path = "/v1/procs/huge-grace/read?stream=stdout&offset=18446744073709551615&max_bytes=18446744073709551615&wait_ms=18446744073709551615";
    let a = raw.send(Method::GET, path, None).await;
    assert!(!a.status.is_server_error(), "{}: {:?}", a.status, String::from_utf8_lossy(&a.body));
    stop(d).await;
}

/// splitmix64: a seeded, dependency-free generator (the same seed, the same run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T: ?Sized>(&mut self, xs: &[&'a T]) -> &'a T {
        xs[self.below(xs.len())]
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }

    fn word(&mut self, max: usize) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_.";
        let n = 1 + self.below(max);
        (0..n).map(|_| char::from(CHARS[self.below(CHARS.len())])).collect()
    }

    fn number(&mut self) -> serde_json::Value {
        match self.below(6) {
            0 => serde_json::json!(0),
            1 => serde_json::json!(-1),
            2 => serde_json::json!(u64::MAX),
            3 => serde_json::json!(1.5e300),
            4 => serde_json::json!(i64::MIN),
            _ => serde_json::json!(self.next() % 100_000),
        }
    }

    /// A random JSON value, nested at most `depth` deep.
    fn json(&mut self, depth: usize) -> serde_json::Value {
        use serde_json::Value;
        match self.below(if depth == 0 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(50)),
            2 => self.number(),
            3 => Value::String(self.word(12)),
            4 => Value::String(String::from_utf8_lossy(&self.bytes(24)).into_owned()),
            5 => Value::Array((0..self.below(4)).map(|_| self.json(depth - 1)).collect()),
            _ => {
                let keys = ["id", "spec", "argv", "offset", "data", "eof", "signal", "rows", "t"];
                Value::Object(
                    (0..self.below(5))
                        .map(|_| ((*self.pick(&keys)).to_owned(), self.json(depth - 1)))
                        .collect(),
                )
            }
        }
    }

    /// A valid body of some endpoint with one field replaced by random JSON.
    fn mutated(&mut self) -> serde_json::Value {
        let mut v = match self.below(4) {
            0 => serde_json::to_value(start(&format!("f{}", self.below(50)), &["true"])).unwrap(),
            1 => serde_json::to_value(proto::Input { offset: 0, data: b"hi".to_vec(), eof: false })
                .unwrap(),
            2 => serde_json::json!({"op": 1, "signal": "TERM", "target": "group"}),
            _ => serde_json::json!({"rows": 24, "cols": 80}),
        };
        let replacement = self.json(2);
        if let Some(obj) = v.as_object_mut() {
            let keys: Vec<String> = obj.keys().cloned().collect();
            let key = &keys[self.below(keys.len())];
            if let Some(spec) = obj.get_mut("spec").and_then(|s| s.as_object_mut())
                && self.chance(50)
            {
                let inner: Vec<String> = spec.keys().cloned().collect();
                let k = inner[self.below(inner.len())].clone();
                spec.insert(k, replacement);
            } else {
                obj.insert(key.clone(), replacement);
            }
        }
        v
    }

    fn body(&mut self) -> Option<Vec<u8>> {
        match self.below(7) {
            0 => None,
            1 => Some(self.bytes(256)),
            2 => Some(serde_json::to_vec(&self.json(3)).unwrap()),
            3 | 4 => Some(serde_json::to_vec(&self.mutated()).unwrap()),
            5 => {
                let full = serde_json::to_vec(&self.mutated()).unwrap();
                let cut = self.below(full.len());
                Some(full[..cut].to_vec())
            }
            // Valid shape, stdin bytes that are not base64.
            _ => Some(
                serde_json::to_vec(&serde_json::json!({
                    "offset": 0,
                    "data": self.pick(&["%%%", "not base64!", "QUJD=", "\u{1F600}", "A"]),
                    "eof": self.chance(50),
                }))
                .unwrap(),
            ),
        }
    }

    fn id(&mut self) -> String {
        match self.below(10) {
            0 | 8 => "live".into(),
            9 => format!("f{}", self.below(50)),
            1 => "n".repeat(1 + self.below(5000)),
            2 => "%FF%FE".into(),
            3 => "..".into(),
            4 => "%2F..%2Fetc".into(),
            5 => format!("{}", u64::MAX),
            _ => self.word(10),
        }
    }

    /// A path, and the method its route takes (when it has one).
    fn path(&mut self) -> (String, Method) {
        let id = self.id();
        let (get, post, delete) = (Method::GET, Method::POST, Method::DELETE);
        match self.below(14) {
            0 => ("/v1/procs".into(), post),
            1 => ("/v1/terms".into(), post),
            2 => (format!("/v1/procs/{id}"), if self.chance(50) { get } else { delete }),
            3 => (format!("/v1/terms/{id}"), if self.chance(50) { get } else { delete }),
            4 => {
                let stream = self.pick(&["stdout", "stderr", "pty", "", "0", "%FF"]);
                let offset = self.pick(&["0", "-1", "x", "18446744073709551616", "3"]);
                let max = self.pick(&["0", "1", "99999999999", "-5", ""]);
                let wait = self.pick(&["0", "5", "abc", "99999999999999999999999"]);
                let q = format!("stream={stream}&offset={offset}&max_bytes={max}&wait_ms={wait}");
                (format!("/v1/procs/{id}/read?{q}"), get)
            }
            5 => {
                let what = self.pick(&["stdin", "kill", "release", "nope", "stdin/extra"]);
                (format!("/v1/procs/{id}/{what}"), post)
            }
            6 => {
                let what = self.pick(&["input", "observe", "signal", "resize", "terminate"]);
                (format!("/v1/terms/{id}/{what}"), post)
            }
            7 => (format!("/v1/which?program={}", self.pick(&["sh", "", "%00", "a%FFb"])), get),
            8 => ("/v1/which".into(), get),
            9 => ("/v1/ws".into(), get),
            10 => ("/v1/info".into(), get),
            11 => (format!("/{}/{}", self.word(8), self.word(8)), get),
            12 => (format!("/v1/{}?{}={}", self.word(6), self.word(4), self.word(4)), post),
            _ => ("/health".into(), get),
        }
    }

    fn method(&mut self) -> Method {
        match self.below(9) {
            0 | 1 => Method::GET,
            2..=4 => Method::POST,
            5 => Method::DELETE,
            6 => Method::PUT,
            7 => Method::PATCH,
            _ => Method::from_bytes(b"FROB").unwrap(),
        }
    }
}

/// 1,000 malformed HTTP requests: never a 5xx, every refusal a typed body.
async fn fuzz_http(d: &Daemon, rng: &mut Rng) -> Vec<String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let mut problems = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..1000 {
        let (path, natural) = rng.path();
        let method = if rng.chance(70) { natural } else { rng.method() };
        let mut req = http.request(method.clone(), format!("{}{path}", d.url()));
        if rng.chance(85) {
            req = req.bearer_auth(TOKEN);
        } else if rng.chance(50) {
            req = req.bearer_auth(rng.word(20));
        }
        match rng.below(10) {
            0 => {}
            1 => req = req.header(proto::CLIENT_HEADER, ""),
            2 => req = req.header(proto::CLIENT_HEADER, "c".repeat(300)),
            _ => req = req.header(proto::CLIENT_HEADER, "fuzzer"),
        }
        if let Some(body) = rng.body() {
            let ct =
                rng.pick(&["application/json", "text/plain", "application/x-www-form-urlencoded"]);
            req = req.header("content-type", ct).body(body);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("#{i} {method} {path}: no answer: {e}"));
                continue;
            }
        };
        let status = resp.status();
        *statuses.entry(status.as_u16()).or_default() += 1;
        let body = resp.bytes().await.unwrap_or_default();
        let shown = &path[..path.len().min(80)];
        if status.is_server_error() {
            problems.push(format!(
                "#{i} {method} {shown}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        } else if status.is_client_error()
            && method != Method::HEAD
            && serde_json::from_slice::<ErrorReply>(&body).is_err()
        {
            problems.push(format!(
                "#{i} {method} {shown}: HTTP {status} without a typed body: {:?}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    eprintln!("fuzz statuses: {statuses:?}");
    // The fuzz reached handlers (successes and handler refusals), not only the edges.
    for expected in [200, 400, 401, 404, 405] {
        assert!(statuses.contains_key(&expected), "no HTTP {expected} in {statuses:?}");
    }
    problems
}

/// 1,000 malformed WebSocket frames over as many connections as they take.
async fn fuzz_ws(d: &Daemon, rng: &mut Rng) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sent = 0;
    let mut connections = 0;
    while sent < 1000 {
        connections += 1;
        let mut s = ws(d, Some(TOKEN), "fuzzer").await.expect("the daemon accepts a connection");
        let greet = rng.chance(75);
        if !greet {
            // Before hello: anything else is refused with a protocol error and a close.
            let frame = match rng.below(4) {
                0 => Message::Binary(rng.bytes(64).into()),
                1 => text(&ClientMsg::Hb),
                2 => text(&ClientMsg::Attach { id: "live".into(), from: Default::default() }),
                _ => Message::Text(String::from_utf8_lossy(&rng.bytes(64)).into_owned().into()),
            };
            sent += 1;
            if s.send(frame).await.is_err() {
                continue;
            }
            match next_msg(&mut s).await {
                Some(ServerMsg::Error { error, .. }) if error.code == ErrorCode::Protocol => {}
                other => problems.push(format!("no protocol error before hello: {other:?}")),
            }
            if next_msg(&mut s).await.is_some() {
                problems.push("the connection stayed open after a refused hello".into());
            }
            continue;
        }
        s.send(hello()).await.unwrap();
        sent += 1;
        match next_msg(&mut s).await {
            Some(ServerMsg::Hello { .. }) => {}
            other => {
                problems.push(format!("no hello answer: {other:?}"));
                continue;
            }
        }
        for _ in 0..(10 + rng.below(40)) {
            let frame = match rng.below(8) {
                0 => Message::Binary(rng.bytes(512).into()),
                1 => Message::Text(String::from_utf8_lossy(&rng.bytes(128)).into_owned().into()),
                2 => Message::Text(serde_json::to_string(&rng.json(3)).unwrap().into()),
                3 => text(&ClientMsg::Attach { id: rng.id(), from: Default::default() }),
                4 => Message::Text(
                    serde_json::json!({"t": "attach", "id": rng.json(1), "from": rng.json(1)})
                        .to_string()
                        .into(),
                ),
                5 if rng.chance(50) => text(&ClientMsg::Detach { id: rng.id() }),
                5 => {
                    // A live process from offsets it never reached, or far past them.
                    let mut from = std::collections::BTreeMap::new();
                    for s in [proto::Stream::Stdout, proto::Stream::Stderr, proto::Stream::Pty] {
                        if rng.chance(60) {
                            from.insert(s, *rng.pick(&[&0, &1, &u64::MAX, &(1 << 40)]));
                        }
                    }
                    text(&ClientMsg::Attach { id: "live-ws".into(), from })
                }
                6 => text(&ClientMsg::Hello { protocol: rng.word(6), heartbeat_ms: rng.next() }),
                _ => text(&ClientMsg::Hb),
            };
            sent += 1;
            if let Err(e) = s.send(frame).await {
                problems.push(format!("the server dropped a greeted connection: {e}"));
                break;
            }
        }
        // The connection still works: an attach of an unknown id is answered.
        let probe = ClientMsg::Attach { id: "probe-unknown".into(), from: Default::default() };
        if s.send(text(&probe)).await.is_err() {
            problems.push("the connection died under malformed frames".into());
            continue;
        }
        let mut answered = false;
        while let Some(m) = next_msg(&mut s).await {
            if let ServerMsg::Error { id: Some(id), error } = m
                && id == "probe-unknown"
            {
                assert_eq!(error.code, ErrorCode::NotFound);
                answered = true;
                break;
            }
        }
        if !answered {
            problems.push("a greeted connection stopped answering after malformed frames".into());
        }
        let _ = s.close(None).await;
    }
    assert!(connections > 10, "the frames spread over many connections: {connections}");
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_malformed_requests_and_frames_leave_the_daemon_serving() {
    let d = daemon(64 << 10);
    // One real process for the fuzzer, so some mistakes reach a live entry.
    let mut live = start("live", &["cat"]);
    live.spec = live
        .spec
        .with_stdin(StdinSpec::Pipe)
        .with_stdout(OutputSpec::Collect { max_bytes: 1 << 16, spill_cap: 0 });
    let a = Raw::ok(&d, "fuzzer").json(Method::POST, "/v1/procs", serde_json::json!(live)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));

    // A fixed seed, so a failure replays; CONCH_FUZZ_SEED explores others.
    let seed = std::env::var("CONCH_FUZZ_SEED").ok().and_then(|s| s.parse().ok());
    let mut rng = Rng(seed.unwrap_or(0x00C0_FFEE_D15E_A5E5));
    let mut problems = fuzz_http(&d, &mut rng).await;
    live.id = "live-ws".into();
    let a = Raw::ok(&d, "fuzzer").json(Method::POST, "/v1/procs", serde_json::json!(live)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    let input = proto::Input { offset: 0, data: b"echoed\n".to_vec(), eof: false };
    let a = Raw::ok(&d, "fuzzer")
        .json(Method::POST, "/v1/procs/live-ws/stdin", serde_json::json!(input))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    problems.extend(fuzz_ws(&d, &mut rng).await);
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));

    // And the daemon still serves a fresh client end to end.
    let client = with_token(Some(TOKEN), || d.client());
    let spec = SpawnSpec::new(vec!["echo".into(), "still serving".into()], "/tmp")
        .with_stdout(OutputSpec::Collect { max_bytes: 1 << 16, spill_cap: 0 });
    let p = client.spawn(spec).await.unwrap();
    let status = within("echo", p.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    let out = p.read(StreamId::Stdout, 0, 1 << 16).unwrap();
    assert_eq!(out.data, b"still serving\n");
    within("shutdown", client.shutdown()).await;
    stop(d).await;
}
