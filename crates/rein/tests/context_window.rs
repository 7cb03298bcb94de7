//! The context policy, seen through the requests the model gets: what is
//! offloaded, compacted and summarized and when, calls and results kept in
//! pairs, the prefix stable between compactions, recovery from a
//! context-length error, and a token budget that refuses a call before it
//! is made.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_history_valid, builder_with, spec, user};
use rein::context::{ContextPolicy, SummarizePolicy, TokenCounter};
use rein::contract::event::AgentEvent;
use rein::contract::inference::{InferenceError, InferenceErrorKind, InferenceRequest};
use rein::prelude::*;
use rein::thread_store::{InMemoryThreadStore, ThreadStore};
use serde_json::{Value, json};

/// Returns `lines` numbered lines of about 40 characters.
struct Big(usize);

#[async_trait::async_trait]
impl Tool for Big {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("big", "returns a long listing")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let text: Vec<String> = (1..=self.0)
            .map(|i| format!("line {i:04}: the quick brown fox {}", i * 7))
            .collect();
        Ok(ToolOutput::text(text.join("\n")))
    }
}

type Seen = Arc<Mutex<Vec<InferenceRequest>>>;

/// An executor that records every request and answers with `answer(n,
/// request)`, `n` counting the agent's own requests from 0.
fn recording(
    answer: impl Fn(usize, &InferenceRequest) -> ScriptedResponse + Send + Sync + 'static,
) -> (ScriptedExecutor, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let executor = ScriptedExecutor::from_fn(move |request| {
        let mut log = log.lock().unwrap();
        log.push(request.clone());
        let n = log.len() - 1;
        drop(log);
        answer(n, request)
    });
    (executor, seen)
}

/// The listings a prompt holds whole (not as references).
fn whole_listings(request: &InferenceRequest) -> usize {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool && m.content.starts_with("line 0001"))
        .count()
}

/// A provider's context-length refusal.
fn too_long() -> ScriptedResponse {
    ScriptedResponse::error(InferenceError::new(
        InferenceErrorKind::ContextOverflow,
        "prompt is too long",
    ))
}

/// A model that reads a listing `calls` times, then answers, behind a
/// "provider" that refuses any prompt holding `max` whole listings.
fn refusing(max: usize, calls: usize) -> (ScriptedExecutor, Seen) {
    recording(move |n, request| {
        if whole_listings(request) >= max {
            too_long()
        } else if n < calls {
            ScriptedResponse::tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    })
}

fn is_reference(m: &Message) -> bool {
    m.role == Role::Tool && m.content.starts_with("[tool result offloaded to artifact")
}

async fn run(
    executor: ScriptedExecutor,
    agent: AgentSpec,
    store: Arc<InMemoryThreadStore>,
) -> (AgentRunResult, Vec<AgentEvent>) {
    let sink = Arc::new(CollectingSink::new());
    let runtime = builder_with(executor, agent)
        .with_tool("big", Arc::new(Big(200)))
        .with_thread_store(store)
        .build()
        .unwrap();
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    (result, sink.events())
}

/// [`run`] on a fresh store, with `policy` on the test agent.
async fn run_with(
    executor: ScriptedExecutor,
    policy: ContextPolicy,
) -> (AgentRunResult, Vec<AgentEvent>) {
    run(
        executor,
        spec().with_context(policy),
        Arc::new(InMemoryThreadStore::new()),
    )
    .await
}

#[tokio::test]
async fn a_large_result_reaches_the_model_as_a_reference_the_store_keeps_it_whole_and_read_artifact_reads_it()
 {
    let (executor, seen) = recording(|n, request| match n {
        0 => ScriptedResponse::tool_call("big", json!({})),
        1 => {
            let id = request
                .messages
                .iter()
                .find(|m| is_reference(m))
                .and_then(|m| m.tool_call_id.clone())
                .unwrap_or_default();
            ScriptedResponse::tool_call(
                "read_artifact",
                json!({"id": id, "contains": "line 01", "start_line": 100}),
            )
        }
        _ => ScriptedResponse::text("done"),
    });
    let policy = ContextPolicy::new(100_000).with_offload(200);
    let store = Arc::new(InMemoryThreadStore::new());
    let (result, _) = run(executor, spec().with_context(policy), store.clone()).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);

    let seen = seen.lock().unwrap().clone();
    assert!(
        seen[0].tools.iter().any(|t| t.name == "read_artifact"),
        "the agent gets read_artifact"
    );
    let reference = seen[1].messages.last().unwrap();
    assert!(is_reference(reference), "{reference:?}");
    assert!(
        reference.content.contains("200 lines"),
        "{}",
        reference.content
    );
    assert!(
        reference.content.contains("line 0001"),
        "a preview: {}",
        reference.content
    );
    assert!(reference.content.len() < 800, "{}", reference.content.len());

    // The model's read: lines 100.. containing "line 01" (100-199).
    let read = &seen[2].messages.last().unwrap().content;
    assert!(read.contains("100: line 0100"), "{read}");
    assert!(read.contains("199: line 0199"), "{read}");
    assert!(
        !read.contains("line 0099") && !read.contains("line 0200"),
        "{read}"
    );

    // The stored history keeps the full result.
    let history = store.load("t").await.unwrap();
    let full = history
        .iter()
        .find(|m| m.role == Role::Tool && m.content.starts_with("line 0001"))
        .expect("the full result is stored");
    assert_eq!(full.content.lines().count(), 200);
    assert_history_valid(&history);
}

