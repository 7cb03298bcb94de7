//! The distributed mode: processes sharing one PostgreSQL database
//! (`rein_postgres::Database`), which is the only truth. Every statement
//! is in `rein-postgres`; this module decides what to run when.
//!
//! - **Submitting** writes a `queued` run before the answer, whichever
//!   process the request reached; a repeated idempotency key finds the
//!   first run through a unique index; AG-UI message ids are checked and
//!   recorded in the submission's own transaction.
//! - **Claiming** ([`claim`]): a thread's work is done by the process
//!   holding its lease, through the thread's **pump**, which claims its
//!   queued runs in order (an `interrupt` one at once), runs them, writes
//!   their events as they come and finishes them — every write fenced.
//! - **Following** ([`follow`]): every read (record, events, SSE, `wait`)
//!   is answered from the database; a run another process runs is copied
//!   into this process's cache, refreshed on `NOTIFY` and by polling.
//! - **Taking over** ([`takeover`]): the heartbeat renews leases; every
//!   process scans for threads with work and no live owner; the first to
//!   take one ends the runs a lost owner left `running` and pumps its
//!   queue. The listener turns notifications into wake-ups and cancels.
//!
//! **Invariant:** a run is started only by a pump whose process holds the
//! thread's lease, and each pump runs one run at a time, so one run per
//! thread holds cluster-wide while leases hold; when they do not (a
//! paused process), the fence refuses the stale process's writes and the
//! process drops what it cached of them.
//!
//! **Invariant:** every path that finishes a run stores its `run_finished`
//! event in the same statement as its record, and a process's cached
//! entry is finished only with the stored events appended.

mod approvals;
mod cancel;
mod claim;
mod follow;
mod listing;
mod takeover;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rein_postgres::{Database, NewRun, SubmitOutcome, WRITE_RETRY, retry};
use rein_runtime::AgentRunResult;
use rein_runtime::auto::{AutoRounds, AutomationPolicy, MetricsReport};
use rein_runtime_contract::event::{AgentEvent, CancelCause};
use rein_runtime_contract::lifecycle::TerminationReason;
use tokio::sync::broadcast;
use tokio_util::task::TaskTracker;

use crate::auto::{AutoRequest, RunMode, StoredAuto, ThreadAuto};
use crate::core::Core;
use rein_runtime::approvals::Decided;
use rein_runtime_contract::approval::{Decision, PendingApproval};

use crate::error::ServiceError;
use crate::listing::{Page, RunFilter, RunSummary, ThreadFilter, ThreadSummary};
use crate::mode::Mode;
use crate::records::{RunEntry, RunStatus, finished_record};
use crate::submission::{Strategy, Submission, Submitted};
use claim::Pump;
use takeover::Elsewhere;

/// How often each process looks for threads with work and no live owner,
/// and for cancel requests it missed (the safety net under NOTIFY).
const SCAN: Duration = Duration::from_millis(250);

/// How often a submission whose AG-UI message ids were recorded
/// concurrently is read and tried again before it is refused.
const MESSAGE_ID_ATTEMPTS: usize = 8;

/// The detail of a run whose process was lost.
pub const LOST_RUN: &str = "the worker running this run was lost (its process stopped renewing the thread's lease); tool calls it left open may or may not have run";

/// The distributed mode.
#[derive(Debug)]
pub(crate) struct Distributed {
    core: Arc<Core>,
    db: Database,
    pumps: Mutex<HashMap<String, Arc<Pump>>>,
    /// Runs whose stored state changed (from `NOTIFY rein_events`).
    changes: broadcast::Sender<Change>,
    drivers: TaskTracker,
    /// Unique per process start: run ids made here are unique across processes.
    tag: String,
    next: AtomicU64,
    /// Threads another live process was found holding.
    elsewhere: Mutex<HashMap<String, Elsewhere>>,
    me: Weak<Distributed>,
}

/// A run's stored state changed: new events, or (`finished`) its record.
#[derive(Debug, Clone)]
struct Change {
    run_id: String,
    finished: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(e: &rein_postgres::Error) -> ServiceError {
    ServiceError::unavailable(e)
}

impl Distributed {
    /// The mode, with its listener, scan and heartbeat started.
    pub(crate) fn start(core: Arc<Core>, db: Database) -> Arc<Self> {
        let mode = Arc::new_cyclic(|me| Self {
            core,
            db,
            pumps: Mutex::default(),
            changes: broadcast::channel(4096).0,
            drivers: TaskTracker::new(),
            tag: process_tag(),
            next: AtomicU64::new(1),
            elsewhere: Mutex::default(),
            me: me.clone(),
        });
        mode.start_loops();
        mode
    }

