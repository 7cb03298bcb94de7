//! Writing submissions: through the inbox's group commit, or alone in a
//! transaction under the thread's lock (`reject`, AG-UI message ids); and
//! the client message ids a thread has seen.

use serde_json::Value;

use super::{NewRun, PgRuns, SubmitOutcome};
use crate::inbox::{Inbox, Row};

impl PgRuns {
    /// Writes a submission (`queued`) and, for an `interrupt` one,
    /// notifies `rein_work` (unless this process holds the thread: its
    /// caller starts the run), unless
    /// its idempotency key was seen on the thread (or, with
    /// `reject_if_busy`, the thread has work). Submissions made at the same time are
    /// committed together (one statement, one commit); a `reject_if_busy`
    /// one is written alone, after looking at the thread.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Dropped before it answers, the submission may or may not have been
    /// committed (resubmit with the same idempotency key to find out).
    pub async fn submit(&self, new: &NewRun<'_>) -> Result<SubmitOutcome, sqlx::Error> {
        if new.reject_if_busy || !new.message_ids.is_empty() {
            return crate::retry(crate::WRITE_RETRY, || self.submit_alone(new)).await;
        }
        let row = Row {
            run_id: new.run_id.to_owned(),
            thread_id: new.thread_id.to_owned(),
            agent_id: new.agent_id.to_owned(),
            interrupt: new.interrupt,
            idempotency_key: new.idempotency_key.map(str::to_owned),
            messages: crate::nul::encode(new.messages).to_string(),
            auto: new.auto.map(|a| crate::nul::encode(a).to_string()),
            // An `enqueue` waits for the thread's current run, whose
            // holder claims the next one when it ends (and, giving the
            // thread up, looks once more and says `r:`): only an
            // `interrupt` has to reach a running holder at once.
            notify: new.interrupt && self.fence(new.thread_id).is_none(),
        };
        self.inbox
            .get_or_init(|| Inbox::start(self.pool.clone()))
            .submit(row)
            .await
    }

    /// [`submit`](Self::submit) with `reject_if_busy` or message ids: one
    /// transaction that takes the thread's turn, looks, and writes.
    /// Retried through a restart: a run id found taken by a row with the
    /// same thread and messages is this submission's own, committed by an
    /// attempt whose answer was lost.
    async fn submit_alone(&self, new: &NewRun<'_>) -> Result<SubmitOutcome, sqlx::Error> {
        let messages = crate::nul::encode(new.messages);
        let mut tx = self.pool.begin().await?;
        // These submissions to one thread take turns, so two of them
        // cannot both find the thread idle, or both record one message id.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(new.thread_id)
            .execute(&mut *tx)
            .await?;
        if !new.message_ids.is_empty() {
            let recorded = sqlx::query(
                "INSERT INTO rein_message_ids (thread_id, message_id)
                 SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING",
            )
            .bind(new.thread_id)
            .bind(new.message_ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if recorded < new.message_ids.len() as u64 {
                drop(tx);
                return Ok(if self.is_own(new).await? {
                    SubmitOutcome::Queued
                } else {
                    SubmitOutcome::MessagesSeen
                });
            }
        }
        if let Some(key) = new.idempotency_key {
            let seen: Option<String> = sqlx::query_scalar(
                "SELECT run_id FROM rein_runs WHERE thread_id = $1 AND idempotency_key = $2",
            )
            .bind(new.thread_id)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(run_id) = seen {
                return Ok(SubmitOutcome::Duplicate(run_id));
            }
        }
        let busy: bool = new.reject_if_busy
            && sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM rein_runs WHERE thread_id = $1 AND status <> 'finished')",
            )
            .bind(new.thread_id)
            .fetch_one(&mut *tx)
            .await?;
        if busy {
            return Ok(SubmitOutcome::Busy);
        }
        let inserted = sqlx::query_scalar::<_, String>(
            "WITH ins AS (
                 INSERT INTO rein_runs (run_id, thread_id, agent_id, interrupt, idempotency_key, messages, auto)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (thread_id, idempotency_key) DO NOTHING
                 RETURNING run_id
             )
             SELECT run_id FROM ins,
                  LATERAL (SELECT pg_notify('rein_work', (CASE WHEN $4 THEN 'i:' ELSE 'e:' END) || $2)) AS n",
        )
        .bind(new.run_id)
        .bind(new.thread_id)
        .bind(new.agent_id)
        .bind(new.interrupt)
        .bind(new.idempotency_key)
        .bind(messages.as_ref())
        .bind(new.auto.map(crate::nul::encode))
        .fetch_optional(&mut *tx)
        .await;
        match inserted {
            Ok(Some(_)) => {
                tx.commit().await?;
                Ok(SubmitOutcome::Queued)
            }
            Ok(None) => {
                // A concurrent submission with the same key committed
                // first: find it (a fresh statement sees it).
                drop(tx);
                let run_id: String = sqlx::query_scalar(
                    "SELECT run_id FROM rein_runs WHERE thread_id = $1 AND idempotency_key = $2",
                )
                .bind(new.thread_id)
                .bind(new.idempotency_key)
                .fetch_one(&self.pool)
                .await?;
                Ok(SubmitOutcome::Duplicate(run_id))
            }
            Err(sqlx::Error::Database(e)) if e.constraint() == Some("rein_runs_pkey") => {
                drop(tx);
                Ok(if self.is_own(new).await? {
                    SubmitOutcome::Queued
                } else {
                    SubmitOutcome::RunIdTaken
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the run `new` names is stored as `new` describes it: this
    /// submission's own, committed by an attempt whose answer was lost.
    async fn is_own(&self, new: &NewRun<'_>) -> Result<bool, sqlx::Error> {
        self.is_submission(new.run_id, new.thread_id, new.agent_id, new.messages)
            .await
    }

    /// Whether run `run_id` was submitted to `thread_id` for `agent_id`
    /// with `messages` (what makes a repeated idempotency key the same
    /// submission).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn is_submission(
        &self,
        run_id: &str,
        thread_id: &str,
        agent_id: &str,
        messages: &Value,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM rein_runs
             WHERE run_id = $1 AND thread_id = $2 AND agent_id = $3 AND messages = $4)",
        )
        .bind(run_id)
        .bind(thread_id)
        .bind(agent_id)
        .bind(crate::nul::encode(messages).as_ref())
        .fetch_one(&self.pool)
        .await
    }

    /// Which of `ids` the thread has recorded (client message ids, AG-UI).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn seen_message_ids(
        &self,
        thread_id: &str,
        ids: &[String],
    ) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT message_id FROM rein_message_ids WHERE thread_id = $1 AND message_id = ANY($2)",
        )
        .bind(thread_id)
        .bind(ids)
        .fetch_all(&self.pool)
        .await
    }

    /// Records client message ids for the thread (those a run emitted, so
    /// a client sending them back appends nothing).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn remember_message_ids(
        &self,
        thread_id: &str,
        ids: &[String],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO rein_message_ids (thread_id, message_id)
             SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING",
        )
        .bind(thread_id)
        .bind(ids)
        .execute(&self.pool)
        .await
        .map(|_| ())
    }
}
