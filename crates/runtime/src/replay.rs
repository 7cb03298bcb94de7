//! Recording runs and replaying them: a [`JsonlSink`] writes every event of
//! the runs it sees as JSON lines with the time they happened; [`replay`]
//! reads such a recording back and evaluates an agent's stop conditions and
//! detectors over each recorded run, offline, reporting where each would
//! have fired. A team measures a detector on real traffic this way before
//! enabling it (`rein replay`; `docs/replay.md`).
//!
//! # The recording
//!
//! One line per event: `{"at_ms": <ms since the sink was created>, "event":
//! <the AgentEvent>}`. Runs are told apart by their `run_id`, so one file
//! can hold many runs, interleaved. A sub-agent's run (one a
//! `subagent_started` of the recording names) is replayed only when it is
//! a run of the replayed agent: a tree's runs of other agents had other
//! conditions.
//!
//! # What replay sees
//!
//! A run is rebuilt round by round from its events: the streamed text
//! (`text_delta`), the tool calls and their results, failed attempts
//! (`inference_retry`) and the run's end. Each round is fed, at the times
//! the run had them, to the judge the agent loop uses
//! (`agent_loop::judge`), in the loop's order: it evaluates the statistics
//! policies, detectors, escalation ladders and tool rules exactly as a
//! live run would, up to the run's first stop. A recording has no usage
//! per inference, only the run's total, so `token_budget` is judged once,
//! at the run's end. The model saw no nudge or stop that replay reports:
//! each firing is where the configured conditions *would* have acted, and
//! the recorded run goes on as it went.
//!
//! The conditions a model judges (`llm_loop_check`, `task_complete`) need
//! their models: [`replay`] leaves them out, [`replay_judged`] asks them
//! over the history the events show (which lacks the user's messages).
//!
//! # Approval rules
//!
//! [`approvals`] reads the same recording for an agent's approval rules:
//! per tool, how many recorded calls the first matching rule would have
//! held (`ask`), refused (`deny`) or let run, and how many no rule matches;
//! per rule, how many calls it would have decided ([`ApprovalReport`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::sync::Arc;

use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::inference::{InferenceResponse, LlmExecutor};
use rein_runtime_contract::message::{Message, ToolCall, ToolResult};
use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
use serde::{Deserialize, Serialize};

use crate::agent::{Agent, GuardItem};
use crate::agent_loop::judge::{Act, Judge, Screened};
use crate::detectors::Verdict;
use crate::detectors::model_checks::{ModelCheck, ask};
use crate::policies::StopPolicyStats;

mod approval_report;

pub use approval_report::{ApprovalReport, RuleTally, ToolTally, approvals};

/// An [`EventSink`] that appends every event, with its time, as one JSON
/// line to a file (see the [module docs](self)).
///
/// Writing is buffered and flushed at each run's end; a write error is
/// logged once and later events are dropped (recording never fails a run).
#[derive(Debug)]
pub struct JsonlSink {
    out: Mutex<Option<std::io::BufWriter<std::fs::File>>>,
    start: Instant,
}

impl JsonlSink {
    /// A sink appending to `path` (created if missing).
    ///
    /// # Errors
    ///
    /// The file cannot be opened for appending.
    pub fn create(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            out: Mutex::new(Some(std::io::BufWriter::new(file))),
            start: Instant::now(),
        })
    }
}

/// One line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// Milliseconds since the recording started.
    pub at_ms: u64,
    /// The event.
    pub event: AgentEvent,
}

impl EventSink for JsonlSink {
    fn emit(&self, event: AgentEvent) {
        let at_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let finished = matches!(event, AgentEvent::RunFinished { .. });
        let line = match serde_json::to_string(&Recorded { at_ms, event }) {
            Ok(line) => line,
            Err(error) => {
                tracing::warn!(%error, "an event could not be recorded");
                return;
            }
        };
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(writer) = out.as_mut() else {
            return;
        };
        let written = writeln!(writer, "{line}")
            .and_then(|()| if finished { writer.flush() } else { Ok(()) });
        if let Err(error) = written {
            tracing::warn!(%error, "recording stopped: the file cannot be written");
            *out = None;
        }
    }
}

