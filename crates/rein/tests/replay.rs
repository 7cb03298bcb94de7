//! Recording runs with `JsonlSink` and replaying them against other stop
//! conditions: where each would have fired, with ladders, offline.

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
use rein::escalation::{EscalationAction, EscalationStep, Ladder};
use rein::events::JsonlSink;
use rein::prelude::*;
use rein::replay::{Firing, read_recording, replay};
use serde_json::json;

/// Records one run of a model that searches six times, then asks the user.
async fn recorded() -> String {
    let mut script: Vec<ScriptedResponse> = (0..6)
        .map(|_| ScriptedResponse::tool_call("search", json!({"q": "rust"})))
        .collect();
    script.push(ScriptedResponse::text(
        "I found three crates. Which one do you prefer?",
    ));
    let (text, result) = record(script).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    text
}

/// A runtime of `agent` on `script`, with the `search` tool and retries
/// without waiting.
fn runtime_of(script: Vec<ScriptedResponse>, agent: AgentSpec) -> AgentRuntime {
    builder_with(ScriptedExecutor::new(script), agent)
        .with_tool("search", Arc::new(Echo("search")))
        .with_retry_backoff(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        )
        .build()
        .unwrap()
}

/// Records a run of `script` by an agent without conditions: the
/// recording and the run's result.
async fn record(script: Vec<ScriptedResponse>) -> (String, AgentRunResult) {
    let path = std::env::temp_dir().join(format!(
        "rein-replay-{}-{}.jsonl",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let sink = Arc::new(JsonlSink::create(&path).unwrap());
    let result = runtime_of(script, spec())
        .run(user("t", "find a crate"), sink)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    (text, result)
}

/// What a live run of `script` by `agent` detected, by round, then how it
/// stopped, as replay lists firings.
async fn live_firings(
    script: Vec<ScriptedResponse>,
    agent: AgentSpec,
) -> Vec<(u32, String, String)> {
    use rein::contract::event::AgentEvent;
    let sink = Arc::new(CollectingSink::new());
    let result = runtime_of(script, agent)
        .run(user("t", "find a crate"), sink.clone())
        .await
        .unwrap();
    let mut round = 0;
    let mut live: Vec<(u32, String, String)> = Vec::new();
    for event in sink.events() {
        match event {
            AgentEvent::StepStarted { .. } | AgentEvent::RetryStarted { .. } => round += 1,
            AgentEvent::Detected { code, action, .. } => live.push((round, code, action)),
            _ => {}
        }
    }
    if let Some(stop) = result.termination.stop_code() {
        live.push((result.steps, stop.to_owned(), "stop".to_owned()));
    }
    live
}

/// The firings of the one run replayed from `recording`, up to and with
/// the first stop (what a live run can show).
fn until_first_stop(recording: &str, agent: &AgentSpec) -> Vec<(u32, String, String)> {
    let runs = replay(agent, &read_recording(recording).unwrap());
    assert_eq!(runs.len(), 1);
    let mut firings = Vec::new();
    for f in &runs[0].firings {
        firings.push((f.round, f.code.clone(), f.action.clone()));
        if f.action == "stop" {
            break;
        }
    }
    firings
}

fn codes(firings: &[Firing]) -> Vec<(u32, &str, &str)> {
    firings
        .iter()
        .map(|f| (f.round, f.code.as_str(), f.action.as_str()))
        .collect()
}

#[tokio::test]
async fn a_recorded_run_replays_against_conditions_it_never_had() {
    let recording = read_recording(&recorded().await).unwrap();
    assert!(recording.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    let watch = Ladder::new(vec![EscalationStep::new(EscalationAction::Warn, 1)]).unwrap();
    let agent = spec()
        .with_stop_condition(StopConditionSpec::ToolCallLoop {
            threshold: 2,
            max_cycle: 1,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_stop_condition(StopConditionSpec::AwaitingUser { auto_nudges: 2 })
        .with_stop_condition(StopConditionSpec::MaxRounds { rounds: 5 })
        .with_escalation("tool_call_loop", watch);
    let runs = replay(&agent, &recording);
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run.rounds, 7);
    assert_eq!(run.ended.as_deref(), Some("natural_end"));
    assert_eq!(
        codes(&run.firings),
        [
            (2, "tool_call_loop", "warn"),
            (4, "tool_call_loop", "warn"),
            (5, "max_rounds", "stop"),
            (6, "tool_call_loop", "warn"),
            (7, "awaiting_user", "stop"),
        ]
    );
    // Without conditions, nothing fires.
    assert!(replay(&spec(), &recording)[0].firings.is_empty());
}

#[test]
fn a_line_that_is_not_a_recorded_event_is_named() {
    let e = read_recording("{\"at_ms\": 1, \"event\": {\"type\": \"text_delta\"}}\n").unwrap_err();
    assert!(e.starts_with("line 1: not a recorded event"), "{e}");
}

#[tokio::test]
async fn a_deny_ladder_replays_as_the_live_run_applies_it() {
    use EscalationAction::{Deny, Stop};
    use rein::contract::event::AgentEvent;
    let ladder = Ladder::new(vec![
        EscalationStep::new(Deny, 2),
        EscalationStep::new(Stop, 1),
    ])
    .unwrap();
    let agent = spec()
        .with_stop_condition(StopConditionSpec::ToolCallLoop {
            threshold: 3,
            max_cycle: 1,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
        .with_escalation("tool_call_loop", ladder);

    // Replayed over a run recorded without the ladder...
    let recording = read_recording(&recorded().await).unwrap();
    let replayed = replay(&agent, &recording);
    let firings = codes(&replayed[0].firings);

    // ...and run live with it, on the same script.
    let mut script: Vec<ScriptedResponse> = (0..6)
        .map(|_| ScriptedResponse::tool_call("search", json!({"q": "rust"})))
        .collect();
    script.push(ScriptedResponse::text("done"));
    let runtime = builder_with(ScriptedExecutor::new(script), agent)
        .with_tool("search", Arc::new(Echo("search")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime
        .run(user("t", "find a crate"), sink.clone())
        .await
        .unwrap();
    let mut round = 0;
    let mut live: Vec<(u32, String, String)> = Vec::new();
    for event in sink.events() {
        match event {
            AgentEvent::StepStarted { .. } | AgentEvent::RetryStarted { .. } => round += 1,
            AgentEvent::Detected { code, action, .. } => live.push((round, code, action)),
            _ => {}
        }
    }
    let stop = result.termination.stop_code().unwrap().to_owned();
    live.push((result.steps, stop, "stop".to_owned()));

    let replayed: Vec<(u32, String, String)> = firings
        .iter()
        .map(|(r, c, a)| (*r, (*c).to_owned(), (*a).to_owned()))
        .collect();
    assert_eq!(replayed, live);
    // In both: the detection that takes the first `deny` has run; the next
    // repetition is refused by it, the one after by the second `deny`.
    assert!(
        replayed.iter().filter(|(_, _, a)| a == "deny").count() == 3,
        "{replayed:?}"
    );
}

#[tokio::test]
async fn a_failed_attempt_is_judged_by_error_rate_before_the_guard_in_replay_as_in_a_live_run() {
    // Both fire on the second failed attempt; `consecutive_errors` is
    // listed first, but the loop shows a failed attempt to `error_rate`
    // before its guard evaluates the policies.
    let failing = || {
        ScriptedResponse::error(rein::contract::inference::InferenceError::new(
            rein::contract::inference::InferenceErrorKind::Server,
            "503 from upstream",
        ))
    };
    let script = || vec![failing(), failing(), ScriptedResponse::text("done")];
    let agent = spec()
        .with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 2 })
        .with_stop_condition(StopConditionSpec::ErrorRate {
            errors: 2,
            within_seconds: 60,
        });
    let (recording, result) = record(script()).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);

    let live = live_firings(script(), agent.clone()).await;
    assert_eq!(live, [(2, "error_rate".to_owned(), "stop".to_owned())]);
    assert_eq!(until_first_stop(&recording, &agent), live);
}

#[tokio::test]
async fn a_guard_stop_comes_before_the_round_s_tool_errors_in_replay_as_in_a_live_run() {
    // The model calls a tool that does not exist: every result is an
    // error. In round 2, `max_rounds` stops the run after the inference,
    // before the call runs; the recording has its error, which
    // `error_rate` would count as its second.
    let script = || {
        let mut script: Vec<ScriptedResponse> = (0..3)
            .map(|_| ScriptedResponse::tool_call("missing", json!({"q": "rust"})))
            .collect();
        script.push(ScriptedResponse::text("done"));
        script
    };
    let agent = spec()
        .with_stop_condition(StopConditionSpec::ErrorRate {
            errors: 2,
            within_seconds: 60,
        })
        .with_stop_condition(StopConditionSpec::MaxRounds { rounds: 2 });
    let (recording, _) = record(script()).await;

    let live = live_firings(script(), agent.clone()).await;
    assert_eq!(live, [(2, "max_rounds".to_owned(), "stop".to_owned())]);
    assert_eq!(until_first_stop(&recording, &agent), live);
}

#[tokio::test]
async fn a_recorded_tree_replays_the_runs_of_the_replayed_agent_only() {
    let path = std::env::temp_dir().join(format!("rein-replay-tree-{}.jsonl", std::process::id()));
    let sink = Arc::new(JsonlSink::create(&path).unwrap());
    let loops: Vec<ScriptedResponse> = (0..4)
        .map(|_| ScriptedResponse::tool_call("search", json!({"q": "same"})))
        .chain([ScriptedResponse::text("done")])
        .collect();
    let lead = AgentSpec::new("lead")
        .with_model_id("m-lead")
        .with_subagent(SubagentSpec::new("worker"));
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(lead)
        .with_agent_spec(AgentSpec::new("worker").with_model_id("m-worker"))
        .with_model(ModelSpec::new("m-lead", "p-lead", "x"))
        .with_model(ModelSpec::new("m-worker", "p-worker", "x"))
        .with_provider(
            "p-lead",
            Arc::new(ScriptedExecutor::new(vec![
                ScriptedResponse::tool_call("worker", json!({"task": "search"})),
                ScriptedResponse::text("ok"),
            ])),
        )
        .with_provider("p-worker", Arc::new(ScriptedExecutor::new(loops)))
        .with_tool("search", Arc::new(Echo("search")))
        .build()
        .unwrap();
    runtime
        .run(
            RunRequest::new("tree", vec![Message::user("go")]).with_agent_id("lead"),
            sink.clone(),
        )
        .await
        .unwrap();
    drop(sink);
    let recording = read_recording(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let looping = |id: &str| {
        AgentSpec::new(id).with_stop_condition(StopConditionSpec::ToolCallLoop {
            threshold: 2,
            max_cycle: 1,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        })
    };
    // Replaying the worker: its run is there, and the loop fires in it.
    let worker = replay(&looping("worker"), &recording);
    assert_eq!(worker.len(), 2, "the root run and the worker's run");
    assert!(worker.iter().any(|r| !r.firings.is_empty()));
    // Replaying the lead: the worker's run is not the lead's.
    let lead = replay(&looping("lead"), &recording);
    assert_eq!(lead.len(), 1);
    assert!(lead[0].firings.is_empty());
}
