//! `file_read`, `file_write`, `file_edit` and `file_list` (the `tool-files` plugin): the
//! model-facing file tools over the files seam, so they work the same over a local, sandboxed
//! or remote world. A relative path means what the seam makes of it (it is joined to
//! `Files::default_dir`); errors are the seam's, typed, a sandbox denial keeping its marker.
//!
//! - Every tool but `file_list` first follows a final symlink with `stat` and refuses a FIFO,
//!   socket or device before opening it: a FIFO's open would block until a writer came.
//! - `file_read` reads [`READ_CHUNK`] bytes at a time and feeds the pager
//!   (`file_text.rs`), stopping once the asked lines are shown or the output budget is
//!   spent, so a huge file is never read whole; the first chunk is sniffed first, and a
//!   binary file is refused with its size. A note ends the output whenever lines were left
//!   out, naming the offset that continues.
//! - `file_write` writes a symlink's target (as a shell's `>` does), never the link itself,
//!   whatever a provider's atomic rename would make of a link; it writes the whole content through one atomic
//!   writer (`WriteSpec::atomic`), so a reader sees the old file or the new one.
//! - `file_edit` reads the whole file (refused past [`EDIT_MAX_BYTES`], binary or not UTF-8),
//!   plans the replacement in memory and writes it back atomically; the seam's atomic
//!   replace keeps the file's permission bits.
//! - `file_list` asks the seam for at most [`LIST_MAX_ENTRIES`] entries, [`LIST_MAX_DEPTH`]
//!   levels deep.
//!
//! Honest limits: `file_edit` is read-modify-write, so a change another process makes
//! between its read and its rename is overwritten; an atomic replace makes a new inode, so a
//! replaced file's owner becomes the writer and hard links to it keep the old content; the
//! FIFO check and the open are two steps, so a FIFO swapped in between is still opened.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::files::{read_all, write_all};
use conch_seams::{
    Error, ErrorCode, FileKind, FileStat, Files, ListSpec, Result, Tool, ToolContext, ToolOutput,
    WriteMode, WriteSpec,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use crate::args::{parse_args, schema_of};
use crate::file_text::{
    EditRefusal, LINE_MAX_BYTES, Pager, SNIFF_BYTES, Stop, plan_edit, render_snippet, sniff,
};

/// The bytes one seam read asks for.
const READ_CHUNK: usize = 256 << 10;

/// The most bytes of output one `file_read` returns, its closing note included.
pub const READ_MAX_BYTES: usize = 256 << 10;

/// Room kept in [`READ_MAX_BYTES`] for the closing note.
const NOTE_ROOM: usize = 1024;

/// The lines `file_read` shows unless asked for fewer or more.
pub const READ_DEFAULT_LINES: u64 = 2000;

/// The largest file `file_edit` edits.
pub const EDIT_MAX_BYTES: u64 = 8 << 20;

/// The deepest `file_list` goes.
pub const LIST_MAX_DEPTH: u32 = 5;

/// The most entries one `file_list` shows.
pub const LIST_MAX_ENTRIES: usize = 1000;

/// How many symlinks the tools follow before giving up (as `ELOOP` does).
const MAX_LINKS: usize = 40;

/// The path as the seam resolves it, for messages and results.
fn resolved(files: &dyn Files, path: &str) -> PathBuf {
    files.default_dir().join(path)
}

/// Refuses an empty path before the seam sees it (it would name the default directory).
fn non_empty(tool: &str, path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::invalid(format!("invalid arguments for `{tool}`: `path` is empty")));
    }
    Ok(())
}

/// The refusal of a FIFO, socket or device.
fn not_regular(path: &Path) -> Error {
    Error::invalid(format!("{} is not a regular file (a FIFO, socket or device)", path.display()))
}

/// A message with `hint` added, the error otherwise unchanged.
fn with_hint(e: Error, hint: &str) -> Error {
    let mut body = e.to_body();
    body.message = format!("{}; {hint}", body.message);
    Error::from_body(body)
}

