//! Following: every read is answered from the database. A run this
//! process does not drive is cached as an entry that is brought up to the
//! database before it is answered, then copied until it finishes (woken
//! by `NOTIFY rein_events`, polled as the safety net).

use std::sync::Arc;

use rein_postgres::{WRITE_RETRY, retry};
use rein_runtime::AgentRunResult;
use rein_runtime_contract::lifecycle::TerminationReason;
use tokio::sync::broadcast;

use super::{Distributed, SCAN, unavailable};
use crate::error::ServiceError;
use crate::records::{RunEntry, RunRecord, RunStatus};

impl Distributed {
    /// A run's entry, as the database has it now; followed until it
    /// finishes unless this process drives it.
    pub(super) async fn entry(&self, run_id: &str) -> Result<Arc<RunEntry>, ServiceError> {
        if let Some(entry) = self.core.records.get(run_id) {
            if entry.driven_here() || entry.status() == RunStatus::Finished {
                return Ok(entry);
            }
            self.refresh(&entry).await.map_err(|e| unavailable(&e))?;
            self.start_following(&entry);
            return Ok(entry);
        }
        let runs = self.db.runs();
        let stored = retry(WRITE_RETRY, || runs.run(run_id))
            .await
            .map_err(|e| unavailable(&e))?
            .ok_or_else(|| ServiceError::unknown_run(run_id))?;
        let status = if stored.status == "queued" {
            RunStatus::Queued
        } else {
            RunStatus::Running
        };
        let entry = self.core.records.get_or_create(
            run_id,
            &stored.thread_id,
            &stored.agent_id,
            stored.idempotency_key,
            status,
        );
        if !entry.driven_here() {
            self.refresh(&entry).await.map_err(|e| unavailable(&e))?;
            self.start_following(&entry);
        }
        Ok(entry)
    }

    /// Brings a followed entry up to the database: its new events, its
    /// status, and its record once finished (with every event before it).
    pub(super) async fn refresh(&self, entry: &RunEntry) -> Result<(), rein_postgres::Error> {
        let runs = self.db.runs();
        // The status first: a finished run's events are all stored.
        let run = retry(WRITE_RETRY, || runs.run(&entry.run_id)).await?;
        let events = retry(WRITE_RETRY, || {
            runs.events_after(&entry.run_id, entry.logged() as i64)
        })
        .await?;
        for e in events {
            entry.append_stored(e.seq as u64, &e.kind, e.data);
        }
        match run {
            Some(run) if run.status == "finished" => {
                let record = run
                    .record
                    .and_then(|r| serde_json::from_value::<RunRecord>(r).ok());
                if let Some(record) = &record {
                    entry.set_links(record);
                }
                self.core.records.finish(entry, result_of(entry, record));
            }
            Some(run) if run.status == "running" => entry.set_running(),
            Some(_) => {}
            None => {
                // Dropped by retention or with its thread.
                let result = AgentRunResult::new(
                    &entry.run_id,
                    &entry.thread_id,
                    TerminationReason::Error("the run's record is gone".to_owned()),
                );
                self.core.records.finish(entry, result);
            }
        }
        Ok(())
    }

    /// After this process finished a run in the database without the
    /// engine: its entry takes the stored events and record (`result`
    /// only if the database cannot be read).
    pub(super) async fn settle(&self, entry: &RunEntry, result: AgentRunResult) {
        if self.refresh(entry).await.is_err() || entry.status() != RunStatus::Finished {
            self.core.records.finish(entry, result);
        }
    }

    /// Starts copying the run into its entry, unless that is done already.
    pub(super) fn start_following(&self, entry: &Arc<RunEntry>) {
        if entry.status() != RunStatus::Finished
            && entry.start_following()
            && let Some(mode) = self.arc()
        {
            let follower = entry.clone();
            tokio::spawn(async move { mode.follow(follower).await });
        }
    }

    /// Copies a run another process runs into its entry here, until it
    /// finishes (or this process takes it over). Cancelling the entry's
    /// token (an AG-UI client leaving) cancels the run where it runs.
    async fn follow(self: Arc<Self>, entry: Arc<RunEntry>) {
        let mut changes = self.changes.subscribe();
        let mut cancel_sent = false;
        loop {
            if entry.driven_here() || entry.status() == RunStatus::Finished {
                return;
            }
            if entry.cancellation().is_cancelled() && !cancel_sent {
                cancel_sent = true;
                if let Err(error) = self.cancel(&entry.run_id).await {
                    tracing::warn!(error = %error, run_id = entry.run_id, "could not pass the cancel on");
                }
            }
            if let Err(error) = self.refresh(&entry).await {
                tracing::debug!(%error, run_id = entry.run_id, "could not read a followed run");
            }
            let deadline = tokio::time::sleep(SCAN);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    // After shutdown nobody here reads the entry any more.
                    _ = self.core.closing.cancelled() => return,
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
}

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
