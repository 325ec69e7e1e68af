//! What a send writes to the terminal: text typed literally, then keys, then Enter.
//!
//! Typed text must reach its reader as text. A raw Tab at readline's prompt is completion
//! (it once completed a filename inside an open quote, and every later send was swallowed at
//! the `> ` prompt), and a raw CR-LF is two Enters (every later result was one command
//! behind). So:
//! - Line ends are normalized: `\r\n`, `\r` and `\n` each become one `\r`, the byte Enter
//!   sends, which a cooked terminal turns into a newline and readline accepts.
//!   When Enter is pressed after the text with no keys between, a trailing line end of the
//!   text is that Enter, not a second one (which would bring a prompt no command owns).
//! - Text goes inside a bracketed paste (`ESC [200~ … ESC [201~`) when its reader handles
//!   one: readline at bash's prompt (bash binds the paste keys even under `TERM=dumb`, where
//!   it never announces the mode), or any line-oriented program that switched the mode on
//!   (`ESC [?2004h`, tracked by [`Modes`]). A full-screen program on the alternate screen
//!   gets keystrokes even then: vim, for one, inserts a paste as text, so a typed `:q!`
//!   would land in the file instead of quitting. Readline then inserts tabs, quotes and line breaks as text and
//!   runs all the pasted lines as one input: one prompt comes back after the last line,
//!   which is what makes a multi-line send return after all its lines ran. A line end that
//!   ends the text is Enter typed after the paste, so text ending in a newline runs even
//!   without `submit`, as typed text would.
//!   (Typed raw, each line was its own input with its own prompt, and a send could settle
//!   at an earlier line's prompt, seen after the first of three lines under CPU load: the
//!   rest of the output landed in the next send's result.)
//! - Elsewhere (a program reading a cooked terminal, a raw one that did not ask for pastes)
//!   the text is written as is: there a tab is a tab and nothing completes.
//! - At bash's own prompt, a short line of printable ASCII ([`typed_at_prompt`]) is typed, not
//!   pasted: readline inserts each of its bytes as the paste would, and reads it for less
//!   (bash took 0.02 to 0.05 ms more for `echo x` pasted, in paired runs: the paste's twelve
//!   marker bytes, read one at a time like the text, and the highlighted echo it then draws
//!   again).
//!
//! Keys meant as keys ([`conch_seams::Key`]) follow the text, outside any paste; arrows
//! honour the application cursor mode a full-screen program switched on (`ESC [?1h`).

use conch_seams::Key;

const PASTE_START: &[u8] = b"\x1b[200~";
const PASTE_END: &[u8] = b"\x1b[201~";

/// The bytes for one send: `text` (pasted when `paste`), then `keys`, then Enter when
/// `submit`.
pub(crate) fn encode(
    text: &str,
    keys: &[Key],
    submit: bool,
    paste: bool,
    app_cursor: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + PASTE_START.len() + PASTE_END.len() + 8);
    // With Enter pressed after it, a trailing line end is that same Enter, not a second
    // one (which would bring an extra prompt, or an empty line to a program).
    let text = if submit && keys.is_empty() { strip_line_end(text) } else { text };
    if !text.is_empty() {
        let body = normalize_line_ends(text);
        if paste {
            // A line end that ends the text is typed as Enter, after the paste: inside it,
            // readline would only insert it, and the lines would wait for an Enter.
            let (inner, enter) = match body.strip_suffix('\r') {
                Some(inner) => (inner, true),
                None => (body.as_str(), false),
            };
            out.extend_from_slice(PASTE_START);
            // The text cannot end the paste early: an embedded end marker loses its ESC.
            out.extend_from_slice(inner.replace("\x1b[201~", "[201~").as_bytes());
            out.extend_from_slice(PASTE_END);
            if enter {
                out.push(b'\r');
            }
        } else {
            out.extend_from_slice(body.as_bytes());
        }
    }
    for k in keys {
        out.extend_from_slice(&key_bytes(*k, app_cursor));
    }
    if submit {
        out.push(b'\r');
    }
    out
}

/// The longest text [`typed_at_prompt`] types: well within what the line discipline holds at
/// once, so readline finds all of it pending and draws its echo once.
const TYPED_MAX: usize = 256;