/// Follows final symlinks from `path` to what they name: that path and its stat, or no
/// stat when nothing is there (a dangling link names where a write creates the file).
async fn follow_links(files: &dyn Files, path: PathBuf) -> Result<(PathBuf, Option<FileStat>)> {
    let mut path = path;
    for _ in 0..MAX_LINKS {
        match files.stat(&path).await {
            Ok(st) if st.kind == FileKind::Symlink => {
                let Some(target) = st.symlink_target else {
                    return Err(Error::internal(format!(
                        "the files provider described the symlink {} without its target",
                        path.display()
                    )));
                };
                path = path.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
            }
            Ok(st) => return Ok((path, Some(st))),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok((path, None)),
            Err(e) => return Err(e),
        }
    }
    Err(Error::invalid(format!(
        "{}: more than {MAX_LINKS} levels of symbolic links",
        path.display()
    )))
}

/// Arguments of `file_read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileReadArgs {
    /// The file to read (absolute, or relative to the files provider's default directory).
    pub path: String,
    /// The first line to show, 1-based (default 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub offset: Option<u64>,
    /// How many lines to show at most (default 2000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
}

/// `file_read`: a window of a text file's lines, numbered.
#[derive(Debug)]
pub struct FileReadTool {
    files: Arc<dyn Files>,
}

#[async_trait]
impl Tool for FileReadTool {
    fn name(&self) -> &'static str {
        "file_read"
    }

    fn description(&self) -> &'static str {
        "Read a text file with 1-based line numbers (`cat -n` style): up to `limit` lines \
         (default 2000) from line `offset` (default 1), at most 256 KiB of output per call, \
         ending with a note that gives the offset to continue from when lines were left out. \
         Lines longer than 2000 bytes are cut with a note, and binary files (a NUL byte or \
         invalid UTF-8 in the first 8 KiB) are refused."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<FileReadArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: FileReadArgs = parse_args("file_read", args, &schema_of::<FileReadArgs>())?;
        non_empty("file_read", &args.path)?;
        let first = args.offset.unwrap_or(1);
        let limit = args.limit.unwrap_or(READ_DEFAULT_LINES);
        if first == 0 || limit == 0 {
            let which = if first == 0 { "offset" } else { "limit" };
            return Err(Error::invalid(format!(
                "invalid arguments for `file_read`: `{which}` must be at least 1"
            )));
        }
        let shown_path = resolved(self.files.as_ref(), &args.path);
        // A FIFO's read would block until some writer came, and a device may never end.
        let (_, stat) = follow_links(self.files.as_ref(), shown_path.clone()).await?;
        if let Some(stat) = stat.filter(|st| st.kind == FileKind::Other) {
            return Err(not_regular(&stat.path));
        }
        let path = Path::new(&args.path);
        let mut pager = Pager::new(first, limit, READ_MAX_BYTES - NOTE_ROOM);
        let mut offset = 0u64;
        let mut size;
        loop {
            if ctx.cancel.is_cancelled() {
                return Err(Error::new(ErrorCode::Cancelled, "file_read was cancelled"));
            }
            let chunk = self.files.read(path, offset, READ_CHUNK).await?;
            size = chunk.size;
            if offset == 0
                && let Some(why) = sniff(&chunk.data, chunk.eof)
            {
                return Err(Error::invalid(format!(
                    "{} is a binary file ({size} bytes; {} in its first {SNIFF_BYTES} \
                     bytes): file_read shows text only",
                    shown_path.display(),
                    why.describe()
                )));
            }
            offset += chunk.data.len() as u64;
            if pager.feed(&chunk.data) {
                break;
            }
            if chunk.eof || chunk.data.is_empty() {
                pager.finish();
                break;
            }
        }
        render_read(&shown_path, &pager, size)
    }
}

