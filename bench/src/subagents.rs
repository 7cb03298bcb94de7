//! W12 and W12b: sub-agents. W12 cancels a whole tree of runs in flight;
//! W12b measures what a sub-agent call costs beyond a plain tool call.
//!
//! The agents here follow the workloads' rules (a system prompt,
//! `max_rounds` 1000, stateless models, every request checked) but their
//! tools are sub-agents (`{"task": string}`) instead of `noop`, except for
//! W12b's baseline, which is W1's agent. The models are
//! `ScriptedExecutor::from_fn` (usage 10 in / 5 out), except for W12's
//! leaves, which stream without end ([`Endless`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rein::contract::inference::{InferenceDelta, InferenceRequest, InferenceStream};
use rein::prelude::*;

use crate::{
    NOT_AS_DEFINED, SYSTEM_PROMPT, emit, fail, model, percentile, runtime_with, sorted, spec,
    tool_results_since_user, user,
};

/// W12's fan-out: each run above the leaves calls this many sub-agents in
/// one round.
const FAN_OUT: usize = 4;

/// W12's leaves: `FAN_OUT²` (root → 4 mids → 16 leaves).
const LEAVES: usize = FAN_OUT * FAN_OUT;

/// W12's runs: the root, its 4 children and their 16 children.
const RUNS: usize = 1 + FAN_OUT + LEAVES;

/// Whether the request carries the system prompt and exactly the tools
/// `tools`, each a sub-agent's `{"task": string}`.
fn as_defined(req: &InferenceRequest, tools: &[&str]) -> bool {
    req.system.is_some()
        && req.tools.len() == tools.len()
        && req
            .tools
            .iter()
            .zip(tools)
            .all(|(t, name)| t.name == *name && t.parameters["required"][0] == "task")
}

/// An agent that, with no tool result since the user's message, calls
/// sub-agent `tool` `calls` times in one answer, and answers "done" after.
fn caller(tool: &'static str, calls: usize) -> Arc<dyn LlmExecutor> {
    Arc::new(ScriptedExecutor::from_fn(move |req| {
        if !as_defined(req, &[tool]) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        let response = if tool_results_since_user(req) == 0 {
            ScriptedResponse::tool_calls(
                (0..calls)
                    .map(|k| (tool, serde_json::json!({ "task": format!("part {k}") })))
                    .collect(),
            )
        } else {
            ScriptedResponse::text("done")
        };
        response.with_usage(10, 5)
    }))
}

/// An agent without tools that answers `response`.
fn answerer(response: ScriptedResponse) -> Arc<dyn LlmExecutor> {
    Arc::new(ScriptedExecutor::from_fn(move |req| {
        if !as_defined(req, &[]) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        response.clone()
    }))
}

/// W12's leaf model: an answer that never ends, one word every
/// `chunk_delay`, made as it is sent (as a provider's stream is; the
/// scripted executor would build all of a long answer's chunks up front,
/// and dropping them would be part of the cancel).
struct Endless {
    chunk_delay: Duration,
}

#[async_trait::async_trait]
impl LlmExecutor for Endless {
    async fn open(&self, req: &InferenceRequest) -> Result<InferenceStream, InferenceError> {
        if !as_defined(req, &[]) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        let delay = self.chunk_delay;
        let words = futures::stream::unfold(true, move |first| async move {
            if !first {
                tokio::time::sleep(delay).await;
            }
            let word = InferenceDelta::Text {
                text: "word ".to_owned(),
            };
            Some((Ok(word), false))
        });
        Ok(words.boxed())
    }
}

/// The workloads' agent `id`: the system prompt and `max_rounds` 1000.
fn agent(id: &str) -> AgentSpec {
    AgentSpec::new(id)
        .with_system_prompt(SYSTEM_PROMPT)
        .with_max_rounds(1000)
}

