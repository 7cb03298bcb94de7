//! Typed tools through the facade: `tool_fn` and `TypedTool` + `typed`,
//! registered with `with_tools`; generated schemas; arguments that do not
//! fit become errored results the model can act on, never a crashed run.

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
use rein::events::AgentEvent;
use rein::prelude::*;
use rein::tools::{TypedTool, typed};
use serde_json::json;

// The snippet, verbatim (a compatibility fixture).
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: f64,
    b: f64,
}

fn add_tool() -> Arc<dyn Tool> {
    let add = rein::tools::tool_fn(
        "add",
        "Add two numbers",
        |args: AddArgs, _ctx: ToolContext| async move { Ok::<_, ToolError>(args.a + args.b) },
    ); // -> Arc<dyn Tool>; output: any Serialize
    add
}

/// A search with a nested struct, an enum and an optional field.
#[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Search {
    /// What to look for.
    query: String,
    /// How to match.
    mode: Mode,
    /// At most this many hits.
    limit: Option<u32>,
    /// Where to look.
    scope: Scope,
}

#[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Exact,
    Fuzzy,
}

#[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Scope {
    folder: String,
    recursive: bool,
}

#[derive(serde::Serialize)]
struct Hits {
    count: usize,
    first: String,
}

struct Finder;

impl TypedTool for Finder {
    const NAME: &'static str = "find";
    const DESCRIPTION: &'static str = "Finds files";
    type Args = Search;
    type Output = Hits;

    async fn call(&self, args: Search, ctx: ToolContext) -> Result<Hits, ToolError> {
        if ctx.cancellation.is_cancelled() {
            return Err(ToolError::new("cancelled"));
        }
        Ok(Hits {
            count: args.limit.unwrap_or(10) as usize,
            first: format!("{}/{}", args.scope.folder, args.query),
        })
    }
}

fn runtime(script: Vec<ScriptedResponse>) -> AgentRuntime {
    builder_with(ScriptedExecutor::new(script), spec())
        .with_tools([add_tool(), typed(Finder)])
        .build()
        .unwrap()
}

async fn tool_result(runtime: &AgentRuntime, thread: &str) -> (String, bool) {
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user(thread, "go"), sink.clone()).await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_history_valid(&runtime.thread_messages(thread).await);
    sink.events()
        .into_iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallFinished {
                result, is_error, ..
            } => Some((result, is_error)),
            _ => None,
        })
        .expect("a tool call finished")
}

#[tokio::test]
async fn a_tool_fn_gets_typed_arguments_and_its_output_reaches_the_model() {
    let rt = runtime(vec![
        ScriptedResponse::tool_call("add", json!({"a": 2, "b": 3.5})),
        ScriptedResponse::text("5.5"),
    ]);
    assert_eq!(tool_result(&rt, "t").await, ("5.5".to_owned(), false));
}

#[tokio::test]
async fn a_typed_tool_implemented_with_a_plain_async_fn_returns_json() {
    let rt = runtime(vec![
        ScriptedResponse::tool_call(
            "find",
            json!({"query": "notes", "mode": "fuzzy", "scope": {"folder": "/tmp", "recursive": true}}),
        ),
        ScriptedResponse::text("done"),
    ]);
    let (content, is_error) = tool_result(&rt, "t").await;
    assert!(!is_error, "{content}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&content).unwrap(),
        json!({"count": 10, "first": "/tmp/notes"})
    );
}

#[tokio::test]
async fn a_wrong_type_becomes_an_errored_result_naming_the_field_and_the_run_goes_on() {
    let rt = runtime(vec![
        ScriptedResponse::tool_call("add", json!({"a": "two", "b": 3})),
        ScriptedResponse::text("sorry"),
    ]);
    let (content, is_error) = tool_result(&rt, "t").await;
    assert!(is_error);
    assert!(content.contains("tool \"add\""), "{content}");
    assert!(content.contains("field `a`"), "{content}");
    assert!(content.contains("expected f64"), "{content}");
}

