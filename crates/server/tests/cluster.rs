//! The multi-process suite: real `rein serve` processes on one PostgreSQL
//! database, killed, paused and cut off from it. Needs `REIN_DATABASE_URL`
//! (`cargo xtask postgres start`; `.ci/run` sets it) and, for the database
//! restart, the `xtask` binary built next to this test (`cargo xtask`
//! builds it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod cluster_common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use cluster_common::{DATABASE, Node, assert_valid, config, database, thread};
use futures::StreamExt;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_submitted_on_one_process_is_streamed_from_a_second_and_cancelled_from_a_third() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = config(3);
    let (a, b, c) = (
        Node::start(&config),
        Node::start(&config),
        Node::start(&config),
    );
    let t = thread("three");
    let run = a.submit(&t, "slow", "talk", "interrupt").await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let events = b
        .client
        .get(format!("{}/v1/runs/{run_id}/events", b.url))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);
    let mut body = events.bytes_stream();
    let mut text = String::new();
    // Stream until some text has arrived, then cancel from the third.
    while !text.contains("text_delta") {
        text.push_str(&String::from_utf8_lossy(
            &body.next().await.unwrap().unwrap(),
        ));
    }
    assert_eq!(
        c.post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
            .await,
        (200, json!({"cancelled": true}))
    );
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let last = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .last()
        .unwrap();
    assert!(last.contains("event: run_finished"), "{last}");
    assert!(last.contains(r#""type":"cancelled""#), "{last}");
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "per-run sequence numbers"
    );
    for node in [&a, &b, &c] {
        let record = node.finished(&run_id, Duration::from_secs(5)).await;
        assert_eq!(record["termination"]["type"], "cancelled", "{record}");
        assert_eq!(record["cancel_cause"]["type"], "requested", "{record}");
    }
    let (_, history) = c.get(&format!("/v1/threads/{t}/messages")).await;
    assert_valid(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_busy_owner_ends_its_run_as_lost_and_a_survivor_runs_the_queue() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let lease = 2;
    let config = config(lease);
    let mut a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("killed");
    let busy = a.submit(&t, "slow", "long job", "interrupt").await;
    assert_eq!(busy["status"], "running", "{busy}");
    let queued = b.submit(&t, "quick", "next job", "enqueue").await;
    assert_eq!(queued["status"], "queued", "{queued}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    a.child.kill().unwrap(); // SIGKILL, by PID
    a.child.wait().unwrap();
    let next = b
        .finished(
            queued["run_id"].as_str().unwrap(),
            Duration::from_secs(lease + 10),
        )
        .await;
    let took = killed.elapsed();
    assert_eq!(next["termination"]["type"], "natural_end", "{next}");
    let lost = b
        .finished(busy["run_id"].as_str().unwrap(), Duration::from_secs(1))
        .await;
    assert_eq!(lost["termination"]["type"], "error", "{lost}");
    assert_eq!(
        lost["termination"]["value"],
        rein_server::service::LOST_RUN,
        "{lost}"
    );
    assert!(
        took < Duration::from_secs(lease + 5),
        "the queue waited {took:?} after the kill"
    );
    let (_, history) = b.get(&format!("/v1/threads/{t}/messages")).await;
    assert_valid(&history);
    let users: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, vec!["long job", "next job"], "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_paused_past_its_lease_writes_nothing_when_it_wakes() {
    let Some(url) = database() else { return };
    let _shared = DATABASE.read().await;
    let pool = rein_postgres::connect(&url).await.unwrap();
    let lease = 2;
    let config = config(lease);
    let a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("paused");
    let busy = a.submit(&t, "slow", "long job", "interrupt").await;
    let run_id = busy["run_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.signal("-STOP");
    // A survivor takes the thread and ends the run as lost.
    let lost = b.finished(&run_id, Duration::from_secs(lease + 10)).await;
    assert_eq!(
        lost["termination"]["value"],
        rein_server::service::LOST_RUN,
        "{lost}"
    );
    let after = b
        .submit(&t, "quick", "after the take-over", "enqueue")
        .await;
    b.finished(after["run_id"].as_str().unwrap(), Duration::from_secs(10))
        .await;
    let runs = rein_postgres::Database::new(pool.clone(), "test-reader", Duration::from_secs(1));
    // Retried: another test may be restarting the database.
    let events = || async {
        rein_postgres::retry(Duration::from_secs(30), || {
            runs.runs().events_after(&run_id, 0)
        })
        .await
        .unwrap()
        .len()
    };
    let messages = || async {
        use rein_postgres::ThreadStore;
        rein_postgres::PgThreadStore::new(pool.clone())
            .load(&t)
            .await
            .unwrap()
            .len()
    };
    let (events_before, messages_before) = (events().await, messages().await);
    let (_, history_before) = b.get(&format!("/v1/threads/{t}/messages")).await;
    a.signal("-CONT");
    // The woken process streams on, then finds its writes refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        events().await,
        events_before,
        "the paused process wrote events"
    );
    assert_eq!(
        messages().await,
        messages_before,
        "the paused process wrote history"
    );
    let (_, history) = b.get(&format!("/v1/threads/{t}/messages")).await;
    assert_eq!(history, history_before);
    assert_valid(&history);
    let record = b.finished(&run_id, Duration::from_secs(1)).await;
    assert_eq!(record, lost, "the paused process rewrote the record");
    // The woken process serves the database's version of the run, not the
    // one it logged while its writes were refused.
    let from_a = a.finished(&run_id, Duration::from_secs(5)).await;
    assert_eq!(from_a, lost, "the woken process serves its own record");
    assert_eq!(
        a.events(&run_id, None, Duration::from_secs(5)).await,
        b.events(&run_id, None, Duration::from_secs(5)).await,
        "SSE ids mean the same events on every process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_run_loses_nothing() {
    let Some(_) = database() else { return };
    let _alone = DATABASE.write().await;
    let xtask = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("xtask"))
        .unwrap();
    assert!(
        xtask.exists(),
        "{} is missing: build it with `cargo build -p xtask`",
        xtask.display()
    );
    let config = config(10);
    let a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("restart");
    let busy = a.submit(&t, "slow", "long job", "interrupt").await;
    let queued = b.submit(&t, "quick", "queued job", "enqueue").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut restart = Command::new(&xtask)
        .args(["postgres", "restart"])
        .spawn()
        .unwrap();
    // `reject` submissions while the database restarts ride it out too:
    // one every 25 ms on fresh threads, over both processes, until the
    // restart is done.
    let mut sent = Vec::new();
    let mut i = 0;
    while restart.try_wait().unwrap().is_none() {
        let node = if i % 2 == 0 { &a } else { &b };
        let lone = thread(&format!("restart-reject-{i}"));
        let body = json!({"agent_id": "quick", "strategy": "reject",
                          "messages": [{"role": "user", "content": "during the restart"}]});
        // Sent now (spawned), not when the answers are collected.
        let request = node
            .client
            .post(format!("{}/v1/threads/{lone}/runs", node.url))
            .json(&body);
        sent.push(tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }));
        tokio::time::sleep(Duration::from_millis(25)).await;
        i += 1;
    }
    assert!(restart.wait().unwrap().success());
    assert!(!sent.is_empty());
    for answer in futures::future::join_all(sent).await {
        let (status, body) = answer.unwrap();
        assert_eq!(status, 202, "{body}");
    }
    let record = a
        .finished(busy["run_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let record = b
        .finished(queued["run_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let after = b.submit(&t, "quick", "after the restart", "enqueue").await;
    b.finished(after["run_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    let events = b
        .client
        .get(format!(
            "{}/v1/runs/{}/events",
            b.url,
            busy["run_id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let deltas = events.matches("event: text_delta").count();
    assert_eq!(deltas, 40, "every streamed word was stored");
    let (_, history) = a.get(&format!("/v1/threads/{t}/messages")).await;
    assert_valid(&history);
    let users = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(users, 3, "{history}");
}

/// 300 submissions over 3 processes × 5 threads, each idempotency key sent
/// twice to two processes at once; repeated 10 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_submissions_loses_none_duplicates_none_and_never_overlaps_runs() {
    let Some(url) = database() else { return };
    let _shared = DATABASE.read().await;
    let pool = rein_postgres::connect(&url).await.unwrap();
    let stored = rein_postgres::Database::new(pool, "test-reader", Duration::from_secs(1))
        .runs()
        .clone();
    let config = config(3);
    let nodes = [
        Node::start(&config),
        Node::start(&config),
        Node::start(&config),
    ];
    for round in 0..10 {
        let threads: Vec<String> = (0..5)
            .map(|i| thread(&format!("storm{round}-{i}")))
            .collect();
        let submissions = (0..300).map(|i| {
            let key = i / 2;
            let (thread, node) = (&threads[key % 5], &nodes[i % 3]);
            async move {
                let (status, body) = node
                    .post(
                        &format!("/v1/threads/{thread}/runs"),
                        json!({"agent_id": "quick", "strategy": "enqueue",
                               "idempotency_key": format!("k{key}"),
                               "messages": [{"role": "user", "content": format!("m{key}")}]}),
                    )
                    .await;
                (key, status, body)
            }
        });
        let answers: Vec<(usize, u16, Value)> = futures::stream::iter(submissions)
            .buffer_unordered(48)
            .collect()
            .await;
        let mut runs: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        for (key, status, body) in &answers {
            assert!(
                *status == 202 || *status == 200,
                "round {round}: {status} {body}"
            );
            runs.entry(*key)
                .or_default()
                .insert(body["run_id"].as_str().unwrap().to_owned());
        }
        assert_eq!(runs.len(), 150, "round {round}: every key got a run");
        assert!(
            runs.values().all(|ids| ids.len() == 1),
            "round {round}: a key got two runs: {runs:?}"
        );
        // Nothing stuck: every run finishes.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut open = 0;
            for t in &threads {
                open += rein_postgres::retry(Duration::from_secs(30), || stored.thread_runs(t))
                    .await
                    .unwrap()
                    .iter()
                    .filter(|r| r.status != "finished")
                    .count();
            }
            if open == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {open} runs stuck"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for t in &threads {
            let rows: Vec<(String, Value, f64, f64)> =
                rein_postgres::retry(Duration::from_secs(30), || stored.thread_runs(t))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| {
                        (
                            r.run_id,
                            r.record.unwrap_or_default(),
                            r.started_at.unwrap_or_default(),
                            r.finished_at.unwrap_or_default(),
                        )
                    })
                    .collect();
            assert_eq!(
                rows.len(),
                30,
                "round {round}: thread {t} has every run once"
            );
            for (run_id, record, _, _) in &rows {
                assert_eq!(
                    record["termination"]["type"], "natural_end",
                    "round {round}: {run_id}: {record}"
                );
            }
            for pair in rows.windows(2) {
                assert!(
                    pair[0].3 <= pair[1].2,
                    "round {round}: runs {} and {} overlap on {t}",
                    pair[0].0,
                    pair[1].0
                );
            }
            let (_, history) = nodes[0].get(&format!("/v1/threads/{t}/messages")).await;
            assert_valid(&history);
            let users: Vec<&str> = history
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "user")
                .map(|m| m["content"].as_str().unwrap())
                .collect();
            let distinct: BTreeSet<&str> = users.iter().copied().collect();
            assert_eq!(
                (users.len(), distinct.len()),
                (30, 30),
                "round {round}: each input appended once on {t}"
            );
        }
    }
}

/// The shared deployment, whose `lab` agent reports one experiment per
/// round, with `edit` applied to its text (every node of the database
/// must know the agent: a process may take over any thread).
fn auto_config(lease: u64, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let path = config(lease);
    let yaml = edit(std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, yaml).unwrap();
    path
}

/// The records of a two-round session, read from `node`.
async fn follow_session(node: &Node, first: &str) -> (Value, Value) {
    let one = node.finished(first, Duration::from_secs(20)).await;
    let next = one["auto"]["next_run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no next round: {one}"))
        .to_owned();
    let two = node.finished(&next, Duration::from_secs(20)).await;
    (one, two)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_session_s_rounds_totals_and_defaults_are_read_from_another_process_also_after_kill_9()
 {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = auto_config(3, |y| y);
    let mut a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("auto");
    let (status, accepted) = a
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"agent_id": "lab", "run_mode": "auto",
                   "automation_policy": {"maxExperiments": 2, "maxTokens": 100000},
                   "messages": [{"role": "user", "content": "Tune it."}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let first = accepted["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        accepted["session_id"],
        format!("auto-{first}"),
        "{accepted}"
    );
    // B follows the session from record to record.
    let (one, two) = follow_session(&b, &first).await;
    assert_eq!(one["auto"]["round"], 1, "{one}");
    assert_eq!(one["auto"]["tokens_used_session"], 240, "{one}");
    assert_eq!(two["auto"]["round"], 2, "{two}");
    assert_eq!(two["auto"]["tokens_used_session"], 480, "{two}");
    assert_eq!(two["auto"]["max_tokens"], 100000, "{two}");
    assert_eq!(
        two["auto"]["stop_reason"], "max experiments reached (2/2)",
        "{two}"
    );
    let (_, auto) = b.get(&format!("/v1/threads/{t}/auto")).await;
    assert_eq!(auto["run_mode"], "auto", "{auto}");
    assert_eq!(auto["tokens_used_session"], 480, "{auto}");
    assert_eq!(auto["reports"].as_array().unwrap().len(), 2, "{auto}");

    a.child.kill().unwrap(); // SIGKILL, by PID
    a.child.wait().unwrap();
    let (again_one, again_two) = follow_session(&b, &first).await;
    assert_eq!(
        (again_one, again_two),
        (one, two),
        "the records are the database's"
    );
    let (_, reset) = b.post(&format!("/v1/threads/{t}/new"), json!({})).await;
    assert_eq!(reset["tokens_used_session"], 0, "{reset}");
    assert_eq!(reset["run_mode"], "auto", "the defaults stay: {reset}");
    let (_, history) = b.get(&format!("/v1/threads/{t}/messages")).await;
    assert_eq!(history, json!([]), "/new drops the history");
    // A plain submission: the thread's stored default (read with the
    // claim) makes it a session of its own.
    let (status, last) = b
        .post(
            &format!("/v1/threads/{t}/runs?wait=true"),
            json!({"agent_id": "lab", "messages": [{"role": "user", "content": "Again."}]}),
        )
        .await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(last["auto"]["round"], 2, "{last}");
    assert_eq!(
        last["auto"]["stop_reason"], "max experiments reached (2/2)",
        "{last}"
    );
    assert_eq!(
        last["auto"]["tokens_used_session"], 480,
        "from zero after /new: {last}"
    );
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_round_parked_for_approval_and_decided_on_another_process_still_ends_its_session() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let config = auto_config(3, |y| {
        y.replace(
            "plugin_ids: [automation] }",
            "plugin_ids: [automation], approvals: [ { tool: report_metrics, action: ask } ] }",
        )
    });
    let (a, b) = (Node::start(&config), Node::start(&config));
    let t = thread("auto-park");
    let (status, accepted) = a
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"agent_id": "lab", "run_mode": "auto", "automation_policy": {"maxExperiments": 1},
                   "messages": [{"role": "user", "content": "Tune it."}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let run = accepted["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Listed once parked and let go by A (the listing is the database's).
    let call = loop {
        let (_, pending) = b.get(&format!("/v1/approvals?thread_id={t}")).await;
        if let Some(call) = pending[0]["call_id"].as_str() {
            break call.to_owned();
        }
        assert!(Instant::now() < deadline, "never parked: {pending}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, decided) = b
        .post(
            &format!("/v1/runs/{run}/approvals/{call}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    let record = b.finished(&run, Duration::from_secs(20)).await;
    assert_eq!(record["auto"]["round"], 1, "{record}");
    // Whichever process carried the run on (another test's node may, with
    // its own script, report once more), the round kept its session
    // through the park and its end decided it.
    let stop = record["auto"]["stop_reason"].as_str().unwrap_or_default();
    assert!(
        stop.starts_with("max experiments reached (") && stop.ends_with("/1)"),
        "the round kept its session through the park: {record}"
    );
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_round_lost_with_its_process_ends_its_session_in_the_record_the_survivor_writes() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let lease = 2;
    let words = (1..=40)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let config = auto_config(lease, |y| {
        y.replace(
            "  lab:\n    kind: scripted",
            "  lab:\n    kind: scripted\n    chunk_delay_ms: 100",
        )
        .replace("text: \"One.\"", &format!("text: \"{words}\""))
    });
    let mut a = Node::start(&config);
    let b = Node::start(&config);
    let t = thread("auto-lost");
    let (status, accepted) = a
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"agent_id": "lab", "run_mode": "auto", "automation_policy": {"maxExperiments": 5},
                   "messages": [{"role": "user", "content": "Tune it."}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["status"], "running", "{accepted}");
    let run = accepted["run_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(700)).await;
    a.child.kill().unwrap(); // SIGKILL, by PID
    a.child.wait().unwrap();
    let record = b.finished(&run, Duration::from_secs(lease + 10)).await;
    assert_eq!(
        record["termination"]["value"],
        rein_server::service::LOST_RUN,
        "{record}"
    );
    let stop = format!("run error: {}", rein_server::service::LOST_RUN);
    assert_eq!(record["auto"]["stop_reason"], stop, "{record}");
    assert_eq!(record["auto"]["round"], 1, "{record}");
    assert_eq!(
        record["auto"]["progress"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        &json!(format!("auto-run stop condition: {stop}")),
        "{record}"
    );
    assert!(
        record["auto"].get("next_run_id").is_none(),
        "no round after a lost one: {record}"
    );
    let _ = std::fs::remove_file(&config);
}
