//! The HTTP half of RXP/1: control calls with JSON bodies, typed errors, auth and limits.
//!
//! Every route but `/health` goes through the bearer-token check; bodies are size-limited, and
//! every refusal is typed JSON.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use conch_seams::{Error, ErrorCode, ErrorReason, StreamId, TerminalObservation};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use conch_nonce::same_secret;

use super::{Entry, Held, ProcEntry, State, TermEntry};
use conch_provider_remote_proto::{
    self as proto, Accepted, ErrorReply, ProcStatus, Started, Which,
};

type Shared = Arc<State>;

/// A handler's failure: a typed error that becomes a JSON body with a matching status.
pub(crate) struct ApiError(pub(crate) Box<Error>, pub(crate) StatusCode);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = status_of(e.code());
        Self(Box::new(e), status)
    }
}

/// The HTTP status an error code travels with; the body carries the code itself.
pub(crate) fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidArgument | ErrorCode::Protocol | ErrorCode::InvalidComposition => {
            StatusCode::BAD_REQUEST
        }
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied | ErrorCode::SandboxDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::AlreadyExists | ErrorCode::ForeignOwner | ErrorCode::DirectoryNotEmpty => {
            StatusCode::CONFLICT
        }
        ErrorCode::NotADirectory | ErrorCode::IsADirectory => StatusCode::BAD_REQUEST,
        ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::SpawnFailed => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::Disposing | ErrorCode::RemoteUnavailable | ErrorCode::SandboxUnavailable => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.1;
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::warn!(error = %self.0, "request failed");
        }
        (status, axum::Json(ErrorReply { error: self.0.to_body() })).into_response()
    }
}

type ApiResult<T> = std::result::Result<axum::Json<T>, ApiError>;

/// The daemon's routes, with auth and limits applied.
pub fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/info", get(info))
        .route("/v1/which", get(which))
        .route("/v1/procs", post(start_proc))
        .route("/v1/procs/{id}", get(proc_status).delete(forget_proc))
        .route("/v1/procs/{id}/read", get(read_proc))
        .route("/v1/procs/{id}/stdin", post(proc_stdin))
        .route("/v1/procs/{id}/kill", post(kill_proc))
        .route("/v1/procs/{id}/release", post(release_proc))
        .route("/v1/terms", post(start_term))
        .route("/v1/terms/{id}", get(term_status).delete(forget_term))
        .route("/v1/terms/{id}/input", post(term_input))
        .route("/v1/terms/{id}/observe", post(term_observe))
        .route("/v1/terms/{id}/signal", post(term_signal))
        .route("/v1/terms/{id}/resize", post(term_resize))
        .route("/v1/terms/{id}/terminate", post(term_terminate))
        .route("/v1/files/stat", post(super::files::stat))
        .route("/v1/files/read", post(super::files::read))
        .route("/v1/files/list", post(super::files::list))
        .route("/v1/files/mkdir", post(super::files::mkdir))
        .route("/v1/files/rename", post(super::files::rename))
        .route("/v1/files/remove", post(super::files::remove))
        .route("/v1/files/uploads", post(super::files::open_upload))
        .route(
            "/v1/files/uploads/{id}",
            axum::routing::put(super::files::upload_chunk).delete(super::files::delete_upload),
        )
        .route("/v1/files/uploads/{id}/finish", post(super::files::finish_upload))
        .route("/v1/files/exports", post(super::files::open_export))
        .route(
            "/v1/files/exports/{id}",
            get(super::files::read_export).delete(super::files::delete_export),
        )
        .route("/v1/leave", post(leave))
        .route("/v1/ws", any(super::ws::upgrade))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .merge(v1)
        .fallback(not_found)
        .with_state(state)
        .layer(middleware::from_fn(typed_refusals))
}

/// axum answers some client mistakes itself, before any handler runs: a method a route
/// does not have (405, empty body), a path or query that does not parse (400, plain text),
/// a `/v1/ws` request that is no WebSocket upgrade. Every refusal must carry a typed JSON
/// body (clients read the code, not the text), so those are rewritten here with the same
/// status and axum's text as the message. Found by the fuzz in `tests/it/remote/security.rs`.
async fn typed_refusals(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let typed = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if typed || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthenticated,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::LimitExceeded,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::InvalidArgument,
    };
    let message = match (text.is_empty(), status) {
        (false, _) => text,
        (true, StatusCode::METHOD_NOT_ALLOWED) => {
            "this endpoint does not take that method; see docs/protocol.md".to_owned()
        }
        (true, _) => format!("request refused with HTTP {status}"),
    };
    let mut typed = ApiError(Box::new(Error::new(code, message)), status).into_response();
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        typed.headers_mut().insert(header::ALLOW, allow.clone());
    }
    typed
}

