//! The stop conditions a model judges: `llm_loop_check` (Gemini CLI's third
//! loop-detection layer) and `task_complete` (a judge of completion), with
//! scripted judging models: confident and unconfident verdicts, malformed
//! output, errors, an unavailable model, a budget that cannot pay, ladders,
//! a check cancelled with its run, the adaptive interval, and the YAML.

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
use rein::contract::config::load_stop_conditions_yaml;
use rein::contract::event::AgentEvent;
use rein::contract::inference::ResponseFormat;
use rein::contract::lifecycle::{Confidence, OnDetect};
use rein::detectors::{
    COMPLETION_INSTRUCTION, LLM_LOOP_NUDGE, LOOP_CHECK_INSTRUCTION, TASK_INCOMPLETE_NUDGE,
};
use rein::escalation::{EscalationAction, EscalationStep, Ladder};
use rein::prelude::*;
use serde_json::json;

/// A judging model answering `answers` in turn (the last repeats),
/// recording each request.
fn judge(answers: Vec<ScriptedResponse>) -> (ScriptedExecutor, Seen) {
    recording_script(answers)
}

fn verdict(reasoning: &str, confidence: f64) -> ScriptedResponse {
    ScriptedResponse::text(json!({ "reasoning": reasoning, "confidence": confidence }).to_string())
        .with_usage(100, 20)
}

fn completion(reasoning: &str, complete: bool, confidence: f64) -> ScriptedResponse {
    ScriptedResponse::text(
        json!({ "reasoning": reasoning, "complete": complete, "confidence": confidence })
            .to_string(),
    )
    .with_usage(100, 20)
}

/// An agent that calls `echo` with the same arguments every round.
fn looping() -> ScriptedExecutor {
    ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({ "path": "a.txt" })).with_usage(10, 5),
    ])
    .repeat_last()
}

fn loop_check(after_rounds: usize, interval: usize) -> StopConditionSpec {
    every_round(after_rounds, interval, 5, 15, 10, OnDetect::Stop)
}

/// A loop check on model "judge" with every setting given.
fn every_round(
    after_rounds: usize,
    interval: usize,
    min_interval: usize,
    max_interval: usize,
    max_checks: usize,
    on_detect: OnDetect,
) -> StopConditionSpec {
    StopConditionSpec::LlmLoopCheck {
        model_id: "judge".into(),
        after_rounds,
        interval,
        min_interval,
        max_interval,
        threshold: Confidence::default(),
        history: 20,
        max_checks,
        on_detect,
    }
}

fn task_complete(every: usize) -> StopConditionSpec {
    StopConditionSpec::TaskComplete {
        model_id: "judge".into(),
        every,
        threshold: Confidence::default(),
        history: 20,
        max_checks: 10,
    }
}

/// The agent on `agent` (model "m") with `echo`, judged by `judge` (model
/// "judge" on provider "j").
fn runtime(agent: ScriptedExecutor, judge: ScriptedExecutor, spec: AgentSpec) -> AgentRuntime {
    builder_with(agent, spec)
        .with_model(ModelSpec::new("judge", "j", "judge-model"))
        .with_provider("j", Arc::new(judge))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap()
}

/// The run's `model_check` events: (code, step, outcome, confidence, detail).
fn checks(events: &[AgentEvent]) -> Vec<(String, u32, String, Option<f64>, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ModelCheck {
                code,
                step,
                outcome,
                confidence,
                detail,
                ..
            } => Some((
                code.clone(),
                *step,
                outcome.clone(),
                *confidence,
                detail.clone(),
            )),
            _ => None,
        })
        .collect()
}

fn stopped(result: &AgentRunResult) -> &StoppedReason {
    match &result.termination {
        TerminationReason::Stopped(reason) => reason,
        other => panic!("expected a stop, got {other:?}"),
    }
}

