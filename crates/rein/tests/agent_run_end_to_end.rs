//! A run works end to end with the scripted executor: model call, tool
//! calls, more model calls, final answer.

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
use rein::contract::event::AgentEvent;
use rein::contract::inference::InferenceError;
use rein::prelude::*;
use serde_json::json;

#[tokio::test]
async fn a_model_call_a_tool_call_and_a_final_answer_make_one_run() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("checking")
            .with_tool_call("echo", json!({"x": 1}))
            .with_usage(10, 2),
        ScriptedResponse::text("all done").with_usage(20, 3),
    ]);
    let runtime = builder_with(model, spec().with_system_prompt("be brief"))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime
        .run(user("t1", "hello"), sink.clone())
        .await
        .unwrap();

    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "all done");
    assert_eq!(result.steps, 2);
    assert_eq!(result.usage, TokenUsage::new(30, 5));
    assert!(result.usage_complete);
    assert_eq!(result.cancel_cause, None);
    assert_eq!(result.thread_id, "t1");

    let history = runtime.thread_messages("t1").await;
    let roles: Vec<Role> = history.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
    );
    assert_eq!(history[1].tool_calls[0].name, "echo");
    assert_eq!(history[2].content, r#"{"echo":{"x":1}}"#);
    assert!(
        history.iter().all(|m| m.role != Role::System),
        "the system prompt is never stored"
    );
    assert_history_valid(&history);

    let events = sink.events();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            AgentEvent::RunStarted { .. } => "run_started",
            AgentEvent::StepStarted { .. } => "step_started",
            AgentEvent::TextDelta { .. } => "text_delta",
            AgentEvent::ToolCallStarted { .. } => "tool_call_started",
            AgentEvent::ToolCallFinished { .. } => "tool_call_finished",
            AgentEvent::RoundUsage { .. } => "round_usage",
            AgentEvent::RunFinished { .. } => "run_finished",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "step_started",
            "text_delta",
            "round_usage",
            "tool_call_started",
            "tool_call_finished",
            "step_started",
            "text_delta",
            "text_delta",
            "round_usage",
            "run_finished"
        ]
    );
    // Each round's tokens, in order; they add up to the run's.
    let rounds: Vec<(u32, TokenUsage)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::RoundUsage { step, usage, .. } => Some((*step, *usage)),
            _ => None,
        })
        .collect();
    assert_eq!(rounds.len(), 2);
    assert_eq!((rounds[0].0, rounds[1].0), (1, 2));
    let mut total = rounds[0].1;
    total.add(rounds[1].1);
    assert_eq!(total, result.usage);
    match events.last().unwrap() {
        AgentEvent::RunFinished {
            termination,
            response,
            steps,
            run_id,
            ..
        } => {
            assert_eq!(termination, &TerminationReason::NaturalEnd);
            assert_eq!(response, "all done");
            assert_eq!(*steps, 2);
            assert_eq!(run_id, &result.run_id);
        }
        other => panic!("last event {other:?}"),
    }
}

#[tokio::test]
async fn the_model_sees_the_system_prompt_history_and_tools() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        log.lock().unwrap().push((
            req.model.clone(),
            req.system.clone(),
            req.messages.len(),
            req.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        ));
        if req.messages.len() < 3 {
            ScriptedResponse::tool_call("echo", json!({}))
        } else {
            ScriptedResponse::text("ok")
        }
    });
    let runtime = builder_with(model, spec().with_system_prompt("sys"))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "hi")).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0],
        (
            "scripted-model".to_owned(),
            Some("sys".to_owned()),
            1,
            vec!["echo".to_owned()]
        )
    );
    assert_eq!(
        seen[1].2, 3,
        "second inference sees user, assistant and tool messages"
    );
}

