//! The in-process mode: one process, its threads' lanes in memory.
//!
//! Each thread has a **lane**: a submission lock, its active run, its
//! FIFO queue (`enqueue`), its idempotency keys and the client message
//! ids it has seen (AG-UI).
//!
//! **Invariant:** submissions to one thread are serialized by the lane's
//! submission lock, from the idempotency and message-id checks to
//! recording the key and the ids, so concurrent duplicates get the first
//! submission's run and append nothing.
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
//!
//! **Invariant:** a run parked for approvals holds no task: it lets go
//! ([`RunRequest::release_when_parked`]) and stays the lane's active run
//! as a [`ParkedRun`] in the lane. Whatever ends the wait — the last
//! decision, a timeout due, a cancel, new input, deleting the thread,
//! shutdown — carries it on through the mailbox (under the lane's
//! submission lock), where the engine ends or continues it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rein_runtime::approvals::ParkedRun;
use rein_runtime::auto::{AutoRounds, AutomationPolicy, MetricsReport};
use rein_runtime::{AgentRunResult, RunExit, RunHandle, RunRequest};
use rein_runtime_contract::event::CancelCause;
use rein_runtime_contract::lifecycle::TerminationReason;

use crate::auto::{RunMode, ThreadAuto};
use crate::core::Core;
use rein_runtime::approvals::{ApprovalError, Decided};
use rein_runtime_contract::approval::{Decision, PendingApproval};

use crate::error::ServiceError;
use crate::listing::{Page, RunFilter, RunSummary, ThreadFilter, ThreadSummary};
use crate::mode::Mode;
use crate::records::{RunEntry, RunStatus, Superseded};
use crate::submission::{Strategy, Submission, Submitted};

/// How often the parked runs' rule timeouts are looked at.
const PARKED_TIMEOUTS: Duration = Duration::from_millis(500);
/// How long a decision on a run that just parked waits for its driver to
/// hand the parked run to the lane, and how often it looks.
const HAND_OVER: Duration = Duration::from_secs(2);
const HAND_OVER_POLL: Duration = Duration::from_millis(2);

/// The in-process mode.
#[derive(Debug)]
pub(crate) struct InProcess {
    core: Arc<Core>,
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
    /// The tasks that await runs and record their results.
    drivers: tokio_util::task::TaskTracker,
    me: Weak<InProcess>,
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
    /// Idempotency keys: the run each names, and its submission's
    /// fingerprint.
    keys: HashMap<String, (String, u64)>,
    /// Client message ids the thread has seen (AG-UI). Kept while the
    /// thread is, so a lane with some is never tidied away.
    message_ids: HashSet<String>,
    /// The active run, when it is parked and let go of its task.
    parked: Option<ParkedRun>,
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

impl InProcess {
    /// The mode, with its retention sweeper started.
    pub(crate) fn start(core: Arc<Core>) -> Arc<Self> {
        let mode = Arc::new_cyclic(|me| Self {
            core: core.clone(),
            lanes: Mutex::default(),
            drivers: tokio_util::task::TaskTracker::new(),
            me: me.clone(),
        });
        let ttl = core.settings.retention.finished_run_ttl_seconds;
        let every = Duration::from_secs(ttl.clamp(1, 120)).div_f64(4.0);
        core.every(every, Arc::downgrade(&mode), |mode: Arc<Self>| async move {
            let dropped = mode.core.records.sweep();
            mode.forget_keys(dropped);
        });
        core.every(
            PARKED_TIMEOUTS,
            Arc::downgrade(&mode),
            |mode: Arc<Self>| async move { mode.carry_on_due().await },
        );
        mode
    }

