//! Explicit completion through full runs: the `terminate` tool and declared
//! outputs with nudges.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use rein::contract::event::AgentEvent;
use rein::plugins::{OutputsPlugin, TerminatePlugin};
use rein::prelude::*;
use serde_json::json;

fn with_terminate(model: ScriptedExecutor) -> AgentRuntime {
    builder_with(model, spec().with_plugin_id("done"))
        .with_plugin("done", Arc::new(TerminatePlugin::new()))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap()
}

#[tokio::test]
async fn calling_terminate_ends_the_run_after_its_result_is_recorded() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})),
        ScriptedResponse::text("All done.").with_tool_call(
            "terminate",
            json!({"status": "success", "message": "converted 3 files"}),
        ),
    ]);
    let runtime = with_terminate(model);
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("terminate", "status: success; message: converted 3 files")
    );
    assert_eq!(r.response, "All done.");
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        history.last().unwrap().content,
        "the task has ended with status success"
    );
}

#[tokio::test]
async fn terminate_with_failure_and_no_message_is_reported_as_such() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call(
        "terminate",
        json!({"status": "failure"}),
    )]);
    let r = with_terminate(model)
        .run_to_completion(user("t", "go"))
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("terminate", "status: failure")
    );
}

#[tokio::test]
async fn invalid_terminate_arguments_give_the_model_an_error_and_the_run_goes_on() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("terminate", json!({"status": "finished"})),
        ScriptedResponse::tool_call("terminate", json!({"status": "success", "message": 42})),
        ScriptedResponse::text("I will keep working."),
    ]);
    let runtime = with_terminate(model);
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    let results = tool_results(&runtime.thread_messages("t").await);
    assert_eq!(
        results[0].1,
        "error: invalid arguments: `status` must be \"success\" or \"failure\", got \"finished\""
    );
    assert_eq!(
        results[1].1,
        "error: invalid arguments: `message` must be a string, got 42"
    );
}

fn outputs_runtime(model: ScriptedExecutor, plugin: OutputsPlugin) -> AgentRuntime {
    builder_with(model, spec().with_plugin_id("outputs"))
        .with_plugin("outputs", Arc::new(plugin))
        .build()
        .unwrap()
}

fn declared() -> OutputsPlugin {
    OutputsPlugin::new([
        ("summary", "string"),
        ("risk_score", "number"),
        ("count", "integer"),
    ])
}

#[tokio::test]
async fn emitting_every_declared_output_reaches_the_goal() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_calls(vec![
            ("emit_output", json!({"name": "summary", "value": "draft"})),
            ("emit_output", json!({"name": "risk_score", "value": 0.3})),
        ]),
        ScriptedResponse::tool_calls(vec![
            ("emit_output", json!({"name": "summary", "value": "final"})),
            ("emit_output", json!({"name": "count", "value": 4.0})),
        ]),
        ScriptedResponse::text("never reached"),
    ]);
    let sink = Arc::new(CollectingSink::new());
    let r = outputs_runtime(model, declared())
        .run(user("t", "go"), sink.clone())
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "goal",
            "all declared outputs were emitted: count, risk_score, summary"
        )
    );
    assert_eq!(r.steps, 2);
    assert_eq!(
        r.outputs["summary"],
        json!("final"),
        "re-emitting overwrites"
    );
    assert_eq!(r.outputs["risk_score"], json!(0.3));
    assert_eq!(r.outputs["count"], json!(4.0));
    match sink.events().last().unwrap() {
        AgentEvent::RunFinished { outputs, .. } => assert_eq!(outputs, &r.outputs),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn wrong_types_and_unknown_names_are_errors_the_model_sees() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_calls(vec![
            ("emit_output", json!({"name": "count", "value": 2.5})),
            ("emit_output", json!({"name": "risk", "value": 1})),
            ("emit_output", json!({"name": "summary", "value": 7})),
        ]),
        ScriptedResponse::tool_calls(vec![
            ("emit_output", json!({"name": "count", "value": 2})),
            ("emit_output", json!({"name": "risk_score", "value": 1})),
            ("emit_output", json!({"name": "summary", "value": "ok"})),
        ]),
    ]);
    let runtime = outputs_runtime(model, declared());
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("goal"));
    let results = tool_results(&runtime.thread_messages("t").await);
    assert_eq!(
        results[0].1,
        "error: output \"count\" must be of type integer, got 2.5"
    );
    assert_eq!(
        results[1].1,
        "error: unknown output \"risk\"; declared outputs: count, risk_score, summary"
    );
    assert_eq!(
        results[2].1,
        "error: output \"summary\" must be of type string, got 7"
    );
}

#[tokio::test]
async fn missing_outputs_are_nudged_then_the_run_stops_naming_them() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        log.lock()
            .unwrap()
            .push(req.messages.last().unwrap().content.clone());
        if req.messages.len() == 1 {
            ScriptedResponse::tool_call("emit_output", json!({"name": "summary", "value": "s"}))
        } else {
            ScriptedResponse::text("I think I am finished.")
        }
    });
    let sink = Arc::new(CollectingSink::new());
    let r = outputs_runtime(model, declared().with_max_nudges(2))
        .run(user("t", "go"), sink.clone())
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "missing_outputs",
            "declared outputs never emitted: count, risk_score (after 2 nudges)"
        )
    );
    assert_eq!(r.steps, 4);
    assert_eq!(
        r.outputs.len(),
        1,
        "what was emitted is reported whatever ended the run"
    );
    let seen = seen.lock().unwrap();
    assert!(seen[2].starts_with(
        "You stopped calling tools but have not emitted these required outputs: count, risk_score."
    ));
    let nudges = sink
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::Nudge { .. }))
        .count();
    assert_eq!(nudges, 2);
}

#[tokio::test]
async fn an_unknown_declared_type_fails_the_build_naming_it() {
    let err = builder_with(
        ScriptedExecutor::new(vec![]),
        spec().with_plugin_id("outputs"),
    )
    .with_plugin(
        "outputs",
        Arc::new(OutputsPlugin::new([("score", "float")])),
    )
    .build()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin \"outputs\" could not be registered for agent \"agent\": invalid plugin configuration: output \"score\": unknown JSON type \"float\"; expected string, number, integer, boolean, object or array"
    );
}
