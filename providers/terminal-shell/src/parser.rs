//! PTY output parser: strips escape sequences, recognises the private prompt marker,
//! normalises CR/LF, and never splits a UTF-8 code point across reads.
//!
//! It yields two renderings of the same bytes. The event stream ([`Parser::feed`]) is what
//! readiness reads: every printed character in order, a lone CR as a line break, so the
//! prompt marker, the echo of typed text and framing markers are seen as they arrive. The
//! line rendering ([`Parser::take_lines`], [`Parser::live_line`]) is what a person reads:
//! each line as the terminal shows it once the program is done with it, through
//! [`LineEditor`]. It applies what programs use to redraw one line (CR back to the start of
//! the screen row, backspace, erase in line, cursor moves along the row, auto-wrap at the
//! terminal's width) and leaves out what a full-screen program draws on the alternate
//! screen (which a terminal keeps out of its scrollback too). What moves the cursor to
//! other rows (cursor up, absolute positioning) is not followed here: the screen view
//! (`vt100`, in the session) is where such output reads right.
//!
//! It also follows the cursor well enough to answer a cursor position request (`CSI 6 n`)
//! the way a terminal would, for sessions that answer them (see [`Parser::answering`]):
//! the column is the characters printed since the last line break, the row the line breaks
//! seen, within the terminal's size. Cursor movements are not followed (they are dropped
//! like every other sequence), so the answer is exact for text written line by line, which
//! is what a shell asking before its prompt needs.
//!
//! Sequences are bounded: an unterminated one ends at a line break, a new ESC or its length cap, so
//! it cannot swallow what follows. CRLF and UTF-8 are carried across reads.

/// One parsed piece of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Printable text (newlines normalised to `\n`).
    Text(String),
    /// The private prompt marker.
    Marker,
    /// A cursor position request, with the position to answer (1-based row and column).
    CursorQuery {
        /// The cursor's row (1-based, as the terminal reports it).
        row: u16,
        /// The cursor's column (1-based).
        col: u16,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Normal,
    Esc,
    Csi,
    Osc,
    OscEsc,
    Charset,
}

/// Carry state across reads.
#[derive(Debug)]
pub(crate) struct Parser {
    marker: Vec<u8>,
    mode: Mode,
    osc: Vec<u8>,
    /// Bytes inside the current CSI or OSC, to bound it.
    seq_len: usize,
    text: Vec<u8>,
    pending_cr: bool,
    /// Parameter bytes of the current CSI (bounded by [`MAX_CSI`]).
    csi: Vec<u8>,
    /// `Some((rows, cols))` when cursor position requests are answered.
    answer: Option<(u16, u16)>,
    /// 0-based cursor column and row as the printed text left them.
    column: u16,
    row: u16,
    /// The line rendering.
    lines: LineEditor,
    /// Printable bytes not yet handed to `lines` (decoded together, so a code point split
    /// across reads stays whole).
    line_bytes: Vec<u8>,
    /// A full-screen program is on the alternate screen: its drawing is not line output.
    alternate: bool,
}

/// The longest line the line rendering holds before it is cut into a line of its own (an
/// endless line must stay bounded in memory; 1 Mi characters is past what a send returns or
/// the scrollback keeps by default).
const MAX_LIVE_CHARS: usize = 1 << 20;

/// One line as a terminal of a given width shows it while a program writes to it: a cursor
/// that printing advances and overwrites at, CR, backspace, tab, erase in line and cursor
/// moves along the screen row, and deferred auto-wrap (a character in the last column
/// leaves the cursor there until the next one), which is what lets a line editor such as
/// readline redraw a wrapped line with CR. A line feed ends the line.
#[derive(Debug)]
pub(crate) struct LineEditor {
    line: Vec<char>,
    /// Cursor, as an index into `line` (may be past its end: gaps fill with spaces).
    col: usize,
    /// The last thing done was printing a character (so a cursor at a row boundary is the
    /// deferred wrap of the row before it: see [`LineEditor::pending_wrap`]).
    after_print: bool,
    cols: usize,
    /// Finished lines, each ending in `\n`, not yet taken.
    done: String,
}

