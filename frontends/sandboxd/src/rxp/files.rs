//! The files half of RXP/1: the hosted composition's files provider (`files-local`,
//! `files-sandbox`) over `/v1/files/...`, so a sandboxed daemon's file API runs confined.
//!
//! Steps, and why:
//! - Metadata calls (stat, list, mkdir, rename, remove) are one JSON request each, answered
//!   by the provider; a refusal keeps its code and message (a sandbox denial its marker).
//! - A read is one byte range, answered with the raw bytes and the file's size and end in
//!   headers: the client reads a large file as a sequence of ranges at offsets it owns, so
//!   a cut connection resumes at the exact byte, and no side holds more than one range.
//! - A write (and a tar import) is an upload the client opens by id, feeds in chunks at
//!   explicit offsets and then finishes. A chunk's body is received in batches of at most
//!   1 MiB (never buffered whole), in a task of its own, and each batch is queued for a
//!   writer task that feeds the provider's writer (`Queue`), so the disk works while the
//!   network does. The accepted count is exactly what was queued, even when the connection
//!   is cut mid-chunk (what arrived before the cut is written); a queued batch is written
//!   unless the writer fails, which fails the upload and answers the next chunk or the
//!   finish. A chunk whose offset is not the accepted count is refused with `next_offset`,
//!   which is where the client resumes. The finish waits for the queue to be written; its
//!   answer is kept, so a repeated finish gets it.
//! - A tar export is staged by a task of its own into an unnamed temporary file (gone when
//!   closed, even if the daemon dies), and served by range like a read: a cut resumes at
//!   the exact offset. The staging does not wait for the client, so the whole archive
//!   occupies the daemon's temporary directory until the export is deleted or expires.
//! - A spill upload (`{"kind":"spill"}`) carries output a terminal on the client had to cut:
//!   its bytes are held in memory (at most [`proto::MAX_SPILL_UPLOAD`] each, and
//!   [`SPILL_BUDGET`] for all of them at once) and the finish hands them to the hosted
//!   subprocess provider's `keep_spill`, so the spill lives in the daemon's world under that
//!   provider's limits and lifetime, like the spills of the streams it collects.
//! - Uploads and exports belong to the client that opened them and are discarded when
//!   unused for a lease (`--lease-ms`), when the client leaves, and when the daemon stops:
//!   an abandoned atomic write leaves its target untouched (the provider drops its temp).
//!
//! Limits: at most [`MAX_TRANSFERS`] open uploads plus exports per client, each holding at
//! most 4 MiB of batches at once ([`QUEUED_BATCHES`] queued, one being written, one being
//! received); a chunk is at most `max_body_bytes`; paths travel as JSON strings, so a path
//! that is not UTF-8 cannot be named.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use conch_seams::files::MAX_READ_CHUNK;
use conch_seams::{
    ByteStream, Error, ErrorBody, ErrorCode, FileStat, FileWriter, Files, ListSpec, Listing,
    Result, TarSink,
};
use conch_sync::LockExt;
use futures::StreamExt as _;
use serde::Deserialize;
use tokio::sync::watch;

use super::State;
use super::api::{ApiError, client_of, detached, json_body};
use conch_provider_remote_proto::{self as proto, Accepted};

/// Open uploads plus exports one client may hold.
pub const MAX_TRANSFERS: usize = 64;

/// Metadata operations whose answers are kept per client, for resends.
const OPS_KEPT: usize = 256;

/// The most bytes of an upload chunk the daemon holds before writing them to the sink.
const WRITE_BATCH: usize = 1 << 20;

/// Batches an upload may have queued in front of its writer (see [`Queue`]).
const QUEUED_BATCHES: usize = 2;

/// The most bytes all unfinished spill uploads may hold in the daemon's memory at once.
pub const SPILL_BUDGET: u64 = 256 << 20;

type Shared = Arc<State>;
type Key = (String, String);

/// The hosted files provider and the transfers in flight.
#[derive(Debug, Default)]
pub(crate) struct FilesHost {
    pub(crate) files: Option<Arc<dyn Files>>,
    uploads: Mutex<HashMap<Key, Arc<Upload>>>,
    exports: Mutex<HashMap<Key, Arc<Export>>>,
    /// The latest metadata operations per client, by operation id, with their answers.
    ops: Mutex<HashMap<String, VecDeque<(String, OpCell)>>>,
    /// Bytes held by unfinished spill uploads, daemon-wide.
    spill_held: Arc<AtomicU64>,
}

