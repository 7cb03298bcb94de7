//! One run: rounds of inference and tool calls until the model answers
//! without tools or something ends the run.
//!
//! ```text
//! RunStart hooks
//! loop:
//!   cancelled?                          -> Cancelled
//!   StepStart, BeforeInference hooks; pending nudges join the history
//!   inference: open + stream, each await raced against cancel and deadline
//!   stats updated once; AfterInference hooks; built-in guard
//!   assistant message appended (also when the run stops here)
//!   stop requested?                     -> that reason
//!   no tool calls                       -> StepEnd hooks; NaturalEnd (unless another round was requested)
//!   a store that outlives the process: the assistant message with its calls is persisted
//!   per call: BeforeToolExecute hook, spawn; wait for all; AfterToolExecute hooks in call order
//!   StepEnd hooks; the round is persisted
//! finish: repair unanswered calls; RunEnd hooks; persist; RunFinished
//! ```
//!
//! **Invariant 1:** `finish` is the only place that emits `RunFinished`, and
//! every path out of [`execute`] goes through it exactly once.
//!
//! **Invariant 3:** `finish` repairs the history before anything is
//! persisted for the last time, so the stored history is valid.
//!
//! Run control (statistics policies, detectors, escalation ladders, the
//! built-in guard) is [`judge`]'s: the loop feeds it what the run does and
//! acts on its verdicts; `rein replay` feeds the same judge a recording.
//!
//! This module does not own the thread's slot; the caller's `SlotGuard`
//! releases it after [`execute`] returns.

mod admission;
mod backoff;
mod context;
mod fallback;
mod inference;
pub(crate) mod judge;
mod model_checks;
mod park;
mod report;
mod tools;

pub(crate) use backoff::RetryBackoff;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use rein_runtime_contract::event::{AgentEvent, CancelCause, EventSink};
use rein_runtime_contract::inference::{
    InferenceError, InferenceRequest, InferenceResponse, ToolChoice,
};
use rein_runtime_contract::lifecycle::{
    ChildRun, IncompleteToolCall, TerminationReason, ToolCallStatus,
};
use rein_runtime_contract::message::{CacheUsage, Message, TokenUsage, ToolCall, ToolResult};
use rein_runtime_contract::phase::Phase;
use tokio::time::Instant;

use crate::active_runs::RunControl;
use crate::agent::Agent;
use crate::context::ContextWindow;
use crate::history;
use crate::phase::{Directives, HookFailure, PhaseContext, RunIdentity, dispatch, panic_message};
use crate::plugins::EmittedOutputs;
use crate::policies::StopStatsKey;
use crate::run::AgentRunResult;
use crate::state::RunState;
use crate::subagents::Family;
use crate::subagents::budget::Pool;
use inference::Inference;
use judge::Judge;

/// The most summarizing calls made before one inference: a history many
/// windows long is summarized in passes of half a window each.
const MAX_SUMMARY_PASSES: u32 = 8;
use crate::thread_store::{LentHistory, ThreadStore, ThreadStoreError};

/// Everything a run needs to start.
pub(crate) struct RunSetup {
    pub(crate) agent: Arc<Agent>,
    pub(crate) control: Arc<RunControl>,
    pub(crate) input: Vec<Message>,
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) store: Arc<dyn ThreadStore>,
    pub(crate) backoff: RetryBackoff,
    pub(crate) tool_choice: Option<ToolChoice>,
    /// The request's own token budget.
    pub(crate) token_budget: Option<u64>,
    /// The request's own cap on inferences.
    pub(crate) max_rounds: Option<usize>,
    /// The request's own deadline.
    pub(crate) timeout: Option<Duration>,
    /// A sub-agent's parent's token pool.
    pub(crate) parent_pool: Option<Arc<Pool>>,
    /// Whether spans record message contents.
    pub(crate) trace_content: bool,
    /// A parked run to carry on instead of starting one.
    pub(crate) resume: Option<Box<crate::approvals::ParkedRun>>,
    /// Whether the run lets go of its task when it parks.
    pub(crate) release_when_parked: bool,
}

