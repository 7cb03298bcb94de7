//! Events: what a run reports while it happens, and the sinks that receive them.
//!
//! Every event carries its `run_id` and `thread_id` and serializes as one
//! JSON object tagged by `type`, so a run can be written out as JSONL. Every
//! run's last event is exactly one [`AgentEvent::RunFinished`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub use crate::lifecycle::CancelCause;
use crate::lifecycle::{StopReport, TerminationReason};
use crate::message::{CacheUsage, TokenUsage};

/// Something that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
#[allow(
    clippy::large_enum_variant,
    reason = "`RunFinished` carries the whole stop report, once per run; boxing it would re-shape a variant of the contract for ~200 bytes per event in flight"
)]
pub enum AgentEvent {
    /// The run took its thread's slot and is starting.
    RunStarted {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The agent running.
        agent_id: String,
    },
    /// A round began.
    StepStarted {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The round number, from 1.
        step: u32,
    },
    /// A failed inference is tried again: the round (counted in `step`
    /// like any other) repeats the last one instead of starting a new one,
    /// so a printer need not call it a new round. Sent instead of
    /// `StepStarted` for the retry.
    RetryStarted {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The round number, from 1 (failed attempts count).
        step: u32,
        /// Which attempt at this inference this is (2 for the first retry).
        attempt: u32,
    },
    /// A piece of the model's answer arrived.
    TextDelta {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The text.
        delta: String,
    },
    /// A tool call is about to run.
    ToolCallStarted {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        arguments: serde_json::Value,
    },
    /// A tool call finished (or was not run; see `is_error`).
    ToolCallFinished {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// What the model will see.
        result: String,
        /// Whether the call failed, panicked, or did not run.
        is_error: bool,
    },
    /// An inference failed with a retryable error and will be retried.
    InferenceRetry {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// How many attempts in a row have failed so far.
        attempt: u32,
        /// The error.
        error: String,
        /// The wait before the next attempt.
        delay_ms: u64,
    },
    /// The runtime added a corrective user message before the next inference.
    Nudge {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The message's text.
        text: String,
    },
    /// A detector fired and its escalation ladder's step was `warn`, `nudge`
    /// or `deny` (a `stop` ends the run instead: see `RunFinished`).
    Detected {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The detector's stop code, e.g. `tool_call_loop`.
        code: String,
        /// What it saw.
        detail: String,
        /// The step taken: `warn`, `nudge` or `deny`.
        action: String,
    },
    /// An inference is about to be sent, with this estimate of its prompt
    /// (sent only by runs that measure their prompts: an agent with a
    /// context policy or a token budget, or a run with its own budget).
    /// The provider's count comes later in the run's usage.
    PromptEstimated {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The round number, from 1.
        step: u32,
        /// The prompt's estimated tokens: system prompt, tools and the
        /// messages the model sees.
        estimated_tokens: u64,
        /// The context policy's window, if the agent has one.
        window_tokens: Option<u64>,
    },
    /// A round's inference answered: the tokens its provider reported for
    /// it (none when the provider reported none). What a console charts
    /// per round; the run's total is in `run_finished`.
    RoundUsage {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The round number, from 1.
        step: u32,
        /// This inference's tokens.
        usage: TokenUsage,
        /// The model id that answered (the agent's, or a fallback).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        model: String,
    },
    /// The next inference waits for its provider's limits (see
    /// `rein_runtime::limits`): one request and its estimated tokens are
    /// reserved before anything is sent. `wait_ms` is the expected wait. A
    /// wait is no round and no error.
    RateLimited {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The provider id.
        provider: String,
        /// How long the run expects to wait, in milliseconds.
        wait_ms: u64,
    },
    /// The run left its model for the next of the model's fallbacks: the
    /// provider kept failing past the retries it gets. Later rounds (and
    /// their spans and usage) are the fallback's.
    ModelFallback {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The model id left.
        from_model: String,
        /// The model id used from now on.
        to_model: String,
        /// The last error of the model left.
        error: String,
    },
    /// The context policy compacted what the model sees: older tool results
    /// became references to the artifact store. `trigger` says why:
    /// `threshold` (over `compact.at`), `budget` (the next call would not
    /// fit the token budget otherwise) or `overflow` (the provider refused
    /// the prompt). Results offloaded as they arrive emit no event. Token
    /// counts are estimates of the whole prompt.
    ContextCompacted {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The prompt's estimated tokens before.
        before_tokens: u64,
        /// And after.
        after_tokens: u64,
        /// How many tool results became references.
        references: u32,
        /// Why: `threshold` (over `compact.at`), `overflow` (the provider
        /// refused the prompt) or `budget` (to fit the token budget).
        trigger: String,
    },
    /// The context policy replaced older rounds of what the model sees by a
    /// summary (the stored history keeps them).
    ContextSummarized {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The prompt's estimated tokens before.
        before_tokens: u64,
        /// And after.
        after_tokens: u64,
        /// How many messages the summary replaced.
        messages: u32,
        /// The tokens the summary's own inference used, when reported.
        usage: Option<TokenUsage>,
    },
    /// A model judged the run (a `llm_loop_check` or `task_complete`
    /// stop condition): once per check, sent or not. A detection it leads
    /// to is also reported as usual (`detected`, a nudge, or the stop).
    ModelCheck {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The condition: `llm_loop_check` or `task_complete`.
        code: String,
        /// The judging model's id.
        model_id: String,
        /// The round it judged.
        step: u32,
        /// `detected` (a loop; a task complete or, on a final answer,
        /// incomplete), `clear` (nothing to act on), `failed` (an error or
        /// malformed output: skipped) or `skipped` (the token budget could
        /// not pay for it: not sent).
        outcome: String,
        /// The model's confidence, 0 to 1, when it answered.
        confidence: Option<f64>,
        /// For `task_complete`: whether the model judged the task complete.
        complete: Option<bool>,
        /// The model's reasoning, or why the check failed or was skipped.
        detail: String,
        /// The tokens the check used, when reported.
        usage: Option<TokenUsage>,
    },
    /// The run's plan changed (the `plan` plugin): the whole plan as it
    /// now stands (`{ title, steps: [{ title, status, notes? }] }`).
    PlanUpdated {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The plan.
        plan: serde_json::Value,
    },
    /// Auto mode's progress: after every round, and when it stops
    /// (`auto-run stop condition: <stop_reason>`).
    ///
    /// Progress belongs to the auto-mode session, not to a run: `run_id` is
    /// the session's id (`auto-<n>`), never a run's, so a run's last event is
    /// still its `RunFinished`. `round_run_id` names the round's run.
    Progress {
        /// The auto-mode session's id (`auto-<n>`).
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// What happened.
        message: String,
        /// Tokens the thread's session has used so far.
        tokens_used_session: u64,
        /// The policy's token budget, when it has one (for a progress bar).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_tokens: Option<u64>,
        /// The run of the round this progress reports on (none when the
        /// session stopped before a round ran).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        round_run_id: Option<String>,
    },
    /// A sub-agent call started a child run (on the parent's run; the
    /// child's own events follow, with the child's `run_id`, until its
    /// `subagent_finished`).
    SubagentStarted {
        /// The parent run.
        run_id: String,
        /// The parent's thread.
        thread_id: String,
        /// The parent's tool call that started the child.
        call_id: String,
        /// The child run.
        child_run_id: String,
        /// The child's thread.
        child_thread_id: String,
        /// The child's agent.
        agent_id: String,
    },
    /// A child run ended; its termination is the parent's tool result.
    SubagentFinished {
        /// The parent run.
        run_id: String,
        /// The parent's thread.
        thread_id: String,
        /// The parent's tool call that started the child.
        call_id: String,
        /// The child run.
        child_run_id: String,
        /// How the child ended.
        termination: TerminationReason,
    },
    /// A call waits for a person (an `ask` approval rule, or `ask_user`):
    /// the run parks once the round's other calls are done.
    ApprovalRequested {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The waiting call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// Its arguments, as the model gave them.
        arguments: serde_json::Value,
        /// What it waits for.
        #[serde(default)]
        kind: crate::approval::PendingKind,
        /// When the rule's timeout passes (RFC 3339).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<String>,
    },
    /// The run parked: every call of the round that could run has run,
    /// and it now waits for decisions on `pending` (each announced by its
    /// `approval_requested` just before). Clients that end a stream on an
    /// interrupt (AG-UI) end it here.
    RunParked {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The calls it waits on.
        pending: Vec<crate::approval::PendingApproval>,
        /// Inferences made so far (to resume the run elsewhere).
        #[serde(default)]
        steps: u32,
        /// Usage so far.
        #[serde(default)]
        usage: TokenUsage,
        /// Time the run has been active (not parked), in milliseconds.
        #[serde(default)]
        active_ms: u64,
    },
    /// A pending call was decided (`approve`, `reject`, `edit`, `respond`;
    /// `timeout` when its rule's timeout passed); once every pending call
    /// is, the same run goes on.
    ApprovalDecided {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// The decided call.
        call_id: String,
        /// The decision's name.
        decision: String,
        /// Who decided: the API token's name, `rein run`, or what the
        /// library caller named (none: not known, or a timeout).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decided_by: Option<String>,
        /// When it was decided (RFC 3339, UTC).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decided_at: Option<String>,
    },
    /// The run ended. Always the last event of a run, exactly once.
    RunFinished {
        /// The run.
        run_id: String,
        /// Its thread.
        thread_id: String,
        /// Why it ended, code and detail included.
        termination: TerminationReason,
        /// The text of the last answer.
        response: String,
        /// Who cancelled it, when it was cancelled.
        cancel_cause: Option<CancelCause>,
        /// Inferences made (failed attempts included).
        steps: u32,
        /// The sum of the usage providers reported.
        usage: TokenUsage,
        /// The sum of the prompt-cache usage providers reported; absent
        /// when none did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_usage: Option<CacheUsage>,
        /// Values emitted through `emit_output`, by name (empty without the
        /// outputs plugin).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        outputs: BTreeMap<String, serde_json::Value>,
        /// How the run ended and how to go on: limits used, tool calls
        /// that did not complete, whether it can be resumed safely.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<StopReport>,
    },
}

