//! Auto mode through the HTTP API (docs/auto-mode.md, "Through the
//! service"): a submission's `run_mode` and `automation_policy`, the
//! thread's stored defaults and the agent's, the round records a client
//! follows, `tokens_used_session` / `max_tokens` in the records, on the
//! thread's live tail and in `GET /v1/threads/{id}/auto`, and `/new`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::time::Duration;

use common::Server;
use futures::StreamExt;
use serde_json::{Value, json};

/// Each round reports one experiment, then answers (120 + 110 tokens).
const YAML: &str = r#"
providers:
  lab:
    kind: scripted
    responses:
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.5 } } } ], usage: { input: 100, output: 20 } }
      - { text: "Tried lr 0.1.", usage: { input: 100, output: 10 } }
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: "0.7" } } } ], usage: { input: 100, output: 20 } }
      - { text: "Tried lr 0.01.", usage: { input: 100, output: 10 } }
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.8 } } } ], usage: { input: 100, output: 20 } }
      - { text: "Tried lr 0.001.", usage: { input: 100, output: 10 } }
      - { text: "Just one answer.", usage: { input: 100, output: 5 } }
models:
  lab: { provider: lab, model: x }
agents:
  - { id: lab, model_id: lab, plugin_ids: [automation] }
"#;

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Tune the model."}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Reads the thread's live tail until a `progress` event whose message
/// starts with `auto-run stop condition`; returns every `progress` event.
async fn progress_until_stop(response: reqwest::Response) -> Vec<Value> {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut progress = Vec::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                if !block.contains("event: progress") {
                    continue;
                }
                let data = block
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap();
                let event: Value = serde_json::from_str(data).unwrap();
                let stop = event["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("auto-run stop condition");
                progress.push(event);
                if stop {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the session's stop reached the thread's tail");
    progress
}

#[tokio::test]
async fn an_auto_submission_runs_rounds_until_its_policy_stops_it_and_every_record_carries_the_session_tokens()
 {
    let server = Server::start(YAML).await;
    let tail = reqwest::get(server.at("/v1/threads/lab/events"))
        .await
        .unwrap();
    let (status, accepted) = server
        .post(
            "/v1/threads/lab/runs",
            ask(json!({"run_mode": "auto", "automation_policy": {"maxExperiments": 2, "maxTokens": 100000}})),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let first = accepted["run_id"].as_str().unwrap().to_owned();
    let session = accepted["session_id"].as_str().unwrap().to_owned();
    assert_eq!(session, format!("auto-{first}"));
    let progress = progress_until_stop(tail).await;

    // Round 1: its record names the next round; round 2 stops the session.
    let one = server.finished(&first).await;
    assert_eq!(one["auto"]["session_id"], session, "{one}");
    assert_eq!(one["auto"]["round"], 1, "{one}");
    assert_eq!(one["auto"]["tokens_used_session"], 230, "{one}");
    assert_eq!(one["auto"]["max_tokens"], 100000, "{one}");
    assert!(one["auto"].get("stop_reason").is_none(), "{one}");
    let second = one["auto"]["next_run_id"].as_str().unwrap().to_owned();
    let two = server.finished(&second).await;
    assert_eq!(two["auto"]["round"], 2, "{two}");
    assert_eq!(two["auto"]["tokens_used_session"], 460, "{two}");
    assert_eq!(
        two["auto"]["stop_reason"], "max experiments reached (2/2)",
        "{two}"
    );
    assert!(two["auto"].get("next_run_id").is_none(), "{two}");
    assert_eq!(
        two["auto"]["progress"].as_array().unwrap().last().unwrap(),
        "auto-run stop condition: max experiments reached (2/2)"
    );
    // The continuation message was the second round's input.
    let users = server.user_messages("lab").await;
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(
        users[1].starts_with("Continue the task (auto-run round 2"),
        "{users:?}"
    );

    // The live tail carried every progress message with the tokens.
    let messages: Vec<&str> = progress
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "auto-run round 1 finished: natural end",
            "auto-run round 2 finished: natural end",
            "auto-run stop condition: max experiments reached (2/2)",
        ]
    );
    for p in &progress {
        assert_eq!(p["run_id"], session, "{p}");
        assert_eq!(p["max_tokens"], 100000, "{p}");
    }
    assert_eq!(progress[0]["tokens_used_session"], 230);
    assert_eq!(progress[2]["tokens_used_session"], 460);

    // The thread keeps the defaults the submission named and the totals.
    let (status, auto) = server.get("/v1/threads/lab/auto").await;
    assert_eq!(status, 200, "{auto}");
    assert_eq!(auto["run_mode"], "auto", "{auto}");
    assert_eq!(auto["automation_policy"]["maxExperiments"], 2, "{auto}");
    assert_eq!(auto["tokens_used_session"], 460, "{auto}");
    assert_eq!(auto["max_tokens"], 100000, "{auto}");
    assert_eq!(auto["reports"][1]["metrics"]["acc"], 0.7, "{auto}");

    // A plain submission now runs in auto mode with the stored policy;
    // the thread's reports already hold two experiments, so one round.
    let (status, last) = server
        .post("/v1/threads/lab/runs?wait=true", ask(json!({})))
        .await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(
        last["auto"]["stop_reason"], "max experiments reached (3/2)",
        "{last}"
    );
    assert_eq!(last["auto"]["round"], 1, "a new session: {last}");
    assert_eq!(last["auto"]["tokens_used_session"], 690, "{last}");

    // `/new`: history and totals gone, the defaults kept.
    let (status, reset) = server.post("/v1/threads/lab/new", json!({})).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["tokens_used_session"], 0, "{reset}");
    assert_eq!(reset["reports"], json!([]), "{reset}");
    assert_eq!(reset["run_mode"], "auto", "{reset}");
    assert!(server.user_messages("lab").await.is_empty());

    // `single` overrides the stored default (and becomes it).
    let (status, single) = server
        .post(
            "/v1/threads/lab/runs?wait=true",
            ask(json!({"run_mode": "single"})),
        )
        .await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single["response"], "Just one answer.", "{single}");
    assert!(single.get("auto").is_none(), "{single}");
    let (_, auto) = server.get("/v1/threads/lab/auto").await;
    assert_eq!(auto["run_mode"], "single", "{auto}");
    assert_eq!(
        auto["tokens_used_session"], 0,
        "a single run is no round: {auto}"
    );
    server.stop().await;
}

