//! The judge: one component that decides, round by round, what the
//! configured run control does — the statistics policies, the detectors,
//! their escalation ladders and the built-in guard, evaluated in one order
//! and combined in one way. The agent loop and `rein replay` both feed it
//! what a run does and act on what it says, so a replay cannot judge a run
//! differently from a live run.
//!
//! # What it is fed, in order
//!
//! Each inference attempt (a round, or a retry of one):
//!
//! 1. [`Judge::start_response`], then [`Judge::text`] for each piece of
//!    the answer as it streams (a verdict other than a warning cuts the
//!    answer: what follows is not judged, and its tool calls do not run);
//! 2. the attempt's end: [`Judge::answered`] with the answer, or
//!    [`Judge::failed`] (the `error_rate` detectors see a failed attempt
//!    first);
//! 3. [`Judge::guard`] — in a live run after the `AfterInference` hooks:
//!    the statistics policies and `stuck` detectors of `stop_conditions`
//!    in list order, then `max_rounds`; not evaluated once a stop is
//!    requested, and the first stop ends it;
//! 4. an answer with tool calls: [`Judge::screen`] for each call before it
//!    runs, in call order (a `deny` step refuses it); [`Judge::tool_result`]
//!    for each result, in call order (a tool error is seen by `error_rate`
//!    at once); then [`Judge::round_results`] (tool-call loops, then
//!    `no_progress`). An answer without: [`Judge::final_answer`]
//!    (`awaiting_user`, unless a stop or another round is requested).
//!
//! Replay also gives it [`Judge::run_end`] (the run's token totals, which a
//! recording has only at its end).
//!
//! # How verdicts combine
//!
//! Every verdict the judge keeps is handed to the caller's [`Act`] at once,
//! in evaluation order: a warning or denial is reported, a nudge is queued
//! and asks for another round, and the first stop is the run's. Where
//! several detectors of one kind judge the same observation, the first
//! verdict in `stop_conditions` order is kept (the tool-call, `error_rate`
//! and `no_progress` detectors all see it; the streaming, `awaiting_user`
//! and denial checks stop at the first that fires).
//!
//! # Live and replay
//!
//! A live run ends at its first stop. A replay goes on to the end of the
//! recording, and from a condition's stop on, that condition's verdicts
//! are dropped before they are combined: the rest of the run is judged as
//! if the condition had been removed. Up to a run's first stop the two are
//! the same evaluation.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use rein_runtime_contract::escalation::ToolLoopRule;
use rein_runtime_contract::inference::InferenceResponse;
use rein_runtime_contract::lifecycle::StoppedReason;
use rein_runtime_contract::message::{ToolCall, ToolResult};
use rein_runtime_contract::spec::AgentSpec;

use crate::agent::GuardItem;
use crate::detectors::{CallRecord, Detectors, Verdict, denied_result, nudge_code};
use crate::policies::{InferenceRecord, StopDecision, StopPolicyStats, record_inference};

/// What a caller does with the judge's verdicts.
pub(crate) trait Act {
    /// Whether the run is to end after this round (a stop was requested,
    /// by the judge or otherwise).
    fn stopping(&self) -> bool;

    /// Whether another round is requested (a nudge, or otherwise).
    fn another_round(&self) -> bool;

    /// Acts on one verdict: report a warning or denial, queue a nudge,
    /// request a stop (the first one requested is the run's).
    fn act(&mut self, verdict: Verdict);
}

/// What happens to a tool call about to run.
#[derive(Debug)]
pub(crate) enum Screened {
    /// It runs.
    Run,
    /// A `deny` step refused it: it does not run; [`Judge::refuse`]
    /// reports it once the caller has recorded the call.
    Denied(Denial),
    /// A step past `deny` stops the run: neither it nor the calls after it
    /// run.
    Stop,
}

/// A call a `deny` step refused, to report with [`Judge::refuse`].
#[derive(Debug)]
#[must_use = "a denial is reported with Judge::refuse"]
pub(crate) struct Denial(StoppedReason);

impl Denial {
    /// The refused call's result.
    pub(crate) fn result(&self) -> String {
        denied_result(&self.0)
    }
}

