//! The planning flow (`PlanPlugin`, after OpenManus's `PlanningFlow`): a
//! plan kept with the `plan` tool, the run closed by a summary once no step
//! is active (`stopped(plan_completed)`), nudged back to the plan while
//! steps are active, the plan in the run's state, its stop report and its
//! `plan_updated` events.

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
use rein::plugins::{FINALIZE_PROMPT, PlanKey, PlanPlugin, StepStatus};
use rein::prelude::*;
use serde_json::{Value, json};

/// A model that answers `script` in order, recording every request.
fn model(script: Vec<ScriptedResponse>) -> (ScriptedExecutor, Seen) {
    recording_script(script)
}

fn runtime(executor: ScriptedExecutor, plugin: PlanPlugin) -> AgentRuntime {
    builder_with(executor, spec().with_plugin_id("plan").with_max_rounds(20))
        .with_plugin("plan", Arc::new(plugin))
        .build()
        .unwrap()
}

fn create() -> ScriptedResponse {
    ScriptedResponse::tool_call(
        "plan",
        json!({"command": "create", "title": "Release 1.2", "steps": ["build", "test", "tag"]}),
    )
}

fn mark(index: usize, status: &str) -> (&'static str, Value) {
    (
        "plan",
        json!({"command": "mark_step", "step_index": index, "step_status": status}),
    )
}

fn plans(events: &[AgentEvent]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::PlanUpdated { plan, .. } => Some(plan.clone()),
            _ => None,
        })
        .collect()
}

const SUMMARY: &str = "Built and tested 1.2; tagging is blocked on the signing key.";

#[tokio::test]
async fn a_plan_worked_to_its_end_closes_with_a_summary_that_is_the_response() {
    let (executor, seen) = model(vec![
        create(),
        ScriptedResponse::tool_calls(vec![
            mark(0, "completed"),
            mark(1, "completed"),
            (
                "plan",
                json!({"command": "mark_step", "step_index": 2, "step_status": "blocked", "step_notes": "no signing key"}),
            ),
        ]),
        ScriptedResponse::text(SUMMARY),
    ]);
    let rt = runtime(executor, PlanPlugin::new());
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(user("t", "release 1.2"), sink.clone())
        .await
        .unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "plan_completed");
            assert_eq!(
                r.detail,
                "plan \"Release 1.2\": 2 completed, 1 blocked (3 steps)"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(result.response, SUMMARY, "the summary is the response");
    assert_eq!(result.steps, 3);
    // The summary was asked for with the plan's state.
    let seen = seen.lock().unwrap().clone();
    let last = seen.last().unwrap().messages.last().unwrap();
    assert_eq!(last.role, Role::User);
    assert!(
        last.content.starts_with(FINALIZE_PROMPT),
        "{}",
        last.content
    );
    assert!(
        last.content
            .contains("2. [blocked] tag — notes: no signing key"),
        "{}",
        last.content
    );
    // The plan: in the run's exported state, its stop report, its events.
    let plan = result.exported::<PlanKey>().flatten().expect("the plan");
    assert_eq!(plan.steps[2].status, StepStatus::Blocked);
    assert_eq!(
        result.report.plan.as_ref().unwrap(),
        &serde_json::to_value(&plan).unwrap()
    );
    let updates = plans(&sink.events());
    // One per round that changed it (the three marks came in one round).
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[0]["steps"][0]["status"], "not_started");
    assert_eq!(updates[1], serde_json::to_value(&plan).unwrap());
    assert_history_valid(&rt.thread_messages("t").await);
}

#[tokio::test]
async fn a_final_answer_with_steps_still_active_is_sent_back_to_the_plan_then_stopped() {
    let (executor, seen) = model(vec![
        create(),
        ScriptedResponse::tool_calls(vec![mark(0, "in_progress")]),
        ScriptedResponse::text("I think we are done."),
    ]);
    let rt = runtime(executor, PlanPlugin::new().with_max_nudges(1));
    let result = rt.run_to_completion(user("t", "release")).await.unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "plan_incomplete");
            assert!(
                r.detail.contains(
                    "0. build (in_progress); 1. test (not_started); 2. tag (not_started)"
                ),
                "{}",
                r.detail
            );
        }
        other => panic!("{other:?}"),
    }
    // One nudge named the active steps.
    let seen = seen.lock().unwrap().clone();
    let nudge = seen[3].messages.last().unwrap();
    assert!(
        nudge
            .content
            .starts_with("The plan still has steps to do: 0. build (in_progress)"),
        "{}",
        nudge.content
    );
    assert_eq!(result.steps, 4);
}

