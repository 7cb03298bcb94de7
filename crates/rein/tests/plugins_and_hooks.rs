//! Plugins selected by `plugin_ids` contribute typed state, hooks and tools;
//! hooks run sequentially in plugin order and steer the run through their
//! context.

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
use rein::prelude::*;
use serde_json::json;

type Log = Arc<Mutex<Vec<String>>>;

/// Records "<label>:<phase>:<step>" at every phase.
struct Recorder {
    label: &'static str,
    log: Log,
}

#[async_trait::async_trait]
impl PhaseHook for Recorder {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:{}:{}", self.label, ctx.phase(), ctx.step()));
        Ok(())
    }
}

struct RecordingPlugin {
    label: &'static str,
    log: Log,
}

impl Plugin for RecordingPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        for phase in [
            Phase::RunStart,
            Phase::StepStart,
            Phase::BeforeInference,
            Phase::AfterInference,
            Phase::BeforeToolExecute,
            Phase::AfterToolExecute,
            Phase::StepEnd,
            Phase::RunEnd,
        ] {
            r.register_hook(
                phase,
                Arc::new(Recorder {
                    label: self.label,
                    log: self.log.clone(),
                }),
            );
        }
        Ok(())
    }
}

#[tokio::test]
async fn hooks_run_in_phase_order_and_in_plugin_ids_order() {
    let log: Log = Arc::default();
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})),
        ScriptedResponse::text("done"),
    ]);
    let runtime = builder_with(model, spec().with_plugin_id("b").with_plugin_id("a"))
        .with_plugin(
            "a",
            Arc::new(RecordingPlugin {
                label: "a",
                log: log.clone(),
            }),
        )
        .with_plugin(
            "b",
            Arc::new(RecordingPlugin {
                label: "b",
                log: log.clone(),
            }),
        )
        .with_plugin(
            "unlisted",
            Arc::new(RecordingPlugin {
                label: "x",
                log: log.clone(),
            }),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "go")).await.unwrap();
    let expected: Vec<String> = [
        "run_start:0",
        "step_start:1",
        "before_inference:1",
        "after_inference:1",
        "before_tool_execute:1",
        "after_tool_execute:1",
        "step_end:1",
        "step_start:2",
        "before_inference:2",
        "after_inference:2",
        "step_end:2",
        "run_end:2",
    ]
    .iter()
    .flat_map(|p| {
        let (phase, step) = p.split_once(':').unwrap();
        ["b", "a"].map(|l| format!("{l}:{phase}:{step}"))
    })
    .collect();
    assert_eq!(*log.lock().unwrap(), expected);
}

struct Visits;
impl StateKey for Visits {
    const KEY: &'static str = "test.visits";
    type Value = Vec<u32>;
}

/// Records each step in typed state and stops the run at step 2 from RunEnd's view.
struct CountingPlugin {
    seen_at_end: Arc<Mutex<Vec<u32>>>,
}

struct CountStep;
#[async_trait::async_trait]
impl PhaseHook for CountStep {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let step = ctx.step();
        ctx.state_mut::<Visits>()?.push(step);
        Ok(())
    }
}

struct ReadAtEnd(Arc<Mutex<Vec<u32>>>);
#[async_trait::async_trait]
impl PhaseHook for ReadAtEnd {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        *self.0.lock().unwrap() = ctx.state::<Visits>()?.clone();
        Ok(())
    }
}

impl Plugin for CountingPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_key::<Visits>()?;
        r.register_hook(Phase::StepStart, Arc::new(CountStep));
        r.register_hook(Phase::RunEnd, Arc::new(ReadAtEnd(self.seen_at_end.clone())));
        Ok(())
    }
}

#[tokio::test]
async fn typed_state_is_per_run_and_starts_at_default() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({})),
        ScriptedResponse::text("done"),
    ])
    .repeat_last();
    let runtime = builder_with(model, spec().with_plugin_id("count"))
        .with_plugin(
            "count",
            Arc::new(CountingPlugin {
                seen_at_end: seen.clone(),
            }),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "one")).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [1, 2]);
    runtime.run_to_completion(user("t", "two")).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [1],
        "a new run starts from the default value"
    );
}

