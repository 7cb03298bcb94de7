//! The stop report a run ends with: its termination, each configured limit
//! with what the run used of it, the tool calls that did not complete
//! normally, whether the thread can be resumed safely, and a hint.

use rein_runtime_contract::lifecycle::{
    LimitUsage, StopConditionSpec, StopReport, TerminationReason,
};

use super::Run;
use crate::policies::StopStatsKey;

impl Run {
    /// The report of a run ending with `reason`.
    pub(super) fn report(&self, reason: &TerminationReason) -> StopReport {
        let mut report = StopReport::new(reason);
        report.limits = self.limits();
        report.tool_calls = self.incomplete.clone();
        if let Some(rare) = &self.rare {
            report.children = rare.children.clone();
            report.pending_approvals = rare.parked_pending.clone();
        }
        report.rate_limited = self.rate_limited();
        report.plan = self
            .state
            .get::<crate::plugins::PlanKey>()
            .ok()
            .and_then(Option::as_ref)
            .and_then(|plan| serde_json::to_value(plan).ok());
        let uncertain = report.uncertain_calls().next().is_some();
        report.resumable = !uncertain;
        report.hint = hint(reason, &report);
        report
    }

    /// Every limit the run had, with what it used of each.
    fn limits(&self) -> Vec<LimitUsage> {
        let spec = &self.agent.spec;
        let smallest = |pick: fn(&StopConditionSpec) -> Option<u64>| {
            spec.stop_conditions
                .iter()
                .filter_map(pick)
                .filter(|v| *v > 0)
                .min()
        };
        let mut limits = Vec::new();
        let rounds = smallest(|c| match c {
            StopConditionSpec::MaxRounds { rounds } => Some(*rounds as u64),
            _ => None,
        })
        .into_iter()
        .chain((self.max_rounds > 0).then_some(self.max_rounds as u64))
        .min();
        if let Some(limit) = rounds {
            limits.push(LimitUsage::new(
                "max_rounds",
                u64::from(self.steps),
                limit,
                "rounds",
            ));
        }
        if let Some(limit) = self.token_budget {
            limits.push(LimitUsage::new(
                "token_budget",
                self.usage.total(),
                limit,
                "tokens",
            ));
        }
        if let Some(deadline) = self.time_limit {
            let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            limits.push(LimitUsage::new(
                "timeout",
                ms(self.started.elapsed()),
                ms(deadline),
                "ms",
            ));
        }
        let errors = smallest(|c| match c {
            StopConditionSpec::ConsecutiveErrors { max } => Some(*max as u64),
            _ => None,
        });
        if let Some(limit) = errors {
            let used = self
                .state
                .get::<StopStatsKey>()
                .map_or(0, |s| s.consecutive_errors as u64);
            limits.push(LimitUsage::new("consecutive_errors", used, limit, "errors"));
        }
        limits
    }
}

/// What to do to go on after `reason`, if there is anything to say.
fn hint(reason: &TerminationReason, report: &StopReport) -> Option<String> {
    let limit = |name: &str| report.limits.iter().find(|l| l.name == name);
    let mut hint = match reason {
        TerminationReason::NaturalEnd => None,
        TerminationReason::Cancelled => {
            Some("the run was cancelled; send a new message to the thread to go on".to_owned())
        }
        TerminationReason::Error(_) => Some(
            "fix what the detail names (a provider, key or request), then send a new message to the thread"
                .to_owned(),
        ),
        TerminationReason::Stopped(r) => match r.code.as_str() {
            "max_rounds" => Some(format!(
                "raise max_rounds (now {}) to let runs go on longer; a new message continues the thread where this run stopped",
                limit("max_rounds").map_or(0, |l| l.limit)
            )),
            "token_budget" => Some(format!(
                "raise token_budget.max_total (now {}) or continue in a new run: the budget counts each run's tokens",
                limit("token_budget").map_or(0, |l| l.limit)
            )),
            "timeout" => Some(format!(
                "raise timeout.seconds (now {} s) to give runs longer",
                limit("timeout").map_or(0, |l| l.limit / 1000)
            )),
            "consecutive_errors" => Some(
                "inferences kept failing: check the provider (reachable, key, quota) before continuing"
                    .to_owned(),
            ),
            "context_window" => Some(
                "the prompt does not fit the model's window: enable or lower the context policy's compact/summarize thresholds, or use a model with a larger window"
                    .to_owned(),
            ),
            "tool_call_loop" | "tool_call_cycle" | "tool_error_loop" | "content_chanting"
            | "stuck" | "loop_detection" | "no_progress" | "error_rate" => Some(format!(
                "the `{}` detector stopped a run going nowhere: change the instructions, tools or arguments before continuing, or give it a gentler escalation ladder",
                r.code
            )),
            "awaiting_user" => Some(
                "the model asked the user something: answer it in a new message on this thread to continue"
                    .to_owned(),
            ),
            _ => None,
        },
    };
    let uncertain: Vec<&str> = report.uncertain_calls().map(|c| c.name.as_str()).collect();
    if !uncertain.is_empty() {
        let first = format!(
            "check whether {} ({}) took effect before continuing",
            if uncertain.len() == 1 {
                "the interrupted call"
            } else {
                "the interrupted calls"
            },
            uncertain.join(", ")
        );
        hint = Some(match hint {
            Some(h) => format!("{first}; then {h}"),
            None => first,
        });
    }
    hint
}
