//! The seams' public vocabulary from outside the crate: pinned signal names, and (with the
//! `serde` feature) the wire forms round-tripping through JSON.

mod signal;
#[cfg(feature = "serde")]
mod wire;
