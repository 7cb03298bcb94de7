//! Assembling a runtime: agents, models, providers, tools and plugins,
//! checked once at [`AgentRuntimeBuilder::build`].

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rein_runtime_contract::event::{EventSink, NullSink};
use rein_runtime_contract::inference::LlmExecutor;
use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
use rein_runtime_contract::state::StateError;
use rein_runtime_contract::tool::Tool;

use crate::agent::Agent;
use crate::agent_loop::RetryBackoff;
use crate::extensions::RunObserver;
use crate::plugin::{Plugin, PluginRegistrar};
use crate::runtime::{AgentRuntime, RuntimeConfig};
use crate::thread_store::{InMemoryThreadStore, ThreadStore};

/// The default bound of `cancel_and_wait_by_thread` and of a mailbox
/// interrupt.
pub const DEFAULT_CANCEL_WAIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why [`AgentRuntimeBuilder::build`] failed. Every variant names the
/// offending id and, where useful, the ids that would have been accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// An agent's sub-agent entry is invalid: an unknown agent, a bad
    /// output type, or sub-agents that reach their own agent again.
    #[error("agent \"{agent_id}\": invalid sub-agent: {message}")]
    InvalidSubagent {
        /// The agent whose `subagents` has the entry.
        agent_id: String,
        /// What is wrong, naming the entry (and the cycle, for one).
        message: String,
    },
    /// An agent's approval rule is invalid or matches none of its tools.
    #[error("agent \"{agent_id}\": invalid approval rule: {message}")]
    InvalidApproval {
        /// The agent.
        agent_id: String,
        /// What is wrong, naming the rule by its position.
        message: String,
    },
    /// An agent's context policy is invalid or names an unknown model.
    #[error("agent \"{agent_id}\": invalid context policy: {message}")]
    InvalidContext {
        /// The agent.
        agent_id: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// An agent's escalation ladders or tool rules do not fit its stop
    /// conditions.
    #[error("agent \"{agent_id}\": invalid escalation: {message}")]
    InvalidEscalation {
        /// The agent.
        agent_id: String,
        /// What is wrong, naming the detector code or tool.
        message: String,
    },
    /// A stop condition judged by a model (`llm_loop_check`,
    /// `task_complete`) names a model nobody registered.
    #[error(
        "agent \"{agent_id}\": the `{code}` stop condition names model_id \"{model_id}\", which is not a registered model; registered: {known}"
    )]
    UnknownCheckModel {
        /// The agent.
        agent_id: String,
        /// The condition's type.
        code: String,
        /// The unknown model id.
        model_id: String,
        /// The registered model ids (or `none`).
        known: String,
    },
    /// A token counter was registered for a model nobody registered.
    #[error(
        "a token counter is registered for model \"{model_id}\", which is not a registered model; registered: {known}"
    )]
    UnknownCounterModel {
        /// The unknown model id.
        model_id: String,
        /// The registered model ids (or `none`).
        known: String,
    },
    /// Two agent specs share an id.
    #[error("agent id \"{agent_id}\" is registered twice; agent ids must be unique")]
    DuplicateAgent {
        /// The id.
        agent_id: String,
    },
    /// Two model specs share an id.
    #[error("model id \"{model_id}\" is registered twice; model ids must be unique")]
    DuplicateModel {
        /// The id.
        model_id: String,
    },
    /// Two providers share an id.
    #[error("provider id \"{provider_id}\" is registered twice; provider ids must be unique")]
    DuplicateProvider {
        /// The id.
        provider_id: String,
    },
    /// A model's fallback is not a registered model (or is the model).
    #[error(
        "model \"{model_id}\" (of agent \"{agent_id}\") falls back to \"{fallback}\", {problem}; registered model ids: {known}"
    )]
    InvalidFallback {
        /// The agent.
        agent_id: String,
        /// The model.
        model_id: String,
        /// The fallback named.
        fallback: String,
        /// What is wrong with it.
        problem: String,
        /// The registered model ids.
        known: String,
    },
    /// Limits were set for a provider nobody registered, or are invalid.
    #[error("provider \"{provider_id}\" limits: {message}")]
    InvalidLimits {
        /// The provider id.
        provider_id: String,
        /// What is wrong.
        message: String,
    },
    /// Two plugins share an id.
    #[error("plugin id \"{plugin_id}\" is registered twice; plugin ids must be unique")]
    DuplicatePlugin {
        /// The id.
        plugin_id: String,
    },
    /// An agent lists the same plugin twice.
    #[error("agent \"{agent_id}\" lists plugin id \"{plugin_id}\" twice in plugin_ids")]
    PluginListedTwice {
        /// The agent.
        agent_id: String,
        /// The plugin.
        plugin_id: String,
    },
    /// An agent lists a plugin id nobody registered.
    #[error(
        "unknown plugin id \"{plugin_id}\" in agent \"{agent_id}\"; registered ids: {registered}"
    )]
    UnknownPlugin {
        /// The agent.
        agent_id: String,
        /// The unknown id.
        plugin_id: String,
        /// The registered ids, comma-separated (or `none`).
        registered: String,
    },
    /// A plugin's registration failed for an agent, e.g. a state key that
    /// another listed plugin already owns.
    #[error("plugin \"{plugin_id}\" could not be registered for agent \"{agent_id}\": {source}")]
    PluginState {
        /// The agent.
        agent_id: String,
        /// The plugin.
        plugin_id: String,
        /// The state error, naming the key.
        #[source]
        source: StateError,
    },
    /// An agent has an empty `model_id`.
    #[error("agent \"{agent_id}\" has no model_id; set one of the registered model ids: {known}")]
    MissingModel {
        /// The agent.
        agent_id: String,
        /// The registered model ids (or `none`).
        known: String,
    },
    /// An agent names a model nobody registered.
    #[error(
        "unknown model id \"{model_id}\" in agent \"{agent_id}\"; registered model ids: {known}"
    )]
    UnknownModel {
        /// The agent.
        agent_id: String,
        /// The unknown id.
        model_id: String,
        /// The registered model ids (or `none`).
        known: String,
    },
    /// A model names a provider nobody registered.
    #[error(
        "unknown provider id \"{provider_id}\" in model \"{model_id}\"; registered provider ids: {known}"
    )]
    UnknownProvider {
        /// The model.
        model_id: String,
        /// The unknown provider id.
        provider_id: String,
        /// The registered provider ids (or `none`).
        known: String,
    },
    /// A tool was registered under a name its descriptor does not carry.
    #[error(
        "tool registered as \"{name}\" describes itself as \"{descriptor_name}\"; register it under its descriptor's name"
    )]
    ToolNameMismatch {
        /// The registration name.
        name: String,
        /// The descriptor's name.
        descriptor_name: String,
    },
    /// One tool name is provided by two sources.
    #[error(
        "tool \"{name}\" is provided by both {first} and {second}; tool names must be unique per agent"
    )]
    DuplicateTool {
        /// The tool name.
        name: String,
        /// The first source (`with_tool` or `plugin "<id>"`).
        first: String,
        /// The second source.
        second: String,
    },
}

