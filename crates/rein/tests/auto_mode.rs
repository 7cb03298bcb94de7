//! Auto mode through full runs: rounds until a stop condition holds, the
//! stop reasons and their progress events, and per-thread session tokens.

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
use rein::auto::{AutoGuardrail, AutomationPlugin, AutomationPolicy};
use rein::contract::event::AgentEvent;
use rein::plugins::TerminatePlugin;
use rein::prelude::*;
use serde_json::json;

/// A model that, each round, reports `Val ACC` from `scores` (one per round)
/// and then answers `closing`. Usage 10 in / 5 out per inference.
fn experimenter(scores: Vec<f64>, closing: &'static str) -> ScriptedExecutor {
    counted_experimenter(scores, closing, (10, 5), Arc::default())
}

/// [`experimenter`] with `usage` (input, output) per inference, counting
/// the calls it answers in `calls`.
fn counted_experimenter(
    scores: Vec<f64>,
    closing: &'static str,
    usage: (u64, u64),
    calls: Arc<Mutex<usize>>,
) -> ScriptedExecutor {
    let round = Mutex::new(0usize);
    ScriptedExecutor::from_fn(move |req| {
        *calls.lock().unwrap() += 1;
        let last = req.messages.last().unwrap();
        if last.role == Role::User {
            let mut n = round.lock().unwrap();
            let score = scores[(*n).min(scores.len() - 1)];
            *n += 1;
            ScriptedResponse::tool_call("report_metrics", json!({"metrics": {"Val ACC": score}}))
                .with_usage(usage.0, usage.1)
        } else {
            ScriptedResponse::text(closing).with_usage(usage.0, usage.1)
        }
    })
}

fn auto_runtime(model: ScriptedExecutor) -> AgentRuntime {
    builder_with(model, spec().with_plugin_id("auto").with_plugin_id("done"))
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .with_plugin("done", Arc::new(TerminatePlugin::new()))
        .build()
        .unwrap()
}

fn progress_messages(sink: &CollectingSink) -> Vec<String> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Progress { message, .. } => Some(message),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn improving_metrics_run_rounds_until_the_goal_is_reached() {
    let runtime = auto_runtime(experimenter(
        vec![0.80, 0.86, 0.93, 0.99],
        "Experiment done.",
    ));
    let policy = AutomationPolicy::from_json(
        r#"{"automation_policy": {"goals": [{"metric": "Val ACC", "operator": ">=", "value": 0.92}], "maxExperiments": 10}}"#,
    )
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(user("t", "Train the model."), policy, sink.clone())
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "automation goals reached");
    assert_eq!(r.rounds, 3);
    assert_eq!(r.runs.len(), 3);
    assert_eq!(r.tokens_used_session, 3 * 2 * 15);
    let messages = progress_messages(&sink);
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(
        messages.last().unwrap(),
        "auto-run stop condition: automation goals reached"
    );
    // Each replanned round starts with a continuation naming the unmet goal.
    let history = runtime.thread_messages("t").await;
    let continuations: Vec<&str> = history
        .iter()
        .filter(|m| m.role == Role::User && m.content.starts_with("Continue the task"))
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(continuations.len(), 2);
    assert!(
        continuations[0].contains("Val ACC >= 0.92 (latest: 0.8)"),
        "{}",
        continuations[0]
    );
}

#[tokio::test]
async fn a_metric_reported_as_a_numeric_string_counts_toward_the_goal() {
    let model = ScriptedExecutor::from_fn(|req| match req.messages.last().unwrap().role {
        Role::User => {
            ScriptedResponse::tool_call("report_metrics", json!({"metrics": {"F1": " 0.93 "}}))
        }
        _ => ScriptedResponse::text("Experiment done."),
    });
    let goal = AutomationPolicy::from_json(
        r#"{"goals": [{"metric": "F1", "operator": ">", "value": 0.9}], "maxExperiments": 5}"#,
    )
    .unwrap();
    let r = auto_runtime(model)
        .auto_run(user("s", "go"), goal, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "automation goals reached");
    assert_eq!(r.rounds, 1);
}

