//! Decisions on a parked run's pending calls: recorded by whichever
//! process a person reached (`NOTIFY rein_cancel` with `decide:<run>` tells
//! the run's owner), read by the owner, and marked applied (fenced) just
//! before the owner's engine runs the decided calls.

use serde_json::Value;

use super::PgRuns;

/// A decision as stored ([`PgRuns::decisions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredDecision {
    /// The decided call.
    pub call_id: String,
    /// The decision's JSON.
    pub decision: Value,
    /// Who took it (an API token's name), if known.
    pub by: Option<String>,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// What [`PgRuns::record_decision`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedDecision {
    /// The call's decision as stored: this one, or the first one taken.
    pub decision: Value,
    /// Whether this call stored it (`false`: it was decided before).
    pub inserted: bool,
}

impl PgRuns {
    /// Records `decision` on `call_id` of `run_id` unless the call was
    /// decided before, and tells the run's owner. Returns the stored
    /// decision; `None` when the run does not exist.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe (the first decision stays).
    pub async fn record_decision(
        &self,
        run_id: &str,
        call_id: &str,
        decision: &Value,
        by: Option<&str>,
    ) -> Result<Option<RecordedDecision>, sqlx::Error> {
        let row: Option<(Option<Value>, bool)> = sqlx::query_as(
            "WITH ins AS (
                 INSERT INTO rein_decisions (run_id, call_id, decision, decided_by)
                 SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM rein_runs WHERE run_id = $1)
                 ON CONFLICT DO NOTHING
                 RETURNING decision
             )
             SELECT COALESCE((SELECT decision FROM ins),
                             (SELECT decision FROM rein_decisions WHERE run_id = $1 AND call_id = $2)),
                    EXISTS (SELECT 1 FROM ins)
             FROM (SELECT pg_notify('rein_cancel', 'decide:' || $1)) AS n
             WHERE EXISTS (SELECT 1 FROM rein_runs WHERE run_id = $1)",
        )
        .bind(run_id)
        .bind(call_id)
        .bind(decision)
        .bind(by)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|(decision, inserted)| {
            decision.map(|decision| RecordedDecision { decision, inserted })
        }))
    }

    /// A run's decisions in the order taken, and whether they were applied
    /// by an owner's engine.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn decisions(
        &self,
        run_id: &str,
    ) -> Result<(Vec<StoredDecision>, bool), sqlx::Error> {
        let rows: Vec<(String, Value, bool, Option<String>, String)> = sqlx::query_as(
            "SELECT call_id, decision, applied, decided_by,
                    to_char(decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
             FROM rein_decisions WHERE run_id = $1 ORDER BY decided_at, call_id",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        let applied = rows.iter().any(|r| r.2);
        Ok((
            rows.into_iter()
                .map(|(call_id, decision, _, by, at)| StoredDecision {
                    call_id,
                    decision,
                    by,
                    at,
                })
                .collect(),
            applied,
        ))
    }

    /// Marks a run's decisions applied (fenced by its thread's lease):
    /// from now on its decided calls may run here, so no other process
    /// carries the run on. `false` when the fence refused it, or the run
    /// is parked with no process holding it (take it first:
    /// [`take_parked`](Self::take_parked)).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn mark_decisions_applied(
        &self,
        thread_id: &str,
        run_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let marked: i64 = sqlx::query_scalar(fenced!(
            "parked AS (
                 SELECT 1 FROM rein_runs WHERE run_id = $4 AND parked_calls IS NOT NULL
             ),
             up AS (
                 UPDATE rein_decisions SET applied = true
                 WHERE run_id = $4 AND EXISTS (SELECT 1 FROM fence) AND NOT EXISTS (SELECT 1 FROM parked)
                 RETURNING 1
             )
             SELECT CASE WHEN EXISTS (SELECT 1 FROM parked) THEN 0
                         ELSE (SELECT count(*) FROM fence) + 0 * (SELECT count(*) FROM up) END"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(run_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(marked > 0)
    }
}

/// A parked run as stored: its last `run_parked` event (JSON text) with
/// nothing after it that ended the park, and the calls decided since.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredPark {
    /// The run.
    pub run_id: String,
    /// Its `run_parked` event as stored.
    pub event: String,
    /// The calls with a recorded decision.
    pub decided: Vec<String>,
    /// Its thread.
    pub thread_id: String,
    /// Whether an owner applied its decisions (its calls may have run).
    pub applied: bool,
}

impl PgRuns {
    /// The running runs parked now (their last `run_parked` event followed
    /// by no decision, tool call or end), of every thread or of `thread_id`
    /// and its sub-agents' threads (`<thread>:<child run>`).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn parked(&self, thread_id: Option<&str>) -> Result<Vec<StoredPark>, sqlx::Error> {
        let rows: Vec<(String, String, Vec<String>, String, bool)> = sqlx::query_as(
            "SELECT r.run_id, e.data,
                    ARRAY(SELECT d.call_id FROM rein_decisions d WHERE d.run_id = r.run_id),
                    r.thread_id,
                    EXISTS (SELECT 1 FROM rein_decisions d WHERE d.run_id = r.run_id AND d.applied)
             FROM rein_runs r
             JOIN LATERAL (
                 SELECT seq, data FROM rein_events e
                 WHERE e.run_id = r.run_id AND e.kind = 'run_parked'
                 ORDER BY seq DESC LIMIT 1
             ) e ON true
             WHERE r.status = 'running'
               AND ($1::text IS NULL OR r.thread_id = $1
                    OR left(r.thread_id, length($1) + 1) = $1 || ':')
               AND NOT EXISTS (
                   SELECT 1 FROM rein_events x
                   WHERE x.run_id = r.run_id AND x.seq > e.seq
                     AND x.kind IN ('approval_decided', 'tool_call_started', 'run_finished'))
             ORDER BY r.run_id",
        )
        .bind(thread_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(run_id, event, decided, thread_id, applied)| StoredPark {
                run_id,
                event,
                decided,
                thread_id,
                applied,
            })
            .collect())
    }
}

/// The held call ids of a root run's `run_parked` event (JSON text); none
/// for a sub-agent's run (it is not carried on) or an unreadable event.
pub(crate) fn parked_call_ids(event: &str) -> Vec<String> {
    let Ok(value) = serde_json::from_str::<Value>(event) else {
        return Vec::new();
    };
    let Some(pending) = value.get("pending").and_then(Value::as_array) else {
        return Vec::new();
    };
    if pending
        .iter()
        .any(|p| p.get("root_run_id").is_some_and(|r| !r.is_null()))
    {
        return Vec::new();
    }
    pending
        .iter()
        .filter_map(|p| p.get("call_id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}
