//! In distributed mode the database is the only truth: every process
//! answers every read the same way, every path that finishes a run ends
//! its stream with `run_finished`, AG-UI's message ids are kept with the
//! thread, and `rein run` holds its thread like a serving process. Real
//! `rein serve` processes on one database (`REIN_DATABASE_URL`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod cluster_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster_common::{DATABASE, Node, assert_valid, config, database, thread};
use serde_json::{Value, json};

/// A run's SSE stream read to its end: the events' types in order.
async fn stream_types(
    node: &Node,
    run_id: &str,
    after: Option<u64>,
    within: Duration,
) -> Vec<String> {
    node.events(run_id, after, within)
        .await
        .into_iter()
        .map(|(_, kind, _)| kind)
        .collect()
}

/// The JSON events of an AG-UI run's stream.
async fn agui(node: &Node, agent: &str, body: Value) -> Vec<Value> {
    let response = node
        .client
        .post(format!("{}/v1/ag-ui/{agent}", node.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .unwrap()
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn history(node: &Node, t: &str) -> Vec<Value> {
    let (status, history) = node.get(&format!("/v1/threads/{t}/messages")).await;
    assert_eq!(status, 200, "{history}");
    history.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_reads_finished_on_the_first_ask_of_a_process_that_never_followed_it() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let a = Node::start(&config);
    let t = thread("truth-read");
    for i in 0..5 {
        let (status, record) = a
            .post(
                &format!("/v1/threads/{t}/runs?wait=true"),
                json!({"agent_id": "quick", "messages": [{"role": "user", "content": format!("q{i}")}]}),
            )
            .await;
        assert_eq!(status, 200, "{record}");
        // A process started after the run finished: nothing of it cached.
        let b = Node::start(&config);
        let run_id = record["run_id"].as_str().unwrap();
        let (status, read) = b.get(&format!("/v1/runs/{run_id}")).await;
        assert_eq!(status, 200, "{read}");
        assert_eq!(read["status"], "finished", "try {i}: {read}");
        assert_eq!(read, record, "try {i}: the same record from both processes");
        let types = stream_types(&b, run_id, None, Duration::from_secs(5)).await;
        assert_eq!(types.last().map(String::as_str), Some("run_finished"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_cancelled_on_one_process_ends_its_stream_with_run_finished_everywhere() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let (a, b, c) = (
        Node::start(&config),
        Node::start(&config),
        Node::start(&config),
    );
    for i in 0..6 {
        let t = thread("truth-queued");
        let busy = a.submit(&t, "slow", "talk", "interrupt").await;
        let queued = b.submit(&t, "quick", "later", "enqueue").await;
        let run_id = queued["run_id"].as_str().unwrap();
        // The cancelling process already follows the run: a reader has its
        // record and an open stream there.
        let (_, record) = b.get(&format!("/v1/runs/{run_id}")).await;
        assert_eq!(record["status"], "queued", "{record}");
        let open = b.events(run_id, None, Duration::from_secs(5));
        tokio::pin!(open);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut open)
                .await
                .is_err(),
            "the stream of a queued run stays open"
        );
        assert_eq!(
            b.post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
                .await,
            (200, json!({"cancelled": true})),
            "try {i}"
        );
        let streamed: Vec<String> = open.await.into_iter().map(|(_, kind, _)| kind).collect();
        assert_eq!(streamed, ["run_finished"], "try {i}: the open stream");
        for node in [&b, &c, &a] {
            let types = stream_types(node, run_id, None, Duration::from_secs(5)).await;
            assert_eq!(types, ["run_finished"], "try {i}");
            // Resuming after the last event is refused, never a silent
            // close a client would reconnect after for ever.
            let resumed = node
                .client
                .get(format!("{}/v1/runs/{run_id}/events", node.url))
                .header("last-event-id", "1")
                .send()
                .await
                .unwrap();
            assert_eq!(resumed.status().as_u16(), 400, "try {i}");
            let error: Value = resumed.json().await.unwrap();
            assert_eq!(error["error"]["code"], "invalid_last_event_id", "{error}");
            let record = node.finished(run_id, Duration::from_secs(1)).await;
            assert_eq!(record["termination"]["type"], "cancelled", "{record}");
        }
        a.post(
            &format!("/v1/runs/{}/cancel", busy["run_id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_taken_over_from_a_killed_process_ends_its_stream_with_run_finished_on_the_survivor()
{
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(1);
    let a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("truth-lost");
    let run = a.submit(&t, "slow", "talk", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    // B follows the run, then its owner dies.
    let (_, record) = b.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(record["status"], "running", "{record}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal("-KILL");
    let types = stream_types(&b, &run_id, None, Duration::from_secs(10)).await;
    assert_eq!(types.last().map(String::as_str), Some("run_finished"));
    let record = b.finished(&run_id, Duration::from_secs(1)).await;
    assert_eq!(
        record["termination"],
        json!({"type": "error", "value": rein_server::service::LOST_RUN}),
    );
    assert_valid(&Value::Array(history(&b, &t).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_conversations_resent_to_other_processes_append_only_their_new_messages() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let (a, b) = (Node::start(&config), Node::start(&config));
    let t = thread("truth-agui");
    let q1 = json!({"id": "u1", "role": "user", "content": "q1"});
    let events = agui(
        &a,
        "quick",
        json!({"threadId": t, "runId": format!("{t}-r1"), "messages": [q1]}),
    )
    .await;
    let answer = events
        .iter()
        .find(|e| e["type"] == "TEXT_MESSAGE_START")
        .unwrap()["messageId"]
        .clone();
    // The client sends the whole conversation back, to another process.
    let conversation = json!([q1, {"id": answer, "role": "assistant", "content": "Done."},
                              {"id": "u2", "role": "user", "content": "q2"}]);
    agui(
        &b,
        "quick",
        json!({"threadId": t, "runId": format!("{t}-r2"), "messages": conversation}),
    )
    .await;
    let roles: Vec<(String, String)> = history(&a, &t)
        .await
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("user", "q1"),
        ("assistant", "Done."),
        ("user", "q2"),
        ("assistant", "Done."),
    ];
    assert_eq!(roles, expected.map(|(r, c)| (r.to_owned(), c.to_owned())),);
    // Eight resends of one new message at once, over both processes.
    let q3 = json!({"id": "u3", "role": "user", "content": "q3"});
    let resends = (0..8).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        let body = json!({"threadId": t, "runId": format!("{t}-r3-{i}"), "messages": [q3]});
        agui(node, "quick", body)
    });
    futures::future::join_all(resends).await;
    let copies = history(&b, &t)
        .await
        .iter()
        .filter(|m| m["content"] == "q3")
        .count();
    assert_eq!(copies, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rein_run_holds_its_thread_against_serving_processes_past_the_lease() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(1);
    let a = Node::start(&config);
    let t = thread("truth-cli");
    let cli = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["run", "--config"])
        .arg(&config)
        .args(["--agent", "slow", "--thread", &t, "talk"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past the one-second lease, while the CLI's run streams (4 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, body) = a
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"agent_id": "quick", "strategy": "reject",
                   "messages": [{"role": "user", "content": "me too"}]}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (409, json!("thread_busy")),
        "{body}"
    );
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || cli.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("w40"), "the whole answer streamed: {text}");
    let history = history(&a, &t).await;
    assert_eq!(history.len(), 2, "{history:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_refused_as_client_errors_and_nul_text_is_stored_exactly() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let a = Node::start(&config);
    let long = "x".repeat(3000);
    let t = thread("truth-input");
    for (path, body, field) in [
        (
            format!("/v1/threads/{long}/runs"),
            json!({"agent_id": "quick", "messages": [{"role": "user", "content": "hi"}]}),
            "thread_id",
        ),
        (
            "/v1/threads/a%00b/runs".to_owned(),
            json!({"agent_id": "quick", "messages": [{"role": "user", "content": "hi"}]}),
            "thread_id",
        ),
        (
            format!("/v1/threads/{t}/runs"),
            json!({"agent_id": "quick", "idempotency_key": long, "messages": [{"role": "user", "content": "hi"}]}),
            "idempotency_key",
        ),
    ] {
        let (status, error) = a.post(&path, body).await;
        assert_eq!(status, 422, "{error}");
        assert_eq!(error["error"]["code"], "invalid_field", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(field),
            "{error}"
        );
    }
    // A repeated idempotency key with other messages, on another process.
    let b = Node::start(&config);
    let k = thread("truth-key");
    let body = |text: &str| {
        json!({"agent_id": "quick", "idempotency_key": "pay",
               "messages": [{"role": "user", "content": text}]})
    };
    let (status, first) = a
        .post(&format!("/v1/threads/{k}/runs"), body("pay 10"))
        .await;
    assert_eq!(status, 202, "{first}");
    let (status, error) = b
        .post(&format!("/v1/threads/{k}/runs"), body("pay 1000"))
        .await;
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (422, json!("idempotency_key_reused")),
        "{error}"
    );
    let (status, again) = b
        .post(&format!("/v1/threads/{k}/runs"), body("pay 10"))
        .await;
    assert_eq!((status, &again["run_id"]), (200, &first["run_id"]));
    let text = "binary\u{0}text \u{E000} end";
    let (status, record) = a
        .post(
            &format!("/v1/threads/{t}/runs?wait=true"),
            json!({"agent_id": "quick", "messages": [{"role": "user", "content": text}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let history = history(&a, &t).await;
    assert_eq!(history[0]["content"], text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_cancel_and_a_shutdown_are_confirmed_by_every_process() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let (a, b) = (Node::start(&config), Node::start(&config));
    // A thread cancelled through a process that does not run it.
    let t = thread("truth-cancel");
    let run = a.submit(&t, "slow", "talk", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        b.post(&format!("/v1/threads/{t}/cancel"), json!({})).await,
        (200, json!({"cancelled": true, "released": true}))
    );
    let (_, record) = b.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(record["status"], "finished", "{record}");
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    // A run whose process shuts down (SIGTERM) reads finished elsewhere.
    let t = thread("truth-shutdown");
    let run = a.submit(&t, "slow", "talk", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal("-TERM");
    let record = b.finished(run_id, Duration::from_secs(10)).await;
    assert_eq!(record["cancel_cause"]["type"], "shutdown", "{record}");
    let types = stream_types(&b, run_id, None, Duration::from_secs(5)).await;
    assert_eq!(types.last().map(String::as_str), Some("run_finished"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_open_when_its_process_is_killed_stays_in_the_history_answered_as_may_have_run()
{
    let Some(_) = database() else { return };
    let Ok(entry) = std::env::var("REIN_MCP_EVERYTHING") else {
        eprintln!("skipped: REIN_MCP_EVERYTHING is not set (.ci/run sets it)");
        return;
    };
    let _shared = DATABASE.read().await;
    let yaml = format!(
        r#"
providers:
  offline:
    kind: scripted
    responses:
      - {{ text: "Starting it.", tool_calls: [ {{ name: everything__trigger-long-running-operation, arguments: {{ duration: 60, steps: 60 }} }} ] }}
      - "Done."
models:
  demo: {{ provider: offline, model: script }}
mcp_servers:
  everything: {{ command: node, args: ["{entry}", "stdio"] }}
agents:
  - {{ id: assistant, model_id: demo, tools: [everything__trigger-long-running-operation] }}
store: {{ postgres: {{ url_env: REIN_DATABASE_URL }} }}
server: {{ lease_seconds: 1 }}
"#
    );
    let config = std::env::temp_dir().join(format!("rein-truth-mcp-{}.yaml", std::process::id()));
    std::fs::write(&config, yaml).unwrap();
    let (a, b) = (Node::start(&config), Node::start(&config));
    let t = thread("truth-open-call");
    let run = a
        .submit(&t, "assistant", "run the long operation", "interrupt")
        .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    // Wait until the run runs; its call (60 s) starts at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, record) = b.get(&format!("/v1/runs/{run_id}")).await;
        if record["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "the run did not start: {record}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    a.signal("-KILL");
    let record = b.finished(&run_id, Duration::from_secs(10)).await;
    assert_eq!(
        record["termination"]["value"],
        rein_server::service::LOST_RUN,
        "{record}"
    );
    let history = history(&b, &t).await;
    assert_valid(&Value::Array(history.clone()));
    let call = history
        .iter()
        .find(|m| m["tool_calls"].is_array())
        .unwrap_or_else(|| panic!("the round's calls are in the history: {history:?}"));
    assert_eq!(call["content"], "Starting it.");
    let result = history
        .iter()
        .find(|m| m["tool_call_id"] == call["tool_calls"][0]["id"])
        .unwrap();
    assert_eq!(result["tool_status"], "may_have_completed", "{result}");
    let _ = std::fs::remove_file(&config);
}

/// A deployment whose `lead` hands a task to `helper` (whose answer
/// streams a word per `helper_delay_ms`), on the shared database.
fn tree_config(name: &str, helper_delay_ms: u64, lease_seconds: u64) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "rein-cluster-tree-{name}-{}.yaml",
        std::process::id()
    ));
    let words = (1..=60)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    std::fs::write(
        &path,
        format!(
            r#"
providers:
  lead:
    kind: scripted
    responses:
      - {{ tool_calls: [ {{ name: helper, arguments: {{ task: "count to three" }} }} ] }}
      - "The helper counted."
  helper: {{ kind: scripted, chunk_delay_ms: {helper_delay_ms}, responses: ["{words}"] }}
models:
  lead: {{ provider: lead, model: x }}
  helper: {{ provider: helper, model: x }}
agents:
  - {{ id: lead, model_id: lead, subagents: [ {{ agent: helper }} ] }}
  - {{ id: helper, model_id: helper }}
store: {{ postgres: {{ url_env: REIN_DATABASE_URL }} }}
server: {{ lease_seconds: {lease_seconds} }}
"#
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_tree_runs_in_distributed_mode_its_child_holding_a_thread_of_its_own() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let path = tree_config("runs", 0, 3);
    let a = Node::start(&path);
    let t = thread("tree");
    let (status, record) = a
        .post(
            &format!("/v1/threads/{t}/runs?wait=true"),
            json!({"agent_id": "lead", "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "The helper counted.");
    let child_id = record["children"][0].as_str().unwrap().to_owned();
    // Read from another process: the records, the parent's history with
    // the child's result, and the child's thread (written under its own
    // lease) with its run.
    let b = Node::start(&path);
    let (_, read) = b
        .get(&format!("/v1/runs/{}", record["run_id"].as_str().unwrap()))
        .await;
    assert_eq!(read["children"], record["children"], "{read}");
    let child = b.finished(&child_id, Duration::from_secs(5)).await;
    assert_eq!(child["parent_run_id"], record["run_id"], "{child}");
    assert_eq!(child["termination"]["type"], "natural_end", "{child}");
    let types = stream_types(&b, &child_id, None, Duration::from_secs(5)).await;
    assert_eq!(
        types.first().map(String::as_str),
        Some("run_started"),
        "{types:?}"
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("run_finished"),
        "{types:?}"
    );
    let parent = history(&b, &t).await;
    let result = parent
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("{parent:?}"));
    let json: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!(json["status"], "natural_end", "{json}");
    let call = result["tool_call_id"].as_str().unwrap();
    assert!(!call.is_empty());
    let child_history = history(&b, &format!("{t}:{child_id}")).await;
    assert_eq!(
        child_history[0]["content"], "count to three",
        "{child_history:?}"
    );
    assert_eq!(child_history.len(), 2, "{child_history:?}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_mid_tree_the_survivor_ends_the_root_and_its_child_as_lost_and_neither_runs_twice()
 {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let path = tree_config("kill", 100, 1);
    let a = Node::start(&path);
    let b = Node::start(&path);
    let t = thread("tree-kill");
    let run = a.submit(&t, "lead", "go", "interrupt").await;
    let root = run["run_id"].as_str().unwrap().to_owned();
    // Wait until the child streams (on A), then kill A.
    let child = loop {
        let (_, record) = a.get(&format!("/v1/runs/{root}")).await;
        if let Some(child) = record["children"][0].as_str() {
            let (_, child_record) = a.get(&format!("/v1/runs/{child}")).await;
            if child_record["status"] == "running" {
                break child.to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.signal("-KILL");
    let lost = json!({"type": "error", "value": rein_server::service::LOST_RUN});
    for run_id in [&root, &child] {
        let record = b.finished(run_id, Duration::from_secs(20)).await;
        assert_eq!(record["termination"], lost, "{run_id}: {record}");
        let events = b.events(run_id, None, Duration::from_secs(5)).await;
        let own_starts = events
            .iter()
            .filter(|(_, kind, data)| {
                let data: Value = serde_json::from_str(data).unwrap();
                kind == "run_started" && data["run_id"] == **run_id
            })
            .count();
        assert_eq!(own_starts, 1, "{run_id} ran once: {events:?}");
        assert_eq!(
            events.last().map(|(_, kind, _)| kind.as_str()),
            Some("run_finished")
        );
    }
    // Nothing of the tree is left running, and the root's thread is whole.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for run_id in [&root, &child] {
        let (_, record) = b.get(&format!("/v1/runs/{run_id}")).await;
        assert_eq!(record["status"], "finished", "{record}");
    }
    assert_valid(&Value::Array(history(&b, &t).await));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cancelled_from_another_process_ends_alone_and_its_parent_goes_on() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let path = tree_config("cancel", 100, 3);
    let a = Node::start(&path);
    let b = Node::start(&path);
    let t = thread("tree-cancel");
    let run = a.submit(&t, "lead", "go", "interrupt").await;
    let root = run["run_id"].as_str().unwrap().to_owned();
    let child = format!("{root}.1");
    // The child is a row of the database once it runs: B can see it.
    let start = Instant::now();
    loop {
        let (status, record) = b.get(&format!("/v1/runs/{child}")).await;
        if status == 200 && record["status"] == "running" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, answer) = b.post(&format!("/v1/runs/{child}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let record = b.finished(&child, Duration::from_secs(10)).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    let record = b.finished(&root, Duration::from_secs(10)).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "The helper counted.");
    let _ = std::fs::remove_file(&path);
}

/// A deployment whose `ops` asks before `terminate` (on the shared
/// database, leases of `lease_seconds`).
fn approval_config(name: &str, lease_seconds: u64) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "rein-cluster-approval-{name}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        format!(
            r#"
providers:
  ops:
    kind: scripted
    responses:
      - {{ text: "Finishing.", tool_calls: [ {{ name: terminate, arguments: {{ status: success, message: done }} }} ] }}
models:
  ops: {{ provider: ops, model: x }}
agents:
  - {{ id: ops, model_id: ops, plugin_ids: [terminate], approvals: [ {{ tool: terminate, action: ask }} ] }}
store: {{ postgres: {{ url_env: REIN_DATABASE_URL }} }}
server: {{ lease_seconds: {lease_seconds} }}
"#
        ),
    )
    .unwrap();
    path
}

/// Polls `node` until the run waits on a call; returns the call's id.
async fn parked_call(node: &Node, run_id: &str) -> String {
    for _ in 0..400 {
        let (_, record) = node.get(&format!("/v1/runs/{run_id}")).await;
        if record["status"] == "awaiting_approval" {
            return record["pending_approvals"][0]["call_id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("run {run_id} never parked");
}

fn started_calls(events: &[(u64, String, String)]) -> usize {
    events
        .iter()
        .filter(|(_, kind, _)| kind == "tool_call_started")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_taken_on_another_process_resumes_the_run_where_it_is_parked() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let path = approval_config("notify", 3);
    let a = Node::start(&path);
    let b = Node::start(&path);
    let t = thread("approve-elsewhere");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let call = parked_call(&a, &run_id).await;
    // B lists it and decides it; A runs it. A reports the park from its
    // own events, a moment before its `run_parked` event is stored, which
    // is what B reads: B is asked until the park is there.
    let mut listed = json!([]);
    for _ in 0..200 {
        listed = b.get(&format!("/v1/approvals?thread_id={t}")).await.1;
        if listed[0]["call_id"] != serde_json::Value::Null {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(listed[0]["call_id"], call.as_str(), "{listed}");
    let path_b = format!("/v1/runs/{run_id}/approvals/{call}");
    let (status, body) = b.post(&path_b, json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{body}");
    let record = b.finished(&run_id, Duration::from_secs(10)).await;
    assert_eq!(
        record["termination"]["value"]["code"], "terminate",
        "{record}"
    );
    let (status, _) = a.post(&path_b, json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "the same decision again, on another process");
    let (status, body) = a
        .post(&path_b, json!({"decision": "reject", "reason": "late"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("already_decided"))
    );
    let events = b.events(&run_id, None, Duration::from_secs(5)).await;
    assert_eq!(started_calls(&events), 1, "{events:?}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_parked_on_a_process_killed_with_sigkill_is_decided_on_another_and_its_call_runs_once()
 {
    let Some(_) = database() else { return };
    // Alone: a process of another test (whose deployment has no `ops`)
    // could take the thread over and, unable to carry the run on, end it.
    let _alone = DATABASE.write().await;
    let path = approval_config("kill", 1);
    let a = Node::start(&path);
    let t = thread("approve-kill");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let call = parked_call(&a, &run_id).await;
    a.signal("-KILL");
    let b = Node::start(&path);
    // B reads the parked run from the database and decides it.
    let call_b = parked_call(&b, &run_id).await;
    assert_eq!(call_b, call);
    let (status, body) = b
        .post(
            &format!("/v1/runs/{run_id}/approvals/{call}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // B takes the thread over (A's lease runs out) and carries the run on.
    let record = b.finished(&run_id, Duration::from_secs(20)).await;
    assert_eq!(
        record["termination"]["value"]["code"], "terminate",
        "{record}"
    );
    let events = b.events(&run_id, None, Duration::from_secs(5)).await;
    assert_eq!(started_calls(&events), 1, "the call ran once: {events:?}");
    let starts = events.iter().filter(|(_, k, _)| k == "run_started").count();
    assert_eq!(starts, 1, "one run, carried on: {events:?}");
    assert_valid(&Value::Array(history(&b, &t).await));
    let _ = std::fs::remove_file(&path);
}

/// A deployment whose agents park: `ops` on every `terminate` call (no
/// timeout), `timed` with a 1 s timeout that stops the run, `quick` never.
fn parking_config(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "rein-cluster-parking-{name}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        r#"
providers:
  ops:
    kind: scripted
    responses:
      - { text: "Finishing.", tool_calls: [ { name: terminate, arguments: { status: success, message: done } } ] }
  quick: { kind: scripted, responses: ["Done."] }
models:
  ops: { provider: ops, model: x }
  quick: { provider: quick, model: q }
agents:
  - { id: ops, model_id: ops, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }
  - id: timed
    model_id: ops
    plugin_ids: [terminate]
    approvals: [ { tool: terminate, action: ask, timeout_seconds: 1, on_timeout: stop } ]
  - { id: quick, model_id: quick }
store: { postgres: { url_env: REIN_DATABASE_URL } }
server: { lease_seconds: 2 }
"#,
    )
    .unwrap();
    path
}

/// Waits until no live process holds the thread's lease (it was given up,
/// or it ran out) and the run is marked parked with no process holding
/// it; panics after 10 s.
async fn released(db: &sqlx::PgPool, t: &str, run_id: &str) {
    for _ in 0..200 {
        let free: bool = sqlx::query_scalar(
            "SELECT COALESCE((SELECT owner IS NULL OR lease_until < now()
                              FROM rein_threads WHERE thread_id = $1), true)
                    AND (SELECT parked_calls IS NOT NULL FROM rein_runs WHERE run_id = $2)",
        )
        .bind(t)
        .bind(run_id)
        .fetch_one(db)
        .await
        .unwrap();
        if free {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run_id} kept its thread {t} held while parked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_holds_no_lease_survives_kill_9_of_every_process_and_any_process_carries_it_on()
 {
    let Some(url) = database() else { return };
    let _alone = DATABASE.write().await;
    let db = rein_postgres::connect(&url).await.unwrap();
    let path = parking_config("all-killed");
    let (a, b) = (Node::start(&path), Node::start(&path));
    let t = thread("park-free");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let call = parked_call(&a, &run_id).await;
    // Parked: no process holds its thread, and none takes it for it.
    released(&db, &t, &run_id).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    released(&db, &t, &run_id).await;
    // Every process killed; a new one decides and carries the run on.
    a.signal("-KILL");
    b.signal("-KILL");
    let c = Node::start(&path);
    assert_eq!(parked_call(&c, &run_id).await, call);
    // A decision the engine would refuse is refused before it is stored.
    let (status, body) = c
        .post(
            &format!("/v1/runs/{run_id}/approvals/{call}"),
            json!({"decision": "continue"}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_decision")),
        "{body}"
    );
    let (status, body) = c
        .post(
            &format!("/v1/runs/{run_id}/approvals/{call}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let record = c.finished(&run_id, Duration::from_secs(20)).await;
    assert_eq!(
        record["termination"]["value"]["code"], "terminate",
        "{record}"
    );
    // When it was decided comes from the database's record of it.
    assert_eq!(record["decisions"][0]["call_id"], call.as_str(), "{record}");
    assert_eq!(record["decisions"][0]["decision"], "approve", "{record}");
    assert!(record["decisions"][0]["decided_at"].is_string(), "{record}");
    let events = c.events(&run_id, None, Duration::from_secs(5)).await;
    assert_eq!(started_calls(&events), 1, "the call ran once: {events:?}");
    let starts = events.iter().filter(|(_, k, _)| k == "run_started").count();
    assert_eq!(starts, 1, "one run, carried on: {events:?}");
    assert_valid(&Value::Array(history(&c, &t).await));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_no_process_holds_ends_on_its_timeout_a_cancel_or_new_input() {
    let Some(url) = database() else { return };
    let _alone = DATABASE.write().await;
    let db = rein_postgres::connect(&url).await.unwrap();
    let path = parking_config("due");
    let (a, b) = (Node::start(&path), Node::start(&path));

    // The rule's timeout passes with no process holding the run: the
    // scan finds it due and a process ends it `approval_timeout`.
    let t = thread("park-timeout");
    let run = a.submit(&t, "timed", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    parked_call(&a, &run_id).await;
    released(&db, &t, &run_id).await;
    let record = b.finished(&run_id, Duration::from_secs(20)).await;
    assert_eq!(
        record["termination"]["value"]["code"], "approval_timeout",
        "{record}"
    );
    assert_valid(&Value::Array(history(&b, &t).await));

    // A cancel on another process ends it, its call `not_started`.
    let t = thread("park-cancel");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let call = parked_call(&a, &run_id).await;
    released(&db, &t, &run_id).await;
    assert_eq!(
        b.post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
            .await,
        (200, json!({"cancelled": true}))
    );
    let record = a.finished(&run_id, Duration::from_secs(20)).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(
        record["report"]["pending_approvals"][0]["call_id"], call,
        "{record}"
    );
    assert_valid(&Value::Array(history(&a, &t).await));

    // So does a thread's cancel on another process: the run it answers
    // for is parked, so that process takes the thread to end it, and
    // answers once it has.
    let t = thread("park-thread-cancel");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    parked_call(&a, &run_id).await;
    released(&db, &t, &run_id).await;
    assert_eq!(
        b.post(&format!("/v1/threads/{t}/cancel"), json!({})).await,
        (200, json!({"cancelled": true, "released": true}))
    );
    let record = a.finished(&run_id, Duration::from_secs(5)).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_valid(&Value::Array(history(&a, &t).await));

    // New input (`interrupt`) supersedes it, then runs.
    let t = thread("park-interrupt");
    let run = a.submit(&t, "ops", "finish", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    parked_call(&a, &run_id).await;
    released(&db, &t, &run_id).await;
    let next = b.submit(&t, "quick", "never mind", "interrupt").await;
    let next_id = next["run_id"].as_str().unwrap().to_owned();
    let record = b.finished(&run_id, Duration::from_secs(20)).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["cancel_cause"]["type"], "interrupted", "{record}");
    let record = b.finished(&next_id, Duration::from_secs(20)).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let history = history(&b, &t).await;
    assert_valid(&Value::Array(history.clone()));
    assert!(
        history.iter().any(|m| m["content"]
            == "not run: superseded by new input — not_started: the call never started"
            || m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("not run: superseded by new input"))),
        "{history:?}"
    );
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agui_interrupt_from_one_process_is_resumed_on_another_and_the_call_runs_once() {
    let Some(url) = database() else { return };
    let _alone = DATABASE.write().await;
    let db = rein_postgres::connect(&url).await.unwrap();
    let path = parking_config("agui");
    let (a, b) = (Node::start(&path), Node::start(&path));
    let t = thread("park-agui");
    let first = agui(
        &a,
        "ops",
        json!({"threadId": t, "runId": format!("{t}-r1"),
               "messages": [{"id": "u1", "role": "user", "content": "finish"}]}),
    )
    .await;
    let finished = first.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED", "{first:?}");
    assert_eq!(finished["outcome"]["type"], "interrupt", "{finished}");
    let interrupt = finished["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The run let go on A: the resume reaches B, which no process holds
    // the run for.
    let run_id = format!("{t}-r1");
    released(&db, &t, &run_id).await;
    let second = agui(
        &b,
        "ops",
        json!({"threadId": t, "runId": format!("{t}-r2"), "messages": [],
               "resume": [{"interruptId": interrupt, "status": "resolved",
                           "payload": {"decision": "approve"}}]}),
    )
    .await;
    assert_eq!(second[0]["type"], "RUN_STARTED", "{second:?}");
    assert!(
        second.iter().any(|e| e["type"] == "TOOL_CALL_RESULT"),
        "{second:?}"
    );
    let end = second.last().unwrap();
    assert_eq!(end["type"], "RUN_FINISHED", "{second:?}");
    assert_eq!(end["result"]["stop_code"], "terminate", "{end}");
    let events = a.events(&run_id, None, Duration::from_secs(5)).await;
    assert_eq!(started_calls(&events), 1, "the call ran once: {events:?}");
    assert_valid(&Value::Array(history(&a, &t).await));
    let _ = std::fs::remove_file(&path);
}

/// Every item of a listing on `node`, one page of `limit` at a time.
async fn listed(node: &Node, path: &str, key: &str, limit: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor = String::new();
    loop {
        let url = format!("{path}&limit={limit}{cursor}");
        let (status, page) = node.get(&url).await;
        assert_eq!(status, 200, "{url}: {page}");
        items.extend(page[key].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return items,
        }
    }
}

fn field(items: &[Value], key: &str) -> Vec<String> {
    items
        .iter()
        .map(|i| i[key].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_lists_the_same_runs_and_threads_also_after_kill_9_of_the_one_that_ran_them()
{
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let path = tree_config("listing", 30, 3);
    let since =
        rein::contract::approval::rfc3339(std::time::SystemTime::now() - Duration::from_secs(1));
    let a = Node::start(&path);
    let b = Node::start(&path);
    let t = thread("listing");
    let lead = a.submit(&t, "lead", "go", "enqueue").await;
    let lead_id = lead["run_id"].as_str().unwrap().to_owned();
    // The running child is listed under its parent before it has a record.
    let child = loop {
        let (_, page) = b.get(&format!("/v1/runs?parent_run_id={lead_id}")).await;
        if let Some(child) = page["runs"].get(0) {
            break child.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(child["status"], "running", "{child}");
    assert_eq!(child["agent_id"], "helper", "{child}");
    let child_id = child["run_id"].as_str().unwrap().to_owned();
    b.finished(&lead_id, Duration::from_secs(20)).await;
    let mut ids = vec![lead_id.clone()];
    for _ in 0..2 {
        let run = a.submit(&t, "lead", "again", "enqueue").await;
        let id = run["run_id"].as_str().unwrap().to_owned();
        b.finished(&id, Duration::from_secs(20)).await;
        ids.push(id);
    }
    ids.reverse();
    a.signal("-KILL");

    let runs = listed(&b, &format!("/v1/runs?thread_id={t}"), "runs", 1).await;
    assert_eq!(field(&runs, "run_id"), ids, "newest first: {runs:?}");
    assert!(runs.iter().all(|r| r["status"] == "finished"
        && r["termination"] == "natural_end"
        && r["finished_at"].is_string()));
    let (_, page) = b
        .get(&format!("/v1/runs?parent_run_id={lead_id}&status=finished"))
        .await;
    assert_eq!(
        field(page["runs"].as_array().unwrap(), "run_id"),
        [child_id.as_str()]
    );
    assert_eq!(page["runs"][0]["termination"], "natural_end", "{page}");
    let (_, page) = b
        .get(&format!(
            "/v1/runs?thread_id={t}&top_level=true&agent_id=lead&termination=natural_end"
        ))
        .await;
    assert_eq!(field(page["runs"].as_array().unwrap(), "run_id"), ids);
    let (_, page) = b
        .get(&format!("/v1/runs?thread_id={t}&termination=cancelled"))
        .await;
    assert_eq!(page["runs"], json!([]));

    let threads = listed(
        &b,
        &format!("/v1/threads?since={since}&agent_id=lead"),
        "threads",
        2,
    )
    .await;
    let names = field(&threads, "thread_id");
    assert_eq!(names.iter().filter(|n| **n == t).count(), 1, "{names:?}");
    let mine = threads.iter().find(|x| x["thread_id"] == t).unwrap();
    assert_eq!(mine["runs"], 3, "{mine}");
    assert_eq!(mine["last_run"]["run_id"], ids[0], "{mine}");
    let children = listed(
        &b,
        &format!("/v1/threads?since={since}&agent_id=helper"),
        "threads",
        50,
    )
    .await;
    assert!(
        field(&children, "thread_id").contains(&format!("{t}:{child_id}")),
        "{children:?}"
    );
    let _ = std::fs::remove_file(&path);
}
