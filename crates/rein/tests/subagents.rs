//! Sub-agents through the public API: an agent as a tool (isolated and
//! shared context, declared outputs), isolation both ways, one cancel for
//! the tree, one budget for the tree, concurrency, nesting and cycles.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rein::prelude::*;
use serde_json::{Value, json};

/// A runtime whose agents each run on their own scripted provider.
fn runtime(agents: Vec<(AgentSpec, Vec<ScriptedResponse>)>) -> AgentRuntimeBuilder {
    let mut builder = AgentRuntimeBuilder::new();
    for (spec, script) in agents {
        let id = spec.id.clone();
        builder = builder
            .with_agent_spec(spec.with_model_id(format!("m-{id}")))
            .with_model(ModelSpec::new(format!("m-{id}"), format!("p-{id}"), "x"))
            .with_provider(
                format!("p-{id}"),
                Arc::new(ScriptedExecutor::new(script).repeat_last()),
            );
    }
    builder
}

fn task(text: &str) -> Value {
    json!({ "task": text })
}

/// The parent's tool message answering call `n` (0-based) of the thread.
async fn tool_result(rt: &AgentRuntime, thread: &str, n: usize) -> (Value, Message) {
    let history = rt.thread_messages(thread).await;
    let message = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .nth(n)
        .cloned()
        .unwrap_or_else(|| panic!("no tool result {n}: {history:#?}"));
    let json = serde_json::from_str(message.content.trim_start_matches("error: "))
        .unwrap_or_else(|e| panic!("{e}: {}", message.content));
    (json, message)
}

#[tokio::test]
async fn an_isolated_sub_agent_gets_only_its_task_and_its_end_comes_back_as_json() {
    let lead = AgentSpec::new("lead").with_subagent(
        SubagentSpec::new("researcher")
            .with_tool("research")
            .with_description("Research one question."),
    );
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("research", task("find the trains")).with_usage(10, 5),
                ScriptedResponse::text("The researcher found them.").with_usage(20, 5),
            ],
        ),
        (
            AgentSpec::new("researcher"),
            vec![ScriptedResponse::text("There are two trains.").with_usage(7, 3)],
        ),
    ])
    .build()
    .unwrap();
    let descriptor = rt
        .agent_tools("lead")
        .unwrap()
        .into_iter()
        .find(|t| t.name == "research")
        .unwrap();
    assert_eq!(descriptor.description, "Research one question.");
    assert_eq!(descriptor.parameters["required"], json!(["task"]));
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(
            RunRequest::new("t", vec![Message::user("plan a trip")]).with_agent_id("lead"),
            sink.clone(),
        )
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let (json, message) = tool_result(&rt, "t", 0).await;
    assert!(
        !message.content.starts_with("error:"),
        "{}",
        message.content
    );
    assert_eq!(json["status"], "natural_end");
    assert_eq!(json["response"], "There are two trains.");
    assert_eq!(json["rounds"], 1);
    assert_eq!(json["usage"]["input_tokens"], 7);
    // The parent's usage includes its child's; the report lists it.
    assert_eq!(result.usage.total(), 10 + 5 + 20 + 5 + 7 + 3);
    assert_eq!(result.report.children.len(), 1);
    let child = &result.report.children[0];
    assert_eq!(
        (child.agent_id.as_str(), child.code.as_str()),
        ("researcher", "natural_end")
    );
    // The child ran on a thread of its own, seeing only the task.
    assert!(message.tool_call_id.is_some());
    assert_eq!(child.run_id, format!("{}.1", result.run_id));
    let child_thread = format!("t:{}", child.run_id);
    let child_history = rt.thread_messages(&child_thread).await;
    assert_eq!(child_history[0].content, "find the trains");
    assert_eq!(child_history.len(), 2);
    // Its events are on the parent's stream, between started and finished.
    let events = sink.events();
    let started = events
        .iter()
        .position(|e| matches!(e, AgentEvent::SubagentStarted { .. }))
        .unwrap();
    let finished = events
        .iter()
        .position(|e| matches!(e, AgentEvent::SubagentFinished { .. }))
        .unwrap();
    let AgentEvent::SubagentStarted {
        run_id,
        child_run_id,
        child_thread_id,
        agent_id,
        ..
    } = &events[started]
    else {
        unreachable!()
    };
    assert_eq!(run_id, &result.run_id);
    assert_eq!(child_thread_id, &child_thread);
    assert_eq!(agent_id, "researcher");
    assert_eq!(child_run_id, &child.run_id);
    let child_events: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.run_id() == child_run_id)
        .map(|(i, _)| i)
        .collect();
    assert!(!child_events.is_empty());
    assert!(child_events.iter().all(|i| *i > started && *i < finished));
    assert!(matches!(
        events[finished - 1],
        AgentEvent::RunFinished { .. }
    ));
}

