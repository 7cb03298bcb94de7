//! `AgentRuntime::run_stream` and `Mailbox::submit_stream`: every event in
//! order, ending with `RunFinished`; the same result as `run`; nothing lost
//! for a slow consumer; dropping the stream cancels the run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rein::events::{AgentEvent, CancelCause};
use rein::prelude::*;
use serde_json::json;

fn script() -> Vec<ScriptedResponse> {
    vec![
        ScriptedResponse::text("Let me look.")
            .with_tool_call("echo", json!({"x": 1}))
            .with_usage(10, 4),
        ScriptedResponse::text("All done, thanks.").with_usage(20, 5),
    ]
}

fn echo_runtime() -> AgentRuntime {
    builder_with(ScriptedExecutor::new(script()), spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap()
}

#[tokio::test]
async fn run_stream_yields_every_event_in_order_and_its_result_equals_runs() {
    // Two runtimes with the same script: one run, one stream.
    let sink = Arc::new(CollectingSink::new());
    let by_run = echo_runtime()
        .run(user("t", "go"), sink.clone())
        .await
        .unwrap();

    let runtime = echo_runtime();
    let mut stream = runtime.run_stream(user("t", "go"));
    assert_eq!(stream.run_id(), by_run.run_id);
    assert!(stream.result().is_none());
    let mut streamed = Vec::new();
    while let Some(event) = stream.next().await {
        streamed.push(event);
    }
    assert_eq!(streamed, sink.events());
    assert!(matches!(
        streamed.last(),
        Some(AgentEvent::RunFinished { .. })
    ));
    assert_one_run_finished_last(&streamed);
    assert_eq!(stream.result(), Some(&Ok(by_run.clone())));
    assert!(stream.next().await.is_none(), "the stream stays ended");
    assert_eq!(stream.wait().await, Ok(by_run));
}

#[tokio::test]
async fn wait_skips_the_unread_events_and_returns_the_result() {
    let runtime = echo_runtime();
    let mut stream = runtime.run_stream(user("t", "go"));
    let first = stream.next().await.unwrap();
    assert!(matches!(first, AgentEvent::RunStarted { .. }), "{first:?}");
    let result = stream.wait().await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "All done, thanks.");
    assert!(!runtime.is_thread_active("t"));
}

#[tokio::test(start_paused = true)]
async fn a_slow_consumer_loses_no_event() {
    let words: Vec<String> = (0..300).map(|i| format!("w{i} ")).collect();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text(words.concat())]),
        spec(),
    )
    .build()
    .unwrap();
    let mut stream = runtime.run_stream(user("t", "go"));
    let mut text = String::new();
    let mut last = None;
    while let Some(event) = stream.next().await {
        // A consumer much slower than the run.
        tokio::time::sleep(Duration::from_millis(5)).await;
        if let AgentEvent::TextDelta { delta, .. } = &event {
            text.push_str(delta);
        }
        last = Some(event);
    }
    assert_eq!(text, words.concat());
    assert!(matches!(last, Some(AgentEvent::RunFinished { .. })));
}

#[tokio::test]
async fn a_run_that_cannot_start_ends_the_stream_at_once_with_its_error() {
    let runtime = echo_runtime();
    let mut stream = runtime.run_stream(user("t", "go").with_agent_id("nobody"));
    assert!(stream.next().await.is_none());
    match stream.result() {
        Some(Err(RuntimeError::UnknownAgent { agent_id, .. })) => assert_eq!(agent_id, "nobody"),
        other => panic!("expected UnknownAgent, got {other:?}"),
    }

    let (runtime, entered) = gated_runtime(true);
    let mut first = runtime.run_stream(user("t", "go"));
    let busy = tokio::spawn(async move {
        // Drive the first run into its tool, then keep it alive.
        while let Some(event) = first.next().await {
            if matches!(event, AgentEvent::ToolCallStarted { .. }) {
                break;
            }
        }
        first
    });
    entered.notified().await;
    let mut second = runtime.run_stream(user("t", "again"));
    assert!(second.next().await.is_none());
    assert!(matches!(
        second.result(),
        Some(Err(RuntimeError::ThreadAlreadyRunning { .. }))
    ));
    let first = busy.await.unwrap();
    first.cancel();
    let result = first.wait().await.unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    assert_eq!(result.cancel_cause, Some(CancelCause::Requested));
}

/// Drops the stream after `after` events; the run must end `Cancelled`
/// (cause `Requested`) with one `RunFinished`, release the thread, and
/// leave a valid history that a next run can continue.
async fn drop_after(after: usize, respect_token: bool) {
    let (runtime, _entered) = gated_runtime(respect_token);
    let side = Arc::new(CollectingSink::new());
    let mut stream = runtime.run_stream(user("t", "go").with_event_sink(side.clone()));
    for _ in 0..after {
        if stream.next().await.is_none() {
            break;
        }
    }
    drop(stream);
    wait_until_idle(&runtime, "t").await;
    let events = side.events();
    let finished = assert_one_run_finished_last(&events);
    if after == 0 {
        // Never polled: the run never started.
        assert!(events.is_empty(), "{events:?}");
    } else {
        assert_eq!(
            finished.values().next(),
            Some(&TerminationReason::Cancelled)
        );
        match events.last() {
            Some(AgentEvent::RunFinished { cancel_cause, .. }) => {
                assert_eq!(cancel_cause, &Some(CancelCause::Requested));
            }
            other => panic!("last event: {other:?}"),
        }
    }
    assert_history_valid(&runtime.thread_messages("t").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_mid_run_cancels_the_run_and_keeps_the_history_valid() {
    // RunStarted, StepStarted, ToolCallStarted: the run then waits in the
    // gate. Every drop point, for tools that honour the token and that don't.
    for iteration in 0..60 {
        let after = iteration % 4;
        drop_after(after, iteration % 2 == 0).await;
    }
}

#[tokio::test]
async fn events_also_reach_the_requests_own_sink() {
    let runtime = echo_runtime();
    let side = Arc::new(CollectingSink::new());
    let stream = runtime.run_stream(user("t", "go").with_event_sink(side.clone()));
    let mut streamed = Vec::new();
    let mut stream = stream;
    while let Some(event) = stream.next().await {
        streamed.push(event);
    }
    assert_eq!(streamed, side.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailbox_stream_gives_the_interrupting_runs_events() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::tool_call("gate", json!({})),
            ScriptedResponse::text("Seen your new message."),
        ]),
        spec(),
    )
    .with_tool("gate", Arc::new(gate))
    .build()
    .unwrap();
    let mailbox = runtime.mailbox();
    let first = mailbox.submit_stream(user("t", "first")).await.unwrap();
    entered.notified().await;
    let mut second = mailbox.submit_stream(user("t", "second")).await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = second.next().await {
        events.push(event);
    }
    assert!(events.iter().all(|e| e.run_id() == second.run_id()));
    assert!(matches!(
        events.first(),
        Some(AgentEvent::RunStarted { .. })
    ));
    let result = second.wait().await.unwrap();
    assert_eq!(result.response, "Seen your new message.");

    let first_result = first.wait().await.unwrap();
    assert_eq!(first_result.termination, TerminationReason::Cancelled);
    assert!(matches!(
        first_result.cancel_cause,
        Some(CancelCause::Interrupted { .. })
    ));
    assert_history_valid(&runtime.thread_messages("t").await);
}
