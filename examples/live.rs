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

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rein::engine::GenaiExecutor;
use rein::prelude::*;
use rein::serde_json::json;

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
        let city = args["city"].as_str().unwrap_or("Paris");
        Ok(ToolOutput::json(
            json!({ "city": city, "sky": "light rain", "celsius": 14 }),
        ))
    }
}

/// Prints events as they happen: the answer as it streams, tool calls and
/// retries on lines of their own.
#[derive(Default)]
struct Printer {
    /// Streamed text was printed and its line is not finished yet.
    mid_line: AtomicBool,
}

impl Printer {
    /// Finishes the streamed answer's line, if one is open, so that what
    /// follows (and the program's last line) starts on a line of its own.
    fn end_line(&self) {
        if self.mid_line.swap(false, Ordering::Relaxed) {
            println!();
        }
    }
}

impl EventSink for Printer {
    fn emit(&self, event: AgentEvent) {
        match event {
            AgentEvent::TextDelta { delta, .. } => {
                print!("{delta}");
                let _ = std::io::stdout().flush();
                if !delta.is_empty() {
                    self.mid_line
                        .store(!delta.ends_with('\n'), Ordering::Relaxed);
                }
            }
            AgentEvent::ToolCallStarted {
                name, arguments, ..
            } => {
                self.end_line();
                println!("[tool call] {name} {arguments}");
            }
            AgentEvent::ToolCallFinished { name, result, .. } => {
                self.end_line();
                println!("[tool result] {name}: {result}");
            }
            AgentEvent::InferenceRetry {
                error, delay_ms, ..
            } => {
                self.end_line();
                println!("[retry in {delay_ms} ms] {error}");
            }
            _ => {}
        }
    }
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
        .with_tool("weather", Arc::new(Weather))
        .build()?;

    let question = "Do I need an umbrella in Paris today?";
    println!("> {question}");
    let mut request = RunRequest::new("live", vec![Message::user(question)]);
    if let Some(choice) = first_choice {
        request = request.with_tool_choice(choice);
    }
    let printer = Arc::new(Printer::default());
    let result = runtime.run(request, printer.clone()).await;
    // The answer streams without a newline; end its line before anything
    // else is printed, the error of a failed run included.
    printer.end_line();
    let result = result?;
    println!("termination: {}", result.termination);
    let usage = if result.usage_complete {
        format!("{:?}", result.usage)
    } else {
        "not fully reported".to_owned()
    };
    println!("rounds: {}, usage: {usage}", result.steps);
    Ok(())
}
