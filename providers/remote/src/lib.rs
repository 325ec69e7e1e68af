//! The remote substrate: `conch sandboxd` ([`server`]) hosts a local subprocess provider's
//! world over RXP/1 ([`proto`], `docs/protocol.md`), and the `remote-sandbox` provider
//! ([`client`]) implements the subprocess seam against it, so every consumer above the seam
//! runs unchanged on a remote machine.
//!
//! `server/` is `conch sandboxd`; `client/` is the `remote-sandbox` provider. `tests/it/remote.rs`
//! runs all four conformance suites over `remote-sandbox` against an in-process daemon;
//! `tests/it/remote/` holds the daemon's promises, fault injection, client error paths (wiremock)
//! and security tests.

pub mod client;
pub mod proto;
pub mod server;
