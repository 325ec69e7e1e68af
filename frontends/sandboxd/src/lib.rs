//! `conch sandboxd`, the daemon front end: it hosts one subprocess provider's world (and the
//! composition's files provider, when it has one) for remote clients. [`rxp`] serves it over
//! RXP/1 (the wire types are `conch_provider_remote_proto`, the prose `docs/protocol.md`) to
//! the `remote-sandbox` and `files-remote` providers; [`Args`] are the command's flags,
//! checked by [`Args::check`] before the binary builds the composition, and [`run`] serves
//! the providers the binary hands over.
//!
//! The daemon links no HTTP client (reqwest stays in the `remote-sandbox` provider), and that
//! provider no HTTP server: `tests/it/tidy.rs` checks both.

mod cli;
pub mod rxp;

pub use cli::{Args, DaemonError, Listen, run};
