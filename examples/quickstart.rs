//! The quickstart: one agent, one tool, an offline scripted model.
//!
//! Run it with `cargo run --example quickstart`. It prints the answer as it
//! streams, each tool call with its result, and why the run ended.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use rein::prelude::*;
use rein::serde_json::json;

/// A tool that reports the weather of a city (from a fixed table).
struct Weather;

#[rein::async_trait]
impl Tool for Weather {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("weather", "Current weather for a city").with_parameters(json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"]
        }))
    }

    async fn execute(
        &self,
        args: rein::serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let city = args["city"]
            .as_str()
            .ok_or_else(|| ToolError::new("missing string argument \"city\""))?;
        let (sky, celsius) = match city {
            "Paris" => ("light rain", 14),
            "Lisbon" => ("sunny", 22),
            _ => return Err(ToolError::new(format!("no weather station for \"{city}\""))),
        };
        Ok(ToolOutput::json(
            json!({ "city": city, "sky": sky, "celsius": celsius }),
        ))
    }
}

/// Prints events as they happen.
struct Printer;

impl EventSink for Printer {
    fn emit(&self, event: AgentEvent) {
        match event {
            AgentEvent::TextDelta { delta, .. } => {
                print!("{delta}");
                let _ = std::io::stdout().flush();
            }
            AgentEvent::ToolCallStarted {
                name, arguments, ..
            } => println!("\n[tool call] {name} {arguments}"),
            AgentEvent::ToolCallFinished {
                name,
                result,
                is_error,
                ..
            } => {
                let status = if is_error { "error" } else { "ok" };
                println!("[tool result] {name} ({status}): {result}");
            }
            AgentEvent::RunFinished {
                termination,
                steps,
                usage,
                ..
            } => println!(
                "\n[run finished] {termination} after {steps} rounds, {} tokens in / {} out",
                usage.input_tokens, usage.output_tokens
            ),
            _ => {}
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The model's two answers, scripted: first it asks for the weather, then
    // it answers with the tool's result. Words stream 40 ms apart.
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("Let me check the weather in Paris.")
            .with_tool_call("weather", json!({ "city": "Paris" }))
            .with_usage(42, 12)
            .with_chunk_delay(Duration::from_millis(40)),
        ScriptedResponse::text("It is 14 °C with light rain in Paris: take an umbrella.")
            .with_usage(71, 15)
            .with_chunk_delay(Duration::from_millis(40)),
    ]);

    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("assistant")
                .with_model_id("scripted")
                .with_system_prompt("You are a concise assistant.")
                .with_max_rounds(8),
        )
        .with_model(ModelSpec::new("scripted", "offline", "quickstart-script"))
        .with_provider("offline", Arc::new(model))
        .with_tool("weather", Arc::new(Weather))
        .build()?;

    let request = RunRequest::new(
        "quickstart",
        vec![Message::user("Do I need an umbrella in Paris?")],
    );
    println!("> Do I need an umbrella in Paris?");
    let result = runtime.run(request, Arc::new(Printer)).await?;

    println!(
        "termination: {}",
        rein::serde_json::to_string(&result.termination)?
    );
    println!(
        "history: {} messages",
        runtime.thread_messages("quickstart").await.len()
    );
    Ok(())
}
