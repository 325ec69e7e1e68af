//! The frame markers a persistent shell prints around a framed command, whatever its dialect,
//! and that the terminal backend scans for. Each is a line of its own:
//!
//! - start: `__CONCH_PB_START_<nonce>__`, printed just before the command runs;
//! - end: `__CONCH_PB_END_<nonce>:<status>__`, with `:e` after the status when bash's errexit
//!   emulation stopped the line;
//! - fresh: `__CONCH_PB_FRESH_<session nonce>__`, printed by the first prompt of a bash that
//!   replaced the shell (`exec bash`);
//! - exit: `__CONCH_PB_EXIT_<session nonce>__`, the last words of an exiting bash;
//! - state: `__CONCH_PB_STATE_<nonce>:<kind>:<script>__`, printed by bash after a frame's end
//!   marker when the shell's state changed: `<script>` is one shell word (`printf %q`) that
//!   restores the exported variables and the working directory (kind `x`), or the working
//!   directory alone (kind `c`: the exports could not be read, or were too large).
//!
//! The shells print them from pieces, so the echo of a typed line never holds a whole marker.

/// Prefix of every frame marker.
pub const TAG: &str = "__CONCH_PB";

/// What follows an end marker's status when bash's errexit emulation stopped the line.
pub const ERREXIT: &str = ":e";

/// What closes a marker (after an end marker's status).
pub const CLOSE: &str = "__";

/// The start marker of frame `nonce`, with the newline that ends it.
pub fn start(nonce: &str) -> String {
    format!("{TAG}_START_{nonce}{CLOSE}\n")
}

/// The end marker of frame `nonce` up to its status, with the newline before it.
pub fn end(nonce: &str) -> String {
    format!("\n{TAG}_END_{nonce}:")
}

/// What the first prompt of a new shell of session `session_nonce` prints, whole.
pub fn fresh(session_nonce: &str) -> String {
    format!("\n{TAG}_FRESH_{session_nonce}{CLOSE}\n")
}

/// What an exiting framed shell of session `session_nonce` prints last, whole.
pub fn exit(session_nonce: &str) -> String {
    format!("\n{TAG}_EXIT_{session_nonce}{CLOSE}\n")
}

/// The state marker after frame `nonce`'s end, up to its kind; the line ends at the next
/// newline, whose `__` closes it.
pub fn state(nonce: &str) -> String {
    format!("\n{TAG}_STATE_{nonce}:")
}
