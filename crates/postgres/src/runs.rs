//! [`PgRuns`]: the runs of every thread — the inbox of submissions, the
//! run records and the runs' events — shared by every process.
//!
//! A submission is a `queued` row of `rein_runs`, committed before the
//! service answers 202. The thread's owner claims rows one by one
//! (`running`), runs them, writes their events (`rein_events`, numbered
//! per run) and finishes them with their record. Every write of a run is
//! **fenced**: it happens only if the thread's fence is still the one this
//! process's lease holds, checked under a share lock of the thread's row in
//! the write's own statement, so a process that lost the thread (paused
//! past its lease, cut off) writes nothing.
//!
//! Notifications (sent at commit): `rein_work` (payload `i:<thread id>`)
//! when a thread another process holds has a new `interrupt` submission
//! (`e:<thread id>` for a lone `reject` one), and `r:<thread id>` when its
//! owner gave it up;
//! `rein_events` (`e:<run id>` when a run has new events, `f:<run id>`
//! when it finished); `rein_cancel` (`run:<run id>`) when a running
//! run is asked to cancel. They make things fast; polling makes them sure.

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sqlx::postgres::PgPool;

use crate::Leases;
use crate::inbox::{Inbox, Row};

/// A submission to write.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// The run's id (unique across threads).
    pub run_id: &'a str,
    /// Its thread.
    pub thread_id: &'a str,
    /// Its agent.
    pub agent_id: &'a str,
    /// `interrupt`: when the thread has a run, cancel it and run this next.
    pub interrupt: bool,
    /// `reject`: refuse when the thread has a run or a queued submission.
    pub reject_if_busy: bool,
    /// Makes a repeated submission find this one.
    pub idempotency_key: Option<&'a str>,
    /// The input messages (the contract's serde shape, as a JSON array).
    pub messages: &'a Value,
    /// Client message ids (AG-UI) the submission records for its thread;
    /// if any was recorded meanwhile the submission is refused with
    /// [`SubmitOutcome::MessagesSeen`] (read them again and resubmit).
    pub message_ids: &'a [String],
}

/// What [`PgRuns::submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// Written, `queued`.
    Queued,
    /// The idempotency key was seen on the thread: the first run's id.
    Duplicate(String),
    /// `reject_if_busy` and the thread has a run or a queued submission.
    Busy,
    /// The run id is taken.
    RunIdTaken,
    /// Some of `message_ids` were recorded for the thread since the caller
    /// read them: nothing was written.
    MessagesSeen,
}

/// A run claimed by the thread's owner.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The run.
    pub run_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its input messages (JSON array).
    pub messages: Value,
    /// Whether a cancel was asked while it was queued.
    pub cancel_requested: bool,
}

/// A run as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredRun {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// `queued`, `running` or `finished`.
    pub status: String,
    /// Its record, once finished.
    pub record: Option<Value>,
    /// The idempotency key it was submitted with.
    pub idempotency_key: Option<String>,
}

/// One event of a run, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its number in the run, from 1.
    pub seq: i64,
    /// Its type (`run_started`, …).
    pub kind: String,
    /// Its JSON text.
    pub data: String,
}

/// The runs in PostgreSQL, written by one process (whose [`Leases`] fence
/// its writes).
#[derive(Debug, Clone)]
pub struct PgRuns {
    pool: PgPool,
    leases: Arc<Leases>,
    inbox: Arc<OnceLock<Inbox>>,
}

/// The share lock on the thread's row that fences a write: present only
/// while the row still has the writer's owner and fence. `$1` thread,
/// `$2` fence, `$3` owner.
macro_rules! fenced {
    ($rest:expr) => {
        concat!(
            "WITH fence AS (SELECT 1 FROM rein_threads
                 WHERE thread_id = $1 AND fence = $2 AND owner = $3 FOR SHARE),",
            $rest
        )
    };
}

/// [`fenced!`] with the CTE `ev` that inserts a run's events (fenced):
/// `$4` run, `$5`/`$6`/`$7` the events' numbers, types and JSON texts.
macro_rules! fenced_events {
    ($rest:literal) => {
        fenced!(concat!(
            "ev AS (
                 INSERT INTO rein_events (run_id, seq, kind, data)
                 SELECT $4, e.seq, e.kind, e.data
                 FROM unnest($5::bigint[], $6::text[], $7::text[]) AS e(seq, kind, data)
                 WHERE EXISTS (SELECT 1 FROM fence)
                 ON CONFLICT DO NOTHING
                 RETURNING 1
             )",
            $rest
        ))
    };
}

