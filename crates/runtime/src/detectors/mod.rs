//! Detectors: the stop conditions that need more than
//! [`StopPolicyStats`](crate::policies::StopPolicyStats) — repeated tool-call
//! cycles, the same call failing again and again, "chanting" inside one
//! streamed answer, stuck responses, errors piling up over time and rounds
//! without progress — each checked at its own point of the round.
//!
//! Each detection climbs the detector's escalation
//! [`Ladder`] (its `on_detect`, or the agent's `escalation:` entry for its
//! code): a [`Verdict`] to warn, nudge, deny, escalate or stop. A `deny` makes the
//! tool-call detectors refuse the repeated call before it runs
//! (`Detectors::screen`); the next detection after the `deny` steps moves
//! on.
//!
//! | detector | checked | code |
//! |---|---|---|
//! | [`ToolCallLoopDetector::new`] | after the round's tool results are recorded, in `stop_conditions` order | `tool_call_loop` |
//! | [`ToolCallLoopDetector::exact_cycle`] | likewise | `tool_call_cycle` |
//! | [`ToolErrorLoopDetector`] | likewise | `tool_error_loop` |
//! | [`ChantingDetector`] | while the answer streams | `content_chanting` |
//! | [`StuckDetector`] | after each inference, in `stop_conditions` order | `stuck` |
//! | [`ErrorRateDetector`] | after a failed inference and each tool error | `error_rate` |
//! | [`NoProgressDetector`] | after the round's tool results are recorded | `no_progress` |
//! | [`AwaitingUserDetector`] | on a final answer (one without tool calls) | `awaiting_user` |
//! | `llm_loop_check` (a model judges) | after a round with tool calls, from `after_rounds` on, every few rounds | `llm_loop_check` |
//! | `task_complete` (a model judges) | after a final answer nothing else answered; with `every`, every few rounds | `task_complete`, `task_incomplete` |
//!
//! Detectors do not cancel and do not end runs themselves: they return a
//! [`Verdict`]; the run's judge (`agent_loop::judge`, shared by the loop
//! and replay) decides in which order they are asked and which verdicts
//! count, and the agent loop acts on them. They are public so that the
//! same rules can watch streams outside a run (and be benchmarked); inside a
//! run, list the matching `StopConditionSpec` instead.

pub(crate) mod awaiting_user;
mod chanting;
pub(crate) mod model_checks;
mod progress;
mod stuck;
mod tool_calls;
mod tool_errors;

pub use awaiting_user::{
    ANSWER_STARTS, ASKING_EN, ASKING_ZH, AwaitingUserDetector, BLOCKED, CLOSING_CHARS, COMPLETION,
    CONDITIONAL, DEFERRED, DONE_MARKERS, HOLD, INVESTIGATION, NEEDS, NOT_ASKING, NOT_DONE,
    NOT_NEEDED, OFFER_EXTRAS, OFFER_FORMS, PENDING_MARKERS, PROCEED_NUDGE, REQUEST_STARTS,
    UNRESOLVED, WAITING, looks_like_awaiting_user,
};
pub use chanting::{CHANTING_NUDGE, ChantingDetector, MEAN_GAP_FACTOR};
pub use model_checks::{
    COMPLETION_INSTRUCTION, COMPLETION_QUESTION, LLM_LOOP_NUDGE, LOOP_CHECK_INSTRUCTION,
    LOOP_CHECK_QUESTION, TASK_INCOMPLETE_NUDGE,
};
pub use progress::{ERROR_RATE_NUDGE, ErrorRateDetector, NO_PROGRESS_NUDGE, NoProgressDetector};
pub use stuck::{STUCK_NUDGE, StuckDetector};
pub use tool_calls::{MAX_TOOL_LOOP_THRESHOLD, ToolCallLoopDetector};
pub use tool_errors::ToolErrorLoopDetector;

use std::sync::Arc;

use std::collections::BTreeMap;

