//! Invariant 3: after any run ends, every assistant tool call in the thread's
//! history has exactly one result; calls that did not run say so.

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
use proptest::prelude::*;
use rein::contract::inference::InferenceError;
use rein::prelude::*;
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn cancelling_mid_stream_keeps_the_partial_text_marked_interrupted() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("one two three four five six")
            .with_chunk_delay(Duration::from_millis(100)),
    ]);
    let model = Arc::new(model);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model.clone())
        .build()
        .unwrap();
    let canceller = runtime.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        canceller.cancel_by_thread("t");
    });
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.response, "one two three ");
    assert_eq!(
        model.served_chunks(),
        3,
        "the rest of the stream was never read"
    );
    let history = runtime.thread_messages("t").await;
    assert_eq!(history.len(), 2);
    assert_eq!(history[1].content, "one two three ");
    assert!(history[1].interrupted);
    assert_history_valid(&history);
}

#[tokio::test]
async fn cancelling_during_tools_answers_every_call() {
    let gate = Gate::new(false);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_calls(vec![
        ("echo", json!({})),
        ("gate", json!({})),
    ])]);
    let runtime = builder_with(model, spec())
        .with_tool("gate", Arc::new(gate))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let canceller = runtime.clone();
    tokio::spawn(async move {
        entered.notified().await;
        canceller.cancel_by_thread("t");
    });
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let results = tool_results(&history);
    assert_eq!(
        results[0].1, r#"{"echo":{}}"#,
        "a call that finished keeps its result"
    );
    assert_eq!(
        results[1].1,
        "cancelled: the run was cancelled before this call finished — may_have_completed: the call was stopped while it ran; it may or may not have taken effect, so check before repeating it"
    );
}

#[tokio::test]
async fn unanswered_calls_in_the_input_are_answered_before_the_run() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("ok")]);
    let runtime = builder_with(model, spec()).build().unwrap();
    let input = vec![
        Message::assistant_with_tools("", vec![ToolCall::new("x1", "echo", json!({}))]),
        Message::user("continue"),
    ];
    runtime
        .run_to_completion(RunRequest::new("t", input))
        .await
        .unwrap();
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        history[1].content,
        "not run: this call had no result in the input"
    );
    assert_eq!(
        history[1].tool_status,
        Some(rein::contract::lifecycle::ToolCallStatus::NotStarted)
    );
}

#[tokio::test]
async fn calls_a_lost_run_left_open_in_the_store_may_have_completed() {
    // A store holding what a process that died mid-call left: a call and
    // no result.
    let store = Arc::new(rein::thread_store::InMemoryThreadStore::new());
    rein::thread_store::ThreadStore::append(
        &*store,
        "t",
        &[
            Message::user("mail them"),
            Message::assistant_with_tools("", vec![ToolCall::new("m1", "send_mail", json!({}))]),
        ],
    )
    .await
    .unwrap();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("ok")]);
    let runtime = builder_with(model, spec())
        .with_thread_store(store)
        .build()
        .unwrap();
    runtime
        .run_to_completion(RunRequest::new("t", vec![Message::user("again")]))
        .await
        .unwrap();
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(history[2].tool_call_id.as_deref(), Some("m1"));
    assert!(
        history[2].content.contains("may or may not have run"),
        "{}",
        history[2].content
    );
    assert_eq!(
        history[2].tool_status,
        Some(rein::contract::lifecycle::ToolCallStatus::MayHaveCompleted)
    );
}

#[derive(Debug, Clone)]
enum Step {
    Text,
    Calls(usize),
    TextAndCalls(usize),
    Retryable,
    Fatal,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Text),
        (1usize..4).prop_map(Step::Calls),
        (1usize..4).prop_map(Step::TextAndCalls),
        Just(Step::Retryable),
        Just(Step::Fatal),
    ]
}

