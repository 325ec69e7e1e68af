//! `conch e2b`: E2B's envd served from a composition's subprocess and files seams, so the
//! unmodified `e2b` SDK (2.63.0, Python; the JS SDK speaks the same protocol) runs its
//! commands, PTYs and files on conch: locally, under a sandbox composition confined, or on a
//! remote sandbox through `remote-sandbox` and `files-remote`.
//!
//! # Map
//! - `connect.rs`: Connect RPC with the JSON codec (unary calls, server streams, errors,
//!   timeouts, keepalives).
//! - `process.rs`: `/process.Process/*` over the subprocess seam.
//! - `filesystem.rs`: `/filesystem.Filesystem/*` over the files seam.
//! - `files.rs`: `GET`/`POST /files`, streamed both ways.
//! - `sandboxes.rs`: E2B's sandbox API (`--api-key`): a world, an envd and a token per
//!   sandbox, envd calls routed by `E2b-Sandbox-Id`.
//! - `GET /health` answers `204` without a token, as envd's does.
//!
//! # Invariants
//! - With an access token set, every route but `/health` checks `X-Access-Token` in constant
//!   time before anything runs; a refused request starts nothing (`401`, Connect code
//!   `unauthenticated`).
//! - Processes, PTYs and files go through the seams, never around them: under a sandbox
//!   composition every process starts behind the sandbox's runner (`Confinement`, as the
//!   shell executors wrap theirs) and every file call goes through its confined files seam.
//! - A process outlives the stream that started it; the server's shutdown stops every tree
//!   it started and waits for each to settle.
//!
//! Not served: `StreamInput` (client streaming needs HTTP/2 and the SDKs' `send_stdin` uses
//! `SendInput`), users (`username`, `Authorization: Basic`: everything runs as the server's
//! user), file metadata, signed URLs, the `/envs`, `/init` and metrics routes.

mod connect;
mod files;
mod filesystem;
mod process;
mod proto;
pub mod sandboxes;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use conch_nonce::same_secret;
use conch_seams::{Files, Subprocess};

use crate::connect::{CallOptions, Code, RpcError};

pub use files::READ_CHUNK;
pub use filesystem::WATCHER_QUEUE;
pub use process::{KEPT_ENDED, MEMORY_BYTES, PTY_LOG_BYTES, ProcessDefaults, SPILL_CAP};

/// The largest RPC request (a `SendInput`'s bytes, base64 in JSON).
pub const MAX_RPC_BODY: usize = 64 << 20;
/// The header a client sets to have `Connect` replay the output still kept (`all`) instead
/// of following only what comes next, which is envd's behaviour and the default.
pub const REPLAY_HEADER: &str = "x-conch-replay";

/// The seams envd is served from.
#[derive(Clone, Debug)]
pub struct Seams {
    /// Commands and PTYs run here.
    pub subprocess: Arc<dyn Subprocess>,
    /// Files and the filesystem service act here (and a lagging follower's spill is read).
    pub files: Arc<dyn Files>,
    /// The composition's sandbox with its default policy, when it binds one: every process
    /// starts behind its runner (the files seam of such a composition confines itself).
    pub confinement: Option<conch_confine::Confinement>,
    /// The working directory and environment of a process whose `Start` gives none.
    pub defaults: ProcessDefaults,
}

/// The server's state.
#[derive(Debug)]
pub struct Envd {
    token: Option<String>,
    files: Arc<dyn Files>,
    processes: Arc<process::Processes>,
    filesystem: Arc<filesystem::Filesystem>,
}

impl Envd {
    /// envd over `seams`, admitting requests that carry `token` as `X-Access-Token` (`None`:
    /// every request, E2B's debug mode; the CLI allows that on loopback only).
    pub fn new(seams: Seams, token: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            token,
            files: Arc::clone(&seams.files),
            processes: process::Processes::new(
                seams.subprocess,
                Arc::clone(&seams.files),
                seams.confinement,
                seams.defaults,
            ),
            filesystem: filesystem::Filesystem::new(seams.files),
        })
    }

    /// Ends every watch and stops every process tree the server started, waiting for each.
    pub async fn shutdown(&self) {
        self.filesystem.shutdown();
        self.processes.shutdown().await;
    }
}

/// envd's routes, behind the token check.
pub fn router(envd: Arc<Envd>) -> Router {
    let rpc = Router::new()
        .route("/process.Process/{method}", post(process_rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem_rpc))
        .layer(DefaultBodyLimit::max(MAX_RPC_BODY));
    let files = Router::new()
        .route("/files", get(download).post(upload))
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(rpc)
        .merge(files)
        .layer(middleware::from_fn_with_state(Arc::clone(&envd), authenticate))
        // After the layer: the health check needs no token.
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .with_state(envd)
}

/// Serves `envd` on `listener` until `stop` resolves, then stops what it started.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    envd: Arc<Envd>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = Arc::clone(&envd);
    // Stopped before the server drains: a stream follows its process until it ends, so
    // draining first would wait on every running process.
    let stop = async move {
        stop.await;
        stopping.shutdown().await;
    };
    let r = serve_router(listener, router(Arc::clone(&envd)), stop).await;
    envd.shutdown().await;
    r
}

/// Serves `app` on `listener` until `stop` resolves.
async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    // A stream's messages are small writes on a connection the SDK keeps: with Nagle on,
    // each one after the first waits for the client's delayed ACK (40 ms a call).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, app).with_graceful_shutdown(stop).await
}

