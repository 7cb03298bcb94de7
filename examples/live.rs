//! The quickstart agent against a real model.
//!
//! ```text
//! cargo run --example live -- --base-url http://127.0.0.1:8080/v1/ [--model smollm2]
//! cargo run --example live -- --model gpt-4o-mini      # provider key from the environment
//! ```
//!
//! Without `--base-url`, `REIN_LLM_BASE_URL` is used when set (the local
//! model server prints it: `export $(cargo xtask local-llm start | tail -n 1)`).
//! With neither, the model name picks a hosted provider through genai, with
//! its key from the usual environment variable (`OPENAI_API_KEY`,
//! `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`, …).
//!
//! Local OpenAI-compatible servers (llama.cpp) answer a streamed request
//! whose `tool_choice` is `auto` with an empty body, so against a base URL
//! the example forces the first call (`RunRequest::with_tool_choice`) and
//! lets the spec's `none` apply afterwards.

use std::sync::Arc;

use rein::engine::GenaiExecutor;
use rein::prelude::*;
use rein::schemars;

/// The weather tool's arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city, e.g. "Paris".
    city: String,
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let base_url = flag(&args, "--base-url").or_else(|| std::env::var("REIN_LLM_BASE_URL").ok());
    let model = flag(&args, "--model").unwrap_or_else(|| "smollm2".to_owned());

    let (executor, spec_choice, first_choice) = match &base_url {
        Some(url) => (
            GenaiExecutor::openai_compatible(url.clone(), std::env::var("REIN_LLM_API_KEY").ok()),
            ToolChoice::None,
            Some(ToolChoice::Tool("weather".to_owned())),
        ),
        None => (GenaiExecutor::new(), ToolChoice::Auto, None),
    };
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("assistant")
                .with_model_id("live")
                .with_system_prompt(
                    "You are a concise assistant. Use the weather tool for weather questions.",
                )
                .with_max_rounds(4)
                .with_tool_choice(spec_choice),
        )
        .with_model(
            ModelSpec::new("live", "provider", model)
                .with_temperature(0.0)
                .with_max_output_tokens(64),
        )
        .with_provider("provider", Arc::new(executor))
        .with_tools([tool_fn(
            "weather",
            "Current weather for a city",
            |args: City, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(rein::serde_json::json!({
                    "city": args.city, "sky": "light rain", "celsius": 14
                }))
            },
        )])
        .build()?;

    let question = "Do I need an umbrella in Paris today?";
    println!("> {question}");
    let mut request = RunRequest::new("live", vec![Message::user(question)]);
    if let Some(choice) = first_choice {
        request = request.with_tool_choice(choice);
    }
    // The answer streams to stdout; tool calls, retries and the end to stderr.
    let result = TerminalPrinter::new()
        .print_stream(runtime.run_stream(request))
        .await?;
    println!("termination: {}", result.termination);
    let usage = if result.usage_complete {
        format!("{:?}", result.usage)
    } else {
        "not fully reported".to_owned()
    };
    println!("rounds: {}, usage: {usage}", result.steps);
    Ok(())
}
