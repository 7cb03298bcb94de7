//! An agent as assembled by the builder: its spec resolved against the
//! registered model, provider, tools and plugins, ready to run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rein_runtime_contract::inference::LlmExecutor;
use rein_runtime_contract::lifecycle::StopConditionSpec;
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
use rein_runtime_contract::tool::{Tool, ToolDescriptor};

use crate::plugin::HookEntry;
use crate::policies::{MaxRoundsPolicy, StopPolicy, stats_policy};
use crate::state::KeyRegistration;

/// One check of the built-in guard after each inference, in
/// `stop_conditions` order, then `max_rounds`.
#[derive(Clone)]
pub(crate) enum GuardItem {
    /// A policy over the statistics.
    Policy(Arc<dyn StopPolicy>),
    /// The run's `index`-th stuck detector.
    Stuck(usize),
}

/// Everything one run of an agent needs, shared by all its runs.
pub(crate) struct Agent {
    pub(crate) spec: AgentSpec,
    /// `spec.id`, shared by the agent's runs (each names its agent).
    pub(crate) id: Arc<str>,
    /// Made by the builder for a sub-agent entry with declared outputs;
    /// not listed among the runtime's agents.
    pub(crate) hidden: bool,
    /// The agent's sub-agents, by tool name (also in `tools`).
    pub(crate) subagents: HashMap<String, Arc<crate::subagents::SubagentTool>>,
    pub(crate) model: ModelSpec,
    pub(crate) executor: Arc<dyn LlmExecutor>,
    /// The model's provider's limits, when it has any.
    pub(crate) limits: Option<Arc<crate::limits::ProviderGate>>,
    /// The model's fallbacks, in order (`model.fallbacks` resolved).
    pub(crate) fallbacks: Vec<Route>,
    /// The judging models of the model-judged stop conditions
    /// (`llm_loop_check`, `task_complete`), in list order.
    pub(crate) checks: Vec<Route>,
    pub(crate) tools: HashMap<String, Arc<dyn Tool>>,
    pub(crate) descriptors: Vec<ToolDescriptor>,
    /// Hooks by phase index, in dispatch order.
    pub(crate) hooks: [Vec<HookEntry>; 8],
    pub(crate) keys: Vec<KeyRegistration>,
    /// The built-in guard: `spec.stop_conditions` in list order, then `max_rounds`.
    pub(crate) guard: Vec<GuardItem>,
    /// The shortest `timeout` stop condition, as a deadline for work in flight.
    pub(crate) deadline: Option<Duration>,
    /// Context management, for agents with a context policy or a token
    /// budget.
    pub(crate) context: Option<Arc<crate::context::ContextSetup>>,
    /// What a run with its own token budget
    /// ([`RunRequest::with_token_budget`](crate::RunRequest::with_token_budget))
    /// measures its prompts with: `context` when the agent has one, else a
    /// setup without policy or budget.
    pub(crate) measure: Arc<crate::context::ContextSetup>,
    /// `spec.tool_rules`, shared by the runs' tool-call loop detectors.
    /// The approval rules, compiled (and whether `ask_user` is on).
    pub(crate) gate: crate::approvals::Gate,
    pub(crate) tool_rules:
        Arc<std::collections::BTreeMap<String, rein_runtime_contract::escalation::ToolLoopRule>>,
}

/// A model a run can send its inferences to: the model, its provider's
/// executor and its provider's limits.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) model: ModelSpec,
    pub(crate) executor: Arc<dyn LlmExecutor>,
    pub(crate) limits: Option<Arc<crate::limits::ProviderGate>>,
}

impl Agent {
    /// Whether some model of the agent is on a provider with a token
    /// limit (its runs then estimate every prompt).
    pub(crate) fn counts_tokens(&self) -> bool {
        self.limits
            .iter()
            .chain(self.fallbacks.iter().filter_map(|r| r.limits.as_ref()))
            .any(|g| g.counts_tokens())
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("spec", &self.spec)
            .field("model", &self.model)
            .field(
                "tools",
                &self.descriptors.iter().map(|d| &d.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Agent {
    pub(crate) fn hooks(&self, phase: Phase) -> &[HookEntry] {
        &self.hooks[phase.index()]
    }

    /// The built-in guard's checks for `spec`: the statistics policies and
    /// stuck detectors of `stop_conditions` in list order, then `max_rounds`.
    /// (The other detectors run at their own points; see `detectors`.)
    pub(crate) fn guard_items(spec: &AgentSpec) -> Vec<GuardItem> {
        Self::guard_items_with(spec, spec.max_rounds)
    }

    /// [`guard_items`](Self::guard_items) with `max_rounds` in place of
    /// the spec's (a run's own cap).
    pub(crate) fn guard_items_with(spec: &AgentSpec, max_rounds: usize) -> Vec<GuardItem> {
        let mut stuck = 0;
        let mut guard: Vec<GuardItem> = spec
            .stop_conditions
            .iter()
            .filter_map(|s| match s {
                StopConditionSpec::Stuck { .. } => {
                    stuck += 1;
                    Some(GuardItem::Stuck(stuck - 1))
                }
                other => stats_policy(other).map(GuardItem::Policy),
            })
            .collect();
        if max_rounds > 0 {
            guard.push(GuardItem::Policy(Arc::new(MaxRoundsPolicy::new(
                max_rounds,
            ))));
        }
        guard
    }

    /// The deadline of the shortest non-zero `timeout` condition in `spec`.
    pub(crate) fn deadline_of(spec: &AgentSpec) -> Option<Duration> {
        spec.stop_conditions
            .iter()
            .filter_map(|s| match s {
                StopConditionSpec::Timeout { seconds } if *seconds > 0 => {
                    Some(Duration::from_secs(*seconds))
                }
                _ => None,
            })
            .min()
    }
}
