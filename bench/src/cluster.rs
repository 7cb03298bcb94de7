//! W8, W9 and W10: three real `rein serve` processes (`REIN_BIN`, built by
//! `cargo xtask bench`) on the PostgreSQL of `REIN_DATABASE_URL` (`cargo
//! xtask postgres start`), driven over HTTP from this process.
//!
//! Each workload runs on a fresh database of its own (created next to
//! `REIN_DATABASE_URL`'s, dropped at the end), so what one leaves queued
//! cannot load the next one's measurement.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rein::serde_json::{Value, json};

use crate::{emit, fail, percentile, sorted};

struct Node {
    child: Child,
    url: String,
}

impl Node {
    fn start(config: &std::path::Path, db: &Database) -> Self {
        let bin = std::env::var("REIN_BIN").unwrap_or_else(|_| {
            fail("REIN_BIN is not set: run the cluster workloads through `cargo xtask bench`")
        });
        let mut child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--bind", "127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .env("REIN_BENCH_DATABASE_URL", &db.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("cannot start rein serve: {e}")));
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap_or_else(|| fail("no stdout")))
            .read_line(&mut line);
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| fail(&format!("rein serve printed {line:?}")))
            .to_owned();
        Self { child, url }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A database of its own for one workload.
pub(crate) struct Database {
    admin: sqlx::PgPool,
    name: String,
    pub(crate) url: String,
}

impl Database {
    pub(crate) async fn create() -> Self {
        let base = std::env::var("REIN_DATABASE_URL").unwrap_or_else(|_| {
            fail("REIN_DATABASE_URL is not set: `cargo xtask postgres start` prints it")
        });
        let admin = sqlx::PgPool::connect(&base)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot connect to REIN_DATABASE_URL: {e}")));
        let name = format!(
            "rein_bench_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default()
        );
        // The name is made here of letters, digits and `_`.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create the database {name}: {e}")));
        let url = match base.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => fail(&format!("REIN_DATABASE_URL has no database name: {base}")),
        };
        Self { admin, name, url }
    }

    /// Drops it (the servers using it must have stopped).
    pub(crate) async fn drop(self) {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&self.admin)
        .await;
    }
}

/// The deployment on `db`: a quick agent, a slow one (a 40-word answer,
/// 100 ms per word) and a holding one (a 20-word answer, a word a second:
/// it holds its thread while writing little), with leases of `lease`
/// seconds.
fn config(db: &Database, lease: u64) -> std::path::PathBuf {
    let words: Vec<String> = (1..=40).map(|i| format!("w{i}")).collect();
    let yaml = format!(
        "providers:\n  quick: {{ kind: scripted, responses: [\"Done.\"] }}\n  \
         slow: {{ kind: scripted, chunk_delay_ms: 100, responses: [\"{}\"] }}\n  \
         hold: {{ kind: scripted, chunk_delay_ms: 1000, responses: [\"{}\"] }}\n  \
         gate: {{ kind: scripted, responses: [{{ tool_calls: [{{ name: terminate, arguments: {{ status: success }} }}] }}] }}\n\
         models:\n  quick: {{ provider: quick, model: q }}\n  slow: {{ provider: slow, model: s }}\n  \
         hold: {{ provider: hold, model: h }}\n  gate: {{ provider: gate, model: g }}\n\
         agents:\n  - {{ id: quick, model_id: quick }}\n  - {{ id: slow, model_id: slow }}\n  \
         - {{ id: hold, model_id: hold }}\n  \
         - {{ id: gated, model_id: gate, plugin_ids: [terminate], approvals: [{{ tool: terminate, action: ask }}] }}\n\
         store: {{ postgres: {{ url_env: REIN_BENCH_DATABASE_URL }} }}\n\
         server: {{ lease_seconds: {lease} }}\n",
        words.join(" "),
        words[..20].join(" ")
    );
    let path = std::env::temp_dir().join(format!("{}.yaml", db.name));
    std::fs::write(&path, yaml).unwrap_or_else(|e| fail(&e.to_string()));
    path
}

