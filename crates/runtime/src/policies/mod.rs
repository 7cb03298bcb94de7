//! Stop policies decide, after each inference, whether a run ends.
//!
//! A [`StopPolicy`] is a pure, synchronous function of the round statistics
//! ([`StopPolicyStats`]). Policies run in three places, in this order each
//! round, and the first [`StopDecision::Stop`] wins:
//!
//! 1. the policies of listed stop-condition plugins ([`StopConditionPlugin`],
//!    [`MaxRoundsPlugin`]) in `plugin_ids` order, each plugin's list in order;
//! 2. the agent's `stop_conditions` (built-in, never listed);
//! 3. the agent's `max_rounds` guard (built-in, never listed).
//!
//! The runtime keeps one [`StopPolicyStats`] per run under [`StopStatsKey`]
//! and updates it once per inference before any policy sees it, so a round
//! is counted once however many places evaluate policies.
//!
//! Policies do not cancel work in flight; the `timeout` condition's deadline
//! does that (see the agent loop).

mod builtin;
mod plugin;
mod stats;

pub use builtin::{
    ConsecutiveErrorsPolicy, ContentMatchPolicy, LoopDetectionPolicy, MaxRoundsPolicy,
    StopOnToolPolicy, TimeoutPolicy, TokenBudgetPolicy, policies_from_specs,
};
pub use plugin::{MaxRoundsPlugin, StopConditionPlugin};
pub use stats::{RECENT_RESPONSES_KEPT, StopPolicyStats, StopStatsKey};

pub(crate) use builtin::stats_policy;
pub(crate) use stats::{InferenceRecord, add_usage, record_inference};

use std::sync::Arc;

use rein_runtime_contract::lifecycle::StoppedReason;

/// A stop condition: looks at the round statistics and decides.
///
/// Implementations must be pure and quick: they run after every inference.
///
/// ```
/// use rein_runtime::policies::{StopDecision, StopPolicy, StopPolicyStats};
///
/// struct MyCustomPolicy { threshold: u64 }
///
/// impl StopPolicy for MyCustomPolicy {
///     fn id(&self) -> &str { "my_custom" }
///     fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision {
///         if stats.total_output_tokens > self.threshold {
///             StopDecision::Stop {
///                 code: "my_custom".into(),
///                 detail: format!("output tokens {} exceeded {}", stats.total_output_tokens, self.threshold),
///             }
///         } else {
///             StopDecision::Continue
///         }
///     }
/// }
///
/// let stats = StopPolicyStats { total_output_tokens: 11, ..Default::default() };
/// assert!(matches!(MyCustomPolicy { threshold: 10 }.evaluate(&stats), StopDecision::Stop { .. }));
/// ```
pub trait StopPolicy: Send + Sync + 'static {
    /// The policy's id; built-in policies use their stop code.
    fn id(&self) -> &str;

    /// `Continue` lets the run go on; `Stop { code, detail }` ends it with
    /// `TerminationReason::Stopped` carrying exactly that code and detail.
    fn evaluate(&self, stats: &StopPolicyStats) -> StopDecision;
}

/// A policy's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopDecision {
    /// Let the run go on.
    Continue,
    /// End the run.
    Stop {
        /// The stop code, e.g. `max_rounds`.
        code: String,
        /// What triggered it.
        detail: String,
    },
}

/// The first `Stop` among `policies`, in order.
pub(crate) fn first_stop(
    policies: &[Arc<dyn StopPolicy>],
    stats: &StopPolicyStats,
) -> Option<StoppedReason> {
    policies.iter().find_map(|p| match p.evaluate(stats) {
        StopDecision::Continue => None,
        StopDecision::Stop { code, detail } => Some(StoppedReason { code, detail }),
    })
}
