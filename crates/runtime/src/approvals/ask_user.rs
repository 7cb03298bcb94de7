//! The `ask_user` plugin: a tool through which the model asks the person a
//! question; the call parks the run like an `ask` approval, and the answer
//! (a `respond` decision) is the call's result.

use std::sync::Arc;

use rein_runtime_contract::state::StateError;
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::plugin::{Plugin, PluginRegistrar};

/// The tool's name.
pub const ASK_USER: &str = "ask_user";

/// Adds the tool `ask_user { question: string, options?: [string] }`.
///
/// A call is never executed: it parks the run with a pending entry of kind
/// `question`; a `respond` decision's `result` is what the model sees (a
/// `reject` tells it the person declined). So a model that asks through the
/// tool is never misread, unlike a question in prose.
#[derive(Debug, Clone, Copy, Default)]
pub struct AskUserPlugin;

impl AskUserPlugin {
    /// The plugin.
    pub fn new() -> Self {
        Self
    }
}

impl Plugin for AskUserPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_tool(ASK_USER, Arc::new(AskUserTool));
        r.asks_user = true;
        Ok(())
    }
}

struct AskUserTool;

#[async_trait::async_trait]
impl Tool for AskUserTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            ASK_USER,
            "Ask the user a question and wait for the answer. Use it when you need a decision, permission or information only the user has; give `options` when the answer is one of a few choices.",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "question": { "type": "string", "description": "The question, addressed to the user." },
                "options": { "type": "array", "items": { "type": "string" }, "description": "The answers to choose from, if the answer is a choice." }
            },
            "required": ["question"]
        }))
    }

    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        // The gate holds every call of this tool; reaching here means the
        // agent lists the tool without the plugin's gate.
        Err(ToolError::new(
            "ask_user is answered by a person: list the `ask_user` plugin in the agent's plugin_ids",
        ))
    }
}

/// The question and options of an `ask_user` call (a call without a
/// string `question` shows its arguments as the question).
pub(crate) fn question_of(arguments: &Value) -> (String, Vec<String>) {
    let question = match arguments.get("question") {
        Some(Value::String(q)) => q.clone(),
        _ => arguments.to_string(),
    };
    let options = arguments
        .get("options")
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (question, options)
}