fn list<'a>(ids: impl IntoIterator<Item = &'a str>) -> String {
    let mut ids: Vec<&str> = ids.into_iter().collect();
    ids.sort_unstable();
    if ids.is_empty() {
        "none".to_owned()
    } else {
        ids.join(", ")
    }
}

/// Builds an [`AgentRuntime`]. Registration methods never fail; every check
/// happens in [`build`](Self::build).
pub struct AgentRuntimeBuilder {
    agents: Vec<AgentSpec>,
    tools: Vec<(String, Arc<dyn Tool>)>,
    plugins: Vec<(String, Arc<dyn Plugin>)>,
    providers: Vec<(String, Arc<dyn LlmExecutor>)>,
    models: Vec<ModelSpec>,
    counters: Vec<(String, Arc<dyn crate::context::TokenCounter>)>,
    limits: Vec<(String, crate::limits::ProviderLimits)>,
    ledger: Option<Arc<dyn crate::limits::LimitLedger>>,
    config: RuntimeConfig,
}

impl std::fmt::Debug for AgentRuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuntimeBuilder")
            .field(
                "agents",
                &self.agents.iter().map(|a| &a.id).collect::<Vec<_>>(),
            )
            .field(
                "tools",
                &self.tools.iter().map(|t| &t.0).collect::<Vec<_>>(),
            )
            .field(
                "plugins",
                &self.plugins.iter().map(|p| &p.0).collect::<Vec<_>>(),
            )
            .field(
                "providers",
                &self.providers.iter().map(|p| &p.0).collect::<Vec<_>>(),
            )
            .field("models", &self.models)
            .finish_non_exhaustive()
    }
}

