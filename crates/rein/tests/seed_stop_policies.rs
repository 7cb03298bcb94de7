//! The code of the "Configure Stop Policies" page of the reference runtime,
//! with only the crate name changed (`awaken` → `rein`): each snippet
//! compiles, builds its runtime, and behaves as the page describes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

use std::sync::Arc;

use rein::prelude::{
    AgentSpec, CollectingSink, Message, RunRequest, ScriptedExecutor, ScriptedResponse,
};

fn spec() -> AgentSpec {
    AgentSpec::new("assistant").with_model_id("claude-sonnet")
}

#[test]
fn create_policies_programmatically_and_register_a_stop_condition_plugin()
-> Result<(), Box<dyn std::error::Error>> {
    let spec = spec();
    // --- from the page ---
    use rein::policies::{
        ConsecutiveErrorsPolicy, MaxRoundsPolicy, StopPolicy, TimeoutPolicy, TokenBudgetPolicy,
    };
    use std::sync::Arc;

    let policies: Vec<Arc<dyn StopPolicy>> = vec![
        Arc::new(MaxRoundsPolicy::new(25)),
        Arc::new(TokenBudgetPolicy::new(100_000)),
        Arc::new(TimeoutPolicy::new(300_000)), // 5 minutes in ms
        Arc::new(ConsecutiveErrorsPolicy::new(3)),
    ];

    use rein::AgentRuntimeBuilder;
    use rein::engine::GenaiExecutor;
    use rein::policies::StopConditionPlugin;
    use rein::registry_spec::ModelSpec;

    let mut spec = spec;
    spec.plugin_ids.push("stop-condition".into());

    let runtime = AgentRuntimeBuilder::new()
        .with_plugin(
            "stop-condition",
            Arc::new(StopConditionPlugin::new(policies)),
        )
        .with_agent_spec(spec)
        .with_provider("anthropic", Arc::new(GenaiExecutor::new()))
        .with_model(ModelSpec::new(
            "claude-sonnet",
            "anthropic",
            "claude-sonnet-4-20250514",
        ))
        .build()?;
    // --- end ---
    assert!(!runtime.is_thread_active("t"));
    Ok(())
}

#[test]
fn the_max_rounds_convenience_wrapper() -> Result<(), Box<dyn std::error::Error>> {
    let spec = spec();
    // --- from the page ---
    use rein::AgentRuntimeBuilder;
    use rein::engine::GenaiExecutor;
    use rein::policies::MaxRoundsPlugin;
    use rein::registry_spec::ModelSpec;
    use std::sync::Arc;

    let mut spec = spec;
    spec.plugin_ids.push("stop-condition:max-rounds".into());

    let runtime = AgentRuntimeBuilder::new()
        .with_plugin(
            "stop-condition:max-rounds",
            Arc::new(MaxRoundsPlugin::new(10)),
        )
        .with_agent_spec(spec)
        .with_provider("anthropic", Arc::new(GenaiExecutor::new()))
        .with_model(ModelSpec::new(
            "claude-sonnet",
            "anthropic",
            "claude-sonnet-4-20250514",
        ))
        .build()?;
    // --- end ---
    assert!(!runtime.is_thread_active("t"));
    Ok(())
}

#[test]
fn declarative_specs_become_policies() {
    // --- from the page ---
    use rein::contract::lifecycle::StopConditionSpec;
    use rein::policies::{StopConditionPlugin, policies_from_specs};

    let specs = vec![
        StopConditionSpec::MaxRounds { rounds: 10 },
        StopConditionSpec::Timeout { seconds: 300 },
        StopConditionSpec::TokenBudget { max_total: 100_000 },
        StopConditionSpec::ConsecutiveErrors { max: 3 },
    ];

    let policies = policies_from_specs(&specs);
    let plugin = StopConditionPlugin::new(policies);
    // --- end ---
    assert_eq!(
        format!("{plugin:?}"),
        r#"["max_rounds", "timeout", "token_budget", "consecutive_errors"]"#
    );
}

// --- from the page ---
use rein::policies::{StopDecision, StopPolicy, StopPolicyStats};

pub struct MyCustomPolicy {
    pub threshold: u64,
}

impl StopPolicy for MyCustomPolicy {
    fn id(&self) -> &str {
        "my_custom"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if stats.total_output_tokens > self.threshold {
            StopDecision::Stop {
                code: "my_custom".into(),
                detail: format!(
                    "output tokens {} exceeded {}",
                    stats.total_output_tokens, self.threshold
                ),
            }
        } else {
            StopDecision::Continue
        }
    }
}
// --- end ---

#[tokio::test]
async fn a_custom_policy_stops_a_run_inside_stop_condition_plugin() {
    use rein::policies::StopConditionPlugin;
    use rein::registry_spec::ModelSpec;
    use rein::{AgentRuntimeBuilder, TerminationReason};

    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("noop", serde_json::json!({})).with_usage(5, 40),
    ])
    .repeat_last();
    let mut spec = AgentSpec::new("assistant").with_model_id("m");
    spec.plugin_ids.push("stop-condition".into());
    let runtime = AgentRuntimeBuilder::new()
        .with_plugin(
            "stop-condition",
            Arc::new(StopConditionPlugin::new(vec![Arc::new(MyCustomPolicy {
                threshold: 100,
            })])),
        )
        .with_agent_spec(spec)
        .with_provider("scripted", Arc::new(model))
        .with_model(ModelSpec::new("m", "scripted", "x"))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .run(RunRequest::new("t", vec![Message::user("go")]), sink)
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("my_custom", "output tokens 120 exceeded 100")
    );
    assert_eq!(r.steps, 3);
}

#[test]
fn the_common_error_two_round_plugins_share_a_state_key() {
    use rein::contract::state::StateError;
    use rein::engine::GenaiExecutor;
    use rein::policies::{MaxRoundsPlugin, StopConditionPlugin};
    use rein::registry_spec::ModelSpec;
    use rein::{AgentRuntimeBuilder, BuildError};

    let mut spec = spec();
    spec.plugin_ids.push("stop-condition".into());
    spec.plugin_ids.push("stop-condition:max-rounds".into());
    let err = AgentRuntimeBuilder::new()
        .with_plugin("stop-condition", Arc::new(StopConditionPlugin::new(vec![])))
        .with_plugin(
            "stop-condition:max-rounds",
            Arc::new(MaxRoundsPlugin::new(10)),
        )
        .with_agent_spec(spec)
        .with_provider("anthropic", Arc::new(GenaiExecutor::new()))
        .with_model(ModelSpec::new(
            "claude-sonnet",
            "anthropic",
            "claude-sonnet-4-20250514",
        ))
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        BuildError::PluginState {
            source: StateError::KeyAlreadyRegistered { .. },
            ..
        }
    ));
}