/// Runs one run to its end and reports it. Never panics on misbehaving
/// tools, hooks or executors; always emits exactly one `RunFinished`.
///
/// The setup comes boxed and the run is built by the synchronous
/// [`prepare`]: nothing of the setup or of the building stays in the
/// suspended future of a waiting run, only the `Run` itself.
pub(crate) async fn execute(setup: Box<RunSetup>) -> AgentRunResult {
    let (mut run, resume, input) = prepare(setup);
    // `start` and `finish` are boxed: each runs once, and keeping their
    // state out of this future makes every waiting run ~1 KB smaller.
    // The start's result is matched in its own statement, so no part of
    // it stays in this future while the rounds run.
    let reason = 'ran: {
        let fresh = match resume {
            Some(parked) => {
                drop(input);
                match Box::pin(run.resume_parked(*parked)).await {
                    Ok(()) => false,
                    Err(reason) => break 'ran reason,
                }
            }
            None => match Box::pin(run.start(input)).await {
                Ok(()) => true,
                Err(reason) => break 'ran reason,
            },
        };
        if fresh {
            run.rounds().await
        } else {
            run.round_loop().await
        }
    };
    // Work has stopped; a deadline passing now must not turn the reason
    // into a cancellation.
    run.watchdog = DeadlineWatchdog(None);
    if let Some(parked) = run.rare.as_mut().and_then(|r| r.let_go.take()) {
        // Parked and let go: the parked round is stored and announced;
        // whoever carries the run on finishes it.
        if let Some(context) = run.context.take() {
            context.save(&run.request.messages);
        }
        tracing::debug!(
            calls = parked.pending.len(),
            "run parked and let go of its task"
        );
        run.control.let_go(*parked);
        return AgentRunResult::new(&*run.id.run_id, &*run.id.thread_id, reason);
    }
    Box::pin(run.finish(reason)).await
}