impl AgentEvent {
    /// The event's `type` as serialized (`run_started`, `text_delta`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::StepStarted { .. } => "step_started",
            Self::RetryStarted { .. } => "retry_started",
            Self::TextDelta { .. } => "text_delta",
            Self::ToolCallStarted { .. } => "tool_call_started",
            Self::ToolCallFinished { .. } => "tool_call_finished",
            Self::InferenceRetry { .. } => "inference_retry",
            Self::Nudge { .. } => "nudge",
            Self::Detected { .. } => "detected",
            Self::PromptEstimated { .. } => "prompt_estimated",
            Self::RoundUsage { .. } => "round_usage",
            Self::RateLimited { .. } => "rate_limited",
            Self::ModelFallback { .. } => "model_fallback",
            Self::ContextCompacted { .. } => "context_compacted",
            Self::ContextSummarized { .. } => "context_summarized",
            Self::ModelCheck { .. } => "model_check",
            Self::PlanUpdated { .. } => "plan_updated",
            Self::Progress { .. } => "progress",
            Self::SubagentStarted { .. } => "subagent_started",
            Self::SubagentFinished { .. } => "subagent_finished",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::RunParked { .. } => "run_parked",
            Self::ApprovalDecided { .. } => "approval_decided",
            Self::RunFinished { .. } => "run_finished",
        }
    }

    /// The run the event belongs to.
    pub fn run_id(&self) -> &str {
        match self {
            Self::RunStarted { run_id, .. }
            | Self::StepStarted { run_id, .. }
            | Self::RetryStarted { run_id, .. }
            | Self::TextDelta { run_id, .. }
            | Self::ToolCallStarted { run_id, .. }
            | Self::ToolCallFinished { run_id, .. }
            | Self::InferenceRetry { run_id, .. }
            | Self::Nudge { run_id, .. }
            | Self::Detected { run_id, .. }
            | Self::PromptEstimated { run_id, .. }
            | Self::RoundUsage { run_id, .. }
            | Self::RateLimited { run_id, .. }
            | Self::ModelFallback { run_id, .. }
            | Self::ContextCompacted { run_id, .. }
            | Self::ContextSummarized { run_id, .. }
            | Self::ModelCheck { run_id, .. }
            | Self::PlanUpdated { run_id, .. }
            | Self::Progress { run_id, .. }
            | Self::SubagentStarted { run_id, .. }
            | Self::SubagentFinished { run_id, .. }
            | Self::ApprovalRequested { run_id, .. }
            | Self::RunParked { run_id, .. }
            | Self::ApprovalDecided { run_id, .. }
            | Self::RunFinished { run_id, .. } => run_id,
        }
    }

    /// The thread the event belongs to.
    pub fn thread_id(&self) -> &str {
        match self {
            Self::RunStarted { thread_id, .. }
            | Self::StepStarted { thread_id, .. }
            | Self::RetryStarted { thread_id, .. }
            | Self::TextDelta { thread_id, .. }
            | Self::ToolCallStarted { thread_id, .. }
            | Self::ToolCallFinished { thread_id, .. }
            | Self::InferenceRetry { thread_id, .. }
            | Self::Nudge { thread_id, .. }
            | Self::Detected { thread_id, .. }
            | Self::PromptEstimated { thread_id, .. }
            | Self::RoundUsage { thread_id, .. }
            | Self::RateLimited { thread_id, .. }
            | Self::ModelFallback { thread_id, .. }
            | Self::ContextCompacted { thread_id, .. }
            | Self::ContextSummarized { thread_id, .. }
            | Self::ModelCheck { thread_id, .. }
            | Self::PlanUpdated { thread_id, .. }
            | Self::Progress { thread_id, .. }
            | Self::SubagentStarted { thread_id, .. }
            | Self::SubagentFinished { thread_id, .. }
            | Self::ApprovalRequested { thread_id, .. }
            | Self::RunParked { thread_id, .. }
            | Self::ApprovalDecided { thread_id, .. }
            | Self::RunFinished { thread_id, .. } => thread_id,
        }
    }
}

