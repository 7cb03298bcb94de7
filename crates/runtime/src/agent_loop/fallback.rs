//! Fallback models: the model a run sends its inferences to, and moving to
//! the next of the model's fallbacks when its provider keeps failing.
//!
//! A model with fallbacks gets [`FALLBACK_AFTER`] attempts in a row (fewer
//! when the agent's `consecutive_errors` stop allows fewer); when the last
//! of them fails with a provider-side error (unreachable, overloaded, rate
//! limited, a server error, a timeout, a cut stream), the run goes on with
//! the next fallback — a `model_fallback` event, no backoff — and the
//! failure streak starts over there. Waiting for a provider's own limits is
//! not a failure: a run waits its turn rather than falling back.

use std::sync::Arc;

use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::inference::{InferenceError, InferenceErrorKind, LlmExecutor};
use rein_runtime_contract::lifecycle::StopConditionSpec;
use rein_runtime_contract::spec::ModelSpec;

use super::Run;
use crate::limits::ProviderGate;
use crate::policies::StopStatsKey;

/// Attempts in a row a model with fallbacks gets before the next one.
pub(crate) const FALLBACK_AFTER: u32 = 3;

/// Whether `error` says the provider is down, overloaded or out of limits
/// (as opposed to a request it will never accept).
fn provider_side(error: &InferenceError) -> bool {
    matches!(
        error.kind(),
        InferenceErrorKind::Connection
            | InferenceErrorKind::Overloaded
            | InferenceErrorKind::RateLimited
            | InferenceErrorKind::Server
            | InferenceErrorKind::Timeout
            | InferenceErrorKind::StreamCut
    )
}

impl Run {
    /// The model the run uses now.
    pub(super) fn model(&self) -> &ModelSpec {
        match self.route.checked_sub(1) {
            None => &self.agent.model,
            Some(i) => &self.agent.fallbacks[i].model,
        }
    }

    /// Its provider's executor.
    pub(super) fn executor(&self) -> &Arc<dyn LlmExecutor> {
        match self.route.checked_sub(1) {
            None => &self.agent.executor,
            Some(i) => &self.agent.fallbacks[i].executor,
        }
    }

    /// Its provider's limits, if it has any.
    pub(super) fn gate(&self) -> Option<&Arc<ProviderGate>> {
        match self.route.checked_sub(1) {
            None => self.agent.limits.as_ref(),
            Some(i) => self.agent.fallbacks[i].limits.as_ref(),
        }
    }

    /// After a failed attempt (already counted in the run's statistics):
    /// moves to the next fallback if the model has used up its attempts,
    /// starting the failure streak over. Returns whether it moved.
    pub(super) fn fall_back(&mut self, error: &InferenceError) -> bool {
        if self.route >= self.agent.fallbacks.len() || !provider_side(error) {
            return false;
        }
        let allowed = self
            .agent
            .spec
            .stop_conditions
            .iter()
            .filter_map(|c| match c {
                StopConditionSpec::ConsecutiveErrors { max } if *max > 0 => {
                    u32::try_from(*max).ok()
                }
                _ => None,
            })
            .fold(FALLBACK_AFTER, u32::min);
        let Some(stats) = self.state.slot_mut::<StopStatsKey>() else {
            return false;
        };
        if stats.consecutive_errors < allowed {
            return false;
        }
        stats.consecutive_errors = 0;
        let from = self.model().id.clone();
        self.route += 1;
        let model = self.model().clone();
        tracing::warn!(from = %from, to = %model.id, %error, "falling back to the next model");
        self.request.model.clone_from(&model.upstream_model);
        self.request.temperature = model.temperature;
        self.request.max_output_tokens = model.max_output_tokens;
        if let Some(context) = &mut self.context {
            context.route_to(&model);
        }
        self.emit(|| AgentEvent::ModelFallback {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            from_model: from.clone(),
            to_model: model.id.clone(),
            error: error.to_string(),
        });
        true
    }
}