/// Builds a run from its setup and announces it (`RunStarted`, unless it
/// is carried on from a park); returns it with what it starts from.
///
/// Takes the setup boxed and frees the box here: the run's future must not
/// keep it for the run's whole life.
#[expect(
    clippy::boxed_local,
    reason = "taking the box frees it here, not at the end of the run's future"
)]
fn prepare(setup: Box<RunSetup>) -> (Run, Option<Box<crate::approvals::ParkedRun>>, Vec<Message>) {
    let RunSetup {
        agent,
        control,
        input,
        sink,
        store,
        backoff,
        tool_choice,
        token_budget,
        max_rounds,
        timeout,
        parent_pool,
        trace_content,
        resume,
        release_when_parked,
    } = *setup;
    let mut request = InferenceRequest::new(agent.model.upstream_model.clone(), Vec::new());
    if !agent.spec.system_prompt.is_empty() {
        request.system = Some(agent.spec.system_prompt.clone());
    }
    request.tools = agent.descriptors.clone();
    request.tool_choice = tool_choice.unwrap_or_else(|| agent.spec.tool_choice.clone());
    request.temperature = agent.model.temperature;
    request.max_output_tokens = agent.model.max_output_tokens;
    let mut state = RunState::new(&agent.keys);
    state.ensure::<StopStatsKey>();
    // A run carried on from a park counts the time it was active before.
    let active = resume.as_ref().map_or(Duration::ZERO, |r| r.active);
    let started = Instant::now()
        .checked_sub(active)
        .unwrap_or_else(Instant::now);
    // The sooner of the agent's deadline and the request's; one too far
    // away to represent is no deadline.
    let time_limit = agent.deadline.into_iter().chain(timeout).min();
    let deadline = time_limit.and_then(|d| started.checked_add(d));
    // The request's cap on rounds, when it is below the agent's.
    let max_rounds =
        max_rounds.filter(|&n| agent.spec.max_rounds == 0 || n < agent.spec.max_rounds);
    let guard = max_rounds.map(|n| Agent::guard_items_with(&agent.spec, n));
    let max_rounds = max_rounds.unwrap_or(agent.spec.max_rounds);
    let watchdog = DeadlineWatchdog::start(&control, deadline);
    let run_budget = agent
        .context
        .as_ref()
        .and_then(|c| c.budget)
        .into_iter()
        .chain(token_budget)
        .min();
    // The run's own pool when it has a budget (under its parent's, for a
    // sub-agent), else its parent's: its tokens count in every ancestor.
    let pool = match run_budget {
        Some(limit) => Some(Pool::new(control.run_id.clone(), limit, parent_pool)),
        None => parent_pool,
    };
    if !agent.subagents.is_empty() {
        let rounds_left = (max_rounds > 0).then_some(max_rounds);
        let family = Family::new(sink.clone(), pool.clone(), deadline, rounds_left);
        let _ = control.family.set(Arc::new(family));
    }
    // A provider with a token limit needs each prompt's estimate.
    let estimated = agent.counts_tokens();
    let context = match (&agent.context, token_budget) {
        (None, None) if !estimated => None,
        (setup, budget) => {
            let setup = setup.as_ref().unwrap_or(&agent.measure).clone();
            let mut window = ContextWindow::new(setup, &control.thread_id, &request);
            window.limit_budget(budget);
            Some(Box::new(window))
        }
    };
    let run = Run {
        context,
        overflow_retried: false,
        id: RunIdentity {
            thread_id: control.thread_id.clone(),
            run_id: control.run_id.clone(),
            agent_id: agent.id.clone(),
        },
        judge: Judge::live(&agent.spec, &agent.tool_rules),
        checks: model_checks::Checks::of(&agent),
        agent,
        control,
        events: sink.is_enabled(),
        sink,
        store,
        backoff,
        trace_content,
        request,
        lease: None,
        persisted: 0,
        committed: 0,
        incomplete: Vec::new(),
        token_budget: run_budget,
        pool,
        reserved: 0,
        limited: None,
        route: 0,
        guard,
        max_rounds,
        time_limit,
        deadline,
        watchdog,
        release_when_parked,
        rare: None,
        state,
        directives: Directives::default(),
        started,
        steps: 0,
        usage: TokenUsage::default(),
        usage_complete: true,
        cache_usage: None,
        response: String::new(),
    };
    // A run carried on from a park started long ago: its stream goes on.
    if resume.is_none() {
        run.emit(|| AgentEvent::RunStarted {
            run_id: run.id.run_id.to_string(),
            thread_id: run.id.thread_id.to_string(),
            agent_id: run.id.agent_id.to_string(),
        });
    }
    (run, resume, input)
}

/// What a hook dispatch focuses on besides the run.
#[derive(Default, Clone, Copy)]
struct Focus<'a> {
    inference: Option<&'a InferenceResponse>,
    error: Option<&'a InferenceError>,
    tool_call: Option<&'a ToolCall>,
    tool_result: Option<&'a ToolResult>,
}

/// A run's dealings with its provider's limits.
#[derive(Default)]
struct Limited {
    permit: Option<crate::limits::Permit>,
    waited: rein_runtime_contract::lifecycle::RateLimitedWait,
}

