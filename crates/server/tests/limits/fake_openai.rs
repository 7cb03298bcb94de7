//! An OpenAI-compatible server that enforces its own limits, as a hosted
//! provider does: per sliding window, at most so many requests and tokens
//! (prompt and answer, counted when the request arrives); past them it
//! answers 429 with `Retry-After`. A conversation gets `rounds - 1` calls
//! of a tool `lookup` (which the agent lacks: its error result is the next
//! round's input), then "ok" — streamed, with usage; a prompt marked
//! `[hang]` is answered after a minute. It records what it accepted and
//! refused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// The answer's tokens, as the fake reports them.
pub(crate) const COMPLETION_TOKENS: u64 = 3;

#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Accepted requests: when each arrived, and its tokens.
    pub(crate) accepted: Vec<(Instant, u64)>,
    /// Refused (429) requests.
    pub(crate) refused: u64,
    /// When each refused request arrived, and the `Retry-After` it got.
    pub(crate) refusals: Vec<(Instant, Duration)>,
    window: VecDeque<(Instant, u64)>,
}

pub(crate) struct Fake {
    pub(crate) url: String,
    pub(crate) tally: Arc<Mutex<Tally>>,
    pub requests: u64,
    pub tokens: u64,
    pub window: Duration,
}

struct Limits {
    requests: u64,
    tokens: u64,
    window: Duration,
    delay: Duration,
    rounds: usize,
    tally: Arc<Mutex<Tally>>,
}

/// The prompt's tokens as the fake counts them: a quarter of its text's
/// bytes, rounded up, and 4 per message.
fn prompt_tokens(body: &Value) -> u64 {
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| {
                    let text = match &m["content"] {
                        Value::String(s) => s.len(),
                        other => other.to_string().len(),
                    } as u64;
                    text.div_ceil(4) + 4
                })
                .sum()
        })
        .unwrap_or(0)
}

async fn completions(State(limits): State<Arc<Limits>>, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let prompt = prompt_tokens(&body);
    let tokens = prompt + COMPLETION_TOKENS;
    let now = Instant::now();
    {
        let mut tally = limits.tally.lock().unwrap();
        while tally
            .window
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= limits.window)
        {
            tally.window.pop_front();
        }
        let used: u64 = tally.window.iter().map(|(_, t)| t).sum();
        if tally.window.len() as u64 >= limits.requests || used + tokens > limits.tokens {
            tally.refused += 1;
            let retry = tally.window.front().map_or(Duration::ZERO, |(at, _)| {
                limits.window - now.duration_since(*at)
            });
            tally.refusals.push((now, retry));
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after-ms", retry.as_millis().to_string())],
                json!({"error": {"message": "rate limit exceeded", "type": "rate_limit_error"}})
                    .to_string(),
            )
                .into_response();
        }
        tally.window.push_back((now, tokens));
        tally.accepted.push((now, tokens));
    }
    tokio::time::sleep(limits.delay).await;
    // A prompt marked "[hang]" is answered after a minute (a stuck call).
    if body.to_string().contains("[hang]") {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let messages = body["messages"].as_array().map_or(0, Vec::len);
    let answer = if messages < 1 + 2 * (limits.rounds - 1) {
        let call = json!([{"index": 0, "id": format!("call_{messages}"), "type": "function",
                           "function": {"name": "lookup", "arguments": "{}"}}]);
        [
            chunk(
                json!({"role": "assistant", "content": null, "tool_calls": call}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
        ]
    } else {
        [
            chunk(json!({"role": "assistant", "content": "ok"}), Value::Null),
            chunk(json!({}), json!("stop")),
        ]
    };
    let usage = json!({"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
        "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": COMPLETION_TOKENS,
                                  "total_tokens": tokens}});
    let stream = answer
        .iter()
        .chain(std::iter::once(&usage))
        .map(|v| format!("data: {v}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
        .collect::<String>();
    ([("content-type", "text/event-stream")], stream).into_response()
}

impl Fake {
    /// Serves on 127.0.0.1 with `requests` and `tokens` per `window`, each
    /// answer after `delay`, each conversation `rounds` inferences long.
    pub(crate) async fn start(
        requests: u64,
        tokens: u64,
        window: Duration,
        delay: Duration,
        rounds: usize,
    ) -> Self {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let limits = Arc::new(Limits {
            requests,
            tokens,
            window,
            delay,
            rounds,
            tally: tally.clone(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(limits);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            tally,
            requests,
            tokens,
            window,
        }
    }

    /// The share of the allowed throughput used, by the binding limit
    /// (requests or tokens) of each window: whole windows from the first
    /// accepted request, averaged, leaving out the last (in which the
    /// work ran out).
    pub(crate) fn utilization(&self) -> f64 {
        let tally = self.tally.lock().unwrap();
        let Some(first) = tally.accepted.iter().map(|a| a.0).min() else {
            return 0.0;
        };
        let mut windows = std::collections::BTreeMap::<u128, (u64, u64)>::new();
        for (at, tokens) in &tally.accepted {
            let w = windows
                .entry((*at - first).as_millis() / self.window.as_millis())
                .or_default();
            w.0 += 1;
            w.1 += tokens;
        }
        let last = windows.keys().max().copied().unwrap_or(0);
        let used: Vec<f64> = (0..last.max(1))
            .map(|k| {
                let (requests, tokens) = windows.get(&k).copied().unwrap_or_default();
                (requests as f64 / self.requests as f64).max(tokens as f64 / self.tokens as f64)
            })
            .collect();
        used.iter().sum::<f64>() / used.len() as f64
    }
}
