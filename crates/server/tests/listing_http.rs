//! `GET /v1/runs` and `GET /v1/threads` in-process: newest first, every
//! filter, cursor pages that neither skip nor repeat, and refusals that
//! name the bad value.

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
      - { tool_calls: [ { name: research, arguments: { task: "find the trains" } } ] }
      - { text: "Found them." }
  researcher: { kind: scripted, responses: ["Two trains."] }
  quick: { kind: scripted, responses: ["Done."] }
  tools:
    kind: scripted
    responses:
      - { tool_calls: [ { name: terminate, arguments: { status: success, message: ok } } ] }
models:
  lead: { provider: lead, model: x }
  researcher: { provider: researcher, model: x }
  quick: { provider: quick, model: q }
  tools: { provider: tools, model: t }
agents:
  - id: lead
    model_id: lead
    subagents:
      - { agent: researcher, tool: research, description: "Research one question." }
  - { id: researcher, model_id: researcher }
  - { id: fast, model_id: quick }
  - { id: finisher, model_id: tools, plugin_ids: [terminate] }
"#;

async fn run(server: &Server, thread: &str, agent: &str) -> Value {
    let (status, record) = server
        .post(
            &format!("/v1/threads/{thread}/runs?wait=true"),
            json!({"agent_id": agent, "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    record
}

/// Every item of a listing, page by page (`limit` per page); asserts each
/// page but the last is full.
async fn all_pages(server: &Server, path: &str, key: &str, limit: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut url = format!("{path}{sep}limit={limit}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = server.get(&url).await;
        assert_eq!(status, 200, "{url}: {page}");
        let got = page[key].as_array().unwrap();
        items.extend(got.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(got.len(), limit, "a page before the last is full: {page}");
                cursor = Some(c.to_owned());
            }
            None => return items,
        }
    }
}

fn ids(items: &[Value], key: &str) -> Vec<String> {
    items
        .iter()
        .map(|i| i[key].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn runs_are_listed_newest_first_filtered_and_paged_without_gaps_or_repeats() {
    let server = Server::start(YAML).await;
    let before = rein::contract::approval::rfc3339(std::time::SystemTime::now());
    let mut submitted = Vec::new();
    for i in 0..5 {
        let record = run(&server, &format!("t{i}"), "fast").await;
        submitted.push(record["run_id"].as_str().unwrap().to_owned());
    }
    let stopped = run(&server, "t-finish", "finisher").await;
    let lead = run(&server, "t-lead", "lead").await;
    let lead_id = lead["run_id"].as_str().unwrap();
    let child_id = lead["children"][0].as_str().unwrap();

    let all = all_pages(&server, "/v1/runs", "runs", 2).await;
    let listed = ids(&all, "run_id");
    assert_eq!(
        listed.len(),
        8,
        "5 fast, 1 finisher, the lead and its child: {all:?}"
    );
    assert_eq!(
        listed.iter().collect::<BTreeSet<_>>().len(),
        8,
        "no run twice"
    );
    let mut newest_first = submitted.clone();
    newest_first.reverse();
    let fast: Vec<String> = listed
        .iter()
        .filter(|id| submitted.contains(id))
        .cloned()
        .collect();
    assert_eq!(fast, newest_first);
    let times: Vec<&str> = all
        .iter()
        .map(|r| r["created_at"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let first = &all.iter().find(|r| r["run_id"] == submitted[0]).unwrap();
    assert_eq!(first["status"], "finished");
    assert_eq!(first["termination"], "natural_end");
    assert_eq!(first["agent_id"], "fast");
    assert_eq!(first["thread_id"], "t0");
    assert!(first["finished_at"].as_str().unwrap() >= first["created_at"].as_str().unwrap());
    assert!(first["created_at"].as_str().unwrap() >= before.as_str());
    assert_eq!(first["steps"], 1);

    let (_, page) = server.get("/v1/runs?agent_id=fast").await;
    assert_eq!(
        ids(page["runs"].as_array().unwrap(), "run_id"),
        newest_first
    );
    let (_, page) = server.get("/v1/runs?termination=terminate").await;
    assert_eq!(
        ids(page["runs"].as_array().unwrap(), "run_id"),
        [stopped["run_id"].as_str().unwrap()],
        "{page}"
    );
    let (_, page) = server
        .get(&format!("/v1/runs?parent_run_id={lead_id}"))
        .await;
    assert_eq!(ids(page["runs"].as_array().unwrap(), "run_id"), [child_id]);
    assert_eq!(page["runs"][0]["parent_run_id"], lead_id);
    let (_, page) = server.get("/v1/runs?top_level=true").await;
    let top = ids(page["runs"].as_array().unwrap(), "run_id");
    assert_eq!(top.len(), 7);
    assert!(!top.contains(&child_id.to_owned()));
    let (_, page) = server.get("/v1/runs?thread_id=t3").await;
    assert_eq!(
        ids(page["runs"].as_array().unwrap(), "run_id"),
        [submitted[3].clone()]
    );
    let (_, page) = server.get("/v1/runs?status=queued").await;
    assert_eq!(page["runs"], json!([]));
    assert_eq!(page["next_cursor"], Value::Null);
    // A time range: from the third fast run's submission to the fifth's.
    let at = |i: usize| {
        all.iter().find(|r| r["run_id"] == submitted[i]).unwrap()["created_at"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (_, page) = server
        .get(&format!(
            "/v1/runs?agent_id=fast&since={}&until={}",
            at(2),
            at(4)
        ))
        .await;
    let ranged = ids(page["runs"].as_array().unwrap(), "run_id");
    assert!(
        ranged.contains(&submitted[2]) && !ranged.contains(&submitted[4]),
        "{ranged:?}"
    );
    for r in page["runs"].as_array().unwrap() {
        let created = r["created_at"].as_str().unwrap();
        assert!(
            created >= at(2).as_str() && created <= at(4).as_str(),
            "{r}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn threads_are_listed_with_their_latest_run_and_paged() {
    let server = Server::start(YAML).await;
    run(&server, "a", "fast").await;
    run(&server, "b", "fast").await;
    let last = run(&server, "a", "finisher").await;
    run(&server, "c", "fast").await;

    let all = all_pages(&server, "/v1/threads", "threads", 1).await;
    assert_eq!(ids(&all, "thread_id"), ["c", "b", "a"], "{all:?}");
    let a = &all[2];
    assert_eq!(a["runs"], 2);
    assert_eq!(a["last_run"]["run_id"], last["run_id"]);
    assert_eq!(a["last_run"]["termination"], "terminate");
    let (_, page) = server.get("/v1/threads?agent_id=finisher").await;
    assert_eq!(ids(page["threads"].as_array().unwrap(), "thread_id"), ["a"]);
    let (_, page) = server.get("/v1/threads?status=running").await;
    assert_eq!(page["threads"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn a_bad_listing_query_is_refused_naming_the_value() {
    let server = Server::start(YAML).await;
    for (query, names) in [
        ("/v1/runs?status=done", "`done`"),
        ("/v1/runs?since=yesterday", "`yesterday`"),
        ("/v1/runs?limit=0", "limit 0"),
        ("/v1/runs?limit=501", "limit 501"),
        ("/v1/runs?cursor=nonsense", "`nonsense`"),
        ("/v1/runs?parent_run_id=r&top_level=true", "top_level"),
        ("/v1/runs?colour=red", "colour"),
        ("/v1/threads?termination=x", "termination"),
    ] {
        let (status, body) = server.get(query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_query", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{query}: {message}");
    }
    server.stop().await;
}
