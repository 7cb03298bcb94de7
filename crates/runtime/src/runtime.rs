//! [`AgentRuntime`]: starts runs, finds them by thread or id, cancels them.
//!
//! Runs execute on spawned tokio tasks, so every method that starts a run
//! must be called from within a tokio runtime.

use std::any::Any;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt;
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::event::{AgentEvent, CancelCause, EventSink};
use rein_runtime_contract::lifecycle::{StopReport, TerminationReason};
use rein_runtime_contract::message::{Message, TokenUsage};
use rein_runtime_contract::spec::AgentSpec;
use rein_runtime_contract::tool::ToolDescriptor;

use crate::active_runs::{ActiveRunRegistry, CURRENT_RUN, RunControl};
use crate::agent::Agent;
use crate::agent_loop::{RetryBackoff, RunSetup, execute};
use crate::approvals::{ApprovalError, Decided};
use crate::extensions::{Extensions, Observers, RunObserver};
use crate::history::validate_input;
use crate::mailbox::{Mailbox, RunHandle};
use crate::phase::panic_message;
use crate::run::{AgentRunResult, RunRequest};
use crate::stream::RunStream;
use crate::telemetry;
use crate::thread_store::ThreadStore;
use rein_runtime_contract::approval::{Decider, Decision, PendingApproval};

/// Why [`AgentRuntime::cancel_tool_call`] found nothing to cancel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CancelToolCallError {
    /// No run with this id is active (it finished, or never existed).
    #[error(
        "no active run \"{run_id}\"; a tool call can be cancelled only while its run is active"
    )]
    UnknownRun {
        /// The run id asked for.
        run_id: String,
    },
    /// The run has no running call with this id.
    #[error(
        "run \"{run_id}\" has no running tool call \"{call_id}\" (it finished or never started); running now: {}",
        if running.is_empty() { "none".to_owned() } else { running.join(", ") }
    )]
    NotRunning {
        /// The run.
        run_id: String,
        /// The call id asked for.
        call_id: String,
        /// The calls running now.
        running: Vec<String>,
    },
}

impl CancelToolCallError {
    /// A stable code for the error (`unknown_run`, `tool_call_not_running`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownRun { .. } => "unknown_run",
            Self::NotRunning { .. } => "tool_call_not_running",
        }
    }
}

/// Why a run could not be started or awaited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A run is already active on the thread (use the mailbox to interrupt it).
    #[error(
        "thread \"{thread_id}\" already has an active run; cancel it first or submit through the mailbox"
    )]
    ThreadAlreadyRunning {
        /// The thread.
        thread_id: String,
    },
    /// A run interrupted by the mailbox kept its thread past the cancel-wait bound.
    #[error(
        "run \"{run_id}\" on thread \"{thread_id}\" did not release the thread within the cancel-wait bound; nothing was submitted"
    )]
    PreviousRunStuck {
        /// The thread.
        thread_id: String,
        /// The run that would not let go.
        run_id: String,
    },
    /// The request names an agent the runtime does not have.
    #[error("unknown agent id \"{agent_id}\"; registered agent ids: {known}")]
    UnknownAgent {
        /// The unknown id.
        agent_id: String,
        /// The registered ids (or `none`).
        known: String,
    },
    /// The request names no agent and the runtime has several (or none).
    #[error(
        "the request names no agent and the runtime has {count} agents; call RunRequest::with_agent_id with one of: {known}"
    )]
    AgentRequired {
        /// How many agents there are.
        count: usize,
        /// The registered ids (or `none`).
        known: String,
    },
    /// The runtime was shut down.
    #[error("the runtime has been shut down; no new runs start")]
    ShutDown,
    /// The run parked and let go of its task (it was started with
    /// `RunRequest::release_when_parked`): it has no result yet. Await it
    /// with `RunHandle::wait_or_parked` to get the parked run.
    #[error(
        "run \"{run_id}\" parked for approvals and let go of its task; await it with RunHandle::wait_or_parked and carry it on with RunRequest::resume"
    )]
    RunParked {
        /// The run.
        run_id: String,
    },
    /// The request's messages would make the thread's history invalid (a
    /// tool result that answers no call, or a second result for one call).
    /// Nothing was stored and no run was interrupted.
    #[error(
        "invalid input for thread \"{thread_id}\": message #{index}: {reason}; a tool result must directly follow the assistant message whose call it answers, once per call"
    )]
    InvalidInput {
        /// The thread.
        thread_id: String,
        /// The offending message's position in the request, from 0.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The request has no messages and the thread has no history: there is
    /// nothing to send to the model.
    #[error(
        "thread \"{thread_id}\" has no history and the request has no messages; send at least one message"
    )]
    EmptyConversation {
        /// The thread.
        thread_id: String,
    },
    /// The thread store failed.
    #[error("the thread store failed for thread \"{thread_id}\": {message}")]
    Store {
        /// The thread.
        thread_id: String,
        /// What the store said.
        message: String,
    },
    /// The request asks for the id of a run that is active
    /// ([`RunRequest::with_run_id`]).
    #[error("run id \"{run_id}\" is already the id of an active run; choose another")]
    RunIdInUse {
        /// The id.
        run_id: String,
    },
    /// The run's task failed outside the loop's own error handling.
    #[error("the task of run \"{run_id}\" failed: {message}")]
    RunTaskFailed {
        /// The run.
        run_id: String,
        /// What happened.
        message: String,
    },
}