#[tokio::test]
async fn a_confident_loop_verdict_stops_the_run_with_the_models_reasoning() {
    let (judge, seen) = judge(vec![verdict("the same echo of a.txt five times", 0.95)]);
    let spec = spec()
        .with_max_rounds(20)
        .with_stop_condition(loop_check(3, 10));
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(user("t", "tidy up a.txt"), sink.clone())
        .await
        .unwrap();
    let reason = stopped(&result);
    assert_eq!(reason.code, "llm_loop_check");
    assert!(
        reason.detail.contains("the same echo of a.txt five times")
            && reason.detail.contains("\"judge\""),
        "{}",
        reason.detail
    );
    assert_eq!(result.steps, 3, "not checked before `after_rounds` rounds");
    // The check's tokens are the run's: three rounds of 15 and one of 120.
    assert_eq!(result.usage.total(), 3 * 15 + 120);
    let events = sink.events();
    let made = checks(&events);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(
        (made[0].0.as_str(), made[0].1, made[0].2.as_str(), made[0].3),
        ("llm_loop_check", 3, "detected", Some(0.95))
    );
    // What the judging model read: the fixed instruction, a schema, the
    // user's request and the calls with their arguments.
    let request = seen.lock().unwrap()[0].clone();
    assert_eq!(request.model, "judge-model");
    assert_eq!(request.system.as_deref(), Some(LOOP_CHECK_INSTRUCTION));
    assert!(request.tools.is_empty());
    let schema = request
        .response_format
        .as_ref()
        .expect("a JSON schema")
        .schema();
    assert_eq!(schema["required"], json!(["reasoning", "confidence"]));
    let prompt = &request.messages[0].content;
    assert!(
        prompt.contains("<user_request>\ntidy up a.txt\n</user_request>"),
        "{prompt}"
    );
    assert!(
        prompt.contains("[assistant called echo] {\"path\":\"a.txt\"}"),
        "{prompt}"
    );
    assert!(prompt.contains("[tool result] "), "{prompt}");
    assert_history_valid(&rt.thread_messages("t").await);
}

#[tokio::test]
async fn an_unconfident_verdict_lets_the_run_go_on_and_stretches_the_interval() {
    // Confidence 0.1: the next check comes round(5 + 10 × 0.9) = 14 rounds
    // later; confidence 0.8: round(5 + 10 × 0.2) = 7 rounds after that.
    let (judge, seen) = judge(vec![
        verdict("different work each round", 0.1),
        verdict("probably looping", 0.8),
        verdict("different work each round", 0.0),
    ]);
    let spec = spec()
        .with_max_rounds(30)
        .with_stop_condition(loop_check(2, 3));
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(stopped(&result).code, "max_rounds");
    let steps: Vec<u32> = checks(&sink.events()).iter().map(|c| c.1).collect();
    assert_eq!(steps, [2, 16, 23], "first after 2 rounds, then 14, then 7");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn malformed_output_errors_and_an_unavailable_model_are_skipped_never_a_stop() {
    let (judge, seen) = judge(vec![
        ScriptedResponse::text("I think it is looping, yes.").with_usage(50, 10),
        ScriptedResponse::text(json!({ "reasoning": "r", "confidence": 7 }).to_string()),
        ScriptedResponse::error(InferenceError::server("judge host answered 500")),
    ]);
    let spec =
        spec()
            .with_max_rounds(6)
            .with_stop_condition(every_round(1, 1, 1, 1, 4, OnDetect::Stop));
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        stopped(&result).code,
        "max_rounds",
        "a failed check never stops"
    );
    let made = checks(&sink.events());
    let outcomes: Vec<&str> = made.iter().map(|c| c.2.as_str()).collect();
    assert_eq!(
        outcomes,
        ["failed", "failed", "failed", "failed"],
        "{made:?}"
    );
    assert!(made[0].4.contains("no JSON object"), "{}", made[0].4);
    assert!(made[1].4.contains("`confidence`"), "{}", made[1].4);
    assert!(
        made[2].4.contains("judge host answered 500"),
        "{}",
        made[2].4
    );
    // Four checks (the cap); each failing one is attempted twice, the
    // second time in JSON mode with the schema alongside.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2 + 2 * 2, "capped at max_checks");
    assert!(matches!(
        seen[2].response_format,
        Some(ResponseFormat::JsonSchema(_))
    ));
    match &seen[3].response_format {
        Some(ResponseFormat::JsonObject(schema)) => {
            assert_eq!(schema["required"], json!(["reasoning", "confidence"]));
        }
        other => panic!("{other:?}"),
    }
    // The malformed answer's tokens were spent all the same.
    assert_eq!(result.usage.total(), 6 * 15 + 60);
}

#[tokio::test]
async fn a_check_the_token_budget_cannot_pay_for_is_not_sent() {
    let (judge, seen) = judge(vec![verdict("looping", 0.99)]);
    let spec = spec()
        .with_max_rounds(3)
        .with_stop_condition(loop_check(1, 1));
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    // Rounds cost 15 tokens; a check reserves 512 for its answer alone.
    let request = user("t", "go").with_token_budget(400);
    let result = rt.run(request, sink.clone()).await.unwrap();
    assert_eq!(stopped(&result).code, "max_rounds");
    assert!(seen.lock().unwrap().is_empty(), "no check was sent");
    let made = checks(&sink.events());
    assert!(!made.is_empty());
    for (_, _, outcome, confidence, detail) in &made {
        assert_eq!(outcome, "skipped");
        assert_eq!(*confidence, None);
        assert!(detail.contains("400-token budget"), "{detail}");
    }
}

