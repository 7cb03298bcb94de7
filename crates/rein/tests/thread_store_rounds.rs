//! When a run's messages reach its thread's store: each round as it ends
//! for a store that wants them (the default, what a database does); for
//! the in-memory store, which lends the run the thread's own history
//! (`ThreadStore::lend`), each round is shown as it ends too, without being
//! copied.

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
use rein::thread_store::{InMemoryThreadStore, ThreadStore, ThreadStoreError};
use serde_json::json;

/// A store that keeps histories in memory but wants each round as it ends
/// (the trait's defaults), as a database store does.
struct EachRound(InMemoryThreadStore);

#[async_trait::async_trait]
impl ThreadStore for EachRound {
    async fn load(&self, thread_id: &str) -> Result<Vec<Message>, ThreadStoreError> {
        self.0.load(thread_id).await
    }
    async fn append(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.0.append(thread_id, messages).await
    }
    async fn replace(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.0.replace(thread_id, messages).await
    }
}

/// A runtime whose first run answers "hi", and whose second calls `echo`,
/// then `gate` (which blocks until the run is cancelled).
fn two_run_runtime(
    store: Option<Arc<dyn ThreadStore>>,
) -> (AgentRuntime, Arc<tokio::sync::Notify>) {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("hi"),
        ScriptedResponse::tool_call("echo", json!({"n": 1})),
        ScriptedResponse::tool_call("gate", json!({})),
    ]);
    let mut builder = builder_with(model, spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_tool("gate", Arc::new(gate));
    if let Some(store) = store {
        builder = builder.with_thread_store(store);
    }
    (builder.build().unwrap(), entered)
}

/// Runs the two runs on thread "t": returns the thread as read while the
/// second blocks in `gate`, and as stored once it was cancelled.
async fn thread_during_and_after(
    runtime: &AgentRuntime,
    entered: &tokio::sync::Notify,
) -> (Vec<Message>, Vec<Message>) {
    let first = runtime.run_to_completion(user("t", "hello")).await.unwrap();
    assert_eq!(first.termination, TerminationReason::NaturalEnd);
    let second = runtime.mailbox().submit(user("t", "go on")).await.unwrap();
    entered.notified().await;
    let during = runtime.thread_messages("t").await;
    assert!(runtime.cancel_and_wait_by_thread("t").await);
    let ended = second.wait().await.unwrap();
    assert_eq!(ended.termination, TerminationReason::Cancelled);
    (during, runtime.thread_messages("t").await)
}

#[tokio::test]
async fn an_in_memory_thread_shows_a_run_s_finished_rounds_while_it_runs_and_the_rest_once_it_ends()
{
    let (runtime, entered) = two_run_runtime(None);
    let (during, after) = thread_during_and_after(&runtime, &entered).await;
    // While the second run blocks in `gate`, the thread shows its finished
    // rounds: the first run's two messages, the input and the echo round.
    // Not the round in progress (the gate call has no result yet).
    assert_eq!(during.len(), 5, "{during:?}");
    assert_history_valid(&during);
    assert_eq!(during[1].content, "hi");
    assert_eq!(during[2].content, "go on");
    assert_eq!(during[3].tool_calls[0].name, "echo");
    // Then everything: the gate call and its "not run" result.
    assert_history_valid(&after);
    assert_eq!(after[..5], during[..]);
    assert_eq!(after[3].tool_calls[0].arguments, json!({"n": 1}));
    assert_eq!(
        tool_results(&after)[0].1,
        json!({"echo": {"n": 1}}).to_string()
    );
    assert_eq!(after[5].tool_calls[0].name, "gate");
    assert_eq!(after.len(), 7, "{after:?}");
}

#[tokio::test]
async fn a_store_that_wants_each_round_has_it_as_soon_as_it_ends_and_the_same_history_at_the_end() {
    let (runtime, entered) = two_run_runtime(Some(Arc::new(EachRound(InMemoryThreadStore::new()))));
    let (during, after) = thread_during_and_after(&runtime, &entered).await;
    // The input and the finished echo round are stored while the run blocks
    // in the next round's call.
    assert_eq!(during.len(), 5, "{during:?}");
    assert_eq!(during[2].content, "go on");
    assert_eq!(during[3].tool_calls[0].name, "echo");
    assert_eq!(
        during[4].tool_call_id.as_deref(),
        Some(&*during[3].tool_calls[0].id)
    );
    assert_history_valid(&after);
    assert_eq!(after[..5], during[..]);

    // The in-memory store ends with the same history.
    let (runtime, entered) = two_run_runtime(None);
    let (_, in_memory) = thread_during_and_after(&runtime, &entered).await;
    assert_eq!(in_memory, after);
}
