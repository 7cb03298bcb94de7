//! Rein's run control as a service: what a network service (or any
//! embedder) needs on top of the engine's mailbox, with no transport.
//!
//! # The model
//!
//! A [`Service`] wraps an `AgentRuntime`. Clients **submit** input to a
//! thread ([`Service::submit`]) with a [`Strategy`] for a thread that is
//! busy (`interrupt` the active run, `enqueue` behind it, or `reject`),
//! optionally with an idempotency key that makes a repeated submission
//! find the first one's run. Every accepted run has a **run record** — its
//! status, its result once finished, and its event log numbered from 1 —
//! kept for a bounded time and count ([`Retention`]); clients read it
//! ([`Service::run`]), follow it ([`RunEntry::watch`], [`RunEntry::finished`]),
//! and cancel it, its thread, or one of its tool calls.
//!
//! The service runs in one of two **modes**, chosen once at construction:
//!
//! - **in-process** ([`Service::new`]): each thread has a **lane** in
//!   memory — a submission lock, its active run, a FIFO queue and its
//!   idempotency keys;
//! - **distributed** ([`Service::distributed`], feature `postgres`):
//!   processes share one PostgreSQL database, which is the only truth.
//!   A submission is a row committed before it is answered; the process
//!   holding a thread's **lease** **claims** its runs in order and runs
//!   them; every process reads records and events from the database.
//!
//! Both modes answer the same calls with the same errors
//! ([`ServiceError`]); transports (`rein-server`'s HTTP/SSE and AG-UI, the
//! `rein` CLI) are thin layers over this crate.
//!
//! ```
//! use rein::prelude::*;
//! use rein_service::{Service, ServiceSettings, Submission};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = AgentRuntimeBuilder::new()
//!     .with_agent_spec(AgentSpec::new("assistant").with_model_id("m"))
//!     .with_model(ModelSpec::new("m", "scripted", "demo"))
//!     .with_provider("scripted", std::sync::Arc::new(ScriptedExecutor::new(vec![
//!         ScriptedResponse::text("Hello."),
//!     ])))
//!     .build()?;
//! let service = Service::new(runtime, ServiceSettings::default());
//! let submitted = service
//!     .submit("t1", Submission::new(vec![Message::user("Hi")]))
//!     .await?;
//! let record = service.live(&submitted).await?.finished().await;
//! assert_eq!(record.response.as_deref(), Some("Hello."));
//! service.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod auto;
mod core;
#[cfg(feature = "postgres")]
mod distributed;
mod error;
mod in_process;
mod listing;
mod metrics;
mod mode;
mod records;
mod settings;
mod subagents;
mod submission;

use std::sync::Arc;

use rein_runtime::AgentRuntime;
use rein_runtime::approvals::Decided;
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::approval::{Decision, PendingApproval};
use rein_runtime_contract::event::EventSink;
use rein_runtime_contract::message::Message;

pub use auto::{AgentAuto, AutoRecord, RunMode, ThreadAuto};
#[cfg(feature = "postgres")]
pub use distributed::LOST_RUN;
pub use error::ServiceError;
pub use listing::{
    Cursor, MAX_PAGE, Page, Parent, RunFilter, RunSummary, ThreadFilter, ThreadSummary,
};
pub use records::{
    DecisionRecord, LoggedEvent, RunEntry, RunRecord, RunStatus, ThreadEvent, ThreadTail,
};
pub use settings::{MAX_ID_BYTES, Retention, ServiceSettings};
pub use submission::{ClientMessage, Strategy, Submission, Submitted};

use crate::core::Core;
use crate::mode::Mode;

/// The service. Cheap to clone; clones share everything.
#[derive(Clone, Debug)]
pub struct Service {
    core: Arc<Core>,
    mode: Arc<dyn Mode>,
}

/// A listener of a thread's live tail (see [`Service::subscribe_tail`]).
#[derive(Debug)]
pub struct TailSubscription {
    /// The events from the subscription on.
    pub receiver: tokio::sync::broadcast::Receiver<ThreadEvent>,
    tail: Option<Arc<ThreadTail>>,
    thread_id: String,
    core: Arc<Core>,
}

impl Drop for TailSubscription {
    fn drop(&mut self) {
        // Held until here so that runs starting meanwhile share this tail.
        self.tail.take();
        self.core.records.release_tail(&self.thread_id);
    }
}

