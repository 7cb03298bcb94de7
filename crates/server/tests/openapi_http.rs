//! `GET /openapi.json`: an OpenAPI 3.1 document that lists exactly the
//! routes the router serves and docs/service.md documents, and whose
//! schemas accept the answers the server really sends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::collections::BTreeSet;

use common::Server;
use serde_json::{Value, json};

const YAML: &str = r#"
providers:
  lead:
    kind: scripted
    responses:
      - { tool_calls: [ { name: research, arguments: { task: "find the trains" } } ], usage: { input: 10, output: 5 } }
      - { text: "Found them.", usage: { input: 20, output: 5 } }
  researcher: { kind: scripted, responses: ["Two trains."] }
  ops:
    kind: scripted
    responses:
      - { tool_calls: [ { name: terminate, arguments: { status: success, message: done } } ] }
      - "Stopped."
models:
  lead: { provider: lead, model: x }
  researcher: { provider: researcher, model: x }
  ops: { provider: ops, model: x }
agents:
  - id: lead
    model_id: lead
    subagents:
      - { agent: researcher, tool: research, description: "Research one question." }
  - { id: researcher, model_id: researcher }
  - { id: ops, model_id: ops, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }
"#;

/// The (method, path) pairs of the document.
fn operations(document: &Value) -> BTreeSet<(String, String)> {
    document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

/// Asserts `body` matches the document's schema of `method path`'s
/// `status` answer.
fn assert_answer(document: &Value, method: &str, path: &str, status: u16, body: &Value) {
    let answer = &document["paths"][path][method]["responses"][status.to_string()];
    let schema = &answer["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} documents no JSON answer {status}: {answer}"
    );
    let mut root = schema.clone();
    root["components"] = document["components"].clone();
    let validator = jsonschema::validator_for(&root).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status} does not match its schema: {errors:?}\n{body}"
    );
}

