//! `stop_on_tool` stops the run before the named tool runs; the call gets a
//! "not run" result and the stopping inference's text is kept.

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

use common::*;
use rein::prelude::*;
use serde_json::json;

#[tokio::test]
async fn the_named_tool_never_runs_and_its_call_is_answered() {
    let sleeper = Sleeper::new(false);
    let completed = sleeper.completed.clone();
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})),
        ScriptedResponse::text("finishing").with_tool_call("sleep", json!({"ms": 1})),
    ]);
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::StopOnTool {
            tool_name: "sleep".into(),
        }),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .with_tool("sleep", Arc::new(sleeper))
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("stop_on_tool", "the model called the tool \"sleep\"")
    );
    assert_eq!(r.response, "finishing");
    assert_eq!(completed.load(Ordering::SeqCst), 0);
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        tool_results(&history)[1].1,
        "not run: the run was stopped (stop_on_tool) — not_started: the call never began, so it had no effect"
    );
}
