//! Run records and their event logs, kept for a bounded time and count.
//!
//! Every run the service accepts has a [`RunEntry`]: its status, its
//! result once finished, and every event it emitted, each with a per-run
//! sequence number (from 1) — what `GET /v1/runs/{id}` and its SSE stream
//! serve. A run's events are serialized once, when emitted.
//!
//! **Invariant:** a run's `run_finished` event is in its log before its
//! status is `finished`, so a reader that sees `finished` and has read the
//! whole log has read `run_finished`.
//!
//! Retention: finished entries are dropped oldest first beyond
//! `max_finished_runs`, and after `finished_run_ttl_seconds`; active and
//! queued ones are never dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rein_runtime::AgentRunResult;
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::approval::PendingApproval;
use rein_runtime_contract::event::{AgentEvent, CancelCause, EventSink};
use rein_runtime_contract::lifecycle::{StopReport, TerminationReason};
use rein_runtime_contract::message::{CacheUsage, TokenUsage};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use crate::settings::Retention;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Waiting behind the thread's active run (`enqueue`).
    Queued,
    /// Holding the thread.
    Running,
    /// Parked: waiting for decisions on `pending_approvals`.
    AwaitingApproval,
    /// Ended; the record has its result.
    Finished,
}

impl RunStatus {
    /// The status as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Finished => "finished",
        }
    }

    /// The status a JSON name names (`queued`, `running`,
    /// `awaiting_approval`, `finished`).
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Queued,
            Self::Running,
            Self::AwaitingApproval,
            Self::Finished,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// The run record's JSON (`GET /v1/runs/{run_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunRecord {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Where it is.
    pub status: RunStatus,
    /// Why it ended (`TerminationReason`'s serde shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination: Option<TerminationReason>,
    /// The last answer's text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Inferences made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Token usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
    /// Prompt-cache usage, when a provider reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_usage: Option<CacheUsage>,
    /// Who cancelled it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_cause: Option<CancelCause>,
    /// How it ended and how to go on (limits used, tool calls that did not
    /// complete, whether the thread can be resumed safely, a hint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<StopReport>,
    /// For a sub-agent's run: the run whose tool call started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// For a sub-agent's run: that tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_call_id: Option<String>,
    /// The sub-agent runs this run started, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// While `awaiting_approval`: the calls it waits on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<PendingApproval>,
    /// The decisions taken on its calls (and escalations), in order: who
    /// decided and when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<DecisionRecord>,
    /// For an auto-mode round: its session, the session's tokens, and
    /// what its end decided (`crate::auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<crate::auto::AutoRecord>,
}

/// A decision taken on one of a run's pending calls, from its
/// `approval_decided` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct DecisionRecord {
    /// The decided call.
    pub call_id: String,
    /// `approve`, `reject`, `edit`, `respond`, `continue`, `stop`,
    /// `take_over`, or `timeout`.
    pub decision: String,
    /// Who decided: the API token's name, `rein run`; absent when not
    /// known (no auth) or for a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// When (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
}

/// One event of a run's log: the event itself (what AG-UI translates)
/// and its JSON (what SSE and the database carry), each made at most once.
#[derive(Debug)]
pub struct LoggedEvent {
    /// Its sequence number in the run (from 1).
    pub seq: u64,
    /// The event's type (`run_started`, …).
    pub kind: &'static str,
    event: Option<AgentEvent>,
    json: OnceLock<String>,
}

impl LoggedEvent {
    fn emitted(seq: u64, event: AgentEvent) -> Self {
        Self {
            seq,
            kind: event.kind(),
            event: Some(event),
            json: OnceLock::new(),
        }
    }

    /// An event read back from the database: its JSON as stored, parsed
    /// once (`None` for a type this version does not know).
    pub(crate) fn stored(seq: u64, kind: &str, json: String) -> Self {
        Self {
            seq,
            kind: intern(kind),
            event: serde_json::from_str(&json).ok(),
            json: OnceLock::from(json),
        }
    }

    /// The event (`None` only for a stored event of a type this version
    /// does not know).
    pub fn event(&self) -> Option<&AgentEvent> {
        self.event.as_ref()
    }

    /// The event as JSON, serialized on first use.
    pub fn json(&self) -> &str {
        self.json.get_or_init(|| {
            self.event
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok())
                .unwrap_or_default()
        })
    }
}

