//! Checking a runtime's sub-agent entries at build time: each names a
//! known agent with known output types, and no agent reaches itself
//! through its sub-agents. An entry with declared outputs runs a hidden
//! variant of its agent, with an outputs plugin of its own.

use std::collections::HashMap;
use std::sync::Arc;

use rein_runtime_contract::spec::{AgentSpec, SubagentSpec};

use crate::BuildError;
/// The agents a builder must add for sub-agent entries with declared
/// outputs (each a hidden variant of the entry's agent with its own
/// outputs plugin), after checking every entry: its agent exists, its
/// output types are known, and no agent reaches itself.
pub(crate) struct Plan {
    /// Hidden variant specs, with the plugin each lists.
    pub(crate) variants: Vec<(AgentSpec, String, Arc<dyn crate::plugin::Plugin>)>,
}

/// The id of the hidden variant of an entry's agent.
pub(crate) fn variant_id(parent: &str, entry: &SubagentSpec) -> String {
    format!("{}@{parent}.{}", entry.agent, entry.tool_name())
}

/// Checks the sub-agent entries of `specs` and plans their variants.
pub(crate) fn plan(specs: &[AgentSpec]) -> Result<Plan, BuildError> {
    let by_id: HashMap<&str, &AgentSpec> = specs.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut variants = Vec::new();
    for spec in specs {
        for entry in &spec.subagents {
            let invalid = |message: String| BuildError::InvalidSubagent {
                agent_id: spec.id.clone(),
                message,
            };
            let Some(child) = by_id.get(entry.agent.as_str()) else {
                let mut known: Vec<&str> = by_id.keys().copied().collect();
                known.sort_unstable();
                return Err(invalid(format!(
                    "entry \"{}\" names unknown agent \"{}\"; known agents: {}",
                    entry.tool_name(),
                    entry.agent,
                    known.join(", ")
                )));
            };
            if entry.outputs.is_empty() {
                continue;
            }
            for (name, ty) in &entry.outputs {
                ty.parse::<crate::plugins::JsonType>().map_err(|e| {
                    invalid(format!(
                        "entry \"{}\": output \"{name}\": {e}",
                        entry.tool_name()
                    ))
                })?;
            }
            let id = variant_id(&spec.id, entry);
            let plugin_id = format!("rein.outputs:{id}");
            let mut variant = (*child).clone();
            variant.id = id;
            variant.plugin_ids.push(plugin_id.clone());
            let plugin: Arc<dyn crate::plugin::Plugin> =
                Arc::new(crate::plugins::OutputsPlugin::new(entry.outputs.clone()));
            variants.push((variant, plugin_id, plugin));
        }
    }
    if let Some(cycle) = rein_runtime_contract::spec::subagent_cycle(specs) {
        return Err(BuildError::InvalidSubagent {
            agent_id: cycle[0].clone(),
            message: format!(
                "sub-agents reach their own agent again: {}; an agent cannot be its own sub-agent, directly or through others",
                cycle.join(" → ")
            ),
        });
    }
    Ok(Plan { variants })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::spec::subagent_cycle;

    #[test]
    fn a_cycle_through_several_agents_is_named_from_start_to_start() {
        let specs = vec![
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            AgentSpec::new("b").with_subagent(SubagentSpec::new("c")),
            AgentSpec::new("c").with_subagent(SubagentSpec::new("a")),
            AgentSpec::new("d").with_subagent(SubagentSpec::new("c")),
        ];
        assert_eq!(
            subagent_cycle(&specs).unwrap(),
            ["a", "b", "c", "a"].map(String::from)
        );
        let tree = vec![
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            AgentSpec::new("b").with_subagent(SubagentSpec::new("c")),
            AgentSpec::new("c"),
            AgentSpec::new("d").with_subagent(SubagentSpec::new("c")),
        ];
        assert_eq!(subagent_cycle(&tree), None);
        let own = vec![AgentSpec::new("a").with_subagent(SubagentSpec::new("a"))];
        assert_eq!(subagent_cycle(&own).unwrap(), ["a", "a"].map(String::from));
    }
}
