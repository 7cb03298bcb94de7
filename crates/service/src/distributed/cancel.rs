//! Cancels and deletion across processes: a run driven here is cancelled
//! through its token; a queued run is finished by whoever cancels it; a
//! run running elsewhere is marked in the database and its process told
//! (`NOTIFY rein_cancel`, and its scan as the safety net).

use std::time::Duration;

use rein_runtime_contract::event::CancelCause;
use rein_runtime_contract::lifecycle::TerminationReason;

use super::{Distributed, SCAN, Unstarted, unavailable};
use crate::error::ServiceError;
use crate::records::RunStatus;

impl Distributed {
    /// Cancels a run wherever it is: here, queued (finished by this
    /// process), or running elsewhere (asked through the database).
    pub(super) async fn cancel(&self, run_id: &str) -> Result<bool, ServiceError> {
        if let Some(entry) = self.core.records.get(run_id)
            && entry.driven_here()
        {
            if entry.status() == RunStatus::Finished {
                return Ok(false);
            }
            self.core.cancel_entry(&entry);
            return Ok(true);
        }
        let runs = self.db.runs();
        let stored = runs
            .run(run_id)
            .await
            .map_err(|e| unavailable(&e))?
            .ok_or_else(|| ServiceError::unknown_run(run_id))?;
        if stored.status == "queued" {
            let cancelled = Unstarted {
                run_id,
                thread_id: &stored.thread_id,
                agent_id: &stored.agent_id,
                termination: TerminationReason::Cancelled,
                cancel_cause: Some(CancelCause::Requested),
                seq: 1,
            };
            let ended = self
                .end_without_engine(cancelled, |record, event| async move {
                    runs.finish_queued(run_id, &record, &[event]).await
                })
                .await;
            match ended {
                Ok(true) => return Ok(true),
                Ok(false) => {} // claimed meanwhile: cancel it running
                Err(e) => return Err(unavailable(&e)),
            }
        }
        match runs.request_cancel(run_id).await {
            Ok(Some(status)) if status == "running" => {
                // Parked with no process holding it: the cancel makes it
                // due; taking its thread carries it on to end.
                self.kick(&stored.thread_id, false, true).await;
                Ok(true)
            }
            Ok(Some(status)) => Ok(status != "finished"),
            Ok(None) => Err(ServiceError::unknown_run(run_id)),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Cancels the thread's running run wherever it runs and waits,
    /// bounded, until it has finished: `(cancelled, released)`.
    pub(super) async fn cancel_thread_elsewhere(&self, thread_id: &str) -> (bool, bool) {
        let runs = self.db.runs();
        let mut changes = self.changes.subscribe();
        let running = match runs.cancel_running(thread_id).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not send the cancel request");
                return (false, false);
            }
        };
        if running.is_empty() {
            return (false, true);
        }
        // A parked run no process holds ends once its thread is taken. A
        // run its process holds is ended by that process (notified on
        // `rein_cancel`): taking its thread after it would be work for
        // nothing, on the path every cross-process cancel waits on.
        if running.iter().any(|(_, parked)| *parked) {
            self.kick(thread_id, false, true).await;
        }
        let mut open: Vec<String> = running.into_iter().map(|(run_id, _)| run_id).collect();
        let deadline = tokio::time::Instant::now() + self.core.cancel_wait();
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
                match runs.run(&run_id).await {
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
    /// takes its lease and deletes its history, keys and message ids.
    pub(super) async fn delete(&self, thread_id: &str) -> Result<(), ServiceError> {
        let runs = self.db.runs();
        for run_id in runs.queued(thread_id).await.map_err(|e| unavailable(&e))? {
            self.cancel(&run_id).await?;
        }
        let runtime = &self.core.runtime;
        let released = if runtime.is_thread_active(thread_id) {
            runtime.cancel_and_wait_by_thread(thread_id).await
        } else {
            self.cancel_thread_elsewhere(thread_id).await.1
        };
        let owned_elsewhere = || ServiceError::ThreadOwnedElsewhere {
            thread_id: thread_id.to_owned(),
        };
        if !released {
            return Err(owned_elsewhere());
        }
        // The owner gives the thread up once its run has finished.
        let deadline = tokio::time::Instant::now() + self.core.cancel_wait();
        while !self.db.acquire(thread_id).await.unwrap_or(false) {
            if tokio::time::Instant::now() >= deadline {
                return Err(owned_elsewhere());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let outcome = runtime.delete_thread(thread_id).await;
        if outcome.is_ok() {
            runs.forget_keys(thread_id)
                .await
                .map_err(|e| unavailable(&e))?;
        }
        if self.pump(thread_id).is_none() {
            self.db.release(thread_id).await;
        }
        Ok(outcome?)
    }
}
