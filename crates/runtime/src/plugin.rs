//! Plugins: named bundles of state keys, phase hooks and tools.
//!
//! A plugin is registered on the builder under an id
//! ([`AgentRuntimeBuilder::with_plugin`](crate::AgentRuntimeBuilder::with_plugin)),
//! and is active for the agents whose `AgentSpec.plugin_ids` list that id.
//! [`Plugin::register`] runs once per such agent, at `build()` time, with a
//! [`PluginRegistrar`] that collects what the plugin contributes.
//!
//! This module does not run hooks; see [`phase`](crate::phase).

use std::sync::Arc;

use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::{StateError, StateKey};
use rein_runtime_contract::tool::Tool;

use crate::phase::PhaseHook;
use crate::state::{KeyRegistration, register_key};

/// A bundle of state keys, phase hooks and tools, activated per agent by id.
///
/// ```
/// use std::sync::Arc;
/// use rein_runtime::plugin::{Plugin, PluginRegistrar};
/// use rein_runtime::phase::{HookError, PhaseContext, PhaseHook};
/// use rein_runtime_contract::phase::Phase;
/// use rein_runtime_contract::state::{StateError, StateKey};
///
/// struct Rounds;
/// impl StateKey for Rounds {
///     const KEY: &'static str = "counter.rounds";
///     type Value = u32;
/// }
///
/// struct CountRounds;
/// #[async_trait::async_trait]
/// impl PhaseHook for CountRounds {
///     async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
///         *ctx.state_mut::<Rounds>()? += 1;
///         Ok(())
///     }
/// }
///
/// struct Counter;
/// impl Plugin for Counter {
///     fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
///         r.register_key::<Rounds>()?;
///         r.register_hook(Phase::StepStart, Arc::new(CountRounds));
///         Ok(())
///     }
/// }
/// ```
pub trait Plugin: Send + Sync {
    /// Declares the plugin's keys, hooks and tools for one agent.
    ///
    /// # Errors
    ///
    /// A [`StateError`] from [`PluginRegistrar::register_key`], e.g. when
    /// another listed plugin already owns the key; `build()` reports it.
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError>;
}

/// A hook together with the id of the plugin that registered it.
#[derive(Clone)]
pub(crate) struct HookEntry {
    pub(crate) plugin_id: Arc<str>,
    pub(crate) hook: Arc<dyn PhaseHook>,
}

/// Collects what the plugins listed by one agent contribute.
pub struct PluginRegistrar {
    agent_id: String,
    plugin_id: Arc<str>,
    pub(crate) keys: Vec<KeyRegistration>,
    pub(crate) hooks: Vec<(Phase, HookEntry)>,
    pub(crate) tools: Vec<(String, String, Arc<dyn Tool>)>,
    /// Set by the `ask_user` plugin: its tool's calls park the run.
    pub(crate) asks_user: bool,
}

impl std::fmt::Debug for PluginRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistrar")
            .field("agent_id", &self.agent_id)
            .field("plugin_id", &self.plugin_id)
            .field("keys", &self.keys)
            .field("hooks", &self.hooks.len())
            .field(
                "tools",
                &self.tools.iter().map(|t| &t.1).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl PluginRegistrar {
    pub(crate) fn new(agent_id: &str) -> Self {
        Self {
            agent_id: agent_id.to_owned(),
            plugin_id: Arc::from(""),
            keys: Vec::new(),
            hooks: Vec::new(),
            tools: Vec::new(),
            asks_user: false,
        }
    }

    pub(crate) fn set_plugin(&mut self, plugin_id: &str) {
        self.plugin_id = Arc::from(plugin_id);
    }

    /// The agent being assembled.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The id the registering plugin was registered under.
    pub fn plugin_id(&self) -> &str {
        &self.plugin_id
    }

    /// Claims the state key `K` for this plugin; every run of the agent
    /// starts with `K::Value::default()`.
    ///
    /// # Errors
    ///
    /// [`StateError::KeyAlreadyRegistered`] when a plugin listed by the same
    /// agent (or this one) already registered `K::KEY`.
    pub fn register_key<K: StateKey>(&mut self) -> Result<(), StateError> {
        register_key(&mut self.keys, KeyRegistration::of::<K>(&self.plugin_id))
    }

    /// Exports the state key `K` (registered earlier by one of the agent's
    /// listed plugins): its value at the end of each run is copied, as JSON,
    /// into [`AgentRunResult::exports`](crate::AgentRunResult::exports) and
    /// read back with [`AgentRunResult::exported`](crate::AgentRunResult::exported).
    /// This is how an extension carries per-run state out of a run.
    ///
    /// # Errors
    ///
    /// [`StateError::UnknownKey`] when no listed plugin registered `K`
    /// before this call.
    pub fn export_key<K: StateKey>(&mut self) -> Result<(), StateError> {
        crate::state::export_key::<K>(&mut self.keys)
    }

    /// Runs `hook` at `phase`, after the hooks of plugins listed earlier and
    /// after this plugin's earlier registrations for the same phase.
    pub fn register_hook(&mut self, phase: Phase, hook: Arc<dyn PhaseHook>) {
        self.hooks.push((
            phase,
            HookEntry {
                plugin_id: self.plugin_id.clone(),
                hook,
            },
        ));
    }

    /// Offers `tool` under `name` to the agents listing this plugin. The
    /// tool's descriptor must carry the same name, and no other source may
    /// provide it; `build()` checks both.
    pub fn register_tool(&mut self, name: impl Into<String>, tool: Arc<dyn Tool>) {
        self.tools
            .push((self.plugin_id.to_string(), name.into(), tool));
    }
}
