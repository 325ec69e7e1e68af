//! `files-remote`: the files seam of a `conch sandboxd`'s composition, over the connection
//! of the composition's `remote-sandbox` (one URL and token, one client identity, one
//! verdict on the daemon: a daemon that went away or restarted fails file calls
//! `remote_unavailable` with `REMOTE_GONE` or `BOOT_CHANGED`, as it fails process calls).
//!
//! Steps, and why:
//! - Metadata calls are one retried JSON call each (`http.rs`); the daemon's refusal comes
//!   back with its code and message, a sandbox denial with its marker.
//! - A read is one byte range at the caller's offset (`/v1/files/read`): the caller's loop
//!   is the resume, so a connection cut mid-file costs one range, resent at the same offset.
//! - A write opens an upload by id and sends the bytes in chunks of at most the daemon's
//!   `max_chunk_bytes`, each at the offset the daemon accepted so far. A chunk that the
//!   daemon took partly or wholly before a cut is answered, on resend, with the daemon's
//!   `next_offset`, and only the rest is sent again: every byte lands once. The client holds
//!   one chunk at a time; the finish names the total so a lost chunk cannot finish short.
//! - A tar export is read by range from the archive the daemon stages, so a cut resumes at
//!   the exact offset; a tar import is an upload like a write.
//! - A watch is a subscription on the stream connection (`conn.rs`): events arrive in order
//!   into a bounded queue; a full queue, or a reconnect (changes while the connection was
//!   down were not seen), yields one `overflow` after the events kept. After a reconnect
//!   the overflow comes once the daemon confirmed the watch again, so every change after it
//!   is reported.
//!
//! Limits: paths travel as JSON strings, so a non-UTF-8 path is refused `invalid_argument`
//! before anything is sent; a daemon without a files provider makes every call
//! `unsupported`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use conch_seams::files::MAX_READ_CHUNK;
use conch_seams::{
    ByteStream, Error, ErrorBody, ErrorCode, FileChunk, FileStat, FileWriter, Files,
    FilesCapabilities, ListSpec, Listing, Result, SpillRef, TarSink, WatchEvent, WatchStream,
    World, WriteSpec,
};
use conch_sync::LockExt;
use reqwest::Method;
use tokio::sync::watch;

use super::conn::{Cmd, lock_watches};
use super::http::Raw;
use super::{RemoteSubprocess, Shared};
use conch_provider_remote_proto::{self as proto, Accepted, FilesInfo};

/// Plugin name.
pub const FILES_NAME: &str = "files-remote";

/// Events a watch keeps while its consumer lags; past it they are dropped for an overflow.
const WATCH_QUEUE: usize = 4096;

/// How long one export read waits on the daemon for staged bytes before asking again.
const EXPORT_WAIT: Duration = Duration::from_secs(10);

/// The files seam of the daemon a [`RemoteSubprocess`] talks to.
#[derive(Debug)]
pub struct RemoteFiles {
    shared: Arc<Shared>,
    /// The daemon's files provider, when its composition has one.
    info: Option<FilesInfo>,
    default_dir: PathBuf,
}

impl RemoteFiles {
    /// The files provider of `sub`'s daemon, sharing its connection and identity.
    pub fn new(sub: &RemoteSubprocess) -> Self {
        Self::of(Arc::clone(&sub.shared))
    }

    fn of(shared: Arc<Shared>) -> Self {
        let info = shared.info.capabilities.files.clone();
        let default_dir =
            info.as_ref().map_or_else(|| PathBuf::from("/"), |i| i.default_dir.clone());
        Self { shared, info, default_dir }
    }

    fn ready(&self) -> Result<&FilesInfo> {
        self.shared.check_alive()?;
        self.info.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::Unsupported,
                format!(
                    "the sandbox daemon at {} hosts no files provider (its composition has \
                     none); add files-local or files-sandbox to the daemon's composition",
                    self.shared.dial.base
                ),
            )
            .with_provider(FILES_NAME)
        })
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl serde::Serialize + Sync),
    ) -> Result<T> {
        self.ready()?;
        self.shared.http.call(Method::POST, path, Some(body), Duration::ZERO).await
    }

    async fn open_upload(&self, kind: proto::UploadKind) -> Result<Upload> {
        let info = self.ready()?;
        Upload::open(&self.shared, "u", kind, info.max_chunk_bytes).await
    }
}

