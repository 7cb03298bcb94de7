//! How runs end: declarative stop conditions, termination reasons and the
//! lifecycle updates that carry them.
//!
//! **Invariant:** a stop reason is never turned into a string before it
//! reaches `RunFinished`: [`RunLifecycleUpdate::Done`] carries the whole
//! [`TerminationReason`], code and detail.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a loop detector does when it fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDetect {
    /// End the run at the first detection.
    #[default]
    Stop,
    /// The first detection adds a corrective user message (a nudge) before
    /// the next inference and resets the detector; the second ends the run.
    NudgeThenStop,
}

fn default_tool_call_loop_threshold() -> usize {
    5
}
fn default_max_cycle() -> usize {
    5
}
fn default_tool_error_threshold() -> usize {
    3
}
fn default_chunk_chars() -> usize {
    50
}
fn default_chanting_threshold() -> usize {
    10
}
fn default_stuck_duplicates() -> usize {
    2
}

/// A declarative stop condition, as written in YAML or JSON.
///
/// Serialized internally tagged by `type` in snake case, e.g.
/// `{ type: max_rounds, rounds: 10 }`. A limit of 0 (or an empty name or
/// pattern) disables the condition. Fields with defaults may be omitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum StopConditionSpec {
    /// Stop once `rounds` inferences have been made (`step_count >= rounds`).
    MaxRounds {
        /// The round limit.
        rounds: usize,
    },
    /// Stop once more than `seconds` have passed since the run started; also
    /// a deadline that cancels work still in flight.
    Timeout {
        /// The limit in seconds.
        seconds: u64,
    },
    /// Stop once reported input + output tokens exceed `max_total`.
    TokenBudget {
        /// The token limit.
        max_total: usize,
    },
    /// Stop once `max` inferences in a row have failed.
    ConsecutiveErrors {
        /// The error streak limit.
        max: usize,
    },
    /// Stop, before it runs, when the model calls the tool `tool_name`.
    StopOnTool {
        /// The tool's name.
        tool_name: String,
    },
    /// Stop when the regex `pattern` matches the latest response text.
    ContentMatch {
        /// A `regex` crate pattern.
        pattern: String,
    },
    /// Stop when the last `window` non-empty responses are identical.
    LoopDetection {
        /// How many identical responses in a row stop the run.
        window: usize,
    },
    /// Stop when the same cycle of tool calls (1 to `max_cycle` calls, each
    /// keyed by name, canonical arguments and result) repeats `threshold`
    /// times in a row. Checked after each round's tool results are recorded.
    ToolCallLoop {
        /// Repetitions that make a loop (default 5; at least 2; 0 disables).
        #[serde(default = "default_tool_call_loop_threshold")]
        threshold: usize,
        /// The longest cycle looked for (default 5; 1 to 16; 0 disables).
        #[serde(default = "default_max_cycle")]
        max_cycle: usize,
        /// Stop at once, or nudge first (default stop).
        #[serde(default)]
        on_detect: OnDetect,
    },
    /// Stop when the same tool with the same arguments (canonical JSON) has
    /// failed `threshold` times in a row, whatever its error texts say: the
    /// last `threshold` calls of the run are that call and all are errors.
    /// A success, or any other call, in between breaks the streak. Checked
    /// after each round's tool results are recorded.
    ToolErrorLoop {
        /// Failures in a row that make a loop (default 3; at least 2; 0
        /// disables).
        #[serde(default = "default_tool_error_threshold")]
        threshold: usize,
        /// Stop at once, or nudge first (default stop).
        #[serde(default)]
        on_detect: OnDetect,
    },
    /// Stop when a cycle of exactly `cycle` tool calls (keyed as for
    /// [`ToolCallLoop`](Self::ToolCallLoop)) repeats `threshold` times in a
    /// row. Unlike `ToolCallLoop`, which looks for every cycle length up to
    /// its `max_cycle` with one threshold, each length gets its own count:
    /// `{ cycle: 1, threshold: 4 }` and `{ cycle: 2, threshold: 3 }` side by
    /// side mean "4 identical calls, or an A/B pair 3 times". A repetition
    /// of a shorter cycle (`A A A A A A`) is not a cycle of 2. Checked after
    /// each round's tool results are recorded.
    ToolCallCycle {
        /// The cycle length (1 to 16; 0 disables).
        cycle: usize,
        /// Repetitions that make a loop (default 5; at least 2; 0 disables).
        #[serde(default = "default_tool_call_loop_threshold")]
        threshold: usize,
        /// Stop at once, or nudge first (default stop).
        #[serde(default)]
        on_detect: OnDetect,
    },
    /// Stop when one `chunk_chars`-character chunk recurs `threshold` times
    /// close together inside one streamed answer. Checked while the answer
    /// streams; the stream is dropped when it fires.
    ContentChanting {
        /// Chunk length in characters (default 50; 8 to 1000; 0 disables).
        #[serde(default = "default_chunk_chars")]
        chunk_chars: usize,
        /// Recurrences that make a loop (default 10; at least 2; 0 disables).
        #[serde(default = "default_chanting_threshold")]
        threshold: usize,
        /// Stop at once, or nudge first (default stop).
        #[serde(default)]
        on_detect: OnDetect,
    },
    /// When the newest response text equals `duplicates` earlier ones of the
    /// run, nudge once; stop on the next repeat.
    Stuck {
        /// Earlier equal texts that make the run stuck (default 2; 0 disables).
        #[serde(default = "default_stuck_duplicates")]
        duplicates: usize,
    },
    /// Stop when `errors` errors — failed inferences and tool calls that
    /// returned an error — happen within `within_seconds` of each other
    /// (a sliding window). Its ladder is set under the agent's
    /// `escalation` (code `error_rate`).
    ErrorRate {
        /// Errors that make the rate too high (1 to 1000; 0 disables).
        errors: usize,
        /// The window, in seconds (at most 86 400; 0 disables).
        within_seconds: u64,
    },
    /// Stop when `rounds` rounds in a row bring no tool result that differs
    /// from every earlier result of the run (rounds without tool calls do
    /// not count). Its ladder is set under `escalation` (code
    /// `no_progress`).
    NoProgress {
        /// Stale rounds in a row (1 to 1000; 0 disables).
        rounds: usize,
    },
    /// Stop, instead of ending naturally, when the final answer asks the
    /// user something the agent needs before it can go on (permission, a
    /// choice, missing information). In auto mode such a round is answered
    /// with a "proceed, don't ask" nudge up to `auto_nudges` times before
    /// the session stops. Its ladder is set under `escalation` (code
    /// `awaiting_user`).
    AwaitingUser {
        /// Auto mode's "proceed" nudges per session (default 2; at most 100).
        #[serde(default = "default_auto_nudges")]
        auto_nudges: usize,
    },
    /// Gemini CLI's third loop-detection layer: once a run is long, every
    /// few rounds a model (`model_id`, typically cheaper than the agent's)
    /// reads the recent history and answers `{ reasoning, confidence }`;
    /// a confidence at or above `threshold` is a detection (code
    /// `llm_loop_check`, the reasoning in its detail). Checked after a
    /// round's tool results; the interval adapts to each answer's
    /// confidence, between `min_interval` and `max_interval`. A check that
    /// fails or answers malformed output is logged and skipped, never a
    /// stop; its tokens count toward the run's usage and budgets, and a
    /// check the budget cannot pay for is not sent. Its ladder is set under
    /// `escalation` (code `llm_loop_check`).
    LlmLoopCheck {
        /// The judging model, a registered model id.
        model_id: String,
        /// Rounds before the first check (default 30; at least 1).
        #[serde(default = "default_check_after_rounds")]
        after_rounds: usize,
        /// Rounds between checks until the first answer (default 10).
        #[serde(default = "default_check_interval")]
        interval: usize,
        /// The interval after a confident answer (default 5; at least 1).
        #[serde(default = "default_min_check_interval")]
        min_interval: usize,
        /// The interval after an answer of confidence 0 (default 15).
        #[serde(default = "default_max_check_interval")]
        max_interval: usize,
        /// The confidence that makes a detection (default 0.9).
        #[serde(default)]
        threshold: Confidence,
        /// How many recent messages the model reads (default 20; 2 to 200).
        #[serde(default = "default_check_history")]
        history: usize,
        /// The most checks one run makes (default 10; 0 disables).
        #[serde(default = "default_max_checks")]
        max_checks: usize,
        /// Stop at once, or nudge first (default stop).
        #[serde(default)]
        on_detect: OnDetect,
    },
    /// A judge of completion: after a round whose answer called no tools
    /// (and, with `every`, every `every` rounds), a model (`model_id`)
    /// reads the user's task and the recent history and answers
    /// `{ reasoning, complete, confidence }`. `complete` with a confidence
    /// at or above `threshold` ends the run `stopped(task_complete)`. A
    /// final answer judged incomplete climbs the ladder set under
    /// `escalation` for `task_complete` (default `[warn]`: reported, the
    /// answer stands; a `nudge` step sends the judge's reasoning back to
    /// the model; a `stop` step ends the run `stopped(task_incomplete)`).
    /// The same cost rules as [`LlmLoopCheck`](Self::LlmLoopCheck).
    TaskComplete {
        /// The judging model, a registered model id.
        model_id: String,
        /// Also judge every `every` rounds with tool calls (default 0:
        /// only final answers).
        #[serde(default)]
        every: usize,
        /// The confidence that makes a verdict count (default 0.9).
        #[serde(default)]
        threshold: Confidence,
        /// How many recent messages the model reads (default 20; 2 to 200).
        #[serde(default = "default_check_history")]
        history: usize,
        /// The most checks one run makes (default 10; 0 disables).
        #[serde(default = "default_max_checks")]
        max_checks: usize,
    },
}

