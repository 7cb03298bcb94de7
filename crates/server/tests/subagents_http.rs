//! Sub-agents through the HTTP API: the deployment's `subagents:`, the
//! child's own run record and stream, its events on the parent's stream,
//! and cancelling one child.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::time::Duration;

use common::Server;
use serde_json::{Value, json};

const YAML: &str = r#"
providers:
  lead:
    kind: scripted
    responses:
      - { tool_calls: [ { name: research, arguments: { task: "find the trains" } } ], usage: { input: 10, output: 5 } }
      - { text: "The researcher found them.", usage: { input: 20, output: 5 } }
  researcher:
    kind: scripted
    chunk_delay_ms: 30
    responses:
      - { text: "There are two trains to Bern today.", usage: { input: 7, output: 3 } }
models:
  lead: { provider: lead, model: x }
  researcher: { provider: researcher, model: x }
agents:
  - id: lead
    model_id: lead
    subagents:
      - { agent: researcher, tool: research, description: "Research one question." }
  - { id: researcher, model_id: researcher }
"#;

#[tokio::test]
async fn a_child_run_has_its_own_record_and_stream_and_shows_on_its_parent_s() {
    let server = Server::start(YAML).await;
    let (_, agents) = server.get("/v1/agents").await;
    let lead = agents
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "lead")
        .unwrap();
    assert!(lead["tools"].to_string().contains("research"), "{lead}");
    let (status, record) = server
        .post(
            "/v1/threads/trip/runs?wait=true",
            json!({"agent_id": "lead", "messages": [{"role": "user", "content": "plan"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["usage"]["input_tokens"], 10 + 20 + 7, "{record}");
    let children = record["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{record}");
    let child_id = children[0].as_str().unwrap();
    assert_eq!(record["report"]["children"][0]["run_id"], child_id);

    let (status, child) = server.get(&format!("/v1/runs/{child_id}")).await;
    assert_eq!(status, 200, "{child}");
    assert_eq!(child["parent_run_id"], record["run_id"]);
    assert_eq!(child["agent_id"], "researcher");
    assert_eq!(child["status"], "finished");
    assert_eq!(child["response"], "There are two trains to Bern today.");
    let call_id = child["parent_call_id"].as_str().unwrap();
    assert!(!call_id.is_empty());
    assert_eq!(
        child_id,
        format!("{}.1", record["run_id"].as_str().unwrap())
    );
    assert_eq!(child["thread_id"], format!("trip:{child_id}"));

    // The child's own stream: its events only, ending with its run_finished.
    let events = server
        .sse(&format!("/v1/runs/{child_id}/events"), None)
        .await;
    assert!(events.iter().all(|(_, _, e)| e["run_id"] == child_id));
    assert_eq!(events.last().unwrap().1, "run_finished");
    // The parent's stream: the child's events, between started and finished.
    let parent = record["run_id"].as_str().unwrap();
    let events = server.sse(&format!("/v1/runs/{parent}/events"), None).await;
    let kinds: Vec<&str> = events.iter().map(|(_, k, _)| k.as_str()).collect();
    let started = kinds.iter().position(|k| *k == "subagent_started").unwrap();
    let finished = kinds
        .iter()
        .position(|k| *k == "subagent_finished")
        .unwrap();
    assert_eq!(events[started].2["child_run_id"], child_id);
    assert_eq!(events[started].2["parent_call_id"], Value::Null);
    assert_eq!(events[started].2["call_id"], call_id);
    for (i, (_, _, e)) in events.iter().enumerate() {
        if e["run_id"] == child_id {
            assert!(i > started && i < finished, "{kinds:?}");
        }
    }
    assert_eq!(*kinds.last().unwrap(), "run_finished");
    assert_eq!(events.last().unwrap().2["run_id"], parent);
    // The child's thread holds its conversation.
    let (_, history) = server
        .get(&format!("/v1/threads/trip:{child_id}/messages"))
        .await;
    assert_eq!(history[0]["content"], "find the trains");
    server.stop().await;
}

#[tokio::test]
async fn cancelling_a_child_by_its_run_id_ends_it_alone_and_the_parent_goes_on() {
    let slow = YAML.replace("chunk_delay_ms: 30", "chunk_delay_ms: 200");
    let server = Server::start(&slow).await;
    let (status, accepted) = server
        .post(
            "/v1/threads/c/runs",
            json!({"agent_id": "lead", "messages": [{"role": "user", "content": "plan"}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let parent = accepted["run_id"].as_str().unwrap().to_owned();
    let child = loop {
        let (_, record) = server.get(&format!("/v1/runs/{parent}")).await;
        if let Some(child) = record["children"][0].as_str() {
            break child.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (status, answer) = server
        .post(&format!("/v1/runs/{child}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{answer}");
    let child_record = server.finished(&child).await;
    assert_eq!(
        child_record["termination"]["type"], "cancelled",
        "{child_record}"
    );
    let record = server.finished(&parent).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "The researcher found them.");
    server.stop().await;
}