#[tokio::test]
async fn progress_events_carry_session_tokens_and_the_budget() {
    // Realistic prompt sizes (the agent's tool list alone is ~190 tokens):
    // 300 in / 20 out per call, two calls a round.
    let model = counted_experimenter(vec![0.1], "ok", (300, 20), Arc::default());
    let runtime = auto_runtime(model);
    let policy = AutomationPolicy::from_json(r#"{"maxTokens": 1500}"#).unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(user("t", "go"), policy, sink.clone())
        .await
        .unwrap();
    assert!(
        r.stop_reason.starts_with("token budget reached ("),
        "{}",
        r.stop_reason
    );
    assert!(r.tokens_used_session <= 1500, "no overshoot");
    assert!(r.rounds >= 2);
    let budgets: Vec<(u64, Option<u64>)> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Progress {
                tokens_used_session,
                max_tokens,
                ..
            } => Some((tokens_used_session, max_tokens)),
            _ => None,
        })
        .collect();
    // One after every round and one for the stop, each with the budget;
    // session tokens only grow, and the last is the session's.
    assert_eq!(budgets.len(), r.runs.len() + 1);
    assert!(budgets.iter().all(|(_, max)| *max == Some(1500)));
    assert!(budgets.windows(2).all(|w| w[0].0 <= w[1].0));
    assert_eq!(budgets[0].0, 640);
    assert_eq!(budgets.last().unwrap().0, r.tokens_used_session);
}

