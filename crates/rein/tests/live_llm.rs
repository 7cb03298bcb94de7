//! Live tests against a real model over real HTTP: the local llama.cpp
//! server started by `cargo xtask local-llm start` (SmolLM2-135M). They run
//! when `REIN_LLM_BASE_URL` is set (the start command prints it) and are
//! skipped, saying so, otherwise. The model is small: the tests assert
//! structure (a tool call with the right name, non-empty text, usage
//! present), never wording. They take turns: the server answers one request
//! at a time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::await_holding_lock,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use common::*;
use rein::contract::event::AgentEvent;
use rein::contract::inference::{InferenceErrorKind, ToolChoice};
use rein::engine::GenaiExecutor;
use rein::prelude::*;
use serde_json::json;

static TURN: Mutex<()> = Mutex::new(());

/// The live tests in this file: its `#[tokio::test]` functions, counted
/// from its own source so the skip message cannot drift from the file.
fn live_test_count() -> usize {
    include_str!("live_llm.rs")
        .lines()
        .filter(|line| line.trim() == "#[tokio::test]")
        .count()
}

/// The server's base URL and this test's turn, or `None` (skipped).
///
/// The first skip in this binary says so on stderr, once, with the count:
/// libtest captures `print!`/`eprint!` of passing tests, but not writes to
/// the process's stderr handle, so the line shows under `cargo test`.
fn live() -> Option<(String, MutexGuard<'static, ()>)> {
    match std::env::var("REIN_LLM_BASE_URL") {
        Ok(url) if !url.is_empty() => Some((url, TURN.lock().unwrap_or_else(|e| e.into_inner()))),
        _ => {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let line = format!(
                    "{} live tests skipped: REIN_LLM_BASE_URL is not set \
                     (run `export $(cargo xtask local-llm start | tail -n 1)`)\n",
                    live_test_count()
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
            });
            None
        }
    }
}

fn model(max_output_tokens: u32) -> ModelSpec {
    ModelSpec::new("smollm2", "local", "smollm2")
        .with_temperature(0.0)
        .with_max_output_tokens(max_output_tokens)
}

fn runtime(
    executor: GenaiExecutor,
    spec: AgentSpec,
    max_output_tokens: u32,
) -> AgentRuntimeBuilder {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("smollm2"))
        .with_model(model(max_output_tokens))
        .with_provider("local", Arc::new(executor))
        .with_retry_backoff(Duration::from_millis(50), Duration::from_millis(200))
}

#[tokio::test]
async fn a_plain_streamed_answer_ends_naturally() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let rt = runtime(GenaiExecutor::openai_compatible(url, None), spec(), 16)
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = rt
        .run(user("t", "Say hello in one short sentence."), sink.clone())
        .await
        .unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd, "{r:?}");
    assert!(!r.response.trim().is_empty());
    let deltas = sink
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::TextDelta { .. }))
        .count();
    assert!(deltas > 1, "the answer streamed in {deltas} deltas");
    assert!(matches!(
        sink.events().last(),
        Some(AgentEvent::RunFinished {
            termination: TerminationReason::NaturalEnd,
            ..
        })
    ));
}

/// Records the arguments it was called with.
struct Weather(Arc<Mutex<Vec<serde_json::Value>>>);

#[async_trait::async_trait]
impl Tool for Weather {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("get_weather", "Get the current weather for a city").with_parameters(
            json!({
                "type": "object",
                "properties": { "city": { "type": "string", "description": "The city name" } },
                "required": ["city"]
            }),
        )
    }
    async fn execute(
        &self,
        args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        self.0.lock().unwrap().push(args);
        Ok(ToolOutput::json(json!({ "celsius": 21, "sky": "sunny" })))
    }
}

