//! The tool seam: model-facing operations that consume other seams only.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{Owner, Result};

/// How far a long call has come, for front ends that show progress (MCP progress
/// notifications). Values only grow within one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Time since the call started.
    pub elapsed: Duration,
    /// Bytes of output produced so far.
    pub output_bytes: u64,
    /// A short human note, if the tool has one.
    pub message: Option<String>,
}

/// Receives [`Progress`] from a running tool call; the front end implements it.
pub trait ProgressSink: Send + Sync + fmt::Debug {
    /// One progress report.
    fn progress(&self, progress: Progress);
}

/// Per-call context.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The calling agent.
    pub owner: Arc<Owner>,
    /// The tool call's own cancellation: a child of the owner's token, so disposing the
    /// owner cancels every call it has in flight. A front end cancels it to abort the call.
    pub cancel: CancellationToken,
    /// Where progress goes, when the front end wants it.
    pub progress: Option<Arc<dyn ProgressSink>>,
}

impl ToolContext {
    /// A context whose cancel token is a fresh child of the owner's.
    pub fn new(owner: Arc<Owner>) -> Self {
        let cancel = owner.cancel_token().child_token();
        Self { owner, cancel, progress: None }
    }

    /// Routes progress reports to `sink`.
    #[must_use]
    pub fn with_progress(mut self, sink: Arc<dyn ProgressSink>) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Reports progress when a sink is attached.
    pub fn report(&self, progress: Progress) {
        if let Some(sink) = &self.progress {
            sink.progress(progress);
        }
    }
}

/// A tool result: text for the model plus optional structured data.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    /// The text the model reads.
    pub text: String,
    /// Structured fields.
    pub structured: Option<serde_json::Value>,
}

impl ToolOutput {
    /// Text only.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), structured: None }
    }

    /// Structured, with the JSON rendering as text.
    pub fn structured(value: serde_json::Value) -> Self {
        Self { text: value.to_string(), structured: Some(value) }
    }
}

/// Another tool that a tool's description, schema, results or errors point the model to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolRef {
    /// The tool pointed to.
    pub tool: String,
    /// Why, and how to do without it (shown when the composition lacks the tool), e.g.
    /// "run_in_background is offered; add `tool-jobs`, or set `enable_run_in_background:
    /// false`".
    pub because: String,
}

/// One model-facing tool.
///
/// # Contract
/// Arguments are validated against the schema's serde type; bad input is
/// `invalid_argument` naming the field.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug + 'static {
    /// Tool name (may come from a provider's dialect, so it is not `'static`).
    fn name(&self) -> &str;
    /// Description shown to the model.
    fn description(&self) -> &str;
    /// JSON schema of the arguments.
    fn input_schema(&self) -> serde_json::Value;
    /// Other tools this tool points the model to. The registry refuses a composition that
    /// lacks one, so a model is never sent to a tool it does not have.
    fn refers_to(&self) -> Vec<ToolRef> {
        Vec::new()
    }
    /// True when one owner's calls to this tool run one at a time, first in, first out:
    /// a front end that receives several at once (MCP) starts them in the order they
    /// arrived, not in the order its tasks happen to reach the tool.
    fn serial(&self) -> bool {
        false
    }
    /// Runs the tool.
    ///
    /// # Errors
    /// `invalid_argument` for bad args; seam errors otherwise.
    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput>;
}