/// The pager's lines and the closing note.
fn render_read(path: &Path, pager: &Pager, size: u64) -> Result<ToolOutput> {
    let first = pager.first();
    let last = first + pager.shown() - 1;
    let (more, stopped) = match pager.stop() {
        None => (false, "end"),
        Some(Stop::Limit) => (pager.pos() < size, "limit"),
        Some(Stop::Cap) => (true, "cap"),
    };
    let mut text = pager.out().to_string();
    if pager.shown() == 0 && pager.stop().is_none() {
        let lines = pager.lines_seen();
        if lines == 0 && first == 1 {
            text = format!("[{} is empty]", path.display());
        } else {
            return Err(Error::invalid(format!(
                "invalid arguments for `file_read`: `offset` {first} is past the end of {}, \
                 which has {lines} lines",
                path.display()
            )));
        }
    }
    let next = pager.next_line();
    if pager.stop() == Some(Stop::Cap) {
        text.push_str(&format!(
            "[output limit of {READ_MAX_BYTES} bytes reached after lines {first}-{last}; \
             continue with offset {next}]"
        ));
    } else if more {
        text.push_str(&format!(
            "[showed lines {first}-{last}; the file has more (it is {size} bytes); continue \
             with offset {next}]"
        ));
    }
    if pager.cut_lines() > 0 {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let n = pager.cut_lines();
        let (lines, were) = if n == 1 { ("line", "was") } else { ("lines", "were") };
        text.push_str(&format!("[{n} {lines} longer than {LINE_MAX_BYTES} bytes {were} cut]"));
    }
    let structured = json!({
        "path": path,
        "size": size,
        "first_line": first,
        "lines": pager.shown(),
        "next_offset": more.then_some(next),
        "stopped": stopped,
        "cut_lines": pager.cut_lines(),
    });
    Ok(ToolOutput { text, structured: Some(structured) })
}

/// Arguments of `file_write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileWriteArgs {
    /// The file to write (absolute, or relative to the files provider's default directory).
    pub path: String,
    /// The file's whole new content.
    pub content: String,
    /// Create missing parent directories (default false).
    #[serde(default)]
    pub create_dirs: Option<bool>,
}

/// `file_write`: a whole file, replaced atomically.
#[derive(Debug)]
pub struct FileWriteTool {
    files: Arc<dyn Files>,
}

#[async_trait]
impl Tool for FileWriteTool {
    fn name(&self) -> &'static str {
        "file_write"
    }

    fn description(&self) -> &'static str {
        "Write a file's whole content, creating it or replacing it atomically (a reader sees \
         the old content or the new; a replaced file keeps its permission bits; a symlink's \
         target is written). Missing parent directories are created only with create_dirs: \
         true."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<FileWriteArgs>()
    }

    async fn call(&self, _ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: FileWriteArgs = parse_args("file_write", args, &schema_of::<FileWriteArgs>())?;
        non_empty("file_write", &args.path)?;
        let create_dirs = args.create_dirs.unwrap_or(false);
        let (path, before) =
            follow_links(self.files.as_ref(), resolved(self.files.as_ref(), &args.path)).await?;
        match before.as_ref().map(|st| st.kind) {
            Some(FileKind::Directory) => {
                return Err(Error::new(
                    ErrorCode::IsADirectory,
                    format!("{} is a directory", path.display()),
                ));
            }
            Some(FileKind::Other) => {
                return Err(not_regular(&path));
            }
            _ => {}
        }
        let mut spec = WriteSpec::new(&path, WriteMode::Truncate).atomic();
        if create_dirs {
            spec = spec.with_parents();
        }
        let stat = match write_all(self.files.as_ref(), spec, args.content.as_bytes()).await {
            Ok(stat) => stat,
            Err(e) if e.code() == ErrorCode::NotFound && !create_dirs => {
                return Err(with_hint(e, "pass create_dirs: true to create missing directories"));
            }
            Err(e) => return Err(e),
        };
        let created = before.is_none();
        let verb = if created { "created" } else { "replaced" };
        let bytes = args.content.len();
        Ok(ToolOutput {
            text: format!("{verb} {} ({bytes} bytes written)", stat.path.display()),
            structured: Some(json!({
                "path": stat.path,
                "bytes": bytes,
                "created": created,
            })),
        })
    }
}

/// Arguments of `file_edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileEditArgs {
    /// The file to edit (absolute, or relative to the files provider's default directory).
    pub path: String,
    /// The exact text to replace (whitespace and line breaks included); it must occur exactly once unless replace_all is true.
    pub old_string: String,
    /// The text to put in its place (must differ from old_string).
    pub new_string: String,
    /// Replace every occurrence instead of exactly one (default false).
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// `file_edit`: exact string replacement, written back atomically.
#[derive(Debug)]
pub struct FileEditTool {
    files: Arc<dyn Files>,
}