#[tokio::test]
async fn a_forced_tool_call_runs_the_tool_and_the_model_answers_after_it() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let rt = runtime(
        GenaiExecutor::openai_compatible(url, None),
        spec().with_tool_choice(ToolChoice::None),
        24,
    )
    .with_tool("get_weather", Arc::new(Weather(calls.clone())))
    .build()
    .unwrap();
    let request = user("t", "What is the weather in Paris?")
        .with_tool_choice(ToolChoice::Tool("get_weather".into()));
    let r = rt.run_to_completion(request).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd, "{r:?}");
    assert_eq!(r.steps, 2);
    let calls = calls.lock().unwrap();
    assert_eq!(
        calls.len(),
        1,
        "the tool ran once with the model's arguments"
    );
    assert!(calls[0].is_object(), "{:?}", calls[0]);
    let history = rt.thread_messages("t").await;
    assert_eq!(history[1].tool_calls[0].name, "get_weather");
    assert_history_valid(&history);
    assert!(
        !r.response.trim().is_empty(),
        "the model answered after the tool"
    );
}

#[tokio::test]
async fn the_local_model_calls_a_sub_agent_and_gets_its_structured_result() {
    let Some((url, _turn)) = live() else {
        return;
    };
    // Both agents on the local model: the lead is made to call the
    // sub-agent; the helper answers in at most two rounds.
    let lead = spec().with_tool_choice(ToolChoice::None).with_subagent(
        SubagentSpec::new("helper")
            .with_tool("ask_helper")
            .with_description("Ask the helper a question.")
            .with_max_rounds(2),
    );
    let helper = AgentSpec::new("helper")
        .with_model_id("smollm2")
        .with_system_prompt("Answer in one short sentence.");
    let rt = runtime(GenaiExecutor::openai_compatible(url, None), lead, 24)
        .with_agent_spec(helper)
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let request = user("sub", "Ask the helper what colour the sky is.")
        .with_agent_id("agent")
        .with_tool_choice(ToolChoice::Tool("ask_helper".into()));
    let r = rt.run(request, sink.clone()).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd, "{r:?}");
    assert_eq!(r.report.children.len(), 1, "{r:?}");
    let history = rt.thread_messages("sub").await;
    assert_history_valid(&history);
    let result = history
        .iter()
        .find(|m| m.role == Role::Tool)
        .expect("the sub-agent's result");
    let json: serde_json::Value = serde_json::from_str(&result.content).unwrap();
    assert!(
        ["natural_end", "max_rounds"].contains(&json["status"].as_str().unwrap_or("")),
        "{json}"
    );
    assert!(json["response"].is_string(), "{json}");
    assert!(
        json["rounds"]
            .as_u64()
            .is_some_and(|n| (1..=2).contains(&n)),
        "{json}"
    );
    let child = &r.report.children[0];
    assert!(
        r.usage.total() >= child.usage.total(),
        "the parent's usage includes the child's"
    );
    let started = sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, AgentEvent::SubagentStarted { .. }))
        .count();
    assert_eq!(started, 1);
}

