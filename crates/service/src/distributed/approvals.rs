//! Approvals across processes: a decision is recorded in the database
//! first (the first decision on a call is final there, whichever process
//! took it), then handed to the engine of the process that drives the run
//! (at once when that is this one, else through `NOTIFY rein_cancel`
//! `decide:<run>`, with the scan as the safety net). A run parked by a
//! process that was lost is carried on by the process that takes its
//! thread, from its `run_parked` event and the stored decisions.
//!
//! **Invariant:** a held call runs at most once cluster-wide. Its run's
//! decisions are marked `applied` (fenced by the thread's lease) before
//! the last of them reaches an engine, and a run whose decisions were
//! applied is never carried on elsewhere: a process lost after that point
//! leaves the run to be ended as lost (its calls `may_have_completed`).

use std::sync::Arc;
use std::time::Duration;

use rein_postgres::{StoredEvent, WRITE_RETRY, retry};
use rein_runtime::RunRequest;
use rein_runtime::approvals::{ApprovalError, Decided, ParkedRun};
use rein_runtime_contract::approval::{Decider, Decision, PendingApproval};
use rein_runtime_contract::event::AgentEvent;

use super::claim::Pump;
use super::{Distributed, unavailable};
use crate::core::Core;
use crate::error::ServiceError;
use crate::mode::Mode;
use crate::records::{RunEntry, RunStatus};

/// How long a decision for a call not (yet) known to be pending waits for
/// its run's park to reach the database, and how often it looks.
const PARK_LAG: Duration = Duration::from_millis(500);
const PARK_POLL: Duration = Duration::from_millis(20);

fn unknown(run_id: &str, call_id: &str) -> ServiceError {
    ApprovalError::UnknownApproval {
        run_id: run_id.to_owned(),
        call_id: call_id.to_owned(),
    }
    .into()
}

