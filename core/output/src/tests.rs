//! Behaviour tests for the collector, the UTF-8 cuts, and the text retainers.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    Collector, CollectorConfig, SpillLimits, SpillRegistry, SpillRoot, Strategy, TextRetainer,
    format_retention_notice, tail_utf8, truncate_utf8, utf8_tail,
};

/// Deterministic pseudo-random numbers (xorshift64), so failures reproduce.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for word in buf.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            word.copy_from_slice(&bytes[..word.len()]);
        }
    }
}

fn collector(max_bytes: usize, spill_cap: u64, dir: &Path) -> Collector {
    Collector::new(CollectorConfig {
        max_bytes,
        replay_bytes: 0,
        spill_cap,
        spill_dir: Some(dir.to_path_buf()),
        root: None,
        registry: None,
    })
}

/// A collector keeping 10 bytes in memory whose spill `registry` accounts for.
fn registered(dir: &Path, spill_cap: u64, registry: &Arc<SpillRegistry>) -> Collector {
    Collector::new(CollectorConfig {
        max_bytes: 10,
        replay_bytes: 0,
        spill_cap,
        spill_dir: Some(dir.to_path_buf()),
        root: None,
        registry: Some(Arc::clone(registry)),
    })
}

fn registry(max_total_bytes: u64, max_age: Duration) -> Arc<SpillRegistry> {
    Arc::new(SpillRegistry::new(SpillLimits { max_total_bytes, max_age }))
}

/// Asserts that `c` had a spill that was evicted: no path anywhere, the flag everywhere.
fn assert_evicted(c: &Collector, path: &Path) {
    assert!(!path.exists(), "{path:?} was deleted");
    assert!(!path.parent().unwrap().exists(), "its private directory went too");
    assert!(c.spill_path().is_none());
    assert!(c.spill_evicted());
    let read = c.read(0, 1000);
    assert!(read.spill.is_none() && read.spill_evicted, "{read:?}");
    let summary = c.summary();
    assert!(summary.spill.is_none() && summary.spill_evicted, "{summary:?}");
}

fn assert_kept(c: &Collector, len: usize) -> PathBuf {
    let path = c.spill_path().expect("the spill is still published");
    assert_eq!(fs::read(&path).unwrap().len(), len, "{path:?} is complete");
    assert!(!c.spill_evicted());
    assert!(!c.summary().spill_evicted);
    path
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
}

/// Peak resident set size of this process, in bytes.
fn vm_hwm() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// A mixed-width text: ASCII, 2-, 3- and 4-byte code points.
fn mixed_text(len_chars: usize) -> String {
    const CHARS: [char; 6] = ['a', 'é', '€', '😀', '\n', 'ß'];
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    (0..len_chars).map(|_| CHARS[rng.below(CHARS.len())]).collect()
}

#[test]
fn tail_keeps_exactly_the_last_max_bytes_and_an_exact_total_across_uneven_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let max = 1000;
    let c = collector(max, 1 << 30, dir.path());
    let mut rng = XorShift(7);
    let mut source = Vec::new();
    for _ in 0..400 {
        // Includes empty chunks, chunks shorter than, equal to and longer than the window.
        let len = match rng.below(10) {
            0 => 0,
            1 => max,
            2 => max + rng.below(3000),
            _ => rng.below(300),
        };
        let mut chunk = vec![0u8; len];
        rng.fill(&mut chunk);
        c.push(&chunk);
        source.extend_from_slice(&chunk);
        assert_eq!(c.total_bytes(), source.len() as u64);
        assert_eq!(c.retained_bytes(), source.len().min(max));
    }
    let window_start = (source.len() - max) as u64;
    let read = c.read(window_start, usize::MAX);
    assert_eq!(read.data, &source[source.len() - max..]);
    assert_eq!(read.start_offset, window_start);
    assert_eq!(read.next_offset, source.len() as u64);
    assert!(!read.lossy);
}

