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
    if let Some(cycle) = find_cycle(specs) {
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

/// A path `a → b → … → a` in the sub-agent graph, if there is one.
pub(crate) fn find_cycle(specs: &[AgentSpec]) -> Option<Vec<String>> {
    let edges: HashMap<&str, Vec<&str>> = specs
        .iter()
        .map(|s| {
            let to = s.subagents.iter().map(|e| e.agent.as_str()).collect();
            (s.id.as_str(), to)
        })
        .collect();
    // 0: unseen, 1: on the current path, 2: done.
    let mut mark: HashMap<&str, u8> = HashMap::new();
    let mut path: Vec<&str> = Vec::new();
    fn visit<'a>(
        at: &'a str,
        edges: &HashMap<&'a str, Vec<&'a str>>,
        mark: &mut HashMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        mark.insert(at, 1);
        path.push(at);
        for &next in edges.get(at).map(Vec::as_slice).unwrap_or_default() {
            match mark.get(next).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| *p == next).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        path[from..].iter().map(|s| (*s).to_owned()).collect();
                    cycle.push(next.to_owned());
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(next, edges, mark, path) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        mark.insert(at, 2);
        None
    }
    let mut ids: Vec<&str> = edges.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        if mark.get(id).copied().unwrap_or(0) == 0
            && let Some(cycle) = visit(id, &edges, &mut mark, &mut path)
        {
            return Some(cycle);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_through_several_agents_is_named_from_start_to_start() {
        let specs = vec![
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            AgentSpec::new("b").with_subagent(SubagentSpec::new("c")),
            AgentSpec::new("c").with_subagent(SubagentSpec::new("a")),
            AgentSpec::new("d").with_subagent(SubagentSpec::new("c")),
        ];
        assert_eq!(
            find_cycle(&specs).unwrap(),
            ["a", "b", "c", "a"].map(String::from)
        );
        let tree = vec![
            AgentSpec::new("a").with_subagent(SubagentSpec::new("b")),
            AgentSpec::new("b").with_subagent(SubagentSpec::new("c")),
            AgentSpec::new("c"),
            AgentSpec::new("d").with_subagent(SubagentSpec::new("c")),
        ];
        assert_eq!(find_cycle(&tree), None);
        let own = vec![AgentSpec::new("a").with_subagent(SubagentSpec::new("a"))];
        assert_eq!(find_cycle(&own).unwrap(), ["a", "a"].map(String::from));
    }
}