    fn arc(&self) -> Option<Arc<Self>> {
        self.me.upgrade()
    }

    fn next_run_id(&self) -> String {
        format!(
            "run-{}-{}",
            self.tag,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The submission's messages and the message ids it records, read
    /// against what the thread has seen.
    async fn unseen(
        &self,
        thread_id: &str,
        s: &Submission,
    ) -> Result<(Vec<rein_runtime_contract::message::Message>, Vec<String>), ServiceError> {
        let ids = s.client_ids();
        let seen: HashSet<String> = if ids.is_empty() {
            HashSet::new()
        } else {
            retry(WRITE_RETRY, || {
                self.db.runs().seen_message_ids(thread_id, &ids)
            })
            .await
            .map_err(|e| unavailable(&e))?
            .into_iter()
            .collect()
        };
        Ok(s.unseen(&seen))
    }

    /// Writes the submission; `Ok(None)` when it must be read again (its
    /// message ids were recorded meanwhile, or a made run id was taken).
    async fn write(
        &self,
        thread_id: &str,
        s: &Submission,
        rounds: Option<&AutoRounds>,
    ) -> Result<Option<Submitted>, ServiceError> {
        let (messages, message_ids) = self.unseen(thread_id, s).await?;
        let (_, agent_id) = self
            .core
            .checked_request(thread_id, s.agent_id.as_deref(), messages.clone())
            .await?;
        let run_id = s.run_id.clone().unwrap_or_else(|| self.next_run_id());
        let messages = serde_json::to_value(&messages)
            .map_err(|e| ServiceError::invalid("messages", e.to_string()))?;
        // A next round carries its session; a first one, what the
        // submission named (resolved with the thread's defaults, read in
        // the claim's statement, when it starts).
        let stored = match rounds {
            Some(rounds) => {
                let mut rounds = rounds.clone();
                if rounds.session_id.is_empty() {
                    rounds.session_id = format!("auto-{run_id}");
                }
                Some(StoredAuto::Rounds(rounds))
            }
            None if s.run_mode.is_some() || s.automation_policy.is_some() => {
                Some(StoredAuto::Request {
                    request: AutoRequest {
                        run_mode: s.run_mode,
                        automation_policy: s.automation_policy.clone(),
                    },
                })
            }
            None => None,
        };
        let auto = stored
            .as_ref()
            .map(|a| serde_json::to_value(a).unwrap_or_default());
        let new = NewRun {
            run_id: &run_id,
            thread_id,
            agent_id: &agent_id,
            interrupt: s.strategy == Strategy::Interrupt,
            reject_if_busy: s.strategy == Strategy::Reject,
            idempotency_key: s.idempotency_key.as_deref(),
            messages: &messages,
            message_ids: &message_ids,
            auto: auto.as_ref(),
        };
        match self.db.runs().submit(&new).await {
            Ok(SubmitOutcome::Queued) => {}
            Ok(SubmitOutcome::Duplicate(first)) => {
                let same = retry(WRITE_RETRY, || {
                    self.db
                        .runs()
                        .is_submission(&first, thread_id, &agent_id, &messages)
                })
                .await
                .map_err(|e| unavailable(&e))?;
                if !same {
                    return Err(ServiceError::IdempotencyKeyReused {
                        thread_id: thread_id.to_owned(),
                        key: s.idempotency_key.clone().unwrap_or_default(),
                        run_id: first,
                    });
                }
                return Ok(Some(Submitted::Duplicate(self.entry(&first).await?)));
            }
            Ok(SubmitOutcome::Busy) => {
                return Err(ServiceError::ThreadBusy {
                    thread_id: thread_id.to_owned(),
                });
            }
            // A client chose the id this process made: make another.
            Ok(SubmitOutcome::RunIdTaken) if s.run_id.is_none() => return Ok(None),
            Ok(SubmitOutcome::RunIdTaken) => {
                return Err(ServiceError::RunIdInUse { run_id });
            }
            Ok(SubmitOutcome::MessagesSeen) => return Ok(None),
            Err(e) => return Err(unavailable(&e)),
        }
        self.kick(thread_id, s.strategy == Strategy::Interrupt, false)
            .await;
        // Started here already, or a snapshot: the answer does not follow
        // the run (`Service::live` does, for a caller that waits).
        let entry = self.core.records.get(&run_id).unwrap_or_else(|| {
            let snapshot = RunEntry::new(
                &run_id,
                thread_id,
                &agent_id,
                s.idempotency_key.clone(),
                RunStatus::Queued,
            );
            // What the answer can tell of a session before it starts.
            match &stored {
                Some(StoredAuto::Rounds(rounds)) => snapshot.set_rounds(rounds.clone(), 0),
                Some(StoredAuto::Request { request })
                    if request.run_mode == Some(RunMode::Auto) =>
                {
                    let policy = request.automation_policy.clone().flatten();
                    let rounds = AutoRounds::new(
                        &self.core.runtime,
                        Some(agent_id.as_str()),
                        format!("auto-{run_id}"),
                        policy,
                    );
                    snapshot.set_rounds(rounds, 0);
                }
                _ => {}
            }
            snapshot
        });
        Ok(Some(Submitted::New(entry)))
    }

    /// An auto-mode round's session state as stored with its run, and its
    /// thread's session tokens; `None` for any other run.
    pub(super) async fn stored_round(
        &self,
        run_id: &str,
        thread_id: &str,
    ) -> Option<(AutoRounds, u64)> {
        let stored = self.db.runs().run_auto(run_id).await.ok().flatten()?;
        let StoredAuto::Rounds(rounds) = serde_json::from_value(stored).ok()? else {
            return None;
        };
        let tokens = self
            .db
            .runs()
            .thread_auto(thread_id)
            .await
            .map_or(0, |t| u64::try_from(t.tokens).unwrap_or(0));
        Some((rounds, tokens))
    }

    /// The record part of an auto-mode round that ends without the engine
    /// (`None` for any other run).
    async fn ended_round(
        &self,
        run_id: &str,
        thread_id: &str,
        termination: &TerminationReason,
    ) -> Option<crate::auto::AutoRecord> {
        let (rounds, tokens) = self.stored_round(run_id, thread_id).await?;
        Some(crate::auto::AutoRecord::ended_without_engine(
            &rounds,
            tokens,
            termination,
        ))
    }

    /// Finishes a run that ends without the engine (cancelled while
    /// queued, lost with its process, unable to start): writes its record
    /// and `run_finished` with `write`, then brings this process's entry,
    /// if any, up to the database.
    async fn end_without_engine<F, Fut>(
        &self,
        run: Unstarted<'_>,
        write: F,
    ) -> Result<bool, rein_postgres::Error>
    where
        F: FnOnce(serde_json::Value, rein_postgres::StoredEvent) -> Fut,
        Fut: std::future::Future<Output = Result<bool, rein_postgres::Error>>,
    {
        let (result, mut record, event) = run.ended();
        // An auto-mode round that ends here ends its session.
        let round = self
            .ended_round(run.run_id, run.thread_id, &run.termination)
            .await;
        if let Some(auto) = &round {
            record["auto"] = serde_json::to_value(auto).unwrap_or_default();
        }
        let ended = write(record, event).await?;
        if let Some(entry) = self.core.records.get(run.run_id) {
            entry.take_rounds();
            if let Some(auto) = round {
                entry.set_auto(auto);
            }
            self.settle(&entry, result).await;
        }
        Ok(ended)
    }
}

/// A run that ends without the engine.
struct Unstarted<'a> {
    run_id: &'a str,
    thread_id: &'a str,
    agent_id: &'a str,
    termination: TerminationReason,
    cancel_cause: Option<CancelCause>,
    /// The number its `run_finished` event gets.
    seq: i64,
}

impl Unstarted<'_> {
    /// Its result, record and `run_finished` event.
    fn ended(
        &self,
    ) -> (
        AgentRunResult,
        serde_json::Value,
        rein_postgres::StoredEvent,
    ) {
        let mut result = AgentRunResult::new(self.run_id, self.thread_id, self.termination.clone());
        result.cancel_cause = self.cancel_cause.clone();
        if matches!(&self.termination, TerminationReason::Error(m) if m == LOST_RUN) {
            // Its open tool calls were answered as "may or may not have run".
            result.report.resumable = false;
            result.report.hint = Some(
                "the process running it was lost: check whether the tool calls it left open took effect, then send a new message to the thread"
                    .to_owned(),
            );
        }
        let record = finished_record(self.run_id, self.thread_id, self.agent_id, &result);
        let event = AgentEvent::RunFinished {
            run_id: self.run_id.to_owned(),
            thread_id: self.thread_id.to_owned(),
            termination: self.termination.clone(),
            response: String::new(),
            cancel_cause: self.cancel_cause.clone(),
            steps: 0,
            usage: Default::default(),
            cache_usage: None,
            outputs: Default::default(),
            report: Some(result.report.clone()),
        };
        let event = rein_postgres::StoredEvent {
            seq: self.seq,
            kind: event.kind().to_owned(),
            data: serde_json::to_string(&event).unwrap_or_default(),
        };
        (
            result,
            serde_json::to_value(record).unwrap_or_default(),
            event,
        )
    }
}

/// A tag unique to this process start (run ids made here are unique).
fn process_tag() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    format!("{:08x}", hasher.finish() as u32)
}