/// Whether `text` may be typed rather than pasted at readline's prompt: besides one line end
/// that ends it (Enter either way), it is printable ASCII, which readline inserts key by key
/// as the paste would; a control character may be a key (a tab completes, a line end accepts,
/// ESC starts a sequence), and a byte above 0x7f may be Meta and a key under a locale that is
/// not UTF-8.
pub(crate) fn typed_at_prompt(text: &str) -> bool {
    let line = strip_line_end(text);
    line.len() <= TYPED_MAX && line.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// `text` without one trailing line end.
fn strip_line_end(text: &str) -> &str {
    text.strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .or_else(|| text.strip_suffix('\r'))
        .unwrap_or(text)
}

/// `\r\n`, `\r` and `\n` each become one `\r`.
fn normalize_line_ends(text: &str) -> String {
    text.replace("\r\n", "\r").replace('\n', "\r")
}

/// The terminal modes a program set that change what keys and pastes must look like:
/// bracketed paste (DEC private mode 2004) and application cursor keys (mode 1), from
/// `CSI ? Pm h` / `CSI ? Pm l` in the output. Sequences split across chunks are followed.
#[derive(Debug, Default)]
pub(crate) struct Modes {
    /// The program asked for bracketed pastes.
    pub(crate) paste: bool,
    /// Arrows send `ESC O x`.
    pub(crate) app_cursor: bool,
    state: Scan,
    params: Vec<u16>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Scan {
    #[default]
    Ground,
    Esc,
    Csi,
    Private,
    /// Any other CSI: skipped to its final byte.
    Other,
}

impl Modes {
    /// Follows the mode changes in a chunk of output.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            self.state = match (self.state, b) {
                (_, 0x1b) => Scan::Esc,
                (Scan::Ground, _) => Scan::Ground,
                (Scan::Esc, b'[') => Scan::Csi,
                (Scan::Esc, _) => Scan::Ground,
                (Scan::Csi, b'?') => {
                    self.params.clear();
                    self.params.push(0);
                    Scan::Private
                }
                (Scan::Csi | Scan::Other, 0x20..=0x3f) => Scan::Other,
                (Scan::Csi | Scan::Other, _) => Scan::Ground,
                (Scan::Private, b'0'..=b'9') => {
                    if let Some(p) = self.params.last_mut() {
                        *p = p.saturating_mul(10).saturating_add(u16::from(b - b'0'));
                    }
                    Scan::Private
                }
                (Scan::Private, b';') => {
                    // Bounded: a hostile stream cannot grow the list without end.
                    if self.params.len() < 16 {
                        self.params.push(0);
                    }
                    Scan::Private
                }
                (Scan::Private, b'h' | b'l') => {
                    let on = b == b'h';
                    for p in &self.params {
                        match p {
                            2004 => self.paste = on,
                            1 => self.app_cursor = on,
                            _ => {}
                        }
                    }
                    Scan::Ground
                }
                (Scan::Private, 0x20..=0x3f) => Scan::Other,
                (Scan::Private, _) => Scan::Ground,
            };
        }
    }
}

/// The bytes a terminal sends for `key`; `app_cursor` is the application cursor mode a
/// full-screen program may have switched on (arrows then send `ESC O x`).
fn key_bytes(key: Key, app_cursor: bool) -> Vec<u8> {
    let arrow = |c: u8| if app_cursor { vec![0x1b, b'O', c] } else { vec![0x1b, b'[', c] };
    match key {
        Key::Enter => b"\r".to_vec(),
        Key::Tab => b"\t".to_vec(),
        Key::BackTab => b"\x1b[Z".to_vec(),
        Key::Esc => b"\x1b".to_vec(),
        Key::Backspace => b"\x7f".to_vec(),
        Key::Delete => b"\x1b[3~".to_vec(),
        Key::Up => arrow(b'A'),
        Key::Down => arrow(b'B'),
        Key::Right => arrow(b'C'),
        Key::Left => arrow(b'D'),
        Key::Home => arrow(b'H'),
        Key::End => arrow(b'F'),
        Key::PageUp => b"\x1b[5~".to_vec(),
        Key::PageDown => b"\x1b[6~".to_vec(),
        Key::Ctrl(b'@') => vec![0],
        Key::Ctrl(c) => vec![c.to_ascii_uppercase() & 0x1f],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_short_line_of_printable_ascii_is_typed_at_the_prompt() {
        for typed in ["echo x", "echo x\n", "echo x\r\n", "printf '%s' \"$HOME\" ~ !x"] {
            assert!(typed_at_prompt(typed), "{typed:?}");
        }
        assert!(typed_at_prompt(&"x".repeat(TYPED_MAX)));
        for pasted in ["a\tb", "one\ntwo", "x\n\n", "caf\u{e9}", "\x1b[A", "a\x7f", "a\x03"] {
            assert!(!typed_at_prompt(pasted), "{pasted:?}");
        }
        assert!(!typed_at_prompt(&"x".repeat(TYPED_MAX + 1)));
    }

    #[test]
    fn text_is_pasted_with_line_ends_as_enter_then_keys() {
        let out = encode("a\tb\r\nc\rd\n", &[Key::Ctrl(b'c'), Key::Up], true, true, false);
        assert_eq!(out, b"\x1b[200~a\tb\rc\rd\x1b[201~\r\x03\x1b[A\r");
        // A trailing line end is Enter, outside the paste, even without submit.
        assert_eq!(encode("ls\n", &[], false, true, false), b"\x1b[200~ls\x1b[201~\r");
        // Enter after the text: its own trailing line end is that Enter.
        assert_eq!(encode("echo x\r\n", &[], true, false, false), b"echo x\r");
        let raw = encode("x\r\ny", &[], false, false, true);
        assert_eq!(raw, b"x\ry");
        assert_eq!(encode("", &[Key::Up], false, false, true), b"\x1bOA");
        // Typed text cannot close the paste itself.
        let sneaky = encode("a\x1b[201~b", &[], false, true, false);
        assert_eq!(sneaky, b"\x1b[200~a[201~b\x1b[201~");
    }

    #[test]
    fn keys_map_to_the_bytes_a_terminal_sends() {
        let bytes = |k: Key| key_bytes(k, false);
        assert_eq!(bytes(Key::Ctrl(b'c')), vec![3]);
        assert_eq!(bytes(Key::Ctrl(b'd')), vec![4]);
        assert_eq!(bytes(Key::Ctrl(b'\\')), vec![0x1c]);
        assert_eq!(bytes(Key::Ctrl(b'@')), vec![0]);
        assert_eq!(bytes(Key::Tab), b"\t".to_vec());
        assert_eq!(bytes(Key::BackTab), b"\x1b[Z".to_vec());
    }

    #[test]
    fn modes_follow_split_sequences() {
        let mut m = Modes::default();
        m.feed(b"x\x1b[?20");
        assert!(!m.paste);
        m.feed(b"04h\x1b[?1;25h");
        assert!(m.paste && m.app_cursor);
        m.feed(b"\x1b[2J\x1b[?2004l");
        assert!(!m.paste && m.app_cursor);
        m.feed(b"\x1b[?1l");
        assert!(!m.app_cursor);
    }
}