#[test]
fn summary_of_ascii_reports_the_tail_and_exact_omitted_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(10, 1 << 20, dir.path());
    c.push(b"0123456789");
    let s = c.summary();
    assert_eq!((s.text.as_str(), s.total_bytes, s.omitted_bytes), ("0123456789", 10, 0));
    assert!(s.spill.is_none());
    c.push(b"abcde");
    let s = c.summary();
    assert_eq!((s.text.as_str(), s.total_bytes, s.omitted_bytes), ("56789abcde", 15, 5));
    assert!(s.spill.is_some());
}

#[test]
fn multi_byte_chars_cut_at_the_window_start_never_yield_a_replacement_char() {
    let dir = tempfile::tempdir().unwrap();
    let text = mixed_text(500);
    let bytes = text.as_bytes();
    let mut rng = XorShift(42);
    for max in 1..=40 {
        let c = collector(max, 1 << 20, dir.path());
        // Byte-level chunks, so chunk edges also split code points.
        let mut at = 0;
        while at < bytes.len() {
            let end = (at + 1 + rng.below(7)).min(bytes.len());
            c.push(&bytes[at..end]);
            at = end;
        }
        let s = c.summary();
        assert!(!s.text.contains('\u{FFFD}'), "max {max}: {:?}", s.text);
        assert!(text.ends_with(&s.text), "max {max}: not a suffix");
        assert_eq!(s.total_bytes, bytes.len() as u64);
        assert_eq!(s.omitted_bytes, s.total_bytes - s.text.len() as u64, "max {max}");
        // Beyond the window, only a partial code point (at most 3 bytes) or, when the cut
        // fell inside a line, the rest of that line is given up.
        assert!(s.text.len() <= max, "max {max}: kept {}", s.text.len());
        let cut = text.len() - s.text.len();
        let at_line = cut == 0 || text.as_bytes()[cut - 1] == b'\n';
        assert!(
            at_line || (s.starts_mid_line && s.text.len() + 3 >= max),
            "max {max}: kept {:?}",
            s.text
        );
        c.discard_spill();
    }
}

#[test]
fn invalid_bytes_inside_the_tail_are_replaced_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(16, 1 << 20, dir.path());
    c.push(b"ok \xff ok");
    let s = c.summary();
    assert_eq!(s.text, "ok \u{FFFD} ok");
    assert_eq!(s.omitted_bytes, 0);
}

#[test]
fn no_spill_is_created_while_the_stream_fits_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(100, 1 << 20, dir.path());
    for _ in 0..10 {
        c.push(&[b'x'; 10]);
    }
    assert_eq!(c.total_bytes(), 100);
    assert!(c.spill_path().is_none());
    assert!(c.read(0, 1000).spill.is_none());
    assert!(c.summary().spill.is_none());
    assert!(entries(dir.path()).is_empty(), "nothing may touch the disk before overflow");
    c.seal();
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn first_overflow_creates_a_private_spill_backfilled_with_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(100, 1 << 20, dir.path());
    c.push(&[b'a'; 60]);
    c.push(&[b'b'; 40]);
    assert!(c.spill_path().is_none());
    c.push(b"c");
    let path = c.spill_path().expect("spill after first overflow");
    let private_dir = path.parent().unwrap();
    assert_eq!(private_dir.parent().unwrap(), dir.path());
    assert_eq!(mode(private_dir), 0o700);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(entries(private_dir), vec![path.clone()]);
    let mut expected = [vec![b'a'; 60], vec![b'b'; 40], b"c".to_vec()].concat();
    assert_eq!(fs::read(&path).unwrap(), expected);

    // Later chunks are appended, and a published path always shows everything so far.
    c.push(b"dd");
    expected.extend_from_slice(b"dd");
    let read = c.read(0, 10);
    assert_eq!(read.spill.map(|s| s.path), Some(path.clone()));
    assert!(!read.sealed);
    assert_eq!(fs::read(&path).unwrap(), expected);
    assert_eq!(c.summary().spill.map(|s| s.path), Some(path.clone()));

    c.seal();
    c.push(b"ignored after seal");
    assert!(c.is_sealed());
    assert_eq!(c.total_bytes(), expected.len() as u64);
    let read = c.read(0, 10);
    assert!(read.sealed);
    assert_eq!(read.spill.map(|s| s.path), Some(path.clone()));
    assert_eq!(fs::read(&path).unwrap(), expected);
}