impl Default for AgentRuntimeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentRuntimeBuilder {
    /// An empty builder: in-memory thread store, no default event sink,
    /// 5 s cancel-wait bound, retry backoff from 500 ms doubling to 30 s
    /// (with jitter).
    pub fn new() -> Self {
        Self {
            agents: Vec::new(),
            tools: Vec::new(),
            plugins: Vec::new(),
            providers: Vec::new(),
            models: Vec::new(),
            counters: Vec::new(),
            limits: Vec::new(),
            ledger: None,
            config: RuntimeConfig {
                store: Arc::new(InMemoryThreadStore::new()),
                default_sink: Arc::new(NullSink),
                cancel_wait: DEFAULT_CANCEL_WAIT_TIMEOUT,
                backoff: RetryBackoff::default(),
                trace_content: false,
                observers: Vec::new(),
                extensions: HashMap::new(),
                artifacts: Arc::new(crate::context::InMemoryArtifactStore::new()),
                providers: Vec::new(),
            },
        }
    }

    /// Adds an agent.
    pub fn with_agent_spec(mut self, spec: AgentSpec) -> Self {
        self.agents.push(spec);
        self
    }

    /// Adds a tool every agent can call; `tool.descriptor().name` must be `name`.
    pub fn with_tool(mut self, name: impl Into<String>, tool: Arc<dyn Tool>) -> Self {
        self.tools.push((name.into(), tool));
        self
    }