/// One metadata operation's answer, set once by the first run.
type OpCell = Arc<tokio::sync::OnceCell<std::result::Result<(), ErrorBody>>>;

impl FilesHost {
    pub(crate) fn new(files: Option<Arc<dyn Files>>) -> Self {
        Self { files, ..Self::default() }
    }

    pub(crate) fn provider(&self) -> Result<Arc<dyn Files>> {
        self.files.clone().ok_or_else(|| {
            Error::new(
                ErrorCode::Unsupported,
                "this daemon's composition has no files provider (add files-local or \
                 files-sandbox to it)",
            )
        })
    }

    fn transfers_of(&self, client: &str) -> usize {
        let ups = self.uploads.locked().keys().filter(|(c, _)| c == client).count();
        ups + self.exports.locked().keys().filter(|(c, _)| c == client).count()
    }

    fn room(&self, client: &str) -> Result<()> {
        Self::check_room(self.transfers_of(client))
    }

    fn check_room(n: usize) -> Result<()> {
        if n >= MAX_TRANSFERS {
            return Err(Error::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this client has {n} uploads and exports open, the daemon's limit; finish \
                     or delete some"
                ),
            ));
        }
        Ok(())
    }

    fn upload(&self, client: &str, id: &str) -> Result<Arc<Upload>> {
        let up = self.uploads.locked().get(&(client.to_owned(), id.to_owned())).cloned();
        let up = up.ok_or_else(|| {
            Error::new(ErrorCode::NotFound, format!("no upload `{id}` for this client"))
        })?;
        up.touch();
        Ok(up)
    }

    fn export(&self, client: &str, id: &str) -> Result<Arc<Export>> {
        let ex = self.exports.locked().get(&(client.to_owned(), id.to_owned())).cloned();
        let ex = ex.ok_or_else(|| {
            Error::new(ErrorCode::NotFound, format!("no export `{id}` for this client"))
        })?;
        *ex.last_used.locked() = Instant::now();
        Ok(ex)
    }

    /// Discards every transfer unused for `lease` (an upload's writer is dropped unfinished,
    /// an export's staging file closed).
    pub(crate) fn sweep(&self, lease: Duration) {
        let stale = |t: &Mutex<Instant>| t.locked().elapsed() > lease;
        let mut gone = 0;
        self.uploads.locked().retain(|_, u| {
            let keep = !stale(&u.last_used);
            gone += usize::from(!keep);
            keep
        });
        self.exports.locked().retain(|_, e| {
            let keep = !stale(&e.last_used);
            gone += usize::from(!keep);
            keep
        });
        if gone > 0 {
            tracing::info!(transfers = gone, "discarded uploads and exports unused for a lease");
        }
    }

    /// The answer slot of `client`'s operation `op` (the last [`OPS_KEPT`] are kept).
    fn op_cell(&self, client: &str, op: &str) -> OpCell {
        let mut ops = self.ops.locked();
        let kept = ops.entry(client.to_owned()).or_default();
        if let Some((_, cell)) = kept.iter().find(|(id, _)| id == op) {
            return Arc::clone(cell);
        }
        let cell = OpCell::default();
        kept.push_back((op.to_owned(), Arc::clone(&cell)));
        if kept.len() > OPS_KEPT {
            kept.pop_front();
        }
        cell
    }

    /// Discards what `client` holds (it left).
    pub(crate) fn drop_client(&self, client: &str) {
        self.ops.locked().remove(client);
        self.uploads.locked().retain(|(c, _), _| c != client);
        self.exports.locked().retain(|(c, _), _| c != client);
    }

    /// Discards everything (the daemon stops).
    pub(crate) fn clear(&self) {
        self.uploads.locked().clear();
        self.exports.locked().clear();
        self.ops.locked().clear();
    }
}

/// Where an upload's bytes go.
enum Sink {
    /// A file write or a tar import, written behind a queue (see [`Queue`]).
    Queued(Queue),
    /// Held in memory and checked against the budget as each batch arrives, so the chunk
    /// that crosses a limit is the one refused.
    Spill(SpillBuf),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sink::Queued(_) => "Sink::Queued",
            Sink::Spill(_) => "Sink::Spill",
        })
    }
}

