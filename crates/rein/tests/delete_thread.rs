//! `delete_thread`: the thread's run is cancelled and awaited, its history
//! dropped, and layers forget it (auto mode's session).

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
use rein::auto::AutomationPolicy;
use rein::prelude::*;

#[tokio::test]
async fn deleting_a_thread_drops_its_history_and_its_session() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("ok").with_usage(7, 3)]).repeat_last(),
        spec(),
    )
    .build()
    .unwrap();
    // The first round uses 10; the second would need more than the 5 left.
    let policy = AutomationPolicy::from_json(r#"{"maxTokens": 15}"#).unwrap();
    runtime
        .auto_run(user("t", "go"), policy, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(runtime.session_tokens("t"), 10);
    assert!(!runtime.thread_messages("t").await.is_empty());
    runtime.delete_thread("t").await.unwrap();
    assert!(runtime.thread_messages("t").await.is_empty());
    assert_eq!(runtime.session_tokens("t"), 0);
    // A plain run on the thread now starts afresh and keeps no session.
    runtime.run_to_completion(user("t", "again")).await.unwrap();
    assert_eq!(runtime.session_tokens("t"), 0);
    assert_eq!(runtime.thread_messages("t").await.len(), 2);
}

#[tokio::test]
async fn deleting_a_thread_cancels_its_run_and_waits_for_it() {
    let (runtime, entered) = gated_runtime(true);
    let handle = runtime.mailbox().submit(user("t", "busy")).await.unwrap();
    entered.notified().await;
    runtime.delete_thread("t").await.unwrap();
    let r = handle.wait().await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert!(!runtime.is_thread_active("t"));
    assert!(runtime.thread_messages("t").await.is_empty());
}

#[tokio::test]
async fn deleting_an_unknown_thread_is_fine() {
    let runtime = builder_with(ScriptedExecutor::new(vec![]), spec())
        .build()
        .unwrap();
    runtime.delete_thread("never-used").await.unwrap();
}
