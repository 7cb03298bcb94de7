//! W7, W7b and retention: the service over HTTP on loopback.
//!
//! The server (`rein_server::serve`) and its clients (reqwest) run in this
//! process on the same two-worker runtime, so a figure includes the
//! clients' own cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rein::contract::message::Role;
use rein::prelude::*;
use rein_server::deployment::Deployment;
use rein_server::service::{Service, Strategy, Submission};

use crate::{emit, fail, percentile, sorted, status_kb};

/// The model of every HTTP workload: a tool call, then an answer once the
/// tool's result is in (one tool round per run).
fn one_tool_round() -> ScriptedExecutor {
    ScriptedExecutor::from_fn(|request| match request.messages.last().map(|m| m.role) {
        Some(Role::Tool) => ScriptedResponse::text("done"),
        _ => ScriptedResponse::tool_call("echo", rein::serde_json::json!({"x": 1})),
    })
}

struct Echo;

#[rein::async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "echoes")
    }
    async fn execute(
        &self,
        args: rein::serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::json(args))
    }
}

/// A service whose one agent runs [`one_tool_round`], keeping at most
/// `keep` finished runs.
fn service(keep: usize) -> Service {
    let yaml = format!(
        "providers: {{ p: {{ kind: scripted, responses: [\"unused\"] }} }}\n\
         models: {{ m: {{ provider: p, model: x }} }}\n\
         agents: [ {{ id: a, model_id: m }} ]\n\
         server: {{ retention: {{ max_finished_runs: {keep}, finished_run_ttl_seconds: 3600 }} }}\n"
    );
    let deployment = Deployment::from_yaml(&yaml).unwrap_or_else(|e| fail(&e.to_string()));
    let runtime = rein_server::assemble::builder(&deployment)
        .unwrap_or_else(|e| fail(&e.to_string()))
        .with_provider("bench", Arc::new(one_tool_round()))
        .with_model(ModelSpec::new("bench-model", "bench", "x"))
        .with_agent_spec(AgentSpec::new("bench").with_model_id("bench-model"))
        .with_tool("echo", Arc::new(Echo))
        .build()
        .unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")));
    Service::new(runtime, deployment.server.service())
}

/// Serves `service` on a free loopback port; returns its base URL.
async fn serve(service: Service) -> String {
    serve_with(service, rein_server::deployment::ServerSettings::default()).await
}

/// [`serve`] with `settings`.
async fn serve_with(service: Service, settings: rein_server::deployment::ServerSettings) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| fail(&format!("cannot bind: {e}")));
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .unwrap_or_else(|e| fail(&e.to_string()))
    );
    tokio::spawn(rein_server::serve(
        listener,
        service,
        settings,
        std::future::pending(),
    ));
    url
}

/// The token W7 with auth on presents: `REIN_BENCH_TOKENS`, which
/// `cargo xtask bench` sets, holds `bench=<token>`.
fn bench_token() -> String {
    std::env::var("REIN_BENCH_TOKENS")
        .ok()
        .and_then(|t| t.split_once('=').map(|(_, token)| token.to_owned()))
        .unwrap_or_else(|| {
            fail("http_auth: set REIN_BENCH_TOKENS=bench=<token> (cargo xtask bench does)")
        })
}

fn body(thread: &str) -> rein::serde_json::Value {
    rein::serde_json::json!({
        "agent_id": "bench",
        "messages": [{"role": "user", "content": format!("go {thread}")}]
    })
}

/// W7: `clients` concurrent clients submit `?wait=true` runs (one tool
/// round each) on their own threads until `runs` are done; runs/s and the
/// round-trip latency.
pub(crate) async fn round_trips(clients: usize, runs: usize) {
    let url = serve(service(10_000)).await;
    let start = Instant::now();
    let latencies = sorted(batch(&url, None, clients, runs, "w7").await);
    let wall = start.elapsed().as_secs_f64();
    emit(
        "http",
        "runs_per_sec",
        latencies.len() as f64 / wall,
        "runs/s",
    );
    emit("http", "latency_p50", percentile(&latencies, 0.5), "ms");
    emit("http", "latency_p99", percentile(&latencies, 0.99), "ms");
}

/// W7 with auth on, against W7 in the same process: two servers, one
/// checking bearer tokens (`server.auth`, every request presenting one),
/// and batches of W7 alternating between them (the order flipped each
/// time), so that drifts of the machine fall on both alike. Runs/s of each
/// and their ratio.
pub(crate) async fn auth_round_trips(clients: usize, runs: usize, batches: usize) {
    let settings = rein_server::deployment::ServerSettings {
        auth: Some(rein_server::deployment::AuthSettings {
            tokens_env: "REIN_BENCH_TOKENS".to_owned(),
        }),
        ..rein_server::deployment::ServerSettings::default()
    };
    let token = bench_token();
    let open = serve(service(10_000)).await;
    let guarded = serve_with(service(10_000), settings).await;
    let per_batch = runs.div_ceil(batches);
    let (mut plain, mut auth) = ((0, 0.0), (0, 0.0));
    for b in 0..batches {
        for with_auth in if b % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let (url, token, tally) = if with_auth {
                (&guarded, Some(token.as_str()), &mut auth)
            } else {
                (&open, None, &mut plain)
            };
            let start = Instant::now();
            let done = batch(url, token, clients, per_batch, &format!("w7a-{b}"))
                .await
                .len();
            tally.0 += done;
            tally.1 += start.elapsed().as_secs_f64();
        }
    }
    let (plain, auth) = (plain.0 as f64 / plain.1, auth.0 as f64 / auth.1);
    emit("http_auth", "runs_per_sec_without_auth", plain, "runs/s");
    emit("http_auth", "runs_per_sec_with_auth", auth, "runs/s");
    emit("http_auth", "with_over_without", auth / plain, "ratio");
}

