//! AG-UI with the official TypeScript client (`@ag-ui/client`'s
//! `HttpAgent`, run by node): a conversation over two runs that appends
//! only new messages, an abort that cancels the run, an unknown agent; and
//! sub-agents: a child's events between `SUBAGENT_STARTED` and
//! `SUBAGENT_FINISHED`, an erroring child, an abort and a server-side
//! cancel mid-tree, concurrent and nested children — each stream accepted
//! by the client's verifier.
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
  limited:
    kind: scripted
    responses: ["Done."]
    limits: { requests_per_minute: 60, window_ms: 1000 }
  planner:
    kind: scripted
    responses:
      - { tool_calls: [ { name: plan, arguments: { command: create, title: "Trip", steps: [ "book train", "book hotel" ] } } ] }
      - { tool_calls: [ { name: plan, arguments: { command: mark_step, step_index: 0, step_status: completed } }, { name: plan, arguments: { command: mark_step, step_index: 1, step_status: completed } } ] }
      - "Train and hotel are booked."
  looper:
    kind: scripted
    responses:
      - { tool_calls: [ { name: poll, arguments: { job: 7 } } ] }
  judge:
    kind: scripted
    responses:
      - '{"reasoning": "it polls job 7 again and again", "confidence": 0.96}'
  lab:
    kind: scripted
    responses:
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.5 } } } ], usage: { input: 100, output: 20 } }
      - { text: "Tried lr 0.1.", usage: { input: 100, output: 10 } }
      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.7 } } } ], usage: { input: 100, output: 20 } }
      - { text: "Tried lr 0.01.", usage: { input: 100, output: 10 } }
models:
  chat: { provider: chat, model: c }
  slow: { provider: slow, model: s }
  limited: { provider: limited, model: l }
  looper: { provider: looper, model: x }
  judge: { provider: judge, model: j }
  planner: { provider: planner, model: p }
  lab: { provider: lab, model: x }
agents:
  - { id: lab, model_id: lab, plugin_ids: [automation] }
  - { id: assistant, model_id: chat, plugin_ids: [terminate] }
  - { id: slow, model_id: slow }
  - { id: limited, model_id: limited }
  - { id: planner, model_id: planner, plugin_ids: [plan] }
  - id: looper
    model_id: looper
    stop_conditions: [ { type: llm_loop_check, model_id: judge, after_rounds: 2, interval: 1 } ]
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
async fn a_wait_for_the_provider_s_limits_reaches_the_official_client_as_a_custom_event() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/limited"), "limited").await;
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    let custom = |run: &str| -> Vec<Value> {
        assert_eq!(seen[run]["error"], Value::Null, "{seen}");
        seen[run]["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "CUSTOM")
            .cloned()
            .collect()
    };
    assert_eq!(custom("first"), Vec::<Value>::new());
    let waits = custom("second");
    assert_eq!(waits.len(), 1, "{seen}");
    assert_eq!(waits[0]["name"], "rate_limited");
    assert_eq!(waits[0]["value"]["provider"], "limited");
    assert!(waits[0]["value"]["wait_ms"].as_u64().is_some(), "{seen}");
    let events = seen["second"]["events"].as_array().unwrap();
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
}

#[tokio::test]
async fn a_model_check_reaches_the_official_client_as_a_custom_event_before_the_run_ends() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/looper"), "judged").await;
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    let events = seen["first"]["events"].as_array().unwrap();
    let checks: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "CUSTOM" && e["name"] == "model_check")
        .collect();
    assert_eq!(checks.len(), 1, "{seen}");
    let value = &checks[0]["value"];
    assert_eq!(value["code"], "llm_loop_check", "{seen}");
    assert_eq!(value["outcome"], "detected", "{seen}");
    assert_eq!(value["step"], 2, "{seen}");
    assert!(
        value["detail"].as_str().unwrap().contains("polls job 7"),
        "{seen}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{seen}");
    server.stop().await;
}