/// The run control of one run (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Judge {
    detectors: Detectors,
    /// Whether any detector watches the text, tool calls, or errors and
    /// progress.
    watch_text: bool,
    watch_calls: bool,
    watch_progress: bool,
    /// Whether the answer streaming now was cut.
    cut: bool,
    /// Positions, in the answer's calls, of the calls a `deny` step
    /// refused this round (empty unless one did).
    denied: Vec<usize>,
    /// The round's finished calls, as the tool-call detectors keep them;
    /// reused from round to round.
    records: Vec<CallRecord>,
    /// In replay: the codes that stopped (`None` in a live run).
    retired: Option<Vec<String>>,
}

impl Judge {
    /// The judge of a live run of `spec` (whose tool rules are `tool_rules`).
    pub(crate) fn live(spec: &AgentSpec, tool_rules: &Arc<BTreeMap<String, ToolLoopRule>>) -> Self {
        let detectors = Detectors::new(&spec.stop_conditions, &spec.escalation, tool_rules);
        Self {
            watch_text: detectors.watches_text(),
            watch_calls: detectors.watches_tool_calls(),
            watch_progress: detectors.watches_progress(),
            detectors,
            cut: false,
            denied: Vec::new(),
            records: Vec::new(),
            retired: None,
        }
    }

    /// The judge of a recorded run replayed against `spec`.
    pub(crate) fn replay(spec: &AgentSpec) -> Self {
        let rules = Arc::new(spec.tool_rules.clone());
        Self {
            retired: Some(Vec::new()),
            ..Self::live(spec, &rules)
        }
    }

    /// Whether any detector watches the streamed text.
    pub(crate) fn watches_text(&self) -> bool {
        self.watch_text
    }

    /// Whether the answer streaming now was cut (nothing more of it is
    /// judged; its tool calls do not run).
    pub(crate) fn is_cut(&self) -> bool {
        self.cut
    }

    /// An inference attempt starts.
    pub(crate) fn start_response(&mut self) {
        self.cut = false;
        self.denied.clear();
        self.records.clear();
        if self.watch_text {
            self.detectors.start_response();
        }
    }

    /// A piece of the streamed answer. Returns whether the answer is cut
    /// here (a verdict other than a warning, acted on already).
    pub(crate) fn text(&mut self, delta: &str, act: &mut impl Act) -> bool {
        if !self.watch_text || self.cut {
            return self.cut;
        }
        let retired = &self.retired;
        if let Some(verdict) = self.detectors.observe_text(delta, |v| admitted(retired, v)) {
            self.cut = !matches!(verdict, Verdict::Warn(_));
            self.act(act, verdict);
        }
        self.cut
    }

    /// The attempt answered `response` (without the calls of a cut answer)
    /// `at` this time into the run.
    pub(crate) fn answered(
        &mut self,
        stats: &mut StopPolicyStats,
        response: &InferenceResponse,
        at: Duration,
    ) {
        record_inference(stats, InferenceRecord::Succeeded(response), millis(at));
    }

    /// The attempt failed `at` this time into the run.
    pub(crate) fn failed(&mut self, stats: &mut StopPolicyStats, at: Duration, act: &mut impl Act) {
        record_inference(stats, InferenceRecord::Failed, millis(at));
        self.error(at, act);
    }

    /// The built-in guard after an attempt (`failed`: its error, if it
    /// failed).
    pub(crate) fn guard(
        &mut self,
        guard: &[GuardItem],
        stats: &StopPolicyStats,
        failed: Option<&dyn Display>,
        act: &mut impl Act,
    ) {
        if act.stopping() {
            return;
        }
        self.evaluate(guard, stats, failed, true, act);
    }

    /// The run ended with the totals in `stats` (replay: the statistics
    /// policies judged once more, on the run's token totals).
    pub(crate) fn run_end(
        &mut self,
        guard: &[GuardItem],
        stats: &StopPolicyStats,
        act: &mut impl Act,
    ) {
        self.evaluate(guard, stats, None, false, act);
    }

