//! From a [`Deployment`] to a running [`AgentRuntime`]: executors for the
//! providers, model specs, the built-in plugins the agents list.

use std::sync::Arc;
use std::time::Duration;

use rein::engine::{GenaiExecutor, ScriptedExecutor};
use rein::plugins::TerminatePlugin;
use rein::{AgentRuntime, AgentRuntimeBuilder, BuildError, ModelSpec};

use crate::deployment::{Deployment, ProviderConfig};

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
    /// An agent lists MCP tools, which this build cannot start.
    #[error(
        "agent \"{agent}\" lists the MCP tool \"{tool}\", but MCP servers are not supported by this build yet"
    )]
    McpUnsupported {
        /// The agent id.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// The runtime's own checks failed.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// Builds the runtime a deployment describes.
///
/// # Errors
///
/// An [`AssembleError`]: a missing API key variable, MCP tools, or a
/// failed runtime build.
pub fn runtime(deployment: &Deployment) -> Result<AgentRuntime, AssembleError> {
    builder(deployment)?.build().map_err(AssembleError::from)
}

/// The builder for a deployment's runtime, for callers that add to it.
///
/// # Errors
///
/// As for [`runtime`], except the final build.
pub fn builder(deployment: &Deployment) -> Result<AgentRuntimeBuilder, AssembleError> {
    let mut builder = AgentRuntimeBuilder::new()
        .with_cancel_wait_timeout(Duration::from_millis(deployment.server.cancel_wait_ms));
    for (id, provider) in &deployment.providers {
        builder = match provider {
            ProviderConfig::Genai {} => builder.with_provider(id, Arc::new(GenaiExecutor::new())),
            ProviderConfig::OpenaiCompatible {
                base_url,
                api_key_env,
            } => {
                let key =
                    match api_key_env {
                        Some(variable) => Some(std::env::var(variable).map_err(|_| {
                            AssembleError::MissingKey {
                                provider: id.clone(),
                                variable: variable.clone(),
                            }
                        })?),
                        None => None,
                    };
                builder.with_provider(
                    id,
                    Arc::new(GenaiExecutor::openai_compatible(base_url.clone(), key)),
                )
            }
            ProviderConfig::Scripted {
                responses,
                delay_ms,
                chunk_delay_ms,
            } => {
                let script = responses
                    .iter()
                    .map(|r| r.to_response(*delay_ms, *chunk_delay_ms))
                    .collect();
                builder.with_provider(id, Arc::new(ScriptedExecutor::new(script).repeat_last()))
            }
        };
    }
    for (id, model) in &deployment.models {
        let mut spec = ModelSpec::new(id, &model.provider, &model.model);
        if let Some(t) = model.temperature {
            spec = spec.with_temperature(t);
        }
        if let Some(max) = model.max_output_tokens {
            spec = spec.with_max_output_tokens(max);
        }
        builder = builder.with_model(spec);
    }
    let mut terminate = false;
    for agent in &deployment.agents {
        if let Some(tool) = agent.tools.first() {
            return Err(AssembleError::McpUnsupported {
                agent: agent.spec.id.clone(),
                tool: tool.clone(),
            });
        }
        terminate |= agent.spec.plugin_ids.iter().any(|p| p == "terminate");
        builder = builder.with_agent_spec(agent.spec.clone());
    }
    if terminate {
        builder = builder.with_plugin("terminate", Arc::new(TerminatePlugin::new()));
    }
    Ok(builder)
}
