//! Run control through full runs: escalation ladders (warn, nudge, deny,
//! stop), per-tool loop rules, and the `error_rate` and `no_progress`
//! conditions, configured in code and in YAML.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use rein::contract::event::AgentEvent;
use rein::escalation::{EscalationAction, EscalationStep, Ladder, ToolLoopRule};
use rein::prelude::*;
use serde_json::{Value, json};

/// Returns the same text every time, counting its executions.
struct Same(&'static str, Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Tool for Same {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.0, "always the same answer")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text("nothing new"))
    }
}

fn ladder(steps: &[(EscalationAction, u32)]) -> Ladder {
    Ladder::new(
        steps
            .iter()
            .map(|(a, n)| EscalationStep::new(*a, *n))
            .collect(),
    )
    .unwrap()
}

/// A model that calls `name` with `args(i)` for call `i`, `calls` times,
/// then answers "done".
fn calling(name: &'static str, calls: usize, args: impl Fn(usize) -> Value) -> ScriptedExecutor {
    let mut script: Vec<ScriptedResponse> = (0..calls)
        .map(|i| ScriptedResponse::tool_call(name, args(i)))
        .collect();
    script.push(ScriptedResponse::text("done"));
    ScriptedExecutor::new(script)
}

async fn run(
    model: ScriptedExecutor,
    spec: AgentSpec,
    tools: &[(&'static str, Arc<dyn Tool>)],
) -> (AgentRunResult, Vec<AgentEvent>, Vec<Message>) {
    let mut builder = builder_with(model, spec.with_max_rounds(0));
    for (name, tool) in tools {
        builder = builder.with_tool(*name, tool.clone());
    }
    let runtime = builder.build().unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    (result, sink.events(), history)
}

fn detections(events: &[AgentEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Detected { code, action, .. } => Some((code.clone(), action.clone())),
            _ => None,
        })
        .collect()
}

fn loop_of(threshold: usize) -> StopConditionSpec {
    StopConditionSpec::ToolCallLoop {
        threshold,
        max_cycle: 1,
        on_detect: rein::contract::lifecycle::OnDetect::Stop,
    }
}

#[tokio::test]
async fn a_loop_climbs_warn_nudge_deny_then_stop_and_denied_calls_never_run() {
    use EscalationAction::{Deny, Nudge, Stop, Warn};
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = spec().with_stop_condition(loop_of(2)).with_escalation(
        "tool_call_loop",
        ladder(&[(Warn, 1), (Nudge, 1), (Deny, 2), (Stop, 1)]),
    );
    let model = calling("search", 20, |_| json!({"q": "rust"}));
    let (result, events, history) = run(
        model,
        spec,
        &[("search", Arc::new(Same("search", runs.clone())))],
    )
    .await;
    // Calls 1-2: a loop, warned. 3-4: nudged. 5 (right after the nudge):
    // takes the first `deny`, after it ran. 6: refused by that deny (the
    // model gets a denied result). 7: refused by the second `deny`. 8: stop.
    assert_eq!(result.termination.stop_code(), Some("tool_call_loop"));
    assert_eq!(runs.load(Ordering::SeqCst), 5, "the denied calls never ran");
    assert_eq!(
        detections(&events),
        [
            ("tool_call_loop".to_owned(), "warn".to_owned()),
            ("tool_call_loop".to_owned(), "deny".to_owned()),
            ("tool_call_loop".to_owned(), "deny".to_owned()),
            ("tool_call_loop".to_owned(), "deny".to_owned()),
        ]
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, AgentEvent::Nudge { .. }))
            .count(),
        1
    );
    let denied: Vec<&Message> = history
        .iter()
        .filter(|m| {
            m.role == Role::Tool
                && m.content
                    .starts_with("not run: Rein's `tool_call_loop` detector denied this call")
        })
        .collect();
    assert_eq!(
        denied.len(),
        2,
        "{{ deny: 2 }} refuses two repetitions: {history:#?}"
    );
}

#[tokio::test]
async fn a_ladder_of_warnings_only_never_stops_the_run() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = spec()
        .with_stop_condition(loop_of(2))
        .with_escalation("tool_call_loop", ladder(&[(EscalationAction::Warn, 1)]));
    let model = calling("search", 6, |_| json!({"q": "rust"}));
    let (result, events, _) = run(
        model,
        spec,
        &[("search", Arc::new(Same("search", runs.clone())))],
    )
    .await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_eq!(detections(&events).len(), 3, "a warning per loop of 2");
}