/// Runtime-wide settings from the builder.
pub(crate) struct RuntimeConfig {
    pub(crate) store: Arc<dyn ThreadStore>,
    pub(crate) default_sink: Arc<dyn EventSink>,
    pub(crate) cancel_wait: Duration,
    pub(crate) backoff: RetryBackoff,
    pub(crate) trace_content: bool,
    pub(crate) observers: Vec<Arc<dyn RunObserver>>,
    pub(crate) extensions: HashMap<std::any::TypeId, Box<dyn Any + Send + Sync>>,
    pub(crate) artifacts: Arc<dyn crate::context::ArtifactStore>,
    /// Every provider id, sorted, with its gate when it is limited.
    pub(crate) providers: Vec<(String, Option<Arc<crate::limits::ProviderGate>>)>,
}

/// The settings runs read (everything of [`RuntimeConfig`] but what moves
/// into [`Inner`]'s own fields).
pub(crate) struct RunConfig {
    pub(crate) store: Arc<dyn ThreadStore>,
    pub(crate) default_sink: Arc<dyn EventSink>,
    pub(crate) cancel_wait: Duration,
    pub(crate) backoff: RetryBackoff,
    pub(crate) trace_content: bool,
    pub(crate) artifacts: Arc<dyn crate::context::ArtifactStore>,
}

pub(crate) struct Inner {
    agents: HashMap<String, Arc<Agent>>,
    pub(crate) registry: Arc<ActiveRunRegistry>,
    pub(crate) config: RunConfig,
    root: CancellationToken,
    shut_down: AtomicBool,
    next_run: AtomicU64,
    pub(crate) mailbox_locks: dashmap::DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    observers: Arc<Observers>,
    extensions: Extensions,
    providers: Vec<(String, Option<Arc<crate::limits::ProviderGate>>)>,
}

/// Why `Inner::start` did not start a run.
pub(crate) enum StartError {
    /// The thread is busy; the request is handed back.
    Busy(Box<RunRequest>),
    Other(RuntimeError),
}

impl Inner {
    pub(crate) fn next_run_id(&self) -> Arc<str> {
        Arc::from(self.next_id("run"))
    }

    /// `<prefix>-<n>` from the one counter behind every id the runtime makes.
    fn next_id(&self, prefix: &str) -> String {
        let n = self.next_run.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{n}")
    }

    /// Checks, starts and awaits one run with a given id (see
    /// [`AgentRuntime::run`]).
    async fn run(
        &self,
        request: RunRequest,
        sink: Arc<dyn EventSink>,
        run_id: Arc<str>,
    ) -> Result<AgentRunResult, RuntimeError> {
        self.check_conversation(&request).await?;
        let handle = self.start_run(request, Some(sink), Some(run_id))?;
        await_run(handle).await
    }

    /// Runs a sub-agent's child run to its end (its thread is its own, so
    /// it is never busy). Dropping the future cancels the child.
    pub(crate) async fn run_child(
        &self,
        request: RunRequest,
    ) -> Result<AgentRunResult, RuntimeError> {
        let handle = self.start_run(request, None, None)?;
        await_run(handle).await
    }

    /// [`start`](Self::start) for a caller that does not wait for a busy
    /// thread: busy is [`RuntimeError::ThreadAlreadyRunning`].
    fn start_run(
        &self,
        request: RunRequest,
        sink: Option<Arc<dyn EventSink>>,
        run_id: Option<Arc<str>>,
    ) -> Result<RunHandle, RuntimeError> {
        self.start(request, sink, run_id).map_err(|e| match e {
            StartError::Busy(request) => RuntimeError::ThreadAlreadyRunning {
                thread_id: request.thread_id,
            },
            StartError::Other(e) => e,
        })
    }