struct UnregisteredReader;
#[async_trait::async_trait]
impl PhaseHook for UnregisteredReader {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        ctx.state::<Visits>()?;
        Ok(())
    }
}

struct HookOnly<H: PhaseHook + Clone + 'static>(Phase, H);
impl<H: PhaseHook + Clone + 'static> Plugin for HookOnly<H> {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(self.0, Arc::new(self.1.clone()));
        Ok(())
    }
}

#[derive(Clone)]
struct Fails;
#[async_trait::async_trait]
impl PhaseHook for Fails {
    async fn run(&self, _ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        Err(HookError::new("quota service unreachable"))
    }
}

#[derive(Clone)]
struct Panics;
#[async_trait::async_trait]
impl PhaseHook for Panics {
    async fn run(&self, _ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        panic!("hook bug")
    }
}

#[tokio::test]
async fn a_failing_hook_ends_the_run_with_an_error_naming_plugin_and_phase() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("echo", json!({}))]);
    let runtime = builder_with(model, spec().with_plugin_id("quota"))
        .with_plugin("quota", Arc::new(HookOnly(Phase::AfterInference, Fails)))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::Error("hook quota at after_inference: quota service unreachable".into())
    );
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(
        tool_results(&history)[0].1,
        "not run: the run ended with an error — not_started: the call never began, so it had no effect"
    );
}

#[tokio::test]
async fn a_panicking_hook_ends_the_run_with_an_error_and_releases_the_thread() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]).repeat_last();
    let runtime = builder_with(model, spec().with_plugin_id("buggy"))
        .with_plugin("buggy", Arc::new(HookOnly(Phase::StepStart, Panics)))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::Error("hook buggy at step_start: panicked: hook bug".into())
    );
    assert!(!runtime.is_thread_active("t"));
}

#[derive(Clone)]
struct ReadsUnregistered;
#[async_trait::async_trait]
impl PhaseHook for ReadsUnregistered {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        UnregisteredReader.run(ctx).await
    }
}

#[tokio::test]
async fn reading_a_key_no_listed_plugin_owns_is_an_unknown_key_error() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]);
    let runtime = builder_with(model, spec().with_plugin_id("reader"))
        .with_plugin(
            "reader",
            Arc::new(HookOnly(Phase::RunStart, ReadsUnregistered)),
        )
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::Error(
            "hook reader at run_start: state key \"test.visits\" is not registered for this agent; list the plugin that owns it in plugin_ids".into()
        )
    );
}

#[derive(Clone)]
struct StopBeforeTools;
#[async_trait::async_trait]
impl PhaseHook for StopBeforeTools {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.inference().is_some_and(|r| !r.tool_calls.is_empty()) {
            ctx.request_termination(TerminationReason::stopped("policy", "no tools today"));
            ctx.request_termination(TerminationReason::stopped(
                "ignored",
                "the first request wins",
            ));
        }
        Ok(())
    }
}

#[tokio::test]
async fn request_termination_keeps_the_text_and_answers_unrun_calls() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text("I will call two tools")
            .with_tool_call("echo", json!({}))
            .with_tool_call("echo", json!({"n": 2})),
    ]);
    let runtime = builder_with(model, spec().with_plugin_id("guard"))
        .with_plugin(
            "guard",
            Arc::new(HookOnly(Phase::AfterInference, StopBeforeTools)),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::stopped("policy", "no tools today")
    );
    assert_eq!(result.response, "I will call two tools");
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    assert_eq!(history[1].content, "I will call two tools");
    let results = tool_results(&history);
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| r.1 == "not run: the run was stopped (policy) — not_started: the call never began, so it had no effect")
    );
    assert!(
        !sink
            .events()
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
    );
}

