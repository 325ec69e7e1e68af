//! Reading a framed command back: a scanner that finds one frame's
//! [`markers`](conch_dialect::markers) in the parsed output stream and counts the command's
//! output between them, and [`extract`], which cuts that output out of a retained tail. What
//! each dialect types and prints around a command is its framing in `conch_dialect` (bash:
//! `conch_dialect::bash`, pwsh: `conch_dialect::pwsh`).

use conch_dialect::markers::{self, CLOSE, ERREXIT};

/// Finds one frame's markers in parsed output (newlines already normalised to `\n`) fed in
/// arbitrary pieces, and counts the bytes of the command's output between them exactly.
#[derive(Debug)]
pub(crate) struct FrameScanner {
    start: String,
    end: String,
    /// The marker the first prompt of a new shell prints (`exec bash` replaced the shell).
    fresh: String,
    /// The marker the shell prints last when it exits.
    exit: String,
    /// Unmatched text that could still be the beginning of the marker being looked for.
    window: String,
    /// Bytes of command output seen after the start marker (end marker excluded).
    body_bytes: u64,
    started: bool,
    code: Option<i32>,
    /// The errexit emulation stopped the line (bash then printed one newline of its own).
    errexit: bool,
    /// The frame ended because the command replaced the shell (`exec bash`).
    replaced: bool,
    /// The shell printed its exit marker: every byte it wrote is in.
    exited: bool,
    /// The state marker's beginning (see [`markers::state`]).
    state_prefix: String,
    /// Text after the end marker that may hold the state marker.
    after_end: String,
    /// The state marker's kind and script, once it came whole.
    state: Option<(bool, String)>,
}

impl FrameScanner {
    /// A scanner for the frame `nonce` of the session whose fresh-shell marker carries
    /// `session_nonce`.
    pub(crate) fn new(nonce: &str, session_nonce: &str) -> Self {
        Self {
            start: markers::start(nonce),
            end: markers::end(nonce),
            fresh: markers::fresh(session_nonce),
            exit: markers::exit(session_nonce),
            window: String::new(),
            body_bytes: 0,
            started: false,
            code: None,
            errexit: false,
            replaced: false,
            exited: false,
            state_prefix: markers::state(nonce),
            after_end: String::new(),
            state: None,
        }
    }

    /// The state the shell reported after the end marker: whether it holds the exports, and
    /// the script that restores it (see [`markers::state`]).
    pub(crate) fn take_state(&mut self) -> Option<(bool, String)> {
        self.state.take()
    }

    /// Looks for the state marker in text after the end marker. It is the shell's next line
    /// when it comes at all, so what cannot begin it is dropped.
    fn scan_state(&mut self, text: &str) {
        if self.state.is_some() {
            return;
        }
        self.after_end.push_str(text);
        let Some(i) = self.after_end.find(&self.state_prefix) else {
            let keep = tail_len(&self.after_end, self.state_prefix.len().saturating_sub(1));
            self.after_end.drain(..self.after_end.len() - keep);
            return;
        };
        let line = &self.after_end[i + self.state_prefix.len()..];
        let Some(end) = line.find('\n') else {
            // A marker that outgrew what the shell ever prints is not the shell's.
            if line.len() > conch_dialect::bash::STATE_MAX + 64 {
                self.after_end.clear();
            }
            return;
        };
        let parsed = line[..end].strip_suffix(CLOSE).and_then(|l| l.split_once(':')).and_then(
            |(kind, script)| {
                let exports = match kind {
                    "x" => true,
                    "c" => false,
                    _ => return None,
                };
                // One shell word, typed back as part of a line: nothing may end or break it.
                let clean = !script.is_empty() && !script.chars().any(char::is_control);
                clean.then(|| (exports, script.to_string()))
            },
        );
        self.state = parsed;
        self.after_end.clear();
    }

    /// True once the exiting shell's last words (its exit marker) arrived.
    pub(crate) fn shell_exited(&self) -> bool {
        self.exited
    }

