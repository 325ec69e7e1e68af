//! The one public error type every seam returns, with stable, append-only codes and an
//! optional typed reason, so callers match on values, never on message text.
//!
//! A reason such as `MISSING_PROGRAM`, which a subprocess provider sets when a spawn's program is
//! not there, lets an executor name what to install. A final reason (`BOOT_CHANGED`, `REMOTE_GONE`)
//! makes `Error::retryable` false whatever the code: nothing succeeds until the world is rebuilt.
//! `ErrorBody` is the error's owned wire form; the `as_str` values are pinned by `tests/it/error.rs`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// Stable error vocabulary; `as_str` values never change once shipped.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A composition file is malformed or a config value is invalid.
    InvalidComposition,
    /// A plugin or provider name is not registered.
    ProviderNotFound,
    /// Two plugins provide the same seam, or one name is registered twice.
    DuplicateProvider,
    /// A plugin requires a seam that nothing in the composition provides.
    SeamUnbound,
    /// The provider cannot do this on this platform or configuration.
    Unsupported,
    /// The caller passed a bad argument.
    InvalidArgument,
    /// The addressed resource does not exist (or is not visible to the caller).
    NotFound,
    /// The resource already exists.
    AlreadyExists,
    /// The caller is not allowed to do this.
    PermissionDenied,
    /// A sandbox policy denied the operation.
    SandboxDenied,
    /// A process could not be started.
    SpawnFailed,
    /// A deadline passed.
    Timeout,
    /// The operation was cancelled by its caller.
    Cancelled,
    /// A remote peer could not be reached.
    ConnectionFailed,
    /// A remote peer spoke an unexpected protocol.
    Protocol,
    /// An I/O operation failed.
    Io,
    /// A bug or unexpected state inside conch.
    Internal,
    /// The resource exists but belongs to another owner.
    ForeignOwner,
    /// A configured capacity (such as the per-owner job cap) is exhausted.
    LimitExceeded,
    /// The service or owner is shutting down and accepts no new work.
    Disposing,
    /// A remote peer refused the credentials (missing or wrong token).
    Unauthenticated,
    /// A remote world stayed unreachable past the provider's give-up time, restarted and
    /// lost what it held (reason `BOOT_CHANGED`), or is known to be gone (reason
    /// `REMOTE_GONE`: its daemon refuses connections).
    RemoteUnavailable,
    /// The sandbox cannot be enforced here (no Landlock, no bubblewrap, a blocked user
    /// namespace) or its runner failed to launch; never answered by running unconfined.
    SandboxUnavailable,
    /// A path was used as a directory but names something else (a file, say).
    NotADirectory,
    /// A path names a directory where a file was expected.
    IsADirectory,
    /// A file, read or transfer is larger than the operation accepts.
    TooLarge,
    /// A directory is not empty (removing it needs `recursive`).
    DirectoryNotEmpty,
}

impl ErrorCode {
    /// Every code, in declaration order (used by the pinning test and docs).
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidComposition,
        ErrorCode::ProviderNotFound,
        ErrorCode::DuplicateProvider,
        ErrorCode::SeamUnbound,
        ErrorCode::Unsupported,
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::SandboxDenied,
        ErrorCode::SpawnFailed,
        ErrorCode::Timeout,
        ErrorCode::Cancelled,
        ErrorCode::ConnectionFailed,
        ErrorCode::Protocol,
        ErrorCode::Io,
        ErrorCode::Internal,
        ErrorCode::ForeignOwner,
        ErrorCode::LimitExceeded,
        ErrorCode::Disposing,
        ErrorCode::Unauthenticated,
        ErrorCode::RemoteUnavailable,
        ErrorCode::SandboxUnavailable,
        ErrorCode::NotADirectory,
        ErrorCode::IsADirectory,
        ErrorCode::TooLarge,
        ErrorCode::DirectoryNotEmpty,
    ];

    /// The stable snake_case spelling shown to models and scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidComposition => "invalid_composition",
            ErrorCode::ProviderNotFound => "provider_not_found",
            ErrorCode::DuplicateProvider => "duplicate_provider",
            ErrorCode::SeamUnbound => "seam_unbound",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::SandboxDenied => "sandbox_denied",
            ErrorCode::SpawnFailed => "spawn_failed",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::ConnectionFailed => "connection_failed",
            ErrorCode::Protocol => "protocol",
            ErrorCode::Io => "io",
            ErrorCode::Internal => "internal",
            ErrorCode::ForeignOwner => "foreign_owner",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Disposing => "disposing",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::RemoteUnavailable => "remote_unavailable",
            ErrorCode::SandboxUnavailable => "sandbox_unavailable",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::IsADirectory => "is_a_directory",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::DirectoryNotEmpty => "directory_not_empty",
        }
    }

    /// Whether an identical retry could succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Timeout
                | ErrorCode::ConnectionFailed
                | ErrorCode::LimitExceeded
                | ErrorCode::RemoteUnavailable
        )
    }
}

