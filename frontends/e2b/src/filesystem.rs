//! envd's filesystem service (`/filesystem.Filesystem/*`) over the files seam, so every
//! call obeys the world's policy (a sandboxed world refuses what its shell could not do).
//!
//! - An entry is described as envd does: `mode` and `permissions` as Go's `FileMode` writes
//!   them (type bits included, `drwxr-xr-x`), sizes as strings (int64 in JSON), times in
//!   RFC 3339. `owner` and `group` are left out: the seam does not report them.
//! - A watch is the seam's watch; an event's `name` is its path relative to the watched
//!   directory. A rename inside the watch is two events, as fsnotify reports it: `RENAME`
//!   for the old name, `CREATE` for the new. A dropped-events notice (the seam's overflow)
//!   has no envd event and is logged.
//! - `CreateWatcher` keeps a watch's events in a bounded queue until `GetWatcherEvents`
//!   takes them ([`WATCHER_QUEUE`]; past it the oldest go) and `RemoveWatcher` or the
//!   server's shutdown ends it.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use conch_seams::{ErrorCode, FileKind, FileStat, Files, ListSpec, WatchEvent, WatchStream};
use conch_sync::LockExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::connect::{CallOptions, Code, RpcError, Stream, idle, until};
use crate::proto::{self, timestamp};

/// The most entries one `ListDir` answers (envd has no limit; this bounds the answer's
/// memory, about 300 bytes an entry).
pub const MAX_LISTED: usize = 1_000_000;

/// Events a non-streaming watcher keeps between two `GetWatcherEvents`.
pub const WATCHER_QUEUE: usize = 10_000;

/// Go's `FileMode` type and special bits.
const GO_DIR: u32 = 1 << 31;
const GO_SYMLINK: u32 = 1 << 27;
const GO_SETUID: u32 = 1 << 23;
const GO_SETGID: u32 = 1 << 22;
const GO_STICKY: u32 = 1 << 20;

fn go_mode(stat: &FileStat) -> u32 {
    let mut mode = stat.mode & 0o777;
    for (unix, go) in [(0o4000, GO_SETUID), (0o2000, GO_SETGID), (0o1000, GO_STICKY)] {
        if stat.mode & unix != 0 {
            mode |= go;
        }
    }
    match stat.kind {
        FileKind::Directory => mode | GO_DIR,
        FileKind::Symlink => mode | GO_SYMLINK,
        FileKind::File | FileKind::Other => mode,
    }
}

