//! The built-in completion plugins of a deployment file through the HTTP
//! API: `plan` (`plan_updated` events on the run's SSE stream, the plan in
//! the run record's stop report, the summary as the response) and
//! `outputs` (the agent's declared outputs, the run ending `goal`).

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

const OUTPUTS_YAML: &str = r#"
providers:
  writer:
    kind: scripted
    responses:
      - { tool_calls: [ { name: emit_output, arguments: { name: summary, value: "Two trains." } } ] }
      - { tool_calls: [ { name: emit_output, arguments: { name: trains, value: 2 } } ] }
models:
  writer: { provider: writer, model: x }
agents:
  - id: writer
    model_id: writer
    plugin_ids: [outputs]
    outputs: { summary: string, trains: integer }
"#;

#[tokio::test]
async fn an_agent_s_declared_outputs_end_its_run_goal_with_the_values_in_its_record() {
    let server = Server::start(OUTPUTS_YAML).await;
    let (status, record) = server
        .post(
            "/v1/threads/out/runs?wait=true",
            json!({"agent_id": "writer", "messages": [{"role": "user", "content": "count the trains"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["value"]["code"], "goal", "{record}");
    let run = record["run_id"].as_str().unwrap();
    let events = server.sse(&format!("/v1/runs/{run}/events"), None).await;
    let (_, kind, finished) = events.last().unwrap();
    assert_eq!(kind, "run_finished");
    assert_eq!(
        finished["outputs"],
        json!({"summary": "Two trains.", "trains": 2}),
        "{finished}"
    );
    server.stop().await;

    // The plugin and the declaration go together; a bad type is named.
    let missing = OUTPUTS_YAML.replace("    outputs: { summary: string, trains: integer }\n", "");
    let error = match rein_server::deployment::Deployment::from_yaml(&missing) {
        Ok(_) => panic!("the plugin without outputs was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("the plugin `outputs` needs the outputs it waits for"),
        "{error}"
    );
    let bad = OUTPUTS_YAML.replace("trains: integer", "trains: int");
    let error = match rein_server::deployment::Deployment::from_yaml(&bad) {
        Ok(_) => panic!("an unknown type was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("output \"trains\": unknown JSON type \"int\""),
        "{error}"
    );
}