impl Sink {
    async fn write(&mut self, batch: Vec<u8>) -> Result<()> {
        match self {
            Sink::Queued(q) => q.push(batch).await,
            Sink::Spill(b) => b.push(&batch),
        }
    }
}

/// The provider's writer for a file write or a tar import.
enum Target {
    Write(Box<dyn FileWriter>),
    Tar(Box<dyn TarSink>),
}

impl Target {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        match self {
            Target::Write(w) => w.write(data).await,
            Target::Tar(t) => t.write(data).await,
        }
    }
}

/// Batches queued in front of a [`Target`] that a task of its own writes, so the network
/// and the disk overlap: while one batch is written the next ones arrive, within a chunk
/// and across the gap before the client's next chunk (written in turn, the two added up).
/// A queued batch counts as accepted: the only way it is not written is an error of the
/// target, which fails the whole upload and is answered to the next chunk or the finish.
/// The queue holds at most [`QUEUED_BATCHES`] batches, so an upload holds at most that
/// many plus the one being written and the one being received.
struct Queue {
    tx: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    task: tokio::task::JoinHandle<(Target, Result<()>)>,
}

impl Queue {
    fn new(mut target: Target) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(QUEUED_BATCHES);
        // An abandoned upload drops the sender: the task writes what was queued, then drops
        // the target unfinished (an atomic write's target stays as it was).
        let task = tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                if let Err(e) = target.write(&batch).await {
                    return (target, Err(e));
                }
            }
            (target, Ok(()))
        });
        Self { tx: Some(tx), task }
    }

    async fn push(&mut self, batch: Vec<u8>) -> Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(batch).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The task stopped taking batches: it failed (or panicked); its error is the answer.
        self.tx = None;
        match written((&mut self.task).await) {
            Ok(_) => Err(Error::internal("an upload's writer stopped early")),
            Err(e) => Err(e),
        }
    }

    /// Waits until every queued batch is written, and hands the target back.
    async fn drain(mut self) -> Result<Target> {
        self.tx = None;
        written(self.task.await)
    }
}

/// How a [`Queue`]'s writer task ended: its target, or its error (a panic is one too).
fn written(
    joined: std::result::Result<(Target, Result<()>), tokio::task::JoinError>,
) -> Result<Target> {
    match joined {
        Ok((target, Ok(()))) => Ok(target),
        Ok((_, Err(e))) => Err(e),
        Err(e) => Err(Error::internal(format!("an upload's writer failed: {e}"))),
    }
}

/// A spill upload's bytes, counted against the daemon-wide [`SPILL_BUDGET`] until dropped.
#[derive(Debug)]
struct SpillBuf {
    bytes: Vec<u8>,
    held: Arc<AtomicU64>,
}

impl SpillBuf {
    fn push(&mut self, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        if self.bytes.len() as u64 + len > proto::MAX_SPILL_UPLOAD {
            return Err(Error::new(
                ErrorCode::LimitExceeded,
                format!("a spill upload is at most {} bytes", proto::MAX_SPILL_UPLOAD),
            ));
        }
        let before = self.held.fetch_add(len, Ordering::AcqRel);
        if before + len > SPILL_BUDGET {
            self.held.fetch_sub(len, Ordering::AcqRel);
            return Err(Error::new(
                ErrorCode::LimitExceeded,
                format!(
                    "spill uploads hold {before} bytes on this daemon, its limit is \
                     {SPILL_BUDGET}; try again once they finished"
                ),
            ));
        }
        self.bytes.extend_from_slice(data);
        Ok(())
    }

    /// The bytes, released from the budget (the provider's `keep_spill` owns them now).
    fn take(mut self) -> Vec<u8> {
        let bytes = std::mem::take(&mut self.bytes);
        self.held.fetch_sub(bytes.len() as u64, Ordering::AcqRel);
        bytes
    }
}

