//! The durable thread store and leases against a real PostgreSQL
//! (`cargo xtask postgres start` prints `REIN_DATABASE_URL`; without it the
//! tests say they are skipped). Each test uses threads of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rein::prelude::*;
use rein_postgres::{Leases, PgThreadStore, ThreadStore};
use serde_json::json;

mod common;
use common::{thread, url};

#[tokio::test]
async fn a_history_is_appended_in_order_replaced_and_deleted() {
    let Some(url) = url() else { return };
    let store = PgThreadStore::new(rein_postgres::connect(&url).await.unwrap());
    let t = thread("history");
    assert!(store.load(&t).await.unwrap().is_empty());
    let call = rein::contract::message::ToolCall::new("c1", "echo", json!({"x": [1, 2]}));
    let first = vec![
        Message::user("hi"),
        Message::assistant_with_tools("", vec![call]),
    ];
    store.append(&t, &first).await.unwrap();
    store
        .append(&t, &[Message::tool("c1", "done")])
        .await
        .unwrap();
    let loaded = store.load(&t).await.unwrap();
    assert_eq!(loaded.len(), 3);
    assert_eq!(loaded[..2], first[..]);
    assert_eq!(loaded[2].tool_call_id.as_deref(), Some("c1"));
    store.replace(&t, &[Message::user("only")]).await.unwrap();
    assert_eq!(store.load(&t).await.unwrap(), vec![Message::user("only")]);
    store.delete(&t).await.unwrap();
    assert!(store.load(&t).await.unwrap().is_empty());
}

#[tokio::test]
async fn concurrent_starts_migrate_once_and_all_connect() {
    let Some(url) = url() else { return };
    let starts = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { rein_postgres::connect(&url).await.map(|_| ()) })
    });
    for start in starts {
        start.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_process_that_lost_its_lease_writes_nothing() {
    let Some(url) = url() else { return };
    let pool = rein_postgres::connect(&url).await.unwrap();
    let a = Leases::new(pool.clone(), "process-a", Duration::from_millis(400));
    let b = Leases::new(pool.clone(), "process-b", Duration::from_secs(30));
    let store_a = PgThreadStore::fenced(pool.clone(), a.clone());
    let store_b = PgThreadStore::fenced(pool.clone(), b.clone());
    let t = thread("fence");

    let fence_a = a.acquire(&t).await.unwrap().expect("a free thread");
    assert_eq!(
        a.acquire(&t).await.unwrap(),
        Some(fence_a),
        "re-acquiring keeps the fence"
    );
    store_a
        .append(&t, &[Message::user("from a")])
        .await
        .unwrap();
    assert_eq!(b.acquire(&t).await.unwrap(), None, "owned by a");
    let refused = store_b
        .append(&t, &[Message::user("from b")])
        .await
        .unwrap_err();
    assert!(
        refused.message.contains("does not hold the thread's lease"),
        "{refused}"
    );

    // a stops renewing (paused); its lease expires on the database's clock.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let fence_b = b.acquire(&t).await.unwrap().expect("an expired lease");
    assert_eq!(fence_b, fence_a + 1);
    assert!(b.take_over(&t), "taken from a process whose lease expired");
    assert!(!b.take_over(&t), "said once");
    // a wakes up: its write is refused by the fence check.
    let stale = store_a
        .append(&t, &[Message::user("stale")])
        .await
        .unwrap_err();
    assert!(stale.message.contains("fenced"), "{stale}");
    assert_eq!(
        a.renew().await.unwrap(),
        vec![t.clone()],
        "a learns it lost the thread"
    );
    assert_eq!(a.fence(&t), None);
    store_b
        .append(&t, &[Message::user("from b")])
        .await
        .unwrap();
    let history = PgThreadStore::new(pool.clone()).load(&t).await.unwrap();
    assert_eq!(
        history,
        vec![Message::user("from a"), Message::user("from b")]
    );

    // A released lease is free for the next owner, at a new fence.
    b.release(&t).await.unwrap();
    assert_eq!(a.acquire(&t).await.unwrap(), Some(fence_b + 1));
    assert!(!a.take_over(&t), "a released lease is not a lost process's");
    assert!(b.renew().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_runtime_on_the_store_keeps_its_threads_across_runtimes() {
    let Some(url) = url() else { return };
    let pool = rein_postgres::connect(&url).await.unwrap();
    let t = thread("runtime");
    let runtime = |answer: &str| {
        AgentRuntimeBuilder::new()
            .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
            .with_model(ModelSpec::new("m", "p", "x"))
            .with_provider(
                "p",
                Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text(answer)])),
            )
            .with_thread_store(Arc::new(PgThreadStore::new(pool.clone())))
            .build()
            .unwrap()
    };
    let first = runtime("first answer");
    first
        .run_to_completion(RunRequest::new(&t, vec![Message::user("one")]))
        .await
        .unwrap();
    // A new runtime (as after a restart) continues the stored thread.
    let second = runtime("second answer");
    let result = second
        .run_to_completion(RunRequest::new(&t, vec![Message::user("two")]))
        .await
        .unwrap();
    assert_eq!(result.response, "second answer");
    let history = second.thread_messages(&t).await;
    let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, vec!["one", "first answer", "two", "second answer"]);
}

#[tokio::test]
async fn a_lost_run_s_open_calls_are_answered_as_may_have_completed() {
    let Some(url) = url() else { return };
    let store = PgThreadStore::new(rein_postgres::connect(&url).await.unwrap());
    let t = thread("lost-calls");
    let calls = vec![
        rein::contract::message::ToolCall::new("c1", "send_mail", json!({})),
        rein::contract::message::ToolCall::new("c2", "search", json!({})),
    ];
    store
        .append(
            &t,
            &[
                Message::user("go"),
                Message::assistant_with_tools("", calls),
                Message::tool("c1", "sent"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(store.repair_lost(&t, &[]).await.unwrap(), 1);
    let history = store.load(&t).await.unwrap();
    let repaired = history.last().unwrap();
    assert_eq!(repaired.tool_call_id.as_deref(), Some("c2"));
    assert_eq!(repaired.content, rein_postgres::LOST_WORKER_NOTE);
    assert_eq!(
        repaired.tool_status,
        Some(rein::contract::lifecycle::ToolCallStatus::MayHaveCompleted)
    );
    assert_eq!(history[2].tool_status, None, "a completed call has none");
    store.delete(&t).await.unwrap();
}
