//! The service behind the HTTP API: submissions with their strategies and
//! idempotency keys, per-thread queues, run records, cancels, retention
//! and shutdown. Transport-free: the HTTP routes and AG-UI call it.
//!
//! Each thread has a **lane**: a submission lock, its active run, its
//! FIFO queue (`enqueue`) and its idempotency keys.
//!
//! **Invariant:** submissions to one thread are serialized by the lane's
//! submission lock, from the idempotency check to registering the key, so
//! concurrent duplicates of a key get the first submission's run and
//! append nothing.
//!
//! **Invariant:** a queued run starts only when the lane's active run has
//! finished (its driver clears `active` under the submission lock, then
//! starts the queue's head); an `interrupt` submission holds the lock while
//! it interrupts and starts, so a finishing run never starts the queue
//! ahead of it.
//!
//! **Invariant:** every accepted run ends with a result and a
//! `run_finished` event in its record — also a queued run that is
//! cancelled, or refused when its turn comes (e.g. at shutdown).

mod cluster;
mod error;
mod ownership;
mod records;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rein::contract::message::Message;
use rein::events::CancelCause;
use rein::{
    AgentRunResult, AgentRuntime, CancellationToken, RunHandle, RunRequest, TerminationReason,
};
use serde::Deserialize;

pub use cluster::LOST_RUN;
pub use error::ApiError;
pub use ownership::{LeaseOwnership, Ownership};
pub use records::{LoggedEvent, RunEntry, RunRecord, RunStatus, ThreadEvent, ThreadTail};

use crate::deployment::ServerSettings;
use cluster::Cluster;
use records::Records;

/// What to do with a submission to a thread that has a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Cancel the active run (cause `interrupted`), then run (the default).
    #[default]
    Interrupt,
    /// Run after the active run and any queued ones, in order.
    Enqueue,
    /// Refuse with 409 `thread_busy`.
    Reject,
}

impl Strategy {
    /// Parses a strategy name.
    ///
    /// # Errors
    ///
    /// 422 `unknown_strategy` naming it and the accepted ones.
    pub fn parse(name: &str) -> Result<Self, ApiError> {
        match name {
            "interrupt" => Ok(Self::Interrupt),
            "enqueue" => Ok(Self::Enqueue),
            "reject" => Ok(Self::Reject),
            other => Err(ApiError::new(
                422,
                "unknown_strategy",
                format!("unknown strategy \"{other}\"; use interrupt, enqueue or reject"),
            )),
        }
    }
}

/// One submission to a thread.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    /// The agent (optional when the service has one).
    pub agent_id: Option<String>,
    /// The new messages.
    pub messages: Vec<Message>,
    /// What to do when the thread is busy.
    pub strategy: Strategy,
    /// A key that makes a repeated submission return the first one's run.
    pub idempotency_key: Option<String>,
    /// The run's id, when the client chooses it (AG-UI); else one is made.
    pub run_id: Option<String>,
}

/// A submission's outcome.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A new run (queued or running).
    New(Arc<RunEntry>),
    /// The idempotency key was seen: the first submission's run.
    Duplicate(Arc<RunEntry>),
}

impl Submitted {
    /// The run's entry. In distributed mode a new run's entry may be a
    /// snapshot taken at submission (the run is queued for another
    /// process): use [`Service::live`] for one that follows the run.
    pub fn entry(&self) -> &Arc<RunEntry> {
        match self {
            Self::New(e) | Self::Duplicate(e) => e,
        }
    }
}

/// A listener of a thread's live tail (see [`Service::subscribe_tail`]).
#[derive(Debug)]
pub struct TailSubscription {
    /// The events from the subscription on.
    pub receiver: tokio::sync::broadcast::Receiver<ThreadEvent>,
    tail: Option<Arc<ThreadTail>>,
    thread_id: String,
    service: Service,
}

impl Drop for TailSubscription {
    fn drop(&mut self) {
        // Held until here so that runs starting meanwhile share this tail.
        self.tail.take();
        self.service.inner.records.release_tail(&self.thread_id);
    }
}

