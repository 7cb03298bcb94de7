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
//! | the round stopped with `awaiting_user` and its "proceed" nudges are used up | `awaiting user: <detail>` |
//! | the guardrail blocks | `guardrail blocking` |
//! | rounds ≥ the ceiling (20 by default; builder only) | `max rounds reached (N)` |
//! | `strictHeuristics` and the answer reports a failure | `failure heuristic matched` |
//! | `strictHeuristics` and the answer asks the user for input | `user-input heuristic matched` |
//! | the goals hold on the latest completed report (AND / OR) | `automation goals reached` |
//! | completed experiments ≥ `maxExperiments` | `max experiments reached (N/M)` |
//! | session tokens ≥ `maxTokens` | `token budget reached (N/M)` |
//! | the round's next inference would have exceeded what remained of `maxTokens` (it was not sent; N < M, the last run's `token_budget` stop has the detail) | `token budget reached (N/M)` |
//!
//! Otherwise it **replans**: the next round starts with a continuation
//! message naming the unmet goals — also after the agent called `terminate`
//! with `success` (the source's emptied queue), as the source's replan
//! table says: no policy, unmet goals, experiment budget left, and only
//! tokens/heuristics set all replan; a met stop condition never gets here.
//! (`queue exhausted, no replan condition met` is therefore never the
//! stop reason.)
//!
//! `maxTokens` is checked before spending, too: every round runs with what
//! remains of it as its own budget
//! ([`RunRequest::with_token_budget`]), so a round refuses an inference
//! whose estimated prompt plus reserved output would exceed the session's
//! budget instead of overshooting it.
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

mod decide;
mod heuristics;
mod metrics;
mod monologue;
mod policy;
mod rounds;
pub(crate) mod session;

pub use decide::LOOP_STOP_CODES;
pub use heuristics::{
    CLOSING_PARAGRAPH_CHARS, FAILURE_HARD_SIGNALS, FAILURE_SOFT_SIGNALS, USER_INPUT_PHRASES_EN,
    USER_INPUT_PHRASES_ZH, closing_paragraph, looks_like_failure, looks_like_user_input_request,
};
pub use metrics::{AutomationPlugin, MetricsReport, MetricsReports};
pub use policy::{AutomationPolicy, Goal, Logic, Operator};
pub use rounds::{AutoRounds, RoundStep, Verdict};

use std::sync::Arc;

use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::message::Message;

use crate::builder::AgentRuntimeBuilder;
use crate::run::{AgentRunResult, RunRequest};
use crate::runtime::{AgentRuntime, RuntimeError};
use rein_runtime_contract::lifecycle::StopConditionSpec;
use session::{SessionObserver, Sessions};

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
    /// The policy's token budget, when it has one.
    pub max_tokens: Option<u64>,
    /// Every round's result, in order.
    pub runs: Vec<AgentRunResult>,
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
        // The source logs each stop too; operators grep for this line.
        tracing::info!(
            thread_id = self.thread_id,
            session = self.session_id,
            tokens_used_session = tokens,
            "auto-run stop condition: {stop_reason}"
        );
        self.progress(
            runs.last(),
            format!("auto-run stop condition: {stop_reason}"),
            tokens,
        );
        AutoRunResult {
            stop_reason,
            rounds: u32::try_from(runs.len()).unwrap_or(u32::MAX),
            tokens_used_session: tokens,
            max_tokens: self.max_tokens,
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
        let mut rounds = AutoRounds::new(self, request.agent_id.as_deref(), &session_id, policy);
        let mut runs: Vec<AgentRunResult> = Vec::new();
        let mut round_request = request.clone().with_cancellation(token.clone());
        loop {
            // A cancel between rounds, or while the last one was finishing.
            if token.is_cancelled() {
                let tokens = sessions.tokens(&thread);
                return Ok(report.stop("cancelled".to_owned(), runs, tokens));
            }
            // What remains of the session's budget is this round's own.
            if let Some(budget) = rounds.round_budget(sessions.tokens(&thread)) {
                let own = round_request.token_budget.unwrap_or(u64::MAX);
                round_request = round_request.with_token_budget(budget.min(own));
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
            let step = rounds.after_round(self, &result, session.tokens, &session.reports);
            match step.verdict {
                Verdict::Stop { stop_reason } => {
                    // The last message is the stop's own, which `stop`
                    // reports (and logs).
                    let before_stop = step.progress.len().saturating_sub(1);
                    for message in &step.progress[..before_stop] {
                        report.progress(Some(&result), message.clone(), session.tokens);
                    }
                    runs.push(result);
                    return Ok(report.stop(stop_reason, runs, session.tokens));
                }
                Verdict::Continue { message } => {
                    for said in &step.progress {
                        report.progress(Some(&result), said.clone(), session.tokens);
                    }
                    round_request = request.clone().with_cancellation(token.clone());
                    round_request.messages = vec![Message::user(message)];
                    round_request.tool_choice = None;
                    runs.push(result);
                }
            }
        }
    }

    /// The value `pick` finds in the agent's first stop condition that has
    /// one.
    fn setting(
        &self,
        agent_id: Option<&str>,
        pick: fn(&StopConditionSpec) -> Option<usize>,
    ) -> Option<usize> {
        self.agent_spec(agent_id)
            .and_then(|spec| spec.stop_conditions.iter().find_map(pick))
    }

    /// The agent's `stuck` setting (its first `stuck` stop condition), 2
    /// when it lists none: the cross-round rule uses the same count.
    pub(crate) fn stuck_duplicates(&self, agent_id: Option<&str>) -> usize {
        self.setting(agent_id, |c| match c {
            StopConditionSpec::Stuck { duplicates } => Some(*duplicates),
            _ => None,
        })
        .unwrap_or(2)
    }

    /// The agent's `awaiting_user` setting: "proceed" nudges per session
    /// (0 when it lists none).
    pub(crate) fn proceed_nudges(&self, agent_id: Option<&str>) -> usize {
        self.setting(agent_id, |c| match c {
            StopConditionSpec::AwaitingUser { auto_nudges } => Some(*auto_nudges),
            _ => None,
        })
        .unwrap_or(0)
    }

    /// The agent's smallest `token_budget`, if it has one.
    pub(crate) fn token_budget(&self, agent_id: Option<&str>) -> Option<u64> {
        self.agent_spec(agent_id)
            .and_then(crate::builder::smallest_token_budget)
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
