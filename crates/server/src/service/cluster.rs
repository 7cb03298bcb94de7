//! Distributed mode: what the service does when processes share one
//! PostgreSQL database (`store: { postgres: ... }`).
//!
//! The database is the truth; each process's [`Records`](super::records)
//! are a cache of it.
//!
//! - **Submitting** writes a `queued` run (`rein_postgres::PgRuns`) before
//!   the 202, whichever process the request reached; a repeated
//!   idempotency key finds the first run through a unique index.
//! - **Running**: a thread's work is done by the process holding its lease,
//!   through the thread's **pump**: it claims the thread's queued runs in
//!   order (an `interrupt` one at once, cancelling the active run through
//!   the engine's mailbox), runs them, writes their events as they come and
//!   finishes them with their record — every write fenced. When the thread
//!   has no work left the pump gives the lease up.
//! - **Following**: a run another process runs is read from the database
//!   (record and events, woken by `NOTIFY rein_events`, polled as the
//!   safety net), so records, `?wait=true` and SSE work from any process.
//! - **Cancelling** a run elsewhere marks it in the database and notifies
//!   (`rein_cancel`); a queued run is finished by whoever cancels it.
//! - **Taking over**: every process scans, a few times a second, for
//!   threads with work and no live owner; the first to take one ends the
//!   runs a lost owner left `running` (`error`, the worker was lost),
//!   repairs the history (done by the lease's take-over) and pumps the
//!   queue.
//!
//! **Invariant:** a run is started only by a pump whose process holds the
//! thread's lease, and each pump runs one run at a time (an interrupting
//! one replaces the active one through the mailbox), so one run per thread
//! holds cluster-wide while leases hold; when they do not (a paused
//! process), the fence refuses the stale process's writes.
//!
//! **Invariant:** a run's record says `finished` only after its events,
//! `run_finished` last, are stored (they are written in one statement).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rein::contract::message::Message;
use rein::events::{AgentEvent, CancelCause};
use rein::{AgentRunResult, RunHandle, RunRequest, TerminationReason};
use rein_postgres::{Claimed, NewRun, PgRuns, StoredEvent, SubmitOutcome, WRITE_RETRY, retry};
use tokio::sync::{Notify, broadcast};
use tokio_util::task::TaskTracker;

use super::records::{Records, RunEntry, RunRecord, RunStatus, finished_record};
use super::{ApiError, Service, Strategy, Submission, Submitted};

/// How often each process looks for threads with work and no live owner,
/// and for cancel requests it missed (the safety net under NOTIFY).
const SCAN: Duration = Duration::from_millis(250);

/// The detail of a run whose process was lost.
pub const LOST_RUN: &str = "the worker running this run was lost (its process stopped renewing the thread's lease); tool calls it left open may or may not have run";

/// The distributed half of a [`Service`].
#[derive(Debug)]
pub(super) struct Cluster {
    runs: PgRuns,
    pumps: Mutex<HashMap<String, Arc<Pump>>>,
    /// Runs whose stored state changed (from `NOTIFY rein_events`).
    changes: broadcast::Sender<Change>,
    drivers: TaskTracker,
    /// Unique per process start: run ids made here are unique cluster-wide.
    tag: String,
    next: AtomicU64,
    /// Threads another live process was found holding (see [`Elsewhere`]).
    elsewhere: Mutex<HashMap<String, Elsewhere>>,
}

/// A run's stored state changed: new events, or (`finished`) its record.
#[derive(Debug, Clone)]
struct Change {
    run_id: String,
    finished: bool,
}

/// A thread another process holds, as last seen: submissions here leave
/// it to that process (which claims them when its run ends; an interrupt
/// reaches it at once through `NOTIFY rein_work`)
/// instead of each trying to take the lease — until the lease would have
/// run out, or the holder says it gave the thread up (`r:`), whereupon
/// this process takes it if something was submitted here meanwhile.
#[derive(Debug)]
struct Elsewhere {
    until: std::time::Instant,
    /// Something was submitted here while the thread was held elsewhere.
    pending: bool,
}

/// A thread's pump: present while this process holds the thread's lease
/// and works on it.
#[derive(Debug, Default)]
struct Pump {
    wake: Notify,
    /// An `interrupt` submission is waiting.
    interrupt: AtomicBool,
    /// Held while claiming, and while giving the thread up.
    stepping: tokio::sync::Mutex<()>,
    /// The thread is held and what a previous owner left was cleaned up:
    /// claims may start.
    ready: AtomicBool,
    /// The thread was given up: this pump claims nothing more.
    closed: AtomicBool,
    /// A claim failed: its commit may have succeeded with the answer lost,
    /// leaving a run `running` here that nothing drives. The next step
    /// looks for it first ([`PgRuns::claimed_here`]).
    claim_failed: AtomicBool,
    active: Mutex<Option<Arc<RunEntry>>>,
}