fn default_auto_nudges() -> usize {
    2
}
fn default_check_after_rounds() -> usize {
    30
}
fn default_check_interval() -> usize {
    10
}
fn default_min_check_interval() -> usize {
    5
}
fn default_max_check_interval() -> usize {
    15
}
fn default_check_history() -> usize {
    20
}
fn default_max_checks() -> usize {
    10
}

/// A model's confidence, from 0 to 1 (default 0.9, as a threshold).
///
/// Compared by value; equal when their bits are (so a spec holding one
/// stays `Eq`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Confidence(pub f64);

impl Default for Confidence {
    fn default() -> Self {
        Self(0.9)
    }
}

impl PartialEq for Confidence {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Confidence {}

impl fmt::Display for Confidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl StopConditionSpec {
    /// The variant's `type` tag, which is also the stop code it produces.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MaxRounds { .. } => "max_rounds",
            Self::Timeout { .. } => "timeout",
            Self::TokenBudget { .. } => "token_budget",
            Self::ConsecutiveErrors { .. } => "consecutive_errors",
            Self::StopOnTool { .. } => "stop_on_tool",
            Self::ContentMatch { .. } => "content_match",
            Self::LoopDetection { .. } => "loop_detection",
            Self::ToolCallLoop { .. } => "tool_call_loop",
            Self::ToolErrorLoop { .. } => "tool_error_loop",
            Self::ToolCallCycle { .. } => "tool_call_cycle",
            Self::ContentChanting { .. } => "content_chanting",
            Self::Stuck { .. } => "stuck",
            Self::ErrorRate { .. } => "error_rate",
            Self::NoProgress { .. } => "no_progress",
            Self::AwaitingUser { .. } => "awaiting_user",
            Self::LlmLoopCheck { .. } => "llm_loop_check",
            Self::TaskComplete { .. } => "task_complete",
        }
    }
}