#[tokio::test]
async fn a_plan_reaches_the_official_client_as_its_state_a_snapshot_then_deltas() {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/planner"), "planned").await;
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    let events = seen["first"]["events"].as_array().unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| t.starts_with("STATE_"))
        .collect();
    assert_eq!(kinds, ["STATE_SNAPSHOT", "STATE_DELTA"], "{seen}");
    // The client applied them: its state is the finished plan.
    assert_eq!(seen["state"]["plan"]["title"], "Trip", "{seen}");
    assert_eq!(
        seen["state"]["plan"]["steps"],
        json!([
            {"title": "book train", "status": "completed"},
            {"title": "book hotel", "status": "completed"}
        ]),
        "{seen}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{seen}");
    assert_eq!(last["result"]["stop_code"], "plan_completed", "{seen}");
    server.stop().await;
}

#[tokio::test]
async fn an_auto_session_from_forwarded_props_is_one_ag_ui_run_with_progress_and_the_session_tokens()
 {
    let Some(modules) = client() else { return };
    let server = Server::start(AGUI_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/lab"), "auto").await;
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    let events = seen["first"]["events"].as_array().unwrap();
    let count = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(count("RUN_STARTED"), 1, "one AG-UI run: {seen}");
    assert_eq!(count("RUN_FINISHED"), 1, "{seen}");
    assert_eq!(
        count("TEXT_MESSAGE_START"),
        2,
        "both rounds' answers: {seen}"
    );
    let progress: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "CUSTOM" && e["name"] == "progress")
        .map(|e| &e["value"])
        .collect();
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
        ],
        "{seen}"
    );
    assert_eq!(progress[0]["tokens_used_session"], 230, "{seen}");
    assert_eq!(progress[2]["tokens_used_session"], 460, "{seen}");
    assert!(progress.iter().all(|p| p["max_tokens"] == 50000), "{seen}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{seen}");
    assert_eq!(last["runId"], "agui-auto-1", "{seen}");
    let result = &last["result"];
    assert_eq!(
        result["stop_reason"], "max experiments reached (2/2)",
        "{seen}"
    );
    assert_eq!(result["tokens_used_session"], 460, "{seen}");
    assert_eq!(result["max_tokens"], 50000, "{seen}");
    assert_eq!(result["rounds"], 2, "{seen}");
    // The forwarded policy became the thread's default.
    let (_, auto) = server.get("/v1/threads/agui-auto/auto").await;
    assert_eq!(auto["run_mode"], "auto", "{auto}");
    assert_eq!(auto["automation_policy"]["maxExperiments"], 2, "{auto}");
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

/// Agents for the sub-agent scenarios; the leads, which list sub-agents,
/// are added in code ([`tree`]).
const TREE_YAML: &str = r#"
providers:
  lead:
    kind: scripted
    chunk_delay_ms: 5
    responses:
      - { text: "Asking the researcher.", tool_calls: [ { name: researcher, arguments: { task: "find the report" } } ] }
      - "The researcher found it."
  research: { kind: scripted, chunk_delay_ms: 5, responses: ["Found the report in the archive."] }
  lead_err:
    kind: scripted
    responses:
      - { text: "Trying.", tool_calls: [ { name: broken, arguments: { task: "try" } } ] }
      - "It failed; going on without it."
  broken: { kind: scripted, responses: [ { error: "model exploded" } ] }
  lead_slow:
    kind: scripted
    responses:
      - { tool_calls: [ { name: talker, arguments: { task: "talk" } } ] }
      - "Done."
  talk: { kind: scripted, chunk_delay_ms: 150, responses: ["this answer takes a long long time to arrive"] }
  lead_tree:
    kind: scripted
    responses:
      - { text: "Two scouts.", tool_calls: [ { name: scout, arguments: { task: "north" } }, { name: scout, arguments: { task: "south" } } ] }
      - "Both scouts reported."
  scout:
    kind: scripted
    chunk_delay_ms: 10
    responses:
      - { text: "Filing first.", tool_calls: [ { name: clerk, arguments: { task: "file it" } } ] }
      - "A plain answer, streamed slowly enough to interleave."
      - "Filed and done."
  clerk: { kind: scripted, chunk_delay_ms: 5, responses: ["Filed."] }
models:
  lead: { provider: lead, model: l }
  research: { provider: research, model: r }
  lead_err: { provider: lead_err, model: l }
  broken: { provider: broken, model: b }
  lead_slow: { provider: lead_slow, model: l }
  talk: { provider: talk, model: t }
  lead_tree: { provider: lead_tree, model: l }
  scout: { provider: scout, model: s }
  clerk: { provider: clerk, model: c }
agents:
  - { id: researcher, model_id: research }
  - { id: broken, model_id: broken }
  - { id: talker, model_id: talk }
  - { id: clerk, model_id: clerk }
