//! The mailbox serializes submissions to a thread and interrupts its active
//! run; no submitted message is lost or duplicated (invariants 2 and 4).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

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
            "cancelled: the run was cancelled before this call finished",
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
