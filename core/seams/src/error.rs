//! The one public error type every seam returns, with stable, append-only codes.

use std::fmt;

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
        }
    }

    /// Whether an identical retry could succeed later.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::Timeout | ErrorCode::ConnectionFailed | ErrorCode::LimitExceeded)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A seam error: a stable code, a lowercase message, where it came from and extra context.
#[derive(Debug)]
pub struct Error {
    code: ErrorCode,
    message: String,
    provider: &'static str,
    operation: &'static str,
    context: Vec<(&'static str, String)>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// A new error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            provider: "",
            operation: "",
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

    /// Names the provider that raised the error.
    #[must_use]
    pub fn with_provider(mut self, provider: &'static str) -> Self {
        self.provider = provider;
        self
    }

    /// Names the seam operation that failed.
    #[must_use]
    pub fn with_operation(mut self, operation: &'static str) -> Self {
        self.operation = operation;
        self
    }

    /// Adds a key/value fact (shown after the message).
    #[must_use]
    pub fn with_context(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.context.push((key, value.into()));
        self
    }

    /// Attaches the underlying cause.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The human message without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The provider that raised it ("" when unknown).
    pub fn provider(&self) -> &'static str {
        self.provider
    }

    /// The operation that failed ("" when unknown).
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// Extra facts.
    pub fn context(&self) -> &[(&'static str, String)] {
        &self.context
    }

    /// Whether an identical retry could succeed.
    pub fn retryable(&self) -> bool {
        self.code.retryable()
    }

    /// The `{code, message, retryable}` object tools hand to models.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "code": self.code.as_str(),
            "message": self.to_string(),
            "retryable": self.retryable(),
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_pinned_string() {
        let pinned = [
            "invalid_composition",
            "provider_not_found",
            "duplicate_provider",
            "seam_unbound",
            "unsupported",
            "invalid_argument",
            "not_found",
            "already_exists",
            "permission_denied",
            "sandbox_denied",
            "spawn_failed",
            "timeout",
            "cancelled",
            "connection_failed",
            "protocol",
            "io",
            "internal",
            "foreign_owner",
            "limit_exceeded",
            "disposing",
        ];
        let got: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(got, pinned);
    }

    #[test]
    fn display_appends_context() {
        let e = Error::invalid("bad workdir").with_context("path", "/nope");
        assert_eq!(e.to_string(), "bad workdir; path: /nope");
        assert_eq!(e.to_json()["code"], "invalid_argument");
    }
}