#[tokio::test]
async fn the_document_lists_exactly_the_routes_served_and_documented() {
    let server = Server::start(YAML).await;
    let (status, document) = server.get("/openapi.json").await;
    assert_eq!(status, 200, "{document}");
    assert_eq!(document["openapi"], "3.1.0");
    assert_eq!(
        document,
        rein_server::http::openapi(),
        "the served document is the library's"
    );
    let described = operations(&document);

    // Every described route is served: none answers the router's fallbacks.
    for (method, path) in &described {
        let url = path.replace(['{', '}'], "");
        let request = server
            .client
            .request(method.parse().unwrap(), server.at(&url));
        let request = if method == "POST" {
            request.json(&json!({}))
        } else {
            request
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = if response
            .headers()
            .get("content-type")
            .is_some_and(|c| c.to_str().unwrap().starts_with("application/json"))
        {
            response.json().await.unwrap()
        } else {
            Value::Null
        };
        assert!(
            !["not_found", "method_not_allowed"]
                .contains(&body["error"]["code"].as_str().unwrap_or("")),
            "{method} {path} is described but not served: {status} {body}"
        );
    }
    // A route the document does not describe is not served.
    let (status, body) = server.get("/v1/nothing").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );

    // docs/service.md's route table names the same routes (the document
    // itself is served beside them).
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/service.md"
    ))
    .unwrap();
    let documented: BTreeSet<(String, String)> = docs
        .lines()
        .filter_map(|line| {
            let route = line.strip_prefix("| `")?.split('`').next()?;
            let (method, path) = route.split_once(' ')?;
            ["GET", "POST", "DELETE"].contains(&method).then(|| {
                (
                    method.to_owned(),
                    path.split('?').next().unwrap().to_owned(),
                )
            })
        })
        .collect();
    let mut served = described.clone();
    served.insert(("GET".to_owned(), "/openapi.json".to_owned()));
    assert_eq!(
        documented, served,
        "docs/service.md's routes and the document's differ"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_schemas_accept_the_answers_the_server_sends() {
    let server = Server::start(YAML).await;
    let document = rein_server::http::openapi();
    let check = |method: &str, path: &str, status: u16, body: &Value| {
        assert_answer(&document, method, path, status, body);
    };
    let (status, body) = server.get("/healthz").await;
    check("get", "/healthz", status, &body);
    let (status, body) = server.get("/v1/agents").await;
    check("get", "/v1/agents", status, &body);

    // A tree: a record with usage, children and a stop report.
    let submit = "/v1/threads/{thread_id}/runs";
    let (status, lead) = server
        .post(
            "/v1/threads/t1/runs?wait=true",
            json!({"agent_id": "lead", "messages": [{"role": "user", "content": "plan"}]}),
        )
        .await;
    check("post", submit, status, &lead);
    let child = lead["children"][0].as_str().unwrap();
    let (status, body) = server.get(&format!("/v1/runs/{child}")).await;
    check("get", "/v1/runs/{run_id}", status, &body);
    // A parked run: its record with pending approvals, the approvals list,
    // a decision, and the record with its decisions.
    let (status, parked) = server
        .say("t2", "stop it", json!({"agent_id": "ops"}))
        .await;
    check("post", submit, status, &parked);
    let run_id = parked["run_id"].as_str().unwrap();
    let call = loop {
        let (status, record) = server.get(&format!("/v1/runs/{run_id}")).await;
        if record["status"] == "awaiting_approval" {
            check("get", "/v1/runs/{run_id}", status, &record);
            break record["pending_approvals"][0]["call_id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let (status, body) = server.get("/v1/approvals").await;
    check("get", "/v1/approvals", status, &body);
    let (status, body) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals/{call}"),
            json!({"decision": "approve"}),
        )
        .await;
    check(
        "post",
        "/v1/runs/{run_id}/approvals/{call_id}",
        status,
        &body,
    );
    let record = server.finished(run_id).await;
    check("get", "/v1/runs/{run_id}", 200, &record);
    assert!(
        record["report"].is_object() && record["decisions"].is_array(),
        "{record}"
    );

    let (status, body) = server.get("/v1/runs?limit=2").await;
    check("get", "/v1/runs", status, &body);
    let (status, body) = server.get("/v1/threads").await;
    check("get", "/v1/threads", status, &body);
    let (status, body) = server.get("/v1/threads/t1/messages").await;
    check("get", "/v1/threads/{thread_id}/messages", status, &body);
    let (status, body) = server
        .post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
        .await;
    check("post", "/v1/runs/{run_id}/cancel", status, &body);
    let (status, body) = server.post("/v1/threads/t1/cancel", json!({})).await;
    check("post", "/v1/threads/{thread_id}/cancel", status, &body);
    // Refusals have the error schema.
    let (status, body) = server.get("/v1/runs/nope").await;
    check("get", "/v1/runs/{run_id}", status, &body);
    let (status, body) = server.get("/v1/runs?status=done").await;
    check("get", "/v1/runs", status, &body);
    // The input schemas accept the bodies the server accepts.
    let body_schema = |path: &str, method: &str| {
        let mut root =
            document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
                .clone();
        root["components"] = document["components"].clone();
        jsonschema::validator_for(&root).unwrap()
    };
    let submission = json!({"agent_id": "lead", "strategy": "enqueue", "idempotency_key": "k",
                            "messages": [{"role": "user", "content": "Hi"}]});
    assert!(body_schema(submit, "post").is_valid(&submission));
    assert!(!body_schema(submit, "post").is_valid(&json!({"message": "Hi"})));
    let decision = body_schema("/v1/runs/{run_id}/approvals/{call_id}", "post");
    for d in [
        json!({"decision": "approve"}),
        json!({"decision": "edit", "arguments": {"a": 1}}),
        json!({"decision": "reject", "reason": "no"}),
    ] {
        assert!(decision.is_valid(&d), "{d}");
    }
    assert!(!decision.is_valid(&json!({"decision": "maybe"})));
    server.stop().await;
}
