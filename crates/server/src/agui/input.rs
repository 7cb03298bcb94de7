//! AG-UI's `RunAgentInput`, and which of its messages are new to the thread.

use std::collections::HashSet;

use rein::contract::message::{Message, ToolCall};
use serde::Deserialize;
use serde_json::Value;

use crate::service::ApiError;

/// The input of one AG-UI run (unknown fields are ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RunAgentInput {
    pub(super) thread_id: String,
    pub(super) run_id: String,
    #[serde(default)]
    messages: Vec<AgUiMessage>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgUiMessage {
    id: String,
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Vec<AgUiToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AgUiToolCall {
    id: String,
    function: AgUiFunction,
}

#[derive(Debug, Deserialize)]
struct AgUiFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

/// A message's text: a string, or the text parts of a content list.
fn text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

impl RunAgentInput {
    /// The messages whose ids are not in `seen`, as Rein messages, and
    /// every new id (skipped roles included, so they stay skipped).
    pub(super) fn new_messages(
        &self,
        seen: &HashSet<String>,
    ) -> Result<(Vec<Message>, Vec<String>), ApiError> {
        let mut messages = Vec::new();
        let mut ids = Vec::new();
        for (i, m) in self.messages.iter().enumerate() {
            if seen.contains(&m.id) {
                continue;
            }
            ids.push(m.id.clone());
            let content = text(m.content.as_ref());
            match m.role.as_str() {
                "user" => messages.push(Message::user(content)),
                "assistant" => {
                    let calls = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            ids.push(c.id.clone());
                            let args = serde_json::from_str(&c.function.arguments).unwrap_or_else(
                                |_| serde_json::json!({"_raw_arguments": c.function.arguments}),
                            );
                            ToolCall::new(&c.id, &c.function.name, args)
                        })
                        .collect();
                    messages.push(Message::assistant_with_tools(content, calls));
                }
                "tool" => {
                    let call = m.tool_call_id.clone().ok_or_else(|| {
                        ApiError::new(
                            422,
                            "invalid_body",
                            format!(
                                "messages[{i}] (id \"{}\"): a tool message needs toolCallId",
                                m.id
                            ),
                        )
                    })?;
                    messages.push(Message::tool(call, content));
                }
                // Instructions come from the agent's spec; activity and
                // reasoning messages are the client's own.
                "system" | "developer" | "activity" | "reasoning" => {}
                other => {
                    return Err(ApiError::new(
                        422,
                        "invalid_body",
                        format!("messages[{i}] (id \"{}\"): unknown role \"{other}\"", m.id),
                    ));
                }
            }
        }
        Ok((messages, ids))
    }
}