use rein_runtime_contract::escalation::{EscalationAction, Ladder, ToolLoopRule};
use rein_runtime_contract::lifecycle::{OnDetect, StopConditionSpec, StoppedReason};
use rein_runtime_contract::message::{ToolCall, ToolResult};

/// What a detector asks of the loop when it fires: the step of its
/// escalation [`Ladder`] this detection reached.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Report the detection (a `detected` event) and go on.
    Warn(StoppedReason),
    /// Add this user message before the next inference and go on.
    Nudge(String),
    /// Do not run the repeated tool call from now on (its result says
    /// why); the reason names the detector and what it saw.
    Deny(StoppedReason),
    /// End the run.
    Stop(StoppedReason),
    /// Park the run for a person before its next inference.
    Escalate(StoppedReason),
}

/// A detector's place on its ladder: each detection takes the next step.
#[derive(Debug, Clone)]
struct Escalation {
    steps: Steps,
    fired: u32,
    nudged: bool,
}

/// A detector's ladder: the one its condition's `on_detect` implies
/// (nothing allocated: most detectors of most runs keep it), or one given.
#[derive(Debug, Clone)]
enum Steps {
    OnDetect(OnDetect),
    Ladder(Ladder),
}

impl Steps {
    /// The action of the `n`th detection (from 1), as
    /// [`Ladder::action`] of the ladder these steps are.
    fn action(&self, n: u32) -> EscalationAction {
        match self {
            Self::OnDetect(OnDetect::NudgeThenStop) if n <= 1 => EscalationAction::Nudge,
            Self::OnDetect(_) => EscalationAction::Stop,
            Self::Ladder(ladder) => ladder.action(n),
        }
    }
}

impl Escalation {
    fn new(on_detect: OnDetect) -> Self {
        Self::with(Steps::OnDetect(on_detect))
    }

    fn with_ladder(ladder: Ladder) -> Self {
        Self::with(Steps::Ladder(ladder))
    }

    fn with(steps: Steps) -> Self {
        Self {
            steps,
            fired: 0,
            nudged: false,
        }
    }

