//! Daemon promises.
