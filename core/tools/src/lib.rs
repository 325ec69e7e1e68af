//! Model-facing tools. They consume seams only (`ShellExecutor`, `Jobs`), so they behave the
//! same over local, sandboxed or remote providers.

mod args;
mod bash;
mod jobs;

pub use args::{parse_args, schema_of};
pub use bash::{BashTool, BashToolConfig, render_run};
pub use jobs::{JobKillTool, JobListTool, JobOutputTool};

/// Link hook for binaries (forces this crate's plugin registrations to be kept).
pub fn register() {}