/// Receives a run's events, in order, from the run's task.
///
/// `emit` is called on the hot path of the loop: keep it cheap and never
/// block on I/O; hand events to a channel if they need slow processing.
pub trait EventSink: Send + Sync {
    /// Receives one event.
    fn emit(&self, event: AgentEvent);

    /// Whether this sink wants events at all. A sink that answers `false`
    /// (like [`NullSink`]) lets the runtime skip building them; the default
    /// is `true`.
    fn is_enabled(&self) -> bool {
        true
    }
}

/// A sink that drops every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _event: AgentEvent) {}

    fn is_enabled(&self) -> bool {
        false
    }
}

/// A sink that keeps every event in memory, for tests and examples.
#[derive(Debug, Default)]
pub struct CollectingSink {
    events: Mutex<Vec<AgentEvent>>,
}

impl CollectingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events received so far, in order.
    pub fn events(&self) -> Vec<AgentEvent> {
        self.lock().clone()
    }

    /// Removes and returns the events received so far.
    pub fn take(&self) -> Vec<AgentEvent> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<AgentEvent>> {
        // A panic while holding this lock can only come from `Vec::push`
        // running out of memory; the events are still usable then.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventSink for CollectingSink {
    fn emit(&self, event: AgentEvent) {
        self.lock().push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_as_one_tagged_object() {
        let e = AgentEvent::TextDelta {
            run_id: "r".into(),
            thread_id: "t".into(),
            delta: "hi".into(),
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"type": "text_delta", "run_id": "r", "thread_id": "t", "delta": "hi"})
        );
        assert_eq!(e.run_id(), "r");
        assert_eq!(e.thread_id(), "t");
        assert_eq!(e.kind(), "text_delta");
    }

    #[test]
    fn collecting_sink_keeps_events_in_order() {
        let sink = CollectingSink::new();
        for step in 1..=3 {
            sink.emit(AgentEvent::StepStarted {
                run_id: "r".into(),
                thread_id: "t".into(),
                step,
            });
        }
        let steps: Vec<_> = sink
            .events()
            .into_iter()
            .map(|e| match e {
                AgentEvent::StepStarted { step, .. } => step,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(steps, [1, 2, 3]);
    }
}