/// A typed tool's arguments: a nested struct, an enum, an optional field.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Booking {
    /// Who the table is for.
    guest: Guest,
    /// Which meal.
    meal: Meal,
    /// Any special request.
    note: Option<String>,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Guest {
    /// The guest's name.
    name: String,
    /// How many people.
    party_size: u32,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Meal {
    Lunch,
    Dinner,
}

#[tokio::test]
async fn a_generated_schema_is_accepted_and_the_forced_call_parses_into_the_struct() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let booked: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = booked.clone();
    let book = rein::tools::tool_fn(
        "book_table",
        "Book a restaurant table",
        move |args: Booking, _ctx: ToolContext| {
            let seen = seen.clone();
            async move {
                let Booking { guest, meal, note } = args;
                let booked = format!(
                    "{meal:?} for {} ({} people){}",
                    guest.name,
                    guest.party_size,
                    note.map(|n| format!(", note: {n}")).unwrap_or_default()
                );
                seen.lock().unwrap().push(booked.clone());
                Ok::<_, ToolError>(booked)
            }
        },
    );
    // Forced for the first inference only; the second answers in text.
    let rt = runtime(
        GenaiExecutor::openai_compatible(url, None),
        spec().with_tool_choice(ToolChoice::None).with_max_rounds(2),
        128,
    )
    .with_tools([book])
    .build()
    .unwrap();
    let request = user("t", "Book dinner for Ada, a party of 2, by the window.")
        .with_tool_choice(ToolChoice::Tool("book_table".into()));
    let sink = Arc::new(CollectingSink::new());
    let r = rt.run(request, sink.clone()).await.unwrap();
    assert!(r.steps >= 1, "{r:?}");
    let results: Vec<(String, bool)> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished {
                result, is_error, ..
            } => Some((result, is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        !results[0].1,
        "the arguments did not parse: {}",
        results[0].0
    );
    let booked = booked.lock().unwrap();
    assert_eq!(booked.len(), 1, "the tool ran once with typed arguments");
    assert_history_valid(&rt.thread_messages("t").await);
}

#[tokio::test]
async fn usage_is_captured_on_a_non_streaming_call() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let rt = runtime(
        GenaiExecutor::openai_compatible(url, None).with_streaming(false),
        spec(),
        8,
    )
    .build()
    .unwrap();
    let r = rt.run_to_completion(user("t", "Hi")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd, "{r:?}");
    assert!(r.usage_complete);
    assert!(
        r.usage.input_tokens > 0 && r.usage.output_tokens > 0,
        "{:?}",
        r.usage
    );
}

#[tokio::test]
async fn token_budget_and_max_rounds_stop_real_runs() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let looping = || {
        spec()
            .with_tool_choice(ToolChoice::Tool("get_weather".into()))
            .with_max_rounds(0)
    };
    let rt = runtime(
        GenaiExecutor::openai_compatible(url.clone(), None).with_streaming(false),
        looping().with_stop_condition(StopConditionSpec::TokenBudget { max_total: 300 }),
        24,
    )
    .with_tool("get_weather", Arc::new(Weather(calls.clone())))
    .build()
    .unwrap();
    let r = rt
        .run_to_completion(user("a", "Weather in Oslo, then in Rome, then in Lima?"))
        .await
        .unwrap();
    assert_eq!(r.termination.stop_code(), Some("token_budget"), "{r:?}");
    // The budget is checked before each call (estimate + the 24 reserved
    // output tokens), so the run stops before spending past it.
    match &r.termination {
        TerminationReason::Stopped(s) => assert!(s.detail.contains("was not sent"), "{s:?}"),
        other => panic!("expected a stop, got {other:?}"),
    }
    assert!(r.usage.total() <= 300, "no overshoot: {:?}", r.usage);

    let rt = runtime(
        GenaiExecutor::openai_compatible(url, None),
        looping().with_max_rounds(2),
        24,
    )
    .with_tool("get_weather", Arc::new(Weather(calls.clone())))
    .build()
    .unwrap();
    let r = rt
        .run_to_completion(user("b", "Weather in Oslo?"))
        .await
        .unwrap();
    assert_eq!(
        r.termination,
        TerminationReason::stopped("max_rounds", "reached 2 rounds (limit 2)")
    );
    assert_history_valid(&rt.thread_messages("b").await);
}

/// Signals the first text delta.
struct FirstDelta(tokio::sync::Notify, AtomicUsize);

impl EventSink for FirstDelta {
    fn emit(&self, event: AgentEvent) {
        if matches!(event, AgentEvent::TextDelta { .. })
            && self.1.fetch_add(1, Ordering::SeqCst) == 0
        {
            self.0.notify_one();
        }
    }
}