/// Reads a recording: one [`Recorded`] per non-empty line.
///
/// # Errors
///
/// A line that is not a recorded event, with its number (from 1).
pub fn read_recording(text: &str) -> Result<Vec<Recorded>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("line {}: not a recorded event: {e}", i + 1))
        })
        .collect()
}

/// Where a condition would have acted in a recorded run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Firing {
    /// The round (from 1) after which it fired.
    pub round: u32,
    /// The stop code of the condition or detector.
    pub code: String,
    /// The step of its ladder: `warn`, `nudge`, `deny` or `stop`.
    pub action: String,
    /// What it saw.
    pub detail: String,
}

/// One recorded run, replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunReplay {
    /// The run.
    pub run_id: String,
    /// Rounds it had.
    pub rounds: u32,
    /// How it really ended (`natural_end`, `cancelled`, `error`, or the stop
    /// code), if the recording has its end.
    pub ended: Option<String>,
    /// Where each condition would have fired, in order.
    pub firings: Vec<Firing>,
}

/// Replays every run of `recording` against `spec`'s stop conditions,
/// detectors, escalation ladders and tool rules; runs in the order they
/// first appear.
pub fn replay(spec: &AgentSpec, recording: &[Recorded]) -> Vec<RunReplay> {
    runs_of(spec, recording)
        .into_iter()
        .map(|(id, events)| Replayer::new(spec).run(id, &events))
        .collect()
}

/// A model that judges an agent's runs: the model of one of its
/// `llm_loop_check` or `task_complete` conditions, with its provider's
/// executor ([`AgentRuntime::judging_models`](crate::AgentRuntime::judging_models)).
#[derive(Clone)]
pub struct JudgingModel {
    /// The model.
    pub model: ModelSpec,
    /// Its provider's executor.
    pub executor: Arc<dyn LlmExecutor>,
}

impl std::fmt::Debug for JudgingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgingModel")
            .field("model", &self.model.id)
            .finish_non_exhaustive()
    }
}

/// What replay tells a judging model in place of the user's request,
/// which no event records.
pub const REPLAY_TASK: &str = "(not in the recording: a replay sees the run's answers, tool calls, results and nudges, not the user's messages)";

/// [`replay`], with the conditions a model judges (`llm_loop_check`,
/// `task_complete`) evaluated too: `models` are their judging models, in
/// the order the conditions are listed.
///
/// At each round's end where a check would be due, the judging model gets
/// the history the events show — the run's answers, tool calls, results
/// and nudges — and its firings join the others at that round. What replay
/// cannot know: the user's request and the thread's earlier runs (no event
/// carries them; the model is told so, [`REPLAY_TASK`]), what the judging
/// model answered in the live run (it is asked again, now, and may answer
/// differently), and the live run's token budget (a check is never
/// skipped for cost). A check that fails is left out, logged. Each check
/// is a real inference: it costs what the model charges.
///
/// # Errors
///
/// `models` does not hold one model per condition a model judges.
///
/// # Cancel safety
///
/// Dropping the future drops the check in flight; nothing is recorded.
pub async fn replay_judged(
    spec: &AgentSpec,
    recording: &[Recorded],
    models: &[JudgingModel],
) -> Result<Vec<RunReplay>, String> {
    let wanted = ModelCheck::all(&spec.stop_conditions, &spec.escalation).len();
    if models.len() != wanted {
        return Err(format!(
            "agent \"{}\" lists {wanted} conditions a model judges, but {} judging models were given",
            spec.id,
            models.len()
        ));
    }
    let mut runs = Vec::new();
    for (id, events) in runs_of(spec, recording) {
        let (mut run, judged) = Replayer::new(spec).rebuild(id, &events);
        if let Some(judged) = judged {
            let firings = judge_rounds(spec, &judged, models).await;
            for firing in firings {
                // After the round's other firings.
                let at = run.firings.partition_point(|f| f.round <= firing.round);
                run.firings.insert(at, firing);
            }
        }
        runs.push(run);
    }
    Ok(runs)
}

