//! The deployment file (`rein.yaml`): providers, models, MCP servers,
//! agents, the store, where artifacts are kept and the server's settings,
//! loaded with every error
//! given as `FILE:LINE:COLUMN: message`.
//!
//! Loading has two passes. serde_yaml deserializes the document (agents
//! through the contract's [`AgentSpecSeed`], so agent and stop-condition
//! errors are the same as everywhere else, with their positions); then
//! every reference between sections is checked — a model's provider, an
//! agent's model, plugins and tools — and each unknown id is reported at
//! its value (positions from [`positions`]), naming it and listing the
//! known ones. All reference errors are reported, not just the first.

mod interpolate;
mod positions;
mod scripted;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use rein::config::{AgentSpecSeed, ConfigError, KeySeed, stop_condition_kinds};
use rein::limits::ProviderLimits;
use rein::registry_spec::AgentSpec;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

pub use scripted::{ScriptedItem, ScriptedReply, ScriptedToolCall, ScriptedUsage};

use positions::Positions;

/// The plugins a deployment file can list in `plugin_ids`.
pub const BUILT_IN_PLUGINS: &[&str] = &["terminate", "ask_user", "automation", "plan", "outputs"];

/// The separator of an MCP tool's qualified name: `<server id>__<tool>`.
pub const MCP_TOOL_SEPARATOR: &str = "__";

/// Names a deployment file may use beyond its own sections: the Rust
/// tools and plugins a program serving it adds ([`crate::App`]). Agents
/// list such a tool by its name in `tools`, such a plugin by its id in
/// `plugin_ids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// Tool names.
    pub tools: std::collections::BTreeSet<String>,
    /// Plugin ids.
    pub plugins: std::collections::BTreeSet<String>,
}

/// A loaded, checked deployment file.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// Providers by id.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Models by id.
    pub models: BTreeMap<String, ModelConfig>,
    /// MCP servers by id.
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// The agents, in file order.
    pub agents: Vec<AgentConfig>,
    /// Where threads are kept.
    pub store: StoreConfig,
    /// Where offloaded tool results are kept (`artifacts:`); `None`
    /// follows the store (see [`artifact_store`](Self::artifact_store)).
    pub artifacts: Option<ArtifactsConfig>,
    /// The HTTP server's settings.
    pub server: ServerSettings,
}

/// A provider: how a model's requests reach an LLM.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderConfig {
    /// Hosted providers through genai, routed by model name; keys from the
    /// usual environment variables.
    Genai {
        /// The provider's limits (service.md §10).
        #[serde(default)]
        limits: Option<ProviderLimits>,
    },
    /// An OpenAI-compatible server (llama.cpp, vLLM, …).
    OpenaiCompatible {
        /// The API's base URL, e.g. `http://127.0.0.1:8080/v1/`.
        base_url: String,
        /// The environment variable holding the API key (optional).
        #[serde(default)]
        api_key_env: Option<String>,
        /// The provider's limits (service.md §10).
        #[serde(default)]
        limits: Option<ProviderLimits>,
    },
    /// A script of replies, for offline demos and tests: shared by every
    /// run that uses it, in order, the last one repeating.
    Scripted {
        /// The replies.
        responses: Vec<ScriptedItem>,
        /// The default wait before a reply starts, in milliseconds.
        #[serde(default)]
        delay_ms: Option<u64>,
        /// The default wait between a reply's streamed chunks, in milliseconds.
        #[serde(default)]
        chunk_delay_ms: Option<u64>,
        /// The provider's limits (service.md §10).
        #[serde(default)]
        limits: Option<ProviderLimits>,
    },
}

impl ProviderConfig {
    /// The provider's limits, when the file sets any.
    pub fn limits(&self) -> Option<&ProviderLimits> {
        match self {
            Self::Genai { limits }
            | Self::OpenaiCompatible { limits, .. }
            | Self::Scripted { limits, .. } => limits.as_ref(),
        }
    }
}

/// A model: a provider and the model's name there.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The provider id.
    pub provider: String,
    /// The upstream model name.
    pub model: String,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The answer's token limit.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Models to go on with, in order, when this one's provider keeps
    /// failing.
    #[serde(default)]
    pub fallbacks: Vec<String>,
}