struct Run {
    agent: Arc<Agent>,
    control: Arc<RunControl>,
    id: RunIdentity,
    sink: Arc<dyn EventSink>,
    /// Whether the sink wants events (see `EventSink::is_enabled`).
    events: bool,
    store: Arc<dyn ThreadStore>,
    backoff: RetryBackoff,
    /// Whether spans record message contents.
    trace_content: bool,
    /// The next inference's request; `request.messages` is the history.
    request: InferenceRequest,
    /// The store's loan of the history, when the store lends it
    /// (`ThreadStore::lend`): changes to it go through the loan.
    lease: Option<Box<dyn LentHistory>>,
    /// How much of the history the store already has.
    persisted: usize,
    /// How much of the history is finished rounds (all their calls
    /// answered): `persisted`, or beyond it for a store that takes a run's
    /// messages when it ends (`ThreadStore::stores_each_round`).
    committed: usize,
    /// Tool calls that did not complete normally, in the order recorded.
    incomplete: Vec<IncompleteToolCall>,
    /// The run's token budget (the agent's and the request's smaller).
    token_budget: Option<u64>,
    /// The tree's token pool this run spends from, if any.
    pool: Option<Arc<Pool>>,
    /// Tokens reserved in `pool` for the inference in flight.
    reserved: u64,
    /// The provider's limits: the reservation of the inference in flight
    /// and the waits so far (boxed: only runs on a limited provider pay).
    limited: Option<Box<Limited>>,
    /// Which model the run uses: 0 the agent's, `n` its `n`th fallback.
    route: usize,
    /// The guard's checks when the request capped `max_rounds`.
    guard: Option<Vec<crate::agent::GuardItem>>,
    /// The run's cap on inferences (0: unbounded).
    max_rounds: usize,
    /// The run's deadline, from its start.
    time_limit: Option<Duration>,
    /// When the deadline passes (moved on by the time spent parked).
    deadline: Option<Instant>,
    /// Cancels the run at `deadline`; none while parked or once work stops.
    watchdog: DeadlineWatchdog,
    /// Whether the run lets go of its task when it parks.
    release_when_parked: bool,
    /// Parking and sub-agent calls, made on first use (see [`Rare`]).
    rare: Option<Box<Rare>>,
    state: RunState,
    directives: Directives,
    started: Instant,
    /// The run control: policies, detectors, ladders, the guard.
    judge: Judge,
    /// The conditions a model judges, when the agent has any (boxed: the
    /// other runs pay one pointer).
    checks: Option<Box<model_checks::Checks>>,
    steps: u32,
    usage: TokenUsage,
    usage_complete: bool,
    /// Boxed: only runs on a provider that reports caching pay for it.
    cache_usage: Option<Box<CacheUsage>>,
    response: String,
    /// What the model sees, for agents with a context policy or a budget.
    /// Boxed: a run without a context policy or token budget pays one
    /// pointer for it, not the window's state.
    context: Option<Box<ContextWindow>>,
    /// Whether this round's inference was already retried after the
    /// provider refused the prompt as too long.
    overflow_retried: bool,
}

/// What only some runs need — parking for a person, sub-agent calls —
/// boxed on first use: a run's suspended future holds its [`Run`], and a
/// run that uses none of it pays a pointer (W2's memory per run).
#[derive(Default)]
struct Rare {
    /// The calls the run still waited on when it ended while parked.
    parked_pending: Vec<rein_runtime_contract::approval::PendingApproval>,
    /// While parked: where the parked round's assistant message is in the
    /// history (stored already, its held calls still unanswered).
    parked_round: Option<usize>,
    /// Set when the run let go of its task while parked: the parked run
    /// to carry on.
    let_go: Option<Box<crate::approvals::ParkedRun>>,
    /// Escalations so far (their pending ids are `escalation-<n>`).
    escalations: u32,
    /// The sub-agent runs that ended, in order.
    children: Vec<ChildRun>,
}

/// Sends `event` to `sink`, containing a panic in the sink: a sink that
/// panics loses that event (it is logged) and changes nothing else about
/// the run.
pub(crate) fn emit_guarded(sink: &dyn EventSink, event: AgentEvent) {
    let delivered = std::panic::catch_unwind(AssertUnwindSafe(|| sink.emit(event)));
    if let Err(payload) = delivered {
        tracing::error!(
            panic = %panic_message(payload.as_ref()),
            "an event sink panicked; the event is lost, the run goes on"
        );
    }
}