fn thread(name: &str, i: usize) -> String {
    format!("bench-{name}-{}-{i}", std::process::id())
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    match client.post(url).json(&body).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => fail(&format!("request failed: {e}")),
    }
}

async fn submit(
    client: &reqwest::Client,
    node: &Node,
    thread: &str,
    agent: &str,
    strategy: &str,
) -> (u16, Value) {
    post(
        client,
        format!("{}/v1/threads/{thread}/runs", node.url),
        json!({"agent_id": agent, "strategy": strategy,
               "messages": [{"role": "user", "content": "go"}]}),
    )
    .await
}

/// Reads an SSE response until its text so far contains `marker`;
/// fails with `ended` if the stream ends first.
async fn read_until<B: AsRef<[u8]>>(
    events: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
    marker: &str,
    ended: &str,
) {
    let mut seen = String::new();
    while !seen.contains(marker) {
        match events.next().await {
            Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(chunk.as_ref())),
            _ => fail(ended),
        }
    }
}

async fn status(client: &reqwest::Client, node: &Node, run_id: &str) -> String {
    let record: Value = match client
        .get(format!("{}/v1/runs/{run_id}", node.url))
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(e) => fail(&format!("request failed: {e}")),
    };
    record["status"].as_str().unwrap_or_default().to_owned()
}

/// W8: `POST /v1/threads/{id}/cancel` on one process for a run another
/// process runs, until the answer (the run has ended and is stored).
pub(crate) async fn cancel(runs: usize) {
    let db = Database::create().await;
    let config = config(&db, 10);
    let (a, b) = (Node::start(&config, &db), Node::start(&config, &db));
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = thread("cancel", i);
        let (_, run) = submit(&client, &a, &t, "slow", "interrupt").await;
        let run_id = run["run_id"].as_str().unwrap_or_default().to_owned();
        // Wait for its first word: the run is streaming on `a`.
        let mut events = match client
            .get(format!("{}/v1/runs/{run_id}/events", a.url))
            .send()
            .await
        {
            Ok(r) => r.bytes_stream(),
            Err(e) => fail(&e.to_string()),
        };
        read_until(&mut events, "text_delta", "the run's stream ended early").await;
        let start = Instant::now();
        let (code, answer) = post(
            &client,
            format!("{}/v1/threads/{t}/cancel", b.url),
            json!({}),
        )
        .await;
        latencies.push(start.elapsed().as_secs_f64() * 1e3);
        if code != 200 || answer != json!({"cancelled": true, "released": true}) {
            fail(&format!("cross-process cancel answered {code} {answer}"));
        }
    }
    drop((a, b));
    db.drop().await;
    // The first trials meet cold database connections: each process opens
    // its pool's connections as it needs them, and each connection parses
    // and plans a statement the first time it runs it (~1–2.5 ms a
    // statement here; docs/performance.md, W8). Reported apart, and with
    // the rest, so a change to either shows.
    let warm = sorted(latencies.get(WARMUP..).unwrap_or_default().to_vec());
    let cold = sorted(latencies[..WARMUP.min(latencies.len())].to_vec());
    let l = sorted(latencies);
    emit("cluster_cancel", "p50", percentile(&l, 0.5), "ms");
    emit("cluster_cancel", "p99", percentile(&l, 0.99), "ms");
    if !warm.is_empty() {
        emit("cluster_cancel", "warm_p99", percentile(&warm, 0.99), "ms");
    }
    emit("cluster_cancel", "cold_max", percentile(&cold, 1.0), "ms");
}

/// W8's first trials, while the processes' database connections warm.
const WARMUP: usize = 20;