    /// The verdict for a detection: the ladder's next step. A stop's
    /// detail says whether a nudge came first.
    fn fire(&mut self, code: &str, detail: String, nudge: &str) -> Verdict {
        self.fired = self.fired.saturating_add(1);
        match self.steps.action(self.fired) {
            EscalationAction::Warn => Verdict::Warn(StoppedReason::new(code, detail)),
            EscalationAction::Nudge => {
                self.nudged = true;
                Verdict::Nudge(nudge.to_owned())
            }
            EscalationAction::Deny => Verdict::Deny(StoppedReason::new(code, detail)),
            EscalationAction::Escalate => Verdict::Escalate(StoppedReason::new(code, detail)),
            _ => {
                let detail = if self.nudged {
                    format!("{detail} (again, after a nudge)")
                } else {
                    detail
                };
                Verdict::Stop(StoppedReason::new(code, detail))
            }
        }
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

    fn screen(&mut self, plain: u64, name: &str) -> Option<Verdict> {
        match self {
            Self::Calls(d) => d.screen(plain, name),
            Self::Errors(d) => d.screen(plain, name),
        }
    }

    fn denies(&self) -> bool {
        match self {
            Self::Calls(d) => d.denies(),
            Self::Errors(d) => d.denies(),
        }
    }
}

/// The calls a tool-call detector refuses after a `deny` step, by their
/// name-and-arguments key, with the detection that denied them.
///
/// The detection that takes a `deny` step has already run its calls, so
/// the step **arms** one denial: the next repetition is refused without
/// climbing the ladder, and the model gets a denied result to change
/// course on. Later repetitions climb it (another `deny` refuses that
/// repetition; a step past `deny` lifts the denial).
#[derive(Debug, Default)]
pub(crate) struct Denied {
    keys: Vec<u64>,
    code: &'static str,
    /// Repetitions refused before the ladder moves on.
    armed: u32,
}

impl Denied {
    fn set(&mut self, code: &'static str, keys: impl IntoIterator<Item = u64>) {
        self.code = code;
        self.keys.clear();
        self.keys.extend(keys);
        self.armed = 1;
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The verdict for a call about to run: `None` unless it is denied;
    /// then the ladder's next step (a step past `deny` lifts the denial).
    fn screen(
        &mut self,
        escalation: &mut Escalation,
        plain: u64,
        name: &str,
        nudge: &str,
    ) -> Option<Verdict> {
        if !self.keys.contains(&plain) {
            return None;
        }
        if self.armed > 0 {
            self.armed -= 1;
            return Some(Verdict::Deny(StoppedReason::new(
                self.code,
                format!("the tool call {name} repeats a call denied for repeating; it did not run"),
            )));
        }
        let detail = format!(
            "the tool call {name} was made again after it was denied for repeating; it did not run"
        );
        let verdict = escalation.fire(self.code, detail, nudge);
        if !matches!(verdict, Verdict::Deny(_)) {
            self.keys.clear();
        }
        Some(verdict)
    }
}

/// The detector whose nudge `text` is: `tool_call_loop` (also for
/// `tool_call_cycle`, which shares its nudge), `tool_error_loop`,
/// `content_chanting`, `stuck`, `error_rate`, `no_progress`,
/// `awaiting_user`, or `nudge` for a text no detector writes.
pub(crate) fn nudge_code(text: &str) -> &'static str {
    if text.starts_with("You appear to be repeating the same tool calls") {
        "tool_call_loop"
    } else if text.starts_with("The tool call ") && text.contains("has failed") {
        "tool_error_loop"
    } else if text == CHANTING_NUDGE {
        "content_chanting"
    } else if text == STUCK_NUDGE {
        "stuck"
    } else if text == ERROR_RATE_NUDGE {
        "error_rate"
    } else if text == NO_PROGRESS_NUDGE {
        "no_progress"
    } else if text == PROCEED_NUDGE {
        "awaiting_user"
    } else if text.starts_with(LLM_LOOP_NUDGE) {
        "llm_loop_check"
    } else if text.starts_with(TASK_INCOMPLETE_NUDGE) {
        "task_incomplete"
    } else {
        "nudge"
    }
}

/// Builds [`HashedKey`] hashers: for maps and sets keyed by a `u64` that is
/// a hash already.
pub(crate) type ByHash = std::hash::BuildHasherDefault<HashedKey>;

/// Hashes a `u64` key that is a hash already to the key itself, its high
/// half folded into the low one (maps index buckets by the low bits, which
/// a polynomial hash mixes least).
#[derive(Default)]
pub(crate) struct HashedKey(u64);

impl std::hash::Hasher for HashedKey {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys come here; any other input still hashes.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// The text of a denied call's result.
pub(crate) fn denied_result(reason: &StoppedReason) -> String {
    format!(
        "not run: Rein's `{}` detector denied this call: {}. Calling it again with the same arguments will not help; change the arguments or the approach.",
        reason.code, reason.detail
    )
}

/// What the tool-call detectors keep of one finished call, made once per
/// call for all of them, so the result itself can move into the history.
#[derive(Debug, Clone)]
pub(crate) struct CallRecord {
    /// Name, canonical arguments and result text.
    key: u64,
    /// Name and canonical arguments alone (what `deny` refuses).
    plain: u64,
    /// The result text alone (what `no_progress` compares).
    outcome: u64,
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
        Self::named(call, result, Arc::from(call.name.as_str()))
    }

