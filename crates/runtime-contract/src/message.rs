//! Conversation messages: what a thread's history is made of.
//!
//! A history is valid for every provider when each assistant [`ToolCall`] is
//! answered by exactly one [`Role::Tool`] message carrying its id. The runtime
//! keeps that true on every exit path; this module only defines the data.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model. Rein sends the agent's system prompt
    /// separately and never stores it in the history.
    System,
    /// Input from the user (or a nudge injected by the runtime).
    User,
    /// The model's answer, possibly with tool calls.
    Assistant,
    /// The result of one tool call; `tool_call_id` names the call.
    Tool,
}

/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolCall {
    /// Provider-assigned id, unique within the thread's history.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as JSON.
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A tool call with the given id, tool name and arguments.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }
}

/// The outcome of one tool call as it is recorded in the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The text the model will see.
    pub content: String,
    /// Whether the call failed (error, panic, not run, cancelled).
    pub is_error: bool,
}

impl ToolResult {
    /// This result as a [`Role::Tool`] history message.
    pub fn to_message(&self) -> Message {
        Message::tool(self.call_id.clone(), self.content.clone())
    }

    /// This result as a [`Role::Tool`] history message, without copying.
    pub fn into_message(self) -> Message {
        Message::tool(self.call_id, self.content)
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text (for tool messages, the tool's output).
    #[serde(default)]
    pub content: String,
    /// Tool calls requested by an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a [`Role::Tool`] message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `true` when this assistant text was cut off by cancellation; the
    /// content is kept exactly as far as it had streamed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// For a [`Role::Tool`] message answering a call that did not
    /// complete normally: what became of it (its text says the same).
    /// `None` for a call that completed (with a result or an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_status: Option<crate::lifecycle::ToolCallStatus>,
}

impl Message {
    fn plain(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            interrupted: false,
            tool_status: None,
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(Role::User, content)
    }

    /// An assistant message without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain(Role::Assistant, content)
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(Role::System, content)
    }

    /// An assistant message with tool calls.
    pub fn assistant_with_tools(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls,
            ..Self::plain(Role::Assistant, content)
        }
    }

    /// A tool result answering the call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::plain(Role::Tool, content)
        }
    }
}

/// Tokens one inference (or a sum of them) consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

impl TokenUsage {
    /// Usage of `input` prompt and `output` completion tokens.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
        }
    }

    /// Input plus output tokens (saturating).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds `other` to this usage (saturating).
    pub fn add(&mut self, other: TokenUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// What a provider's prompt cache did for an inference (or a sum of
/// them): of the prompt tokens in [`TokenUsage::input_tokens`], how many
/// were read from the cache and how many were written to it.
///
/// Reported only by providers that say so (Anthropic's
/// `cache_read_input_tokens` / `cache_creation_input_tokens`, OpenAI's
/// `cached_tokens`); `None` where it is carried means the provider said
/// nothing, never zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct CacheUsage {
    /// Prompt tokens served from the cache (billed at a discount).
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the cache (Anthropic bills them at a
    /// premium; the next request reads them).
    pub cache_write_tokens: u64,
}

impl CacheUsage {
    /// `cached` tokens read from the cache and `written` written to it.
    pub fn new(cached_input_tokens: u64, cache_write_tokens: u64) -> Self {
        Self {
            cached_input_tokens,
            cache_write_tokens,
        }
    }

    /// Adds `other` to this usage (saturating).
    pub fn add(&mut self, other: CacheUsage) {
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_serialize_without_empty_fields() {
        let json = serde_json::to_value(Message::user("hi")).unwrap();
        assert_eq!(json, serde_json::json!({"role": "user", "content": "hi"}));
    }

    #[test]
    fn usage_addition_saturates() {
        let mut u = TokenUsage::new(u64::MAX, 1);
        u.add(TokenUsage::new(5, 2));
        assert_eq!(u, TokenUsage::new(u64::MAX, 3));
        assert_eq!(u.total(), u64::MAX);
    }
}