/// The member of `all` spelled `s`; an unknown spelling from a peer is a protocol error.
fn by_name<T: Copy>(
    all: &[T],
    name: fn(T) -> &'static str,
    s: &str,
    what: &str,
) -> Result<T, Error> {
    all.iter()
        .copied()
        .find(|v| name(*v) == s)
        .ok_or_else(|| Error::new(ErrorCode::Protocol, format!("unknown {what} `{s}`")))
}

impl FromStr for ErrorCode {
    type Err = Error;

    /// Parses the exact `as_str` spelling.
    fn from_str(s: &str) -> Result<Self, Error> {
        by_name(ErrorCode::ALL, ErrorCode::as_str, s, "error code")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed refinement of an [`ErrorCode`]: why exactly the operation was refused. Callers
/// that need to react to one case match on this, never on the message. `as_str` values are
/// stable and shown in front of the message.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorReason {
    /// No terminal session has that id or name (for this owner).
    NoSession,
    /// The session belongs to another owner.
    ForeignSession,
    /// The owner already has a session with that name.
    DuplicateName,
    /// The session is already running a send.
    SendActive,
    /// The owner is being disposed.
    OwnerNotLive,
    /// The service is shutting down.
    ServiceDisposing,
    /// No terminal backend of the requested type.
    NoBackend,
    /// A session name is malformed or looks like an id.
    BadName,
    /// The session's shell has exited; it takes no more input.
    SessionExited,
    /// The remote world restarted (its boot id changed): what it held is gone.
    BootChanged,
    /// A spawn's working directory does not exist: the caller's mistake, not the runner's
    /// (a sandboxed executor keeps it a `spawn_failed`, not `sandbox_unavailable`).
    MissingWorkdir,
    /// A spawn's program was not found (not on the PATH it was looked up on, or no such
    /// file), so an executor can say which program its user has to install.
    MissingProgram,
    /// A spawn's working directory exists but is not a directory (a file, say): the
    /// caller's mistake, like [`ErrorReason::MissingWorkdir`], with its own words.
    WorkdirNotDirectory,
    /// The remote world is known to be gone: its daemon refuses connections (nothing
    /// listens at its address), so what it ran cannot be reached.
    RemoteGone,
}

impl ErrorReason {
    /// Whether this reason says a spawn's working directory is unusable (missing, or not a
    /// directory): the caller's mistake wherever the command runs.
    pub fn is_bad_workdir(self) -> bool {
        matches!(self, ErrorReason::MissingWorkdir | ErrorReason::WorkdirNotDirectory)
    }

