//! Connect RPC as envd speaks it: the JSON codec, unary calls and server streams, over
//! HTTP/1.1 (what the Python SDK uses on a plaintext URL; axum also serves HTTP/2 with prior
//! knowledge).
//!
//! - A unary call is `POST /<package.Service>/<Method>` with `Content-Type: application/json`
//!   and the request message as the body; the answer is `200` with the response message, or
//!   an error status with `{"code": "...", "message": "..."}`.
//! - A server stream is the same path with `Content-Type: application/connect+json`; the
//!   request and every response message travel in envelopes (a flags byte, a big-endian u32
//!   length, the JSON). The last envelope has flag `0x02` and carries `{}` or
//!   `{"error": {...}}`, so a stream's status is always `200` and its error is in its end.
//! - `Connect-Timeout-Ms` bounds a call; `Keepalive-Ping-Interval` (seconds, envd's own
//!   header) asks a stream for a keepalive message after that much silence.
//! - Compressed messages (`Connect-Content-Encoding`, `Content-Encoding` on unary bodies) are
//!   refused `unimplemented`: the SDKs send none.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use conch_seams::ErrorCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Content type of a unary call's messages.
const UNARY_JSON: &str = "application/json";
/// Content type of a stream's enveloped messages.
const STREAM_JSON: &str = "application/connect+json";
/// The end-of-stream flag of an envelope.
const END_STREAM: u8 = 0x02;
/// The compressed flag of an envelope.
const COMPRESSED: u8 = 0x01;

/// Connect's error codes (the subset of gRPC's that envd and its clients use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error (Connect's table).
    fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: its code and a message for people.
#[derive(Clone, Debug)]
pub(crate) struct RpcError {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl RpcError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    fn body(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl From<conch_seams::Error> for RpcError {
    /// A seam error as the Connect code an SDK maps to the matching exception; the message
    /// keeps conch's stable code in front (`[not_found] ...`).
    fn from(e: conch_seams::Error) -> Self {
        let code = match e.code() {
            ErrorCode::InvalidArgument
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory
            | ErrorCode::DirectoryNotEmpty
            | ErrorCode::SpawnFailed => Code::InvalidArgument,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::PermissionDenied | ErrorCode::SandboxDenied | ErrorCode::ForeignOwner => {
                Code::PermissionDenied
            }
            ErrorCode::TooLarge | ErrorCode::LimitExceeded => Code::ResourceExhausted,
            ErrorCode::Unsupported => Code::Unimplemented,
            ErrorCode::Timeout => Code::DeadlineExceeded,
            ErrorCode::Cancelled => Code::Canceled,
            ErrorCode::Unauthenticated => Code::Unauthenticated,
            ErrorCode::ConnectionFailed
            | ErrorCode::RemoteUnavailable
            | ErrorCode::SandboxUnavailable
            | ErrorCode::Disposing => Code::Unavailable,
            _ => Code::Internal,
        };
        Self::new(code, format!("[{}] {}", e.code().as_str(), e.message()))
    }
}

impl IntoResponse for RpcError {
    /// A unary call's error (also what a refused stream gets before it began).
    fn into_response(self) -> Response {
        let mut r = (self.code.status(), self.body().to_string()).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON));
        r
    }
}

/// What a call's headers ask for.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallOptions {
    /// `Connect-Timeout-Ms`.
    pub(crate) timeout: Option<Duration>,
    /// `Keepalive-Ping-Interval` (a stream's keepalive period).
    pub(crate) keepalive: Option<Duration>,
}

impl CallOptions {
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Self, RpcError> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let timeout = match text("connect-timeout-ms") {
            None => None,
            // Connect allows at most 10 digits.
            Some(t) if !t.is_empty() && t.len() <= 10 && t.bytes().all(|b| b.is_ascii_digit()) => {
                t.parse::<u64>().ok().map(Duration::from_millis)
            }
            Some(t) => {
                return Err(RpcError::invalid(format!(
                    "Connect-Timeout-Ms {t:?} is not a number of milliseconds"
                )));
            }
        };
        // envd reads it as whole seconds; anything else is ignored there too.
        let keepalive = text("keepalive-ping-interval")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        Ok(Self { timeout, keepalive })
    }
}

/// The request message of a unary call.
pub(crate) fn unary_request(headers: &HeaderMap, body: &[u8]) -> Result<Value, RpcError> {
    let ctype = content_type(headers);
    if ctype != UNARY_JSON {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!(
                "content type {ctype:?} is not served: envd here speaks Connect's JSON codec ({UNARY_JSON})"
            ),
        ));
    }
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes() != b"identity") {
        return Err(RpcError::new(Code::Unimplemented, "compressed requests are not served"));
    }
    parse_message(body)
}

/// The request message of a server stream (one envelope).
pub(crate) fn stream_request(headers: &HeaderMap, body: &[u8]) -> Result<Value, RpcError> {
    let ctype = content_type(headers);
    if ctype != STREAM_JSON {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("content type {ctype:?} is not served: a stream here takes {STREAM_JSON}"),
        ));
    }
    let Some((&flags, rest)) = body.split_first() else {
        return Err(RpcError::invalid("the stream's request has no envelope"));
    };
    if rest.len() < 4 {
        return Err(RpcError::invalid("the stream's request envelope is cut short"));
    }
    if flags & COMPRESSED != 0 {
        return Err(RpcError::new(Code::Unimplemented, "compressed messages are not served"));
    }
    let (len, payload) = rest.split_at(4);
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if payload.len() != len {
        return Err(RpcError::invalid(format!(
            "the stream's request envelope says {len} bytes and holds {}",
            payload.len()
        )));
    }
    parse_message(payload)
}

