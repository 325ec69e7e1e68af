//! conch seams: the abstract service traits, their vocabulary, and the one error type.
//!
//! Tools consume these traits only; providers implement them; the registry wires them.
#![deny(missing_docs)]

mod error;
pub mod jobs;
mod owner;
pub mod sandbox;
pub mod shell;
pub mod subprocess;
pub mod terminal;
pub mod tools;

pub use error::{Error, ErrorCode, Result};
pub use jobs::{
    JobHooks, JobInfo, JobOutput, JobRead, JobRun, JobSettlement, JobStart, JobStatus, Jobs,
};
pub use owner::{CollectingSink, DEFAULT_WAKE_BUDGET, Notice, NoticeRoute, NoticeSink, Owner};
pub use sandbox::{Sandbox, SandboxInfo, SandboxMode, SandboxPolicy};
pub use shell::{
    ShellCapabilities, ShellExecRequest, ShellExecSpec, ShellExecutor, ShellProcess,
    ShellProcessRead, ShellProcessStatus, ShellRunResult,
};
pub use subprocess::{
    AfterExit, CollectedOutput, EnvOverlay, ExitStatus, Leftover, OutputSpec, Process, SpawnSpec,
    StdinSpec, StreamId, StreamRead, Subprocess, SubprocessCapabilities, TerminalProcess,
    TerminalSize, TerminalSpawnSpec,
};
pub use terminal::{
    CloseReport, OpenRequest, ScrollbackPage, SendSettle, SendSlot, SessionStatus, TerminalBackend,
    TerminalInfo, TerminalOpenSpec, TerminalSession, Terminals, WaitReason,
};
pub use tools::{Tool, ToolContext, ToolOutput};

/// Signal number → conventional name (`9` → `SIGKILL`).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        17 => "SIGCHLD",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}