/// Keeps `text` as a spill of the daemon's subprocess provider (`Subprocess::keep_spill` on
/// the daemon), sent as a spill upload: chunked, and resumed at the daemon's offset after a
/// cut. `Ok(None)` when `text` is over the spill cap or the daemon's provider keeps none.
pub(crate) async fn keep_spill(shared: &Arc<Shared>, text: &[u8]) -> Result<Option<SpillRef>> {
    if text.len() as u64 > proto::MAX_SPILL_UPLOAD {
        return Ok(None);
    }
    shared.check_alive()?;
    let max_chunk = shared.info.limits.max_body_bytes;
    let mut up = Upload::open(shared, "s", proto::UploadKind::Spill, max_chunk).await?;
    up.send(text).await?;
    let finished = up.finish().await?;
    Ok(finished
        .spill
        .map(|path| SpillRef { world: World::Remote { name: shared.dial.base.clone() }, path }))
}

/// RXP/1 names paths as JSON strings: a path that is not UTF-8 cannot cross.
fn named(path: &Path) -> Result<()> {
    if path.to_str().is_some() {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{} is not UTF-8, and RXP/1 names paths as JSON strings; rename it on the daemon's side",
        path.display()
    ))
    .with_provider(FILES_NAME))
}

fn header<'a>(raw: &'a Raw, name: &str) -> Option<&'a str> {
    raw.headers.get(name).and_then(|v| v.to_str().ok())
}

fn protocol(what: String) -> Error {
    Error::new(ErrorCode::Protocol, what).with_provider(FILES_NAME)
}

#[async_trait]
impl Files for RemoteFiles {
    fn provider_name(&self) -> &'static str {
        FILES_NAME
    }

    fn capabilities(&self) -> FilesCapabilities {
        FilesCapabilities::new(self.info.as_ref().is_some_and(|i| i.watch))
    }

    fn default_dir(&self) -> &Path {
        &self.default_dir
    }

    async fn stat(&self, path: &Path) -> Result<FileStat> {
        named(path)?;
        self.call("/v1/files/stat", &proto::PathReq { path: path.to_path_buf() }).await
    }

    async fn read(&self, path: &Path, offset: u64, max_bytes: usize) -> Result<FileChunk> {
        named(path)?;
        self.ready()?;
        let req = proto::ReadReq {
            path: path.to_path_buf(),
            offset,
            max_bytes: max_bytes.min(MAX_READ_CHUNK) as u64,
        };
        let body = serde_json::to_vec(&req)
            .map_err(|e| Error::internal(format!("encoding a read failed: {e}")))?;
        let raw = self
            .shared
            .http
            .exchange(
                Method::POST,
                "/v1/files/read",
                Some((Bytes::from(body), "application/json")),
                Duration::ZERO,
            )
            .await?;
        let size = header(&raw, proto::SIZE_HEADER).and_then(|v| v.parse::<u64>().ok());
        let eof = header(&raw, proto::EOF_HEADER);
        let eof = eof.map(|v| v == "true");
        let (Some(size), Some(eof)) = (size, eof) else {
            return Err(protocol("the daemon's read answer lacks its size or end headers".into()));
        };
        if raw.bytes.len() > max_bytes.min(MAX_READ_CHUNK) {
            return Err(protocol(format!(
                "the daemon answered {} bytes to a read of at most {max_bytes}",
                raw.bytes.len()
            )));
        }
        // No copy when the body arrived as one unshared buffer.
        Ok(FileChunk::new(Vec::from(raw.bytes), size, eof))
    }

    async fn write(&self, spec: WriteSpec) -> Result<Box<dyn FileWriter>> {
        named(&spec.path)?;
        Ok(Box::new(self.open_upload(proto::UploadKind::Write { spec }).await?))
    }

    async fn list(&self, spec: ListSpec) -> Result<Listing> {
        named(&spec.path)?;
        self.call("/v1/files/list", &spec).await
    }

    async fn make_dir(&self, path: &Path, parents: bool) -> Result<()> {
        named(path)?;
        let op = Some(self.shared.new_id("op"));
        let req = proto::MkdirReq { path: path.to_path_buf(), parents, op };
        self.call::<serde_json::Value>("/v1/files/mkdir", &req).await.map(drop)
    }

    async fn rename(&self, from: &Path, to: &Path, overwrite: bool) -> Result<()> {
        named(from)?;
        named(to)?;
        let op = Some(self.shared.new_id("op"));
        let req =
            proto::RenameReq { from: from.to_path_buf(), to: to.to_path_buf(), overwrite, op };
        self.call::<serde_json::Value>("/v1/files/rename", &req).await.map(drop)
    }

    async fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        named(path)?;
        let op = Some(self.shared.new_id("op"));
        let req = proto::RemoveReq { path: path.to_path_buf(), recursive, op };
        self.call::<serde_json::Value>("/v1/files/remove", &req).await.map(drop)
    }

    async fn export_tar(&self, path: &Path) -> Result<Box<dyn ByteStream>> {
        named(path)?;
        let id = self.shared.new_id("x");
        let req = proto::ExportReq { id: id.clone(), path: path.to_path_buf() };
        let _: proto::ExportState = self.call("/v1/files/exports", &req).await?;
        Ok(Box::new(Export { shared: Arc::clone(&self.shared), id, offset: 0, done: false }))
    }

    async fn import_tar(&self, path: &Path) -> Result<Box<dyn TarSink>> {
        named(path)?;
        Ok(Box::new(self.open_upload(proto::UploadKind::Tar { path: path.to_path_buf() }).await?))
    }

    async fn watch(&self, path: &Path, recursive: bool) -> Result<Box<dyn WatchStream>> {
        named(path)?;
        let info = self.ready()?;
        if !info.watch {
            return Err(Error::new(
                ErrorCode::Unsupported,
                format!("the daemon's files provider ({}) cannot watch", info.provider),
            )
            .with_provider(FILES_NAME));
        }
        let id = self.shared.new_id("w");
        let slot = Arc::new(WatchSlot::new(path.to_path_buf(), recursive));
        lock_watches(&self.shared.watches).insert(id.clone(), Arc::clone(&slot));
        let stream = RemoteWatch { shared: Arc::clone(&self.shared), id: id.clone(), slot };
        self.shared.command(Cmd::Watch(id));
        // In place before this returns: a change made right after is reported.
        let give_up = self.shared.http.give_up;
        let placed = stream.slot.wait(|s| {
            if let Some(e) = &s.failed {
                return Some(Err(Error::from_body(e.clone())));
            }
            (s.established || s.ended).then_some(Ok(()))
        });
        match tokio::time::timeout(give_up, placed).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(super::http::unavailable(
                    &self.shared.dial.base,
                    "give_up_ms",
                    give_up,
                    give_up,
                    "the daemon did not confirm the watch",
                ));
            }
        }
        Ok(Box::new(stream))
    }
}