#[tokio::test]
async fn cancelling_a_real_stream_is_prompt_and_the_server_keeps_serving() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let rt = runtime(GenaiExecutor::openai_compatible(url, None), spec(), 400)
        .build()
        .unwrap();
    let sink = Arc::new(FirstDelta(tokio::sync::Notify::new(), AtomicUsize::new(0)));
    let run = tokio::spawn({
        let (rt, sink) = (rt.clone(), sink.clone());
        async move {
            rt.run(
                user("t", "Write a very long story about a lighthouse keeper."),
                sink,
            )
            .await
        }
    });
    sink.0.notified().await;
    let start = Instant::now();
    assert!(rt.cancel_and_wait_by_thread("t").await);
    let latency = start.elapsed();
    println!("live cancel latency: {latency:?}");
    assert!(latency < Duration::from_secs(2), "cancel took {latency:?}");
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.termination, TerminationReason::Cancelled);
    assert!(!r.response.is_empty());
    // The server serves the next request.
    let next = rt.run_to_completion(user("u", "Say hi.")).await.unwrap();
    assert_eq!(next.termination, TerminationReason::NaturalEnd, "{next:?}");
}

#[tokio::test]
async fn a_wrong_port_is_a_retryable_connection_error_and_consecutive_errors_stop_the_run() {
    let Some((_url, _turn)) = live() else {
        return;
    };
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let rt = runtime(
        GenaiExecutor::openai_compatible(format!("http://127.0.0.1:{port}/v1"), None),
        spec().with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 2 }),
        8,
    )
    .build()
    .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = rt.run(user("t", "hi"), sink.clone()).await.unwrap();
    assert_eq!(
        r.termination.stop_code(),
        Some("consecutive_errors"),
        "{r:?}"
    );
    let retry = sink.events().into_iter().find_map(|e| match e {
        AgentEvent::InferenceRetry { error, .. } => Some(error),
        _ => None,
    });
    assert!(
        retry
            .as_deref()
            .is_some_and(|e| e.starts_with(InferenceErrorKind::Connection.as_str())),
        "{retry:?}"
    );
}

/// Each request sent, with the input tokens the provider reported for it.
type RequestLog = Arc<Mutex<Vec<(rein::contract::inference::InferenceRequest, Option<u64>)>>>;

/// An agent with `policy` on the local model (24 output tokens, no tools
/// unless a request forces one), behind `executor`.
fn context_runtime(
    executor: Recording,
    policy: rein::context::ContextPolicy,
) -> AgentRuntimeBuilder {
    let agent = spec()
        .with_model_id("smollm2")
        .with_tool_choice(ToolChoice::None)
        .with_context(policy);
    AgentRuntimeBuilder::new()
        .with_agent_spec(agent)
        .with_model(model(24))
        .with_provider("local", Arc::new(executor))
}

/// Records each request and the input tokens the provider reported for it.
struct Recording {
    inner: GenaiExecutor,
    log: RequestLog,
}

impl Recording {
    /// The local server, non-streaming (it reports usage only then).
    fn local(url: String) -> (Self, RequestLog) {
        let log = RequestLog::default();
        let executor = Self {
            inner: GenaiExecutor::openai_compatible(url, None).with_streaming(false),
            log: log.clone(),
        };
        (executor, log)
    }
}

#[async_trait::async_trait]
impl LlmExecutor for Recording {
    async fn open(
        &self,
        request: &rein::contract::inference::InferenceRequest,
    ) -> Result<rein::contract::inference::InferenceStream, InferenceError> {
        use futures::StreamExt;
        let index = {
            let mut log = self.log.lock().unwrap();
            log.push((request.clone(), None));
            log.len() - 1
        };
        let stream = self.inner.open(request).await?;
        let log = self.log.clone();
        Ok(stream
            .inspect(move |delta| {
                if let Ok(rein::contract::inference::InferenceDelta::Usage { usage }) = delta {
                    log.lock().unwrap()[index].1 = Some(usage.input_tokens);
                }
            })
            .boxed())
    }
}

