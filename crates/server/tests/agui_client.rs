//! AG-UI with the official TypeScript client (`@ag-ui/client`'s
//! `HttpAgent`, run by node): a conversation over two runs that appends
//! only new messages, an abort that cancels the run, and an unknown agent.
//!
//! The client is installed by `.ci/run` (`npm install` into
//! `$HOME/.cache/rein-npm/agui`); `REIN_AGUI_CLIENT` names its
//! `node_modules`. Without it the tests say they are skipped, and `.ci/run`
//! sets it, so CI runs them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::Write;
use std::path::PathBuf;

use common::Server;
use serde_json::{Value, json};

const AGUI_YAML: &str = r#"
providers:
  chat:
    kind: scripted
    chunk_delay_ms: 5
    responses:
      - { text: "Let me check.", tool_calls: [ { name: terminate, arguments: { status: success, message: checked } } ] }
      - "Hello again, friend."
  slow: { kind: scripted, chunk_delay_ms: 200, responses: ["this answer takes a long long time to arrive"] }
models:
  chat: { provider: chat, model: c }
  slow: { provider: slow, model: s }
agents:
  - { id: assistant, model_id: chat, plugin_ids: [terminate] }
  - { id: slow, model_id: slow }
"#;

/// The client's `node_modules`, or `None` (skipped, said once).
fn client() -> Option<PathBuf> {
    match std::env::var("REIN_AGUI_CLIENT") {
        Ok(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            let _ = std::io::stderr().write_all(
                b"AG-UI client tests skipped: REIN_AGUI_CLIENT is not set (.ci/run installs @ag-ui/client and sets it)\n",
            );
            None
        }
    }
}

async fn node(modules: &PathBuf, url: &str, scenario: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agui/client.cjs");
    let output = tokio::process::Command::new("node")
        .arg(script)
        .arg(url)
        .arg(scenario)
        .env("NODE_PATH", modules)
        .env("SUPPRESS_TRANSFORMATION_WARNINGS", "true")
        .output()
        .await
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "node failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap()
}

#[tokio::test]
async fn the_official_client_runs_a_conversation_and_only_new_messages_are_stored() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/assistant"), "conversation").await;
    let first: Vec<&str> = seen["first"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    assert_eq!(first.first(), Some(&"RUN_STARTED"));
    assert_eq!(first.last(), Some(&"RUN_FINISHED"));
    for kind in [
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
    ] {
        assert!(first.contains(&kind), "{kind} missing from {first:?}");
    }
    assert_eq!(seen["second"]["error"], Value::Null, "{seen}");
    assert_eq!(
        seen["second"]["events"].as_array().unwrap().last().unwrap(),
        "RUN_FINISHED"
    );

    // Rein's records of the two runs, under the client's run ids.
    let one = server.finished("agui-run-1").await;
    assert_eq!(one["termination"]["value"]["code"], "terminate");
    assert_eq!(
        server.finished("agui-run-2").await["termination"]["type"],
        "natural_end"
    );
    // The second request resent "hello" and the first run's messages:
    // only "and again" was appended.
    let users = server.user_messages("agui-conversation").await;
    assert_eq!(users, vec!["hello", "and again"]);
    // The client holds both answers and the tool result as messages.
    let roles: Vec<&str> = seen["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(
        roles.contains(&"tool") && roles.iter().filter(|r| **r == "assistant").count() >= 2,
        "{roles:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn aborting_in_the_client_cancels_the_run() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/slow"), "abort").await;
    let events = seen["aborted"]["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e == "TEXT_MESSAGE_CONTENT"), "{seen}");
    let record = server.finished("agui-abort").await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["cancel_cause"], json!({"type": "requested"}));
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_agent_is_a_json_404_the_client_reports() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/assistant"), "error").await;
    let error = seen["failed"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("404") && error.contains("unknown_agent"),
        "{seen}"
    );
    server.stop().await;
}