    /// The guard's items in order; the `stuck` detectors too unless
    /// `with_stuck` is false.
    fn evaluate(
        &mut self,
        guard: &[GuardItem],
        stats: &StopPolicyStats,
        failed: Option<&dyn Display>,
        with_stuck: bool,
        act: &mut impl Act,
    ) {
        for item in guard {
            let verdict = match item {
                GuardItem::Policy(policy) => match policy.evaluate(stats) {
                    StopDecision::Continue => None,
                    StopDecision::Stop { code, mut detail } => {
                        if let (Some(error), "max_rounds") = (failed, code.as_str()) {
                            detail = format!("{detail}; the last round failed: {error}");
                        }
                        Some(Verdict::Stop(StoppedReason { code, detail }))
                    }
                },
                GuardItem::Stuck(i) if with_stuck => {
                    self.detectors.stuck(*i).and_then(|d| d.check(stats))
                }
                GuardItem::Stuck(_) => None,
            };
            let Some(verdict) = verdict.filter(|v| admitted(&self.retired, v)) else {
                continue;
            };
            let stop = matches!(verdict, Verdict::Stop(_));
            self.act(act, verdict);
            if stop {
                return;
            }
        }
    }

    /// The call at position `index` of the answer's calls is about to run.
    pub(crate) fn screen(&mut self, index: usize, call: &ToolCall, act: &mut impl Act) -> Screened {
        if !self.detectors.denies() {
            return Screened::Run;
        }
        let retired = &self.retired;
        let Some(verdict) = self.detectors.screen(call, |v| admitted(retired, v)) else {
            return Screened::Run;
        };
        let screened = match verdict {
            Verdict::Deny(reason) => {
                self.denied.push(index);
                return Screened::Denied(Denial(reason));
            }
            Verdict::Stop(_) => Screened::Stop,
            _ => Screened::Run,
        };
        self.act(act, verdict);
        screened
    }

    /// Reports a call [`screen`](Self::screen) denied.
    pub(crate) fn refuse(&mut self, denial: Denial, act: &mut impl Act) {
        self.act(act, Verdict::Deny(denial.0));
    }

    /// The call at position `index` returned `result`, `at` this time into
    /// the run (read only for an error). A call a `deny` step refused is
    /// not counted as run.
    pub(crate) fn tool_result(
        &mut self,
        index: usize,
        call: &ToolCall,
        result: &ToolResult,
        at: impl FnOnce() -> Duration,
        act: &mut impl Act,
    ) {
        if !self.watch_calls || (!self.denied.is_empty() && self.denied.contains(&index)) {
            return;
        }
        if result.is_error && self.watch_progress {
            self.error(at(), act);
        }
        let record = self.detectors.record(call, result);
        self.records.push(record);
    }

    /// The round's tool results are all in: the tool-call loop detectors,
    /// then `no_progress`.
    pub(crate) fn round_results(&mut self, act: &mut impl Act) {
        if !self.watch_calls {
            return;
        }
        let retired = &self.retired;
        let loops = self
            .detectors
            .observe_tool_results(&self.records, |v| admitted(retired, v));
        if let Some(verdict) = loops {
            self.act(act, verdict);
        }
        if self.watch_progress {
            let retired = &self.retired;
            let progress = self
                .detectors
                .observe_progress(&self.records, |v| admitted(retired, v));
            if let Some(verdict) = progress {
                self.act(act, verdict);
            }
        }
        self.records.clear();
    }

    /// The answer had no tool calls: unless a stop or another round is
    /// requested, `awaiting_user` judges it.
    pub(crate) fn final_answer(&mut self, answer: &str, act: &mut impl Act) {
        if act.stopping() || act.another_round() {
            return;
        }
        let retired = &self.retired;
        if let Some(verdict) = self
            .detectors
            .observe_final(answer, |v| admitted(retired, v))
        {
            self.act(act, verdict);
        }
    }

    /// An error (a failed attempt or a tool error) `at` this time into the
    /// run: the `error_rate` detectors.
    fn error(&mut self, at: Duration, act: &mut impl Act) {
        if !self.watch_progress {
            return;
        }
        let retired = &self.retired;
        if let Some(verdict) = self.detectors.observe_error(at, |v| admitted(retired, v)) {
            self.act(act, verdict);
        }
    }