    /// Carries on the parked runs a rule's timeout is due for.
    async fn carry_on_due(&self) {
        let now = std::time::SystemTime::now();
        let due: Vec<Arc<Lane>> = self
            .lanes()
            .values()
            .filter(|lane| {
                lane.state().parked.as_ref().is_some_and(|p| {
                    p.undecided().any(|call| {
                        call.expires_at
                            .as_deref()
                            .and_then(rein_runtime_contract::approval::parse_rfc3339)
                            .is_some_and(|at| at <= now)
                    })
                })
            })
            .cloned()
            .collect();
        for lane in due {
            let _serial = lane.submit.lock().await;
            self.carry_on(&lane, true).await;
        }
    }

    /// Carries the lane's parked run on (if it has one) through the
    /// mailbox; with `release`, it lets go again if it is still waiting.
    /// The caller holds the lane's submission lock.
    async fn carry_on(&self, lane: &Arc<Lane>, release: bool) {
        let Some(parked) = lane.state().parked.take() else {
            return;
        };
        let Some(entry) = self.core.records.get(&parked.run_id) else {
            lane.state().active = None;
            return;
        };
        let mut request = RunRequest::resume(parked)
            .with_cancellation(entry.cancellation().clone())
            .with_event_sink(self.core.records.sink(&entry));
        if release {
            request = request.release_when_parked();
        }
        match self.core.runtime.mailbox().submit(request).await {
            Ok(handle) => self.drive(lane.clone(), entry, handle),
            Err(e) => {
                let reason = TerminationReason::Error(format!(
                    "the parked run could not be carried on: {e}"
                ));
                self.finish_unstarted(&entry, reason, None);
                let freed = {
                    let mut state = lane.state();
                    let freed = state.active.as_deref() == Some(entry.run_id.as_str());
                    if freed {
                        state.active = None;
                    }
                    freed
                };
                // Its queue goes on (the caller holds the lock).
                if freed {
                    Box::pin(self.start_next(lane)).await;
                }
            }
        }
    }

    /// Ends the lane's parked run, if it has one: cancelled (its token)
    /// and carried on, so the engine records its calls `not_started`.
    /// The caller holds the lane's submission lock.
    async fn end_parked(&self, lane: &Arc<Lane>) {
        let run_id = lane.state().parked.as_ref().map(|p| p.run_id.clone());
        if let Some(entry) = run_id.and_then(|id| self.core.records.get(&id)) {
            self.core.cancel_entry(&entry);
            self.carry_on(lane, false).await;
        }
    }