    /// Adds tools every agent can call, each under its descriptor's name —
    /// e.g. the `Arc<dyn Tool>`s made by [`tool_fn`](crate::tools::tool_fn)
    /// and [`typed`](crate::tools::typed).
    pub fn with_tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        for tool in tools {
            self.tools.push((tool.descriptor().name, tool));
        }
        self
    }

    /// Registers a plugin under `id`; agents activate it by listing `id` in
    /// `plugin_ids`.
    pub fn with_plugin(mut self, id: impl Into<String>, plugin: Arc<dyn Plugin>) -> Self {
        self.plugins.push((id.into(), plugin));
        self
    }

    /// Registers an executor under a provider id that models refer to.
    pub fn with_provider(mut self, id: impl Into<String>, executor: Arc<dyn LlmExecutor>) -> Self {
        self.providers.push((id.into(), executor));
        self
    }

    /// Limits the provider registered as `id`: every inference on it first
    /// reserves a request and its estimated tokens, and waits while the
    /// limits are used up (see [`limits`](crate::limits)).
    pub fn with_provider_limits(
        mut self,
        id: impl Into<String>,
        limits: crate::limits::ProviderLimits,
    ) -> Self {
        self.limits.push((id.into(), limits));
        self
    }

    /// Keeps the providers' reservations in `ledger` instead of in this
    /// runtime alone — a ledger shared between processes (the PostgreSQL
    /// one) makes the limits hold for the whole cluster.
    pub fn with_limit_ledger(mut self, ledger: Arc<dyn crate::limits::LimitLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// Registers a model.
    pub fn with_model(mut self, model: ModelSpec) -> Self {
        self.models.push(model);
        self
    }

    /// Bounds how long `cancel_and_wait_by_thread` and a mailbox interrupt
    /// wait for a cancelled run to release its thread (default 5 s).
    pub fn with_cancel_wait_timeout(mut self, timeout: Duration) -> Self {
        self.config.cancel_wait = timeout;
        self
    }

    /// Sets where offloaded tool results are kept (agents with a context
    /// policy that offloads or compacts); default in memory.
    pub fn with_artifact_store(mut self, store: Arc<dyn crate::context::ArtifactStore>) -> Self {
        self.config.artifacts = store;
        self
    }

    /// Counts prompt tokens for the model `model_id` with `counter` (its
    /// exact tokenizer) in agents with a context policy or a token budget.
    /// Without one, an OpenAI model gets `tiktoken`'s (with the `tiktoken`
    /// feature) and any other model a calibrated estimate from characters.
    pub fn with_token_counter(
        mut self,
        model_id: impl Into<String>,
        counter: Arc<dyn crate::context::TokenCounter>,
    ) -> Self {
        self.counters.push((model_id.into(), counter));
        self
    }

    /// Replaces the in-memory thread store.
    pub fn with_thread_store(mut self, store: Arc<dyn ThreadStore>) -> Self {
        self.config.store = store;
        self
    }

    /// The sink for runs whose request names none (default: events are dropped).
    pub fn with_event_sink(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.config.default_sink = sink;
        self
    }

    /// Whether the GenAI tracing spans record message contents — the
    /// prompt and answer on `chat` spans, a tool's arguments and result on
    /// `execute_tool` spans (default `false`: they may hold personal
    /// data). See [`telemetry`](crate::telemetry).
    pub fn with_trace_content(mut self, record: bool) -> Self {
        self.config.trace_content = record;
        self
    }

    /// Sets the retry backoff: a ceiling of `base` doubling per failure, at
    /// most `cap` (defaults 500 ms and 30 s); each wait is random between
    /// half the ceiling and the ceiling (equal jitter), so runs that fail
    /// together do not retry in lockstep. A provider's `retry_after`
    /// overrides it, exactly (no jitter), up to 60 s.
    pub fn with_retry_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.config.backoff = RetryBackoff { base, cap };
        self
    }

    /// Adds an observer of every run's end and of thread cancellations
    /// and deletions (see [`RunObserver`]).
    pub fn with_run_observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.config.observers.push(observer);
        self
    }

    /// Sets the runtime's extension value of type `T` (one per type; a
    /// later call replaces an earlier one). Layers keep their settings
    /// here; read it back with [`AgentRuntime::extension`].
    pub fn with_extension<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.config
            .extensions
            .insert(TypeId::of::<T>(), Box::new(value));
        self
    }

    /// The extension value of type `T`, inserted as `T::default()` if
    /// there is none yet — for layers whose builder methods each set one
    /// field of their settings.
    ///
    /// # Panics
    ///
    /// Never: the slot is checked to hold a `T` first.
    pub fn extension_mut<T: Any + Send + Sync + Default>(&mut self) -> &mut T {
        let slot = self
            .config
            .extensions
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()));
        if !slot.is::<T>() {
            *slot = Box::new(T::default());
        }
        // The slot holds a `T`: it was just checked (or replaced) above.
        #[allow(clippy::expect_used)]
        slot.downcast_mut::<T>()
            .expect("the slot was just checked to hold this type")
    }

    /// Checks everything and assembles the runtime.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the first problem found: duplicate ids, an
    /// agent's missing or unknown model, a model's unknown provider, an
    /// unknown or twice-listed plugin id, a plugin registration that fails
    /// (e.g. two listed plugins owning one state key), a tool whose
    /// descriptor name differs from its registration name, or one tool name
    /// from two sources.
    pub fn build(mut self) -> Result<AgentRuntime, BuildError> {
        // Sub-agent entries: checked, and those with declared outputs run a
        // hidden variant of their agent with its own outputs plugin.
        let plan = crate::subagents::plan(&self.agents)?;
        let mut hidden = HashSet::new();
        for (variant, plugin_id, plugin) in plan.variants {
            hidden.insert(variant.id.clone());
            self.plugins.push((plugin_id, plugin));
            self.agents.push(variant);
        }
        let own_rounds: HashMap<String, usize> = self
            .agents
            .iter()
            .map(|s| (s.id.clone(), s.max_rounds))
            .collect();
        let runtime_cell: Arc<std::sync::OnceLock<std::sync::Weak<crate::runtime::Inner>>> =
            Arc::default();
        let providers = unique(&self.providers, |id| BuildError::DuplicateProvider {
            provider_id: id.to_owned(),
        })?;
        let plugins = unique(&self.plugins, |id| BuildError::DuplicatePlugin {
            plugin_id: id.to_owned(),
        })?;
        let gates = self.gates(&providers)?;
        let mut models: HashMap<&str, &ModelSpec> = HashMap::new();
        for m in &self.models {
            if models.insert(&m.id, m).is_some() {
                return Err(BuildError::DuplicateModel {
                    model_id: m.id.clone(),
                });
            }
        }
        let mut shared_tools: Vec<(String, String, Arc<dyn Tool>)> = Vec::new();
        for (name, tool) in &self.tools {
            shared_tools.push(("with_tool".to_owned(), name.clone(), tool.clone()));
        }

        let mut agents = HashMap::new();
        // One calibration per model, shared by the agents that use it.
        let mut calibrations: HashMap<String, Arc<crate::context::Calibration>> = HashMap::new();
        for (model_id, counter) in self.counters {
            if !models.contains_key(model_id.as_str()) {
                return Err(BuildError::UnknownCounterModel {
                    model_id,
                    known: list(models.keys().copied()),
                });
            }
            calibrations.insert(
                model_id,
                Arc::new(crate::context::Calibration::with_counter(counter)),
            );
        }
        for spec in self.agents {
            if agents.contains_key(&spec.id) {
                return Err(BuildError::DuplicateAgent { agent_id: spec.id });
            }
            let model = resolve_model(&spec, &models)?;
            let crate::agent::Route {
                executor, limits, ..
            } = route_to(model, &providers, &gates)?;
            let mut registrar = PluginRegistrar::new(&spec.id);
            let mut listed = HashSet::new();
            for plugin_id in &spec.plugin_ids {
                if !listed.insert(plugin_id.as_str()) {
                    return Err(BuildError::PluginListedTwice {
                        agent_id: spec.id.clone(),
                        plugin_id: plugin_id.clone(),
                    });
                }
                let plugin =
                    plugins
                        .get(plugin_id.as_str())
                        .ok_or_else(|| BuildError::UnknownPlugin {
                            agent_id: spec.id.clone(),
                            plugin_id: plugin_id.clone(),
                            registered: list(plugins.keys().copied()),
                        })?;
                registrar.set_plugin(plugin_id);
                plugin
                    .register(&mut registrar)
                    .map_err(|source| BuildError::PluginState {
                        agent_id: spec.id.clone(),
                        plugin_id: plugin_id.clone(),
                        source,
                    })?;
            }
            let mut tools: HashMap<String, Arc<dyn Tool>> = HashMap::new();
            let mut sources: HashMap<String, String> = HashMap::new();
            let mut descriptors = Vec::new();
            let plugin_tools = registrar
                .tools
                .drain(..)
                .map(|(plugin, name, tool)| (format!("plugin \"{plugin}\""), name, tool));
            for (source, name, tool) in shared_tools.iter().cloned().chain(plugin_tools) {
                let descriptor = tool.descriptor();
                if descriptor.name != name {
                    return Err(BuildError::ToolNameMismatch {
                        name,
                        descriptor_name: descriptor.name,
                    });
                }
                if let Some(first) = sources.get(&name) {
                    return Err(BuildError::DuplicateTool {
                        name,
                        first: first.clone(),
                        second: source,
                    });
                }
                sources.insert(name.clone(), source);
                descriptors.push(descriptor);
                tools.insert(name, tool);
            }
            let mut subagents = HashMap::new();
            for entry in &spec.subagents {
                let name = entry.tool_name().to_owned();
                let source = format!("sub-agent entry for agent \"{}\"", entry.agent);
                if let Some(first) = sources.get(&name) {
                    return Err(BuildError::DuplicateTool {
                        name,
                        first: first.clone(),
                        second: source,
                    });
                }
                let target = if entry.outputs.is_empty() {
                    entry.agent.clone()
                } else {
                    crate::subagents::variant_id(&spec.id, entry)
                };
                let rounds = own_rounds.get(&target).copied().unwrap_or(0);
                let tool = Arc::new(crate::subagents::SubagentTool::new(
                    entry.clone(),
                    target,
                    rounds,
                    runtime_cell.clone(),
                ));
                sources.insert(name.clone(), source);
                descriptors.push(tool.descriptor());
                tools.insert(name.clone(), tool.clone() as Arc<dyn Tool>);
                subagents.insert(name, tool);
            }
            check_escalation(&spec)?;
            if let Some(policy) = &spec.context {
                policy
                    .validate()
                    .map_err(|message| BuildError::InvalidContext {
                        agent_id: spec.id.clone(),
                        message,
                    })?;
                if policy.uses_artifacts() {
                    let name = crate::context::READ_ARTIFACT.to_owned();
                    if let Some(first) = sources.get(&name) {
                        return Err(BuildError::DuplicateTool {
                            name,
                            first: first.clone(),
                            second: "the context policy".to_owned(),
                        });
                    }
                    let tool: Arc<dyn Tool> = Arc::new(crate::context::ReadArtifact::new(
                        self.config.artifacts.clone(),
                    ));
                    descriptors.push(tool.descriptor());
                    tools.insert(name, tool);
                }
            }
            let (mut setup, active) = context_setup(
                &spec,
                model,
                &executor,
                &models,
                &providers,
                &self.config.artifacts,
                &mut calibrations,
            )?;
            setup.compact_calls = compact_forms(&spec, &tools)?;
            let measure = Arc::new(setup);
            let context = active.then(|| measure.clone());
            let mut hooks: [Vec<_>; 8] = Default::default();
            for (phase, entry) in registrar.hooks.drain(..) {
                hooks[phase.index()].push(entry);
            }
            let gate = crate::approvals::Gate::new(&spec, &descriptors, registrar.asks_user)
                .map_err(|message| BuildError::InvalidApproval {
                    agent_id: spec.id.clone(),
                    message,
                })?;
            // Its phrase automaton is built now, not in a run's final answer.
            if spec.stop_conditions.iter().any(|c| {
                matches!(
                    c,
                    rein_runtime_contract::lifecycle::StopConditionSpec::AwaitingUser { .. }
                )
            }) {
                crate::detectors::awaiting_user::prepare();
            }
            let agent = Agent {
                gate,
                hidden: hidden.contains(&spec.id),
                id: spec.id.as_str().into(),
                subagents,
                guard: Agent::guard_items(&spec),
                deadline: Agent::deadline_of(&spec),
                model: model.clone(),
                limits,
                fallbacks: fallbacks(&spec, model, &models, &providers, &gates)?,
                checks: check_routes(&spec, &models, &providers, &gates)?,
                executor,
                tools,
                descriptors,
                hooks,
                context,
                measure,
                tool_rules: Arc::new(spec.tool_rules.clone()),
                keys: std::mem::take(&mut registrar.keys),
                spec,
            };
            agents.insert(agent.spec.id.clone(), Arc::new(agent));
        }
        let mut ids: Vec<&str> = providers.keys().copied().collect();
        ids.sort_unstable();
        self.config.providers = ids
            .into_iter()
            .map(|id| (id.to_owned(), gates.get(id).cloned()))
            .collect();
        let runtime = AgentRuntime::new(agents, self.config);
        let _ = runtime_cell.set(Arc::downgrade(runtime.inner()));
        Ok(runtime)
    }
}

