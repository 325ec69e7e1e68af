//! The text logic of the file tools, without IO: the binary sniff, the line pager `file_read`
//! feeds chunk by chunk, and the planning and rendering of a `file_edit`.
//!
//! The pager keeps only what it shows: lines before `offset` are counted and dropped, and a
//! line longer than [`LINE_MAX_BYTES`] keeps its first bytes and counts the rest, so paging
//! through a huge file (or a file that is one huge line) holds at most one chunk and the
//! output in memory. Line numbers are 1-based and rendered `cat -n` style (`{:>6}\t`).
//! A line is shown as its bytes, `\r` included; bytes that are not UTF-8 (possible past the
//! sniffed first 8 KiB) are shown as U+FFFD.

/// How much of a file's start the binary sniff looks at.
pub(crate) const SNIFF_BYTES: usize = 8 << 10;

/// The bytes of one line `file_read` and `file_edit` show before cutting it.
pub(crate) const LINE_MAX_BYTES: usize = 2000;

/// Why a file is refused as binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binary {
    /// A NUL byte at this offset.
    Nul(usize),
    /// Bytes that are not UTF-8 at this offset.
    NotUtf8(usize),
}

impl Binary {
    /// `a NUL byte at offset 12` / `bytes that are not UTF-8 at offset 12`.
    pub(crate) fn describe(self) -> String {
        match self {
            Binary::Nul(at) => format!("a NUL byte at offset {at}"),
            Binary::NotUtf8(at) => format!("bytes that are not UTF-8 at offset {at}"),
        }
    }
}

/// Sniffs the first [`SNIFF_BYTES`] of `start` (a file's first bytes; `whole` when they are
/// all of it). A multi-byte character cut by the sniff window is not held against the file;
/// one cut by the file's end is.
pub(crate) fn sniff(start: &[u8], whole: bool) -> Option<Binary> {
    let window = &start[..start.len().min(SNIFF_BYTES)];
    if let Some(at) = window.iter().position(|&b| b == 0) {
        return Some(Binary::Nul(at));
    }
    match std::str::from_utf8(window) {
        Ok(_) => None,
        Err(e) if e.error_len().is_none() && !(whole && window.len() == start.len()) => None,
        Err(e) => Some(Binary::NotUtf8(e.valid_up_to())),
    }
}

/// A line of `len` bytes whose first bytes are `kept` (at least [`LINE_MAX_BYTES`] of them,
/// or all) as text: cut to [`LINE_MAX_BYTES`] at a character boundary, with a note when cut.
/// Returns the text and whether it was cut.
fn show_line(kept: &[u8], len: u64) -> (String, bool) {
    let mut kept = kept;
    let cut = len > LINE_MAX_BYTES as u64;
    if cut {
        kept = &kept[..kept.len().min(LINE_MAX_BYTES)];
        // Do not show half a character as U+FFFD when the cut split it.
        if let Err(e) = std::str::from_utf8(kept)
            && e.error_len().is_none()
        {
            kept = &kept[..e.valid_up_to()];
        }
    }
    let mut text = String::from_utf8_lossy(kept).into_owned();
    if cut {
        text.push_str(&format!(" [line cut: showing {} of its {len} bytes]", kept.len()));
    }
    (text, cut)
}

/// One numbered line, `cat -n` style, with its newline.
pub(crate) fn numbered(number: u64, text: &str) -> String {
    format!("{number:>6}\t{text}\n")
}

/// Why the pager stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It showed `limit` lines.
    Limit,
    /// The next line would have passed the byte budget.
    Cap,
}

/// Shows the lines `first..first + limit` of a byte stream within a byte budget.
#[derive(Debug)]
pub(crate) struct Pager {
    first: u64,
    limit: u64,
    budget: usize,
    /// The number of the line being scanned.
    line: u64,
    /// The shown prefix of that line (empty while skipping).
    kept: Vec<u8>,
    /// Its bytes so far, newline not counted.
    len: u64,
    /// Whether the scanner is inside a line (bytes seen since the last newline).
    open: bool,
    /// The stream offset of the next byte to scan.
    pos: u64,
    out: String,
    shown: u64,
    cut_lines: u64,
    stop: Option<Stop>,
}

impl Pager {
    /// Shows up to `limit` lines from line `first` (1-based), in at most `budget` bytes.
    pub(crate) fn new(first: u64, limit: u64, budget: usize) -> Self {
        Self {
            first: first.max(1),
            limit: limit.max(1),
            budget,
            line: 1,
            kept: Vec::new(),
            len: 0,
            open: false,
            pos: 0,
            out: String::new(),
            shown: 0,
            cut_lines: 0,
            stop: None,
        }
    }