/// Why a stop condition ended a run: a machine-readable `code` (the policy's
/// id) and a human-readable `detail`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StoppedReason {
    /// The stop code, e.g. `max_rounds`.
    pub code: String,
    /// What exactly triggered it, e.g. `reached 10 rounds (limit 10)`.
    pub detail: String,
}

impl StoppedReason {
    /// A reason with the given code and detail.
    pub fn new(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            detail: detail.into(),
        }
    }
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum TerminationReason {
    /// The model answered without calling a tool.
    NaturalEnd,
    /// A stop condition (or a hook) ended the run.
    Stopped(StoppedReason),
    /// The run was cancelled; see the run's cancel cause for by whom.
    Cancelled,
    /// The run failed: a non-retryable inference error, a failing hook, or an
    /// internal fault. The message says which.
    Error(String),
}

impl TerminationReason {
    /// A `Stopped` reason with the given code and detail.
    pub fn stopped(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::Stopped(StoppedReason::new(code, detail))
    }

    /// A short code for the reason: `natural_end`, `cancelled`, `error`,
    /// or a stopped run's stop code (`max_rounds`, `timeout`, …).
    pub fn code(&self) -> &str {
        match self {
            Self::NaturalEnd => "natural_end",
            Self::Stopped(r) => &r.code,
            Self::Cancelled => "cancelled",
            Self::Error(_) => "error",
        }
    }