/// The agent's model's fallbacks, resolved to routes in order.
fn fallbacks(
    spec: &AgentSpec,
    model: &ModelSpec,
    models: &HashMap<&str, &ModelSpec>,
    providers: &HashMap<&str, Arc<dyn LlmExecutor>>,
    gates: &HashMap<String, Arc<crate::limits::ProviderGate>>,
) -> Result<Vec<crate::agent::Route>, BuildError> {
    let mut routes: Vec<crate::agent::Route> = Vec::new();
    for id in &model.fallbacks {
        let invalid = |problem: &str| BuildError::InvalidFallback {
            agent_id: spec.id.clone(),
            model_id: model.id.clone(),
            fallback: id.clone(),
            problem: problem.to_owned(),
            known: list(models.keys().copied()),
        };
        let Some(fallback) = models.get(id.as_str()) else {
            return Err(invalid("which is not a registered model"));
        };
        if fallback.id == model.id || routes.iter().any(|r| r.model.id == fallback.id) {
            return Err(invalid("which is the model itself or named twice"));
        }
        routes.push(route_to(fallback, providers, gates)?);
    }
    Ok(routes)
}

/// The route to `model`: its provider's executor and limits.
fn route_to(
    model: &ModelSpec,
    providers: &HashMap<&str, Arc<dyn LlmExecutor>>,
    gates: &HashMap<String, Arc<crate::limits::ProviderGate>>,
) -> Result<crate::agent::Route, BuildError> {
    let executor = providers
        .get(model.provider_id.as_str())
        .cloned()
        .ok_or_else(|| BuildError::UnknownProvider {
            model_id: model.id.clone(),
            provider_id: model.provider_id.clone(),
            known: list(providers.keys().copied()),
        })?;
    Ok(crate::agent::Route {
        model: model.clone(),
        executor,
        limits: gates.get(model.provider_id.as_str()).cloned(),
    })
}