async fn authenticate(State(envd): State<Arc<Envd>>, req: Request, next: Next) -> Response {
    if let Some(token) = &envd.token {
        let given = req.headers().get("x-access-token");
        if !given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes())) {
            let why = if given.is_some() {
                "the access token (X-Access-Token) is not this sandbox's"
            } else {
                "this sandbox needs its access token (X-Access-Token)"
            };
            return answer_unread(req, RpcError::new(Code::Unauthenticated, why).into_response())
                .await;
        }
    }
    next.run(req).await
}

/// The most of a refused request's body read before answering.
const DRAINED: usize = 1 << 20;

/// `answer` to `req`, whose body nothing read: the body is read first (up to [`DRAINED`])
/// so the connection stays usable; past that the answer closes an HTTP/1 connection. Left
/// unread, the server closes the connection without saying so, and a client that reuses it
/// for its next request meets a broken pipe mid-request.
pub(crate) async fn answer_unread(req: Request, mut answer: Response) -> Response {
    let http1 = req.version() < axum::http::Version::HTTP_2;
    if axum::body::to_bytes(req.into_body(), DRAINED).await.is_err() && http1 {
        answer
            .headers_mut()
            .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    answer
}

/// Runs a unary call within its `Connect-Timeout-Ms`.
async fn unary_call(
    headers: &HeaderMap,
    body: &[u8],
    call: impl AsyncFnOnce(serde_json::Value) -> Result<serde_json::Value, RpcError>,
) -> Response {
    let opts = match CallOptions::from_headers(headers) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let message = match connect::unary_request(headers, body) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let r = match opts.timeout.filter(|t| !t.is_zero()) {
        Some(t) => match tokio::time::timeout(t, call(message)).await {
            Ok(r) => r,
            Err(_) => Err(RpcError::new(Code::DeadlineExceeded, "the call's timeout passed")),
        },
        None => call(message).await,
    };
    connect::unary(r)
}

/// Starts a server stream, or answers why it will not run.
async fn stream_call(
    headers: &HeaderMap,
    body: &[u8],
    call: impl AsyncFnOnce(serde_json::Value, CallOptions) -> Result<Response, RpcError>,
) -> Response {
    let opts = match CallOptions::from_headers(headers) {
        Ok(o) => o,
        Err(e) => return connect::stream_refused(e),
    };
    match connect::stream_request(headers, body) {
        Ok(m) => call(m, opts).await.unwrap_or_else(connect::stream_refused),
        Err(e) => connect::stream_refused(e),
    }
}

fn unknown_method(service: &str, method: &str) -> Response {
    let e = RpcError::new(Code::Unimplemented, format!("{service}/{method} is not served"));
    let mut r = e.into_response();
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}

async fn process_rpc(
    State(envd): State<Arc<Envd>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let p = &envd.processes;
    match method.as_str() {
        "Start" => stream_call(&headers, &body, async |m, o| p.start(m, o).await).await,
        "Connect" => {
            let replay = headers
                .get(REPLAY_HEADER)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"all"));
            stream_call(&headers, &body, async |m, o| p.connect(m, o, replay)).await
        }
        "List" => unary_call(&headers, &body, async |_| Ok(p.list())).await,
        "SendInput" => unary_call(&headers, &body, async |m| p.send_input(m).await).await,
        "SendSignal" => unary_call(&headers, &body, async |m| p.send_signal(m).await).await,
        "CloseStdin" => unary_call(&headers, &body, async |m| p.close_stdin(m).await).await,
        "Update" => unary_call(&headers, &body, async |m| p.update(m).await).await,
        "StreamInput" => RpcError::new(
            Code::Unimplemented,
            "StreamInput (client streaming) is not served: send input with SendInput",
        )
        .into_response(),
        other => unknown_method("process.Process", other),
    }
}

async fn filesystem_rpc(
    State(envd): State<Arc<Envd>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let f = &envd.filesystem;
    match method.as_str() {
        "Stat" => unary_call(&headers, &body, async |m| f.stat(m).await).await,
        "MakeDir" => unary_call(&headers, &body, async |m| f.make_dir(m).await).await,
        "Move" => unary_call(&headers, &body, async |m| f.move_entry(m).await).await,
        "ListDir" => unary_call(&headers, &body, async |m| f.list_dir(m).await).await,
        "Remove" => unary_call(&headers, &body, async |m| f.remove(m).await).await,
        "WatchDir" => stream_call(&headers, &body, async |m, o| f.watch_dir(m, o).await).await,
        "CreateWatcher" => unary_call(&headers, &body, async |m| f.create_watcher(m).await).await,
        "GetWatcherEvents" => unary_call(&headers, &body, async |m| f.get_watcher_events(m)).await,
        "RemoveWatcher" => unary_call(&headers, &body, async |m| f.remove_watcher(m)).await,
        other => unknown_method("filesystem.Filesystem", other),
    }
}

async fn download(State(envd): State<Arc<Envd>>, q: Query<files::FileQuery>) -> Response {
    files::download(Arc::clone(&envd.files), q).await
}

async fn upload(
    State(envd): State<Arc<Envd>>,
    Query(q): Query<files::FileQuery>,
    req: Request,
) -> Response {
    files::upload(Arc::clone(&envd.files), q, req).await
}