const AGENT_DEFAULT_YAML: &str = r#"
providers:
  lab:
    kind: scripted
    responses:
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.9 } } } ] }
      - "Done once."
models:
  lab: { provider: lab, model: x }
agents:
  - id: lab
    model_id: lab
    plugin_ids: [automation]
    run_mode: auto
    automation_policy: { maxExperiments: 1 }
"#;

#[tokio::test]
async fn an_agent_s_deployment_default_makes_a_plain_submission_an_auto_session() {
    let server = Server::start(AGENT_DEFAULT_YAML).await;
    let (status, record) = server
        .post("/v1/threads/t/runs?wait=true", ask(json!({})))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        record["auto"]["stop_reason"], "max experiments reached (1/1)",
        "{record}"
    );
    // Nothing was named, so the thread stores no default of its own.
    let (_, auto) = server.get("/v1/threads/t/auto").await;
    assert!(auto.get("run_mode").is_none(), "{auto}");
    assert!(auto.get("automation_policy").is_none(), "{auto}");
    server.stop().await;
}

#[tokio::test]
async fn a_bad_run_mode_or_policy_is_refused_naming_the_field_and_changes_nothing() {
    let server = Server::start(YAML).await;
    let (status, error) = server
        .post("/v1/threads/bad/runs", ask(json!({"run_mode": "forever"})))
        .await;
    assert_eq!(status, 422, "{error}");
    assert_eq!(error["error"]["code"], "invalid_field", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("run_mode") && message.contains("forever"),
        "{message}"
    );
    let (status, error) = server
        .post(
            "/v1/threads/bad/runs",
            ask(json!({"run_mode": "auto", "automation_policy": {"goals": [{"metric": "acc", "operator": "=>", "value": 1}]}})),
        )
        .await;
    assert_eq!(status, 422, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("automation_policy") && message.contains("=>"),
        "{message}"
    );
    assert!(server.user_messages("bad").await.is_empty());
    let (_, auto) = server.get("/v1/threads/bad/auto").await;
    assert!(auto.get("run_mode").is_none(), "{auto}");
    server.stop().await;
}

/// Each round answers slowly (a word every 50 ms), so a client acts while
/// it runs.
const SLOW_YAML: &str = r#"
providers:
  lab:
    kind: scripted
    chunk_delay_ms: 50
    responses:
      - "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
models:
  lab: { provider: lab, model: x }
agents:
  - { id: lab, model_id: lab, plugin_ids: [automation] }
"#;

/// Waits until the run is running, and a little longer.
async fn streaming(server: &Server, run_id: &str) {
    for _ in 0..400 {
        let (_, record) = server.get(&format!("/v1/runs/{run_id}")).await;
        if record["status"] == "running" {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("run {run_id} never ran");
}

#[tokio::test]
async fn new_input_interrupting_a_round_ends_its_session_and_starts_no_next_round() {
    let server = Server::start(SLOW_YAML).await;
    let (status, accepted) = server
        .post(
            "/v1/threads/i/runs",
            ask(json!({"run_mode": "auto", "automation_policy": {"maxExperiments": 3}})),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let round = accepted["run_id"].as_str().unwrap().to_owned();
    streaming(&server, &round).await;
    let (status, single) = server
        .post(
            "/v1/threads/i/runs?wait=true",
            ask(json!({"run_mode": "single"})),
        )
        .await;
    assert_eq!(status, 200, "{single}");
    assert!(single.get("auto").is_none(), "{single}");
    let record = server.finished(&round).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["auto"]["stop_reason"], "cancelled", "{record}");
    assert!(record["auto"].get("next_run_id").is_none(), "{record}");
    // Nothing else ran on the thread: the round and the single run.
    let (_, runs) = server.get("/v1/runs?thread_id=i").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "{runs}");
    server.stop().await;
}

#[tokio::test]
async fn new_during_a_round_ends_the_session_and_leaves_the_totals_at_zero() {
    let server = Server::start(SLOW_YAML).await;
    let (status, accepted) = server
        .post(
            "/v1/threads/n/runs",
            ask(json!({"run_mode": "auto", "automation_policy": {"maxExperiments": 3}})),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let round = accepted["run_id"].as_str().unwrap().to_owned();
    streaming(&server, &round).await;
    let (status, reset) = server.post("/v1/threads/n/new", json!({})).await;
    assert_eq!(status, 200, "{reset}");
    let record = server.finished(&round).await;
    assert_eq!(record["auto"]["stop_reason"], "cancelled", "{record}");
    let (_, auto) = server.get("/v1/threads/n/auto").await;
    assert_eq!(auto["tokens_used_session"], 0, "{auto}");
    assert!(server.user_messages("n").await.is_empty());
    server.stop().await;
}