fn response(step: &Step) -> ScriptedResponse {
    let calls = |n: usize| {
        (0..n)
            .map(|i| ("echo", json!({ "i": i })))
            .collect::<Vec<_>>()
    };
    match step {
        Step::Text => ScriptedResponse::text("plain answer"),
        Step::Calls(n) => ScriptedResponse::tool_calls(calls(*n)),
        Step::TextAndCalls(n) => {
            let mut r = ScriptedResponse::text("finish now");
            for (name, args) in calls(*n) {
                r = r.with_tool_call(name, args);
            }
            r
        }
        Step::Retryable => ScriptedResponse::error(InferenceError::server("flaky")),
        Step::Fatal => ScriptedResponse::error(InferenceError::invalid_request("bad")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the model does and whichever policy stops it, the history
    /// stays valid and the run reports exactly one RunFinished.
    #[test]
    fn any_script_leaves_a_valid_history(
        steps in prop::collection::vec(step(), 1..8),
        max_rounds in 0usize..6,
        stop_on_tool in any::<bool>(),
        content_match in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async {
            let model = ScriptedExecutor::new(steps.iter().map(response).collect());
            let mut s = spec().with_max_rounds(max_rounds);
            if stop_on_tool {
                s = s.with_stop_condition(StopConditionSpec::StopOnTool { tool_name: "echo".into() });
            }
            if content_match {
                s = s.with_stop_condition(StopConditionSpec::ContentMatch { pattern: "finish".into() });
            }
            let runtime = builder_with(model, s)
                .with_tool("echo", Arc::new(Echo("echo")))
                .with_retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
                .build()
                .unwrap();
            let sink = Arc::new(CollectingSink::new());
            runtime.run(user("t", "go"), sink.clone()).await.unwrap();
            assert_history_valid(&runtime.thread_messages("t").await);
            assert_one_run_finished_last(&sink.events());
            assert!(!runtime.is_thread_active("t"));
        });
    }
}

/// Stops the run at the first `BeforeToolExecute`.
struct StopBeforeTools;

#[async_trait::async_trait]
impl PhaseHook for StopBeforeTools {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        ctx.request_termination(TerminationReason::stopped("halt", "before tools"));
        Ok(())
    }
}

impl Plugin for StopBeforeTools {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::BeforeToolExecute, Arc::new(StopBeforeTools));
        Ok(())
    }
}

#[tokio::test]
async fn calls_sharing_an_id_each_get_a_result_when_a_stop_comes_before_the_tools() {
    // Some providers reuse call ids within one answer.
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_calls(vec![("echo", json!({"n": 1})), ("echo", json!({"n": 2}))])
            .with_call_id("same"),
    ]);
    let runtime = builder_with(model, spec().with_plugin_id("halt"))
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_plugin("halt", Arc::new(StopBeforeTools))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("halt"));
    let history = runtime.thread_messages("t").await;
    let results = tool_results(&history);
    assert_eq!(results.len(), 2, "{history:#?}");
    assert!(
        results
            .iter()
            .all(|(id, text)| id == "same" && text.starts_with("not run"))
    );
}

#[tokio::test]
async fn input_with_a_tool_result_that_answers_no_call_is_rejected_and_nothing_is_stored() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]).repeat_last(),
        spec(),
    )
    .build()
    .unwrap();
    runtime.run_to_completion(user("t", "first")).await.unwrap();
    let before = runtime.thread_messages("t").await;
    let orphan = RunRequest::new(
        "t",
        vec![Message::user("more"), Message::tool("call-x", "a result")],
    );
    let err = runtime.run_to_completion(orphan.clone()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input for thread \"t\": message #1: a tool result for call \"call-x\" that no assistant message right before it made; a tool result must directly follow the assistant message whose call it answers, once per call"
    );
    let err = runtime.mailbox().submit(orphan).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::InvalidInput { index: 1, .. }),
        "{err}"
    );
    assert_eq!(runtime.thread_messages("t").await, before);
}

#[tokio::test]
async fn input_with_a_second_result_for_one_call_is_rejected() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]),
        spec(),
    )
    .build()
    .unwrap();
    let twice = RunRequest::new(
        "t",
        vec![
            Message::user("go"),
            Message::assistant_with_tools("", vec![ToolCall::new("c1", "echo", json!({}))]),
            Message::tool("c1", "one"),
            Message::tool("c1", "two"),
        ],
    );
    let err = runtime.run_to_completion(twice).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::InvalidInput { thread_id, index: 3, reason }
            if thread_id == "t" && reason.contains("second tool result for call \"c1\"")),
        "{err}"
    );
    assert!(runtime.thread_messages("t").await.is_empty());
}

#[tokio::test]
async fn an_empty_answer_is_not_stored_as_an_empty_assistant_message() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::text(""),
            ScriptedResponse::text("ok"),
        ]),
        spec(),
    )
    .build()
    .unwrap();
    let r = runtime.run_to_completion(user("t", "first")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_eq!(r.response, "");
    runtime
        .run_to_completion(user("t", "second"))
        .await
        .unwrap();
    let history = runtime.thread_messages("t").await;
    assert!(
        history.iter().all(|m| m.role != Role::Assistant
            || !m.content.is_empty()
            || !m.tool_calls.is_empty()),
        "{history:#?}"
    );
    assert_eq!(history.len(), 3, "user, user, assistant: {history:#?}");
}
