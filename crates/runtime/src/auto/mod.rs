//! Auto mode: goal-driven sessions of several runs ("rounds") on one
//! thread, under an [`AutomationPolicy`].
//!
//! After each round, [`AgentRuntime::auto_run`] decides whether to start
//! another round on the same thread or stop, checking in this order (the
//! first that holds is the stop reason):
//!
//! | check | `stop_reason` |
//! |---|---|
//! | the round was cancelled / failed | `cancelled` / `run error: <message>` |
//! | a loop detector stopped the round | `loop detected (<code>): <detail>` |
//! | the round's answer repeated earlier rounds' answers again after a nudge | `stuck across rounds: <detail>` |
//! | the guardrail blocks | `guardrail blocking` |
//! | rounds ≥ the ceiling (20 by default; builder only) | `max rounds reached (N)` |
//! | `strictHeuristics` and the answer reports a failure | `failure heuristic matched` |
//! | `strictHeuristics` and the answer asks the user for input | `user-input heuristic matched` |
//! | the goals hold on the latest completed report (AND / OR) | `automation goals reached` |
//! | completed experiments ≥ `maxExperiments` | `max experiments reached (N/M)` |
//! | session tokens ≥ `maxTokens` | `token budget reached (N/M)` |
//! | the agent called `terminate` with `success` and no goal is unmet | `queue exhausted, no replan condition met` |
//!
//! Otherwise it **replans**: the next round starts with a continuation
//! message naming the unmet goals. That covers every row of the source's
//! replan table: no policy, unmet goals, experiment budget left, and only
//! tokens/heuristics set all replan; a met stop condition never gets here.
//!
//! Reports ([`AutomationPlugin`]) and session tokens belong to the thread:
//! its session begins with the thread's first `auto_run`, from then on every
//! run on the thread adds to them, they outlive one `auto_run`, and
//! [`AgentRuntime::reset_session`] clears both ([`AgentRuntime::delete_thread`]
//! drops the session). They live in memory only.
//!
//! # Stopping a session
//!
//! Each `auto_run` has its own cancellation token, a child of the request's
//! [`with_cancellation`](RunRequest::with_cancellation) token: cancelling
//! that token, calling [`AgentRuntime::cancel_by_thread`] (or
//! `cancel_and_wait_by_thread`, or `delete_thread`) on the thread, or
//! dropping the `auto_run` future stops the session — the round in progress
//! is cancelled, no further round starts, and the result's `stop_reason` is
//! `cancelled`. A cancel that arrives between rounds, or while a round is
//! finishing, is not lost.
//!
//! # A layer on the runtime
//!
//! Auto mode stands on the runtime's public surfaces only: it starts rounds
//! with [`AgentRuntime::run`], keeps its settings and sessions as runtime
//! extensions ([`AgentRuntimeBuilder::with_extension`],
//! [`AgentRuntime::extension_or_insert_with`]), learns of every run's end
//! and of thread cancellations through a [`RunObserver`](crate::RunObserver),
//! and reads reports from the state key [`AutomationPlugin`] exports. The
//! engine never refers to it. `progress` events belong to the session (their
//! `run_id` is the session id, `auto-<n>`), so a run's last event stays its
//! `RunFinished`.

mod heuristics;
mod metrics;
mod monologue;
mod policy;
pub(crate) mod session;

pub use heuristics::{
    CLOSING_PARAGRAPH_CHARS, FAILURE_HARD_SIGNALS, FAILURE_SOFT_SIGNALS, USER_INPUT_PHRASES_EN,
    USER_INPUT_PHRASES_ZH, closing_paragraph, looks_like_failure, looks_like_user_input_request,
};
pub use metrics::{AutomationPlugin, MetricsReport, MetricsReports};
pub use policy::{AutomationPolicy, Goal, Logic, Operator};

use std::sync::Arc;

use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::Message;

