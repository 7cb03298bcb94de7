//! The planning flow through the HTTP API: the built-in plugin id `plan`
//! in a deployment file, `plan_updated` events on the run's SSE stream,
//! the plan in the run record's stop report, and the summary as the
//! response.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::Server;
use serde_json::json;

const YAML: &str = r#"
providers:
  planner:
    kind: scripted
    responses:
      - { tool_calls: [ { name: plan, arguments: { command: create, title: "Trip", steps: [ "book train", "book hotel" ] } } ] }
      - { tool_calls: [ { name: plan, arguments: { command: mark_step, step_index: 0, step_status: completed } }, { name: plan, arguments: { command: mark_step, step_index: 1, step_status: completed } } ] }
      - "Train and hotel are booked."
models:
  planner: { provider: planner, model: x }
agents:
  - { id: planner, model_id: planner, plugin_ids: [plan] }
"#;

#[tokio::test]
async fn a_plan_shows_on_the_stream_and_in_the_record_and_its_summary_is_the_response() {
    let server = Server::start(YAML).await;
    let (status, record) = server
        .post(
            "/v1/threads/trip/runs?wait=true",
            json!({"agent_id": "planner", "messages": [{"role": "user", "content": "plan my trip"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        record["termination"]["value"]["code"], "plan_completed",
        "{record}"
    );
    assert_eq!(
        record["response"], "Train and hotel are booked.",
        "{record}"
    );
    assert_eq!(record["report"]["plan"]["title"], "Trip", "{record}");
    assert_eq!(
        record["report"]["plan"]["steps"][1],
        json!({"title": "book hotel", "status": "completed"}),
        "{record}"
    );
    let run = record["run_id"].as_str().unwrap();
    let events = server.sse(&format!("/v1/runs/{run}/events"), None).await;
    let updates: Vec<&serde_json::Value> = events
        .iter()
        .filter(|(_, kind, _)| kind == "plan_updated")
        .map(|(_, _, e)| e)
        .collect();
    assert_eq!(
        updates.len(),
        2,
        "the create's round, then the marks' round"
    );
    assert_eq!(updates[1]["plan"], record["report"]["plan"]);
    server.stop().await;
}
