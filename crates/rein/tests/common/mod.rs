//! Helpers shared by the behaviour tests: small tools, a runtime builder
//! shortcut, and checks of the invariants every run must keep.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rein::contract::event::AgentEvent;
use rein::prelude::*;
use serde_json::{Value, json};

/// Echoes its arguments back as JSON.
pub struct Echo(pub &'static str);

#[async_trait::async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.0, "echoes its arguments")
    }
    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::json(json!({ "echo": args })))
    }
}

/// Always fails.
pub struct Failing;

#[async_trait::async_trait]
impl Tool for Failing {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("failing", "always fails")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::new("disk on fire"))
    }
}

/// Always panics.
pub struct Panicking;

#[async_trait::async_trait]
impl Tool for Panicking {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("panicking", "always panics")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        panic!("tool exploded")
    }
}

/// Sleeps for `args.ms` milliseconds; with `respect_token` it returns early
/// when its run is cancelled. Counts calls that ran to completion.
pub struct Sleeper {
    pub respect_token: bool,
    pub completed: Arc<AtomicUsize>,
}

impl Sleeper {
    pub fn new(respect_token: bool) -> Self {
        Self {
            respect_token,
            completed: Arc::new(AtomicUsize::new(0)),
        }
    }
}

#[async_trait::async_trait]
impl Tool for Sleeper {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("sleep", "sleeps")
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let ms = args["ms"].as_u64().unwrap_or(1000);
        let sleep = tokio::time::sleep(Duration::from_millis(ms));
        if self.respect_token {
            tokio::select! {
                _ = sleep => {}
                _ = ctx.cancellation.cancelled() => return Err(ToolError::new("cancelled")),
            }
        } else {
            sleep.await;
        }
        self.completed.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text(format!("slept {ms} ms")))
    }
}

/// A builder with one agent "agent" on model "m" served by `executor`.
pub fn builder_with(executor: ScriptedExecutor, spec: AgentSpec) -> AgentRuntimeBuilder {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "scripted-model"))
        .with_provider("p", Arc::new(executor))
}

pub fn spec() -> AgentSpec {
    AgentSpec::new("agent")
}

pub fn user(thread: &str, text: &str) -> RunRequest {
    RunRequest::new(thread, vec![Message::user(text)])
}

/// Every assistant tool call has exactly one tool result, and every tool
/// result answers an earlier call of the same block.
pub fn assert_history_valid(messages: &[Message]) {
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::Tool => {
                let id = m
                    .tool_call_id
                    .clone()
                    .unwrap_or_else(|| panic!("tool message {i} has no call id"));
                let pos = open.iter().position(|o| *o == id).unwrap_or_else(|| {
                    panic!("tool result {i} answers no open call: {messages:#?}")
                });
                open.remove(pos);
            }
            _ => {
                assert!(
                    open.is_empty(),
                    "calls {open:?} unanswered before message {i}: {messages:#?}"
                );
                open.extend(m.tool_calls.iter().map(|c| c.id.clone()));
            }
        }
    }
    assert!(
        open.is_empty(),
        "calls {open:?} unanswered at the end: {messages:#?}"
    );
}

/// Exactly one `RunFinished` per run id, each its run's last event; returns
/// the terminations by run id.
pub fn assert_one_run_finished_last(events: &[AgentEvent]) -> HashMap<String, TerminationReason> {
    let mut finished: HashMap<String, TerminationReason> = HashMap::new();
    for e in events {
        let run = e.run_id().to_owned();
        assert!(
            !finished.contains_key(&run),
            "event after RunFinished of {run}: {e:?}"
        );
        if let AgentEvent::RunFinished { termination, .. } = e {
            finished.insert(run, termination.clone());
        }
    }
    let runs: std::collections::HashSet<_> = events.iter().map(|e| e.run_id().to_owned()).collect();
    assert_eq!(runs.len(), finished.len(), "some run has no RunFinished");
    finished
}

/// The tool results in `messages`, as (call id, content).
pub fn tool_results(messages: &[Message]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| {
            (
                m.tool_call_id.clone().unwrap_or_default(),
                m.content.clone(),
            )
        })
        .collect()
}

/// A tool that signals when it starts and then blocks until cancelled
/// (`respect_token`) or forever. Records entries and exits.
pub struct Gate {
    pub entered: Arc<tokio::sync::Notify>,
    pub respect_token: bool,
    pub exits: Arc<AtomicUsize>,
}

impl Gate {
    pub fn new(respect_token: bool) -> Self {
        Self {
            entered: Arc::new(tokio::sync::Notify::new()),
            respect_token,
            exits: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// Counts when a future is dropped.
pub struct DropCounter(pub Arc<AtomicUsize>);
impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Tool for Gate {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("gate", "blocks")
    }
    async fn execute(&self, _args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let _exit = DropCounter(self.exits.clone());
        self.entered.notify_one();
        if self.respect_token {
            ctx.cancellation.cancelled().await;
            Err(ToolError::new("stopped on request"))
        } else {
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

/// Waits (on the paused or real clock) until the thread has no active run.
pub async fn wait_until_idle(runtime: &AgentRuntime, thread: &str) {
    for _ in 0..10_000 {
        if !runtime.is_thread_active(thread) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("thread {thread} never became idle");
}

/// A runtime whose model calls `gate` once (so its run blocks in the tool),
/// and the signal that the gate was entered.
pub fn gated_runtime(respect_token: bool) -> (AgentRuntime, Arc<tokio::sync::Notify>) {
    let gate = Gate::new(respect_token);
    let entered = gate.entered.clone();
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call("gate", json!({}))]);
    let runtime = builder_with(model, spec())
        .with_tool("gate", Arc::new(gate))
        .build()
        .unwrap();
    (runtime, entered)
}

/// The requests a recording model received.
pub type Seen = Arc<std::sync::Mutex<Vec<rein::contract::inference::InferenceRequest>>>;

/// A model answering `script` in order (the last answer repeats), keeping
/// every request it gets.
pub fn recording_script(script: Vec<ScriptedResponse>) -> (ScriptedExecutor, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let executor = ScriptedExecutor::from_fn(move |request| {
        let mut log = log.lock().unwrap();
        log.push(request.clone());
        let i = (log.len() - 1).min(script.len() - 1);
        script[i].clone()
    });
    (executor, seen)
}