    /// True when the frame ended because the command replaced the shell with a new one
    /// (which needs `conch_dialect::bash::INIT` again before its first frame).
    pub(crate) fn replaced_shell(&self) -> bool {
        self.replaced
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

    /// True when the errexit emulation ended the command.
    pub(crate) fn stopped_by_errexit(&self) -> bool {
        self.errexit
    }

    /// True once the start marker arrived (the command began printing).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Ends the scan: every byte after the start marker, up to the end marker when it came,
    /// including text held back in case it began a marker.
    pub(crate) fn finish(self) -> u64 {
        if self.started && self.code.is_none() && !self.exited {
            self.body_bytes + self.window.len() as u64
        } else {
            self.body_bytes
        }
    }

    /// Feeds parsed text.
    pub(crate) fn push(&mut self, text: &str) {
        if self.exited || self.replaced {
            return;
        }
        if self.code.is_some() {
            self.scan_state(text);
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
            if let Some(k) = after.find(CLOSE) {
                let status = &after[..k];
                let (code, errexit) = match status.strip_suffix(ERREXIT) {
                    Some(c) => (c, true),
                    None => (status, false),
                };
                self.body_bytes += j as u64;
                self.code = Some(code.trim().parse().unwrap_or(-1));
                self.errexit = errexit;
                if errexit && self.body_bytes > 0 {
                    // The newline bash prints when it abandons the line is not output.
                    self.body_bytes -= 1;
                }
                let rest = after[k + CLOSE.len()..].to_string();
                self.window.clear();
                self.scan_state(&rest);
            }
            return;
        }
        if let Some(j) = self.window.find(&self.exit) {
            // The shell exited (its status comes from the process, not a marker).
            self.body_bytes += j as u64;
            self.exited = true;
            self.window.clear();
            return;
        }
        if let Some(j) = self.window.find(&self.fresh) {
            // A new shell's first prompt: the command replaced the shell (`exec bash`), which
            // never reports a status; the exec itself succeeded.
            self.body_bytes += j as u64;
            self.code = Some(0);
            self.replaced = true;
            self.window.clear();
            return;
        }
        // Everything but a possible start of a marker is command output.
        let longest = self.end.len().max(self.fresh.len()).max(self.exit.len());
        let keep = self.possible_prefix_len(longest);
        let done = self.window.len() - keep;
        self.body_bytes += done as u64;
        self.window.drain(..done);
    }

    /// Length of the longest tail of the window that is shorter than `marker_len` and sits
    /// on a char boundary: the only part that could still begin a marker.
    fn possible_prefix_len(&self, marker_len: usize) -> usize {
        tail_len(&self.window, marker_len.saturating_sub(1))
    }

    fn keep_possible_prefix(&mut self, marker_len: usize) {
        let keep = self.possible_prefix_len(marker_len);
        let cut = self.window.len() - keep;
        self.window.drain(..cut);
    }
}

/// Length of the longest tail of `text` of at most `max` bytes that starts on a char
/// boundary.
fn tail_len(text: &str, max: usize) -> usize {
    let mut keep = text.len().min(max);
    while !text.is_char_boundary(text.len() - keep) {
        keep -= 1;
    }
    keep
}

/// The command's output inside `retained` (the tail of everything the command's line
/// produced): after the start marker when it is still there, up to the end marker when it
/// arrived. `started` says the scanner saw the start marker go by, so a tail that lost it
/// is still all command output.
pub(crate) fn extract<'a>(
    retained: &'a str,
    nonce: &str,
    session_nonce: &str,
    started: bool,
    errexit: bool,
) -> &'a str {
    let start = markers::start(nonce);
    // A replaced shell ends the frame with its fresh marker instead, an exiting one with its
    // exit marker.
    let end = [markers::end(nonce), markers::fresh(session_nonce), markers::exit(session_nonce)]
        .into_iter()
        .find(|m| retained.contains(m.as_str()))
        .unwrap_or_else(|| markers::end(nonce));
    let body = match retained.find(&start) {
        Some(i) => &retained[i + start.len()..],
        // The tail can lose the start marker under long output; what is left is output.
        None if started || retained.contains(&end) => retained,
        // The command never started printing: the text is the echoed line.
        None => return "",
    };
    match body.find(&end) {
        // After the errexit emulation (or an interrupt) stopped the line, bash printed one
        // newline itself.
        Some(j) if errexit => body[..j].strip_suffix('\n').unwrap_or(&body[..j]),
        Some(j) => &body[..j],
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use conch_dialect::bash::frame;
    use conch_dialect::markers::TAG;
    use conch_dialect::pwsh::frame as pwsh_frame;

    use super::*;

    #[test]
    fn the_state_after_the_end_marker_is_read_in_any_pieces_and_checked() {
        let stream = "\n__CONCH_PB_START_n__\nout\n\n__CONCH_PB_END_n:0__\n\n__CONCH_PB_STATE_n:x:$'declare -x A=\"1\"\\nbuiltin cd -- /t'__\n$ ";
        for cut in 1..stream.len() {
            let mut s = FrameScanner::new("n", "sn");
            s.push(&stream[..cut]);
            s.push(&stream[cut..]);
            assert_eq!(s.code(), Some(0), "cut at {cut}");
            let want = "$'declare -x A=\"1\"\\nbuiltin cd -- /t'".to_string();
            assert_eq!(s.take_state(), Some((true, want)), "cut at {cut}");
        }
        // Another frame's state, an unknown kind, or a control character is no state.
        for bad in [
            "\n__CONCH_PB_STATE_m:x:a__\n",
            "\n__CONCH_PB_STATE_n:q:a__\n",
            "\n__CONCH_PB_STATE_n:c:a\x1bb__\n",
        ] {
            let mut s = FrameScanner::new("n", "sn");
            s.push("\n__CONCH_PB_START_n__\n\n__CONCH_PB_END_n:0__\n");
            s.push(bad);
            assert_eq!(s.take_state(), None, "{bad:?}");
        }
    }

    #[test]
    fn the_scanner_finds_markers_split_anywhere_and_counts_the_body() {
        let stream = format!(
            "$ {}\n\n{TAG}_START_n1__\nhéllo\nworld\n\n{TAG}_END_n1:3__\n$ ",
            frame("x", "n1", false, None)
        );
        for piece in 1..stream.len() {
            let mut s = FrameScanner::new("n1", "sn");
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
    fn an_errexit_stop_is_flagged_and_bashs_newline_is_not_output() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nstep1\n\n\n{TAG}_END_n:1:e__\n"));
        assert_eq!((s.code(), s.stopped_by_errexit()), (Some(1), true));
        assert_eq!(s.body_bytes(), "step1\n".len() as u64);
        let text = format!("{TAG}_START_n__\nstep1\n\n\n{TAG}_END_n:1:e__\n# ");
        assert_eq!(extract(&text, "n", "sn", true, true), "step1\n");
    }

    #[test]
    fn a_replaced_or_exiting_shell_ends_the_frame_with_its_own_marker() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nexit\n[stopped]\n\n{TAG}_EXIT_s"));
        assert!(!s.shell_exited(), "the marker is not whole yet");
        s.push("n__\n");
        assert!(s.shell_exited() && s.code().is_none());
        assert_eq!(s.finish(), "exit\n[stopped]\n".len() as u64);
        let text = format!("{TAG}_START_n__\nexit\n\n{TAG}_EXIT_sn__\n");
        assert_eq!(extract(&text, "n", "sn", true, false), "exit\n");
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n\n{TAG}_FRESH_sn__\n"));
        assert_eq!((s.code(), s.replaced_shell()), (Some(0), true));
        // Another session's markers are output.
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n\n{TAG}_FRESH_other__\n"));
        assert_eq!(s.code(), None);
    }

    #[test]
    fn the_scanner_waits_for_the_whole_status() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nout\n{TAG}_END_n:12"));
        assert_eq!(s.code(), None, "12 may continue");
        s.push("7__\n");
        assert_eq!(s.code(), Some(127));
    }

    #[test]
    fn extract_returns_output_between_markers() {
        let acc = format!(
            "# {}\n\n{TAG}_START_n1__\nhello\n\n{TAG}_END_n1:3__\n# ",
            frame("x", "n1", false, None)
        );
        assert_eq!(extract(&acc, "n1", "sn", true, false), "hello\n");
        let cut = format!("99\n100\n\n{TAG}_END_n1:0__\n# ");
        assert_eq!(extract(&cut, "n1", "sn", true, false), "99\n100\n");
        let partial = format!("\n{TAG}_START_n1__\nName? ");
        assert_eq!(extract(&partial, "n1", "sn", true, false), "Name? ");
        assert_eq!(extract("echoed line only", "n1", "sn", false, false), "");
        // A timed-out command whose tail lost the start marker still returns that tail.
        assert_eq!(extract("99998\n99999\n", "n1", "sn", true, false), "99998\n99999\n");
    }

    /// Feeds `chunks` through a pwsh session's parser (answering cursor requests) into a
    /// frame scanner, as the session does; returns the text, the answers and the markers.
    fn pwsh_session(
        nonce: &str,
        chunks: &[&[u8]],
    ) -> (FrameScanner, String, Vec<(u16, u16)>, usize) {
        use crate::parser::{Event, Parser};
        let mut parser = Parser::new("7770;abc").answering(24, 200);
        let mut scanner = FrameScanner::new(nonce, "sn");
        let (mut text, mut queries, mut markers) = (String::new(), Vec::new(), 0);
        for chunk in chunks {
            for ev in parser.feed(chunk) {
                match ev {
                    Event::Text(t) => {
                        scanner.push(&t);
                        text.push_str(&t);
                    }
                    Event::Marker => markers += 1,
                    Event::CursorQuery { row, col } => queries.push((row, col)),
                }
            }
        }
        (scanner, text, queries, markers)
    }

    // PowerShell 7 output on a PTY as the pwsh dialect's session receives it, written from
    // its documented behaviour (pwsh is not installed where these tests were written):
    // .NET asks for the cursor (`ESC [6n`) before the prompt, the host turns cursor keys to
    // application mode (`ESC [?1h`) after it, every line ends CRLF (the tty's ONLCR), the
    // typed line comes back as .NET's echo, and `__conch_f` and `prompt` print the markers.
    const STARTUP: &[u8] = b"\x1b[6n\x1b]7770;abc\x07PS> \x1b[?1h";

    #[test]
    fn pwsh_output_samples_frame_and_answer_like_a_terminal() {
        let echo = format!("{}\r\n", pwsh_frame("echo hi", "n1"));
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            echo.as_bytes(),
            b"\r\n__CONCH_PB_START_n1__\r\nhi\r\n",
            b"\x1b[6n\r\n__CONCH_PB_END_n1:0__\r",
            b"\n\x1b]7770;abc\x07PS> \x1b[?1h",
        ];
        let (scanner, text, queries, markers) = pwsh_session("n1", &chunks);
        assert_eq!(scanner.code(), Some(0));
        assert_eq!(markers, 2, "the startup prompt and the one after the command");
        assert_eq!(queries, [(1, 1), (5, 1)], "asked at column 1 both times: {text:?}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert_eq!(extract(&text, "n1", "sn", scanner.started(), false), "hi\n");
        assert_eq!(scanner.finish(), 3);
    }

    #[test]
    fn pwsh_samples_of_a_failure_and_of_output_without_a_final_newline() {
        // A native command failing with 3, its error split across reads inside a CRLF.
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            b" . __conch_f 'n2' 'bHMgL25vcGU='\r\n\r\n__CONCH_PB_START_n2__\r\nls: cannot access '/nope': No such file or directory\r",
            b"\n\x1b[6n\r\n__CONCH_PB_END_n2:3__\r\n\x1b]7770;abc\x07PS> ",
        ];
        let (scanner, text, queries, _) = pwsh_session("n2", &chunks);
        assert_eq!(scanner.code(), Some(3));
        assert_eq!(
            extract(&text, "n2", "sn", true, false),
            "ls: cannot access '/nope': No such file or directory\n"
        );
        assert_eq!(queries.len(), 2);
        // `Write-Host -NoNewline hi`: the cursor is not at column 1, so the host writes a
        // line break before the prompt, and the body keeps it.
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            b" . __conch_f 'n3' 'eA=='\r\n\r\n__CONCH_PB_START_n3__\r\nhi\x1b[6n",
            b"\r\n\r\n__CONCH_PB_END_n3:0__\r\n\x1b]7770;abc\x07PS> ",
        ];
        let (scanner, text, queries, _) = pwsh_session("n3", &chunks);
        assert_eq!(queries.last(), Some(&(4, 3)), "after `hi`: column 3");
        assert_eq!((scanner.code(), extract(&text, "n3", "sn", true, false)), (Some(0), "hi\n"));
    }

    #[test]
    fn finish_counts_what_the_window_held_back() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n"));
        s.push(&"x".repeat(100));
        assert!(s.body_bytes() < 100, "a possible marker start is held back");
        assert_eq!(s.finish(), 100, "an unfinished frame counts every byte after the start");
    }
}