impl Service {
    /// An in-process service over `runtime`. Starts the retention
    /// sweeper, so it must be called within a tokio runtime.
    pub fn new(runtime: AgentRuntime, settings: ServiceSettings) -> Self {
        let core = Core::new(runtime, settings);
        let mode = in_process::InProcess::start(core.clone());
        Self { core, mode }
    }

    /// A distributed service: submissions, run records, events and AG-UI
    /// message ids live in the shared database, and this process runs a
    /// thread's work only while it holds the thread's lease. `runtime`
    /// must store its threads in `database`'s fenced store. Must be called
    /// within a tokio runtime.
    #[cfg(feature = "postgres")]
    pub fn distributed(
        runtime: AgentRuntime,
        settings: ServiceSettings,
        database: rein_postgres::Database,
    ) -> Self {
        let core = Core::new(runtime, settings);
        let mode = distributed::Distributed::start(core.clone(), database);
        Self { core, mode }
    }

    /// Writes every run's events to `recorder` too (e.g. a
    /// `rein::events::JsonlSink`, as `rein serve --record DIR` does). Set
    /// once, before serving; a second call is ignored.
    pub fn record_events(&self, recorder: Arc<dyn EventSink>) {
        self.core.records.set_recorder(recorder);
    }

    /// The runtime.
    pub fn runtime(&self) -> &AgentRuntime {
        &self.core.runtime
    }

    /// The settings.
    pub fn settings(&self) -> &ServiceSettings {
        &self.core.settings
    }

