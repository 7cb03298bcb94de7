//! The seven built-in policies and their construction from declarative specs.
//!
//! Each policy's `id()` is its stop code. A limit of 0, an empty name or an
//! empty pattern disables a policy: it always answers `Continue`.

use std::sync::Arc;

use regex::Regex;
use rein_runtime_contract::lifecycle::StopConditionSpec;

use super::{StopDecision, StopPolicy, StopPolicyStats};

fn stop(code: &str, detail: String) -> StopDecision {
    StopDecision::Stop {
        code: code.to_owned(),
        detail,
    }
}

/// Stops once `step_count >= max_rounds` (code `max_rounds`); 0 disables.
#[derive(Debug, Clone)]
pub struct MaxRoundsPolicy {
    max_rounds: usize,
}

impl MaxRoundsPolicy {
    /// A policy allowing `max_rounds` inferences.
    pub fn new(max_rounds: usize) -> Self {
        Self { max_rounds }
    }
}

impl StopPolicy for MaxRoundsPolicy {
    fn id(&self) -> &str {
        "max_rounds"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if self.max_rounds > 0 && stats.step_count as usize >= self.max_rounds {
            stop(
                "max_rounds",
                format!(
                    "reached {} rounds (limit {})",
                    stats.step_count, self.max_rounds
                ),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Stops once reported `input + output` tokens are **more than** `max_total`
/// (code `token_budget`); 0 disables. Unreported usage counts as nothing.
#[derive(Debug, Clone)]
pub struct TokenBudgetPolicy {
    max_total: u64,
}

impl TokenBudgetPolicy {
    /// A policy allowing `max_total` tokens.
    pub fn new(max_total: u64) -> Self {
        Self { max_total }
    }
}

impl StopPolicy for TokenBudgetPolicy {
    fn id(&self) -> &str {
        "token_budget"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        let total = stats
            .total_input_tokens
            .saturating_add(stats.total_output_tokens);
        if self.max_total > 0 && total > self.max_total {
            stop(
                "token_budget",
                format!(
                    "used {total} tokens ({} input + {} output), over the budget of {}",
                    stats.total_input_tokens, stats.total_output_tokens, self.max_total
                ),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Stops once `elapsed_ms` is **more than** the limit, given in
/// **milliseconds** (code `timeout`); 0 disables. (`StopConditionSpec::Timeout`
/// takes seconds.)
#[derive(Debug, Clone)]
pub struct TimeoutPolicy {
    max_ms: u64,
}

impl TimeoutPolicy {
    /// A policy allowing `max_ms` milliseconds.
    pub fn new(max_ms: u64) -> Self {
        Self { max_ms }
    }
}

impl StopPolicy for TimeoutPolicy {
    fn id(&self) -> &str {
        "timeout"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if self.max_ms > 0 && stats.elapsed_ms > self.max_ms {
            stop(
                "timeout",
                format!(
                    "elapsed {} ms, over the limit of {} ms",
                    stats.elapsed_ms, self.max_ms
                ),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Stops once `consecutive_errors >= max` (code `consecutive_errors`); 0 disables.
#[derive(Debug, Clone)]
pub struct ConsecutiveErrorsPolicy {
    max: usize,
}

impl ConsecutiveErrorsPolicy {
    /// A policy allowing `max - 1` failed inferences in a row.
    pub fn new(max: usize) -> Self {
        Self { max }
    }
}

impl StopPolicy for ConsecutiveErrorsPolicy {
    fn id(&self) -> &str {
        "consecutive_errors"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if self.max > 0 && stats.consecutive_errors as usize >= self.max {
            stop(
                "consecutive_errors",
                format!(
                    "{} inference errors in a row (limit {})",
                    stats.consecutive_errors, self.max
                ),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Stops when the latest response calls the tool `tool_name`, before the
/// tool runs (code `stop_on_tool`); an empty name disables.
#[derive(Debug, Clone)]
pub struct StopOnToolPolicy {
    tool_name: String,
}

impl StopOnToolPolicy {
    /// A policy watching for `tool_name`.
    pub fn new(tool_name: impl Into<String>) -> Self {
        Self {
            tool_name: tool_name.into(),
        }
    }
}

impl StopPolicy for StopOnToolPolicy {
    fn id(&self) -> &str {
        "stop_on_tool"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if !self.tool_name.is_empty() && stats.last_tool_names.contains(&self.tool_name) {
            stop(
                "stop_on_tool",
                format!("the model called the tool \"{}\"", self.tool_name),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Stops when the regex matches the latest response text (code
/// `content_match`); an empty pattern disables. An invalid pattern fails
/// closed: the first evaluation stops with code `content_match_invalid_regex`
/// and a detail naming the pattern and the regex error.
#[derive(Debug, Clone)]
pub struct ContentMatchPolicy {
    pattern: String,
    regex: Result<Regex, String>,
}

impl ContentMatchPolicy {
    /// A policy matching `pattern` (`regex` crate syntax).
    pub fn new(pattern: impl Into<String>) -> Self {
        let pattern = pattern.into();
        let regex = Regex::new(&pattern).map_err(|e| e.to_string());
        Self { pattern, regex }
    }
}

impl StopPolicy for ContentMatchPolicy {
    fn id(&self) -> &str {
        "content_match"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        if self.pattern.is_empty() {
            return StopDecision::Continue;
        }
        match &self.regex {
            Err(e) => stop(
                "content_match_invalid_regex",
                format!("invalid content_match pattern \"{}\": {e}", self.pattern),
            ),
            Ok(re) if re.is_match(&stats.last_response_text) => stop(
                "content_match",
                format!("the response matched the pattern \"{}\"", self.pattern),
            ),
            Ok(_) => StopDecision::Continue,
        }
    }
}

/// Stops when the last `window` non-empty response texts are identical
/// (code `loop_detection`); a window below 2 disables. Only the 64 most
/// recent texts are kept, so a window above 64 never triggers.
#[derive(Debug, Clone)]
pub struct LoopDetectionPolicy {
    window: usize,
}

impl LoopDetectionPolicy {
    /// A policy over the last `window` responses.
    pub fn new(window: usize) -> Self {
        Self { window }
    }
}

impl StopPolicy for LoopDetectionPolicy {
    fn id(&self) -> &str {
        "loop_detection"
    }

    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
        let recent = &stats.recent_response_texts;
        if self.window < 2 || recent.len() < self.window {
            return StopDecision::Continue;
        }
        let tail = &recent[recent.len() - self.window..];
        if tail.iter().all(|t| *t == tail[0]) {
            let mut snippet: String = tail[0].chars().take(80).collect();
            if snippet.len() < tail[0].len() {
                snippet.push('…');
            }
            stop(
                "loop_detection",
                format!(
                    "the last {} responses were identical: \"{snippet}\"",
                    self.window
                ),
            )
        } else {
            StopDecision::Continue
        }
    }
}

/// Builds the policies for declarative specs, in order.
///
/// The variants that are pure functions of [`StopPolicyStats`] become
/// policies; `Timeout { seconds }` becomes a [`TimeoutPolicy`] of
/// `seconds × 1000` ms (saturating). The loop detectors that need more than
/// the statistics — `tool_call_loop`, `tool_call_cycle`, `tool_error_loop`,
/// `content_chanting`, `stuck` — are
/// skipped with a warning: they are enforced when listed in
/// `AgentSpec.stop_conditions`, as is the timeout's deadline, which cancels
/// work in flight (a policy built here only checks after each inference).
pub fn policies_from_specs(specs: &[StopConditionSpec]) -> Vec<Arc<dyn StopPolicy>> {
    specs
        .iter()
        .filter_map(|spec| {
            let policy = stats_policy(spec);
            if policy.is_none() {
                tracing::warn!(
                    kind = spec.kind(),
                    "policies_from_specs skips the \"{}\" stop condition: it is not a function of \
                     StopPolicyStats; list it in AgentSpec.stop_conditions instead",
                    spec.kind()
                );
            }
            policy
        })
        .collect()
}

/// The policy of a spec that is a pure function of the statistics.
pub(crate) fn stats_policy(spec: &StopConditionSpec) -> Option<Arc<dyn StopPolicy>> {
    Some(match spec {
        StopConditionSpec::MaxRounds { rounds } => Arc::new(MaxRoundsPolicy::new(*rounds)),
        StopConditionSpec::Timeout { seconds } => {
            Arc::new(TimeoutPolicy::new(seconds.saturating_mul(1000)))
        }
        StopConditionSpec::TokenBudget { max_total } => {
            Arc::new(TokenBudgetPolicy::new(*max_total as u64))
        }
        StopConditionSpec::ConsecutiveErrors { max } => {
            Arc::new(ConsecutiveErrorsPolicy::new(*max))
        }
        StopConditionSpec::StopOnTool { tool_name } => {
            Arc::new(StopOnToolPolicy::new(tool_name.clone()))
        }
        StopConditionSpec::ContentMatch { pattern } => {
            Arc::new(ContentMatchPolicy::new(pattern.clone()))
        }
        StopConditionSpec::LoopDetection { window } => Arc::new(LoopDetectionPolicy::new(*window)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(d: StopDecision) -> Option<String> {
        match d {
            StopDecision::Continue => None,
            StopDecision::Stop { code, .. } => Some(code),
        }
    }

    fn stats() -> StopPolicyStats {
        StopPolicyStats::default()
    }

    #[test]
    fn max_rounds_stops_at_the_limit_not_before() {
        let p = MaxRoundsPolicy::new(3);
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                step_count: 2,
                ..stats()
            })),
            None
        );
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                step_count: 3,
                ..stats()
            }))
            .as_deref(),
            Some("max_rounds")
        );
        assert_eq!(
            code(MaxRoundsPolicy::new(0).evaluate(&StopPolicyStats {
                step_count: 99,
                ..stats()
            })),
            None
        );
    }

    #[test]
    fn token_budget_stops_only_above_the_limit() {
        let p = TokenBudgetPolicy::new(100);
        let at = StopPolicyStats {
            total_input_tokens: 60,
            total_output_tokens: 40,
            ..stats()
        };
        let over = StopPolicyStats {
            total_input_tokens: 60,
            total_output_tokens: 41,
            ..stats()
        };
        assert_eq!(code(p.evaluate(&at)), None);
        assert_eq!(code(p.evaluate(&over)).as_deref(), Some("token_budget"));
        assert_eq!(code(TokenBudgetPolicy::new(0).evaluate(&over)), None);
    }

    #[test]
    fn timeout_stops_only_above_the_limit_in_milliseconds() {
        let p = TimeoutPolicy::new(1000);
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                elapsed_ms: 1000,
                ..stats()
            })),
            None
        );
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                elapsed_ms: 1001,
                ..stats()
            }))
            .as_deref(),
            Some("timeout")
        );
        assert_eq!(
            code(TimeoutPolicy::new(0).evaluate(&StopPolicyStats {
                elapsed_ms: u64::MAX,
                ..stats()
            })),
            None
        );
    }

    #[test]
    fn consecutive_errors_stop_at_the_limit() {
        let p = ConsecutiveErrorsPolicy::new(3);
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                consecutive_errors: 2,
                ..stats()
            })),
            None
        );
        assert_eq!(
            code(p.evaluate(&StopPolicyStats {
                consecutive_errors: 3,
                ..stats()
            }))
            .as_deref(),
            Some("consecutive_errors")
        );
        assert_eq!(
            code(ConsecutiveErrorsPolicy::new(0).evaluate(&StopPolicyStats {
                consecutive_errors: 9,
                ..stats()
            })),
            None
        );
    }

    #[test]
    fn stop_on_tool_matches_the_exact_name() {
        let s = StopPolicyStats {
            last_tool_names: vec!["finish".into()],
            ..stats()
        };
        assert_eq!(
            code(StopOnToolPolicy::new("finish").evaluate(&s)).as_deref(),
            Some("stop_on_tool")
        );
        assert_eq!(code(StopOnToolPolicy::new("Finish").evaluate(&s)), None);
        assert_eq!(code(StopOnToolPolicy::new("").evaluate(&s)), None);
    }

    #[test]
    fn content_match_matches_and_fails_closed_on_a_bad_regex() {
        let s = StopPolicyStats {
            last_response_text: "All DONE here".into(),
            ..stats()
        };
        assert_eq!(
            code(ContentMatchPolicy::new("(?i)done").evaluate(&s)).as_deref(),
            Some("content_match")
        );
        assert_eq!(code(ContentMatchPolicy::new("^done$").evaluate(&s)), None);
        assert_eq!(code(ContentMatchPolicy::new("").evaluate(&s)), None);
        match ContentMatchPolicy::new("(unclosed").evaluate(&stats()) {
            StopDecision::Stop { code, detail } => {
                assert_eq!(code, "content_match_invalid_regex");
                assert!(detail.contains("\"(unclosed\""), "{detail}");
                assert!(detail.contains("unclosed group"), "{detail}");
            }
            StopDecision::Continue => panic!("an invalid regex must stop"),
        }
    }

    #[test]
    fn loop_detection_needs_a_full_window_of_identical_texts() {
        let p = LoopDetectionPolicy::new(3);
        let texts = |t: &[&str]| StopPolicyStats {
            recent_response_texts: t.iter().map(|s| s.to_string()).collect(),
            ..stats()
        };
        assert_eq!(code(p.evaluate(&texts(&["a", "a"]))), None);
        assert_eq!(
            code(p.evaluate(&texts(&["b", "a", "a", "a"]))).as_deref(),
            Some("loop_detection")
        );
        assert_eq!(code(p.evaluate(&texts(&["a", "a", "b"]))), None);
        assert_eq!(
            code(LoopDetectionPolicy::new(1).evaluate(&texts(&["a", "a"]))),
            None
        );
        assert_eq!(
            code(LoopDetectionPolicy::new(0).evaluate(&texts(&["a", "a"]))),
            None
        );
    }

    #[test]
    fn specs_map_to_policies_with_matching_ids_and_seconds_become_milliseconds() {
        let specs = vec![
            StopConditionSpec::MaxRounds { rounds: 10 },
            StopConditionSpec::Timeout { seconds: 2 },
            StopConditionSpec::TokenBudget { max_total: 100 },
            StopConditionSpec::ConsecutiveErrors { max: 3 },
            StopConditionSpec::StopOnTool {
                tool_name: "finish".into(),
            },
            StopConditionSpec::ContentMatch {
                pattern: "x".into(),
            },
            StopConditionSpec::LoopDetection { window: 3 },
        ];
        let policies = policies_from_specs(&specs);
        let ids: Vec<_> = policies.iter().map(|p| p.id().to_owned()).collect();
        let kinds: Vec<_> = specs.iter().map(|s| s.kind().to_owned()).collect();
        assert_eq!(ids, kinds);
        let timeout = &policies[1];
        assert_eq!(
            code(timeout.evaluate(&StopPolicyStats {
                elapsed_ms: 2000,
                ..stats()
            })),
            None
        );
        assert_eq!(
            code(timeout.evaluate(&StopPolicyStats {
                elapsed_ms: 2001,
                ..stats()
            }))
            .as_deref(),
            Some("timeout")
        );
        let skipped = policies_from_specs(&[
            StopConditionSpec::Stuck { duplicates: 2 },
            StopConditionSpec::ToolErrorLoop {
                threshold: 3,
                on_detect: Default::default(),
            },
            StopConditionSpec::ToolCallCycle {
                cycle: 2,
                threshold: 3,
                on_detect: Default::default(),
            },
            StopConditionSpec::MaxRounds { rounds: 1 },
        ]);
        assert_eq!(skipped.len(), 1, "detectors are skipped, the rest kept");
        assert_eq!(skipped[0].id(), "max_rounds");
        let huge = policies_from_specs(&[StopConditionSpec::Timeout { seconds: u64::MAX }]);
        assert_eq!(
            code(huge[0].evaluate(&StopPolicyStats {
                elapsed_ms: u64::MAX,
                ..stats()
            })),
            None
        );
    }
}