    /// The stop code if this is `Stopped`.
    pub fn stop_code(&self) -> Option<&str> {
        match self {
            Self::Stopped(r) => Some(&r.code),
            _ => None,
        }
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NaturalEnd => f.write_str("natural end"),
            Self::Stopped(r) => write!(f, "stopped ({}): {}", r.code, r.detail),
            Self::Cancelled => f.write_str("cancelled"),
            Self::Error(m) => write!(f, "error: {m}"),
        }
    }
}

/// Who or what cancelled a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CancelCause {
    /// An explicit request: `cancel_by_thread`, `cancel_run`, a run handle,
    /// a parent token, or the run's future being dropped.
    Requested,
    /// A newer mailbox submission on the same thread interrupted it.
    Interrupted {
        /// The run that took over the thread.
        by_run_id: String,
    },
    /// The runtime shut down.
    Shutdown,
    /// A `timeout` stop condition's deadline passed while work was running.
    Deadline,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The run holds its thread's slot and is making progress.
    Running,
    /// The run has ended.
    Done,
}

/// A change of a run's lifecycle, as requested by a hook or a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "reason", rename_all = "snake_case")]
pub enum RunLifecycleUpdate {
    /// Keep running.
    Running,
    /// End the run with this reason, kept whole.
    Done(TerminationReason),
}