/// The judging models of the agent's model-judged stop conditions, in
/// list order.
fn check_routes(
    spec: &AgentSpec,
    models: &HashMap<&str, &ModelSpec>,
    providers: &HashMap<&str, Arc<dyn LlmExecutor>>,
    gates: &HashMap<String, Arc<crate::limits::ProviderGate>>,
) -> Result<Vec<crate::agent::Route>, BuildError> {
    use rein_runtime_contract::lifecycle::StopConditionSpec;
    let mut routes = Vec::new();
    for condition in &spec.stop_conditions {
        let (StopConditionSpec::LlmLoopCheck { model_id, .. }
        | StopConditionSpec::TaskComplete { model_id, .. }) = condition
        else {
            continue;
        };
        let model = models
            .get(model_id.as_str())
            .ok_or_else(|| BuildError::UnknownCheckModel {
                agent_id: spec.id.clone(),
                code: condition.kind().to_owned(),
                model_id: model_id.clone(),
                known: list(models.keys().copied()),
            })?;
        routes.push(route_to(model, providers, gates)?);
    }
    Ok(routes)
}

impl AgentRuntimeBuilder {
    /// A gate per limited provider, all reserving in one ledger.
    fn gates(
        &self,
        providers: &HashMap<&str, Arc<dyn LlmExecutor>>,
    ) -> Result<HashMap<String, Arc<crate::limits::ProviderGate>>, BuildError> {
        let ledger = self
            .ledger
            .clone()
            .unwrap_or_else(|| Arc::new(crate::limits::InMemoryLedger::new()));
        let mut gates = HashMap::new();
        for (id, limits) in &self.limits {
            let invalid = |message: String| BuildError::InvalidLimits {
                provider_id: id.clone(),
                message,
            };
            if !providers.contains_key(id.as_str()) {
                return Err(invalid(format!(
                    "no provider is registered as \"{id}\"; registered provider ids: {}",
                    list(providers.keys().copied())
                )));
            }
            limits.validate().map_err(invalid)?;
            if gates.contains_key(id) {
                return Err(invalid("limits are set twice".to_owned()));
            }
            if limits.is_limited() {
                let gate = crate::limits::ProviderGate::new(id.clone(), *limits, ledger.clone());
                gates.insert(id.clone(), gate);
            }
        }
        Ok(gates)
    }
}

