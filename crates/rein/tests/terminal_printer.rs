//! `TerminalPrinter`: the model's text to one writer as it streams, a line
//! per tool call, retry, nudge and end to the other.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rein::contract::inference::{InferenceError, InferenceErrorKind};
use rein::events::TerminalPrinter;
use rein::prelude::*;
use serde_json::json;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn printer() -> (TerminalPrinter, Buffer, Buffer) {
    let (out, err) = (Buffer::default(), Buffer::default());
    (
        TerminalPrinter::with_writers(out.clone(), err.clone()),
        out,
        err,
    )
}

#[tokio::test]
async fn text_goes_to_one_writer_and_tool_calls_and_the_end_to_the_other() {
    let rt = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::text("Checking.")
                .with_tool_call("echo", json!({"city": "Paris"}))
                .with_usage(42, 12),
            ScriptedResponse::tool_call("failing", json!({})),
            ScriptedResponse::text("It rains.").with_usage(71, 15),
        ]),
        spec(),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .with_tool("failing", Arc::new(Failing))
    .build()
    .unwrap();
    let (printer, out, err) = printer();
    let result = printer
        .print_stream(rt.run_stream(user("t", "rain?")))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    // Text only, with the open line ended before the first status line.
    assert_eq!(out.text(), "Checking.\nIt rains.\n");
    let lines: Vec<String> = err.text().lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        vec![
            r#"[tool] echo {"city":"Paris"}"#.to_owned(),
            r#"[tool] echo -> {"echo":{"city":"Paris"}}"#.to_owned(),
            "[tool] failing {}".to_owned(),
            "[tool] failing failed: error: disk on fire".to_owned(),
            "[end] natural_end · 3 rounds · 113 tokens in / 27 out".to_owned(),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn retries_nudges_and_a_stop_with_its_detail_get_a_line_each() {
    let rt = builder_with(
        ScriptedExecutor::new(vec![
            ScriptedResponse::error(InferenceError::new(
                InferenceErrorKind::RateLimited,
                "slow down",
            )),
            ScriptedResponse::tool_call("echo", json!({})),
        ])
        .repeat_last(),
        spec().with_max_rounds(20).with_stop_condition(
            load_stop_conditions_yaml(
                "- { type: tool_call_loop, threshold: 3, on_detect: nudge_then_stop }",
            )
            .unwrap()
            .remove(0),
        ),
    )
    .with_tool("echo", Arc::new(Echo("echo")))
    .with_retry_backoff(Duration::from_millis(100), Duration::from_millis(100))
    .build()
    .unwrap();
    let (printer, _out, err) = printer();
    // As a sink this time.
    let result = rt.run(user("t", "go"), Arc::new(printer)).await.unwrap();
    assert_eq!(result.termination.code(), "tool_call_loop");
    let text = err.text();
    let retry = text.lines().find(|l| l.starts_with("[retry]")).unwrap();
    assert!(retry.starts_with("[retry] attempt 2 in "), "{text}");
    assert!(retry.contains("slow down"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("[nudge] ")), "{text}");
    let end = text.lines().last().unwrap();
    assert!(
        end.starts_with("[end] stopped (tool_call_loop): "),
        "{text}"
    );
}