    fn named(call: &ToolCall, result: &ToolResult, name: Arc<str>) -> Self {
        let plain = tool_calls::call_key(call);
        let outcome = tool_calls::outcome_key(&result.content);
        Self {
            key: tool_calls::with_result(plain, outcome),
            plain,
            outcome,
            name,
            failure: result
                .is_error
                .then(|| (plain, snippet(&result.content, 200))),
        }
    }
}

/// `detector` with `ladder` when there is one.
fn maybe<T>(detector: T, ladder: Option<Ladder>, with: fn(T, Ladder) -> T) -> T {
    match ladder {
        Some(ladder) => with(detector, ladder),
        None => detector,
    }
}

/// The detectors of one run, built from the agent's `stop_conditions`:
/// boxed, and nothing at all for an agent without any (a run waiting in a
/// round holds 8 bytes for them instead of ~150).
#[derive(Debug, Default)]
pub(crate) struct Detectors(Option<Box<Set>>);

/// The detectors of a run that has some.
#[derive(Debug, Default)]
struct Set {
    /// In `stop_conditions` order.
    tool_loops: Vec<ToolDetector>,
    chanting: Vec<ChantingDetector>,
    /// Indexed by the position among the spec's `stuck` conditions.
    stuck: Vec<StuckDetector>,
    /// `error_rate` and `no_progress`, in list order.
    progress: Vec<Progress>,
    /// `awaiting_user`.
    awaiting: Vec<AwaitingUserDetector>,
    /// The tool names records were made for, shared by every record of
    /// the run (a run calls a handful of tools, many times).
    names: Vec<Arc<str>>,
}

/// A detector of errors over time or of progress over rounds.
#[derive(Debug)]
enum Progress {
    Errors(ErrorRateDetector),
    Rounds(NoProgressDetector),
}

impl Set {
    /// The detectors of `specs`, each with its ladder from `escalation`
    /// (by code) when one is given, and the tool-call loop detectors with
    /// `tool_rules`.
    pub(crate) fn new(
        specs: &[StopConditionSpec],
        escalation: &BTreeMap<String, Ladder>,
        tool_rules: &Arc<BTreeMap<String, ToolLoopRule>>,
    ) -> Self {
        let mut d = Self::default();
        let ladder = |code: &str| escalation.get(code).cloned();
        for spec in specs {
            match *spec {
                StopConditionSpec::ToolCallLoop {
                    threshold,
                    max_cycle,
                    on_detect,
                } => d.tool_loops.extend(
                    ToolCallLoopDetector::new(threshold, max_cycle, on_detect).map(|t| {
                        ToolDetector::Calls(
                            maybe(
                                t,
                                ladder("tool_call_loop"),
                                ToolCallLoopDetector::with_ladder,
                            )
                            .with_tool_rules(tool_rules.clone()),
                        )
                    }),
                ),
                StopConditionSpec::ToolCallCycle {
                    cycle,
                    threshold,
                    on_detect,
                } => d.tool_loops.extend(
                    ToolCallLoopDetector::exact_cycle(cycle, threshold, on_detect).map(|t| {
                        ToolDetector::Calls(
                            maybe(
                                t,
                                ladder("tool_call_cycle"),
                                ToolCallLoopDetector::with_ladder,
                            )
                            .with_tool_rules(tool_rules.clone()),
                        )
                    }),
                ),
                StopConditionSpec::ToolErrorLoop {
                    threshold,
                    on_detect,
                } => d
                    .tool_loops
                    .extend(ToolErrorLoopDetector::new(threshold, on_detect).map(|t| {
                        ToolDetector::Errors(maybe(
                            t,
                            ladder("tool_error_loop"),
                            ToolErrorLoopDetector::with_ladder,
                        ))
                    })),
                StopConditionSpec::ContentChanting {
                    chunk_chars,
                    threshold,
                    on_detect,
                } => d.chanting.extend(
                    ChantingDetector::new(chunk_chars, threshold, on_detect).map(|c| {
                        maybe(c, ladder("content_chanting"), ChantingDetector::with_ladder)
                    }),
                ),
                StopConditionSpec::Stuck { duplicates } => {
                    let stuck = StuckDetector::new(duplicates);
                    d.stuck
                        .push(maybe(stuck, ladder("stuck"), StuckDetector::with_ladder));
                }
                StopConditionSpec::ErrorRate {
                    errors,
                    within_seconds,
                } => d
                    .progress
                    .extend(ErrorRateDetector::new(errors, within_seconds).map(|e| {
                        Progress::Errors(maybe(
                            e,
                            ladder("error_rate"),
                            ErrorRateDetector::with_ladder,
                        ))
                    })),
                StopConditionSpec::AwaitingUser { .. } => d.awaiting.push(maybe(
                    AwaitingUserDetector::new(),
                    ladder("awaiting_user"),
                    AwaitingUserDetector::with_ladder,
                )),
                StopConditionSpec::NoProgress { rounds } => {
                    d.progress.extend(NoProgressDetector::new(rounds).map(|p| {
                        Progress::Rounds(maybe(
                            p,
                            ladder("no_progress"),
                            NoProgressDetector::with_ladder,
                        ))
                    }))
                }
                _ => {}
            }
        }
        d
    }

