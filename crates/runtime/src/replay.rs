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
//! can hold many runs, interleaved.
//!
//! # What replay sees
//!
//! A run is rebuilt round by round from its events: the streamed text
//! (`text_delta`), the tool calls and their results, failed attempts
//! (`inference_retry`) and the run's end. The detectors and the statistics
//! policies get them in the order and at the times the run had them, with
//! the agent's escalation ladders and tool rules. A recording has no usage
//! per inference, only the run's total, so `token_budget` is judged once,
//! at the run's end. The model saw no nudge or stop that replay reports:
//! each firing is where the configured conditions *would* have acted, and
//! the recorded run goes on as it went.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::inference::InferenceResponse;
use rein_runtime_contract::message::{ToolCall, ToolResult};
use rein_runtime_contract::spec::AgentSpec;
use serde::{Deserialize, Serialize};

use crate::agent::{Agent, GuardItem};
use crate::detectors::{CallRecord, Detectors, Verdict};
use crate::policies::{InferenceRecord, StopDecision, StopPolicyStats, record_inference};

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
    let mut order: Vec<&str> = Vec::new();
    let mut runs: BTreeMap<&str, Vec<&Recorded>> = BTreeMap::new();
    for r in recording {
        let id = r.event.run_id();
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
            is_run.then(|| Replayer::new(spec).run(id, &events))
        })
        .collect()
}

/// The state of one run being replayed.
struct Replayer {
    guard: Vec<GuardItem>,
    detectors: Detectors,
    stats: StopPolicyStats,
    /// Policies that fired already (a policy keeps holding once it does),
    /// and detectors that would have stopped the run: what they see after
    /// that is not reported.
    fired: BTreeSet<String>,
    firings: Vec<Firing>,
    round: u32,
    text: String,
    calls: Vec<ToolCall>,
    results: Vec<ToolResult>,
    /// Calls of the round a `deny` step would have refused: as in a live
    /// run, they are not observed as run (their errors and results do not
    /// count).
    denied: BTreeSet<String>,
    open: bool,
}

impl Replayer {
    fn new(spec: &AgentSpec) -> Self {
        let rules = std::sync::Arc::new(spec.tool_rules.clone());
        Self {
            guard: Agent::guard_items(spec),
            detectors: Detectors::new(&spec.stop_conditions, &spec.escalation, &rules),
            stats: StopPolicyStats::default(),
            fired: BTreeSet::new(),
            firings: Vec::new(),
            round: 0,
            text: String::new(),
            calls: Vec::new(),
            results: Vec::new(),
            denied: BTreeSet::new(),
            open: false,
        }
    }

    fn run(mut self, run_id: &str, events: &[&Recorded]) -> RunReplay {
        let start = events.first().map_or(0, |r| r.at_ms);
        let mut ended = None;
        for r in events {
            let at = r.at_ms.saturating_sub(start);
            match &r.event {
                AgentEvent::StepStarted { .. } | AgentEvent::RetryStarted { .. } => {
                    self.end_round(at);
                    self.round += 1;
                    self.open = true;
                    self.detectors.start_response();
                }
                AgentEvent::TextDelta { delta, .. } => {
                    self.text.push_str(delta);
                    if let Some(v) = self.detectors.observe_text(delta) {
                        self.fire(v);
                    }
                }
                AgentEvent::ToolCallStarted {
                    call_id,
                    name,
                    arguments,
                    ..
                } => {
                    let call = ToolCall::new(call_id.clone(), name.clone(), arguments.clone());
                    // Screened before it runs, as the loop does.
                    if self.detectors.denies()
                        && let Some(verdict) = self.detectors.screen(&call)
                    {
                        if matches!(verdict, Verdict::Deny(_)) {
                            self.denied.insert(call_id.clone());
                        }
                        self.fire(verdict);
                    }
                    self.calls.push(call);
                }
                AgentEvent::ToolCallFinished {
                    call_id,
                    name,
                    result,
                    is_error,
                    ..
                } => {
                    self.results.push(ToolResult {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        content: result.clone(),
                        is_error: *is_error,
                    });
                    if *is_error && !self.denied.contains(call_id) {
                        self.error(at);
                    }
                }
                AgentEvent::InferenceRetry { .. } => {
                    // The round's attempt failed: no answer to judge.
                    self.open = false;
                    self.text.clear();
                    self.calls.clear();
                    record_inference(&mut self.stats, InferenceRecord::Failed, at);
                    self.guard_check();
                    self.error(at);
                }
                AgentEvent::RunFinished {
                    termination, usage, ..
                } => {
                    self.end_round(at);
                    self.stats.total_input_tokens = usage.input_tokens;
                    self.stats.total_output_tokens = usage.output_tokens;
                    self.guard_check();
                    ended = Some(termination.code().to_owned());
                }
                _ => {}
            }
        }
        self.end_round(events.last().map_or(0, |r| r.at_ms.saturating_sub(start)));
        RunReplay {
            run_id: run_id.to_owned(),
            rounds: self.round,
            ended,
            firings: self.firings,
        }
    }