    /// Scans the next bytes of the stream; true once the pager stopped (the rest of `data`
    /// is not scanned).
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> bool {
        while self.stop.is_none() && !data.is_empty() {
            let newline = data.iter().position(|&b| b == b'\n');
            let seg = &data[..newline.unwrap_or(data.len())];
            if self.line >= self.first {
                let room = LINE_MAX_BYTES.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&seg[..seg.len().min(room)]);
            }
            self.len += seg.len() as u64;
            self.open |= !seg.is_empty();
            match newline {
                Some(i) => {
                    self.pos += i as u64 + 1;
                    self.end_line();
                    data = &data[i + 1..];
                }
                None => {
                    self.pos += seg.len() as u64;
                    data = &[];
                }
            }
        }
        self.stop.is_some()
    }

    /// Ends the stream: a last line without a newline counts.
    pub(crate) fn finish(&mut self) {
        if self.stop.is_none() && self.open {
            self.end_line();
        }
    }

    fn end_line(&mut self) {
        if self.line >= self.first {
            let (text, cut) = show_line(&self.kept, self.len);
            let rendered = numbered(self.line, &text);
            if self.out.len() + rendered.len() > self.budget {
                self.stop = Some(Stop::Cap);
                return;
            }
            self.out.push_str(&rendered);
            self.shown += 1;
            self.cut_lines += u64::from(cut);
            if self.shown == self.limit {
                self.stop = Some(Stop::Limit);
            }
        }
        self.line += 1;
        self.kept.clear();
        self.len = 0;
        self.open = false;
    }

    /// Why it stopped, if it did.
    pub(crate) fn stop(&self) -> Option<Stop> {
        self.stop
    }

    /// The stream offset just past what was scanned.
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// The rendered lines.
    pub(crate) fn out(&self) -> &str {
        &self.out
    }

    /// How many lines were shown.
    pub(crate) fn shown(&self) -> u64 {
        self.shown
    }

    /// How many shown lines were cut.
    pub(crate) fn cut_lines(&self) -> u64 {
        self.cut_lines
    }

    /// The first line asked for.
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// The line the next call would start at: after the last shown line, or the line the
    /// byte budget refused.
    pub(crate) fn next_line(&self) -> u64 {
        match self.stop {
            Some(Stop::Cap) => self.line,
            _ => self.first + self.shown,
        }
    }

    /// Lines scanned to the end (all of them after [`Pager::finish`] at end of stream).
    pub(crate) fn lines_seen(&self) -> u64 {
        self.line - 1
    }
}

/// Why an edit cannot be made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EditRefusal {
    /// `old_string` does not occur.
    Absent,
    /// It occurs this many times (at these 1-based lines, the first few) and
    /// `replace_all` was not asked for.
    Ambiguous(usize, Vec<usize>),
}

/// A planned edit: the new text and where the replacements landed in it.
#[derive(Debug)]
pub(crate) struct EditPlan {
    /// The new content.
    pub(crate) text: String,
    /// How many occurrences were replaced.
    pub(crate) count: usize,
    /// The byte ranges of the replacements in `text`.
    pub(crate) ranges: Vec<(usize, usize)>,
}

/// How many occurrence lines an ambiguity names.
const AMBIGUOUS_LINES_SHOWN: usize = 10;

/// Replaces `old` by `new` in `content`: the one occurrence, or every one with `all`.
/// Occurrences are counted without overlap, left to right.
pub(crate) fn plan_edit(
    content: &str,
    old: &str,
    new: &str,
    all: bool,
) -> Result<EditPlan, EditRefusal> {
    let found: Vec<usize> = content.match_indices(old).map(|(i, _)| i).collect();
    match found.len() {
        0 => return Err(EditRefusal::Absent),
        n if n > 1 && !all => {
            let lines = found
                .iter()
                .take(AMBIGUOUS_LINES_SHOWN)
                .map(|&at| 1 + content[..at].bytes().filter(|&b| b == b'\n').count())
                .collect();
            return Err(EditRefusal::Ambiguous(n, lines));
        }
        _ => {}
    }
    let mut text = String::with_capacity(content.len() + found.len() * new.len());
    let mut ranges = Vec::with_capacity(found.len());
    let mut from = 0;
    for &at in &found {
        text.push_str(&content[from..at]);
        ranges.push((text.len(), text.len() + new.len()));
        text.push_str(new);
        from = at + old.len();
    }
    text.push_str(&content[from..]);
    Ok(EditPlan { text, count: found.len(), ranges })
}

/// How many lines of context a snippet shows around a change.
const CONTEXT_LINES: usize = 3;

/// The most lines an edit's snippet shows.
pub(crate) const SNIPPET_MAX_LINES: usize = 200;