/// One event of a thread's live tail.
#[derive(Debug, Clone)]
pub struct ThreadEvent {
    /// Its sequence number on the thread (from 1; unique per thread while
    /// the service runs).
    pub seq: u64,
    /// The event's type.
    pub kind: &'static str,
    /// The event as JSON (shared with the run's log).
    pub json: Arc<LoggedEvent>,
}

/// What a client did to a run that its end must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Superseded {
    /// Cancelled, or interrupted by new input.
    Cancelled = 1,
    /// Its thread was deleted (or reset with `/new`).
    Dropped = 2,
}

/// A run's record and event log.
#[derive(Debug)]
pub struct RunEntry {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// The idempotency key it was submitted with.
    pub idempotency_key: Option<String>,
    /// The run's parent token: cancelling it cancels the run, also before
    /// it started.
    cancellation: CancellationToken,
    state: Mutex<EntryState>,
    /// The number of logged events, bumped on every append and on finish.
    changed: watch::Sender<u64>,
    /// Whether this process runs it (in distributed mode, a run another
    /// process runs is followed from the database instead).
    driven_here: std::sync::atomic::AtomicBool,
    /// Whether a follower copies it from the database.
    followed: std::sync::atomic::AtomicBool,
    /// What a client did to it that its end must respect (an auto-mode
    /// round then starts no next round): [`Superseded`] as a number.
    superseded: std::sync::atomic::AtomicU8,
    /// When this process made the entry (a run's log line says how long
    /// it ran here).
    born: std::time::Instant,
    /// When it was submitted, in microseconds since the Unix epoch (what
    /// listings order by).
    created_us: u64,
}

#[derive(Debug)]
struct EntryState {
    status: RunStatus,
    result: Option<AgentRunResult>,
    events: Vec<Arc<LoggedEvent>>,
    /// The sub-agent runs it started.
    children: Vec<String>,
    /// For a sub-agent's run: its parent run and the parent's tool call.
    parent: Option<(String, String)>,
    /// The calls it waits on while parked.
    pending: Vec<PendingApproval>,
    /// The decisions taken on its calls.
    decisions: Vec<DecisionRecord>,
    /// When it finished, in microseconds since the Unix epoch.
    finished_us: Option<u64>,
    /// For an auto-mode round: its session's state, until its end decides.
    rounds: Option<rein_runtime::auto::AutoRounds>,
    /// For an auto-mode round: its part of the record.
    auto: Option<crate::auto::AutoRecord>,
}

impl RunEntry {
    /// A new entry; one no record keeps is a snapshot (the answer to a
    /// submission another process will run).
    pub(crate) fn new(
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
        idempotency_key: Option<String>,
        status: RunStatus,
    ) -> Arc<Self> {
        Arc::new(Self {
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            agent_id: agent_id.to_owned(),
            idempotency_key,
            cancellation: CancellationToken::new(),
            state: Mutex::new(EntryState {
                status,
                result: None,
                events: Vec::new(),
                children: Vec::new(),
                parent: None,
                pending: Vec::new(),
                decisions: Vec::new(),
                finished_us: None,
                rounds: None,
                auto: None,
            }),
            changed: watch::channel(0).0,
            driven_here: std::sync::atomic::AtomicBool::new(false),
            followed: std::sync::atomic::AtomicBool::new(false),
            superseded: std::sync::atomic::AtomicU8::new(0),
            born: std::time::Instant::now(),
            created_us: crate::listing::now_us(),
        })
    }

    /// When it was submitted, in microseconds since the Unix epoch.
    pub(crate) fn created_us(&self) -> u64 {
        self.created_us
    }

    /// For a sub-agent's run: its parent run and the parent's tool call.
    pub(crate) fn parent(&self) -> Option<(String, String)> {
        self.state().parent.clone()
    }

    /// Takes the tree links (and an auto-mode round's part) of a stored
    /// record (a run followed from the database).
    pub(crate) fn set_links(&self, record: &RunRecord) {
        let mut state = self.state();
        if let (Some(run), Some(call)) = (&record.parent_run_id, &record.parent_call_id) {
            state.parent = Some((run.clone(), call.clone()));
        }
        state.children.clone_from(&record.children);
        if record.auto.is_some() {
            state.auto.clone_from(&record.auto);
        }
    }