use crate::builder::AgentRuntimeBuilder;
use crate::detectors::STUCK_NUDGE;
use crate::run::{AgentRunResult, RunRequest};
use crate::runtime::{AgentRuntime, RuntimeError};
use monologue::{Monologue, Repeat};
use rein_runtime_contract::lifecycle::StopConditionSpec;
use session::{Session, SessionObserver, Sessions};

/// The stop codes of the loop detectors. A round that one of them stops
/// ends the session (`loop detected (<code>): <detail>`): the next round
/// would start with fresh detectors and repeat the loop.
pub const LOOP_STOP_CODES: [&str; 5] = [
    "tool_call_loop",
    "tool_call_cycle",
    "tool_error_loop",
    "content_chanting",
    "stuck",
];

/// The default hard ceiling on rounds per `auto_run`.
pub const DEFAULT_AUTO_ROUND_CEILING: u32 = 20;

/// Auto mode's settings, kept as a runtime extension (set through the
/// builder methods below).
#[derive(Clone)]
struct AutoSettings {
    ceiling: u32,
    guardrail: Option<Arc<dyn AutoGuardrail>>,
}

impl Default for AutoSettings {
    fn default() -> Self {
        Self {
            ceiling: DEFAULT_AUTO_ROUND_CEILING,
            guardrail: None,
        }
    }
}

/// Auto mode's per-runtime state, created on first use.
struct AutoState {
    sessions: Arc<Sessions>,
}

impl AgentRuntimeBuilder {
    /// Sets auto mode's hard ceiling on rounds per `auto_run` (default 20).
    /// No policy field changes it.
    pub fn with_auto_round_ceiling(mut self, rounds: u32) -> Self {
        self.extension_mut::<AutoSettings>().ceiling = rounds;
        self
    }

    /// Adds auto mode's guardrail, checked after every round.
    pub fn with_auto_guardrail(mut self, guardrail: Arc<dyn AutoGuardrail>) -> Self {
        self.extension_mut::<AutoSettings>().guardrail = Some(guardrail);
        self
    }
}

/// A user-supplied check after every round; `Some(reason)` stops auto mode
/// with `guardrail blocking` (the reason goes in a progress message).
pub trait AutoGuardrail: Send + Sync {
    /// Checks the round that just ended on `thread_id`.
    fn check(&self, thread_id: &str, round: &AgentRunResult) -> Option<String>;
}

/// The outcome of an auto-mode session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AutoRunResult {
    /// Why it stopped (one of the strings in the module docs).
    pub stop_reason: String,
    /// Rounds run.
    pub rounds: u32,
    /// The thread's session tokens when it stopped.
    pub tokens_used_session: u64,
    /// Every round's result, in order.
    pub runs: Vec<AgentRunResult>,
}

/// What to do after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Stop(String),
    Replan,
}

/// The goals' verdict on the latest completed report.
fn goals_met(policy: &AutomationPolicy, session: &Session) -> bool {
    let Some(report) = session.latest_completed() else {
        return false;
    };
    let holds = |g: &Goal| report.metrics.get(&g.metric).is_some_and(|v| g.holds(*v));
    match policy.logic {
        Logic::And => policy.goals.iter().all(holds),
        Logic::Or => policy.goals.iter().any(holds),
    }
}

fn declared_done(result: &AgentRunResult) -> bool {
    matches!(&result.termination, TerminationReason::Stopped(r)
        if r.code == "terminate" && r.detail.starts_with("status: success"))
}

