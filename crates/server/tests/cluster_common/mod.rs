//! What the multi-process suites share: real `rein serve` processes on one
//! PostgreSQL database (`REIN_DATABASE_URL`), and helpers to drive them.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub(crate) fn database() -> Option<String> {
    match std::env::var("REIN_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let _ = std::io::stderr()
                .write_all(b"multi-process tests skipped: REIN_DATABASE_URL is not set\n");
            None
        }
    }
}

/// The database restart takes every lease's clock away for a moment (a
/// restart longer than a lease is a take-over): it runs alone, the other
/// tests share the database.
pub(crate) static DATABASE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub(crate) fn config(lease_seconds: u64) -> PathBuf {
    let yaml = format!(
        r#"
providers:
  quick: {{ kind: scripted, responses: ["Done."] }}
  slow: {{ kind: scripted, chunk_delay_ms: 100, responses: ["{words}"] }}
  lab:
    kind: scripted
    responses:
      - {{ tool_calls: [ {{ name: report_metrics, arguments: {{ metrics: {{ acc: 0.5 }} }} }} ], usage: {{ input: 100, output: 20 }} }}
      - {{ text: "One.", usage: {{ input: 100, output: 20 }} }}
      - {{ tool_calls: [ {{ name: report_metrics, arguments: {{ metrics: {{ acc: 0.6 }} }} }} ], usage: {{ input: 100, output: 20 }} }}
      - {{ text: "Two.", usage: {{ input: 100, output: 20 }} }}
models:
  quick: {{ provider: quick, model: q }}
  slow: {{ provider: slow, model: s }}
  lab: {{ provider: lab, model: x }}
agents:
  - {{ id: quick, model_id: quick }}
  - {{ id: slow, model_id: slow }}
  # Auto mode's tests (every node of the shared database knows every
  # agent: a process may take over any thread whose owner is gone).
  - {{ id: lab, model_id: lab, plugin_ids: [automation] }}
store: {{ postgres: {{ url_env: REIN_DATABASE_URL }} }}
server: {{ lease_seconds: {lease_seconds} }}
"#,
        words = (1..=40)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    // One file per call: tests run in parallel, and rewriting a file another
    // test's process is reading hands it an empty configuration.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "rein-cluster-{}-{n}-{lease_seconds}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// One `rein serve` process.
pub(crate) struct Node {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) client: reqwest::Client,
}

impl Node {
    pub(crate) fn start(config: &PathBuf) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--config"])
            .arg(config)
            .args(["--bind", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no listening line: {line:?}"))
            .to_owned();
        Self {
            child,
            url,
            client: reqwest::Client::new(),
        }
    }

    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn submit(
        &self,
        thread: &str,
        agent: &str,
        text: &str,
        strategy: &str,
    ) -> Value {
        let (status, body) = self
            .post(
                &format!("/v1/threads/{thread}/runs"),
                json!({"agent_id": agent, "strategy": strategy,
                       "messages": [{"role": "user", "content": text}]}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body
    }

    /// Polls the run record until it is finished.
    pub(crate) async fn finished(&self, run_id: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, record) = self.get(&format!("/v1/runs/{run_id}")).await;
            assert_eq!(status, 200, "{record}");
            if record["status"] == "finished" {
                return record;
            }
            assert!(
                Instant::now() < deadline,
                "run {run_id} not finished: {record}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Node {
    /// A run's SSE stream read to its end (at most `within`), after
    /// `Last-Event-ID` `after` if given: each event's id, type and data.
    pub(crate) async fn events(
        &self,
        run_id: &str,
        after: Option<u64>,
        within: Duration,
    ) -> Vec<(u64, String, String)> {
        use futures::StreamExt;
        let mut request = self
            .client
            .get(format!("{}/v1/runs/{run_id}/events", self.url));
        if let Some(id) = after {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let mut body = response.bytes_stream();
        let mut text = String::new();
        let read = tokio::time::timeout(within, async {
            while let Some(chunk) = body.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "the stream of {run_id} did not end within {within:?}: {text}"
        );
        text.split("\n\n")
            .filter_map(|block| {
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::to_owned)
                };
                Some((
                    field("id: ")?.parse().ok()?,
                    field("event: ")?,
                    field("data: ")?,
                ))
            })
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // By PID: SIGCONT first, in case it is stopped, then SIGKILL.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn thread(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// A history is valid when it alternates user input and answers and every
/// tool call has a result.
pub(crate) fn assert_valid(history: &Value) {
    let messages = history.as_array().unwrap();
    let mut open: BTreeSet<String> = BTreeSet::new();
    for m in messages {
        if let Some(calls) = m["tool_calls"].as_array() {
            for c in calls {
                open.insert(c["id"].as_str().unwrap().to_owned());
            }
        }
        if let Some(id) = m["tool_call_id"].as_str() {
            assert!(open.remove(id), "a result without its call: {history}");
        }
    }
    assert!(open.is_empty(), "calls without results {open:?}: {history}");
}