/// A runtime whose agents each run on their own provider.
fn tree_runtime(agents: Vec<(AgentSpec, Arc<dyn LlmExecutor>)>) -> AgentRuntime {
    let mut builder = AgentRuntimeBuilder::new();
    for (spec, executor) in agents {
        let id = spec.id.clone();
        builder = builder
            .with_agent_spec(spec.with_model_id(format!("m-{id}")))
            .with_model(ModelSpec::new(
                format!("m-{id}"),
                format!("p-{id}"),
                "bench",
            ))
            .with_provider(format!("p-{id}"), executor);
    }
    builder
        .build()
        .unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// W12's sink, one per tree: which runs have streamed text, and when the
/// last of the tree's runs finished.
#[derive(Default)]
struct TreeSink {
    streaming: Mutex<HashSet<String>>,
    all_streaming: tokio::sync::Notify,
    finished: AtomicUsize,
    all_finished: Mutex<Option<Instant>>,
}

impl TreeSink {
    fn run_finished(&self) {
        if self.finished.fetch_add(1, Ordering::SeqCst) + 1 == RUNS {
            *lock(&self.all_finished) = Some(Instant::now());
        }
    }
}

impl EventSink for TreeSink {
    fn emit(&self, event: AgentEvent) {
        match event {
            AgentEvent::TextDelta { run_id, .. } => {
                let mut streaming = lock(&self.streaming);
                if !streaming.contains(&run_id) {
                    streaming.insert(run_id);
                    if streaming.len() == LEAVES {
                        self.all_streaming.notify_one();
                    }
                }
            }
            AgentEvent::RunFinished { .. } => self.run_finished(),
            _ => {}
        }
    }
}

/// W12: `trees` trees of depth 3 and fan-out 4 (the root calls 4 `mid`s in
/// one round, each calls 4 `leaf`s: 21 runs), on one runtime, one tree at
/// a time. Once all 16 leaves stream (a word every `chunk_delay`), the
/// root's thread is cancelled: the latency of `cancel_and_wait_by_thread`,
/// and the time until the last of the 21 runs emitted `run_finished`.
pub(crate) async fn cancel(trees: usize, chunk_delay: Duration) {
    const NAME: &str = "subagent_cancel";
    let runtime = tree_runtime(vec![
        (
            agent("root").with_subagent(SubagentSpec::new("mid")),
            caller("mid", FAN_OUT),
        ),
        (
            agent("mid").with_subagent(SubagentSpec::new("leaf")),
            caller("leaf", FAN_OUT),
        ),
        (agent("leaf"), Arc::new(Endless { chunk_delay })),
    ]);
    let mut cancel_us = Vec::with_capacity(trees);
    let mut finished_us = Vec::with_capacity(trees);
    for i in 0..trees {
        let thread = format!("w12-{i}");
        let sink = Arc::new(TreeSink::default());
        let run = tokio::spawn({
            let runtime = runtime.clone();
            let request = user(thread.clone()).with_agent_id("root");
            let sink = sink.clone();
            async move { runtime.run(request, sink).await }
        });
        sink.all_streaming.notified().await;
        if sink.finished.load(Ordering::SeqCst) != 0 {
            fail(&format!("{NAME}: tree {i}: a run ended before the cancel"));
        }
        let start = Instant::now();
        let released = runtime.cancel_and_wait_by_thread(&thread).await;
        let returned = start.elapsed();
        let finished = sink.finished.load(Ordering::SeqCst);
        let last = *lock(&sink.all_finished);
        match (released, last) {
            (true, Some(last)) if finished == RUNS => {
                cancel_us.push(returned.as_secs_f64() * 1e6);
                finished_us.push(last.saturating_duration_since(start).as_secs_f64() * 1e6);
            }
            _ => fail(&format!(
                "{NAME}: tree {i}: released {released}, {finished} of {RUNS} runs finished when the cancel returned"
            )),
        }
        match run.await {
            Ok(Ok(r))
                if r.termination == TerminationReason::Cancelled
                    && r.report.children.len() == FAN_OUT
                    && r.report.children.iter().all(|c| c.code == "cancelled") => {}
            other => fail(&format!("{NAME}: tree {i}: unexpected result {other:?}")),
        }
    }
    let c = sorted(cancel_us);
    let f = sorted(finished_us);
    emit(NAME, "cancel_p50", percentile(&c, 0.5), "us");
    emit(NAME, "cancel_p99", percentile(&c, 0.99), "us");
    emit(NAME, "cancel_max", percentile(&c, 1.0), "us");
    emit(NAME, "all_finished_p50", percentile(&f, 0.5), "us");
    emit(NAME, "all_finished_p99", percentile(&f, 0.99), "us");
    emit(NAME, "all_finished_max", percentile(&f, 1.0), "us");
}

/// W12b: µs per call of a run of `R` rounds, one call a round, median of
/// `runs` runs each: W1's run (the `noop` tool) and the same with a
/// sub-agent (a `child` whose model answers "done" at once) instead,
/// alternating run by run on two runtimes in this process. For
/// reference, before each pair, `R` runs of one inference and no tool
/// call (what a child is), each timed alone.
pub(crate) async fn overhead(runs: usize) {
    const NAME: &str = "subagent_overhead";
    const R: usize = 50;
    let plain = runtime_with(model(R, None), spec());
    // A run like the child's (one inference, no tool call), for reference.
    let single = runtime_with(model(0, None), spec());
    let parent = ScriptedExecutor::from_fn(|req| {
        if !as_defined(req, &["child"]) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        let k = tool_results_since_user(req);
        let response = if k < R {
            ScriptedResponse::tool_call("child", serde_json::json!({ "task": format!("step {k}") }))
        } else {
            ScriptedResponse::text("done")
        };
        response.with_usage(10, 5)
    });
    let nested = tree_runtime(vec![
        (
            agent("parent").with_subagent(SubagentSpec::new("child")),
            Arc::new(parent),
        ),
        (
            agent("child"),
            answerer(ScriptedResponse::text("done").with_usage(10, 5)),
        ),
    ]);
    let (mut plain_us, mut nested_us, mut diff_us, mut single_us) = (
        Vec::with_capacity(runs),
        Vec::with_capacity(runs),
        Vec::with_capacity(runs),
        Vec::with_capacity(runs * R),
    );
    for i in 0..runs {
        for k in 0..R {
            let start = Instant::now();
            let result = single
                .run_to_completion(user(format!("w12b-single-{i}-{k}")))
                .await;
            single_us.push(start.elapsed().as_secs_f64() * 1e6);
            match result {
                Ok(r) if r.termination == TerminationReason::NaturalEnd && r.steps == 1 => {}
                other => fail(&format!(
                    "{NAME}: single run {i}: unexpected result {other:?}"
                )),
            }
        }
        let start = Instant::now();
        let result = plain
            .run_to_completion(user(format!("w12b-plain-{i}")))
            .await;
        let p = start.elapsed().as_secs_f64() * 1e6 / R as f64;
        match result {
            Ok(r)
                if r.termination == TerminationReason::NaturalEnd && r.steps as usize == R + 1 => {}
            other => fail(&format!(
                "{NAME}: plain run {i}: unexpected result {other:?}"
            )),
        }
        let start = Instant::now();
        let result = nested
            .run_to_completion(user(format!("w12b-{i}")).with_agent_id("parent"))
            .await;
        let n = start.elapsed().as_secs_f64() * 1e6 / R as f64;
        match result {
            Ok(r)
                if r.termination == TerminationReason::NaturalEnd
                    && r.steps as usize == R + 1
                    && r.report.children.len() == R
                    && r.usage.total() == 15 * (2 * R as u64 + 1) => {}
            other => fail(&format!(
                "{NAME}: sub-agent run {i}: unexpected result {other:?}"
            )),
        }
        plain_us.push(p);
        nested_us.push(n);
        diff_us.push(n - p);
    }
    let p = sorted(plain_us);
    let n = sorted(nested_us);
    let d = sorted(diff_us);
    let s = sorted(single_us);
    let (p50, n50) = (percentile(&p, 0.5), percentile(&n, 0.5));
    emit(NAME, "plain_per_call", p50, "us");
    emit(NAME, "subagent_per_call", n50, "us");
    emit(NAME, "overhead_per_call", percentile(&d, 0.5), "us");
    emit(NAME, "ratio", n50 / p50, "x");
    emit(NAME, "one_inference_run", percentile(&s, 0.5), "us");
}
