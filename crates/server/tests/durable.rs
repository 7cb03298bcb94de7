//! `store: postgres`: histories in PostgreSQL shared by several service
//! processes (here: several services in one test process, each with its
//! own ownership), one run per thread across them, and a restarted service
//! serving what an earlier one stored. Needs `REIN_DATABASE_URL`
//! (`cargo xtask postgres start`; `.ci/run` sets it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::Write;
use std::time::Duration;

use common::Server;
use serde_json::json;

fn database() -> bool {
    let set = std::env::var("REIN_DATABASE_URL").is_ok_and(|u| !u.is_empty());
    if !set {
        let _ = std::io::stderr()
            .write_all(b"durable-store tests skipped: REIN_DATABASE_URL is not set\n");
    }
    set
}

const YAML: &str = r#"
providers:
  quick: { kind: scripted, responses: ["Stored answer."] }
  slow: { kind: scripted, chunk_delay_ms: 40, responses: ["one two three four five six seven eight nine ten"] }
  slower: { kind: scripted, chunk_delay_ms: 200, responses: ["a b c d e f g h i j k l m n o p q r s t"] }
models:
  slower: { provider: slower, model: s2 }
  quick: { provider: quick, model: q }
  slow: { provider: slow, model: s }
agents:
  - { id: fast, model_id: quick }
  - { id: slow, model_id: slow }
  - { id: slower, model_id: slower }
store: { postgres: { url_env: REIN_DATABASE_URL } }
server: { lease_seconds: 3 }
"#;