/// The mode as Go's `FileMode.String()` writes it.
fn permissions(stat: &FileStat) -> String {
    let mut s = String::with_capacity(11);
    if stat.mode & 0o4000 != 0 {
        s.push('u');
    }
    if stat.mode & 0o2000 != 0 {
        s.push('g');
    }
    if stat.mode & 0o1000 != 0 {
        s.push('t');
    }
    match stat.kind {
        FileKind::Directory => s.insert(0, 'd'),
        FileKind::Symlink => s.insert(0, 'L'),
        FileKind::File | FileKind::Other => {}
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if stat.mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// envd's `EntryInfo`.
pub(crate) fn entry_info(stat: &FileStat) -> Value {
    let name = stat
        .path
        .file_name()
        .map_or_else(|| stat.path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let kind = match stat.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Directory => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut info = json!({
        "name": name,
        "type": kind,
        "path": stat.path.display().to_string(),
        "size": stat.size.to_string(),
        "mode": go_mode(stat),
        "permissions": permissions(stat),
        "modifiedTime": timestamp(stat.modified_ms),
    });
    if let Some(t) = &stat.symlink_target {
        info["symlinkTarget"] = json!(t.display().to_string());
    }
    info
}

fn path_of(files: &dyn Files, text: &str) -> Result<PathBuf, RpcError> {
    if text.is_empty() {
        return Err(RpcError::invalid("path is empty"));
    }
    Ok(proto::resolve_path(files.default_dir(), text))
}

/// A watch's events as envd's `FilesystemEvent`s.
fn events(root: &Path, event: WatchEvent) -> Vec<(String, &'static str, Option<PathBuf>)> {
    let rel = |p: &Path| {
        p.strip_prefix(root).map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
    };
    match event {
        WatchEvent::Created { path } => vec![(rel(&path), "EVENT_TYPE_CREATE", Some(path))],
        WatchEvent::Modified { path } => vec![(rel(&path), "EVENT_TYPE_WRITE", Some(path))],
        WatchEvent::Removed { path } => vec![(rel(&path), "EVENT_TYPE_REMOVE", None)],
        WatchEvent::Renamed { from, to } => {
            let mut out = Vec::new();
            if let Some(f) = from {
                out.push((rel(&f), "EVENT_TYPE_RENAME", None));
            }
            if let Some(t) = to {
                out.push((rel(&t), "EVENT_TYPE_CREATE", Some(t)));
            }
            out
        }
        WatchEvent::Overflow => {
            tracing::warn!(root = %root.display(), "a watch dropped events (the consumer fell behind)");
            Vec::new()
        }
    }
}

/// One non-streaming watcher: its queued events and the task that fills them.
#[derive(Debug)]
struct Watcher {
    queue: Arc<Mutex<VecDeque<Value>>>,
    stop: CancellationToken,
}

/// The filesystem service's state.
#[derive(Debug)]
pub(crate) struct Filesystem {
    files: Arc<dyn Files>,
    watchers: Mutex<HashMap<String, Watcher>>,
    stop: CancellationToken,
}

impl Filesystem {
    pub(crate) fn new(files: Arc<dyn Files>) -> Arc<Self> {
        Arc::new(Self {
            files,
            watchers: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
        })
    }

    /// Ends every watch (the server's shutdown).
    pub(crate) fn shutdown(&self) {
        self.stop.cancel();
        self.watchers.locked().clear();
    }

    pub(crate) async fn stat(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::PathRequest = proto::decode(message)?;
        let stat = match self.files.stat(&path_of(self.files.as_ref(), &req.path)?).await {
            Ok(s) => s,
            // `file/child` does not exist (the SDK's `exists` asks this way).
            Err(e) if e.code() == ErrorCode::NotADirectory => {
                return Err(RpcError::not_found(format!("path not found: {}", req.path)));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(json!({"entry": entry_info(&stat)}))
    }

    pub(crate) async fn make_dir(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::PathRequest = proto::decode(message)?;
        let path = path_of(self.files.as_ref(), &req.path)?;
        // envd answers `already_exists` for a directory (the SDK's `make_dir` returns False)
        // and `invalid_argument` for anything else in the way.
        match self.files.stat(&path).await {
            Ok(s) if s.kind == FileKind::Directory => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", s.path.display()),
                ));
            }
            Ok(s) => {
                return Err(RpcError::invalid(format!(
                    "path already exists but it is not a directory: {}",
                    s.path.display()
                )));
            }
            Err(_) => {}
        }
        self.files.make_dir(&path, true).await?;
        let stat = self.files.stat(&path).await?;
        Ok(json!({"entry": entry_info(&stat)}))
    }

    pub(crate) async fn move_entry(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::MoveRequest = proto::decode(message)?;
        let (from, to) = (
            path_of(self.files.as_ref(), &req.source)?,
            path_of(self.files.as_ref(), &req.destination)?,
        );
        // envd creates the destination's parents and replaces what is there (rename(2)).
        if let Some(parent) = to.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.files.make_dir(parent, true).await?;
        }
        self.files.rename(&from, &to, true).await?;
        let stat = self.files.stat(&to).await?;
        Ok(json!({"entry": entry_info(&stat)}))
    }

    pub(crate) async fn list_dir(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::ListDirRequest = proto::decode(message)?;
        let spec = ListSpec::new(path_of(self.files.as_ref(), &req.path)?)
            .with_depth(req.depth.max(1))
            .with_limit(MAX_LISTED);
        let listing = self.files.list(spec).await?;
        if listing.truncated {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "the listing passed {MAX_LISTED} entries: list a smaller depth or a subdirectory"
                ),
            ));
        }
        let entries: Vec<Value> = listing.entries.iter().map(entry_info).collect();
        Ok(json!({"entries": entries}))
    }

    pub(crate) async fn remove(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::PathRequest = proto::decode(message)?;
        // As envd's `os.RemoveAll`: a path that is not there is removed already.
        match self.files.remove(&path_of(self.files.as_ref(), &req.path)?, true).await {
            Err(e) if e.code() != ErrorCode::NotFound => Err(e.into()),
            _ => Ok(json!({})),
        }
    }

    /// Starts a watch of a directory (refusing anything else, as envd does).
    async fn open_watch(
        &self,
        req: &proto::WatchRequest,
    ) -> Result<(PathBuf, Box<dyn WatchStream>), RpcError> {
        let path = path_of(self.files.as_ref(), &req.path)?;
        let stat = self.files.stat(&path).await?;
        if stat.kind != FileKind::Directory {
            return Err(RpcError::invalid(format!(
                "path {} is not a directory",
                stat.path.display()
            )));
        }
        let watch = self.files.watch(&stat.path, req.recursive).await?;
        Ok((stat.path, watch))
    }

    /// The `FilesystemEvent`s of one seam event, with entries when asked.
    async fn describe(
        files: &dyn Files,
        root: &Path,
        event: WatchEvent,
        include_entry: bool,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        for (name, kind, path) in events(root, event) {
            let mut e = json!({"name": name, "type": kind});
            if include_entry
                && let Some(p) = path
                && let Ok(stat) = files.stat(&p).await
            {
                e["entry"] = entry_info(&stat);
            }
            out.push(e);
        }
        out
    }

    /// `WatchDir`: a start event, then the directory's events as they come (the response's
    /// oneof is its top level, unlike a process event's).
    pub(crate) async fn watch_dir(
        &self,
        message: Value,
        opts: CallOptions,
    ) -> Result<axum::response::Response, RpcError> {
        let req: proto::WatchRequest = proto::decode(message)?;
        let (root, mut watch) = self.open_watch(&req).await?;
        let (stream, response) = Stream::open();
        let files = Arc::clone(&self.files);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            if !stream.send(&json!({"start": {}})).await {
                return;
            }
            let deadline =
                opts.timeout.filter(|t| !t.is_zero()).map(|t| tokio::time::Instant::now() + t);
            loop {
                let next = tokio::select! {
                    biased;
                    () = stream.closed() => return,
                    () = stop.cancelled() => {
                        stream.end(Some(RpcError::new(Code::Unavailable, "the server is shutting down"))).await;
                        return;
                    }
                    () = until(deadline) => {
                        stream.end(Some(RpcError::new(Code::DeadlineExceeded, "the watch's timeout passed (Connect-Timeout-Ms)"))).await;
                        return;
                    }
                    next = watch.next_event() => next,
                    () = idle(opts.keepalive) => {
                        if !stream.send(&json!({"keepalive": {}})).await {
                            return;
                        }
                        continue;
                    }
                };
                match next {
                    Ok(Some(event)) => {
                        for e in
                            Self::describe(files.as_ref(), &root, event, req.include_entry).await
                        {
                            if !stream.send(&json!({"filesystem": e})).await {
                                return;
                            }
                        }
                    }
                    Ok(None) => {
                        stream.end(None).await;
                        return;
                    }
                    Err(e) => {
                        stream.end(Some(e.into())).await;
                        return;
                    }
                }
            }
        });
        Ok(response)
    }

    /// `CreateWatcher`: a watch whose events wait for `GetWatcherEvents`.
    pub(crate) async fn create_watcher(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::WatchRequest = proto::decode(message)?;
        let (root, mut watch) = self.open_watch(&req).await?;
        let id = conch_nonce::random_hex::<16>();
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let stop = self.stop.child_token();
        let (files, q, s) = (Arc::clone(&self.files), Arc::clone(&queue), stop.clone());
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = s.cancelled() => return,
                    next = watch.next_event() => next,
                };
                let Ok(Some(event)) = next else { return };
                let described =
                    Self::describe(files.as_ref(), &root, event, req.include_entry).await;
                let mut q = q.locked();
                q.extend(described);
                let over = q.len().saturating_sub(WATCHER_QUEUE);
                q.drain(..over);
            }
        });
        self.watchers.locked().insert(id.clone(), Watcher { queue, stop });
        Ok(json!({"watcherId": id}))
    }

    pub(crate) fn get_watcher_events(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::WatcherRequest = proto::decode(message)?;
        let w = self.watchers.locked();
        let Some(watcher) = w.get(&req.watcher_id) else {
            return Err(RpcError::not_found(format!("watcher {:?} not found", req.watcher_id)));
        };
        let events: Vec<Value> = watcher.queue.locked().drain(..).collect();
        Ok(json!({"events": events}))
    }

    pub(crate) fn remove_watcher(&self, message: Value) -> Result<Value, RpcError> {
        let req: proto::WatcherRequest = proto::decode(message)?;
        match self.watchers.locked().remove(&req.watcher_id) {
            Some(w) => {
                w.stop.cancel();
                Ok(json!({}))
            }
            None => Err(RpcError::not_found(format!("watcher {:?} not found", req.watcher_id))),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_go_writes_them() {
        let dir = FileStat::new("/w/d".into(), FileKind::Directory, 4096, 0o755, 0);
        assert_eq!(permissions(&dir), "drwxr-xr-x");
        assert_eq!(go_mode(&dir), GO_DIR | 0o755);
        let file = FileStat::new("/w/f".into(), FileKind::File, 3, 0o4644, 0);
        assert_eq!(permissions(&file), "urw-r--r--");
        assert_eq!(go_mode(&file), GO_SETUID | 0o644);
        let link = FileStat::new("/w/l".into(), FileKind::Symlink, 1, 0o777, 0);
        assert_eq!(permissions(&link), "Lrwxrwxrwx");
        let info = entry_info(&file.clone());
        assert_eq!(info["size"], "3");
        assert_eq!(info["name"], "f");
        assert_eq!(info["type"], "FILE_TYPE_FILE");
    }

    #[test]
    fn a_rename_inside_the_watch_is_rename_then_create() {
        let got = events(
            Path::new("/w"),
            WatchEvent::Renamed { from: Some("/w/a".into()), to: Some("/w/sub/b".into()) },
        );
        let kinds: Vec<(&str, &str)> = got.iter().map(|(n, k, _)| (n.as_str(), *k)).collect();
        assert_eq!(kinds, vec![("a", "EVENT_TYPE_RENAME"), ("sub/b", "EVENT_TYPE_CREATE")]);
    }
}
