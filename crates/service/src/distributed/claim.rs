//! Claiming and running: a thread's **pump** exists while this process
//! holds the thread's lease and works on it. It claims the thread's
//! queued runs in order (an `interrupt` one at once, which the engine's
//! mailbox lets interrupt the active run), drives each run (events
//! written as they come, then the record with the last events in one
//! fenced statement), and gives the thread up when it has no work left.
//!
//! **Invariant:** a pump gives its thread up only when it has no active
//! run and no driver of its runs is still writing (an interrupted run
//! stores its end while the next one runs): a write after the thread was
//! given up would be refused by the fence and the run's end lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rein_postgres::{Claimed, PgRuns, StoredEvent, WRITE_RETRY, retry};
use rein_runtime::{AgentRunResult, RunExit, RunHandle, RunRequest};
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::Message;
use tokio::sync::Notify;

use super::{Distributed, LOST_RUN, Unstarted, lock};
use crate::records::{LoggedEvent, RunEntry, RunRecord, RunStatus, finished_record};

/// How long a run's new events wait to be written with the ones that
/// follow them (what a follower on another process lags at most, beyond
/// the write itself).
const EVENT_LINGER: Duration = Duration::from_millis(5);

/// A thread's pump.
#[derive(Debug, Default)]
pub(super) struct Pump {
    pub(super) wake: Notify,
    /// An `interrupt` submission is waiting.
    pub(super) interrupt: AtomicBool,
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
    /// Runs of the thread whose drivers have not finished writing (an
    /// interrupted run still storing its end while the next one runs):
    /// the thread is not given up before they have.
    writing: std::sync::atomic::AtomicUsize,
}

/// Counts a driver in its pump's `writing` for as long as it lives.
struct Writing(Arc<Pump>);