"#;

/// A server whose leads call sub-agents: `lead` → `researcher`, `lead_err`
/// → `broken` (its model fails), `lead_slow` → `talker` (streams slowly),
/// `lead_tree` → two `scout`s at once, one calling `clerk`.
async fn tree() -> Server {
    use rein::{AgentSpec, SubagentSpec};
    let deployment = rein_server::deployment::Deployment::from_yaml(TREE_YAML).unwrap();
    let lead = |id: &str, child: &str| {
        AgentSpec::new(id)
            .with_model_id(id)
            .with_subagent(SubagentSpec::new(child))
    };
    let runtime = rein_server::assemble::builder(&deployment)
        .unwrap()
        .with_agent_spec(lead("lead", "researcher"))
        .with_agent_spec(lead("lead_err", "broken"))
        .with_agent_spec(lead("lead_slow", "talker"))
        .with_agent_spec(lead("lead_tree", "scout"))
        .with_agent_spec(lead("scout", "clerk"))
        .build()
        .unwrap();
    Server::start_runtime(runtime).await
}

/// The sub-agent scenario's first run: the client accepted it (no error,
/// no warning), and its events.
fn accepted(seen: &Value) -> Vec<Value> {
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    seen["first"]["events"].as_array().unwrap().clone()
}

fn position(events: &[Value], what: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(what)
        .unwrap_or_else(|| panic!("not in {events:#?}"))
}

#[tokio::test]
async fn a_sub_agents_events_reach_the_official_client_between_subagent_started_and_finished() {
    let Some(modules) = client() else { return };
    let server = tree().await;
    let seen = node(&modules, &server.at("/v1/ag-ui/lead"), "subagent").await;
    let events = accepted(&seen);
    assert_eq!(events[0]["type"], "RUN_STARTED");
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    assert_eq!(
        events.iter().filter(|e| e["type"] == "RUN_STARTED").count(),
        1
    );
    let call = position(&events, |e| {
        e["type"] == "TOOL_CALL_START" && e["toolCallName"] == "researcher"
    });
    let call_id = events[call]["toolCallId"].as_str().unwrap().to_owned();
    assert_eq!(events[call].get("subagentRunId"), None);
    let started = position(&events, |e| e["type"] == "SUBAGENT_STARTED");
    let child = events[started]["subagentRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(events[started]["name"], "researcher");
    assert_eq!(events[started]["parentToolCallId"], call_id.as_str());
    assert_eq!(events[started].get("parentSubagentRunId"), None);
    let finished = position(&events, |e| e["type"] == "SUBAGENT_FINISHED");
    assert_eq!(events[finished]["subagentRunId"], child.as_str());
    assert_eq!(
        events[finished]["result"]["response"],
        "Found the report in the archive."
    );
    assert_eq!(
        events[finished]["result"]["termination"]["type"],
        "natural_end"
    );
    let result = position(&events, |e| {
        e["type"] == "TOOL_CALL_RESULT" && e["toolCallId"] == call_id.as_str()
    });
    assert!(call < started && started < finished && finished < result);
    // Between its start and its end: the child's own step and text, each
    // carrying its subagentRunId; nothing of the root's.
    let inner = &events[started + 1..finished];
    for kind in [
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
    ] {
        assert!(
            inner.iter().any(|e| e["type"] == kind),
            "{kind}: {inner:#?}"
        );
    }
    assert!(
        inner.iter().all(|e| e["subagentRunId"] == child.as_str()),
        "{inner:#?}"
    );
    // The client holds the child's answer as a message of the child's.
    let messages = seen["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "assistant" && m["subagentRunId"] == child.as_str()),
        "{messages:?}"
    );
    // The second request sent the child's message back: the root's thread
    // got only the new user message, and never the child's answer.
    assert_eq!(seen["second"]["error"], Value::Null, "{seen}");
    let users = server.user_messages("agui-subagent").await;
    assert_eq!(users, vec!["look into it", "thanks"]);
    let (_, history) = server.get("/v1/threads/agui-subagent/messages").await;
    assert!(
        !history
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"] == "Found the report in the archive."),
        "{history}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_erroring_sub_agent_is_a_subagent_error_and_the_root_finishes() {
    let Some(modules) = client() else { return };
    let server = tree().await;
    let seen = node(&modules, &server.at("/v1/ag-ui/lead_err"), "subagent-error").await;
    let events = accepted(&seen);
    let error = position(&events, |e| e["type"] == "SUBAGENT_ERROR");
    assert_eq!(events[error]["code"], "error");
    assert!(
        events[error]["message"]
            .as_str()
            .unwrap()
            .contains("model exploded"),
        "{:?}",
        events[error]
    );
    assert!(!events.iter().any(|e| e["type"] == "SUBAGENT_FINISHED"));
    // The root goes on: the call's result, its answer, RUN_FINISHED.
    let result = position(&events, |e| e["type"] == "TOOL_CALL_RESULT");
    let answer = events
        .iter()
        .rposition(|e| e["type"] == "TEXT_MESSAGE_START" && e.get("subagentRunId").is_none())
        .unwrap();
    assert!(error < result && result < answer);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED");
    assert_eq!(last["result"]["termination"]["type"], "natural_end");
    server.stop().await;
}

#[tokio::test]
async fn aborting_in_the_client_while_a_sub_agent_streams_cancels_the_tree() {
    let Some(modules) = client() else { return };
    let server = tree().await;
    let seen = node(
        &modules,
        &server.at("/v1/ag-ui/lead_slow"),
        "subagent-abort",
    )
    .await;
    let events = accepted(&seen);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "TEXT_MESSAGE_CONTENT" && e.get("subagentRunId").is_some()),
        "{events:#?}"
    );
    let record = server.finished("agui-subagent-abort-run").await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["cancel_cause"], json!({"type": "requested"}));
    server.stop().await;
}

