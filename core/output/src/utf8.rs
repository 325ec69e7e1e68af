//! UTF-8-safe cuts: bounded text must never start or end in the middle of a code point,
//! because a split code point decodes to a replacement character the stream never held.

/// Most continuation bytes one code point can have (a 4-byte sequence has 3).
const MAX_CONTINUATION: usize = 3;

/// Cuts a partial leading code point off `bytes`.
///
/// Use it on a tail whose head was dropped: the cut may have landed inside a multi-byte
/// sequence, leaving up to three orphan continuation bytes at the front. At most three are
/// skipped, because a longer run cannot be the remainder of one code point: it is invalid
/// data that lossy decoding should show rather than silently eat.
pub fn utf8_tail(bytes: &[u8]) -> &[u8] {
    let skip = bytes.iter().take(MAX_CONTINUATION).take_while(|&&b| is_continuation(b)).count();
    &bytes[skip..]
}

/// The longest prefix of `s` that is at most `max_bytes` long and ends on a char boundary.
pub fn truncate_utf8(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    // A boundary is at most 3 bytes back, so this loop is short.
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The longest suffix of `s` that is at most `max_bytes` long and starts on a char boundary.
pub fn tail_utf8(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    // A boundary is at most 3 bytes ahead, so this loop is short.
    let mut start = s.len() - max_bytes;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Like [`tail_utf8`], but a tail that would begin in the middle of a line begins at the next
/// line instead, so a reader never takes a fragment for a whole line. When that would give up
/// more than half of the kept part (one long line), it starts mid-line and the flag says so.
pub fn tail_lines_utf8(s: &str, max_bytes: usize) -> (&str, bool) {
    let tail = tail_utf8(s, max_bytes);
    let start = s.len() - tail.len();
    if start == 0 || s.as_bytes()[start - 1] == b'\n' {
        return (tail, false);
    }
    match tail.find('\n') {
        Some(i) if i + 1 < tail.len() && i < tail.len() / 2 => (&tail[i + 1..], false),
        _ => (tail, true),
    }
}

/// True for a UTF-8 continuation byte (`10xxxxxx`).
fn is_continuation(b: u8) -> bool {
    b & 0b1100_0000 == 0b1000_0000
}