/// A pasted log excerpt of about 700 of SmolLM2's tokens.
fn log_excerpt(part: usize) -> String {
    (0..18)
        .map(|i| {
            format!(
                "2026-11-25 03:{part:02}:{i:02} WARN worker-{} request {} took {} ms (retrying)",
                i % 4,
                part * 100 + i,
                100 + i * 37
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// The local server's chat template (`chatml-function-calling`) leaves
// tool results' text out of the prompt, so tool results cannot fill its
// window; this task fills it with pasted documents instead.
#[tokio::test]
async fn a_thread_several_times_the_window_fits_a_small_context_and_the_estimate_tracks_usage() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let window: u64 = 2048; // the local server's n_ctx
    let (executor, log) = Recording::local(url);
    let policy = rein::context::ContextPolicy::new(window)
        .with_reserve_output_tokens(24)
        .with_summarize(rein::context::SummarizePolicy::new(0.6).with_keep_last_rounds(1));
    let rt = context_runtime(executor, policy).build().unwrap();
    let sink = Arc::new(CollectingSink::new());
    let parts = 9;
    for part in 0..parts {
        let text = format!(
            "Here is part {part} of the log:\n{}\nWhich worker appears most? One word.",
            log_excerpt(part)
        );
        let r = rt.run(user("ctx", &text), sink.clone()).await.unwrap();
        assert_eq!(
            r.termination,
            TerminationReason::NaturalEnd,
            "part {part}: {r:?}"
        );
    }
    assert_history_valid(&rt.thread_messages("ctx").await);
    let log = log.lock().unwrap().clone();
    let reported: Vec<u64> = log.iter().filter_map(|(_, tokens)| *tokens).collect();
    assert_eq!(reported.len(), log.len(), "every call reported usage");
    assert!(reported.iter().all(|&t| t < window), "{reported:?}");
    // The first prompt is one part: the parts together are several windows.
    assert!(
        reported[0] * parts as u64 > 3 * window,
        "{parts} parts of about {} tokens are not several windows",
        reported[0]
    );
    let summaries = sink
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::ContextSummarized { .. }))
        .count();
    assert!(summaries >= 1, "nothing was summarized");

    // The estimator's error against the reported counts, replayed with a
    // fresh calibration as the run's learnt (estimate, then learn).
    let calibration = rein::context::Calibration::default();
    let mut errors = Vec::new();
    let mut table = String::from("\nprompt  estimate  reported  error\n");
    for (i, (request, tokens)) in log.iter().enumerate() {
        let estimate = calibration.estimate(request);
        let reported = tokens.unwrap();
        let error = (estimate as f64 - reported as f64) / reported as f64;
        table.push_str(&format!(
            "{i:>6}  {estimate:>8}  {reported:>8}  {:>+6.1}%\n",
            error * 100.0
        ));
        errors.push(error);
        calibration.observe_request(request, reported);
    }
    let _ = std::io::stderr().write_all(table.as_bytes());
    let calibrated = &errors[1..];
    let mean = calibrated.iter().map(|e| e.abs()).sum::<f64>() / calibrated.len() as f64;
    assert!(
        mean < 0.15,
        "mean error after calibration {mean:.3}: {table}"
    );
}

/// Returns a part of a log: about 1 400 of SmolLM2's tokens.
struct ReadLog(AtomicUsize);

#[async_trait::async_trait]
impl Tool for ReadLog {
    fn descriptor(&self) -> ToolDescriptor {
        // No arguments to write: a free-text one let the small model run
        // past the output cap inside the string, and the call's JSON was cut.
        ToolDescriptor::new("read_log", "Read the next part of the server log").with_parameters(
            json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        )
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let part = self.0.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text(format!(
            "{}\n{}",
            log_excerpt(2 * part),
            log_excerpt(2 * part + 1)
        )))
    }
}