/// Resolves when the run is cancelled (by anyone, or by its deadline).
async fn interrupted(control: &RunControl) {
    control.token.cancelled().await;
}

/// Cancels the run (cause `Deadline`) when its `timeout` deadline passes:
/// one timer per run, so no await of the loop needs its own. Dropping the
/// guard stops the watchdog.
struct DeadlineWatchdog(Option<tokio::task::AbortHandle>);

impl DeadlineWatchdog {
    fn start(control: &Arc<RunControl>, deadline: Option<Instant>) -> Self {
        Self(deadline.map(|at| {
            let control = control.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                control.cancel(CancelCause::Deadline);
            })
            .abort_handle()
        }))
    }
}

impl Drop for DeadlineWatchdog {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// Below this many messages, [`Run::push_history`] grows the history by
/// exactly what a round adds.
const EXACT_GROWTH_BELOW: usize = 32;

fn store_failed(e: ThreadStoreError) -> TerminationReason {
    TerminationReason::Error(e.to_string())
}

impl Run {
    /// Builds and sends an event, unless the sink wants none.
    fn emit(&self, event: impl FnOnce() -> AgentEvent) {
        if self.events {
            emit_guarded(&*self.sink, event());
        }
    }

    /// The run's [`Rare`] part, made on first use.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Changes the history (through the store's loan, if it lent it).
    fn edit_history<R: Default>(&mut self, edit: impl FnOnce(&mut Vec<Message>) -> R) -> R {
        let Some(lease) = &self.lease else {
            return edit(Arc::make_mut(&mut self.request.messages));
        };
        let mut edit = Some(edit);
        let mut out = None;
        lease.edit(&mut self.request.messages, &mut |history| {
            out = edit.take().map(|edit| edit(history));
        });
        // The loan runs the edit exactly once.
        out.unwrap_or_default()
    }

    /// Appends to the history. A short history grows by what the round
    /// adds (the message, and the results its tool calls will add), not by
    /// doubling: a run's suspended state is mostly its history, and a
    /// doubled vector holds a third of it spare on average (W2's memory per
    /// run). A long one doubles, so appending stays amortized O(1).
    fn push_history(&mut self, message: Message) {
        let needs = 1 + message.tool_calls.len();
        self.edit_history(|history| {
            if history.capacity() - history.len() < needs && history.len() < EXACT_GROWTH_BELOW {
                history.reserve_exact(needs);
            }
            history.push(message);
        });
    }

    /// Takes the thread's history: borrowed from the store when it lends
    /// it, loaded otherwise. Returns its length.
    async fn take_history(&mut self) -> Result<usize, TerminationReason> {
        let thread = &self.id.thread_id;
        self.request.messages = match self.store.lend(thread) {
            Some((history, lease)) => {
                self.lease = Some(lease);
                history
            }
            None => Arc::new(self.store.load(thread).await.map_err(store_failed)?),
        };
        let len = self.request.messages.len();
        self.persisted = len;
        self.committed = len;
        if let Some(checks) = &mut self.checks {
            checks.task_from = len;
        }
        Ok(len)
    }

    /// Loads the thread, repairs what it finds, and records the input.
    async fn start(&mut self, input: Vec<Message>) -> Result<(), TerminationReason> {
        let from = self.take_history().await?;
        // Calls a previous run left open (its process stopped mid-call):
        // nothing says whether they ran.
        let repaired = self.edit_history(|history| {
            history::repair_with_status(
                history,
                0,
                "error: the run that requested this call ended without recording its result; the call may or may not have run",
                ToolCallStatus::MayHaveCompleted,
            )
        });
        // A lent history is the store's own: repaired in place.
        if repaired > 0 && self.lease.is_none() {
            self.store
                .replace(&self.id.thread_id, &self.request.messages)
                .await
                .map_err(store_failed)?;
        }
        self.edit_history(|history| {
            history.extend(input);
            history::repair_with_status(
                history,
                from,
                "not run: this call had no result in the input",
                ToolCallStatus::NotStarted,
            );
        });
        self.persist_round().await
    }