#[test]
fn spill_is_removed_once_the_stream_passes_the_spill_cap() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(10, 50, dir.path());
    c.push(&[b'x'; 30]);
    c.push(&[b'y'; 20]);
    let path = c.spill_path().expect("complete at exactly the cap");
    assert_eq!(fs::read(&path).unwrap().len(), 50);
    c.push(b"z");
    assert!(c.spill_path().is_none());
    assert!(!path.exists(), "an incomplete spill must not stay on disk");
    assert!(entries(dir.path()).is_empty(), "the private directory goes too");
    c.push(b"more");
    c.seal();
    assert!(c.spill_path().is_none());
    assert!(c.read(0, 100).spill.is_none());
    assert!(c.summary().spill.is_none());
    assert_eq!(c.total_bytes(), 55);
    assert_eq!(c.summary().text, "yyyyyzmore");
}

#[test]
fn a_stream_already_past_the_cap_at_first_overflow_never_spills() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(100, 50, dir.path());
    c.push(&[b'x'; 100]);
    c.push(b"y");
    assert!(c.spill_path().is_none());
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn a_spill_that_cannot_be_created_is_abandoned_without_losing_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(4, 1 << 20, &dir.path().join("missing"));
    c.push(b"abcdef");
    c.push(b"gh");
    assert!(c.spill_path().is_none());
    assert_eq!(c.total_bytes(), 8);
    assert_eq!(c.summary().text, "efgh");
}

#[test]
fn discarding_the_spill_deletes_it_and_stops_publishing() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(4, 1 << 20, dir.path());
    c.push(b"abcdef");
    let path = c.spill_path().unwrap();
    c.discard_spill();
    assert!(!path.exists());
    assert!(entries(dir.path()).is_empty());
    c.push(b"gh");
    assert!(c.spill_path().is_none());
}

#[test]
fn dropping_the_collector_keeps_a_complete_spill_for_results_that_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(4, 1 << 20, dir.path());
    c.push(b"abcdef");
    let path = c.spill_path().unwrap();
    c.push(b"gh");
    drop(c);
    assert_eq!(fs::read(&path).unwrap(), b"abcdefgh");
}

#[test]
fn contiguous_offset_reads_reassemble_the_stream_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(1000, 1 << 20, dir.path());
    let mut rng = XorShift(3);
    let mut source = vec![0u8; 900];
    rng.fill(&mut source);
    c.push(&source[..500]);
    let mut got = Vec::new();
    let mut offset = 0;
    loop {
        let read = c.read(offset, 64);
        assert!(!read.lossy);
        assert_eq!(read.start_offset, offset);
        assert!(read.data.len() <= 64);
        assert_eq!(read.next_offset, offset + read.data.len() as u64);
        if read.data.is_empty() {
            break;
        }
        got.extend_from_slice(&read.data);
        offset = read.next_offset;
    }
    // Reads interleave with pushes: the next read continues exactly where the last stopped.
    c.push(&source[500..]);
    let read = c.read(offset, usize::MAX);
    got.extend_from_slice(&read.data);
    assert_eq!(got, source);
    assert_eq!(read.next_offset, 900);
}

#[test]
fn a_stale_offset_returns_the_retained_tail_marked_lossy() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(10, 1 << 20, dir.path());
    c.push(b"0123456789abcdefghij");
    let read = c.read(3, 100);
    assert!(read.lossy);
    assert_eq!(read.start_offset, 10);
    assert_eq!(read.data, b"abcdefghij");
    assert_eq!(read.next_offset, 20);
    assert!(read.spill.is_some());

    // The window start itself is not stale.
    let read = c.read(10, 4);
    assert!(!read.lossy);
    assert_eq!(read.data, b"abcd");

    // A stale read still honours max_bytes.
    let read = c.read(0, 4);
    assert!(read.lossy);
    assert_eq!((read.data.as_slice(), read.start_offset, read.next_offset), (&b"abcd"[..], 10, 14));
}

