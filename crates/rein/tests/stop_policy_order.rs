//! Stop policies run after each inference in the contract's order — listed
//! stop-condition plugins, then `stop_conditions`, then the `max_rounds`
//! guard — count each round once, and report their own code and detail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use rein::contract::event::AgentEvent;
use rein::policies::{
    MaxRoundsPlugin, StopConditionPlugin, StopDecision, StopPolicy, StopPolicyStats,
    TokenBudgetPolicy,
};
use rein::prelude::*;
use serde_json::json;

/// Records the step counts it sees; never stops.
struct Spy(Arc<Mutex<Vec<u32>>>);
impl StopPolicy for Spy {
    fn id(&self) -> &str {
        "spy"
    }
    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        self.0.lock().unwrap().push(stats.step_count);
        StopDecision::Continue
    }
}

/// Stops at a given step with its own code.
struct StopAt(u32, &'static str);
impl StopPolicy for StopAt {
    fn id(&self) -> &str {
        self.1
    }
    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if stats.step_count >= self.0 {
            StopDecision::Stop {
                code: self.1.into(),
                detail: format!("{} fired at step {}", self.1, stats.step_count),
            }
        } else {
            StopDecision::Continue
        }
    }
}

fn looping() -> ScriptedExecutor {
    ScriptedExecutor::new(vec![
        ScriptedResponse::text("working")
            .with_tool_call("echo", json!({}))
            .with_usage(10, 5),
    ])
    .repeat_last()
}

#[tokio::test]
async fn a_listed_stop_condition_plugin_counts_every_round_once_beside_the_guard() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let runtime = builder_with(
        looping(),
        spec().with_max_rounds(4).with_plugin_id("stop-condition"),
    )
    .with_plugin(
        "stop-condition",
        Arc::new(StopConditionPlugin::new(vec![Arc::new(Spy(seen.clone()))])),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3, 4]);
    assert_eq!(
        r.termination,
        TerminationReason::stopped("max_rounds", "reached 4 rounds (limit 4)")
    );
    assert_eq!(r.steps, 4);
}

#[tokio::test]
async fn plugin_policies_win_over_stop_conditions_which_win_over_the_guard() {
    // All three fire at step 2; the listed plugin's policy is evaluated first.
    let runtime = builder_with(
        looping(),
        spec()
            .with_max_rounds(2)
            .with_stop_condition(StopConditionSpec::MaxRounds { rounds: 2 })
            .with_plugin_id("mine"),
    )
    .with_plugin(
        "mine",
        Arc::new(StopConditionPlugin::new(vec![Arc::new(StopAt(
            2,
            "my_custom",
        ))])),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("my_custom", "my_custom fired at step 2")
    );

    // Without the plugin, the spec's condition comes before the guard. Its
    // token budget (15 per round) is exceeded at round 2 as the guard fires.
    let runtime = builder_with(
        looping(),
        spec()
            .with_max_rounds(2)
            .with_stop_condition(StopConditionSpec::TokenBudget { max_total: 20 }),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("token_budget"));
}

#[tokio::test]
async fn within_a_plugin_the_first_policy_in_list_order_wins() {
    let runtime = builder_with(looping(), spec().with_plugin_id("stop-condition"))
        .with_plugin(
            "stop-condition",
            Arc::new(StopConditionPlugin::new(vec![
                Arc::new(StopAt(3, "second_in_time")),
                Arc::new(StopAt(1, "first_in_time")),
                Arc::new(StopAt(1, "same_time_later_in_list")),
            ])),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("first_in_time"));
    assert_eq!(r.steps, 1);
}

#[tokio::test]
async fn the_stop_detail_reaches_the_result_and_the_run_finished_event_whole() {
    let runtime = builder_with(looping(), spec().with_plugin_id("stop-condition"))
        .with_plugin(
            "stop-condition",
            Arc::new(StopConditionPlugin::new(vec![Arc::new(
                TokenBudgetPolicy::new(40),
            )])),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    let expected = TerminationReason::stopped(
        "token_budget",
        "used 45 tokens (30 input + 15 output), over the budget of 40",
    );
    assert_eq!(r.termination, expected);
    assert!(
        matches!(sink.events().last(), Some(AgentEvent::RunFinished { termination, .. }) if *termination == expected)
    );
    // The text of the stopping inference is kept, and its tool call was not run.
    assert_eq!(r.response, "working");
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        history.last().unwrap().content,
        "not run: the run was stopped (token_budget) — not_started: the call never began, so it had no effect"
    );
}

#[tokio::test]
async fn max_rounds_plugin_and_spec_max_rounds_both_apply() {
    let runtime = builder_with(
        looping(),
        spec()
            .with_max_rounds(5)
            .with_plugin_id("stop-condition:max-rounds"),
    )
    .with_plugin(
        "stop-condition:max-rounds",
        Arc::new(MaxRoundsPlugin::new(3)),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    assert_eq!(
        runtime
            .run_to_completion(user("a", "go"))
            .await
            .unwrap()
            .steps,
        3
    );

    let runtime = builder_with(
        looping(),
        spec()
            .with_max_rounds(2)
            .with_plugin_id("stop-condition:max-rounds"),
    )
    .with_plugin(
        "stop-condition:max-rounds",
        Arc::new(MaxRoundsPlugin::new(3)),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    assert_eq!(
        runtime
            .run_to_completion(user("a", "go"))
            .await
            .unwrap()
            .steps,
        2
    );
}
