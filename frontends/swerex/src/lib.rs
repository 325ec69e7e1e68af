//! `conch swerex-remote`: SWE-ReX's HTTP API (swe-rex 1.4.0's `swerex-remote`) served from a
//! composition's seams, so SWE-agent, mini-swe-agent and every SWE-ReX deployment drive conch
//! unmodified. Sessions are persistent shells on the terminals service (`session.rs`),
//! `execute` runs through the shell seam and files through the files seam (`execute.rs`);
//! under a sandbox composition every one of them runs confined.
//!
//! # Invariants
//! - The key (`X-API-Key`) is checked in constant time before routing, on every path: a
//!   missing key is 403 and a wrong one 401 (what swe-rex's tests expect), and a refused
//!   request starts nothing.
//! - Every request runs to its end in a task of its own, whether or not its client waits.
//! - `X-Request-ID`: a request whose id was seen answers what that request answered (waiting
//!   for it when it is still running) and runs nothing; the last [`REPLAY_IDS`] ids are kept,
//!   with answers up to [`MAX_KEPT_BODY`].
//! - Errors are HTTP 511 with the `swerexception` body the client re-raises (`error.rs`).
//! - `/close` closes every session (each one's whole process tree is stopped first) and the
//!   server goes on serving, as swe-rex's does.

mod error;
mod execute;
mod models;
mod session;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Multipart, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use conch_nonce::same_secret;
use conch_seams::{Files, NoticeSink, Owner, ShellExecutor, Subprocess, Terminals};
use conch_sync::LockExt;
use serde_json::json;
use tokio::sync::watch;

use crate::error::{Raised, refused};
use crate::models::{Action, CloseSession, Command, CreateSession, ReadFile, WriteFile};
use crate::session::Sessions;

/// Request ids whose responses are kept for replay.
pub const REPLAY_IDS: usize = 64;
/// Largest request body (an `upload`'s file, a `write_file`'s content).
pub const MAX_BODY: usize = 1 << 30;
/// Largest response kept for an `X-Request-ID` replay.
pub const MAX_KEPT_BODY: usize = 8 << 20;

/// The seams the API is served from.
#[derive(Clone, Debug)]
pub struct Seams {
    /// Named sessions open here.
    pub terminals: Arc<dyn Terminals>,
    /// `execute` runs here.
    pub shell: Arc<dyn ShellExecutor>,
    /// `read_file`, `write_file` and `upload` act here.
    pub files: Arc<dyn Files>,
    /// The syntax check (`bash -n`) runs here.
    pub subprocess: Arc<dyn Subprocess>,
}

/// Notices for the front end's owner have no one to go to: sessions are closed explicitly.
#[derive(Debug)]
struct NoNotices;

impl NoticeSink for NoNotices {
    fn deliver(&self, _notice: conch_seams::Notice) {}
}

/// A kept response: status, content type and body.
type Kept = (StatusCode, Option<axum::http::HeaderValue>, axum::body::Bytes);

/// The API's state.
#[derive(Debug)]
pub struct Api {
    token: String,
    seams: Seams,
    sessions: Sessions,
    /// Responses by request id, oldest first (`None` while the request runs).
    replay: std::sync::Mutex<VecDeque<(String, watch::Receiver<Option<Kept>>)>>,
}

impl Api {
    /// An API over `seams` that admits requests carrying `token` (empty: every request, as
    /// swe-rex does with an empty `--auth-token`; the CLI allows that on loopback only).
    pub fn new(seams: Seams, token: String) -> Arc<Self> {
        let owner = Owner::new("swerex", Arc::new(NoNotices));
        let sessions =
            Sessions::new(Arc::clone(&seams.terminals), Arc::clone(&seams.subprocess), owner);
        Arc::new(Self { token, seams, sessions, replay: std::sync::Mutex::new(VecDeque::new()) })
    }

    /// Closes every session (the server's shutdown).
    pub async fn shutdown(&self) {
        if let Err(e) = self.sessions.close_all().await {
            tracing::warn!("closing the sessions: {e}");
        }
    }
}

/// The API's routes, behind the key check and the request-id replay.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/", get(|| async { axum::Json(json!({"message": "hello world"})) }))
        .route("/is_alive", get(|| async { axum::Json(json!({"is_alive": true, "message": ""})) }))
        .route("/create_session", post(create_session))
        .route("/run_in_session", post(run_in_session))
        .route("/close_session", post(close_session))
        .route("/execute", post(execute))
        .route("/read_file", post(read_file))
        .route("/write_file", post(write_file))
        .route("/upload", post(upload))
        .route("/close", post(close))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(Arc::clone(&api), replay))
        .layer(middleware::from_fn_with_state(Arc::clone(&api), authenticate))
        .with_state(api)
}

/// Serves `api` on `listener` until `stop` resolves, then closes every session.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Arc<Api>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(Arc::clone(&api)).into_make_service_with_connect_info::<SocketAddr>();
    let r = axum::serve(listener, app).with_graceful_shutdown(stop).await;
    api.shutdown().await;
    r
}

