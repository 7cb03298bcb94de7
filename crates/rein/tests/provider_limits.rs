//! Provider limits: every inference on a limited provider reserves a
//! request and its estimated tokens first; runs wait in line (cancellably,
//! with a `rate_limited` event) instead of being refused; a 429 pauses the
//! provider for every run; the wait is no round and no error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rein::contract::inference::InferenceError;
use rein::limits::ProviderLimits;
use rein::prelude::*;
use tokio::time::Instant;

/// A runtime whose provider "p" answers "ok" after 50 ms with 100 tokens
/// used, recording when each request arrived; limited by `limits`.
fn limited(limits: ProviderLimits) -> (AgentRuntime, Arc<Mutex<Vec<Instant>>>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let executor = ScriptedExecutor::from_fn(move |_| {
        seen.lock().unwrap().push(Instant::now());
        ScriptedResponse::text("ok")
            .with_usage(90, 10)
            .with_delay(Duration::from_millis(50))
    });
    let runtime = builder_with(executor, spec())
        .with_provider_limits("p", limits)
        .build()
        .unwrap();
    (runtime, arrivals)
}

/// The most requests that arrived within any `window`.
fn busiest_window(arrivals: &[Instant], window: Duration) -> usize {
    let mut sorted = arrivals.to_vec();
    sorted.sort();
    (0..sorted.len())
        .map(|i| {
            sorted[i..]
                .iter()
                .take_while(|&&t| t < sorted[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn concurrent_runs_never_exceed_the_requests_per_window_and_all_finish() {
    let window = Duration::from_secs(1);
    let (runtime, arrivals) = limited(
        ProviderLimits::new()
            .requests_per_minute(300)
            .window(window),
    );
    let runtime = Arc::new(runtime);
    let mut runs = Vec::new();
    for i in 0..30 {
        let runtime = runtime.clone();
        runs.push(tokio::spawn(async move {
            let sink = Arc::new(CollectingSink::new());
            let result = runtime
                .run(user(&format!("t{i}"), "hi"), sink.clone())
                .await
                .unwrap();
            (result, sink.events())
        }));
    }
    let mut waited = 0;
    for run in runs {
        let (result, events) = run.await.unwrap();
        assert_eq!(result.termination, TerminationReason::NaturalEnd);
        // The wait is no round.
        assert_eq!(result.steps, 1);
        let waits: Vec<_> = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RateLimited { provider, .. } if provider == "p"))
            .collect();
        if let Some(wait) = result.report.rate_limited {
            waited += 1;
            assert_eq!(wait.waits, 1);
            assert_eq!(waits.len(), 1, "one rate_limited event per wait");
        } else {
            assert!(waits.is_empty());
        }
    }
    // 5 requests per 1 s window: 30 runs need 6 windows; 25 of them waited.
    assert_eq!(waited, 25);
    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 30);
    assert_eq!(busiest_window(&arrivals, window), 5);
}

#[tokio::test(start_paused = true)]
async fn tokens_per_window_hold_back_the_next_prompt_until_the_window_has_room() {
    let window = Duration::from_secs(1);
    // The output reserve is 1024 by default: 2 inferences fit in 2500.
    let (runtime, arrivals) = limited(
        ProviderLimits::new()
            .tokens_per_minute(150_000)
            .window(window),
    );
    let runtime = Arc::new(runtime);
    let mut runs = Vec::new();
    for i in 0..4 {
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
    // Each answer settles at 100 tokens, so after the first two the window
    // has room again at once: nobody waits for a whole window.
    let arrivals = arrivals.lock().unwrap();
    let span = *arrivals.iter().max().unwrap() - *arrivals.iter().min().unwrap();
    assert!(span < window, "{span:?}");
    assert!(busiest_window(&arrivals, Duration::from_millis(10)) <= 2);
}

#[tokio::test(start_paused = true)]
async fn a_run_cancelled_while_waiting_ends_at_once_and_sends_nothing() {
    let (runtime, arrivals) = limited(ProviderLimits::new().max_concurrent(1));
    let runtime = Arc::new(runtime);
    let executor_busy = {
        let runtime = runtime.clone();
        tokio::spawn(async move {
            runtime
                .run(user("a", "hi"), Arc::new(CollectingSink::new()))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let sink = Arc::new(CollectingSink::new());
    let waiting = {
        let (runtime, sink) = (runtime.clone(), sink.clone());
        tokio::spawn(async move { runtime.run(user("b", "hi"), sink).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::RateLimited { .. })),
        "the waiting run said it waits"
    );
    assert!(runtime.cancel_by_thread("b"));
    let result = waiting.await.unwrap().unwrap();
    assert!(
        matches!(result.termination, TerminationReason::Cancelled),
        "{:?}",
        result.termination
    );
    assert_eq!(result.report.rate_limited.unwrap().waits, 1);
    executor_busy.await.unwrap().unwrap();
    assert_eq!(arrivals.lock().unwrap().len(), 1, "b sent nothing");
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_pauses_the_provider_for_every_run() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let executor = ScriptedExecutor::from_fn(move |request| {
        let mut seen = seen.lock().unwrap();
        seen.push((Instant::now(), request.messages.len()));
        if seen.len() == 1 {
            ScriptedResponse::error(InferenceError::rate_limited(
                "HTTP 429: slow down",
                Some(Duration::from_secs(4)),
            ))
        } else {
            ScriptedResponse::text("ok").with_usage(5, 5)
        }
    });
    let runtime = Arc::new(
        builder_with(executor, spec())
            .with_provider_limits("p", ProviderLimits::new().requests_per_minute(1000))
            .build()
            .unwrap(),
    );
    let start = Instant::now();
    let first = runtime.run(user("a", "hi"), Arc::new(CollectingSink::new()));
    let second = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        runtime
            .run(user("b", "hi"), Arc::new(CollectingSink::new()))
            .await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.unwrap().termination, TerminationReason::NaturalEnd);
    let second = second.unwrap();
    assert_eq!(second.termination, TerminationReason::NaturalEnd);
    // b never got a 429: it waited out a's pause before sending.
    assert!(second.report.rate_limited.is_some());
    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 3);
    for (at, _) in &arrivals[1..] {
        assert!(*at - start >= Duration::from_secs(4), "{:?}", *at - start);
    }
}

#[test]
fn limits_for_an_unknown_provider_or_of_zero_are_refused_at_build() {
    let error = builder_with(ScriptedExecutor::new(vec![]), spec())
        .with_provider_limits("hosted", ProviderLimits::new().requests_per_minute(10))
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "provider \"hosted\" limits: no provider is registered as \"hosted\"; registered provider ids: p"
    );
    let error = builder_with(ScriptedExecutor::new(vec![]), spec())
        .with_provider_limits("p", ProviderLimits::new().tokens_per_minute(0))
        .build()
        .unwrap_err();
    assert!(
        error.to_string().contains("tokens_per_minute is 0"),
        "{error}"
    );
}

#[tokio::test]
async fn provider_status_shows_limits_reservations_and_unlimited_providers() {
    let (runtime, _) = limited(ProviderLimits::new().requests_per_minute(60));
    runtime
        .run(user("t", "hi"), Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    let status = runtime.provider_status().await;
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].id, "p");
    assert_eq!(status[0].limits.requests_per_minute, Some(60));
    let usage = status[0].usage.unwrap();
    assert_eq!((usage.requests, usage.tokens, usage.in_flight), (1, 100, 0));
}
