//! Parked runs no process holds: the owner of a run that parked for
//! approvals stores the park, marks the run released
//! ([`PgRuns::release_parked`]) and gives its thread up. The run then
//! waits at no cost — no task, no lease — until a decision on every call,
//! its soonest rule timeout, a cancel request or an `interrupt` submission
//! makes it due; then whichever process takes the thread carries it on
//! ([`PgRuns::take_parked`]).

use std::time::SystemTime;

use super::PgRuns;

/// Where a parked run stands ([`PgRuns::parked_wake`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedWake {
    /// No process holds it (its owner released it).
    pub released: bool,
    /// Released, and nothing has made it due yet: leave it.
    pub waiting: bool,
    /// An `interrupt` submission is queued on its thread (it is carried on
    /// only to be superseded: it must not let go again).
    pub interrupt_queued: bool,
    /// A cancel was requested.
    pub cancel_requested: bool,
}

impl PgRuns {
    /// Marks a parked run released (fenced by its thread's lease): it waits
    /// on `calls` calls, the soonest of its rule timeouts at `wake_at`. Any
    /// decisions marked applied are unmarked (the run let go before it ran
    /// anything; whoever carries it on applies them). `false` when the
    /// fence refused it.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn release_parked(
        &self,
        thread_id: &str,
        run_id: &str,
        calls: usize,
        wake_at: Option<SystemTime>,
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let wake_at = wake_at.map(chrono_free_timestamp);
        let released: i64 = sqlx::query_scalar(fenced!(
            "up AS (
                 UPDATE rein_runs SET parked_calls = $5, parked_wake_at = to_timestamp($6)
                 WHERE run_id = $4 AND status = 'running' AND EXISTS (SELECT 1 FROM fence)
                 RETURNING 1
             ),
             unapplied AS (
                 UPDATE rein_decisions SET applied = false
                 WHERE run_id = $4 AND EXISTS (SELECT 1 FROM up)
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM up) + 0 * (SELECT count(*) FROM unapplied)"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(run_id)
        .bind(i32::try_from(calls).unwrap_or(i32::MAX))
        .bind(wake_at)
        .fetch_one(&self.pool)
        .await?;
        Ok(released > 0)
    }

    /// Takes a released parked run back (fenced by its thread's lease):
    /// this process carries it on now. `false` when the fence refused it.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn take_parked(&self, thread_id: &str, run_id: &str) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let taken: i64 = sqlx::query_scalar(fenced!(
            "up AS (
                 UPDATE rein_runs SET parked_calls = NULL, parked_wake_at = NULL
                 WHERE run_id = $4 AND EXISTS (SELECT 1 FROM fence)
                 RETURNING 1
             )
             SELECT count(*) FROM up"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(run_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(taken > 0)
    }

    /// Where a running run stands as a parked run; `None` if it is not
    /// running.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn parked_wake(&self, run_id: &str) -> Result<Option<ParkedWake>, sqlx::Error> {
        let row: Option<(bool, bool, bool, bool)> = sqlx::query_as(concat!(
            "SELECT r.parked_calls IS NOT NULL, ",
            waiting!("r"),
            ",
                    EXISTS (SELECT 1 FROM rein_runs q WHERE q.thread_id = r.thread_id
                            AND q.status = 'queued' AND q.interrupt),
                    r.cancel_requested
             FROM rein_runs r WHERE r.run_id = $1 AND r.status = 'running'"
        ))
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(released, waiting, interrupt_queued, cancel_requested)| ParkedWake {
                released,
                waiting,
                interrupt_queued,
                cancel_requested,
            },
        ))
    }
}

/// Seconds since the Unix epoch, for `to_timestamp`.
fn chrono_free_timestamp(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
