//! Provider limits through the binary (service.md §10), against an
//! OpenAI-compatible fake that enforces its own limits and answers 429
//! past them: Rein reserves before it sends, so the fake refuses nothing;
//! the waits show in the SSE stream, the run records and
//! `GET /v1/providers`; in PostgreSQL mode, three processes share one set
//! of limits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod cluster_common;
#[path = "limits/fake_openai.rs"]
mod fake_openai;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster_common::{DATABASE, Node, database};
use fake_openai::Fake;
use serde_json::Value;

/// A deployment whose one agent talks to the fake through the provider
/// `provider` with `limits` (`lease_seconds`: in PostgreSQL mode, the
/// processes' lease; `None` keeps threads in memory). Processes sharing a
/// database share a provider's limits by its id: each test names its own.
fn deployment(fake: &Fake, provider: &str, limits: &str, lease_seconds: Option<u64>) -> PathBuf {
    let store = match lease_seconds {
        Some(lease) => format!(
            "store: {{ postgres: {{ url_env: REIN_DATABASE_URL }} }}\nserver: {{ lease_seconds: {lease} }}"
        ),
        None => String::new(),
    };
    let yaml = format!(
        r#"
providers:
  {provider}:
    kind: openai_compatible
    base_url: {url}
    limits: {limits}
models:
  main: {{ provider: {provider}, model: fake-model, max_output_tokens: 16 }}
agents:
  - {{ id: worker, model_id: main }}
{store}
"#,
        url = fake.url
    );
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rein-limits-{}-{n}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A prompt of about 250 tokens as the fake counts them.
fn prompt(i: usize) -> String {
    format!("task {i}: {}", "lorem ipsum ".repeat(83))
}

/// The node's `/metrics` text.
async fn metrics(node: &Node) -> String {
    let response = node
        .client
        .get(format!("{}/metrics", node.url))
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// Inferences per run in the fleet test.
const ROUNDS: usize = 6;

fn thread(name: &str) -> String {
    format!("limits-{name}-{}-{}", std::process::id(), fastrand_suffix())
}

fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_waits_instead_of_being_refused_and_shows_the_waits() {
    // The fake allows 2 requests per second; so does Rein.
    let fake = Fake::start(2, 100_000, Duration::from_secs(1), Duration::ZERO, 1).await;
    let config = deployment(
        &fake,
        "hosted",
        "{ requests_per_minute: 120, window_ms: 1000 }",
        None,
    );
    let node = Node::start(&config);
    let base = thread("one");
    let mut runs = Vec::new();
    for i in 0..6 {
        let run = node
            .submit(&format!("{base}-{i}"), "worker", &prompt(i), "reject")
            .await;
        runs.push(run["run_id"].as_str().unwrap().to_owned());
    }
    // The last run waits about two windows: its stream says so first.
    let events = node.events(&runs[5], None, Duration::from_secs(20)).await;
    let kinds: Vec<&str> = events.iter().map(|(_, kind, _)| kind.as_str()).collect();
    let limited = kinds
        .iter()
        .position(|k| *k == "rate_limited")
        .expect("a rate_limited event");
    let first_text = kinds.iter().position(|k| *k == "text_delta").unwrap();
    assert!(limited < first_text, "{kinds:?}");
    let data: Value = serde_json::from_str(&events[limited].2).unwrap();
    assert_eq!(data["provider"], "hosted");
    assert!(data["wait_ms"].as_u64().is_some(), "{data}");
    let (status, providers) = node.get("/v1/providers").await;
    assert_eq!(status, 200);
    assert_eq!(providers[0]["id"], "hosted");
    assert_eq!(providers[0]["limits"]["requests_per_minute"], 120);
    assert!(
        providers[0]["usage"]["requests"].as_u64().unwrap() >= 1,
        "{providers}"
    );
    let mut waited = 0;
    for run in &runs {
        let record = node.finished(run, Duration::from_secs(20)).await;
        assert_eq!(record["termination"]["type"], "natural_end", "{record}");
        // A wait is no round.
        assert_eq!(record["steps"], 1, "{record}");
        if let Some(wait) = record["report"].get("rate_limited") {
            waited += 1;
            assert_eq!(wait["waits"], 1, "{record}");
        }
    }
    assert_eq!(waited, 4, "2 went at once, 4 waited");
    let metrics = metrics(&node).await;
    assert!(
        metrics.contains("rein_rate_limited_waits_total{provider=\"hosted\"} 4"),
        "{metrics}"
    );
    assert_eq!(
        fake.tally.lock().unwrap().refused,
        0,
        "the fake refused nothing"
    );
    assert_eq!(fake.tally.lock().unwrap().accepted.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_set_of_limits_use_them_fully_and_starve_no_run() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    // 60 requests and 20 000 tokens per minute, the minute shortened to a
    // 2 s window (each cycle of a slot through the window costs the time
    // from its expiry to the next request's arrival, some 100 ms on this
    // loaded 2-core machine: against a real minute that is 0.2 %).
    let fake = Fake::start(
        60,
        20_000,
        Duration::from_secs(2),
        Duration::from_millis(5),
        ROUNDS,
    )
    .await;
    let provider = thread("fleet").replace('-', "_");
    let config = deployment(
        &fake,
        &provider,
        "{ requests_per_minute: 1800, tokens_per_minute: 600000, window_ms: 2000 }",
        Some(5),
    );
    let nodes = Arc::new([
        Node::start(&config),
        Node::start(&config),
        Node::start(&config),
    ]);
    let base = thread("fleet");
    // 50 runs at once, spread over the three processes, each 6 inferences
    // long: 300 inferences, their prompts growing round by round.
    let mut runs = Vec::new();
    for c in 0..50 {
        let (nodes, base) = (nodes.clone(), base.clone());
        runs.push(tokio::spawn(async move {
            let node = &nodes[c % 3];
            let run = node
                .submit(&format!("{base}-{c}"), "worker", &prompt(c), "reject")
                .await;
            let run_id = run["run_id"].as_str().unwrap();
            node.events(run_id, None, Duration::from_secs(60)).await;
            let record = node.finished(run_id, Duration::from_secs(10)).await;
            assert_eq!(record["termination"]["type"], "natural_end", "{record}");
            assert_eq!(record["steps"], ROUNDS, "{record}");
            record["report"]["rate_limited"]["waited_ms"]
                .as_u64()
                .unwrap_or(0)
        }));
    }
    let mut per_run = Vec::new();
    for run in runs {
        per_run.push(run.await.unwrap());
    }
    {
        let tally = fake.tally.lock().unwrap();
        assert_eq!(
            tally.refused, 0,
            "the fake answered 429 {} times",
            tally.refused
        );
        assert_eq!(tally.accepted.len(), 50 * ROUNDS);
    }
    let utilization = fake.utilization();
    let mean = per_run.iter().sum::<u64>() as f64 / per_run.len() as f64;
    let longest = *per_run.iter().max().unwrap() as f64;
    eprintln!(
        "fleet: utilization {utilization:.3}, wait per run mean {mean:.0} ms, longest {longest:.0} ms"
    );
    assert!(
        utilization >= 0.9,
        "used {utilization:.3} of the allowed throughput"
    );
    assert!(
        longest <= 2.0 * mean,
        "longest wait {longest} ms, mean {mean} ms"
    );
    for node in nodes.iter() {
        let (status, providers) = node.get("/v1/providers").await;
        assert_eq!(status, 200);
        assert_eq!(providers[0]["usage"]["in_flight"], 0, "{providers}");
    }
    // The ledger's running totals match its rows.
    let pool = sqlx::PgPool::connect(&database().unwrap()).await.unwrap();
    let books: (i64, i64, i64) = sqlx::query_as(
        "SELECT requests, tokens, in_flight FROM rein_limit_books WHERE provider = $1",
    )
    .bind(&provider)
    .fetch_one(&pool)
    .await
    .unwrap();
    let rows: (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(tokens), 0)::BIGINT, count(*) FILTER (WHERE counts_until IS NULL)
         FROM rein_limit_reservations WHERE provider = $1",
    )
    .bind(&provider)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(books, rows);
    assert_eq!(books.2, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_holding_a_reservation_frees_it_when_its_lease_ends() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    let fake = Fake::start(100, 1_000_000, Duration::from_secs(1), Duration::ZERO, 1).await;
    let lease = 2;
    let config = deployment(
        &fake,
        &thread("killed").replace('-', "_"),
        "{ max_concurrent: 1 }",
        Some(lease),
    );
    let (a, b) = (Node::start(&config), Node::start(&config));
    let base = thread("killed");
    // a's inference hangs at the provider, holding the only slot.
    a.submit(
        &format!("{base}-a"),
        "worker",
        "[hang] the slow one",
        "reject",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fake.tally.lock().unwrap().accepted.is_empty() {
        assert!(std::time::Instant::now() < deadline, "a never sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal("-KILL");
    let (_, providers) = b.get("/v1/providers").await;
    assert_eq!(providers[0]["usage"]["in_flight"], 1, "{providers}");
    // b waits for the slot until a's lease has ended, then goes.
    let run = b
        .submit(&format!("{base}-b"), "worker", "hello", "reject")
        .await;
    let run_id = run["run_id"].as_str().unwrap();
    let events = b.events(run_id, None, Duration::from_secs(30)).await;
    assert!(
        events.iter().any(|(_, kind, _)| kind == "rate_limited"),
        "{events:?}"
    );
    let record = b.finished(run_id, Duration::from_secs(10)).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let waited = record["report"]["rate_limited"]["waited_ms"]
        .as_u64()
        .unwrap();
    assert!(waited <= (lease + 2) * 1000, "waited {waited} ms");
    assert_eq!(fake.tally.lock().unwrap().accepted.len(), 2);
    assert_eq!(fake.tally.lock().unwrap().refused, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_provider_is_down_falls_back_to_the_next_model() {
    let fake = Fake::start(100, 1_000_000, Duration::from_secs(1), Duration::ZERO, 1).await;
    // A port nothing listens on: bound, then closed.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let yaml = format!(
        r#"
providers:
  hosted: {{ kind: openai_compatible, base_url: "http://{down}/v1/" }}
  backup: {{ kind: openai_compatible, base_url: "{url}", limits: {{ max_concurrent: 4 }} }}
models:
  main: {{ provider: hosted, model: big-model, fallbacks: [small] }}
  small: {{ provider: backup, model: fake-model }}
agents:
  - {{ id: worker, model_id: main }}
"#,
        url = fake.url
    );
    let path = std::env::temp_dir().join(format!("rein-fallback-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    let node = Node::start(&path);
    let run = node
        .submit(&thread("fallback"), "worker", "hello", "reject")
        .await;
    let run_id = run["run_id"].as_str().unwrap();
    let events = node.events(run_id, None, Duration::from_secs(30)).await;
    let fallback = events
        .iter()
        .find(|(_, kind, _)| kind == "model_fallback")
        .expect("a model_fallback event");
    let data: Value = serde_json::from_str(&fallback.2).unwrap();
    assert_eq!(
        (data["from_model"].as_str(), data["to_model"].as_str()),
        (Some("main"), Some("small"))
    );
    let usage = events
        .iter()
        .find(|(_, kind, _)| kind == "round_usage")
        .expect("a round_usage event");
    let data: Value = serde_json::from_str(&usage.2).unwrap();
    assert_eq!(data["model"], "small");
    let record = node.finished(run_id, Duration::from_secs(10)).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "ok");
    let metrics = metrics(&node).await;
    assert!(
        metrics.contains("rein_model_fallbacks_total{model=\"main\"} 1"),
        "{metrics}"
    );
    assert_eq!(fake.tally.lock().unwrap().accepted.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_in_one_process_pauses_the_provider_in_every_process() {
    let Some(_) = database() else { return };
    let _shared = DATABASE.read().await;
    // The provider allows one request per 3 s; Rein is told nothing of it
    // (only `max_concurrent`), so its second request gets a 429.
    let fake = Fake::start(1, 1_000_000, Duration::from_secs(3), Duration::ZERO, 1).await;
    let provider = thread("paused").replace('-', "_");
    let config = deployment(&fake, &provider, "{ max_concurrent: 8 }", Some(5));
    let (a, b) = (Node::start(&config), Node::start(&config));
    let base = thread("paused");
    let first = a
        .submit(&format!("{base}-1"), "worker", "one", "reject")
        .await;
    a.finished(first["run_id"].as_str().unwrap(), Duration::from_secs(10))
        .await;
    let second = a
        .submit(&format!("{base}-2"), "worker", "two", "reject")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fake.tally.lock().unwrap().refusals.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no 429");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (refused_at, retry_after) = fake.tally.lock().unwrap().refusals[0];
    // The other process sees the pause (once a has recorded it, moments
    // after the 429), and its run waits it out.
    loop {
        let (_, providers) = b.get("/v1/providers").await;
        if providers[0]["usage"]["paused_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < refused_at + Duration::from_secs(2),
            "b never saw the pause: {providers}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let third = b
        .submit(&format!("{base}-3"), "worker", "three", "reject")
        .await;
    let third = b
        .finished(third["run_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(third["termination"]["type"], "natural_end", "{third}");
    assert!(
        third["report"]["rate_limited"]["waits"].as_u64().unwrap() >= 1,
        "{third}"
    );
    let second = a
        .finished(second["run_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(second["termination"]["type"], "natural_end", "{second}");
    // Nothing reached the provider while it was paused.
    let tally = fake.tally.lock().unwrap();
    let pause_end = refused_at + retry_after - Duration::from_millis(50);
    let during: Vec<_> = tally
        .accepted
        .iter()
        .map(|a| a.0)
        .chain(tally.refusals.iter().skip(1).map(|r| r.0))
        .filter(|at| *at > refused_at && *at < pause_end)
        .collect();
    assert!(
        during.is_empty(),
        "{} requests during the pause",
        during.len()
    );
}