#[tokio::test]
async fn a_shared_sub_agent_sees_the_parent_s_history_before_the_call_then_its_task() {
    let lead = AgentSpec::new("lead")
        .with_subagent(SubagentSpec::new("critic").with_context(SubagentContext::Shared));
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::text("Let me ask the critic.")
                    .with_tool_call("critic", task("judge the plan")),
                ScriptedResponse::text("done"),
            ],
        ),
        (
            AgentSpec::new("critic"),
            vec![ScriptedResponse::text("It is fine.")],
        ),
    ])
    .build()
    .unwrap();
    let result = rt
        .run_to_completion(
            RunRequest::new("s", vec![Message::user("my plan: walk")]).with_agent_id("lead"),
        )
        .await
        .unwrap();
    let (json, _) = tool_result(&rt, "s", 0).await;
    assert_eq!(json["response"], "It is fine.");
    let child = rt
        .thread_messages(&format!("s:{}", result.report.children[0].run_id))
        .await;
    let texts: Vec<(&Role, &str)> = child
        .iter()
        .map(|m| (&m.role, m.content.as_str()))
        .collect();
    assert_eq!(
        texts[..3],
        [
            (&Role::User, "my plan: walk"),
            (&Role::Assistant, "Let me ask the critic."),
            (&Role::User, "judge the plan"),
        ]
    );
}

#[tokio::test]
async fn declared_outputs_end_the_child_with_goal_and_come_back_with_its_result() {
    let lead = AgentSpec::new("lead").with_subagent(
        SubagentSpec::new("researcher")
            .with_output("summary", "string")
            .with_output("sources", "array"),
    );
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("researcher", task("trains")),
                ScriptedResponse::text("ok"),
            ],
        ),
        (
            AgentSpec::new("researcher"),
            vec![
                // Stops without the outputs: nudged, then emits them.
                ScriptedResponse::text("I looked."),
                ScriptedResponse::tool_call(
                    "emit_output",
                    json!({"name": "summary", "value": "two trains"}),
                )
                .with_tool_call(
                    "emit_output",
                    json!({"name": "sources", "value": ["sbb.ch"]}),
                ),
            ],
        ),
    ])
    .build()
    .unwrap();
    // The hidden variant with the outputs is not one of the runtime's agents.
    assert_eq!(rt.agent_ids(), ["lead", "researcher"]);
    rt.run_to_completion(RunRequest::new("o", vec![Message::user("go")]).with_agent_id("lead"))
        .await
        .unwrap();
    let (json, _) = tool_result(&rt, "o", 0).await;
    assert_eq!(json["status"], "goal", "{json}");
    assert_eq!(
        json["outputs"],
        json!({"summary": "two trains", "sources": ["sbb.ch"]})
    );
    assert_eq!(json["response"], "I looked.");
}

#[tokio::test]
async fn any_end_of_a_child_is_one_tool_result_and_the_parent_and_siblings_go_on() {
    let lead = AgentSpec::new("lead")
        .with_subagent(SubagentSpec::new("looper").with_max_rounds(2))
        .with_subagent(SubagentSpec::new("broken"))
        .with_subagent(SubagentSpec::new("fine"));
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("looper", task("loop"))
                    .with_tool_call("broken", task("fail"))
                    .with_tool_call("fine", task("answer")),
                ScriptedResponse::text("all three came back"),
            ],
        ),
        (
            AgentSpec::new("looper"),
            vec![ScriptedResponse::tool_call("nothing", json!({}))],
        ),
        (
            AgentSpec::new("broken"),
            vec![ScriptedResponse::error(InferenceError::invalid_request(
                "bad request",
            ))],
        ),
        (AgentSpec::new("fine"), vec![ScriptedResponse::text("fine")]),
    ])
    .build()
    .unwrap();
    let result = rt
        .run_to_completion(RunRequest::new("i", vec![Message::user("go")]).with_agent_id("lead"))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "all three came back");
    let (looper, _) = tool_result(&rt, "i", 0).await;
    assert_eq!(looper["status"], "max_rounds", "{looper}");
    assert_eq!(looper["rounds"], 2);
    let (broken, message) = tool_result(&rt, "i", 1).await;
    assert_eq!(broken["status"], "error");
    assert!(
        !message.content.starts_with("error: "),
        "the result is the JSON"
    );
    assert!(broken["detail"].as_str().unwrap().contains("bad request"));
    let (fine, _) = tool_result(&rt, "i", 2).await;
    assert_eq!(fine["status"], "natural_end");
    let codes: Vec<&str> = result
        .report
        .children
        .iter()
        .map(|c| c.code.as_str())
        .collect();
    assert_eq!(codes.len(), 3);
    for code in ["max_rounds", "error", "natural_end"] {
        assert!(codes.contains(&code), "{codes:?}");
    }
}

