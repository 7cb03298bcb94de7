//! Auto mode: a scripted agent runs one experiment per round and reports its
//! metrics; the policy (the source document's goal-driven example, loaded
//! unchanged) stops the session once both goals hold on the latest report.
//!
//! Run it with `cargo run --example auto_mode`.

use std::sync::{Arc, Mutex};

use rein::auto::{AutomationPlugin, AutomationPolicy};
use rein::prelude::*;
use rein::serde_json::json;

const POLICY: &str = r#"{
  "automation_policy": {
    "logic": "AND",
    "goals": [
      { "metric": "Val ACC", "operator": ">=", "value": 0.95 },
      { "metric": "Val Loss", "operator": "<", "value": 0.15 }
    ],
    "maxExperiments": 50,
    "maxTokens": 5000000,
    "strictHeuristics": false
  }
}"#;

/// Prints progress events.
struct Progress;

impl EventSink for Progress {
    fn emit(&self, event: AgentEvent) {
        if let AgentEvent::Progress {
            message,
            tokens_used_session,
            max_tokens,
            ..
        } = event
        {
            let budget = max_tokens.map(|m| format!("/{m}")).unwrap_or_default();
            println!("[progress] {message} (tokens {tokens_used_session}{budget})");
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = AutomationPolicy::from_json(POLICY)?;

    // Each round: train (report the next, better metrics), then summarize.
    let results = [
        (0.81, 0.42),
        (0.89, 0.27),
        (0.93, 0.19),
        (0.96, 0.12),
        (0.97, 0.10),
    ];
    let experiment = Mutex::new(0usize);
    let model = ScriptedExecutor::from_fn(move |req| {
        if req.messages.last().is_some_and(|m| m.role == Role::User) {
            let mut n = experiment.lock().unwrap_or_else(|e| e.into_inner());
            let (acc, loss) = results[(*n).min(results.len() - 1)];
            *n += 1;
            ScriptedResponse::text(format!("Running experiment {}.", *n))
                .with_tool_call(
                    "report_metrics",
                    json!({ "metrics": { "Val ACC": acc, "Val Loss": loss } }),
                )
                .with_usage(900, 120)
        } else {
            ScriptedResponse::text("Experiment finished; metrics reported.").with_usage(1000, 30)
        }
    });

    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("researcher")
                .with_model_id("scripted")
                .with_plugin_id("auto"),
        )
        .with_model(ModelSpec::new("scripted", "offline", "auto-script"))
        .with_provider("offline", Arc::new(model))
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .build()?;

    let request = RunRequest::new(
        "study",
        vec![Message::user(
            "Tune the classifier until it is good enough.",
        )],
    );
    let result = runtime
        .auto_run(request, policy, Arc::new(Progress))
        .await?;
    println!("stop reason: {}", result.stop_reason);
    println!(
        "rounds: {}, session tokens: {}",
        result.rounds, result.tokens_used_session
    );
    Ok(())
}
