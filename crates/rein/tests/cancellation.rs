//! Cancellation reaches everything a run does: the executor's open step and
//! its stream, tools (through their child tokens, or by being dropped), and
//! the loop between phases; every way to cancel records its cause.

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
use rein::contract::event::AgentEvent;
use rein::prelude::*;
use serde_json::json;

fn runtime_with(model: Arc<ScriptedExecutor>) -> AgentRuntime {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn cancelling_mid_stream_does_not_wait_for_the_remaining_chunks() {
    let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let model = Arc::new(ScriptedExecutor::new(vec![
        ScriptedResponse::text(words.join(" ")).with_chunk_delay(Duration::from_secs(1)),
    ]));
    let runtime = runtime_with(model.clone());
    let sink = Arc::new(CollectingSink::new());
    let run = tokio::spawn({
        let (runtime, sink) = (runtime.clone(), sink.clone());
        async move { runtime.run(user("t", "go"), sink).await }
    });
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let start = tokio::time::Instant::now();
    assert!(runtime.cancel_and_wait_by_thread("t").await);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.response, "w0 w1 w2 w3 w4 ");
    assert_eq!(model.served_chunks(), 5);
    let history = runtime.thread_messages("t").await;
    assert!(history[1].interrupted);
    assert_eq!(history[1].content, r.response);
    assert_one_run_finished_last(&sink.events());
}

#[tokio::test(start_paused = true)]
async fn cancelling_before_the_executor_returns_its_stream_cuts_it_off() {
    let model = Arc::new(ScriptedExecutor::new(vec![
        ScriptedResponse::text("too late").with_delay(Duration::from_secs(3600)),
    ]));
    let runtime = runtime_with(model.clone());
    let run = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.run_to_completion(user("t", "go")).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.cancel_and_wait_by_thread("t").await);
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.response, "");
    assert_eq!(model.served_chunks(), 0);
    assert_eq!(
        runtime.thread_messages("t").await.len(),
        1,
        "no assistant message without text"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_honours_its_token_returns_and_one_that_ignores_it_is_dropped() {
    for respect_token in [true, false] {
        let sleeper = Sleeper::new(respect_token);
        let completed = sleeper.completed.clone();
        let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call(
            "sleep",
            json!({"ms": 3_600_000}),
        )]);
        let runtime = builder_with(model, spec())
            .with_tool("sleep", Arc::new(sleeper))
            .build()
            .unwrap();
        let run = tokio::spawn({
            let runtime = runtime.clone();
            async move { runtime.run_to_completion(user("t", "go")).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(runtime.cancel_and_wait_by_thread("t").await);
        let r = run.await.unwrap().unwrap();
        assert_eq!(r.termination, TerminationReason::Cancelled);
        assert_eq!(completed.load(Ordering::SeqCst), 0);
        let results = tool_results(&runtime.thread_messages("t").await);
        assert_eq!(results.len(), 1);
        let dropped = "cancelled: the run was cancelled before this call finished — may_have_completed: the call was stopped while it ran; it may or may not have taken effect, so check before repeating it";
        if respect_token {
            // It may answer for itself before it is aborted; either way the call is answered.
            assert!(
                results[0].1 == "error: cancelled" || results[0].1 == dropped,
                "{:?}",
                results[0]
            );
        } else {
            assert_eq!(results[0].1, dropped);
        }
    }
}

#[tokio::test]
async fn a_parent_token_cancels_the_run() {
    let (runtime, entered) = gated_runtime(true);
    let client_gone = CancellationToken::new();
    let run = tokio::spawn({
        let runtime = runtime.clone();
        let request = user("t", "go").with_cancellation(client_gone.clone());
        async move { runtime.run_to_completion(request).await }
    });
    entered.notified().await;
    client_gone.cancel();
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.cancel_cause, Some(CancelCause::Requested));
}

#[tokio::test]
async fn a_run_handle_and_cancel_run_cancel_by_run_id() {
    for via_runtime in [false, true] {
        let (runtime, entered) = gated_runtime(true);
        let handle = runtime.mailbox().submit(user("t", "go")).await.unwrap();
        entered.notified().await;
        if via_runtime {
            assert!(runtime.cancel_run(handle.run_id()));
        } else {
            handle.cancel();
        }
        let r = handle.wait().await.unwrap();
        assert_eq!(r.termination, TerminationReason::Cancelled);
        assert_eq!(r.cancel_cause, Some(CancelCause::Requested));
    }
}

#[tokio::test]
async fn the_run_finished_event_carries_the_cancel_cause() {
    let (runtime, entered) = gated_runtime(true);
    let sink = Arc::new(CollectingSink::new());
    let handle = runtime
        .mailbox()
        .submit(user("t", "go").with_event_sink(sink.clone()))
        .await
        .unwrap();
    entered.notified().await;
    handle.cancel();
    handle.wait().await.unwrap();
    match sink.events().last().unwrap() {
        AgentEvent::RunFinished {
            termination,
            cancel_cause,
            ..
        } => {
            assert_eq!(termination, &TerminationReason::Cancelled);
            assert_eq!(cancel_cause, &Some(CancelCause::Requested));
        }
        other => panic!("{other:?}"),
    }
}

/// Cancels the thread's run when it sees the `n`-th text delta.
struct CancelOnDelta {
    runtime: std::sync::OnceLock<AgentRuntime>,
    n: usize,
    seen: std::sync::atomic::AtomicUsize,
}

impl EventSink for CancelOnDelta {
    fn emit(&self, event: AgentEvent) {
        if let AgentEvent::TextDelta { thread_id, .. } = &event
            && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.n
        {
            self.runtime.get().unwrap().cancel_by_thread(thread_id);
        }
    }
}

#[tokio::test]
async fn a_cancel_reaches_a_run_whose_stream_never_waits() {
    // Every chunk is ready at once: the stream never returns Pending, so
    // only a check between chunks can see the cancel.
    let model = Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text(
        "word ".repeat(200),
    )]));
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model.clone())
        .build()
        .unwrap();
    let sink = Arc::new(CancelOnDelta {
        runtime: std::sync::OnceLock::new(),
        n: 3,
        seen: std::sync::atomic::AtomicUsize::new(0),
    });
    assert!(sink.runtime.set(runtime.clone()).is_ok());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.response, "word word word ");
    assert!(
        model.served_chunks() < 10,
        "the stream was dropped at the cancel ({} chunks read)",
        model.served_chunks()
    );
}
