//! One run's input and output: [`RunRequest`] and [`AgentRunResult`].

use std::collections::BTreeMap;
use std::sync::Arc;

use rein_runtime_contract::CancellationToken;

use rein_runtime_contract::event::{CancelCause, EventSink};
use rein_runtime_contract::inference::ToolChoice;
use rein_runtime_contract::lifecycle::{StopReport, TerminationReason};
use rein_runtime_contract::message::{CacheUsage, Message, TokenUsage};
use rein_runtime_contract::state::StateKey;

/// Input for one run: the thread, the new messages, and per-run options.
#[derive(Clone)]
pub struct RunRequest {
    pub(crate) thread_id: String,
    pub(crate) messages: Vec<Message>,
    pub(crate) agent_id: Option<String>,
    pub(crate) event_sink: Option<Arc<dyn EventSink>>,
    pub(crate) cancellation: Option<CancellationToken>,
    pub(crate) tool_choice: Option<ToolChoice>,
    pub(crate) run_id: Option<Arc<str>>,
    pub(crate) token_budget: Option<u64>,
    pub(crate) max_rounds: Option<usize>,
    pub(crate) timeout: Option<std::time::Duration>,
    /// A sub-agent's parent's token pool: the run's tokens count there too.
    pub(crate) parent_pool: Option<Arc<crate::subagents::budget::Pool>>,
    /// A sub-agent's root run (the run at the top of its tree).
    pub(crate) root_run_id: Option<Arc<str>>,
    /// A parked run to carry on instead of a new one.
    pub(crate) resume: Option<Box<crate::approvals::ParkedRun>>,
    /// Whether the run lets go of its task when it parks.
    pub(crate) release_when_parked: bool,
}

impl std::fmt::Debug for RunRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRequest")
            .field("thread_id", &self.thread_id)
            .field("messages", &self.messages)
            .field("agent_id", &self.agent_id)
            .field("event_sink", &self.event_sink.is_some())
            .field("cancellation", &self.cancellation)
            .field("tool_choice", &self.tool_choice)
            .field("run_id", &self.run_id)
            .field("token_budget", &self.token_budget)
            .field("max_rounds", &self.max_rounds)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RunRequest {
    /// A run on `thread_id` that appends `messages` to the thread's history.
    pub fn new(thread_id: impl Into<String>, messages: Vec<Message>) -> Self {
        Self {
            thread_id: thread_id.into(),
            messages,
            agent_id: None,
            event_sink: None,
            cancellation: None,
            tool_choice: None,
            run_id: None,
            token_budget: None,
            max_rounds: None,
            timeout: None,
            parent_pool: None,
            root_run_id: None,
            resume: None,
            release_when_parked: false,
        }
    }

    /// A request that carries on `parked` — a run parked for approvals in
    /// another process, or before a restart — with its id, thread and
    /// agent; its stored decisions apply at once and it waits for the
    /// rest. Start it like any request (a sink and a cancellation token
    /// may be added).
    pub fn resume(parked: crate::approvals::ParkedRun) -> Self {
        let mut request = Self::new(parked.thread_id.clone(), Vec::new())
            .with_run_id(parked.run_id.clone())
            .with_agent_id(parked.agent_id.clone());
        request.resume = Some(Box::new(parked));
        request
    }

    /// Lets the run go when it parks for approvals: instead of waiting in
    /// its task (and thread slot) for the decisions, it stores the parked
    /// round, emits `approval_requested` and `run_parked` as usual, and
    /// ends its task; [`RunHandle::wait_or_parked`](crate::RunHandle::wait_or_parked)
    /// then answers [`RunExit::Parked`] with the [`ParkedRun`](crate::approvals::ParkedRun)
    /// to carry on later through [`RunRequest::resume`] — in this process
    /// or another, with the decisions taken meanwhile. This is how a
    /// service parks a run at no cost: no task, no slot, nothing in
    /// memory beyond what it keeps itself.
    ///
    /// A carried-on run that is still waiting lets go again (unless it is
    /// cancelled, or a timeout is due). A sub-agent's run never lets go:
    /// its parent's call waits for it. Without this (the default) the run
    /// waits in its task and its future completes after the decisions.
    pub fn release_when_parked(mut self) -> Self {
        self.release_when_parked = true;
        self
    }

    /// The id the run gets, instead of one the runtime makes (e.g. a
    /// client's own id). It must not be the id of an active run
    /// ([`RuntimeError::RunIdInUse`](crate::RuntimeError::RunIdInUse));
    /// ids from [`AgentRuntime::next_id`](crate::AgentRuntime::next_id)
    /// never are.
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(Arc::from(run_id.into()));
        self
    }

    /// Runs this agent. Without it, the runtime's only agent runs (an error
    /// when there are several).
    pub fn with_agent_id(mut self, agent_id: impl Into<String>) -> Self {
        self.agent_id = Some(agent_id.into());
        self
    }

    /// Sends this run's events here instead of the runtime's default sink.
    pub fn with_event_sink(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.event_sink = Some(sink);
        self
    }

    /// A parent token: cancelling it cancels the run (e.g. a client disconnect).
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.cancellation = Some(token);
        self
    }

    /// The tool choice for this run's inferences until the first successful
    /// one; later inferences use the agent's.
    pub fn with_tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = Some(choice);
        self
    }

    /// A cap on the tokens this run may use (input plus output, every
    /// inference), checked before spending like the agent's `token_budget`
    /// stop condition: a call whose estimated prompt plus reserved output
    /// would exceed what remains is not sent, and the run stops with
    /// `token_budget`. With the agent's own `token_budget`, the smaller
    /// holds. Auto mode sets it to what remains of the session's
    /// `maxTokens`.
    pub fn with_token_budget(mut self, tokens: u64) -> Self {
        self.token_budget = Some(tokens);
        self
    }

    /// A cap on this run's inferences: with the agent's `max_rounds`, the
    /// smaller holds (a sub-agent gets what its parent has left).
    pub fn with_max_rounds(mut self, rounds: usize) -> Self {
        self.max_rounds = Some(rounds);
        self
    }

    /// A deadline for this run, from its start: with the agent's `timeout`
    /// condition, the sooner holds. Passing it stops the run with
    /// `timeout`, as the agent's own would.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The thread.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The new messages.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AgentRunResult {
    /// The run's id.
    pub run_id: String,
    /// The thread it ran on.
    pub thread_id: String,
    /// Why it ended, code and detail included.
    pub termination: TerminationReason,
    /// The text of the run's last answer (partial when it was cut off;
    /// empty when the run produced none).
    pub response: String,
    /// Inferences made, failed attempts included.
    pub steps: u32,
    /// The sum of the usage providers reported.
    pub usage: TokenUsage,
    /// Whether every successful inference reported its usage.
    pub usage_complete: bool,
    /// The sum of the prompt-cache usage providers reported (tokens read
    /// from and written to their prompt caches, part of `usage`'s input
    /// tokens); `None` when no inference reported any.
    pub cache_usage: Option<CacheUsage>,
    /// Who cancelled the run, when it was cancelled (or hit its deadline).
    pub cancel_cause: Option<CancelCause>,
    /// Values emitted through `emit_output` ([`OutputsPlugin`](crate::plugins::OutputsPlugin)),
    /// whatever ended the run; empty otherwise.
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// The final values of the state keys the agent's plugins export
    /// ([`PluginRegistrar::export_key`](crate::plugin::PluginRegistrar::export_key)),
    /// as JSON by key name; empty when none are exported. Read one back
    /// typed with [`exported`](Self::exported).
    pub exports: BTreeMap<String, serde_json::Value>,
    /// How the run ended and how to go on: every configured limit with
    /// what the run used of it, the tool calls that did not complete
    /// normally (`not_started`, `interrupted`, `may_have_completed`),
    /// whether the thread can be resumed without checking anything, and a
    /// hint.
    pub report: StopReport,
}

