//! Rein's benchmark workloads, one per process run:
//! `rein-bench <workload> [--tiny]`, printing `NAME metric value unit` lines.
//! `cargo xtask bench` builds this in release mode, runs each workload three
//! times in fresh processes and reports the medians.
//!
//! Every workload uses an agent with a system prompt, a no-op tool with a
//! parameter schema (`{"i": integer}`, returns `{"ok": true, "value": 42}`)
//! and a stateless `ScriptedExecutor::from_fn` model: with k tool results
//! after the last user message it asks for one `noop` call with arguments
//! `{"i": k}` while k < R and answers `"done"` after (usage 10 in / 5 out per
//! call), so a run makes R + 1 inferences and ends `NaturalEnd`. The tokio
//! runtime is multi-threaded with two workers.
//!
//! Most workloads run as a task on one of the workers, as server code would;
//! the `*_external` ones are driven from the thread that owns the runtime
//! (`runtime.block_on(…)`, as `#[tokio::main]`, a CLI or a test does).

mod approvals;
mod cluster;
mod context;
mod http;
mod limits;
mod subagents;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rein::contract::inference::InferenceRequest;
use rein::contract::lifecycle::OnDetect;
use rein::detectors::ChantingDetector;
use rein::policies::{StopDecision, StopPolicy, StopPolicyStats, policies_from_specs};
use rein::prelude::*;

/// The agent's system prompt.
const SYSTEM_PROMPT: &str = "You are a benchmark agent. Call the noop tool once per round, \
passing the round's index as `i`, until you have called it as often as asked; then answer \"done\".";

/// The agent every workload uses: the system prompt, and `max_rounds` high
/// enough that the guard never ends a benchmark run.
fn spec() -> AgentSpec {
    AgentSpec::new("bench")
        .with_system_prompt(SYSTEM_PROMPT)
        .with_max_rounds(1000)
}

/// The no-op tool.
struct Noop;

#[async_trait::async_trait]
impl Tool for Noop {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("noop", "Does nothing; returns a small JSON object.").with_parameters(
            serde_json::json!({
                "type": "object",
                "properties": {
                    "i": {"type": "integer", "minimum": 0, "description": "The round's index, from 0."}
                },
                "required": ["i"],
                "additionalProperties": false
            }),
        )
    }
    async fn execute(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::json(
            serde_json::json!({"ok": true, "value": 42}),
        ))
    }
}

/// Tool results after the last user message.
fn tool_results_since_user(req: &InferenceRequest) -> usize {
    req.messages
        .iter()
        .rev()
        .take_while(|m| m.role != Role::User)
        .filter(|m| m.role == Role::Tool)
        .count()
}

/// Whether the request carries what the definition says the model is sent:
/// the system prompt and the one tool with its schema.
fn as_defined(req: &InferenceRequest) -> bool {
    // `read_artifact` joins the tools of agents with a context policy (W11).
    let tools: Vec<_> = req
        .tools
        .iter()
        .filter(|t| t.name != rein::context::READ_ARTIFACT)
        .collect();
    req.system.is_some() && tools.len() == 1 && tools[0].parameters["required"][0] == "i"
}

/// Set when the model was sent a request that is not as defined; `main`
/// then fails the workload.
static NOT_AS_DEFINED: AtomicBool = AtomicBool::new(false);

/// The stateless model: `rounds` no-op calls with `{"i": k}`, then "done".
fn model(rounds: usize, delay: Option<Duration>) -> ScriptedExecutor {
    ScriptedExecutor::from_fn(move |req| {
        if !as_defined(req) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        let k = tool_results_since_user(req);
        let response = if k < rounds {
            ScriptedResponse::tool_call("noop", serde_json::json!({ "i": k }))
        } else {
            ScriptedResponse::text("done")
        };
        let response = response.with_usage(10, 5);
        match delay {
            Some(d) => response.with_delay(d),
            None => response,
        }
    })
}