/// A child that streams slowly: cancels reach it mid-stream.
fn slow(text: &str) -> ScriptedResponse {
    ScriptedResponse::text(text).with_chunk_delay(Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_ends_the_whole_tree_before_the_cancel_returns() {
    for round in 0..10 {
        let lead = AgentSpec::new("lead")
            .with_subagent(SubagentSpec::new("mid"))
            .with_subagent(SubagentSpec::new("leaf"));
        let mid = AgentSpec::new("mid").with_subagent(SubagentSpec::new("leaf"));
        let words = "one two three four five six seven eight nine ten ".repeat(10);
        let rt = runtime(vec![
            (
                lead,
                vec![
                    ScriptedResponse::tool_call("mid", task("go deeper"))
                        .with_tool_call("leaf", task("talk")),
                ],
            ),
            (mid, vec![ScriptedResponse::tool_call("leaf", task("talk"))]),
            (AgentSpec::new("leaf"), vec![slow(&words)]),
        ])
        .build()
        .unwrap();
        let sink = Arc::new(CollectingSink::new());
        let run = spawn_lead(&rt, "root", &sink);
        // Wait until both leaves are streaming.
        while sink
            .events()
            .iter()
            .filter(|e| matches!(e, AgentEvent::TextDelta { .. }))
            .count()
            < 4
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(rt.cancel_and_wait_by_thread("root").await, "round {round}");
        let seen = sink.events().len();
        // Every run of the tree has ended: each has its run_finished, and
        // no thread of the tree is active.
        let events = sink.events();
        let started: Vec<&str> = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunStarted { .. }))
            .map(AgentEvent::run_id)
            .collect();
        assert_eq!(started.len(), 4, "root, mid, two leaves");
        for id in &started {
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, AgentEvent::RunFinished { run_id, .. } if run_id == id)),
                "run {id} had not finished when the cancel returned (round {round})"
            );
        }
        let result = run.await.unwrap().unwrap();
        assert_eq!(result.termination, TerminationReason::Cancelled);
        for child in &result.report.children {
            assert_eq!(child.code, "cancelled", "{child:?}");
        }
        // Nothing happens after the cancel returned.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            sink.events().len(),
            seen,
            "events after the cancel returned"
        );
    }
}

#[tokio::test]
async fn cancelling_one_child_ends_only_it_and_the_parent_goes_on() {
    let lead = AgentSpec::new("lead").with_subagent(SubagentSpec::new("leaf"));
    let words = "one two three four five ".repeat(40);
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("leaf", task("talk")),
                ScriptedResponse::text("the parent went on"),
            ],
        ),
        (AgentSpec::new("leaf"), vec![slow(&words)]),
    ])
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let run = spawn_lead(&rt, "p", &sink);
    let child_thread = loop {
        if let Some(thread) = sink.events().iter().find_map(|e| match e {
            AgentEvent::SubagentStarted {
                child_thread_id, ..
            } => Some(child_thread_id.clone()),
            _ => None,
        }) {
            break thread;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    until_a_child_streams(&sink).await;
    assert!(rt.cancel_and_wait_by_thread(&child_thread).await);
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "the parent went on");
    let (json, message) = tool_result(&rt, "p", 0).await;
    assert_eq!(json["status"], "cancelled");
    // An error result for the model (`is_error`), whose text is the JSON.
    let call_id = message.tool_call_id.unwrap();
    assert!(sink.events().iter().any(|e| matches!(
        e,
        AgentEvent::ToolCallFinished { call_id: id, is_error: true, .. } if *id == call_id
    )));
}

