//! The `scripted` provider's replies: a string (a text reply) or a mapping
//! with text, tool calls, an error, delays and the usage it reports.

use std::fmt;
use std::time::Duration;

use rein::contract::inference::{InferenceError, InferenceErrorKind};
use rein::engine::ScriptedResponse;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// One reply of a scripted provider.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedItem {
    /// A text reply (the string form).
    Text(String),
    /// The mapping form.
    Reply(ScriptedReply),
}

/// A scripted reply in full: `tool_calls` come after the text; `error` is
/// a non-retryable inference error.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    /// The text, streamed one word per chunk.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls after the text.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// A non-retryable error instead of a reply: the run ends `error`.
    #[serde(default)]
    pub error: Option<String>,
    /// Wait before the reply starts, in milliseconds.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Wait between streamed chunks, in milliseconds.
    #[serde(default)]
    pub chunk_delay_ms: Option<u64>,
    /// The tokens the reply reports having used, so token budgets and
    /// usage can be shown offline (none reported when absent).
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
}

/// `usage: { input: 120, output: 30 }` of a scripted reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (default `{}`).
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

impl<'de> Deserialize<'de> for ScriptedItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = ScriptedItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a text reply or a mapping { text, tool_calls, error, delay_ms, chunk_delay_ms }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ScriptedItem, E> {
                Ok(ScriptedItem::Text(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ScriptedItem, A::Error> {
                ScriptedReply::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ScriptedItem::Reply)
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

impl ScriptedItem {
    /// The executor's response, with the provider's default delays where
    /// the reply sets none.
    pub fn to_response(
        &self,
        delay_ms: Option<u64>,
        chunk_delay_ms: Option<u64>,
    ) -> ScriptedResponse {
        let reply = match self {
            Self::Text(text) => ScriptedReply {
                text: Some(text.clone()),
                ..ScriptedReply::default()
            },
            Self::Reply(reply) => reply.clone(),
        };
        let mut response = if let Some(error) = &reply.error {
            ScriptedResponse::error(InferenceError::new(
                InferenceErrorKind::InvalidRequest,
                error.clone(),
            ))
        } else {
            let mut r = ScriptedResponse::text(reply.text.clone().unwrap_or_default());
            for call in &reply.tool_calls {
                r = r.with_tool_call(call.name.clone(), call.arguments.clone());
            }
            if let Some(usage) = reply.usage {
                r = r.with_usage(usage.input, usage.output);
            }
            r
        };
        if let Some(ms) = reply.delay_ms.or(delay_ms) {
            response = response.with_delay(Duration::from_millis(ms));
        }
        if let Some(ms) = reply.chunk_delay_ms.or(chunk_delay_ms) {
            response = response.with_chunk_delay(Duration::from_millis(ms));
        }
        response
    }
}