#[tokio::test]
async fn a_root_cancelled_mid_tree_ends_its_sub_agent_before_run_finished() {
    let Some(modules) = client() else { return };
    let server = tree().await;
    let seen = node(
        &modules,
        &server.at("/v1/ag-ui/lead_slow"),
        "subagent-cancel",
    )
    .await;
    let events = accepted(&seen);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:#?}");
    assert_eq!(last["outcome"], json!({"type": "cancelled"}));
    let finished = position(&events, |e| e["type"] == "SUBAGENT_FINISHED");
    assert_eq!(
        events[finished]["result"]["termination"]["type"],
        "cancelled"
    );
    assert!(
        events[finished]["result"]["response"]
            .as_str()
            .unwrap()
            .starts_with("this"),
        "{:?}",
        events[finished]
    );
    let record = server.finished("agui-subagent-cancel-run").await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    server.stop().await;
}

#[tokio::test]
async fn concurrent_sub_agents_and_a_nested_one_pass_the_client_verifier() {
    let Some(modules) = client() else { return };
    let server = tree().await;
    let seen = node(&modules, &server.at("/v1/ag-ui/lead_tree"), "subagent-tree").await;
    let events = accepted(&seen);
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "SUBAGENT_STARTED")
        .collect();
    assert_eq!(starts.len(), 3, "{events:#?}");
    let scouts: Vec<&str> = starts
        .iter()
        .filter(|e| e["name"] == "scout")
        .map(|e| e["subagentRunId"].as_str().unwrap())
        .collect();
    assert_eq!(scouts.len(), 2);
    let clerk = starts.iter().find(|e| e["name"] == "clerk").unwrap();
    let filer = clerk["parentSubagentRunId"].as_str().unwrap();
    assert!(scouts.contains(&filer), "{clerk}");
    // The clerk's parent tool call is the filing scout's, under its id.
    assert!(
        events.iter().any(|e| e["type"] == "TOOL_CALL_START"
            && e["subagentRunId"] == filer
            && e["toolCallId"] == clerk["parentToolCallId"]),
        "{events:#?}"
    );
    // The scouts ran at once: both started before either finished, and
    // their text interleaves.
    let first_end = position(&events, |e| {
        matches!(
            e["type"].as_str(),
            Some("SUBAGENT_FINISHED" | "SUBAGENT_ERROR")
        )
    });
    let second_start = position(&events, |e| {
        e["type"] == "SUBAGENT_STARTED" && e["subagentRunId"] == scouts[1]
    });
    assert!(second_start < first_end, "{events:#?}");
    let ends = events
        .iter()
        .filter(|e| e["type"] == "SUBAGENT_FINISHED")
        .count();
    assert_eq!(ends, 3, "{events:#?}");
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    server.stop().await;
}