/// The stop decision after round `round` (from 1), in the documented order.
pub(crate) fn decide(
    result: &AgentRunResult,
    session: &Session,
    policy: Option<&AutomationPolicy>,
    round: u32,
    ceiling: u32,
    guardrail: Option<&str>,
    monologue: Option<&str>,
) -> Decision {
    let stop = |s: String| Decision::Stop(s);
    match &result.termination {
        TerminationReason::Cancelled => return stop("cancelled".into()),
        TerminationReason::Error(m) => return stop(format!("run error: {m}")),
        TerminationReason::Stopped(r) if LOOP_STOP_CODES.contains(&r.code.as_str()) => {
            return stop(format!("loop detected ({}): {}", r.code, r.detail));
        }
        _ => {}
    }
    if let Some(detail) = monologue {
        return stop(format!("stuck across rounds: {detail}"));
    }
    if guardrail.is_some() {
        return stop("guardrail blocking".into());
    }
    if round >= ceiling {
        return stop(format!("max rounds reached ({ceiling})"));
    }
    if policy.is_none_or(AutomationPolicy::strict_heuristics) {
        if looks_like_failure(&result.response) {
            return stop("failure heuristic matched".into());
        }
        if looks_like_user_input_request(&result.response) {
            return stop("user-input heuristic matched".into());
        }
    }
    let has_goals = policy.is_some_and(|p| !p.goals.is_empty());
    let met = policy.is_some_and(|p| has_goals && goals_met(p, session));
    if met {
        return stop("automation goals reached".into());
    }
    if let Some(max) = policy.and_then(|p| p.max_experiments) {
        let done = session.completed();
        if done >= max {
            return stop(format!("max experiments reached ({done}/{max})"));
        }
    }
    if let Some(max) = policy.and_then(|p| p.max_tokens)
        && session.tokens >= max
    {
        return stop(format!("token budget reached ({}/{max})", session.tokens));
    }
    if declared_done(result) && !has_goals {
        return stop("queue exhausted, no replan condition met".into());
    }
    Decision::Replan
}

/// The user message that starts a replanned round.
pub(crate) fn continuation(
    policy: Option<&AutomationPolicy>,
    session: &Session,
    next_round: u32,
    ceiling: u32,
) -> String {
    let mut text = format!("Continue the task (auto-run round {next_round} of at most {ceiling}).");
    let Some(policy) = policy else {
        return text;
    };
    let latest = session.latest_completed();
    let unmet: Vec<String> = policy
        .goals
        .iter()
        .filter(|g| {
            !latest
                .and_then(|r| r.metrics.get(&g.metric))
                .is_some_and(|v| g.holds(*v))
        })
        .map(|g| match latest.and_then(|r| r.metrics.get(&g.metric)) {
            Some(v) => format!("{g} (latest: {v})"),
            None => format!("{g} (not reported yet)"),
        })
        .collect();
    if !unmet.is_empty() {
        let logic = match policy.logic {
            Logic::And => "all must hold",
            Logic::Or => "any one suffices",
        };
        text.push_str(&format!(
            " Unmet goals ({logic}): {}. Report each experiment's results with report_metrics.",
            unmet.join("; ")
        ));
    }
    if let Some(max) = policy.max_experiments {
        text.push_str(&format!(
            " Completed experiments: {}/{max}.",
            session.completed()
        ));
    }
    text
}

/// Where one `auto_run`'s progress events go, and what they carry.
struct Reporter<'a> {
    sink: &'a dyn EventSink,
    session_id: &'a str,
    thread_id: &'a str,
    max_tokens: Option<u64>,
}

impl Reporter<'_> {
    fn progress(&self, round: Option<&AgentRunResult>, message: String, tokens: u64) {
        self.sink.emit(AgentEvent::Progress {
            run_id: self.session_id.to_owned(),
            thread_id: self.thread_id.to_owned(),
            message,
            tokens_used_session: tokens,
            max_tokens: self.max_tokens,
            round_run_id: round.map(|r| r.run_id.clone()),
        });
    }

    /// Ends the session: the stop's progress event, then the result. The
    /// last of `runs` is the round the stop follows.
    fn stop(&self, stop_reason: String, runs: Vec<AgentRunResult>, tokens: u64) -> AutoRunResult {
        self.progress(
            runs.last(),
            format!("auto-run stop condition: {stop_reason}"),
            tokens,
        );
        AutoRunResult {
            stop_reason,
            rounds: u32::try_from(runs.len()).unwrap_or(u32::MAX),
            tokens_used_session: tokens,
            runs,
        }
    }
}

