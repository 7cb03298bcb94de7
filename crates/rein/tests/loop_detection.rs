//! Loop detectors through full runs: tool-call loops, content chanting while
//! streaming, stuck responses, the same call failing again and again,
//! per-cycle thresholds, and nudging before stopping.

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
use rein::contract::lifecycle::OnDetect;
use rein::prelude::*;
use serde_json::json;

fn tool_loop(threshold: usize, on_detect: OnDetect) -> StopConditionSpec {
    StopConditionSpec::ToolCallLoop {
        threshold,
        max_cycle: 5,
        on_detect,
    }
}

/// A model that plays `calls` in order, then answers "done".
fn calling(calls: Vec<(&'static str, serde_json::Value)>) -> ScriptedExecutor {
    let mut script: Vec<ScriptedResponse> = calls
        .into_iter()
        .map(|(n, a)| ScriptedResponse::tool_call(n, a))
        .collect();
    script.push(ScriptedResponse::text("done"));
    ScriptedExecutor::new(script)
}

fn runtime(model: ScriptedExecutor, spec: AgentSpec) -> AgentRuntime {
    builder_with(model, spec.with_max_rounds(0))
        .with_tool("search", Arc::new(Echo("search")))
        .with_tool("open", Arc::new(Echo("open")))
        .build()
        .unwrap()
}

#[tokio::test]
async fn five_identical_calls_stop_the_run_and_four_do_not() {
    let five = calling(vec![("search", json!({"q": "rust", "page": 1})); 5]);
    let r = runtime(
        five,
        spec().with_stop_condition(tool_loop(5, OnDetect::Stop)),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination.stop_code(), Some("tool_call_loop"));
    assert_eq!(r.steps, 5);

    let four = calling(vec![("search", json!({"q": "rust", "page": 1})); 4]);
    let r = runtime(
        four,
        spec().with_stop_condition(tool_loop(5, OnDetect::Stop)),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn an_a_b_cycle_repeated_five_times_stops_the_run() {
    let mut calls = Vec::new();
    for _ in 0..5 {
        calls.push(("search", json!({"q": "x"})));
        calls.push(("open", json!({"url": "u"})));
    }
    let r = runtime(
        calling(calls),
        spec().with_stop_condition(tool_loop(5, OnDetect::Stop)),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "tool_call_loop",
            "the tool call cycle [search → open] repeated 5 times with identical arguments and results"
        )
    );
    assert_eq!(r.steps, 10);
}

#[tokio::test]
async fn batch_work_and_argument_key_order() {
    // Fifty different files: legitimate batch work.
    let calls: Vec<_> = (0..50).map(|i| ("search", json!({ "file": i }))).collect();
    let r = runtime(
        calling(calls),
        spec().with_stop_condition(tool_loop(5, OnDetect::Stop)),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    // The same arguments with their keys in another order are the same call
    // (the tool answers the same whatever the order).
    let calls = vec![
        ("status", json!({"a": 1, "b": 2})),
        ("status", json!({"b": 2, "a": 1})),
        ("status", json!({"a": 1, "b": 2})),
    ];
    let r = builder_with(
        calling(calls),
        spec().with_stop_condition(tool_loop(3, OnDetect::Stop)),
    )
    .with_tool("status", Arc::new(Fixed))
    .build()
    .unwrap()
    .run_to_completion(user("t2", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination.stop_code(), Some("tool_call_loop"));
}

/// A tool that always answers the same.
struct Fixed;

#[async_trait::async_trait]
impl Tool for Fixed {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("status", "a fixed status")
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("running"))
    }
}

/// A status tool whose answer changes on every call.
struct Status(Mutex<u32>);

#[async_trait::async_trait]
impl Tool for Status {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("status", "job status")
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let mut n = self.0.lock().unwrap();
        *n += 10;
        Ok(ToolOutput::text(format!("{}% complete", *n)))
    }
}

#[tokio::test]
async fn polling_a_status_that_changes_is_not_a_loop() {
    let r = builder_with(
        calling(vec![("status", json!({"job": 7})); 9]),
        spec().with_stop_condition(tool_loop(5, OnDetect::Stop)),
    )
    .with_tool("status", Arc::new(Status(Mutex::new(0))))
    .build()
    .unwrap()
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn nudge_then_stop_nudges_into_the_next_request_and_stops_when_the_call_is_repeated_at_once()
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        log.lock()
            .unwrap()
            .push(req.messages.last().unwrap().clone());
        ScriptedResponse::tool_call("search", json!({"q": "same"}))
    });
    let sink = Arc::new(CollectingSink::new());
    let r = runtime(
        model,
        spec().with_stop_condition(tool_loop(3, OnDetect::NudgeThenStop)),
    )
    .run(user("t", "go"), sink.clone())
    .await
    .unwrap();
    // 3 calls → nudge; the very next call repeats it: the nudge failed → stop.
    assert_eq!(r.steps, 4);
    assert_eq!(r.termination.stop_code(), Some("tool_call_loop"));
    assert!(
        r.termination.to_string().contains("right after a nudge"),
        "{}",
        r.termination
    );
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[3].role,
        Role::User,
        "the fourth request ends with the nudge"
    );
    assert!(
        seen[3]
            .content
            .starts_with("You appear to be repeating the same tool calls (search)"),
        "{}",
        seen[3].content
    );
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Nudge { text, .. } if *text == seen[3].content))
    );
}