#[tokio::test]
async fn over_compact_at_older_results_become_references_in_one_batch_and_pairs_stay_intact() {
    // Each `big` result is ~8 000 characters (~2 000 tokens at first).
    let (executor, seen) = recording(|n, _| {
        if n < 5 {
            ScriptedResponse::tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let policy = ContextPolicy::new(12_000).with_compact(0.5, 1);
    let store = Arc::new(InMemoryThreadStore::new());
    let (result, events) = run(executor, spec().with_context(policy), store.clone()).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);

    let compactions: Vec<(u64, u64, u32)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ContextCompacted {
                before_tokens,
                after_tokens,
                references,
                trigger,
                ..
            } => {
                assert_eq!(trigger, "threshold");
                Some((*before_tokens, *after_tokens, *references))
            }
            _ => None,
        })
        .collect();
    assert!(!compactions.is_empty(), "compaction happened");
    for (before, after, references) in &compactions {
        assert!(before > after && *references > 0, "{compactions:?}");
        assert!(*before as f64 > 0.5 * 12_000.0, "only over the threshold");
    }

    let seen = seen.lock().unwrap().clone();
    for (i, request) in seen.iter().enumerate() {
        assert_history_valid(&request.messages);
        // The last round's result is never a reference.
        let last_tool = request.messages.iter().rposition(|m| m.role == Role::Tool);
        if let Some(last) = last_tool {
            assert!(!is_reference(&request.messages[last]), "request {i}");
        }
    }
    // Between compactions the prefix is unchanged: each request extends
    // the one before, except where a compaction rewrote it.
    let rewrites = seen
        .windows(2)
        .filter(|w| !w[1].messages.starts_with(&w[0].messages))
        .count();
    assert_eq!(rewrites, compactions.len(), "one rewrite per compaction");
    // The last request is back under the threshold.
    let last = seen.last().unwrap();
    assert!(last.messages.iter().any(is_reference));
    assert_eq!(last.system, seen[0].system);
    assert_eq!(last.tools, seen[0].tools);

    // The store has every result in full.
    let history = store.load("t").await.unwrap();
    assert_eq!(
        history
            .iter()
            .filter(|m| m.role == Role::Tool && m.content.starts_with("line 0001"))
            .count(),
        5
    );
}

#[tokio::test]
async fn over_summarize_at_older_rounds_are_replaced_by_a_summary_counted_in_usage() {
    const SUMMARY: &str = "SUMMARY: five listings were read.";
    let long_thought = "thinking ".repeat(600); // ~5 400 characters
    let (executor, seen) = recording(move |n, request| {
        if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
            return ScriptedResponse::text(SUMMARY).with_usage(500, 20);
        }
        if n < 6 {
            // No usage reported: the estimate stays uncalibrated, so the
            // thresholds are crossed where the test expects.
            ScriptedResponse::text(long_thought.clone()).with_tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let policy = ContextPolicy::new(10_000)
        .with_offload(100)
        .with_compact(0.5, 1)
        .with_summarize(SummarizePolicy::new(0.6));
    let store = Arc::new(InMemoryThreadStore::new());
    let (result, events) = run(executor, spec().with_context(policy), store.clone()).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);

    let summaries: Vec<&AgentEvent> = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ContextSummarized { .. }))
        .collect();
    assert!(!summaries.is_empty(), "a summary was written");
    if let AgentEvent::ContextSummarized {
        before_tokens,
        after_tokens,
        usage,
        messages,
        ..
    } = summaries[0]
    {
        assert!(before_tokens > after_tokens);
        assert!(*messages >= 2);
        assert_eq!(*usage, Some(TokenUsage::new(500, 20)));
    }
    assert!(
        result.usage.input_tokens >= 500,
        "the summary's usage counts"
    );
    // Written from the full results (not their references), one summary
    // takes fewer rounds than the view would suggest: at most two passes.
    assert!(
        summaries.len() <= 2,
        "later rounds fit: {}",
        summaries.len()
    );

    let seen = seen.lock().unwrap().clone();
    let agent_requests: Vec<&InferenceRequest> = seen
        .iter()
        .filter(|r| r.system.as_deref() != Some(rein::context::DEFAULT_SUMMARY_PROMPT))
        .collect();
    let last = agent_requests.last().unwrap();
    assert!(
        last.messages[0].content.contains(SUMMARY),
        "{:?}",
        last.messages[0]
    );
    assert_history_valid(&last.messages);
    // The stored history has every round, not the summary.
    let history = store.load("t").await.unwrap();
    assert!(history.iter().all(|m| !m.content.contains(SUMMARY)));
    assert_eq!(
        history.iter().filter(|m| m.role == Role::Tool).count(),
        agent_requests.len() - 1,
        "every round's result is stored"
    );
}

#[tokio::test]
async fn a_context_length_error_is_answered_by_compacting_and_one_retry() {
    // The "provider" refuses any prompt holding two whole listings.
    let (executor, seen) = refusing(2, 3);
    let policy = ContextPolicy::new(1_000_000).with_compact(0.9, 3);
    let store = Arc::new(InMemoryThreadStore::new());
    let (result, events) = run(executor, spec().with_context(policy), store).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ContextCompacted { trigger, .. } if trigger == "overflow"
    )));
    let seen = seen.lock().unwrap().clone();
    let refused = seen
        .iter()
        .filter(|r| {
            r.messages
                .iter()
                .filter(|m| m.role == Role::Tool && m.content.starts_with("line 0001"))
                .count()
                >= 2
        })
        .count();
    assert_eq!(refused, 1, "one refused attempt; every later prompt fits");
}