impl Writing {
    fn new(pump: &Arc<Pump>) -> Self {
        pump.writing.fetch_add(1, Ordering::SeqCst);
        Self(pump.clone())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.writing.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

impl Pump {
    pub(super) fn active(&self) -> Option<Arc<RunEntry>> {
        lock(&self.active).clone()
    }

    pub(super) fn set_active(&self, entry: Option<Arc<RunEntry>>) {
        *lock(&self.active) = entry;
    }

    /// Clears the active run if it is `entry`.
    fn finished(&self, entry: &Arc<RunEntry>) {
        let mut active = lock(&self.active);
        if active.as_ref().is_some_and(|a| Arc::ptr_eq(a, entry)) {
            *active = None;
        }
    }
}

fn stored(logged: &[Arc<LoggedEvent>]) -> Vec<StoredEvent> {
    logged
        .iter()
        .map(|e| StoredEvent {
            seq: e.seq as i64,
            kind: e.kind.to_owned(),
            data: e.json().to_owned(),
        })
        .collect()
}

impl Distributed {
    pub(super) fn pump(&self, thread_id: &str) -> Option<Arc<Pump>> {
        lock(&self.pumps).get(thread_id).cloned()
    }

    fn drop_pump(&self, thread_id: &str, pump: &Arc<Pump>) {
        let mut pumps = lock(&self.pumps);
        if pumps.get(thread_id).is_some_and(|p| Arc::ptr_eq(p, pump)) {
            pumps.remove(thread_id);
        }
    }

    /// Makes sure the thread's work is being done: wakes its pump here, or
    /// takes the thread (if no live process holds it) and starts one.
    /// Unless `force`, a thread last seen held elsewhere is left to its
    /// holder.
    pub(super) async fn kick(&self, thread_id: &str, interrupt: bool, force: bool) {
        if self.core.shutting_down() {
            return;
        }
        let (pump, fresh) = {
            let mut pumps = lock(&self.pumps);
            match pumps.get(thread_id) {
                Some(pump) => (pump.clone(), false),
                None if !force && self.held_elsewhere(thread_id) => return,
                None => {
                    let pump = Arc::new(Pump::default());
                    pumps.insert(thread_id.to_owned(), pump.clone());
                    (pump, true)
                }
            }
        };
        if fresh {
            match self.db.acquire(thread_id).await {
                Ok(true) => {}
                Ok(false) => {
                    self.seen_elsewhere(thread_id);
                    if force {
                        // Work for the thread was made here (e.g. a parked
                        // run's last decision) while its holder was giving
                        // it up: take it when the holder says it did.
                        self.held_elsewhere(thread_id);
                    }
                    self.drop_pump(thread_id, &pump);
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, thread_id, "could not take the thread's lease");
                    self.drop_pump(thread_id, &pump);
                    return;
                }
            }
            lock(&self.elsewhere).remove(thread_id);
            self.end_lost_runs(thread_id, &pump).await;
            pump.ready.store(true, Ordering::SeqCst);
            if let Some(mode) = self.arc() {
                let thread = thread_id.to_owned();
                let running = pump.clone();
                tokio::spawn(async move { mode.run_pump(thread, running).await });
            }
        }
        if interrupt {
            pump.interrupt.store(true, Ordering::SeqCst);
        }
        self.step(thread_id, &pump, false).await;
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
    async fn end_lost_runs(&self, thread_id: &str, pump: &Arc<Pump>) {
        let runs = self.db.runs();
        let running = match runs.running(thread_id).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not read the thread's runs");
                return;
            }
        };
        for (run_id, agent_id, last) in running {
            if self
                .core
                .records
                .get(&run_id)
                .is_some_and(|e| e.driven_here() && e.status() != RunStatus::Finished)
            {
                continue; // running here: not lost
            }
            // Parked and let go, nothing has made it due: it waits.
            let wake = runs.parked_wake(&run_id).await.ok().flatten();
            if wake.is_some_and(|w| w.waiting) {
                continue;
            }
            // Parked, its calls never run: carried on here instead — to
            // let go again if it still waits, unless it is carried on to
            // end (a cancel, or new input that supersedes it).
            let cancel = wake.is_some_and(|w| w.cancel_requested);
            let superseded = wake.is_some_and(|w| w.interrupt_queued);
            if let Some((parked, events)) =
                self.parked_to_carry_on(&run_id, thread_id, &agent_id).await
                && self
                    .carry_on(
                        thread_id,
                        pump,
                        parked,
                        events,
                        cancel,
                        !(cancel || superseded),
                    )
                    .await
            {
                continue;
            }
            let lost = Unstarted {
                run_id: &run_id,
                thread_id,
                agent_id: &agent_id,
                termination: TerminationReason::Error(LOST_RUN.to_owned()),
                cancel_cause: None,
                seq: last + 1,
            };
            let id = run_id.as_str();
            let ended = self
                .end_without_engine(lost, |record, event| async move {
                    runs.finish(thread_id, id, &record, &[event]).await
                })
                .await;
            match ended {
                Ok(true) => tracing::warn!(thread_id, run_id, "ended a run whose process was lost"),
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, run_id, "could not end a lost run"),
            }
        }
    }

    /// Claims and starts what the thread can run now: its next queued run
    /// when nothing runs, an `interrupt` one when something does (only
    /// when one was announced, unless `poll`). Returns whether a run is
    /// active after it.
    async fn step(&self, thread_id: &str, pump: &Arc<Pump>, poll: bool) -> bool {
        let _turn = pump.stepping.lock().await;
        loop {
            if pump.closed.load(Ordering::SeqCst) || !pump.ready.load(Ordering::SeqCst) {
                return false;
            }
            if self.core.shutting_down() {
                return pump.active().is_some();
            }
            let active = pump.active().is_some();
            if pump.claim_failed.swap(false, Ordering::SeqCst) {
                match self.claimed_unstarted(thread_id).await {
                    Ok(Some(claimed)) => {
                        // Started now, as its claim would have (through the
                        // mailbox, which interrupts an active run).
                        self.start_claimed(thread_id, pump, claimed).await;
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
            match self.db.runs().claim(thread_id, active).await {
                Ok(Some(claimed)) => self.start_claimed(thread_id, pump, claimed).await,
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
        thread_id: &str,
    ) -> Result<Option<Claimed>, rein_postgres::Error> {
        let claimed = self.db.runs().claimed_here(thread_id).await?;
        Ok(claimed.into_iter().find(|c| {
            !self
                .core
                .records
                .get(&c.run_id)
                .is_some_and(|e| e.driven_here())
        }))
    }

    /// Starts a claimed run (through the mailbox, which interrupts the
    /// thread's active run if there is one).
    async fn start_claimed(&self, thread_id: &str, pump: &Arc<Pump>, claimed: Claimed) {
        let records = &self.core.records;
        // The run this one interrupts is superseded: were it an auto-mode
        // round just ending, its session starts no next round.
        if let Some(active) = pump.active() {
            active.supersede(crate::records::Superseded::Cancelled);
        }
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
        // An auto-mode round: its session's state came with its row, or
        // the session starts here (what the submission named, the
        // thread's defaults read with the claim, the agent's).
        let mut budget = None;
        let thread = super::claimed_thread_auto(claimed.thread_auto.as_ref());
        let stored = claimed
            .auto
            .map(serde_json::from_value::<crate::auto::StoredAuto>);
        let rounds = match stored {
            Some(Ok(crate::auto::StoredAuto::Rounds(rounds))) => Some(rounds),
            Some(Ok(crate::auto::StoredAuto::Request { request })) => self.core.resolve_rounds(
                Some(claimed.agent_id.as_str()).filter(|a| !a.is_empty()),
                &request,
                &thread,
                format!("auto-{}", claimed.run_id),
            ),
            Some(Err(error)) => {
                tracing::warn!(%error, run_id = claimed.run_id, "the run's auto-mode state is unreadable; it runs as a single run");
                None
            }
            None => self.core.resolve_rounds(
                Some(claimed.agent_id.as_str()).filter(|a| !a.is_empty()),
                &crate::auto::AutoRequest::default(),
                &thread,
                format!("auto-{}", claimed.run_id),
            ),
        };
        if let Some(rounds) = rounds {
            // Kept with the run: carried on after a park, it is still a round.
            let value = serde_json::to_value(crate::auto::StoredAuto::Rounds(rounds.clone()))
                .unwrap_or_default();
            if let Err(error) = self.db.runs().set_run_auto(&claimed.run_id, &value).await {
                tracing::warn!(%error, run_id = claimed.run_id, "could not store the round's session state");
            }
            let tokens = thread.tokens_used_session;
            budget = rounds.round_budget(tokens);
            entry.set_rounds(rounds, tokens);
        }
        let started = match serde_json::from_value::<Vec<Message>>(claimed.messages) {
            Ok(messages) => {
                let mut request = RunRequest::new(thread_id, messages)
                    .with_run_id(&claimed.run_id)
                    .with_cancellation(entry.cancellation().clone())
                    .with_event_sink(records.sink_with(&entry, Some(self.child_hook())))
                    .release_when_parked();
                if !claimed.agent_id.is_empty() {
                    request = request.with_agent_id(&claimed.agent_id);
                }
                if let Some(budget) = budget {
                    request = request.with_token_budget(budget);
                }
                self.core
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
                self.drive(thread_id, pump.clone(), entry, handle);
            }
            Err(why) => {
                let runs = self.db.runs();
                let failed = Unstarted {
                    run_id: &entry.run_id,
                    thread_id,
                    agent_id: &entry.agent_id,
                    termination: TerminationReason::Error(format!(
                        "the run could not start: {why}"
                    )),
                    cancel_cause: None,
                    seq: entry.logged() as i64 + 1,
                };
                let run_id = entry.run_id.clone();
                let _ = self
                    .end_without_engine(failed, |record, event| async move {
                        retry(WRITE_RETRY, || {
                            runs.finish(thread_id, &run_id, &record, std::slice::from_ref(&event))
                        })
                        .await
                    })
                    .await;
            }
        }
    }

    /// Awaits a run started here: writes its events as they come, then its
    /// last events and record in one statement, and wakes the pump. A
    /// write the fence refuses means another process owns the thread now:
    /// this process's entry is dropped, so reads go to the database.
    pub(super) fn drive(
        &self,
        thread_id: &str,
        pump: Arc<Pump>,
        entry: Arc<RunEntry>,
        handle: RunHandle,
    ) {
        let Some(mode) = self.arc() else {
            return;
        };
        let thread_id = thread_id.to_owned();
        let writing = Writing::new(&pump);
        self.drivers.spawn(async move {
            let _writing = writing;
            let runs = mode.db.runs().clone();
            let writer = Writer::start(&runs, &thread_id, &entry);
            let result = match handle.wait_or_parked().await {
                Ok(RunExit::Finished(result)) => *result,
                Ok(RunExit::Parked(parked)) => {
                    mode.let_go(&thread_id, &pump, &entry, writer, &parked).await;
                    return;
                }
                Ok(other) => AgentRunResult::new(
                    &entry.run_id,
                    &thread_id,
                    TerminationReason::Error(format!("the run's task ended unexpectedly: {other:?}")),
                ),
                Err(e) => AgentRunResult::new(
                    &entry.run_id,
                    &thread_id,
                    TerminationReason::Error(e.to_string()),
                ),
            };
            // An auto-mode round: its end may queue the next one.
            mode.core.end_round(&*mode, &entry, &result).await;
            let kept = match writer.stop().await {
                Written::Upto(written) => {
                    let mut record =
                        finished_record(&entry.run_id, &thread_id, &entry.agent_id, &result);
                    record.children = entry.children();
                    record.decisions = entry.decisions();
                    record.auto = entry.auto();
                    match store_end(&runs, &thread_id, &entry, written, &record).await {
                        Ok(true) => true,
                        Ok(false) => {
                            tracing::warn!(
                                run_id = entry.run_id,
                                thread_id,
                                "the run's record was refused: this process no longer holds the thread"
                            );
                            false
                        }
                        Err(error) => {
                            tracing::error!(%error, run_id = entry.run_id, "could not store the run's record");
                            true
                        }
                    }
                }
                Written::Refused => false,
            };
            if kept {
                mode.core.records.finish(&entry, result);
            } else {
                // What this process logged is not the run's truth.
                mode.core.records.finish_discarded(&entry, result);
            }
            pump.finished(&entry);
            pump.wake.notify_one();
        });
    }

    /// A run driven here parked and let go of its task: its events are
    /// written, it is marked released (fenced) and its entry dropped, so
    /// it costs this process nothing while it waits; the pump then gives
    /// the thread up unless something already made the run due.
    async fn let_go(
        &self,
        thread_id: &str,
        pump: &Arc<Pump>,
        entry: &Arc<RunEntry>,
        writer: Writer,
        parked: &rein_runtime::approvals::ParkedRun,
    ) {
        let runs = self.db.runs();
        let released = match writer.stop().await {
            Written::Upto(written) => {
                let (rest, _) = entry.events_after(written);
                let rest = stored(&rest);
                let wake_at = parked
                    .undecided()
                    .filter_map(|p| p.expires_at.as_deref())
                    .filter_map(rein_runtime_contract::approval::parse_rfc3339)
                    .min();
                let stored_all = rest.is_empty()
                    || matches!(
                        retry(WRITE_RETRY, || runs.append_events(
                            thread_id,
                            &entry.run_id,
                            &rest
                        ))
                        .await,
                        Ok(true)
                    );
                stored_all
                    && matches!(
                        retry(WRITE_RETRY, || {
                            runs.release_parked(
                                thread_id,
                                &entry.run_id,
                                // The calls a person still decides (not
                                // those a rule's timeout answered).
                                parked.pending.len() - parked.timed_out.len(),
                                wake_at,
                            )
                        })
                        .await,
                        Ok(true)
                    )
            }
            Written::Refused => false,
        };
        if !released {
            tracing::warn!(
                run_id = entry.run_id,
                thread_id,
                "a parked run could not be released: this process no longer holds the thread (its new owner carries it on)"
            );
        }
        entry.clear_driven_here();
        pump.finished(entry);
        if self.core.records.forget(entry) {
            // A stream here reads it: copy it from the database.
            self.start_following(entry);
        }
        self.core.records.release_tail(thread_id);
        pump.wake.notify_one();
    }

    /// What keeps a sub-agent's run in the database: on the sink's call,
    /// its thread (whose lease the child's run holds) is pinned; then its
    /// row, events and record are written as the run goes, and the thread
    /// given up when both are done. If this process is lost, the child's
    /// row is `running` on a thread nobody renews: whoever takes the thread
    /// ends it as lost, so none stays `running` and none runs twice.
    pub(super) fn child_hook(&self) -> crate::subagents::ChildHook {
        let me = self.me.clone();
        Arc::new(move |child: &Arc<RunEntry>| {
            let Some(mode) = me.upgrade() else { return };
            if !mode.db.leases().pin(&child.thread_id) {
                return;
            }
            let child = child.clone();
            let task = mode.clone();
            mode.drivers
                .spawn(async move { task.keep_child(child).await });
        })
    }

    async fn keep_child(&self, child: Arc<RunEntry>) {
        let runs = self.db.runs().clone();
        let thread_id = child.thread_id.clone();
        let parent = child.parent().map(|(run, _)| run).unwrap_or_default();
        match retry(WRITE_RETRY, || {
            runs.start_child(&thread_id, &child.run_id, &child.agent_id, &parent)
        })
        .await
        {
            Ok(true) => {
                let writer = Writer::start(&runs, &thread_id, &child);
                let record = child.finished().await;
                if let Written::Upto(written) = writer.stop().await
                    && let Err(error) = store_end(&runs, &thread_id, &child, written, &record).await
                {
                    tracing::error!(%error, run_id = child.run_id, "could not store a sub-agent run's record");
                }
            }
            Ok(false) => {
                tracing::warn!(
                    run_id = child.run_id,
                    "a sub-agent's run was not recorded: its thread is not held here"
                );
            }
            Err(error) => {
                tracing::error!(%error, run_id = child.run_id, "could not record a sub-agent's run");
            }
        }
        if self.db.leases().unpin(&thread_id) {
            self.db.release(&thread_id).await;
        }
    }

    /// Works on a held thread until it has nothing left, then gives it up.
    async fn run_pump(self: Arc<Self>, thread_id: String, pump: Arc<Pump>) {
        let closing = self.core.closing.clone();
        loop {
            let mut poll = false;
            tokio::select! {
                _ = pump.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => poll = true,
                _ = closing.cancelled() => {}
            }
            let busy = self.step(&thread_id, &pump, poll).await;
            if busy {
                continue;
            }
            // Idle: give the thread up — in turn with claims, so no run
            // starts here once the lease is going. Then, if work came in
            // meanwhile (its submitter found this pump closing), take the
            // thread again through a fresh pump.
            {
                let _turn = pump.stepping.lock().await;
                // A driver still writing wakes the pump when it is done.
                if pump.active().is_some() || pump.writing.load(Ordering::SeqCst) > 0 {
                    continue;
                }
                pump.closed.store(true, Ordering::SeqCst);
                self.db.release(&thread_id).await;
                self.drop_pump(&thread_id, &pump);
            }
            if matches!(self.db.runs().has_open(&thread_id).await, Ok(true)) {
                self.kick_again(&thread_id).await;
            }
            return;
        }
    }
}

/// A run's events written to the database as they are logged, on a task
/// of its own, until [`stop`](Self::stop).
struct Writer {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Written>,
}

impl Writer {
    fn start(runs: &PgRuns, thread_id: &str, entry: &Arc<RunEntry>) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(write_events(
            runs.clone(),
            thread_id.to_owned(),
            entry.clone(),
            stop.clone(),
        ));
        Self { stop, task }
    }

    /// Stops writing once what is logged is written; how far it got.
    async fn stop(self) -> Written {
        self.stop.cancel();
        self.task.await.unwrap_or(Written::Refused)
    }
}

/// Finishes a run in the database (fenced): the events logged after
/// `written`, and its record. `false` when the fence refused it.
async fn store_end(
    runs: &PgRuns,
    thread_id: &str,
    entry: &RunEntry,
    written: u64,
    record: &RunRecord,
) -> Result<bool, rein_postgres::Error> {
    let (rest, _) = entry.events_after(written);
    let rest = stored(&rest);
    let record = serde_json::to_value(record).unwrap_or_default();
    retry(WRITE_RETRY, || {
        runs.finish(thread_id, &entry.run_id, &record, &rest)
    })
    .await
}

/// How far a run's events were written.
enum Written {
    /// Every event up to this number is stored.
    Upto(u64),
    /// The fence refused a write: this process lost the thread.
    Refused,
}

/// Writes a run's events to the database as they are logged, in batches,
/// until `stop`. A write the fence refuses cancels the run (this process
/// lost the thread).
async fn write_events(
    runs: PgRuns,
    thread_id: String,
    entry: Arc<RunEntry>,
    stop: tokio_util::sync::CancellationToken,
) -> Written {
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
                    return Written::Refused;
                }
                Err(error) => {
                    tracing::error!(%error, run_id = entry.run_id, "could not store the run's events");
                    return Written::Upto(written);
                }
            }
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => return Written::Upto(written),
            changed = changes.changed() => if changed.is_err() { return Written::Upto(written) },
        }
        // Linger: a burst of events (a quick run's all of them) becomes
        // one statement — or none, if the run ends meanwhile (its finish
        // writes the rest).
        tokio::select! {
            _ = stop.cancelled() => return Written::Upto(written),
            _ = tokio::time::sleep(EVENT_LINGER) => {}
        }
    }
}