    /// Appends the part of the history the store does not have yet.
    async fn persist(&mut self) -> Result<(), TerminationReason> {
        if let Some(lease) = &self.lease {
            // The store holds the history already: readers are shown it.
            self.committed = self.request.messages.len();
            lease.show(self.committed);
            return Ok(());
        }
        let new = &self.request.messages[self.persisted..];
        if !new.is_empty() {
            self.store
                .append(&self.id.thread_id, new)
                .await
                .map_err(store_failed)?;
            self.persisted = self.request.messages.len();
        }
        self.committed = self.persisted;
        Ok(())
    }

    /// Marks the history so far as finished rounds, storing it if the store
    /// takes each round as it ends, or showing it if the store lent it
    /// ([`persist`](Self::persist)); otherwise it waits for
    /// [`hand_over`](Self::hand_over).
    async fn persist_round(&mut self) -> Result<(), TerminationReason> {
        if self.store.stores_each_round() || self.lease.is_some() {
            return self.persist().await;
        }
        self.committed = self.request.messages.len();
        Ok(())
    }

    /// At the run's end: gives the store what it does not have yet, moved
    /// out of the history when the run holds it alone (a copy otherwise);
    /// a history the store lent goes back whole. The history is left empty.
    async fn hand_over(&mut self) -> Result<(), TerminationReason> {
        if let Some(lease) = self.lease.take() {
            lease.give_back(std::mem::take(&mut self.request.messages));
            return Ok(());
        }
        let from = self.persisted;
        if from >= self.request.messages.len() {
            return Ok(());
        }
        let new = match Arc::try_unwrap(std::mem::take(&mut self.request.messages)) {
            Ok(history) if from == 0 => history,
            Ok(mut history) => history.split_off(from),
            // Someone else holds the history still: copy only what is new.
            Err(shared) => shared[from..].to_vec(),
        };
        self.store
            .append_owned(&self.id.thread_id, new)
            .await
            .map_err(store_failed)
    }

    async fn hooks(&mut self, phase: Phase, focus: Focus<'_>) -> Result<(), TerminationReason> {
        if self.agent.hooks(phase).is_empty() {
            return Ok(());
        }
        let agent = self.agent.clone();
        let hooks = agent.hooks(phase);
        let estimated_prompt_tokens = self
            .context
            .as_ref()
            .map(|context| context.estimate_with(&self.request.messages));
        let mut ctx = PhaseContext {
            estimated_prompt_tokens,
            phase,
            run: &self.id,
            step: self.steps,
            state: &mut self.state,
            messages: &self.request.messages,
            inference: focus.inference,
            inference_error: focus.error,
            tool_call: focus.tool_call,
            tool_result: focus.tool_result,
            directives: &mut self.directives,
        };
        let dispatched = dispatch(hooks, &mut ctx).await;
        for event in std::mem::take(&mut self.directives.events) {
            self.emit(|| event);
        }
        dispatched.map_err(HookFailure::into_reason)
    }

    fn termination(&mut self) -> Option<TerminationReason> {
        self.directives.termination.take()
    }

    /// The reason a cancelled run ends with.
    fn cancelled_reason(&self) -> TerminationReason {
        match (self.control.cause(), self.time_limit) {
            (Some(CancelCause::Deadline), Some(limit)) => TerminationReason::stopped(
                "timeout",
                format!(
                    "the {} s timeout passed while work was in flight",
                    limit.as_secs()
                ),
            ),
            _ => TerminationReason::Cancelled,
        }
    }

    /// The rounds of the run; returns why it ends.
    async fn rounds(&mut self) -> TerminationReason {
        if let Err(reason) = self.hooks(Phase::RunStart, Focus::default()).await {
            return reason;
        }
        self.round_loop().await
    }