/// An agent's context setup (without its call forms:
/// [`compact_forms`]), and whether its runs use it: those of an agent with
/// a context policy or a token budget always do; the others measure
/// nothing unless a request brings its own token budget.
fn context_setup(
    spec: &AgentSpec,
    model: &ModelSpec,
    executor: &Arc<dyn LlmExecutor>,
    models: &HashMap<&str, &ModelSpec>,
    providers: &HashMap<&str, Arc<dyn LlmExecutor>>,
    artifacts: &Arc<dyn crate::context::ArtifactStore>,
    calibrations: &mut HashMap<String, Arc<crate::context::Calibration>>,
) -> Result<(crate::context::ContextSetup, bool), BuildError> {
    let budget = smallest_token_budget(spec);
    let policy = spec.context.clone();
    let active = policy.is_some() || budget.is_some();
    let summarizer =
        match policy.as_ref().and_then(|p| p.summarize.as_ref()) {
            None => None,
            Some(s) => match &s.model_id {
                None => Some((model.clone(), executor.clone())),
                Some(id) => {
                    let m = models.get(id.as_str()).ok_or_else(|| BuildError::InvalidContext {
                    agent_id: spec.id.clone(),
                    message: format!(
                        "summarize.model_id \"{id}\" is not a registered model; registered: {}",
                        list(models.keys().copied())
                    ),
                })?;
                    let e = providers.get(m.provider_id.as_str()).ok_or_else(|| {
                        BuildError::UnknownProvider {
                            model_id: m.id.clone(),
                            provider_id: m.provider_id.clone(),
                            known: list(providers.keys().copied()),
                        }
                    })?;
                    Some(((*m).clone(), e.clone()))
                }
            },
        };
    let reserve = policy
        .as_ref()
        .map_or(0, |p| p.reserve_output_tokens)
        .max(model.max_output_tokens.map_or(0, u64::from));
    let setup = crate::context::ContextSetup {
        policy,
        artifacts: artifacts.clone(),
        // A tokenizer is loaded for agents that use it; the others measure
        // a run's own budget with a registered counter or characters.
        calibration: if active {
            calibrations
                .entry(model.id.clone())
                .or_insert_with(|| Arc::new(default_calibration(model)))
                .clone()
        } else {
            calibrations.get(&model.id).cloned().unwrap_or_default()
        },
        budget,
        reserve,
        summarizer,
        compact_calls: HashMap::new(),
        views: std::sync::Mutex::default(),
    };
    Ok((setup, active))
}