/// Agents that park: `ops` asks before `terminate`, `asker` asks the user
/// a question, `lead` hands a task to `worker`, which asks before
/// `terminate`.
const APPROVAL_YAML: &str = r#"
providers:
  ops:
    kind: scripted
    chunk_delay_ms: 5
    responses:
      - { text: "Finishing.", tool_calls: [ { name: terminate, arguments: { status: success, message: done } } ] }
  asker:
    kind: scripted
    responses:
      - { tool_calls: [ { name: ask_user, arguments: { question: "Which region?", options: [eu, us] } } ] }
      - "Deploying to the chosen region."
  worker:
    kind: scripted
    responses:
      - { text: "Wrapping up.", tool_calls: [ { name: terminate, arguments: { status: success, message: wrapped } } ] }
  lead:
    kind: scripted
    responses:
      - { text: "Delegating.", tool_calls: [ { name: worker, arguments: { task: "finish up" } } ] }
      - "The worker finished."
  careful:
    kind: scripted
    responses:
      - "I prepared the migration.\n\nShall I run it on production now?"
      - "Ran it: 12 rows updated."
models:
  ops: { provider: ops, model: o }
  asker: { provider: asker, model: a }
  worker: { provider: worker, model: w }
  lead: { provider: lead, model: l }
  careful: { provider: careful, model: c }
agents:
  - { id: ops, model_id: ops, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }
  - { id: asker, model_id: asker, plugin_ids: [ask_user] }
  - { id: worker, model_id: worker, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }
  - { id: lead, model_id: lead, subagents: [ { agent: worker } ] }
  - id: careful
    model_id: careful
    stop_conditions: [ { type: awaiting_user } ]
    escalation: { awaiting_user: [escalate] }
"#;

/// The approval scenario's two runs, accepted by the client (no error,
/// no warning): the first's and the second's events.
fn two_runs(seen: &Value) -> (Vec<Value>, Vec<Value>) {
    assert_eq!(seen["first"]["error"], Value::Null, "{seen}");
    assert_eq!(seen["second"]["error"], Value::Null, "{seen}");
    assert_eq!(seen["warnings"], json!([]), "{seen}");
    (
        seen["first"]["events"].as_array().unwrap().clone(),
        seen["second"]["events"].as_array().unwrap().clone(),
    )
}

