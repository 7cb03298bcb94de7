//! A thread's auto-mode row: its stored defaults (mode and policy) and its
//! session totals (tokens and metric reports), shared by every process.
//! The values are the service's JSON; this module only stores them.

use serde_json::Value;

use super::PgRuns;

/// A thread's auto-mode row as stored.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct StoredThreadAuto {
    /// The stored default mode (`auto` or `single`).
    pub run_mode: Option<String>,
    /// The stored default policy (JSON `null` or absent: see `policy_set`).
    pub policy: Option<Value>,
    /// Whether a default policy is stored (a stored "no policy" has a
    /// NULL `policy`).
    pub policy_set: bool,
    /// Tokens used since the last reset.
    pub tokens: i64,
    /// Metric reports since the last reset (a JSON array).
    pub reports: Value,
}

impl StoredThreadAuto {
    /// The row with the text NUL-encoded for storage decoded again.
    fn decoded(self) -> Self {
        Self {
            policy: self.policy.map(crate::nul::decode),
            reports: crate::nul::decode(self.reports),
            ..self
        }
    }
}

impl PgRuns {
    /// The thread's auto-mode row (the default one when it has none).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn thread_auto(&self, thread_id: &str) -> Result<StoredThreadAuto, sqlx::Error> {
        let row: Option<StoredThreadAuto> = sqlx::query_as(
            "SELECT run_mode, policy, policy_set, tokens, reports
             FROM rein_thread_auto WHERE thread_id = $1",
        )
        .bind(thread_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map_or_else(
            || StoredThreadAuto {
                reports: Value::Array(Vec::new()),
                ..StoredThreadAuto::default()
            },
            StoredThreadAuto::decoded,
        ))
    }

    /// Stores the thread's defaults: the mode when `run_mode` is given, the
    /// policy when `policy` is (`Some(None)`: "no policy").
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed.
    pub async fn set_auto_defaults(
        &self,
        thread_id: &str,
        run_mode: Option<&str>,
        policy: Option<Option<&Value>>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO rein_thread_auto (thread_id, run_mode, policy, policy_set)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (thread_id) DO UPDATE SET
                 run_mode = COALESCE(EXCLUDED.run_mode, rein_thread_auto.run_mode),
                 policy = CASE WHEN $4 THEN EXCLUDED.policy ELSE rein_thread_auto.policy END,
                 policy_set = rein_thread_auto.policy_set OR $4",
        )
        .bind(thread_id)
        .bind(run_mode)
        .bind(policy.flatten().map(crate::nul::encode))
        .bind(policy.is_some())
        .execute(&self.pool)
        .await
        .map(|_| ())
    }

    /// Adds a round's tokens and reports (a JSON array) to the thread's
    /// totals, atomically; the row after.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed (so do not retry it blindly: the tokens would count
    /// twice).
    pub async fn add_to_session(
        &self,
        thread_id: &str,
        tokens: i64,
        reports: &Value,
    ) -> Result<StoredThreadAuto, sqlx::Error> {
        let row: StoredThreadAuto = sqlx::query_as(
            "INSERT INTO rein_thread_auto (thread_id, tokens, reports)
             VALUES ($1, $2, $3)
             ON CONFLICT (thread_id) DO UPDATE SET
                 tokens = rein_thread_auto.tokens + EXCLUDED.tokens,
                 reports = rein_thread_auto.reports || EXCLUDED.reports
             RETURNING run_mode, policy, policy_set, tokens, reports",
        )
        .bind(thread_id)
        .bind(tokens)
        .bind(crate::nul::encode(reports))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.decoded())
    }

    /// Clears the thread's session totals; its defaults stay.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement; calling it again is safe.
    pub async fn reset_session(&self, thread_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE rein_thread_auto SET tokens = 0, reports = '[]'::jsonb WHERE thread_id = $1",
        )
        .bind(thread_id)
        .execute(&self.pool)
        .await
        .map(|_| ())
    }

    /// Stores an auto-mode round's session state with its run (resolved
    /// when the run started, so a run carried on after a park keeps it).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement; calling it again is safe.
    pub async fn set_run_auto(&self, run_id: &str, auto: &Value) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE rein_runs SET auto = $2 WHERE run_id = $1")
            .bind(run_id)
            .bind(crate::nul::encode(auto))
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// The auto-mode state stored with a run, if any.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn run_auto(&self, run_id: &str) -> Result<Option<Value>, sqlx::Error> {
        sqlx::query_scalar("SELECT auto FROM rein_runs WHERE run_id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map(|v: Option<Option<Value>>| v.flatten().map(crate::nul::decode))
    }

    /// Queues an auto-mode session's next round (`enqueue`, `auto` its
    /// session state) after round `after` ended here — only while this
    /// process still holds the thread (fenced), `after` was not asked to
    /// cancel, and no `interrupt` submission waits on the thread: a round
    /// whose end a client overtook starts nothing. `false` when refused.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, the round may or may not
    /// have been queued.
    pub async fn submit_next_round(
        &self,
        thread_id: &str,
        after: &str,
        run_id: &str,
        agent_id: &str,
        messages: &Value,
        auto: &Value,
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let inserted: Option<String> = sqlx::query_scalar(fenced!(
            "ok AS (
                 SELECT 1 WHERE EXISTS (SELECT 1 FROM fence)
                   AND NOT EXISTS (SELECT 1 FROM rein_runs WHERE run_id = $4 AND cancel_requested)
                   AND NOT EXISTS (SELECT 1 FROM rein_runs
                                   WHERE thread_id = $1 AND status = 'queued' AND interrupt)
             )
             INSERT INTO rein_runs (run_id, thread_id, agent_id, interrupt, messages, auto)
             SELECT $5, $1, $6, false, $7, $8 FROM ok
             RETURNING run_id"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(after)
        .bind(run_id)
        .bind(agent_id)
        .bind(crate::nul::encode(messages))
        .bind(crate::nul::encode(auto))
        .fetch_optional(&self.pool)
        .await?;
        Ok(inserted.is_some())
    }
}
