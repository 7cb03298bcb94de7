//! The web console in real headless Chromium, driven by `playwright-core`
//! (`tests/console/browser.cjs`) against the `rein` binary with auth on:
//! send a message and watch its run stream to the end, cancel a running
//! run, approve a pending call, open a sub-agent tree, replay a recording.
//! Each test saves a screenshot under `target/tmp/console/`.
//!
//! `.ci/run` installs Debian's `chromium` and `playwright-core` (into
//! `$HOME/.cache/rein-npm/console`) and sets `REIN_CHROMIUM` and
//! `REIN_PLAYWRIGHT`; without them the tests say they are skipped (in CI
//! they fail instead).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const TOKEN: &str = "console-test-token-0123456789";

const YAML: &str = r#"
providers:
  writer:
    kind: scripted
    chunk_delay_ms: 25
    responses:
      - { text: "Let me ask the researcher.", tool_calls: [ { name: research, arguments: { task: "the launch date" } } ], usage: { input: 120, output: 14 } }
      - { text: "The launch is on Monday; the researcher confirmed the date and the venue.", usage: { input: 190, output: 22 } }
  researcher: { kind: scripted, chunk_delay_ms: 5, responses: [ { text: "Monday, at the venue.", usage: { input: 30, output: 6 } } ] }
  slow: { kind: scripted, chunk_delay_ms: 300, responses: ["this answer takes a long long long long long long long time to arrive"] }
  ops:
    kind: scripted
    responses:
      - { text: "Finishing.", tool_calls: [ { name: terminate, arguments: { status: success, message: done } } ] }
  lead:
    kind: scripted
    responses:
      - { tool_calls: [ { name: research, arguments: { task: "find the trains" } } ] }
      - "The researcher found them."
  quiet: { kind: scripted, responses: ["Fine."] }
  patient:
    kind: scripted
    responses:
      - { tool_calls: [ { name: dawdle, arguments: { task: "count slowly" } } ] }
      - "I went on without the dawdler."
  dawdler: { kind: scripted, chunk_delay_ms: 300, responses: ["one two three four five six seven eight nine ten eleven twelve"] }
models:
  writer: { provider: writer, model: w }
  researcher: { provider: researcher, model: r }
  slow: { provider: slow, model: s }
  ops: { provider: ops, model: o }
  lead: { provider: lead, model: l }
  quiet: { provider: quiet, model: q }
  patient: { provider: patient, model: p }
  dawdler: { provider: dawdler, model: d }
agents:
  - id: writer
    model_id: writer
    stop_conditions: [ { type: token_budget, max_total: 600 } ]
    subagents: [ { agent: researcher, tool: research, description: "Research one question." } ]
  - { id: researcher, model_id: researcher }
  - { id: slow, model_id: slow }
  - { id: ops, model_id: ops, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }
  - id: lead
    model_id: lead
    subagents: [ { agent: researcher, tool: research, description: "Research one question." } ]
  - id: guarded
    model_id: quiet
    stop_conditions: [ { type: tool_call_loop, threshold: 3 }, { type: tool_error_loop, threshold: 4 } ]
  - id: patient
    model_id: patient
    subagents: [ { agent: dawdler, tool: dawdle, description: "Does one thing slowly." } ]
  - { id: dawdler, model_id: dawdler }
server: { auth: { tokens_env: REIN_CONSOLE_TEST_TOKENS } }
"#;

/// `playwright-core`'s `node_modules` and the browser, or `None` (skipped).
fn browser() -> Option<(PathBuf, PathBuf)> {
    let modules = std::env::var_os("REIN_PLAYWRIGHT").map(PathBuf::from);
    let chromium = std::env::var_os("REIN_CHROMIUM").map(PathBuf::from);
    match (modules, chromium) {
        (Some(m), Some(c)) if m.join("playwright-core").exists() && c.exists() => Some((m, c)),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must set REIN_PLAYWRIGHT and REIN_CHROMIUM (.ci/run installs them)"
            );
            let _ = std::io::stderr().write_all(
                b"console browser tests skipped: REIN_PLAYWRIGHT / REIN_CHROMIUM not set (.ci/run installs playwright-core and chromium)\n",
            );
            None
        }
    }
}

/// `rein serve` with the console's deployment; killed by PID on drop.
struct Serve {
    child: std::process::Child,
    url: String,
}