#[tokio::test]
async fn a_tool_with_side_effects_loops_sooner_and_a_poller_never_loops() {
    let writes = Arc::new(AtomicUsize::new(0));
    let polls = Arc::new(AtomicUsize::new(0));
    let rules = |s: AgentSpec| {
        s.with_stop_condition(loop_of(5))
            .with_tool_rule("write_file", ToolLoopRule::threshold(2))
            .with_tool_rule("poll_status", ToolLoopRule::exempt())
    };
    let tools: [(&'static str, Arc<dyn Tool>); 2] = [
        ("write_file", Arc::new(Same("write_file", writes.clone()))),
        ("poll_status", Arc::new(Same("poll_status", polls.clone()))),
    ];
    let (result, _, _) = run(
        calling("write_file", 5, |_| json!({"path": "a.txt"})),
        rules(spec()),
        &tools,
    )
    .await;
    assert_eq!(result.termination.stop_code(), Some("tool_call_loop"));
    assert_eq!(writes.load(Ordering::SeqCst), 2);
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert!(r.detail.contains("repeated 2 times"), "{}", r.detail)
        }
        other => panic!("{other:?}"),
    }
    let (result, _, _) = run(
        calling("poll_status", 12, |_| json!({})),
        rules(spec()),
        &tools,
    )
    .await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(polls.load(Ordering::SeqCst), 12);
}

#[tokio::test]
async fn errors_piling_up_within_the_window_stop_the_run() {
    // Each call fails with other arguments: no tool_error_loop, but three
    // errors within a minute.
    let spec = spec()
        .with_stop_condition(StopConditionSpec::ToolErrorLoop {
            threshold: 3,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_stop_condition(StopConditionSpec::ErrorRate {
            errors: 3,
            within_seconds: 60,
        });
    let model = calling("failing", 10, |i| json!({"attempt": i}));
    let (result, _, _) = run(model, spec, &[("failing", Arc::new(Failing))]).await;
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "error_rate");
            assert!(r.detail.starts_with("3 errors"), "{}", r.detail);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(result.steps, 3);
}

#[tokio::test]
async fn rounds_that_bring_nothing_new_are_no_progress() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = spec()
        .with_stop_condition(StopConditionSpec::NoProgress { rounds: 3 })
        .with_escalation(
            "no_progress",
            ladder(&[(EscalationAction::Nudge, 1), (EscalationAction::Stop, 1)]),
        );
    // Different queries, the same answer every time.
    let model = calling("search", 20, |i| json!({"q": i}));
    let (result, events, _) = run(
        model,
        spec,
        &[("search", Arc::new(Same("search", runs.clone())))],
    )
    .await;
    // Round 1 is new; 2-4 are stale (nudge); 5-7 are stale again (stop).
    assert_eq!(result.termination.stop_code(), Some("no_progress"));
    assert_eq!(runs.load(Ordering::SeqCst), 7);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::Nudge { text, .. } if text.contains("nothing you had not already seen")))
    );
}