/// W9: `submissions` for `agent` enqueued with `clients` concurrent
/// clients spread over three processes, into `threads` threads;
/// submissions/s until the last 202, and how many were refused. With the
/// `quick` agent the runs execute meanwhile on the same cores; with the
/// `hold` one each thread's first run holds it for the whole storm, so
/// what is measured is acceptance alone.
pub(crate) async fn submit_storm(
    name: &str,
    agent: &str,
    threads: usize,
    submissions: usize,
    clients: usize,
) {
    let db = Database::create().await;
    let config = config(&db, 10);
    let nodes = [
        Node::start(&config, &db),
        Node::start(&config, &db),
        Node::start(&config, &db),
    ];
    let client = reqwest::Client::new();
    let start = Instant::now();
    let answers: Vec<u16> = futures::stream::iter(0..submissions)
        .map(|i| {
            let (client, node, t) = (&client, &nodes[i % 3], thread(name, i % threads));
            async move { submit(client, node, &t, agent, "enqueue").await.0 }
        })
        .buffer_unordered(clients)
        .collect()
        .await;
    let elapsed = start.elapsed().as_secs_f64();
    drop(nodes);
    db.drop().await;
    let refused = answers.iter().filter(|s| **s != 202).count();
    emit(
        name,
        "submissions_per_s",
        submissions as f64 / elapsed,
        "1/s",
    );
    emit(name, "refused", refused as f64, "count");
}

/// W10: kill -9 of the process running a thread's run, until the run
/// queued behind it starts on a survivor (leases of 2 s).
pub(crate) async fn takeover(repeats: usize) {
    let lease = 2;
    let db = Database::create().await;
    let config = config(&db, lease);
    let survivor = Node::start(&config, &db);
    let client = reqwest::Client::new();
    let mut gaps = Vec::with_capacity(repeats);
    for i in 0..repeats {
        let mut owner = Node::start(&config, &db);
        let t = thread("takeover", i);
        let (_, busy) = submit(&client, &owner, &t, "slow", "interrupt").await;
        if busy["status"] != "running" {
            fail(&format!(
                "the first run did not start on its process: {busy}"
            ));
        }
        let (_, queued) = submit(&client, &survivor, &t, "quick", "enqueue").await;
        let queued = queued["run_id"].as_str().unwrap_or_default().to_owned();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed = Instant::now();
        let _ = owner.child.kill(); // SIGKILL, by PID
        let _ = owner.child.wait();
        loop {
            if status(&client, &survivor, &queued).await != "queued" {
                break;
            }
            if killed.elapsed() > Duration::from_secs(lease + 30) {
                fail("the queued run never started after the kill");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        gaps.push(killed.elapsed().as_secs_f64() * 1e3);
    }
    drop(survivor);
    db.drop().await;
    let g = sorted(gaps);
    emit("cluster_takeover", "p50", percentile(&g, 0.5), "ms");
    emit("cluster_takeover", "max", percentile(&g, 1.0), "ms");
    emit("cluster_takeover", "lease", (lease * 1000) as f64, "ms");
}

/// W13b: a run parked on one process, decided on another; the time from
/// the decision's request to the held call's `tool_call_started` on the
/// run's stream. With `lost`, the decision is written to the database
/// without its notification, so the owner's scan finds it.
pub(crate) async fn approval(runs: usize, lost: bool) {
    let name = if lost {
        "cluster_approval_lost_notify"
    } else {
        "cluster_approval"
    };
    let db = Database::create().await;
    let config = config(&db, 10);
    let (a, b) = (Node::start(&config, &db), Node::start(&config, &db));
    let pool = sqlx::PgPool::connect(&db.url)
        .await
        .unwrap_or_else(|e| fail(&format!("cannot connect to the bench database: {e}")));
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = thread(name, i);
        let (_, run) = submit(&client, &a, &t, "gated", "interrupt").await;
        let run_id = run["run_id"].as_str().unwrap_or_default().to_owned();
        // The run's stream, read until it parks.
        let mut events = match client
            .get(format!("{}/v1/runs/{run_id}/events", a.url))
            .send()
            .await
        {
            Ok(r) => r.bytes_stream(),
            Err(e) => fail(&e.to_string()),
        };
        if std::env::var_os("REIN_BENCH_TRACE").is_some() {
            eprintln!("run {i}: {run_id} submitted");
        }
        read_until(
            &mut events,
            "event: run_parked",
            "the run's stream ended before it parked",
        )
        .await;
        let record: Value = match client
            .get(format!("{}/v1/runs/{run_id}", a.url))
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(e) => fail(&e.to_string()),
        };
        let call = record["pending_approvals"][0]["call_id"]
            .as_str()
            .unwrap_or_else(|| fail(&format!("not parked: {record}")))
            .to_owned();
        if std::env::var_os("REIN_BENCH_TRACE").is_some() {
            eprintln!("run {i}: parked on {call}");
        }
        let start = Instant::now();
        if lost {
            let inserted = sqlx::query(
                "INSERT INTO rein_decisions (run_id, call_id, decision) VALUES ($1, $2, '{\"decision\": \"approve\"}'::jsonb)",
            )
            .bind(&run_id)
            .bind(&call)
            .execute(&pool)
            .await;
            if let Err(e) = inserted {
                fail(&format!("cannot write the decision: {e}"));
            }
        } else {
            let (code, answer) = post(
                &client,
                format!("{}/v1/runs/{run_id}/approvals/{call}", b.url),
                json!({"decision": "approve"}),
            )
            .await;
            if code != 200 {
                fail(&format!("the decision was answered {code} {answer}"));
            }
        }
        read_until(
            &mut events,
            "event: tool_call_started",
            "the run's stream ended before the call started",
        )
        .await;
        latencies.push(start.elapsed().as_secs_f64() * 1e3);
    }
    pool.close().await;
    drop((a, b));
    db.drop().await;
    let l = sorted(latencies);
    emit(name, "p50", percentile(&l, 0.5), "ms");
    emit(name, "p99", percentile(&l, 0.99), "ms");
}