#[tokio::test]
async fn an_overflow_that_cannot_be_reduced_stops_with_context_window_and_the_numbers() {
    let executor = ScriptedExecutor::new(vec![ScriptedResponse::error(InferenceError::new(
        InferenceErrorKind::ContextOverflow,
        "prompt is too long: 9000 tokens > 4096 maximum",
    ))])
    .repeat_last();
    let policy = ContextPolicy::new(4096).with_compact(0.7, 2);
    let (result, _) = run_with(executor, policy).await;
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "context_window");
            assert!(r.detail.contains("a window of 4096 tokens"), "{}", r.detail);
            assert!(r.detail.contains("9000 tokens > 4096"), "{}", r.detail);
        }
        other => panic!("expected context_window, got {other:?}"),
    }
}

#[tokio::test]
async fn the_token_budget_refuses_the_call_that_would_exceed_it_before_it_is_made() {
    let (executor, seen) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({})).with_usage(100, 10)
        } else {
            ScriptedResponse::text("done").with_usage(100, 10)
        }
    });
    let agent = spec().with_stop_condition(StopConditionSpec::TokenBudget { max_total: 1_000 });
    let (result, _) = run(executor, agent, Arc::new(InMemoryThreadStore::new())).await;
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "token_budget");
            assert!(r.detail.contains("was not sent"), "{}", r.detail);
            assert!(
                r.detail.contains("890 of the 1000-token budget remain"),
                "{}",
                r.detail
            );
            assert!(
                r.detail.contains("exceed the budget by about"),
                "{}",
                r.detail
            );
        }
        other => panic!("expected token_budget, got {other:?}"),
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "no call was made over the budget"
    );
    assert_eq!(result.usage.total(), 110, "no overshoot");
}

#[tokio::test]
async fn a_request_s_own_token_budget_refuses_before_spending_on_an_agent_without_one() {
    let (executor, seen) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({})).with_usage(100, 10)
        } else {
            ScriptedResponse::text("done").with_usage(100, 10)
        }
    });
    let runtime = builder_with(executor, spec())
        .with_tool("big", Arc::new(Big(200)))
        .build()
        .unwrap();
    let result = runtime
        .run(
            user("t", "go").with_token_budget(1_000),
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "token_budget");
            assert!(
                r.detail.contains("890 of the 1000-token budget remain"),
                "{}",
                r.detail
            );
        }
        other => panic!("expected token_budget, got {other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 1, "no call over the budget");
    // The same agent without a request budget answers.
    let result = runtime
        .run(user("u", "go"), Arc::new(CollectingSink::new()))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn the_smaller_of_the_agent_s_and_the_request_s_budget_holds() {
    let answer = |n: usize, _: &InferenceRequest| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({})).with_usage(100, 10)
        } else {
            ScriptedResponse::text("done").with_usage(100, 10)
        }
    };
    for (agent, request, remain) in [
        (1_000, 5_000, "890 of the 1000-token budget"),
        (5_000, 1_000, "890 of the 1000-token budget"),
    ] {
        let (executor, _) = recording(answer);
        let agent = spec().with_stop_condition(StopConditionSpec::TokenBudget { max_total: agent });
        let runtime = builder_with(executor, agent)
            .with_tool("big", Arc::new(Big(200)))
            .build()
            .unwrap();
        let result = runtime
            .run(
                user("t", "go").with_token_budget(request),
                Arc::new(CollectingSink::new()),
            )
            .await
            .unwrap();
        match &result.termination {
            TerminationReason::Stopped(r) => {
                assert_eq!(r.code, "token_budget");
                assert!(r.detail.contains(remain), "{}", r.detail);
            }
            other => panic!("expected token_budget, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn each_inference_of_a_measuring_run_reports_its_prompt_estimate_first() {
    let answer = |n: usize, _: &InferenceRequest| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({}))
        } else {
            ScriptedResponse::text("done")
        }
    };
    let (executor, seen) = recording(answer);
    let agent = spec().with_context(ContextPolicy::new(100_000));
    let (result, events) = run(executor, agent, Arc::new(InMemoryThreadStore::new())).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let estimates: Vec<(u32, u64, Option<u64>)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::PromptEstimated {
                step,
                estimated_tokens,
                window_tokens,
                ..
            } => Some((*step, *estimated_tokens, *window_tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(
        estimates.len(),
        seen.lock().unwrap().len(),
        "one per inference"
    );
    assert_eq!(estimates[0].0, 1);
    assert_eq!(estimates[1].0, 2);
    assert!(estimates.iter().all(|e| e.2 == Some(100_000)));
    // The second prompt holds the 200-line result: about 2 000 tokens more.
    assert!(estimates[1].1 > estimates[0].1 + 1_500, "{estimates:?}");
    // A run that measures nothing reports nothing.
    let (executor, _) = recording(answer);
    let (_, events) = run(executor, spec(), Arc::new(InMemoryThreadStore::new())).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, AgentEvent::PromptEstimated { .. }))
    );
}

#[tokio::test]
async fn without_a_policy_the_model_sees_the_history_itself() {
    let (executor, seen) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let (result, _) = run(executor, spec(), Arc::new(InMemoryThreadStore::new())).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0].tools.iter().all(|t| t.name != "read_artifact"));
    assert_eq!(
        seen[1].messages.last().unwrap().content.lines().count(),
        200
    );
}

#[tokio::test]
async fn prompt_cache_usage_is_summed_over_the_run_and_absent_when_never_reported() {
    let (executor, _) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({}))
                .with_usage(1000, 10)
                .with_cache_usage(0, 900)
        } else {
            ScriptedResponse::text("done")
                .with_usage(3000, 5)
                .with_cache_usage(900, 2000)
        }
    });
    let (result, events) = run(executor, spec(), Arc::new(InMemoryThreadStore::new())).await;
    assert_eq!(result.cache_usage, Some(CacheUsage::new(900, 2900)));
    let finished = events.iter().find_map(|e| match e {
        AgentEvent::RunFinished { cache_usage, .. } => Some(*cache_usage),
        _ => None,
    });
    assert_eq!(finished, Some(Some(CacheUsage::new(900, 2900))));

    let (executor, _) = recording(|_, _| ScriptedResponse::text("done").with_usage(10, 1));
    let (result, events) = run(executor, spec(), Arc::new(InMemoryThreadStore::new())).await;
    assert_eq!(result.cache_usage, None);
    let json = serde_json::to_value(events.last().unwrap()).unwrap();
    assert!(json.get("cache_usage").is_none(), "{json}");
}