    /// The rounds after `RunStart` (where a run carried on from a park
    /// goes on).
    async fn round_loop(&mut self) -> TerminationReason {
        loop {
            if let Some(reason) = self.termination() {
                return reason;
            }
            if self.control.token.is_cancelled() {
                return self.cancelled_reason();
            }
            if let Some(reason) = self.directives.escalation.take() {
                match Box::pin(self.escalate(*reason)).await {
                    Ok(Some(message)) => self.directives.user_messages.push(message),
                    // Nothing to tell the model after a final answer: it stands.
                    Ok(None) if self.answered() => return TerminationReason::NaturalEnd,
                    Ok(None) => {}
                    Err(reason) => return reason,
                }
            }
            self.steps += 1;
            // A request for another round applies to the round it was made in.
            self.directives.another_round = false;
            // The loop only goes on after a failed inference to retry it,
            // so a failure streak means this round is a retry.
            let failed_before = self
                .state
                .get::<StopStatsKey>()
                .map_or(0, |s| s.consecutive_errors);
            match (failed_before > 0).then(|| failed_before.saturating_add(1)) {
                Some(attempt) => self.emit(|| AgentEvent::RetryStarted {
                    run_id: self.id.run_id.to_string(),
                    thread_id: self.id.thread_id.to_string(),
                    step: self.steps,
                    attempt,
                }),
                None => self.emit(|| AgentEvent::StepStarted {
                    run_id: self.id.run_id.to_string(),
                    thread_id: self.id.thread_id.to_string(),
                    step: self.steps,
                }),
            }
            // Time-based policies checked before the inference (a hook
            // there, e.g. a plugin's timeout) see the time now.
            if !self.agent.hooks[Phase::BeforeInference.index()].is_empty()
                && let Some(stats) = self.state.slot_mut::<StopStatsKey>()
            {
                stats.elapsed_ms =
                    u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            }
            for phase in [Phase::StepStart, Phase::BeforeInference] {
                if let Err(reason) = self.hooks(phase, Focus::default()).await {
                    return reason;
                }
            }
            if let Some(reason) = self.termination() {
                return reason;
            }
            self.add_nudges();
            // A window without a policy (a token budget alone) is brought
            // up to date in place; one with a view may compact or summarize,
            // whose state is boxed out of the run's.
            match self.prepare_counts() {
                Some(Some(reason)) => return reason,
                Some(None) => {}
                None if self.context.is_some() => {
                    if let Some(reason) = Box::pin(self.prepare_context()).await {
                        return reason;
                    }
                }
                None => {}
            }
            match self.infer().await {
                Inference::Interrupted(partial) => {
                    self.settle_limits(None, None).await;
                    if !partial.text.is_empty() {
                        self.response = partial.text.clone();
                        let mut message = Message::assistant(partial.text);
                        message.interrupted = true;
                        self.push_history(message);
                    }
                    return self.cancelled_reason();
                }
                Inference::Failed(error) => {
                    if let Some(reason) = self.after_failed_inference(error).await {
                        return reason;
                    }
                }
                Inference::Done(response) => {
                    // Boxed, like `start` and `finish` in `execute`: the
                    // state of a round's tool calls is large and live only
                    // while they are handled, so it stays out of the future
                    // every waiting run holds (W2 in docs/performance.md).
                    if let Some(reason) = Box::pin(self.after_inference(response)).await {
                        return reason;
                    }
                }
                Inference::Cut(mut partial) => {
                    // Calls of a cut answer are incomplete; they are not run.
                    partial.tool_calls.clear();
                    if let Some(reason) = Box::pin(self.after_inference(partial)).await {
                        return reason;
                    }
                }
            }
        }
    }

    /// Whether the history ends with a final answer (an assistant message
    /// without tool calls).
    fn answered(&self) -> bool {
        self.request.messages.last().is_some_and(|m| {
            m.role == rein_runtime_contract::message::Role::Assistant && m.tool_calls.is_empty()
        })
    }