#[tokio::test]
async fn tokens_anywhere_in_the_tree_count_against_the_root_s_budget_before_spending() {
    // The root may spend 1 000 tokens; each child inference reports 300.
    let lead = AgentSpec::new("lead")
        .with_stop_condition(StopConditionSpec::TokenBudget { max_total: 1000 })
        .with_subagent(SubagentSpec::new("worker"));
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("worker", task("work")).with_usage(50, 10),
                ScriptedResponse::text("done").with_usage(10, 10),
            ],
        ),
        (
            AgentSpec::new("worker"),
            vec![ScriptedResponse::tool_call("nothing", json!({})).with_usage(250, 50)],
        ),
    ])
    .build()
    .unwrap();
    let result = rt
        .run_to_completion(RunRequest::new("b", vec![Message::user("go")]).with_agent_id("lead"))
        .await
        .unwrap();
    let (json, _) = tool_result(&rt, "b", 0).await;
    assert_eq!(json["status"], "token_budget", "{json}");
    // The child stopped before an inference that would not fit: the tree's
    // total stays within the root's budget.
    assert!(result.usage.total() <= 1000, "{:?}", result.usage);
    let child_usage = result.report.children[0].usage.total();
    assert!(
        child_usage >= 600,
        "the child spent what fit: {child_usage}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_agent_calls_of_one_round_run_at_once() {
    let lead = AgentSpec::new("lead")
        .with_subagent(SubagentSpec::new("a"))
        .with_subagent(SubagentSpec::new("b"));
    let rt = runtime(vec![
        (
            lead,
            vec![
                ScriptedResponse::tool_call("a", task("x")).with_tool_call("b", task("y")),
                ScriptedResponse::text("both"),
            ],
        ),
        (AgentSpec::new("a"), vec![slow("a a a a a a")]),
        (AgentSpec::new("b"), vec![slow("b b b b b b")]),
    ])
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    rt.run(
        RunRequest::new("c", vec![Message::user("go")]).with_agent_id("lead"),
        sink.clone(),
    )
    .await
    .unwrap();
    // Both children started before either finished.
    let events = sink.events();
    let first_child_end = events
        .iter()
        .position(|e| matches!(e, AgentEvent::SubagentFinished { .. }))
        .unwrap();
    let starts = events[..first_child_end]
        .iter()
        .filter(|e| matches!(e, AgentEvent::SubagentStarted { .. }))
        .count();
    assert_eq!(starts, 2);
}

#[tokio::test]
async fn nested_sub_agents_report_up_the_tree_and_a_cycle_is_refused_at_build() {
    let rt = runtime(vec![
        (
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            vec![
                ScriptedResponse::tool_call("b", task("ask c")),
                ScriptedResponse::text("a done"),
            ],
        ),
        (
            AgentSpec::new("b").with_subagent(SubagentSpec::new("c")),
            vec![
                ScriptedResponse::tool_call("c", task("answer")).with_usage(1, 1),
                ScriptedResponse::text("b done").with_usage(1, 1),
            ],
        ),
        (
            AgentSpec::new("c"),
            vec![ScriptedResponse::text("c done").with_usage(5, 5)],
        ),
    ])
    .build()
    .unwrap();
    let result = rt
        .run_to_completion(RunRequest::new("n", vec![Message::user("go")]).with_agent_id("a"))
        .await
        .unwrap();
    assert_eq!(result.response, "a done");
    let (json, _) = tool_result(&rt, "n", 0).await;
    assert_eq!(json["response"], "b done");
    assert_eq!(json["usage"]["input_tokens"], 1 + 1 + 5);

    let cycle = runtime(vec![
        (
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            vec![],
        ),
        (
            AgentSpec::new("b").with_subagent(SubagentSpec::new("a")),
            vec![],
        ),
    ])
    .build()
    .unwrap_err();
    assert!(cycle.to_string().contains("a → b → a"), "{cycle}");
    let unknown = runtime(vec![(
        AgentSpec::new("a").with_subagent(SubagentSpec::new("ghost")),
        vec![],
    )])
    .build()
    .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains("names unknown agent \"ghost\"; known agents: a"),
        "{unknown}"
    );
}

#[tokio::test]
async fn a_child_s_deadline_is_its_own_and_capped_by_what_the_parent_has_left() {
    let words = "word ".repeat(200);
    let lead = AgentSpec::new("lead")
        .with_subagent(SubagentSpec::new("slow").with_timeout_seconds(1))
        .with_subagent(SubagentSpec::new("counter").with_tool("count"));
    let rt = runtime(vec![
        (
            lead.with_max_rounds(3),
            vec![
                ScriptedResponse::tool_call("slow", task("talk")),
                ScriptedResponse::tool_call("count", task("loop")),
                ScriptedResponse::text("done"),
            ],
        ),
        (AgentSpec::new("slow"), vec![slow(&words)]),
        // It would loop for its own 16 rounds: the lead has 1 left when
        // it calls it (3 rounds, 2 made).
        (
            AgentSpec::new("counter"),
            vec![ScriptedResponse::tool_call("nothing", json!({}))],
        ),
    ])
    .build()
    .unwrap();
    let result = rt
        .run_to_completion(RunRequest::new("d", vec![Message::user("go")]).with_agent_id("lead"))
        .await
        .unwrap();
    let (timed_out, _) = tool_result(&rt, "d", 0).await;
    assert_eq!(timed_out["status"], "timeout", "{timed_out}");
    assert!(timed_out["response"].as_str().unwrap().starts_with("word"));
    let (counted, _) = tool_result(&rt, "d", 1).await;
    assert_eq!(counted["status"], "max_rounds", "{counted}");
    assert_eq!(counted["rounds"], 1, "capped by the lead's last round");
    // Only the lead's own limit ends the lead (its third round).
    assert_eq!(result.termination.stop_code(), Some("max_rounds"));
    assert_eq!(result.response, "done");
}