#[tokio::test]
async fn a_thread_s_next_run_goes_on_from_the_summary_its_last_run_left() {
    let summaries = Arc::new(Mutex::new(Vec::new()));
    let log = summaries.clone();
    let (executor, seen) = recording(move |_, request| {
        if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
            log.lock().unwrap().push(request.messages[0].content.len());
            return ScriptedResponse::text("SUMMARY");
        }
        ScriptedResponse::text("ok")
    });
    // Each message is about 400 tokens (uncalibrated: 4 characters a
    // token); the window holds two of them.
    let policy = ContextPolicy::new(1_000)
        .with_summarize(SummarizePolicy::new(0.6).with_keep_last_rounds(1));
    let runtime = builder_with(executor, spec().with_context(policy))
        .build()
        .unwrap();
    let runs = 8;
    for i in 0..runs {
        let text = format!("part {i}: {}", "data ".repeat(320));
        let r = runtime.run_to_completion(user("t", &text)).await.unwrap();
        assert_eq!(r.termination, TerminationReason::NaturalEnd);
    }
    let summaries = summaries.lock().unwrap().clone();
    // One summary a run from the second on, each of what the last summary
    // and one round hold, never the whole history again.
    assert_eq!(summaries.len(), runs - 1, "{summaries:?}");
    assert!(
        summaries.iter().all(|&chars| chars < 2 * 1_700),
        "{summaries:?}"
    );
    let last = seen
        .lock()
        .unwrap()
        .iter()
        .rfind(|r| r.system.is_none())
        .cloned()
        .unwrap();
    assert_eq!(last.messages.len(), 3, "summary, answer, new part");
    assert!(last.messages[0].content.ends_with("SUMMARY"));
    assert!(last.messages[2].content.starts_with("part 7"));

    // A deleted thread starts over.
    runtime.delete_thread("t").await.unwrap();
    runtime.run_to_completion(user("t", "fresh")).await.unwrap();
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.messages.len(), 1);
}

/// Records what `BeforeInference` hooks see as the prompt estimate.
struct Estimates(Arc<Mutex<Vec<Option<u64>>>>);

#[async_trait::async_trait]
impl PhaseHook for Estimates {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        self.0.lock().unwrap().push(ctx.estimated_prompt_tokens());
        Ok(())
    }
}

struct EstimatesPlugin(Arc<Mutex<Vec<Option<u64>>>>);

impl Plugin for EstimatesPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::BeforeInference, Arc::new(Estimates(self.0.clone())));
        Ok(())
    }
}

/// Counts words: an exact counter easy to check by hand.
struct Words;

impl TokenCounter for Words {
    fn count(&self, text: &str) -> u64 {
        text.split_whitespace().count() as u64
    }
}

#[tokio::test]
async fn hooks_see_the_prompt_estimate_counted_by_the_model_s_registered_counter() {
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let (executor, _) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::tool_call("big", json!({}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let agent =
        spec()
            .with_plugin_id("estimates")
            .with_stop_condition(StopConditionSpec::TokenBudget {
                max_total: 1_000_000,
            });
    let runtime = builder_with(executor, agent)
        .with_tool("big", Arc::new(Big(200)))
        .with_plugin("estimates", Arc::new(EstimatesPlugin(seen.clone())))
        .with_token_counter("m", Arc::new(Words))
        .build()
        .unwrap();
    runtime.run_to_completion(user("t", "go")).await.unwrap();
    let estimates = seen.lock().unwrap().clone();
    // Round 1: "go" (1 word) + 4 a message + the tool's schema (`{}` and
    // the words of its name and description).
    let first = estimates[0].unwrap();
    assert!(first < 20, "{estimates:?}");
    // Round 2 adds the call and its 200-line result, 7 words a line.
    let second = estimates[1].unwrap();
    assert!(second - first >= 1_400, "{estimates:?}");
    assert!(second - first < 1_500, "{estimates:?}");

    // Without a policy or a budget nothing is estimated.
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("done")]),
        spec().with_plugin_id("estimates"),
    )
    .with_plugin("estimates", Arc::new(EstimatesPlugin(seen.clone())))
    .build()
    .unwrap();
    runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![None]);
}

#[test]
fn a_counter_for_an_unregistered_model_is_a_build_error_naming_it() {
    let error = builder_with(ScriptedExecutor::new(vec![]), spec())
        .with_token_counter("gpt-nope", Arc::new(Words))
        .build()
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("\"gpt-nope\""), "{message}");
    assert!(message.contains("registered: m"), "{message}");
}

#[test]
fn a_bad_context_value_is_reported_at_its_line_and_column() {
    let e = rein::config::load_agent_spec_yaml(
        "id: a\nmodel_id: m\ncontext:\n  window_tokens: 4096\n  compact: { at: 1.5 }\n",
    )
    .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(5), Some(18)), "{e}");
    assert!(e.message().contains("1.5 is out of range"), "{e}");
    let e = rein::config::load_agent_spec_yaml(
        "id: a\ncontext:\n  window_tokens: 4096\n  offlaod: { min_tokens: 10 }\n",
    )
    .unwrap_err();
    assert!(e.message().contains("unknown field `offlaod`"), "{e}");
    assert_eq!(e.line(), Some(4), "{e}");
}

