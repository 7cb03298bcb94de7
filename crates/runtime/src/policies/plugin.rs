//! The stop-condition plugins: policies evaluated by a hook at `AfterInference`.

use std::sync::Arc;

use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::StateError;

use super::{MaxRoundsPolicy, StopPolicy, StopStatsKey, first_stop};
use crate::phase::{HookError, PhaseContext, PhaseHook};
use crate::plugin::{Plugin, PluginRegistrar};

/// Evaluates a list of policies after each inference; the first `Stop` ends
/// the run. Conventionally registered under the id `"stop-condition"`.
///
/// It claims the [`StopStatsKey`] state key, so it cannot be listed together
/// with a [`MaxRoundsPlugin`] (or a second `StopConditionPlugin`) by one agent.
#[derive(Clone)]
pub struct StopConditionPlugin {
    policies: Arc<[Arc<dyn StopPolicy>]>,
}

impl std::fmt::Debug for StopConditionPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.policies.iter().map(|p| p.id()))
            .finish()
    }
}

impl StopConditionPlugin {
    /// A plugin evaluating `policies` in order.
    pub fn new(policies: Vec<Arc<dyn StopPolicy>>) -> Self {
        Self {
            policies: policies.into(),
        }
    }
}

impl Plugin for StopConditionPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_key::<StopStatsKey>()?;
        r.register_hook(
            Phase::AfterInference,
            Arc::new(StopConditionHook {
                policies: self.policies.clone(),
            }),
        );
        // "Check twice": a timeout is also checked before each inference,
        // so a run past its time does not start one more (the statistics'
        // `elapsed_ms` is brought up to date before `BeforeInference`).
        let timeouts: Vec<Arc<dyn StopPolicy>> = self
            .policies
            .iter()
            .filter(|p| p.id() == "timeout")
            .cloned()
            .collect();
        if !timeouts.is_empty() {
            r.register_hook(
                Phase::BeforeInference,
                Arc::new(StopConditionHook {
                    policies: timeouts.into(),
                }),
            );
        }
        Ok(())
    }
}

/// Limits rounds only: a [`StopConditionPlugin`] with one [`MaxRoundsPolicy`].
/// Conventionally registered under the id `"stop-condition:max-rounds"`.
#[derive(Debug, Clone)]
pub struct MaxRoundsPlugin {
    inner: StopConditionPlugin,
}

impl MaxRoundsPlugin {
    /// A plugin stopping the run after `max_rounds` inferences (0 disables).
    pub fn new(max_rounds: usize) -> Self {
        Self {
            inner: StopConditionPlugin::new(vec![Arc::new(MaxRoundsPolicy::new(max_rounds))]),
        }
    }
}

impl Plugin for MaxRoundsPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        self.inner.register(r)
    }
}

struct StopConditionHook {
    policies: Arc<[Arc<dyn StopPolicy>]>,
}

#[async_trait::async_trait]
impl PhaseHook for StopConditionHook {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.termination_requested().is_some() {
            return Ok(());
        }
        if let Some(reason) = first_stop(&self.policies, ctx.stop_stats()) {
            ctx.request_termination(TerminationReason::Stopped(reason));
        }
        Ok(())
    }
}