/// The changed lines of `plan.text` with [`CONTEXT_LINES`] of context, numbered, windows
/// that touch merged and gaps shown as `...`; at most [`SNIPPET_MAX_LINES`] lines, with a
/// note when more were left out.
pub(crate) fn render_snippet(plan: &EditPlan) -> String {
    let text = &plan.text;
    let starts: Vec<usize> =
        std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    // Lines are 1-based; a final newline does not start a line.
    let total =
        if text.is_empty() || text.ends_with('\n') { starts.len() - 1 } else { starts.len() };
    if total == 0 {
        return "[the file is now empty]\n".to_string();
    }
    let line_of = |byte: usize| starts.partition_point(|&s| s <= byte).min(total);
    let mut windows: Vec<(usize, usize)> = Vec::new();
    for &(a, b) in &plan.ranges {
        let first = line_of(a);
        let last = if b > a { line_of(b - 1) } else { first };
        let lo = first.saturating_sub(CONTEXT_LINES).max(1);
        let hi = (last + CONTEXT_LINES).min(total);
        match windows.last_mut() {
            Some(w) if lo <= w.1 + 1 => w.1 = w.1.max(hi),
            _ => windows.push((lo, hi)),
        }
    }
    let mut out = String::new();
    let mut shown = 0;
    for (i, &(lo, hi)) in windows.iter().enumerate() {
        if i > 0 {
            out.push_str("   ...\n");
        }
        for n in lo..=hi {
            if shown == SNIPPET_MAX_LINES {
                let left = windows[i..].iter().map(|w| w.1 - w.0 + 1).sum::<usize>() - (n - lo);
                out.push_str(&format!("[{left} more lines of the edit not shown]\n"));
                return out;
            }
            let end = starts.get(n).map_or(text.len(), |&s| s - 1);
            let line = &text.as_bytes()[starts[n - 1]..end];
            let (shown_text, _) = show_line(line, line.len() as u64);
            out.push_str(&numbered(n as u64, &shown_text));
            shown += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn page(data: &[u8], first: u64, limit: u64, budget: usize, chunk: usize) -> Pager {
        let mut p = Pager::new(first, limit, budget);
        for c in data.chunks(chunk.max(1)) {
            if p.feed(c) {
                return p;
            }
        }
        p.finish();
        p
    }

    #[test]
    fn sniff_tells_text_from_binary() {
        assert_eq!(sniff(b"plain text\n", true), None);
        assert_eq!(sniff(b"ab\0cd", true), Some(Binary::Nul(2)));
        assert_eq!(sniff(b"ab\xffcd", true), Some(Binary::NotUtf8(2)));
        // A character cut by the file's end is invalid; one cut by the window is not.
        assert_eq!(sniff("é".as_bytes()[..1].as_ref(), true), Some(Binary::NotUtf8(0)));
        let mut big = vec![b'a'; SNIFF_BYTES - 1];
        big.extend_from_slice("é".as_bytes());
        assert_eq!(sniff(&big, false), None);
        assert_eq!(sniff(&big, true), None, "the window, not the file, cut it");
        // Past the window nothing is looked at.
        let mut late = vec![b'a'; SNIFF_BYTES];
        late.push(0);
        assert_eq!(sniff(&late, true), None);
    }

    #[test]
    fn pager_numbers_lines_whatever_the_chunking() {
        let data = b"one\ntwo\nthree";
        for chunk in 1..=data.len() {
            let p = page(data, 1, 100, 1 << 20, chunk);
            assert_eq!(p.out(), "     1\tone\n     2\ttwo\n     3\tthree\n", "chunk {chunk}");
            assert_eq!(p.stop(), None);
            assert_eq!(p.lines_seen(), 3);
        }
        let p = page(b"a\n\nb\n", 1, 100, 1 << 20, 2);
        assert_eq!(p.out(), "     1\ta\n     2\t\n     3\tb\n");
        assert_eq!(p.lines_seen(), 3, "a final newline does not start a line");
    }

    #[test]
    fn pager_pages_by_offset_and_limit() {
        let data: String = (1..=10).map(|i| format!("l{i}\n")).collect();
        let p = page(data.as_bytes(), 4, 3, 1 << 20, 5);
        assert_eq!(p.out(), "     4\tl4\n     5\tl5\n     6\tl6\n");
        assert_eq!(p.stop(), Some(Stop::Limit));
        assert_eq!(p.next_line(), 7);
        assert_eq!(p.pos(), "l1\nl2\nl3\nl4\nl5\nl6\n".len() as u64);
        // The limit reached on the last line: the scan stops exactly at the end.
        let p = page(data.as_bytes(), 9, 2, 1 << 20, 64);
        assert_eq!(p.stop(), Some(Stop::Limit));
        assert_eq!(p.pos(), data.len() as u64);
        // Past the end: nothing shown, every line counted.
        let p = page(data.as_bytes(), 20, 2, 1 << 20, 3);
        assert_eq!((p.shown(), p.lines_seen(), p.stop()), (0, 10, None));
    }

    #[test]
    fn pager_stops_before_the_line_that_passes_the_budget() {
        let data: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        let one = numbered(1, "line 1").len();
        let p = page(data.as_bytes(), 1, 1000, one * 3 + 1, 7);
        assert_eq!(p.stop(), Some(Stop::Cap));
        assert_eq!(p.shown(), 3);
        assert_eq!(p.next_line(), 4);
        assert!(p.out().len() <= one * 3 + 1);
    }

    #[test]
    fn pager_cuts_long_lines_at_a_character_boundary() {
        let mut long = "é".repeat(LINE_MAX_BYTES); // 2 bytes each
        long.push('\n');
        long.push_str("short\n");
        let p = page(long.as_bytes(), 1, 10, 1 << 20, 333);
        let lines: Vec<&str> = p.out().lines().collect();
        assert_eq!(lines.len(), 2);
        let shown = "é".repeat(LINE_MAX_BYTES / 2);
        assert_eq!(
            lines[0],
            format!("     1\t{shown} [line cut: showing {LINE_MAX_BYTES} of its 4000 bytes]")
        );
        assert_eq!(lines[1], "     2\tshort");
        assert_eq!(p.cut_lines(), 1);
        // Exactly the limit is not cut.
        let exact = "x".repeat(LINE_MAX_BYTES);
        let p = page(exact.as_bytes(), 1, 10, 1 << 20, 100);
        assert_eq!(p.out(), numbered(1, &exact));
        assert_eq!(p.cut_lines(), 0);
    }

    #[test]
    fn edit_plans_one_or_all_and_refuses_the_rest() {
        let p = plan_edit("a b a", "b", "c", false).unwrap();
        assert_eq!((p.text.as_str(), p.count, p.ranges), ("a c a", 1, vec![(2, 3)]));
        assert_eq!(plan_edit("x", "y", "z", true).unwrap_err(), EditRefusal::Absent);
        assert_eq!(
            plan_edit("a\nb a\na", "a", "z", false).unwrap_err(),
            EditRefusal::Ambiguous(3, vec![1, 2, 3])
        );
        let p = plan_edit("a\nb a\na", "a", "zz", true).unwrap();
        assert_eq!(p.text, "zz\nb zz\nzz");
        assert_eq!(p.count, 3);
        // Non-overlapping, left to right.
        assert_eq!(plan_edit("aaa", "aa", "b", true).unwrap().text, "ba");
    }

    #[test]
    fn snippets_show_changed_lines_with_context() {
        let content: String = (1..=20).map(|i| format!("l{i}\n")).collect();
        let plan = plan_edit(&content, "l10\n", "ten\nTEN\n", false).unwrap();
        let want: String = [(7, "l7"), (8, "l8"), (9, "l9"), (10, "ten"), (11, "TEN")]
            .iter()
            .chain(&[(12, "l11"), (13, "l12"), (14, "l13")])
            .map(|(n, t)| numbered(*n, t))
            .collect();
        assert_eq!(render_snippet(&plan), want);
        // Two distant changes: two windows and a gap.
        let plan = plan_edit(&content, "l2\n", "two\n", false).unwrap();
        assert!(render_snippet(&plan).starts_with("     1\tl1\n     2\ttwo\n"));
        let plan = plan_edit("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\na\n", "a\n", "A\n", true).unwrap();
        let s = render_snippet(&plan);
        assert!(s.contains("     4\td\n   ...\n     9\ti\n"), "{s}");
        assert!(s.ends_with("    12\tA\n"), "{s}");
        // A deletion shows where it happened.
        let plan = plan_edit("a\nb\nc\n", "b\n", "", false).unwrap();
        assert_eq!(render_snippet(&plan), "     1\ta\n     2\tc\n");
        let plan = plan_edit("x", "x", "", false);
        assert_eq!(render_snippet(&plan.unwrap()), "[the file is now empty]\n");
    }

    #[test]
    fn snippets_are_capped() {
        let content = "a\n".repeat(1000);
        let plan = plan_edit(&content, "a", "b", true).unwrap();
        let s = render_snippet(&plan);
        assert_eq!(s.lines().count(), SNIPPET_MAX_LINES + 1);
        assert!(s.ends_with("[800 more lines of the edit not shown]\n"), "{s}");
    }
}