/// `clients` clients submitting `?wait=true` runs on threads of their own
/// until `runs` are done, with `token` if given; each run's latency (ms).
async fn batch(url: &str, token: Option<&str>, clients: usize, runs: usize, tag: &str) -> Vec<f64> {
    let per_client = runs.div_ceil(clients);
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let url = url.to_owned();
        let token = token.map(str::to_owned);
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut latencies = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let thread = format!("{tag}-{c}-{i}");
                let t0 = Instant::now();
                let mut request = client
                    .post(format!("{url}/v1/threads/{thread}/runs?wait=true"))
                    .json(&body(&thread));
                if let Some(token) = &token {
                    request = request.bearer_auth(token);
                }
                let response = request
                    .send()
                    .await
                    .unwrap_or_else(|e| fail(&format!("http: {e}")));
                let record: rein::serde_json::Value = response
                    .json()
                    .await
                    .unwrap_or_else(|e| fail(&format!("http: {e}")));
                latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                if record["termination"]["type"] != "natural_end" || record["steps"] != 2 {
                    fail(&format!("http: unexpected record {record}"));
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap_or_else(|e| fail(&e.to_string())));
    }
    latencies
}

/// W7b: submit (no wait), then open the run's SSE stream; the time from
/// the submission's start to the first event, one run at a time.
pub(crate) async fn first_event(trials: usize) {
    let url = serve(service(10_000)).await;
    let client = reqwest::Client::new();
    let mut waits = Vec::with_capacity(trials);
    for i in 0..trials {
        let thread = format!("w7b-{i}");
        let t0 = Instant::now();
        let accepted: rein::serde_json::Value = client
            .post(format!("{url}/v1/threads/{thread}/runs"))
            .json(&body(&thread))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| fail(&format!("http: {e}")))
            .json()
            .await
            .unwrap_or_else(|e| fail(&format!("http: {e}")));
        let run_id = accepted["run_id"].as_str().unwrap_or_default().to_owned();
        let mut events = client
            .get(format!("{url}/v1/runs/{run_id}/events"))
            .send()
            .await
            .unwrap_or_else(|e| fail(&format!("http: {e}")))
            .bytes_stream();
        match events.next().await {
            Some(Ok(chunk)) if chunk.starts_with(b"event: run_started") => {}
            other => fail(&format!(
                "http_first_event: unexpected first chunk {other:?}"
            )),
        }
        waits.push(t0.elapsed().as_secs_f64() * 1e3);
        // Read the rest so the run's stream ends before the next trial.
        while events.next().await.is_some() {}
    }
    let waits = sorted(waits);
    emit("http_first_event", "p50", percentile(&waits, 0.5), "ms");
    emit("http_first_event", "p99", percentile(&waits, 0.99), "ms");
}

/// Retention: `runs` runs through the service (no HTTP), each on its own
/// thread that is deleted afterwards, at most `keep` finished runs kept;
/// the resident memory added at half way and at the end (equal when
/// retention bounds it), and the records kept at the end.
pub(crate) async fn retention(runs: usize, keep: usize) {
    let service = service(keep);
    let before = status_kb("VmRSS:");
    let mut batch = Vec::new();
    for i in 0..runs {
        let submission = Submission {
            agent_id: Some("bench".into()),
            messages: vec![Message::user("go")],
            strategy: Strategy::Interrupt,
            idempotency_key: Some(format!("k{i}")),
            ..Submission::default()
        };
        let service = service.clone();
        batch.push(tokio::spawn(async move {
            let submitted = service
                .submit(&format!("r-{i}"), submission)
                .await
                .unwrap_or_else(|e| fail(&format!("retention: {e}")));
            submitted.entry().finished().await;
            // The history is the store's, not the records': dropped, so
            // what stays is what retention bounds.
            service
                .delete_thread(&format!("r-{i}"))
                .await
                .unwrap_or_else(|e| fail(&format!("retention: {e}")));
        }));
        if batch.len() == 256 {
            for task in batch.drain(..) {
                task.await.unwrap_or_else(|e| fail(&e.to_string()));
            }
        }
        if i + 1 == runs / 2 {
            let half = status_kb("VmRSS:");
            emit(
                "http_retention",
                "rss_added_at_half",
                (half - before) / 1024.0,
                "MB",
            );
        }
    }
    for task in batch {
        task.await.unwrap_or_else(|e| fail(&e.to_string()));
    }
    // Let the last drivers record their runs.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = status_kb("VmRSS:");
    emit(
        "http_retention",
        "kept_runs",
        service.kept_runs() as f64,
        "runs",
    );
    emit(
        "http_retention",
        "rss_added",
        (after - before) / 1024.0,
        "MB",
    );
}