#[derive(Clone)]
struct NudgeOnce;
#[async_trait::async_trait]
impl PhaseHook for NudgeOnce {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.step() == 1 {
            ctx.push_user_message("please double-check");
            ctx.request_another_round();
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_nudge_joins_the_history_before_the_next_inference_and_another_round_overrides_the_end() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        log.lock()
            .unwrap()
            .push(req.messages.last().unwrap().content.clone());
        ScriptedResponse::text(format!("answer {}", req.messages.len()))
    });
    let runtime = builder_with(model, spec().with_plugin_id("nudge"))
        .with_plugin(
            "nudge",
            Arc::new(HookOnly(Phase::AfterInference, NudgeOnce)),
        )
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.steps, 2);
    assert_eq!(*seen.lock().unwrap(), ["go", "please double-check"]);
    let texts: Vec<String> = runtime
        .thread_messages("t")
        .await
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["go", "answer 1", "please double-check", "answer 3"]);
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Nudge { text, .. } if text == "please double-check"))
    );
}

struct ToolPlugin;
impl Plugin for ToolPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_tool("plugin_echo", Arc::new(Echo("plugin_echo")));
        Ok(())
    }
}

#[tokio::test]
async fn a_plugins_tools_serve_only_the_agents_that_list_it() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let model = ScriptedExecutor::from_fn(move |req| {
        let mut names: Vec<String> = req.tools.iter().map(|t| t.name.clone()).collect();
        names.sort();
        log.lock().unwrap().push(names);
        ScriptedResponse::text("ok")
    });
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("with")
                .with_model_id("m")
                .with_plugin_id("tools"),
        )
        .with_agent_spec(AgentSpec::new("without").with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model))
        .with_plugin("tools", Arc::new(ToolPlugin))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    runtime
        .run_to_completion(user("a", "go").with_agent_id("with"))
        .await
        .unwrap();
    runtime
        .run_to_completion(user("b", "go").with_agent_id("without"))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            vec!["echo".to_owned(), "plugin_echo".to_owned()],
            vec!["echo".to_owned()]
        ]
    );
}

#[derive(Clone)]
struct StopAtFirstCall;
#[async_trait::async_trait]
impl PhaseHook for StopAtFirstCall {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        ctx.request_termination(TerminationReason::stopped("policy", "no tools"));
        Ok(())
    }
}

#[derive(Clone)]
struct FailAtSecondCall;
#[async_trait::async_trait]
impl PhaseHook for FailAtSecondCall {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.tool_call().is_some_and(|c| c.arguments["n"] == 2) {
            return Err(HookError::new("refused"));
        }
        Ok(())
    }
}

fn two_calls() -> ScriptedExecutor {
    ScriptedExecutor::new(vec![ScriptedResponse::tool_calls(vec![
        ("echo", json!({"n": 1})),
        ("echo", json!({"n": 2})),
    ])])
}

#[tokio::test]
async fn a_stop_before_the_first_call_answers_every_call_in_the_stored_history() {
    let runtime = builder_with(two_calls(), spec().with_plugin_id("gate"))
        .with_plugin(
            "gate",
            Arc::new(HookOnly(Phase::BeforeToolExecute, StopAtFirstCall)),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("policy", "no tools")
    );
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let results = tool_results(&history);
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| r.1 == "not run: the run was stopped (policy) — not_started: the call never began, so it had no effect"),
        "{results:?}"
    );
    assert!(
        !sink
            .events()
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
    );
}

#[tokio::test]
async fn every_started_tool_call_also_finishes_when_a_later_hook_fails() {
    let runtime = builder_with(two_calls(), spec().with_plugin_id("gate"))
        .with_plugin(
            "gate",
            Arc::new(HookOnly(Phase::BeforeToolExecute, FailAtSecondCall)),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::Error("hook gate at before_tool_execute: refused".into())
    );
    let events = sink.events();
    let started = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
        .count();
    let finished = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolCallFinished { .. }))
        .count();
    assert_eq!(started, finished);
    assert_history_valid(&runtime.thread_messages("t").await);
}