/// An upload on the daemon: a file write or a tar import.
#[derive(Debug)]
struct Upload {
    shared: Arc<Shared>,
    id: String,
    /// Bytes the daemon accepted.
    sent: u64,
    /// The largest chunk sent at once.
    chunk: usize,
    done: bool,
}

impl Upload {
    /// Opens an upload of `kind` under a fresh id with `prefix`, sending chunks of at most
    /// `max_chunk` bytes (and at most 4 MiB).
    async fn open(
        shared: &Arc<Shared>,
        prefix: &str,
        kind: proto::UploadKind,
        max_chunk: u64,
    ) -> Result<Self> {
        let chunk = usize::try_from(max_chunk).unwrap_or(MAX_READ_CHUNK).clamp(1, 4 << 20);
        let id = shared.new_id(prefix);
        let req = proto::UploadReq { id: id.clone(), kind };
        let state: proto::UploadState =
            shared.http.call(Method::POST, "/v1/files/uploads", Some(&req), Duration::ZERO).await?;
        Ok(Self { shared: Arc::clone(shared), id, sent: state.next_offset, chunk, done: false })
    }

    /// Sends `data` (which starts at `self.sent`), resuming at the daemon's offset after a
    /// cut.
    async fn send(&mut self, data: &[u8]) -> Result<()> {
        self.shared.check_alive()?;
        let base = self.sent;
        let end = base + data.len() as u64;
        while self.sent < end {
            let from = usize::try_from(self.sent - base).unwrap_or(usize::MAX);
            let to = (from + self.chunk).min(data.len());
            let offset = self.sent;
            let piece = Bytes::copy_from_slice(&data[from..to]);
            let path = format!("/v1/files/uploads/{}?offset={offset}", self.id);
            let r = self
                .shared
                .http
                .exchange(
                    Method::PUT,
                    &path,
                    Some((piece, "application/octet-stream")),
                    Duration::ZERO,
                )
                .await;
            let next = match r {
                Ok(raw) => {
                    serde_json::from_slice::<Accepted>(&raw.bytes)
                        .map_err(|e| protocol(format!("the daemon's answer to a chunk: {e}")))?
                        .next_offset
                }
                // The daemon is elsewhere than this chunk's start: the chunk (or part of it)
                // landed before a cut. Resume where it is, if that lies within what we hold.
                Err(e) => match next_offset(&e) {
                    Some(n) if n != offset => n,
                    _ => return Err(e),
                },
            };
            if next < base || next > end {
                return Err(protocol(format!(
                    "the daemon is at offset {next} of upload {}, outside the {base}..{end} \
                     this writer holds",
                    self.id
                )));
            }
            self.sent = next;
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<proto::Finished> {
        self.shared.check_alive()?;
        let path = format!("/v1/files/uploads/{}/finish", self.id);
        let r = self
            .shared
            .http
            .call(Method::POST, &path, Some(&proto::FinishReq { size: self.sent }), Duration::ZERO)
            .await;
        self.done = true;
        r
    }
}

/// Tells the daemon, from a task of its own, to drop the transfer at `path` (`DELETE`); a
/// message that is not delivered leaves it to the daemon's lease. Nothing is sent once the
/// provider stopped (its leave dropped every transfer) or outside a runtime.
fn forget(shared: &Arc<Shared>, path: String) {
    if shared.stop.is_cancelled() {
        return;
    }
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let shared = Arc::clone(shared);
        rt.spawn(async move {
            let _: Result<serde_json::Value> =
                shared.http.call(Method::DELETE, &path, None::<&()>, Duration::ZERO).await;
        });
    }
}

fn next_offset(e: &Error) -> Option<u64> {
    e.context().iter().find(|(k, _)| k == "next_offset").and_then(|(_, v)| v.parse().ok())
}

impl Drop for Upload {
    fn drop(&mut self) {
        // Abandoned: the daemon drops its writer (an atomic write's target stays as it
        // was); if this is not delivered, the daemon discards it after a lease.
        if !self.done {
            forget(&self.shared, format!("/v1/files/uploads/{}", self.id));
        }
    }
}

#[async_trait]
impl FileWriter for Upload {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.send(data).await
    }