impl AgentRuntime {
    /// Runs `request` in auto mode: round after round on its thread until a
    /// stop condition of `policy` (or the ceiling, the guardrail, a
    /// cancelled or failed round) holds. A `progress` event follows every
    /// round and the stop (`auto-run stop condition: <stop_reason>`); they go
    /// to the request's event sink if it has one, else to `sink`.
    ///
    /// # Errors
    ///
    /// As for [`run`](Self::run), when the first round cannot start. Later
    /// rounds that cannot start end the session with `run error: …`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the current round (see `run`); no further
    /// round starts.
    pub async fn auto_run(
        &self,
        request: RunRequest,
        policy: Option<AutomationPolicy>,
        sink: Arc<dyn EventSink>,
    ) -> Result<AutoRunResult, RuntimeError> {
        let policy = policy.filter(|p| !p.is_empty());
        let sink = request.event_sink.clone().unwrap_or(sink);
        let settings = self
            .extension::<AutoSettings>()
            .map(|s| (*s).clone())
            .unwrap_or_default();
        let ceiling = settings.ceiling;
        let sessions = self.auto_state().sessions.clone();
        let thread = request.thread_id.clone();
        let session_id = self.next_id("auto");
        let token = request
            .cancellation
            .as_ref()
            .map_or_else(CancellationToken::new, CancellationToken::child_token);
        // Dropping the future drops this guard too: the round in progress is
        // cancelled (as `run`'s drop does) and nothing else starts.
        let _cancel_on_drop = token.clone().drop_guard();
        let (_running, created) = sessions.begin(&thread, &session_id, token.clone());
        let report = Reporter {
            sink: &*sink,
            session_id: &session_id,
            thread_id: &thread,
            max_tokens: policy.as_ref().and_then(|p| p.max_tokens),
        };
        let mut monologue = Monologue::new(self.stuck_duplicates(request.agent_id.as_deref()));
        let mut runs: Vec<AgentRunResult> = Vec::new();
        let mut round_request = request.clone().with_cancellation(token.clone());
        loop {
            let round = u32::try_from(runs.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1);
            // A cancel between rounds, or while the last one was finishing.
            if token.is_cancelled() {
                let tokens = sessions.tokens(&thread);
                return Ok(report.stop("cancelled".to_owned(), runs, tokens));
            }
            let result = match self.run(round_request, sink.clone()).await {
                Ok(result) => result,
                Err(e) => {
                    if runs.is_empty() {
                        if created {
                            sessions.forget(&thread);
                        }
                        return Err(e);
                    }
                    let tokens = sessions.tokens(&thread);
                    return Ok(report.stop(format!("run error: {e}"), runs, tokens));
                }
            };
            let session = sessions.get(&thread);
            report.progress(
                Some(&result),
                format!("auto-run round {round} finished: {}", result.termination),
                session.tokens,
            );
            let blocked = settings
                .guardrail
                .as_ref()
                .and_then(|g| g.check(&thread, &result));
            if let Some(reason) = &blocked {
                report.progress(
                    Some(&result),
                    format!("auto-run guardrail blocked: {reason}"),
                    session.tokens,
                );
            }
            let repeat = monologue.observe(&result.response);
            let stuck = match &repeat {
                Repeat::Stop(detail) => Some(detail.as_str()),
                Repeat::No | Repeat::Nudge => None,
            };
            match decide(
                &result,
                &session,
                policy.as_ref(),
                round,
                ceiling,
                blocked.as_deref(),
                stuck,
            ) {
                Decision::Stop(stop_reason) => {
                    runs.push(result);
                    return Ok(report.stop(stop_reason, runs, session.tokens));
                }
                Decision::Replan => {
                    let mut text = continuation(policy.as_ref(), &session, round + 1, ceiling);
                    if repeat == Repeat::Nudge {
                        report.progress(
                            Some(&result),
                            format!("auto-run nudge: {STUCK_NUDGE}"),
                            session.tokens,
                        );
                        text.push(' ');
                        text.push_str(STUCK_NUDGE);
                    }
                    round_request = request.clone().with_cancellation(token.clone());
                    round_request.messages = vec![Message::user(text)];
                    round_request.tool_choice = None;
                    runs.push(result);
                }
            }
        }
    }

