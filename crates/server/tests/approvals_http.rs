//! Tool approvals through the HTTP API: a parked run's record and stream,
//! `POST /v1/runs/{run_id}/approvals/{call_id}` (idempotent, conflicts,
//! unknown calls, edits outside the schema), `GET /v1/approvals`, and the
//! matrix of strategies × pending calls × {new input, cancel} whose every
//! resulting history an OpenAI-compatible endpoint accepts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use rein::approvals::{ApprovalAction, ApprovalRule};
use rein::contract::inference::{InferenceRequest, LlmExecutor};
use rein::contract::message::Message;
use rein::engine::{GenaiExecutor, ScriptedExecutor, ScriptedResponse};
use rein::tools::{ToolContext, ToolError, tool_fn};
use rein::{AgentRuntime, AgentRuntimeBuilder, AgentSpec, ModelSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A runtime whose agent `ops` asks before `shell` and `deploy`, and
/// whose first answer calls `held` gated tools and one free `search`.
fn runtime(held: usize, runs: &Arc<AtomicUsize>) -> AgentRuntime {
    let calls: Vec<(&str, Value)> = [
        ("shell", json!({"cmd": "ls"})),
        ("deploy", json!({"env": "prod"})),
        ("shell", json!({"cmd": "df"})),
    ]
    .into_iter()
    .take(held)
    .chain([("search", json!({"q": "x"}))])
    .collect();
    // The first request of the thread calls the tools; a request after
    // tool results finishes; one after new input answers it.
    let first = Mutex::new(Some(ScriptedResponse::tool_calls(calls)));
    let executor = ScriptedExecutor::from_fn(move |request| {
        if let Some(calls) = first.lock().unwrap().take() {
            return calls;
        }
        match request.messages.last().map(|m| m.role) {
            Some(rein::contract::message::Role::Tool) => ScriptedResponse::text("done"),
            _ => ScriptedResponse::text("answered the new input"),
        }
    });
    let mut builder = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("ops")
                .with_model_id("m")
                .with_approval(ApprovalRule::new("shell", ApprovalAction::Ask))
                .with_approval(ApprovalRule::new("deploy", ApprovalAction::Ask)),
        )
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(executor));
    for name in ["shell", "deploy", "search"] {
        let runs = runs.clone();
        builder = builder.with_tool(
            name,
            tool_fn(
                name,
                "counts its runs",
                move |args: Value, _: ToolContext| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, ToolError>(format!("ran with {args}"))
                    }
                },
            ),
        );
    }
    builder.build().unwrap()
}

/// Polls the run until it waits on `n` calls; returns its record.
async fn parked(server: &Server, run_id: &str, n: usize) -> Value {
    for _ in 0..2000 {
        let (_, record) = server.get(&format!("/v1/runs/{run_id}")).await;
        if record["status"] == "awaiting_approval"
            && record["pending_approvals"].as_array().map(Vec::len) == Some(n)
        {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("run {run_id} never parked on {n} calls");
}

fn call_ids(record: &Value) -> Vec<String> {
    record["pending_approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["call_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_parked_run_is_listed_and_decided_over_http_and_the_same_run_goes_on() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start_runtime(runtime(1, &runs)).await;
    let (status, accepted) = server.say("t", "check", json!({})).await;
    assert_eq!(status, 202, "{accepted}");
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let record = parked(&server, &run_id, 1).await;
    let pending = &record["pending_approvals"][0];
    assert_eq!(pending["tool"], "shell");
    assert_eq!(pending["arguments"], json!({"cmd": "ls"}));
    assert_eq!(pending["run_id"], run_id.as_str());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the free call ran, the held one not"
    );
    let call = pending["call_id"].as_str().unwrap().to_owned();

    let (status, listed) = server.get("/v1/approvals").await;
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["call_id"], call.as_str());
    let (_, other) = server.get("/v1/approvals?thread_id=other").await;
    assert_eq!(other, json!([]));
    let (_, mine) = server.get("/v1/approvals?thread_id=t").await;
    assert_eq!(mine.as_array().unwrap().len(), 1);

    // Refusals change nothing.
    let path = format!("/v1/runs/{run_id}/approvals/{call}");
    let (status, body) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals/nope"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_approval"))
    );
    let (status, body) = server.post(&path, json!({"decision": "maybe"})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = server
        .post(
            &path,
            json!({"decision": "edit", "arguments": "not an object"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_decision");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let (status, body) = server.post(&path, json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"call_id": call, "decision": "approve"}));
    let record = server.finished(&run_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "done");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Idempotent after the run went on; a different decision conflicts.
    let (status, _) = server.post(&path, json!({"decision": "approve"})).await;
    assert_eq!(status, 200);
    let (status, body) = server
        .post(&path, json!({"decision": "reject", "reason": "late"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("already_decided"))
    );

    let events = server.sse(&format!("/v1/runs/{run_id}/events"), None).await;
    let kinds: Vec<&str> = events.iter().map(|(_, k, _)| k.as_str()).collect();
    let requested = kinds
        .iter()
        .position(|k| *k == "approval_requested")
        .unwrap();
    let decided = kinds.iter().position(|k| *k == "approval_decided").unwrap();
    assert!(requested < decided, "{kinds:?}");
    assert_eq!(events[decided].2["decision"], "approve");
    assert_eq!(
        kinds.iter().filter(|k| **k == "run_started").count(),
        1,
        "same run"
    );
    server.stop().await;
}

/// What an OpenAI-compatible endpoint says about a chat request's
/// messages: every assistant `tool_calls` id answered by the `tool`
/// messages right after it (the rule OpenAI enforces with a 400).
fn openai_pairing_error(body: &Value) -> Option<String> {
    let mut open: Vec<String> = Vec::new();
    for m in body["messages"].as_array()? {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            match open.iter().position(|o| o == id) {
                Some(at) => {
                    open.remove(at);
                }
                None => return Some(format!("tool message for unknown tool_call_id {id}")),
            }
            continue;
        }
        if !open.is_empty() {
            return Some(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. Missing: {open:?}"
            ));
        }
        if let Some(calls) = m["tool_calls"].as_array() {
            open = calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                .collect();
        }
    }
    (!open.is_empty()).then(|| format!("unanswered tool calls at the end: {open:?}"))
}

/// Sends `history` through Rein's OpenAI-compatible executor to an
/// endpoint that checks it as OpenAI does; `Err` is the endpoint's 400.
async fn openai_accepts(history: Vec<Message>) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let endpoint = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0_u8; 8192];
        let body = loop {
            let n = socket.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    break serde_json::from_slice::<Value>(&buf[end + 4..end + 4 + length])
                        .unwrap();
                }
            }
            assert!(n > 0);
        };
        let verdict = openai_pairing_error(&body);
        let response = match &verdict {
            None => "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_owned(),
            Some(error) => {
                let body = json!({"error": {"message": error, "type": "invalid_request_error"}}).to_string();
                format!("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
            }
        };
        socket.write_all(response.as_bytes()).await.unwrap();
        verdict
    });
    let executor = GenaiExecutor::openai_compatible(&base_url, None);
    let request = InferenceRequest::new("gpt-compatible", history);
    let opened = executor.open(&request).await;
    let verdict = endpoint.await.unwrap();
    match (opened, verdict) {
        (Ok(_), None) => Ok(()),
        (_, Some(error)) => Err(error),
        (Err(e), None) => panic!("the endpoint accepted but the executor failed: {e}"),
    }
}

