//! `cancel_and_wait_by_thread` returns `true` iff a run was active and
//! released its thread within the bound; `false` at once without a run, at
//! the bound for a run that will not let go, and at once from inside the run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use rein::prelude::*;
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn without_a_run_it_returns_false_at_once() {
    let runtime = builder_with(ScriptedExecutor::new(vec![]), spec())
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    assert!(!runtime.cancel_and_wait_by_thread("nobody").await);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(!runtime.cancel_by_thread("nobody"));
    assert!(!runtime.cancel_run("run-404"));
}

#[tokio::test]
async fn with_a_run_it_returns_true_once_the_thread_is_free() {
    for respect_token in [true, false] {
        let gate = Gate::new(respect_token);
        let (entered, exits) = (gate.entered.clone(), gate.exits.clone());
        let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]);
        let runtime = builder_with(model, spec())
            .with_tool("gate", Arc::new(gate))
            .build()
            .unwrap();
        let sink = Arc::new(CollectingSink::new());
        let run = tokio::spawn({
            let (runtime, sink) = (runtime.clone(), sink.clone());
            async move { runtime.run(user("t", "go"), sink).await }
        });
        entered.notified().await;
        assert!(runtime.cancel_and_wait_by_thread("t").await);
        // Everything the contract promises holds the moment it returns.
        assert!(!runtime.is_thread_active("t"));
        assert_eq!(
            exits.load(Ordering::SeqCst),
            1,
            "the tool future completed or was dropped"
        );
        assert_one_run_finished_last(&sink.events());
        assert_history_valid(&runtime.thread_messages("t").await);
        let r = run.await.unwrap().unwrap();
        assert_eq!(r.termination, TerminationReason::Cancelled);
        assert_eq!(r.cancel_cause, Some(CancelCause::Requested));
    }
}

/// A `RunEnd` hook that takes ten seconds, ignoring cancellation.
#[derive(Clone)]
struct SlowCleanup;
#[async_trait::async_trait]
impl PhaseHook for SlowCleanup {
    async fn run(&self, _ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok(())
    }
}
struct SlowCleanupPlugin;
impl Plugin for SlowCleanupPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::RunEnd, Arc::new(SlowCleanup));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_that_outlasts_the_bound_gives_false_at_the_bound_and_still_ends_cancelled() {
    let gate = Gate::new(true);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]);
    let runtime = builder_with(model, spec().with_plugin_id("slow"))
        .with_plugin("slow", Arc::new(SlowCleanupPlugin))
        .with_tool("gate", Arc::new(gate))
        .with_cancel_wait_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.run_to_completion(user("t", "go")).await }
    });
    entered.notified().await;
    let start = tokio::time::Instant::now();
    assert!(!runtime.cancel_and_wait_by_thread("t").await);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(runtime.is_thread_active("t"));
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

/// A tool that cancels and waits on its own thread.
struct SelfCanceller {
    runtime: std::sync::OnceLock<AgentRuntime>,
    answered: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl Tool for SelfCanceller {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("self_cancel", "cancels its own run")
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let runtime = self.runtime.get().unwrap();
        let waited = runtime.cancel_and_wait_by_thread(&ctx.thread_id).await;
        assert!(!waited, "a run cannot wait for itself");
        self.answered.store(true, Ordering::SeqCst);
        Ok(ToolOutput::text("cancelled myself"))
    }
}

#[tokio::test(start_paused = true)]
async fn called_from_inside_the_run_it_cancels_and_returns_false_without_deadlock() {
    let answered = Arc::new(AtomicBool::new(false));
    let tool = Arc::new(SelfCanceller {
        runtime: std::sync::OnceLock::new(),
        answered: answered.clone(),
    });
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("self_cancel", json!({}))]);
    let runtime = builder_with(model, spec())
        .with_tool("self_cancel", tool.clone())
        .build()
        .unwrap();
    tool.runtime.set(runtime.clone()).unwrap();
    let start = tokio::time::Instant::now();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait for the bound");
    assert!(answered.load(Ordering::SeqCst));
    assert_eq!(r.termination, TerminationReason::Cancelled);
}

/// A hook that cancels and waits on its own thread at the first step.
#[derive(Clone)]
struct HookSelfCanceller(Arc<std::sync::OnceLock<AgentRuntime>>);
#[async_trait::async_trait]
impl PhaseHook for HookSelfCanceller {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let waited = self
            .0
            .get()
            .unwrap()
            .cancel_and_wait_by_thread(ctx.thread_id())
            .await;
        if waited {
            return Err(HookError::new("waited for itself"));
        }
        Ok(())
    }
}
struct HookSelfCancelPlugin(HookSelfCanceller);
impl Plugin for HookSelfCancelPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::StepStart, Arc::new(self.0.clone()));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn called_from_a_hook_of_the_run_it_does_not_deadlock_either() {
    let cell = Arc::new(std::sync::OnceLock::new());
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text("never")]);
    let runtime = builder_with(model, spec().with_plugin_id("h"))
        .with_plugin(
            "h",
            Arc::new(HookSelfCancelPlugin(HookSelfCanceller(cell.clone()))),
        )
        .build()
        .unwrap();
    cell.set(runtime.clone()).unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert_eq!(r.steps, 1);
}