    async fn finish(mut self: Box<Self>) -> Result<FileStat> {
        let f = Upload::finish(&mut self).await?;
        f.stat.ok_or_else(|| protocol("the daemon's finish of a write has no stat".into()))
    }
}

#[async_trait]
impl TarSink for Upload {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.send(data).await
    }

    async fn finish(mut self: Box<Self>) -> Result<u64> {
        let f = Upload::finish(&mut self).await?;
        f.entries.ok_or_else(|| protocol("the daemon's finish of a tar import has no count".into()))
    }
}

/// A tar archive staged on the daemon, read by range.
#[derive(Debug)]
struct Export {
    shared: Arc<Shared>,
    id: String,
    offset: u64,
    done: bool,
}

impl Export {
    fn forget(&self) {
        forget(&self.shared, format!("/v1/files/exports/{}", self.id));
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.forget();
    }
}

#[async_trait]
impl ByteStream for Export {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            self.shared.check_alive()?;
            let path = format!(
                "/v1/files/exports/{}?offset={}&max_bytes={MAX_READ_CHUNK}&wait_ms={}",
                self.id,
                self.offset,
                EXPORT_WAIT.as_millis()
            );
            let raw = self.shared.http.exchange(Method::GET, &path, None, EXPORT_WAIT).await?;
            let eof = header(&raw, proto::EOF_HEADER) == Some("true");
            self.offset += raw.bytes.len() as u64;
            self.done = eof;
            if !raw.bytes.is_empty() {
                return Ok(Some(raw.bytes.to_vec()));
            }
        }
    }
}

/// One watch's side of the stream connection: its events, in order, and its state.
#[derive(Debug)]
pub(crate) struct WatchSlot {
    pub(crate) path: PathBuf,
    pub(crate) recursive: bool,
    state: Mutex<SlotState>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct SlotState {
    queue: VecDeque<WatchEvent>,
    /// Events were dropped: an overflow is due once the queue is drained.
    overflowed: bool,
    established: bool,
    ended: bool,
    failed: Option<ErrorBody>,
}

impl WatchSlot {
    pub(crate) fn new(path: PathBuf, recursive: bool) -> Self {
        Self { path, recursive, state: Mutex::default(), changed: watch::Sender::new(0) }
    }

    fn update(&self, f: impl FnOnce(&mut SlotState)) {
        f(&mut self.state.locked());
        self.changed.send_modify(|n| *n += 1);
    }