/// How a run started with [`RunRequest::release_when_parked`] left its
/// task ([`RunHandle::wait_or_parked`](crate::RunHandle::wait_or_parked)).
#[derive(Debug)]
#[non_exhaustive]
pub enum RunExit {
    /// The run ended.
    Finished(Box<AgentRunResult>),
    /// The run parked and let go of its task; carry it on with
    /// [`RunRequest::resume`] once its calls are decided (or to end it:
    /// a carried-on run that is cancelled ends as a parked run does).
    Parked(Box<crate::approvals::ParkedRun>),
}

impl AgentRunResult {
    /// The result of a run that did no work — e.g. one a service cancelled
    /// before it started: no response, no steps, no usage (reported
    /// complete), no outputs.
    pub fn new(
        run_id: impl Into<String>,
        thread_id: impl Into<String>,
        termination: TerminationReason,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            thread_id: thread_id.into(),
            report: StopReport::new(&termination),
            termination,
            response: String::new(),
            steps: 0,
            usage: TokenUsage::default(),
            usage_complete: true,
            cache_usage: None,
            cancel_cause: None,
            outputs: BTreeMap::new(),
            exports: BTreeMap::new(),
        }
    }

    /// The final value of the exported state key `K`, if the run's agent
    /// exports it (and it reads back as `K::Value`).
    pub fn exported<K: StateKey>(&self) -> Option<K::Value> {
        let json = self.exports.get(K::KEY)?;
        serde_json::from_value(json.clone()).ok()
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// A finished run on `thread_id` that used `tokens` input tokens.
    pub(crate) fn result(thread_id: &str, tokens: u64) -> AgentRunResult {
        let mut result = AgentRunResult::new("run-1", thread_id, TerminationReason::NaturalEnd);
        result.steps = 1;
        result.usage = TokenUsage::new(tokens, 0);
        result
    }
}
