//! Agent and model specifications: what an agent is, independent of any run.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::approval::ApprovalRule;
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
    /// Other agents this one may hand tasks to, each as a tool
    /// `{ "task": string }` (see [`SubagentSpec`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<SubagentSpec>,
    /// Approval rules for the agent's tool calls, first match decides
    /// ([`crate::approval`]); none: every call runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalRule>,
}

/// What a sub-agent sees of its parent's conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubagentContext {
    /// Only the task it is given (communication).
    #[default]
    Isolated,
    /// The parent's history up to the call, then the task, under the
    /// sub-agent's own system prompt and tools.
    Shared,
}

/// One sub-agent of an agent: another agent of the runtime, called by the
/// parent's model as a tool `{ "task": string }`.
///
/// A call runs the agent as a child run on a thread of its own; its end
/// (whatever ended it) is the call's result, and the parent goes on. Its
/// limits default to, and are capped by, what the parent has left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SubagentSpec {
    /// The agent that runs the task.
    pub agent: String,
    /// The tool's name (default: the agent id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The tool's description, shown to the parent's model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// What the child sees (default `isolated`).
    #[serde(default)]
    pub context: SubagentContext,
    /// Declared outputs the child must emit (name → JSON type: `string`,
    /// `number`, `integer`, `boolean`, `object`, `array`); the child ends
    /// with `goal` once it has emitted them all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
    /// The child's most inferences (capped by what the parent has left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<usize>,
    /// The child's deadline (capped by the parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// The child's token budget (capped by what the parent's has left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
}

/// A path `a → b → … → a` through the `subagents` of `specs` (searched
/// from each spec in order), if an agent reaches itself; entries naming an
/// agent not in `specs` lead nowhere.
pub fn subagent_cycle(specs: &[AgentSpec]) -> Option<Vec<String>> {
    fn visit<'a>(
        at: &'a str,
        specs: &'a [AgentSpec],
        path: &mut Vec<&'a str>,
        done: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(from) = path.iter().position(|p| *p == at) {
            let mut cycle: Vec<String> = path[from..].iter().map(|s| (*s).to_owned()).collect();
            cycle.push(at.to_owned());
            return Some(cycle);
        }
        if done.contains(&at) {
            return None;
        }
        path.push(at);
        let entries = specs
            .iter()
            .find(|s| s.id == at)
            .map(|s| s.subagents.as_slice());
        for entry in entries.unwrap_or_default() {
            if let Some(cycle) = visit(&entry.agent, specs, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(at);
        None
    }
    let mut done = Vec::new();
    specs
        .iter()
        .find_map(|s| visit(&s.id, specs, &mut Vec::new(), &mut done))
}

impl SubagentSpec {
    /// A sub-agent entry for `agent`: tool named after it, `isolated`, no
    /// outputs, no limits of its own.
    pub fn new(agent: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            tool: None,
            description: String::new(),
            context: SubagentContext::Isolated,
            outputs: BTreeMap::new(),
            max_rounds: None,
            timeout_seconds: None,
            token_budget: None,
        }
    }

    /// The tool's name: `tool`, else the agent id.
    pub fn tool_name(&self) -> &str {
        self.tool.as_deref().unwrap_or(&self.agent)
    }

    /// Names the tool.
    pub fn with_tool(mut self, name: impl Into<String>) -> Self {
        self.tool = Some(name.into());
        self
    }

    /// Describes the tool to the parent's model.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Sets what the child sees.
    pub fn with_context(mut self, context: SubagentContext) -> Self {
        self.context = context;
        self
    }

    /// Declares an output the child must emit, with its JSON type.
    pub fn with_output(mut self, name: impl Into<String>, json_type: impl Into<String>) -> Self {
        self.outputs.insert(name.into(), json_type.into());
        self
    }

    /// Caps the child's inferences.
    pub fn with_max_rounds(mut self, rounds: usize) -> Self {
        self.max_rounds = Some(rounds);
        self
    }

    /// Gives the child a deadline.
    pub fn with_timeout_seconds(mut self, seconds: u64) -> Self {
        self.timeout_seconds = Some(seconds);
        self
    }

    /// Gives the child a token budget.
    pub fn with_token_budget(mut self, tokens: u64) -> Self {
        self.token_budget = Some(tokens);
        self
    }
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
            subagents: Vec::new(),
            approvals: Vec::new(),
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

    /// Adds a sub-agent: another agent this one may hand tasks to.
    pub fn with_subagent(mut self, subagent: SubagentSpec) -> Self {
        self.subagents.push(subagent);
        self
    }

    /// Adds an approval rule (after the ones already there: the first
    /// matching rule decides).
    pub fn with_approval(mut self, rule: ApprovalRule) -> Self {
        self.approvals.push(rule);
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
    /// Models to go on with, in order, when this one's provider keeps
    /// failing (down, overloaded, refusing for rate) past the retries a
    /// run gives it; each a registered model id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<String>,
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
            fallbacks: Vec::new(),
        }
    }

    /// Sets the models to go on with when this one's provider keeps failing.
    pub fn with_fallbacks<I: Into<String>>(mut self, ids: impl IntoIterator<Item = I>) -> Self {
        self.fallbacks = ids.into_iter().map(Into::into).collect();
        self
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
