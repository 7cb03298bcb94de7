//! The `terminate` tool (after OpenManus): the model ends the run itself,
//! saying whether it succeeded.

use std::sync::Arc;

use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::StateError;
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::phase::{HookError, PhaseContext, PhaseHook};
use crate::plugin::{Plugin, PluginRegistrar};

/// Adds the tool `terminate { status: "success" | "failure", message?: string }`.
///
/// A valid call is answered like any tool call, then the run ends with
/// `Stopped { code: "terminate", detail }` where the detail holds the status
/// and the message (`status: success; message: all files converted`).
/// Invalid arguments give the model an error result and the run goes on.
#[derive(Debug, Clone, Copy, Default)]
pub struct TerminatePlugin;

impl TerminatePlugin {
    /// The plugin.
    pub fn new() -> Self {
        Self
    }
}

/// The validated arguments of a `terminate` call.
fn parse(args: &Value) -> Result<(String, Option<String>), ToolError> {
    let status = match args.get("status") {
        Some(Value::String(s)) if s == "success" || s == "failure" => s.clone(),
        Some(other) => {
            return Err(ToolError::new(format!(
                "invalid arguments: `status` must be \"success\" or \"failure\", got {other}"
            )));
        }
        None => {
            return Err(ToolError::new(
                "invalid arguments: `status` (\"success\" or \"failure\") is required",
            ));
        }
    };
    let message = match args.get("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(other) => {
            return Err(ToolError::new(format!(
                "invalid arguments: `message` must be a string, got {other}"
            )));
        }
    };
    Ok((status, message))
}

struct TerminateTool;

#[async_trait::async_trait]
impl Tool for TerminateTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            "terminate",
            "End the task. Call this when the request is fully done (status \"success\") or when you cannot make further progress (status \"failure\"); add a short message saying why.",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "status": { "type": "string", "enum": ["success", "failure"], "description": "How the task ended." },
                "message": { "type": "string", "description": "A short summary for the user." }
            },
            "required": ["status"]
        }))
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let (status, _) = parse(&args)?;
        Ok(ToolOutput::text(format!(
            "the task has ended with status {status}"
        )))
    }
}

struct TerminateHook;

#[async_trait::async_trait]
impl PhaseHook for TerminateHook {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let (Some(call), Some(result)) = (ctx.tool_call(), ctx.tool_result()) else {
            return Ok(());
        };
        if call.name != "terminate" || result.is_error {
            return Ok(());
        }
        let Ok((status, message)) = parse(&call.arguments) else {
            return Ok(());
        };
        let detail = match message {
            Some(m) => format!("status: {status}; message: {m}"),
            None => format!("status: {status}"),
        };
        ctx.request_termination(TerminationReason::stopped("terminate", detail));
        Ok(())
    }
}

impl Plugin for TerminatePlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_tool("terminate", Arc::new(TerminateTool));
        r.register_hook(Phase::AfterToolExecute, Arc::new(TerminateHook));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_validated() {
        assert_eq!(
            parse(&json!({"status": "success"})).unwrap(),
            ("success".into(), None)
        );
        assert_eq!(
            parse(&json!({"status": "failure", "message": "no access"})).unwrap(),
            ("failure".into(), Some("no access".into()))
        );
        assert!(
            parse(&json!({}))
                .unwrap_err()
                .message()
                .contains("is required")
        );
        assert!(
            parse(&json!({"status": "done"}))
                .unwrap_err()
                .message()
                .contains("got \"done\"")
        );
        assert!(
            parse(&json!({"status": "success", "message": 3}))
                .unwrap_err()
                .message()
                .contains("`message` must be a string")
        );
    }
}
