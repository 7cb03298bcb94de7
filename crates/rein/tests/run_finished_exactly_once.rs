//! Invariant 1: every run ends with exactly one `RunFinished`, last, carrying
//! the full termination reason and the final response — whatever ended it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;

use common::*;
use rein::contract::event::AgentEvent;
use rein::contract::inference::InferenceError;
use rein::prelude::*;
use serde_json::json;

async fn finished(
    runtime: &AgentRuntime,
    request: RunRequest,
) -> (AgentRunResult, Vec<AgentEvent>) {
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(request, sink.clone()).await.unwrap();
    let events = sink.events();
    let terminations = assert_one_run_finished_last(&events);
    assert_eq!(terminations[&result.run_id], result.termination);
    match events.last().unwrap() {
        AgentEvent::RunFinished {
            response,
            steps,
            usage,
            cancel_cause,
            ..
        } => {
            assert_eq!(response, &result.response);
            assert_eq!(*steps, result.steps);
            assert_eq!(*usage, result.usage);
            assert_eq!(cancel_cause, &result.cancel_cause);
        }
        other => panic!("last event is {other:?}"),
    }
    (result, events)
}

#[tokio::test]
async fn a_natural_end_finishes_once() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]),
        spec(),
    )
    .build()
    .unwrap();
    let (r, _) = finished(&runtime, user("t", "go")).await;
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn a_max_rounds_stop_finishes_once_with_code_and_detail() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("again").with_tool_call("echo", json!({})),
    ])
    .repeat_last();
    let runtime = builder_with(model, spec().with_max_rounds(3))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let (r, _) = finished(&runtime, user("t", "go")).await;
    assert_eq!(
        r.termination,
        TerminationReason::stopped("max_rounds", "reached 3 rounds (limit 3)")
    );
    assert_eq!(r.response, "again");
    assert_eq!(r.steps, 3);
}

#[tokio::test]
async fn an_inference_error_finishes_once() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::error(
        InferenceError::invalid_request("bad"),
    )]);
    let runtime = builder_with(model, spec()).build().unwrap();
    let (r, _) = finished(&runtime, user("t", "go")).await;
    assert!(matches!(r.termination, TerminationReason::Error(_)));
}

#[tokio::test]
async fn a_cancelled_run_finishes_once() {
    let (runtime, entered) = gated_runtime(false);
    let canceller = runtime.clone();
    tokio::spawn(async move {
        entered.notified().await;
        assert!(canceller.cancel_by_thread("t"));
    });
    let (r, _) = finished(&runtime, user("t", "go")).await;
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.cancel_cause, Some(CancelCause::Requested));
}

#[tokio::test]
async fn a_run_whose_runtime_is_shut_down_finishes_once_with_cause_shutdown() {
    let (runtime, entered) = gated_runtime(true);
    let stopper = runtime.clone();
    tokio::spawn(async move {
        entered.notified().await;
        stopper.shutdown().await;
    });
    let (r, _) = finished(&runtime, user("t", "go")).await;
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.cancel_cause, Some(CancelCause::Shutdown));
    assert_eq!(
        runtime
            .run_to_completion(user("u", "go"))
            .await
            .unwrap_err(),
        RuntimeError::ShutDown
    );
}

/// Records every event, then panics on the ones it is told to.
struct PanickingSink {
    events: CollectingSink,
    on_step: bool,
}

impl EventSink for PanickingSink {
    fn emit(&self, event: AgentEvent) {
        let panic_now = matches!(event, AgentEvent::RunFinished { .. })
            || (self.on_step && matches!(event, AgentEvent::StepStarted { .. }));
        self.events.emit(event);
        if panic_now {
            panic!("this sink panics");
        }
    }
}

#[tokio::test]
async fn a_panicking_sink_gets_one_run_finished_and_the_run_keeps_its_result() {
    for on_step in [false, true] {
        let runtime = builder_with(
            ScriptedExecutor::new(vec![
                ScriptedResponse::tool_call("echo", json!({"text": "a"})),
                ScriptedResponse::text("done"),
            ]),
            spec(),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
        let sink = Arc::new(PanickingSink {
            events: CollectingSink::new(),
            on_step,
        });
        let result = runtime
            .run(user("t", "go"), sink.clone())
            .await
            .expect("a sink that panics does not fail the run");
        assert_eq!(result.termination, TerminationReason::NaturalEnd);
        assert_eq!(result.response, "done");
        let events = sink.events.events();
        let finished = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunFinished { .. }))
            .count();
        assert_eq!(finished, 1, "on_step = {on_step}: {events:#?}");
        assert_one_run_finished_last(&events);
        assert_history_valid(&runtime.thread_messages("t").await);
        assert!(!runtime.is_thread_active("t"));
    }
}
