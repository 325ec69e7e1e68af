//! The stream collector: exactly the last `max_bytes` of a byte stream in memory, plus a lazy
//! spill file that holds the complete stream for as long as it stays under the spill cap.
//!
//! # Spill lifecycle
//! - Nothing touches the disk while the whole stream fits in memory.
//! - The first push that takes the total past `max_bytes` creates a private 0700 directory
//!   holding an exclusively created 0600 file and backfills it from memory. Nothing has been
//!   dropped from memory before that push, so the backfill is the complete prefix.
//! - Once the total passes `spill_cap`, or any spill I/O fails, the file and its directory are
//!   deleted and no path is ever published again: a spill that lacks bytes must not be handed
//!   out as if it were the output.
//! - A path is published only after the writer was flushed, so a reader that opens it sees
//!   every byte pushed so far. It is final only once [`Collector::seal`] succeeded.
//! - Dropping the collector keeps a complete spill on disk, because results handed out
//!   earlier may still name it; whoever owns the process lifetime cleans it up: the
//!   subprocess provider keeps every spill under one private directory it removes at
//!   shutdown, and [`Collector::discard_spill`] deletes one stream's spill when its owner is
//!   done with it (a deleted job record). An incomplete spill is never kept.
//! - A collector given a [`SpillRegistry`] reports its spill's creation, growth, seal and
//!   removal there, and the registry may evict the spill once it is final (sealed, or the
//!   collector dropped) to keep its owner's spills under a total size cap and an age limit.
//!   A spill still being written is never evicted; one that alone outgrows the total cap
//!   keeps its own `spill_cap` rule while it is written and is evicted as soon as it is
//!   final. After an eviction no path is published again: reads and summaries carry
//!   `spill: None` with `spill_evicted: true`, so whoever renders them can say the full
//!   output is gone rather than that it never existed.
//!
//! Reads are by caller-owned offset; a read from before the memory window is `lossy`.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use conch_seams::{CollectedOutput, SpillRef, StreamRead};
use conch_sync::LockExt;

use crate::registry::{SpillRegistry, Ticket};
use crate::root::SpillRoot;
use crate::utf8::utf8_tail;

/// Default bytes kept in memory.
const DEFAULT_MAX_BYTES: usize = 64_000;
/// Default largest complete spill (64 MiB).
const DEFAULT_SPILL_CAP: u64 = 64 * 1024 * 1024;
/// Write buffer in front of the spill file; pipe reads arrive in chunks of up to 64 KiB, and
/// batching small ones keeps the syscall count down. Larger chunks bypass it.
const SPILL_BUFFER: usize = 64 * 1024;

/// How a [`Collector`] retains a stream.
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    /// Tail bytes kept in memory; the spill starts once the stream passes it.
    pub max_bytes: usize,
    /// Bytes kept in memory beyond `max_bytes` so that a replica of this stream elsewhere
    /// can be replayed what it missed (a remote daemon's retention). Reads reach into them;
    /// summaries and the spill threshold still follow `max_bytes`. Usually 0.
    pub replay_bytes: usize,
    /// Largest stream the spill may represent; past it the spill is deleted.
    pub spill_cap: u64,
    /// Parent of the private spill directory; `None` means [`std::env::temp_dir`]. Ignored
    /// when `root` is given.
    pub spill_dir: Option<PathBuf>,
    /// The owner's lazily made spill root: spills go under it, and nothing is created until
    /// one is needed.
    pub root: Option<Arc<SpillRoot>>,
    /// The registry that accounts for this spill and may evict it once it is final; `None`
    /// leaves the spill to its owner alone.
    pub registry: Option<Arc<SpillRegistry>>,
}

impl CollectorConfig {
    /// A config with these limits, the default spill location and no registry.
    pub fn new(max_bytes: usize, spill_cap: u64) -> Self {
        Self { max_bytes, replay_bytes: 0, spill_cap, spill_dir: None, root: None, registry: None }
    }
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_BYTES, DEFAULT_SPILL_CAP)
    }
}