impl PgRuns {
    /// The runs, written as `leases`' owner.
    pub fn new(pool: PgPool, leases: Arc<Leases>) -> Self {
        Self {
            pool,
            leases,
            inbox: Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The leases that fence this process's writes.
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

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
                return Ok(if self.is_mine(new, &messages).await? {
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
                 INSERT INTO rein_runs (run_id, thread_id, agent_id, interrupt, idempotency_key, messages)
                 VALUES ($1, $2, $3, $4, $5, $6)
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
                Ok(if self.is_mine(new, &messages).await? {
                    SubmitOutcome::Queued
                } else {
                    SubmitOutcome::RunIdTaken
                })
            }
            Err(e) => Err(e),
        }
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

    /// Whether the run `new` names is stored with its thread and messages:
    /// this submission's own, committed by an attempt whose answer was
    /// lost.
    async fn is_mine(&self, new: &NewRun<'_>, messages: &Value) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM rein_runs
             WHERE run_id = $1 AND thread_id = $2 AND messages = $3)",
        )
        .bind(new.run_id)
        .bind(new.thread_id)
        .bind(messages)
        .fetch_one(&self.pool)
        .await
    }

    fn fence(&self, thread_id: &str) -> Option<i64> {
        self.leases.fence(thread_id)
    }

    /// Claims the thread's next queued run (the oldest; with
    /// `interrupting_only`, the oldest `interrupt` one) and marks it
    /// `running`. `None` when there is none, or the thread is not held.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped after its commit, the run is `running` here
    /// with nobody driving it; [`claimed_here`](Self::claimed_here) finds it.
    pub async fn claim(
        &self,
        thread_id: &str,
        interrupting_only: bool,
    ) -> Result<Option<Claimed>, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(None);
        };
        let row: Option<(String, String, Value, bool)> = sqlx::query_as(fenced!(
            "next AS (
                 SELECT run_id FROM rein_runs
                 WHERE thread_id = $1 AND status = 'queued' AND ($4 = false OR interrupt)
                   AND EXISTS (SELECT 1 FROM fence)
                 ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED
             )
             UPDATE rein_runs AS r SET status = 'running', started_at = now(), worker = $3
             FROM next WHERE r.run_id = next.run_id
             RETURNING r.run_id, r.agent_id, r.messages, r.cancel_requested"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(interrupting_only)
        .fetch_optional(&self.pool)
        .await?;
        Ok(
            row.map(|(run_id, agent_id, messages, cancel_requested)| Claimed {
                run_id,
                agent_id,
                messages: crate::nul::decode(messages),
                cancel_requested,
            }),
        )
    }

    /// Appends a run's events (fenced) and notifies `rein_events`; `false`
    /// when the fence refused them (nothing written).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn append_events(
        &self,
        thread_id: &str,
        run_id: &str,
        events: &[StoredEvent],
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let (seqs, kinds, datas) = columns(events);
        let written: i64 = sqlx::query_scalar(fenced_events!(
            "
             SELECT (SELECT count(*) FROM fence) FROM (SELECT pg_notify('rein_events', 'e:' || $4)) AS n"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(run_id)
        .bind(&seqs)
        .bind(&kinds)
        .bind(&datas)
        .fetch_one(&self.pool)
        .await?;
        Ok(written > 0)
    }

    /// Finishes a running run (fenced): appends its last events, stores its
    /// record, marks it `finished` and notifies `rein_events`, in one
    /// statement. `false` when the fence refused it or it had finished.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn finish(
        &self,
        thread_id: &str,
        run_id: &str,
        record: &Value,
        events: &[StoredEvent],
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let (seqs, kinds, datas) = columns(events);
        let finished: i64 = sqlx::query_scalar(fenced_events!(
            ",
             up AS (
                 UPDATE rein_runs SET status = 'finished', record = $8, finished_at = now()
                 WHERE run_id = $4 AND thread_id = $1 AND status <> 'finished'
                   AND EXISTS (SELECT 1 FROM fence)
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM up) FROM (SELECT pg_notify('rein_events',
                 CASE WHEN EXISTS (SELECT 1 FROM up) THEN 'f:' ELSE 'e:' END || $4)) AS n"
        ))
        .bind(thread_id)
        .bind(fence)
        .bind(self.leases.owner())
        .bind(run_id)
        .bind(&seqs)
        .bind(&kinds)
        .bind(&datas)
        .bind(crate::nul::encode(record).as_ref())
        .fetch_one(&self.pool)
        .await?;
        Ok(finished > 0)
    }

    /// Finishes a queued run that never started (cancelled while queued):
    /// its last events and its record, if it is still queued. Any process
    /// may do it: a queued run has no writer yet, and a claim and this take
    /// the row's lock in turn.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn finish_queued(
        &self,
        run_id: &str,
        record: &Value,
        events: &[StoredEvent],
    ) -> Result<bool, sqlx::Error> {
        let (seqs, kinds, datas) = columns(events);
        let finished: i64 = sqlx::query_scalar(
            "WITH up AS (
                 UPDATE rein_runs SET status = 'finished', record = $1, finished_at = now()
                 WHERE run_id = $2 AND status = 'queued'
                 RETURNING run_id
             ),
             ev AS (
                 INSERT INTO rein_events (run_id, seq, kind, data)
                 SELECT up.run_id, e.seq, e.kind, e.data
                 FROM up, unnest($3::bigint[], $4::text[], $5::text[]) AS e(seq, kind, data)
                 ON CONFLICT DO NOTHING
             )
             SELECT (SELECT count(*) FROM up) FROM (SELECT pg_notify('rein_events',
                 CASE WHEN EXISTS (SELECT 1 FROM up) THEN 'f:' ELSE 'e:' END || $2)) AS n",
        )
        .bind(crate::nul::encode(record).as_ref())
        .bind(run_id)
        .bind(&seqs)
        .bind(&kinds)
        .bind(&datas)
        .fetch_one(&self.pool)
        .await?;
        Ok(finished > 0)
    }

    /// Asks the owner of a running run to end one of its tool calls
    /// (`NOTIFY rein_cancel` with `call:<run id> <call id>`; not polled: a
    /// listener that is reconnecting misses it). Returns the run's status,
    /// `None` if it does not exist; only a `running` run is notified.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn request_tool_call_cancel(
        &self,
        run_id: &str,
        call_id: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT status,
                    CASE WHEN status = 'running'
                         THEN pg_notify('rein_cancel', 'call:' || $1 || ' ' || $2) END
             FROM rein_runs WHERE run_id = $1",
        )
        .bind(run_id)
        .bind(call_id)
        .fetch_optional(&self.pool)
        .await
    }

    /// Asks the owner of a running run to cancel it (`NOTIFY rein_cancel`
    /// with `run:<id>`; owners also poll). Returns the run's status, `None`
    /// if it does not exist.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn request_cancel(&self, run_id: &str) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(
            "WITH up AS (
                 UPDATE rein_runs SET cancel_requested = true
                 WHERE run_id = $1 AND status <> 'finished'
                 RETURNING status
             )
             SELECT COALESCE((SELECT status FROM up), (SELECT status FROM rein_runs WHERE run_id = $1))
             FROM (SELECT pg_notify('rein_cancel', 'run:' || $1)) AS n",
        )
        .bind(run_id)
        .fetch_one(&self.pool)
        .await
    }

    /// Asks the owner of the thread's running runs to cancel them, in one
    /// statement (as [`request_cancel`](Self::request_cancel) for each);
    /// returns their ids.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn cancel_running(&self, thread_id: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "WITH up AS (
                 UPDATE rein_runs SET cancel_requested = true
                 WHERE thread_id = $1 AND status = 'running'
                 RETURNING run_id
             )
             SELECT run_id FROM up, LATERAL (SELECT pg_notify('rein_cancel', 'run:' || run_id)) AS n",
        )
        .bind(thread_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The running runs of `threads` with a cancel request.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn cancel_requested(&self, threads: &[String]) -> Result<Vec<String>, sqlx::Error> {
        if threads.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(
            "SELECT run_id FROM rein_runs
             WHERE thread_id = ANY($1) AND status = 'running' AND cancel_requested",
        )
        .bind(threads)
        .fetch_all(&self.pool)
        .await
    }

    /// A run, if stored.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn run(&self, run_id: &str) -> Result<Option<StoredRun>, sqlx::Error> {
        sqlx::query_as::<_, StoredRun>(
            "SELECT run_id, thread_id, agent_id, status, record, idempotency_key
             FROM rein_runs WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await
        .map(|run| {
            run.map(|mut run| {
                run.record = run.record.map(crate::nul::decode);
                run
            })
        })
    }

    /// A run's events after `after`, in order.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn events_after(
        &self,
        run_id: &str,
        after: i64,
    ) -> Result<Vec<StoredEvent>, sqlx::Error> {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT seq, kind, data FROM rein_events WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(run_id)
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(seq, kind, data)| StoredEvent { seq, kind, data })
            .collect())
    }

    /// The thread's `running` runs (id, agent, number of the last event):
    /// after taking the thread, these are runs of a previous owner.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn running(
        &self,
        thread_id: &str,
    ) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT r.run_id, r.agent_id,
                    COALESCE((SELECT MAX(seq) FROM rein_events e WHERE e.run_id = r.run_id), 0)
             FROM rein_runs r WHERE r.thread_id = $1 AND r.status = 'running' ORDER BY r.seq",
        )
        .bind(thread_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The thread's runs this process claimed (`running` under its owner
    /// name) that have no event yet, oldest first, as [`claim`](Self::claim)
    /// returned them; none while this process does not hold the thread. After a claim that failed, one of them that this
    /// process does not drive was claimed with the answer lost (the commit
    /// succeeded, the reply did not arrive): it never started, and its
    /// claimer starts it now.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn claimed_here(&self, thread_id: &str) -> Result<Vec<Claimed>, sqlx::Error> {
        // Only while the thread is held, as for a claim.
        if self.fence(thread_id).is_none() {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, String, Value, bool)> = sqlx::query_as(
            "SELECT run_id, agent_id, messages, cancel_requested FROM rein_runs
             WHERE thread_id = $1 AND status = 'running' AND worker = $2
               AND NOT EXISTS (SELECT 1 FROM rein_events e WHERE e.run_id = rein_runs.run_id)
             ORDER BY seq",
        )
        .bind(thread_id)
        .bind(self.leases.owner())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(run_id, agent_id, messages, cancel_requested)| Claimed {
                run_id,
                agent_id,
                messages: crate::nul::decode(messages),
                cancel_requested,
            })
            .collect())
    }

    /// The thread's queued runs, oldest first.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn queued(&self, thread_id: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT run_id FROM rein_runs WHERE thread_id = $1 AND status = 'queued' ORDER BY seq",
        )
        .bind(thread_id)
        .fetch_all(&self.pool)
        .await
    }

    /// Whether the thread has a queued or running run.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn has_open(&self, thread_id: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM rein_runs WHERE thread_id = $1 AND status <> 'finished')",
        )
        .bind(thread_id)
        .fetch_one(&self.pool)
        .await
    }

    /// Threads with queued or running runs that no live process owns (their
    /// owner released them, or its lease expired): work to take, at most
    /// 256 a scan.
    ///
    /// A thread whose oldest open run is younger than [`ORPHAN_GRACE`] is
    /// left to the process that submitted it, which takes the thread
    /// itself right after writing the run; the scan is for work whose
    /// submitter or owner is gone.
    ///
    /// The scans are fair: they go round the orphaned threads in thread id
    /// order, each starting after the last thread the previous scan of this
    /// owner ([`Leases::owner`]) answered and wrapping around at the end.
    /// So with `n` orphaned threads, each is answered within `⌈n/256⌉`
    /// consecutive scans, whether or not the threads answered before it were
    /// taken. (Scans that each started at the first thread id answered the
    /// same 256 for as long as those stayed orphaned, and never the rest.)
    /// Where an owner's scans are is kept in this process; a new process
    /// starts at the first thread id.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropped before it answers, the owner's cursor does not
    /// move.
    pub async fn orphaned(&self) -> Result<Vec<String>, sqlx::Error> {
        /// The most threads a scan answers.
        const LIMIT: usize = 256;
        /// A loose scan of `rein_runs_open` (one index probe per thread
        /// with work, however many runs are queued on it) from a first
        /// thread id on, keeping the orphaned threads (one probe of
        /// `rein_threads` each), the first `$3` in thread id order: `$1`
        /// the grace in seconds, `$2` the bound. The order is asked for:
        /// the rows of a join (as this scan had) need not come in the
        /// order of the scan, and then neither the limit nor the cursor
        /// follow the ids.
        macro_rules! scan {
            ($first:literal, $step:literal, $last:literal) => {
                concat!(
                    "WITH RECURSIVE open(thread_id) AS (
                         (SELECT thread_id FROM rein_runs WHERE status <> 'finished' ",
                    $first,
                    " ORDER BY thread_id LIMIT 1)
                         UNION ALL
                         SELECT (SELECT r.thread_id FROM rein_runs r
                                 WHERE r.status <> 'finished' AND r.thread_id > open.thread_id
                                 ORDER BY r.thread_id LIMIT 1)
                         FROM open WHERE open.thread_id IS NOT NULL ",
                    $step,
                    "
                     )
                     SELECT o.thread_id FROM open o
                     WHERE o.thread_id IS NOT NULL ",
                    $last,
                    "
                       AND COALESCE((SELECT (t.owner IS NULL OR t.lease_until < now()) IS TRUE
                                     FROM rein_threads t WHERE t.thread_id = o.thread_id), true)
                       AND (SELECT r.created_at FROM rein_runs r
                            WHERE r.thread_id = o.thread_id AND r.status <> 'finished'
                            ORDER BY r.seq LIMIT 1) < now() - make_interval(secs => $1)
                     ORDER BY o.thread_id
                     LIMIT $3"
                )
            };
        }
        /// The threads after the cursor (`$2`).
        const AFTER: &str = scan!("AND thread_id > $2", "", "");
        /// The threads up to the cursor (`$2`, inclusive; `NULL`: all).
        const UP_TO: &str = scan!(
            "",
            "AND ($2::text IS NULL OR open.thread_id < $2)",
            "AND ($2::text IS NULL OR o.thread_id <= $2)"
        );
        /// Each owner's cursor: the last thread its previous scan answered.
        /// Only where the next scan starts, so a lost one costs nothing but
        /// one round's order.
        static CURSORS: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
            std::sync::Mutex::new(std::collections::BTreeMap::new());

        let owner = self.leases.owner();
        let cursor = CURSORS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(owner)
            .cloned();
        let grace = ORPHAN_GRACE.as_secs_f64();
        let mut threads: Vec<String> = match &cursor {
            Some(after) => {
                sqlx::query_scalar(AFTER)
                    .bind(grace)
                    .bind(after)
                    .bind(LIMIT as i64)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => Vec::new(),
        };
        if threads.len() < LIMIT {
            // Round again from the first thread id, up to the cursor.
            let more: Vec<String> = sqlx::query_scalar(UP_TO)
                .bind(grace)
                .bind(cursor.as_deref())
                .bind((LIMIT - threads.len()) as i64)
                .fetch_all(&self.pool)
                .await?;
            threads.extend(more);
        }
        if let Some(last) = threads.last() {
            let mut cursors = CURSORS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A process has one owner; a test process has many, briefly.
            if cursors.len() >= 1024 && !cursors.contains_key(owner) {
                cursors.clear();
            }
            cursors.insert(owner.to_owned(), last.clone());
        }
        Ok(threads)
    }

    /// Forgets the thread's idempotency keys and client message ids (the
    /// thread was deleted).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn forget_keys(&self, thread_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "WITH ids AS (DELETE FROM rein_message_ids WHERE thread_id = $1)
             UPDATE rein_runs SET idempotency_key = NULL WHERE thread_id = $1",
        )
        .bind(thread_id)
        .execute(&self.pool)
        .await
        .map(|_| ())
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

    /// Drops finished runs (and their events) older than `ttl`; returns
    /// how many.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn sweep(&self, ttl: std::time::Duration) -> Result<u64, sqlx::Error> {
        sqlx::query(
            "DELETE FROM rein_runs WHERE status = 'finished'
             AND finished_at < now() - make_interval(secs => $1)",
        )
        .bind(ttl.as_secs_f64())
        .execute(&self.pool)
        .await
        .map(|r| r.rows_affected())
    }
}