#[tokio::test]
async fn a_second_run_continues_the_thread_history() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("one"),
        ScriptedResponse::text("two"),
    ]);
    let runtime = builder_with(model, spec()).build().unwrap();
    runtime.run_to_completion(user("t", "first")).await.unwrap();
    runtime
        .run_to_completion(user("t", "second"))
        .await
        .unwrap();
    let texts: Vec<String> = runtime
        .thread_messages("t")
        .await
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["first", "one", "second", "two"]);
    assert!(runtime.thread_messages("unknown").await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn tool_calls_of_one_answer_run_concurrently_and_results_keep_call_order() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_calls(vec![
            ("sleep", json!({"ms": 300})),
            ("echo", json!({"n": 2})),
            ("sleep", json!({"ms": 100})),
        ]),
        ScriptedResponse::text("done"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("sleep", Arc::new(Sleeper::new(true)))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    // On the paused clock, concurrent calls take as long as the longest
    // (300 ms); sequential ones would take 400 ms.
    assert_eq!(started.elapsed(), std::time::Duration::from_millis(300));
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let history = runtime.thread_messages("t").await;
    let calls: Vec<String> = history[1].tool_calls.iter().map(|c| c.id.clone()).collect();
    let results: Vec<String> = tool_results(&history).into_iter().map(|r| r.0).collect();
    assert_eq!(calls, results);
    assert_eq!(tool_results(&history)[0].1, "slept 300 ms");
}

#[tokio::test]
async fn a_failing_tool_gives_the_model_an_error_result_and_the_run_goes_on() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("failing", json!({})),
        ScriptedResponse::text("recovered"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("failing", Arc::new(Failing))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "recovered");
    let history = runtime.thread_messages("t").await;
    assert_eq!(tool_results(&history)[0].1, "error: disk on fire");
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolCallFinished { is_error: true, .. }))
    );
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_error_result_and_the_run_goes_on() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("panicking", json!({})),
        ScriptedResponse::text("still here"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("panicking", Arc::new(Panicking))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let history = runtime.thread_messages("t").await;
    assert_eq!(
        tool_results(&history)[0].1,
        "error: tool \"panicking\" panicked: tool exploded"
    );
    assert!(!runtime.is_thread_active("t"));
}

#[tokio::test]
async fn an_unknown_tool_gets_an_error_result_naming_the_available_tools() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("nope", json!({})),
        ScriptedResponse::text("ok"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "go")).await.unwrap();
    let history = runtime.thread_messages("t").await;
    assert_eq!(
        tool_results(&history)[0].1,
        "error: unknown tool \"nope\"; available tools: echo"
    );
}

#[tokio::test]
async fn a_script_that_ends_in_a_non_retryable_error_ends_the_run_with_that_error() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})),
        ScriptedResponse::error(InferenceError::unauthorized("bad key")),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::Error("inference failed: unauthorized: bad key".into())
    );
    assert_eq!(result.steps, 2);
    assert_history_valid(&runtime.thread_messages("t").await);
    assert_one_run_finished_last(&sink.events());
}

#[tokio::test]
async fn an_exhausted_script_ends_the_run_with_an_error() {
    let runtime = builder_with(ScriptedExecutor::new(vec![]), spec())
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    match result.termination {
        TerminationReason::Error(m) => {
            assert!(m.contains("script is exhausted after 0 responses"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unknown_usage_is_reported_as_incomplete_not_zero() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})).with_usage(5, 5),
        ScriptedResponse::text("no usage reported"),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(result.usage, TokenUsage::new(5, 5));
    assert!(!result.usage_complete);
}

#[tokio::test]
async fn requests_must_name_an_agent_when_there_are_several_and_unknown_ones_fail() {
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
        .with_agent_spec(AgentSpec::new("b").with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider(
            "p",
            Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text("hi")])),
        )
        .build()
        .unwrap();
    let err = runtime
        .run_to_completion(user("t", "go"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the request names no agent and the runtime has 2 agents; call RunRequest::with_agent_id with one of: a, b"
    );
    let err = runtime
        .run_to_completion(user("t", "go").with_agent_id("c"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuntimeError::UnknownAgent {
            agent_id: "c".into(),
            known: "a, b".into()
        }
    );
    let ok = runtime
        .run_to_completion(user("t", "go").with_agent_id("b"))
        .await
        .unwrap();
    assert_eq!(ok.response, "hi");
    assert!(
        runtime.thread_messages("t").await.len() == 2,
        "failed requests append nothing"
    );
}

#[tokio::test]
async fn a_request_with_no_messages_for_an_empty_thread_is_rejected() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]).repeat_last(),
        spec(),
    )
    .build()
    .unwrap();
    let err = runtime
        .run_to_completion(RunRequest::new("t", Vec::new()))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuntimeError::EmptyConversation {
            thread_id: "t".into()
        }
    );
    assert!(!runtime.is_thread_active("t"));
    // An empty continuation of a thread with a history is fine.
    runtime.run_to_completion(user("t", "hello")).await.unwrap();
    let r = runtime
        .run_to_completion(RunRequest::new("t", Vec::new()))
        .await
        .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
}

#[tokio::test(start_paused = true)]
async fn a_retried_inference_is_announced_as_a_retry_not_a_new_round() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::error(InferenceError::server("boom")),
            ScriptedResponse::text("fine"),
        ]),
        spec(),
    )
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(r.steps, 2);
    let rounds: Vec<String> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::StepStarted { step, .. } => Some(format!("step {step}")),
            AgentEvent::RetryStarted { step, attempt, .. } => {
                Some(format!("retry {step} attempt {attempt}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(rounds, ["step 1", "retry 2 attempt 2"]);
}
