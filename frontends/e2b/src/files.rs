//! envd's file transfer routes, over the files seam: `GET /files` (a download) and
//! `POST /files` (an upload, as `multipart/form-data` or a raw `application/octet-stream`
//! body, either optionally `Content-Encoding: gzip`).
//!
//! - Both stream: a download is read in [`READ_CHUNK`] pieces as the client takes them, and
//!   an upload is written as it arrives, so a file of any size crosses in bounded memory.
//! - An upload creates missing parent directories and writes the file in place, truncated
//!   first, as envd does (a watch sees the file itself created and written, and a hard link
//!   stays shared); a cut upload is answered with an error and leaves what arrived.
//! - Paths are cleaned lexically first (`a/../b` is `b`), as envd cleans them.
//! - Errors are envd's: a status and `{"code": <status>, "message": "..."}`. A missing file
//!   is 404 (the SDK's `FileNotFoundException`).
//! - Not served: the `username` parameter (everything runs as the server's user), signed
//!   URLs (`signature`), gzip-compressed downloads (the body goes uncompressed, which every
//!   client reads), and file metadata (`X-Metadata-*` headers are refused).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Query, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use conch_seams::{ErrorCode, FileKind, FileWriter, Files, WriteMode, WriteSpec};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::json;

use crate::proto;

/// The size of one read of a download.
pub const READ_CHUNK: usize = 4 << 20;

/// The query both routes take.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FileQuery {
    path: Option<String>,
}

/// envd's error answer: a status and `{"code": <status>, "message": "..."}`.
#[derive(Debug)]
pub(crate) struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let Refused(status, message) = self;
        let body = json!({"code": status.as_u16(), "message": message}).to_string();
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        r
    }
}

fn refused(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused(status, message.into())
}