// A task whose real tool results add up to several windows: each run's
// first inference is a (forced) call of `read_log`, whose result is
// offloaded as it arrives, then the model answers. The local template
// drops tool results' text from the prompt it builds, so what this shows
// on this server is the real tool path with the policy on — calls parsed,
// results offloaded into the artifact store and kept whole in the
// history, references in what is sent, no context error — while the test
// above fills the window itself.
#[tokio::test]
async fn tool_results_several_times_the_window_are_offloaded_and_every_run_completes() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let window: u64 = 2048; // the local server's n_ctx
    let (executor, log) = Recording::local(url);
    let artifacts = Arc::new(rein::context::InMemoryArtifactStore::new());
    let policy = rein::context::ContextPolicy::new(window)
        .with_reserve_output_tokens(24)
        .with_offload(300)
        .with_compact(0.7, 1);
    let rt = context_runtime(executor, policy)
        .with_tool("read_log", Arc::new(ReadLog(AtomicUsize::new(0))))
        .with_artifact_store(artifacts.clone())
        .build()
        .unwrap();
    let runs = 4;
    for part in 0..runs {
        let request = user(
            "tools",
            &format!("Read part {part} of the log. Any errors?"),
        )
        .with_tool_choice(ToolChoice::Tool("read_log".into()));
        let r = rt.run_to_completion(request).await.unwrap();
        assert_eq!(
            r.termination,
            TerminationReason::NaturalEnd,
            "run {part}: {r:?}"
        );
    }
    let history = rt.thread_messages("tools").await;
    assert_history_valid(&history);
    let results: Vec<&Message> = history.iter().filter(|m| m.role == Role::Tool).collect();
    assert_eq!(results.len(), runs, "one read_log call a run");
    let log = log.lock().unwrap().clone();
    // Each result is in the artifact store, under the id its reference names.
    use rein::context::ArtifactStore;
    let mut stored = Vec::new();
    let ids: std::collections::BTreeSet<String> = log
        .iter()
        .flat_map(|(request, _)| request.messages.iter())
        .filter_map(|m| {
            m.content
                .strip_prefix("[tool result offloaded to artifact \"")
        })
        .filter_map(|rest| rest.split('"').next().map(str::to_owned))
        .collect();
    for id in &ids {
        stored.push(artifacts.get("tools", id).await.unwrap().unwrap());
    }
    for m in &results {
        assert!(stored.contains(&m.content), "not offloaded: {}", m.content);
    }
    // Every prompt sent holds references, never a whole result, and fits.
    for (request, reported) in &log {
        let tools: Vec<&Message> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .collect();
        assert!(
            tools
                .iter()
                .all(|m| m.content.starts_with("[tool result offloaded to artifact")),
            "{tools:?}"
        );
        assert!(reported.is_some_and(|t| t < window), "{reported:?}");
    }
    // What one tool returned, in the model's own tokens (sent once as a
    // user message on another thread): the results are several windows.
    let measured = rt
        .run_to_completion(user("measure", &results[0].content))
        .await
        .unwrap();
    let one_result_tokens = measured.usage.input_tokens;
    assert!(
        one_result_tokens * runs as u64 > 2 * window,
        "{runs} results of about {one_result_tokens} tokens are not several windows"
    );
}

