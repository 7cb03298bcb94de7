//! Tools: work the model can ask for.
//!
//! A tool is called with JSON arguments and a [`ToolContext`] whose
//! `cancellation` token is a child of the run's. Honouring it is how a tool
//! stops promptly; a tool that ignores it is dropped at its next await when
//! its run is cancelled.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::CancellationToken;
use crate::lifecycle::ToolCallStatus;

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDescriptor {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON schema of its arguments (default: an object with no declared
    /// properties). Shared: cloning a descriptor does not copy it.
    pub parameters: ToolSchema,
}

impl ToolDescriptor {
    /// A descriptor whose parameters accept any object.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters: ToolSchema::new(serde_json::json!({"type": "object", "properties": {}})),
        }
    }

    /// Sets the JSON schema of the arguments.
    pub fn with_parameters(mut self, schema: serde_json::Value) -> Self {
        self.parameters = ToolSchema::new(schema);
        self
    }
}

/// A tool's JSON schema, shared by every copy of its [`ToolDescriptor`].
///
/// Every run's request carries the agent's descriptors, so a schema copied
/// per run would cost each live run its whole JSON tree (~1.8 KB for a
/// one-parameter tool); clones of a `ToolSchema` share one. It reads as the
/// [`serde_json::Value`] it holds (`Deref`), compares equal to one, and
/// serializes as it.
///
/// ```
/// use rein_runtime_contract::tool::ToolDescriptor;
/// use serde_json::json;
///
/// let d = ToolDescriptor::new("add", "adds").with_parameters(json!({"required": ["a"]}));
/// assert_eq!(d.parameters["required"][0], "a");
/// assert_eq!(d.parameters, json!({"required": ["a"]}));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ToolSchema(Arc<serde_json::Value>);

impl ToolSchema {
    /// A schema holding `schema`.
    pub fn new(schema: serde_json::Value) -> Self {
        Self(Arc::new(schema))
    }

    /// The schema as JSON.
    pub fn value(&self) -> &serde_json::Value {
        &self.0
    }

    /// The schema as owned JSON (a copy unless this is its only holder).
    pub fn into_value(self) -> serde_json::Value {
        Arc::unwrap_or_clone(self.0)
    }
}

impl std::ops::Deref for ToolSchema {
    type Target = serde_json::Value;

    fn deref(&self) -> &serde_json::Value {
        &self.0
    }
}

impl std::fmt::Display for ToolSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<serde_json::Value> for ToolSchema {
    fn from(schema: serde_json::Value) -> Self {
        Self::new(schema)
    }
}

impl PartialEq for ToolSchema {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl PartialEq<serde_json::Value> for ToolSchema {
    fn eq(&self, other: &serde_json::Value) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<ToolSchema> for serde_json::Value {
    fn eq(&self, other: &ToolSchema) -> bool {
        *self == *other.0
    }
}

impl Serialize for ToolSchema {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolSchema {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(Self::new)
    }
}

/// Where a tool call runs: its thread, run and call ids, and its
/// cancellation token (a child of the run's).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ToolContext {
    /// The thread the run belongs to.
    pub thread_id: String,
    /// The run making the call.
    pub run_id: String,
    /// The model's id for this call.
    pub call_id: String,
    /// Cancelled when the run is cancelled (or its deadline passes).
    pub cancellation: CancellationToken,
}

impl ToolContext {
    /// A context, e.g. for calling a tool directly in a test.
    pub fn new(
        thread_id: impl Into<String>,
        run_id: impl Into<String>,
        call_id: impl Into<String>,
        cancellation: CancellationToken,
    ) -> Self {
        Self {
            thread_id: thread_id.into(),
            run_id: run_id.into(),
            call_id: call_id.into(),
            cancellation,
        }
    }
}

/// A tool's successful output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The output; a JSON string is shown to the model as plain text,
    /// anything else as JSON.
    pub value: serde_json::Value,
}

impl ToolOutput {
    /// Plain text output.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            value: serde_json::Value::String(text.into()),
        }
    }

    /// JSON output.
    pub fn json(value: serde_json::Value) -> Self {
        Self { value }
    }

    /// The text the model sees.
    pub fn to_content(&self) -> String {
        match &self.value {
            serde_json::Value::String(s) => s.clone(),
            // Written straight into a buffer: `Display` goes through a
            // formatter adapter, several times slower on small values. A
            // `Value` always serializes (its keys are strings).
            // The text joins the history, so it gives back the buffer's
            // spare room (serde_json starts it at 128 bytes).
            other => {
                let mut text = serde_json::to_string(other).unwrap_or_else(|_| other.to_string());
                text.shrink_to_fit();
                text
            }
        }
    }
}

/// A tool's failure; its message is shown to the model as an error result.
///
/// A failure whose outcome is uncertain — the tool may have had its
/// effect although no result came back (a timeout, a server that exited,
/// a result too large to read) — carries a [`ToolCallStatus`]: the call
/// is then recorded like a call the run's cancel stopped, in the stop
/// report and in the tool message's `tool_status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    message: String,
    status: Option<ToolCallStatus>,
}

impl ToolError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            status: None,
        }
    }

    /// The same error, recorded with `status` (e.g.
    /// [`ToolCallStatus::MayHaveCompleted`] when the call may have had its
    /// effect).
    #[must_use]
    pub fn with_status(mut self, status: ToolCallStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What became of the call, when its outcome is uncertain.
    pub fn status(&self) -> Option<ToolCallStatus> {
        self.status
    }
}

/// A tool the model can call.
///
/// `execute` may be dropped at any await point when the run is cancelled;
/// do not leave shared state half-updated across an await.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// The tool's name, description and argument schema.
    fn descriptor(&self) -> ToolDescriptor;

    /// Runs the tool.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] the model sees as an error result; the run goes on.
    async fn execute(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError>;

    /// Whether the tool has no side effects. A read-only call stopped
    /// before it finished is recorded as `interrupted`; any other as
    /// `may_have_completed` (its outcome is unknown). Default: `false`.
    fn read_only(&self) -> bool {
        false
    }

    /// The compact form of this tool's calls: the argument keys an old
    /// call keeps when the agent's context policy compacts it (a
    /// `write_file` keeps `["path"]` and drops the content); the other
    /// arguments go to the artifact store, replaced by a reference that
    /// `read_artifact` reads. `None` (the default): old calls keep their
    /// arguments. An agent's `compact.calls` rule for the tool wins.
    fn compact_call(&self) -> Option<Vec<String>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_output_is_shown_verbatim_and_json_as_json() {
        assert_eq!(ToolOutput::text("hi").to_content(), "hi");
        assert_eq!(
            ToolOutput::json(serde_json::json!({"ok": true})).to_content(),
            r#"{"ok":true}"#
        );
    }
}