async fn authenticate(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    if !api.token.is_empty() {
        match req.headers().get("x-api-key") {
            None => return refused(StatusCode::FORBIDDEN, "Not authenticated"),
            Some(k) if !same_secret(k.as_bytes(), api.token.as_bytes()) => {
                return refused(StatusCode::UNAUTHORIZED, "Invalid API Key");
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

/// Runs each request to its end in a task of its own, so a client that goes away mid-call
/// (SWE-ReX's client retries with the same `X-Request-ID`) leaves no command half-observed,
/// and answers a request whose id was seen with that request's response.
async fn replay(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let tx = match &id {
        None => None,
        Some(id) => {
            let seen = {
                let mut kept = api.replay.locked();
                match kept.iter().find(|(k, _)| k == id) {
                    Some((_, rx)) => Err(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        kept.push_back((id.clone(), rx));
                        while kept.len() > REPLAY_IDS {
                            kept.pop_front();
                        }
                        Ok(tx)
                    }
                }
            };
            match seen {
                Ok(tx) => Some(tx),
                Err(mut rx) => {
                    return match rx.wait_for(Option::is_some).await {
                        Ok(kept) => kept_response(kept.clone()),
                        Err(_) => refused(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "the request with this X-Request-ID failed before it answered",
                        ),
                    };
                }
            }
        }
    };
    let task = tokio::spawn(async move {
        let (parts, body) = next.run(req).await.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(b) => b,
            Err(e) => axum::body::Bytes::from(json!({"detail": e.to_string()}).to_string()),
        };
        let kept =
            (parts.status, parts.headers.get(axum::http::header::CONTENT_TYPE).cloned(), bytes);
        if let (Some(tx), Some(id)) = (tx, id) {
            // A large answer (a big `read_file`) is not kept: a retry reads again.
            if kept.2.len() > MAX_KEPT_BODY {
                api.replay.locked().retain(|(k, _)| *k != id);
            }
            let _ = tx.send(Some(kept.clone()));
        }
        kept
    });
    match task.await {
        Ok(kept) => kept_response(Some(kept)),
        Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, format!("the request failed: {e}")),
    }
}

fn kept_response(kept: Option<Kept>) -> Response {
    let Some((status, ctype, body)) = kept else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "no response was kept");
    };
    let mut headers = HeaderMap::new();
    if let Some(c) = ctype {
        headers.insert(axum::http::header::CONTENT_TYPE, c);
    }
    (status, headers, Body::from(body)).into_response()
}

/// A JSON body as the model `T`, or why it is not one.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))
}

/// FastAPI's answer to a body that is not the model.
fn unprocessable(why: String) -> Response {
    refused(StatusCode::UNPROCESSABLE_ENTITY, why)
}

fn answer<T: serde::Serialize>(r: Result<T, Raised>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn create_session(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<CreateSession>(&body) {
        Ok(r) => answer(api.sessions.create(r).await),
        Err(why) => unprocessable(why),
    }
}

async fn run_in_session(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<Action>(&body) {
        Ok(Action::Bash(a)) => answer(api.sessions.run(a).await),
        Ok(Action::Interrupt(a)) => answer(api.sessions.interrupt(a).await),
        Err(why) => unprocessable(why),
    }
}

async fn close_session(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<CloseSession>(&body) {
        Ok(r) => {
            answer(api.sessions.close(&r.session).await.map(|()| json!({"session_type": "bash"})))
        }
        Err(why) => unprocessable(why),
    }
}

async fn execute(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<Command>(&body) {
        Ok(c) => answer(execute::execute(&api.seams.shell, c).await),
        Err(why) => unprocessable(why),
    }
}

async fn read_file(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<ReadFile>(&body) {
        Ok(r) => {
            answer(execute::read_file(&api.seams.files, r).await.map(|c| json!({"content": c})))
        }
        Err(why) => unprocessable(why),
    }
}

async fn write_file(State(api): State<Arc<Api>>, body: axum::body::Bytes) -> Response {
    match parse::<WriteFile>(&body) {
        Ok(w) => answer(execute::write_file(&api.seams.files, w).await.map(|()| json!({}))),
        Err(why) => unprocessable(why),
    }
}

/// `upload`: multipart `file`, `target_path` and `unzip` (a zip unpacked into `target_path`).
async fn upload(State(api): State<Arc<Api>>, mut form: Multipart) -> Response {
    let (mut file, mut target, mut unzip) = (None, None, false);
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                return refused(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("bad multipart body: {e}"),
                );
            }
        };
        let name = field.name().unwrap_or_default().to_string();
        let data = match field.bytes().await {
            Ok(d) => d,
            Err(e) => {
                return refused(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("bad multipart body: {e}"),
                );
            }
        };
        match name.as_str() {
            "file" => file = Some(data),
            "target_path" => target = Some(String::from_utf8_lossy(&data).into_owned()),
            // Pydantic's boolean words.
            "unzip" => {
                unzip = matches!(
                    String::from_utf8_lossy(&data).to_ascii_lowercase().as_str(),
                    "true" | "1" | "yes" | "on" | "t" | "y"
                );
            }
            _ => {}
        }
    }
    let (Some(file), Some(target)) = (file, target) else {
        return refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "upload needs the fields file and target_path",
        );
    };
    let files = &api.seams.files;
    let target = std::path::PathBuf::from(target);
    let r = if unzip {
        execute::unzip_into(files, &target, file).await
    } else {
        execute::replace_file(files, &target, &file).await
    };
    answer(r.map(|()| json!({})))
}

async fn close(State(api): State<Arc<Api>>) -> Response {
    answer(api.sessions.close_all().await.map(|()| json!({})))
}