impl RunLifecycleUpdate {
    /// The status this update moves the run to.
    pub fn status(&self) -> RunStatus {
        match self {
            Self::Running => RunStatus::Running,
            Self::Done(_) => RunStatus::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn termination_reasons_are_adjacently_tagged() {
        let stopped = TerminationReason::stopped("max_rounds", "reached 3 rounds");
        assert_eq!(
            serde_json::to_value(&stopped).unwrap(),
            json!({"type": "stopped", "value": {"code": "max_rounds", "detail": "reached 3 rounds"}})
        );
        assert_eq!(
            serde_json::to_value(TerminationReason::Error("boom".into())).unwrap(),
            json!({"type": "error", "value": "boom"})
        );
        assert_eq!(
            serde_json::to_value(TerminationReason::Cancelled).unwrap(),
            json!({"type": "cancelled"})
        );
    }

    #[test]
    fn stop_condition_specs_use_the_documented_shape() {
        let cases = [
            (
                StopConditionSpec::MaxRounds { rounds: 10 },
                json!({"type": "max_rounds", "rounds": 10}),
            ),
            (
                StopConditionSpec::Timeout { seconds: 300 },
                json!({"type": "timeout", "seconds": 300}),
            ),
            (
                StopConditionSpec::TokenBudget { max_total: 100000 },
                json!({"type": "token_budget", "max_total": 100000}),
            ),
            (
                StopConditionSpec::ConsecutiveErrors { max: 3 },
                json!({"type": "consecutive_errors", "max": 3}),
            ),
            (
                StopConditionSpec::StopOnTool {
                    tool_name: "finish".into(),
                },
                json!({"type": "stop_on_tool", "tool_name": "finish"}),
            ),
            (
                StopConditionSpec::ContentMatch {
                    pattern: "(?i)done".into(),
                },
                json!({"type": "content_match", "pattern": "(?i)done"}),
            ),
            (
                StopConditionSpec::LoopDetection { window: 3 },
                json!({"type": "loop_detection", "window": 3}),
            ),
        ];
        for (spec, expected) in cases {
            assert_eq!(serde_json::to_value(&spec).unwrap(), expected);
            assert_eq!(
                serde_json::from_value::<StopConditionSpec>(expected).unwrap(),
                spec
            );
            assert_eq!(spec.kind(), serde_json::to_value(&spec).unwrap()["type"]);
        }
    }

    #[test]
    fn loop_detector_fields_have_defaults() {
        let spec: StopConditionSpec =
            serde_json::from_value(json!({"type": "tool_call_loop"})).unwrap();
        assert_eq!(
            spec,
            StopConditionSpec::ToolCallLoop {
                threshold: 5,
                max_cycle: 5,
                on_detect: OnDetect::Stop
            }
        );
        let spec: StopConditionSpec = serde_json::from_value(
            json!({"type": "content_chanting", "on_detect": "nudge_then_stop"}),
        )
        .unwrap();
        assert_eq!(
            spec,
            StopConditionSpec::ContentChanting {
                chunk_chars: 50,
                threshold: 10,
                on_detect: OnDetect::NudgeThenStop
            }
        );
        let spec: StopConditionSpec = serde_json::from_value(json!({"type": "stuck"})).unwrap();
        assert_eq!(spec, StopConditionSpec::Stuck { duplicates: 2 });
        let spec: StopConditionSpec =
            serde_json::from_value(json!({"type": "tool_error_loop"})).unwrap();
        assert_eq!(
            spec,
            StopConditionSpec::ToolErrorLoop {
                threshold: 3,
                on_detect: OnDetect::Stop
            }
        );
        let spec: StopConditionSpec =
            serde_json::from_value(json!({"type": "tool_call_cycle", "cycle": 2})).unwrap();
        assert_eq!(
            spec,
            StopConditionSpec::ToolCallCycle {
                cycle: 2,
                threshold: 5,
                on_detect: OnDetect::Stop
            }
        );
        assert_eq!(spec.kind(), "tool_call_cycle");
        assert!(
            serde_json::from_value::<StopConditionSpec>(json!({"type": "tool_call_cycle"}))
                .is_err(),
            "cycle has no default"
        );
    }

    #[test]
    fn unknown_fields_in_a_stop_condition_are_rejected() {
        let err = serde_json::from_value::<StopConditionSpec>(
            json!({"type": "max_rounds", "rounds": 1, "extra": 2}),
        );
        assert!(err.is_err());
    }
}

/// What became of a tool call that did not complete normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolCallStatus {
    /// It never began (the run ended first), so it had no effect.
    NotStarted,
    /// It was stopped before it finished, and the tool is read-only: it
    /// had no effect.
    Interrupted,
    /// It was running with possible side effects when it was stopped: it
    /// may or may not have taken effect.
    MayHaveCompleted,
}

impl ToolCallStatus {
    /// The status's name, as in JSON and in the history's result text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotStarted => "not_started",
            Self::Interrupted => "interrupted",
            Self::MayHaveCompleted => "may_have_completed",
        }
    }

    /// What the status means, for the result text the model sees.
    pub fn explanation(self) -> &'static str {
        match self {
            Self::NotStarted => "the call never began, so it had no effect",
            Self::Interrupted => {
                "the call was stopped before it finished; the tool is read-only, so it had no effect"
            }
            Self::MayHaveCompleted => {
                "the call was stopped while it ran; it may or may not have taken effect, so check before repeating it"
            }
        }
    }
}

impl fmt::Display for ToolCallStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call of the run that did not complete normally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct IncompleteToolCall {
    /// The model's id for the call.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// What became of it.
    pub status: ToolCallStatus,
}

impl IncompleteToolCall {
    /// The call `call_id` of tool `name`, with `status`.
    pub fn new(
        call_id: impl Into<String>,
        name: impl Into<String>,
        status: ToolCallStatus,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            name: name.into(),
            status,
        }
    }
}

/// A limit the run was configured with, and how much of it the run used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct LimitUsage {
    /// The setting: `max_rounds`, `token_budget`, `timeout` or
    /// `consecutive_errors`.
    pub name: String,
    /// How much the run used when it ended.
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// What is counted: `rounds`, `tokens`, `ms` or `errors`.
    pub unit: String,
}