    /// Moves nudges requested by hooks into the history.
    fn add_nudges(&mut self) {
        if self.directives.user_messages.is_empty() {
            return;
        }
        for text in std::mem::take(&mut self.directives.user_messages) {
            self.emit(|| AgentEvent::Nudge {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                text: text.clone(),
            });
            self.push_history(Message::user(text));
        }
    }

    /// Ends the run: repairs the history, runs `RunEnd` hooks, persists,
    /// and emits `RunFinished`.
    async fn finish(mut self, mut reason: TerminationReason) -> AgentRunResult {
        // Nudges requested in the last round have no inference to join.
        self.directives.user_messages.clear();
        let status = ToolCallStatus::NotStarted;
        let note = format!(
            "{} — {status}: {}",
            not_run_note(
                &reason,
                self.control.cause(),
                self.rare
                    .as_ref()
                    .is_some_and(|r| !r.parked_pending.is_empty())
            ),
            status.explanation()
        );
        // A round parked and stored with its held calls unanswered is
        // repaired too.
        let from = self
            .rare
            .as_ref()
            .and_then(|r| r.parked_round)
            .map_or(self.committed, |at| at.min(self.committed));
        let repaired =
            self.edit_history(|history| history::repair_calls(history, from, &note, Some(status)));
        for (id, name) in repaired {
            self.incomplete
                .push(IncompleteToolCall::new(id, name, status));
        }
        if let Err(failure) = self.hooks(Phase::RunEnd, Focus::default()).await {
            reason = failure;
        }
        if let Some(context) = self.context.take() {
            context.save(&self.request.messages);
        }
        if let Err(failure) = self.hand_over().await {
            reason = failure;
        }
        let cancel_cause = match (&reason, self.control.cause()) {
            (TerminationReason::Cancelled, cause) => {
                Some(cause.cloned().unwrap_or(CancelCause::Requested))
            }
            (TerminationReason::Stopped(r), Some(CancelCause::Deadline)) if r.code == "timeout" => {
                Some(CancelCause::Deadline)
            }
            _ => None,
        };
        let outputs = self
            .state
            .get::<EmittedOutputs>()
            .cloned()
            .unwrap_or_default();
        let exports = self.state.exports(&self.agent.keys);
        let report = self.report(&reason);
        tracing::debug!(%reason, steps = self.steps, "run finished");
        // The one `RunFinished`; the claim keeps the task's panic handler
        // from sending another should anything after this point panic.
        self.control.claim_finished();
        self.emit(|| AgentEvent::RunFinished {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            termination: reason.clone(),
            response: self.response.clone(),
            cancel_cause: cancel_cause.clone(),
            steps: self.steps,
            usage: self.usage,
            cache_usage: self.cache_usage.as_deref().copied(),
            outputs: outputs.clone(),
            report: Some(report.clone()),
        });
        AgentRunResult {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            termination: reason,
            response: self.response,
            steps: self.steps,
            usage: self.usage,
            usage_complete: self.usage_complete,
            cache_usage: self.cache_usage.as_deref().copied(),
            cancel_cause,
            outputs,
            exports,
            report,
        }
    }
}

/// The text of the result given to a call that never ran.
fn not_run_note(reason: &TerminationReason, cause: Option<&CancelCause>, parked: bool) -> String {
    match (reason, cause) {
        (TerminationReason::Cancelled, Some(CancelCause::Interrupted { .. })) if parked => {
            "not run: superseded by new input".to_owned()
        }
        (TerminationReason::Cancelled, Some(CancelCause::Interrupted { .. })) => {
            "not run: the run was interrupted by new input".to_owned()
        }
        (TerminationReason::Cancelled, _) => "not run: the run was cancelled".to_owned(),
        (TerminationReason::Stopped(r), _) => format!("not run: the run was stopped ({})", r.code),
        (TerminationReason::Error(_), _) => "not run: the run ended with an error".to_owned(),
        (TerminationReason::NaturalEnd, _) => "not run: the run ended".to_owned(),
    }
}
