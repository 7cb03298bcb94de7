//! Auto mode's stop reasons in the log. Alone in its test binary: the log
//! line's callsite is shared process-wide, and another test's auto run
//! registering it at the moment this test installs its subscriber could
//! leave it disabled (`tracing` caches each callsite's interest).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use rein::auto::{AutomationPlugin, AutomationPolicy};
use rein::prelude::*;
use serde_json::json;

/// A log writer appending to a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn each_stop_reason_also_goes_to_the_log() {
    let log = LogBuffer::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let policy = AutomationPolicy::from_json(r#"{"maxExperiments": 1}"#).unwrap();
    // Each round: one experiment reported, then an answer.
    let model = ScriptedExecutor::from_fn(|req| match req.messages.last().unwrap().role {
        Role::User => {
            ScriptedResponse::tool_call("report_metrics", json!({"metrics": {"Val ACC": 0.5}}))
        }
        _ => ScriptedResponse::text("Experiment done."),
    });
    let runtime = builder_with(model, spec().with_plugin_id("auto"))
        .with_plugin("auto", Arc::new(AutomationPlugin::new()))
        .build()
        .unwrap();
    let r = runtime
        .auto_run(
            user("logged", "go"),
            policy,
            Arc::new(CollectingSink::new()),
        )
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "max experiments reached (1/1)");
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("auto-run stop condition: max experiments reached (1/1)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("INFO") && line.contains("thread_id=\"logged\""),
        "{line}"
    );
}