/// The firings of the model checks over one rebuilt run.
async fn judge_rounds(spec: &AgentSpec, judged: &Judged, models: &[JudgingModel]) -> Vec<Firing> {
    let mut checks = ModelCheck::all(&spec.stop_conditions, &spec.escalation);
    let mut retired = vec![false; checks.len()];
    let mut report = Report {
        firings: Vec::new(),
        round: 0,
        stopping: false,
        another_round: false,
    };
    for end in &judged.ends {
        report.round = end.round;
        report.stopping = end.busy;
        report.another_round = false;
        for check in &mut checks {
            if report.stopping
                || report.another_round
                || retired[check.index]
                || !check.due(end.round, end.final_answer)
            {
                continue;
            }
            let model = &models[check.index];
            let history = &judged.history[..end.len];
            let request = check.request(end.round, history, REPLAY_TASK, &model.model);
            check.sent();
            let answer = match ask(&*model.executor, &request).await {
                Ok(response) => check.parse(&response.text),
                Err(error) => Err(format!("the model failed: {error}")),
            };
            let answer = match answer {
                Ok(answer) => answer,
                Err(problem) => {
                    tracing::warn!(
                        code = check.code(),
                        model = model.model.id,
                        round = end.round,
                        problem,
                        "replay: a model check failed; it is left out"
                    );
                    continue;
                }
            };
            let (_, verdict) = check.judge(&model.model.id, &answer, end.final_answer);
            if let Some(verdict) = verdict {
                retired[check.index] |= matches!(verdict, Verdict::Stop(_));
                report.act(verdict);
            }
        }
    }
    report.firings
}

/// The runs of `recording` that replay judges against `spec`, in the order
/// they first appear, each with its events: sub-agent runs of another
/// agent, and event groups that are not runs, are left out.
fn runs_of<'a>(spec: &AgentSpec, recording: &'a [Recorded]) -> Vec<(&'a str, Vec<&'a Recorded>)> {
    let mut order: Vec<&str> = Vec::new();
    let mut runs: BTreeMap<&str, Vec<&Recorded>> = BTreeMap::new();
    // Sub-agent runs of another agent (a variant made for declared outputs
    // is `<agent>@<parent>.<tool>`).
    let others: Vec<&str> = recording
        .iter()
        .filter_map(|r| match &r.event {
            AgentEvent::SubagentStarted {
                child_run_id,
                agent_id,
                ..
            } if agent_id.split('@').next() != Some(spec.id.as_str()) => {
                Some(child_run_id.as_str())
            }
            _ => None,
        })
        .collect();
    for r in recording {
        let id = r.event.run_id();
        if others.contains(&id) {
            continue;
        }
        if !runs.contains_key(id) {
            order.push(id);
        }
        runs.entry(id).or_default().push(r);
    }
    order
        .into_iter()
        .filter_map(|id| {
            let events = runs.remove(id)?;
            // Auto mode's progress events belong to a session, not a run.
            let is_run = events.iter().any(|r| {
                matches!(
                    r.event,
                    AgentEvent::RunStarted { .. } | AgentEvent::StepStarted { .. }
                )
            });
            is_run.then_some((id, events))
        })
        .collect()
}

/// The state of one run being replayed.
struct Replayer {
    guard: Vec<GuardItem>,
    judge: Judge,
    stats: StopPolicyStats,
    report: Report,
    text: String,
    /// The round's calls as they started, with when the first started
    /// (the answer's end).
    calls: Vec<ToolCall>,
    answered_at: Option<u64>,
    /// The round's results, in the order the loop recorded them (call
    /// order), with their times.
    results: Vec<(ToolResult, u64)>,
    open: bool,
    /// For the conditions a model judges: the run's history as the events
    /// show it, and where each round ended in it.
    judged: Option<Judged>,
}