    /// Every reason, in declaration order.
    pub const ALL: &'static [ErrorReason] = &[
        ErrorReason::NoSession,
        ErrorReason::ForeignSession,
        ErrorReason::DuplicateName,
        ErrorReason::SendActive,
        ErrorReason::OwnerNotLive,
        ErrorReason::ServiceDisposing,
        ErrorReason::NoBackend,
        ErrorReason::BadName,
        ErrorReason::SessionExited,
        ErrorReason::BootChanged,
        ErrorReason::MissingWorkdir,
        ErrorReason::MissingProgram,
        ErrorReason::WorkdirNotDirectory,
        ErrorReason::RemoteGone,
    ];

    /// The stable upper-case spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::NoSession => "NO_SESSION",
            ErrorReason::ForeignSession => "FOREIGN_SESSION",
            ErrorReason::DuplicateName => "DUPLICATE_NAME",
            ErrorReason::SendActive => "SEND_ACTIVE",
            ErrorReason::OwnerNotLive => "OWNER_NOT_LIVE",
            ErrorReason::ServiceDisposing => "SERVICE_DISPOSING",
            ErrorReason::NoBackend => "NO_BACKEND",
            ErrorReason::BadName => "BAD_NAME",
            ErrorReason::SessionExited => "SESSION_EXITED",
            ErrorReason::BootChanged => "BOOT_CHANGED",
            ErrorReason::MissingWorkdir => "MISSING_WORKDIR",
            ErrorReason::MissingProgram => "MISSING_PROGRAM",
            ErrorReason::WorkdirNotDirectory => "WORKDIR_NOT_A_DIRECTORY",
            ErrorReason::RemoteGone => "REMOTE_GONE",
        }
    }

    /// True when the reason rules out that an identical retry succeeds, whatever the code
    /// (a world that restarted or is gone must be rebuilt first).
    pub fn is_final(self) -> bool {
        matches!(self, ErrorReason::BootChanged | ErrorReason::RemoteGone)
    }
}

impl FromStr for ErrorReason {
    type Err = Error;