/// An MCP server: a command to run (stdio) or a URL (streamable HTTP).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The command of a stdio server.
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The URL of a streamable-HTTP server.
    #[serde(default)]
    pub url: Option<String>,
    /// How long one of its tool calls may take (default 60 s); past it,
    /// the call is cancelled and its result says so.
    #[serde(default = "default_tool_timeout")]
    pub tool_timeout_seconds: u64,
    /// The largest result one of its tool calls may return, in bytes
    /// (default 1 MiB); a larger one is answered "result too large".
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
}

fn default_tool_timeout() -> u64 {
    60
}

fn default_max_result_bytes() -> usize {
    rein_mcp::McpOptions::default().max_result_bytes
}

/// Why genai cannot route `name` to a provider, if it cannot: a name
/// with no known prefix (`gpt-…`, `claude-…`, `gemini-…`, …) and no
/// namespace (`anthropic::…`) would silently go to a local Ollama server.
fn genai_route_unknown(name: &str) -> Option<String> {
    use rein::engine::genai::adapter::AdapterKind;
    let kind = AdapterKind::from_model(name).ok()?;
    if kind != AdapterKind::Ollama || name.starts_with("ollama::") {
        return None;
    }
    Some(format!(
        "the `genai` provider cannot tell which provider serves \"{name}\": the name has no known prefix (gpt-, o3-, claude-, gemini-, grok-, command-, …); check its spelling, or name the provider with a namespace (`anthropic::{name}`, `ollama::{name}` for a local Ollama)"
    ))
}

/// An agent: its spec, and the tools it lists by name.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The agent spec (the same shape as an agent spec file).
    pub spec: AgentSpec,
    /// Tools by name (MCP tools as `<server id>__<tool>`).
    pub tools: Vec<String>,
    /// Declared outputs, name → JSON type, for the built-in plugin
    /// `outputs` (Gemini CLI's goal mode; the run ends `goal` once all are
    /// emitted).
    pub outputs: BTreeMap<String, String>,
    /// The agent's auto-mode defaults (`run_mode`, `automation_policy`):
    /// what a submission that names no mode, on a thread with no stored
    /// default, runs with (docs/auto-mode.md).
    pub auto: Option<rein_service::AgentAuto>,
}

/// Where threads are kept.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    /// In this process's memory (lost when it exits).
    Memory,
    /// PostgreSQL, its URL in the named environment variable.
    Postgres {
        /// The environment variable holding the database URL.
        url_env: String,
    },
}

/// Where the context policy's offloaded tool results are kept:
/// `artifacts: memory`, `artifacts: { dir: PATH }` or `artifacts: postgres`.
#[derive(Debug, Clone, PartialEq)]
pub enum ArtifactsConfig {
    /// In this process's memory (the default with `store: memory`).
    Memory,
    /// One file per artifact under a directory (relative paths are taken
    /// from the directory `rein` runs in).
    Dir {
        /// The directory.
        path: PathBuf,
    },
    /// In the store's PostgreSQL database, readable from every process
    /// (the default with `store: postgres`; needs it).
    Postgres,
}

/// The HTTP server's settings (`server:`; every field optional).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// The largest accepted request body (default 1 MiB).
    pub body_limit_bytes: usize,
    /// How long a cancel waits for a run to release its thread, and
    /// shutdown for each run (default 5000).
    pub cancel_wait_ms: u64,
    /// How long finished runs and their events are kept.
    pub retention: Retention,
    /// With `store: postgres`: how long a process's ownership of a thread
    /// lasts without a heartbeat (default 10 s; renewed every third of it).
    pub lease_seconds: u64,
    /// Who may call: bearer tokens from an environment variable (none:
    /// every caller on the loopback interface may).
    pub auth: Option<AuthSettings>,
    /// Which browser origins may call (CORS); none by default.
    pub cors: CorsSettings,
    /// How many connections may be open and how long a client may take
    /// (`server.connections`).
    pub connections: ConnectionSettings,
    /// Set by `rein serve --insecure-public`: served on a public interface
    /// without auth, any `Host` accepted. Not a key of the file.
    #[serde(skip)]
    pub insecure_public: bool,
}

/// `server: { auth: { tokens_env: REIN_API_TOKENS } }`: the variable holds
/// comma-separated tokens, each optionally limited — `TOKEN` (everything),
/// `TOKEN:read` (only reads), `TOKEN:agents=a|b` (only those agents' runs
/// may be submitted).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// The environment variable with the tokens (never the tokens).
    pub tokens_env: String,
}

