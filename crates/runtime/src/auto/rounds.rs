//! A session between its rounds, as data: what auto mode carries from one
//! round to the next — the round count, the policy, the answers the
//! cross-round monologue rule remembers, the "proceed" nudges used — and
//! the step that decides after a round.
//!
//! [`AgentRuntime::auto_run`] keeps an [`AutoRounds`] in its loop. A
//! service that runs each round as an ordinary run (possibly in another
//! process, after a restart) stores it with the queued round instead and
//! calls the same [`AutoRounds::after_round`], so both entry points stop
//! for the same reasons with the same strings.

use serde::{Deserialize, Serialize};

use rein_runtime_contract::lifecycle::TerminationReason;

use super::AutoSettings;
use super::decide::{Decision, RoundChecks, continuation, decide};
use super::metrics::MetricsReport;
use super::monologue::{Monologue, Repeat};
use super::policy::AutomationPolicy;
use super::session::Session;
use crate::detectors::{PROCEED_NUDGE, STUCK_NUDGE};
use crate::run::AgentRunResult;
use crate::runtime::AgentRuntime;

/// One auto-mode session's state between rounds. Serializable, so it can
/// travel with a queued round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoRounds {
    /// The session's id (`auto-<n>`; progress events carry it as their
    /// `run_id`).
    pub session_id: String,
    /// Rounds finished so far.
    pub rounds: u32,
    /// The session's policy (`None`: no policy).
    pub policy: Option<AutomationPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_id: Option<String>,
    monologue: Monologue,
    proceed_used: usize,
}

/// What to do after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Start the next round with this user message.
    Continue {
        /// The continuation message (unmet goals, nudges).
        message: String,
    },
    /// The session ends.
    Stop {
        /// One of the strings in the module docs of `auto`.
        stop_reason: String,
    },
}

/// The outcome of [`AutoRounds::after_round`]: the progress messages to
/// report, in order, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundStep {
    /// `auto-run round N finished: …`, then any guardrail block or nudge,
    /// then (on a stop) `auto-run stop condition: <stop_reason>`.
    pub progress: Vec<String>,
    /// Continue or stop.
    pub verdict: Verdict,
}

impl AutoRounds {
    /// A session that has run no round yet, for `agent_id` on `runtime`
    /// (whose `stuck` setting the cross-round rule uses). An empty policy
    /// is no policy.
    pub fn new(
        runtime: &AgentRuntime,
        agent_id: Option<&str>,
        session_id: impl Into<String>,
        policy: Option<AutomationPolicy>,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            rounds: 0,
            policy: policy.filter(|p| !p.is_empty()),
            agent_id: agent_id.map(str::to_owned),
            monologue: Monologue::new(runtime.stuck_duplicates(agent_id)),
            proceed_used: 0,
        }
    }

    /// The policy's token budget, if any.
    pub fn max_tokens(&self) -> Option<u64> {
        self.policy.as_ref().and_then(|p| p.max_tokens)
    }

    /// The next round's own token budget when the session has used
    /// `tokens_used_session`: what remains of `maxTokens`.
    pub fn round_budget(&self, tokens_used_session: u64) -> Option<u64> {
        self.max_tokens()
            .map(|max| max.saturating_sub(tokens_used_session))
    }

    /// Decides after a round: `result` is the round's result,
    /// `tokens_used_session` and `reports` the thread's session totals
    /// *including* that round. Counts the round.
    pub fn after_round(
        &mut self,
        runtime: &AgentRuntime,
        result: &AgentRunResult,
        tokens_used_session: u64,
        reports: &[MetricsReport],
    ) -> RoundStep {
        let settings = runtime
            .extension::<AutoSettings>()
            .map(|s| (*s).clone())
            .unwrap_or_default();
        self.rounds = self.rounds.saturating_add(1);
        let round = self.rounds;
        let session = Session {
            tokens: tokens_used_session,
            reports: reports.to_vec(),
        };
        let mut progress = vec![format!(
            "auto-run round {round} finished: {}",
            result.termination
        )];
        let blocked = settings
            .guardrail
            .as_ref()
            .and_then(|g| g.check(&result.thread_id, result));
        if let Some(reason) = &blocked {
            progress.push(format!("auto-run guardrail blocked: {reason}"));
        }
        let repeat = self.monologue.observe(&result.response);
        let stuck = match &repeat {
            Repeat::Stop(detail) => Some(detail.as_str()),
            Repeat::No | Repeat::Nudge => None,
        };
        // The session's budget refused the round's next call (not the
        // agent's own `token_budget`, which replans as before).
        let before = tokens_used_session.saturating_sub(result.usage.total());
        let agent = self.agent_id.as_deref();
        let agent_budget = runtime.token_budget(agent);
        let budget_refused = matches!(
            &result.termination,
            TerminationReason::Stopped(r)
                if r.code == "token_budget"
                    && self.round_budget(before).is_some_and(|b| agent_budget.is_none_or(|a| b <= a))
        );
        let awaiting_user = match &result.termination {
            TerminationReason::Stopped(r) if r.code == "awaiting_user" => Some(r.detail.as_str()),
            _ => None,
        };
        let proceed_nudges = runtime.proceed_nudges(agent);
        let checks = RoundChecks {
            guardrail: blocked.as_deref(),
            monologue: stuck,
            budget_refused,
            awaiting_user,
            proceed_left: self.proceed_used < proceed_nudges,
        };
        let ceiling = settings.ceiling;
        let verdict = match decide(
            result,
            &session,
            self.policy.as_ref(),
            round,
            ceiling,
            &checks,
        ) {
            Decision::Stop(stop_reason) => {
                progress.push(format!("auto-run stop condition: {stop_reason}"));
                Verdict::Stop { stop_reason }
            }
            Decision::Replan => {
                let mut message = continuation(self.policy.as_ref(), &session, round + 1, ceiling);
                if awaiting_user.is_some() {
                    self.proceed_used += 1;
                    progress.push(format!("auto-run nudge: {PROCEED_NUDGE}"));
                    message.push(' ');
                    message.push_str(PROCEED_NUDGE);
                }
                if repeat == Repeat::Nudge {
                    progress.push(format!("auto-run nudge: {STUCK_NUDGE}"));
                    message.push(' ');
                    message.push_str(STUCK_NUDGE);
                }
                Verdict::Continue { message }
            }
        };
        RoundStep { progress, verdict }
    }
}
