//! The quickstart: one agent, one typed tool, an offline scripted model.
//!
//! Run it with `cargo run --example quickstart`. It prints the answer as it
//! streams (stdout), each tool call with its result and why the run ended
//! (stderr).

use std::sync::Arc;
use std::time::Duration;

use rein::prelude::*;
use rein::schemars;
use rein::serde_json::json;

/// The weather tool's arguments; their JSON schema is generated.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city, e.g. "Paris".
    city: String,
}

/// The weather tool's output, shown to the model as JSON.
#[derive(serde::Serialize)]
struct Weather {
    city: String,
    sky: &'static str,
    celsius: i32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let weather = tool_fn(
        "weather",
        "Current weather for a city",
        |args: City, _ctx: ToolContext| async move {
            let (sky, celsius) = match args.city.as_str() {
                "Paris" => ("light rain", 14),
                "Lisbon" => ("sunny", 22),
                other => {
                    return Err(ToolError::new(format!(
                        "no weather station for \"{other}\""
                    )));
                }
            };
            Ok(Weather {
                city: args.city,
                sky,
                celsius,
            })
        },
    );

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
        .with_tools([weather])
        .build()?;

    let request = RunRequest::new(
        "quickstart",
        vec![Message::user("Do I need an umbrella in Paris?")],
    );
    println!("> Do I need an umbrella in Paris?");
    let result = TerminalPrinter::new()
        .print_stream(runtime.run_stream(request))
        .await?;

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