/// `server: { cors: { origins: ["https://app.example"] } }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsSettings {
    /// Origins whose pages may call the API (exactly, scheme and host and
    /// port), answered preflights included.
    pub origins: Vec<String>,
}

/// `server: { connections: { max: 1024, idle_timeout_ms: 60000,
/// header_timeout_ms: 10000, body_timeout_ms: 30000 } }`: the connection
/// cap and the time a client may take. None of them cuts a request in
/// flight (a long SSE stream, a `?wait=true` submission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionSettings {
    /// The most connections open at once (default 1024; lowered, with a
    /// log line, to leave a quarter of the process's file-descriptor limit
    /// for the rest). A new connection past it closes the connection idle
    /// the longest; when every one has a request in flight, the new one is
    /// closed.
    #[serde(deserialize_with = "positive")]
    pub max: u64,
    /// How long a connection may wait for the first byte of its next
    /// request, after it opened or after its last answer (default 60 s).
    #[serde(deserialize_with = "positive")]
    pub idle_timeout_ms: u64,
    /// How long a request's head (request line and headers) may take to
    /// arrive, from its first byte (default 10 s).
    #[serde(deserialize_with = "positive")]
    pub header_timeout_ms: u64,
    /// How long a request's body may take to arrive, from the end of its
    /// head (default 30 s); past it the request gets 408
    /// `request_timeout` and the connection closes.
    #[serde(deserialize_with = "positive")]
    pub body_timeout_ms: u64,
}

/// A number that must not be 0 (a cap of no connections, a timeout of no
/// time).
fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    std::num::NonZeroU64::deserialize(d).map(std::num::NonZeroU64::get)
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            max: 1024,
            idle_timeout_ms: 60_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            body_limit_bytes: 1024 * 1024,
            cancel_wait_ms: 5000,
            retention: Retention::default(),
            lease_seconds: 10,
            auth: None,
            cors: CorsSettings::default(),
            connections: ConnectionSettings::default(),
            insecure_public: false,
        }
    }
}

pub use rein_service::Retention;

impl ServerSettings {
    /// What the service needs of these settings.
    pub fn service(&self) -> rein_service::ServiceSettings {
        rein_service::ServiceSettings {
            cancel_wait_ms: self.cancel_wait_ms,
            retention: self.retention,
        }
    }
}

/// Why a deployment file was refused: every error found, each with its
/// position. Displayed one per line as `FILE:LINE:COLUMN: message`.
#[derive(Clone, PartialEq, Eq)]
pub struct DeploymentError {
    file: String,
    errors: Vec<ConfigError>,
}

impl DeploymentError {
    fn one(file: &str, error: ConfigError) -> Self {
        Self {
            file: file.to_owned(),
            errors: vec![error],
        }
    }

    /// The errors, in file order.
    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }

    /// Each error as `FILE:LINE:COLUMN: message` (or `FILE: message`
    /// without a position).
    pub fn lines(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|e| match (e.line(), e.column()) {
                (Some(line), Some(column)) => {
                    format!("{}:{line}:{column}: {}", self.file, e.message())
                }
                _ => format!("{}: {}", self.file, e.message()),
            })
            .collect()
    }
}

impl fmt::Display for DeploymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines().join("\n"))
    }
}

impl fmt::Debug for DeploymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for DeploymentError {}

