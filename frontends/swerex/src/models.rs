//! The request and response bodies of swe-rex 1.4.0's API (`swerex/runtime/abstract.py`),
//! field for field: names, defaults and the `session_type` / `action_type` tags its pydantic
//! models discriminate on. Unknown fields are ignored, as pydantic does by default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

fn default_session() -> String {
    "default".into()
}

fn bash() -> String {
    "bash".into()
}

fn default_startup_timeout() -> f64 {
    1.0
}

fn default_interrupt_timeout() -> f64 {
    0.2
}

fn default_retries() -> u32 {
    3
}

/// `CreateBashSessionRequest`.
#[derive(Debug, Deserialize)]
pub(crate) struct CreateSession {
    #[serde(default)]
    pub startup_source: Vec<String>,
    #[serde(default = "default_session")]
    pub session: String,
    #[serde(default = "bash")]
    pub session_type: String,
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout: f64,
}

/// `CreateBashSessionResponse`.
#[derive(Debug, Serialize)]
pub(crate) struct CreateSessionResponse {
    pub output: String,
    pub session_type: &'static str,
}

/// How a `BashAction` treats the exit code.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Check {
    /// Report it; a non-zero one is `NonZeroExitCodeError`.
    #[default]
    Raise,
    /// Report it, never raise.
    Silent,
    /// Do not report it (`exit_code: null`).
    Ignore,
}

/// `BashAction`.
#[derive(Debug, Deserialize)]
pub(crate) struct BashAction {
    pub command: String,
    #[serde(default = "default_session")]
    pub session: String,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub is_interactive_command: bool,
    #[serde(default)]
    pub is_interactive_quit: bool,
    #[serde(default)]
    pub check: Check,
    #[serde(default)]
    pub error_msg: String,
    #[serde(default)]
    pub expect: Vec<String>,
}

/// `BashInterruptAction`.
#[derive(Debug, Deserialize)]
pub(crate) struct InterruptAction {
    #[serde(default = "default_session")]
    pub session: String,
    #[serde(default = "default_interrupt_timeout")]
    pub timeout: f64,
    #[serde(default = "default_retries")]
    pub n_retry: u32,
    #[serde(default)]
    pub expect: Vec<String>,
}

/// The `Action` union, told apart by `action_type` (default `bash`).
#[derive(Debug, Deserialize)]
#[serde(tag = "action_type")]
pub(crate) enum Action {
    #[serde(rename = "bash")]
    Bash(BashAction),
    #[serde(rename = "bash_interrupt")]
    Interrupt(InterruptAction),
}

/// `BashObservation`.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Observation {
    pub output: String,
    pub exit_code: Option<i32>,
    pub failure_reason: String,
    pub expect_string: String,
    pub session_type: &'static str,
}

/// `CloseBashSessionRequest`.
#[derive(Debug, Deserialize)]
pub(crate) struct CloseSession {
    #[serde(default = "default_session")]
    pub session: String,
}

/// `Command.command`: a string or an argv list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum CommandLine {
    Text(String),
    Argv(Vec<String>),
}

/// `Command`.
#[derive(Debug, Deserialize)]
pub(crate) struct Command {
    pub command: CommandLine,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub shell: bool,
    #[serde(default)]
    pub check: bool,
    #[serde(default)]
    pub error_msg: String,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub merge_output_streams: bool,
}

/// `CommandResponse`.
#[derive(Debug, Serialize)]
pub(crate) struct CommandResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
}

/// `ReadFileRequest`.
#[derive(Debug, Deserialize)]
pub(crate) struct ReadFile {
    pub path: String,
    #[serde(default)]
    pub encoding: Option<String>,
    #[serde(default)]
    pub errors: Option<String>,
}

/// `WriteFileRequest`.
#[derive(Debug, Deserialize)]
pub(crate) struct WriteFile {
    pub content: String,
    pub path: String,
}