#[tokio::test]
async fn the_session_budget_refuses_a_round_s_call_before_it_would_exceed_it() {
    // Each round makes two calls of 320 tokens; the second round's first
    // call, a prompt of more than 300 tokens, would need more than the 260
    // that remain of 900.
    let calls = Arc::new(Mutex::new(0usize));
    let model = counted_experimenter(vec![0.1], "ok", (300, 20), calls.clone());
    let runtime = auto_runtime(model);
    let policy = AutomationPolicy::from_json(r#"{"maxTokens": 900}"#).unwrap();
    let r = runtime
        .auto_run(user("t", "go"), policy, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    // The contract's exact string; the detail is the last run's stop.
    assert_eq!(r.stop_reason, "token budget reached (640/900)");
    assert_eq!(r.rounds, 2);
    assert_eq!(r.tokens_used_session, 640, "no overshoot");
    assert_eq!(*calls.lock().unwrap(), 2, "the refused call was never made");
    let last = r.runs.last().unwrap();
    match &last.termination {
        TerminationReason::Stopped(s) => {
            assert_eq!(s.code, "token_budget");
            assert!(
                s.detail.starts_with("the next inference was not sent"),
                "{}",
                s.detail
            );
        }
        other => panic!("expected token_budget, got {other:?}"),
    }
    assert_eq!(last.usage.total(), 0);
}

#[tokio::test]
async fn experiment_budgets_and_the_ceiling_stop_the_session() {
    let runtime = auto_runtime(experimenter(vec![0.1], "ok"));
    let policy = AutomationPolicy::from_json(r#"{"maxExperiments": 2}"#).unwrap();
    let r = runtime
        .auto_run(user("a", "go"), policy, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "max experiments reached (2/2)");

    let runtime = builder_with(experimenter(vec![0.1], "ok"), spec().with_plugin_id("auto"))
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .with_auto_round_ceiling(3)
        .build()
        .unwrap();
    let r = runtime
        .auto_run(user("b", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "max rounds reached (3)");
    assert_eq!(r.rounds, 3);
}

#[tokio::test]
async fn text_heuristics_stop_unless_disabled() {
    let runtime = auto_runtime(experimenter(
        vec![0.1],
        "Results attached.\n\nShould I proceed with the next dataset?",
    ));
    let r = runtime
        .auto_run(user("a", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "user-input heuristic matched");
    assert_eq!(r.rounds, 1);

    let runtime = auto_runtime(experimenter(
        vec![0.1],
        "Traceback (most recent call last):\n  oops",
    ));
    let r = runtime
        .auto_run(user("b", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "failure heuristic matched");

    let runtime = auto_runtime(experimenter(
        vec![0.1],
        "Traceback (most recent call last):\n  oops",
    ));
    let lax =
        AutomationPolicy::from_json(r#"{"maxExperiments": 2, "strictHeuristics": false}"#).unwrap();
    let r = runtime
        .auto_run(user("c", "go"), lax, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "max experiments reached (2/2)");
}

/// The source's replan table for an emptied queue (the agent calls
/// `terminate` with `success` every round): with no policy, with goals
/// unmet, with experiment budget left, or with only a token budget, the
/// session replans until a stop condition holds.
#[tokio::test]
async fn declaring_the_work_done_replans_until_a_stop_condition_as_the_source_s_table_says() {
    let model = || {
        ScriptedExecutor::from_fn(|req| match req.messages.last().unwrap().role {
            Role::User => {
                ScriptedResponse::tool_call("report_metrics", json!({"metrics": {"F1": 0.5}}))
                    .with_usage(100, 50)
            }
            _ => ScriptedResponse::tool_call(
                "terminate",
                json!({"status": "success", "message": "nothing left"}),
            )
            .with_usage(100, 50),
        })
    };
    let session = |thread: &str, policy: Option<&str>| {
        let policy = policy.and_then(|p| AutomationPolicy::from_json(p).unwrap());
        let runtime = builder_with(
            model(),
            spec().with_plugin_id("auto").with_plugin_id("done"),
        )
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .with_plugin("done", Arc::new(TerminatePlugin::new()))
        .with_auto_round_ceiling(4)
        .build()
        .unwrap();
        let thread = thread.to_owned();
        async move {
            runtime
                .auto_run(user(&thread, "go"), policy, Arc::new(CollectingSink::new()))
                .await
                .unwrap()
        }
    };
    // No policy: the ceiling ends it.
    let r = session("none", None).await;
    assert_eq!(
        (r.stop_reason.as_str(), r.rounds),
        ("max rounds reached (4)", 4)
    );
    // Goals unmet, no budget: the ceiling ends it.
    let goals = r#"{"goals": [{"metric": "F1", "operator": ">", "value": 0.9}]}"#;
    let r = session("goals", Some(goals)).await;
    assert_eq!(
        (r.stop_reason.as_str(), r.rounds),
        ("max rounds reached (4)", 4)
    );
    // Experiment budget left: until it is spent.
    let r = session("budget", Some(r#"{"maxExperiments": 3}"#)).await;
    assert_eq!(
        (r.stop_reason.as_str(), r.rounds),
        ("max experiments reached (3/3)", 3)
    );
    // Only a token budget (300 tokens a round, and each round's prompts
    // estimated before they are sent): until it is spent, past round 1.
    let r = session("tokens", Some(r#"{"maxTokens": 800}"#)).await;
    assert!(
        r.stop_reason.starts_with("token budget reached (") && r.rounds >= 2,
        "{} after {} rounds",
        r.stop_reason,
        r.rounds
    );
}

struct BlockAfter(u32, Mutex<u32>);
impl AutoGuardrail for BlockAfter {
    fn check(&self, _thread_id: &str, _round: &AgentRunResult) -> Option<String> {
        let mut n = self.1.lock().unwrap();
        *n += 1;
        (*n >= self.0).then(|| "plan file is malformed".to_owned())
    }
}

#[tokio::test]
async fn the_guardrail_blocks_with_its_reason_in_the_progress() {
    let runtime = builder_with(experimenter(vec![0.1], "ok"), spec().with_plugin_id("auto"))
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .with_auto_guardrail(Arc::new(BlockAfter(2, Mutex::new(0))))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(user("t", "go"), None, sink.clone())
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "guardrail blocking");
    assert_eq!(r.rounds, 2);
    let messages = progress_messages(&sink);
    assert!(messages.contains(&"auto-run guardrail blocked: plan file is malformed".to_owned()));
    assert_eq!(
        messages.last().unwrap(),
        "auto-run stop condition: guardrail blocking"
    );
}

#[tokio::test]
async fn a_cancelled_round_stops_the_session() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]),
        spec(),
    )
    .with_tool("gate", Arc::new(gate))
    .build()
    .unwrap();
    let canceller = runtime.clone();
    tokio::spawn(async move {
        entered.notified().await;
        canceller.cancel_by_thread("t");
    });
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "cancelled");
}

#[tokio::test]
async fn session_tokens_add_up_across_user_messages_until_reset() {
    let runtime = auto_runtime(experimenter(vec![0.1], "ok"));
    let policy = || AutomationPolicy::from_json(r#"{"maxExperiments": 1}"#).unwrap();
    let r = runtime
        .auto_run(
            user("t", "first message"),
            policy(),
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    assert_eq!(r.tokens_used_session, 30);
    // A plain run on the thread adds its tokens too.
    let extra = runtime
        .run_to_completion(user("t", "a plain question"))
        .await
        .unwrap();
    assert_eq!(runtime.session_tokens("t"), 30 + extra.usage.total());
    runtime.reset_session("t");
    assert_eq!(runtime.session_tokens("t"), 0);
    let r = runtime
        .auto_run(
            user("t", "second message"),
            policy(),
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    assert_eq!(
        r.tokens_used_session, 30,
        "the reset also cleared the reports: one more experiment was needed"
    );
    assert_eq!(runtime.session_tokens("other"), 0);
}

#[tokio::test]
async fn a_round_that_cannot_start_is_an_error() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]),
        spec(),
    )
    .with_tool("gate", Arc::new(gate))
    .build()
    .unwrap();
    let handle = runtime.mailbox().submit(user("t", "busy")).await.unwrap();
    entered.notified().await;
    let err = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuntimeError::ThreadAlreadyRunning {
            thread_id: "t".into()
        }
    );
    handle.cancel();
}

/// A guardrail that cancels the thread the first time it is asked — that is,
/// between rounds, when no run is active — and records what cancel said.
struct CancelBetweenRounds {
    runtime: std::sync::OnceLock<AgentRuntime>,
    said: Mutex<Vec<bool>>,
}

impl AutoGuardrail for CancelBetweenRounds {
    fn check(&self, thread_id: &str, _round: &AgentRunResult) -> Option<String> {
        let runtime = self.runtime.get().unwrap();
        assert!(!runtime.is_thread_active(thread_id), "between rounds");
        let mut said = self.said.lock().unwrap();
        if said.is_empty() {
            said.push(runtime.cancel_by_thread(thread_id));
        }
        None
    }
}

#[tokio::test]
async fn cancel_by_thread_between_rounds_stops_the_session() {
    let guard = Arc::new(CancelBetweenRounds {
        runtime: std::sync::OnceLock::new(),
        said: Mutex::new(Vec::new()),
    });
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("working")]).repeat_last(),
        spec(),
    )
    .with_auto_guardrail(guard.clone())
    .build()
    .unwrap();
    assert!(guard.runtime.set(runtime.clone()).is_ok());
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(
        *guard.said.lock().unwrap(),
        [true],
        "the cancel found the session"
    );
    assert_eq!(r.stop_reason, "cancelled");
    assert_eq!(r.rounds, 1, "no round started after the cancel");
}