impl Deployment {
    /// Loads and checks a deployment file.
    ///
    /// # Errors
    ///
    /// A [`DeploymentError`] with every problem found: the file cannot be
    /// read, invalid YAML, an unknown or mistyped key, an invalid agent or
    /// stop condition, or an unknown id (provider, model, plugin, MCP
    /// server, tool).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, DeploymentError> {
        Self::load_with(path, &Extras::default())
    }

    /// Loads and checks a deployment file whose agents may also list the
    /// Rust tools and plugins of `extras`.
    ///
    /// # Errors
    ///
    /// As for [`load`](Self::load).
    pub fn load_with(path: impl AsRef<Path>, extras: &Extras) -> Result<Self, DeploymentError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            DeploymentError::one(
                &file,
                ConfigError::new(format!("cannot read the file: {e}")),
            )
        })?;
        Self::from_yaml_named(&text, &file, extras)
    }

    /// Loads and checks a deployment from YAML text (errors name the file
    /// as `<text>`).
    ///
    /// # Errors
    ///
    /// As for [`load`](Self::load).
    pub fn from_yaml(text: &str) -> Result<Self, DeploymentError> {
        Self::from_yaml_named(text, "<text>", &Extras::default())
    }

    /// [`from_yaml`](Self::from_yaml) for a program that adds `extras`.
    ///
    /// # Errors
    ///
    /// As for [`load`](Self::load).
    pub fn from_yaml_with(text: &str, extras: &Extras) -> Result<Self, DeploymentError> {
        Self::from_yaml_named(text, "<text>", extras)
    }

    fn from_yaml_named(text: &str, file: &str, extras: &Extras) -> Result<Self, DeploymentError> {
        let text =
            &interpolate::interpolate(text, |name| std::env::var(name).ok()).map_err(|errors| {
                DeploymentError {
                    file: file.to_owned(),
                    errors,
                }
            })?;
        let first: serde_yaml::Value = serde_yaml::from_str(text)
            .map_err(|e| DeploymentError::one(file, ConfigError::from_yaml_error(&e)))?;
        let kinds: Vec<Vec<Option<String>>> = match first.get("agents") {
            Some(serde_yaml::Value::Sequence(agents)) => {
                agents.iter().map(stop_condition_kinds).collect()
            }
            _ => Vec::new(),
        };
        let deployment = DocumentSeed { kinds: &kinds }
            .deserialize(serde_yaml::Deserializer::from_str(text))
            .map_err(|e| DeploymentError::one(file, ConfigError::from_yaml_error(&e)))?;
        let errors = deployment.check_references(&Positions::of(text), extras);
        if errors.is_empty() {
            Ok(deployment)
        } else {
            Err(DeploymentError {
                file: file.to_owned(),
                errors,
            })
        }
    }

    /// Where artifacts are kept: `artifacts:` if the file sets it, else
    /// with the threads (PostgreSQL for `store: postgres`, memory for
    /// `store: memory`).
    pub fn artifact_store(&self) -> ArtifactsConfig {
        match (&self.artifacts, &self.store) {
            (Some(artifacts), _) => artifacts.clone(),
            (None, StoreConfig::Postgres { .. }) => ArtifactsConfig::Postgres,
            (None, StoreConfig::Memory) => ArtifactsConfig::Memory,
        }
    }

    /// The agent with this id.
    pub fn agent(&self, id: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.spec.id == id)
    }

    /// Every reference between sections, each unknown id an error at its
    /// value.
    fn check_references(&self, positions: &Positions, extras: &Extras) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut error = |path: &str, message: String| {
            errors.push(match positions.get(path) {
                Some((line, column)) => ConfigError::at(message, line, column),
                None => ConfigError::new(message),
            });
        };
        for (id, model) in &self.models {
            if let Some(ProviderConfig::Genai { .. }) = self.providers.get(&model.provider)
                && let Some(message) = genai_route_unknown(&model.model)
            {
                error(
                    &format!("models.{id}.model"),
                    format!("model \"{id}\": {message}"),
                );
            }
            for (i, fallback) in model.fallbacks.iter().enumerate() {
                if fallback == id || !self.models.contains_key(fallback) {
                    error(
                        &format!("models.{id}.fallbacks[{i}]"),
                        format!(
                            "model \"{id}\": fallback \"{fallback}\" is {}; known models: {}",
                            if fallback == id {
                                "the model itself"
                            } else {
                                "not a model of this file"
                            },
                            known(self.models.keys())
                        ),
                    );
                }
            }
            if !self.providers.contains_key(&model.provider) {
                error(
                    &format!("models.{id}.provider"),
                    format!(
                        "model \"{id}\": unknown provider \"{}\"; known providers: {}",
                        model.provider,
                        known(self.providers.keys())
                    ),
                );
            }
        }
        for (id, provider) in &self.providers {
            if let Some(Err(message)) = provider.limits().map(ProviderLimits::validate) {
                let key = message.split_whitespace().next().unwrap_or_default();
                error(
                    &format!("providers.{id}.limits.{key}"),
                    format!("provider \"{id}\": limits: {message}"),
                );
            }
        }
        for (id, server) in &self.mcp_servers {
            if server.command.is_some() == server.url.is_some() {
                error(
                    &format!("mcp_servers.{id}"),
                    format!(
                        "MCP server \"{id}\": give either `command` (stdio) or `url` (streamable HTTP)"
                    ),
                );
            }
        }
        if self.artifacts == Some(ArtifactsConfig::Postgres) && self.store == StoreConfig::Memory {
            error(
                "artifacts",
                "artifacts: postgres keeps artifacts in the store's database, but the store is `memory`; set `store: { postgres: { url_env: NAME } }`, or keep artifacts in `memory` or a `{ dir: PATH }`".to_owned(),
            );
        }
        if self.agents.is_empty() {
            error(
                "agents",
                "the file defines no agents; add one under `agents:`".to_owned(),
            );
        }
        for (i, agent) in self.agents.iter().enumerate() {
            let id = &agent.spec.id;
            if self.agents[..i].iter().any(|a| a.spec.id == *id) {
                error(
                    &format!("agents[{i}].id"),
                    format!("agent \"{id}\" is defined twice"),
                );
            }
            if agent.spec.model_id.is_empty() {
                error(
                    &format!("agents[{i}]"),
                    format!(
                        "agent \"{id}\" has no model_id; known models: {}",
                        known(self.models.keys())
                    ),
                );
            } else if !self.models.contains_key(&agent.spec.model_id) {
                error(
                    &format!("agents[{i}].model_id"),
                    format!(
                        "agent \"{id}\": unknown model \"{}\"; known models: {}",
                        agent.spec.model_id,
                        known(self.models.keys())
                    ),
                );
            }
            let lists_outputs = agent.spec.plugin_ids.iter().position(|p| p == "outputs");
            match (lists_outputs, agent.outputs.is_empty()) {
                (Some(j), true) => error(
                    &format!("agents[{i}].plugin_ids[{j}]"),
                    format!(
                        "agent \"{id}\": the plugin `outputs` needs the outputs it waits for: add `outputs: {{ <name>: <type>, … }}` to the agent"
                    ),
                ),
                (None, false) => error(
                    &format!("agents[{i}].outputs"),
                    format!(
                        "agent \"{id}\" declares outputs but does not list the plugin `outputs` in plugin_ids; add it, or drop `outputs`"
                    ),
                ),
                _ => {}
            }
            for (name, ty) in &agent.outputs {
                if let Err(e) = ty.parse::<rein::plugins::JsonType>() {
                    error(
                        &format!("agents[{i}].outputs.{name}"),
                        format!("agent \"{id}\", output \"{name}\": {e}"),
                    );
                }
            }
            for (j, condition) in agent.spec.stop_conditions.iter().enumerate() {
                use rein::contract::lifecycle::StopConditionSpec;
                let (StopConditionSpec::LlmLoopCheck { model_id, .. }
                | StopConditionSpec::TaskComplete { model_id, .. }) = condition
                else {
                    continue;
                };
                if !self.models.contains_key(model_id) {
                    error(
                        &format!("agents[{i}].stop_conditions[{j}].model_id"),
                        format!(
                            "agent \"{id}\": the `{}` stop condition names unknown model \"{model_id}\"; known models: {}",
                            condition.kind(),
                            known(self.models.keys())
                        ),
                    );
                }
            }
            for (j, plugin) in agent.spec.plugin_ids.iter().enumerate() {
                if !BUILT_IN_PLUGINS.contains(&plugin.as_str()) && !extras.plugins.contains(plugin)
                {
                    let mut plugins: Vec<&str> = BUILT_IN_PLUGINS.to_vec();
                    plugins.extend(extras.plugins.iter().map(String::as_str));
                    error(
                        &format!("agents[{i}].plugin_ids[{j}]"),
                        format!(
                            "agent \"{id}\": unknown plugin \"{plugin}\"; known plugins: {}",
                            plugins.join(", ")
                        ),
                    );
                }
            }
            let ids: Vec<&String> = self.agents.iter().map(|a| &a.spec.id).collect();
            for (j, entry) in agent.spec.subagents.iter().enumerate() {
                if !ids.contains(&&entry.agent) {
                    error(
                        &format!("agents[{i}].subagents[{j}].agent"),
                        format!(
                            "agent \"{id}\": sub-agent \"{}\" is not an agent of this file; known agents: {}",
                            entry.agent,
                            known(ids.iter().copied())
                        ),
                    );
                }
                for (name, ty) in &entry.outputs {
                    if let Err(e) = ty.parse::<rein::plugins::JsonType>() {
                        error(
                            &format!("agents[{i}].subagents[{j}].outputs.{name}"),
                            format!(
                                "agent \"{id}\": sub-agent \"{}\", output \"{name}\": {e}",
                                entry.agent
                            ),
                        );
                    }
                }
            }
            for (j, tool) in agent.tools.iter().enumerate() {
                let path = format!("agents[{i}].tools[{j}]");
                if extras.tools.contains(tool) {
                    continue;
                }
                match tool.split_once(MCP_TOOL_SEPARATOR) {
                    Some((server, name)) if !server.is_empty() && !name.is_empty() => {
                        if !self.mcp_servers.contains_key(server) {
                            error(
                                &path,
                                format!(
                                    "agent \"{id}\": tool \"{tool}\" names unknown MCP server \"{server}\"; known MCP servers: {}",
                                    known(self.mcp_servers.keys())
                                ),
                            );
                        }
                    }
                    _ => error(
                        &path,
                        format!(
                            "agent \"{id}\": unknown tool \"{tool}\"; tools listed here come from MCP servers, named \"<server id>{MCP_TOOL_SEPARATOR}<tool>\" (known MCP servers: {}){}; plugin tools come with plugin_ids",
                            known(self.mcp_servers.keys()),
                            if extras.tools.is_empty() {
                                "; Rust tools need a binary that adds them (rein_server::App)"
                                    .to_owned()
                            } else {
                                format!(
                                    "; this program's Rust tools: {}",
                                    known(extras.tools.iter())
                                )
                            }
                        ),
                    ),
                }
            }
        }
        for (i, agent) in self.agents.iter().enumerate() {
            // A Rust plugin's tools are known once the runtime is built,
            // which checks the rules then.
            if agent
                .spec
                .plugin_ids
                .iter()
                .any(|p| extras.plugins.contains(p))
            {
                continue;
            }
            for (path, message) in approval_errors(agent) {
                error(&format!("agents[{i}].{path}"), message);
            }
        }
        let specs: Vec<AgentSpec> = self.agents.iter().map(|a| a.spec.clone()).collect();
        if let Some(cycle) = rein::contract::spec::subagent_cycle(&specs) {
            // At the entry that closes the cycle.
            let from = &cycle[cycle.len() - 2];
            let to = &cycle[cycle.len() - 1];
            let path = self.agents.iter().enumerate().find_map(|(i, a)| {
                let j = a.spec.subagents.iter().position(|e| &e.agent == to)?;
                (&a.spec.id == from).then(|| format!("agents[{i}].subagents[{j}].agent"))
            });
            error(
                path.as_deref().unwrap_or("agents"),
                format!(
                    "sub-agents reach their own agent again: {}; an agent cannot be its own sub-agent, directly or through others",
                    cycle.join(" → ")
                ),
            );
        }
        errors
    }
}