async fn not_found() -> ApiError {
    ApiError::from(Error::new(ErrorCode::NotFound, "no such endpoint; see docs/protocol.md"))
}

/// Bearer-token check before any handler runs: a refused request starts nothing.
async fn auth(AxState(state): AxState<Shared>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.cfg.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes()));
        if !ok {
            let why = if given.is_some() {
                "the bearer token is wrong"
            } else {
                "missing `Authorization: Bearer <token>` header"
            };
            return ApiError::from(Error::new(
                ErrorCode::Unauthenticated,
                format!("{why}; give the daemon's token (its --token-file)"),
            ))
            .into_response();
        }
    }
    // After auth, so an unauthenticated caller learns nothing about restarts.
    let known = req.headers().get(proto::BOOT_HEADER).and_then(|v| v.to_str().ok());
    if let Some(known) = known
        && known != state.boot_id
    {
        return ApiError::from(
            Error::new(
                ErrorCode::RemoteUnavailable,
                format!(
                    "this daemon restarted (boot id {}, the client knew {known}): every process                      the client started is gone; rebuild the runtime",
                    state.boot_id
                ),
            )
            .with_reason(ErrorReason::BootChanged),
        )
        .into_response();
    }
    next.run(req).await
}

/// The client (lease) a request belongs to; every call renews its lease.
pub(crate) fn client_of(state: &State, headers: &HeaderMap) -> Result<String, ApiError> {
    let id = headers
        .get(proto::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .ok_or_else(|| {
            Error::invalid(format!(
                "missing or bad `{}` header (1..=128 chars)",
                proto::CLIENT_HEADER
            ))
        })?;
    state.touch(id);
    Ok(id.to_owned())
}

/// Reads and parses a JSON body under the daemon's size limit.
pub(crate) async fn json_body<T: DeserializeOwned>(
    state: &State,
    body: Body,
) -> Result<T, ApiError> {
    let limit = state.cfg.max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        let e = Error::new(
            ErrorCode::LimitExceeded,
            format!("request body over the daemon's limit of {limit} bytes"),
        );
        ApiError(Box::new(e), StatusCode::PAYLOAD_TOO_LARGE)
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::from(Error::new(ErrorCode::Protocol, format!("bad request body: {e}")))
    })
}

/// Runs `f` in a task of its own: the work finishes even when the client drops the request.
pub(crate) async fn detached<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    f: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(f)
        .await
        .map_err(|e| ApiError::from(Error::internal(format!("task failed: {e}"))))?
        .map_err(Into::into)
}

fn proc_of(e: &Entry) -> Result<&ProcEntry, ApiError> {
    match &e.held {
        Held::Proc(p) => Ok(p),
        Held::Term(_) => Err(ApiError::from(Error::new(
            ErrorCode::NotFound,
            format!("`{}` is a terminal, not a process", e.id),
        ))),
    }
}

fn term_of(e: &Entry) -> Result<&TermEntry, ApiError> {
    match &e.held {
        Held::Term(t) => Ok(t),
        Held::Proc(_) => Err(ApiError::from(Error::new(
            ErrorCode::NotFound,
            format!("`{}` is a process, not a terminal", e.id),
        ))),
    }
}

pub(crate) fn check_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::from(Error::invalid("an id is 1..=128 characters of [A-Za-z0-9._-]")))
    }
}

async fn info(AxState(state): AxState<Shared>) -> axum::Json<proto::Info> {
    axum::Json(state.info())
}

#[derive(Deserialize)]
struct WhichQuery {
    program: String,
}

async fn which(AxState(state): AxState<Shared>, Query(q): Query<WhichQuery>) -> ApiResult<Which> {
    let path = state.sub.which(&q.program).await?;
    Ok(axum::Json(Which { path: path.map(|p| p.to_string_lossy().into_owned()) }))
}