    fn agent_for(&self, request: &RunRequest) -> Result<Arc<Agent>, RuntimeError> {
        // Hidden agents (variants made for sub-agents' declared outputs)
        // run only when named; they are never listed nor picked.
        let visible = || self.agents.values().filter(|a| !a.hidden);
        let known = || {
            let mut ids: Vec<&str> = visible().map(|a| a.spec.id.as_str()).collect();
            ids.sort_unstable();
            if ids.is_empty() {
                "none".to_owned()
            } else {
                ids.join(", ")
            }
        };
        match &request.agent_id {
            Some(id) => self
                .agents
                .get(id)
                .cloned()
                .ok_or_else(|| RuntimeError::UnknownAgent {
                    agent_id: id.clone(),
                    known: known(),
                }),
            None => {
                let mut agents = visible();
                match (agents.next(), agents.next()) {
                    (Some(only), None) => Ok(only.clone()),
                    _ => Err(RuntimeError::AgentRequired {
                        count: visible().count(),
                        known: known(),
                    }),
                }
            }
        }
    }

    /// Everything that can be checked about a request without the store:
    /// the runtime is up, the agent exists, the input keeps the history
    /// valid. Returns the agent.
    pub(crate) fn check(&self, request: &RunRequest) -> Result<Arc<Agent>, RuntimeError> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(RuntimeError::ShutDown);
        }
        let agent = self.agent_for(request)?;
        validate_input(&request.messages).map_err(|e| RuntimeError::InvalidInput {
            thread_id: request.thread_id.clone(),
            index: e.index,
            reason: e.reason,
        })?;
        Ok(agent)
    }

    /// Rejects a request with no messages for a thread with no history.
    /// A thread with an active run is not empty (that run's input is, or is
    /// about to be, its history).
    pub(crate) async fn check_conversation(
        &self,
        request: &RunRequest,
    ) -> Result<(), RuntimeError> {
        if !request.messages.is_empty() || self.registry.is_active(&request.thread_id) {
            return Ok(());
        }
        let history = self
            .config
            .store
            .load(&request.thread_id)
            .await
            .map_err(|e| RuntimeError::Store {
                thread_id: request.thread_id.clone(),
                message: e.message,
            })?;
        if history.is_empty() {
            return Err(RuntimeError::EmptyConversation {
                thread_id: request.thread_id.clone(),
            });
        }
        Ok(())
    }

    /// Takes the thread's slot and spawns the run. Returns once the run has
    /// started (holds its slot); the run proceeds on its own task.
    pub(crate) fn start(
        &self,
        request: RunRequest,
        sink: Option<Arc<dyn EventSink>>,
        run_id: Option<Arc<str>>,
    ) -> Result<RunHandle, StartError> {
        let agent = self.check(&request).map_err(StartError::Other)?;
        let run_id = run_id
            .or_else(|| request.run_id.clone())
            .unwrap_or_else(|| self.next_run_id());
        if self.registry.by_run(&run_id).is_some() {
            return Err(StartError::Other(RuntimeError::RunIdInUse {
                run_id: run_id.to_string(),
            }));
        }
        let token = match &request.cancellation {
            Some(parent) => parent.child_token(),
            None => self.root.child_token(),
        };
        let mut control = RunControl::new(run_id.clone(), request.thread_id.as_str().into(), token);
        control.root_run_id = request.root_run_id.clone();
        let control = Arc::new(control);
        let slot = match self.registry.acquire(control.clone()) {
            Ok(slot) => slot,
            Err(_) => return Err(StartError::Busy(Box::new(request))),
        };
        // Pairs with `shutdown`, which sets the flag before it lists the
        // active runs: either it sees this slot or this sees the flag.
        if self.shut_down.load(Ordering::SeqCst) {
            control.cancel(CancelCause::Shutdown);
        }
        let RunRequest {
            thread_id,
            messages,
            event_sink,
            tool_choice,
            token_budget,
            max_rounds,
            timeout,
            parent_pool,
            resume,
            release_when_parked,
            root_run_id,
            ..
        } = request;
        let sink = event_sink
            .or(sink)
            .unwrap_or_else(|| self.config.default_sink.clone());
        let setup = RunSetup {
            agent,
            control: control.clone(),
            input: messages,
            sink: sink.clone(),
            store: self.config.store.clone(),
            backoff: self.config.backoff,
            tool_choice,
            token_budget,
            max_rounds,
            timeout,
            parent_pool,
            trace_content: self.config.trace_content,
            resume,
            // A sub-agent's parent waits on its call: it never lets go.
            release_when_parked: release_when_parked && root_run_id.is_none(),
        };
        let span = telemetry::run_span(&setup.agent.spec.id, &thread_id, &run_id);
        let task_control = control.clone();
        let observers = self.observers.clone();
        // Boxed before the task captures it: the task's future holds a
        // pointer, not the setup, for as long as the run waits.
        let setup = Box::new(setup);
        let task = async move {
            // The slot lives exactly as long as this task's future (moved
            // in, not bound again: a binding would hold a second copy).
            let _ = &slot;
            let run_id = task_control.run_id.clone();
            let outcome = AssertUnwindSafe(CURRENT_RUN.scope(run_id, execute(setup)))
                .catch_unwind()
                .await;
            let result = match outcome {
                Ok(result) => result,
                Err(payload) => internal_failure(&task_control, &*sink, payload.as_ref()),
            };
            // A run that let go while parked has not ended.
            if task_control.has_let_go() {
                return result;
            }
            // The task runs in the run's span (no second handle kept).
            telemetry::record_run_end(&tracing::Span::current(), &result.termination);
            // Before the slot is released, so the thread's next run
            // starts after the observers saw this one end.
            let seen = AssertUnwindSafe(|| observers.run_finished(&result));
            if std::panic::catch_unwind(seen).is_err() {
                tracing::error!("a run observer panicked; the run's result stands");
            }
            result
        };
        let task = tokio::spawn(telemetry::in_span(task, span));
        Ok(RunHandle::new(control, task))
    }
}