/// A recorded run's history as its events show it (answers, calls,
/// results, nudges — not the user's input, which no event carries), and
/// the rounds' ends in it.
#[derive(Default)]
struct Judged {
    history: Vec<Message>,
    ends: Vec<RoundEnd>,
}

/// Where a round ended, for the model checks due there.
struct RoundEnd {
    round: u32,
    /// The answer called no tools.
    final_answer: bool,
    /// A stop or another round was already requested (the loop would not
    /// send a check).
    busy: bool,
    /// The history's length then.
    len: usize,
}

/// The firings of one run: how replay acts on the judge's verdicts.
struct Report {
    firings: Vec<Firing>,
    round: u32,
    /// Whether a stop or another round was asked for in this round.
    stopping: bool,
    another_round: bool,
}

impl Act for Report {
    fn stopping(&self) -> bool {
        self.stopping
    }

    fn another_round(&self) -> bool {
        self.another_round
    }

    fn act(&mut self, verdict: Verdict) {
        let (code, detail, action) = match verdict {
            Verdict::Stop(r) => {
                self.stopping = true;
                (r.code, r.detail, "stop")
            }
            Verdict::Warn(r) => (r.code, r.detail, "warn"),
            Verdict::Deny(r) => (r.code, r.detail, "deny"),
            // What a person would have decided is not in the recording.
            Verdict::Escalate(r) => (r.code, r.detail, "escalate"),
            Verdict::Nudge(text) => {
                self.another_round = true;
                (
                    crate::detectors::nudge_code(&text).to_owned(),
                    text,
                    "nudge",
                )
            }
        };
        self.firings.push(Firing {
            round: self.round,
            code,
            action: action.to_owned(),
            detail,
        });
    }
}

impl Replayer {
    fn new(spec: &AgentSpec) -> Self {
        Self {
            guard: Agent::guard_items(spec),
            judge: Judge::replay(spec),
            stats: StopPolicyStats::default(),
            report: Report {
                firings: Vec::new(),
                round: 0,
                stopping: false,
                another_round: false,
            },
            text: String::new(),
            calls: Vec::new(),
            answered_at: None,
            results: Vec::new(),
            open: false,
            judged: spec
                .stop_conditions
                .iter()
                .any(|c| matches!(c.kind(), "llm_loop_check" | "task_complete"))
                .then(Judged::default),
        }
    }

    fn run(self, run_id: &str, events: &[&Recorded]) -> RunReplay {
        self.rebuild(run_id, events).0
    }

    /// Replays the run, and rebuilds its history when a model judges it.
    fn rebuild(mut self, run_id: &str, events: &[&Recorded]) -> (RunReplay, Option<Judged>) {
        let start = events.first().map_or(0, |r| r.at_ms);
        let mut ended = None;
        for r in events {
            let at = r.at_ms.saturating_sub(start);
            match &r.event {
                AgentEvent::StepStarted { .. } | AgentEvent::RetryStarted { .. } => {
                    self.end_round(at);
                    self.report.round += 1;
                    self.report.stopping = false;
                    self.report.another_round = false;
                    self.open = true;
                    self.judge.start_response();
                }
                // What streams after a cut was never read.
                AgentEvent::TextDelta { delta, .. } if !self.judge.is_cut() => {
                    self.text.push_str(delta);
                    self.judge.text(delta, &mut self.report);
                }
                AgentEvent::ToolCallStarted {
                    call_id,
                    name,
                    arguments,
                    ..
                } => {
                    self.answered_at.get_or_insert(at);
                    let call = ToolCall::new(call_id.clone(), name.clone(), arguments.clone());
                    self.calls.push(call);
                }
                AgentEvent::ToolCallFinished {
                    call_id,
                    name,
                    result,
                    is_error,
                    ..
                } => {
                    let result = ToolResult {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        content: result.clone(),
                        is_error: *is_error,
                    };
                    self.results.push((result, at));
                }
                AgentEvent::Nudge { text, .. } => {
                    if let Some(judged) = &mut self.judged {
                        judged.history.push(Message::user(text.clone()));
                    }
                }
                AgentEvent::InferenceRetry { error, .. } => {
                    // The round's attempt failed: no answer to judge.
                    self.open = false;
                    self.text.clear();
                    self.calls.clear();
                    self.results.clear();
                    self.answered_at = None;
                    let at = Duration::from_millis(at);
                    self.judge.failed(&mut self.stats, at, &mut self.report);
                    let error: &dyn std::fmt::Display = error;
                    self.judge
                        .guard(&self.guard, &self.stats, Some(error), &mut self.report);
                }
                AgentEvent::RunFinished {
                    termination, usage, ..
                } => {
                    self.end_round(at);
                    self.stats.total_input_tokens = usage.input_tokens;
                    self.stats.total_output_tokens = usage.output_tokens;
                    self.judge
                        .run_end(&self.guard, &self.stats, &mut self.report);
                    ended = Some(termination.code().to_owned());
                }
                _ => {}
            }
        }
        self.end_round(events.last().map_or(0, |r| r.at_ms.saturating_sub(start)));
        let run = RunReplay {
            run_id: run_id.to_owned(),
            rounds: self.report.round,
            ended,
            firings: self.report.firings,
        };
        (run, self.judged)
    }

