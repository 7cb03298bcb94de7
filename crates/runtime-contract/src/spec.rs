//! Agent and model specifications: what an agent is, independent of any run.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::context::ContextPolicy;
use crate::escalation::{Ladder, ToolLoopRule};
use crate::inference::ToolChoice;
use crate::lifecycle::StopConditionSpec;

/// The default for [`AgentSpec::max_rounds`].
pub const DEFAULT_MAX_ROUNDS: usize = 16;

fn default_max_rounds() -> usize {
    DEFAULT_MAX_ROUNDS
}

/// Describes one agent: which model it talks to, its system prompt, how many
/// rounds it may take, which plugins are active and which declarative stop
/// conditions apply.
///
/// `max_rounds` and `stop_conditions` are enforced by the runtime's built-in
/// guard without being listed in `plugin_ids`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AgentSpec {
    /// The agent's id, unique within a runtime.
    pub id: String,
    /// The id of a [`ModelSpec`] registered with the runtime.
    #[serde(default)]
    pub model_id: String,
    /// Sent as the system prompt of every inference; never stored in history.
    #[serde(default)]
    pub system_prompt: String,
    /// The most inferences one run may make; 0 means unbounded. Default 16.
    #[serde(default = "default_max_rounds")]
    pub max_rounds: usize,
    /// Ids of registered plugins active for this agent, in hook order.
    #[serde(default)]
    pub plugin_ids: Vec<String>,
    /// Declarative stop conditions, evaluated after each inference in list order.
    #[serde(default)]
    pub stop_conditions: Vec<StopConditionSpec>,
    /// The tool choice sent with every inference that offers tools.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// How runs keep the prompt inside the model's window
    /// ([`crate::context`]); `None` sends the whole history every round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextPolicy>,
    /// Each detector's escalation ladder, by detector code
    /// ([`crate::escalation`]); it replaces that detector's `on_detect`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "crate::escalation::deserialize_escalation"
    )]
    pub escalation: BTreeMap<String, Ladder>,
    /// Per-tool rules of the tool-call loop detectors, by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_rules: BTreeMap<String, ToolLoopRule>,
}

impl AgentSpec {
    /// A spec with the given id, no model, an empty system prompt,
    /// `max_rounds` 16, no plugins and no stop conditions.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            model_id: String::new(),
            system_prompt: String::new(),
            max_rounds: DEFAULT_MAX_ROUNDS,
            plugin_ids: Vec::new(),
            stop_conditions: Vec::new(),
            tool_choice: ToolChoice::Auto,
            context: None,
            escalation: BTreeMap::new(),
            tool_rules: BTreeMap::new(),
        }
    }

    /// Sets the model id.
    pub fn with_model_id(mut self, model_id: impl Into<String>) -> Self {
        self.model_id = model_id.into();
        self
    }

    /// Sets the system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Sets the round limit (0 = unbounded).
    pub fn with_max_rounds(mut self, max_rounds: usize) -> Self {
        self.max_rounds = max_rounds;
        self
    }

    /// Appends a plugin id.
    pub fn with_plugin_id(mut self, plugin_id: impl Into<String>) -> Self {
        self.plugin_ids.push(plugin_id.into());
        self
    }

    /// Appends a declarative stop condition.
    pub fn with_stop_condition(mut self, spec: StopConditionSpec) -> Self {
        self.stop_conditions.push(spec);
        self
    }

    /// Sets the context policy.
    pub fn with_context(mut self, policy: ContextPolicy) -> Self {
        self.context = Some(policy);
        self
    }

    /// Sets the escalation ladder of the detector with stop code `code`
    /// (e.g. `tool_call_loop`), replacing its `on_detect`.
    pub fn with_escalation(mut self, code: impl Into<String>, ladder: Ladder) -> Self {
        self.escalation.insert(code.into(), ladder);
        self
    }

    /// Sets `tool`'s own rule for the tool-call loop detectors.
    pub fn with_tool_rule(mut self, tool: impl Into<String>, rule: ToolLoopRule) -> Self {
        self.tool_rules.insert(tool.into(), rule);
        self
    }

    /// Sets the default tool choice.
    pub fn with_tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }
}

/// Names a model: the id agents refer to, the provider that serves it and
/// the model's name at that provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ModelSpec {
    /// The id an [`AgentSpec::model_id`] refers to.
    pub id: String,
    /// The id a provider (executor) is registered under.
    pub provider_id: String,
    /// The model name sent to the provider.
    pub upstream_model: String,
    /// Sampling temperature, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Output token limit, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

impl ModelSpec {
    /// A model `id` served by `provider_id` under the name `upstream_model`.
    pub fn new(
        id: impl Into<String>,
        provider_id: impl Into<String>,
        upstream_model: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            provider_id: provider_id.into(),
            upstream_model: upstream_model.into(),
            temperature: None,
            max_output_tokens: None,
        }
    }

    /// Sets the sampling temperature.
    pub fn with_temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Sets the output token limit.
    pub fn with_max_output_tokens(mut self, max: u32) -> Self {
        self.max_output_tokens = Some(max);
        self
    }
}