/// Reports a run whose loop itself panicked (a bug in Rein): the run still
/// gets its one `RunFinished` — unless it already had it.
fn internal_failure(
    control: &RunControl,
    sink: &dyn EventSink,
    payload: &(dyn std::any::Any + Send),
) -> AgentRunResult {
    let (run_id, thread_id) = (&*control.run_id, &*control.thread_id);
    let termination = TerminationReason::Error(format!(
        "internal error: the run loop panicked: {}",
        panic_message(payload)
    ));
    tracing::error!(%termination, "run loop panicked");
    if !control.claim_finished() {
        return failed_result(run_id, thread_id, termination);
    }
    crate::agent_loop::emit_guarded(
        sink,
        AgentEvent::RunFinished {
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            termination: termination.clone(),
            response: String::new(),
            cancel_cause: None,
            steps: 0,
            usage: TokenUsage::default(),
            cache_usage: None,
            outputs: Default::default(),
            report: Some(panicked_report(&termination)),
        },
    );
    failed_result(run_id, thread_id, termination)
}

/// The report of a run whose loop panicked: not known to be resumable.
fn panicked_report(termination: &TerminationReason) -> StopReport {
    let mut report = StopReport::new(termination);
    report.resumable = false;
    report.hint = Some(
        "Rein's run loop failed (a bug; please report it): check the thread's history before continuing"
            .to_owned(),
    );
    report
}

fn failed_result(run_id: &str, thread_id: &str, termination: TerminationReason) -> AgentRunResult {
    AgentRunResult {
        run_id: run_id.to_owned(),
        thread_id: thread_id.to_owned(),
        response: String::new(),
        steps: 0,
        usage: TokenUsage::default(),
        cache_usage: None,
        usage_complete: false,
        cancel_cause: None,
        outputs: Default::default(),
        exports: Default::default(),
        report: panicked_report(&termination),
        termination,
    }
}

/// Awaits a started run; dropping the future cancels it (cause `Requested`).
async fn await_run(handle: RunHandle) -> Result<AgentRunResult, RuntimeError> {
    let mut guard = CancelOnDrop(Some(handle.control().clone()));
    let result = handle.wait().await;
    guard.0 = None;
    result
}

/// Cancels a run when the future awaiting it is dropped.
struct CancelOnDrop(Option<Arc<RunControl>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(control) = self.0.take() {
            control.cancel(CancelCause::Requested);
        }
    }
}

/// The agent runtime: holds the agents and the active runs, starts runs and
/// cancels them. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct AgentRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<&String> = self.inner.agents.keys().collect();
        agents.sort_unstable();
        f.debug_struct("AgentRuntime")
            .field("agents", &agents)
            .field("active_runs", &self.inner.registry.all().len())
            .finish_non_exhaustive()
    }
}

impl AgentRuntime {
    pub(crate) fn new(agents: HashMap<String, Arc<Agent>>, config: RuntimeConfig) -> Self {
        let RuntimeConfig {
            store,
            default_sink,
            cancel_wait,
            backoff,
            trace_content,
            observers,
            extensions,
            artifacts,
            providers,
        } = config;
        Self {
            inner: Arc::new(Inner {
                agents,
                registry: Arc::default(),
                config: RunConfig {
                    store,
                    default_sink,
                    cancel_wait,
                    backoff,
                    trace_content,
                    artifacts,
                },
                root: CancellationToken::new(),
                shut_down: AtomicBool::new(false),
                next_run: AtomicU64::new(1),
                mailbox_locks: dashmap::DashMap::new(),
                observers: Arc::new(Observers::new(observers)),
                extensions: Extensions::from_builder(extensions),
                providers,
            }),
        }
    }

