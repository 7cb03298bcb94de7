//! Fallback models: a model whose provider keeps failing (down, overloaded,
//! refusing for rate) hands the run to the next of its fallbacks, with a
//! `model_fallback` event; later rounds, their usage and their spans are
//! the fallback's; limits apply to whichever model answers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use rein::contract::inference::InferenceError;
use rein::limits::ProviderLimits;
use rein::prelude::*;

/// A provider that always fails with `error`, counting its calls.
fn failing(error: InferenceError) -> (ScriptedExecutor, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let executor = ScriptedExecutor::from_fn(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
        ScriptedResponse::error(error.clone())
    });
    (executor, calls)
}

fn runtime(primary: ScriptedExecutor, spec: AgentSpec) -> AgentRuntimeBuilder {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("main"))
        .with_model(ModelSpec::new("main", "hosted", "big-model").with_fallbacks(["small"]))
        .with_model(ModelSpec::new("small", "local", "small-model"))
        .with_provider("hosted", Arc::new(primary))
        .with_provider(
            "local",
            Arc::new(ScriptedExecutor::from_fn(|request| {
                ScriptedResponse::text(format!("answered by {}", request.model)).with_usage(7, 3)
            })),
        )
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_provider_hands_the_run_to_the_fallback_after_three_attempts() {
    let (primary, calls) = failing(InferenceError::overloaded("HTTP 529: overloaded"));
    let runtime = runtime(primary, spec()).build().unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "hi"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "answered by small-model");
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // Three failed rounds and the answer: each attempt is a round.
    assert_eq!(result.steps, 4);
    let events = sink.events();
    let fallbacks: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ModelFallback {
                from_model,
                to_model,
                error,
                ..
            } => Some((from_model.as_str(), to_model.as_str(), error.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(fallbacks.len(), 1);
    assert_eq!((fallbacks[0].0, fallbacks[0].1), ("main", "small"));
    assert!(fallbacks[0].2.contains("overloaded"), "{}", fallbacks[0].2);
    // Two retries with backoff on the model, none into the fallback.
    let retries = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::InferenceRetry { .. }))
        .count();
    assert_eq!(retries, 2);
    let answered_by: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::RoundUsage { model, .. } => Some(model.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(answered_by, ["small"]);
}

#[tokio::test(start_paused = true)]
async fn a_consecutive_errors_stop_below_three_moves_on_before_it_would_stop() {
    let (primary, calls) = failing(InferenceError::connection("connection refused"));
    let spec = spec().with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 2 });
    let result = runtime(primary, spec)
        .build()
        .unwrap()
        .run(user("t", "hi"), Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_the_provider_will_never_accept_does_not_fall_back() {
    let (primary, calls) = failing(InferenceError::invalid_request("HTTP 400: bad tool schema"));
    let result = runtime(primary, spec())
        .build()
        .unwrap()
        .run(user("t", "hi"), Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert!(
        matches!(&result.termination, TerminationReason::Error(m) if m.contains("bad tool schema")),
        "{:?}",
        result.termination
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn the_fallback_s_own_limits_apply_to_its_inferences() {
    let (primary, _) = failing(InferenceError::server("HTTP 500"));
    let runtime = Arc::new(
        runtime(primary, spec())
            .with_provider_limits("local", ProviderLimits::new().max_concurrent(1))
            .build()
            .unwrap(),
    );
    let mut runs = Vec::new();
    for i in 0..3 {
        let runtime = runtime.clone();
        runs.push(tokio::spawn(async move {
            runtime
                .run(
                    user(&format!("t{i}"), "hi"),
                    Arc::new(CollectingSink::new()),
                )
                .await
                .unwrap()
        }));
    }
    for run in runs {
        assert_eq!(
            run.await.unwrap().termination,
            TerminationReason::NaturalEnd
        );
    }
    let status = runtime.provider_status().await;
    let local = status.iter().find(|p| p.id == "local").unwrap();
    assert_eq!(local.usage.unwrap().requests, 3);
}

#[test]
fn a_fallback_that_is_not_a_registered_model_is_refused_at_build() {
    let (primary, _) = failing(InferenceError::server("HTTP 500"));
    let error = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("main"))
        .with_model(ModelSpec::new("main", "hosted", "big").with_fallbacks(["smal"]))
        .with_provider("hosted", Arc::new(primary))
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "model \"main\" (of agent \"agent\") falls back to \"smal\", which is not a registered model; registered model ids: main"
    );
}
