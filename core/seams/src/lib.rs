//! conch seams: the abstract service traits, their vocabulary, and the one error type.
//!
//! Tools consume these traits only; providers implement them; the registry wires them.
#![deny(missing_docs)]

pub mod config;
mod error;
pub mod jobs;
mod owner;
pub mod sandbox;
pub mod shell;
mod signal;
pub mod subprocess;
pub mod terminal;
pub mod tools;
#[cfg(all(test, feature = "serde"))]
mod wire_tests;

pub use config::{ConfigIssue, NoConfig, PluginConfig};
pub use error::{Error, ErrorBody, ErrorCode, ErrorReason, Result};
pub use jobs::{
    JobCancel, JobHooks, JobInfo, JobOutput, JobRead, JobRun, JobSettlement, JobStart, JobStatus,
    Jobs,
};
pub use owner::{
    CollectingSink, DEFAULT_WAKE_BUDGET, Notice, NoticeRoute, NoticeSink, Owner, TurnGuard,
};
pub use sandbox::{
    Approval, ApprovalDecision, CommandLine, Denial, EscalationRequest, Sandbox,
    SandboxCapabilities, SandboxInfo, SandboxMode, SandboxPolicy, SandboxRelease,
};
pub use shell::{
    ShellCapabilities, ShellDialect, ShellExecRequest, ShellExecSpec, ShellExecutor, ShellProcess,
    ShellProcessRead, ShellProcessStatus, ShellRunResult,
};
pub use signal::Signal;
pub use subprocess::{
    AfterExit, CollectedOutput, EnvOverlay, ExitStatus, ForegroundCpu, ForegroundTarget, Leftover,
    OutputSpec, Probe, Process, SignalDelivery, SpawnSpec, SpillRef, StdinSpec, StdinWait,
    StreamId, StreamRead, Subprocess, SubprocessCapabilities, TeardownReport, TerminalObservation,
    TerminalProcess, TerminalSize, TerminalSpawnSpec, World,
};
pub use terminal::{
    CloseReport, CommandEnd, CommandOutcome, Interrupted, Key, OpenRequest, ScreenView,
    ScrollbackPage, SendOutcome, SendProgress, SendRequest, SendSettle, SendSlot, SessionStatus,
    StopCause, TerminalBackend, TerminalInfo, TerminalOpenSpec, TerminalSession, Terminals,
    WaitReason,
};
pub use tools::{Progress, ProgressSink, Tool, ToolContext, ToolOutput, ToolRef};