    /// Runs `request` to its end, sending its events to `sink` (unless the
    /// request carries its own sink).
    ///
    /// # Errors
    ///
    /// `Err` only when no run started — [`RuntimeError::ThreadAlreadyRunning`],
    /// an unknown or missing agent id, [`RuntimeError::ShutDown`], input
    /// that would make the history invalid ([`RuntimeError::InvalidInput`]),
    /// no messages for a thread with no history
    /// ([`RuntimeError::EmptyConversation`]) — or the run's task failed. Every run that started returns `Ok`, whatever its
    /// termination.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the run (cause `Requested`); the run's
    /// cleanup — history repair, `RunFinished`, releasing the thread —
    /// completes in the background.
    pub fn run(
        &self,
        request: RunRequest,
        sink: Arc<dyn EventSink>,
    ) -> impl Future<Output = Result<AgentRunResult, RuntimeError>> + Send + '_ {
        // Not an `async fn`: one keeps its arguments for its whole life, so
        // every waiting run would hold the 224-byte request (twice, as an
        // argument and as a local). Boxed and taken back at the start, the
        // request lives only until the run starts (W2's memory per run).
        let args = Box::new((request, sink));
        async move {
            // No await while the request is in scope: input to check against
            // the store (no messages) is checked in a boxed future of its own.
            let started = {
                let (request, sink) = {
                    let args = args;
                    *args
                };
                if request.messages.is_empty() {
                    let inner = &self.inner;
                    Err(Box::pin(async move {
                        inner.check_conversation(&request).await?;
                        inner.start_run(request, Some(sink), None)
                    }))
                } else {
                    Ok(self.inner.start_run(request, Some(sink), None))
                }
            };
            let handle = match started {
                Ok(started) => started?,
                Err(checked) => checked.await?,
            };
            await_run(handle).await
        }
    }

    /// Starts `request` and returns its events as a stream that ends with
    /// `RunFinished`; [`RunStream::result`] then has what
    /// [`run`](Self::run) would have returned. Events also go to the sink
    /// the run would have had (the request's, else the runtime's default).
    ///
    /// Nothing happens until the stream is first polled. A run that cannot
    /// start ends the stream at once, and its [`RuntimeError`] is the
    /// stream's result. No event is lost for a slow consumer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the stream before it ended cancels the run (cause
    /// `Requested`), as dropping [`run`](Self::run)'s future does.
    pub fn run_stream(&self, mut request: RunRequest) -> RunStream {
        let (events, cancellation) =
            RunStream::prepare(&mut request, &self.inner.config.default_sink);
        let run_id = request
            .run_id
            .clone()
            .unwrap_or_else(|| self.inner.next_run_id());
        let inner = self.inner.clone();
        let sink = self.inner.config.default_sink.clone();
        let id = run_id.clone();
        let run = async move { inner.run(request, sink, id).await }.boxed();
        RunStream::new(run_id, events, cancellation, run)
    }

    /// Like [`run`](Self::run), with the runtime's default event sink.
    ///
    /// # Errors
    ///
    /// As for [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As for [`run`](Self::run).
    pub fn run_to_completion(
        &self,
        request: RunRequest,
    ) -> impl Future<Output = Result<AgentRunResult, RuntimeError>> + Send + '_ {
        // `run`'s future itself, not one wrapping it (see `run`).
        let sink = self.inner.config.default_sink.clone();
        self.run(request, sink)
    }

    /// The thread's stored history (empty for an unknown thread, or when the
    /// store fails; the failure is logged).
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping it loses nothing.
    pub async fn thread_messages(&self, thread_id: &str) -> Vec<Message> {
        match self.inner.config.store.load(thread_id).await {
            Ok(messages) => messages,
            Err(error) => {
                tracing::warn!(%error, "could not load thread history");
                Vec::new()
            }
        }
    }

    /// The spec of the agent a request names (`Some(id)`), or of the only
    /// agent (`None`, as a request without an agent id runs); `None` when
    /// there is no such agent.
    pub fn agent_spec(&self, agent_id: Option<&str>) -> Option<&AgentSpec> {
        let agent = match agent_id {
            Some(id) => self.inner.agents.get(id)?,
            None if self.inner.agents.len() == 1 => self.inner.agents.values().next()?,
            None => return None,
        };
        Some(&agent.spec)
    }

    /// The judging models of agent `agent_id`'s `llm_loop_check` and
    /// `task_complete` conditions, in list order (for
    /// [`replay_judged`](crate::replay::replay_judged)); `None` for an
    /// unknown agent.
    pub fn judging_models(&self, agent_id: &str) -> Option<Vec<crate::replay::JudgingModel>> {
        let agent = self.inner.agents.get(agent_id)?;
        Some(
            agent
                .checks
                .iter()
                .map(|route| crate::replay::JudgingModel {
                    model: route.model.clone(),
                    executor: route.executor.clone(),
                })
                .collect(),
        )
    }

    /// Checks a request as starting it would, without starting it: the
    /// runtime is up, the agent exists, the input keeps the history valid,
    /// and the conversation is not empty (a thread with an active run is
    /// not empty).
    ///
    /// # Errors
    ///
    /// The [`RuntimeError`] that [`run`](Self::run) would return before
    /// starting.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping it loses nothing.
    pub async fn check_request(&self, request: &RunRequest) -> Result<(), RuntimeError> {
        self.inner.check(request)?;
        self.inner.check_conversation(request).await
    }

    /// Every registered provider, sorted by id: its limits and, for a
    /// limited one, what its window holds and how many inferences wait.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping it loses nothing.
    pub async fn provider_status(&self) -> Vec<crate::limits::ProviderStatus> {
        let mut out = Vec::with_capacity(self.inner.providers.len());
        for (id, gate) in &self.inner.providers {
            out.push(match gate {
                Some(gate) => gate.status().await,
                None => crate::limits::ProviderStatus {
                    id: id.clone(),
                    limits: crate::limits::ProviderLimits::default(),
                    usage: None,
                    error: None,
                },
            });
        }
        out
    }

    /// The ids of the runtime's agents, sorted.
    pub fn agent_ids(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .inner
            .agents
            .values()
            .filter(|a| !a.hidden)
            .map(|a| a.spec.id.as_str())
            .collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The descriptors of the tools an agent can call (its own, its
    /// plugins' and the runtime's), by name; `None` for an unknown agent.
    pub fn agent_tools(&self, agent_id: &str) -> Option<Vec<ToolDescriptor>> {
        let agent = self.inner.agents.get(agent_id)?;
        let mut tools = agent.descriptors.clone();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Some(tools)
    }

    /// Whether a run holds the thread's slot now.
    pub fn is_thread_active(&self, thread_id: &str) -> bool {
        self.inner.registry.is_active(thread_id)
    }

    /// Cancels the thread's active run (cause `Requested`), and whatever
    /// a layer runs on the thread (an auto-mode session stops: no further
    /// round starts); `true` if there was either. Does not wait; see
    /// [`cancel_and_wait_by_thread`](Self::cancel_and_wait_by_thread).
    pub fn cancel_by_thread(&self, thread_id: &str) -> bool {
        let layers = self.inner.observers.thread_cancelled(thread_id);
        match self.inner.registry.by_thread(thread_id) {
            Some(control) => {
                control.cancel(CancelCause::Requested);
                true
            }
            None => layers,
        }
    }

    /// Cancels the active run with this id (cause `Requested`); `true` if
    /// there was one.
    pub fn cancel_run(&self, run_id: &str) -> bool {
        match self.inner.registry.by_run(run_id) {
            Some(control) => {
                control.cancel(CancelCause::Requested);
                true
            }
            None => false,
        }
    }

    /// Ends one running tool call of run `run_id`: its future is dropped
    /// (the tool's token is cancelled first, for a tool that watches it),
    /// the model gets a result saying the user cancelled it, and the run
    /// goes on. The call is recorded in the run's stop report as
    /// `interrupted` (a read-only tool) or `may_have_completed`.
    ///
    /// The calls parked runs wait on (approvals and `ask_user` questions),
    /// of every active run — sub-agents' runs included, each with its
    /// `root_run_id` — or of the runs on `thread_id` only, in run order.
    pub fn pending_approvals(&self, thread_id: Option<&str>) -> Vec<PendingApproval> {
        let mut controls = self.inner.registry.all();
        controls.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let mut pending = Vec::new();
        for control in controls {
            if thread_id.is_some_and(|t| t != &*control.thread_id) {
                continue;
            }
            if let Some(parked) = control.parked.get() {
                pending.extend(parked.pending().into_iter().map(|mut p| {
                    p.root_run_id = control.root_run_id.as_deref().map(str::to_owned);
                    p
                }));
            }
        }
        pending
    }

    /// Decides the pending call `call_id` of run `run_id`. When it was the
    /// run's last undecided call, the same run goes on (see
    /// [`crate::approvals`]); its future and stream complete as usual.
    ///
    /// # Errors
    ///
    /// [`ApprovalError::UnknownApproval`] when no active run has that
    /// pending call; [`ApprovalError::AlreadyDecided`] when it was decided
    /// differently (the same decision again is `Ok` with `repeated`);
    /// [`ApprovalError::Invalid`] when edited arguments do not fit the
    /// tool's parameters, or a question is approved instead of answered.
    pub fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
    ) -> Result<Decided, ApprovalError> {
        self.decide_as(run_id, call_id, decision, None)
    }

    /// [`decide`](Self::decide), recording who decided (`by`: e.g. a
    /// user's or an API token's name) in the `approval_decided` event.
    ///
    /// # Errors
    ///
    /// As for [`decide`](Self::decide).
    pub fn decide_as(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ApprovalError> {
        let unknown = || ApprovalError::UnknownApproval {
            run_id: run_id.to_owned(),
            call_id: call_id.to_owned(),
        };
        let control = self.inner.registry.by_run(run_id).ok_or_else(unknown)?;
        let parked = control.parked.get().ok_or_else(unknown)?;
        parked.decide(run_id, call_id, decision, Decider::now(by))
    }

    /// Checks `decision` on `pending` — a call of a run of agent
    /// `agent_id`, parked anywhere — as [`decide`](Self::decide) would,
    /// without taking it (e.g. before storing it for another process).
    ///
    /// # Errors
    ///
    /// [`ApprovalError::Invalid`] as for [`decide`](Self::decide).
    pub fn check_decision(
        &self,
        agent_id: &str,
        pending: &PendingApproval,
        decision: &Decision,
    ) -> Result<(), ApprovalError> {
        let mut parked = crate::approvals::ParkedRun::new(
            pending.run_id.clone(),
            pending.thread_id.clone(),
            agent_id,
            vec![pending.clone()],
        );
        self.decide_parked(&mut parked, &pending.call_id, decision.clone(), None)
            .map(|_| ())
    }

    /// Decides the pending call `call_id` of `parked` — a run that let go
    /// of its task ([`RunRequest::release_when_parked`]) — with the same
    /// checks as [`decide`](Self::decide), recording it (and `by`, who
    /// decided) in `parked.decisions` and `parked.deciders`. Carry the run on ([`RunRequest::resume`]) once
    /// [`ParkedRun::is_decided`](crate::approvals::ParkedRun::is_decided).
    ///
    /// # Errors
    ///
    /// As for [`decide`](Self::decide); `UnknownApproval` when `parked`
    /// does not wait on `call_id`.
    pub fn decide_parked(
        &self,
        parked: &mut crate::approvals::ParkedRun,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ApprovalError> {
        let tools = self
            .inner
            .agents
            .get(&parked.agent_id)
            .map(|a| a.descriptors.clone())
            .unwrap_or_default();
        parked.decide(call_id, decision, Decider::now(by), |tool| {
            tools
                .iter()
                .find(|t| t.name == tool)
                .map(|t| t.parameters.clone())
                .unwrap_or_default()
        })
    }

    /// # Errors
    ///
    /// [`CancelToolCallError::UnknownRun`] when no run `run_id` is active;
    /// [`CancelToolCallError::NotRunning`] when the run has no running
    /// call `call_id` (it finished, never started, or belongs to another
    /// run), listing the calls that are running.
    pub fn cancel_tool_call(&self, run_id: &str, call_id: &str) -> Result<(), CancelToolCallError> {
        let control =
            self.inner
                .registry
                .by_run(run_id)
                .ok_or_else(|| CancelToolCallError::UnknownRun {
                    run_id: run_id.to_owned(),
                })?;
        control
            .cancel_call(call_id)
            .map_err(|running| CancelToolCallError::NotRunning {
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
                running,
            })
    }

    /// Cancels the thread's active run and waits until it has released the
    /// thread: its tool futures are finished or dropped, its history is
    /// repaired and `RunFinished` is emitted.
    ///
    /// Returns `true` iff a run was active and released the thread within the
    /// cancel-wait bound (default 5 s); `false` at once when no run is
    /// active, and `false` at the bound otherwise (the run stays cancelled
    /// and ends on its own). Called from inside the run itself (one of its
    /// tools or hooks) it cancels the run and returns `false` at once, since
    /// waiting for itself would never end.
    ///
    /// # Cancel safety
    ///
    /// The cancellation happens before the first await; dropping the future
    /// only stops the waiting.
    pub async fn cancel_and_wait_by_thread(&self, thread_id: &str) -> bool {
        // A layer's work on the thread (an auto-mode session) stops first,
        // so that no new run takes the thread while this one is awaited.
        self.inner.observers.thread_cancelled(thread_id);
        let Some(control) = self.inner.registry.by_thread(thread_id) else {
            return false;
        };
        control.cancel(CancelCause::Requested);
        control.wait_released(self.inner.config.cancel_wait).await
    }

    /// Deletes the thread: cancels its active run and waits for it (as
    /// [`cancel_and_wait_by_thread`](Self::cancel_and_wait_by_thread)),
    /// holds the thread so no run starts meanwhile, drops its stored history
    /// ([`ThreadStore::delete`]) and tells the observers, so layers drop
    /// what they keep for it (auto mode: the thread's session).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::PreviousRunStuck`] when the active run does not
    /// release the thread within the cancel-wait bound (nothing is
    /// deleted); [`RuntimeError::Store`] when the store fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting for the run, nothing is deleted (the run stays
    /// cancelled); dropped during the store's delete, the history may or may
    /// not be gone and the observers are not told.
    pub async fn delete_thread(&self, thread_id: &str) -> Result<(), RuntimeError> {
        self.inner.observers.thread_cancelled(thread_id);
        let holder = Arc::new(RunControl::new(
            Arc::from(self.next_id("delete")),
            thread_id.into(),
            CancellationToken::new(),
        ));
        // Take the thread's slot: runs that try to start meanwhile fail
        // with `ThreadAlreadyRunning`, and a mailbox waits for the slot.
        let _slot = loop {
            if let Some(active) = self.inner.registry.by_thread(thread_id) {
                active.cancel(CancelCause::Requested);
                if !active.wait_released(self.inner.config.cancel_wait).await {
                    return Err(RuntimeError::PreviousRunStuck {
                        thread_id: thread_id.to_owned(),
                        run_id: active.run_id.to_string(),
                    });
                }
            }
            if let Ok(slot) = self.inner.registry.acquire(holder.clone()) {
                break slot;
            }
        };
        self.inner
            .config
            .store
            .delete(thread_id)
            .await
            .map_err(|e| RuntimeError::Store {
                thread_id: thread_id.to_owned(),
                message: e.message,
            })?;
        // Offloaded tool results go with the history; a failure here
        // leaves unreachable artifacts, not a half-deleted thread.
        if let Err(error) = self.inner.config.artifacts.delete_thread(thread_id).await {
            tracing::warn!(%error, thread_id, "could not delete the thread's artifacts");
        }
        for agent in self.inner.agents.values() {
            if let Some(context) = &agent.context {
                context.forget(thread_id);
            }
        }
        self.inner.observers.thread_deleted(thread_id);
        Ok(())
    }

    /// Adds an observer of every later run's end and of thread
    /// cancellations and deletions (see [`RunObserver`]). Observers can
    /// also be set on the builder.
    pub fn add_run_observer(&self, observer: Arc<dyn RunObserver>) {
        self.inner.observers.add(observer);
    }

    /// The runtime's extension value of type `T`, if there is one (set on
    /// the builder with
    /// [`with_extension`](crate::AgentRuntimeBuilder::with_extension), or
    /// created by [`extension_or_insert_with`](Self::extension_or_insert_with)).
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.inner.extensions.get::<T>()
    }

    /// The runtime's extension value of type `T`, created by `init` the
    /// first time (exactly once, even when called concurrently). `init`
    /// must not call back into this runtime's extensions.
    pub fn extension_or_insert_with<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> T,
    ) -> Arc<T> {
        self.inner.extensions.get_or_insert_with(init)
    }

    /// A fresh id from the runtime's run-id counter, with `prefix` instead
    /// of `run` (e.g. `auto-7`): unique among the runtime's ids.
    pub fn next_id(&self, prefix: &str) -> String {
        self.inner.next_id(prefix)
    }

    #[cfg(test)]
    pub(crate) fn inner_for_tests(&self) -> &Inner {
        &self.inner
    }

    /// A mailbox for submitting input to threads, interrupting their active runs.
    pub fn mailbox(&self) -> Mailbox {
        Mailbox::new(self.inner.clone())
    }

    /// Stops accepting runs, cancels every active run (cause `Shutdown`) and
    /// waits for each to release its thread, at most the cancel-wait bound
    /// per run.
    ///
    /// # Cancel safety
    ///
    /// Runs are cancelled before the first await; dropping the future only
    /// stops the waiting.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let active = self.inner.registry.all();
        for control in &active {
            control.cancel(CancelCause::Shutdown);
        }
        self.inner.root.cancel();
        for control in active {
            if !control.wait_released(self.inner.config.cancel_wait).await {
                tracing::warn!(run_id = %control.run_id, "run did not stop within the cancel-wait bound");
            }
        }
    }
}
