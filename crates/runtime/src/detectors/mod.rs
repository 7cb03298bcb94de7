//! Loop detectors: the stop conditions that need more than
//! [`StopPolicyStats`](crate::policies::StopPolicyStats) — repeated tool-call
//! cycles, the same call failing again and again, "chanting" inside one
//! streamed answer, and stuck responses — each checked at its own point of
//! the round, each able to nudge before it stops.
//!
//! | detector | checked | code |
//! |---|---|---|
//! | [`ToolCallLoopDetector::new`] | after the round's tool results are recorded, in `stop_conditions` order | `tool_call_loop` |
//! | [`ToolCallLoopDetector::exact_cycle`] | likewise | `tool_call_cycle` |
//! | [`ToolErrorLoopDetector`] | likewise | `tool_error_loop` |
//! | [`ChantingDetector`] | while the answer streams | `content_chanting` |
//! | [`StuckDetector`] | after each inference, in `stop_conditions` order | `stuck` |
//!
//! Detectors do not cancel and do not end runs themselves: they return a
//! [`Verdict`] and the agent loop acts on it. They are public so that the
//! same rules can watch streams outside a run (and be benchmarked); inside a
//! run, list the matching `StopConditionSpec` instead.

mod chanting;
mod stuck;
mod tool_calls;
mod tool_errors;

pub use chanting::{CHANTING_NUDGE, ChantingDetector, MEAN_GAP_FACTOR};
pub use stuck::{STUCK_NUDGE, StuckDetector};
pub use tool_calls::{MAX_TOOL_LOOP_THRESHOLD, ToolCallLoopDetector};
pub use tool_errors::ToolErrorLoopDetector;

use std::sync::Arc;

use rein_runtime_contract::lifecycle::{OnDetect, StopConditionSpec, StoppedReason};
use rein_runtime_contract::message::{ToolCall, ToolResult};

/// What a detector asks of the loop when it fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Add this user message before the next inference and go on.
    Nudge(String),
    /// End the run.
    Stop(StoppedReason),
}

/// First detection nudges (when configured), the next one stops.
#[derive(Debug, Clone, Copy)]
struct Escalation {
    on_detect: OnDetect,
    nudged: bool,
}

impl Escalation {
    fn new(on_detect: OnDetect) -> Self {
        Self {
            on_detect,
            nudged: false,
        }
    }

    /// The verdict for a detection: a nudge the first time when the policy
    /// is `nudge_then_stop`, else a stop whose detail says whether a nudge
    /// came first.
    fn fire(&mut self, code: &str, detail: String, nudge: &str) -> Verdict {
        if self.on_detect == OnDetect::NudgeThenStop && !self.nudged {
            self.nudged = true;
            return Verdict::Nudge(nudge.to_owned());
        }
        let detail = if self.nudged {
            format!("{detail} (again, after a nudge)")
        } else {
            detail
        };
        Verdict::Stop(StoppedReason::new(code, detail))
    }
}

/// The first `max` characters of `text`, with an ellipsis when cut.
pub(crate) fn snippet(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// A detector checked after the round's tool results are recorded.
#[derive(Debug)]
enum ToolDetector {
    /// `tool_call_loop` and `tool_call_cycle`.
    Calls(ToolCallLoopDetector),
    /// `tool_error_loop`.
    Errors(ToolErrorLoopDetector),
}

impl ToolDetector {
    fn observe_records(&mut self, records: &[CallRecord]) -> Option<Verdict> {
        match self {
            Self::Calls(d) => d.observe_records(records),
            Self::Errors(d) => d.observe_records(records),
        }
    }
}

/// What the tool-call detectors keep of one finished call, made once per
/// call for all of them, so the result itself can move into the history.
#[derive(Debug, Clone)]
pub(crate) struct CallRecord {
    /// Name, canonical arguments and result text.
    key: u64,
    name: Arc<str>,
    /// For a failed call: the key of its name and arguments alone, and the
    /// start of its error text.
    failure: Option<(u64, String)>,
}

impl CallRecord {
    /// The records of a round's calls, in call order.
    pub(crate) fn of_round(round: &[(&ToolCall, &ToolResult)]) -> Vec<Self> {
        round.iter().map(|(c, r)| Self::new(c, r)).collect()
    }

    /// The record of `call` answered by `result`.
    pub(crate) fn new(call: &ToolCall, result: &ToolResult) -> Self {
        Self {
            key: tool_calls::call_key(call, Some(&result.content)),
            name: Arc::from(call.name.as_str()),
            failure: result.is_error.then(|| {
                (
                    tool_calls::call_key(call, None),
                    snippet(&result.content, 200),
                )
            }),
        }
    }
}

/// The detectors of one run, built from the agent's `stop_conditions`.
#[derive(Debug, Default)]
pub(crate) struct Detectors {
    /// In `stop_conditions` order.
    tool_loops: Vec<ToolDetector>,
    chanting: Vec<ChantingDetector>,
    /// Indexed by the position among the spec's `stuck` conditions.
    pub(crate) stuck: Vec<StuckDetector>,
}

impl Detectors {
    pub(crate) fn new(specs: &[StopConditionSpec]) -> Self {
        let mut d = Self::default();
        for spec in specs {
            match *spec {
                StopConditionSpec::ToolCallLoop {
                    threshold,
                    max_cycle,
                    on_detect,
                } => d.tool_loops.extend(
                    ToolCallLoopDetector::new(threshold, max_cycle, on_detect)
                        .map(ToolDetector::Calls),
                ),
                StopConditionSpec::ToolCallCycle {
                    cycle,
                    threshold,
                    on_detect,
                } => d.tool_loops.extend(
                    ToolCallLoopDetector::exact_cycle(cycle, threshold, on_detect)
                        .map(ToolDetector::Calls),
                ),
                StopConditionSpec::ToolErrorLoop {
                    threshold,
                    on_detect,
                } => d.tool_loops.extend(
                    ToolErrorLoopDetector::new(threshold, on_detect).map(ToolDetector::Errors),
                ),
                StopConditionSpec::ContentChanting {
                    chunk_chars,
                    threshold,
                    on_detect,
                } => d
                    .chanting
                    .extend(ChantingDetector::new(chunk_chars, threshold, on_detect)),
                StopConditionSpec::Stuck { duplicates } => {
                    d.stuck.push(StuckDetector::new(duplicates));
                }
                _ => {}
            }
        }
        d
    }

    /// Whether any detector watches the text stream.
    pub(crate) fn watches_text(&self) -> bool {
        !self.chanting.is_empty()
    }

    /// Whether any detector watches tool calls.
    pub(crate) fn watches_tool_calls(&self) -> bool {
        !self.tool_loops.is_empty()
    }

    /// A new answer starts streaming.
    pub(crate) fn start_response(&mut self) {
        self.chanting
            .iter_mut()
            .for_each(ChantingDetector::start_response);
    }

    /// A piece of the streamed answer; the first verdict, in list order.
    pub(crate) fn observe_text(&mut self, text: &str) -> Option<Verdict> {
        self.chanting.iter_mut().find_map(|d| d.observe(text))
    }

    /// The round's finished calls, in call order; the first verdict, in
    /// list order.
    pub(crate) fn observe_tool_results(&mut self, records: &[CallRecord]) -> Option<Verdict> {
        let mut verdict = None;
        for d in &mut self.tool_loops {
            let v = d.observe_records(records);
            if verdict.is_none() {
                verdict = v;
            }
        }
        verdict
    }
}