    /// The record of `call` answered by `result`, its name shared with
    /// the run's earlier records of the same tool.
    pub(crate) fn record(&mut self, call: &ToolCall, result: &ToolResult) -> CallRecord {
        let name = match self.names.iter().find(|n| ***n == *call.name) {
            Some(name) => name.clone(),
            None => {
                let name: Arc<str> = Arc::from(call.name.as_str());
                // Bounded: a run calling ever new names shares none past it.
                if self.names.len() < 64 {
                    self.names.push(name.clone());
                }
                name
            }
        };
        CallRecord::named(call, result, name)
    }

    /// Whether a detector refuses some calls now (a `deny` step was taken).
    pub(crate) fn denies(&self) -> bool {
        self.tool_loops.iter().any(ToolDetector::denies)
    }

    /// Checks a call about to run against the calls detectors denied: the
    /// first verdict `admit` keeps (`Deny`: do not run it; `Stop`: end the
    /// run; `Warn` or `Nudge`: run it), or `None`.
    pub(crate) fn screen(
        &mut self,
        call: &ToolCall,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        let plain = tool_calls::call_key(call);
        self.tool_loops
            .iter_mut()
            .find_map(|d| d.screen(plain, &call.name).filter(&admit))
    }

    /// An inference failed or a tool call returned an error, `after` the
    /// run started (a recorded time, in replay): every `error_rate`
    /// detector sees it; the first verdict `admit` keeps.
    pub(crate) fn observe_error(
        &mut self,
        after: std::time::Duration,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        let mut verdict = None;
        for p in &mut self.progress {
            if let Progress::Errors(d) = p {
                let v = d.observe_after(after).filter(&admit);
                verdict = verdict.or(v);
            }
        }
        verdict
    }

    /// A final answer (no tool calls): the `awaiting_user` detectors'
    /// first verdict `admit` keeps.
    pub(crate) fn observe_final(
        &mut self,
        answer: &str,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.awaiting
            .iter_mut()
            .find_map(|d| d.check(answer).filter(&admit))
    }

    /// Whether any detector watches errors or progress.
    pub(crate) fn watches_progress(&self) -> bool {
        !self.progress.is_empty()
    }

    /// A round's tool results (rounds without tool calls do not count):
    /// every `no_progress` detector sees them; the first verdict `admit`
    /// keeps.
    pub(crate) fn observe_progress(
        &mut self,
        records: &[CallRecord],
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        let mut verdict = None;
        for p in &mut self.progress {
            if let Progress::Rounds(d) = p {
                let v = d.observe_round(records).filter(&admit);
                verdict = verdict.or(v);
            }
        }
        verdict
    }

    /// Whether any detector watches the text stream.
    pub(crate) fn watches_text(&self) -> bool {
        !self.chanting.is_empty()
    }

    /// Whether any detector watches tool calls.
    pub(crate) fn watches_tool_calls(&self) -> bool {
        !self.tool_loops.is_empty() || !self.progress.is_empty()
    }

    /// A new answer starts streaming.
    pub(crate) fn start_response(&mut self) {
        self.chanting
            .iter_mut()
            .for_each(ChantingDetector::start_response);
    }

    /// A piece of the streamed answer; the first verdict `admit` keeps, in
    /// list order.
    pub(crate) fn observe_text(
        &mut self,
        text: &str,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.chanting
            .iter_mut()
            .find_map(|d| d.observe(text).filter(&admit))
    }

