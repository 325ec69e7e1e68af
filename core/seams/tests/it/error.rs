//! The error vocabulary from outside the crate: pinned code and reason strings (append-only),
//! and the lossless round trip through an error body.

use conch_seams::{Error, ErrorCode, ErrorReason};

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
        "unauthenticated",
        "remote_unavailable",
        "sandbox_unavailable",
        "not_a_directory",
        "is_a_directory",
        "too_large",
        "directory_not_empty",
    ];
    let got: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(got, pinned);
}

#[test]
fn every_reason_has_a_pinned_string() {
    let got: Vec<&str> = ErrorReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        got,
        [
            "NO_SESSION",
            "FOREIGN_SESSION",
            "DUPLICATE_NAME",
            "SEND_ACTIVE",
            "OWNER_NOT_LIVE",
            "SERVICE_DISPOSING",
            "NO_BACKEND",
            "BAD_NAME",
            "SESSION_EXITED",
            "BOOT_CHANGED",
            "MISSING_WORKDIR",
            "MISSING_PROGRAM",
            "WORKDIR_NOT_A_DIRECTORY",
            "REMOTE_GONE"
        ]
    );
    for r in ErrorReason::ALL {
        assert_eq!(r.as_str().parse::<ErrorReason>().unwrap(), *r);
    }
    for c in ErrorCode::ALL {
        assert_eq!(c.as_str().parse::<ErrorCode>().unwrap(), *c);
    }
    assert_eq!("nope".parse::<ErrorCode>().unwrap_err().code(), ErrorCode::Protocol);
}

#[test]
fn the_reason_is_typed_and_shown_in_front_of_the_message() {
    let e = Error::new(ErrorCode::NotFound, "no terminal session `x`")
        .with_reason(ErrorReason::NoSession);
    assert_eq!(e.reason(), Some(ErrorReason::NoSession));
    assert_eq!(e.message(), "no terminal session `x`");
    assert_eq!(e.to_string(), "NO_SESSION: no terminal session `x`");
    assert_eq!(e.to_json()["reason"], "NO_SESSION");
}

#[test]
fn a_body_rebuilds_the_same_error() {
    let e = Error::new(ErrorCode::SpawnFailed, "command not found: `x`")
        .with_provider(String::from("remote-sandbox"))
        .with_operation("spawn")
        .with_context("path", "/nope")
        .with_reason(ErrorReason::BadName);
    let back = Error::from_body(e.to_body());
    assert_eq!(back.to_body(), e.to_body());
    assert_eq!(back.to_string(), e.to_string());
    assert_eq!(back.provider(), "remote-sandbox");
}

#[test]
fn a_final_reason_makes_a_retryable_code_not_retryable() {
    let silent = Error::new(ErrorCode::RemoteUnavailable, "no answer");
    assert!(silent.retryable());
    for r in [ErrorReason::BootChanged, ErrorReason::RemoteGone] {
        let e = Error::new(ErrorCode::RemoteUnavailable, "gone").with_reason(r);
        assert!(!e.retryable(), "{r}");
        assert_eq!(e.to_json()["retryable"], false);
        assert!(!e.to_body().retryable);
    }
}

#[test]
fn display_appends_context() {
    let e = Error::invalid("bad workdir").with_context("path", "/nope");
    assert_eq!(e.to_string(), "bad workdir; path: /nope");
    assert_eq!(e.to_json()["code"], "invalid_argument");
}