#[test]
fn an_unknown_summary_model_is_a_build_error_naming_it() {
    let policy =
        ContextPolicy::new(4096).with_summarize(SummarizePolicy::new(0.8).with_model_id("tiny"));
    let err = builder_with(ScriptedExecutor::new(vec![]), spec().with_context(policy))
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("summarize.model_id \"tiny\" is not a registered model"),
        "{err}"
    );
}

/// Returns 200 numbered lines, each starting with the call's `tag`.
struct Tagged;

#[async_trait::async_trait]
impl Tool for Tagged {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("tagged", "returns a long listing under a tag")
    }
    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let tag = args["tag"].as_str().unwrap_or("none").to_owned();
        let text: Vec<String> = (1..=200)
            .map(|i| format!("{tag} line {i:04}: the quick brown fox"))
            .collect();
        Ok(ToolOutput::text(text.join("\n")))
    }
}

#[tokio::test]
async fn a_refused_prompt_is_a_round_that_counts_toward_max_rounds() {
    // Round 1 reads a listing; round 2's prompt is refused. With two
    // rounds allowed, the refused attempt is the last one: the run stops
    // at max_rounds, naming the error, and never retries.
    let (executor, seen) = recording(|n, _| match n {
        0 => ScriptedResponse::tool_call("big", json!({})),
        _ => too_long(),
    });
    let policy = ContextPolicy::new(1_000_000).with_compact(0.9, 3);
    let agent = spec().with_context(policy).with_max_rounds(2);
    let (result, events) = run(executor, agent, Arc::new(InMemoryThreadStore::new())).await;
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "max_rounds");
            assert!(r.detail.contains("prompt is too long"), "{}", r.detail);
        }
        other => panic!("expected max_rounds, got {other:?}"),
    }
    assert_eq!(result.steps, 2);
    assert_eq!(seen.lock().unwrap().len(), 2, "no retry past the limit");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, AgentEvent::ContextCompacted { .. })),
        "the guard ends the run before any recovery"
    );
}

#[tokio::test]
async fn a_recovered_overflow_counts_its_refused_attempt_as_a_retried_round() {
    let (executor, seen) = refusing(2, 2);
    let policy = ContextPolicy::new(1_000_000).with_compact(0.9, 3);
    let (result, events) = run_with(executor, policy).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let requests = seen.lock().unwrap().len();
    assert_eq!(requests, 4, "two listings, one refusal, the retry");
    assert_eq!(
        result.steps as usize, requests,
        "every attempt is a round, the refused one too"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::RetryStarted { attempt: 2, .. })),
        "the retry is announced as a second attempt"
    );
}

#[tokio::test]
async fn an_overflow_is_also_answered_by_a_summary_when_one_is_configured() {
    const SUMMARY: &str = "SUMMARY: listings were read.";
    let (executor, seen) = recording(|n, request| {
        if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
            return ScriptedResponse::text(SUMMARY).with_usage(50, 5);
        }
        if whole_listings(request) >= 3 {
            return too_long();
        }
        if n < 3 {
            ScriptedResponse::text(format!("reading {n}")).with_tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    // Thresholds the run never reaches on its own: only the refusal
    // reduces the prompt.
    let policy = ContextPolicy::new(1_000_000).with_summarize(SummarizePolicy::new(0.99));
    let (result, events) = run_with(executor, policy).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ContextCompacted { trigger, .. } if trigger == "overflow"
    )));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::ContextSummarized { .. }))
    );
    let seen = seen.lock().unwrap().clone();
    let retry = seen
        .iter()
        .filter(|r| r.system.as_deref() != Some(rein::context::DEFAULT_SUMMARY_PROMPT))
        .nth(4)
        .unwrap();
    assert!(retry.messages[0].content.contains(SUMMARY), "{retry:?}");
    assert_history_valid(&retry.messages);
}

#[tokio::test]
async fn a_result_under_min_tokens_stays_in_the_prompt_as_it_is() {
    let (executor, seen) = recording(|n, _| match n {
        0 => ScriptedResponse::tool_call("big", json!({})),
        _ => ScriptedResponse::text("done"),
    });
    // The listing is about 1 800 tokens: under the threshold.
    let policy = ContextPolicy::new(100_000).with_offload(5_000);
    let (result, events) = run_with(executor, policy).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let seen = seen.lock().unwrap().clone();
    let last = seen[1].messages.last().unwrap();
    assert!(last.content.starts_with("line 0001"), "{last:?}");
    assert!(!events.iter().any(|e| matches!(
        e,
        AgentEvent::ContextCompacted { .. } | AgentEvent::ContextSummarized { .. }
    )));
}

#[tokio::test]
async fn a_prompt_over_the_budget_is_compacted_before_the_call_is_refused() {
    // Two listings (about 1 900 tokens as the estimate calibrates on the
    // reported usage) do not fit the 1 580 that remain of 1 800; with the
    // older one a reference (about 1 150), the prompt does, and the run
    // goes on.
    let (executor, seen) = recording(|n, _| match n {
        0 | 1 => ScriptedResponse::tool_call("big", json!({"n": n})).with_usage(100, 10),
        _ => ScriptedResponse::text("done").with_usage(100, 10),
    });
    let policy = ContextPolicy::new(1_000_000).with_compact(0.99, 2);
    let agent = spec()
        .with_context(policy)
        .with_stop_condition(StopConditionSpec::TokenBudget { max_total: 1_800 });
    let (result, events) = run(executor, agent, Arc::new(InMemoryThreadStore::new())).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ContextCompacted { trigger, .. } if trigger == "budget"
    )));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        whole_listings(&seen[2]),
        1,
        "the older listing was compacted"
    );
}