impl LineEditor {
    fn new(cols: u16) -> Self {
        Self {
            line: Vec::new(),
            col: 0,
            after_print: false,
            cols: usize::from(cols.max(1)),
            done: String::new(),
        }
    }

    /// The last column was just printed: the cursor shows there, the next character wraps.
    /// (Worked out when asked rather than at every character, which would cost a division.)
    fn pending_wrap(&self) -> bool {
        self.after_print && self.col > 0 && self.col.is_multiple_of(self.cols)
    }

    /// Start of the screen row the cursor shows on.
    fn row_start(&self) -> usize {
        if self.pending_wrap() { self.col - self.cols } else { self.col - self.col % self.cols }
    }

    fn print(&mut self, c: char) {
        if self.col == self.line.len() {
            self.line.push(c);
        } else if self.col < self.line.len() {
            self.line[self.col] = c;
        } else {
            self.line.resize(self.col, ' ');
            self.line.push(c);
        }
        self.col += 1;
        self.after_print = true;
        if self.line.len() >= MAX_LIVE_CHARS {
            self.col -= self.line.len().min(self.col);
            self.finish();
        }
    }

    fn cr(&mut self) {
        self.col = self.row_start();
        self.after_print = false;
    }

    fn bs(&mut self) {
        // Like a terminal without reverse-wrap: never back past the row's start.
        if self.pending_wrap() {
            self.col -= 2.min(self.col);
        } else if !self.col.is_multiple_of(self.cols) {
            self.col -= 1;
        }
        self.after_print = false;
    }

    fn tab(&mut self) {
        let start = self.row_start();
        let at = if self.pending_wrap() { self.col - 1 } else { self.col } - start;
        self.col = start + ((at / 8 + 1) * 8).min(self.cols - 1);
        self.after_print = false;
    }

    /// Moves to `col` (0-based) of the cursor's screen row.
    fn move_to_column(&mut self, col: usize) {
        self.col = self.row_start() + col.min(self.cols - 1);
        self.after_print = false;
    }

    /// The cursor's 0-based column within its screen row.
    fn column(&self) -> usize {
        if self.pending_wrap() { self.cols - 1 } else { self.col % self.cols }
    }

    /// Erase in line: 0 to the end of the row, 1 to its start, 2 the whole row.
    fn erase(&mut self, mode: u16) {
        let start = self.row_start();
        let end = start + self.cols;
        let cursor = start + self.column();
        let (from, to) = match mode {
            0 => (cursor, end),
            1 => (start, cursor + 1),
            2 => (start, end),
            _ => return,
        };
        if to >= self.line.len() {
            self.line.truncate(from);
        } else {
            let from = from.min(self.line.len());
            for c in &mut self.line[from..to] {
                *c = ' ';
            }
        }
        // Blanks at the end are not text.
        while self.line.last() == Some(&' ') {
            self.line.pop();
        }
    }

    fn finish(&mut self) {
        self.done.extend(self.line.drain(..));
        self.done.push('\n');
        self.after_print = false;
    }

    fn lf(&mut self) {
        self.finish();
        self.col = 0;
    }

    fn set_cols(&mut self, cols: u16) {
        self.cols = usize::from(cols.max(1));
    }
}

/// Longest CSI parameter run accepted; real ones are a few bytes.
const MAX_CSI: usize = 64;
/// Longest OSC accepted (titles, hyperlinks); past it the sequence is dropped.
const MAX_OSC: usize = 4096;