/// Cancels the thread from a `RunEnd` hook: while the round is finishing.
struct CancelAtRunEnd(Arc<std::sync::OnceLock<AgentRuntime>>);

#[async_trait::async_trait]
impl PhaseHook for CancelAtRunEnd {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let thread = ctx.thread_id().to_owned();
        assert!(self.0.get().unwrap().cancel_by_thread(&thread));
        Ok(())
    }
}

impl Plugin for CancelAtRunEnd {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::RunEnd, Arc::new(CancelAtRunEnd(self.0.clone())));
        Ok(())
    }
}

#[tokio::test]
async fn a_cancel_while_a_round_finishes_starts_no_next_round() {
    let cell = Arc::new(std::sync::OnceLock::new());
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("working")]).repeat_last(),
        spec().with_plugin_id("cancel"),
    )
    .with_plugin("cancel", Arc::new(CancelAtRunEnd(cell.clone())))
    .build()
    .unwrap();
    assert!(cell.set(runtime.clone()).is_ok());
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "cancelled");
    assert_eq!(r.rounds, 1);
}

#[tokio::test]
async fn cancelling_the_request_token_stops_the_session() {
    let token = CancellationToken::new();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("working")]).repeat_last(),
        spec(),
    )
    .with_auto_guardrail(Arc::new(CancelToken(token.clone())))
    .build()
    .unwrap();
    let r = runtime
        .auto_run(
            user("t", "go").with_cancellation(token.clone()),
            None,
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "cancelled");
    assert_eq!(r.rounds, 1);
}

/// Cancels a token after the first round.
struct CancelToken(CancellationToken);

