//! The round statistics every stop policy reads, and how a round updates them.

use serde::{Deserialize, Serialize};

use rein_runtime_contract::inference::InferenceResponse;
use rein_runtime_contract::message::TokenUsage;
use rein_runtime_contract::state::StateKey;

/// How many recent non-empty response texts [`StopPolicyStats`] keeps.
pub const RECENT_RESPONSES_KEPT: usize = 64;

/// A snapshot of a run's progress, as stop policies see it after each inference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopPolicyStats {
    /// Inferences made so far, failed attempts included.
    pub step_count: u32,
    /// Reported prompt tokens, summed.
    pub total_input_tokens: u64,
    /// Reported completion tokens, summed.
    pub total_output_tokens: u64,
    /// Milliseconds since the run started.
    pub elapsed_ms: u64,
    /// Failed inferences in a row; a success resets it to 0.
    pub consecutive_errors: u32,
    /// Tools called by the latest response (empty after a failure).
    pub last_tool_names: Vec<String>,
    /// Text of the latest response (empty after a failure).
    pub last_response_text: String,
    /// The most recent non-empty response texts, oldest first, at most
    /// [`RECENT_RESPONSES_KEPT`].
    pub recent_response_texts: Vec<String>,
}

/// The state key under which a run's [`StopPolicyStats`] live. Stop-condition
/// plugins claim it, so two of them listed by one agent are rejected at build.
#[derive(Debug)]
pub struct StopStatsKey;

impl StateKey for StopStatsKey {
    const KEY: &'static str = "stop_condition.stats";
    type Value = StopPolicyStats;
}

/// What one inference attempt produced, for the statistics.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InferenceRecord<'a> {
    Succeeded(&'a InferenceResponse),
    Failed,
}

/// Adds tokens spent to the totals (an inference's, or a summary's: the
/// run paid for both).
pub(crate) fn add_usage(stats: &mut StopPolicyStats, usage: TokenUsage) {
    stats.total_input_tokens = stats.total_input_tokens.saturating_add(usage.input_tokens);
    stats.total_output_tokens = stats
        .total_output_tokens
        .saturating_add(usage.output_tokens);
}

/// Counts one inference attempt.
pub(crate) fn record_inference(
    stats: &mut StopPolicyStats,
    record: InferenceRecord<'_>,
    elapsed_ms: u64,
) {
    stats.step_count = stats.step_count.saturating_add(1);
    stats.elapsed_ms = elapsed_ms;
    stats.last_tool_names.clear();
    stats.last_response_text.clear();
    match record {
        InferenceRecord::Failed => {
            stats.consecutive_errors = stats.consecutive_errors.saturating_add(1);
        }
        InferenceRecord::Succeeded(response) => {
            stats.consecutive_errors = 0;
            if let Some(usage) = response.usage {
                add_usage(stats, usage);
            }
            stats
                .last_tool_names
                .extend(response.tool_calls.iter().map(|c| c.name.clone()));
            stats.last_response_text.push_str(&response.text);
            if !response.text.is_empty() {
                if stats.recent_response_texts.len() == RECENT_RESPONSES_KEPT {
                    stats.recent_response_texts.remove(0);
                }
                stats.recent_response_texts.push(response.text.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::message::{TokenUsage, ToolCall};

    fn response(text: &str, tools: &[&str], usage: Option<TokenUsage>) -> InferenceResponse {
        InferenceResponse {
            text: text.into(),
            tool_calls: tools
                .iter()
                .map(|n| ToolCall::new("c", *n, serde_json::json!({})))
                .collect(),
            usage,
            cache: None,
        }
    }

    #[test]
    fn a_success_resets_the_error_streak_and_adds_usage() {
        let mut s = StopPolicyStats::default();
        record_inference(&mut s, InferenceRecord::Failed, 1);
        record_inference(&mut s, InferenceRecord::Failed, 2);
        assert_eq!((s.step_count, s.consecutive_errors), (2, 2));
        let r = response("hi", &["search"], Some(TokenUsage::new(10, 5)));
        record_inference(&mut s, InferenceRecord::Succeeded(&r), 3);
        assert_eq!(s.step_count, 3);
        assert_eq!(s.consecutive_errors, 0);
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (10, 5));
        assert_eq!(s.last_tool_names, ["search"]);
        assert_eq!(s.last_response_text, "hi");
        assert_eq!(s.elapsed_ms, 3);
    }

    #[test]
    fn unknown_usage_adds_nothing_and_empty_texts_are_not_recent() {
        let mut s = StopPolicyStats::default();
        record_inference(
            &mut s,
            InferenceRecord::Succeeded(&response("", &["t"], None)),
            0,
        );
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (0, 0));
        assert!(s.recent_response_texts.is_empty());
    }

    #[test]
    fn recent_texts_keep_the_newest_sixty_four() {
        let mut s = StopPolicyStats::default();
        for i in 0..70 {
            record_inference(
                &mut s,
                InferenceRecord::Succeeded(&response(&i.to_string(), &[], None)),
                0,
            );
        }
        assert_eq!(s.recent_response_texts.len(), RECENT_RESPONSES_KEPT);
        assert_eq!(s.recent_response_texts[0], "6");
        assert_eq!(s.recent_response_texts[63], "69");
    }
}