fn thread(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_process_accepts_a_submission_and_the_owner_runs_it_after_the_active_run() {
    if !database() {
        return;
    }
    let a = Server::start(YAML).await;
    let b = Server::start(YAML).await;
    assert_eq!(a.get("/healthz").await, (200, json!({"status": "ok"})));
    let t = thread("shared");
    let (status, first) = a.say(&t, "on a", json!({"agent_id": "slow"})).await;
    assert_eq!(
        (status, first["status"].as_str()),
        (202, Some("running")),
        "{first}"
    );
    let (status, second) = b
        .say(
            &t,
            "on b",
            json!({"agent_id": "fast", "strategy": "enqueue"}),
        )
        .await;
    assert_eq!(
        (status, second["status"].as_str()),
        (202, Some("queued")),
        "{second}"
    );
    // b follows the run a runs: its record, from the database.
    let second = b.finished(second["run_id"].as_str().unwrap()).await;
    assert_eq!(second["termination"]["type"], "natural_end", "{second}");
    let first = a.finished(first["run_id"].as_str().unwrap()).await;
    assert_eq!(first["termination"]["type"], "natural_end", "{first}");
    let users = b.user_messages(&t).await;
    assert_eq!(users, vec!["on a", "on b"], "one history, in order");
    assert_eq!(a.user_messages(&t).await, users);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_restarted_service_serves_what_an_earlier_one_stored() {
    if !database() {
        return;
    }
    let t = thread("restart");
    let first = Server::start(YAML).await;
    let (_, record) = first
        .post(
            &format!("/v1/threads/{t}/runs?wait=true"),
            json!({"agent_id": "fast", "messages": [{"role": "user", "content": "remember me"}]}),
        )
        .await;
    assert_eq!(record["termination"]["type"], "natural_end");
    first.stop().await;
    let second = Server::start(YAML).await;
    let (_, history) = second.get(&format!("/v1/threads/{t}/messages")).await;
    assert_eq!(
        history,
        json!([{"role": "user", "content": "remember me"}, {"role": "assistant", "content": "Stored answer."}])
    );
    second.stop().await;
}

#[test]
fn a_missing_database_url_variable_is_named() {
    let dir = std::env::temp_dir().join(format!("rein-durable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::write(
        &path,
        YAML.replace("REIN_DATABASE_URL", "REIN_TEST_NO_SUCH_VARIABLE"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["run", "--config"])
        .arg(&path)
        .args(["--agent", "fast", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("REIN_TEST_NO_SUCH_VARIABLE (its url_env) is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn rein_run_continues_a_stored_thread() {
    if !database() {
        return;
    }
    use rein_postgres::ThreadStore;
    let dir = std::env::temp_dir().join(format!("rein-durable-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::write(&path, YAML).unwrap();
    let t = thread("cli");
    for message in ["first", "second"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["run", "--config"])
            .arg(&path)
            .args(["--agent", "fast", "--thread", &t, message])
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let url = std::env::var("REIN_DATABASE_URL").unwrap();
    let store = rein_postgres::PgThreadStore::new(rein_postgres::connect(&url).await.unwrap());
    let history = store.load(&t).await.unwrap();
    let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        texts,
        vec!["first", "Stored answer.", "second", "Stored answer."]
    );
}

#[tokio::test]
async fn deleting_a_thread_from_another_process_cancels_its_run_and_drops_its_stored_history() {
    if !database() {
        return;
    }
    let a = Server::start(YAML).await;
    let b = Server::start(YAML).await;
    let t = thread("delete");
    let (_, run) = a.say(&t, "slow", json!({"agent_id": "slower"})).await;
    let (_, queued) = a
        .say(
            &t,
            "later",
            json!({"agent_id": "fast", "strategy": "enqueue"}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = b
        .client
        .delete(b.at(&format!("/v1/threads/{t}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 204);
    let record = a.finished(run["run_id"].as_str().unwrap()).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    let record = b.finished(queued["run_id"].as_str().unwrap()).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["steps"], 0, "the queued run never started: {record}");
    assert_eq!(
        a.get(&format!("/v1/threads/{t}/messages")).await,
        (200, json!([]))
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_another_process_reaches_the_run() {
    if !database() {
        return;
    }
    let a = Server::start(YAML).await;
    let b = Server::start(YAML).await;
    let t = thread("cancel");
    let (_, run) = a.say(&t, "talk", json!({"agent_id": "slower"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let answer = b.post(&format!("/v1/threads/{t}/cancel"), json!({})).await;
    assert_eq!(answer, (200, json!({"cancelled": true, "released": true})));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let record = a.finished(run["run_id"].as_str().unwrap()).await;
    assert_eq!(record["termination"]["type"], "cancelled", "{record}");
    assert_eq!(record["cancel_cause"]["type"], "requested");
    // Nobody runs the thread now: nothing to cancel.
    assert_eq!(
        b.post(&format!("/v1/threads/{t}/cancel"), json!({})).await,
        (200, json!({"cancelled": false, "released": true}))
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_thread_taken_from_a_lost_process_has_its_open_tool_calls_answered_as_maybe_run() {
    if !database() {
        return;
    }
    use rein::contract::message::{Message, ToolCall};
    use rein_postgres::{Leases, PgThreadStore, ThreadStore};
    let url = std::env::var("REIN_DATABASE_URL").unwrap();
    let pool = rein_postgres::connect(&url).await.unwrap();
    let t = thread("lost");
    // A process that started a tool call, then died (it never renews).
    let lost = Leases::new(pool.clone(), "a-lost-process", Duration::from_millis(300));
    assert!(lost.acquire(&t).await.unwrap().is_some());
    let call = ToolCall::new("call-9", "write_file", json!({"path": "/tmp/x"}));
    PgThreadStore::fenced(pool.clone(), lost.clone())
        .append(
            &t,
            &[
                Message::user("write it"),
                Message::assistant_with_tools("", vec![call]),
            ],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let survivor = Server::start(YAML).await;
    let (status, record) = survivor
        .post(
            &format!("/v1/threads/{t}/runs?wait=true"),
            json!({"agent_id": "fast", "messages": [{"role": "user", "content": "go on"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end");
    let history = PgThreadStore::new(pool).load(&t).await.unwrap();
    assert_eq!(history[2].tool_call_id.as_deref(), Some("call-9"));
    assert_eq!(history[2].content, rein_postgres::LOST_WORKER_NOTE);
    assert_eq!(history[3].content, "go on");
    survivor.stop().await;
}

/// Agents that offload every tool result: `offloader` calls a tool that
/// does not exist (its error result is offloaded), `reader` reads artifact
/// `ID` back. `ARTIFACTS` is the file's `artifacts:` line.
const OFFLOAD_YAML: &str = r#"
providers:
  offload: { kind: scripted, responses: [ { tool_calls: [ { name: no_such_tool, arguments: {} } ] }, "Offloaded." ] }
  read: { kind: scripted, responses: [ { tool_calls: [ { name: read_artifact, arguments: { id: "ID" } } ] }, "Read." ] }
models:
  offload: { provider: offload, model: o }
  read: { provider: read, model: r }
agents:
  - { id: offloader, model_id: offload, context: { window_tokens: 8000, offload: { min_tokens: 1 } } }
  - { id: reader, model_id: read, context: { window_tokens: 8000, offload: { min_tokens: 1 } } }
store: { postgres: { url_env: REIN_DATABASE_URL } }
ARTIFACTS
"#;

/// The thread's first tool result: its call id and content.
async fn first_tool_result(server: &Server, thread: &str) -> (String, String) {
    let (_, history) = server.get(&format!("/v1/threads/{thread}/messages")).await;
    let result = history
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    (
        result["tool_call_id"].as_str().unwrap().to_owned(),
        result["content"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn offloaded_tool_results_go_where_the_file_says_postgres_by_default() {
    if !database() {
        return;
    }
    use rein::context::ArtifactStore;
    let url = std::env::var("REIN_DATABASE_URL").unwrap();
    let table = rein_postgres::PgArtifactStore::new(rein_postgres::connect(&url).await.unwrap());
    let dir = std::env::temp_dir().join(format!("rein-artifacts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_line = format!("artifacts: {{ dir: \"{}\" }}", dir.display());
    for (line, in_table) in [
        ("", true),
        ("artifacts: memory", false),
        (&dir_line[..], false),
    ] {
        let t = thread("artifacts");
        let server = Server::start(&OFFLOAD_YAML.replace("ARTIFACTS", line)).await;
        let runs = format!("/v1/threads/{t}/runs?wait=true");
        let go = json!({"agent_id": "offloader", "messages": [{"role": "user", "content": "go"}]});
        let (_, record) = server.post(&runs, go).await;
        assert_eq!(record["termination"]["type"], "natural_end", "{record}");
        let (id, text) = first_tool_result(&server, &t).await;
        assert!(text.contains("no_such_tool"), "{text}");
        let stored = table.get(&t, &id).await.unwrap();
        assert_eq!(stored.is_some(), in_table, "`{line}`: {stored:?}");
        if in_table {
            assert_eq!(stored.unwrap(), text);
            // Another process reads it back with `read_artifact`.
            let reader = OFFLOAD_YAML
                .replace("\"ID\"", &format!("\"{id}\""))
                .replace("ARTIFACTS", "");
            let other = Server::start(&reader).await;
            let read =
                json!({"agent_id": "reader", "messages": [{"role": "user", "content": "read it"}]});
            let (_, record) = other.post(&runs, read).await;
            assert_eq!(record["termination"]["type"], "natural_end", "{record}");
            let (_, history) = other.get(&format!("/v1/threads/{t}/messages")).await;
            let back = history.as_array().unwrap().last().unwrap().clone();
            assert_eq!(back["content"], "Read.");
            let read_back = history
                .as_array()
                .unwrap()
                .iter()
                .rev()
                .find(|m| m["role"] == "tool")
                .unwrap();
            assert!(
                read_back["content"].as_str().unwrap().contains(&text),
                "{read_back}"
            );
            other.stop().await;
        }
        if line == dir_line {
            let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            assert_eq!(files, 1, "one thread directory under {}", dir.display());
        }
        server.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