fn content_type(headers: &HeaderMap) -> String {
    let raw = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    raw.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

fn parse_message(bytes: &[u8]) -> Result<Value, RpcError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| RpcError::invalid(format!("the request is not a JSON message: {e}")))
}

/// A unary call's answer.
pub(crate) fn unary_ok(message: &Value) -> Response {
    let mut r = (StatusCode::OK, message.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON));
    r
}

/// The answer to a unary call: the message or the error.
pub(crate) fn unary(r: Result<Value, RpcError>) -> Response {
    match r {
        Ok(m) => unary_ok(&m),
        Err(e) => e.into_response(),
    }
}

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// The sending side of a server stream. Dropping it without [`Stream::end`] ends the stream
/// with an `internal` error, so a client never mistakes a cut stream for a finished one.
#[derive(Debug)]
pub(crate) struct Stream {
    tx: mpsc::Sender<Bytes>,
    ended: bool,
}

/// Messages a stream buffers before its producer waits for the client.
const STREAM_QUEUE: usize = 16;

impl Stream {
    /// A stream and the response that carries it.
    pub(crate) fn open() -> (Self, Response) {
        let (tx, rx) = mpsc::channel::<Bytes>(STREAM_QUEUE);
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        });
        let mut r = Response::new(Body::from_stream(body));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON));
        (Self { tx, ended: false }, r)
    }

    /// Sends one message; `false` once the client is gone.
    pub(crate) async fn send(&self, message: &Value) -> bool {
        let bytes = envelope(0, message.to_string().as_bytes());
        self.tx.send(bytes).await.is_ok()
    }

    /// Resolves when the client went away.
    pub(crate) async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Ends the stream: cleanly, or with `error`.
    pub(crate) async fn end(mut self, error: Option<RpcError>) {
        self.ended = true;
        let _ = self.tx.send(end_envelope(error.as_ref())).await;
    }
}

fn end_envelope(error: Option<&RpcError>) -> Bytes {
    let end = match error {
        None => json!({}),
        Some(e) => json!({"error": e.body()}),
    };
    envelope(END_STREAM, end.to_string().as_bytes())
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.ended {
            let e = RpcError::new(Code::Internal, "the stream's producer stopped before its end");
            let _ = self.tx.try_send(end_envelope(Some(&e)));
        }
    }
}

/// A stream refused before it began: a `200` whose only envelope is the error end, which
/// is how Connect servers answer a stream they will not run.
pub(crate) fn stream_refused(error: RpcError) -> Response {
    let mut r = Response::new(Body::from(end_envelope(Some(&error))));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON));
    r
}

/// Resolves at `deadline` (a stream's `Connect-Timeout-Ms`), or never.
pub(crate) async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Resolves after `period` (one keepalive's silence), or never.
pub(crate) async fn idle(period: Option<Duration>) {
    match period {
        Some(p) => tokio::time::sleep(p).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_stream_request_is_one_envelope_of_json() {
        let h = headers(&[("content-type", "application/connect+json")]);
        let body = envelope(0, br#"{"path":"/x"}"#);
        assert_eq!(stream_request(&h, &body).unwrap(), json!({"path": "/x"}));
        let short = &body[..body.len() - 1];
        assert_eq!(stream_request(&h, short).unwrap_err().code, Code::InvalidArgument);
        let packed = envelope(COMPRESSED, b"{}");
        assert_eq!(stream_request(&h, &packed).unwrap_err().code, Code::Unimplemented);
        let proto = headers(&[("content-type", "application/connect+proto")]);
        assert_eq!(stream_request(&proto, &body).unwrap_err().code, Code::Unimplemented);
    }

    #[test]
    fn unary_requests_take_json_with_a_charset_and_an_empty_body() {
        let h = headers(&[("content-type", "application/json; charset=utf-8")]);
        assert_eq!(unary_request(&h, b"").unwrap(), json!({}));
        assert_eq!(unary_request(&h, br#"{"a":1}"#).unwrap(), json!({"a": 1}));
        assert_eq!(unary_request(&h, b"{").unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn timeouts_are_whole_milliseconds_of_at_most_ten_digits() {
        let ok = CallOptions::from_headers(&headers(&[("connect-timeout-ms", "60000")])).unwrap();
        assert_eq!(ok.timeout, Some(Duration::from_secs(60)));
        for bad in ["-1", "1.5", "12345678901", ""] {
            let h = headers(&[("connect-timeout-ms", bad)]);
            assert!(CallOptions::from_headers(&h).is_err(), "{bad:?}");
        }
        let k = CallOptions::from_headers(&headers(&[("keepalive-ping-interval", "50")])).unwrap();
        assert_eq!(k.keepalive, Some(Duration::from_secs(50)));
    }

    #[test]
    fn seam_errors_keep_their_code_in_the_message() {
        let e = RpcError::from(conch_seams::Error::new(ErrorCode::NotFound, "no such file"));
        assert_eq!(e.code, Code::NotFound);
        assert_eq!(e.message, "[not_found] no such file");
        assert_eq!(e.clone().into_response().status(), StatusCode::NOT_FOUND);
    }
}