/// The names of the tools `agent` has: its MCP tools, its plugins',
/// its sub-agents', and `read_artifact` with a context policy that
/// offloads.
pub fn agent_tool_names(agent: &AgentConfig) -> Vec<String> {
    let mut names: Vec<String> = agent.tools.clone();
    for plugin in &agent.spec.plugin_ids {
        match plugin.as_str() {
            "terminate" => names.push("terminate".to_owned()),
            "ask_user" => names.push(rein::approvals::ASK_USER.to_owned()),
            "outputs" => names.push("emit_output".to_owned()),
            "automation" => names.push("report_metrics".to_owned()),
            "plan" => names.push(rein::plugins::PLAN_TOOL.to_owned()),
            _ => {}
        }
    }
    names.extend(
        agent
            .spec
            .subagents
            .iter()
            .map(|s| s.tool_name().to_owned()),
    );
    if agent
        .spec
        .context
        .as_ref()
        .is_some_and(|c| c.uses_artifacts())
    {
        names.push(rein::context::READ_ARTIFACT.to_owned());
    }
    names
}

/// Each approval rule of `agent` that cannot be used: its path under the
/// agent (`approvals[1].tool`) and what is wrong.
fn approval_errors(agent: &AgentConfig) -> Vec<(String, String)> {
    let id = &agent.spec.id;
    let names = agent_tool_names(agent);
    let mut errors = Vec::new();
    for (j, rule) in agent.spec.approvals.iter().enumerate() {
        if let Err(e) = rule.check() {
            let field = ["when", "timeout_seconds", "tool"]
                .into_iter()
                .find(|f| e.message.contains(&format!("`{f}")))
                .unwrap_or("tool");
            let path = match (
                field,
                rule.when
                    .keys()
                    .find(|k| e.message.contains(&format!("`when.{k}`"))),
            ) {
                ("when", Some(arg)) => format!("approvals[{j}].when.{arg}"),
                (field, _) => format!("approvals[{j}].{field}"),
            };
            errors.push((path, format!("agent \"{id}\": {e}")));
            continue;
        }
        if !names.iter().any(|n| rule.matches_tool(n)) {
            let mut listed = names.clone();
            listed.sort();
            errors.push((
                format!("approvals[{j}].tool"),
                format!(
                    "agent \"{id}\": approval rule tool \"{}\" matches none of the agent's tools ({}); fix the name or the glob",
                    rule.tool,
                    if listed.is_empty() { "it has none".to_owned() } else { listed.join(", ") }
                ),
            ));
        }
    }
    errors
}

