//! Loads an agent spec from `examples/agents/triage.yaml` and runs it with a
//! scripted model; the spec's `content_match` condition ends the run.
//!
//! Run it with `cargo run --example yaml_agent`.

use std::path::Path;
use std::sync::Arc;

use rein::config::load_agent_spec_file;
use rein::prelude::*;
use rein::schemars;
use rein::serde_json::json;

/// The lookup tool's arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Customer {
    /// The customer's id.
    customer: String,
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
        .with_tools([tool_fn(
            "lookup",
            "Look up a customer's plan",
            |args: Customer, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(json!({ "customer": args.customer, "plan": "enterprise" }))
            },
        )])
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
