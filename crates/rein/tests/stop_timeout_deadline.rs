//! A `timeout` stop condition is also a deadline: work still running when it
//! passes is cancelled and the run ends `Stopped { code: "timeout" }` with
//! cancel cause `Deadline`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use rein::policies::{StopConditionPlugin, TimeoutPolicy};
use rein::prelude::*;
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn a_tool_sleeping_past_the_deadline_is_cancelled() {
    let sleeper = Sleeper::new(false);
    let completed = sleeper.completed.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call(
        "sleep",
        json!({"ms": 600_000}),
    )]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::Timeout { seconds: 5 }),
    )
    .with_tool("sleep", Arc::new(sleeper))
    .build()
    .unwrap();
    let start = tokio::time::Instant::now();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(
        r.termination,
        TerminationReason::stopped("timeout", "the 5 s timeout passed while work was in flight")
    );
    assert_eq!(r.cancel_cause, Some(CancelCause::Deadline));
    assert_eq!(completed.load(Ordering::SeqCst), 0);
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        tool_results(&history)[0].1,
        "cancelled: the run was cancelled before this call finished — may_have_completed: the call was stopped while it ran; it may or may not have taken effect, so check before repeating it"
    );
}

#[tokio::test(start_paused = true)]
async fn an_inference_that_has_not_answered_by_the_deadline_is_cut_off() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("late").with_delay(Duration::from_secs(3600)),
    ]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::Timeout { seconds: 2 }),
    )
    .build()
    .unwrap();
    let start = tokio::time::Instant::now();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(r.termination.stop_code(), Some("timeout"));
    assert_eq!(r.cancel_cause, Some(CancelCause::Deadline));
}

#[tokio::test(start_paused = true)]
async fn timeout_policy_in_milliseconds_stops_after_the_inference_that_crosses_it() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})).with_delay(Duration::from_millis(600)),
    ])
    .repeat_last();
    let runtime = builder_with(model, spec().with_plugin_id("stop-condition"))
        .with_plugin(
            "stop-condition",
            Arc::new(StopConditionPlugin::new(vec![Arc::new(
                TimeoutPolicy::new(1000),
            )])),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("timeout", "elapsed 1200 ms, over the limit of 1000 ms")
    );
    assert_eq!(r.steps, 2);
    assert_eq!(r.cancel_cause, None, "a policy stop is not a cancellation");
}

#[tokio::test]
async fn a_timeout_too_far_away_to_represent_is_no_deadline() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("fine")]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::Timeout { seconds: u64::MAX }),
    )
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_eq!(runtime.thread_messages("t").await.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_plugin_s_timeout_is_checked_before_the_next_inference_too() {
    // Round 1 calls a tool that sleeps past the plugin's 50 ms; the check
    // before round 2's inference stops the run without sending it.
    let executor = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("sleep", json!({"ms": 100})),
        ScriptedResponse::text("never sent"),
    ]);
    let runtime = builder_with(executor, spec().with_plugin_id("limits"))
        .with_plugin(
            "limits",
            Arc::new(StopConditionPlugin::new(vec![Arc::new(
                TimeoutPolicy::new(50),
            )])),
        )
        .with_tool("sleep", Arc::new(Sleeper::new(false)))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    match &result.termination {
        TerminationReason::Stopped(reason) => assert_eq!(reason.code, "timeout"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        result.steps, 2,
        "round 2 started, its inference was not sent"
    );
    assert_eq!(result.response, "");
}
