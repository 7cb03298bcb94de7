//! Sub-agents: an agent as a tool, with one cancel, one budget and one
//! stop report for the whole tree.
//!
//! # The model
//!
//! An agent's [`SubagentSpec`]s each become a tool `{ "task": string }`
//! ([`SubagentTool`]). A call starts a **child run** of the named agent on
//! a thread of its own (`<parent thread>:<child run id>`, the child's run
//! id being `<parent run id>.<n>`), whose first user
//! message is the task (`isolated`), or the parent's history up to the
//! call plus the task (`shared`). The call's result is the child's end as
//! JSON: `{"status", "detail"?, "response", "outputs"?, "rounds",
//! "usage"}`, an error result for `error` and `cancelled`. Whatever ends
//! the child, it is one tool result: the parent goes on.
//!
//! Run control spans the tree:
//!
//! - **One cancel.** The child's token is a child of its call's token, a
//!   child of the parent run's. Cancelling any run ends its subtree; the
//!   parent does not drop a sub-agent call on cancel but waits for the
//!   child to end (promptly: its token is cancelled), so a run releases
//!   its thread only after its children released theirs.
//! - **One budget.** The child's `max_rounds`, `timeout_seconds` and
//!   `token_budget` default to, and are capped by, what the parent has
//!   left; tokens are reserved in every ancestor's [`budget::Pool`] before
//!   they are spent.
//! - **One report.** The parent's usage includes its children's, and its
//!   stop report lists them (`children`).
//!
//! Events: the child's events go to the parent's sink (so to every
//! ancestor's), between `subagent_started` and `subagent_finished` on the
//! parent's run.

pub(crate) mod budget;
mod plan;

pub(crate) use plan::{plan, variant_id};

use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::lifecycle::{ChildRun, TerminationReason};
use rein_runtime_contract::message::{Message, Role, TokenUsage};
use rein_runtime_contract::spec::{SubagentContext, SubagentSpec};
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::run::{AgentRunResult, RunRequest};
use crate::runtime::Inner;
use budget::Pool;

