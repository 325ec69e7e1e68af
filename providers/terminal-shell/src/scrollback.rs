//! Bounded scrollback: at most N lines and M bytes retained; pages read backward.

use std::collections::VecDeque;

use conch_seams::ScrollbackPage;

/// Retained terminal lines.
#[derive(Debug)]
pub(crate) struct Scrollback {
    lines: VecDeque<String>,
    partial: String,
    bytes: usize,
    dropped: usize,
    max_lines: usize,
    max_bytes: usize,
}

impl Scrollback {
    pub(crate) fn new(max_lines: usize, max_bytes: usize) -> Self {
        Self {
            lines: VecDeque::new(),
            partial: String::new(),
            bytes: 0,
            dropped: 0,
            max_lines,
            max_bytes,
        }
    }

    /// Appends normalised text (only `\n` line breaks).
    pub(crate) fn push(&mut self, text: &str) {
        let mut parts = text.split('\n');
        if let Some(first) = parts.next() {
            self.partial.push_str(first);
        }
        for part in parts {
            let line = std::mem::replace(&mut self.partial, part.to_string());
            self.push_line(line);
        }
        // One endless line must not bypass the byte bound either.
        if self.partial.len() > self.max_bytes {
            let keep = conch_output::tail_utf8(&self.partial, self.max_bytes / 2).to_string();
            self.partial = keep;
        }
        self.trim();
    }

    /// Appends finished lines (each ending in `\n`) after the last finished one: the
    /// unfinished line set by [`Scrollback::set_live`] is not part of them (a line still
    /// being drawn can change, so it is set anew when a page is read).
    pub(crate) fn push_lines(&mut self, lines: &str) {
        self.partial.clear();
        self.push(lines);
    }

    /// Replaces the current, unfinished line.
    pub(crate) fn set_live(&mut self, live: &str) {
        if self.partial != live {
            self.partial.clear();
            self.push(live);
        }
    }

    fn push_line(&mut self, mut line: String) {
        if line.len() > self.max_bytes {
            line = conch_output::truncate_utf8(&line, self.max_bytes / 2).to_string();
        }
        self.bytes += line.len() + 1;
        self.lines.push_back(line);
    }

    fn trim(&mut self) {
        while self.lines.len() > self.max_lines || self.bytes + self.partial.len() > self.max_bytes
        {
            let Some(l) = self.lines.pop_front() else { break };
            self.bytes -= l.len() + 1;
            self.dropped += 1;
        }
    }

    /// A page `offset_lines` back from the newest line, at most `max_lines` lines and
    /// `max_bytes` bytes (newest kept). Line numbers are absolute since session start.
    pub(crate) fn page(
        &self,
        offset_lines: usize,
        max_lines: usize,
        max_bytes: usize,
    ) -> ScrollbackPage {
        let has_partial = !self.partial.is_empty();
        let retained = self.lines.len() + usize::from(has_partial);
        let end = retained.saturating_sub(offset_lines);
        let begin = end.saturating_sub(max_lines.max(1));
        let mut picked: Vec<&str> = Vec::with_capacity(end - begin);
        for i in begin..end {
            picked.push(if i < self.lines.len() {
                self.lines[i].as_str()
            } else {
                self.partial.as_str()
            });
        }
        let joined = picked.join("\n");
        let text = conch_output::tail_utf8(&joined, max_bytes);
        let cut = text.len() < joined.len();
        // Count the lines actually returned after a byte cut, so line_begin stays honest.
        let returned_lines = if joined.is_empty() { 0 } else { text.split('\n').count() };
        let line_end = self.dropped + end;
        ScrollbackPage {
            text: text.to_string(),
            total_lines: self.dropped + retained,
            line_begin: line_end - returned_lines.min(end - begin),
            line_end,
            truncated: cut || (self.dropped > 0 && begin == 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_backward_from_the_newest_line() {
        let mut s = Scrollback::new(100, 1 << 20);
        s.push("a\nb\nc\nd");
        let p = s.page(0, 2, 1000);
        assert_eq!(
            (p.text.as_str(), p.total_lines, p.line_begin, p.line_end, p.truncated),
            ("c\nd", 4, 2, 4, false)
        );
        let p = s.page(2, 10, 1000);
        assert_eq!((p.text.as_str(), p.line_begin, p.line_end), ("a\nb", 0, 2));
    }

    #[test]
    fn line_and_byte_bounds_drop_the_oldest_and_say_so() {
        let mut s = Scrollback::new(3, 1 << 20);
        for i in 0..10 {
            s.push(&format!("line {i}\n"));
        }
        let p = s.page(0, 100, 1000);
        assert_eq!(p.total_lines, 10);
        assert_eq!(p.text, "line 7\nline 8\nline 9");
        assert!(p.truncated, "retention loss is reported");
        let mut s = Scrollback::new(1000, 20);
        s.push("0123456789\n0123456789\nabc\n");
        assert!(s.page(0, 100, 1000).text.len() <= 20);
    }

    #[test]
    fn an_oversized_line_is_bounded() {
        let mut s = Scrollback::new(10, 64);
        s.push(&"x".repeat(10_000));
        s.push("\n");
        assert!(s.page(0, 10, 1 << 20).text.len() <= 64);
    }

    #[test]
    fn byte_cap_keeps_the_newest_on_a_char_boundary() {
        let mut s = Scrollback::new(10, 1 << 20);
        s.push("ééééé\nzz");
        let p = s.page(0, 10, 5);
        assert_eq!(p.text, "é\nzz");
        assert!(p.truncated);
    }
}
