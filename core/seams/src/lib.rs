//! conch seams: the abstract service traits, their vocabulary, and the one error type.
//!
//! Tools consume these traits only; providers implement them; the registry wires them.
//!
//! The vocabulary: `Subprocess`, `Process`, `TerminalProcess`, `ShellExecutor`, `ShellProcess`,
//! `Sandbox`, `Provisioner`, `TerminalBackend`, `TerminalSession`, `Terminals`, `Jobs`, `Files`, `Tool`, the
//! `Owner` scope and `Signal`.
//!
//! `Process::kill`, `release` and `close_stdin` and `Subprocess::which` are async and fallible: a
//! request a provider could not deliver is the caller's error (a failed job kill is reported by
//! `job_kill`; teardown logs it), and `which` never reports a lost world as "not found". Work whose
//! world was lost has a state of its own: `ShellProcessStatus::Lost`, `JobStatus::Lost` (`lost`)
//! and `SessionStatus::Lost`.
//!
//! Executors and terminal backends say which `Dialect` (`conch_dialect`'s, re-exported) they
//! speak; it carries every shell-specific word a tool needs.
//!
//! The `serde` feature derives Serialize/Deserialize for the wire vocabulary: `SpawnSpec` (without
//! its cancel token), stdio specs, `AfterExit` (milliseconds), `ExitStatus`, `StreamRead` and
//! `CollectedOutput` (with `spill_evicted`, defaulting to false for older peers), `Leftover`,
//! `SpillRef` (a path plus the `World` it lives in), terminal specs, observations and reports,
//! `Signal`, `ErrorCode`, `ErrorBody`.
#![deny(missing_docs)]

mod error;
pub mod files;
pub mod jobs;
mod owner;
pub mod provision;
pub mod sandbox;
pub mod shell;
mod signal;
pub mod subprocess;
pub mod terminal;
pub mod tools;

pub use conch_dialect::Dialect;
pub use error::{Error, ErrorBody, ErrorCode, ErrorReason, Result};
pub use files::{
    ByteStream, FileChunk, FileKind, FileStat, FileWriter, Files, FilesCapabilities, ListSpec,
    Listing, TarSink, WatchEvent, WatchStream, WriteMode, WriteSpec,
};
pub use jobs::{
    JobCancel, JobHooks, JobInfo, JobOutput, JobRead, JobRun, JobSettlement, JobStart, JobStatus,
    Jobs,
};
pub use owner::{Notice, NoticeSink, Owner};
pub use provision::{Provisioned, Provisioner, SandboxRequest};
pub use sandbox::{
    Approval, ApprovalDecision, CommandLine, Denial, Enforcement, EscalationPermissions,
    EscalationRequest, Sandbox, SandboxCapabilities, SandboxInfo, SandboxMode, SandboxPolicy,
    SandboxVerdict,
};
pub use shell::{
    ShellCapabilities, ShellExecRequest, ShellExecSpec, ShellExecutor, ShellProcess,
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
    CloseReport, CommandEnd, CommandOutcome, Interrupted, Key, OMITTED_NOTE, OpenRequest,
    ScreenView, ScrollbackPage, SendOutcome, SendProgress, SendRequest, SendSettle, SendSlot,
    SessionStatus, ShellState, StopCause, TerminalBackend, TerminalInfo, TerminalOpenSpec,
    TerminalSession, Terminals, WaitReason,
};
pub use tools::{Progress, ProgressSink, Tool, ToolContext, ToolOutput, ToolRef};
