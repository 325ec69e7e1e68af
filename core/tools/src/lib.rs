//! Model-facing tools. They consume seams only (`ShellExecutor`, `Jobs`, `Terminals`, `Files`), so they behave the
//! same over local, sandboxed or remote providers, and hold no shell syntax: every word that
//! depends on the shell comes from the seam's `Dialect`.
//!
//! The plugins: `tool-bash` and `tool-pwsh` (`shell.rs`: one tool, named and worded after the
//! executor's dialect; each refuses an executor of the other dialect), `tool-jobs` (`job_output`,
//! `job_list`, `job_kill`), `tool-terminal` (`terminal_open`, `send`, `read`, `resize`, `signal`,
//! `list`, `close`) and `tool-bash-persistent`/`tool-pwsh-persistent` (`persistent.rs`: a shell
//! tool named after the terminal backend's dialect, which each plugin checks). `render.rs` holds
//! the exit markers both renderers write (one-shot `render_run`, persistent `render_outcome`) and
//! `parse_exit_status`; `args.rs` parses arguments and shapes schemas. `tool-files`
//! (`files.rs`: `file_read`, `file_write`, `file_edit`, `file_list`) works over the files seam,
//! with its text logic (binary sniff, line pager, edit planning) in `file_text.rs`.

mod args;
mod file_text;
mod files;
mod jobs;
mod persistent;
mod render;
mod shell;
mod terminal;

pub use args::{parse_args, schema_of};
pub use files::{
    EDIT_MAX_BYTES, FileEditTool, FileListTool, FileReadTool, FileWriteTool, LIST_MAX_DEPTH,
    LIST_MAX_ENTRIES, READ_DEFAULT_LINES, READ_MAX_BYTES,
};
pub use jobs::{JobKillTool, JobListTool, JobOutputTool};
pub use persistent::{PersistentShellConfig, PersistentShellTool};
pub use render::{RenderedExit, parse_exit_status};
pub use shell::{ShellTool, ShellToolConfig, render_run};
pub use terminal::TerminalToolsConfig;

/// Link hook for binaries (forces this crate's plugin registrations to be kept).
pub fn register() {}