    /// Whether the mode's store answers (always in-process).
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`].
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn health(&self) -> Result<(), ServiceError> {
        self.mode.health().await
    }

    /// Cancelled when the service shuts down (live tails end on it).
    pub fn closing(&self) -> &CancellationToken {
        &self.core.closing
    }

    /// How many run records this process keeps (finished ones within
    /// retention).
    pub fn kept_runs(&self) -> usize {
        self.core.records.len()
    }

    /// Submits input to a thread.
    ///
    /// # Errors
    ///
    /// A [`ServiceError`], with nothing appended and nothing interrupted:
    /// an invalid field, an unknown agent, a busy thread with `reject`,
    /// invalid input or an empty conversation, a taken run id, shutting
    /// down, an unreachable database.
    ///
    /// # Cancel safety
    ///
    /// Dropped before it returns, the submission may or may not have been
    /// accepted (resubmit with the same idempotency key to find out).
    pub async fn submit(
        &self,
        thread_id: &str,
        submission: Submission,
    ) -> Result<Submitted, ServiceError> {
        if self.core.shutting_down() {
            return Err(ServiceError::ShuttingDown);
        }
        submission.validate(thread_id)?;
        let rounds = self.auto_rounds(thread_id, &submission).await?;
        let defaults = (submission.run_mode, submission.automation_policy.clone());
        let submitted = self.mode.submit(thread_id, submission, rounds).await?;
        if let (Submitted::New(_), (mode, policy)) = (&submitted, defaults)
            && (mode.is_some() || policy.is_some())
        {
            // What a submission names becomes the thread's default. The
            // submission is accepted already: a failure here is logged,
            // never its answer (a retry would submit it twice).
            if let Err(error) = self.mode.set_auto_defaults(thread_id, mode, policy).await {
                tracing::warn!(%error, thread_id, "could not store the thread's auto-mode defaults");
            }
        }
        Ok(submitted)
    }

    /// The auto-mode session a submission starts, by the precedence in
    /// [`crate::auto`]; `None` for a single run, or when the mode resolves
    /// it as the run starts.
    async fn auto_rounds(
        &self,
        thread_id: &str,
        submission: &Submission,
    ) -> Result<Option<rein_runtime::auto::AutoRounds>, ServiceError> {
        if submission.run_mode == Some(RunMode::Single) || self.mode.resolves_at_start() {
            return Ok(None);
        }
        // In-process (the only mode resolving here) the defaults are in
        // memory: no mode call on every submission.
        let thread = self.core.autos.defaults(thread_id);
        let request = auto::AutoRequest {
            run_mode: submission.run_mode,
            automation_policy: submission.automation_policy.clone(),
        };
        // The session's id is made from its first round's run id.
        Ok(self.core.resolve_rounds(
            submission.agent_id.as_deref(),
            &request,
            &thread,
            String::new(),
        ))
    }

    /// Sets an agent's auto-mode defaults (the deployment file's
    /// `run_mode` and `automation_policy`): submissions to it that name no
    /// mode, on threads with no stored default, use them. Call before
    /// serving.
    pub fn set_agent_auto(&self, agent_id: &str, defaults: AgentAuto) {
        self.core
            .agent_autos
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(agent_id.to_owned(), defaults);
    }

    /// The thread's auto-mode defaults and session totals
    /// (`tokens_used_session`, reports).
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`] in distributed mode.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn thread_auto(&self, thread_id: &str) -> Result<ThreadAuto, ServiceError> {
        self.mode.thread_auto(thread_id).await
    }

    /// The source's `/new`: cancels the thread's runs, drops its history,
    /// keys and message ids (as [`delete_thread`](Self::delete_thread)),
    /// and clears its auto-mode session totals — tokens and reports — while
    /// its stored defaults stay.
    ///
    /// # Errors
    ///
    /// As for [`delete_thread`](Self::delete_thread).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped midway, the history may be gone and the
    /// totals kept.
    pub async fn reset_session(&self, thread_id: &str) -> Result<(), ServiceError> {
        let defaults = self.mode.thread_auto(thread_id).await?;
        self.mode.delete_thread(thread_id).await?;
        if defaults.run_mode.is_some() || defaults.policy.is_some() {
            self.mode
                .set_auto_defaults(thread_id, defaults.run_mode, defaults.policy)
                .await?;
        }
        self.mode.reset_session(thread_id).await
    }

    /// A run's entry, kept up to date until the run finishes: in
    /// distributed mode read from the database (then followed) when
    /// another process runs it.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownRun`]; [`ServiceError::StoreUnavailable`].
    ///
    /// # Cancel safety
    ///
    /// Read-only; a dropped call may leave a follower started.
    pub async fn run(&self, run_id: &str) -> Result<Arc<RunEntry>, ServiceError> {
        self.mode.run(run_id).await
    }

    /// A submission's entry, kept up to date until the run finishes (a
    /// distributed submission's answer may be a snapshot).
    ///
    /// # Errors
    ///
    /// The run's record could not be read (distributed mode).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    pub async fn live(&self, submitted: &Submitted) -> Result<Arc<RunEntry>, ServiceError> {
        let entry = submitted.entry();
        match self.mode.run(&entry.run_id).await {
            // Finished and already past retention: the submission's entry
            // has its result.
            Err(ServiceError::UnknownRun { .. }) if entry.status() == RunStatus::Finished => {
                Ok(entry.clone())
            }
            other => other,
        }
    }

    /// Records client message ids the thread has now been sent (AG-UI:
    /// the messages a run emitted), so a client sending the conversation
    /// back appends none of them; kept with the thread in the mode's store.
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`].
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, the ids may or may not be recorded.
    pub async fn remember_message_ids(
        &self,
        thread_id: &str,
        ids: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.mode.remember_message_ids(thread_id, ids).await
    }

    /// Listens to a thread's live tail (runs this process runs or
    /// follows) until the subscription is dropped.
    pub fn subscribe_tail(&self, thread_id: &str) -> TailSubscription {
        let tail = self.core.records.tail(thread_id);
        let receiver = tail.subscribe();
        TailSubscription {
            receiver,
            tail: Some(tail),
            thread_id: thread_id.to_owned(),
            core: self.core.clone(),
        }
    }

    /// Cancels one run, queued or running, wherever it runs; `false` if
    /// it had finished.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownRun`]; [`ServiceError::StoreUnavailable`].
    ///
    /// # Cancel safety
    ///
    /// The cancel is sent (or the queued run finished) before the call
    /// returns; dropped earlier, it may or may not have been.
    pub async fn cancel_run(&self, run_id: &str) -> Result<bool, ServiceError> {
        self.mode.cancel_run(run_id).await
    }

    /// Decides the pending call `call_id` of the parked run `run_id`
    /// (`docs/approvals.md`): when it was the run's last undecided call,
    /// the same run goes on. The same decision again is `Ok` with
    /// `repeated`, also after the run went on or finished.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Approval`]: `unknown_approval`, `already_decided`,
    /// `invalid_decision` (edited arguments outside the tool's schema, or a
    /// question approved instead of answered).
    ///
    /// # Cancel safety
    ///
    /// A run parked in this process gets the decision before the first
    /// await.
    pub async fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
    ) -> Result<Decided, ServiceError> {
        self.mode.decide(run_id, call_id, decision, None).await
    }

    /// [`decide`](Self::decide), recording who decided (`by`: an API
    /// token's name, `rein run`) with the decision: the `approval_decided`
    /// event and the run record's `decisions` carry it.
    ///
    /// # Errors
    ///
    /// As for [`decide`](Self::decide).
    ///
    /// # Cancel safety
    ///
    /// As for [`decide`](Self::decide).
    pub async fn decide_as(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ServiceError> {
        self.mode.decide(run_id, call_id, decision, by).await
    }

    /// This process's metrics in the Prometheus text format (version
    /// 0.0.4): runs finished by termination code, active, queued and
    /// parked runs, tokens, inference and tool latency histograms,
    /// detector firings by code, lease take-overs.
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`] when the pending approvals cannot be
    /// read (distributed mode: the database).
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn metrics(&self) -> Result<String, ServiceError> {
        let (queued, active) = self.core.records.counts();
        let parked = self.mode.pending_approvals(None).await?.len() as u64;
        Ok(self.core.records.metrics.text(metrics::Gauges {
            active,
            queued,
            parked,
            takeovers: self.mode.takeovers(),
        }))
    }

    /// A page of runs matching `filter`, newest submitted first
    /// ([`crate::listing`]'s order and cursor). In-process: the runs this
    /// process keeps; distributed: every stored run.
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`] in distributed mode.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<Page<RunSummary>, ServiceError> {
        self.mode.list_runs(filter).await
    }

    /// A page of threads matching `filter`, newest first, each with its
    /// latest run. In-process: the threads of the runs this process keeps;
    /// distributed: every stored thread.
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`] in distributed mode.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn list_threads(
        &self,
        filter: &ThreadFilter,
    ) -> Result<Page<ThreadSummary>, ServiceError> {
        self.mode.list_threads(filter).await
    }

    /// The calls parked runs wait on, of every thread or of `thread_id`'s
    /// runs (sub-agents' runs are on their own threads, with their
    /// `root_run_id`).
    ///
    /// # Errors
    ///
    /// [`ServiceError::StoreUnavailable`] in distributed mode.
    ///
    /// # Cancel safety
    ///
    /// Reads only.
    pub async fn pending_approvals(
        &self,
        thread_id: Option<&str>,
    ) -> Result<Vec<PendingApproval>, ServiceError> {
        self.mode.pending_approvals(thread_id).await
    }

    /// Ends one running tool call of run `run_id`; the run goes on.
    /// Returns `true` when the call was ended here, `false` when the run
    /// runs in another process and was asked to.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownRun`]; [`ServiceError::ToolCall`] when the
    /// run has no running call `call_id` (naming the running ones);
    /// [`ServiceError::RunNotRunning`].
    ///
    /// # Cancel safety
    ///
    /// A call running here is ended before the first await.
    pub async fn cancel_tool_call(
        &self,
        run_id: &str,
        call_id: &str,
    ) -> Result<bool, ServiceError> {
        match self.core.runtime.cancel_tool_call(run_id, call_id) {
            Ok(()) => Ok(true),
            Err(e @ rein_runtime::CancelToolCallError::NotRunning { .. }) => {
                Err(ServiceError::ToolCall(e))
            }
            Err(_) => self.mode.cancel_tool_call_elsewhere(run_id, call_id).await,
        }
    }

    /// Cancels the thread's active run wherever it runs and waits, bounded
    /// by the cancel-wait setting, until it has finished:
    /// `(cancelled, released)`.
    ///
    /// # Cancel safety
    ///
    /// In-process, the cancel happens before the first await.
    pub async fn cancel_thread(&self, thread_id: &str) -> (bool, bool) {
        self.mode.cancel_thread(thread_id).await
    }

    /// Cancels the thread's queued and active runs and drops its history,
    /// its idempotency keys and its AG-UI message ids.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Runtime`] with `PreviousRunStuck` or a store
    /// failure; [`ServiceError::ThreadOwnedElsewhere`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped midway, the queued runs may be ended and
    /// the history kept.
    pub async fn delete_thread(&self, thread_id: &str) -> Result<(), ServiceError> {
        self.mode.delete_thread(thread_id).await
    }

    /// The thread's stored history.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn messages(&self, thread_id: &str) -> Vec<Message> {
        self.core.runtime.thread_messages(thread_id).await
    }

    /// Stops accepting submissions, ends queued runs here (`cancelled`,
    /// cause `shutdown`; in distributed mode they stay queued for the
    /// other processes), cancels active runs (cause `shutdown`) and waits
    /// for them within the cancel-wait bound, ends the live tails and
    /// awaits every background loop.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped midway, some runs may still be running.
    pub async fn shutdown(&self) {
        self.core.begin_shutdown();
        self.mode.shutdown().await;
        self.core.stop_background().await;
    }
}