fn runtime_with(executor: ScriptedExecutor, spec: AgentSpec) -> AgentRuntime {
    let built = AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "bench"))
        .with_provider("p", Arc::new(executor))
        .with_tool("noop", Arc::new(Noop))
        .build();
    match built {
        Ok(runtime) => runtime,
        Err(e) => fail(&format!("cannot build the runtime: {e}")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("rein-bench: {message}");
    std::process::exit(1)
}

fn user(thread: String) -> RunRequest {
    RunRequest::new(thread, vec![Message::user("go")])
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn emit(name: &str, metric: &str, value: f64, unit: &str) {
    println!("{name} {metric} {value:.3} {unit}");
}

/// All seven built-in stop conditions, at limits a benchmark never reaches.
fn seven_conditions() -> Vec<StopConditionSpec> {
    vec![
        StopConditionSpec::MaxRounds { rounds: 1000 },
        StopConditionSpec::Timeout { seconds: 3600 },
        StopConditionSpec::TokenBudget {
            max_total: 1_000_000_000,
        },
        StopConditionSpec::ConsecutiveErrors { max: 5 },
        StopConditionSpec::StopOnTool {
            tool_name: "never_called".into(),
        },
        StopConditionSpec::ContentMatch {
            pattern: "STOP_NOW_[0-9]+".into(),
        },
        StopConditionSpec::LoopDetection { window: 3 },
    ]
}

/// The seven conditions and every loop detector (W1b with the loop keys),
/// at settings the workload never trips: its calls differ by argument.
fn loop_conditions() -> Vec<StopConditionSpec> {
    let mut all = seven_conditions();
    all.extend([
        StopConditionSpec::ToolCallLoop {
            threshold: 5,
            max_cycle: 5,
            on_detect: OnDetect::NudgeThenStop,
        },
        StopConditionSpec::ToolErrorLoop {
            threshold: 3,
            on_detect: OnDetect::Stop,
        },
        StopConditionSpec::ToolCallCycle {
            cycle: 1,
            threshold: 4,
            on_detect: OnDetect::Stop,
        },
        StopConditionSpec::ToolCallCycle {
            cycle: 2,
            threshold: 3,
            on_detect: OnDetect::Stop,
        },
        StopConditionSpec::ContentChanting {
            chunk_chars: 50,
            threshold: 10,
            on_detect: OnDetect::Stop,
        },
        StopConditionSpec::Stuck { duplicates: 2 },
    ]);
    all
}

/// The agent spec with `conditions`.
fn with(conditions: Vec<StopConditionSpec>) -> AgentSpec {
    conditions
        .into_iter()
        .fold(spec(), AgentSpec::with_stop_condition)
}

/// W1b with every run-control feature: the loop conditions, `error_rate`,
/// `no_progress` and `awaiting_user`, a ladder for each of them and per-tool rules, at
/// settings the workload never trips.
fn control_spec() -> AgentSpec {
    use rein::escalation::{EscalationAction, EscalationStep, Ladder, ToolLoopRule};
    let mut conditions = loop_conditions();
    conditions.extend([
        StopConditionSpec::ErrorRate {
            errors: 3,
            within_seconds: 60,
        },
        // Every `noop` result is the same: 100 stale rounds is past the
        // workload's 50, so the detector works every round and never fires.
        StopConditionSpec::NoProgress { rounds: 100 },
        StopConditionSpec::AwaitingUser { auto_nudges: 2 },
    ]);
    let ladder = || {
        Ladder::new(vec![
            EscalationStep::new(EscalationAction::Warn, 1),
            EscalationStep::new(EscalationAction::Nudge, 1),
            EscalationStep::new(EscalationAction::Stop, 1),
        ])
        .unwrap_or_else(|e| fail(&e))
    };
    let mut spec = with(conditions);
    // A ladder for every detector the workload lists. The conditions a
    // model judges (`llm_loop_check`, `task_complete`) are left out: each
    // of their checks is an inference, not per-round work.
    let listed: Vec<&str> = spec.stop_conditions.iter().map(|c| c.kind()).collect();
    for code in rein::escalation::LADDER_CODES {
        if listed.contains(code) {
            spec = spec.with_escalation(*code, ladder());
        }
    }
    spec.with_tool_rule("write_file", ToolLoopRule::threshold(2))
        .with_tool_rule("poll_status", ToolLoopRule::exempt())
}

/// Counts the events it receives (a sink that wants events, so the runtime
/// builds every one of them).
#[derive(Default)]
struct Counting(AtomicU64);

impl EventSink for Counting {
    fn emit(&self, _event: AgentEvent) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// W1 / W1b: µs per round of one run of 50 rounds, median of `runs` runs.
/// With `events`, every event is built and sent to a counting sink;
/// without, the runtime's default sink discards them unbuilt.
async fn rounds(name: &str, spec: AgentSpec, events: bool, runs: usize) {
    const R: usize = 50;
    let runtime = runtime_with(model(R, None), spec);
    let mut per_round = Vec::with_capacity(runs);
    for i in 0..runs {
        let sink = Arc::new(Counting::default());
        let start = Instant::now();
        let result = if events {
            runtime.run(user(format!("w1-{i}")), sink.clone()).await
        } else {
            runtime.run_to_completion(user(format!("w1-{i}"))).await
        };
        let elapsed = start.elapsed();
        match result {
            Ok(r)
                if r.termination == TerminationReason::NaturalEnd && r.steps as usize == R + 1 => {}
            other => fail(&format!("{name}: unexpected result {other:?}")),
        }
        per_round.push(elapsed.as_secs_f64() * 1e6 / R as f64);
    }
    let s = sorted(per_round);
    emit(name, "per_round_median", percentile(&s, 0.5), "us");
    emit(name, "per_round_p99", percentile(&s, 0.99), "us");
}

fn status_kb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// W2: `n` runs started at once on distinct threads, 5 rounds each, 1 ms per inference.
async fn concurrent(n: usize) {
    const R: usize = 5;
    let runtime = runtime_with(model(R, Some(Duration::from_millis(1))), spec());
    let rss_before = status_kb("VmRSS:");
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let runtime = runtime.clone();
        tasks.push(tokio::spawn(async move {
            runtime.run_to_completion(user(format!("w2-{i}"))).await
        }));
    }
    for task in tasks {
        match task.await {
            Ok(Ok(r))
                if r.termination == TerminationReason::NaturalEnd && r.steps as usize == R + 1 => {}
            other => fail(&format!("concurrent: unexpected result {other:?}")),
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let peak = status_kb("VmHWM:");
    emit("concurrent", "wall", wall, "s");
    emit("concurrent", "runs_per_sec", n as f64 / wall, "runs/s");
    emit(
        "concurrent",
        "peak_rss_added",
        (peak - rss_before) / 1024.0,
        "MB",
    );
    emit(
        "concurrent",
        "peak_rss_added_per_run",
        (peak - rss_before) * 1024.0 / n as f64,
        "B",
    );
}

/// W3 / W3a: latency of `cancel_and_wait_by_thread` on a run whose model
/// never answers, cancelled as soon as the model has been asked, or `pause`
/// after that (by then the runtime's workers have gone idle).
async fn cancel(name: &str, before_stream: bool, pause: Option<Duration>, trials: usize) {
    let opened = Arc::new(AtomicU64::new(0));
    let counter = opened.clone();
    let executor = ScriptedExecutor::from_fn(move |req| {
        if !as_defined(req) {
            NOT_AS_DEFINED.store(true, Ordering::Relaxed);
        }
        counter.fetch_add(1, Ordering::SeqCst);
        if before_stream {
            ScriptedResponse::text("never").with_delay(Duration::from_secs(3600))
        } else {
            ScriptedResponse::stalled()
        }
    });
    let runtime = runtime_with(executor, spec());
    let mailbox = runtime.mailbox();
    let mut latencies = Vec::with_capacity(trials);
    for i in 0..trials {
        let thread = format!("w3-{i}");
        let seen = opened.load(Ordering::SeqCst);
        let handle = match mailbox.submit(user(thread.clone())).await {
            Ok(h) => h,
            Err(e) => fail(&format!("{name}: submit failed: {e}")),
        };
        // Wait until the model has been asked, so the run is blocked on it.
        while opened.load(Ordering::SeqCst) == seen {
            tokio::task::yield_now().await;
        }
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let start = Instant::now();
        let released = runtime.cancel_and_wait_by_thread(&thread).await;
        latencies.push(start.elapsed().as_secs_f64() * 1e6);
        match handle.wait().await {
            Ok(r) if released && r.termination == TerminationReason::Cancelled => {}
            other => fail(&format!(
                "{name}: trial {i} did not end Cancelled: {other:?}"
            )),
        }
    }
    let s = sorted(latencies);
    emit(name, "p50", percentile(&s, 0.5), "us");
    emit(name, "p99", percentile(&s, 0.99), "us");
    emit(name, "max", percentile(&s, 1.0), "us");
}

/// W4: `n` submissions back to back on one thread, each interrupting the last.
async fn mailbox(name: &str, n: usize) {
    let runtime = runtime_with(model(0, Some(Duration::from_millis(1))), spec());
    let mailbox = runtime.mailbox();
    let mut handles = Vec::with_capacity(n);
    let mut per_submit = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        match mailbox
            .submit(RunRequest::new("w4", vec![Message::user(format!("m{i}"))]))
            .await
        {
            Ok(h) => handles.push(h),
            Err(e) => fail(&format!("{name}: submission {i} failed: {e}")),
        }
        per_submit.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let wall = start.elapsed().as_secs_f64();
    let mut stuck = 0;
    for h in handles {
        if h.wait().await.is_err() {
            stuck += 1;
        }
    }
    let history = runtime.thread_messages("w4").await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for m in history.iter().filter(|m| m.role == Role::User) {
        *counts.entry(m.content.as_str()).or_default() += 1;
    }
    let lost = (0..n)
        .filter(|i| !counts.contains_key(format!("m{i}").as_str()))
        .count();
    let duplicated = counts.values().filter(|c| **c > 1).count();
    if runtime.is_thread_active("w4") {
        stuck += 1;
    }
    let s = sorted(per_submit);
    emit(name, "submissions_per_sec", n as f64 / wall, "submits/s");
    emit(name, "submit_p50", percentile(&s, 0.5), "us");
    emit(name, "submit_p99", percentile(&s, 0.99), "us");
    emit(name, "lost", lost as f64, "messages");
    emit(name, "duplicated", duplicated as f64, "messages");
    emit(name, "stuck", stuck as f64, "runs");
    if lost + duplicated + stuck > 0 {
        fail(&format!(
            "{name}: messages lost or duplicated, or runs stuck"
        ));
    }
}

/// W5: all seven built-in policies on a 10 KB response and 8 recent texts.
fn policies(iterations: usize) {
    let specs = seven_conditions();
    let all = policies_from_specs(&specs);
    type Policies = Vec<Arc<dyn StopPolicy>>;
    let (content, others): (Policies, Policies) =
        all.iter().cloned().partition(|p| p.id() == "content_match");
    let text: String =
        "The quick brown fox jumps over the lazy dog; STOP NOW 12 is not a match. ".repeat(200);
    let text = text[..10 * 1024].to_owned();
    let stats = StopPolicyStats {
        step_count: 7,
        total_input_tokens: 70_000,
        total_output_tokens: 35_000,
        elapsed_ms: 12_345,
        consecutive_errors: 0,
        last_tool_names: vec!["search".into(), "open".into()],
        last_response_text: text.clone(),
        recent_response_texts: (0..8).map(|i| format!("answer number {i}")).collect(),
    };
    let time = |f: &dyn Fn() -> bool| {
        let start = Instant::now();
        let mut stops = 0u64;
        for _ in 0..iterations {
            if std::hint::black_box(f()) {
                stops += 1;
            }
        }
        if stops > 0 {
            fail("policies: a policy fired on non-triggering stats");
        }
        start.elapsed().as_secs_f64() * 1e9 / iterations as f64
    };
    let any_stop = |ps: &[Arc<dyn StopPolicy>]| {
        ps.iter().any(|p| {
            !matches!(
                p.evaluate(std::hint::black_box(&stats)),
                StopDecision::Continue
            )
        })
    };
    let regex = regex::Regex::new("STOP_NOW_[0-9]+").unwrap_or_else(|e| fail(&e.to_string()));
    emit(
        "policies",
        "six_non_regex",
        time(&|| any_stop(&others)),
        "ns",
    );
    emit(
        "policies",
        "content_match",
        time(&|| any_stop(&content)),
        "ns",
    );
    emit("policies", "all_seven", time(&|| any_stop(&all)), "ns");
    emit(
        "policies",
        "bare_is_match",
        time(&|| regex.is_match(std::hint::black_box(&text))),
        "ns",
    );
}

/// What W6 feeds the chanting detector.
#[derive(Clone, Copy)]
enum Answer {
    /// Ordinary text: distinct numbered sentences.
    Text,
    /// Spaces only, no newline.
    Spaces,
    /// `=` and `-` rule characters only, no newline.
    Rules,
}

/// W6: the chanting detector over a `bytes`-long streamed answer in 64-byte
/// chunks; ns per byte. Ordinary text must not be flagged; for the others
/// the number of chunks flagged is reported.
fn chanting(name: &str, answer: Answer, bytes: usize) {
    let text = match answer {
        Answer::Text => {
            let sentence = "Each sentence here is different: number ";
            let mut text = String::with_capacity(bytes + 64);
            let mut i = 0u64;
            while text.len() < bytes {
                text.push_str(sentence);
                text.push_str(&i.to_string());
                text.push_str(". ");
                i += 1;
            }
            text
        }
        Answer::Spaces => " ".repeat(bytes),
        Answer::Rules => "="
            .repeat(32)
            .chars()
            .chain("-".repeat(32).chars())
            .cycle()
            .take(bytes)
            .collect(),
    };
    let chunks: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or(""))
        .collect();
    let Some(mut detector) = ChantingDetector::new(50, 10, OnDetect::Stop) else {
        fail("chanting: the detector is disabled")
    };
    let mut flagged = 0u64;
    let start = Instant::now();
    for c in &chunks {
        if detector.observe(std::hint::black_box(c)).is_some() {
            flagged += 1;
        }
    }
    let ns = start.elapsed().as_secs_f64() * 1e9 / text.len() as f64;
    emit(name, "per_byte", ns, "ns");
    match answer {
        Answer::Text if flagged > 0 => fail(&format!("{name}: varied text was flagged")),
        Answer::Text => {}
        Answer::Spaces | Answer::Rules => emit(name, "flagged_chunks", flagged as f64, "chunks"),
    }
}

/// Runs the workload as a task on one of the two workers, as server code
/// would, not on the thread that owns the runtime.
fn on_worker<F: std::future::Future<Output = ()> + Send + 'static>(
    rt: &tokio::runtime::Runtime,
    workload: F,
) {
    if let Err(e) = rt.block_on(rt.spawn(workload)) {
        fail(&format!("the workload task failed: {e}"));
    }
}

/// Runs the workload on the thread that owns the runtime, as
/// `#[tokio::main]`, a CLI or a test does: the runtime's workers run the
/// runs, and this thread parks in `block_on` whenever it waits.
fn external<F: std::future::Future<Output = ()>>(rt: &tokio::runtime::Runtime, workload: F) {
    rt.block_on(workload);
}

/// The workloads `rein-bench` knows, in the order `cargo xtask bench` runs them.
const USAGE: &str = "usage: rein-bench <rounds|rounds_external|rounds_policies|rounds_loops|rounds_control|rounds_events|concurrent|\
cancel|cancel_pause|cancel_external|cancel_external_pause|cancel_open|mailbox|mailbox_external|\
policies|chanting|chanting_spaces|chanting_rules|http|http_first_event|http_retention|\
context|subagent_cancel|subagent_overhead|approval_resume|approval_parked_memory|cluster_approval|cluster_approval_lost_notify|cluster_parked_memory|cluster_cancel|cluster_submit|cluster_submit_spread|cluster_submit_spread_held|cluster_takeover> [--tiny]";

/// W9's concurrent clients (HTTP/1.1 connections, each one submission at
/// a time), spread over the three processes.
const STORM_CLIENTS: usize = 128;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tiny = args.iter().any(|a| a == "--tiny");
    let Some(workload) = args.iter().find(|a| !a.starts_with("--")) else {
        fail(USAGE)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("cannot start tokio: {e}")));
    let scale = |full: usize, small: usize| if tiny { small } else { full };
    let ms = Some(Duration::from_millis(1));
    match workload.as_str() {
        "rounds" => on_worker(&rt, rounds("rounds", with(vec![]), false, scale(200, 2))),
        "rounds_external" => external(
            &rt,
            rounds("rounds_external", with(vec![]), false, scale(200, 2)),
        ),
        "rounds_policies" => on_worker(
            &rt,
            rounds(
                "rounds_policies",
                with(seven_conditions()),
                false,
                scale(200, 2),
            ),
        ),
        "rounds_loops" => on_worker(
            &rt,
            rounds(
                "rounds_loops",
                with(loop_conditions()),
                false,
                scale(200, 2),
            ),
        ),
        "rounds_control" => on_worker(
            &rt,
            rounds("rounds_control", control_spec(), false, scale(200, 2)),
        ),
        "rounds_events" => on_worker(
            &rt,
            rounds("rounds_events", with(vec![]), true, scale(200, 2)),
        ),
        "concurrent" => on_worker(&rt, concurrent(scale(10_000, 20))),
        "context" => on_worker(&rt, context::rounds(scale(100, 2))),
        "cancel" => on_worker(&rt, cancel("cancel", false, None, scale(1000, 5))),
        "cancel_pause" => on_worker(&rt, cancel("cancel_pause", false, ms, scale(1000, 5))),
        "cancel_external" => external(&rt, cancel("cancel_external", false, None, scale(1000, 5))),
        "cancel_external_pause" => external(
            &rt,
            cancel("cancel_external_pause", false, ms, scale(1000, 5)),
        ),
        "cancel_open" => on_worker(&rt, cancel("cancel_open", true, None, scale(1000, 5))),
        "mailbox" => on_worker(&rt, mailbox("mailbox", scale(1000, 10))),
        "mailbox_external" => external(&rt, mailbox("mailbox_external", scale(1000, 10))),
        "policies" => policies(scale(1_000_000, 100)),
        "chanting" => chanting("chanting", Answer::Text, scale(1 << 20, 4096)),
        // Tiny: small enough that a detector quadratic on these inputs
        // cannot hang CI.
        "chanting_spaces" => chanting("chanting_spaces", Answer::Spaces, scale(1 << 20, 2048)),
        "chanting_rules" => chanting("chanting_rules", Answer::Rules, scale(1 << 20, 2048)),
        "http" => on_worker(&rt, http::round_trips(scale(64, 4), scale(20_000, 16))),
        "http_auth" => on_worker(
            &rt,
            http::auth_round_trips(scale(64, 4), scale(40_000, 16), scale(10, 2)),
        ),
        "http_first_event" => on_worker(&rt, http::first_event(scale(1000, 5))),
        "http_retention" => on_worker(
            &rt,
            http::retention(scale(100_000, 300), scale(10_000, 100)),
        ),
        "subagent_cancel" => on_worker(
            &rt,
            subagents::cancel(scale(200, 3), Duration::from_millis(2)),
        ),
        "subagent_overhead" => on_worker(&rt, subagents::overhead(scale(200, 2))),
        "approval_resume" => on_worker(&rt, approvals::decision_to_tool(scale(1000, 5))),
        "approval_parked_memory" => on_worker(&rt, approvals::parked_memory(scale(10_000, 20))),
        "cluster_approval" => on_worker(&rt, cluster::approval(scale(200, 3), false)),
        "cluster_approval_lost_notify" => on_worker(&rt, cluster::approval(scale(50, 2), true)),
        "cluster_parked_memory" => on_worker(&rt, cluster::parked_memory(scale(2000, 10))),
        "cluster_cancel" => on_worker(&rt, cluster::cancel(scale(200, 3))),
        "limits" => on_worker(
            &rt,
            limits::in_process(scale(1_000_000, 100), scale(200, 2)),
        ),
        "cluster_limits" => on_worker(&rt, limits::postgres(scale(2000, 10))),
        "cluster_submit" => on_worker(
            &rt,
            cluster::submit_storm("cluster_submit", "quick", 1, scale(6000, 30), STORM_CLIENTS),
        ),
        "cluster_submit_spread" => on_worker(
            &rt,
            cluster::submit_storm(
                "cluster_submit_spread",
                "quick",
                64,
                scale(12_000, 64),
                STORM_CLIENTS,
            ),
        ),
        "cluster_submit_spread_held" => on_worker(
            &rt,
            cluster::submit_storm(
                "cluster_submit_spread_held",
                "hold",
                64,
                scale(12_000, 64),
                STORM_CLIENTS,
            ),
        ),
        "cluster_takeover" => on_worker(&rt, cluster::takeover(scale(3, 1))),
        other => fail(&format!("unknown workload \"{other}\"\n{USAGE}")),
    }
    if NOT_AS_DEFINED.load(Ordering::Relaxed) {
        fail(&format!(
            "{workload}: the model was sent a request without the system prompt or the tool's schema"
        ));
    }
}