#[test]
fn ladders_rules_and_the_new_conditions_load_from_yaml_with_positions() {
    let spec = rein::config::load_agent_spec_yaml(
        "id: a\nmodel_id: m\nstop_conditions:\n  - { type: tool_call_loop, threshold: 3 }\n  - { type: error_rate, errors: 3, within_seconds: 60 }\n  - { type: no_progress, rounds: 10 }\nescalation:\n  tool_call_loop: [warn, nudge, { deny: 2 }, stop]\n  error_rate: [{ warn: 2 }, stop]\ntool_rules:\n  write_file: { threshold: 2 }\n  poll_status: { exempt: true }\n",
    )
    .unwrap();
    assert_eq!(
        spec.stop_conditions[1],
        StopConditionSpec::ErrorRate {
            errors: 3,
            within_seconds: 60
        }
    );
    assert_eq!(
        spec.stop_conditions[2],
        StopConditionSpec::NoProgress { rounds: 10 }
    );
    assert_eq!(
        spec.escalation["tool_call_loop"].to_string(),
        "[warn, nudge, { deny: 2 }, stop]"
    );
    assert_eq!(spec.tool_rules["poll_status"], ToolLoopRule::exempt());
    let error = |yaml: &str| {
        rein::config::load_agent_spec_yaml(yaml)
            .unwrap_err()
            .to_string()
    };
    let e = error("id: a\nescalation:\n  tool_call_lop: [stop]\n");
    assert!(e.starts_with("line 3, column"), "{e}");
    assert!(e.contains("unknown detector \"tool_call_lop\""), "{e}");
    let stuck = "id: a\nstop_conditions:\n  - { type: stuck }\nescalation:\n";
    let e = error(&format!("{stuck}  stuck: [deny, stop]\n"));
    assert!(e.starts_with("line 5, column"), "{e}");
    assert!(e.contains("`stuck` does not watch tool calls"), "{e}");
    let e = error(&format!("{stuck}  stuck: [stop, nudge]\n"));
    assert!(e.starts_with("line 5, column"), "{e}");
    assert!(e.contains("can never be reached"), "{e}");
    let e = error("id: a\nstop_conditions:\n  - { type: error_rate, errors: 3 }\n");
    assert!(e.starts_with("line 3, column"), "{e}");
    assert!(e.contains("missing field `within_seconds`"), "{e}");
    let e = error("id: a\nstop_conditions:\n  - { type: awaiting_user, auto_nudges: 101 }\n");
    assert!(e.starts_with("line 3, column"), "{e}");
    assert!(e.contains("auto_nudges must be at most 100"), "{e}");
    let loops = "id: a\nstop_conditions:\n  - { type: tool_call_loop }\n";
    let e = error(&format!(
        "{loops}tool_rules:\n  write_file: {{ threshold: 1 }}\n"
    ));
    assert!(e.starts_with("line 5"), "{e}");
    assert!(e.contains("out of range"), "{e}");
    // What `build()` also refuses is refused at loading, where it stands.
    let e =
        error("id: a\nstop_conditions:\n  - { type: stuck }\nescalation:\n  no_progress: [stop]\n");
    assert!(e.starts_with("line 5, column"), "{e}");
    assert!(
        e.contains(
            "a ladder is set for `no_progress`, but no `no_progress` stop condition is listed"
        ),
        "{e}"
    );
    let e = error("id: a\ntool_rules:\n  write_file: { threshold: 2 }\n");
    assert!(e.starts_with("line 3, column"), "{e}");
    assert!(e.contains("neither is listed"), "{e}");
}

#[test]
fn a_ladder_for_a_detector_the_agent_does_not_list_is_a_build_error() {
    let agent = spec().with_escalation("stuck", ladder(&[(EscalationAction::Stop, 1)]));
    let e = builder_with(ScriptedExecutor::new(vec![]), agent)
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("a ladder is set for `stuck`, but no `stuck` stop condition is listed"),
        "{e}"
    );
    let agent = spec().with_tool_rule("write_file", ToolLoopRule::threshold(2));
    let e = builder_with(ScriptedExecutor::new(vec![]), agent)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("tool_rules"), "{e}");
}

#[tokio::test]
async fn failed_inferences_count_toward_error_rate_like_tool_errors() {
    let failing = || {
        ScriptedResponse::error(rein::contract::inference::InferenceError::new(
            rein::contract::inference::InferenceErrorKind::Server,
            "503 from upstream",
        ))
    };
    let model = ScriptedExecutor::new(vec![
        failing(),
        failing(),
        failing(),
        ScriptedResponse::text("recovered"),
    ]);
    let spec = spec().with_stop_condition(StopConditionSpec::ErrorRate {
        errors: 3,
        within_seconds: 60,
    });
    let runtime = builder_with(model, spec)
        .with_retry_backoff(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(2),
        )
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "error_rate");
            assert!(r.detail.starts_with("3 errors"), "{}", r.detail);
        }
        other => panic!("expected error_rate, got {other:?}"),
    }
    assert_eq!(result.steps, 3, "the third failed round stops the run");
}

#[tokio::test]
async fn a_cycle_of_two_tools_is_nudged_then_stopped_by_its_ladder() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = spec()
        .with_stop_condition(StopConditionSpec::ToolCallCycle {
            cycle: 2,
            threshold: 2,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_escalation(
            "tool_call_cycle",
            ladder(&[(EscalationAction::Nudge, 1), (EscalationAction::Stop, 1)]),
        );
    let script: Vec<ScriptedResponse> = (0..20)
        .map(|i| ScriptedResponse::tool_call(if i % 2 == 0 { "a" } else { "b" }, json!({})))
        .collect();
    let tools: [(&'static str, Arc<dyn Tool>); 2] = [
        ("a", Arc::new(Same("a", runs.clone()))),
        ("b", Arc::new(Same("b", runs.clone()))),
    ];
    let (result, events, _) = run(ScriptedExecutor::new(script), spec, &tools).await;
    assert_eq!(result.termination.stop_code(), Some("tool_call_cycle"));
    let nudges = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::Nudge { .. }))
        .count();
    assert_eq!(nudges, 1, "the first detection nudges, the next stops");
    assert!(
        runs.load(Ordering::SeqCst) > 4,
        "it went on after the nudge"
    );
}