#[tokio::test]
async fn after_a_nudge_a_different_call_starts_a_fresh_streak() {
    let model = ScriptedExecutor::from_fn(|req| {
        // search ×3 (→ nudge), then fetch once, then search ×2: no new
        // streak of 3, so the run ends on its own.
        let calls = req.messages.iter().filter(|m| m.role == Role::Tool).count();
        match calls {
            3 => ScriptedResponse::tool_call("fetch", json!({"url": "x"})),
            0..=5 => ScriptedResponse::tool_call("search", json!({"q": "same"})),
            _ => ScriptedResponse::text("done"),
        }
    });
    let r = runtime(
        model,
        spec().with_stop_condition(tool_loop(3, OnDetect::NudgeThenStop)),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::NaturalEnd,
        "{}",
        r.termination
    );
}

const SENTENCE: &str = "I will now check the weather again to be sure. ";

#[tokio::test]
async fn chanting_in_a_streamed_answer_cuts_the_stream_and_keeps_the_partial_text() {
    let model = Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text(
        SENTENCE.repeat(30),
    )]));
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m").with_stop_condition(
            StopConditionSpec::ContentChanting {
                chunk_chars: 50,
                threshold: 10,
                on_detect: OnDetect::Stop,
            },
        ))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model.clone())
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("content_chanting"));
    let served = model.served_chunks();
    let words = SENTENCE.repeat(30).split_whitespace().count() as u64;
    assert!(
        served < words / 2,
        "the executor was drained: {served} of {words} chunks"
    );
    assert!(!r.response.is_empty());
    let history = runtime.thread_messages("t").await;
    assert_eq!(history[1].content, r.response);
    assert_history_valid(&history);
}

#[tokio::test]
async fn a_hundred_chunk_chanting_response_is_cut_off_early() {
    let words: Vec<&str> = "again and again the same line again and again the"
        .split(' ')
        .collect();
    let text: String = (0..100)
        .map(|i| format!("{} ", words[i % words.len()]))
        .collect();
    let model = Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text(text)]));
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m").with_stop_condition(
            StopConditionSpec::ContentChanting {
                chunk_chars: 20,
                threshold: 5,
                on_detect: OnDetect::Stop,
            },
        ))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model.clone())
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("content_chanting"));
    assert!(
        model.served_chunks() < 50,
        "{} of 100 chunks consumed",
        model.served_chunks()
    );
}

#[tokio::test]
async fn repeated_lines_inside_a_code_fence_or_table_do_not_stop_the_run() {
    let code = format!(
        "Here:\n```\n{}```\n",
        "let x = compute_the_same_value_again(42);\n".repeat(30)
    );
    let table = format!(
        "| k | v |\n|---|---|\n{}",
        "| the same key here | the same value |\n".repeat(30)
    );
    for text in [code, table] {
        let model = ScriptedExecutor::new(vec![ScriptedResponse::text(text)]);
        let r = builder_with(
            model,
            spec().with_stop_condition(StopConditionSpec::ContentChanting {
                chunk_chars: 30,
                threshold: 5,
                on_detect: OnDetect::Stop,
            }),
        )
        .build()
        .unwrap()
        .run_to_completion(user("t", "go"))
        .await
        .unwrap();
        assert_eq!(r.termination, TerminationReason::NaturalEnd);
    }
}

#[tokio::test]
async fn chanting_with_nudge_then_stop_nudges_once_then_stops() {
    let model =
        ScriptedExecutor::new(vec![ScriptedResponse::text(SENTENCE.repeat(30))]).repeat_last();
    let sink = Arc::new(CollectingSink::new());
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::ContentChanting {
            chunk_chars: 50,
            threshold: 10,
            on_detect: OnDetect::NudgeThenStop,
        }),
    )
    .build()
    .unwrap();
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(r.steps, 2);
    assert!(
        matches!(&r.termination, TerminationReason::Stopped(s) if s.code == "content_chanting" && s.detail.ends_with("(again, after a nudge)"))
    );
    let history = runtime.thread_messages("t").await;
    let roles: Vec<Role> = history.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::User, Role::Assistant]
    );
    assert!(history[2].content.contains("repeating the same text"));
}

