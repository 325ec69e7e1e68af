//! Command framing in the bash dialect: one typed line that runs a command between private
//! start/end markers, so only the command's own output and its status come back, and a
//! scanner that finds those markers in the parsed output stream.
//!
//! The markers are printed with `%s` pieces, so the echoed command line itself never holds a
//! complete marker; `eval` keeps state changes (cd, export, functions) in the shell while
//! stdin stays the terminal. The command travels base64-encoded, so no quoting of its text
//! can break the frame.

/// Prefix of every frame marker.
const TAG: &str = "__CONCH_PB";

/// Standard base64 (RFC 4648) of `data`, padded.
fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The single line typed into the shell for `command` under `nonce`.
pub(crate) fn frame(command: &str, nonce: &str) -> String {
    format!(
        " printf '\\n%s_START_%s__\\n' {TAG} {nonce}; eval \"$(printf %s '{}' | base64 -d)\"; __conch_rc=$?; printf '\\n%s_END_%s:%s__\\n' {TAG} {nonce} \"$__conch_rc\"",
        b64(command.as_bytes())
    )
}

/// Finds one frame's markers in parsed output (newlines already normalised to `\n`) fed in
/// arbitrary pieces, and counts the bytes of the command's output between them exactly.
#[derive(Debug)]
pub(crate) struct FrameScanner {
    start: String,
    end: String,
    /// Unmatched text that could still be the beginning of the marker being looked for.
    window: String,
    /// Bytes of command output seen after the start marker (end marker excluded).
    body_bytes: u64,
    started: bool,
    code: Option<i32>,
}

impl FrameScanner {
    pub(crate) fn new(nonce: &str) -> Self {
        Self {
            start: format!("{TAG}_START_{nonce}__\n"),
            end: format!("\n{TAG}_END_{nonce}:"),
            window: String::new(),
            body_bytes: 0,
            started: false,
            code: None,
        }
    }

    /// The exit status, once the end marker (with its status) arrived.
    pub(crate) fn code(&self) -> Option<i32> {
        self.code
    }

    /// Bytes of command output between the markers so far (what the window still holds
    /// back is counted by [`FrameScanner::finish`]).
    #[cfg(test)]
    pub(crate) fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// True once the start marker arrived (the command began printing).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Ends the scan: every byte after the start marker, up to the end marker when it came,
    /// including text held back in case it began a marker.
    pub(crate) fn finish(self) -> u64 {
        if self.started && self.code.is_none() {
            self.body_bytes + self.window.len() as u64
        } else {
            self.body_bytes
        }
    }

    /// Feeds parsed text.
    pub(crate) fn push(&mut self, text: &str) {
        if self.code.is_some() {
            return;
        }
        self.window.push_str(text);
        if !self.started {
            match self.window.find(&self.start) {
                Some(i) => {
                    self.window.drain(..i + self.start.len());
                    self.started = true;
                }
                None => {
                    self.keep_possible_prefix(self.start.len());
                    return;
                }
            }
        }
        if let Some(j) = self.window.find(&self.end) {
            let after = &self.window[j + self.end.len()..];
            // The status is complete once its closing `__` arrived.
            if let Some(k) = after.find("__") {
                self.body_bytes += j as u64;
                self.code = Some(after[..k].trim().parse().unwrap_or(-1));
                self.window.clear();
            }
            return;
        }
        // Everything but a possible start of the end marker is command output.
        let keep = self.possible_prefix_len(self.end.len());
        let done = self.window.len() - keep;
        self.body_bytes += done as u64;
        self.window.drain(..done);
    }

    /// Length of the longest tail of the window that is shorter than `marker_len` and sits
    /// on a char boundary: the only part that could still begin a marker.
    fn possible_prefix_len(&self, marker_len: usize) -> usize {
        let mut keep = self.window.len().min(marker_len.saturating_sub(1));
        while !self.window.is_char_boundary(self.window.len() - keep) {
            keep -= 1;
        }
        keep
    }

    fn keep_possible_prefix(&mut self, marker_len: usize) {
        let keep = self.possible_prefix_len(marker_len);
        let cut = self.window.len() - keep;
        self.window.drain(..cut);
    }
}

/// The command's output inside `retained` (the tail of everything the command's line
/// produced): after the start marker when it is still there, up to the end marker when it
/// arrived. `started` says the scanner saw the start marker go by, so a tail that lost it
/// is still all command output.
pub(crate) fn extract<'a>(retained: &'a str, nonce: &str, started: bool) -> &'a str {
    let start = format!("{TAG}_START_{nonce}__\n");
    let end = format!("\n{TAG}_END_{nonce}:");
    let body = match retained.find(&start) {
        Some(i) => &retained[i + start.len()..],
        // The tail can lose the start marker under long output; what is left is output.
        None if started || retained.contains(&end) => retained,
        // The command never started printing: the text is the echoed line.
        None => return "",
    };
    match body.find(&end) {
        Some(j) => &body[..j],
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn the_echoed_frame_never_contains_a_whole_marker() {
        let w = frame("echo hi", "abc");
        assert!(!w.contains("__CONCH_PB_START_abc__"));
        assert!(!w.contains("__CONCH_PB_END_abc:"));
    }

    #[test]
    fn the_scanner_finds_markers_split_anywhere_and_counts_the_body() {
        let stream = format!(
            "$ {}\n\n{TAG}_START_n1__\nhéllo\nworld\n\n{TAG}_END_n1:3__\n$ ",
            frame("x", "n1")
        );
        for piece in 1..stream.len() {
            let mut s = FrameScanner::new("n1");
            let mut rest = stream.as_str();
            while !rest.is_empty() {
                let mut cut = piece.min(rest.len());
                while !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                s.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            assert_eq!(s.code(), Some(3), "pieces of {piece}");
            assert_eq!(s.body_bytes(), "héllo\nworld\n".len() as u64, "pieces of {piece}");
        }
    }

    #[test]
    fn the_scanner_waits_for_the_whole_status() {
        let mut s = FrameScanner::new("n");
        s.push(&format!("{TAG}_START_n__\nout\n{TAG}_END_n:12"));
        assert_eq!(s.code(), None, "12 may continue");
        s.push("7__\n");
        assert_eq!(s.code(), Some(127));
    }

    #[test]
    fn extract_returns_output_between_markers() {
        let acc =
            format!("# {}\n\n{TAG}_START_n1__\nhello\n\n{TAG}_END_n1:3__\n# ", frame("x", "n1"));
        assert_eq!(extract(&acc, "n1", true), "hello\n");
        let cut = format!("99\n100\n\n{TAG}_END_n1:0__\n# ");
        assert_eq!(extract(&cut, "n1", true), "99\n100\n");
        let partial = format!("\n{TAG}_START_n1__\nName? ");
        assert_eq!(extract(&partial, "n1", true), "Name? ");
        assert_eq!(extract("echoed line only", "n1", false), "");
        // A timed-out command whose tail lost the start marker still returns that tail.
        assert_eq!(extract("99998\n99999\n", "n1", true), "99998\n99999\n");
    }

    #[test]
    fn finish_counts_what_the_window_held_back() {
        let mut s = FrameScanner::new("n");
        s.push(&format!("{TAG}_START_n__\n"));
        s.push(&"x".repeat(100));
        assert!(s.body_bytes() < 100, "a possible marker start is held back");
        assert_eq!(s.finish(), 100, "an unfinished frame counts every byte after the start");
    }
}