impl Drop for SpillBuf {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
struct UploadInner {
    /// `None` once finished or failed.
    sink: Option<Sink>,
    accepted: u64,
    finished: Option<proto::Finished>,
    /// A provider error ends the upload; every later call gets it.
    failed: Option<ErrorBody>,
}

#[derive(Debug)]
struct Upload {
    /// The lock also serialises chunks: a resent chunk waits for the cut one to end.
    inner: tokio::sync::Mutex<UploadInner>,
    /// How opening the provider's writer went, set once by the first open: a resent open
    /// waits for it instead of opening a second writer.
    opened: tokio::sync::OnceCell<std::result::Result<(), ErrorBody>>,
    last_used: Mutex<Instant>,
}

impl Upload {
    fn touch(&self) {
        *self.last_used.locked() = Instant::now();
    }
}

/// A tar archive staged in an unnamed temporary file.
#[derive(Debug)]
struct Export {
    file: Arc<std::fs::File>,
    /// Bytes staged so far, and how the staging ended (`Some` once it did).
    progress: watch::Receiver<(u64, Option<std::result::Result<(), ErrorBody>>)>,
    staging: tokio::task::JoinHandle<()>,
    last_used: Mutex<Instant>,
}

impl Drop for Export {
    fn drop(&mut self) {
        self.staging.abort();
    }
}

fn err(e: Error) -> ApiError {
    ApiError::from(e)
}

fn host(state: &State) -> std::result::Result<Arc<dyn Files>, ApiError> {
    state.files.provider().map_err(err)
}

fn check_id(id: &str) -> std::result::Result<(), ApiError> {
    super::api::check_id(id)
}

fn ok() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({}))
}

type ApiResult<T> = std::result::Result<axum::Json<T>, ApiError>;