impl Serve {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rein-console-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("rein.yaml");
        std::fs::write(&config, YAML).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--bind", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env("REIN_CONSOLE_TEST_TOKENS", TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let url = common::listening(&mut child);
        Self { child, url }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the screenshots go: `target/tmp/console`.
fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs one scenario of `browser.cjs` against a fresh server; its facts.
fn scenario(name: &str) -> Option<Value> {
    let (modules, chromium) = browser()?;
    let server = Serve::start(name);
    let out = out_dir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/browser.cjs");
    let output = Command::new("node")
        .arg(script)
        .args([&server.url, TOKEN, name])
        .arg(&out)
        .env("NODE_PATH", modules)
        .env("REIN_CHROMIUM", chromium)
        .env(
            "REIN_RECORDING",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/loop-recording.jsonl"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let facts: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "{name}: no result from the browser: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    assert!(
        output.status.success() && facts["ok"] == true,
        "{name}: {facts:#}"
    );
    let screenshot = out.join(facts["screenshot"].as_str().unwrap());
    assert!(
        std::fs::metadata(&screenshot).unwrap().len() > 10_000,
        "{name}: the screenshot {} is empty",
        screenshot.display()
    );
    Some(facts)
}

#[test]
fn a_message_sent_from_the_console_streams_its_run_to_the_end() {
    let Some(facts) = scenario("stream") else {
        return;
    };
    assert!(
        facts["refused"].as_str().unwrap().contains("token"),
        "without a token the page says to enter one: {facts}"
    );
    let text = facts["text"].as_str().unwrap();
    assert_eq!(
        text,
        "The launch is on Monday; the researcher confirmed the date and the venue."
    );
    // Seen while streaming: a part of the text, before the run ended.
    let partial = facts["partial"].as_str().unwrap();
    assert!(!partial.is_empty() && text.starts_with(partial), "{facts}");
    assert_eq!(facts["termination"], "natural_end");
    assert_eq!(facts["tool"], "research");
    assert_eq!(facts["bars"], 2, "one bar per round: {facts}");
    assert_eq!(facts["budget"], "600");
    assert!(
        facts["limits"].as_str().unwrap().contains("token_budget"),
        "{facts}"
    );
    assert!(
        facts["listed"].as_str().unwrap().contains("writer"),
        "{facts}"
    );
    // The page, its script and style: under the 300 KB budget.
    let bytes = facts["asset_bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < 300 * 1024, "{bytes} bytes");
}

#[test]
fn a_running_run_is_cancelled_from_its_page() {
    let Some(facts) = scenario("cancel") else {
        return;
    };
    assert_eq!(facts["termination"], "cancelled", "{facts}");
}

#[test]
fn one_tool_call_is_cancelled_from_the_run_page_and_the_run_goes_on() {
    let Some(facts) = scenario("cancel_call") else {
        return;
    };
    assert_eq!(facts["termination"], "natural_end", "{facts}");
    assert!(
        facts["result"].as_str().unwrap().contains("cancel"),
        "{facts}"
    );
}

#[test]
fn a_pending_call_approved_in_the_console_runs_and_the_run_finishes() {
    let Some(facts) = scenario("approve") else {
        return;
    };
    assert!(
        facts["waiting"].as_str().unwrap().contains("terminate"),
        "{facts}"
    );
    assert_eq!(facts["termination"], "terminate", "{facts}");
    assert!(
        facts["decided"].as_str().unwrap().contains("approve"),
        "{facts}"
    );
}

#[test]
fn a_run_s_sub_agent_tree_opens_on_the_child_s_page() {
    let Some(facts) = scenario("tree") else {
        return;
    };
    let child = facts["child"].as_str().unwrap();
    assert_eq!(child, format!("{}.1", facts["runId"].as_str().unwrap()));
    assert!(
        facts["entry"].as_str().unwrap().contains("researcher"),
        "{facts}"
    );
    assert!(
        facts["parent"].as_str().unwrap().contains("sub-agent of"),
        "{facts}"
    );
}

#[test]
fn an_uploaded_recording_is_replayed_against_an_agent_s_stop_conditions() {
    let Some(facts) = scenario("replay") else {
        return;
    };
    let firings: Vec<&str> = facts["firings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(firings.contains(&"tool_call_loop"), "{facts}");
}

#[test]
fn the_console_s_assets_stay_under_300_kb() {
    assert!(rein_server::console::page_bytes() < 300 * 1024);
}