#[tokio::test]
async fn a_missing_nested_field_and_an_unknown_variant_are_named() {
    let rt = runtime(vec![
        ScriptedResponse::tool_call(
            "find",
            json!({"query": "x", "mode": "exact", "scope": {"folder": "/"}}),
        ),
        ScriptedResponse::text("sorry"),
    ]);
    let (content, is_error) = tool_result(&rt, "t").await;
    assert!(is_error);
    assert!(content.contains("field `scope`"), "{content}");
    assert!(content.contains("missing field `recursive`"), "{content}");

    let rt = runtime(vec![
        ScriptedResponse::tool_call(
            "find",
            json!({"query": "x", "mode": "loose", "scope": {"folder": "/", "recursive": false}}),
        ),
        ScriptedResponse::text("sorry"),
    ]);
    let (content, _) = tool_result(&rt, "t").await;
    assert!(content.contains("field `mode`"), "{content}");
    assert!(content.contains("unknown variant `loose`"), "{content}");
}

#[tokio::test]
async fn arguments_that_are_not_json_say_so() {
    // What an executor makes of a model's unparsable arguments.
    let rt = runtime(vec![
        ScriptedResponse::tool_call(
            "add",
            json!({"_raw_arguments": "{\"a\": 1,", "_error": "EOF while parsing an object"}),
        ),
        ScriptedResponse::text("sorry"),
    ]);
    let (content, is_error) = tool_result(&rt, "t").await;
    assert!(is_error);
    assert!(content.contains("not valid JSON"), "{content}");
    assert!(content.contains("EOF while parsing an object"), "{content}");
}

#[test]
fn the_generated_schema_is_an_object_with_nested_types_inlined() {
    let schema = typed(Finder).descriptor().parameters;
    assert_eq!(schema["type"], "object");
    assert_eq!(schema.get("$schema"), None);
    assert_eq!(schema.get("$defs"), None);
    assert_eq!(schema.get("definitions"), None);
    assert_eq!(schema["required"], json!(["query", "mode", "scope"]));
    assert_eq!(
        schema["properties"]["mode"],
        json!({"type": "string", "enum": ["exact", "fuzzy"], "description": "How to match."})
    );
    assert_eq!(schema["properties"]["limit"]["type"], "integer");
    assert_eq!(schema["properties"]["scope"]["type"], "object");
    assert_eq!(
        schema["properties"]["scope"]["required"],
        json!(["folder", "recursive"])
    );
    assert_eq!(
        rein::tools::parameters_schema::<AddArgs>(),
        json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]
        })
    );
}

#[test]
fn with_tools_names_each_tool_by_its_descriptor_and_rejects_a_second_of_one_name() {
    let rt = builder_with(ScriptedExecutor::new(vec![]), spec())
        .with_tools([add_tool(), typed(Finder)])
        .build();
    assert!(rt.is_ok(), "{rt:?}");
    let twice = builder_with(ScriptedExecutor::new(vec![]), spec())
        .with_tools([add_tool(), add_tool()])
        .build();
    match twice {
        Err(BuildError::DuplicateTool { name, .. }) => assert_eq!(name, "add"),
        other => panic!("expected DuplicateTool, got {other:?}"),
    }
}

#[tokio::test]
async fn cancelling_a_run_ends_a_typed_tool_that_waits_for_its_token() {
    struct Waits;
    impl TypedTool for Waits {
        const NAME: &'static str = "wait";
        const DESCRIPTION: &'static str = "Waits for the run's cancellation";
        type Args = Empty;
        type Output = &'static str;
        async fn call(&self, _args: Empty, ctx: ToolContext) -> Result<&'static str, ToolError> {
            ctx.cancellation.cancelled().await;
            Ok("saw the cancel")
        }
    }
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Empty {}

    let rt = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::tool_call("wait", json!({}))]),
        spec(),
    )
    .with_tools([typed(Waits)])
    .build()
    .unwrap();
    let run = tokio::spawn({
        let rt = rt.clone();
        async move { rt.run_to_completion(user("t", "go")).await }
    });
    while !rt.is_thread_active("t") {
        tokio::task::yield_now().await;
    }
    assert!(rt.cancel_and_wait_by_thread("t").await);
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    assert_history_valid(&rt.thread_messages("t").await);
}