impl AutoGuardrail for CancelToken {
    fn check(&self, _thread_id: &str, _round: &AgentRunResult) -> Option<String> {
        self.0.cancel();
        None
    }
}

#[tokio::test]
async fn progress_belongs_to_the_session_and_never_follows_a_runs_run_finished() {
    let runtime = auto_runtime(experimenter(vec![0.1], "ok"));
    let policy = AutomationPolicy::from_json(r#"{"maxExperiments": 2}"#).unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(user("t", "go"), policy, sink.clone())
        .await
        .unwrap();
    let events = sink.events();
    // Invariant 1 holds for every run: RunFinished is its last event.
    let finished = assert_one_run_finished_last(
        &events
            .iter()
            .filter(|e| !matches!(e, AgentEvent::Progress { .. }))
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert_eq!(finished.len(), 2);
    let mut finished_so_far = std::collections::HashSet::new();
    for e in &events {
        match e {
            AgentEvent::RunFinished { run_id, .. } => {
                finished_so_far.insert(run_id.clone());
            }
            AgentEvent::Progress {
                run_id,
                round_run_id,
                ..
            } => {
                assert!(run_id.starts_with("auto-"), "{run_id}");
                assert!(!finished.contains_key(run_id), "a session id is no run id");
                let round = round_run_id.as_ref().unwrap();
                assert!(finished_so_far.contains(round), "progress after its round");
            }
            other => assert!(
                !finished_so_far.contains(other.run_id()),
                "event after its run's RunFinished: {other:?}"
            ),
        }
    }
    assert_eq!(r.rounds, 2);
}

#[tokio::test]
async fn a_loop_detector_stop_ends_the_session_instead_of_starting_fresh_detectors() {
    let model = Arc::new(
        ScriptedExecutor::new(vec![ScriptedResponse::tool_call("echo", json!({"q": 1}))])
            .repeat_last(),
    );
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m").with_stop_condition(
            StopConditionSpec::ToolCallLoop {
                threshold: 3,
                max_cycle: 1,
                on_detect: rein::contract::lifecycle::OnDetect::Stop,
            },
        ))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", model.clone())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.rounds, 1, "{}", r.stop_reason);
    assert!(
        r.stop_reason
            .starts_with("loop detected (tool_call_loop): the tool call cycle [echo]"),
        "{}",
        r.stop_reason
    );
    // Three calls and the model was asked three times: not ceiling × threshold.
    assert_eq!(r.runs[0].steps, 3);
}

#[tokio::test]
async fn the_same_answer_every_round_is_nudged_then_stops_the_session() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        log.lock()
            .unwrap()
            .push(req.messages.last().unwrap().content.clone());
        ScriptedResponse::text("I am still working on it.")
    });
    let runtime = builder_with(model, spec()).build().unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(user("t", "go"), None, sink.clone())
        .await
        .unwrap();
    // Round 3 repeats two earlier answers: round 4 is nudged; round 4
    // repeats again: the session stops.
    assert_eq!(r.rounds, 4, "{}", r.stop_reason);
    assert!(
        r.stop_reason
            .starts_with("stuck across rounds: the round's answer repeated 3 earlier"),
        "{}",
        r.stop_reason
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen[3].ends_with(rein::detectors::STUCK_NUDGE),
        "{}",
        seen[3]
    );
    assert!(!seen[2].contains(rein::detectors::STUCK_NUDGE));
    assert!(
        progress_messages(&sink)
            .iter()
            .any(|m| m.starts_with("auto-run nudge: Observed duplicate responses"))
    );
}

#[tokio::test]
async fn the_agents_stuck_setting_applies_across_rounds_and_zero_disables_it() {
    let model = ScriptedExecutor::from_fn(|_| ScriptedResponse::text("same"));
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::Stuck { duplicates: 0 }),
    )
    .with_auto_round_ceiling(6)
    .build()
    .unwrap();
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "max rounds reached (6)");
    let model = ScriptedExecutor::from_fn(|_| ScriptedResponse::text("same"));
    let runtime = builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::Stuck { duplicates: 1 }),
    )
    .build()
    .unwrap();
    let r = runtime
        .auto_run(user("t", "go"), None, Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(
        r.rounds, 3,
        "nudged after round 2, stopped after round 3: {}",
        r.stop_reason
    );
}
