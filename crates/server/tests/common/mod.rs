//! A server on a free loopback port, and a client for it.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::Duration;

use futures::StreamExt;
use rein_server::deployment::Deployment;
use rein_server::service::Service;
use serde_json::Value;

/// A running server: its base URL, its service, and a way to stop it.
pub struct Server {
    pub url: String,
    pub service: Service,
    pub assembled: std::sync::Arc<rein_server::assemble::Assembled>,
    pub client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    pub async fn start(yaml: &str) -> Self {
        let deployment = Deployment::from_yaml(yaml).unwrap();
        let assembled =
            std::sync::Arc::new(rein_server::assemble::start(&deployment).await.unwrap());
        Self::serve(assembled, deployment.server).await
    }

    /// A server over a runtime built in code (default server settings,
    /// in-process service, no MCP servers).
    pub async fn start_runtime(runtime: rein::AgentRuntime) -> Self {
        let assembled = std::sync::Arc::new(rein_server::assemble::Assembled {
            runtime,
            mcp_servers: std::collections::BTreeMap::new(),
            database: None,
            agent_autos: Vec::new(),
        });
        Self::serve(
            assembled,
            rein_server::deployment::ServerSettings::default(),
        )
        .await
    }

    /// A server over a started deployment.
    pub async fn start_assembled(
        assembled: rein_server::assemble::Assembled,
        settings: rein_server::deployment::ServerSettings,
    ) -> Self {
        Self::serve(std::sync::Arc::new(assembled), settings).await
    }

    async fn serve(
        assembled: std::sync::Arc<rein_server::assemble::Assembled>,
        settings: rein_server::deployment::ServerSettings,
    ) -> Self {
        let service: Service = assembled.service(&settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(rein_server::serve(
            listener,
            service.clone(),
            settings,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            url,
            service,
            assembled,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Shuts the server down and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        self.assembled.shutdown_mcp().await;
    }

    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(self.at(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.at(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = self
            .client
            .post(self.at(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Submits one user message; returns the status and body.
    pub async fn say(&self, thread: &str, text: &str, extra: Value) -> (u16, Value) {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": text}]});
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        self.post(&format!("/v1/threads/{thread}/runs"), body).await
    }

    /// The contents of the thread's user messages, in order.
    pub async fn user_messages(&self, thread: &str) -> Vec<String> {
        let (status, history) = self.get(&format!("/v1/threads/{thread}/messages")).await;
        assert_eq!(status, 200, "{history}");
        history
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Polls a run until it is finished; returns its record.
    pub async fn finished(&self, run_id: &str) -> Value {
        for _ in 0..2000 {
            let (status, record) = self.get(&format!("/v1/runs/{run_id}")).await;
            assert_eq!(status, 200, "{record}");
            if record["status"] == "finished" {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("run {run_id} never finished");
    }

    /// Opens a run's event stream (SSE), from its start.
    pub async fn run_events(&self, run_id: &str) -> reqwest::Response {
        let response = self
            .client
            .get(self.at(&format!("/v1/runs/{run_id}/events")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response
    }

    /// Reads an SSE response to its end: (id, event, data) per event.
    pub async fn sse(
        &self,
        path: &str,
        last_event_id: Option<u64>,
    ) -> Vec<(String, String, Value)> {
        let mut request = self.client.get(self.at(path));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        read_sse(response, usize::MAX).await
    }
}

/// The URL a spawned `rein serve` (stdout piped) announces on its one
/// line, `listening on <url>`.
pub fn listening(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("no listening line: {line:?}"))
        .to_owned()
}

/// Reads up to `max` SSE events from a response (to its end if fewer).
pub async fn read_sse(response: reqwest::Response, max: usize) -> Vec<(String, String, Value)> {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while events.len() < max {
        let Some(chunk) = body.next().await else {
            break;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut kind, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_owned();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if !data.is_empty() {
                events.push((id, kind, serde_json::from_str(&data).unwrap()));
            }
        }
    }
    events
}

/// A deployment with a fast scripted agent `fast`, and `slow` (50 ms per
/// word) holding runs busy for a while.
pub const YAML: &str = r#"
providers:
  quick: { kind: scripted, responses: ["Done quickly."] }
  slow: { kind: scripted, chunk_delay_ms: 50, responses: ["one two three four five six seven eight nine ten eleven twelve"] }
  tools:
    kind: scripted
    responses:
      - { text: "Finishing.", tool_calls: [ { name: terminate, arguments: { status: success, message: ok } } ] }
models:
  quick: { provider: quick, model: q }
  slow: { provider: slow, model: s }
  tools: { provider: tools, model: t }
agents:
  - { id: fast, model_id: quick }
  - { id: slow, model_id: slow }
  - { id: finisher, model_id: tools, plugin_ids: [terminate] }
"#;
