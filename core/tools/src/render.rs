//! The exit markers every shell tool renders, whatever its dialect, and the parser that
//! recovers a command's exit status from a rendered result (a replayed transcript holds only
//! the text, so a presentation layer can still show how the command ended).
//!
//! A rendered result is the command's output followed by marker lines, each a whole line
//! in brackets, joined by newlines, with no newline after the last. A clean exit has no
//! status marker. So a status marker counts only in that trailing block: output that
//! happens to print `[exit code: 3]` and then a newline is output, not a status. The one
//! ambiguity left: a command whose output ends, without a final newline, in a line exactly
//! like a marker, and that itself exits 0, reads as that marker.

use conch_seams::ExitStatus;

/// How a rendered command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenderedExit {
    /// It exited with this code (0 when the result shows no status marker).
    Code(i32),
    /// A signal killed it (`SIGTERM`, ...).
    Signal(String),
}

/// The prefixes of every marker line the shell tools write after a command's output.
const MARKERS: &[&str] = &[
    EXIT_CODE,
    SIGNAL,
    TIMED_OUT,
    "[sandbox: ",
    "[ran outside the sandbox",
    "[stopped ",
    "[the shell exited",
    WAITING,
];

const EXIT_CODE: &str = "[exit code: ";
const SIGNAL: &str = "[killed by signal: ";
const TIMED_OUT: &str = "[timed out after ";
const WAITING: &str = "[the command waited for input";

/// The note a result starts with when the `timeout_ms` a call asked for was above the
/// limit and a lower one was used: `[timeout_ms 9999999 is above the limit; used 600000]`.
/// `None` when the call got what it asked for (or asked for nothing).
pub(crate) fn timeout_clamp_note(asked: Option<u64>, used: std::time::Duration) -> Option<String> {
    let used = u64::try_from(used.as_millis()).unwrap_or(u64::MAX);
    asked.filter(|&a| a > used).map(|a| format!("[timeout_ms {a} is above the limit; used {used}]"))
}

/// The marker for a non-zero exit.
pub(crate) fn exit_code_marker(code: i32) -> String {
    format!("{EXIT_CODE}{code}]")
}

/// The marker for a death by signal.
pub(crate) fn signal_marker(signal: &str) -> String {
    format!("{SIGNAL}{signal}]")
}

/// The status marker for `status`, if it needs one (a clean exit has none).
pub(crate) fn status_marker(status: &ExitStatus) -> Option<String> {
    match (&status.signal, status.code) {
        (Some(sig), _) => Some(signal_marker(sig)),
        (None, Some(code)) if code != 0 => Some(exit_code_marker(code)),
        _ => None,
    }
}

fn is_marker(line: &str) -> bool {
    line.ends_with(']') && MARKERS.iter().any(|m| line.starts_with(m))
}

/// Recovers how the command of a rendered shell tool result ended: the status marker of its
/// trailing marker block, or exit 0 when that block has none. `None` when the result says
/// the command did not finish (it timed out without being killed, or waited for input).
pub fn parse_exit_status(rendered: &str) -> Option<RenderedExit> {
    let trailing: Vec<&str> = rendered.rsplit('\n').take_while(|l| is_marker(l)).collect();
    for line in &trailing {
        if let Some(code) = line.strip_prefix(EXIT_CODE).and_then(|r| r.strip_suffix(']')) {
            return code.parse().ok().map(RenderedExit::Code);
        }
        if let Some(sig) = line.strip_prefix(SIGNAL).and_then(|r| r.strip_suffix(']')) {
            return Some(RenderedExit::Signal(sig.to_string()));
        }
    }
    if trailing.iter().any(|l| l.starts_with(TIMED_OUT) || l.starts_with(WAITING)) {
        return None;
    }
    Some(RenderedExit::Code(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_trailing_marker_block_counts() {
        assert_eq!(parse_exit_status("out\n[exit code: 3]"), Some(RenderedExit::Code(3)));
        assert_eq!(parse_exit_status("[exit code: 3]\n"), Some(RenderedExit::Code(0)));
        assert_eq!(parse_exit_status(""), Some(RenderedExit::Code(0)));
        assert_eq!(
            parse_exit_status("[exit code: 3]\nmore output\n"),
            Some(RenderedExit::Code(0)),
            "printed by the command, then more output"
        );
        assert_eq!(
            parse_exit_status("x\n[timed out after 5ms]\n[killed by signal: SIGTERM]"),
            Some(RenderedExit::Signal("SIGTERM".into()))
        );
        assert_eq!(parse_exit_status("x\n[timed out after 5ms; the shell was reset]"), None);
        assert_eq!(parse_exit_status("[exit code: -1]"), Some(RenderedExit::Code(-1)));
    }
}