    /// The sub-agent runs this run started, in order.
    pub(crate) fn children(&self) -> Vec<String> {
        self.state().children.clone()
    }

    /// Notes a sub-agent run this run started.
    pub(crate) fn add_child(&self, run_id: &str) {
        self.state().children.push(run_id.to_owned());
    }

    fn state(&self) -> MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that a client cancelled or interrupted the run, or dropped
    /// its thread (the stronger mark stays).
    pub(crate) fn supersede(&self, how: Superseded) {
        self.superseded
            .fetch_max(how as u8, std::sync::atomic::Ordering::SeqCst);
    }

    /// What a client did to the run, if anything.
    pub(crate) fn superseded(&self) -> Option<Superseded> {
        match self.superseded.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            1 => Some(Superseded::Cancelled),
            _ => Some(Superseded::Dropped),
        }
    }

    /// Whether the run is an auto-mode round whose end is not decided yet.
    pub(crate) fn is_round(&self) -> bool {
        self.state().rounds.is_some()
    }

    /// Makes the run a round of an auto-mode session, whose thread has
    /// used `tokens_used_session` so far.
    pub(crate) fn set_rounds(
        &self,
        rounds: rein_runtime::auto::AutoRounds,
        tokens_used_session: u64,
    ) {
        let mut state = self.state();
        state.auto = Some(crate::auto::AutoRecord::running(
            &rounds,
            tokens_used_session,
        ));
        state.rounds = Some(rounds);
    }

    /// The session's state, for a round whose end has not been decided
    /// (taken: a round ends once).
    pub(crate) fn take_rounds(&self) -> Option<rein_runtime::auto::AutoRounds> {
        self.state().rounds.take()
    }

    /// The round's part of the record, as its end decided.
    pub(crate) fn set_auto(&self, record: crate::auto::AutoRecord) {
        self.state().auto = Some(record);
    }

    /// The round's part of the record, if the run is a round.
    pub(crate) fn auto(&self) -> Option<crate::auto::AutoRecord> {
        self.state().auto.clone()
    }

    /// For an auto-mode round: its session's id (cheaper than the record).
    pub fn auto_session(&self) -> Option<String> {
        self.state().auto.as_ref().map(|a| a.session_id.clone())
    }

    /// The record as served.
    pub fn record(&self) -> RunRecord {
        let state = self.state();
        let mut record = match &state.result {
            Some(result) => finished_record(&self.run_id, &self.thread_id, &self.agent_id, result),
            None => RunRecord {
                run_id: self.run_id.clone(),
                thread_id: self.thread_id.clone(),
                agent_id: self.agent_id.clone(),
                status: state.status,
                termination: None,
                response: None,
                steps: None,
                usage: None,
                cache_usage: None,
                cancel_cause: None,
                report: None,
                parent_run_id: None,
                parent_call_id: None,
                children: Vec::new(),
                pending_approvals: state.pending.clone(),
                decisions: Vec::new(),
                auto: None,
            },
        };
        record.decisions.clone_from(&state.decisions);
        if let Some((run, call)) = &state.parent {
            record.parent_run_id = Some(run.clone());
            record.parent_call_id = Some(call.clone());
        }
        record.children.clone_from(&state.children);
        record.auto.clone_from(&state.auto);
        record
    }

    /// What a listing shows of it, read under one lock, without building
    /// its record (no answer or report copied).
    pub(crate) fn listed(&self) -> crate::listing::RunSummary {
        use crate::listing::us_rfc3339;
        let state = self.state();
        let result = state.result.as_ref();
        crate::listing::RunSummary {
            run_id: self.run_id.clone(),
            thread_id: self.thread_id.clone(),
            agent_id: self.agent_id.clone(),
            status: if result.is_some() {
                RunStatus::Finished
            } else {
                state.status
            },
            termination: result.map(|r| r.termination.code().to_owned()),
            parent_run_id: state.parent.as_ref().map(|(run, _)| run.clone()),
            created_at: us_rfc3339(self.created_us),
            finished_at: state.finished_us.map(us_rfc3339),
            steps: result.map(|r| r.steps),
            usage: result.map(|r| r.usage),
        }
    }

    /// The decisions taken on its calls so far.
    pub(crate) fn decisions(&self) -> Vec<DecisionRecord> {
        self.state().decisions.clone()
    }

    /// The run's parent token.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// Where the run is.
    pub fn status(&self) -> RunStatus {
        self.state().status
    }

    /// The logged events after `after` (a sequence number), and whether
    /// the log is complete (the run finished and these are the last).
    pub fn events_after(&self, after: u64) -> (Vec<Arc<LoggedEvent>>, bool) {
        let state = self.state();
        let from = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(state.events.len());
        (
            state.events[from..].to_vec(),
            state.status == RunStatus::Finished,
        )
    }

    /// A receiver that changes whenever the log grows or the run finishes.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits until the run has finished; returns its record.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping it loses nothing.
    pub async fn finished(&self) -> RunRecord {
        let mut changes = self.watch();
        loop {
            if self.status() == RunStatus::Finished {
                return self.record();
            }
            if changes.changed().await.is_err() {
                return self.record();
            }
        }
    }

    /// Whether this process runs it.
    pub fn driven_here(&self) -> bool {
        self.driven_here.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a follower copies it from the database.
    pub(crate) fn followed(&self) -> bool {
        self.followed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks it followed; `true` for the first caller only.
    pub(crate) fn start_following(&self) -> bool {
        !self
            .followed
            .swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    /// How many events are logged.
    pub fn logged(&self) -> u64 {
        self.state().events.len() as u64
    }

    /// No longer run here (it parked and let go of its task).
    pub(crate) fn clear_driven_here(&self) {
        self.driven_here
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn set_driven_here(&self) {
        self.driven_here
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Appends an event read from the database, unless the log has it
    /// already (events arrive in order; `seq` is the next one or a repeat).
    pub(crate) fn append_stored(&self, seq: u64, kind: &str, json: String) {
        let mut state = self.state();
        if seq != state.events.len() as u64 + 1 {
            return;
        }
        let logged = Arc::new(LoggedEvent::stored(seq, kind, json));
        if let Some(event) = logged.event() {
            track_approvals(&mut state, event);
        }
        state.events.push(logged);
        let count = state.events.len() as u64;
        drop(state);
        self.changed.send_replace(count);
    }

    /// Marks it finished with `result`; `false` if it was already.
    fn close(&self, result: AgentRunResult) -> bool {
        {
            let mut state = self.state();
            if state.status == RunStatus::Finished {
                return false;
            }
            state.status = RunStatus::Finished;
            state.result = Some(result);
            state.finished_us = Some(crate::listing::now_us());
        }
        self.changed.send_modify(|_| {});
        true
    }

    pub(crate) fn set_running(&self) {
        let mut state = self.state();
        state.status = if state.pending.is_empty() {
            RunStatus::Running
        } else {
            RunStatus::AwaitingApproval
        };
        drop(state);
        self.changed.send_modify(|_| {});
    }

    fn append(&self, event: AgentEvent) -> Arc<LoggedEvent> {
        let mut state = self.state();
        track_approvals(&mut state, &event);
        let logged = Arc::new(LoggedEvent::emitted(state.events.len() as u64 + 1, event));
        state.events.push(logged.clone());
        let count = state.events.len() as u64;
        drop(state);
        self.changed.send_replace(count);
        logged
    }
}

/// Every run record, the threads' live tails, and retention.
#[derive(Debug)]
pub(crate) struct Records {
    retention: Retention,
    inner: Mutex<Inner>,
    /// Where every run's events are also written (`rein serve --record`).
    pub(crate) recorder: std::sync::OnceLock<Recorder>,
    /// What the runs did, counted from their events.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
}

/// The sink that records every run's events.
#[derive(Clone)]
pub(crate) struct Recorder(pub(crate) Arc<dyn EventSink>);

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

#[derive(Debug, Default)]
struct Inner {
    runs: HashMap<String, Arc<RunEntry>>,
    /// Finished runs, oldest first, with when they finished.
    finished: VecDeque<(Instant, String)>,
    tails: HashMap<String, Arc<ThreadTail>>,
}

/// A thread's live tail: a broadcast of its runs' events. The channel
/// (1024 events of lag) exists only while someone listens, so a thread
/// nobody watches costs a few bytes.
#[derive(Debug, Default)]
pub struct ThreadTail {
    inner: Mutex<TailInner>,
}

#[derive(Debug, Default)]
struct TailInner {
    next: u64,
    sender: Option<broadcast::Sender<ThreadEvent>>,
}

impl ThreadTail {
    /// A receiver of the events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ThreadEvent> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .sender
            .get_or_insert_with(|| broadcast::channel(1024).0)
            .subscribe()
    }

    fn send(&self, logged: Arc<LoggedEvent>) {
        // The lock orders the sends, so ids arrive in order.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.next += 1;
        let seq = inner.next;
        if let Some(sender) = &inner.sender {
            if sender.receiver_count() == 0 {
                inner.sender = None;
            } else {
                let _ = sender.send(ThreadEvent {
                    seq,
                    kind: logged.kind,
                    json: logged,
                });
            }
        }
    }
}

impl Records {
    /// No records yet.
    pub(crate) fn new(retention: Retention) -> Self {
        Self {
            retention,
            inner: Mutex::new(Inner::default()),
            recorder: std::sync::OnceLock::new(),
            metrics: Arc::default(),
        }
    }

    /// How many kept runs are queued, and how many run here now.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let inner = self.inner();
        let mut counts = (0, 0);
        for entry in inner.runs.values() {
            match entry.status() {
                RunStatus::Queued => counts.0 += 1,
                RunStatus::Running if entry.driven_here() || !entry.followed() => counts.1 += 1,
                _ => {}
            }
        }
        counts
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's entry, made (with `status`) if it is not kept.
    pub(crate) fn get_or_create(
        &self,
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
        idempotency_key: Option<String>,
        status: RunStatus,
    ) -> Arc<RunEntry> {
        self.inner()
            .runs
            .entry(run_id.to_owned())
            .or_insert_with(|| RunEntry::new(run_id, thread_id, agent_id, idempotency_key, status))
            .clone()
    }

    /// A new running entry for a sub-agent's run started by `parent`'s
    /// tool call `call_id`; `None` if the id is taken.
    pub(crate) fn create_child(
        &self,
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
        parent: (&str, &str),
    ) -> Option<Arc<RunEntry>> {
        let mut inner = self.inner();
        if inner.runs.contains_key(run_id) {
            return None;
        }
        let entry = RunEntry::new(run_id, thread_id, agent_id, None, RunStatus::Running);
        entry.state().parent = Some((parent.0.to_owned(), parent.1.to_owned()));
        entry.set_driven_here();
        inner.runs.insert(run_id.to_owned(), entry.clone());
        Some(entry)
    }

    /// A new entry (queued or running); `None` if the id is taken.
    pub(crate) fn create(
        &self,
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
        idempotency_key: Option<String>,
        status: RunStatus,
    ) -> Option<Arc<RunEntry>> {
        let mut inner = self.inner();
        if inner.runs.contains_key(run_id) {
            return None;
        }
        let entry = RunEntry::new(run_id, thread_id, agent_id, idempotency_key, status);
        inner.runs.insert(run_id.to_owned(), entry.clone());
        Some(entry)
    }

    /// Writes every run's events to `recorder` too (set once).
    pub(crate) fn set_recorder(&self, recorder: Arc<dyn EventSink>) {
        let _ = self.recorder.set(Recorder(recorder));
    }

    /// Drops an entry whose run never started (its submission failed).
    pub(crate) fn discard(&self, run_id: &str) {
        self.inner().runs.remove(run_id);
    }

    /// Drops `entry` from the kept runs (it is read from the database
    /// from now on); `true` if a reader watches it (a stream).
    pub(crate) fn forget(&self, entry: &Arc<RunEntry>) -> bool {
        let mut inner = self.inner();
        if inner
            .runs
            .get(&entry.run_id)
            .is_some_and(|kept| Arc::ptr_eq(kept, entry))
        {
            inner.runs.remove(&entry.run_id);
        }
        entry.changed.receiver_count() > 0
    }

    /// Every kept entry.
    pub(crate) fn entries(&self) -> Vec<Arc<RunEntry>> {
        self.inner().runs.values().cloned().collect()
    }

    /// The entry of a run, if it is kept.
    pub(crate) fn get(&self, run_id: &str) -> Option<Arc<RunEntry>> {
        self.inner().runs.get(run_id).cloned()
    }

    /// The live tail of a thread (created on first use).
    pub(crate) fn tail(&self, thread_id: &str) -> Arc<ThreadTail> {
        self.inner()
            .tails
            .entry(thread_id.to_owned())
            .or_default()
            .clone()
    }

    /// The sink that logs a run's events and sends them to its thread's
    /// tail; the events of its sub-agents' runs also make and feed their
    /// own entries ([`crate::subagents`]).
    pub(crate) fn sink(self: &Arc<Self>, entry: &Arc<RunEntry>) -> Arc<dyn EventSink> {
        self.sink_with(entry, None)
    }

    /// [`sink`](Self::sink), telling `on_child` of each sub-agent run's
    /// new entry.
    pub(crate) fn sink_with(
        self: &Arc<Self>,
        entry: &Arc<RunEntry>,
        on_child: Option<crate::subagents::ChildHook>,
    ) -> Arc<dyn EventSink> {
        Arc::new(RunSink {
            entry: entry.clone(),
            tail: self.tail(&entry.thread_id),
            recorder: self.recorder.get().map(|r| r.0.clone()),
            tree: crate::subagents::Tree::new(self.clone(), on_child),
            metrics: self.metrics.clone(),
            timing: Mutex::default(),
        })
    }

    /// Drops the entry (this process's log of it is not the run's truth)
    /// and ends it for those holding it.
    pub(crate) fn finish_discarded(&self, entry: &RunEntry, result: AgentRunResult) {
        {
            let mut inner = self.inner();
            if inner
                .runs
                .get(&entry.run_id)
                .is_some_and(|kept| std::ptr::eq(kept.as_ref(), entry))
            {
                inner.runs.remove(&entry.run_id);
            }
        }
        entry.close(result);
    }

    /// Marks a run finished with its result (once; later calls do
    /// nothing); applies retention. Returns the idempotency keys (thread,
    /// key) of the entries dropped.
    pub(crate) fn finish(&self, entry: &RunEntry, result: AgentRunResult) -> Vec<(String, String)> {
        if !entry.close(result) {
            return Vec::new();
        }
        let mut inner = self.inner();
        inner
            .finished
            .push_back((Instant::now(), entry.run_id.clone()));
        let dropped = self.evict(&mut inner, Instant::now());
        Self::tidy_tail(&mut inner, &entry.thread_id);
        dropped
    }

    /// Marks a sub-agent's run finished; retention counts it like any
    /// run, applied at the next finish or sweep (whose dropped keys the
    /// mode forgets).
    pub(crate) fn finish_child(&self, entry: &RunEntry, result: AgentRunResult) {
        if entry.close(result) {
            let mut inner = self.inner();
            inner
                .finished
                .push_back((Instant::now(), entry.run_id.clone()));
            Self::tidy_tail(&mut inner, &entry.thread_id);
        }
    }

    /// Sends an event that belongs to no run (auto mode's progress) to the
    /// thread's live tail.
    pub(crate) fn send_to_tail(&self, thread_id: &str, event: AgentEvent) {
        let tail = self.tail(thread_id);
        tail.send(Arc::new(LoggedEvent::emitted(0, event)));
        drop(tail);
        self.release_tail(thread_id);
    }

    /// Drops a thread's tail that nobody holds (no run's sink, no
    /// listener): the next user makes a new one.
    fn tidy_tail(inner: &mut Inner, thread_id: &str) {
        if inner
            .tails
            .get(thread_id)
            .is_some_and(|tail| Arc::strong_count(tail) == 1)
        {
            inner.tails.remove(thread_id);
        }
    }

    /// Drops the thread's tail if nobody holds it (a listener left).
    pub(crate) fn release_tail(&self, thread_id: &str) {
        Self::tidy_tail(&mut self.inner(), thread_id);
    }

    /// A run that never started (cancelled while queued, or its start
    /// failed) gets a `run_finished` event and a result.
    pub(crate) fn finish_unstarted(
        &self,
        entry: &RunEntry,
        termination: TerminationReason,
        cancel_cause: Option<CancelCause>,
    ) -> Vec<(String, String)> {
        let event = AgentEvent::RunFinished {
            run_id: entry.run_id.clone(),
            thread_id: entry.thread_id.clone(),
            termination: termination.clone(),
            response: String::new(),
            cancel_cause: cancel_cause.clone(),
            steps: 0,
            usage: Default::default(),
            cache_usage: None,
            outputs: Default::default(),
            report: Some(StopReport::new(&termination)),
        };
        // An auto-mode round that never ran ends its session.
        if let Some(rounds) = entry.take_rounds() {
            let tokens = entry.auto().map_or(0, |a| a.tokens_used_session);
            entry.set_auto(crate::auto::AutoRecord::ended_without_engine(
                &rounds,
                tokens,
                &termination,
            ));
        }
        log_run(entry, &event, false);
        self.metrics.record(&event);
        let logged = entry.append(event);
        self.tail(&entry.thread_id).send(logged);
        let result = unstarted_result(entry, termination, cancel_cause);
        self.finish(entry, result)
    }

    /// Applies retention now (also run periodically).
    pub(crate) fn sweep(&self) -> Vec<(String, String)> {
        let mut inner = self.inner();
        self.evict(&mut inner, Instant::now())
    }

    /// How many records are kept (finished or not).
    pub(crate) fn len(&self) -> usize {
        self.inner().runs.len()
    }

    fn evict(&self, inner: &mut Inner, now: Instant) -> Vec<(String, String)> {
        let ttl = Duration::from_secs(self.retention.finished_run_ttl_seconds);
        let mut dropped = Vec::new();
        while let Some((at, _)) = inner.finished.front() {
            let expired = now.saturating_duration_since(*at) >= ttl;
            if inner.finished.len() <= self.retention.max_finished_runs && !expired {
                break;
            }
            let Some((_, run_id)) = inner.finished.pop_front() else {
                break;
            };
            if let Some(entry) = inner.runs.remove(&run_id)
                && let Some(key) = &entry.idempotency_key
            {
                dropped.push((entry.thread_id.clone(), key.clone()));
            }
        }
        dropped
    }
}

/// The `&'static` name of an event type read back from the store (the
/// engine's types are a small fixed set; each new name is kept once).
fn intern(kind: &str) -> &'static str {
    static KINDS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut kinds = KINDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(known) = kinds.iter().find(|k| **k == kind) {
        return known;
    }
    let leaked: &'static str = Box::leak(kind.to_owned().into_boxed_str());
    kinds.push(leaked);
    leaked
}

/// The record of a finished run.
pub(crate) fn finished_record(
    run_id: &str,
    thread_id: &str,
    agent_id: &str,
    result: &AgentRunResult,
) -> RunRecord {
    RunRecord {
        run_id: run_id.to_owned(),
        thread_id: thread_id.to_owned(),
        agent_id: agent_id.to_owned(),
        status: RunStatus::Finished,
        termination: Some(result.termination.clone()),
        response: Some(result.response.clone()),
        steps: Some(result.steps),
        usage: Some(result.usage),
        cache_usage: result.cache_usage,
        cancel_cause: result.cancel_cause.clone(),
        report: Some(result.report.clone()),
        parent_run_id: None,
        parent_call_id: None,
        children: Vec::new(),
        pending_approvals: Vec::new(),
        decisions: Vec::new(),
        auto: None,
    }
}

fn unstarted_result(
    entry: &RunEntry,
    termination: TerminationReason,
    cancel_cause: Option<CancelCause>,
) -> AgentRunResult {
    let mut result = AgentRunResult::new(&entry.run_id, &entry.thread_id, termination);
    result.cancel_cause = cancel_cause;
    result
}

/// Logs a run's events and sends them to its thread's tail.
struct RunSink {
    entry: Arc<RunEntry>,
    tail: Arc<ThreadTail>,
    recorder: Option<Arc<dyn EventSink>>,
    tree: crate::subagents::Tree,
    metrics: Arc<crate::metrics::Metrics>,
    timing: Mutex<Timing>,
}

/// When the inferences and tool calls in flight in a run's tree began.
#[derive(Default)]
struct Timing {
    /// By run: the round whose model request is in flight.
    rounds: HashMap<String, Instant>,
    /// By call id.
    calls: HashMap<String, Instant>,
}

impl RunSink {
    /// Times inferences (a round's start to the first event after its
    /// streamed answer) and tool calls (start to result).
    fn time(&self, event: &AgentEvent) {
        // The streamed text (most events) and what happens before a
        // request is sent neither start nor end anything.
        if matches!(
            event,
            AgentEvent::TextDelta { .. }
                | AgentEvent::PromptEstimated { .. }
                | AgentEvent::RateLimited { .. }
                | AgentEvent::Progress { .. }
                | AgentEvent::ContextCompacted { .. }
                | AgentEvent::ContextSummarized { .. }
        ) {
            return;
        }
        let mut timing = self.timing.lock().unwrap_or_else(|e| e.into_inner());
        let run = event.run_id();
        if let Some(began) = timing.rounds.remove(run) {
            self.metrics.inference(began.elapsed());
        }
        match event {
            AgentEvent::StepStarted { .. } | AgentEvent::RetryStarted { .. } => {
                timing.rounds.insert(run.to_owned(), Instant::now());
            }
            AgentEvent::ToolCallStarted { call_id, .. } => {
                timing.calls.insert(call_id.clone(), Instant::now());
            }
            AgentEvent::ToolCallFinished { call_id, .. } => {
                if let Some(began) = timing.calls.remove(call_id) {
                    self.metrics.tool(began.elapsed());
                }
            }
            _ => {}
        }
    }
}

impl EventSink for RunSink {
    fn emit(&self, event: AgentEvent) {
        self.metrics.record(&event);
        self.time(&event);
        if let Some(recorder) = &self.recorder {
            recorder.emit(event.clone());
        }
        let descendant = event.run_id() != self.entry.run_id;
        if descendant
            || matches!(
                event,
                AgentEvent::SubagentStarted { .. } | AgentEvent::SubagentFinished { .. }
            )
        {
            self.tree.route(&self.entry, &event);
        }
        log_run(&self.entry, &event, descendant);
        let logged = self.entry.append(event);
        self.tail.send(logged);
    }
}

/// One `info` line (target `rein::runs`) when a run starts, parks and
/// ends: its thread, run and agent; at the end its termination code,
/// rounds, tokens, and how long it ran in this process.
fn log_run(entry: &RunEntry, event: &AgentEvent, descendant: bool) {
    let (thread_id, run_id) = (event.thread_id(), event.run_id());
    match event {
        AgentEvent::RunStarted { agent_id, .. } => {
            tracing::info!(target: "rein::runs", thread_id, run_id, agent_id, "run started");
        }
        AgentEvent::RunParked { pending, .. } => tracing::info!(
            target: "rein::runs",
            thread_id,
            run_id,
            pending = pending.len(),
            "run parked for approvals"
        ),
        AgentEvent::RunFinished {
            termination,
            steps,
            usage,
            ..
        } => {
            let agent_id = if descendant {
                ""
            } else {
                entry.agent_id.as_str()
            };
            let duration_ms = if descendant {
                None
            } else {
                Some(u64::try_from(entry.born.elapsed().as_millis()).unwrap_or(u64::MAX))
            };
            tracing::info!(
                target: "rein::runs",
                thread_id,
                run_id,
                agent_id,
                termination = termination.code(),
                rounds = steps,
                input_tokens = usage.input_tokens,
                output_tokens = usage.output_tokens,
                duration_ms,
                "run finished"
            );
        }
        _ => {}
    }
}

impl RunEntry {
    /// Logs an event of a descendant run and sends it to `tail`.
    pub(crate) fn log_to(&self, tail: &ThreadTail, event: AgentEvent) {
        let logged = self.append(event);
        tail.send(logged);
    }
}

/// Keeps a parked run's pending calls and status from its own events.
fn track_approvals(state: &mut EntryState, event: &AgentEvent) {
    match event {
        AgentEvent::ApprovalRequested { .. } => {
            state
                .pending
                .extend(rein_runtime::approvals::pending_of(event));
            if state.status != RunStatus::Finished {
                state.status = RunStatus::AwaitingApproval;
            }
        }
        AgentEvent::ApprovalDecided {
            call_id,
            decision,
            decided_by,
            decided_at,
            ..
        } => {
            if !state.decisions.iter().any(|d| d.call_id == *call_id) {
                state.decisions.push(DecisionRecord {
                    call_id: call_id.clone(),
                    decision: decision.clone(),
                    decided_by: decided_by.clone(),
                    decided_at: decided_at.clone(),
                });
            }
            state.pending.retain(|p| p.call_id != *call_id);
            if state.pending.is_empty() && state.status == RunStatus::AwaitingApproval {
                state.status = RunStatus::Running;
            }
        }
        AgentEvent::RunFinished { .. } => state.pending.clear(),
        _ => {}
    }
}
