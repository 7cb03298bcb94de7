//! `build()` rejects every inconsistent registration with an error that
//! names the offending id.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;

use common::*;
use rein::contract::state::StateError;
use rein::policies::{MaxRoundsPlugin, StopConditionPlugin};
use rein::prelude::*;

fn model() -> ScriptedExecutor {
    ScriptedExecutor::new(vec![])
}

fn err(builder: AgentRuntimeBuilder) -> BuildError {
    builder.build().expect_err("build must fail")
}

#[test]
fn an_unknown_plugin_id_names_the_id_the_agent_and_the_registered_ids() {
    let e = err(builder_with(model(), spec().with_plugin_id("max_roundz"))
        .with_plugin("stop-condition", Arc::new(StopConditionPlugin::new(vec![])))
        .with_plugin("audit", Arc::new(StopConditionPlugin::new(vec![]))));
    assert_eq!(
        e.to_string(),
        "unknown plugin id \"max_roundz\" in agent \"agent\"; registered ids: audit, stop-condition"
    );
}

#[test]
fn a_duplicate_plugin_registration_is_rejected() {
    let e = err(builder_with(model(), spec())
        .with_plugin("p", Arc::new(MaxRoundsPlugin::new(1)))
        .with_plugin("p", Arc::new(MaxRoundsPlugin::new(2))));
    assert_eq!(
        e,
        BuildError::DuplicatePlugin {
            plugin_id: "p".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "plugin id \"p\" is registered twice; plugin ids must be unique"
    );
}

#[test]
fn a_plugin_listed_twice_by_one_agent_is_rejected() {
    let e = err(
        builder_with(model(), spec().with_plugin_id("p").with_plugin_id("p"))
            .with_plugin("p", Arc::new(MaxRoundsPlugin::new(1))),
    );
    assert_eq!(
        e.to_string(),
        "agent \"agent\" lists plugin id \"p\" twice in plugin_ids"
    );
}

#[test]
fn two_listed_plugins_owning_one_state_key_fail_with_key_already_registered() {
    let e = err(builder_with(
        model(),
        spec()
            .with_plugin_id("stop-condition")
            .with_plugin_id("stop-condition:max-rounds"),
    )
    .with_plugin("stop-condition", Arc::new(StopConditionPlugin::new(vec![])))
    .with_plugin(
        "stop-condition:max-rounds",
        Arc::new(MaxRoundsPlugin::new(10)),
    ));
    match &e {
        BuildError::PluginState {
            agent_id,
            plugin_id,
            source,
        } => {
            assert_eq!(agent_id, "agent");
            assert_eq!(plugin_id, "stop-condition:max-rounds");
            assert_eq!(
                source,
                &StateError::KeyAlreadyRegistered {
                    key: "stop_condition.stats".into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "plugin \"stop-condition:max-rounds\" could not be registered for agent \"agent\": state key \"stop_condition.stats\" is already registered; only one plugin of an agent may own it"
    );
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn plugins_registered_but_not_listed_do_not_conflict() {
    builder_with(model(), spec().with_plugin_id("stop-condition"))
        .with_plugin("stop-condition", Arc::new(StopConditionPlugin::new(vec![])))
        .with_plugin(
            "stop-condition:max-rounds",
            Arc::new(MaxRoundsPlugin::new(10)),
        )
        .build()
        .unwrap();
}

#[test]
fn an_agent_without_a_model_id_is_rejected() {
    let e = err(AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("triage"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model())));
    assert_eq!(
        e.to_string(),
        "agent \"triage\" has no model_id; set one of the registered model ids: m"
    );
}

#[test]
fn an_unknown_model_is_rejected_naming_the_known_ones() {
    let e = err(AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("triage").with_model_id("gpt"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model())));
    assert_eq!(
        e.to_string(),
        "unknown model id \"gpt\" in agent \"triage\"; registered model ids: m"
    );
}

#[test]
fn an_unknown_provider_is_rejected_naming_the_known_ones() {
    let e = err(AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("triage").with_model_id("m"))
        .with_model(ModelSpec::new("m", "anthropic", "claude"))
        .with_provider("openai", Arc::new(model())));
    assert_eq!(
        e.to_string(),
        "unknown provider id \"anthropic\" in model \"m\"; registered provider ids: openai"
    );
}

#[test]
fn duplicate_agents_models_and_providers_are_rejected() {
    let e =
        err(builder_with(model(), spec())
            .with_agent_spec(AgentSpec::new("agent").with_model_id("m")));
    assert_eq!(
        e,
        BuildError::DuplicateAgent {
            agent_id: "agent".into()
        }
    );
    let e = err(builder_with(model(), spec()).with_model(ModelSpec::new("m", "p", "y")));
    assert_eq!(
        e,
        BuildError::DuplicateModel {
            model_id: "m".into()
        }
    );
    let e = err(builder_with(model(), spec()).with_provider("p", Arc::new(model())));
    assert_eq!(
        e,
        BuildError::DuplicateProvider {
            provider_id: "p".into()
        }
    );
}

#[test]
fn a_tool_registered_under_another_name_than_its_descriptor_is_rejected() {
    let e = err(builder_with(model(), spec()).with_tool("search", Arc::new(Echo("echo"))));
    assert_eq!(
        e.to_string(),
        "tool registered as \"search\" describes itself as \"echo\"; register it under its descriptor's name"
    );
}

#[test]
fn one_tool_name_from_two_sources_is_rejected_naming_both() {
    struct ToolPlugin;
    impl Plugin for ToolPlugin {
        fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
            r.register_tool("echo", Arc::new(Echo("echo")));
            Ok(())
        }
    }
    let e = err(builder_with(model(), spec().with_plugin_id("tools"))
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_plugin("tools", Arc::new(ToolPlugin)));
    assert_eq!(
        e.to_string(),
        "tool \"echo\" is provided by both with_tool and plugin \"tools\"; tool names must be unique per agent"
    );
    let e = err(builder_with(model(), spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_tool("echo", Arc::new(Echo("echo"))));
    assert!(matches!(e, BuildError::DuplicateTool { .. }), "{e:?}");
}