fn known<'a>(ids: impl Iterator<Item = &'a String>) -> String {
    let ids: Vec<&str> = ids.map(String::as_str).collect();
    if ids.is_empty() {
        "none".to_owned()
    } else {
        ids.join(", ")
    }
}

const DOCUMENT_KEYS: &[&str] = &[
    "providers",
    "models",
    "mcp_servers",
    "agents",
    "store",
    "artifacts",
    "server",
];

/// The keys of an agent item: the agent spec's, and `tools`.
const AGENT_ITEM_KEYS: &[&str] = &[
    "id",
    "model_id",
    "system_prompt",
    "max_rounds",
    "plugin_ids",
    "stop_conditions",
    "tool_choice",
    "context",
    "escalation",
    "tool_rules",
    "subagents",
    "approvals",
    "tools",
    "outputs",
    "run_mode",
    "automation_policy",
];

struct DocumentSeed<'k> {
    kinds: &'k [Vec<Option<String>>],
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = Deployment;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Deployment, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Deployment;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a deployment mapping (providers, models, mcp_servers, agents, store, artifacts, server)",
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Deployment, A::Error> {
        let mut deployment = Deployment {
            providers: BTreeMap::new(),
            models: BTreeMap::new(),
            mcp_servers: BTreeMap::new(),
            agents: Vec::new(),
            store: StoreConfig::Memory,
            artifacts: None,
            server: ServerSettings::default(),
        };
        let mut seen: Vec<&'static str> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed(DOCUMENT_KEYS))? {
            if seen.contains(&key) {
                return Err(de::Error::custom(format!("duplicate field `{key}`")));
            }
            match key {
                "providers" => deployment.providers = map.next_value()?,
                "models" => deployment.models = map.next_value()?,
                "mcp_servers" => deployment.mcp_servers = map.next_value()?,
                "agents" => deployment.agents = map.next_value_seed(AgentsSeed(self.kinds))?,
                "store" => deployment.store = map.next_value::<StoreSeed>()?.0,
                "artifacts" => {
                    deployment.artifacts = Some(map.next_value::<ArtifactsSeed>()?.0);
                }
                _ => deployment.server = map.next_value()?,
            }
            seen.push(key);
        }
        Ok(deployment)
    }
}