impl Distributed {
    /// Records a decision and hands it to the run's process.
    pub(super) async fn decide_anywhere(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ServiceError> {
        let entry = match self.run(run_id).await {
            Ok(entry) => entry,
            Err(ServiceError::UnknownRun { .. }) => return Err(unknown(run_id, call_id)),
            Err(e) => return Err(e),
        };
        let runs = self.db.runs();
        let mut pending = entry
            .record()
            .pending_approvals
            .into_iter()
            .find(|p| p.call_id == call_id);
        // This process's copy of a run another one drives may lag its
        // park, and the park may not be in the database yet (its owner
        // writes events a few milliseconds after it logs them): the
        // database is asked, for a moment, while the run runs.
        let mut waited = Duration::ZERO;
        while pending.is_none() && !entry.driven_here() && entry.status() != RunStatus::Finished {
            pending = self
                .stored_pending(Some(&entry.thread_id))
                .await?
                .into_iter()
                .find(|p| p.run_id == run_id && p.call_id == call_id);
            if pending.is_some() || waited >= PARK_LAG {
                break;
            }
            tokio::time::sleep(PARK_POLL).await;
            waited += PARK_POLL;
        }
        if let Some(p) = &pending {
            // What the engine would refuse is refused before it is stored.
            self.core
                .runtime
                .check_decision(&entry.agent_id, p, &decision)?;
        }
        let json = serde_json::to_value(&decision).unwrap_or_default();
        let first = if pending.is_some() {
            let recorded = runs
                .record_decision(run_id, call_id, &json, by)
                .await
                .map_err(|e| unavailable(&e))?
                .ok_or_else(|| unknown(run_id, call_id))?;
            (!recorded.inserted).then_some(recorded.decision)
        } else {
            // Not pending: only a repeat of a stored decision is answered.
            let (stored, _) = runs.decisions(run_id).await.map_err(|e| unavailable(&e))?;
            match stored.into_iter().find(|d| d.call_id == call_id) {
                Some(d) => Some(d.decision),
                None => return Core::decided_before(&entry, call_id, &decision),
            }
        };
        if let Some(first) = first {
            let first: Option<Decision> = serde_json::from_value(first).ok();
            return match first {
                Some(first) if first == decision => Ok(Decided::repeated(call_id, &decision)),
                first => Err(ApprovalError::AlreadyDecided {
                    call_id: call_id.to_owned(),
                    decision: first.map_or("unknown", |d| d.name()).to_owned(),
                }
                .into()),
            };
        }
        if entry.driven_here() {
            self.apply_decisions(&entry).await;
        } else if self
            .stored_pending(Some(&entry.thread_id))
            .await
            .is_ok_and(|left| !left.iter().any(|p| p.run_id == run_id))
        {
            // The last decision of a run parked with no process holding
            // it: taking its thread carries it on (wherever it was parked).
            self.kick(&entry.thread_id, false, true).await;
        }
        Ok(Decided::taken(call_id, &decision))
    }

    /// Hands a run parked here the decisions stored for it; before the
    /// last one, marks them applied (fenced), so no other process carries
    /// the run on once its calls may run here.
    pub(super) async fn apply_decisions(&self, entry: &RunEntry) {
        let runtime = &self.core.runtime;
        let run_id = &entry.run_id;
        let local: Vec<PendingApproval> = runtime
            .pending_approvals(None)
            .into_iter()
            .filter(|p| p.run_id == *run_id)
            .collect();
        if local.is_empty() {
            return;
        }
        let runs = self.db.runs();
        let stored = match runs.decisions(run_id).await {
            Ok((stored, _)) => stored,
            Err(error) => {
                tracing::warn!(%error, run_id, "could not read the run's decisions");
                return;
            }
        };
        let todo: Vec<(String, Decision, Option<String>)> = stored
            .into_iter()
            .filter(|d| local.iter().any(|p| p.call_id == d.call_id))
            .filter_map(|d| {
                let decision = serde_json::from_value(d.decision).ok()?;
                Some((d.call_id, decision, d.by))
            })
            .collect();
        if todo.is_empty() {
            return;
        }
        let completes = local
            .iter()
            .all(|p| todo.iter().any(|(c, _, _)| *c == p.call_id));
        if completes {
            match runs.mark_decisions_applied(&entry.thread_id, run_id).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        run_id,
                        "the run's decisions were not applied here: this process no longer holds its thread"
                    );
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, run_id, "could not mark the run's decisions applied");
                    return;
                }
            }
        }
        for (call_id, decision, by) in todo {
            if let Err(error) = runtime.decide_as(run_id, &call_id, decision, by.as_deref()) {
                tracing::debug!(%error, run_id, call_id, "a stored decision was not applied");
            }
        }
    }

    /// Every pending approval, from the database.
    pub(super) async fn stored_pending(
        &self,
        thread_id: Option<&str>,
    ) -> Result<Vec<PendingApproval>, ServiceError> {
        let parks = self
            .db
            .runs()
            .parked(thread_id)
            .await
            .map_err(|e| unavailable(&e))?;
        let mut pending = Vec::new();
        for park in parks {
            if let Ok(AgentEvent::RunParked { pending: calls, .. }) =
                serde_json::from_str::<AgentEvent>(&park.event)
            {
                pending.extend(
                    calls
                        .into_iter()
                        .filter(|p| !park.decided.contains(&p.call_id)),
                );
            }
        }
        Ok(pending)
    }

    /// The safety net: hands the runs parked here the decisions whose
    /// notification was lost.
    pub(super) async fn apply_missed_decisions(&self) {
        let mut parked: Vec<String> = self
            .core
            .runtime
            .pending_approvals(None)
            .into_iter()
            .map(|p| p.run_id)
            .collect();
        parked.dedup();
        for run_id in parked {
            if let Some(entry) = self.core.records.get(&run_id)
                && entry.driven_here()
            {
                self.apply_decisions(&entry).await;
            }
        }
    }

    /// A run a lost process left parked, if it can be carried on here:
    /// its last stored event ended the round with `run_parked`, it is not
    /// a sub-agent's (its parent's task is gone), and no process applied
    /// its decisions (its calls never ran).
    pub(super) async fn parked_to_carry_on(
        &self,
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
    ) -> Option<(ParkedRun, Vec<StoredEvent>)> {
        let runs = self.db.runs();
        let events = runs.events_after(run_id, 0).await.ok()?;
        let at = events.iter().rposition(|e| e.kind == "run_parked")?;
        if events[at + 1..].iter().any(|e| {
            matches!(
                e.kind.as_str(),
                "approval_decided" | "tool_call_started" | "run_finished"
            )
        }) {
            return None;
        }
        let Ok(AgentEvent::RunParked {
            pending,
            steps,
            usage,
            active_ms,
            ..
        }) = serde_json::from_str::<AgentEvent>(&events[at].data)
        else {
            return None;
        };
        if pending.is_empty() || pending.iter().any(|p| p.root_run_id.is_some()) {
            return None;
        }
        let (stored, applied) = runs.decisions(run_id).await.ok()?;
        if applied {
            return None;
        }
        let mut parked = ParkedRun::new(run_id, thread_id, agent_id, pending);
        parked.steps = steps;
        parked.usage = usage;
        parked.active = Duration::from_millis(active_ms);
        for d in stored {
            if let Ok(decision) = serde_json::from_value(d.decision) {
                let mut decider = Decider::now(d.by.as_deref());
                decider.at = d.at;
                parked.deciders.push((d.call_id.clone(), decider));
                parked.decisions.push((d.call_id, decision));
            }
        }
        Some((parked, events))
    }

    /// Carries on, here, a run a lost process left parked (or one released
    /// while parked, now due): its entry takes the stored events, the
    /// engine the park; the pump drives it. With `cancel` it is carried on
    /// to end (a cancel request); with `release` it lets go again if it
    /// still waits (not when new input is to supersede it). `false` if it
    /// could not start (it is then ended as lost).
    pub(super) async fn carry_on(
        &self,
        thread_id: &str,
        pump: &Arc<Pump>,
        parked: ParkedRun,
        events: Vec<StoredEvent>,
        cancel: bool,
        release: bool,
    ) -> bool {
        let records = &self.core.records;
        let entry = records.get_or_create(
            &parked.run_id,
            thread_id,
            &parked.agent_id,
            None,
            RunStatus::Running,
        );
        entry.set_driven_here();
        for e in events {
            entry.append_stored(e.seq as u64, &e.kind, e.data);
        }
        // Running, or awaiting approval if the stored events say so.
        entry.set_running();
        if cancel {
            entry.cancellation().cancel();
        }
        // Taken back from the database's waiting runs (fenced).
        let runs = self.db.runs();
        if !matches!(
            retry(WRITE_RETRY, || runs.take_parked(thread_id, &parked.run_id)).await,
            Ok(true)
        ) {
            return false;
        }
        // An auto-mode round carried on (taken, so it is this process's):
        // its session came with its row.
        if let Some((rounds, tokens)) = self.stored_round(&parked.run_id, thread_id).await {
            entry.set_rounds(rounds, tokens);
        }
        // Decisions complete already: applied before the calls may run.
        let complete = parked.is_decided();
        if complete
            && !matches!(
                self.db
                    .runs()
                    .mark_decisions_applied(thread_id, &parked.run_id)
                    .await,
                Ok(true)
            )
        {
            return false;
        }
        let mut request = RunRequest::resume(parked)
            .with_cancellation(entry.cancellation().clone())
            .with_event_sink(records.sink_with(&entry, Some(self.child_hook())));
        if release {
            request = request.release_when_parked();
        }
        match self.core.runtime.mailbox().submit(request).await {
            Ok(handle) => {
                tracing::info!(thread_id, run_id = entry.run_id, "carrying on a parked run");
                pump.set_active(Some(entry.clone()));
                self.drive(thread_id, pump.clone(), entry, handle);
                true
            }
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not carry on a parked run");
                false
            }
        }
    }
}
