//! W13: tool approvals. How long from a decision to the held call's start
//! (in one process; and across processes on PostgreSQL, told by NOTIFY or
//! found by the scan when the notification is lost), and what a parked
//! run keeps in memory.
//!
//! The agent is the workloads' (system prompt, `noop` with its schema,
//! `max_rounds` 1000) with one rule: `ask` before `noop`. Its model calls
//! `noop` once, then answers "done".

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rein::approvals::{ApprovalAction, ApprovalRule, Decision};
use rein::prelude::*;

use crate::{NOT_AS_DEFINED, as_defined, emit, fail, percentile, sorted, spec, status_kb, user};

/// `noop`, noting when it starts.
struct Timed(Arc<Mutex<Option<Instant>>>);

#[async_trait::async_trait]
impl Tool for Timed {
    fn descriptor(&self) -> ToolDescriptor {
        crate::Noop.descriptor()
    }
    async fn execute(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        crate::Noop.execute(args, ctx).await
    }
}

/// The model: one `noop` call, then "done".
fn once() -> ScriptedExecutor {
    ScriptedExecutor::from_fn(|req| {
        if !as_defined(req) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        let response = if crate::tool_results_since_user(req) == 0 {
            ScriptedResponse::tool_call("noop", serde_json::json!({ "i": 0 }))
        } else {
            ScriptedResponse::text("done")
        };
        response.with_usage(10, 5)
    })
}

fn gated(started: Arc<Mutex<Option<Instant>>>) -> AgentRuntime {
    let built = AgentRuntimeBuilder::new()
        .with_agent_spec(
            spec()
                .with_model_id("m")
                .with_approval(ApprovalRule::new("noop", ApprovalAction::Ask)),
        )
        .with_model(ModelSpec::new("m", "p", "bench"))
        .with_provider("p", Arc::new(once()))
        .with_tool("noop", Arc::new(Timed(started)))
        .build();
    built.unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")))
}

/// Waits (yielding) until `runtime` has `n` pending calls.
async fn parked(runtime: &AgentRuntime, n: usize) -> Vec<rein::approvals::PendingApproval> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = runtime.pending_approvals(None);
        if pending.len() >= n {
            return pending;
        }
        if Instant::now() > deadline {
            fail(&format!("only {} of {n} runs parked", pending.len()));
        }
        tokio::task::yield_now().await;
    }
}

/// W13a: `runs` runs one at a time, each parked then approved; the time
/// from `decide` to the held call's start.
pub(crate) async fn decision_to_tool(runs: usize) {
    let started = Arc::new(Mutex::new(None));
    let runtime = gated(started.clone());
    let mut micros = Vec::with_capacity(runs);
    for i in 0..runs {
        *started.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let run = tokio::spawn({
            let runtime = runtime.clone();
            async move { runtime.run_to_completion(user(format!("w13-{i}"))).await }
        });
        let pending = parked(&runtime, 1).await;
        let at = Instant::now();
        if let Err(e) = runtime.decide(&pending[0].run_id, &pending[0].call_id, Decision::Approve) {
            fail(&format!("decide: {e}"));
        }
        match run.await {
            Ok(Ok(r)) if r.termination == TerminationReason::NaturalEnd && r.steps == 2 => {}
            other => fail(&format!("approval: unexpected result {other:?}")),
        }
        let tool = started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or_else(|| fail("the approved call never started"));
        micros.push(tool.duration_since(at).as_secs_f64() * 1e6);
    }
    let s = sorted(micros);
    emit("approval_resume", "p50", percentile(&s, 0.5), "us");
    emit("approval_resume", "p99", percentile(&s, 0.99), "us");
}

/// W13c: `runs` runs parked at once; the memory each keeps (RSS added
/// per parked run, after the parks, before any decision).
pub(crate) async fn parked_memory(runs: usize) {
    let started = Arc::new(Mutex::new(None));
    let runtime = gated(started);
    let rss_before = status_kb("VmRSS:");
    let tasks: Vec<_> = (0..runs)
        .map(|i| {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.run_to_completion(user(format!("w13m-{i}"))).await })
        })
        .collect();
    let pending = parked(&runtime, runs).await;
    let rss_parked = status_kb("VmRSS:");
    emit(
        "approval_parked_memory",
        "rss_per_parked_run",
        (rss_parked - rss_before) * 1024.0 / runs as f64,
        "bytes",
    );
    for p in pending {
        let _ = runtime.decide(&p.run_id, &p.call_id, Decision::Approve);
    }
    for task in tasks {
        match task.await {
            Ok(Ok(r)) if r.termination == TerminationReason::NaturalEnd => {}
            other => fail(&format!("approval memory: unexpected result {other:?}")),
        }
    }
}