#[tokio::test]
async fn the_local_model_judges_a_looping_run_with_structured_output() {
    let Some((url, _turn)) = live() else {
        return;
    };
    // The agent is scripted (it polls the same job every round); the judge
    // is the local model, asked for `{ reasoning, confidence }` through
    // the JSON-schema response format, which llama.cpp enforces.
    let agent = ScriptedExecutor::new(vec![ScriptedResponse::tool_call(
        "echo",
        json!({ "job": 7 }),
    )])
    .repeat_last();
    let spec = spec()
        .with_model_id("agent")
        .with_max_rounds(3)
        .with_stop_condition(StopConditionSpec::LlmLoopCheck {
            model_id: "smollm2".into(),
            after_rounds: 2,
            interval: 1,
            min_interval: 1,
            max_interval: 1,
            threshold: rein::contract::lifecycle::Confidence(0.9),
            history: 20,
            max_checks: 2,
            on_detect: rein::contract::lifecycle::OnDetect::Stop,
        });
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(spec)
        .with_model(ModelSpec::new("agent", "scripted", "loop"))
        .with_provider("scripted", Arc::new(agent))
        .with_model(model(96))
        .with_provider(
            "local",
            Arc::new(GenaiExecutor::openai_compatible(url, None)),
        )
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(user("judged", "Wait until job 7 is done."), sink.clone())
        .await
        .unwrap();
    let checks: Vec<AgentEvent> = sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, AgentEvent::ModelCheck { .. }))
        .collect();
    assert!(!checks.is_empty(), "{:?}", result.termination);
    for check in &checks {
        let AgentEvent::ModelCheck {
            outcome,
            confidence,
            detail,
            ..
        } = check
        else {
            unreachable!()
        };
        // The server refuses the JSON-schema format; the second attempt's
        // JSON mode with the schema makes its grammar give valid JSON, and
        // what it says is the model's. A 96-token answer can still be cut
        // mid-object: that is a failed check, never a stop. (This server
        // reports no usage when streaming.)
        match outcome.as_str() {
            "detected" | "clear" => {
                let c = confidence.expect("an answered check has a confidence");
                assert!((0.0..=1.0).contains(&c), "{check:?}");
                assert!(!detail.is_empty(), "the reasoning: {check:?}");
            }
            "failed" => assert!(
                detail.contains("malformed") || detail.contains("failed"),
                "{check:?}"
            ),
            other => panic!("unexpected outcome {other}: {check:?}"),
        }
    }
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert!(
                r.code == "llm_loop_check" || r.code == "max_rounds",
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_local_model_judges_whether_a_final_answer_completes_the_task() {
    let Some((url, _turn)) = live() else {
        return;
    };
    let agent = ScriptedExecutor::new(vec![ScriptedResponse::text(
        "I wrote the summary to summary.md: three paragraphs, as asked.",
    )]);
    let spec = spec()
        .with_model_id("agent")
        .with_stop_condition(StopConditionSpec::TaskComplete {
            model_id: "smollm2".into(),
            every: 0,
            threshold: rein::contract::lifecycle::Confidence(0.9),
            history: 20,
            max_checks: 1,
        });
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(spec)
        .with_model(ModelSpec::new("agent", "scripted", "answer"))
        .with_provider("scripted", Arc::new(agent))
        .with_model(model(96))
        .with_provider(
            "local",
            Arc::new(GenaiExecutor::openai_compatible(url, None)),
        )
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = rt
        .run(
            user("completion", "Summarize the notes into summary.md."),
            sink.clone(),
        )
        .await
        .unwrap();
    let checks: Vec<AgentEvent> = sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, AgentEvent::ModelCheck { .. }))
        .collect();
    assert_eq!(checks.len(), 1, "one final answer, one check");
    let AgentEvent::ModelCheck {
        code,
        outcome,
        confidence,
        complete,
        ..
    } = &checks[0]
    else {
        unreachable!()
    };
    assert_eq!(code, "task_complete");
    match outcome.as_str() {
        "detected" | "clear" => {
            assert!(complete.is_some(), "{:?}", checks[0]);
            assert!(
                confidence.is_some_and(|c| (0.0..=1.0).contains(&c)),
                "{:?}",
                checks[0]
            );
        }
        "failed" => {}
        other => panic!("unexpected outcome {other}: {:?}", checks[0]),
    }
    // Complete: `task_complete`; incomplete: the default `[warn]` lets the
    // answer stand; a failed check changes nothing.
    match &result.termination {
        TerminationReason::NaturalEnd => {}
        TerminationReason::Stopped(r) => assert_eq!(r.code, "task_complete", "{r:?}"),
        other => panic!("{other:?}"),
    }
}

/// The skip line's count is the number of `#[tokio::test]`s; it is true
/// only if each of them skips through [`live`].
#[test]
fn every_live_test_skips_through_live_so_the_skip_count_is_true() {
    let lines: Vec<&str> = include_str!("live_llm.rs").lines().collect();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim() == "#[tokio::test]")
        .collect();
    assert!(!starts.is_empty());
    assert_eq!(starts.len(), live_test_count());
    for start in starts {
        let end = (start..lines.len()).find(|&i| lines[i] == "}").unwrap();
        let body = lines[start..end].join("\n");
        let name = lines[start + 1];
        assert!(body.contains("live()"), "{name} does not call live()");
    }
}