struct AgentsSeed<'k>(&'k [Vec<Option<String>>]);

impl<'de> DeserializeSeed<'de> for AgentsSeed<'_> {
    type Value = Vec<AgentConfig>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for AgentsSeed<'_> {
    type Value = Vec<AgentConfig>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of agents")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut agents = Vec::new();
        loop {
            let kinds = self.0.get(agents.len()).map_or(&[][..], Vec::as_slice);
            let seed = AgentSpecSeed::new(kinds, AGENT_ITEM_KEYS);
            let Some((spec, extra)) = seq.next_element_seed(seed)? else {
                return Ok(agents);
            };
            let mut tools = Vec::new();
            let mut outputs = BTreeMap::new();
            let mut run_mode = None;
            let mut policy = None;
            for (key, value) in extra {
                if key == "run_mode" {
                    let name: String = serde_yaml::from_value(value).map_err(|e| {
                        de::Error::custom(format!(
                            "agent \"{}\", field `run_mode`: {e}; expected auto or single",
                            spec.id
                        ))
                    })?;
                    run_mode = Some(rein_service::RunMode::parse("run_mode", &name).map_err(|_| {
                        de::Error::custom(format!(
                            "agent \"{}\", field `run_mode`: unknown mode \"{name}\"; expected auto or single",
                            spec.id
                        ))
                    })?);
                    continue;
                }
                if key == "automation_policy" {
                    let text = serde_json::to_string(&value).unwrap_or_default();
                    policy = Some(rein::auto::AutomationPolicy::from_json(&text).map_err(|e| {
                        de::Error::custom(format!(
                            "agent \"{}\", field `automation_policy`: {e}",
                            spec.id
                        ))
                    })?);
                    continue;
                }
                if key == "outputs" {
                    outputs = serde_yaml::from_value(value).map_err(|e| {
                        de::Error::custom(format!(
                            "agent \"{}\", field `outputs`: {e}; expected a mapping of output names to JSON types (string, number, integer, boolean, object, array)",
                            spec.id
                        ))
                    })?;
                    continue;
                }
                debug_assert_eq!(key, "tools");
                tools = serde_yaml::from_value(value).map_err(|e| {
                    de::Error::custom(format!(
                        "agent \"{}\", field `tools`: {e}; expected a list of tool names",
                        spec.id
                    ))
                })?;
            }
            // A policy alone makes auto mode the agent's default (`null`
            // alone sets nothing).
            let auto = match (run_mode, policy) {
                (None, None | Some(None)) => None,
                (mode, policy) => Some(rein_service::AgentAuto {
                    run_mode: mode.unwrap_or(rein_service::RunMode::Auto),
                    policy: policy.flatten(),
                }),
            };
            agents.push(AgentConfig {
                spec,
                tools,
                outputs,
                auto,
            });
        }
    }
}