    /// The agent's `stuck` setting (its first `stuck` stop condition), 2
    /// when it lists none: the cross-round rule uses the same count.
    fn stuck_duplicates(&self, agent_id: Option<&str>) -> usize {
        self.agent_spec(agent_id)
            .and_then(|spec| {
                spec.stop_conditions.iter().find_map(|c| match c {
                    StopConditionSpec::Stuck { duplicates } => Some(*duplicates),
                    _ => None,
                })
            })
            .unwrap_or(2)
    }

    /// Auto mode's state on this runtime, created (with its observer) on
    /// first use.
    fn auto_state(&self) -> Arc<AutoState> {
        if let Some(state) = self.extension::<AutoState>() {
            return state;
        }
        self.extension_or_insert_with(|| {
            let sessions = Arc::new(Sessions::default());
            self.add_run_observer(Arc::new(SessionObserver(sessions.clone())));
            AutoState { sessions }
        })
    }

    /// Tokens the thread's runs have used since the session started (or
    /// was reset): every run on the thread adds its reported usage.
    pub fn session_tokens(&self, thread_id: &str) -> u64 {
        self.extension::<AutoState>()
            .map_or(0, |state| state.sessions.tokens(thread_id))
    }

    /// Clears the thread's session tokens and metric reports (the source's
    /// `/new`). The thread's history is kept.
    pub fn reset_session(&self, thread_id: &str) {
        if let Some(state) = self.extension::<AutoState>() {
            state.sessions.reset(thread_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `decide` for a round whose answer repeats nothing.
    fn decide(
        result: &AgentRunResult,
        session: &Session,
        policy: Option<&AutomationPolicy>,
        round: u32,
        ceiling: u32,
        guardrail: Option<&str>,
    ) -> Decision {
        super::decide(result, session, policy, round, ceiling, guardrail, None)
    }

    #[test]
    fn a_loop_detector_stop_or_a_monologue_ends_the_session_first() {
        let s = session(vec![], 0);
        for code in LOOP_STOP_CODES {
            let looped = round(
                TerminationReason::stopped(code, "the same call 5 times"),
                "",
            );
            assert_eq!(
                decide(&looped, &s, None, 1, 20, None),
                stop(&format!("loop detected ({code}): the same call 5 times"))
            );
        }
        // Other stops (a goal, terminate, max_rounds) are not loops.
        let max = round(TerminationReason::stopped("max_rounds", "16 rounds"), "");
        assert_eq!(decide(&max, &s, None, 1, 20, None), Decision::Replan);
        assert_eq!(
            super::decide(
                &natural("same"),
                &s,
                None,
                1,
                20,
                Some("x"),
                Some("repeated")
            ),
            stop("stuck across rounds: repeated"),
            "before the guardrail"
        );
    }
    use rein_runtime_contract::message::TokenUsage;
    use std::collections::BTreeMap;

    fn round(termination: TerminationReason, response: &str) -> AgentRunResult {
        AgentRunResult {
            run_id: "r".into(),
            thread_id: "t".into(),
            termination,
            response: response.into(),
            steps: 1,
            usage: TokenUsage::default(),
            usage_complete: true,
            cancel_cause: None,
            outputs: BTreeMap::new(),
            exports: BTreeMap::new(),
        }
    }

    fn natural(response: &str) -> AgentRunResult {
        round(TerminationReason::NaturalEnd, response)
    }

    fn report(pairs: &[(&str, f64)], status: &str) -> MetricsReport {
        MetricsReport {
            metrics: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            status: status.into(),
        }
    }

    fn session(reports: Vec<MetricsReport>, tokens: u64) -> Session {
        Session { tokens, reports }
    }

    fn policy(json: &str) -> AutomationPolicy {
        AutomationPolicy::from_json(json).unwrap().unwrap()
    }

    fn stop(s: &str) -> Decision {
        Decision::Stop(s.into())
    }

    #[test]
    fn the_replan_table_row_by_row() {
        let s = session(vec![], 0);
        // No policy: replan (the ceiling and the heuristics still apply).
        assert_eq!(
            decide(&natural("done"), &s, None, 1, 20, None),
            Decision::Replan
        );
        // Goals unmet: replan, even after the agent declared it is done.
        let goals = policy(r#"{"goals": [{"metric": "F1", "operator": ">", "value": 0.9}]}"#);
        let done = round(
            TerminationReason::stopped("terminate", "status: success"),
            "all done",
        );
        assert_eq!(
            decide(
                &done,
                &session(vec![report(&[("F1", 0.5)], "completed")], 0),
                Some(&goals),
                1,
                20,
                None
            ),
            Decision::Replan
        );
        // Experiment budget left: replan.
        let budget = policy(r#"{"maxExperiments": 3}"#);
        assert_eq!(
            decide(
                &natural("ok"),
                &session(vec![report(&[], "completed")], 0),
                Some(&budget),
                1,
                20,
                None
            ),
            Decision::Replan
        );
        // Only tokens / heuristics set: replan.
        let tokens = policy(r#"{"maxTokens": 1000, "strictHeuristics": false}"#);
        assert_eq!(
            decide(
                &natural("ok"),
                &session(vec![], 10),
                Some(&tokens),
                1,
                20,
                None
            ),
            Decision::Replan
        );
        // A stop condition already met: no replan.
        assert_eq!(
            decide(
                &natural("ok"),
                &session(vec![], 1000),
                Some(&tokens),
                1,
                20,
                None
            ),
            stop("token budget reached (1000/1000)")
        );
        // Declared done, no unmet goal: the queue is exhausted.
        assert_eq!(
            decide(&done, &s, None, 1, 20, None),
            stop("queue exhausted, no replan condition met")
        );
        assert_eq!(
            decide(&done, &s, Some(&budget), 1, 20, None),
            stop("queue exhausted, no replan condition met")
        );
    }

    #[test]
    fn precedence_follows_the_documented_order() {
        let goals = policy(
            r#"{"goals": [{"metric": "F1", "operator": ">=", "value": 0.9}], "maxExperiments": 1, "maxTokens": 10}"#,
        );
        let met = session(vec![report(&[("F1", 0.95)], "completed")], 50);
        let failing = natural("All good.\n\nI cannot continue because the disk is full.");
        // Heuristics beat goals.
        assert_eq!(
            decide(&failing, &met, Some(&goals), 1, 20, None),
            stop("failure heuristic matched")
        );
        // The ceiling beats everything but the guardrail.
        assert_eq!(
            decide(&failing, &met, Some(&goals), 20, 20, None),
            stop("max rounds reached (20)")
        );
        assert_eq!(
            decide(&failing, &met, Some(&goals), 20, 20, Some("bad plan")),
            stop("guardrail blocking")
        );
        // Failure before user input.
        let both = natural("Sorry, I encountered an error.\n\nPlease confirm how to go on.");
        assert_eq!(
            decide(&both, &met, None, 1, 20, None),
            stop("failure heuristic matched")
        );
        let asking = natural("Done with step 1.\n\nShall I proceed with step 2?");
        assert_eq!(
            decide(&asking, &met, None, 1, 20, None),
            stop("user-input heuristic matched")
        );
        // Goals before experiments before tokens.
        assert_eq!(
            decide(&natural("ok"), &met, Some(&goals), 1, 20, None),
            stop("automation goals reached")
        );
        let unmet = session(vec![report(&[("F1", 0.5)], "completed")], 50);
        assert_eq!(
            decide(&natural("ok"), &unmet, Some(&goals), 1, 20, None),
            stop("max experiments reached (1/1)")
        );
        let no_experiments = session(vec![report(&[("F1", 0.5)], "failed")], 50);
        assert_eq!(
            decide(&natural("ok"), &no_experiments, Some(&goals), 1, 20, None),
            stop("token budget reached (50/10)")
        );
        // strictHeuristics false disables both heuristics.
        let lax = policy(r#"{"strictHeuristics": false}"#);
        assert_eq!(
            decide(&failing, &unmet, Some(&lax), 1, 20, None),
            Decision::Replan
        );
        assert_eq!(
            decide(&asking, &unmet, Some(&lax), 1, 20, None),
            Decision::Replan
        );
    }

    #[test]
    fn unfinished_rounds_stop_first() {
        let s = session(vec![], 0);
        assert_eq!(
            decide(
                &round(TerminationReason::Cancelled, ""),
                &s,
                None,
                1,
                20,
                Some("x")
            ),
            stop("cancelled")
        );
        assert_eq!(
            decide(
                &round(TerminationReason::Error("boom".into()), ""),
                &s,
                None,
                1,
                20,
                None
            ),
            stop("run error: boom")
        );
    }

    #[test]
    fn and_or_every_operator_exact_names_and_the_latest_report_only() {
        let and = policy(
            r#"{"logic": "AND", "goals": [{"metric": "Val ACC", "operator": ">=", "value": 0.9}, {"metric": "Val Loss", "operator": "<", "value": 0.2}]}"#,
        );
        let or = policy(
            r#"{"logic": "or", "goals": [{"metric": "Val ACC", "operator": ">=", "value": 0.9}, {"metric": "Val Loss", "operator": "<", "value": 0.2}]}"#,
        );
        let one = session(
            vec![report(&[("Val ACC", 0.95), ("Val Loss", 0.3)], "completed")],
            0,
        );
        let both = session(
            vec![report(&[("Val ACC", 0.95), ("Val Loss", 0.1)], "completed")],
            0,
        );
        assert!(!goals_met(&and, &one));
        assert!(goals_met(&or, &one));
        assert!(goals_met(&and, &both));
        // Exact names: case and spaces matter.
        let wrong_name = session(
            vec![report(
                &[("val acc", 0.99), ("Val  Loss", 0.0)],
                "completed",
            )],
            0,
        );
        assert!(!goals_met(&or, &wrong_name));
        // Only the latest completed report counts, not the best.
        let regressed = session(
            vec![
                report(&[("Val ACC", 0.99), ("Val Loss", 0.01)], "completed"),
                report(&[("Val ACC", 0.5), ("Val Loss", 0.5)], "completed"),
            ],
            0,
        );
        assert!(!goals_met(&or, &regressed));
        // A later report that is not completed does not replace it.
        let pending = session(
            vec![
                report(&[("Val ACC", 0.99), ("Val Loss", 0.01)], "finished"),
                report(&[("Val ACC", 0.1)], "running"),
            ],
            0,
        );
        assert!(goals_met(&and, &pending));
        for (op, value, expected) in [
            (">", 0.5, false),
            (">", 0.4, true),
            (">=", 0.5, true),
            ("<", 0.5, false),
            ("<", 0.6, true),
            ("<=", 0.5, true),
            ("==", 0.5, true),
            ("==", 0.4, false),
        ] {
            let p = policy(&format!(
                r#"{{"goals": [{{"metric": "m", "operator": "{op}", "value": {value}}}]}}"#
            ));
            let s = session(vec![report(&[("m", 0.5)], "completed")], 0);
            assert_eq!(goals_met(&p, &s), expected, "0.5 {op} {value}");
        }
    }

    #[test]
    fn the_continuation_names_unmet_goals() {
        let p = policy(
            r#"{"goals": [{"metric": "F1", "operator": ">", "value": 0.9}, {"metric": "AUC", "operator": ">", "value": 0.8}], "maxExperiments": 5}"#,
        );
        let s = session(vec![report(&[("F1", 0.7), ("AUC", 0.85)], "completed")], 0);
        assert_eq!(
            continuation(Some(&p), &s, 2, 20),
            "Continue the task (auto-run round 2 of at most 20). Unmet goals (all must hold): F1 > 0.9 (latest: 0.7). Report each experiment's results with report_metrics. Completed experiments: 1/5."
        );
        assert_eq!(
            continuation(None, &s, 3, 20),
            "Continue the task (auto-run round 3 of at most 20)."
        );
    }
}
