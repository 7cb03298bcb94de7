//! AG-UI's `RunAgentInput`, and which of its messages are new to the thread.

use rein::contract::message::{Message, ToolCall};
use serde::Deserialize;
use serde_json::Value;

use crate::http::ApiError;
use crate::service::ClientMessage;

/// The input of one AG-UI run (unknown fields are ignored).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunAgentInput {
    pub(crate) thread_id: String,
    pub(crate) run_id: String,
    #[serde(default)]
    messages: Vec<AgUiMessage>,
    /// Answers to the interrupts a parked run's stream ended with.
    #[serde(default)]
    pub(crate) resume: Vec<ResumeEntry>,
    /// What the client forwards: Rein reads `run_mode` and
    /// `automation_policy` from it, or from its `metadata` object.
    #[serde(default)]
    forwarded_props: Option<Value>,
}

/// A forwarded value with the path a refusal names.
pub(crate) type Forwarded = Option<(String, Value)>;

impl RunAgentInput {
    /// The forwarded `run_mode` and `automation_policy` (each at the top
    /// of `forwardedProps` or in its `metadata`), with the field path a
    /// refusal names.
    pub(crate) fn auto_props(&self) -> (Forwarded, Forwarded) {
        let Some(props) = self.forwarded_props.as_ref().and_then(Value::as_object) else {
            return (None, None);
        };
        let metadata = props.get("metadata").and_then(Value::as_object);
        let find = |key: &str| {
            props
                .get(key)
                .map(|v| (format!("forwardedProps.{key}"), v.clone()))
                .or_else(|| {
                    metadata
                        .and_then(|m| m.get(key))
                        .map(|v| (format!("forwardedProps.metadata.{key}"), v.clone()))
                })
        };
        (find("run_mode"), find("automation_policy"))
    }
}

/// One entry of `RunAgentInput.resume`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResumeEntry {
    pub(crate) interrupt_id: String,
    /// `resolved` (decided by `payload`) or `cancelled` (rejected).
    pub(crate) status: String,
    #[serde(default)]
    pub(crate) payload: Option<Value>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
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
    /// Set on a sub-agent's messages: they belong to its own thread.
    #[serde(default)]
    subagent_run_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct AgUiToolCall {
    id: String,
    function: AgUiFunction,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
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
    /// The conversation as client messages: each with its ids (its own
    /// and its tool calls'), and the Rein message to append if its ids
    /// are new to the thread (`None` for roles that are not stored, and
    /// for a sub-agent's messages — those with a `subagentRunId`, which
    /// its own thread holds — so they stay skipped).
    pub(super) fn client_messages(&self) -> Result<Vec<ClientMessage>, ApiError> {
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let mut ids = vec![m.id.clone()];
            let content = text(m.content.as_ref());
            let message = match m.role.as_str() {
                _ if m.subagent_run_id.is_some() => {
                    ids.extend(m.tool_calls.iter().map(|c| c.id.clone()));
                    None
                }
                "user" => Some(Message::user(content)),
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
                    Some(Message::assistant_with_tools(content, calls))
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
                    Some(Message::tool(call, content))
                }
                // Instructions: the service refuses them, as it does for
                // the HTTP API (one policy, in `rein-service`).
                "system" | "developer" => Some(Message::system(content)),
                // Activity and reasoning messages are the client's own.
                "activity" | "reasoning" => None,
                other => {
                    return Err(ApiError::new(
                        422,
                        "invalid_body",
                        format!("messages[{i}] (id \"{}\"): unknown role \"{other}\"", m.id),
                    ));
                }
            };
            out.push(ClientMessage { ids, message });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_agents_messages_are_known_but_never_appended() {
        let input: RunAgentInput = serde_json::from_value(serde_json::json!({
            "threadId": "t", "runId": "r",
            "messages": [
                {"id": "u1", "role": "user", "content": "hi"},
                {"id": "c1-m1", "role": "assistant", "content": "child text", "subagentRunId": "c1",
                 "toolCalls": [{"id": "c1:call_1", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
                {"id": "c1-m2", "role": "tool", "toolCallId": "c1:call_1", "content": "r", "subagentRunId": "c1"},
            ],
        }))
        .unwrap();
        let messages = input.client_messages().unwrap();
        assert!(messages[0].message.is_some());
        assert!(messages[1].message.is_none() && messages[2].message.is_none());
        assert_eq!(messages[1].ids, vec!["c1-m1", "c1:call_1"]);
    }
}
