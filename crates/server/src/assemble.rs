//! From a [`Deployment`] to a running [`AgentRuntime`]: executors for the
//! providers, model specs, the built-in plugins the agents list, and the
//! MCP servers whose tools they list (started here, each agent getting
//! exactly the MCP tools it names).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rein::engine::{GenaiExecutor, ScriptedExecutor};
use rein::plugin::{Plugin, PluginRegistrar};
use rein::plugins::TerminatePlugin;
use rein::tools::Tool;
use rein::{AgentRuntime, AgentRuntimeBuilder, BuildError, ModelSpec};
use rein_mcp::{McpError, McpOptions, McpServer, McpTransport};

use crate::deployment::{
    ArtifactsConfig, Deployment, MCP_TOOL_SEPARATOR, McpServerConfig, ProviderConfig, StoreConfig,
};
use crate::service::Service;
use rein::context::{ArtifactStore, DirArtifactStore};
use rein::thread_store::ThreadStore;
use rein_postgres::{Database, PgArtifactStore};

/// Why a checked deployment could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    /// A provider's `api_key_env` names a variable that is not set.
    #[error(
        "provider \"{provider}\": the environment variable {variable} (its api_key_env) is not set"
    )]
    MissingKey {
        /// The provider id.
        provider: String,
        /// The variable.
        variable: String,
    },
    /// `store: postgres` names a variable that is not set.
    #[error("store: postgres: the environment variable {variable} (its url_env) is not set")]
    MissingDatabaseUrl {
        /// The variable.
        variable: String,
    },
    /// The database could not be reached or migrated.
    #[error("store: postgres: {message}")]
    Database {
        /// What went wrong (the URL is not shown).
        message: String,
    },
    /// An MCP server could not be started, or lacks a listed tool.
    #[error("{0}")]
    Mcp(#[from] McpError),
    /// The runtime's own checks failed.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// A started deployment: its runtime and the MCP servers its agents use.
#[derive(Debug)]
pub struct Assembled {
    /// The runtime.
    pub runtime: AgentRuntime,
    /// The MCP servers, by id.
    pub mcp_servers: BTreeMap<String, Arc<McpServer>>,
    /// With `store: postgres`: this process's handle on the database
    /// (leases, the fenced store, the runs every process shares).
    pub database: Option<Database>,
    /// The agents' auto-mode defaults, by agent id.
    pub agent_autos: Vec<(String, rein_service::AgentAuto)>,
}

impl Assembled {
    /// The service over this deployment: distributed with `store:
    /// postgres`, in-process otherwise. Must be called within a tokio
    /// runtime.
    pub fn service(&self, settings: &crate::deployment::ServerSettings) -> Service {
        let service = match &self.database {
            Some(database) => {
                Service::distributed(self.runtime.clone(), settings.service(), database.clone())
            }
            None => Service::new(self.runtime.clone(), settings.service()),
        };
        for (agent_id, defaults) in &self.agent_autos {
            service.set_agent_auto(agent_id, defaults.clone());
        }
        service
    }
}

impl Assembled {
    /// Shuts the MCP servers down (each gets the cancel-wait bound, then
    /// its process group is killed).
    pub async fn shutdown_mcp(&self) {
        for server in self.mcp_servers.values() {
            server.shutdown().await;
        }
    }
}

/// Starts what a deployment describes: the MCP servers its agents use
/// (in parallel), then the runtime.
///
/// # Errors
///
/// An [`AssembleError`]: a missing API key variable, an MCP server that
/// does not start or lacks a listed tool (naming the server and tool, and
/// listing its tools), or a failed runtime build. Servers already started
/// are shut down first.
pub async fn start(deployment: &Deployment) -> Result<Assembled, AssembleError> {
    start_with(deployment, &crate::App::new()).await
}

/// [`start`], the agents also getting the Rust tools and plugins of `app`
/// they list (a tool by its name in `tools`, a plugin by its id in
/// `plugin_ids`).
///
/// # Errors
///
/// As for [`start`].
pub async fn start_with(
    deployment: &Deployment,
    app: &crate::App,
) -> Result<Assembled, AssembleError> {
    let store = durable_store(deployment).await?;
    let mcp_servers = start_mcp(deployment).await?;
    let artifacts = artifact_store(deployment, store.as_ref());
    let shared = store.as_ref().map(|d| Shared {
        threads: Arc::new(d.store().clone()),
        limits: d.limits().clone(),
    });
    let outcome = build(deployment, app, &mcp_servers, shared, artifacts);
    match outcome {
        Ok(runtime) => Ok(Assembled {
            runtime,
            mcp_servers,
            database: store,
            agent_autos: deployment
                .agents
                .iter()
                .filter_map(|a| Some((a.spec.id.clone(), a.auto.clone()?)))
                .collect(),
        }),
        Err(e) => {
            for server in mcp_servers.values() {
                server.shutdown().await;
            }
            Err(e)
        }
    }
}

/// The artifact store the deployment chooses (`artifacts:`, else with the
/// threads); `None` keeps the runtime's in-memory default.
fn artifact_store(
    deployment: &Deployment,
    durable: Option<&Database>,
) -> Option<Arc<dyn ArtifactStore>> {
    match (deployment.artifact_store(), durable) {
        (ArtifactsConfig::Memory, _) => None,
        (ArtifactsConfig::Dir { path }, _) => Some(Arc::new(DirArtifactStore::new(path))),
        (ArtifactsConfig::Postgres, Some(durable)) => {
            Some(Arc::new(PgArtifactStore::new(durable.pool().clone())))
        }
        // The file was checked: `artifacts: postgres` needs `store: postgres`.
        (ArtifactsConfig::Postgres, None) => None,
    }
}

/// With `store: postgres`: this process's handle on the database.
async fn durable_store(deployment: &Deployment) -> Result<Option<Database>, AssembleError> {
    let StoreConfig::Postgres { url_env } = &deployment.store else {
        return Ok(None);
    };
    let url = std::env::var(url_env).map_err(|_| AssembleError::MissingDatabaseUrl {
        variable: url_env.clone(),
    })?;
    let pool = rein_postgres::connect(&url)
        .await
        .map_err(|e| AssembleError::Database {
            message: e.to_string(),
        })?;
    let owner = format!(
        "{}-{}-{}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "rein".to_owned()),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let lease = Duration::from_secs(deployment.server.lease_seconds.max(1));
    Ok(Some(Database::new(pool, owner, lease)))
}

/// What the runtimes of a cluster share through its database.
struct Shared {
    threads: Arc<dyn ThreadStore>,
    limits: Arc<rein_postgres::PgLimitLedger>,
}

fn build(
    deployment: &Deployment,
    app: &crate::App,
    mcp_servers: &BTreeMap<String, Arc<McpServer>>,
    shared: Option<Shared>,
    artifacts: Option<Arc<dyn ArtifactStore>>,
) -> Result<AgentRuntime, AssembleError> {
    let mut agent_tools = BTreeMap::new();
    for agent in &deployment.agents {
        let mut tools = Vec::new();
        for name in &agent.tools {
            if let Some(tool) = app.tool(name) {
                tools.push(tool);
                continue;
            }
            // The file was checked: every other listed tool names a known
            // server.
            let Some((server_id, tool)) = name.split_once(MCP_TOOL_SEPARATOR) else {
                continue;
            };
            if let Some(server) = mcp_servers.get(server_id) {
                tools.push(server.tool(tool)?);
            }
        }
        agent_tools.insert(agent.spec.id.clone(), tools);
    }
    let mut builder = builder_with(deployment, agent_tools)?;
    for (id, plugin) in app.plugins() {
        if deployment
            .agents
            .iter()
            .any(|a| a.spec.plugin_ids.iter().any(|p| p == id))
        {
            builder = builder.with_plugin(id, plugin.clone());
        }
    }
    if let Some(shared) = shared {
        builder = builder
            .with_thread_store(shared.threads)
            .with_limit_ledger(shared.limits);
    }
    if let Some(artifacts) = artifacts {
        builder = builder.with_artifact_store(artifacts);
    }
    builder.build().map_err(AssembleError::from)
}

/// The MCP servers that some agent uses, started in parallel.
async fn start_mcp(
    deployment: &Deployment,
) -> Result<BTreeMap<String, Arc<McpServer>>, AssembleError> {
    let used: Vec<(&String, &McpServerConfig)> = deployment
        .mcp_servers
        .iter()
        .filter(|(id, _)| {
            deployment.agents.iter().any(|a| {
                a.tools.iter().any(|t| {
                    t.split_once(MCP_TOOL_SEPARATOR)
                        .is_some_and(|(s, _)| s == *id)
                })
            })
        })
        .collect();
    let starts = used.iter().map(|(id, config)| {
        let options = McpOptions {
            cancel_wait: Duration::from_millis(deployment.server.cancel_wait_ms),
            tool_timeout: Duration::from_secs(config.tool_timeout_seconds),
            max_result_bytes: config.max_result_bytes,
            ..McpOptions::default()
        };
        McpServer::start((*id).clone(), transport(config), options)
    });
    let mut started = BTreeMap::new();
    let mut failure = None;
    for outcome in futures::future::join_all(starts).await {
        match outcome {
            Ok(server) => {
                started.insert(server.id().to_owned(), server);
            }
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        for server in started.values() {
            server.shutdown().await;
        }
        return Err(e.into());
    }
    Ok(started)
}

fn transport(config: &McpServerConfig) -> McpTransport {
    match (&config.command, &config.url) {
        (Some(command), _) => McpTransport::Stdio {
            command: command.clone(),
            args: config.args.clone(),
            env: config.env.clone(),
            cwd: config.cwd.clone(),
        },
        (None, url) => McpTransport::Http {
            url: url.clone().unwrap_or_default(),
        },
    }
}

/// An agent's listed tools (MCP and Rust), registered for that agent only.
struct AgentTools(Vec<Arc<dyn Tool>>);

impl Plugin for AgentTools {
    fn register(
        &self,
        registrar: &mut PluginRegistrar,
    ) -> Result<(), rein::contract::state::StateError> {
        for tool in &self.0 {
            registrar.register_tool(tool.descriptor().name, tool.clone());
        }
        Ok(())
    }
}

/// The builder for a deployment's runtime without MCP tools (its agents'
/// `tools` lists are ignored), for callers that add their own agents and
/// tools — e.g. benchmarks.
///
/// # Errors
///
/// [`AssembleError::MissingKey`].
pub fn builder(deployment: &Deployment) -> Result<AgentRuntimeBuilder, AssembleError> {
    builder_with(deployment, BTreeMap::new())
}

/// The executor of provider `id`.
///
/// # Errors
///
/// [`AssembleError::MissingKey`] when its `api_key_env` is not set.
pub fn executor(
    id: &str,
    provider: &ProviderConfig,
) -> Result<Arc<dyn rein::contract::inference::LlmExecutor>, AssembleError> {
    Ok(match provider {
        ProviderConfig::Genai { .. } => Arc::new(GenaiExecutor::new()),
        ProviderConfig::OpenaiCompatible {
            base_url,
            api_key_env,
            ..
        } => {
            let key = match api_key_env {
                Some(variable) => {
                    Some(
                        std::env::var(variable).map_err(|_| AssembleError::MissingKey {
                            provider: id.to_owned(),
                            variable: variable.clone(),
                        })?,
                    )
                }
                None => None,
            };
            Arc::new(GenaiExecutor::openai_compatible(base_url.clone(), key))
        }
        ProviderConfig::Scripted {
            responses,
            delay_ms,
            chunk_delay_ms,
            ..
        } => {
            let script = responses
                .iter()
                .map(|r| r.to_response(*delay_ms, *chunk_delay_ms))
                .collect();
            Arc::new(ScriptedExecutor::new(script).repeat_last())
        }
    })
}

/// The builder, each agent getting the tools in `agent_tools` (the MCP
/// and Rust tools it lists) through a plugin of its own, `tools:<agent id>`.
fn builder_with(
    deployment: &Deployment,
    mut agent_tools: BTreeMap<String, Vec<Arc<dyn Tool>>>,
) -> Result<AgentRuntimeBuilder, AssembleError> {
    let mut builder = AgentRuntimeBuilder::new()
        .with_cancel_wait_timeout(Duration::from_millis(deployment.server.cancel_wait_ms));
    for (id, provider) in &deployment.providers {
        builder = builder.with_provider(id, executor(id, provider)?);
        if let Some(limits) = provider.limits() {
            builder = builder.with_provider_limits(id, *limits);
        }
    }
    for (id, model) in &deployment.models {
        let mut spec = ModelSpec::new(id, &model.provider, &model.model);
        if let Some(t) = model.temperature {
            spec = spec.with_temperature(t);
        }
        if let Some(max) = model.max_output_tokens {
            spec = spec.with_max_output_tokens(max);
        }
        spec = spec.with_fallbacks(model.fallbacks.iter().cloned());
        builder = builder.with_model(spec);
    }
    let (mut terminate, mut ask_user, mut automation, mut plan) = (false, false, false, false);
    for agent in &deployment.agents {
        plan |= agent.spec.plugin_ids.iter().any(|p| p == "plan");
        terminate |= agent.spec.plugin_ids.iter().any(|p| p == "terminate");
        ask_user |= agent.spec.plugin_ids.iter().any(|p| p == "ask_user");
        automation |= agent.spec.plugin_ids.iter().any(|p| p == "automation");
        let mut spec = agent.spec.clone();
        // Each agent's declared outputs are a plugin of its own.
        if let Some(listed) = spec.plugin_ids.iter_mut().find(|p| *p == "outputs") {
            let plugin_id = format!("outputs:{}", spec.id);
            builder = builder.with_plugin(
                &plugin_id,
                Arc::new(rein::plugins::OutputsPlugin::new(
                    agent.outputs.iter().map(|(n, t)| (n.clone(), t.clone())),
                )),
            );
            *listed = plugin_id;
        }
        if let Some(tools) = agent_tools.remove(&spec.id).filter(|t| !t.is_empty()) {
            let plugin_id = format!("tools:{}", spec.id);
            builder = builder.with_plugin(&plugin_id, Arc::new(AgentTools(tools)));
            spec = spec.with_plugin_id(plugin_id);
        }
        builder = builder.with_agent_spec(spec);
    }
    if terminate {
        builder = builder.with_plugin("terminate", Arc::new(TerminatePlugin::new()));
    }
    if ask_user {
        builder = builder.with_plugin("ask_user", Arc::new(rein::approvals::AskUserPlugin::new()));
    }
    if automation {
        builder = builder.with_plugin("automation", Arc::new(rein::auto::AutomationPlugin::new()));
    }
    if plan {
        builder = builder.with_plugin("plan", Arc::new(rein::plugins::PlanPlugin::new()));
    }
    Ok(builder)
}