#[tokio::test]
async fn a_warn_ladder_reports_each_detection_and_the_run_goes_on() {
    let (judge, _) = judge(vec![verdict("the same call again", 0.97)]);
    let mut spec =
        spec()
            .with_max_rounds(5)
            .with_stop_condition(every_round(2, 1, 1, 1, 10, OnDetect::Stop));
    spec.escalation.insert(
        "llm_loop_check".into(),
        Ladder::new(vec![EscalationStep::new(EscalationAction::Warn, 1)]).unwrap(),
    );
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(stopped(&result).code, "max_rounds");
    let detected: Vec<(String, String)> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Detected {
                code,
                action,
                detail,
                ..
            } => {
                assert!(detail.contains("the same call again"), "{detail}");
                Some((code.clone(), action.clone()))
            }
            _ => None,
        })
        .collect();
    let expected = ("llm_loop_check".to_owned(), "warn".to_owned());
    assert_eq!(detected, vec![expected; 3], "rounds 2, 3 and 4");
}

#[tokio::test]
async fn nudge_then_stop_sends_the_reasoning_to_the_model_then_stops() {
    let (judge, _) = judge(vec![verdict("polling the same file", 0.95)]);
    let spec = spec().with_max_rounds(20).with_stop_condition(every_round(
        2,
        1,
        1,
        1,
        10,
        OnDetect::NudgeThenStop,
    ));
    let rt = runtime(looping(), judge, spec);
    let result = rt.run_to_completion(user("t", "go")).await.unwrap();
    let reason = stopped(&result);
    assert_eq!(reason.code, "llm_loop_check");
    assert!(reason.detail.contains("after a nudge"), "{}", reason.detail);
    assert_eq!(result.steps, 3);
    let history = rt.thread_messages("t").await;
    let nudge = history
        .iter()
        .find(|m| m.role == Role::User && m.content.starts_with(LLM_LOOP_NUDGE))
        .expect("the nudge joined the history");
    assert!(
        nudge.content.contains("polling the same file"),
        "{}",
        nudge.content
    );
    assert_history_valid(&history);
}

#[tokio::test]
async fn a_check_in_flight_is_cancelled_with_its_run() {
    let (judge, seen) = judge(vec![
        verdict("never read", 0.99).with_delay(Duration::from_secs(3600)),
    ]);
    let spec = spec()
        .with_max_rounds(10)
        .with_stop_condition(loop_check(1, 1));
    let rt = runtime(looping(), judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let run = {
        let rt = rt.clone();
        let sink = sink.clone();
        tokio::spawn(async move { rt.run(user("t", "go"), sink).await })
    };
    // The judging model has the request: the check is in flight.
    tokio::time::timeout(Duration::from_secs(10), async {
        while seen.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the check was sent");
    assert!(rt.cancel_by_thread("t"));
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the cancel ends the check at once")
        .unwrap()
        .unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    assert_eq!(result.steps, 1);
    assert!(
        checks(&sink.events()).is_empty(),
        "a cancelled check reports nothing"
    );
    assert_history_valid(&rt.thread_messages("t").await);
}

#[tokio::test]
async fn a_judge_naming_an_unregistered_model_is_refused_at_build() {
    let error = builder_with(
        looping(),
        spec().with_stop_condition(StopConditionSpec::LlmLoopCheck {
            model_id: "flash".into(),
            after_rounds: 30,
            interval: 10,
            min_interval: 5,
            max_interval: 15,
            threshold: Confidence::default(),
            history: 20,
            max_checks: 10,
            on_detect: OnDetect::Stop,
        }),
    )
    .build()
    .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("`llm_loop_check`")
            && text.contains("\"flash\"")
            && text.contains("registered: m"),
        "{text}"
    );
}

#[tokio::test]
async fn a_final_answer_judged_complete_ends_the_run_task_complete() {
    let agent = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({ "path": "report.md" })),
        ScriptedResponse::text("The report is written to report.md."),
    ]);
    let (judge, seen) = judge(vec![completion(
        "report.md was written as asked",
        true,
        0.95,
    )]);
    let rt = runtime(agent, judge, spec().with_stop_condition(task_complete(0)));
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(user("t", "write the report"), sink.clone())
        .await
        .unwrap();
    let reason = stopped(&result);
    assert_eq!(reason.code, "task_complete");
    assert!(
        reason.detail.contains("report.md was written"),
        "{}",
        reason.detail
    );
    assert_eq!(result.response, "The report is written to report.md.");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "judged on the final answer only (every: 0)");
    assert_eq!(seen[0].system.as_deref(), Some(COMPLETION_INSTRUCTION));
    assert_eq!(
        seen[0].response_format.as_ref().unwrap().schema()["required"],
        json!(["reasoning", "complete", "confidence"])
    );
    let made = checks(&sink.events());
    assert_eq!((made[0].1, made[0].2.as_str()), (2, "detected"));
}