#[test]
fn an_offset_at_or_past_the_end_returns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(10, 1 << 20, dir.path());
    let read = c.read(0, 10);
    assert_eq!(
        (read.data.len(), read.start_offset, read.next_offset, read.lossy),
        (0, 0, 0, false)
    );
    c.push(b"0123456789abc");
    for offset in [13, 14, u64::MAX] {
        let read = c.read(offset, 10);
        assert!(read.data.is_empty());
        assert_eq!((read.start_offset, read.next_offset, read.lossy), (13, 13, false));
    }
}

#[test]
fn reads_respect_max_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(100, 1 << 20, dir.path());
    c.push(b"0123456789");
    assert_eq!(c.read(2, 3).data, b"234");
    assert_eq!(c.read(8, 3).data, b"89");
    let read = c.read(4, 0);
    assert!(read.data.is_empty());
    assert_eq!((read.start_offset, read.next_offset), (4, 4));
}

#[test]
fn collector_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Collector>();
    let dir = tempfile::tempdir().unwrap();
    let c = std::sync::Arc::new(collector(64, 1 << 20, dir.path()));
    let writer = {
        let c = std::sync::Arc::clone(&c);
        std::thread::spawn(move || {
            for _ in 0..1000 {
                c.push(b"0123456789");
            }
            c.seal();
        })
    };
    while !c.is_sealed() {
        let read = c.read(0, 1000);
        assert!(read.data.len() <= 64);
    }
    writer.join().unwrap();
    assert_eq!(c.total_bytes(), 10_000);
    let path = c.spill_path().unwrap();
    assert_eq!(fs::read(path).unwrap(), b"0123456789".repeat(1000));
}

#[test]
fn a_big_stream_spills_byte_exact_in_bounded_memory() {
    const CHUNK: usize = 64 * 1024;
    const TOTAL: u64 = 300_000_000 + 12_345;
    let dir = tempfile::tempdir().unwrap();
    let max = 64_000;
    let hwm_before = vm_hwm();
    let c = collector(max, 1 << 30, dir.path());
    let mut rng = XorShift(0xDEAD_BEEF_CAFE_F00D);
    let mut source_hash = Sha256::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut pushed = 0u64;
    while pushed < TOTAL {
        let len = CHUNK.min((TOTAL - pushed) as usize);
        rng.fill(&mut chunk[..len]);
        source_hash.update(&chunk[..len]);
        c.push(&chunk[..len]);
        pushed += len as u64;
    }
    c.seal();
    assert_eq!(c.total_bytes(), TOTAL);
    assert!(c.retained_bytes() <= max);
    assert_eq!(c.retained_bytes(), max);
    let tail = c.read(0, usize::MAX);
    assert!(tail.lossy);
    assert_eq!(tail.start_offset, TOTAL - max as u64);

    let path = c.spill_path().expect("under the cap, so complete");
    assert_eq!(fs::metadata(&path).unwrap().len(), TOTAL);
    let mut file_hash = Sha256::new();
    let mut file = fs::File::open(&path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        file_hash.update(&buf[..n]);
    }
    assert_eq!(file_hash.finalize(), source_hash.finalize());

    let growth = vm_hwm().saturating_sub(hwm_before);
    assert!(growth < 64 * 1024 * 1024, "peak RSS grew by {growth} bytes");
    c.discard_spill();
}

