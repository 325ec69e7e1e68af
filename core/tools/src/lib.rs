//! Model-facing tools. They consume seams only (`ShellExecutor`, `Jobs`), so they behave the
//! same over local, sandboxed or remote providers, and hold no shell syntax: every word that
//! depends on the shell comes from the seam's `ShellDialect`.

mod args;
mod bash;
mod jobs;
mod persistent;
mod render;
mod terminal;

pub use args::{parse_args, schema_of};
pub use bash::{BashTool, BashToolConfig, render_run};
pub use jobs::{JobKillTool, JobListTool, JobOutputTool};
pub use persistent::{PersistentBashConfig, PersistentBashTool};
pub use render::{RenderedExit, parse_exit_status};
pub use terminal::TerminalToolsConfig;

/// Link hook for binaries (forces this crate's plugin registrations to be kept).
pub fn register() {}