/// What a run with sub-agents shares with its sub-agent calls: its sink,
/// its budget, what it has left of its limits, its history (for `shared`
/// calls) and what its children reported.
pub(crate) struct Family {
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) pool: Option<Arc<Pool>>,
    /// The run's deadline, if it has one.
    pub(crate) deadline: Option<Instant>,
    /// Rounds the run may still make (`None`: unbounded).
    rounds_left: Mutex<Option<usize>>,
    /// The run's history when its current round's tools started.
    history: Mutex<Arc<Vec<Message>>>,
    /// What the run's children reported, in the order they ended.
    children: Mutex<Vec<(ChildRun, TokenUsage)>>,
    /// How many children the run has started.
    started: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Family")
            .field("pool", &self.pool)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Family {
    pub(crate) fn new(
        sink: Arc<dyn EventSink>,
        pool: Option<Arc<Pool>>,
        deadline: Option<Instant>,
        rounds_left: Option<usize>,
    ) -> Self {
        Self {
            sink,
            pool,
            deadline,
            rounds_left: Mutex::new(rounds_left),
            history: Mutex::default(),
            children: Mutex::default(),
            started: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The next child's number (from 1).
    fn next_child(&self) -> u32 {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1)
    }

    /// Before a round's tools run: what the run has left and sees.
    pub(crate) fn update(&self, rounds_left: Option<usize>, history: &Arc<Vec<Message>>) {
        *lock(&self.rounds_left) = rounds_left;
        *lock(&self.history) = history.clone();
    }

    /// After a round's tools ended: the children that ended since the last
    /// call, with their usage. Also lets go of the round's history (only
    /// calls starting read it), so that the run appending the round's
    /// results does not copy its whole history.
    pub(crate) fn round_ended(&self) -> Vec<(ChildRun, TokenUsage)> {
        *lock(&self.history) = Arc::default();
        std::mem::take(&mut *lock(&self.children))
    }
}

/// A sub-agent entry of an agent, as the tool its model calls.
pub(crate) struct SubagentTool {
    entry: SubagentSpec,
    /// The agent that runs the child: the entry's agent, or a variant of
    /// it with the entry's declared outputs.
    agent_id: String,
    /// The child agent's own `max_rounds` (0: unbounded).
    own_max_rounds: usize,
    runtime: Arc<OnceLock<Weak<Inner>>>,
}

impl std::fmt::Debug for SubagentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentTool")
            .field("tool", &self.entry.tool_name())
            .field("agent", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// How a sub-agent call ended, as the parent's tool result.
pub(crate) struct CallResult {
    pub(crate) content: String,
    pub(crate) is_error: bool,
}

impl SubagentTool {
    pub(crate) fn new(
        entry: SubagentSpec,
        agent_id: String,
        own_max_rounds: usize,
        runtime: Arc<OnceLock<Weak<Inner>>>,
    ) -> Self {
        Self {
            entry,
            agent_id,
            own_max_rounds,
            runtime,
        }
    }

    /// Runs the child to its end and reports it. Ends promptly once
    /// `ctx`'s token is cancelled (the child's is its child).
    pub(crate) async fn call(&self, args: &Value, ctx: &ToolContext) -> CallResult {
        match self.try_call(args, ctx).await {
            Ok(result) => result,
            Err(message) => CallResult {
                content: format!("error: {message}"),
                is_error: true,
            },
        }
    }

    async fn try_call(&self, args: &Value, ctx: &ToolContext) -> Result<CallResult, String> {
        let task = args
            .get("task")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                format!(
                    "sub-agent \"{}\" needs {{\"task\": \"<what to do>\"}}, a non-empty string",
                    self.entry.tool_name()
                )
            })?;
        if ctx.cancellation.is_cancelled() {
            // Cancelled before it began: no child starts.
            let cancelled = AgentRunResult::new("", "", TerminationReason::Cancelled);
            return Ok(result_of(&cancelled));
        }
        let inner = self
            .runtime
            .get()
            .and_then(Weak::upgrade)
            .ok_or("the runtime has shut down")?;
        let parent = inner
            .registry
            .by_run(&ctx.run_id)
            .ok_or_else(|| format!("run \"{}\" is not active", ctx.run_id))?;
        let family = parent
            .family
            .get()
            .cloned()
            .ok_or_else(|| format!("run \"{}\" has no sub-agents", ctx.run_id))?;
        let messages = match self.entry.context {
            SubagentContext::Isolated => vec![Message::user(task)],
            SubagentContext::Shared => {
                let history = lock(&family.history).clone();
                shared_input(&history, &ctx.call_id, task)
            }
        };
        // Named after the parent's (unique in every process of a cluster):
        // `<parent run>.<n>`, on thread `<parent thread>:<child run>`.
        let child_run_id: Arc<str> = format!("{}.{}", ctx.run_id, family.next_child()).into();
        let child_thread = format!("{}:{child_run_id}", ctx.thread_id);
        let mut request = RunRequest::new(&child_thread, messages)
            .with_agent_id(&self.agent_id)
            .with_run_id(child_run_id.to_string())
            .with_cancellation(ctx.cancellation.clone())
            .with_event_sink(family.sink.clone());
        request.root_run_id = Some(
            parent
                .root_run_id
                .clone()
                .unwrap_or_else(|| parent.run_id.clone()),
        );
        // Limits: the entry's, capped by what the parent has left.
        let parent_rounds = *lock(&family.rounds_left);
        let rounds = [self.entry.max_rounds, parent_rounds]
            .into_iter()
            .flatten()
            .min();
        if let Some(rounds) = rounds
            && (self.own_max_rounds == 0 || rounds < self.own_max_rounds)
        {
            request.max_rounds = Some(rounds.max(1));
        }
        let parent_left = family
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        request.timeout = [
            self.entry.timeout_seconds.map(Duration::from_secs),
            parent_left,
        ]
        .into_iter()
        .flatten()
        .min();
        let tokens = [
            self.entry.token_budget,
            family.pool.as_ref().map(|p| p.remaining()),
        ]
        .into_iter()
        .flatten()
        .min();
        if let Some(tokens) = tokens {
            request = request.with_token_budget(tokens);
        }
        request.parent_pool = family.pool.clone();
        // A store that fences writes by thread takes the child's thread
        // first (given up again below, however the child ends), before
        // anyone hears of the child.
        let held = inner.config.store.hold_for_child(&child_thread).await;
        family.sink.emit(AgentEvent::SubagentStarted {
            run_id: ctx.run_id.clone(),
            thread_id: ctx.thread_id.clone(),
            call_id: ctx.call_id.clone(),
            child_run_id: child_run_id.to_string(),
            child_thread_id: child_thread.clone(),
            agent_id: self.entry.agent.clone(),
        });
        let outcome = match held {
            Ok(()) => inner.run_child(request).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let mut result = match outcome {
            Ok(result) => result,
            Err(e) => {
                let termination = TerminationReason::Error(e);
                AgentRunResult::new(child_run_id.to_string(), &child_thread, termination)
            }
        };
        // The child's last text, also when its last answer had none (it
        // ended emitting outputs, or calling tools).
        if result.response.is_empty()
            && let Ok(history) = inner.config.store.load(&child_thread).await
            && let Some(text) = history
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant && !m.content.is_empty())
        {
            result.response = text.content.clone();
        }
        inner.config.store.release_child(&child_thread).await;
        family.sink.emit(AgentEvent::SubagentFinished {
            run_id: ctx.run_id.clone(),
            thread_id: ctx.thread_id.clone(),
            call_id: ctx.call_id.clone(),
            child_run_id: child_run_id.to_string(),
            termination: result.termination.clone(),
        });
        let report = ChildRun::new(
            &result.run_id,
            &self.entry.agent,
            result.termination.code(),
            result.steps,
            result.usage,
        );
        lock(&family.children).push((report, result.usage));
        Ok(result_of(&result))
    }
}

