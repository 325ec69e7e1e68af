//! The tool seam: model-facing operations that consume other seams only.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{Owner, Result};

/// Per-call context.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The calling agent.
    pub owner: Arc<Owner>,
    /// The tool call's own cancellation.
    pub cancel: CancellationToken,
}

impl ToolContext {
    /// A context with a fresh cancel token.
    pub fn new(owner: Arc<Owner>) -> Self {
        Self { owner, cancel: CancellationToken::new() }
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

/// One model-facing tool.
///
/// # Contract
/// Arguments are validated against the schema's serde type; bad input is
/// `invalid_argument` naming the field.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug + 'static {
    /// Tool name.
    fn name(&self) -> &'static str;
    /// Description shown to the model.
    fn description(&self) -> &'static str;
    /// JSON schema of the arguments.
    fn input_schema(&self) -> serde_json::Value;
    /// Runs the tool.
    ///
    /// # Errors
    /// `invalid_argument` for bad args; seam errors otherwise.
    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput>;
}
