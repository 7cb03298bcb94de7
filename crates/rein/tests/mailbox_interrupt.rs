//! The mailbox serializes submissions to a thread and interrupts its active
//! run; no submitted message is lost or duplicated (invariants 2 and 4).

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
use rein::prelude::*;
use serde_json::json;

#[tokio::test]
async fn a_submission_interrupts_the_active_run_and_continues_its_history() {
    let gate = Gate::new(false);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("gate", json!({})),
        ScriptedResponse::text("answer to the second message"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("gate", Arc::new(gate))
        .build()
        .unwrap();
    let mailbox = runtime.mailbox();
    let first = mailbox.submit(user("t", "first")).await.unwrap();
    entered.notified().await;
    let second = mailbox.submit(user("t", "second")).await.unwrap();

    let first_id = first.run_id().to_owned();
    let first = first.wait().await.unwrap();
    assert_eq!(first.termination, TerminationReason::Cancelled);
    assert_eq!(
        first.cancel_cause,
        Some(CancelCause::Interrupted {
            by_run_id: second.run_id().to_owned()
        })
    );
    assert_ne!(first_id, second.run_id());
    let second = second.wait().await.unwrap();
    assert_eq!(second.termination, TerminationReason::NaturalEnd);

    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        texts,
        [
            "first",
            "",
            "cancelled: the run was cancelled before this call finished — may_have_completed: the call was stopped while it ran; it may or may not have taken effect, so check before repeating it",
            "second",
            "answer to the second message",
        ]
    );
}

#[tokio::test]
async fn concurrent_submissions_to_one_thread_never_collide_and_each_message_lands_once() {
    let model = ScriptedExecutor::from_fn(|req| {
        ScriptedResponse::text(format!("seen {}", req.messages.len()))
            .with_delay(std::time::Duration::from_millis(2))
    });
    let runtime = builder_with(model, spec()).build().unwrap();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mailbox = runtime.mailbox();
        tasks.push(tokio::spawn(async move {
            mailbox.submit(user("t", &format!("m{i}"))).await
        }));
    }
    let mut handles = Vec::new();
    for t in tasks {
        handles.push(t.await.unwrap().expect("no submission fails"));
    }
    for h in handles {
        h.wait().await.unwrap();
    }
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    for i in 0..16 {
        let n = history
            .iter()
            .filter(|m| m.role == Role::User && m.content == format!("m{i}"))
            .count();
        assert_eq!(n, 1, "m{i} appears {n} times");
    }
    assert!(!runtime.is_thread_active("t"));
}

/// A `RunEnd` hook that takes ten seconds, ignoring cancellation.
#[derive(Clone)]
struct SlowCleanup;
#[async_trait::async_trait]
impl PhaseHook for SlowCleanup {
    async fn run(&self, _ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        Ok(())
    }
}
impl Plugin for SlowCleanup {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::RunEnd, Arc::new(self.clone()));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_that_will_not_let_go_makes_the_submission_fail_and_append_nothing() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]);
    let runtime = builder_with(model, spec().with_plugin_id("slow"))
        .with_plugin("slow", Arc::new(SlowCleanup))
        .with_tool("gate", Arc::new(gate))
        .with_cancel_wait_timeout(std::time::Duration::from_secs(1))
        .build()
        .unwrap();
    let mailbox = runtime.mailbox();
    let first = mailbox.submit(user("t", "first")).await.unwrap();
    entered.notified().await;
    let err = mailbox.submit(user("t", "second")).await.unwrap_err();
    assert_eq!(
        err,
        RuntimeError::PreviousRunStuck {
            thread_id: "t".into(),
            run_id: first.run_id().to_owned()
        }
    );
    let first = first.wait().await.unwrap();
    assert!(matches!(
        first.cancel_cause,
        Some(CancelCause::Interrupted { .. })
    ));
    let texts: Vec<String> = runtime
        .thread_messages("t")
        .await
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert!(!texts.contains(&"second".to_owned()), "{texts:?}");
}

#[tokio::test]
async fn mailbox_runs_stream_their_events_to_the_requests_sink() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("streamed answer")]);
    let default_sink = Arc::new(CollectingSink::new());
    let runtime = builder_with(model, spec())
        .with_event_sink(default_sink.clone())
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let handle = runtime
        .mailbox()
        .submit(user("t", "go").with_event_sink(sink.clone()))
        .await
        .unwrap();
    let run_id = handle.run_id().to_owned();
    handle.wait().await.unwrap();
    let events = sink.events();
    assert!(events.iter().all(|e| e.run_id() == run_id));
    let deltas: String = events
        .iter()
        .filter_map(|e| match e {
            rein::contract::event::AgentEvent::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "streamed answer");
    assert_one_run_finished_last(&events);
    assert!(default_sink.events().is_empty());
}

#[tokio::test]
async fn different_threads_run_concurrently_and_shutdown_stops_them_all() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let model =
        ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]).repeat_last();
    let runtime = builder_with(model, spec())
        .with_tool("gate", Arc::new(gate))
        .build()
        .unwrap();
    let mut handles = Vec::new();
    for t in 0..5 {
        handles.push(
            runtime
                .mailbox()
                .submit(user(&format!("t{t}"), "go"))
                .await
                .unwrap(),
        );
        entered.notified().await;
    }
    assert!(
        (0..5).all(|t| runtime.is_thread_active(&format!("t{t}"))),
        "five runs active at once"
    );
    runtime.shutdown().await;
    assert!((0..5).all(|t| !runtime.is_thread_active(&format!("t{t}"))));
    for h in handles {
        let r = h.wait().await.unwrap();
        assert_eq!(r.cancel_cause, Some(CancelCause::Shutdown));
    }
    assert_eq!(
        runtime
            .mailbox()
            .submit(user("t9", "late"))
            .await
            .unwrap_err(),
        RuntimeError::ShutDown
    );
}

#[tokio::test]
async fn a_submission_that_cannot_start_does_not_interrupt_the_active_run() {
    let (runtime, entered) = gated_runtime(true);
    let handle = runtime.mailbox().submit(user("t", "busy")).await.unwrap();
    entered.notified().await;
    // An unknown agent, and input that would break the history: both are
    // rejected before anything is interrupted.
    let unknown = runtime
        .mailbox()
        .submit(user("t", "other agent").with_agent_id("nobody"))
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, RuntimeError::UnknownAgent { .. }),
        "{unknown}"
    );
    let orphan = RunRequest::new("t", vec![Message::tool("c9", "orphan")]);
    let invalid = runtime.mailbox().submit(orphan).await.unwrap_err();
    assert!(
        matches!(invalid, RuntimeError::InvalidInput { .. }),
        "{invalid}"
    );
    assert!(
        runtime.is_thread_active("t"),
        "the active run was not interrupted"
    );
    handle.cancel();
    let r = handle.wait().await.unwrap();
    assert_eq!(
        r.cancel_cause,
        Some(CancelCause::Requested),
        "not Interrupted"
    );
}

#[tokio::test]
async fn an_empty_submission_to_an_empty_thread_is_rejected() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]),
        spec(),
    )
    .build()
    .unwrap();
    let err = runtime
        .mailbox()
        .submit(RunRequest::new("empty", Vec::new()))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "thread \"empty\" has no history and the request has no messages; send at least one message"
    );
    assert!(runtime.thread_messages("empty").await.is_empty());
}