#[tokio::test]
async fn the_reserved_output_is_part_of_what_a_call_needs_from_the_budget() {
    let (executor, seen) = recording(|n, _| {
        if n == 0 {
            ScriptedResponse::text("thinking")
                .with_tool_call("noop", json!({}))
                .with_usage(100, 10)
        } else {
            ScriptedResponse::text("done").with_usage(100, 10)
        }
    });
    // A small prompt, but 900 tokens reserved for the answer: more than the
    // 890 that remain after the first call.
    let policy = ContextPolicy::new(100_000).with_reserve_output_tokens(900);
    let agent = spec()
        .with_context(policy)
        .with_stop_condition(StopConditionSpec::TokenBudget { max_total: 1_000 });
    let runtime = builder_with(executor, agent)
        .with_tool("noop", Arc::new(common::Echo("noop")))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "token_budget");
            assert!(r.detail.contains("+ 900 reserved"), "{}", r.detail);
            assert!(
                r.detail.contains("890 of the 1000-token budget"),
                "{}",
                r.detail
            );
        }
        other => panic!("expected token_budget, got {other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_summary_s_tokens_count_in_the_totals_stop_policies_read() {
    // A budget only a stop policy checks (in a listed plugin, after each
    // inference): the agent's own calls use 40 tokens, the summary 5 000.
    let (executor, _) = recording(|n, request| {
        if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
            return ScriptedResponse::text("SUMMARY").with_usage(5_000, 20);
        }
        if n < 6 {
            ScriptedResponse::text("thinking ".repeat(600))
                .with_tool_call("big", json!({"n": n}))
                .with_usage(0, 0)
        } else {
            ScriptedResponse::text("done").with_usage(0, 0)
        }
    });
    let policy = ContextPolicy::new(10_000)
        .with_offload(100)
        .with_compact(0.5, 1)
        .with_summarize(SummarizePolicy::new(0.6));
    let plugin = rein::policies::StopConditionPlugin::new(vec![Arc::new(
        rein::policies::TokenBudgetPolicy::new(4_000),
    )]);
    let agent = spec().with_context(policy).with_plugin_id("budget");
    let runtime = builder_with(executor, agent)
        .with_tool("big", Arc::new(Big(200)))
        .with_plugin("budget", Arc::new(plugin))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => assert_eq!(r.code, "token_budget", "{}", r.detail),
        other => panic!("expected token_budget after the summary, got {other:?}"),
    }
}

#[tokio::test]
async fn a_reused_call_id_never_makes_an_older_reference_read_a_newer_result() {
    // The provider gives every call the id "same"; each result is offloaded.
    let (executor, seen) = recording(|n, _| match n {
        0 => ScriptedResponse::tool_call("tagged", json!({"tag": "first"})).with_call_id("same"),
        1 => ScriptedResponse::tool_call("tagged", json!({"tag": "second"})).with_call_id("same"),
        _ => ScriptedResponse::text("done"),
    });
    let artifacts = Arc::new(rein::context::InMemoryArtifactStore::new());
    let policy = ContextPolicy::new(100_000).with_offload(200);
    let runtime = builder_with(executor, spec().with_context(policy))
        .with_tool("tagged", Arc::new(Tagged))
        .with_artifact_store(artifacts.clone())
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    use rein::context::ArtifactStore;
    let seen = seen.lock().unwrap().clone();
    let ids: Vec<&str> = seen[2]
        .messages
        .iter()
        .filter(|m| is_reference(m))
        .filter_map(|m| m.content.split('"').nth(1))
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], "same");
    assert!(
        ids[1].starts_with("same~") && ids[1].len() == "same~".len() + 16,
        "{ids:?}"
    );
    // Each reference reads its own result.
    let first = artifacts.get("t", ids[0]).await.unwrap().unwrap();
    let second = artifacts.get("t", ids[1]).await.unwrap().unwrap();
    assert!(first.starts_with("first line 0001"), "{first}");
    assert!(second.starts_with("second line 0001"), "{second}");
}

#[tokio::test]
async fn the_history_is_stored_before_a_summary_and_a_cancel_during_it_ends_the_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let store = Arc::new(InMemoryThreadStore::new());
    let stored_at_summary: Arc<Mutex<Option<usize>>> = Arc::default();
    let summarizing = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(AtomicBool::new(false));
    let (executor, _) = {
        let (store, stored_at_summary, summarizing, started) = (
            store.clone(),
            stored_at_summary.clone(),
            summarizing.clone(),
            started.clone(),
        );
        recording(move |n, request| {
            if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
                let stored = futures::executor::block_on(store.load("t")).unwrap();
                *stored_at_summary.lock().unwrap() = Some(stored.len());
                started.store(true, Ordering::SeqCst);
                summarizing.notify_one();
                // A summary that never comes: only a cancel ends it.
                return ScriptedResponse::stalled();
            }
            ScriptedResponse::text("thinking ".repeat(600)).with_tool_call("big", json!({"n": n}))
        })
    };
    let policy = ContextPolicy::new(10_000)
        .with_offload(100)
        .with_compact(0.5, 1)
        .with_summarize(SummarizePolicy::new(0.6));
    let runtime = builder_with(executor, spec().with_context(policy))
        .with_tool("big", Arc::new(Big(200)))
        .with_thread_store(store.clone())
        .build()
        .unwrap();
    let running = runtime.clone();
    let handle = tokio::spawn(async move { running.run_to_completion(user("t", "go")).await });
    tokio::time::timeout(std::time::Duration::from_secs(10), summarizing.notified())
        .await
        .expect("a summary was asked for");
    assert!(started.load(Ordering::SeqCst));
    runtime.cancel_by_thread("t");
    let result = tokio::time::timeout(std::time::Duration::from_secs(5), handle)
        .await
        .expect("the cancel ends the summary at once")
        .unwrap()
        .unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    let history = store.load("t").await.unwrap();
    assert_history_valid(&history);
    let at_summary = stored_at_summary.lock().unwrap().unwrap();
    assert!(at_summary > 1, "rounds were stored before the summary");
    assert_eq!(
        at_summary,
        history.len(),
        "the store had the whole history when the summary was asked for"
    );
}

