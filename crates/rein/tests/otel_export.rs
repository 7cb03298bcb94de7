//! The `otel` feature: a run's GenAI spans reach an OTLP/HTTP endpoint.
//! The endpoint is a minimal HTTP server in this test that keeps each
//! request body (OTLP JSON) and answers 200, as a collector does.

#![cfg(feature = "otel")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use rein::otel::Otlp;
use rein::prelude::*;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

/// Serves OTLP/HTTP requests on a free port; sends each body to the channel.
fn collector() -> (String, mpsc::Receiver<(String, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let (sender, bodies) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
                    let _ = sender.send((path, String::from_utf8_lossy(&body).into_owned()));
                    writer
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
                        )
                        .unwrap();
                }
            });
        }
    });
    (url, bodies)
}

#[tokio::test]
async fn a_runs_genai_spans_are_exported_over_otlp() {
    let (url, bodies) = collector();
    let (layer, guard) = Otlp::new("rein-test")
        .with_endpoint(&url)
        .with_json()
        .layer()
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    let _default = tracing::subscriber::set_default(subscriber);

    let runtime = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::tool_call("echo", json!({"x": 1})).with_usage(5, 1),
            ScriptedResponse::text("done").with_usage(7, 1),
        ]),
        spec(),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .build()
    .unwrap();
    runtime
        .run_to_completion(user("t-otel", "go"))
        .await
        .unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    guard.flush().unwrap();

    let mut seen = String::new();
    while let Ok((path, body)) = bodies.recv_timeout(Duration::from_secs(10)) {
        assert_eq!(path, "/v1/traces");
        seen.push_str(&body);
        if seen.contains("invoke_agent agent") {
            break;
        }
    }
    for expected in [
        "\"invoke_agent agent\"",
        "\"chat scripted-model\"",
        "\"execute_tool echo\"",
        "gen_ai.conversation.id",
        "\"t-otel\"",
        "gen_ai.usage.input_tokens",
        "\"rein-test\"",
    ] {
        assert!(seen.contains(expected), "{expected} missing from {seen}");
    }
    drop(guard);
}