#[tokio::test]
async fn an_incomplete_final_answer_is_reported_and_stands_by_default() {
    let agent = ScriptedExecutor::new(vec![ScriptedResponse::text("I will write it next.")]);
    let (judge, _) = judge(vec![completion("nothing was written yet", false, 0.95)]);
    let rt = runtime(agent, judge, spec().with_stop_condition(task_complete(0)));
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "write it"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let detected = sink.events().into_iter().find_map(|e| match e {
        AgentEvent::Detected { code, action, .. } => Some((code, action)),
        _ => None,
    });
    assert_eq!(
        detected,
        Some(("task_incomplete".to_owned(), "warn".to_owned()))
    );
}

#[tokio::test]
async fn a_nudge_ladder_sends_the_judges_reason_back_then_a_stop_step_ends_it() {
    let agent = ScriptedExecutor::new(vec![ScriptedResponse::text("Done, I think.")]).repeat_last();
    let (judge, _) = judge(vec![completion("the tests were not run", false, 0.92)]);
    let mut spec = spec().with_stop_condition(task_complete(0));
    spec.escalation.insert(
        "task_complete".into(),
        Ladder::new(vec![
            EscalationStep::new(EscalationAction::Nudge, 2),
            EscalationStep::new(EscalationAction::Stop, 1),
        ])
        .unwrap(),
    );
    let rt = runtime(agent, judge, spec);
    let result = rt
        .run_to_completion(user("t", "fix and test"))
        .await
        .unwrap();
    let reason = stopped(&result);
    assert_eq!(reason.code, "task_incomplete");
    assert!(
        reason.detail.contains("the tests were not run"),
        "{}",
        reason.detail
    );
    assert_eq!(result.steps, 3, "two nudges, then the stop");
    let nudges: Vec<Message> = rt
        .thread_messages("t")
        .await
        .into_iter()
        .filter(|m| m.role == Role::User && m.content.starts_with(TASK_INCOMPLETE_NUDGE))
        .collect();
    assert_eq!(nudges.len(), 2);
    assert!(nudges[0].content.contains("the tests were not run"));
}

