//! Invariant 5: a run's thread slot is released on every exit path — normal
//! end, error, panic, and the run's future being dropped — and a thread has
//! one active run at a time.

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
use rein::contract::inference::InferenceError;
use rein::prelude::*;
use serde_json::json;

#[tokio::test]
async fn the_slot_is_free_after_a_normal_end_and_after_an_error() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("fine"),
        ScriptedResponse::error(InferenceError::unauthorized("no")),
        ScriptedResponse::text("fine again"),
    ]);
    let runtime = builder_with(model, spec()).build().unwrap();
    let r = runtime.run_to_completion(user("t", "1")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert!(!runtime.is_thread_active("t"));
    let r = runtime.run_to_completion(user("t", "2")).await.unwrap();
    assert!(matches!(r.termination, TerminationReason::Error(_)));
    assert!(!runtime.is_thread_active("t"));
    let r = runtime.run_to_completion(user("t", "3")).await.unwrap();
    assert_eq!(r.response, "fine again");
}

#[tokio::test]
async fn a_panicking_tool_does_not_keep_the_slot() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("panicking", json!({})),
        ScriptedResponse::text("after the panic"),
        ScriptedResponse::text("next run"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("panicking", Arc::new(Panicking))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "1")).await.unwrap();
    assert!(!runtime.is_thread_active("t"));
    assert_eq!(
        runtime
            .run_to_completion(user("t", "2"))
            .await
            .unwrap()
            .response,
        "next run"
    );
}

#[tokio::test]
async fn a_second_run_on_an_active_thread_fails_at_once() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]);
    let runtime = Arc::new(
        builder_with(model, spec())
            .with_tool("gate", Arc::new(gate))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.run_to_completion(user("t", "1")).await }
    });
    entered.notified().await;
    assert!(runtime.is_thread_active("t"));
    let err = runtime.run_to_completion(user("t", "2")).await.unwrap_err();
    assert_eq!(
        err,
        RuntimeError::ThreadAlreadyRunning {
            thread_id: "t".into()
        }
    );
    assert!(runtime.cancel_by_thread("t"));
    assert_eq!(
        first.await.unwrap().unwrap().termination,
        TerminationReason::Cancelled
    );
    let texts: Vec<String> = runtime
        .thread_messages("t")
        .await
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert!(
        !texts.contains(&"2".to_owned()),
        "the rejected run appended nothing: {texts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_run_future_cancels_the_run_and_frees_the_slot() {
    let gate = Gate::new(false);
    let (entered, exits) = (gate.entered.clone(), gate.exits.clone());
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("gate", json!({})),
        ScriptedResponse::text("second run"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("gate", Arc::new(gate))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    {
        let run = runtime.run(user("t", "1"), sink.clone());
        tokio::select! {
            _ = run => panic!("the gate never opens"),
            _ = entered.notified() => {}
        }
        // `run` is dropped here, while the tool blocks forever.
    }
    wait_until_idle(&runtime, "t").await;
    assert_eq!(
        exits.load(Ordering::SeqCst),
        1,
        "the ignoring tool's future was dropped"
    );
    let terminations = assert_one_run_finished_last(&sink.events());
    assert_eq!(
        terminations.values().next(),
        Some(&TerminationReason::Cancelled)
    );
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let r = runtime.run_to_completion(user("t", "2")).await.unwrap();
    assert_eq!(r.response, "second run");
    tokio::time::sleep(Duration::from_millis(1)).await;
}