fn seam_refused(e: &conch_seams::Error) -> Refused {
    let status = match e.code() {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::PermissionDenied | ErrorCode::SandboxDenied => StatusCode::FORBIDDEN,
        ErrorCode::InvalidArgument
        | ErrorCode::IsADirectory
        | ErrorCode::NotADirectory
        | ErrorCode::AlreadyExists => StatusCode::BAD_REQUEST,
        ErrorCode::TooLarge | ErrorCode::LimitExceeded => StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::RemoteUnavailable | ErrorCode::ConnectionFailed => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refused(status, format!("[{}] {}", e.code().as_str(), e.message()))
}

/// `GET /files?path=`: the file's bytes.
pub(crate) async fn download(files: Arc<dyn Files>, Query(q): Query<FileQuery>) -> Response {
    let Some(path) = q.path.filter(|p| !p.is_empty()) else {
        return refused(StatusCode::BAD_REQUEST, "the path parameter is required").into_response();
    };
    let stat = match files.stat(&proto::resolve_path(files.default_dir(), &path)).await {
        Ok(s) => s,
        Err(e) => return seam_refused(&e).into_response(),
    };
    if stat.kind == FileKind::Directory {
        let why = format!("path {} is a directory", stat.path.display());
        return refused(StatusCode::BAD_REQUEST, why).into_response();
    }
    // The first chunk is read before the answer, so an unreadable file is an error status,
    // not a cut body.
    let first = match files.read(&stat.path, 0, READ_CHUNK).await {
        Ok(c) => c,
        Err(e) => return seam_refused(&e).into_response(),
    };
    let name = stat.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let target = stat.path.clone();
    let start = (first.data.len() as u64, first.eof);
    let rest = futures::stream::unfold(Some(start), move |state| {
        let files = Arc::clone(&files);
        let target = target.clone();
        async move {
            let (offset, eof) = state?;
            if eof {
                return None;
            }
            match files.read(&target, offset, READ_CHUNK).await {
                Ok(c) if c.data.is_empty() => None,
                Ok(c) => {
                    let next = (offset + c.data.len() as u64, c.eof);
                    Some((Ok(Bytes::from(c.data)), Some(next)))
                }
                // A failure mid-body can only cut the body: the client sees a short read.
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
            }
        }
    });
    let body = futures::stream::once(async move { Ok(Bytes::from(first.data)) }).chain(rest);
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    let disposition = format!("attachment; filename={}", quoted(&name));
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

fn quoted(name: &str) -> String {
    let escaped: String = name
        .chars()
        .filter(|c| !c.is_control())
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if c.is_ascii() => vec![c],
            _ => vec!['_'],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// Undoes `Content-Encoding: gzip` chunk by chunk, or passes the bytes through.
enum Decode {
    Plain,
    Gzip(Box<flate2::write::GzDecoder<Vec<u8>>>),
}

impl Decode {
    fn of(headers: &HeaderMap) -> Result<Self, Refused> {
        match headers.get(header::CONTENT_ENCODING).map(HeaderValue::as_bytes) {
            None | Some(b"identity") => Ok(Decode::Plain),
            Some(b"gzip") => Ok(Decode::Gzip(Box::new(flate2::write::GzDecoder::new(Vec::new())))),
            Some(other) => Err(refused(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Encoding {:?} is not served (gzip and identity are)",
                    String::from_utf8_lossy(other)
                ),
            )),
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<u8>, Refused> {
        match self {
            Decode::Plain => Ok(chunk.to_vec()),
            Decode::Gzip(d) => {
                d.write_all(chunk).map_err(bad_gzip)?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }

    fn finish(self) -> Result<Vec<u8>, Refused> {
        match self {
            Decode::Plain => Ok(Vec::new()),
            Decode::Gzip(d) => d.finish().map_err(bad_gzip),
        }
    }
}

fn bad_gzip(e: std::io::Error) -> Refused {
    refused(StatusCode::BAD_REQUEST, format!("the gzip body does not decode: {e}"))
}

/// One file being received.
struct Upload {
    writer: Box<dyn FileWriter>,
    decode: Decode,
}

impl Upload {
    async fn open(files: &dyn Files, path: &Path, headers: &HeaderMap) -> Result<Self, Refused> {
        let decode = Decode::of(headers)?;
        // In place, as envd writes: a watch sees the file itself created and written (an
        // atomic replace would show a temporary file and a rename), and hard links stay one.
        let spec = WriteSpec::new(path, WriteMode::Truncate).with_parents();
        let writer = files.write(spec).await.map_err(|e| seam_refused(&e))?;
        Ok(Self { writer, decode })
    }

    async fn feed(&mut self, chunk: &[u8]) -> Result<(), Refused> {
        let data = self.decode.feed(chunk)?;
        if !data.is_empty() {
            self.writer.write(&data).await.map_err(|e| seam_refused(&e))?;
        }
        Ok(())
    }

    async fn finish(self) -> Result<serde_json::Value, Refused> {
        let Upload { mut writer, decode } = self;
        let tail = decode.finish()?;
        if !tail.is_empty() {
            writer.write(&tail).await.map_err(|e| seam_refused(&e))?;
        }
        let stat = writer.finish().await.map_err(|e| seam_refused(&e))?;
        let name =
            stat.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(json!({"name": name, "type": "file", "path": stat.path.display().to_string()}))
    }
}

/// `POST /files`: one raw body to `?path=`, or the `file` parts of a multipart form, each
/// to its filename (or to `?path=` when the form holds one file).
pub(crate) async fn upload(files: Arc<dyn Files>, q: FileQuery, req: Request) -> Response {
    let headers = req.headers().clone();
    if headers.keys().any(|k| k.as_str().starts_with("x-metadata-")) {
        return refused(
            StatusCode::BAD_REQUEST,
            "file metadata (X-Metadata-* headers) is not supported by this server",
        )
        .into_response();
    }
    let ctype = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let param =
        q.path.filter(|p| !p.is_empty()).map(|p| proto::resolve_path(files.default_dir(), &p));
    let result = if ctype.starts_with("multipart/form-data") {
        match Multipart::from_request(req, &()).await {
            Ok(form) => multipart(files.as_ref(), form, param).await,
            Err(e) => Err(refused(StatusCode::BAD_REQUEST, format!("bad multipart body: {e}"))),
        }
    } else {
        match param {
            None => Err(refused(
                StatusCode::BAD_REQUEST,
                "the path parameter is required for a raw body upload",
            )),
            Some(path) => raw(files.as_ref(), &path, req, &headers).await.map(|w| vec![w]),
        }
    };
    match result {
        Ok(written) => axum::Json(written).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn raw(
    files: &dyn Files,
    path: &Path,
    req: Request,
    headers: &HeaderMap,
) -> Result<serde_json::Value, Refused> {
    let mut up = Upload::open(files, path, headers).await?;
    let mut body = req.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk
            .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("reading the body: {e}")))?;
        up.feed(&chunk).await?;
    }
    up.finish().await
}

async fn multipart(
    files: &dyn Files,
    mut form: Multipart,
    param: Option<PathBuf>,
) -> Result<Vec<serde_json::Value>, Refused> {
    let mut written = Vec::new();
    let mut param = param;
    loop {
        let field = form
            .next_field()
            .await
            .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("bad multipart body: {e}")))?;
        let Some(mut field) = field else { break };
        if field.name() != Some("file") {
            continue;
        }
        // The query's path names the first file; every other takes its part's filename.
        let path = match param.take() {
            Some(p) => p,
            None => match field.file_name().filter(|n| !n.is_empty()) {
                Some(n) => proto::resolve_path(files.default_dir(), n),
                None => {
                    return Err(refused(
                        StatusCode::BAD_REQUEST,
                        "a file part has no filename and no path parameter names it",
                    ));
                }
            },
        };
        // The SDKs compress only raw bodies (gzip needs the octet-stream upload).
        let mut up = Upload::open(files, &path, &HeaderMap::new()).await?;
        while let Some(chunk) = field
            .chunk()
            .await
            .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("bad multipart body: {e}")))?
        {
            up.feed(&chunk).await?;
        }
        written.push(up.finish().await?);
    }
    if written.is_empty() {
        return Err(refused(StatusCode::BAD_REQUEST, "the form holds no file part"));
    }
    Ok(written)
}