#[tokio::test]
async fn with_every_the_judge_can_end_a_run_that_is_still_calling_tools() {
    let (judge, seen) = judge(vec![
        completion("only two of the files are done", false, 0.95),
        completion("all four files are done", true, 0.93),
    ]);
    let rt = runtime(
        looping(),
        judge,
        spec()
            .with_max_rounds(20)
            .with_stop_condition(task_complete(2)),
    );
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(stopped(&result).code, "task_complete");
    assert_eq!(result.steps, 4);
    let made = checks(&sink.events());
    let outcomes: Vec<(u32, &str)> = made.iter().map(|c| (c.1, c.2.as_str())).collect();
    assert_eq!(
        outcomes,
        [(2, "clear"), (4, "detected")],
        "an incomplete verdict mid-run has nothing to act on"
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_history_valid(&rt.thread_messages("t").await);
}

#[test]
fn the_yaml_names_every_field_and_rejects_bad_values_where_they_are() {
    let specs = load_stop_conditions_yaml(
        "- type: llm_loop_check\n  model_id: flash\n  after_rounds: 12\n  threshold: 0.8\n  on_detect: nudge_then_stop\n- { type: task_complete, model_id: flash, every: 5 }\n",
    )
    .unwrap();
    assert_eq!(
        specs[0],
        StopConditionSpec::LlmLoopCheck {
            model_id: "flash".into(),
            after_rounds: 12,
            interval: 10,
            min_interval: 5,
            max_interval: 15,
            threshold: Confidence(0.8),
            history: 20,
            max_checks: 10,
            on_detect: OnDetect::NudgeThenStop,
        }
    );
    assert_eq!(
        specs[1],
        StopConditionSpec::TaskComplete {
            model_id: "flash".into(),
            every: 5,
            threshold: Confidence(0.9),
            history: 20,
            max_checks: 10,
        }
    );
    let cases = [
        (
            "- { type: llm_loop_check, model_id: f, threshold: 1.5 }",
            "threshold must be from 0 to 1",
        ),
        (
            "- { type: llm_loop_check, model_id: f, min_interval: 9, max_interval: 3 }",
            "min_interval (9) is above max_interval (3)",
        ),
        (
            "- { type: llm_loop_check, model_id: \"\" }",
            "model_id is empty",
        ),
        ("- { type: llm_loop_check }", "model_id"),
        (
            "- { type: task_complete, model_id: f, history: 1 }",
            "history must be 2 to 200",
        ),
        (
            "- { type: task_complete, model_id: f, treshold: 0.5 }",
            "treshold",
        ),
    ];
    for (yaml, expected) in cases {
        let error = load_stop_conditions_yaml(yaml).unwrap_err();
        assert!(error.to_string().contains(expected), "{yaml}: {error}");
        assert_eq!(error.line(), Some(1), "{yaml}: {error}");
    }
}

#[tokio::test]
async fn replay_asks_the_judging_model_over_the_history_the_recording_shows() {
    use rein::replay::{JsonlSink, REPLAY_TASK, read_recording, replay, replay_judged};
    // Record a looping run that no condition watched.
    let dir = std::env::temp_dir().join(format!("rein-model-checks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("recording.jsonl");
    let _ = std::fs::remove_file(&path);
    let (quiet, _) = judge(vec![verdict("unused", 0.0)]);
    let rt = runtime(looping(), quiet, spec().with_max_rounds(5));
    let sink = Arc::new(JsonlSink::create(&path).unwrap());
    rt.run(user("t", "tidy up a.txt"), sink).await.unwrap();
    let recording = read_recording(&std::fs::read_to_string(&path).unwrap()).unwrap();

    // Replayed against an agent with a loop check.
    let watched = spec().with_stop_condition(every_round(3, 1, 1, 1, 10, OnDetect::Stop));
    let (judge, seen) = judge(vec![
        verdict("not yet", 0.2),
        verdict("the same echo again and again", 0.95),
    ]);
    let models = runtime(looping(), judge, watched.clone().with_model_id("m"))
        .judging_models("agent")
        .unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].model.id, "judge");
    let runs = replay_judged(&watched, &recording, &models).await.unwrap();
    let firings: Vec<(u32, &str, &str)> = runs[0]
        .firings
        .iter()
        .map(|f| (f.round, f.code.as_str(), f.action.as_str()))
        .collect();
    assert_eq!(firings, [(4, "llm_loop_check", "stop")]);
    assert!(
        runs[0].firings[0]
            .detail
            .contains("the same echo again and again")
    );
    // Asked after rounds 3 and 4, then retired by its stop; what it read
    // is what the events show, and it was told the request is missing.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let prompt = &seen[1].messages[0].content;
    assert!(prompt.contains(REPLAY_TASK), "{prompt}");
    assert_eq!(
        prompt
            .matches("[assistant called echo] {\"path\":\"a.txt\"}")
            .count(),
        4,
        "{prompt}"
    );
    // Without its models, replay leaves the condition out.
    assert!(replay(&watched, &recording)[0].firings.is_empty());
    // One judging model per condition, or an error that says so.
    let error = replay_judged(&watched, &recording, &[]).await.unwrap_err();
    assert!(
        error.contains("1 conditions a model judges, but 0"),
        "{error}"
    );
}

#[tokio::test]
async fn long_batch_work_over_different_files_reaches_the_judge_with_its_arguments_and_runs_on() {
    // Gemini CLI's users report batch work judged a loop. The judge can
    // only tell batch work apart if it sees the request and each call's
    // arguments: this judge answers from exactly that.
    let agent = ScriptedExecutor::from_fn(|request| {
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        if done < 12 {
            ScriptedResponse::tool_call("echo", json!({ "path": format!("src/f{done}.rs") }))
        } else {
            ScriptedResponse::text("Added the header to all 12 files.")
        }
    });
    let judge = ScriptedExecutor::from_fn(|request| {
        let prompt = &request.messages[0].content;
        let batch = prompt.contains("to every file");
        let paths: std::collections::BTreeSet<&str> = prompt
            .match_indices("src/f")
            .map(|(at, _)| &prompt[at..at + 8])
            .collect();
        let confidence = if batch && paths.len() >= 3 {
            0.05
        } else {
            0.95
        };
        verdict("one call per file", confidence)
    });
    let spec =
        spec()
            .with_max_rounds(40)
            .with_stop_condition(every_round(4, 2, 2, 4, 10, OnDetect::Stop));
    let rt = runtime(agent, judge, spec);
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(
            user("t", "Add the license header to every file in src/."),
            sink.clone(),
        )
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let made = checks(&sink.events());
    assert!(made.len() >= 3, "{made:?}");
    assert!(made.iter().all(|c| c.2 == "clear"), "{made:?}");
}

#[tokio::test]
async fn a_completion_judge_that_fails_answers_malformed_or_cannot_be_paid_for_changes_nothing() {
    let answer = || ScriptedExecutor::new(vec![ScriptedResponse::text("Here is the report.")]);
    let cases: Vec<(ScriptedResponse, Option<u64>, &str, &str)> = vec![
        (
            ScriptedResponse::text(json!({ "reasoning": "done", "confidence": 0.99 }).to_string()),
            None,
            "failed",
            "`complete` is missing",
        ),
        (
            ScriptedResponse::error(InferenceError::server("judge overloaded")),
            None,
            "failed",
            "judge overloaded",
        ),
        (
            completion("done", true, 0.99),
            Some(100),
            "skipped",
            "100-token budget",
        ),
    ];
    for (response, budget, outcome, detail) in cases {
        let (judge, _) = judge(vec![response]);
        let rt = runtime(
            answer(),
            judge,
            spec().with_stop_condition(task_complete(0)),
        );
        let sink = Arc::new(CollectingSink::new());
        let mut request = user("t", "write the report");
        if let Some(budget) = budget {
            request = request.with_token_budget(budget);
        }
        let result = rt.run(request, sink.clone()).await.unwrap();
        assert_eq!(
            result.termination,
            TerminationReason::NaturalEnd,
            "{outcome}: the answer stands"
        );
        let made = checks(&sink.events());
        assert_eq!(made.len(), 1, "{made:?}");
        assert_eq!(made[0].0, "task_complete");
        assert_eq!(made[0].2, outcome, "{made:?}");
        assert!(made[0].4.contains(detail), "{made:?}");
    }
}

#[tokio::test]
async fn an_unreachable_or_rate_limited_judge_is_asked_once_and_the_check_fails() {
    for error in [
        InferenceError::connection("judge host unreachable"),
        InferenceError::rate_limited("slow down", Some(Duration::from_secs(30))),
    ] {
        let (judge, seen) = judge(vec![ScriptedResponse::error(error.clone())]);
        let spec = spec().with_max_rounds(2).with_stop_condition(every_round(
            1,
            5,
            5,
            5,
            10,
            OnDetect::Stop,
        ));
        let rt = runtime(looping(), judge, spec);
        let sink = Arc::new(CollectingSink::new());
        let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
        assert_eq!(stopped(&result).code, "max_rounds");
        assert_eq!(seen.lock().unwrap().len(), 1, "{error}: no second attempt");
        let made = checks(&sink.events());
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].2, "failed");
        assert!(made[0].4.contains(error.message()), "{made:?}");
    }
}

#[tokio::test]
async fn a_judge_s_429_pauses_its_limited_provider_for_every_run() {
    let (judge, _) = judge(vec![ScriptedResponse::error(InferenceError::rate_limited(
        "slow down",
        Some(Duration::from_secs(30)),
    ))]);
    let spec =
        spec()
            .with_max_rounds(2)
            .with_stop_condition(every_round(1, 5, 5, 5, 10, OnDetect::Stop));
    let rt = builder_with(looping(), spec)
        .with_model(ModelSpec::new("judge", "j", "judge-model"))
        .with_provider("j", Arc::new(judge))
        .with_provider_limits(
            "j",
            rein::limits::ProviderLimits::new().requests_per_minute(100),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let result = rt.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(stopped(&result).code, "max_rounds");
    let status = rt.provider_status().await;
    let judge = status
        .iter()
        .find(|s| s.id == "j")
        .expect("the judge's provider");
    let paused = judge.usage.as_ref().and_then(|u| u.paused_ms);
    assert!(
        paused.is_some_and(|ms| ms > 20_000),
        "the provider waits the 30 s it was told: {judge:?}"
    );
}
