//! What a failed call answers. SWE-ReX's client re-raises the exception a server names: an
//! HTTP 511 whose body is `{"swerexception": {message, class_path, traceback, extra_info}}`,
//! where `class_path` is the Python class (`swerex.exceptions.CommandTimeoutError`,
//! `builtins.FileNotFoundError`, …) and `extra_info` lands on the raised exception. Requests
//! the API refuses before any work (a bad body, a wrong key) are 4xx with `{"detail": …}`, as
//! FastAPI answers them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use conch_seams::ErrorCode;
use serde_json::{Map, Value, json};

/// A failure the client re-raises as the exception `class` names.
#[derive(Debug, thiserror::Error)]
#[error("{class}: {message}")]
pub(crate) struct Raised {
    /// The Python class path the client re-raises.
    pub class: &'static str,
    /// The exception's message.
    pub message: String,
    /// Set on the raised exception as `extra_info`.
    pub extra: Map<String, Value>,
}

/// The exception classes conch raises, by their Python paths.
pub(crate) mod class {
    pub const TIMEOUT: &str = "swerex.exceptions.CommandTimeoutError";
    pub const NON_ZERO: &str = "swerex.exceptions.NonZeroExitCodeError";
    pub const SYNTAX: &str = "swerex.exceptions.BashIncorrectSyntaxError";
    pub const SESSION_EXISTS: &str = "swerex.exceptions.SessionExistsError";
    pub const NO_SESSION: &str = "swerex.exceptions.SessionDoesNotExistError";
    pub const SWEREX: &str = "swerex.exceptions.SwerexException";
    pub const FILE_NOT_FOUND: &str = "builtins.FileNotFoundError";
    pub const PERMISSION: &str = "builtins.PermissionError";
    pub const IS_A_DIRECTORY: &str = "builtins.IsADirectoryError";
    pub const NOT_A_DIRECTORY: &str = "builtins.NotADirectoryError";
    pub const FILE_EXISTS: &str = "builtins.FileExistsError";
    pub const VALUE: &str = "builtins.ValueError";
}

impl Raised {
    pub(crate) fn new(class: &'static str, message: impl Into<String>) -> Self {
        Self { class, message: message.into(), extra: Map::new() }
    }

    /// Adds one `extra_info` entry.
    #[must_use]
    pub(crate) fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.into(), value.into());
        self
    }
}

/// A seam error as the Python exception closest to it (file errors as `OSError`
/// subclasses, so `except FileNotFoundError` works as against swe-rex's own server); the
/// stable conch code travels in `extra_info.conch_code`.
impl From<conch_seams::Error> for Raised {
    fn from(e: conch_seams::Error) -> Self {
        let class = match e.code() {
            ErrorCode::NotFound => class::FILE_NOT_FOUND,
            ErrorCode::PermissionDenied | ErrorCode::SandboxDenied => class::PERMISSION,
            ErrorCode::IsADirectory => class::IS_A_DIRECTORY,
            ErrorCode::NotADirectory => class::NOT_A_DIRECTORY,
            ErrorCode::AlreadyExists => class::FILE_EXISTS,
            ErrorCode::InvalidArgument | ErrorCode::TooLarge => class::VALUE,
            _ => class::SWEREX,
        };
        Raised::new(class, e.to_string()).with("conch_code", e.code().as_str())
    }
}

impl IntoResponse for Raised {
    fn into_response(self) -> Response {
        let body = json!({"swerexception": {
            "message": self.message,
            "class_path": self.class,
            "traceback": "",
            "extra_info": Value::Object(self.extra),
        }});
        let status = StatusCode::from_u16(511).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(body)).into_response()
    }
}

/// A request refused before any work: `status` with FastAPI's `{"detail": …}` body.
pub(crate) fn refused(status: StatusCode, detail: impl Into<String>) -> Response {
    (status, axum::Json(json!({"detail": detail.into()}))).into_response()
}