/// W13c in the service: the resident memory a `rein serve` process keeps
/// per parked run once the runs have let go (no task, no lease): its RSS
/// after `runs` more runs parked, against after a warm-up batch.
pub(crate) async fn parked_memory(runs: usize) {
    let db = Database::create().await;
    let config = config(&db, 10);
    let a = Node::start(&config, &db);
    let pool = sqlx::PgPool::connect(&db.url)
        .await
        .unwrap_or_else(|e| fail(&format!("cannot connect to the bench database: {e}")));
    let client = reqwest::Client::new();
    let warm_up = (runs / 4).max(2);
    park_released(&client, &a, &pool, "parked-memory-warm", warm_up).await;
    let before = rss_kb(a.child.id());
    park_released(&client, &a, &pool, "parked-memory", runs).await;
    let after = rss_kb(a.child.id());
    emit(
        "cluster_parked_memory",
        "rss_per_parked_run",
        (after - before) * 1024.0 / runs as f64,
        "bytes",
    );
    pool.close().await;
    drop(a);
    db.drop().await;
}

/// Parks `runs` runs of `gated` on `node`, one thread each, and waits
/// until every parked run is released and no thread is held.
async fn park_released(
    client: &reqwest::Client,
    node: &Node,
    pool: &sqlx::PgPool,
    name: &str,
    runs: usize,
) {
    for i in 0..runs {
        let t = thread(name, i);
        let (code, answer) = submit(client, node, &t, "gated", "interrupt").await;
        if code != 202 {
            fail(&format!("the submission was answered {code} {answer}"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (parked, held): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM rein_runs WHERE parked_calls IS NOT NULL),
                    (SELECT count(*) FROM rein_threads WHERE owner IS NOT NULL AND lease_until > now())",
        )
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| fail(&format!("cannot read the runs: {e}")));
        if held == 0 && parked >= i64::try_from(runs).unwrap_or(i64::MAX) {
            return;
        }
        if Instant::now() > deadline {
            fail(&format!(
                "{parked} runs parked and released, {held} threads still held"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The resident memory of process `pid`, in KiB.
fn rss_kb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