/// How long a new run is left to its submitter before the scan
/// ([`PgRuns::orphaned`]) counts its thread as work to take: a submitter
/// writes the run, then takes the thread; a scan in between would take it
/// instead, and the submitter would answer `queued` for a run another
/// process is already running.
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn columns(events: &[StoredEvent]) -> (Vec<i64>, Vec<&str>, Vec<&str>) {
    (
        events.iter().map(|e| e.seq).collect(),
        events.iter().map(|e| e.kind.as_str()).collect(),
        events.iter().map(|e| e.data.as_str()).collect(),
    )
}

/// Whether a database error is the kind that passes (the connection was
/// lost, the server is restarting), so the operation is worth retrying.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // connection exceptions, admin shutdown, cannot connect now
            code.starts_with("08") || code == "57P01" || code == "57P02" || code == "57P03"
        }),
        _ => false,
    }
}

/// Runs `op` until it succeeds, fails for good, or `within` has passed
/// while the database is unreachable (see [`is_transient`]), backing off
/// between attempts.
///
/// # Errors
///
/// The last error.
///
/// # Cancel safety
///
/// As `op`'s: dropping it drops the attempt under way.
pub async fn retry<T, F, Fut>(within: std::time::Duration, mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let start = tokio::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match op().await {
            Err(e) if is_transient(&e) && start.elapsed() < within => {
                tracing::warn!(error = %e, "the database is unreachable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