    /// Hands `verdict` to the caller; in replay, a stop retires its code.
    fn act(&mut self, act: &mut impl Act, verdict: Verdict) {
        if let (Some(retired), Verdict::Stop(reason)) = (&mut self.retired, &verdict) {
            retired.push(reason.code.clone());
        }
        act.act(verdict);
    }
}

/// Whether `verdict` counts: in a live run always; in replay unless its
/// condition stopped already.
fn admitted(retired: &Option<Vec<String>>, verdict: &Verdict) -> bool {
    let Some(retired) = retired else {
        return true;
    };
    let code = match verdict {
        Verdict::Warn(r) | Verdict::Deny(r) | Verdict::Stop(r) | Verdict::Escalate(r) => {
            r.code.as_str()
        }
        Verdict::Nudge(text) => nudge_code(text),
    };
    !retired.iter().any(|c| c == code)
}

/// `at` in whole milliseconds.
fn millis(at: Duration) -> u64 {
    u64::try_from(at.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::lifecycle::StopConditionSpec;

    /// Records what the judge asks, as replay does.
    #[derive(Default)]
    struct Listed {
        verdicts: Vec<Verdict>,
        stopping: bool,
    }

    impl Act for Listed {
        fn stopping(&self) -> bool {
            self.stopping
        }
        fn another_round(&self) -> bool {
            false
        }
        fn act(&mut self, verdict: Verdict) {
            self.stopping |= matches!(verdict, Verdict::Stop(_));
            self.verdicts.push(verdict);
        }
    }

    fn codes(listed: &Listed) -> Vec<&str> {
        listed
            .verdicts
            .iter()
            .map(|v| match v {
                Verdict::Warn(r) | Verdict::Deny(r) | Verdict::Stop(r) | Verdict::Escalate(r) => {
                    r.code.as_str()
                }
                Verdict::Nudge(text) => nudge_code(text),
            })
            .collect()
    }

    fn spec() -> AgentSpec {
        AgentSpec::new("a")
            .with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 1 })
            .with_stop_condition(StopConditionSpec::MaxRounds { rounds: 1 })
    }

    #[test]
    fn the_guard_ends_at_its_first_stop_and_is_skipped_once_a_stop_is_requested() {
        let spec = spec();
        let guard = crate::agent::Agent::guard_items(&spec);
        let mut judge = Judge::replay(&spec);
        let mut stats = StopPolicyStats::default();
        let mut listed = Listed::default();
        judge.failed(&mut stats, Duration::ZERO, &mut listed);
        judge.guard(&guard, &stats, Some(&"503"), &mut listed);
        assert_eq!(codes(&listed), ["consecutive_errors"]);
        // A stop requested already: nothing more this round.
        judge.guard(&guard, &stats, None, &mut listed);
        assert_eq!(codes(&listed), ["consecutive_errors"]);
    }

    #[test]
    fn in_replay_a_stopped_condition_is_judged_as_removed_and_the_next_one_acts() {
        let spec = spec();
        let guard = crate::agent::Agent::guard_items(&spec);
        let mut judge = Judge::replay(&spec);
        let mut stats = StopPolicyStats::default();
        let mut listed = Listed::default();
        judge.failed(&mut stats, Duration::ZERO, &mut listed);
        judge.guard(&guard, &stats, Some(&"503"), &mut listed);
        // The next round: `consecutive_errors` still holds, but it stopped
        // already; `max_rounds` is evaluated and stops, with the failure.
        listed.stopping = false;
        judge.failed(&mut stats, Duration::ZERO, &mut listed);
        judge.guard(&guard, &stats, Some(&"503"), &mut listed);
        assert_eq!(codes(&listed), ["consecutive_errors", "max_rounds"]);
        match &listed.verdicts[1] {
            Verdict::Stop(r) => assert!(r.detail.ends_with("the last round failed: 503")),
            other => panic!("{other:?}"),
        }
        // A live judge acts on the first stop each time.
        let mut live = Judge::live(&spec, &Arc::new(spec.tool_rules.clone()));
        let mut listed = Listed::default();
        live.guard(&guard, &stats, None, &mut listed);
        assert_eq!(codes(&listed), ["consecutive_errors"]);
    }
}