async fn start_proc(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Started> {
    let client = client_of(&state, &headers)?;
    let req: proto::StartProc = json_body(&state, body).await?;
    check_id(&req.id)?;
    let st = Arc::clone(&state);
    let (entry, created) = detached(async move { st.start_proc(&client, req).await }).await?;
    let pid = proc_of(&entry)?.proc.pid();
    Ok(axum::Json(Started { id: entry.id.clone(), pid, created }))
}

async fn start_term(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Started> {
    let client = client_of(&state, &headers)?;
    let req: proto::StartTerm = json_body(&state, body).await?;
    check_id(&req.id)?;
    let st = Arc::clone(&state);
    let (entry, created) = detached(async move { st.start_term(&client, req).await }).await?;
    let pid = term_of(&entry)?.term.pid();
    Ok(axum::Json(Started { id: entry.id.clone(), pid, created }))
}

fn entry(state: &State, headers: &HeaderMap, id: &str) -> Result<Arc<Entry>, ApiError> {
    let client = client_of(state, headers)?;
    Ok(state.get(&client, id)?)
}

pub(crate) fn proc_status_of(id: &str, p: &ProcEntry) -> ProcStatus {
    let mut streams = BTreeMap::new();
    for (name, s) in [("stdout", StreamId::Stdout), ("stderr", StreamId::Stderr)] {
        if let Some(c) = p.proc.collected(s) {
            streams.insert(name.to_owned(), c);
        }
    }
    let settled = p.proc.try_status();
    ProcStatus {
        id: id.to_owned(),
        leftovers: if settled.is_some() { p.proc.leftovers() } else { Vec::new() },
        settled,
        streams,
    }
}

async fn proc_status(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<ProcStatus> {
    let e = entry(&state, &headers, &id)?;
    Ok(axum::Json(proc_status_of(&id, proc_of(&e)?)))
}

#[derive(Deserialize)]
struct ReadQuery {
    stream: StreamId,
    #[serde(default)]
    offset: u64,
    #[serde(default = "default_read_max")]
    max_bytes: usize,
    /// Long-poll: wait up to this long for bytes past `offset`.
    #[serde(default)]
    wait_ms: u64,
}

fn default_read_max() -> usize {
    64 << 10
}

/// `GET /v1/procs/{id}/read`: one offset read, as the local seam gives it (bytes base64).
#[derive(serde::Serialize)]
struct ReadReply {
    #[serde(with = "proto::b64")]
    data: Vec<u8>,
    start_offset: u64,
    next_offset: u64,
    lossy: bool,
    sealed: bool,
    spill: Option<conch_seams::SpillRef>,
    spill_evicted: bool,
}

async fn read_proc(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<ReadQuery>,
) -> ApiResult<ReadReply> {
    let e = entry(&state, &headers, &id)?;
    let p = proc_of(&e)?;
    if q.wait_ms > 0 {
        let wait = Duration::from_millis(q.wait_ms.min(60_000));
        if let Ok(r) = tokio::time::timeout(wait, p.proc.readable(q.stream, q.offset)).await {
            r?;
        }
    }
    let r = p.proc.read(q.stream, q.offset, q.max_bytes.min(state.cfg.max_frame_bytes))?;
    Ok(axum::Json(ReadReply {
        data: r.data,
        start_offset: r.start_offset,
        next_offset: r.next_offset,
        lossy: r.lossy,
        sealed: r.sealed,
        spill: r.spill,
        spill_evicted: r.spill_evicted,
    }))
}

/// Offset-addressed write: the part of `input` below `accepted` was written before.
fn fresh_part(input: &proto::Input, accepted: u64) -> Result<&[u8], ApiError> {
    if input.offset > accepted {
        return Err(ApiError::from(
            Error::invalid(format!(
                "input offset {} is past the {accepted} bytes accepted so far; resend from there",
                input.offset
            ))
            .with_context("next_offset", accepted.to_string()),
        ));
    }
    let skip = usize::try_from(accepted - input.offset).unwrap_or(usize::MAX);
    Ok(input.data.get(skip..).unwrap_or_default())
}

async fn proc_stdin(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Accepted> {
    let e = entry(&state, &headers, &id)?;
    let input: proto::Input = json_body(&state, body).await?;
    let accepted = detached(async move {
        let p = proc_of(&e)?;
        let mut accepted = p.stdin.lock().await;
        let fresh = fresh_part(&input, *accepted)?;
        if !fresh.is_empty() {
            p.proc.write_stdin(fresh).await?;
            *accepted += fresh.len() as u64;
        }
        if input.eof {
            p.proc.close_stdin().await?;
        }
        Ok::<_, ApiError>(Accepted { next_offset: *accepted })
    })
    .await?;
    Ok(axum::Json(accepted))
}

async fn kill_proc(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    let e = entry(&state, &headers, &id)?;
    proc_of(&e)?.proc.kill().await?;
    Ok(axum::Json(serde_json::json!({})))
}

async fn release_proc(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    let e = entry(&state, &headers, &id)?;
    proc_of(&e)?.proc.release().await?;
    Ok(axum::Json(serde_json::json!({})))
}

/// `DELETE /v1/procs/{id}` and `/v1/terms/{id}`: stops what still runs (a process's tree is
/// killed and its output released, a terminal torn down) and forgets the id; an unknown id,
/// or one of the other kind, is `not_found` (see `stop` for what happens to the output).
fn forget(
    state: &State,
    headers: &HeaderMap,
    id: &str,
    kind: fn(&Entry) -> Result<(), ApiError>,
) -> ApiResult<serde_json::Value> {
    let client = client_of(state, headers)?;
    let e = state.get(&client, id)?;
    kind(&e)?;
    let e = state.remove(&client, id).unwrap_or(e);
    tokio::spawn(async move { super::stop(&e).await });
    Ok(axum::Json(serde_json::json!({})))
}

async fn forget_proc(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    forget(&state, &headers, &id, |e| proc_of(e).map(drop))
}

#[derive(serde::Serialize)]
struct TermStatus {
    id: String,
    exited: Option<conch_seams::ExitStatus>,
    output_bytes: u64,
}

async fn term_status(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<TermStatus> {
    let e = entry(&state, &headers, &id)?;
    let t = term_of(&e)?;
    Ok(axum::Json(TermStatus {
        id,
        exited: t.term.try_status(),
        output_bytes: t.out.total_bytes(),
    }))
}

async fn term_input(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Accepted> {
    let e = entry(&state, &headers, &id)?;
    let input: proto::Input = json_body(&state, body).await?;
    let accepted = detached(async move {
        let t = term_of(&e)?;
        let mut accepted = t.input.lock().await;
        let fresh = fresh_part(&input, *accepted)?;
        if !fresh.is_empty() {
            t.term.write(fresh).await?;
            *accepted += fresh.len() as u64;
        }
        Ok::<_, ApiError>(Accepted { next_offset: *accepted })
    })
    .await?;
    Ok(axum::Json(accepted))
}

async fn term_observe(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<TerminalObservation> {
    let e = entry(&state, &headers, &id)?;
    let req: proto::ObserveReq = json_body(&state, body).await?;
    let t = term_of(&e)?;
    let mut obs = t.term.observe(req.probe).await?;
    // What the server holds but a client may not have yet is the client's to judge: it
    // compares `delivered_bytes` (taken in here) with what it handed out.
    obs.delivered_bytes = obs.delivered_bytes.max(t.out.total_bytes());
    Ok(axum::Json(obs))
}

async fn term_signal(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Option<conch_seams::SignalDelivery>> {
    let e = entry(&state, &headers, &id)?;
    let req: proto::SignalReq = json_body(&state, body).await?;
    let answer = detached(async move {
        let t = term_of(&e)?;
        let mut last = t.last_signal.lock().await;
        if let Some((op, answer)) = *last
            && op == req.op
        {
            return Ok(answer);
        }
        let answer = t.term.signal_foreground(req.signal, req.target).await?;
        *last = Some((req.op, answer));
        Ok::<_, ApiError>(answer)
    })
    .await?;
    Ok(axum::Json(answer))
}

async fn term_resize(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<serde_json::Value> {
    let e = entry(&state, &headers, &id)?;
    let size: proto::ResizeReq = json_body(&state, body).await?;
    term_of(&e)?.term.resize(size).await?;
    Ok(axum::Json(serde_json::json!({})))
}

async fn term_terminate(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<conch_seams::TeardownReport> {
    let e = entry(&state, &headers, &id)?;
    let req: proto::TerminateReq = json_body(&state, body).await?;
    term_of(&e)?;
    let grace = Duration::from_millis(req.grace_ms.min(600_000));
    let report = detached(async move {
        let Held::Term(t) = &e.held else { unreachable!("checked above") };
        t.term.terminate(grace).await
    })
    .await?;
    Ok(axum::Json(report))
}

async fn forget_term(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    forget(&state, &headers, &id, |e| term_of(e).map(drop))
}

/// `POST /v1/leave`: the client is done; everything it holds is stopped now, not at lease
/// expiry. Answers once every teardown finished.
async fn leave(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    let st = Arc::clone(&state);
    detached(async move {
        st.drop_client(&client).await;
        Ok::<_, ApiError>(())
    })
    .await?;
    Ok(axum::Json(serde_json::json!({})))
}