    /// Parses the exact `as_str` spelling.
    fn from_str(s: &str) -> Result<Self, Error> {
        by_name(ErrorReason::ALL, ErrorReason::as_str, s, "error reason")
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A seam error: a stable code, an optional typed reason, a lowercase message, where it
/// came from and extra context. Every field but the source survives a trip over the wire
/// (see [`ErrorBody`]).
#[derive(Debug)]
pub struct Error {
    code: ErrorCode,
    reason: Option<ErrorReason>,
    message: String,
    provider: Cow<'static, str>,
    operation: Cow<'static, str>,
    context: Vec<(Cow<'static, str>, String)>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// A new error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: None,
            message: message.into(),
            provider: Cow::Borrowed(""),
            operation: Cow::Borrowed(""),
            context: Vec::new(),
            source: None,
        }
    }

    /// Shorthand for [`ErrorCode::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorCode::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// An [`ErrorCode::Io`] error wrapping an `std::io::Error`.
    pub fn io(what: impl fmt::Display, err: std::io::Error) -> Self {
        Self::new(ErrorCode::Io, format!("{what}: {err}")).with_source(err)
    }

    /// A filesystem error about `path`, coded by what the OS said: `ENOENT` is `not_found`,
    /// `ENOTDIR` `not_a_directory`, `EISDIR` `is_a_directory`, `EEXIST` `already_exists`,
    /// `EACCES`/`EPERM`/`EROFS` `permission_denied`, `ENOTEMPTY` `directory_not_empty`,
    /// `EFBIG` `too_large`, anything else `io`. The message names the path.
    pub fn fs(what: &str, path: &std::path::Path, err: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let code = match err.kind() {
            K::NotFound => ErrorCode::NotFound,
            K::NotADirectory => ErrorCode::NotADirectory,
            K::IsADirectory => ErrorCode::IsADirectory,
            K::AlreadyExists => ErrorCode::AlreadyExists,
            K::PermissionDenied | K::ReadOnlyFilesystem => ErrorCode::PermissionDenied,
            K::DirectoryNotEmpty => ErrorCode::DirectoryNotEmpty,
            K::FileTooLarge => ErrorCode::TooLarge,
            _ => ErrorCode::Io,
        };
        Self::new(code, format!("{what} {}: {err}", path.display())).with_source(err)
    }

    /// Sets the typed reason (shown in front of the message).
    #[must_use]
    pub fn with_reason(mut self, reason: ErrorReason) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Names the provider that raised the error.
    #[must_use]
    pub fn with_provider(mut self, provider: impl Into<Cow<'static, str>>) -> Self {
        self.provider = provider.into();
        self
    }

    /// Names the seam operation that failed.
    #[must_use]
    pub fn with_operation(mut self, operation: impl Into<Cow<'static, str>>) -> Self {
        self.operation = operation.into();
        self
    }

    /// Adds a key/value fact (shown after the message).
    #[must_use]
    pub fn with_context(
        mut self,
        key: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Self {
        self.context.push((key.into(), value.into()));
        self
    }

    /// Attaches the underlying cause.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Prefixes the message with where it happened (`bad.yaml: ...`), keeping everything else.
    #[must_use]
    pub fn prefixed(mut self, prefix: impl fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The typed reason, when the code alone does not say which case this is.
    pub fn reason(&self) -> Option<ErrorReason> {
        self.reason
    }

    /// The human message without reason or context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The provider that raised it ("" when unknown).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The operation that failed ("" when unknown).
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// Extra facts.
    pub fn context(&self) -> &[(Cow<'static, str>, String)] {
        &self.context
    }

    /// Whether an identical retry could succeed: the code says so and no final reason
    /// ([`ErrorReason::is_final`]) rules it out.
    pub fn retryable(&self) -> bool {
        self.code.retryable() && !self.reason.is_some_and(ErrorReason::is_final)
    }

    /// The `{code, message, retryable}` object tools hand to models (plus `reason` when set).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "code": self.code.as_str(),
            "message": self.to_string(),
            "retryable": self.retryable(),
        });
        if let Some(r) = self.reason {
            v["reason"] = serde_json::Value::from(r.as_str());
        }
        v
    }

    /// The wire form: every field as owned data (the source becomes part of nothing; its
    /// text is already in the message where it matters).
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code,
            reason: self.reason,
            message: self.message.clone(),
            provider: self.provider.to_string(),
            operation: self.operation.to_string(),
            context: self.context.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            retryable: self.retryable(),
        }
    }

    /// Rebuilds an error from its wire form.
    pub fn from_body(body: ErrorBody) -> Self {
        Self {
            code: body.code,
            reason: body.reason,
            message: body.message,
            provider: Cow::Owned(body.provider),
            operation: Cow::Owned(body.operation),
            context: body.context.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect(),
            source: None,
        }
    }
}

/// An [`Error`] as plain owned data, for carrying it across a process or network boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ErrorBody {
    /// The stable code.
    pub code: ErrorCode,
    /// The typed reason, if any.
    #[cfg_attr(feature = "serde", serde(default))]
    pub reason: Option<ErrorReason>,
    /// The message without reason or context.
    pub message: String,
    /// The provider that raised it.
    #[cfg_attr(feature = "serde", serde(default))]
    pub provider: String,
    /// The operation that failed.
    #[cfg_attr(feature = "serde", serde(default))]
    pub operation: String,
    /// Extra facts, in order.
    #[cfg_attr(feature = "serde", serde(default))]
    pub context: Vec<(String, String)>,
    /// Informational on the wire; the receiver recomputes it from the code and reason.
    #[cfg_attr(feature = "serde", serde(default))]
    pub retryable: bool,
}

#[cfg(feature = "serde")]
macro_rules! serde_by_name {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

#[cfg(feature = "serde")]
serde_by_name!(ErrorCode);
#[cfg(feature = "serde")]
serde_by_name!(ErrorReason);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = self.reason {
            write!(f, "{r}: ")?;
        }
        f.write_str(&self.message)?;
        for (k, v) in &self.context {
            write!(f, "; {k}: {v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Result alias for seam operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