#[tokio::test]
async fn a_parked_run_ends_the_stream_on_an_interrupt_and_a_resume_carries_it_to_its_end() {
    let Some(modules) = client() else { return };
    let server = Server::start(APPROVAL_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/ops"), "approval").await;
    let (first, second) = two_runs(&seen);
    let finished = first.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED", "{first:#?}");
    let interrupts = finished["outcome"]["interrupts"].as_array().unwrap();
    assert_eq!(finished["outcome"]["type"], "interrupt");
    assert_eq!(interrupts.len(), 1);
    assert_eq!(interrupts[0]["reason"], "tool_approval");
    let call = interrupts[0]["toolCallId"].as_str().unwrap();
    // The call was announced before the interrupt, and not run.
    assert!(
        first
            .iter()
            .any(|e| e["type"] == "TOOL_CALL_START" && e["toolCallId"] == call)
    );
    assert!(!first.iter().any(|e| e["type"] == "TOOL_CALL_RESULT"));
    assert_eq!(seen["pending"].as_array().unwrap().len(), 1, "{seen}");
    // The resume's stream carries the same Rein run to its end.
    assert_eq!(second[0]["type"], "RUN_STARTED");
    assert!(
        second
            .iter()
            .any(|e| e["type"] == "TOOL_CALL_RESULT" && e["toolCallId"] == call)
    );
    let end = second.last().unwrap();
    assert_eq!(end["type"], "RUN_FINISHED", "{second:#?}");
    assert_eq!(end["result"]["stop_code"], "terminate", "{end}");
    assert_eq!(seen["after"], 0);
    // One Rein run, decided once, its tool run once.
    let (_, record) = server.get("/v1/runs/agui-approval-1").await;
    assert_eq!(record["status"], "finished", "{record}");
    let events = server.sse("/v1/runs/agui-approval-1/events", None).await;
    let starts = events
        .iter()
        .filter(|(_, k, _)| k == "tool_call_started")
        .count();
    assert_eq!(starts, 1);
    let (status, _) = server.get("/v1/runs/agui-approval-2").await;
    assert_eq!(status, 404, "the resume is not a new Rein run");
    server.stop().await;
}

#[tokio::test]
async fn a_cancelled_interrupt_rejects_the_call_and_the_run_goes_on() {
    let Some(modules) = client() else { return };
    let server = Server::start(APPROVAL_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/ops"), "approval-reject").await;
    let (_, second) = two_runs(&seen);
    let result = second
        .iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .unwrap();
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .starts_with("not run: rejected"),
        "{result}"
    );
    assert_eq!(second.last().unwrap()["type"], "RUN_FINISHED");
    server.stop().await;
}

#[tokio::test]
async fn an_ask_user_question_is_an_input_required_interrupt_answered_by_the_resume() {
    let Some(modules) = client() else { return };
    let server = Server::start(APPROVAL_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/asker"), "question").await;
    let (first, second) = two_runs(&seen);
    let interrupt = &first.last().unwrap()["outcome"]["interrupts"][0];
    assert_eq!(interrupt["reason"], "input_required", "{interrupt}");
    assert_eq!(interrupt["message"], "Which region?");
    assert_eq!(
        interrupt["responseSchema"]["properties"]["result"]["enum"],
        json!(["eu", "us"])
    );
    let result = second
        .iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .unwrap();
    assert_eq!(result["content"], "eu");
    assert!(second.iter().any(|e| e["type"] == "TEXT_MESSAGE_CONTENT"
        && e["delta"].as_str().unwrap_or("").contains("Deploying")));
    server.stop().await;
}

#[tokio::test]
async fn an_approval_inside_a_sub_agent_surfaces_at_the_root_and_resumes_the_child() {
    let Some(modules) = client() else { return };
    let server = Server::start(APPROVAL_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/lead"), "approval-subagent").await;
    let (first, second) = two_runs(&seen);
    let suspended = first
        .iter()
        .find(|e| e["type"] == "SUBAGENT_FINISHED")
        .unwrap_or_else(|| panic!("{first:#?}"));
    assert_eq!(suspended["outcome"]["type"], "suspended", "{suspended}");
    let child = suspended["subagentRunId"].as_str().unwrap();
    let interrupt = &first.last().unwrap()["outcome"]["interrupts"][0];
    assert_eq!(interrupt["subagentRunId"], child, "{interrupt}");
    assert_eq!(
        suspended["outcome"]["interruptIds"],
        json!([interrupt["id"]])
    );
    // The resume restarts the child's segment, runs its call, ends both.
    assert!(
        second
            .iter()
            .any(|e| e["type"] == "SUBAGENT_STARTED" && e["subagentRunId"] == child)
    );
    let done = second
        .iter()
        .find(|e| e["type"] == "SUBAGENT_FINISHED")
        .unwrap_or_else(|| panic!("{second:#?}"));
    assert_eq!(done["result"]["stop_code"], "terminate", "{done}");
    let end = second.last().unwrap();
    assert_eq!(end["type"], "RUN_FINISHED");
    assert_eq!(end["result"]["termination"]["type"], "natural_end", "{end}");
    server.stop().await;
}

#[tokio::test]
async fn an_escalation_is_an_interrupt_the_official_client_resumes_with_continue() {
    let Some(modules) = client() else { return };
    let server = Server::start(APPROVAL_YAML).await;
    let seen = node(&modules, &server.at("/v1/ag-ui/careful"), "escalation").await;
    let (first, second) = two_runs(&seen);
    let interrupt = &first.last().unwrap()["outcome"]["interrupts"][0];
    assert_eq!(interrupt["reason"], "escalation", "{interrupt}");
    assert_eq!(
        interrupt.get("toolCallId"),
        None,
        "an escalation holds no tool call"
    );
    assert!(!first.iter().any(|e| e["type"] == "TOOL_CALL_START"));
    let text: String = second
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert!(text.contains("12 rows updated"), "{second:#?}");
    let end = second.last().unwrap();
    assert_eq!(end["type"], "RUN_FINISHED", "{second:#?}");
    assert_eq!(end["result"]["termination"]["type"], "natural_end", "{end}");
    let (_, history) = server.get("/v1/threads/agui-escalation/messages").await;
    assert!(history.to_string().contains("Yes, run it."), "{history}");
    server.stop().await;
}