impl Pump {
    fn active(&self) -> Option<Arc<RunEntry>> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_active(&self, entry: Option<Arc<RunEntry>>) {
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = entry;
    }

    /// Clears the active run if it is `entry`.
    fn finished(&self, entry: &Arc<RunEntry>) {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active.as_ref().is_some_and(|a| Arc::ptr_eq(a, entry)) {
            *active = None;
        }
    }
}

impl Cluster {
    pub(super) fn new(runs: PgRuns) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        hasher.write_u32(std::process::id());
        Self {
            runs,
            pumps: Mutex::default(),
            changes: broadcast::channel(4096).0,
            drivers: TaskTracker::new(),
            tag: format!("{:08x}", hasher.finish() as u32),
            next: AtomicU64::new(1),
            elsewhere: Mutex::default(),
        }
    }

    fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<String, Elsewhere>> {
        self.elsewhere.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether another process was seen holding the thread and its lease
    /// may still run; if so, notes that work is pending here.
    fn held_elsewhere(&self, thread_id: &str) -> bool {
        let mut elsewhere = self.elsewhere();
        match elsewhere.get_mut(thread_id) {
            Some(e) if e.until > std::time::Instant::now() => {
                e.pending = true;
                true
            }
            Some(_) => {
                elsewhere.remove(thread_id);
                false
            }
            None => false,
        }
    }

    fn next_run_id(&self) -> String {
        format!(
            "run-{}-{}",
            self.tag,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Asks the process running run `run_id` to end its call `call_id`:
    /// `Ok(false)` once asked (the run is running elsewhere).
    pub(super) async fn cancel_tool_call(
        &self,
        run_id: &str,
        call_id: &str,
    ) -> Result<bool, ApiError> {
        let status = self
            .runs
            .request_tool_call_cancel(run_id, call_id)
            .await
            .map_err(|e| unavailable(&e))?;
        match status.as_deref() {
            Some("running") => Ok(false),
            Some(status) => Err(ApiError::new(
                409,
                "tool_call_not_running",
                format!(
                    "run \"{run_id}\" is {status}, not running; a tool call can be cancelled only while its run runs"
                ),
            )),
            None => Err(ApiError::new(
                404,
                "unknown_run",
                format!("no run \"{run_id}\""),
            )),
        }
    }

    fn pump(&self, thread_id: &str) -> Option<Arc<Pump>> {
        self.pumps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(thread_id)
            .cloned()
    }
}

fn unavailable(e: &sqlx::Error) -> ApiError {
    ApiError::new(
        503,
        "store_unavailable",
        format!("the database could not be reached: {e}"),
    )
}

/// A run as stored: 404 `unknown_run` when there is none.
async fn stored_run(cluster: &Cluster, run_id: &str) -> Result<rein_postgres::StoredRun, ApiError> {
    // Through a database restart, like the writes.
    retry(WRITE_RETRY, || cluster.runs.run(run_id))
        .await
        .map_err(|e| unavailable(&e))?
        .ok_or_else(|| ApiError::unknown_run(run_id))
}

fn stored(logged: &[Arc<super::LoggedEvent>]) -> Vec<StoredEvent> {
    logged
        .iter()
        .map(|e| StoredEvent {
            seq: e.seq as i64,
            kind: e.kind.to_owned(),
            data: e.json.clone(),
        })
        .collect()
}

/// The record and `run_finished` event of a run that ends without the
/// engine (cancelled while queued, lost with its process, unable to start).
fn ended_without_engine(
    run_id: &str,
    thread_id: &str,
    agent_id: &str,
    termination: TerminationReason,
    cancel_cause: Option<CancelCause>,
    seq: i64,
) -> (AgentRunResult, serde_json::Value, StoredEvent) {
    let mut result = AgentRunResult::new(run_id, thread_id, termination.clone());
    result.cancel_cause = cancel_cause.clone();
    if matches!(&termination, TerminationReason::Error(m) if m == LOST_RUN) {
        // Its open tool calls were answered as "may or may not have run".
        result.report.resumable = false;
        result.report.hint = Some(
            "the process running it was lost: check whether the tool calls it left open took effect, then send a new message to the thread"
                .to_owned(),
        );
    }
    let record = finished_record(run_id, thread_id, agent_id, &result);
    let event = AgentEvent::RunFinished {
        run_id: run_id.to_owned(),
        thread_id: thread_id.to_owned(),
        termination,
        response: String::new(),
        cancel_cause,
        steps: 0,
        usage: Default::default(),
        cache_usage: None,
        outputs: Default::default(),
        report: Some(result.report.clone()),
    };
    let event = StoredEvent {
        seq,
        kind: event.kind().to_owned(),
        data: serde_json::to_string(&event).unwrap_or_default(),
    };
    (
        result,
        serde_json::to_value(record).unwrap_or_default(),
        event,
    )
}

impl Service {
    fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.inner.cluster.as_ref()
    }

    /// Submits through the database (see the module docs).
    pub(super) async fn submit_shared(
        &self,
        cluster: &Cluster,
        thread_id: &str,
        s: Submission,
    ) -> Result<Submitted, ApiError> {
        let (_, agent_id) = self.checked_request(thread_id, &s).await?;
        let run_id = s.run_id.unwrap_or_else(|| cluster.next_run_id());
        let messages = serde_json::to_value(&s.messages)
            .map_err(|e| ApiError::new(422, "invalid_messages", e.to_string()))?;
        let new = NewRun {
            run_id: &run_id,
            thread_id,
            agent_id: &agent_id,
            interrupt: s.strategy == Strategy::Interrupt,
            reject_if_busy: s.strategy == Strategy::Reject,
            idempotency_key: s.idempotency_key.as_deref(),
            messages: &messages,
        };
        match cluster.runs.submit(&new).await {
            Ok(SubmitOutcome::Queued) => {}
            Ok(SubmitOutcome::Duplicate(first)) => {
                return Ok(Submitted::Duplicate(self.run(&first).await?));
            }
            Ok(SubmitOutcome::Busy) => {
                return Err(ApiError::new(
                    409,
                    "thread_busy",
                    format!(
                        "thread \"{thread_id}\" has a run; submit with strategy interrupt or enqueue, or cancel it first"
                    ),
                ));
            }
            Ok(SubmitOutcome::RunIdTaken) => {
                return Err(ApiError::new(
                    409,
                    "run_id_in_use",
                    format!("run id \"{run_id}\" is already taken; choose another"),
                ));
            }
            Err(e) => return Err(unavailable(&e)),
        }
        self.kick(thread_id, s.strategy == Strategy::Interrupt, false)
            .await;
        // Started here already, or a snapshot: the answer does not follow
        // the run (`Service::run` does, for a caller that waits).
        let entry = self.inner.records.get(&run_id).unwrap_or_else(|| {
            Records::detached(
                &run_id,
                thread_id,
                &agent_id,
                s.idempotency_key.clone(),
                RunStatus::Queued,
            )
        });
        Ok(Submitted::New(entry))
    }

    /// Makes sure the thread's work is being done: wakes its pump here, or
    /// takes the thread (if no live process holds it) and starts one.
    /// Unless `force`, a thread last seen held elsewhere is left to its
    /// holder ([`Elsewhere`]).
    async fn kick(&self, thread_id: &str, interrupt: bool, force: bool) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let (pump, fresh) = {
            let mut pumps = cluster.pumps.lock().unwrap_or_else(|e| e.into_inner());
            match pumps.get(thread_id) {
                Some(pump) => (pump.clone(), false),
                None if !force && cluster.held_elsewhere(thread_id) => return,
                None => {
                    let pump = Arc::new(Pump::default());
                    pumps.insert(thread_id.to_owned(), pump.clone());
                    (pump, true)
                }
            }
        };
        if fresh {
            let held = match &self.inner.ownership {
                Some(ownership) => ownership.acquire(thread_id).await,
                None => Ok(false),
            };
            if !matches!(held, Ok(true)) {
                match held {
                    Err(error) => {
                        tracing::warn!(%error, thread_id, "could not take the thread's lease");
                    }
                    Ok(_) => {
                        let until = std::time::Instant::now() + cluster.runs.leases().lease();
                        cluster.elsewhere().insert(
                            thread_id.to_owned(),
                            Elsewhere {
                                until,
                                pending: false,
                            },
                        );
                    }
                }
                let mut pumps = cluster.pumps.lock().unwrap_or_else(|e| e.into_inner());
                if pumps.get(thread_id).is_some_and(|p| Arc::ptr_eq(p, &pump)) {
                    pumps.remove(thread_id);
                }
                return;
            }
            cluster.elsewhere().remove(thread_id);
            self.end_lost_runs(cluster, thread_id).await;
            pump.ready.store(true, Ordering::SeqCst);
            let service = self.clone();
            let thread = thread_id.to_owned();
            let running = pump.clone();
            tokio::spawn(async move { service.run_pump(thread, running).await });
        }
        if interrupt {
            pump.interrupt.store(true, Ordering::SeqCst);
        }
        self.step(cluster, thread_id, &pump, false).await;
        pump.wake.notify_one();
    }

    /// [`kick`](Self::kick) from a pump (boxed: a pump starts pumps).
    fn kick_again<'a>(
        &'a self,
        thread_id: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.kick(thread_id, false, true))
    }

    /// Ends the runs a previous owner left `running`: it was lost (its
    /// lease was taken), so it can write nothing more for them.
    async fn end_lost_runs(&self, cluster: &Cluster, thread_id: &str) {
        let running = match cluster.runs.running(thread_id).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not read the thread's runs");
                return;
            }
        };
        for (run_id, agent_id, last) in running {
            if self
                .inner
                .records
                .get(&run_id)
                .is_some_and(|e| e.driven_here() && e.status() != RunStatus::Finished)
            {
                continue; // running here: not lost
            }
            let (result, record, event) = ended_without_engine(
                &run_id,
                thread_id,
                &agent_id,
                TerminationReason::Error(LOST_RUN.to_owned()),
                None,
                last + 1,
            );
            match cluster
                .runs
                .finish(thread_id, &run_id, &record, &[event])
                .await
            {
                Ok(true) => {
                    tracing::warn!(thread_id, run_id, "ended a run whose process was lost");
                    if let Some(entry) = self.inner.records.get(&run_id) {
                        self.inner.records.finish(&entry, result);
                    }
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, run_id, "could not end a lost run"),
            }
        }
    }

    /// Claims and starts what the thread can run now: its next queued run
    /// when nothing runs, an `interrupt` one when something does (only
    /// when one was announced, unless `poll`). Returns whether a run is
    /// active after it.
    async fn step(&self, cluster: &Cluster, thread_id: &str, pump: &Arc<Pump>, poll: bool) -> bool {
        let _turn = pump.stepping.lock().await;
        loop {
            if pump.closed.load(Ordering::SeqCst) || !pump.ready.load(Ordering::SeqCst) {
                return false;
            }
            if self.inner.shutting_down.load(Ordering::SeqCst) {
                return pump.active().is_some();
            }
            let active = pump.active().is_some();
            if pump.claim_failed.swap(false, Ordering::SeqCst) {
                match self.claimed_unstarted(cluster, thread_id).await {
                    Ok(Some(claimed)) => {
                        // Started now, as its claim would have (through the
                        // mailbox, which interrupts an active run).
                        self.start_claimed(cluster, thread_id, pump, claimed).await;
                        continue;
                    }
                    Ok(None) => {}
                    Err(error) => {
                        tracing::warn!(%error, thread_id, "could not look for a claimed run");
                        pump.claim_failed.store(true, Ordering::SeqCst);
                        return true;
                    }
                }
            }
            let interrupting = pump.interrupt.swap(false, Ordering::SeqCst);
            if active && !interrupting && !poll {
                return true;
            }
            match cluster.runs.claim(thread_id, active).await {
                Ok(Some(claimed)) => self.start_claimed(cluster, thread_id, pump, claimed).await,
                Ok(None) => return active,
                Err(error) => {
                    tracing::warn!(%error, thread_id, "could not claim the thread's next run");
                    pump.claim_failed.store(true, Ordering::SeqCst);
                    return true;
                }
            }
        }
    }

    /// A run this process claimed whose claim's answer was lost: `running`
    /// here in the database, yet no entry here was ever driven for it.
    async fn claimed_unstarted(
        &self,
        cluster: &Cluster,
        thread_id: &str,
    ) -> Result<Option<Claimed>, sqlx::Error> {
        let claimed = cluster.runs.claimed_here(thread_id).await?;
        Ok(claimed.into_iter().find(|c| {
            !self
                .inner
                .records
                .get(&c.run_id)
                .is_some_and(|e| e.driven_here())
        }))
    }

    /// Starts a claimed run (through the mailbox, which interrupts the
    /// thread's active run if there is one).
    async fn start_claimed(
        &self,
        cluster: &Cluster,
        thread_id: &str,
        pump: &Arc<Pump>,
        claimed: Claimed,
    ) {
        let records = &self.inner.records;
        let entry = records.get_or_create(
            &claimed.run_id,
            thread_id,
            &claimed.agent_id,
            None,
            RunStatus::Running,
        );
        entry.set_driven_here();
        entry.set_running();
        if claimed.cancel_requested {
            entry.cancellation().cancel();
        }
        let started = match serde_json::from_value::<Vec<Message>>(claimed.messages) {
            Ok(messages) => {
                let mut request = RunRequest::new(thread_id, messages)
                    .with_run_id(&claimed.run_id)
                    .with_cancellation(entry.cancellation().clone())
                    .with_event_sink(records.sink(&entry));
                if !claimed.agent_id.is_empty() {
                    request = request.with_agent_id(&claimed.agent_id);
                }
                self.inner
                    .runtime
                    .mailbox()
                    .submit(request)
                    .await
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("its stored messages are unreadable: {e}")),
        };
        match started {
            Ok(handle) => {
                pump.set_active(Some(entry.clone()));
                self.drive_shared(cluster, thread_id, pump.clone(), entry, handle);
            }
            Err(why) => {
                let (result, record, event) = ended_without_engine(
                    &entry.run_id,
                    thread_id,
                    &entry.agent_id,
                    TerminationReason::Error(format!("the run could not start: {why}")),
                    None,
                    entry.logged() as i64 + 1,
                );
                let _ = retry(WRITE_RETRY, || {
                    cluster.runs.finish(
                        thread_id,
                        &entry.run_id,
                        &record,
                        std::slice::from_ref(&event),
                    )
                })
                .await;
                records.finish(&entry, result);
            }
        }
    }

    /// Awaits a run started here: writes its events as they come, then its
    /// last events and record in one statement, and wakes the pump.
    fn drive_shared(
        &self,
        cluster: &Cluster,
        thread_id: &str,
        pump: Arc<Pump>,
        entry: Arc<RunEntry>,
        handle: RunHandle,
    ) {
        let service = self.clone();
        let runs = cluster.runs.clone();
        let thread_id = thread_id.to_owned();
        cluster.drivers.spawn(async move {
            let stop = tokio_util::sync::CancellationToken::new();
            let writer = tokio::spawn(write_events(
                runs.clone(),
                thread_id.clone(),
                entry.clone(),
                stop.clone(),
            ));
            let result = handle.wait().await.unwrap_or_else(|e| {
                AgentRunResult::new(&entry.run_id, &thread_id, TerminationReason::Error(e.to_string()))
            });
            stop.cancel();
            let written = writer.await.unwrap_or(0);
            let (rest, _) = entry.events_after(written);
            let rest = stored(&rest);
            let record = serde_json::to_value(finished_record(
                &entry.run_id,
                &thread_id,
                &entry.agent_id,
                &result,
            ))
            .unwrap_or_default();
            match retry(WRITE_RETRY, || runs.finish(&thread_id, &entry.run_id, &record, &rest)).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    run_id = entry.run_id,
                    thread_id,
                    "the run's record was refused: this process no longer holds the thread"
                ),
                Err(error) => {
                    tracing::error!(%error, run_id = entry.run_id, "could not store the run's record");
                }
            }
            let dropped = service.inner.records.finish(&entry, result);
            service.forget_keys(dropped);
            pump.finished(&entry);
            pump.wake.notify_one();
        });
    }

    /// Works on a held thread until it has nothing left, then gives it up.
    async fn run_pump(self, thread_id: String, pump: Arc<Pump>) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let closing = self.inner.closing.clone();
        loop {
            let mut poll = false;
            tokio::select! {
                _ = pump.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => poll = true,
                _ = closing.cancelled() => {}
            }
            let busy = self.step(&cluster, &thread_id, &pump, poll).await;
            if busy {
                continue;
            }
            // Idle: give the thread up — in turn with claims, so no run
            // starts here once the lease is going. Then, if work came in
            // meanwhile (its submitter found this pump closing), take the
            // thread again through a fresh pump.
            {
                let _turn = pump.stepping.lock().await;
                if pump.active().is_some() {
                    continue;
                }
                pump.closed.store(true, Ordering::SeqCst);
                if let Some(ownership) = &self.inner.ownership {
                    ownership.release(&thread_id).await;
                }
                let mut pumps = cluster.pumps.lock().unwrap_or_else(|e| e.into_inner());
                if pumps.get(&thread_id).is_some_and(|p| Arc::ptr_eq(p, &pump)) {
                    pumps.remove(&thread_id);
                }
            }
            if matches!(cluster.runs.has_open(&thread_id).await, Ok(true)) {
                self.kick_again(&thread_id).await;
            }
            return;
        }
    }

    /// A run's entry: kept here, or read from the database (and followed
    /// until it finishes).
    pub(super) async fn run_shared(
        &self,
        cluster: &Cluster,
        run_id: &str,
    ) -> Result<Arc<RunEntry>, ApiError> {
        if let Some(entry) = self.inner.records.get(run_id) {
            if !entry.driven_here() && entry.status() != RunStatus::Finished {
                self.start_following(cluster, &entry);
            }
            return Ok(entry);
        }
        let stored = stored_run(cluster, run_id).await?;
        let status = match stored.status.as_str() {
            "queued" => RunStatus::Queued,
            "running" => RunStatus::Running,
            _ => RunStatus::Finished,
        };
        let entry = self.inner.records.get_or_create(
            run_id,
            &stored.thread_id,
            &stored.agent_id,
            stored.idempotency_key,
            if status == RunStatus::Finished {
                RunStatus::Running
            } else {
                status
            },
        );
        self.start_following(cluster, &entry);
        Ok(entry)
    }

    /// Starts copying the run into its entry, unless that is done already.
    fn start_following(&self, cluster: &Cluster, entry: &Arc<RunEntry>) {
        if entry.start_following() {
            let service = self.clone();
            let runs = cluster.runs.clone();
            let follower = entry.clone();
            tokio::spawn(async move { service.follow(runs, follower).await });
        }
    }

    /// Copies a run another process runs into its entry here, until it
    /// finishes (or this process takes it over). Cancelling the entry's
    /// token (an AG-UI client leaving) cancels the run where it runs.
    async fn follow(self, runs: PgRuns, entry: Arc<RunEntry>) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let mut changes = cluster.changes.subscribe();
        let mut cancel_sent = false;
        loop {
            if entry.driven_here() || entry.status() == RunStatus::Finished {
                return;
            }
            if entry.cancellation().is_cancelled() && !cancel_sent {
                cancel_sent = true;
                if let Err(error) = self.cancel_shared(&cluster, &entry.run_id).await {
                    tracing::warn!(error = %error, run_id = entry.run_id, "could not pass the cancel on");
                }
            }
            // The status first: a finished run's events are all stored.
            let run = runs.run(&entry.run_id).await;
            let events = runs
                .events_after(&entry.run_id, entry.logged() as i64)
                .await;
            if let Ok(events) = events {
                for e in events {
                    entry.append_stored(e.seq as u64, &e.kind, e.data);
                }
            }
            match run {
                Ok(Some(run)) if run.status == "finished" => {
                    let record = run
                        .record
                        .and_then(|r| serde_json::from_value::<RunRecord>(r).ok());
                    let result = result_of(&entry, record);
                    self.inner.records.finish(&entry, result);
                    return;
                }
                Ok(Some(run)) if run.status == "running" => entry.set_running(),
                Ok(None) => {
                    // Dropped by retention or with its thread.
                    let result = AgentRunResult::new(
                        &entry.run_id,
                        &entry.thread_id,
                        TerminationReason::Error("the run's record is gone".to_owned()),
                    );
                    self.inner.records.finish(&entry, result);
                    return;
                }
                _ => {}
            }
            let deadline = tokio::time::sleep(SCAN);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    _ = entry.cancellation().cancelled(), if !cancel_sent => break,
                    change = changes.recv() => match change {
                        Ok(change) if change.run_id == entry.run_id => break,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        }
    }

    /// Cancels a run wherever it is: here, queued (finished by this
    /// process), or running elsewhere (asked through the database).
    pub(super) async fn cancel_shared(
        &self,
        cluster: &Cluster,
        run_id: &str,
    ) -> Result<bool, ApiError> {
        if let Some(entry) = self.inner.records.get(run_id)
            && entry.driven_here()
        {
            if entry.status() == RunStatus::Finished {
                return Ok(false);
            }
            entry.cancellation().cancel();
            return Ok(true);
        }
        let stored = stored_run(cluster, run_id).await?;
        if stored.status == "queued" {
            let (result, record, event) = ended_without_engine(
                run_id,
                &stored.thread_id,
                &stored.agent_id,
                TerminationReason::Cancelled,
                Some(CancelCause::Requested),
                1,
            );
            match cluster.runs.finish_queued(run_id, &record, &[event]).await {
                Ok(true) => {
                    if let Some(entry) = self.inner.records.get(run_id) {
                        self.inner.records.finish(&entry, result);
                    }
                    return Ok(true);
                }
                Ok(false) => {} // claimed meanwhile: cancel it running
                Err(e) => return Err(unavailable(&e)),
            }
        }
        match cluster.runs.request_cancel(run_id).await {
            Ok(Some(status)) => Ok(status != "finished"),
            Ok(None) => Err(ApiError::unknown_run(run_id)),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Cancels the thread's running run wherever it runs and waits,
    /// bounded, until it has finished: `(cancelled, released)`.
    pub(super) async fn cancel_thread_shared(
        &self,
        cluster: &Cluster,
        thread_id: &str,
    ) -> (bool, bool) {
        let mut changes = cluster.changes.subscribe();
        let mut open = match cluster.runs.cancel_running(thread_id).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not send the cancel request");
                return (false, false);
            }
        };
        if open.is_empty() {
            return (false, true);
        }
        let bound = Duration::from_millis(self.inner.settings.cancel_wait_ms);
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Woken by a run's `f:` notification; on a timeout (or missed
            // notifications) the records are read: polling as the safety net.
            let heard =
                tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + SCAN), async {
                    loop {
                        match changes.recv().await {
                            Ok(change) if change.finished => {
                                open.retain(|run_id| *run_id != change.run_id);
                                if open.is_empty() {
                                    return true;
                                }
                            }
                            Ok(_) => {}
                            Err(_) => return false,
                        }
                    }
                })
                .await;
            if heard == Ok(true) {
                return (true, true);
            }
            let mut still = Vec::new();
            for run_id in std::mem::take(&mut open) {
                match cluster.runs.run(&run_id).await {
                    Ok(Some(run)) if run.status != "finished" => still.push(run_id),
                    Err(_) => still.push(run_id),
                    _ => {}
                }
            }
            if still.is_empty() {
                return (true, true);
            }
            open = still;
            if tokio::time::Instant::now() >= deadline {
                return (true, false);
            }
        }
    }

    /// Drops a thread: finishes its queued runs, cancels its running one,
    /// takes its lease and deletes its history.
    pub(super) async fn delete_thread_shared(
        &self,
        cluster: &Cluster,
        thread_id: &str,
    ) -> Result<(), ApiError> {
        for run_id in cluster
            .runs
            .queued(thread_id)
            .await
            .map_err(|e| unavailable(&e))?
        {
            self.cancel_shared(cluster, &run_id).await?;
        }
        let (_, released) = if self.inner.runtime.is_thread_active(thread_id) {
            let released = self
                .inner
                .runtime
                .cancel_and_wait_by_thread(thread_id)
                .await;
            (true, released)
        } else {
            self.cancel_thread_shared(cluster, thread_id).await
        };
        let owned_elsewhere = || {
            ApiError::new(
                409,
                "thread_owned_elsewhere",
                format!(
                    "thread \"{thread_id}\" is being run by another process that does not let it go; retry later"
                ),
            )
        };
        if !released {
            return Err(owned_elsewhere());
        }
        let Some(ownership) = &self.inner.ownership else {
            return Err(owned_elsewhere());
        };
        // The owner gives the thread up once its run has finished.
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.inner.settings.cancel_wait_ms);
        while !ownership.acquire(thread_id).await.unwrap_or(false) {
            if tokio::time::Instant::now() >= deadline {
                return Err(owned_elsewhere());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let outcome = self.inner.runtime.delete_thread(thread_id).await;
        if outcome.is_ok() {
            cluster
                .runs
                .forget_keys(thread_id)
                .await
                .map_err(|e| unavailable(&e))?;
            self.message_ids().remove(thread_id);
        }
        if cluster.pump(thread_id).is_none() {
            ownership.release(thread_id).await;
        }
        outcome.map_err(ApiError::from)
    }

    /// At shutdown: lets the runs started here write their records (the
    /// engine has cancelled them), then gives every thread up; queued runs
    /// stay queued for the other processes.
    pub(super) async fn shutdown_shared(&self, cluster: &Cluster) {
        cluster.drivers.close();
        let bound = Duration::from_millis(self.inner.settings.cancel_wait_ms);
        if tokio::time::timeout(bound, cluster.drivers.wait())
            .await
            .is_err()
        {
            tracing::warn!("some run records were not stored before shutdown");
        }
        if let Some(ownership) = &self.inner.ownership {
            for thread_id in ownership.held() {
                ownership.release(&thread_id).await;
            }
        }
    }

    /// Listens to the database's notifications and scans for work and
    /// cancels, until shutdown.
    pub(super) fn start_cluster(&self) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let closing = self.inner.closing.clone();
        let service = Arc::downgrade(&self.inner);
        let listener_closing = closing.clone();
        let listener_service = service.clone();
        let pool = cluster.runs.pool().clone();
        tokio::spawn(async move {
            loop {
                let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut l) => match l
                        .listen_all(["rein_work", "rein_events", "rein_cancel"])
                        .await
                    {
                        Ok(()) => l,
                        Err(_) => {
                            tokio::time::sleep(SCAN).await;
                            continue;
                        }
                    },
                    Err(_) => {
                        tokio::select! {
                            _ = listener_closing.cancelled() => return,
                            _ = tokio::time::sleep(SCAN) => continue,
                        }
                    }
                };
                loop {
                    let notification = tokio::select! {
                        _ = listener_closing.cancelled() => return,
                        n = listener.recv() => n,
                    };
                    let Ok(notification) = notification else {
                        break;
                    };
                    let Some(inner) = listener_service.upgrade() else {
                        return;
                    };
                    let service = Service { inner };
                    service.notified(notification.channel(), notification.payload());
                }
            }
        });
        tokio::spawn(async move {
            let mut sweeps = 0u32;
            loop {
                tokio::select! {
                    _ = closing.cancelled() => return,
                    _ = tokio::time::sleep(SCAN) => {}
                }
                let Some(inner) = service.upgrade() else {
                    return;
                };
                let service = Service { inner };
                service.scan(&cluster, &mut sweeps).await;
            }
        });
    }

    fn notified(&self, channel: &str, payload: &str) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        match channel {
            "rein_events" => {
                let (finished, run_id) = match payload.split_once(':') {
                    Some(("f", run_id)) => (true, run_id),
                    Some((_, run_id)) => (false, run_id),
                    None => (false, payload),
                };
                let _ = cluster.changes.send(Change {
                    run_id: run_id.to_owned(),
                    finished,
                });
            }
            "rein_work" => {
                let (interrupt, thread_id) = match payload.split_once(':') {
                    Some(("r", thread)) => {
                        // Given up by its holder: take it if work was
                        // submitted here meanwhile.
                        let pending = cluster
                            .elsewhere()
                            .remove(thread)
                            .is_some_and(|e| e.pending);
                        if pending {
                            let service = self.clone();
                            let thread = thread.to_owned();
                            tokio::spawn(async move { service.kick(&thread, false, true).await });
                        }
                        return;
                    }
                    Some(("i", thread)) => (true, thread),
                    Some((_, thread)) => (false, thread),
                    None => (false, payload),
                };
                if let Some(pump) = cluster.pump(thread_id) {
                    if interrupt {
                        pump.interrupt.store(true, Ordering::SeqCst);
                    }
                    if interrupt || pump.active().is_none() {
                        pump.wake.notify_one();
                    }
                }
            }
            "rein_cancel" => {
                if let Some((run_id, call_id)) = payload
                    .strip_prefix("call:")
                    .and_then(|rest| rest.split_once(' '))
                {
                    // Not running here (or already ended): nothing to do.
                    let _ = self.inner.runtime.cancel_tool_call(run_id, call_id);
                    return;
                }
                if let Some(run_id) = payload.strip_prefix("run:")
                    && let Some(entry) = self.inner.records.get(run_id)
                    && entry.driven_here()
                {
                    entry.cancellation().cancel();
                }
            }
            _ => {}
        }
    }

    /// The safety net: threads with work and no live owner are taken;
    /// cancel requests for runs here are acted on; old runs are dropped.
    async fn scan(&self, cluster: &Cluster, sweeps: &mut u32) {
        match cluster.runs.orphaned().await {
            Ok(threads) => {
                for thread_id in threads {
                    if cluster.pump(&thread_id).is_none() {
                        self.kick(&thread_id, false, true).await;
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "could not look for work"),
        }
        if let Some(ownership) = &self.inner.ownership
            && let Ok(runs) = cluster.runs.cancel_requested(&ownership.held()).await
        {
            for run_id in runs {
                if let Some(entry) = self.inner.records.get(&run_id)
                    && entry.driven_here()
                {
                    entry.cancellation().cancel();
                }
            }
        }
        *sweeps += 1;
        if (*sweeps).is_multiple_of(120) {
            let ttl = Duration::from_secs(self.inner.settings.retention.finished_run_ttl_seconds);
            if let Err(error) = cluster.runs.sweep(ttl).await {
                tracing::debug!(%error, "could not drop old runs");
            }
        }
    }
}

/// Writes a run's events to the database as they are logged, in batches,
/// until `stop`; returns the number of the last one written. A write the
/// fence refuses cancels the run (this process lost the thread).
async fn write_events(
    runs: PgRuns,
    thread_id: String,
    entry: Arc<RunEntry>,
    stop: tokio_util::sync::CancellationToken,
) -> u64 {
    let mut written = 0;
    let mut changes = entry.watch();
    loop {
        let (events, _) = entry.events_after(written);
        if let Some(last) = events.last().map(|e| e.seq) {
            let batch = stored(&events);
            match retry(WRITE_RETRY, || {
                runs.append_events(&thread_id, &entry.run_id, &batch)
            })
            .await
            {
                Ok(true) => written = last,
                Ok(false) => {
                    tracing::warn!(
                        run_id = entry.run_id,
                        thread_id,
                        "the run's events were refused: this process no longer holds the thread; cancelling the run"
                    );
                    entry.cancellation().cancel();
                    return written;
                }
                Err(error) => {
                    tracing::error!(%error, run_id = entry.run_id, "could not store the run's events");
                    return written;
                }
            }
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => return written,
            changed = changes.changed() => if changed.is_err() { return written },
        }
        // Linger: a burst of events (a quick run's all of them) becomes
        // one statement — or none, if the run ends meanwhile (its finish
        // writes the rest).
        tokio::select! {
            _ = stop.cancelled() => return written,
            _ = tokio::time::sleep(EVENT_LINGER) => {}
        }
    }
}

/// How long a run's new events wait to be written with the ones that
/// follow them (what a follower on another process lags at most, beyond
/// the write itself).
const EVENT_LINGER: Duration = Duration::from_millis(5);

/// A followed run's result, from its stored record.
fn result_of(entry: &RunEntry, record: Option<RunRecord>) -> AgentRunResult {
    let Some(record) = record else {
        return AgentRunResult::new(
            &entry.run_id,
            &entry.thread_id,
            TerminationReason::Error("the run's record is unreadable".to_owned()),
        );
    };
    let mut result = AgentRunResult::new(
        &entry.run_id,
        &entry.thread_id,
        record.termination.unwrap_or_else(|| {
            TerminationReason::Error("the run's record has no termination".to_owned())
        }),
    );
    result.response = record.response.unwrap_or_default();
    result.steps = record.steps.unwrap_or_default();
    result.usage = record.usage.unwrap_or_default();
    result.cache_usage = record.cache_usage;
    result.cancel_cause = record.cancel_cause;
    if let Some(report) = record.report {
        result.report = report;
    }
    result
}