#[tokio::test]
async fn new_input_or_a_cancel_while_parked_leaves_a_history_every_provider_accepts() {
    for strategy in ["interrupt", "enqueue", "reject"] {
        for held in [1, 3] {
            for by_message in [true, false] {
                let case = format!(
                    "{strategy}, {held} pending, by {}",
                    if by_message { "message" } else { "cancel" }
                );
                let runs = Arc::new(AtomicUsize::new(0));
                let server = Server::start_runtime(runtime(held, &runs)).await;
                let (_, accepted) = server.say("t", "go", json!({})).await;
                let run_id = accepted["run_id"].as_str().unwrap().to_owned();
                let record = parked(&server, &run_id, held).await;
                let ids = call_ids(&record);
                if by_message {
                    let (status, next) = server
                        .say("t", "something else", json!({"strategy": strategy}))
                        .await;
                    match strategy {
                        "interrupt" => {
                            assert_eq!(status, 202, "{case}: {next}");
                            let first = server.finished(&run_id).await;
                            assert_eq!(first["termination"]["type"], "cancelled", "{case}");
                            assert_eq!(
                                first["cancel_cause"]["type"], "interrupted",
                                "{case}: {first}"
                            );
                            assert_eq!(
                                first["report"]["pending_approvals"]
                                    .as_array()
                                    .unwrap()
                                    .len(),
                                held,
                                "{case}"
                            );
                            let second = server.finished(next["run_id"].as_str().unwrap()).await;
                            assert_eq!(second["response"], "answered the new input", "{case}");
                        }
                        "enqueue" => {
                            assert_eq!(
                                (status, next["status"].as_str()),
                                (202, Some("queued")),
                                "{case}: {next}"
                            );
                            for id in &ids {
                                let (s, b) = server
                                    .post(
                                        &format!("/v1/runs/{run_id}/approvals/{id}"),
                                        json!({"decision": "reject", "reason": "not now"}),
                                    )
                                    .await;
                                assert_eq!(s, 200, "{case}: {b}");
                            }
                            let first = server.finished(&run_id).await;
                            assert_eq!(first["termination"]["type"], "natural_end", "{case}");
                            let second = server.finished(next["run_id"].as_str().unwrap()).await;
                            assert_eq!(second["response"], "answered the new input", "{case}");
                        }
                        _ => {
                            assert_eq!(
                                (status, next["error"]["code"].as_str()),
                                (409, Some("thread_busy")),
                                "{case}"
                            );
                            assert_eq!(
                                parked(&server, &run_id, held).await["status"],
                                "awaiting_approval"
                            );
                            let (s, _) = server
                                .post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
                                .await;
                            assert_eq!(s, 200);
                            server.finished(&run_id).await;
                        }
                    }
                } else {
                    let (status, body) = server
                        .post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
                        .await;
                    assert_eq!((status, &body["cancelled"]), (200, &json!(true)), "{case}");
                    let first = server.finished(&run_id).await;
                    assert_eq!(first["termination"]["type"], "cancelled", "{case}");
                    let statuses: Vec<&str> = first["report"]["tool_calls"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|c| c["status"].as_str().unwrap())
                        .collect();
                    assert_eq!(statuses, vec!["not_started"; held], "{case}: {first}");
                    // The thread takes new input afterwards, whatever the strategy.
                    let (status, next) = server
                        .say("t", "again", json!({"strategy": strategy}))
                        .await;
                    assert_eq!(status, 202, "{case}: {next}");
                    server.finished(next["run_id"].as_str().unwrap()).await;
                }
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    1,
                    "{case}: only the free call ran"
                );
                let (_, history) = server.get("/v1/threads/t/messages").await;
                let history: Vec<Message> = serde_json::from_value(history).unwrap();
                if let Err(error) = openai_accepts(history.clone()).await {
                    panic!("{case}: the provider refuses the history: {error}\n{history:#?}");
                }
                server.stop().await;
            }
        }
    }
}