/// `store: memory` or `store: { postgres: { url_env: NAME } }`.
struct StoreSeed(StoreConfig);

impl<'de> Deserialize<'de> for StoreSeed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Postgres {
            url_env: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Durable {
            postgres: Postgres,
        }
        struct StoreVisitor;
        impl<'de> Visitor<'de> for StoreVisitor {
            type Value = StoreSeed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`memory` or `{ postgres: { url_env: NAME } }`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StoreSeed, E> {
                match v {
                    "memory" => Ok(StoreSeed(StoreConfig::Memory)),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StoreSeed, A::Error> {
                let durable = Durable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(StoreSeed(StoreConfig::Postgres {
                    url_env: durable.postgres.url_env,
                }))
            }
        }
        d.deserialize_any(StoreVisitor)
    }
}

/// `artifacts: memory`, `artifacts: postgres` or `artifacts: { dir: PATH }`.
struct ArtifactsSeed(ArtifactsConfig);

impl<'de> Deserialize<'de> for ArtifactsSeed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Dir {
            dir: PathBuf,
        }
        struct ArtifactsVisitor;
        impl<'de> Visitor<'de> for ArtifactsVisitor {
            type Value = ArtifactsSeed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`memory`, `postgres` or `{ dir: PATH }`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ArtifactsSeed, E> {
                match v {
                    "memory" => Ok(ArtifactsSeed(ArtifactsConfig::Memory)),
                    "postgres" => Ok(ArtifactsSeed(ArtifactsConfig::Postgres)),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ArtifactsSeed, A::Error> {
                let dir = Dir::deserialize(de::value::MapAccessDeserializer::new(map))?;
                if dir.dir.as_os_str().is_empty() {
                    return Err(de::Error::custom(
                        "artifacts: `dir` is empty; give the directory to keep artifacts in",
                    ));
                }
                Ok(ArtifactsSeed(ArtifactsConfig::Dir { path: dir.dir }))
            }
        }
        d.deserialize_any(ArtifactsVisitor)
    }
}

#[cfg(test)]
mod tests;