#[tokio::test]
async fn a_failing_call_repeated_is_denied_by_the_error_loop_ladder() {
    let spec = spec()
        .with_stop_condition(StopConditionSpec::ToolErrorLoop {
            threshold: 2,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_escalation(
            "tool_error_loop",
            ladder(&[(EscalationAction::Deny, 2), (EscalationAction::Stop, 1)]),
        );
    let model = calling("failing", 10, |_| json!({"path": "/etc/shadow"}));
    let (result, events, history) = run(model, spec, &[("failing", Arc::new(Failing))]).await;
    // Calls 1-2 fail: a loop; the first `deny`. 3: refused by it. 4: refused
    // by the second `deny`. 5: stop.
    assert_eq!(result.termination.stop_code(), Some("tool_error_loop"));
    let denied = history
        .iter()
        .filter(|m| {
            m.role == Role::Tool
                && m.content
                    .starts_with("not run: Rein's `tool_error_loop` detector denied this call")
        })
        .count();
    assert_eq!(denied, 2, "{history:#?}");
    assert_eq!(
        detections(&events),
        [
            ("tool_error_loop".to_owned(), "deny".to_owned()),
            ("tool_error_loop".to_owned(), "deny".to_owned()),
            ("tool_error_loop".to_owned(), "deny".to_owned()),
        ]
    );
}

#[tokio::test]
async fn the_same_answer_again_is_warned_then_stopped_by_the_stuck_ladder() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = spec()
        .with_stop_condition(StopConditionSpec::Stuck { duplicates: 2 })
        .with_escalation(
            "stuck",
            ladder(&[(EscalationAction::Warn, 1), (EscalationAction::Stop, 1)]),
        );
    // The same words every round, with a different search each time.
    let script: Vec<ScriptedResponse> = (0..10)
        .map(|i| {
            ScriptedResponse::text("Let me look that up.").with_tool_call("search", json!({"q": i}))
        })
        .collect();
    let (result, events, _) = run(
        ScriptedExecutor::new(script),
        spec,
        &[("search", Arc::new(Same("search", runs.clone())))],
    )
    .await;
    // Round 3 repeats two earlier answers (warned); round 4 stops.
    assert_eq!(result.termination.stop_code(), Some("stuck"));
    assert_eq!(
        detections(&events),
        [("stuck".to_owned(), "warn".to_owned())]
    );
    assert_eq!(result.steps, 4);
}

#[tokio::test]
async fn chanting_with_a_warning_ladder_is_reported_and_the_answer_stands() {
    let chant = "I will now repeat the plan once more for clarity. ".repeat(40);
    let spec = spec()
        .with_stop_condition(StopConditionSpec::ContentChanting {
            chunk_chars: 50,
            threshold: 10,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_escalation("content_chanting", ladder(&[(EscalationAction::Warn, 1)]));
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text(chant.clone())]);
    let (result, events, _) = run(model, spec, &[]).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let found = detections(&events);
    assert!(!found.is_empty(), "the chanting was reported");
    assert!(
        found
            .iter()
            .all(|(code, action)| code == "content_chanting" && action == "warn"),
        "{found:?}"
    );
    assert_eq!(result.response, chant, "a warning cuts nothing");
}

#[tokio::test]
async fn a_single_deny_step_refuses_the_next_repetition_before_the_ladder_stops() {
    use EscalationAction::{Deny, Nudge, Stop, Warn};
    let runs = Arc::new(AtomicUsize::new(0));
    // The ladder: the repetition that takes `deny` has already run;
    // the model must still receive a denial before `stop`.
    let spec = spec().with_stop_condition(loop_of(2)).with_escalation(
        "tool_call_loop",
        ladder(&[(Warn, 2), (Nudge, 1), (Deny, 1), (Stop, 1)]),
    );
    let model = calling("search", 20, |_| json!({"q": "rust"}));
    let (result, _, history) = run(
        model,
        spec,
        &[("search", Arc::new(Same("search", runs.clone())))],
    )
    .await;
    assert_eq!(result.termination.stop_code(), Some("tool_call_loop"));
    let denied = history
        .iter()
        .filter(|m| {
            m.role == Role::Tool
                && m.content
                    .starts_with("not run: Rein's `tool_call_loop` detector denied this call")
        })
        .count();
    assert_eq!(denied, 1, "the model received one denial: {history:#?}");
}