/// The service. Cheap to clone; clones share everything.
#[derive(Clone, Debug)]
pub struct Service {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    runtime: AgentRuntime,
    records: Records,
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
    settings: ServerSettings,
    closing: CancellationToken,
    shutting_down: AtomicBool,
    /// Per thread, the ids of the messages a client sent or was sent
    /// (AG-UI), so a resent conversation appends only what is new.
    message_ids: Mutex<HashMap<String, HashSet<String>>>,
    /// Which threads this process may run, when the store is shared.
    ownership: Option<Arc<dyn Ownership>>,
    /// The runs in the shared database (distributed mode).
    cluster: Option<Arc<Cluster>>,
}

#[derive(Debug, Default)]
struct Lane {
    submit: tokio::sync::Mutex<()>,
    state: Mutex<LaneState>,
}

#[derive(Debug, Default)]
struct LaneState {
    active: Option<String>,
    queue: VecDeque<Queued>,
    keys: HashMap<String, String>,
}

#[derive(Debug)]
struct Queued {
    entry: Arc<RunEntry>,
    request: RunRequest,
}

impl Lane {
    fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Service {
    /// Writes every run's events to `recorder` too (e.g. a
    /// `rein::events::JsonlSink`, as `rein serve --record DIR` does). Set
    /// once, before serving; a second call is ignored.
    pub fn record_events(&self, recorder: Arc<dyn rein::events::EventSink>) {
        let _ = self.inner.records.recorder.set(records::Recorder(recorder));
    }

    /// A service over `runtime`. Starts the retention sweeper, so it must
    /// be called within a tokio runtime.
    pub fn new(runtime: AgentRuntime, settings: ServerSettings) -> Self {
        Self::with_ownership(runtime, settings, None)
    }

    /// A service over a runtime whose store other processes share: it runs
    /// a thread only while `ownership` gives it the thread (see
    /// [`Ownership`]), and renews what it holds.
    pub fn with_ownership(
        runtime: AgentRuntime,
        settings: ServerSettings,
        ownership: Option<Arc<dyn Ownership>>,
    ) -> Self {
        Self::build(runtime, settings, ownership, None)
    }

    /// A service in distributed mode: its submissions, run records and
    /// events live in the shared database (`runs`), and it runs a thread's
    /// work only while `ownership` gives it the thread.
    pub fn distributed(
        runtime: AgentRuntime,
        settings: ServerSettings,
        ownership: Arc<dyn Ownership>,
        runs: rein_postgres::PgRuns,
    ) -> Self {
        Self::build(
            runtime,
            settings,
            Some(ownership),
            Some(Arc::new(Cluster::new(runs))),
        )
    }

    fn build(
        runtime: AgentRuntime,
        settings: ServerSettings,
        ownership: Option<Arc<dyn Ownership>>,
        cluster: Option<Arc<Cluster>>,
    ) -> Self {
        let service = Self {
            inner: Arc::new(Inner {
                runtime,
                records: Records::new(settings.retention),
                lanes: Mutex::default(),
                settings,
                closing: CancellationToken::new(),
                shutting_down: AtomicBool::new(false),
                message_ids: Mutex::default(),
                ownership,
                cluster,
            }),
        };
        service.start_sweeper();
        service.start_heartbeat();
        if service.inner.cluster.is_some() {
            service.start_cluster();
        } else {
            service.start_cancel_listener();
        }
        service
    }

    /// The runtime.
    pub fn runtime(&self) -> &AgentRuntime {
        &self.inner.runtime
    }

    /// Whether the shared store answers (always, without one).
    ///
    /// # Errors
    ///
    /// 503 `store_unavailable`.
    pub async fn health(&self) -> Result<(), ApiError> {
        match &self.inner.ownership {
            None => Ok(()),
            Some(o) => o.check().await.map_err(|e| {
                ApiError::new(
                    503,
                    "store_unavailable",
                    format!("the database does not answer: {e}"),
                )
            }),
        }
    }

    /// This process's ownership of threads, when the store is shared.
    pub fn ownership(&self) -> Option<&Arc<dyn Ownership>> {
        self.inner.ownership.as_ref()
    }

    /// The settings.
    pub fn settings(&self) -> &ServerSettings {
        &self.inner.settings
    }

    /// Cancelled when the service shuts down (live tails end on it).
    pub fn closing(&self) -> &CancellationToken {
        &self.inner.closing
    }

    /// How many run records are kept (finished ones within retention).
    pub fn kept_runs(&self) -> usize {
        self.inner.records.len()
    }

    fn lane(&self, thread_id: &str) -> Arc<Lane> {
        let mut lanes = self.inner.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.entry(thread_id.to_owned()).or_default().clone()
    }

    /// Drops a lane that holds nothing and that nobody else holds.
    fn tidy(&self, thread_id: &str) {
        let mut lanes = self.inner.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = lanes.get(thread_id)
            && Arc::strong_count(lane) == 1
        {
            let state = lane.state();
            let idle = state.active.is_none() && state.queue.is_empty() && state.keys.is_empty();
            drop(state);
            if idle {
                lanes.remove(thread_id);
            }
        }
    }

    /// Submits input to a thread.
    ///
    /// # Errors
    ///
    /// An [`ApiError`], with nothing appended and nothing interrupted:
    /// unknown agent (404), busy thread with `reject` (409 `thread_busy`),
    /// invalid input or an empty conversation (422), a taken run id (409),
    /// shutting down (503).
    ///
    /// # Cancel safety
    ///
    /// Dropped before it returns, the submission may or may not have been
    /// accepted (resubmit with the same idempotency key to find out).
    pub async fn submit(
        &self,
        thread_id: &str,
        submission: Submission,
    ) -> Result<Submitted, ApiError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::shutting_down());
        }
        if let Some(cluster) = &self.inner.cluster {
            return self.submit_shared(cluster, thread_id, submission).await;
        }
        let lane = self.lane(thread_id);
        let outcome = self.submit_in(&lane, thread_id, submission).await;
        drop(lane);
        if outcome.is_err() {
            self.tidy(thread_id);
        }
        outcome
    }

    async fn submit_in(
        &self,
        lane: &Arc<Lane>,
        thread_id: &str,
        s: Submission,
    ) -> Result<Submitted, ApiError> {
        let _serial = lane.submit.lock().await;
        if let Some(key) = &s.idempotency_key {
            let known = lane.state().keys.get(key).cloned();
            if let Some(entry) = known.and_then(|run_id| self.inner.records.get(&run_id)) {
                return Ok(Submitted::Duplicate(entry));
            }
        }
        let runtime = &self.inner.runtime;
        let (request, agent_id) = self.checked_request(thread_id, &s).await?;
        let busy = {
            let state = lane.state();
            state.active.is_some() || !state.queue.is_empty()
        };
        let status = match (busy, s.strategy) {
            (true, Strategy::Reject) => {
                return Err(ApiError::new(
                    409,
                    "thread_busy",
                    format!(
                        "thread \"{thread_id}\" has a run; submit with strategy interrupt or enqueue, or cancel it first"
                    ),
                ));
            }
            (true, Strategy::Enqueue) => RunStatus::Queued,
            _ => RunStatus::Running,
        };
        if !busy && let Some(ownership) = &self.inner.ownership {
            match ownership.acquire(thread_id).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ApiError::new(
                        409,
                        "thread_owned_elsewhere",
                        format!(
                            "thread \"{thread_id}\" is being run by another process; retry when its run has finished"
                        ),
                    ));
                }
                Err(e) => {
                    return Err(ApiError::new(
                        503,
                        "store_unavailable",
                        format!("the shared store could not be reached: {e}"),
                    ));
                }
            }
        }
        let run_id = s.run_id.unwrap_or_else(|| runtime.next_id("run"));
        let entry = self
            .inner
            .records
            .create(
                &run_id,
                thread_id,
                &agent_id,
                s.idempotency_key.clone(),
                status,
            )
            .ok_or_else(|| {
                ApiError::new(
                    409,
                    "run_id_in_use",
                    format!("run id \"{run_id}\" is already taken; choose another"),
                )
            })?;
        let request = request
            .with_run_id(&run_id)
            .with_cancellation(entry.cancellation().clone())
            .with_event_sink(self.inner.records.sink(&entry));
        if status == RunStatus::Queued {
            lane.state().queue.push_back(Queued {
                entry: entry.clone(),
                request,
            });
        } else {
            match runtime.mailbox().submit(request).await {
                Ok(handle) => {
                    lane.state().active = Some(run_id.clone());
                    self.drive(lane.clone(), entry.clone(), handle);
                }
                Err(e) => {
                    self.inner.records.discard(&run_id);
                    return Err(ApiError::from(e));
                }
            }
        }
        if let Some(key) = s.idempotency_key {
            lane.state().keys.insert(key, run_id);
        }
        Ok(Submitted::New(entry))
    }

    /// The submission as a run request, checked by the runtime (agent,
    /// messages, thread), with the id of the agent that will run it.
    async fn checked_request(
        &self,
        thread_id: &str,
        s: &Submission,
    ) -> Result<(RunRequest, String), ApiError> {
        let runtime = &self.inner.runtime;
        let mut request = RunRequest::new(thread_id, s.messages.clone());
        if let Some(agent) = &s.agent_id {
            request = request.with_agent_id(agent);
        }
        runtime
            .check_request(&request)
            .await
            .map_err(ApiError::from)?;
        let agent_id = runtime
            .agent_spec(s.agent_id.as_deref())
            .map(|spec| spec.id.clone())
            .unwrap_or_default();
        Ok((request, agent_id))
    }

    /// Awaits a started run, records its result, and starts the lane's
    /// next queued run.
    fn drive(&self, lane: Arc<Lane>, entry: Arc<RunEntry>, handle: RunHandle) {
        let service = self.clone();
        tokio::spawn(async move {
            let result = handle.wait().await.unwrap_or_else(|e| {
                AgentRunResult::new(
                    &entry.run_id,
                    &entry.thread_id,
                    TerminationReason::Error(e.to_string()),
                )
            });
            let dropped = service.inner.records.finish(&entry, result);
            service.forget_keys(dropped);
            let _serial = lane.submit.lock().await;
            let mine = {
                let mut state = lane.state();
                let mine = state.active.as_deref() == Some(entry.run_id.as_str());
                if mine {
                    state.active = None;
                }
                mine
            };
            if mine {
                service.start_next(&lane).await;
            }
            service.release_if_idle(&lane, &entry.thread_id).await;
            drop(_serial);
            drop(lane);
            service.tidy(&entry.thread_id);
        });
    }

    /// Starts the lane's next queued run; the caller holds the lane's
    /// submission lock and the lane has no active run.
    async fn start_next(&self, lane: &Arc<Lane>) {
        loop {
            let next = {
                let mut state = lane.state();
                let next = state.queue.pop_front();
                if let Some(q) = &next {
                    q.entry.set_running();
                }
                next
            };
            let Some(Queued { entry, request }) = next else {
                return;
            };
            if self.inner.shutting_down.load(Ordering::SeqCst) {
                self.finish_unstarted(
                    &entry,
                    TerminationReason::Cancelled,
                    Some(CancelCause::Shutdown),
                );
                continue;
            }
            match self.inner.runtime.mailbox().submit(request).await {
                Ok(handle) => {
                    lane.state().active = Some(entry.run_id.clone());
                    self.drive(lane.clone(), entry, handle);
                    return;
                }
                Err(e) => {
                    let reason =
                        TerminationReason::Error(format!("the queued run could not start: {e}"));
                    self.finish_unstarted(&entry, reason, None);
                }
            }
        }
    }

    fn finish_unstarted(
        &self,
        entry: &RunEntry,
        termination: TerminationReason,
        cause: Option<CancelCause>,
    ) {
        let dropped = self
            .inner
            .records
            .finish_unstarted(entry, termination, cause);
        self.forget_keys(dropped);
    }

    /// Removes the idempotency keys of dropped records.
    fn forget_keys(&self, dropped: Vec<(String, String)>) {
        for (thread_id, key) in dropped {
            let lane = self
                .inner
                .lanes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&thread_id)
                .cloned();
            if let Some(lane) = lane {
                lane.state().keys.remove(&key);
                drop(lane);
                self.tidy(&thread_id);
            }
        }
    }

    fn message_ids(&self) -> MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.inner
            .message_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The client message ids the thread has seen.
    pub fn seen_message_ids(&self, thread_id: &str) -> HashSet<String> {
        self.message_ids()
            .get(thread_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Records client message ids as seen on the thread.
    pub fn remember_message_ids(&self, thread_id: &str, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        self.message_ids()
            .entry(thread_id.to_owned())
            .or_default()
            .extend(ids);
    }

    /// A run's entry, while it is kept (in distributed mode, from the
    /// database when another process runs it).
    ///
    /// # Errors
    ///
    /// 404 `unknown_run`; 503 when the database does not answer.
    pub async fn run(&self, run_id: &str) -> Result<Arc<RunEntry>, ApiError> {
        if let Some(cluster) = &self.inner.cluster {
            return self.run_shared(cluster, run_id).await;
        }
        self.inner
            .records
            .get(run_id)
            .ok_or_else(|| ApiError::unknown_run(run_id))
    }

    /// A submission's entry, kept up to date until the run finishes: the
    /// entry itself in memory; in distributed mode the run's followed
    /// entry (the submission's may be a snapshot).
    ///
    /// # Errors
    ///
    /// The run's record could not be read (distributed mode).
    pub async fn live(&self, submitted: &Submitted) -> Result<Arc<RunEntry>, ApiError> {
        match &self.inner.cluster {
            Some(cluster) => self.run_shared(cluster, &submitted.entry().run_id).await,
            None => Ok(submitted.entry().clone()),
        }
    }

    /// Listens to a thread's live tail until the subscription is dropped.
    pub fn subscribe_tail(&self, thread_id: &str) -> TailSubscription {
        let tail = self.inner.records.tail(thread_id);
        let receiver = tail.subscribe();
        TailSubscription {
            receiver,
            tail: Some(tail),
            thread_id: thread_id.to_owned(),
            service: self.clone(),
        }
    }

    /// Cancels one run, queued or running; `false` if it had finished.
    ///
    /// # Errors
    ///
    /// 404 `unknown_run`.
    pub async fn cancel_run(&self, run_id: &str) -> Result<bool, ApiError> {
        if let Some(cluster) = &self.inner.cluster {
            return self.cancel_shared(cluster, run_id).await;
        }
        let entry = self.run(run_id).await?;
        if entry.status() == RunStatus::Finished {
            return Ok(false);
        }
        // A queued run leaves its queue and ends now.
        let lane = self.lane(&entry.thread_id);
        let queued = {
            let mut state = lane.state();
            let at = state.queue.iter().position(|q| q.entry.run_id == run_id);
            at.and_then(|i| state.queue.remove(i))
        };
        drop(lane);
        match queued {
            Some(q) => self.finish_unstarted(
                &q.entry,
                TerminationReason::Cancelled,
                Some(CancelCause::Requested),
            ),
            // Running, or about to start: its token ends it either way.
            None => entry.cancellation().cancel(),
        }
        self.tidy(&entry.thread_id);
        Ok(true)
    }

    /// Ends one running tool call of run `run_id`; the run goes on.
    /// Returns `true` when the call was ended here, `false` when the run
    /// runs in another process and was asked to (distributed mode).
    ///
    /// # Errors
    ///
    /// 404 `unknown_run`; 409 `tool_call_not_running` when the run is not
    /// running or has no running call `call_id` (naming the running ones).
    pub async fn cancel_tool_call(&self, run_id: &str, call_id: &str) -> Result<bool, ApiError> {
        let not_running = |message: String| ApiError::new(409, "tool_call_not_running", message);
        match self.inner.runtime.cancel_tool_call(run_id, call_id) {
            Ok(()) => return Ok(true),
            Err(e @ rein::CancelToolCallError::NotRunning { .. }) => {
                return Err(not_running(e.to_string()));
            }
            Err(_) => {}
        }
        if let Some(cluster) = &self.inner.cluster {
            return cluster.cancel_tool_call(run_id, call_id).await;
        }
        let entry = self.run(run_id).await?;
        Err(not_running(format!(
            "run \"{run_id}\" is {}, not running; a tool call can be cancelled only while its run runs",
            entry.status().as_str()
        )))
    }

    /// Cancels the thread's active run and waits, bounded, for it to
    /// release the thread: `(cancelled, released)`.
    ///
    /// # Cancel safety
    ///
    /// The cancel happens before the first await.
    pub async fn cancel_thread(&self, thread_id: &str) -> (bool, bool) {
        let runtime = &self.inner.runtime;
        if !runtime.is_thread_active(thread_id) {
            if let Some(cluster) = &self.inner.cluster {
                return self.cancel_thread_shared(cluster, thread_id).await;
            }
            return match &self.inner.ownership {
                Some(ownership) => self.cancel_elsewhere(ownership.as_ref(), thread_id).await,
                None => (false, true),
            };
        }
        let released = runtime.cancel_and_wait_by_thread(thread_id).await;
        (true, released || !runtime.is_thread_active(thread_id))
    }

    /// Cancels the thread's queued and active runs and drops its history.
    ///
    /// # Errors
    ///
    /// 409 `previous_run_stuck` when the active run does not release the
    /// thread within the cancel-wait bound; 500 when the store fails.
    pub async fn delete_thread(&self, thread_id: &str) -> Result<(), ApiError> {
        if let Some(cluster) = &self.inner.cluster {
            return self.delete_thread_shared(cluster, thread_id).await;
        }
        let lane = self.lane(thread_id);
        let serial = lane.submit.lock().await;
        // With a shared store, deleting writes the thread: it must be ours.
        if let Some(ownership) = &self.inner.ownership
            && !ownership.acquire(thread_id).await.unwrap_or(false)
        {
            drop(serial);
            drop(lane);
            self.tidy(thread_id);
            return Err(ApiError::new(
                409,
                "thread_owned_elsewhere",
                format!(
                    "thread \"{thread_id}\" is being run by another process; delete it there, or when its run has finished"
                ),
            ));
        }
        let queued: Vec<Queued> = lane.state().queue.drain(..).collect();
        for q in queued {
            self.finish_unstarted(
                &q.entry,
                TerminationReason::Cancelled,
                Some(CancelCause::Requested),
            );
        }
        let outcome = self.inner.runtime.delete_thread(thread_id).await;
        if outcome.is_ok() {
            lane.state().keys.clear();
            self.message_ids().remove(thread_id);
        }
        self.release_if_idle(&lane, thread_id).await;
        drop(serial);
        drop(lane);
        self.tidy(thread_id);
        outcome.map_err(ApiError::from)
    }

    /// The thread's stored history.
    pub async fn messages(&self, thread_id: &str) -> Vec<Message> {
        self.inner.runtime.thread_messages(thread_id).await
    }

    /// Stops accepting submissions, ends queued runs (`cancelled`, cause
    /// `shutdown`), cancels active runs (cause `shutdown`) and waits for
    /// them within the cancel-wait bound, and ends the live tails.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let lanes: Vec<Arc<Lane>> = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for lane in lanes {
            let queued: Vec<Queued> = lane.state().queue.drain(..).collect();
            for q in queued {
                self.finish_unstarted(
                    &q.entry,
                    TerminationReason::Cancelled,
                    Some(CancelCause::Shutdown),
                );
            }
        }
        self.inner.runtime.shutdown().await;
        if let Some(cluster) = &self.inner.cluster {
            self.shutdown_shared(cluster).await;
        }
        self.inner.closing.cancel();
    }

    /// Applies retention every few seconds until shutdown.
    fn start_sweeper(&self) {
        let service = Arc::downgrade(&self.inner);
        let ttl = self.inner.settings.retention.finished_run_ttl_seconds;
        let every = Duration::from_secs(ttl.clamp(1, 120)).div_f64(4.0);
        let closing = self.inner.closing.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = closing.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let Some(inner) = service.upgrade() else {
                    return;
                };
                let service = Service { inner };
                let dropped = service.inner.records.sweep();
                service.forget_keys(dropped);
            }
        });
    }
}