#[tokio::test]
async fn a_stuck_run_is_nudged_once_then_stopped() {
    // The arguments vary, so only the text repeats.
    let counter = Mutex::new(0);
    let model = ScriptedExecutor::from_fn(move |_req| {
        let mut n = counter.lock().unwrap();
        *n += 1;
        ScriptedResponse::text("I cannot find it.").with_tool_call("search", json!({ "i": *n }))
    });
    let sink = Arc::new(CollectingSink::new());
    let r = runtime(
        model,
        spec().with_stop_condition(StopConditionSpec::Stuck { duplicates: 2 }),
    )
    .run(user("t", "go"), sink.clone())
    .await
    .unwrap();
    // Round 3 repeats two earlier texts → nudge; round 4 repeats again → stop.
    assert_eq!(r.steps, 4);
    assert_eq!(r.termination.stop_code(), Some("stuck"));
    let nudges: Vec<String> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Nudge { text, .. } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(nudges.len(), 1);
    assert!(nudges[0].starts_with("Observed duplicate responses"));
}

#[tokio::test]
async fn a_huge_threshold_set_in_code_neither_panics_nor_loses_the_round() {
    let model = ScriptedExecutor::from_fn(|req| {
        if req.messages.iter().filter(|m| m.role == Role::Tool).count() < 3 {
            ScriptedResponse::tool_call("search", json!({"q": "same"}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let r = runtime(
        model,
        spec().with_stop_condition(StopConditionSpec::ToolCallLoop {
            threshold: usize::MAX,
            max_cycle: usize::MAX,
            on_detect: OnDetect::Stop,
        }),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::NaturalEnd,
        "{}",
        r.termination
    );
    assert_eq!(r.steps, 4);
}

/// A `fetch` tool whose errors are all different (a counter and a
/// timestamp), succeeding only on the calls numbered in `succeed_on`.
struct Flaky {
    calls: Mutex<u32>,
    succeed_on: &'static [u32],
}

impl Flaky {
    fn new(succeed_on: &'static [u32]) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(0),
            succeed_on,
        })
    }
}

#[async_trait::async_trait]
impl Tool for Flaky {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("fetch", "fetches, mostly failing")
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let n = {
            let mut n = self.calls.lock().unwrap();
            *n += 1;
            *n
        };
        if self.succeed_on.contains(&n) {
            return Ok(ToolOutput::text("fetched"));
        }
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Err(ToolError::new(format!(
            "upstream timeout (request {n}, at {at} ns, log /tmp/fetch-{n}.log)"
        )))
    }
}

/// A model that calls `fetch` with the same arguments `n` times, then
/// answers "done".
fn fetching(n: usize) -> ScriptedExecutor {
    ScriptedExecutor::from_fn(move |req| {
        if req.messages.iter().filter(|m| m.role == Role::Tool).count() < n {
            ScriptedResponse::tool_call("fetch", json!({"url": "https://x", "retries": 0}))
        } else {
            ScriptedResponse::text("done")
        }
    })
}

fn error_loop(threshold: usize, on_detect: OnDetect) -> StopConditionSpec {
    StopConditionSpec::ToolErrorLoop {
        threshold,
        on_detect,
    }
}

fn fetch_runtime(model: ScriptedExecutor, spec: AgentSpec, tool: Arc<Flaky>) -> AgentRuntime {
    builder_with(model, spec.with_max_rounds(0))
        .with_tool("fetch", tool)
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_same_call_failing_three_times_with_different_errors_stops_with_tool_error_loop() {
    // tool_call_loop keys calls by their result too, so unique errors never
    // look like a loop to it; tool_error_loop ignores the error text.
    let r = fetch_runtime(
        fetching(20),
        spec()
            .with_stop_condition(tool_loop(3, OnDetect::Stop))
            .with_stop_condition(error_loop(3, OnDetect::Stop)),
        Flaky::new(&[]),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.steps, 3);
    let TerminationReason::Stopped(reason) = &r.termination else {
        panic!("{}", r.termination)
    };
    assert_eq!(reason.code, "tool_error_loop");
    assert!(
        reason
            .detail
            .starts_with("the tool call fetch failed 3 times in a row with the same arguments (last error: error: upstream timeout (request 3, at "),
        "{}",
        reason.detail
    );
}

#[tokio::test]
async fn a_success_of_the_same_call_in_between_resets_the_error_streak() {
    // fail, fail, succeed, fail, fail, fail: the streak starts again after
    // the success, so the sixth call stops the run.
    let r = fetch_runtime(
        fetching(20),
        spec().with_stop_condition(error_loop(3, OnDetect::Stop)),
        Flaky::new(&[3]),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination.stop_code(), Some("tool_error_loop"));
    assert_eq!(r.steps, 6);
    // Two failures, a success, two failures: no streak of three.
    let r = fetch_runtime(
        fetching(5),
        spec().with_stop_condition(error_loop(3, OnDetect::Stop)),
        Flaky::new(&[3]),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn a_tool_error_loop_with_nudge_then_stop_stops_when_the_call_fails_again_right_after_the_nudge()
 {
    let sink = Arc::new(CollectingSink::new());
    let r = fetch_runtime(
        fetching(20),
        spec().with_stop_condition(error_loop(3, OnDetect::NudgeThenStop)),
        Flaky::new(&[]),
    )
    .run(user("t", "go"), sink.clone())
    .await
    .unwrap();
    assert_eq!(r.steps, 4);
    assert_eq!(r.termination.stop_code(), Some("tool_error_loop"));
    assert!(
        r.termination.to_string().contains("right after a nudge"),
        "{}",
        r.termination
    );
    let nudges: Vec<String> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Nudge { text, .. } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(nudges.len(), 1);
    assert!(
        nudges[0].starts_with("The tool call fetch has failed 3 times in a row"),
        "{}",
        nudges[0]
    );
}

#[tokio::test]
async fn when_two_tool_detectors_fire_on_the_same_call_the_first_listed_wins() {
    // Identical errors: both tool_call_loop and tool_error_loop fire on the
    // third call; the stop_conditions order decides the code.
    for (first, second, code) in [
        (
            tool_loop(3, OnDetect::Stop),
            error_loop(3, OnDetect::Stop),
            "tool_call_loop",
        ),
        (
            error_loop(3, OnDetect::Stop),
            tool_loop(3, OnDetect::Stop),
            "tool_error_loop",
        ),
    ] {
        let r = builder_with(
            fetching(20),
            spec()
                .with_max_rounds(0)
                .with_stop_condition(first)
                .with_stop_condition(second),
        )
        .with_tool("fetch", Arc::new(FailingFetch))
        .build()
        .unwrap()
        .run_to_completion(user("t", "go"))
        .await
        .unwrap();
        assert_eq!(r.steps, 3);
        assert_eq!(r.termination.stop_code(), Some(code));
    }
}

/// A `fetch` that always fails with the same text.
struct FailingFetch;

#[async_trait::async_trait]
impl Tool for FailingFetch {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("fetch", "always fails")
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Err(ToolError::new("disk on fire"))
    }
}

fn cycle(cycle: usize, threshold: usize) -> StopConditionSpec {
    StopConditionSpec::ToolCallCycle {
        cycle,
        threshold,
        on_detect: OnDetect::Stop,
    }
}

/// "4 identical calls, or an A/B pair repeated 3 times".
fn four_identical_or_a_b_three_times() -> AgentSpec {
    spec()
        .with_stop_condition(cycle(1, 4))
        .with_stop_condition(cycle(2, 3))
}

#[tokio::test]
async fn per_cycle_thresholds_do_not_fire_on_three_identical_calls() {
    let three = || calling(vec![("search", json!({"q": "x"})); 3]);
    let r = runtime(three(), four_identical_or_a_b_three_times())
        .run_to_completion(user("t", "go"))
        .await
        .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    // One tool_call_loop threshold for every cycle length cannot say it:
    // threshold 3 fires on three identical calls.
    let r = runtime(
        three(),
        spec().with_stop_condition(StopConditionSpec::ToolCallLoop {
            threshold: 3,
            max_cycle: 2,
            on_detect: OnDetect::Stop,
        }),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(r.termination.stop_code(), Some("tool_call_loop"));
    assert_eq!(r.steps, 3);
}

#[tokio::test]
async fn per_cycle_thresholds_stop_four_identical_calls_and_an_a_b_pair_repeated_three_times() {
    let r = runtime(
        calling(vec![("search", json!({"q": "x"})); 4]),
        four_identical_or_a_b_three_times(),
    )
    .run_to_completion(user("t", "go"))
    .await
    .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "tool_call_cycle",
            "the tool call cycle [search] repeated 4 times with identical arguments and results"
        )
    );
    assert_eq!(r.steps, 4);

    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push(("search", json!({"q": "x"})));
        calls.push(("open", json!({"url": "u"})));
    }
    let r = runtime(calling(calls), four_identical_or_a_b_three_times())
        .run_to_completion(user("t", "go"))
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped(
            "tool_call_cycle",
            "the tool call cycle [search → open] repeated 3 times with identical arguments and results"
        )
    );
    assert_eq!(r.steps, 6);
}