#[tokio::test]
async fn a_malformed_plan_call_is_an_error_result_and_changes_nothing() {
    let (executor, seen) = model(vec![
        ScriptedResponse::tool_call("plan", json!({"command": "mark_step", "step_index": 0})),
        create(),
        ScriptedResponse::tool_call(
            "plan",
            json!({"command": "mark_step", "step_index": 7, "step_status": "completed"}),
        ),
        ScriptedResponse::text("stopping here"),
    ]);
    let rt = runtime(executor, PlanPlugin::new().with_max_nudges(0));
    let sink = Arc::new(CollectingSink::new());
    let result = rt.run(user("t", "go"), sink.clone()).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let first = &seen[1].messages.last().unwrap().content;
    assert!(first.contains("there is no plan yet"), "{first}");
    let third = &seen[3].messages.last().unwrap().content;
    assert!(
        third.contains("`step_index` must be a step's index, 0 to 2; got 7"),
        "{third}"
    );
    assert_eq!(plans(&sink.events()).len(), 1, "only the create changed it");
    match &result.termination {
        TerminationReason::Stopped(r) => assert_eq!(r.code, "plan_incomplete"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn without_a_plan_the_run_ends_as_any_other() {
    let (executor, _) = model(vec![ScriptedResponse::text("Nothing to plan.")]);
    let rt = runtime(executor, PlanPlugin::new());
    let result = rt.run_to_completion(user("t", "hi")).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.report.plan, None);
    assert_eq!(result.exported::<PlanKey>().flatten(), None);
}

#[tokio::test]
async fn a_step_that_names_a_sub_agent_records_its_answer_and_completes_with_it() {
    let lead = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call(
            "plan",
            json!({"command": "create", "title": "Trip", "steps": [
                {"title": "find trains", "agent": "research"},
                "book the hotel"
            ]}),
        ),
        ScriptedResponse::tool_calls(vec![
            mark(0, "in_progress"),
            ("research", json!({"task": "trains to Bern"})),
        ]),
        ScriptedResponse::tool_call(
            "plan",
            json!({"command": "mark_step", "step_index": 1, "step_status": "blocked", "step_notes": "no card"}),
        ),
        ScriptedResponse::text("Trains found; the hotel is blocked."),
    ]);
    let researcher = ScriptedExecutor::new(vec![ScriptedResponse::text(
        "Two trains to Bern: 08:02 and 09:02.",
    )]);
    let spec = spec()
        .with_plugin_id("plan")
        .with_subagent(SubagentSpec::new("researcher").with_tool("research"));
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("m"))
        .with_agent_spec(AgentSpec::new("researcher").with_model_id("r"))
        .with_model(ModelSpec::new("m", "p", "lead-model"))
        .with_model(ModelSpec::new("r", "q", "research-model"))
        .with_provider("p", Arc::new(lead))
        .with_provider("q", Arc::new(researcher))
        .with_plugin("plan", Arc::new(PlanPlugin::new()))
        .build()
        .unwrap();
    let result = rt
        .run(
            RunRequest::new("t", vec![Message::user("plan a trip")]).with_agent_id("agent"),
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "plan_completed");
            assert!(r.detail.contains("1 completed, 1 blocked"), "{}", r.detail);
        }
        other => panic!("{other:?}"),
    }
    let plan = result.exported::<PlanKey>().flatten().unwrap();
    assert_eq!(plan.steps[0].agent.as_deref(), Some("research"));
    assert_eq!(plan.steps[0].status, StepStatus::Completed);
    assert!(
        plan.steps[0].result.contains("08:02 and 09:02"),
        "{:?}",
        plan.steps[0]
    );
    assert_eq!(plan.steps[1].status, StepStatus::Blocked);
}