#[tokio::test]
async fn the_pairing_check_refuses_an_unanswered_call() {
    // The check above can fail: a history with a call left open is refused.
    let call = rein::contract::message::ToolCall::new("c1", "shell", json!({}));
    let history = vec![
        Message::user("go"),
        Message::assistant_with_tools("", vec![call]),
        Message::user("next"),
    ];
    let error = openai_accepts(history).await.unwrap_err();
    assert!(error.contains("tool_call_id"), "{error}");
}

#[tokio::test]
async fn an_escalation_is_answered_over_http_with_continue_and_a_message() {
    use rein::escalation::{EscalationAction, EscalationStep, Ladder};
    let asking = "I prepared the migration.\n\nShall I run it on production now?";
    let executor = ScriptedExecutor::new(vec![
        ScriptedResponse::text(asking),
        ScriptedResponse::text("Ran it: 12 rows updated."),
    ]);
    let ladder = Ladder::new(vec![EscalationStep::new(EscalationAction::Escalate, 1)]).unwrap();
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("a")
                .with_model_id("m")
                .with_stop_condition(rein::contract::lifecycle::StopConditionSpec::AwaitingUser {
                    auto_nudges: 1,
                })
                .with_escalation("awaiting_user", ladder),
        )
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(executor))
        .build()
        .unwrap();
    let server = Server::start_runtime(runtime).await;
    let (_, accepted) = server.say("t", "migrate", json!({})).await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let record = parked(&server, &run_id, 1).await;
    let pending = &record["pending_approvals"][0];
    assert_eq!(pending["kind"], "escalation", "{record}");
    assert_eq!(pending["tool"], "awaiting_user");
    let path = format!(
        "/v1/runs/{run_id}/approvals/{}",
        pending["call_id"].as_str().unwrap()
    );
    let (status, body) = server.post(&path, json!({"decision": "approve"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_decision")),
        "{body}"
    );
    let (status, body) = server
        .post(
            &path,
            json!({"decision": "continue", "message": "Yes, run it."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let record = server.finished(&run_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "Ran it: 12 rows updated.");
    assert_eq!(
        server.user_messages("t").await,
        vec!["migrate".to_owned(), "Yes, run it.".to_owned()]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_parked_run_holds_no_slot_yet_keeps_its_thread_busy_until_it_is_decided() {
    let runs = Arc::new(AtomicUsize::new(0));
    let runtime = runtime(2, &runs);
    let server = Server::start_runtime(runtime.clone()).await;
    let (_, accepted) = server.say("t", "check", json!({})).await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let record = parked(&server, &run_id, 2).await;
    // Parked: the run let go of its task and the thread's slot.
    for _ in 0..500 {
        if !runtime.is_thread_active("t") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        !runtime.is_thread_active("t"),
        "the parked run holds its slot"
    );
    assert!(runtime.pending_approvals(None).is_empty());
    // Yet the thread is busy with it: `reject` is refused, `enqueue` waits.
    let (status, body) = server
        .post(
            "/v1/threads/t/runs",
            json!({"strategy": "reject", "messages": [{"role": "user", "content": "now"}]}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("thread_busy")),
        "{body}"
    );
    let (_, queued) = server
        .say("t", "later", json!({"strategy": "enqueue"}))
        .await;
    let queued_id = queued["run_id"].as_str().unwrap().to_owned();
    assert_eq!(queued["status"], "queued", "{queued}");
    let (_, listed) = server.get("/v1/approvals?thread_id=t").await;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    for call in call_ids(&record) {
        let (status, body) = server
            .post(
                &format!("/v1/runs/{run_id}/approvals/{call}"),
                json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let record = server.finished(&run_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "each call ran once");
    let record = server.finished(&queued_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    server.stop().await;
}