#[async_trait::async_trait]
impl Mode for Distributed {
    async fn submit(
        &self,
        thread_id: &str,
        s: Submission,
        rounds: Option<AutoRounds>,
    ) -> Result<Submitted, ServiceError> {
        for _ in 0..MESSAGE_ID_ATTEMPTS {
            if let Some(submitted) = self.write(thread_id, &s, rounds.as_ref()).await? {
                return Ok(submitted);
            }
        }
        Err(ServiceError::StoreUnavailable {
            detail: format!(
                "thread \"{thread_id}\" kept receiving the same messages from other submissions; retry"
            ),
        })
    }

    async fn run(&self, run_id: &str) -> Result<Arc<RunEntry>, ServiceError> {
        self.entry(run_id).await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<bool, ServiceError> {
        self.cancel(run_id).await
    }

    async fn cancel_tool_call_elsewhere(
        &self,
        run_id: &str,
        call_id: &str,
    ) -> Result<bool, ServiceError> {
        let status = self
            .db
            .runs()
            .request_tool_call_cancel(run_id, call_id)
            .await
            .map_err(|e| unavailable(&e))?;
        match status.as_deref() {
            Some("running") => Ok(false),
            Some(status) => Err(ServiceError::RunNotRunning {
                run_id: run_id.to_owned(),
                status: if status == "queued" {
                    RunStatus::Queued
                } else {
                    RunStatus::Finished
                },
            }),
            None => Err(ServiceError::unknown_run(run_id)),
        }
    }

    async fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ServiceError> {
        self.decide_anywhere(run_id, call_id, decision, by).await
    }

    async fn pending_approvals(
        &self,
        thread_id: Option<&str>,
    ) -> Result<Vec<PendingApproval>, ServiceError> {
        self.stored_pending(thread_id).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Page<RunSummary>, ServiceError> {
        self.stored_runs(filter).await
    }

    async fn list_threads(
        &self,
        filter: &ThreadFilter,
    ) -> Result<Page<ThreadSummary>, ServiceError> {
        self.stored_threads(filter).await
    }

    async fn cancel_thread(&self, thread_id: &str) -> (bool, bool) {
        if self.core.runtime.is_thread_active(thread_id) {
            let runtime = &self.core.runtime;
            let released = runtime.cancel_and_wait_by_thread(thread_id).await;
            return (true, released || !runtime.is_thread_active(thread_id));
        }
        self.cancel_thread_elsewhere(thread_id).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), ServiceError> {
        self.delete(thread_id).await
    }

    async fn remember_message_ids(
        &self,
        thread_id: &str,
        ids: Vec<String>,
    ) -> Result<(), ServiceError> {
        if ids.is_empty() {
            return Ok(());
        }
        retry(WRITE_RETRY, || {
            self.db.runs().remember_message_ids(thread_id, &ids)
        })
        .await
        .map_err(|e| unavailable(&e))
    }

    fn resolves_at_start(&self) -> bool {
        true
    }

    async fn submit_round(
        &self,
        thread_id: &str,
        s: Submission,
        mut rounds: AutoRounds,
        after: &str,
    ) -> Result<Option<Submitted>, ServiceError> {
        let run_id = self.next_run_id();
        if rounds.session_id.is_empty() {
            rounds.session_id = format!("auto-{run_id}");
        }
        let agent_id = s.agent_id.clone().unwrap_or_default();
        let messages = serde_json::to_value(&s.messages)
            .map_err(|e| ServiceError::invalid("messages", e.to_string()))?;
        let auto = serde_json::to_value(StoredAuto::Rounds(rounds.clone()))
            .map_err(|e| ServiceError::invalid("auto", e.to_string()))?;
        // Not retried: a lost answer's retry would find its own row taken.
        let queued = self
            .db
            .runs()
            .submit_next_round(thread_id, after, &run_id, &agent_id, &messages, &auto)
            .await
            .map_err(|e| unavailable(&e))?;
        if !queued {
            return Ok(None);
        }
        let entry = RunEntry::new(&run_id, thread_id, &agent_id, None, RunStatus::Queued);
        entry.set_rounds(rounds, 0);
        Ok(Some(Submitted::New(entry)))
    }

    async fn thread_auto(&self, thread_id: &str) -> Result<ThreadAuto, ServiceError> {
        let stored = retry(WRITE_RETRY, || self.db.runs().thread_auto(thread_id))
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(thread_auto(stored))
    }

    async fn set_auto_defaults(
        &self,
        thread_id: &str,
        run_mode: Option<RunMode>,
        policy: Option<Option<AutomationPolicy>>,
    ) -> Result<(), ServiceError> {
        let mode = run_mode.map(RunMode::as_str);
        let policy = policy.map(|p| p.map(|p| serde_json::to_value(p).unwrap_or_default()));
        retry(WRITE_RETRY, || {
            self.db
                .runs()
                .set_auto_defaults(thread_id, mode, policy.as_ref().map(Option::as_ref))
        })
        .await
        .map_err(|e| unavailable(&e))
    }

    async fn add_to_session(
        &self,
        thread_id: &str,
        tokens: u64,
        reports: &[MetricsReport],
    ) -> Result<ThreadAuto, ServiceError> {
        let reports = serde_json::to_value(reports).unwrap_or_default();
        // Not retried: a retry after a lost answer would count twice.
        let stored = self
            .db
            .runs()
            .add_to_session(
                thread_id,
                i64::try_from(tokens).unwrap_or(i64::MAX),
                &reports,
            )
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(thread_auto(stored))
    }

    async fn reset_session(&self, thread_id: &str) -> Result<(), ServiceError> {
        retry(WRITE_RETRY, || self.db.runs().reset_session(thread_id))
            .await
            .map_err(|e| unavailable(&e))
    }

    async fn health(&self) -> Result<(), ServiceError> {
        self.db.ping().await.map_err(|e| unavailable(&e))
    }

    fn takeovers(&self) -> u64 {
        self.db.takeovers()
    }

    async fn shutdown(&self) {
        self.core.runtime.shutdown().await;
        // Lets the runs started here write their records (the engine has
        // cancelled them), then gives every thread up; queued runs stay
        // queued for the other processes.
        self.drivers.close();
        if tokio::time::timeout(self.core.cancel_wait(), self.drivers.wait())
            .await
            .is_err()
        {
            tracing::warn!("some run records were not stored before shutdown");
        }
        for thread_id in self.db.leases().held() {
            self.db.release(&thread_id).await;
        }
    }
}

/// The thread's auto-mode row as a claim reads it (`run_mode`, `policy`,
/// `policy_set`, `tokens`; none when the thread has no row).
pub(super) fn claimed_thread_auto(value: Option<&serde_json::Value>) -> ThreadAuto {
    let Some(v) = value else {
        return ThreadAuto::default();
    };
    thread_auto(rein_postgres::StoredThreadAuto {
        run_mode: v["run_mode"].as_str().map(str::to_owned),
        policy: v.get("policy").filter(|p| !p.is_null()).cloned(),
        policy_set: v["policy_set"].as_bool().unwrap_or(false),
        tokens: v["tokens"].as_i64().unwrap_or(0),
        reports: serde_json::Value::Array(Vec::new()),
    })
}

/// A thread's auto-mode row as the service reads it (a value this version
/// cannot read counts as unset).
fn thread_auto(stored: rein_postgres::StoredThreadAuto) -> ThreadAuto {
    ThreadAuto {
        run_mode: stored
            .run_mode
            .as_deref()
            .and_then(|m| RunMode::parse("run_mode", m).ok()),
        policy: if stored.policy_set {
            match stored.policy {
                None => Some(None),
                Some(p) => serde_json::from_value::<AutomationPolicy>(p)
                    .ok()
                    .map(|p| Some(p).filter(|p| !p.is_empty())),
            }
        } else {
            None
        },
        tokens_used_session: u64::try_from(stored.tokens).unwrap_or(0),
        reports: serde_json::from_value(stored.reports).unwrap_or_default(),
    }
}
