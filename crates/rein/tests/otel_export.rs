//! The `otel` feature: a run's GenAI spans reach an OTLP/HTTP endpoint.
//! The endpoint is a minimal HTTP server (`otlp_collector`) that keeps
//! each request body and answers 200, as a collector does.

#![cfg(feature = "otel")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;
mod otlp_collector;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use otlp_collector::collector;
use rein::otel::Otlp;
use rein::prelude::*;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

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
