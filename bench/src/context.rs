//! W11: what the context policy costs a round on a long thread.

use std::sync::Arc;
use std::time::Instant;

use rein::context::ContextPolicy;
use rein::prelude::*;
use rein::thread_store::{InMemoryThreadStore, ThreadStore};

use crate::{Noop, emit, fail, model, percentile, sorted, spec, user};

/// A thread of 1 000 messages: 250 times a call, its 400-character
/// result, an answer and the next question.
fn long_history() -> Vec<Message> {
    let mut history = Vec::with_capacity(1000);
    for i in 0..250 {
        let id = format!("old-{i}");
        history.push(Message::assistant_with_tools(
            "",
            vec![ToolCall::new(&id, "noop", serde_json::json!({ "i": i }))],
        ));
        history.push(Message::tool(&id, format!("result {i} ").repeat(40)));
        history.push(Message::assistant(format!(
            "answer {i}: all is well so far"
        )));
        history.push(Message::user(format!("question {}: and then?", i + 1)));
    }
    history
}

fn runtime(
    policy: Option<ContextPolicy>,
    rounds: usize,
    store: Arc<InMemoryThreadStore>,
) -> AgentRuntime {
    let mut agent = spec();
    if let Some(policy) = policy {
        agent = agent.with_context(policy);
    }
    AgentRuntimeBuilder::new()
        .with_agent_spec(agent.with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "bench"))
        .with_provider("p", Arc::new(model(rounds, None)))
        .with_tool("noop", Arc::new(Noop))
        .with_thread_store(store)
        .build()
        .unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")))
}

/// Microseconds per round of `runs` runs of `rounds` rounds, each on a
/// fresh copy of the long thread.
async fn per_round(policy: Option<ContextPolicy>, rounds: usize, runs: usize) -> Vec<f64> {
    let store = Arc::new(InMemoryThreadStore::new());
    let runtime = runtime(policy, rounds, store.clone());
    let history = long_history();
    let mut out = Vec::with_capacity(runs);
    for i in 0..runs {
        let thread = format!("w11-{i}");
        if let Err(e) = store.append(&thread, &history).await {
            fail(&e.to_string());
        }
        let start = Instant::now();
        let result = runtime.run_to_completion(user(thread)).await;
        let elapsed = start.elapsed();
        match result {
            Ok(r) if r.termination == TerminationReason::NaturalEnd => {}
            other => fail(&format!("context: unexpected result {other:?}")),
        }
        out.push(elapsed.as_secs_f64() * 1e6 / (rounds + 1) as f64);
    }
    out
}

/// W11: rounds on a 1 000-message thread without a policy and with one
/// under its thresholds (the policy's cost per round is the difference),
/// and one-round runs whose first round compacts (the cost of one
/// compaction of 250 results is the difference to one that does not).
pub(crate) async fn rounds(runs: usize) {
    const R: usize = 50;
    let quiet = ContextPolicy::new(10_000_000)
        .with_offload(100_000)
        .with_compact(0.9, 2);
    let without = sorted(per_round(None, R, runs).await);
    let with = sorted(per_round(Some(quiet.clone()), R, runs).await);
    let (a, b) = (percentile(&without, 0.5), percentile(&with, 0.5));
    emit("context", "per_round_without_policy", a, "us");
    emit("context", "per_round_with_policy", b, "us");
    emit("context", "policy_cost_per_round", b - a, "us");
    // A window this small is over `compact.at` from the first round.
    let compacting = ContextPolicy::new(10_000_000).with_compact(0.001, 1);
    let once = sorted(per_round(Some(compacting), 0, runs).await);
    let plain = sorted(per_round(Some(quiet), 0, runs).await);
    emit(
        "context",
        "one_compaction",
        percentile(&once, 0.5) - percentile(&plain, 0.5),
        "us",
    );
}
