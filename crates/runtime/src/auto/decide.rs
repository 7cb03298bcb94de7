//! When an auto-mode session stops: the decision after each round, in the
//! order of the table in the module docs of `auto`, and the continuation
//! message that starts a replanned round. Pure functions of the round's
//! result, the thread's session and the policy; `auto_run` acts on them.

use rein_runtime_contract::lifecycle::TerminationReason;

use super::heuristics::{looks_like_failure, looks_like_user_input_request};
use super::policy::{AutomationPolicy, Goal, Logic};
use super::session::Session;
use crate::run::AgentRunResult;

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

/// What `auto_run` learned about a round besides its result.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RoundChecks<'a> {
    /// The guardrail's reason to block.
    pub(crate) guardrail: Option<&'a str>,
    /// The cross-round monologue's stop detail.
    pub(crate) monologue: Option<&'a str>,
    /// The round stopped with `token_budget` because its next call would
    /// have exceeded what remained of the session's `maxTokens`.
    pub(crate) budget_refused: bool,
    /// The round stopped with `awaiting_user` (its detail).
    pub(crate) awaiting_user: Option<&'a str>,
    /// Whether a "proceed, don't ask" nudge is left for such a round.
    pub(crate) proceed_left: bool,
}

/// The stop decision after round `round` (from 1), in the documented order.
pub(crate) fn decide(
    result: &AgentRunResult,
    session: &Session,
    policy: Option<&AutomationPolicy>,
    round: u32,
    ceiling: u32,
    checks: &RoundChecks<'_>,
) -> Decision {
    let RoundChecks {
        guardrail,
        monologue,
        budget_refused,
        awaiting_user,
        proceed_left,
    } = *checks;
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
    if let Some(detail) = awaiting_user
        && !proceed_left
    {
        return stop(format!("awaiting user: {detail}"));
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
        // With `awaiting_user` listed, such an answer is nudged instead.
        if awaiting_user.is_none() && looks_like_user_input_request(&result.response) {
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
    if let Some(max) = policy.and_then(|p| p.max_tokens) {
        // The contract's exact string in both cases; a refusal's detail
        // (what the next call would have needed) is the last run's
        // `token_budget` stop.
        if session.tokens >= max || budget_refused {
            return stop(format!("token budget reached ({}/{max})", session.tokens));
        }
    }
    // The agent may have declared its work done (`terminate` with
    // `success`: the source's emptied queue). The source's replan table
    // (`_should_replan_exhausted_queue`, v0.3) replans an emptied queue in
    // every case that reaches here — no policy, goals unmet, experiment
    // budget left, only `maxTokens`/`strictHeuristics` set — bounded by the
    // ceiling and the heuristics: only a met stop condition (above) ends it.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::MetricsReport;

    /// `decide` for a round whose answer repeats nothing.
    fn decide(
        result: &AgentRunResult,
        session: &Session,
        policy: Option<&AutomationPolicy>,
        round: u32,
        ceiling: u32,
        guardrail: Option<&str>,
    ) -> Decision {
        let checks = RoundChecks {
            guardrail,
            ..RoundChecks::default()
        };
        super::decide(result, session, policy, round, ceiling, &checks)
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
                &RoundChecks {
                    guardrail: Some("x"),
                    monologue: Some("repeated"),
                    ..RoundChecks::default()
                }
            ),
            stop("stuck across rounds: repeated"),
            "before the guardrail"
        );
    }

    fn round(termination: TerminationReason, response: &str) -> AgentRunResult {
        let mut result = AgentRunResult::new("r", "t", termination);
        result.response = response.into();
        result.steps = 1;
        result
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
        // Declared done (the queue emptied): the same rows replan — no
        // policy, budget left without goals, only a token budget.
        assert_eq!(decide(&done, &s, None, 1, 20, None), Decision::Replan);
        assert_eq!(
            decide(&done, &s, Some(&budget), 1, 20, None),
            Decision::Replan
        );
        assert_eq!(
            decide(&done, &session(vec![], 10), Some(&tokens), 1, 20, None),
            Decision::Replan
        );
        // ... until a stop condition holds.
        assert_eq!(
            decide(&done, &s, None, 20, 20, None),
            stop("max rounds reached (20)")
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