/// Collects one output stream: a bounded in-memory tail plus a lazy complete spill.
///
/// All methods take `&self`; state sits behind a mutex so one pump task can push while
/// readers poll from other threads (callers share it behind `Arc`).
#[derive(Debug)]
pub struct Collector {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    max_bytes: usize,
    /// What memory holds at most: `max_bytes` plus the config's `replay_bytes`.
    memory_bytes: usize,
    spill_cap: u64,
    spill_dir: Option<PathBuf>,
    root: Option<Arc<SpillRoot>>,
    registry: Option<Arc<SpillRegistry>>,
    /// The last `memory_bytes` bytes of the stream.
    tail: VecDeque<u8>,
    /// Every byte ever pushed (before sealing).
    total: u64,
    sealed: bool,
    spill: Spill,
    /// The byte just before the memory window, once bytes were dropped: tells whether the
    /// retained tail begins at a line start.
    before_window: Option<u8>,
}

#[derive(Debug)]
enum Spill {
    /// The stream still fits in memory; no file exists yet.
    NotNeeded,
    /// The file holds every byte pushed so far (some possibly still in the write buffer).
    Complete(SpillFile),
    /// Deleted or never created; never comes back, since bytes already left memory.
    Abandoned,
    /// Was complete and final, then the registry evicted it; never comes back either.
    Evicted,
}

#[derive(Debug)]
struct SpillFile {
    /// The private directory the file lives in.
    dir: PathBuf,
    path: PathBuf,
    /// `None` once sealed: the file is closed and final.
    writer: Option<BufWriter<File>>,
    /// The registry's handle, when one accounts for this spill.
    ticket: Option<Arc<Ticket>>,
}

/// Requests owner-only permissions where the platform has Unix modes.
#[cfg(unix)]
fn private<'b, 'p, 's>(
    builder: &'b mut tempfile::Builder<'p, 's>,
    mode: u32,
) -> &'b mut tempfile::Builder<'p, 's> {
    use std::os::unix::fs::PermissionsExt;
    builder.permissions(std::fs::Permissions::from_mode(mode))
}

/// Elsewhere the temp directory's own access rules apply.
#[cfg(not(unix))]
fn private<'b, 'p, 's>(
    builder: &'b mut tempfile::Builder<'p, 's>,
    _mode: u32,
) -> &'b mut tempfile::Builder<'p, 's> {
    builder
}