    /// Decides a call of a run that let go of its task: waits (bounded)
    /// for its driver to hand the parked run to the lane, records the
    /// decision there, and carries the run on when it was the last.
    /// `None`: the run is not parked so.
    async fn decide_let_go(
        &self,
        entry: &RunEntry,
        call_id: &str,
        decision: &Decision,
        by: Option<&str>,
    ) -> Option<Result<Decided, ServiceError>> {
        let lane = self.lane(&entry.thread_id);
        let mut waited = Duration::ZERO;
        loop {
            {
                let _serial = lane.submit.lock().await;
                let decided = {
                    let mut state = lane.state();
                    let parked = state.parked.as_mut().filter(|p| p.run_id == entry.run_id);
                    parked.map(|p| {
                        let decided =
                            self.core
                                .runtime
                                .decide_parked(p, call_id, decision.clone(), by);
                        (decided, p.is_decided())
                    })
                };
                if let Some((decided, complete)) = decided {
                    if decided.is_ok() && complete {
                        self.carry_on(&lane, false).await;
                    }
                    return Some(decided.map_err(ServiceError::from));
                }
            }
            // Parked a moment ago: its driver has not handed it over yet.
            let pending = entry.status() == RunStatus::AwaitingApproval
                && entry
                    .record()
                    .pending_approvals
                    .iter()
                    .any(|p| p.call_id == call_id);
            if !pending || waited >= HAND_OVER {
                return None;
            }
            tokio::time::sleep(HAND_OVER_POLL).await;
            waited += HAND_OVER_POLL;
        }
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<String, Arc<Lane>>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lane(&self, thread_id: &str) -> Arc<Lane> {
        self.lanes()
            .entry(thread_id.to_owned())
            .or_default()
            .clone()
    }

    /// Drops a lane that holds nothing and that nobody else holds.
    fn tidy(&self, thread_id: &str) {
        let mut lanes = self.lanes();
        if let Some(lane) = lanes.get(thread_id)
            && Arc::strong_count(lane) == 1
        {
            let state = lane.state();
            let idle = state.active.is_none()
                && state.queue.is_empty()
                && state.keys.is_empty()
                && state.message_ids.is_empty();
            drop(state);
            if idle {
                lanes.remove(thread_id);
            }
        }
    }

    async fn submit_in(
        &self,
        lane: &Arc<Lane>,
        thread_id: &str,
        s: Submission,
        rounds: Option<AutoRounds>,
    ) -> Result<Submitted, ServiceError> {
        let _serial = lane.submit.lock().await;
        self.submit_locked(lane, thread_id, s, rounds).await
    }

    /// [`submit_in`](Self::submit_in) with the lane's submission lock held
    /// by the caller.
    async fn submit_locked(
        &self,
        lane: &Arc<Lane>,
        thread_id: &str,
        s: Submission,
        rounds: Option<AutoRounds>,
    ) -> Result<Submitted, ServiceError> {
        let core = &self.core;
        // Only a keyed submission is compared with a later one.
        let fingerprint = s.idempotency_key.as_ref().map(|_| {
            let agent = core.runtime.agent_spec(s.agent_id.as_deref());
            s.fingerprint(agent.map_or("", |spec| spec.id.as_str()))
        });
        if let Some(key) = &s.idempotency_key {
            let known = lane.state().keys.get(key).cloned();
            if let Some((run_id, first)) = known
                && let Some(entry) = core.records.get(&run_id)
            {
                if Some(first) != fingerprint {
                    return Err(ServiceError::IdempotencyKeyReused {
                        thread_id: thread_id.to_owned(),
                        key: key.clone(),
                        run_id,
                    });
                }
                return Ok(Submitted::Duplicate(entry));
            }
        }
        let (messages, new_ids) = s.unseen(&lane.state().message_ids);
        let (request, agent_id) = core
            .checked_request(thread_id, s.agent_id.as_deref(), messages)
            .await?;
        let busy = {
            let state = lane.state();
            state.active.is_some() || !state.queue.is_empty()
        };
        let status = match (busy, s.strategy) {
            (true, Strategy::Reject) => {
                return Err(ServiceError::ThreadBusy {
                    thread_id: thread_id.to_owned(),
                });
            }
            (true, Strategy::Enqueue) => RunStatus::Queued,
            _ => RunStatus::Running,
        };
        let key = s.idempotency_key.clone();
        let entry = match &s.run_id {
            Some(run_id) => core
                .records
                .create(run_id, thread_id, &agent_id, key, status)
                .ok_or_else(|| ServiceError::RunIdInUse {
                    run_id: run_id.clone(),
                })?,
            // A made id skips any a client chose: it is never refused.
            None => loop {
                let run_id = core.runtime.next_id("run");
                if let Some(entry) =
                    core.records
                        .create(&run_id, thread_id, &agent_id, key.clone(), status)
                {
                    break entry;
                }
            },
        };
        let run_id = entry.run_id.clone();
        let mut request = request;
        if let Some(mut rounds) = rounds {
            if rounds.session_id.is_empty() {
                rounds.session_id = format!("auto-{run_id}");
            }
            let tokens = core.autos.get(thread_id).tokens_used_session;
            if let Some(budget) = rounds.round_budget(tokens) {
                request = request.with_token_budget(budget);
            }
            entry.set_rounds(rounds, tokens);
        }
        let request = request
            .with_run_id(&run_id)
            .with_cancellation(entry.cancellation().clone())
            .with_event_sink(core.records.sink(&entry))
            .release_when_parked();
        if status == RunStatus::Queued {
            lane.state().queue.push_back(Queued {
                entry: entry.clone(),
                request,
            });
        } else {
            // The run it interrupts is superseded: were it an auto-mode
            // round just ending, its session starts no next round.
            let active = lane.state().active.clone();
            if let Some(active) = active.and_then(|id| core.records.get(&id)) {
                active.supersede(Superseded::Cancelled);
            }
            // A parked run that new input supersedes ends first (the
            // mailbox interrupts it once it is carried on).
            self.carry_on(lane, false).await;
            match core.runtime.mailbox().submit(request).await {
                Ok(handle) => {
                    lane.state().active = Some(run_id.clone());
                    self.drive(lane.clone(), entry.clone(), handle);
                }
                Err(e) => {
                    core.records.discard(&run_id);
                    return Err(e.into());
                }
            }
        }
        let mut state = lane.state();
        if let (Some(key), Some(fingerprint)) = (s.idempotency_key, fingerprint) {
            state.keys.insert(key, (run_id, fingerprint));
        }
        state.message_ids.extend(new_ids);
        Ok(Submitted::New(entry))
    }

    /// Awaits a started run, records its result, and starts the lane's
    /// next queued run.
    fn drive(&self, lane: Arc<Lane>, entry: Arc<RunEntry>, handle: RunHandle) {
        let Some(mode) = self.me.upgrade() else {
            return;
        };
        self.drivers.spawn(async move {
            let result = match handle.wait_or_parked().await {
                Ok(RunExit::Finished(result)) => *result,
                Ok(RunExit::Parked(parked)) => {
                    // Parked: the lane keeps it (its active run) until
                    // something carries it on.
                    lane.state().parked = Some(*parked);
                    return;
                }
                Ok(other) => AgentRunResult::new(
                    &entry.run_id,
                    &entry.thread_id,
                    TerminationReason::Error(format!(
                        "the run's task ended unexpectedly: {other:?}"
                    )),
                ),
                Err(e) => AgentRunResult::new(
                    &entry.run_id,
                    &entry.thread_id,
                    TerminationReason::Error(e.to_string()),
                ),
            };
            // An auto-mode round ends under the lane's lock, so a cancel,
            // new input or deletion is either seen by its end or sees the
            // next round queued.
            {
                let round = entry.is_round();
                let early = if round {
                    Some(lane.submit.lock().await)
                } else {
                    None
                };
                if round {
                    mode.core.end_round(&*mode, &entry, &result).await;
                }
                let dropped = mode.core.records.finish(&entry, result);
                mode.forget_keys(dropped);
                let serial = match early {
                    Some(serial) => serial,
                    None => lane.submit.lock().await,
                };
                let mine = {
                    let mut state = lane.state();
                    let mine = state.active.as_deref() == Some(entry.run_id.as_str());
                    if mine {
                        state.active = None;
                    }
                    mine
                };
                if mine {
                    mode.start_next(&lane).await;
                }
                drop(serial);
            }
            drop(lane);
            mode.tidy(&entry.thread_id);
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
            if self.core.shutting_down() {
                self.finish_unstarted(
                    &entry,
                    TerminationReason::Cancelled,
                    Some(CancelCause::Shutdown),
                );
                continue;
            }
            match self.core.runtime.mailbox().submit(request).await {
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
            .core
            .records
            .finish_unstarted(entry, termination, cause);
        self.forget_keys(dropped);
    }

    /// Removes the idempotency keys of dropped records.
    fn forget_keys(&self, dropped: Vec<(String, String)>) {
        for (thread_id, key) in dropped {
            let lane = self.lanes().get(&thread_id).cloned();
            if let Some(lane) = lane {
                lane.state().keys.remove(&key);
                drop(lane);
                self.tidy(&thread_id);
            }
        }
    }

    /// Marks the lane's active run (see [`RunEntry::supersede`]).
    fn supersede_active(&self, lane: &Lane, how: Superseded) {
        let active = lane.state().active.clone();
        if let Some(entry) = active.and_then(|id| self.core.records.get(&id)) {
            entry.supersede(how);
        }
    }

    fn drain_queue(&self, lane: &Lane, cause: CancelCause) {
        let queued: Vec<Queued> = lane.state().queue.drain(..).collect();
        for q in queued {
            self.finish_unstarted(&q.entry, TerminationReason::Cancelled, Some(cause.clone()));
        }
    }
}

#[async_trait::async_trait]
impl Mode for InProcess {
    async fn submit_round(
        &self,
        thread_id: &str,
        s: Submission,
        rounds: AutoRounds,
        _after: &str,
    ) -> Result<Option<Submitted>, ServiceError> {
        // From `drive`, which holds the lane's lock: what could overtake the
        // round's end took the lock first, and marked the round.
        let lane = self.lane(thread_id);
        self.submit_locked(&lane, thread_id, s, Some(rounds))
            .await
            .map(Some)
    }

    async fn submit(
        &self,
        thread_id: &str,
        s: Submission,
        rounds: Option<AutoRounds>,
    ) -> Result<Submitted, ServiceError> {
        let lane = self.lane(thread_id);
        let outcome = self.submit_in(&lane, thread_id, s, rounds).await;
        drop(lane);
        if outcome.is_err() {
            self.tidy(thread_id);
        }
        outcome
    }

    async fn run(&self, run_id: &str) -> Result<Arc<RunEntry>, ServiceError> {
        self.core
            .records
            .get(run_id)
            .ok_or_else(|| ServiceError::unknown_run(run_id))
    }

    async fn cancel_run(&self, run_id: &str) -> Result<bool, ServiceError> {
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
            // Running, or about to start: its token ends it either way (a
            // sub-agent's run: the runtime's token of that run alone).
            // Parked without a task: carried on to end.
            None => {
                self.core.cancel_entry(&entry);
                let lane = self.lane(&entry.thread_id);
                let serial = lane.submit.lock().await;
                let parked = lane
                    .state()
                    .parked
                    .as_ref()
                    .is_some_and(|p| p.run_id == run_id);
                if parked {
                    self.carry_on(&lane, false).await;
                }
                drop(serial);
                // An auto-mode round whose end queued the next one before
                // the cancel: the session's next round is cancelled too.
                if let Some(next) = entry.auto().and_then(|a| a.next_run_id) {
                    Box::pin(self.cancel_run(&next)).await?;
                }
            }
        }
        self.tidy(&entry.thread_id);
        Ok(true)
    }

    async fn cancel_tool_call_elsewhere(
        &self,
        run_id: &str,
        _call_id: &str,
    ) -> Result<bool, ServiceError> {
        let entry = self.run(run_id).await?;
        Err(ServiceError::RunNotRunning {
            run_id: run_id.to_owned(),
            status: entry.status(),
        })
    }

    async fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ServiceError> {
        match self
            .core
            .runtime
            .decide_as(run_id, call_id, decision.clone(), by)
        {
            Ok(decided) => return Ok(decided),
            Err(ApprovalError::UnknownApproval { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let entry = self.core.records.get(run_id).ok_or_else(|| {
            ServiceError::from(ApprovalError::UnknownApproval {
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
            })
        })?;
        // Parked without a task: decided in its lane.
        if let Some(decided) = self.decide_let_go(&entry, call_id, &decision, by).await {
            return decided;
        }
        // Not pending (any more): a repeat of the logged decision, or not.
        Core::decided_before(&entry, call_id, &decision)
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Page<RunSummary>, ServiceError> {
        Ok(crate::listing::runs_page(
            self.core.records.entries(),
            filter,
        ))
    }

    async fn list_threads(
        &self,
        filter: &ThreadFilter,
    ) -> Result<Page<ThreadSummary>, ServiceError> {
        Ok(crate::listing::threads_page(
            self.core.records.entries(),
            filter,
        ))
    }

    async fn pending_approvals(
        &self,
        thread_id: Option<&str>,
    ) -> Result<Vec<PendingApproval>, ServiceError> {
        let mut pending = self.core.runtime.pending_approvals(None);
        for lane in self.lanes().values() {
            if let Some(parked) = &lane.state().parked {
                pending.extend(parked.undecided().cloned());
            }
        }
        pending.retain(|p| Core::on_thread(p, thread_id));
        pending.sort_by(|a, b| (&a.run_id, &a.call_id).cmp(&(&b.run_id, &b.call_id)));
        Ok(pending)
    }

    async fn cancel_thread(&self, thread_id: &str) -> (bool, bool) {
        let lane = self.lane(thread_id);
        {
            let _serial = lane.submit.lock().await;
            self.end_parked(&lane).await;
            self.supersede_active(&lane, Superseded::Cancelled);
        }
        drop(lane);
        let runtime = &self.core.runtime;
        if !runtime.is_thread_active(thread_id) {
            return (false, true);
        }
        let released = runtime.cancel_and_wait_by_thread(thread_id).await;
        (true, released || !runtime.is_thread_active(thread_id))
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), ServiceError> {
        let lane = self.lane(thread_id);
        let serial = lane.submit.lock().await;
        self.supersede_active(&lane, Superseded::Dropped);
        self.drain_queue(&lane, CancelCause::Requested);
        self.end_parked(&lane).await;
        let outcome = self.core.runtime.delete_thread(thread_id).await;
        if outcome.is_ok() {
            self.core.autos.delete(thread_id);
            let mut state = lane.state();
            state.keys.clear();
            state.message_ids.clear();
        }
        drop(serial);
        drop(lane);
        self.tidy(thread_id);
        Ok(outcome?)
    }

    async fn remember_message_ids(
        &self,
        thread_id: &str,
        ids: Vec<String>,
    ) -> Result<(), ServiceError> {
        if !ids.is_empty() {
            self.lane(thread_id).state().message_ids.extend(ids);
        }
        Ok(())
    }

    async fn health(&self) -> Result<(), ServiceError> {
        Ok(())
    }

    async fn thread_auto(&self, thread_id: &str) -> Result<ThreadAuto, ServiceError> {
        Ok(self.core.autos.get(thread_id))
    }

    async fn set_auto_defaults(
        &self,
        thread_id: &str,
        run_mode: Option<RunMode>,
        policy: Option<Option<AutomationPolicy>>,
    ) -> Result<(), ServiceError> {
        self.core.autos.set_defaults(thread_id, run_mode, policy);
        Ok(())
    }

    async fn add_to_session(
        &self,
        thread_id: &str,
        tokens: u64,
        reports: &[MetricsReport],
    ) -> Result<ThreadAuto, ServiceError> {
        Ok(self.core.autos.add(thread_id, tokens, reports))
    }

    async fn reset_session(&self, thread_id: &str) -> Result<(), ServiceError> {
        self.core.autos.reset(thread_id);
        Ok(())
    }

    async fn shutdown(&self) {
        let lanes: Vec<Arc<Lane>> = self.lanes().values().cloned().collect();
        for lane in lanes {
            self.drain_queue(&lane, CancelCause::Shutdown);
            // Carried on, so the shutdown below ends it.
            let _serial = lane.submit.lock().await;
            self.carry_on(&lane, false).await;
        }
        self.core.runtime.shutdown().await;
        // The runs have ended: their records are written next.
        self.drivers.close();
        if tokio::time::timeout(self.core.cancel_wait(), self.drivers.wait())
            .await
            .is_err()
        {
            tracing::warn!("some run records were not written before shutdown");
        }
    }
}
