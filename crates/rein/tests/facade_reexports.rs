//! The facade is enough on its own: a tool is written with
//! `#[rein::async_trait]` (or `#[rein::async_trait::async_trait]`) and
//! `rein::serde_json`, a typed tool with `rein::schemars` and `rein::serde`,
//! the prelude has the executors, the typed-tool functions and the YAML loaders,
//! and it holds nothing named `Result`, `Error`, `spec` or `request`.
//!
//! This file names no crate but `rein` (and tokio for `#[tokio::test]`).

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use rein::prelude::*;

/// Stands in for every name the prelude must not hold: if the prelude had
/// one, the name used below would be ambiguous between the two globs (or
/// be the prelude's item, not this one) and this file would not compile.
mod not_in_the_prelude {
    pub(crate) struct Result;
    pub(crate) struct Error;
    pub(crate) mod spec {
        pub(crate) struct Marker;
    }
    pub(crate) mod request {
        pub(crate) struct Marker;
    }
}
use not_in_the_prelude::*;

#[test]
fn the_prelude_holds_nothing_named_result_error_spec_or_request() {
    let _: (Result, Error, spec::Marker, request::Marker) =
        (Result, Error, spec::Marker, request::Marker);
}

/// Written through the re-exported attribute.
struct Greet;

#[rein::async_trait]
impl Tool for Greet {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("greet", "greets someone").with_parameters(rein::serde_json::json!({
            "type": "object",
            "properties": { "name": { "type": "string" } }
        }))
    }

    async fn execute(
        &self,
        args: rein::serde_json::Value,
        _ctx: &ToolContext,
    ) -> std::result::Result<ToolOutput, ToolError> {
        let name = args["name"].as_str().unwrap_or("nobody");
        Ok(ToolOutput::json(
            rein::serde_json::json!({ "greeting": format!("hello, {name}") }),
        ))
    }
}

/// Written through the re-exported crate.
struct Shout;

#[rein::async_trait::async_trait]
impl Tool for Shout {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("shout", "shouts")
    }

    async fn execute(
        &self,
        _args: rein::serde_json::Value,
        _ctx: &ToolContext,
    ) -> std::result::Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("HEY"))
    }
}

#[tokio::test]
async fn a_tool_written_only_with_rein_paths_runs_from_a_spec_loaded_through_the_prelude() {
    let mut spec =
        load_agent_spec_yaml("id: greeter\nmodel_id: scripted\nmax_rounds: 4\n").unwrap();
    spec.stop_conditions = load_stop_conditions_yaml("- { type: max_rounds, rounds: 8 }").unwrap();
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("greet", rein::serde_json::json!({ "name": "Ada" })),
        ScriptedResponse::tool_call("shout", rein::serde_json::json!({})),
        ScriptedResponse::text("done"),
    ]);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(spec)
        .with_model(ModelSpec::new("scripted", "offline", "script"))
        .with_provider("offline", Arc::new(model))
        .with_tool("greet", Arc::new(Greet))
        .with_tool("shout", Arc::new(Shout))
        .build()
        .unwrap();
    let result = runtime
        .run_to_completion(RunRequest::new("t", vec![Message::user("greet Ada")]))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "done");
    let history = runtime.thread_messages("t").await;
    assert_eq!(history[2].role, Role::Tool);
    assert_eq!(history[2].content, r#"{"greeting":"hello, Ada"}"#);
    assert_eq!(history[4].content, "HEY");
}

#[test]
fn the_prelude_has_the_genai_executor_and_the_file_loaders() {
    let _: Arc<dyn LlmExecutor> = Arc::new(GenaiExecutor::new());
    let missing = "/nonexistent/rein/agent.yaml";
    let e: ConfigError = load_agent_spec_file(missing).unwrap_err();
    assert_eq!(e.path(), Some(std::path::Path::new(missing)));
    assert!(load_stop_conditions_file(missing).is_err());
}

/// A typed tool's arguments, derived through the facade only: `schemars`
/// through `use rein::schemars`, serde through its `crate` attribute.
mod typed_through_the_facade {
    use rein::schemars;

    #[derive(rein::serde::Deserialize, schemars::JsonSchema)]
    #[serde(crate = "rein::serde")]
    pub(crate) struct Named {
        pub(crate) name: String,
    }
}

#[tokio::test]
async fn a_typed_tool_needs_only_rein_paths() {
    use typed_through_the_facade::Named;
    let hello = tool_fn(
        "hello",
        "says hello",
        |args: Named, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(format!("hello, {}", args.name))
        },
    );
    assert_eq!(
        hello.descriptor().parameters["required"],
        rein::serde_json::json!(["name"])
    );
    let ctx = ToolContext::new("t", "r", "c", CancellationToken::new());
    let out = hello
        .execute(rein::serde_json::json!({"name": "Ada"}), &ctx)
        .await
        .unwrap();
    assert_eq!(out.to_content(), "hello, Ada");
}