/// Length of the longest prefix of `b` that does not end inside a UTF-8 sequence.
fn complete_utf8_prefix(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=3.min(n) {
        let c = b[n - back];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = match c {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if need > back { n - back } else { n };
    }
    n
}

impl Parser {
    /// A parser that recognises `OSC <marker_payload> BEL|ST` as the prompt marker.
    pub(crate) fn new(marker_payload: &str) -> Self {
        Self {
            marker: marker_payload.as_bytes().to_vec(),
            mode: Mode::Normal,
            osc: Vec::new(),
            seq_len: 0,
            text: Vec::new(),
            pending_cr: false,
            csi: Vec::new(),
            answer: None,
            column: 0,
            row: 0,
            lines: LineEditor::new(crate::DEFAULT_COLS),
            line_bytes: Vec::new(),
            alternate: false,
        }
    }

    /// Lays the line rendering out for a terminal `cols` wide.
    pub(crate) fn with_cols(mut self, cols: u16) -> Self {
        self.lines.set_cols(cols);
        self
    }

    /// The terminal was resized: lines wrap at `cols` from now on, and cursor position
    /// answers stay within `rows` × `cols`.
    pub(crate) fn resize(&mut self, rows: u16, cols: u16) {
        self.flush_line_bytes(false);
        self.lines.set_cols(cols);
        if let Some(size) = self.answer.as_mut() {
            *size = (rows.max(1), cols.max(1));
            self.row = self.row.min(size.0 - 1);
            self.column = self.column.min(size.1 - 1);
        }
    }

    /// Finished lines of the line rendering since the last call, each ending in `\n`.
    pub(crate) fn take_lines(&mut self) -> String {
        std::mem::take(&mut self.lines.done)
    }

    /// The line the cursor is on, as the line rendering shows it now.
    pub(crate) fn live_line(&self) -> String {
        self.lines.line.iter().collect()
    }

    /// Nothing is printed on the line the cursor is on (a line just ended).
    pub(crate) fn at_line_start(&self) -> bool {
        self.lines.line.is_empty()
    }

    /// Index (in characters) where the cursor is in [`Parser::live_line`].
    pub(crate) fn live_column(&self) -> usize {
        self.lines.col.min(self.lines.line.len())
    }

    /// Hands the pending printable bytes to the line rendering (all of them, or only up to
    /// the last whole code point).
    fn flush_line_bytes(&mut self, all: bool) {
        let cut = if all { self.line_bytes.len() } else { complete_utf8_prefix(&self.line_bytes) };
        if cut == 0 {
            return;
        }
        if !self.alternate {
            let bytes = &self.line_bytes[..cut];
            match std::str::from_utf8(bytes) {
                Ok(text) => text.chars().for_each(|c| self.lines.print(c)),
                Err(_) => String::from_utf8_lossy(bytes).chars().for_each(|c| self.lines.print(c)),
            }
        }
        self.line_bytes.drain(..cut);
    }

    /// Applies one control to the line rendering, after the text before it.
    fn line_control(&mut self, f: impl FnOnce(&mut LineEditor)) {
        self.flush_line_bytes(true);
        if !self.alternate {
            f(&mut self.lines);
        }
    }

    /// A CSI sequence's effect on the line rendering (`params` without the final byte).
    fn line_csi(&mut self, params: &[u8], fin: u8) {
        let private = params.first() == Some(&b'?');
        let nums: Vec<u16> = params
            .strip_prefix(b"?")
            .unwrap_or(params)
            .split(|&b| b == b';')
            .map(|p| std::str::from_utf8(p).ok().and_then(|s| s.parse().ok()).unwrap_or(0))
            .collect();
        let first = nums.first().copied().unwrap_or(0);
        let count = usize::from(first.max(1));
        match (private, fin) {
            (true, b'h' | b'l') if nums.iter().any(|n| matches!(n, 47 | 1047 | 1049)) => {
                self.flush_line_bytes(true);
                self.alternate = fin == b'h';
            }
            (false, b'K') => self.line_control(|l| l.erase(first)),
            (false, b'G' | b'`') => self.line_control(|l| l.move_to_column(count - 1)),
            (false, b'C') => self.line_control(|l| {
                let c = l.column();
                l.move_to_column(c + count);
            }),
            (false, b'D') => self.line_control(|l| {
                let c = l.column();
                l.move_to_column(c.saturating_sub(count));
            }),
            _ => {}
        }
    }

    /// Also reports cursor position requests, for a terminal of `rows` × `cols`.
    pub(crate) fn answering(mut self, rows: u16, cols: u16) -> Self {
        self.answer = Some((rows.max(1), cols.max(1)));
        self
    }

    /// Moves the tracked cursor over one byte that reaches the text.
    fn advance(&mut self, b: u8) {
        let Some((rows, cols)) = self.answer else { return };
        match b {
            b'\n' => {
                self.column = 0;
                self.row = (self.row + 1).min(rows - 1);
            }
            b'\t' => self.column = ((self.column / 8 + 1) * 8).min(cols - 1),
            // A UTF-8 continuation byte adds no column.
            _ if b & 0xC0 == 0x80 => {}
            _ => {
                self.column += 1;
                if self.column >= cols {
                    self.column = 0;
                    self.row = (self.row + 1).min(rows - 1);
                }
            }
        }
    }

    fn flush_text(&mut self, out: &mut Vec<Event>, all: bool) {
        let cut = if all { self.text.len() } else { complete_utf8_prefix(&self.text) };
        if cut == 0 {
            return;
        }
        let rest = self.text.split_off(cut);
        let s = String::from_utf8_lossy(&self.text).into_owned();
        self.text = rest;
        match out.last_mut() {
            Some(Event::Text(t)) => t.push_str(&s),
            _ => out.push(Event::Text(s)),
        }
    }

    fn push_byte(&mut self, b: u8) {
        match b {
            b'\r' => self.line_control(LineEditor::cr),
            b'\n' => self.line_control(LineEditor::lf),
            b'\t' => self.line_control(LineEditor::tab),
            0x08 => self.line_control(LineEditor::bs),
            0x00..=0x1F | 0x7F => {}
            _ => self.line_bytes.push(b),
        }
        if self.pending_cr && b != b'\r' {
            self.pending_cr = false;
            if b != b'\n' {
                // A lone CR (redraw, progress) becomes a line break so nothing is lost.
                self.text.push(b'\n');
                self.advance(b'\n');
            }
        }
        match b {
            b'\r' => self.pending_cr = true,
            b'\n' | b'\t' => {
                self.text.push(b);
                self.advance(b);
            }
            0x00..=0x1F | 0x7F => {}
            _ => {
                self.text.push(b);
                self.advance(b);
            }
        }
    }

    /// Handles one byte inside an escape sequence; true when it was consumed there.
    fn escape_byte(&mut self, b: u8, out: &mut Vec<Event>) -> bool {
        match self.mode {
            Mode::Normal => false,
            Mode::Esc => {
                self.seq_len = 0;
                self.mode = match b {
                    b'[' => {
                        self.csi.clear();
                        Mode::Csi
                    }
                    b']' => {
                        self.osc.clear();
                        Mode::Osc
                    }
                    b'(' | b')' | b'*' | b'+' => Mode::Charset,
                    // ESC ESC: the second one starts the sequence.
                    0x1B => Mode::Esc,
                    _ => Mode::Normal,
                };
                true
            }
            Mode::Charset => {
                self.mode = Mode::Normal;
                true
            }
            Mode::Csi => {
                self.seq_len += 1;
                match b {
                    // Final byte.
                    0x40..=0x7E => {
                        self.mode = Mode::Normal;
                        if matches!(b, b'K' | b'G' | b'`' | b'C' | b'D' | b'h' | b'l') {
                            let params = std::mem::take(&mut self.csi);
                            self.line_csi(&params, b);
                            self.csi = params;
                        }
                        if b == b'n' && self.csi == b"6" && self.answer.is_some() {
                            // The text before the request moved the cursor first.
                            self.flush_text(out, true);
                            out.push(Event::CursorQuery {
                                row: self.row + 1,
                                col: self.column + 1,
                            });
                        }
                        true
                    }
                    // Parameter and intermediate bytes, within bounds.
                    0x20..=0x3F if self.seq_len <= MAX_CSI => {
                        self.csi.push(b);
                        true
                    }
                    // Anything else aborts the sequence, and the byte is handled afresh
                    // (a newline stays a newline, an ESC starts the next sequence).
                    _ => {
                        self.mode = Mode::Normal;
                        false
                    }
                }
            }
            Mode::Osc | Mode::OscEsc => {
                self.seq_len += 1;
                let was_esc = self.mode == Mode::OscEsc;
                match b {
                    0x07 => self.end_osc(out),
                    b'\\' if was_esc => self.end_osc(out),
                    // An ESC not followed by `\` begins a new sequence: the OSC is dropped.
                    _ if was_esc => {
                        self.mode = Mode::Esc;
                        return self.escape_byte(b, out);
                    }
                    0x1B => self.mode = Mode::OscEsc,
                    // An unterminated OSC ends at a line break or past its bound, so it can
                    // never swallow the output (or a prompt marker) that follows it.
                    b'\n' | b'\r' => {
                        self.mode = Mode::Normal;
                        return false;
                    }
                    _ if self.seq_len > MAX_OSC => self.mode = Mode::Normal,
                    _ => {
                        if self.osc.len() < 256 {
                            self.osc.push(b);
                        }
                    }
                }
                true
            }
        }
    }

    fn end_osc(&mut self, out: &mut Vec<Event>) {
        self.mode = Mode::Normal;
        if self.osc == self.marker {
            self.flush_text(out, true);
            out.push(Event::Marker);
        }
    }

    /// Parses one chunk.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        for &b in data {
            if self.escape_byte(b, &mut out) {
                continue;
            }
            if b == 0x1B {
                self.mode = Mode::Esc;
            } else {
                self.push_byte(b);
            }
        }
        self.flush_text(&mut out, false);
        self.flush_line_bytes(false);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(events: &[Event]) -> String {
        events
            .iter()
            .filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None })
            .collect()
    }

    #[test]
    fn crlf_split_across_reads_gives_one_newline() {
        let mut p = Parser::new("7770;n");
        let mut all = p.feed(b"line one\r");
        all.extend(p.feed(b"\nline two\r\r\n"));
        assert_eq!(text(&all), "line one\nline two\n");
    }

    #[test]
    fn utf8_is_never_split_across_reads() {
        let mut p = Parser::new("7770;n");
        let bytes = "é€😀".as_bytes();
        let mut got = String::new();
        for b in bytes {
            got.push_str(&text(&p.feed(std::slice::from_ref(b))));
        }
        assert_eq!(got, "é€😀");
        assert!(!got.contains('\u{FFFD}'));
    }

    #[test]
    fn marker_is_recognised_split_and_stripped() {
        let mut p = Parser::new("7770;abc");
        let mut all = p.feed(b"out\r\n\x1b]77");
        all.extend(p.feed(b"70;abc\x07# "));
        assert_eq!(all, vec![Event::Text("out\n".into()), Event::Marker, Event::Text("# ".into())]);
        let all = p.feed(b"\x1b]7770;abc\x1b\\$ ");
        assert_eq!(all, vec![Event::Marker, Event::Text("$ ".into())]);
    }

    #[test]
    fn foreign_osc_csi_and_controls_are_dropped() {
        let mut p = Parser::new("7770;abc");
        let all = p.feed(
            b"\x1b]0;title\x07\x1b[?2004h\x1b[1;31mred\x1b[0m\x08\x07 ok\x1b(B\n\x1b]7770;zzz\x07",
        );
        assert_eq!(all, vec![Event::Text("red ok\n".into())]);
    }

    #[test]
    fn regression_10_an_unterminated_osc_ends_at_the_line_or_the_next_escape() {
        let mut p = Parser::new("7770;abc");
        // `printf '\033]0;title'; echo visible`, then the prompt marker and prompt.
        let all = p.feed(b"\x1b]0;titlevisible\r\nafter\n\x1b]0;again\x1b]7770;abc\x07$ ");
        assert_eq!(text(&all), "\nafter\n$ ", "{all:?}");
        assert!(all.contains(&Event::Marker), "the marker survives: {all:?}");
        // A CSI aborted by a newline keeps the newline and what follows.
        let all = p.feed(b"\x1b[12\nnext\n");
        assert_eq!(text(&all), "\nnext\n");
        // Bounds: an endless OSC or CSI does not eat the stream forever.
        let mut p = Parser::new("m");
        let mut long = b"\x1b]".to_vec();
        long.extend(std::iter::repeat_n(b'x', 5000));
        long.extend(b"tail");
        let got = text(&p.feed(&long));
        assert!(got.ends_with("tail"), "{:?}", &got[got.len().saturating_sub(20)..]);
        let mut long = b"\x1b[".to_vec();
        long.extend(std::iter::repeat_n(b'1', 100));
        long.extend(b"Xok");
        assert!(text(&p.feed(&long)).ends_with("ok"));
    }

    #[test]
    fn cursor_requests_are_reported_with_the_printed_position_when_answering() {
        let mut p = Parser::new("m");
        assert_eq!(text(&p.feed(b"ab\x1b[6n")), "ab", "not answering: just dropped");
        let mut p = Parser::new("m").answering(24, 10);
        let all = p.feed("héllo\x1b[6n\r\nx\ty\x1b[6n\x1b[5n".as_bytes());
        assert_eq!(
            all,
            vec![
                Event::Text("héllo".into()),
                Event::CursorQuery { row: 1, col: 6 },
                Event::Text("\nx\ty".into()),
                Event::CursorQuery { row: 2, col: 10 },
            ],
            "columns count characters; a tab stops at 8; other requests are dropped"
        );
        // A request split across reads, after a line longer than the width.
        let mut p = Parser::new("m").answering(3, 10);
        let mut all = p.feed(b"0123456789012\n\n\n\x1b[");
        all.extend(p.feed(b"6n"));
        assert_eq!(all.last(), Some(&Event::CursorQuery { row: 3, col: 1 }), "{all:?}");
    }

    #[test]
    fn lone_carriage_return_becomes_a_line_break() {
        let mut p = Parser::new("x");
        assert_eq!(text(&p.feed(b"10%\r20%\r\n")), "10%\n20%\n");
    }

    /// The line rendering of `data` fed in one-byte reads: finished lines, then the live one.
    fn rendered(cols: u16, data: &[u8]) -> String {
        let mut p = Parser::new("m").with_cols(cols);
        let mut out = String::new();
        for b in data {
            p.feed(std::slice::from_ref(b));
            out.push_str(&p.take_lines());
        }
        out + &p.live_line()
    }

    #[test]
    fn issue_23_8_carriage_return_and_backspace_redraw_the_line() {
        assert_eq!(rendered(80, b"12345\r67\r\n"), "67345\n");
        assert_eq!(rendered(80, b"abc\x08X\r\n"), "abX\n");
        let mut bar = Vec::new();
        for i in 0..=100 {
            bar.extend(format!("\r[{:<10}] {i}%", "#".repeat(i / 10)).bytes());
        }
        bar.extend(b"\r\ndone\r\n");
        assert_eq!(rendered(80, &bar), "[##########] 100%\ndone\n");
        // Erase in line, cursor moves along the row, tabs, and UTF-8 split across reads.
        assert_eq!(rendered(80, b"downloading 10%\r\x1b[Kdone\n"), "done\n");
        assert_eq!(rendered(80, b"abcdef\x1b[3D\x1b[1K!\n"), "   !ef\n");
        assert_eq!(rendered(80, b"xxxxxx\x1b[3GY\x1b[2CZ\n"), "xxYxxZ\n");
        assert_eq!(rendered(80, "é€😀\rA\ta".as_bytes()), "A€😀     a");
    }

    #[test]
    fn a_wrapped_line_redrawn_with_cr_stays_one_line() {
        // readline at 10 columns: 10 characters fill the row (wrap pending), the 11th is
        // printed and the CR returns to the second row's start, which is then redrawn.
        assert_eq!(rendered(10, b"$ echo aaaa\raaaa\r\n"), "$ echo aaaaaaa\n");
        // A CR while the wrap is pending returns to the start of the full row.
        assert_eq!(rendered(10, b"0123456789\rX\r\n"), "X123456789\n");
        // Backspace never goes back past the row's start.
        assert_eq!(rendered(10, b"0123456789ab\x08\x08\x08Z\r\n"), "0123456789Zb\n");
    }

    #[test]
    fn a_long_line_stays_one_line() {
        let long = "x".repeat(300_000);
        let mut p = Parser::new("m").with_cols(200);
        let mut out = String::new();
        for chunk in format!("{long}\r\n").as_bytes().chunks(4096) {
            p.feed(chunk);
            out.push_str(&p.take_lines());
        }
        assert_eq!(out.len(), long.len() + 1);
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn alternate_screen_drawing_is_not_line_output() {
        let out = rendered(80, b"$ vim f\r\n\x1b[?1049h\x1b[H~\r\n~\r\n\"f\" 0L\x1b[?1049l$ ");
        assert_eq!(out, "$ vim f\n$ ");
        // The readiness stream still sees everything.
        let mut p = Parser::new("m");
        assert!(text(&p.feed(b"\x1b[?1049hdrawn\x1b[?1049l")).contains("drawn"));
    }
}
