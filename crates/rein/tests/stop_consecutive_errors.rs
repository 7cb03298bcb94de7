//! Retryable inference errors are errored rounds: hooks and policies see
//! them, the backoff waits between half and all of a ceiling that doubles
//! from the base (equal jitter), `retry_after` is honoured exactly, and
//! `consecutive_errors` stops the run; non-retryable errors end it at once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rein::contract::event::AgentEvent;
use rein::contract::inference::InferenceError;
use rein::prelude::*;

fn retries(events: &[AgentEvent]) -> Vec<(u32, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::InferenceRetry {
                attempt, delay_ms, ..
            } => Some((*attempt, *delay_ms)),
            _ => None,
        })
        .collect()
}

/// Checks each retry's attempt and that its `delay_ms` is in its range.
fn assert_retries(actual: &[(u32, u64)], expected: &[(u32, RangeInclusive<u64>)]) {
    let attempts: Vec<u32> = actual.iter().map(|(attempt, _)| *attempt).collect();
    let expected_attempts: Vec<u32> = expected.iter().map(|(attempt, _)| *attempt).collect();
    assert_eq!(attempts, expected_attempts, "{actual:?}");
    for ((attempt, delay), (_, range)) in actual.iter().zip(expected) {
        assert!(
            range.contains(delay),
            "retry {attempt} waited {delay} ms, not in {range:?} ms"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn three_retryable_errors_stop_the_run_with_consecutive_errors() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::error(InferenceError::server(
        "boom",
    ))])
    .repeat_last();
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 3 }),
    )
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let start = tokio::time::Instant::now();
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "consecutive_errors",
            "3 inference errors in a row (limit 3)"
        )
    );
    assert_eq!(r.steps, 3);
    let retries = retries(&sink.events());
    assert_retries(&retries, &[(1, 250..=500), (2, 500..=1000)]);
    // The waits are the reported ones (whole ms, rounded down; the paused
    // clock's timer rounds each sleep up to the next ms).
    let waited: u64 = retries.iter().map(|(_, delay)| delay).sum();
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(waited) && elapsed <= Duration::from_millis(waited + 2),
        "waited {elapsed:?} for {waited} ms of backoff"
    );
    assert_eq!(
        runtime.thread_messages("t").await.len(),
        1,
        "failed attempts add nothing to history"
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_error_count() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::error(InferenceError::overloaded("busy")),
        ScriptedResponse::error(InferenceError::overloaded("busy")),
        ScriptedResponse::tool_call("echo", serde_json::json!({})),
        ScriptedResponse::error(InferenceError::overloaded("busy")),
        ScriptedResponse::error(InferenceError::overloaded("busy")),
        ScriptedResponse::text("made it"),
    ]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 3 }),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_eq!(r.steps, 6);
    assert_retries(
        &retries(&sink.events()),
        &[
            (1, 250..=500),
            (2, 500..=1000),
            (1, 250..=500),
            (2, 500..=1000),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn the_backoff_is_capped_settable_and_yields_to_retry_after() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::error(InferenceError::timeout("slow")),
        ScriptedResponse::error(InferenceError::timeout("slow")),
        ScriptedResponse::error(InferenceError::timeout("slow")),
        ScriptedResponse::error(InferenceError::rate_limited(
            "429",
            Some(Duration::from_secs(7)),
        )),
        ScriptedResponse::error(InferenceError::rate_limited(
            "429",
            Some(Duration::from_secs(600)),
        )),
        ScriptedResponse::text("ok"),
    ]);
    let runtime = builder_with(model, spec())
        .with_retry_backoff(Duration::from_millis(100), Duration::from_millis(250))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_retries(
        &retries(&sink.events()),
        &[
            (1, 50..=100),
            (2, 100..=200),
            (3, 125..=250),
            (4, 7000..=7000),
            (5, 60000..=60000),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_during_the_backoff_ends_the_run_at_once() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::error(InferenceError::server(
        "boom",
    ))])
    .repeat_last();
    let runtime = builder_with(model, spec().with_max_rounds(0))
        .with_retry_backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .build()
        .unwrap();
    let canceller = runtime.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        canceller.cancel_by_thread("t");
    });
    let start = tokio::time::Instant::now();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn max_rounds_after_a_failed_round_names_the_error() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::error(InferenceError::server(
        "upstream 502",
    ))])
    .repeat_last();
    let runtime = builder_with(model, spec().with_max_rounds(2))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "max_rounds",
            "reached 2 rounds (limit 2); the last round failed: server error: upstream 502"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_retried_attempts_partial_text_is_not_kept() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("half an ans")
            .with_stream_error(InferenceError::stream_cut("connection dropped")),
        ScriptedResponse::text("whole answer"),
    ]);
    let runtime = builder_with(model, spec()).build().unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.response, "whole answer");
    let texts: Vec<String> = runtime
        .thread_messages("t")
        .await
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["go", "whole answer"]);
}

#[tokio::test]
async fn a_non_retryable_error_ends_the_run_with_error_even_with_a_streak_limit() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::error(
        InferenceError::context_overflow("too long"),
    )]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 3 }),
    )
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::Error("inference failed: context overflow: too long".into())
    );
}
