//! The stop conditions a model judges, through the HTTP API: a deployment
//! whose agent keeps polling the same job and whose `llm_loop_check` names
//! a scripted judging model; the check shows on the run's SSE stream as a
//! `model_check` event, its tokens in the run record's usage, and its
//! reasoning in the stop. A judging model the deployment does not declare
//! is refused at load, named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::Server;
use serde_json::json;

const YAML: &str = r#"
providers:
  looper:
    kind: scripted
    responses:
      - { tool_calls: [ { name: poll, arguments: { job: 7 } } ], usage: { input: 10, output: 5 } }
  judge:
    kind: scripted
    responses:
      - { text: '{"reasoning": "it polls job 7 again and again", "confidence": 0.96}', usage: { input: 100, output: 20 } }
models:
  looper: { provider: looper, model: x }
  judge: { provider: judge, model: j }
agents:
  - id: looper
    model_id: looper
    max_rounds: 10
    stop_conditions:
      - { type: llm_loop_check, model_id: judge, after_rounds: 3, interval: 1 }
"#;

#[tokio::test]
async fn a_loop_the_judging_model_confirms_stops_the_run_and_shows_on_its_stream() {
    let server = Server::start(YAML).await;
    let (status, record) = server
        .post(
            "/v1/threads/judged/runs?wait=true",
            json!({"agent_id": "looper", "messages": [{"role": "user", "content": "wait for job 7"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "stopped", "{record}");
    assert_eq!(
        record["termination"]["value"]["code"], "llm_loop_check",
        "{record}"
    );
    let detail = record["termination"]["value"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("it polls job 7 again and again"),
        "{detail}"
    );
    assert_eq!(record["steps"], 3, "{record}");
    assert_eq!(record["usage"]["input_tokens"], 3 * 10 + 100, "{record}");
    assert_eq!(record["usage"]["output_tokens"], 3 * 5 + 20, "{record}");

    let run = record["run_id"].as_str().unwrap();
    let events = server.sse(&format!("/v1/runs/{run}/events"), None).await;
    let kinds: Vec<&str> = events.iter().map(|(_, k, _)| k.as_str()).collect();
    let check = kinds
        .iter()
        .position(|k| *k == "model_check")
        .expect("a model_check event");
    let event = &events[check].2;
    assert_eq!(event["code"], "llm_loop_check", "{event}");
    assert_eq!(event["model_id"], "judge", "{event}");
    assert_eq!(event["step"], 3, "{event}");
    assert_eq!(event["outcome"], "detected", "{event}");
    assert_eq!(event["confidence"], 0.96, "{event}");
    assert_eq!(
        event["usage"],
        json!({"input_tokens": 100, "output_tokens": 20}),
        "{event}"
    );
    assert_eq!(*kinds.last().unwrap(), "run_finished", "{kinds:?}");
    server.stop().await;
}

#[test]
fn a_judging_model_the_deployment_does_not_declare_is_refused_at_load() {
    let yaml = YAML.replace("model_id: judge,", "model_id: flash,");
    let error = match rein_server::deployment::Deployment::from_yaml(&yaml) {
        Ok(_) => panic!("an undeclared judging model was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("`llm_loop_check` stop condition names unknown model \"flash\"")
            && error.contains("known models: judge, looper"),
        "{error}"
    );
    assert!(error.contains(":19:"), "the line of the model_id: {error}");
}

#[tokio::test]
async fn post_replay_asks_the_agent_s_judging_model() {
    let server = Server::start(YAML).await;
    let fixture = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/loop-recording.jsonl"),
    )
    .unwrap();
    let (status, report) = server
        .post(
            "/v1/replay",
            json!({"agent_id": "looper", "recording": fixture}),
        )
        .await;
    assert_eq!(status, 200, "{report}");
    let firings = report["runs"][0]["firings"].as_array().unwrap();
    assert_eq!(firings.len(), 1, "{report}");
    assert_eq!(firings[0]["code"], "llm_loop_check", "{report}");
    assert_eq!(firings[0]["round"], 3, "{report}");
    assert_eq!(firings[0]["action"], "stop", "{report}");
    assert!(report.get("not_evaluated").is_none(), "{report}");
    server.stop().await;
}