    /// Waits until `f` says something about the state.
    async fn wait<T>(&self, mut f: impl FnMut(&mut SlotState) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(t) = f(&mut self.state.locked()) {
                return t;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`: unreachable while we borrow it.
                continue;
            }
        }
    }

    /// The daemon confirmed the watch. A confirmation after a reconnect is an overflow:
    /// what changed while the connection was down was not seen; from here on every change
    /// is reported again.
    pub(crate) fn established(&self) {
        self.update(|s| {
            if s.established {
                s.overflowed = true;
            }
            s.established = true;
        });
    }

    pub(crate) fn push(&self, event: WatchEvent) {
        self.update(|s| {
            if s.overflowed {
                return;
            }
            if s.queue.len() >= WATCH_QUEUE {
                s.overflowed = true;
                return;
            }
            s.queue.push_back(event);
        });
    }

    pub(crate) fn end(&self) {
        self.update(|s| s.ended = true);
    }

    pub(crate) fn fail(&self, e: &Error) {
        self.update(|s| {
            if s.failed.is_none() && !s.ended {
                s.failed = Some(e.to_body());
            }
        });
    }
}

/// The consumer's end of a watch.
#[derive(Debug)]
struct RemoteWatch {
    shared: Arc<Shared>,
    id: String,
    slot: Arc<WatchSlot>,
}

#[async_trait]
impl WatchStream for RemoteWatch {
    async fn next_event(&mut self) -> Result<Option<WatchEvent>> {
        self.slot
            .wait(|s| {
                if let Some(ev) = s.queue.pop_front() {
                    return Some(Ok(Some(ev)));
                }
                if s.overflowed {
                    s.overflowed = false;
                    return Some(Ok(Some(WatchEvent::Overflow)));
                }
                if let Some(e) = &s.failed {
                    return Some(Err(Error::from_body(e.clone())));
                }
                s.ended.then_some(Ok(None))
            })
            .await
    }
}

impl Drop for RemoteWatch {
    fn drop(&mut self) {
        lock_watches(&self.shared.watches).remove(&self.id);
        if !self.shared.stop.is_cancelled() {
            self.shared.command(Cmd::Unwatch(self.id.clone()));
        }
    }
}

/// The `remote-sandbox` providers built in this process: `files-remote` finds the one its
/// composition's subprocess seam is. (The registry hands a plugin its seams as trait
/// objects; this is how one learns which remote-sandbox it got.) Entries are weak and matched
/// only while alive, so an address a dropped provider left behind never matches a newer one.
static CONNECTIONS: Mutex<Vec<Weak<RemoteSubprocess>>> = Mutex::new(Vec::new());

/// Records a built remote-sandbox, so `files-remote` can share its connection.
pub(crate) fn register_connection(provider: &Arc<RemoteSubprocess>) {
    let mut all = CONNECTIONS.locked();
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(provider));
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _: conch_registry::NoConfig = ctx.config()?;
    let sub = ctx.subprocess()?;
    // `sub` is alive while we look, so at most one live entry shares its address.
    let shared = CONNECTIONS
        .locked()
        .iter()
        .filter_map(Weak::upgrade)
        .find(|p| std::ptr::addr_eq(Arc::as_ptr(p), Arc::as_ptr(&sub)))
        .map(|p| Arc::clone(&p.shared));
    let Some(shared) = shared else {
        return Err(ctx.locate(Error::new(
            ErrorCode::InvalidComposition,
            format!(
                "files-remote shares the connection of the composition's remote-sandbox, but \
                 its subprocess provider is `{}`; use files-local or files-sandbox with it",
                sub.provider_name()
            ),
        )));
    };
    Ok(PluginOutput::seam(SeamHandle::Files(Arc::new(RemoteFiles::of(shared)))))
}

register_plugin!(PluginEntry {
    name: FILES_NAME,
    provides: Some(SeamId::Files),
    requires: &[SeamId::Subprocess],
    description: "the files of a remote `conch sandboxd`'s composition, over remote-sandbox's \
                  connection (RXP/1)",
    build,
});

#[cfg(test)]
mod tests {
    use super::*;

    fn created(i: usize) -> WatchEvent {
        WatchEvent::Created { path: PathBuf::from(format!("/w/{i}")) }
    }

    #[tokio::test]
    async fn a_lagging_consumer_gets_what_was_kept_then_one_overflow() {
        let slot = WatchSlot::new("/w".into(), false);
        slot.established();
        for i in 0..WATCH_QUEUE + 10 {
            slot.push(created(i));
        }
        let next = |s: &mut SlotState| {
            s.queue
                .pop_front()
                .map(Some)
                .or_else(|| std::mem::take(&mut s.overflowed).then_some(Some(WatchEvent::Overflow)))
        };
        for i in 0..WATCH_QUEUE {
            assert_eq!(slot.wait(next).await, Some(created(i)));
        }
        assert_eq!(slot.wait(next).await, Some(WatchEvent::Overflow));
        // Events after the overflow was reported are kept again, in order.
        slot.push(created(9999));
        assert_eq!(slot.wait(next).await, Some(created(9999)));
        // A confirmation after a reconnect is an overflow too: changes were missed.
        slot.established();
        assert_eq!(slot.wait(next).await, Some(WatchEvent::Overflow));
    }
}