#[test]
fn utf8_tail_cuts_only_a_partial_leading_code_point() {
    let euro = "€".as_bytes(); // e2 82 ac
    let grin = "😀".as_bytes(); // 4 bytes
    assert_eq!(utf8_tail(&euro[1..]), b"");
    assert_eq!(utf8_tail(&[&euro[2..], b"x"].concat()), b"x");
    assert_eq!(utf8_tail(&[&grin[1..], b"ok"].concat()), b"ok");
    assert_eq!(utf8_tail(b"plain"), b"plain");
    assert_eq!(utf8_tail(euro), euro);
    // More continuation bytes than any code point has: invalid data, left for lossy decoding.
    assert_eq!(utf8_tail(b"\x80\x80\x80\x80a"), b"\x80a");
    assert_eq!(utf8_tail(b""), b"");
}

#[test]
fn truncate_and_tail_cut_on_char_boundaries() {
    let s = "a€b😀";
    assert_eq!(truncate_utf8(s, 100), s);
    assert_eq!(truncate_utf8(s, 0), "");
    assert_eq!(truncate_utf8(s, 1), "a");
    assert_eq!(truncate_utf8(s, 3), "a");
    assert_eq!(truncate_utf8(s, 4), "a€");
    assert_eq!(truncate_utf8(s, 8), "a€b");
    assert_eq!(tail_utf8(s, 100), s);
    assert_eq!(tail_utf8(s, 0), "");
    assert_eq!(tail_utf8(s, 3), "");
    assert_eq!(tail_utf8(s, 4), "😀");
    assert_eq!(tail_utf8(s, 5), "b😀");
    assert_eq!(tail_utf8(s, 8), "€b😀");
    assert_eq!(tail_utf8(s, 9), s);
}

/// The retainer's result computed directly from the whole text.
fn expected_retained(strategy: Strategy, text: &str, max: usize) -> (String, u64) {
    let total = text.len() as u64;
    match strategy {
        Strategy::Head => {
            let head = truncate_utf8(text, max);
            (head.to_owned(), total - head.len() as u64)
        }
        Strategy::Tail => {
            let tail = tail_utf8(text, max);
            (tail.to_owned(), total - tail.len() as u64)
        }
        Strategy::HeadTail => {
            let head = truncate_utf8(text, max / 2);
            let tail = tail_utf8(&text[head.len()..], max - head.len());
            let omitted = total - (head.len() + tail.len()) as u64;
            if omitted == 0 {
                return (text.to_owned(), 0);
            }
            let sep = if head.is_empty() || head.ends_with('\n') { "" } else { "\n" };
            (format!("{head}{sep}{}\n{tail}", format_retention_notice(omitted)), omitted)
        }
    }
}

/// Pushes `text` in random pieces split on char boundaries.
fn retain_in_pieces(
    strategy: Strategy,
    text: &str,
    max: usize,
    rng: &mut XorShift,
) -> crate::Retained {
    let mut r = TextRetainer::new(strategy, max);
    let mut rest = text;
    while !rest.is_empty() {
        let piece = truncate_utf8(rest, 1 + rng.below(12));
        let piece = if piece.is_empty() {
            &rest[..rest.chars().next().map_or(0, char::len_utf8)]
        } else {
            piece
        };
        r.push(piece);
        rest = &rest[piece.len()..];
    }
    r.finish()
}

#[test]
fn retainers_report_exact_omitted_counts_on_char_boundaries() {
    let mut rng = XorShift(11);
    for strategy in [Strategy::Head, Strategy::Tail, Strategy::HeadTail] {
        for len_chars in [0, 1, 5, 30, 200] {
            let text = mixed_text(len_chars);
            for max in 0..=60 {
                let got = retain_in_pieces(strategy, &text, max, &mut rng);
                let (want_text, want_omitted) = expected_retained(strategy, &text, max);
                let ctx = format!("{strategy:?} chars {len_chars} max {max}");
                assert_eq!(got.text, want_text, "{ctx}");
                assert_eq!(got.total_bytes, text.len() as u64, "{ctx}");
                assert_eq!(got.omitted_bytes, want_omitted, "{ctx}");
                assert!(!got.text.contains('\u{FFFD}'), "{ctx}");
            }
        }
    }
}

