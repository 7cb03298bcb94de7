//! Loads an agent spec from `examples/agents/triage.yaml` and runs it with a
//! scripted model; the spec's `content_match` condition ends the run.
//!
//! Run it with `cargo run --example yaml_agent`.

use std::path::Path;
use std::sync::Arc;

use rein::config::load_agent_spec_file;
use rein::prelude::*;
use rein::serde_json::json;

struct Lookup;

#[rein::async_trait]
impl Tool for Lookup {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("lookup", "Look up a customer's plan")
    }

    async fn execute(
        &self,
        args: rein::serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::json(
            json!({ "customer": args["customer"], "plan": "enterprise" }),
        ))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/triage.yaml");
    let spec = load_agent_spec_file(&path)?;
    println!(
        "loaded agent \"{}\" with {} stop conditions",
        spec.id,
        spec.stop_conditions.len()
    );

    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("lookup", json!({ "customer": "acme" })),
        ScriptedResponse::text("Enterprise customer, outage reported.\nTRIAGED high"),
    ]);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec)
        .with_model(ModelSpec::new("scripted", "offline", "triage-script"))
        .with_provider("offline", Arc::new(model))
        .with_tool("lookup", Arc::new(Lookup))
        .build()?;
    let result = runtime
        .run_to_completion(RunRequest::new(
            "ticket-42",
            vec![Message::user("Acme: everything is down!")],
        ))
        .await?;
    println!("response: {}", result.response);
    println!("termination: {}", result.termination);
    Ok(())
}