    /// The round's finished calls, in call order: every tool-call detector
    /// sees them; the first verdict `admit` keeps, in list order.
    pub(crate) fn observe_tool_results(
        &mut self,
        records: &[CallRecord],
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        let mut verdict = None;
        for d in &mut self.tool_loops {
            let v = d.observe_records(records).filter(&admit);
            if verdict.is_none() {
                verdict = v;
            }
        }
        verdict
    }
}

impl Detectors {
    /// The detectors of `specs`, each with its ladder from `escalation`
    /// (by code) when one is given, and the tool-call loop detectors with
    /// `tool_rules`; nothing boxed when `specs` make none.
    pub(crate) fn new(
        specs: &[StopConditionSpec],
        escalation: &BTreeMap<String, Ladder>,
        tool_rules: &Arc<BTreeMap<String, ToolLoopRule>>,
    ) -> Self {
        let set = Set::new(specs, escalation, tool_rules);
        let none = set.tool_loops.is_empty()
            && set.chanting.is_empty()
            && set.stuck.is_empty()
            && set.progress.is_empty()
            && set.awaiting.is_empty();
        Self((!none).then(|| Box::new(set)))
    }

    /// The `i`-th `stuck` detector (by position among the spec's `stuck`
    /// conditions).
    pub(crate) fn stuck(&mut self, i: usize) -> Option<&mut StuckDetector> {
        self.0.as_mut()?.stuck.get_mut(i)
    }

    /// See [`Set::record`]; a plain record when there are no detectors.
    pub(crate) fn record(&mut self, call: &ToolCall, result: &ToolResult) -> CallRecord {
        match &mut self.0 {
            Some(set) => set.record(call, result),
            None => CallRecord::new(call, result),
        }
    }

    /// Whether a detector refuses some calls now (a `deny` step was taken).
    pub(crate) fn denies(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.denies())
    }

    /// See [`Set::screen`].
    pub(crate) fn screen(
        &mut self,
        call: &ToolCall,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.screen(call, admit)
    }

    /// See [`Set::observe_error`].
    pub(crate) fn observe_error(
        &mut self,
        after: std::time::Duration,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.observe_error(after, admit)
    }

    /// See [`Set::observe_final`].
    pub(crate) fn observe_final(
        &mut self,
        answer: &str,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.observe_final(answer, admit)
    }

    /// Whether any detector watches errors or progress.
    pub(crate) fn watches_progress(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.watches_progress())
    }

    /// See [`Set::observe_progress`].
    pub(crate) fn observe_progress(
        &mut self,
        records: &[CallRecord],
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.observe_progress(records, admit)
    }

    /// Whether any detector watches the text stream.
    pub(crate) fn watches_text(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.watches_text())
    }

    /// Whether any detector watches tool calls.
    pub(crate) fn watches_tool_calls(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.watches_tool_calls())
    }

    /// A new answer starts streaming.
    pub(crate) fn start_response(&mut self) {
        if let Some(set) = &mut self.0 {
            set.start_response();
        }
    }

    /// See [`Set::observe_text`].
    pub(crate) fn observe_text(
        &mut self,
        text: &str,
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.observe_text(text, admit)
    }

    /// See [`Set::observe_tool_results`].
    pub(crate) fn observe_tool_results(
        &mut self,
        records: &[CallRecord],
        admit: impl Fn(&Verdict) -> bool,
    ) -> Option<Verdict> {
        self.0.as_mut()?.observe_tool_results(records, admit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_on_detect_acts_as_the_ladder_it_implies() {
        for on_detect in [OnDetect::Stop, OnDetect::NudgeThenStop] {
            let ladder = Ladder::from_on_detect(on_detect);
            for n in 0..=6 {
                assert_eq!(
                    Steps::OnDetect(on_detect).action(n),
                    ladder.action(n),
                    "{on_detect:?}, detection {n}"
                );
            }
        }
    }
}