#[async_trait::async_trait]
impl Tool for SubagentTool {
    fn descriptor(&self) -> ToolDescriptor {
        let mut description = if self.entry.description.is_empty() {
            format!(
                "Hand a task to the sub-agent \"{}\"; it works on it alone and reports back.",
                self.entry.agent
            )
        } else {
            self.entry.description.clone()
        };
        if !self.entry.outputs.is_empty() {
            let outputs: Vec<String> = self
                .entry
                .outputs
                .iter()
                .map(|(n, t)| format!("{n} ({t})"))
                .collect();
            description.push_str(&format!(" It reports: {}.", outputs.join(", ")));
        }
        ToolDescriptor::new(self.entry.tool_name(), description).with_parameters(json!({
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the sub-agent should do, with everything it needs to know."}
            },
            "required": ["task"]
        }))
    }

    /// Runs the child. (The agent loop calls [`SubagentTool::call`]
    /// itself, to keep the result's JSON whole; this is for callers of
    /// the tool outside a run.)
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let result = self.call(&args, ctx).await;
        if result.is_error {
            Err(ToolError::new(result.content))
        } else {
            Ok(ToolOutput::text(result.content))
        }
    }
}

/// The input of a `shared` child: the parent's history before the
/// assistant message that made call `call_id` (that message's text is
/// kept, its calls are not: they have no results yet), then the task.
fn shared_input(history: &[Message], call_id: &str, task: &str) -> Vec<Message> {
    let at = history
        .iter()
        .rposition(|m| m.role == Role::Assistant && m.tool_calls.iter().any(|c| c.id == call_id))
        .unwrap_or(history.len());
    let mut messages: Vec<Message> = history[..at].to_vec();
    if let Some(text) = history
        .get(at)
        .map(|m| m.content.clone())
        .filter(|t| !t.is_empty())
    {
        messages.push(Message::assistant(text));
    }
    messages.push(Message::user(task));
    messages
}

/// The parent's tool result for a child's end (service.md §8).
fn result_of(result: &AgentRunResult) -> CallResult {
    let mut json = json!({
        "status": result.termination.code(),
        "response": result.response,
        "rounds": result.steps,
        "usage": {
            "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens,
        },
    });
    let detail = &result.report.detail;
    if !detail.is_empty() {
        json["detail"] = Value::String(detail.clone());
    }
    if !result.outputs.is_empty() {
        json["outputs"] = json!(result.outputs);
    }
    CallResult {
        content: json.to_string(),
        is_error: matches!(
            result.termination,
            TerminationReason::Error(_) | TerminationReason::Cancelled
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::message::ToolCall;

    #[test]
    fn a_shared_child_sees_the_history_before_the_call_and_then_its_task() {
        let history = vec![
            Message::user("plan a trip"),
            Message::assistant_with_tools(
                "I will ask the researcher.",
                vec![ToolCall::new(
                    "c1",
                    "research",
                    json!({"task": "find trains"}),
                )],
            ),
        ];
        let input = shared_input(&history, "c1", "find trains");
        assert_eq!(input.len(), 3);
        assert_eq!(input[0].content, "plan a trip");
        assert_eq!(input[1].role, Role::Assistant);
        assert!(input[1].tool_calls.is_empty());
        assert_eq!(input[2].content, "find trains");
    }
}