#[test]
fn a_summary_threshold_below_the_compaction_threshold_is_refused_where_context_stands() {
    let e = rein::config::load_agent_spec_yaml(
        "id: a\nmodel_id: m\ncontext:\n  window_tokens: 4096\n  compact: { at: 0.8 }\n  summarize: { at: 0.5 }\n",
    )
    .unwrap_err();
    assert!(e.line().is_some() && e.column().is_some(), "{e}");
    assert!(e.message().contains("summarize.at"), "{e}");
    assert!(e.message().contains("compact.at"), "{e}");
}

/// Writes a file (nothing really): its calls carry the whole content, and
/// its compact form keeps only the path.
struct WriteFile;

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("write_file", "writes a file")
    }
    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(format!("wrote {}", args["path"])))
    }
    fn compact_call(&self) -> Option<Vec<String>> {
        Some(vec!["path".to_owned()])
    }
}

/// A write of file `n`, about 4 000 characters of content.
fn write(n: usize) -> ScriptedResponse {
    ScriptedResponse::tool_call(
        "write_file",
        json!({"path": format!("src/f{n}.rs"), "content": format!("// file {n}\n{}", "let x = 1;\n".repeat(360))}),
    )
}

/// Whether `call` is in its compact form.
fn compacted(call: &ToolCall) -> bool {
    call.arguments.get(rein::context::COMPACTED_KEY).is_some()
}

#[tokio::test]
async fn old_calls_keep_only_their_compact_form_and_read_artifact_gives_the_whole_arguments_back() {
    let (executor, seen) = recording(|n, request| {
        if n < 6 {
            return write(n);
        }
        if n == 6 {
            // Read back what the first compacted call dropped.
            let id = request
                .messages
                .iter()
                .flat_map(|m| &m.tool_calls)
                .find_map(|c| {
                    let text = c.arguments.get(rein::context::COMPACTED_KEY)?.as_str()?;
                    let start = text.find("artifact \"")? + "artifact \"".len();
                    Some(text[start..start + text[start..].find('"')?].to_owned())
                })
                .unwrap_or_default();
            return ScriptedResponse::tool_call("read_artifact", json!({ "id": id }));
        }
        ScriptedResponse::text("done")
    });
    let policy = ContextPolicy::new(6_000).with_compact(0.5, 1);
    let store = Arc::new(InMemoryThreadStore::new());
    let sink = Arc::new(CollectingSink::new());
    let runtime = builder_with(executor, spec().with_context(policy))
        .with_tool("write_file", Arc::new(WriteFile))
        .with_thread_store(store.clone())
        .build()
        .unwrap();
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);

    let seen = seen.lock().unwrap().clone();
    let before_read = &seen[6];
    let calls: Vec<&ToolCall> = before_read
        .messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .collect();
    assert_eq!(calls.len(), 6);
    // The old calls keep the path and a reference; the last round's call
    // is whole.
    let old = calls[0];
    assert!(compacted(old), "{:?}", old.arguments);
    assert_eq!(old.arguments["path"], "src/f0.rs");
    assert!(old.arguments.get("content").is_none());
    let reference = old.arguments[rein::context::COMPACTED_KEY]
        .as_str()
        .unwrap();
    assert!(
        reference.contains("arguments content offloaded to artifact")
            && reference.contains(".arguments\""),
        "{reference}"
    );
    assert!(!compacted(calls[5]), "the last round is left whole");
    assert_history_valid(&before_read.messages);
    // read_artifact gives the whole arguments back.
    let read = &seen[7].messages.last().unwrap().content;
    assert!(
        read.contains("\"path\":\"src/f0.rs\"") && read.contains("// file 0"),
        "{read}"
    );
    // A compaction counted calls as references too, and the store keeps
    // every call whole.
    let references: u32 = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ContextCompacted { references, .. } => Some(*references),
            _ => None,
        })
        .sum();
    assert!(references >= 2, "{references}");
    let history = store.load("t").await.unwrap();
    assert!(
        history
            .iter()
            .flat_map(|m| &m.tool_calls)
            .all(|c| c.name != "write_file" || c.arguments.get("content").is_some())
    );
}

