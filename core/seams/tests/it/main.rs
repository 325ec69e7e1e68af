//! The seams' public vocabulary from outside the crate: pinned error codes, reasons and signal
//! names, and (with the `serde` feature) the wire forms round-tripping through JSON.

mod error;
mod signal;
#[cfg(feature = "serde")]
mod wire;