impl SpillFile {
    /// Creates the private directory and the exclusive file inside it.
    fn create(parent: &Path) -> io::Result<Self> {
        // tempfile gives random names and O_EXCL creation; the modes are requested
        // explicitly so the privacy does not depend on the library's defaults.
        let dir =
            private(tempfile::Builder::new().prefix("conch-spill-"), 0o700).tempdir_in(parent)?;
        let file =
            private(tempfile::Builder::new().prefix("stream-"), 0o600).tempfile_in(dir.path())?;
        let (file, path) = file.keep().map_err(|e| e.error)?;
        // Only now that both exist do we take over cleanup from tempfile.
        let dir = dir.keep();
        Ok(Self {
            dir,
            path,
            writer: Some(BufWriter::with_capacity(SPILL_BUFFER, file)),
            ticket: None,
        })
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.writer {
            Some(w) => w.write_all(bytes),
            // Sealed files take no more bytes; pushes after seal are ignored earlier.
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.writer {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }

    /// Flushes and closes the file.
    fn close(&mut self) -> io::Result<()> {
        match self.writer.take() {
            Some(w) => w.into_inner().map(drop).map_err(|e| e.into_error()),
            None => Ok(()),
        }
    }

    /// Deletes the file and its private directory.
    fn remove(mut self) {
        // Drop the writer without flushing: the file is going away anyway.
        if let Some(w) = self.writer.take() {
            let (file, _unflushed) = w.into_parts();
            drop(file);
        }
        // Removal is best effort: nothing useful can be done if it fails, and the path is
        // never published again either way.
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_dir(&self.dir);
    }
}

impl State {
    fn push(&mut self, chunk: &[u8]) {
        if self.sealed || chunk.is_empty() {
            return;
        }
        self.total += chunk.len() as u64;
        self.spill_chunk(chunk);
        // Memory is trimmed only after the spill saw the chunk, so the first-overflow
        // backfill still has every earlier byte.
        self.retain(chunk);
    }

    fn spill_chunk(&mut self, chunk: &[u8]) {
        match &mut self.spill {
            Spill::Complete(file) => {
                if self.total > self.spill_cap || file.append(chunk).is_err() {
                    self.abandon();
                } else if let (Some(registry), Some(ticket)) = (&self.registry, &file.ticket) {
                    registry.grew(ticket, chunk.len() as u64);
                }
            }
            Spill::NotNeeded if self.total > self.max_bytes as u64 => {
                self.spill = if self.total > self.spill_cap {
                    // The complete stream is already too big to represent.
                    Spill::Abandoned
                } else {
                    match self.start_spill(chunk) {
                        Some(file) => Spill::Complete(file),
                        None => Spill::Abandoned,
                    }
                };
            }
            Spill::NotNeeded | Spill::Abandoned | Spill::Evicted => {}
        }
    }

    /// Creates the spill and backfills it with memory (everything before `chunk`) and `chunk`.
    fn start_spill(&self, chunk: &[u8]) -> Option<SpillFile> {
        let parent = match &self.root {
            Some(root) => root.dir(),
            None => self.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        };
        let mut file = SpillFile::create(&parent).ok()?;
        let (a, b) = self.tail.as_slices();
        let written =
            file.append(a).and_then(|()| file.append(b)).and_then(|()| file.append(chunk));
        match written {
            Ok(()) => {
                if let Some(registry) = &self.registry {
                    let size = self.total;
                    file.ticket =
                        Some(registry.register(file.path.clone(), file.dir.clone(), size));
                }
                Some(file)
            }
            Err(_) => {
                file.remove();
                None
            }
        }
    }

    /// Keeps exactly the last `memory_bytes` bytes after appending `chunk`.
    fn retain(&mut self, chunk: &[u8]) {
        let max = self.memory_bytes;
        if chunk.len() >= max {
            let start = chunk.len() - max;
            if start > 0 {
                self.before_window = Some(chunk[start - 1]);
            } else if let Some(&last) = self.tail.back() {
                self.before_window = Some(last);
            }
            self.tail.clear();
            self.tail.extend(&chunk[start..]);
        } else {
            let excess = (self.tail.len() + chunk.len()).saturating_sub(max);
            if excess > 0 {
                self.before_window = self.tail.get(excess - 1).copied();
            }
            self.tail.drain(..excess);
            self.tail.extend(chunk);
        }
    }

    fn abandon(&mut self) {
        if !matches!(self.spill, Spill::Complete(_)) {
            // Nothing on disk to delete, and an eviction stays reported as one.
            return;
        }
        if let Spill::Complete(file) = std::mem::replace(&mut self.spill, Spill::Abandoned) {
            if let Some(ticket) = &file.ticket {
                if ticket.is_evicted() {
                    // Already gone by the registry's hand: keep saying so.
                    self.spill = Spill::Evicted;
                } else if let Some(registry) = &self.registry {
                    registry.forget(ticket);
                }
            }
            file.remove();
        }
    }

    /// Tells the registry that nothing writes the spill any more.
    fn finalize(&self) {
        if let (Spill::Complete(file), Some(registry)) = (&self.spill, &self.registry)
            && let Some(ticket) = &file.ticket
        {
            registry.finalized(ticket);
        }
    }

    /// Switches to [`Spill::Evicted`] once the registry evicted the spill (it deleted the
    /// file); true when it did.
    fn observe_eviction(&mut self) -> bool {
        let evicted = match &self.spill {
            Spill::Complete(file) => file.ticket.as_ref().is_some_and(|t| t.is_evicted()),
            Spill::Evicted => return true,
            Spill::NotNeeded | Spill::Abandoned => return false,
        };
        if evicted {
            // Only final spills are evicted, so there is no writer left to flush or drop.
            self.spill = Spill::Evicted;
        }
        evicted
    }

    /// The spill path for a reader: flushed first so the file holds everything so far.
    fn published_path(&mut self) -> Option<PathBuf> {
        if self.observe_eviction() {
            return None;
        }
        let flushed = match &mut self.spill {
            Spill::Complete(file) => file.flush().is_ok(),
            Spill::NotNeeded | Spill::Abandoned | Spill::Evicted => return None,
        };
        if !flushed {
            self.abandon();
            return None;
        }
        match &self.spill {
            Spill::Complete(file) => Some(file.path.clone()),
            Spill::NotNeeded | Spill::Abandoned | Spill::Evicted => None,
        }
    }

    /// True once the registry evicted the spill (observed by the last `published_path`).
    fn evicted(&self) -> bool {
        matches!(self.spill, Spill::Evicted)
    }

    fn window_start(&self) -> u64 {
        self.total - self.tail.len() as u64
    }
}

impl Collector {
    /// An empty, unsealed collector.
    pub fn new(cfg: CollectorConfig) -> Self {
        let CollectorConfig { max_bytes, replay_bytes, spill_cap, spill_dir, root, registry } = cfg;
        Self {
            state: Mutex::new(State {
                max_bytes,
                memory_bytes: max_bytes.saturating_add(replay_bytes),
                spill_cap,
                spill_dir,
                root,
                registry,
                tail: VecDeque::new(),
                total: 0,
                sealed: false,
                spill: Spill::NotNeeded,
                before_window: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves byte counts consistent enough to read;
        // refusing all further output over it would be worse.
        self.state.locked()
    }

    /// Appends a chunk. Never fails: a spill I/O error only abandons the spill, since it can
    /// no longer be complete. Ignored after [`Collector::seal`].
    pub fn push(&self, chunk: &[u8]) {
        self.lock().push(chunk);
    }

    /// Records `n` bytes of the stream that this copy never received (a gap in a replica of a
    /// stream held elsewhere): they count in the total, memory restarts after them because
    /// the retained tail must be contiguous, and the spill is given up since it would lack
    /// them. A read from before the gap is then `lossy`, as for bytes dropped from memory.
    /// Ignored after [`Collector::seal`].
    pub fn skip(&self, n: u64) {
        let mut s = self.lock();
        if s.sealed || n == 0 {
            return;
        }
        s.total += n;
        s.tail.clear();
        // The byte before the window is unknown: never claim the tail starts a line.
        s.before_window = Some(0);
        match s.spill {
            Spill::NotNeeded => s.spill = Spill::Abandoned,
            Spill::Complete(_) => s.abandon(),
            Spill::Abandoned | Spill::Evicted => {}
        }
    }

    /// Marks EOF: flushes and closes the spill, which becomes final (and so evictable by the
    /// registry, if there is one). Later pushes are ignored. Idempotent.
    pub fn seal(&self) {
        let mut s = self.lock();
        if s.sealed {
            return;
        }
        s.sealed = true;
        let closed = match &mut s.spill {
            Spill::Complete(file) => file.close().is_ok(),
            Spill::NotNeeded | Spill::Abandoned | Spill::Evicted => true,
        };
        if closed {
            s.finalize();
        } else {
            s.abandon();
        }
    }

    /// Reads from a caller-owned `offset`, at most `max_bytes`.
    ///
    /// - `offset` at or past the end: empty data at the end, not lossy.
    /// - `offset` older than the memory window: the retained tail from the window start
    ///   (at most `max_bytes`), `lossy` set, rather than a fake contiguous delta.
    /// - otherwise: the bytes from `offset` on.
    pub fn read(&self, offset: u64, max_bytes: usize) -> StreamRead {
        let mut s = self.lock();
        let total = s.total;
        let window_start = s.window_start();
        let (start_offset, lossy) = if offset >= total {
            (total, false)
        } else if offset < window_start {
            (window_start, true)
        } else {
            (offset, false)
        };
        // `start_offset` lies within [window_start, total], so the difference is at most the
        // in-memory length and the cast cannot truncate.
        let from = (start_offset - window_start) as usize;
        let to = from + max_bytes.min(s.tail.len() - from);
        // Copied slice by slice (two memcpys at most), not byte by byte.
        let mut data = Vec::with_capacity(to - from);
        let (a, b) = s.tail.as_slices();
        if from < a.len() {
            data.extend_from_slice(&a[from..to.min(a.len())]);
        }
        if to > a.len() {
            data.extend_from_slice(&b[from.saturating_sub(a.len())..to - a.len()]);
        }
        let next_offset = start_offset + data.len() as u64;
        let spill = s.published_path().map(SpillRef::local);
        StreamRead {
            data,
            start_offset,
            next_offset,
            lossy,
            spill,
            spill_evicted: s.evicted(),
            sealed: s.sealed,
        }
    }

    /// The retained tail as UTF-8-safe text with exact accounting.
    ///
    /// When bytes were dropped from the head, a partial leading code point is cut (and
    /// counted as omitted); invalid bytes elsewhere are replaced lossily.
    pub fn summary(&self) -> CollectedOutput {
        let mut s = self.lock();
        let total_bytes = s.total;
        // The summary covers the last `max_bytes` even when memory holds replay bytes too.
        let skip = s.tail.len().saturating_sub(s.max_bytes);
        let dropped = s.window_start() + skip as u64 > 0;
        let before = if skip > 0 { s.tail.get(skip - 1).copied() } else { s.before_window };
        let at_line = before.is_none_or(|b| b == b'\n');
        let (text, kept, starts_mid_line) = {
            let bytes = &s.tail.make_contiguous()[skip..];
            // A tail whose head was dropped mid-line starts at its next line instead, so no
            // fragment passes for a whole line; when that would give up more than half of
            // the tail (one long line), the fragment stays and is flagged as one.
            let (bytes, mid) = if !dropped || at_line {
                (bytes as &[u8], false)
            } else {
                match bytes.iter().position(|b| *b == b'\n') {
                    Some(i) if i + 1 < bytes.len() && i < bytes.len() / 2 => {
                        (&bytes[i + 1..], false)
                    }
                    _ => (utf8_tail(bytes), true),
                }
            };
            let bytes = if dropped { utf8_tail(bytes) } else { bytes };
            (String::from_utf8_lossy(bytes).into_owned(), bytes.len() as u64, mid)
        };
        let spill = s.published_path().map(SpillRef::local);
        CollectedOutput {
            text,
            total_bytes,
            omitted_bytes: total_bytes - kept,
            spill,
            spill_evicted: s.evicted(),
            starts_mid_line,
        }
    }

    /// Exact count of bytes pushed (before sealing).
    pub fn total_bytes(&self) -> u64 {
        self.lock().total
    }

    /// Bytes held in memory right now (at most `max_bytes` plus `replay_bytes`).
    pub fn retained_bytes(&self) -> usize {
        self.lock().tail.len()
    }

    /// True once [`Collector::seal`] ran.
    pub fn is_sealed(&self) -> bool {
        self.lock().sealed
    }

    /// The spill file, only while it holds the complete stream so far (flushed first).
    pub fn spill_path(&self) -> Option<PathBuf> {
        self.lock().published_path()
    }

    /// True once the registry evicted the spill; no path is published afterwards.
    pub fn spill_evicted(&self) -> bool {
        let mut s = self.lock();
        s.observe_eviction()
    }

    /// Deletes the spill now (file and private directory); no path is published afterwards.
    ///
    /// For owners that are done with the output: dropping the collector deliberately keeps
    /// a complete spill because earlier results may name it.
    pub fn discard_spill(&self) {
        self.lock().abandon();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let mut s = self.state.locked();
        // The file outlives us (see the module docs), so it must hold every byte: flush
        // explicitly, because BufWriter's own drop would swallow a failure and leave a
        // short file behind under a path that was published as complete.
        let flushed = match &mut s.spill {
            Spill::Complete(file) => file.flush().is_ok(),
            Spill::NotNeeded | Spill::Abandoned | Spill::Evicted => true,
        };
        if flushed {
            // Nobody writes the file after us, so the registry may now evict it. A sealed
            // spill was final already, and telling the registry again would restart its age.
            if !s.sealed {
                s.finalize();
            }
        } else {
            s.abandon();
        }
    }
}