#[tokio::test]
async fn a_policy_rule_gives_a_tool_without_one_a_compact_form_and_an_unknown_tool_is_refused() {
    let (executor, seen) = recording(|n, _| {
        if n < 5 {
            ScriptedResponse::tool_call("big", json!({"n": n, "note": "x".repeat(3000)}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let compact = rein::context::CompactPolicy::new(0.5, 1).with_call("big", ["n"]);
    let policy = ContextPolicy::new(12_000).with_compact_policy(compact);
    let (result, _) = run_with(executor, policy).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let seen = seen.lock().unwrap().clone();
    let last = seen.last().unwrap();
    let first_call = last
        .messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .next()
        .unwrap();
    assert!(compacted(first_call), "{:?}", first_call.arguments);
    assert_eq!(first_call.arguments["n"], 0);
    assert!(first_call.arguments.get("note").is_none());

    let compact = rein::context::CompactPolicy::new(0.5, 1).with_call("writ_file", ["path"]);
    let error = builder_with(
        ScriptedExecutor::new(vec![]),
        spec().with_context(ContextPolicy::new(12_000).with_compact_policy(compact)),
    )
    .with_tool("big", Arc::new(Big(1)))
    .build()
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("compact.calls names tool \"writ_file\", which the agent does not have; its tools: big, read_artifact"),
        "{error}"
    );
}

/// The requests of a run that reads eight listings under `compact`.
async fn listings_under(
    compact: rein::context::CompactPolicy,
) -> (Vec<InferenceRequest>, Vec<u32>) {
    let (executor, seen) = recording(|n, _| {
        if n < 8 {
            ScriptedResponse::tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    let (result, events) = run_with(
        executor,
        ContextPolicy::new(12_000).with_compact_policy(compact),
    )
    .await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let steps = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ContextCompacted { references, .. } => Some(*references),
            _ => None,
        })
        .collect();
    let seen = seen.lock().unwrap().clone();
    (seen, steps)
}

#[tokio::test]
async fn with_a_fraction_compaction_turns_the_oldest_share_first_and_stops_once_under_the_threshold()
 {
    let (seen, steps) =
        listings_under(rein::context::CompactPolicy::new(0.5, 1).with_fraction(0.5)).await;
    assert!(!steps.is_empty());
    // Each step turns half of what it can (rounded up), oldest first: a
    // later request still holds an old listing whole while an older one is
    // a reference.
    let mixed = seen.iter().any(|r| {
        let tools: Vec<&Message> = r.messages.iter().filter(|m| m.role == Role::Tool).collect();
        tools.len() > 2 && is_reference(tools[0]) && !is_reference(tools[tools.len() - 2])
    });
    assert!(mixed, "steps: {steps:?}");
    for request in &seen {
        assert_history_valid(&request.messages);
        // References are always the oldest results.
        let flags: Vec<bool> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(is_reference)
            .collect();
        assert!(flags.windows(2).all(|w| w[0] || !w[1]), "{flags:?}");
    }
}

/// Tokens a prompt cache could reuse over a run: each request's prefix in
/// common with the one before, in characters / 4.
fn cached_and_sent(seen: &[InferenceRequest]) -> (usize, usize, usize) {
    let size = |m: &Message| {
        m.content.len()
            + m.tool_calls
                .iter()
                .map(|c| c.arguments.to_string().len())
                .sum::<usize>()
    };
    let mut cached = 0;
    let mut sent = 0;
    let mut rewrites = 0;
    for (i, request) in seen.iter().enumerate() {
        sent += request.messages.iter().map(size).sum::<usize>() / 4;
        if i == 0 {
            continue;
        }
        let before = &seen[i - 1].messages;
        let common = request
            .messages
            .iter()
            .zip(before.iter())
            .take_while(|(a, b)| a == b)
            .count();
        if common < before.len() {
            rewrites += 1;
        }
        cached += request.messages[..common].iter().map(size).sum::<usize>() / 4;
    }
    (cached, sent, rewrites)
}

#[tokio::test]
async fn all_at_once_rewrites_the_prompt_less_often_than_half_at_a_time() {
    // The measurement behind `compact.fraction`'s default (docs/context.md):
    // run with `--nocapture` to see the figures.
    let (all, steps_all) = listings_under(rein::context::CompactPolicy::new(0.5, 1)).await;
    let (half, steps_half) =
        listings_under(rein::context::CompactPolicy::new(0.5, 1).with_fraction(0.5)).await;
    let (cached_all, sent_all, rewrites_all) = cached_and_sent(&all);
    let (cached_half, sent_half, rewrites_half) = cached_and_sent(&half);
    println!(
        "fraction 1.0: {} steps, {rewrites_all} prefix rewrites, {sent_all} tokens sent, {cached_all} cacheable ({:.0} %)",
        steps_all.len(),
        100.0 * cached_all as f64 / sent_all as f64
    );
    println!(
        "fraction 0.5: {} steps, {rewrites_half} prefix rewrites, {sent_half} tokens sent, {cached_half} cacheable ({:.0} %)",
        steps_half.len(),
        100.0 * cached_half as f64 / sent_half as f64
    );
    assert!(
        rewrites_all <= rewrites_half,
        "{rewrites_all} > {rewrites_half}"
    );
    assert!(
        cached_all * sent_half >= cached_half * sent_all,
        "a larger cacheable share all at once"
    );
}

#[tokio::test]
async fn a_summary_is_written_from_the_full_results_not_their_references() {
    const SUMMARY: &str = "SUMMARY: listings were read.";
    let (executor, seen) = recording(move |n, request| {
        if request.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT) {
            return ScriptedResponse::text(SUMMARY);
        }
        if n < 6 {
            ScriptedResponse::text("thinking ".repeat(600)).with_tool_call("big", json!({"n": n}))
        } else {
            ScriptedResponse::text("done")
        }
    });
    // Every listing is offloaded as it arrives: the view only ever holds
    // references.
    let policy = ContextPolicy::new(10_000)
        .with_offload(100)
        .with_compact(0.5, 1)
        .with_summarize(SummarizePolicy::new(0.6));
    let (result, _) = run_with(executor, policy).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let seen = seen.lock().unwrap().clone();
    let summary = seen
        .iter()
        .find(|r| r.system.as_deref() == Some(rein::context::DEFAULT_SUMMARY_PROMPT))
        .expect("a summary was asked for");
    let transcript = &summary.messages[0].content;
    assert!(
        transcript.contains("line 0001: the quick brown fox"),
        "the full listing: {}",
        &transcript[..transcript.len().min(600)]
    );
    // Each result is its full text (cut past a quarter of the budget, with
    // the reference after it), never a reference alone.
    for line in transcript
        .lines()
        .filter(|l| l.starts_with("[tool result] "))
    {
        assert!(
            line.starts_with("[tool result] line 0001"),
            "not the references: {line}"
        );
    }
}