    /// Judges the round that is open, as the run loop does after an
    /// inference and after its tool results.
    fn end_round(&mut self, at: u64) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let response = InferenceResponse {
            text: std::mem::take(&mut self.text),
            tool_calls: std::mem::take(&mut self.calls),
            ..InferenceResponse::default()
        };
        record_inference(&mut self.stats, InferenceRecord::Succeeded(&response), at);
        self.guard_check();
        let results = std::mem::take(&mut self.results);
        let denied = std::mem::take(&mut self.denied);
        let pairs: Vec<(&ToolCall, &ToolResult)> = response
            .tool_calls
            .iter()
            .filter(|c| !denied.contains(&c.id))
            .filter_map(|c| results.iter().find(|r| r.call_id == c.id).map(|r| (c, r)))
            .collect();
        let records = CallRecord::of_round(&pairs);
        // As the loop does for a round with calls, even when all were
        // denied (no records).
        if !response.tool_calls.is_empty() {
            for v in self.detectors.observe_tool_results_each(&records) {
                self.fire(v);
            }
            if let Some(v) = self.detectors.observe_progress(&records) {
                self.fire(v);
            }
        }
        if response.tool_calls.is_empty()
            && let Some(v) = self.detectors.observe_final(&response.text)
        {
            self.fire(v);
        }
    }

    /// The statistics policies and stuck detectors, in the guard's order.
    fn guard_check(&mut self) {
        let mut verdicts = Vec::new();
        for item in &self.guard {
            match item {
                GuardItem::Policy(policy) => {
                    if let StopDecision::Stop { code, detail } = policy.evaluate(&self.stats)
                        && self.fired.insert(code.clone())
                    {
                        verdicts.push(Verdict::Stop(
                            rein_runtime_contract::lifecycle::StoppedReason::new(code, detail),
                        ));
                    }
                }
                GuardItem::Stuck(i) => {
                    if let Some(v) = self
                        .detectors
                        .stuck
                        .get_mut(*i)
                        .and_then(|d| d.check(&self.stats))
                    {
                        verdicts.push(v);
                    }
                }
            }
        }
        for v in verdicts {
            self.fire(v);
        }
    }

    fn error(&mut self, at: u64) {
        let after = std::time::Duration::from_millis(at);
        if let Some(v) = self.detectors.observe_error(after) {
            self.fire(v);
        }
    }

    fn fire(&mut self, verdict: Verdict) {
        let (code, detail, action) = match verdict {
            Verdict::Stop(r) => (r.code, r.detail, "stop"),
            Verdict::Warn(r) => (r.code, r.detail, "warn"),
            Verdict::Deny(r) => (r.code, r.detail, "deny"),
            Verdict::Nudge(text) => (
                crate::detectors::nudge_code(&text).to_owned(),
                text,
                "nudge",
            ),
        };
        let stopped = self
            .firings
            .iter()
            .any(|f| f.code == code && f.action == "stop");
        if stopped {
            return;
        }
        self.firings.push(Firing {
            round: self.round,
            code,
            action: action.to_owned(),
            detail,
        });
    }
}