/// The compact forms of the agent's calls, by tool name: the tools' own
/// (`Tool::compact_call`), then its policy's `compact.calls` (each naming
/// one of its tools); none without a compact policy.
fn compact_forms(
    spec: &AgentSpec,
    tools: &HashMap<String, Arc<dyn Tool>>,
) -> Result<HashMap<String, Vec<String>>, BuildError> {
    let mut compact_calls = HashMap::new();
    let Some(compact) = spec.context.as_ref().and_then(|p| p.compact.as_ref()) else {
        return Ok(compact_calls);
    };
    for (name, tool) in tools {
        if let Some(keep) = tool.compact_call() {
            compact_calls.insert(name.clone(), keep);
        }
    }
    for (name, keep) in &compact.calls {
        if !tools.contains_key(name) {
            let mut known: Vec<&str> = tools.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(BuildError::InvalidContext {
                agent_id: spec.id.clone(),
                message: format!(
                    "compact.calls names tool \"{name}\", which the agent does not have; its tools: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        }
        compact_calls.insert(name.clone(), keep.clone());
    }
    Ok(compact_calls)
}

/// Checks that every ladder is for a detector the agent lists, `deny` only
/// for detectors that watch tool calls, and tool rules only with a
/// tool-call loop detector.
fn check_escalation(spec: &AgentSpec) -> Result<(), BuildError> {
    use rein_runtime_contract::escalation::{
        check_code, check_deny, check_listed, check_tool_rules_listed,
    };
    let error = |message: String| BuildError::InvalidEscalation {
        agent_id: spec.id.clone(),
        message,
    };
    let listed: Vec<&str> = spec.stop_conditions.iter().map(|c| c.kind()).collect();
    for (code, ladder) in &spec.escalation {
        check_code(code).map_err(error)?;
        check_listed(code, &listed).map_err(error)?;
        check_deny(code, ladder).map_err(error)?;
    }
    if let Some(tool) = spec.tool_rules.keys().next() {
        check_tool_rules_listed(tool, &listed).map_err(error)?;
    }
    Ok(())
}

/// The smallest of the agent's `token_budget`s (0 disables one), if any.
pub(crate) fn smallest_token_budget(spec: &AgentSpec) -> Option<u64> {
    use rein_runtime_contract::lifecycle::StopConditionSpec;
    spec.stop_conditions
        .iter()
        .filter_map(|c| match c {
            StopConditionSpec::TokenBudget { max_total } if *max_total > 0 => {
                Some(*max_total as u64)
            }
            _ => None,
        })
        .min()
}

/// A model's calibration without a registered counter: `tiktoken`'s
/// tokenizer for an OpenAI model (with the feature), else characters.
fn default_calibration(model: &ModelSpec) -> crate::context::Calibration {
    #[cfg(feature = "tiktoken")]
    if let Some(counter) = crate::context::TiktokenCounter::for_model(&model.upstream_model) {
        return crate::context::Calibration::with_counter(Arc::new(counter));
    }
    let _ = model;
    crate::context::Calibration::default()
}

fn unique<T: Clone>(
    items: &[(String, T)],
    duplicate: impl Fn(&str) -> BuildError,
) -> Result<HashMap<&str, T>, BuildError> {
    let mut map = HashMap::new();
    for (id, item) in items {
        if map.insert(id.as_str(), item.clone()).is_some() {
            return Err(duplicate(id));
        }
    }
    Ok(map)
}

fn resolve_model<'a>(
    spec: &AgentSpec,
    models: &HashMap<&str, &'a ModelSpec>,
) -> Result<&'a ModelSpec, BuildError> {
    if spec.model_id.is_empty() {
        return Err(BuildError::MissingModel {
            agent_id: spec.id.clone(),
            known: list(models.keys().copied()),
        });
    }
    models
        .get(spec.model_id.as_str())
        .copied()
        .ok_or_else(|| BuildError::UnknownModel {
            agent_id: spec.id.clone(),
            model_id: spec.model_id.clone(),
            known: list(models.keys().copied()),
        })
}