#[test]
fn head_retainer_keeps_a_true_prefix_even_when_a_later_char_would_fit() {
    let mut r = TextRetainer::new(Strategy::Head, 3);
    r.push("ab");
    r.push("€"); // does not fit the 1 byte left
    r.push("c"); // would fit, but is not adjacent to the kept prefix
    let got = r.finish();
    assert_eq!((got.text.as_str(), got.total_bytes, got.omitted_bytes), ("ab", 6, 4));
}

#[test]
fn tail_retainer_keeps_the_last_max_bytes() {
    let mut r = TextRetainer::new(Strategy::Tail, 5);
    for piece in ["hello ", "wor", "ld", "!"] {
        r.push(piece);
    }
    let got = r.finish();
    assert_eq!((got.text.as_str(), got.total_bytes, got.omitted_bytes), ("orld!", 12, 7));
}

#[test]
fn head_tail_marker_sits_on_its_own_line_outside_the_budget() {
    let mut r = TextRetainer::new(Strategy::HeadTail, 10);
    r.push("01234");
    r.push("-middle-");
    r.push("56789");
    let got = r.finish();
    assert_eq!(got.omitted_bytes, 8);
    assert_eq!(got.text, "01234\n[... 8 bytes omitted ...]\n56789");
    // Kept content is exactly the budget; the marker comes on top of it.
    let content = got.text.len() - format_retention_notice(8).len() - 2;
    assert_eq!(content, 10);
    assert_eq!(got.total_bytes, content as u64 + got.omitted_bytes);
}

#[test]
fn head_tail_keeps_text_within_the_budget_whole_without_a_marker() {
    // The head stops short at a char boundary (4 of 5 bytes); the tail absorbs the slack.
    let text = "abc€defg"; // 10 bytes
    let mut r = TextRetainer::new(Strategy::HeadTail, 10);
    r.push(text);
    let got = r.finish();
    assert_eq!((got.text.as_str(), got.omitted_bytes), (text, 0));
}

#[test]
fn format_retention_notice_names_the_exact_count() {
    assert_eq!(format_retention_notice(1234), "[... 1234 bytes omitted ...]");
}

#[test]
fn retainers_hold_bounded_memory_for_unbounded_input() {
    let max = 1000;
    let line = "a line of output with € and 😀 in it\n";
    for strategy in [Strategy::Head, Strategy::Tail, Strategy::HeadTail] {
        let mut r = TextRetainer::new(strategy, max);
        let mut total = 0u64;
        for i in 0..200_000 {
            // Mix tiny pieces with the occasional piece bigger than the budget.
            if i % 10_000 == 0 {
                let big = line.repeat(100);
                r.push(&big);
                total += big.len() as u64;
            } else {
                r.push(line);
                total += line.len() as u64;
            }
            assert!(r.held_bytes() <= 8 * max, "{strategy:?}: holds {}", r.held_bytes());
        }
        assert_eq!(r.total_bytes(), total);
        let got = r.finish();
        assert_eq!(got.total_bytes, total);
        assert!(got.omitted_bytes >= total - max as u64);
    }
}

#[test]
fn regression_10_a_cut_tail_starts_at_a_line_boundary_or_says_it_does_not() {
    use crate::tail_lines_utf8;
    assert_eq!(tail_lines_utf8("one\ntwo\nthree\n", 100), ("one\ntwo\nthree\n", false));
    // Cut inside "two": the fragment is dropped and the tail starts at "three".
    assert_eq!(tail_lines_utf8("one\ntwo\nthree\n", 8), ("three\n", false));
    // Cut exactly after a newline: nothing to drop.
    assert_eq!(tail_lines_utf8("one\ntwo\n", 4), ("two\n", false));
    // One endless line: it has to start mid-line, and says so.
    assert_eq!(tail_lines_utf8("abcdefgh", 3), ("fgh", true));
    // Dropping the fragment would give up most of the tail: keep it, flagged.
    assert_eq!(tail_lines_utf8("ééé\nx", 4), ("é\nx", true));
}