/// A lead whose one sub-agent streams slowly, on `thread`, with `sink`.
fn streaming_tree(lead: AgentSpec) -> AgentRuntime {
    let words = "one two three four five ".repeat(40);
    runtime(vec![
        (
            lead.with_subagent(SubagentSpec::new("leaf")),
            vec![
                ScriptedResponse::tool_call("leaf", task("talk")),
                ScriptedResponse::text("after"),
            ],
        ),
        (AgentSpec::new("leaf"), vec![slow(&words)]),
    ])
    .build()
    .unwrap()
}

/// Runs `lead` on `thread` with `sink`, on a task of its own.
fn spawn_lead(
    rt: &AgentRuntime,
    thread: &str,
    sink: &Arc<CollectingSink>,
) -> tokio::task::JoinHandle<Result<AgentRunResult, RuntimeError>> {
    let (rt, sink) = (rt.clone(), sink.clone());
    let request = RunRequest::new(thread, vec![Message::user("go")]).with_agent_id("lead");
    tokio::spawn(async move { rt.run(request, sink).await })
}

/// Waits until a child of the tree streams.
async fn until_a_child_streams(sink: &CollectingSink) {
    while !sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::TextDelta { run_id, .. } if run_id.contains('.')))
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_input_interrupting_the_root_ends_its_tree_before_the_next_run_starts() {
    let rt = streaming_tree(AgentSpec::new("lead"));
    let sink = Arc::new(CollectingSink::new());
    let first = rt
        .mailbox()
        .submit(
            RunRequest::new("m", vec![Message::user("go")])
                .with_agent_id("lead")
                .with_event_sink(sink.clone()),
        )
        .await
        .unwrap();
    until_a_child_streams(&sink).await;
    let second = rt
        .mailbox()
        .submit(
            RunRequest::new("m", vec![Message::user("stop that")])
                .with_agent_id("lead")
                .with_event_sink(sink.clone()),
        )
        .await
        .unwrap();
    let second_id = second.run_id().to_owned();
    let first = first.wait().await.unwrap();
    second.wait().await.unwrap();
    assert_eq!(first.termination, TerminationReason::Cancelled);
    assert_eq!(first.report.children[0].code, "cancelled");
    // The child's run_finished came before the second run's run_started.
    let events = sink.events();
    let child_end = events
        .iter()
        .position(|e| matches!(e, AgentEvent::RunFinished { run_id, .. } if run_id.contains('.')))
        .unwrap();
    let second_start = events
        .iter()
        .position(|e| matches!(e, AgentEvent::RunStarted { run_id, .. } if *run_id == second_id))
        .unwrap();
    assert!(child_end < second_start, "{events:#?}");
}

#[tokio::test]
async fn the_root_s_deadline_ends_its_tree_and_the_root_stops_with_timeout() {
    let rt = streaming_tree(
        AgentSpec::new("lead").with_stop_condition(StopConditionSpec::Timeout { seconds: 1 }),
    );
    let result = rt
        .run_to_completion(RunRequest::new("dl", vec![Message::user("go")]).with_agent_id("lead"))
        .await
        .unwrap();
    assert_eq!(
        result.termination.stop_code(),
        Some("timeout"),
        "{result:?}"
    );
    let child = &result.report.children[0];
    assert!(
        ["cancelled", "timeout"].contains(&child.code.as_str()),
        "the child ended with the root's deadline: {child:?}"
    );
    assert!(!rt.is_thread_active(&format!("dl:{}", child.run_id)));
}

#[tokio::test]
async fn deleting_the_root_s_thread_ends_its_tree() {
    let rt = streaming_tree(AgentSpec::new("lead"));
    let sink = Arc::new(CollectingSink::new());
    let run = spawn_lead(&rt, "del", &sink);
    until_a_child_streams(&sink).await;
    rt.delete_thread("del").await.unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    assert_eq!(result.report.children[0].code, "cancelled");
}
