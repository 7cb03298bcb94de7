//! `rein_server::App`: a deployment served with Rust tools and plugins —
//! the example's app through HTTP, and the library entry point with a
//! plugin, each checked against the file before anything starts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::process::Command;
use std::sync::Arc;

use common::Server;
use rein::plugin::{Plugin, PluginRegistrar};
use rein::schemars;
use rein::tools::tool_fn;
use rein_server::App;
use rein_server::deployment::Deployment;
use serde_json::{Value, json};

const EXAMPLE_YAML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rust-tools.yaml");

/// The example binary's code (`examples/rust_tools.rs`), compiled in here:
/// `cargo test` builds examples only as test harnesses, so the test serves
/// the example's own `App` (its `main` is `app().main()`, the `rein`
/// command line, tested through the `rein` binary).
#[allow(dead_code)]
#[path = "../examples/rust_tools.rs"]
mod example;

#[tokio::test]
async fn the_example_s_app_serves_its_typed_rust_tool_over_http() {
    let app = example::app();
    let deployment = Deployment::load_with(EXAMPLE_YAML, &app.extras()).unwrap();
    let assembled = rein_server::assemble::start_with(&deployment, &app)
        .await
        .unwrap();
    let server = Server::start_assembled(assembled, deployment.server.clone()).await;
    let (_, agents) = server.get("/v1/agents").await;
    assert_eq!(agents[0]["tools"], json!(["lookup_order"]), "{agents}");
    let (status, record) = server
        .post(
            "/v1/threads/t1/runs?wait=true",
            json!({"messages": [{"role": "user", "content": "Where is order 42?"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let (_, history) = server.get("/v1/threads/t1/messages").await;
    let result = history
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("{history}"));
    let output: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        output,
        json!({"order_id": 42, "status": "packed", "ships_in_days": 1})
    );
    server.stop().await;
}

#[test]
fn the_example_s_file_loads_with_its_app_and_plain_rein_names_the_tool_it_does_not_know() {
    assert!(Deployment::load_with(EXAMPLE_YAML, &example::app().extras()).is_ok());
    let plain = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["check", "--config", EXAMPLE_YAML])
        .output()
        .unwrap();
    assert!(!plain.status.success());
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(
        out.contains("rust-tools.yaml:17:13:")
            && out.contains("unknown tool \"lookup_order\"")
            && out.contains("rein_server::App"),
        "{out}"
    );
}

/// A plugin written in Rust: a tool of its own.
struct Stamps;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Stamp {
    /// What to stamp.
    text: String,
}

impl Plugin for Stamps {
    fn register(
        &self,
        registrar: &mut PluginRegistrar,
    ) -> Result<(), rein::contract::state::StateError> {
        registrar.register_tool(
            "stamp",
            tool_fn("stamp", "Stamps a text.", |s: Stamp, _ctx| async move {
                Ok(format!("[stamped] {}", s.text))
            }),
        );
        Ok(())
    }
}

const PLUGIN_YAML: &str = r#"
providers:
  p:
    kind: scripted
    responses:
      - { tool_calls: [ { name: stamp, arguments: { text: "ok" } }, { name: shout, arguments: { text: "hi" } } ] }
      - "Stamped and shouted."
models:
  m: { provider: p, model: x }
agents:
  - id: clerk
    model_id: m
    plugin_ids: [stamps]
    tools: [shout]
    approvals: [ { tool: stamp, action: allow } ]
"#;

fn app() -> App {
    let shout = tool_fn("shout", "Shouts.", |s: Stamp, _ctx| async move {
        Ok(s.text.to_uppercase())
    });
    App::new()
        .with_tool(shout)
        .with_plugin("stamps", Arc::new(Stamps))
}

#[tokio::test]
async fn an_app_s_plugin_and_tool_serve_the_agents_that_list_them() {
    let app = app();
    let deployment = Deployment::from_yaml_with(PLUGIN_YAML, &app.extras()).unwrap();
    let assembled = rein_server::assemble::start_with(&deployment, &app)
        .await
        .unwrap();
    let server = Server::start_assembled(assembled, deployment.server.clone()).await;
    let (status, record) = server
        .post(
            "/v1/threads/t/runs?wait=true",
            json!({"messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let (_, history) = server.get("/v1/threads/t/messages").await;
    let results: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["[stamped] ok", "HI"], "{history}");
    server.stop().await;
}

#[test]
fn a_file_naming_an_unknown_rust_plugin_or_tool_is_refused_listing_the_app_s() {
    let app = app();
    let text = PLUGIN_YAML
        .replace("plugin_ids: [stamps]", "plugin_ids: [stampz]")
        .replace("tools: [shout]", "tools: [shoot]");
    let err = Deployment::from_yaml_with(&text, &app.extras()).unwrap_err();
    let lines = err.lines().join("\n");
    assert!(
        lines.contains(":13:18: agent \"clerk\": unknown plugin \"stampz\"; known plugins: terminate, ask_user, automation, plan, outputs, stamps"),
        "{lines}"
    );
    assert!(
        lines.contains("unknown tool \"shoot\"")
            && lines.contains("this program's Rust tools: shout"),
        "{lines}"
    );
    // Without the app, the same names are unknown.
    assert!(Deployment::from_yaml(PLUGIN_YAML).is_err());
}