#[test]
fn over_the_total_cap_the_oldest_final_spill_is_evicted_first() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(250, Duration::from_secs(3600));
    let cs: Vec<Collector> = (0..3).map(|_| registered(dir.path(), 1 << 20, &reg)).collect();
    let mut paths = Vec::new();
    for (i, c) in cs.iter().enumerate() {
        c.push(&[b'a' + i as u8; 100]);
        paths.push(c.spill_path().unwrap());
        c.seal();
    }
    // 300 bytes passed the 250-byte cap when the third spill was created: the first went.
    assert_evicted(&cs[0], &paths[0]);
    assert_eq!(assert_kept(&cs[1], 100), paths[1]);
    assert_eq!(assert_kept(&cs[2], 100), paths[2]);
    assert_eq!((reg.total_bytes(), reg.spill_count(), reg.evicted_count()), (200, 2, 1));
    // The tail in memory is untouched by the eviction.
    assert_eq!(cs[0].summary().text, "aaaaaaaaaa");
    assert_eq!(cs[0].summary().omitted_bytes, 90);
    // Growth past the cap evicts too, and a discard afterwards does not hide the eviction.
    cs[0].discard_spill();
    assert!(cs[0].spill_evicted());
    let d = registered(dir.path(), 1 << 20, &reg);
    d.push(&[b'd'; 20]);
    assert_kept(&cs[1], 100);
    d.push(&[b'd'; 40]);
    assert_evicted(&cs[1], &paths[1]);
    assert_kept(&d, 60);
    assert_eq!(reg.total_bytes(), 160);
}

#[test]
fn a_spill_still_being_written_is_never_evicted_even_alone_over_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(150, Duration::from_secs(3600));
    let live = registered(dir.path(), 1 << 20, &reg);
    live.push(&[b'l'; 200]);
    let live_path = assert_kept(&live, 200);
    let done = registered(dir.path(), 1 << 20, &reg);
    done.push(&[b'd'; 100]);
    let done_path = assert_kept(&done, 100);
    assert_eq!(reg.total_bytes(), 300, "over the cap, but nothing is final yet");
    // Once final, the younger spill goes: the older one is still being written.
    done.seal();
    assert_evicted(&done, &done_path);
    live.push(&[b'l'; 50]);
    reg.sweep();
    reg.sweep_at(Instant::now() + Duration::from_secs(7200));
    assert_eq!(assert_kept(&live, 250), live_path, "neither growth nor sweeps evict it");
    // Sealed, it could never fit under the cap, so it goes at once.
    live.seal();
    assert_evicted(&live, &live_path);
    assert_eq!((reg.total_bytes(), reg.spill_count()), (0, 0));
}

#[test]
fn final_spills_past_the_age_limit_are_evicted_by_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(1 << 30, Duration::from_secs(3600));
    let sealed = registered(dir.path(), 1 << 20, &reg);
    sealed.push(&[b's'; 30]);
    sealed.seal();
    let sealed_path = sealed.spill_path().unwrap();
    let live = registered(dir.path(), 1 << 20, &reg);
    live.push(&[b'l'; 30]);
    let dropped = registered(dir.path(), 1 << 20, &reg);
    dropped.push(&[b'x'; 30]);
    let dropped_path = dropped.spill_path().unwrap();
    // Dropped unsealed: nobody writes it any more, so it is final and ages like a sealed one.
    drop(dropped);
    reg.sweep();
    assert_kept(&sealed, 30);
    assert!(dropped_path.is_file(), "younger than the limit");
    reg.sweep_at(Instant::now() + Duration::from_secs(7200));
    assert_evicted(&sealed, &sealed_path);
    assert!(!dropped_path.exists(), "a dropped collector's spill ages out too");
    assert_kept(&live, 30);
    assert_eq!((reg.total_bytes(), reg.spill_count(), reg.evicted_count()), (30, 1, 2));
}

