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
    let path = std::env::temp_dir().join(format!(
        "rein-replay-{}-{}.jsonl",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut script: Vec<ScriptedResponse> = (0..6)
        .map(|_| ScriptedResponse::tool_call("search", json!({"q": "rust"})))
        .collect();
    script.push(ScriptedResponse::text(
        "I found three crates. Which one do you prefer?",
    ));
    let runtime = builder_with(ScriptedExecutor::new(script), spec())
        .with_tool("search", Arc::new(Echo("search")))
        .build()
        .unwrap();
    let sink = Arc::new(JsonlSink::create(&path).unwrap());
    let result = runtime.run(user("t", "find a crate"), sink).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    text
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
    // The call the ladder denied is refused before it runs, in both.
    assert!(
        replayed.iter().filter(|(_, _, a)| a == "deny").count() == 2,
        "{replayed:?}"
    );
}