#[async_trait]
impl Tool for FileEditTool {
    fn name(&self) -> &'static str {
        "file_edit"
    }

    fn description(&self) -> &'static str {
        "Replace an exact string in a text file: old_string must occur exactly once unless \
         replace_all is true, and the result shows the changed lines, numbered, with 3 lines \
         of context (at most 200 lines). The file is rewritten atomically, keeping its \
         permission bits; binary files, files that are not UTF-8 and files over 8 MiB are \
         refused."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<FileEditArgs>()
    }

    async fn call(&self, _ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: FileEditArgs = parse_args("file_edit", args, &schema_of::<FileEditArgs>())?;
        non_empty("file_edit", &args.path)?;
        if args.old_string.is_empty() {
            return Err(Error::invalid(
                "invalid arguments for `file_edit`: `old_string` is empty; to write a whole \
                 file use file_write",
            ));
        }
        if args.old_string == args.new_string {
            return Err(Error::invalid(
                "invalid arguments for `file_edit`: `new_string` is the same as `old_string`, \
                 so there is nothing to change",
            ));
        }
        let files = self.files.as_ref();
        let (path, stat) = follow_links(files, resolved(files, &args.path)).await?;
        let Some(stat) = stat else {
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("{} does not exist; file_write creates files", path.display()),
            ));
        };
        match stat.kind {
            FileKind::File => {}
            FileKind::Directory => {
                return Err(Error::new(
                    ErrorCode::IsADirectory,
                    format!("{} is a directory", path.display()),
                ));
            }
            _ => {
                return Err(not_regular(&path));
            }
        }
        let too_large = |size: u64| {
            Error::new(
                ErrorCode::TooLarge,
                format!(
                    "{} is {size} bytes; file_edit edits files up to {EDIT_MAX_BYTES} bytes \
                     (8 MiB)",
                    path.display()
                ),
            )
        };
        if stat.size > EDIT_MAX_BYTES {
            return Err(too_large(stat.size));
        }
        let bytes = read_all(files, &path, EDIT_MAX_BYTES).await.map_err(|e| {
            // It grew past the cap since the stat.
            if e.code() == ErrorCode::TooLarge { too_large(EDIT_MAX_BYTES + 1) } else { e }
        })?;
        if let Some(why) = sniff(&bytes, true) {
            return Err(Error::invalid(format!(
                "{} is a binary file ({} bytes; {}): file_edit edits text only",
                path.display(),
                bytes.len(),
                why.describe()
            )));
        }
        let content = String::from_utf8(bytes).map_err(|e| {
            Error::invalid(format!(
                "{} is not UTF-8 text (bytes that are not UTF-8 at offset {}): file_edit edits \
                 UTF-8 text only",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        let all = args.replace_all.unwrap_or(false);
        let plan = match plan_edit(&content, &args.old_string, &args.new_string, all) {
            Ok(plan) => plan,
            Err(EditRefusal::Absent) => {
                // The likeliest miss: a model writes `\n` where the file has `\r\n`.
                let crlf = if content.contains("\r\n")
                    && args.old_string.contains('\n')
                    && !args.old_string.contains('\r')
                {
                    "; the file's lines end in \\r\\n"
                } else {
                    ""
                };
                return Err(Error::new(
                    ErrorCode::NotFound,
                    format!(
                        "`old_string` does not occur in {} (it must match exactly, whitespace \
                         and line breaks included){crlf}",
                        path.display()
                    ),
                ));
            }
            Err(EditRefusal::Ambiguous(n, lines)) => {
                let lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
                let more = if n > lines.len() { ", ..." } else { "" };
                return Err(Error::invalid(format!(
                    "`old_string` occurs {n} times in {} (at lines {}{more}); add surrounding \
                     text to make it unique, or pass replace_all: true to replace every one",
                    path.display(),
                    lines.join(", ")
                )));
            }
        };
        let spec = WriteSpec::new(&path, WriteMode::Truncate).atomic();
        let written = write_all(files, spec, plan.text.as_bytes()).await?;
        let what = if plan.count == 1 {
            "1 occurrence".to_string()
        } else {
            format!("{} occurrences", plan.count)
        };
        Ok(ToolOutput {
            text: format!(
                "edited {}: replaced {what}\n{}",
                written.path.display(),
                render_snippet(&plan)
            ),
            structured: Some(json!({
                "path": written.path,
                "replacements": plan.count,
                "bytes": plan.text.len(),
            })),
        })
    }
}

/// Arguments of `file_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileListArgs {
    /// The directory to list (absolute, or relative to the files provider's default directory).
    pub path: String,
    /// How many levels to list: 1 (the default) lists the directory's own entries, 2 their children too, up to 5.
    #[serde(default)]
    #[schemars(range(min = 1, max = 5))]
    pub depth: Option<u32>,
}

/// `file_list`: a directory's entries, a few levels deep.
#[derive(Debug)]
pub struct FileListTool {
    files: Arc<dyn Files>,
}

#[async_trait]
impl Tool for FileListTool {
    fn name(&self) -> &'static str {
        "file_list"
    }

    fn description(&self) -> &'static str {
        "List a directory's entries (type, size in bytes, path relative to the directory), \
         sorted by path, `depth` levels deep (default 1, at most 5); symlinks are shown, \
         never entered. At most 1000 entries, with a note when more were left out."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<FileListArgs>()
    }

    async fn call(&self, _ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: FileListArgs = parse_args("file_list", args, &schema_of::<FileListArgs>())?;
        non_empty("file_list", &args.path)?;
        let depth = args.depth.unwrap_or(1);
        if !(1..=LIST_MAX_DEPTH).contains(&depth) {
            return Err(Error::invalid(format!(
                "invalid arguments for `file_list`: `depth` must be 1 to {LIST_MAX_DEPTH}, not \
                 {depth}"
            )));
        }
        let dir = resolved(self.files.as_ref(), &args.path);
        let listing = self
            .files
            .list(ListSpec::new(&args.path).with_depth(depth).with_limit(LIST_MAX_ENTRIES))
            .await?;
        let mut text = String::new();
        let mut entries = Vec::with_capacity(listing.entries.len());
        for e in &listing.entries {
            let name = e.path.strip_prefix(&dir).unwrap_or(&e.path).display().to_string();
            let (size, shown) = match e.kind {
                FileKind::Directory => ("-".to_string(), format!("{name}/")),
                FileKind::Symlink => match &e.symlink_target {
                    Some(t) => ("-".to_string(), format!("{name} -> {}", t.display())),
                    None => ("-".to_string(), name.clone()),
                },
                FileKind::File | FileKind::Other => (e.size.to_string(), name.clone()),
            };
            text.push_str(&format!("{:<9} {size:>12}  {shown}\n", e.kind.as_str()));
            entries.push(json!({
                "name": name,
                "type": e.kind.as_str(),
                "size": e.size,
                "symlink_target": e.symlink_target,
            }));
        }
        if listing.entries.is_empty() {
            text = format!("[{} is empty]", dir.display());
        }
        if listing.truncated {
            text.push_str(&format!(
                "[listing stopped at {LIST_MAX_ENTRIES} entries; list a subdirectory or use a \
                 lower depth to see the rest]"
            ));
        }
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "path": dir,
                "depth": depth,
                "entries": entries,
                "truncated": listing.truncated,
            })),
        })
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _: conch_registry::NoConfig = ctx.config()?;
    let files = ctx.files()?;
    Ok(PluginOutput::tools(vec![
        Arc::new(FileReadTool { files: Arc::clone(&files) }),
        Arc::new(FileWriteTool { files: Arc::clone(&files) }),
        Arc::new(FileEditTool { files: Arc::clone(&files) }),
        Arc::new(FileListTool { files }),
    ]))
}

register_plugin!(PluginEntry {
    name: "tool-files",
    provides: None,
    requires: &[SeamId::Files],
    description: "file_read, file_write, file_edit and file_list over the files seam",
    build,
});
