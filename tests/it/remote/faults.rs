//! Fault injection.