impl LimitUsage {
    /// `used` of `limit` `unit`s of the setting `name`.
    pub fn new(name: impl Into<String>, used: u64, limit: u64, unit: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            used,
            limit,
            unit: unit.into(),
        }
    }
}

impl fmt::Display for LimitUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} {}",
            self.name, self.used, self.limit, self.unit
        )
    }
}

/// Why a run ended and how to go on: the termination's code and detail,
/// every configured limit with what the run used of it, whether the run
/// can be continued safely, and a hint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StopReport {
    /// `natural_end`, `cancelled`, `error`, or the stop code.
    pub code: String,
    /// The termination's detail (empty for a natural end).
    pub detail: String,
    /// Each configured limit, with what the run used of it.
    pub limits: Vec<LimitUsage>,
    /// The tool calls that did not complete normally, in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<IncompleteToolCall>,
    /// Whether the thread can be continued without checking anything
    /// first: no tool call may have taken effect unseen.
    pub resumable: bool,
    /// How to continue, when there is something to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The run's sub-agent runs, in the order they ended (their usage is
    /// part of the run's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildRun>,
    /// The calls the run was waiting on when it ended (it ended while
    /// parked: cancelled, interrupted, or `approval_timeout`); each is also
    /// in `tool_calls` as `not_started`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<crate::approval::PendingApproval>,
    /// How long the run waited for its provider's limits, when it waited
    /// (boxed: most runs never wait, and every event carries the report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limited: Option<Box<RateLimitedWait>>,
    /// The run's plan as it ended, when it kept one (the `plan` plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
}

/// The waits of a run for its provider's limits, in its [`StopReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RateLimitedWait {
    /// How many inferences waited.
    pub waits: u32,
    /// How long they waited in all, in milliseconds.
    pub waited_ms: u64,
    /// The longest single wait, in milliseconds.
    pub longest_ms: u64,
}

impl RateLimitedWait {
    /// Counts one more wait of `waited_ms`.
    pub fn add(&mut self, waited_ms: u64) {
        self.waits += 1;
        self.waited_ms += waited_ms;
        self.longest_ms = self.longest_ms.max(waited_ms);
    }
}

/// One child run in its parent's [`StopReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ChildRun {
    /// The child run.
    pub run_id: String,
    /// Its agent.
    pub agent_id: String,
    /// How it ended: `natural_end`, `cancelled`, `error` or the stop code.
    pub code: String,
    /// Inferences it made.
    pub rounds: u32,
    /// What it used (its own children included).
    pub usage: crate::message::TokenUsage,
}

impl ChildRun {
    /// The child `run_id` of `agent_id`, ended with `code` after `rounds`
    /// inferences that used `usage`.
    pub fn new(
        run_id: impl Into<String>,
        agent_id: impl Into<String>,
        code: impl Into<String>,
        rounds: u32,
        usage: crate::message::TokenUsage,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            agent_id: agent_id.into(),
            code: code.into(),
            rounds,
            usage,
        }
    }
}

impl StopReport {
    /// A report of `termination` with no limits, no incomplete calls and
    /// no hint; resumable.
    pub fn new(termination: &TerminationReason) -> Self {
        let detail = match termination {
            TerminationReason::NaturalEnd | TerminationReason::Cancelled => String::new(),
            TerminationReason::Error(message) => message.clone(),
            TerminationReason::Stopped(r) => r.detail.clone(),
        };
        Self {
            code: termination.code().to_owned(),
            detail,
            limits: Vec::new(),
            tool_calls: Vec::new(),
            resumable: true,
            hint: None,
            children: Vec::new(),
            pending_approvals: Vec::new(),
            rate_limited: None,
            plan: None,
        }
    }

    /// The calls that may have taken effect unseen.
    pub fn uncertain_calls(&self) -> impl Iterator<Item = &IncompleteToolCall> {
        self.tool_calls
            .iter()
            .filter(|c| c.status == ToolCallStatus::MayHaveCompleted)
    }
}