#[test]
fn abandoned_and_discarded_spills_leave_the_books_without_counting_as_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(1 << 30, Duration::from_secs(3600));
    let capped = registered(dir.path(), 50, &reg);
    capped.push(&[b'c'; 40]);
    assert_eq!(reg.total_bytes(), 40);
    capped.push(&[b'c'; 20]);
    assert_eq!(reg.total_bytes(), 0, "past its spill cap the spill is forgotten");
    assert!(capped.summary().spill.is_none());
    assert!(!capped.summary().spill_evicted, "outgrowing spill_cap is not an eviction");
    let discarded = registered(dir.path(), 1 << 20, &reg);
    discarded.push(&[b'd'; 40]);
    discarded.seal();
    discarded.discard_spill();
    assert!(!discarded.spill_evicted());
    assert_eq!((reg.total_bytes(), reg.spill_count(), reg.evicted_count()), (0, 0, 0));
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn regression_10_a_cut_summary_starts_at_a_line_and_says_when_it_cannot() {
    let c = Collector::new(CollectorConfig::new(12, 1 << 20));
    c.push(b"first line\nsecond\nthird line\n");
    let s = c.summary();
    // The last 12 bytes are "d\nthird line\n": the fragment "d" is dropped and counted.
    assert_eq!(s.text, "third line\n");
    assert_eq!(s.omitted_bytes + s.text.len() as u64, s.total_bytes, "exact accounting");
    assert!(!s.starts_mid_line);
    // Cut exactly at a line start: nothing more is dropped.
    let c = Collector::new(CollectorConfig::new(6, 1 << 20));
    c.push(b"abcde\nthird\n");
    assert_eq!(c.summary().text, "third\n");
    // One endless line: it must start mid-line, and says so.
    let c = Collector::new(CollectorConfig::new(4, 1 << 20));
    c.push(b"0123456789");
    let s = c.summary();
    assert_eq!((s.text.as_str(), s.starts_mid_line), ("6789", true));
}

#[test]
fn the_spill_root_is_made_by_the_first_spill_only_and_removed_whole() {
    let parent = tempfile::tempdir().unwrap();
    let root = Arc::new(SpillRoot::new(Some(parent.path().to_path_buf())));
    let c = |max_bytes| {
        Collector::new(CollectorConfig {
            max_bytes,
            replay_bytes: 0,
            spill_cap: 1 << 20,
            spill_dir: None,
            root: Some(Arc::clone(&root)),
            registry: None,
        })
    };
    // Output that fits in memory touches no disk.
    let small = c(100);
    small.push(b"fits");
    small.seal();
    assert!(entries(parent.path()).is_empty(), "nothing made: {:?}", entries(parent.path()));
    assert_eq!(root.made(), None);
    // The first spill makes one private directory; later spills share it.
    let a = c(4);
    a.push(b"more than four bytes");
    let b = c(4);
    b.push(b"also more than four");
    let made = root.made().expect("the first spill made the root");
    assert_eq!(entries(parent.path()), vec![made.clone()]);
    assert_eq!(mode(&made), 0o700);
    for spill in [a.summary().spill, b.summary().spill] {
        assert!(spill.expect("spilled").path.starts_with(&made));
    }
    root.remove();
    assert!(!made.exists());
    assert!(entries(parent.path()).is_empty());
}

#[test]
fn a_skipped_gap_counts_in_the_total_and_makes_older_reads_lossy() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(100, 1 << 20, dir.path());
    c.push(b"hello\n");
    c.skip(10);
    c.push(b"world\n");
    assert_eq!(c.total_bytes(), 22);
    let r = c.read(0, 100);
    assert!(r.lossy, "bytes before the gap are not contiguous with what follows");
    assert_eq!((r.start_offset, r.data.as_slice(), r.next_offset), (16, &b"world\n"[..], 22));
    let s = c.summary();
    assert_eq!((s.total_bytes, s.omitted_bytes), (22, 16));
    assert!(c.spill_path().is_none(), "a spill would lack the gap");
    c.seal();
    c.skip(5);
    assert_eq!(c.total_bytes(), 22, "a sealed stream takes no more");
}