    /// Feeds the judge the round that is open, as the run loop does: the
    /// answer, the guard, then its calls before they run and their
    /// results, or the final answer.
    fn end_round(&mut self, at: u64) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let mut calls = std::mem::take(&mut self.calls);
        let results = std::mem::take(&mut self.results);
        if self.judge.is_cut() {
            // The calls of a cut answer are not run.
            calls.clear();
        }
        // The calls in the answer's order: the loop records the results in
        // it (a denied call is reported as started before the others).
        let finished = |c: &ToolCall| {
            results
                .iter()
                .position(|(r, _)| r.call_id == c.id)
                .unwrap_or(usize::MAX)
        };
        calls.sort_by_key(finished);
        let response = InferenceResponse {
            text: std::mem::take(&mut self.text),
            tool_calls: calls,
            ..InferenceResponse::default()
        };
        let answered = self.answered_at.take().unwrap_or(at);
        let report = &mut self.report;
        self.judge
            .answered(&mut self.stats, &response, Duration::from_millis(answered));
        self.judge.guard(&self.guard, &self.stats, None, report);
        if response.tool_calls.is_empty() {
            self.judge.final_answer(&response.text, report);
        } else {
            for (i, call) in response.tool_calls.iter().enumerate() {
                if let Screened::Denied(denial) = self.judge.screen(i, call, report) {
                    self.judge.refuse(denial, report);
                }
            }
            for (i, call) in response.tool_calls.iter().enumerate() {
                if let Some((result, at)) = results.iter().find(|(r, _)| r.call_id == call.id) {
                    let at = Duration::from_millis(*at);
                    self.judge.tool_result(i, call, result, || at, report);
                }
            }
            self.judge.round_results(report);
        }
        // A round that brought no answer (a failed attempt the recording
        // does not mark, a run that ended in it) is not judged.
        let answered = !response.text.is_empty() || !response.tool_calls.is_empty();
        if let Some(judged) = self.judged.as_mut().filter(|_| answered) {
            let final_answer = response.tool_calls.is_empty();
            let InferenceResponse {
                text, tool_calls, ..
            } = response;
            if final_answer {
                if !text.is_empty() {
                    judged.history.push(Message::assistant(text));
                }
            } else {
                let calls = tool_calls.clone();
                judged
                    .history
                    .push(Message::assistant_with_tools(text, tool_calls));
                for call in &calls {
                    if let Some((result, _)) = results.iter().find(|(r, _)| r.call_id == call.id) {
                        judged
                            .history
                            .push(Message::tool(call.id.clone(), result.content.clone()));
                    }
                }
            }
            judged.ends.push(RoundEnd {
                round: report.round,
                final_answer,
                busy: report.stopping || report.another_round,
                len: judged.history.len(),
            });
        }
    }
}