/// `POST /v1/files/stat`.
pub(super) async fn stat(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<FileStat> {
    client_of(&state, &headers)?;
    let req: proto::PathReq = json_body(&state, body).await?;
    Ok(axum::Json(host(&state)?.stat(&req.path).await?))
}

/// The raw-bytes answer of a range read.
fn bytes_reply(data: Vec<u8>, size: Option<u64>, eof: bool) -> Response {
    let mut resp = (StatusCode::OK, data).into_response();
    let h = resp.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(size) = size {
        h.insert(proto::SIZE_HEADER, HeaderValue::from(size));
    }
    h.insert(proto::EOF_HEADER, HeaderValue::from_static(if eof { "true" } else { "false" }));
    resp
}

/// `POST /v1/files/read`: raw bytes, size and end in headers.
pub(super) async fn read(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> std::result::Result<Response, ApiError> {
    client_of(&state, &headers)?;
    let req: proto::ReadReq = json_body(&state, body).await?;
    let max = usize::try_from(req.max_bytes).unwrap_or(MAX_READ_CHUNK).min(MAX_READ_CHUNK);
    let chunk = host(&state)?.read(&req.path, req.offset, max).await?;
    Ok(bytes_reply(chunk.data, Some(chunk.size), chunk.eof))
}

/// `POST /v1/files/list`.
pub(super) async fn list(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Listing> {
    client_of(&state, &headers)?;
    let spec: ListSpec = json_body(&state, body).await?;
    Ok(axum::Json(host(&state)?.list(spec).await?))
}

/// Runs a metadata operation in a task of its own (it finishes even when the client drops
/// the request), once per operation id: a resend of `op` gets the first run's answer, even
/// while that run is still going.
async fn once<F, Fut>(
    state: &State,
    client: &str,
    op: Option<String>,
    f: F,
) -> ApiResult<serde_json::Value>
where
    F: FnOnce(Arc<dyn Files>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let files = host(state)?;
    let Some(op) = op else {
        detached(f(files)).await?;
        return Ok(ok());
    };
    check_id(&op)?;
    let cell = state.files.op_cell(client, &op);
    let answer = detached(async move {
        let r = cell.get_or_init(|| async move { f(files).await.map_err(|e| e.to_body()) }).await;
        Ok::<_, ApiError>(r.clone())
    })
    .await?;
    answer.map_err(|b| err(Error::from_body(b)))?;
    Ok(ok())
}

/// `POST /v1/files/mkdir`.
pub(super) async fn mkdir(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    let req: proto::MkdirReq = json_body(&state, body).await?;
    let op = req.op.clone();
    once(
        &state,
        &client,
        op,
        move |files| async move { files.make_dir(&req.path, req.parents).await },
    )
    .await
}

/// `POST /v1/files/rename`.
pub(super) async fn rename(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    let req: proto::RenameReq = json_body(&state, body).await?;
    let op = req.op.clone();
    once(&state, &client, op, move |files| async move {
        files.rename(&req.from, &req.to, req.overwrite).await
    })
    .await
}

/// `POST /v1/files/remove`.
pub(super) async fn remove(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    let req: proto::RemoveReq = json_body(&state, body).await?;
    let op = req.op.clone();
    once(
        &state,
        &client,
        op,
        move |files| async move { files.remove(&req.path, req.recursive).await },
    )
    .await
}

/// `POST /v1/files/uploads`: opens a write or a tar import (idempotent by id).
pub(super) async fn open_upload(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<proto::UploadState> {
    let client = client_of(&state, &headers)?;
    let req: proto::UploadReq = json_body(&state, body).await?;
    check_id(&req.id)?;
    // A spill is the subprocess provider's: it needs no files provider.
    let files = match req.kind {
        proto::UploadKind::Spill => None,
        _ => Some(host(&state)?),
    };
    let held = Arc::clone(&state.files.spill_held);
    let key = (client.clone(), req.id.clone());
    // The entry first, so an open resent while this one still runs finds it and waits.
    let (up, created) = {
        let mut ups = state.files.uploads.locked();
        match ups.get(&key) {
            Some(up) => (Arc::clone(up), false),
            None => {
                let held = ups.keys().filter(|(c, _)| *c == client).count()
                    + state.files.exports.locked().keys().filter(|(c, _)| *c == client).count();
                FilesHost::check_room(held)?;
                let up = Arc::new(Upload {
                    inner: tokio::sync::Mutex::default(),
                    opened: tokio::sync::OnceCell::new(),
                    last_used: Mutex::new(Instant::now()),
                });
                ups.insert(key.clone(), Arc::clone(&up));
                (up, true)
            }
        }
    };
    let opening = Arc::clone(&up);
    let kind = req.kind;
    let opened = detached(async move {
        let r = opening
            .opened
            .get_or_init(|| async {
                let sink = match (kind, files) {
                    (proto::UploadKind::Write { spec }, Some(files)) => {
                        files.write(spec).await.map(|w| Sink::Queued(Queue::new(Target::Write(w))))
                    }
                    (proto::UploadKind::Tar { path }, Some(files)) => files
                        .import_tar(&path)
                        .await
                        .map(|t| Sink::Queued(Queue::new(Target::Tar(t)))),
                    (proto::UploadKind::Spill, _) => {
                        Ok(Sink::Spill(SpillBuf { bytes: Vec::new(), held }))
                    }
                    (_, None) => Err(Error::invalid("this upload needs a files provider")),
                };
                match sink {
                    Ok(sink) => {
                        opening.inner.lock().await.sink = Some(sink);
                        Ok(())
                    }
                    Err(e) => Err(e.to_body()),
                }
            })
            .await;
        Ok::<_, ApiError>(r.clone())
    })
    .await?;
    if let Err(e) = opened {
        // A refused open leaves nothing behind: the same id may be opened again.
        let mut ups = state.files.uploads.locked();
        if ups.get(&key).is_some_and(|u| Arc::ptr_eq(u, &up)) {
            ups.remove(&key);
        }
        return Err(err(Error::from_body(e)));
    }
    let next_offset = up.inner.lock().await.accepted;
    Ok(axum::Json(proto::UploadState { id: req.id, next_offset, created }))
}

#[derive(Deserialize)]
pub(super) struct ChunkQuery {
    offset: u64,
}

fn not_here(what: &str, offset: u64, accepted: u64) -> ApiError {
    err(Error::invalid(format!(
        "{what} offset {offset} is not where the upload is: {accepted} bytes were accepted; \
         resend from there"
    ))
    .with_context("next_offset", accepted.to_string()))
}

/// `PUT /v1/files/uploads/{id}?offset=N`: the body's bytes, streamed into the writer.
pub(super) async fn upload_chunk(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<ChunkQuery>,
    body: Body,
) -> ApiResult<Accepted> {
    let client = client_of(&state, &headers)?;
    let up = state.files.upload(&client, &id)?;
    let max = state.cfg.max_body_bytes as u64;
    // In a task of its own: a cut connection ends the body, never a write halfway.
    let accepted = detached(async move {
        let mut inner = up.inner.lock().await;
        if let Some(e) = &inner.failed {
            return Err(err(Error::from_body(e.clone())));
        }
        if inner.finished.is_some() {
            return Err(err(Error::invalid("this upload is finished")));
        }
        if q.offset != inner.accepted {
            return Err(not_here("chunk", q.offset, inner.accepted));
        }
        let mut stream = body.into_data_stream();
        let mut taken = 0u64;
        // Frames are small (tens of KiB); the sink gets them in batches of up to WRITE_BATCH,
        // since each sink write is a hop to a blocking thread.
        let mut batch: Vec<u8> = Vec::new();
        loop {
            // A cut connection ends the body: what arrived is written, and the client resumes
            // from `accepted`.
            let frame = match stream.next().await {
                Some(Ok(bytes)) => Some(bytes),
                Some(Err(_)) | None => None,
            };
            if let Some(bytes) = &frame {
                taken += bytes.len() as u64;
                if taken > max {
                    let e = Error::new(
                        ErrorCode::LimitExceeded,
                        format!("an upload chunk is at most {max} bytes (max_body_bytes)"),
                    )
                    .with_context("next_offset", inner.accepted.to_string());
                    return Err(ApiError(Box::new(e), StatusCode::PAYLOAD_TOO_LARGE));
                }
                batch.extend_from_slice(bytes);
                if batch.len() < WRITE_BATCH {
                    continue;
                }
            }
            if !batch.is_empty() {
                let len = batch.len() as u64;
                let full = std::mem::replace(&mut batch, Vec::with_capacity(WRITE_BATCH));
                let r = match inner.sink.as_mut() {
                    Some(sink) => sink.write(full).await,
                    None => Err(Error::invalid("this upload is not open yet")),
                };
                if let Err(e) = r {
                    inner.sink = None;
                    inner.failed = Some(e.to_body());
                    return Err(err(e));
                }
                inner.accepted += len;
                up.touch();
            }
            if frame.is_none() {
                break;
            }
        }
        Ok(Accepted { next_offset: inner.accepted })
    })
    .await?;
    Ok(axum::Json(accepted))
}

/// `POST /v1/files/uploads/{id}/finish`.
pub(super) async fn finish_upload(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<proto::Finished> {
    let client = client_of(&state, &headers)?;
    let req: proto::FinishReq = json_body(&state, body).await?;
    let up = state.files.upload(&client, &id)?;
    let sub = Arc::clone(&state.sub);
    let done = detached(async move {
        let mut inner = up.inner.lock().await;
        if let Some(f) = &inner.finished {
            return Ok(f.clone());
        }
        if let Some(e) = &inner.failed {
            return Err(err(Error::from_body(e.clone())));
        }
        if req.size != inner.accepted {
            return Err(not_here("finish at", req.size, inner.accepted));
        }
        let r =
            match inner.sink.take() {
                Some(Sink::Queued(q)) => match q.drain().await {
                    Ok(Target::Write(w)) => w.finish().await.map(|s| proto::Finished {
                        stat: Some(s),
                        entries: None,
                        spill: None,
                    }),
                    Ok(Target::Tar(t)) => t.finish().await.map(|n| proto::Finished {
                        stat: None,
                        entries: Some(n),
                        spill: None,
                    }),
                    Err(e) => Err(e),
                },
                Some(Sink::Spill(b)) => sub.keep_spill(b.take()).await.map(|kept| {
                    proto::Finished { stat: None, entries: None, spill: kept.map(|k| k.path) }
                }),
                None => Err(Error::invalid("this upload is not open yet")),
            };
        match r {
            Ok(f) => {
                inner.finished = Some(f.clone());
                Ok(f)
            }
            Err(e) => {
                inner.failed = Some(e.to_body());
                Err(err(e))
            }
        }
    })
    .await?;
    Ok(axum::Json(done))
}

/// `DELETE /v1/files/uploads/{id}`: abandons an upload (an atomic write's target stays as
/// it was); a finished one is only forgotten.
pub(super) async fn delete_upload(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    state.files.upload(&client, &id)?;
    state.files.uploads.locked().remove(&(client, id));
    Ok(ok())
}

/// `POST /v1/files/exports`: starts staging a tar archive (idempotent by id).
pub(super) async fn open_export(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<proto::ExportState> {
    let client = client_of(&state, &headers)?;
    let req: proto::ExportReq = json_body(&state, body).await?;
    check_id(&req.id)?;
    let files = host(&state)?;
    if state.files.export(&client, &req.id).is_ok() {
        return Ok(axum::Json(proto::ExportState { id: req.id, created: false }));
    }
    state.files.room(&client)?;
    let path = req.path.clone();
    let stream = detached(async move { files.export_tar(&path).await }).await?;
    let file = tempfile::tempfile()
        .map_err(|e| Error::io("creating the export's staging file", e))
        .map_err(err)?;
    let file = Arc::new(file);
    let (tx, progress) = watch::channel((0u64, None));
    let staging = tokio::spawn(stage(stream, Arc::clone(&file), tx, req.path));
    let ex = Arc::new(Export { file, progress, staging, last_used: Mutex::new(Instant::now()) });
    let created = {
        let mut exs = state.files.exports.locked();
        let key = (client, req.id.clone());
        let fresh = !exs.contains_key(&key);
        exs.entry(key).or_insert(ex);
        fresh
    };
    Ok(axum::Json(proto::ExportState { id: req.id, created }))
}

/// Copies the archive into the staging file as fast as the provider makes it.
async fn stage(
    mut stream: Box<dyn ByteStream>,
    file: Arc<std::fs::File>,
    tx: watch::Sender<(u64, Option<std::result::Result<(), ErrorBody>>)>,
    path: PathBuf,
) {
    let mut at = 0u64;
    let end = loop {
        match stream.next_chunk().await {
            Ok(Some(chunk)) => {
                let f = Arc::clone(&file);
                let len = chunk.len() as u64;
                let wrote = tokio::task::spawn_blocking(move || f.write_all_at(&chunk, at)).await;
                match wrote {
                    Ok(Ok(())) => {
                        at += len;
                        tx.send_replace((at, None));
                    }
                    Ok(Err(e)) => break Err(Error::fs("staging the tar export of", &path, e)),
                    Err(e) => break Err(Error::internal(format!("staging task failed: {e}"))),
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    tx.send_replace((at, Some(end.map_err(|e| e.to_body()))));
}

#[derive(Deserialize)]
pub(super) struct ExportQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default = "default_export_max")]
    max_bytes: u64,
    #[serde(default = "default_export_wait")]
    wait_ms: u64,
}

fn default_export_max() -> u64 {
    MAX_READ_CHUNK as u64
}

fn default_export_wait() -> u64 {
    30_000
}

/// `GET /v1/files/exports/{id}?offset=N`: bytes of the staged archive from `offset`.
pub(super) async fn read_export(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<ExportQuery>,
) -> std::result::Result<Response, ApiError> {
    let client = client_of(&state, &headers)?;
    let ex = state.files.export(&client, &id)?;
    let mut progress = ex.progress.clone();
    let wait = Duration::from_millis(q.wait_ms.min(60_000));
    let ready = progress.wait_for(|(at, end)| *at > q.offset || end.is_some());
    // A timed-out wait answers what there is (possibly nothing): the client asks again.
    let _ = tokio::time::timeout(wait, ready).await;
    let (staged, end) = ex.progress.borrow().clone();
    if let Some(Err(e)) = &end {
        return Err(err(Error::from_body(e.clone())));
    }
    let complete = end.is_some();
    if q.offset > staged && complete {
        return Err(err(Error::invalid(format!(
            "offset {} is past the archive's {staged} bytes",
            q.offset
        ))));
    }
    let want = q.max_bytes.min(MAX_READ_CHUNK as u64).min(staged.saturating_sub(q.offset));
    let file = Arc::clone(&ex.file);
    let offset = q.offset;
    let data = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0; usize::try_from(want).unwrap_or(0)];
        file.read_exact_at(&mut buf, offset).map(|()| buf)
    })
    .await
    .map_err(|e| err(Error::internal(format!("read task failed: {e}"))))?
    .map_err(|e| err(Error::io("reading the export's staging file", e)))?;
    let eof = complete && q.offset + data.len() as u64 == staged;
    Ok(bytes_reply(data, complete.then_some(staged), eof))
}

/// `DELETE /v1/files/exports/{id}`: stops staging and deletes the staged archive.
pub(super) async fn delete_export(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<serde_json::Value> {
    let client = client_of(&state, &headers)?;
    state.files.export(&client, &id)?;
    state.files.exports.locked().remove(&(client, id));
    Ok(ok())
}
