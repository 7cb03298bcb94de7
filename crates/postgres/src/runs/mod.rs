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

/// SQL: run `$r` (an alias of `rein_runs`) is **waiting** — parked with
/// no process holding it ([`PgRuns::release_parked`]) and nothing yet
/// making it due: not every call decided, its soonest rule timeout not
/// passed, no cancel request, no `interrupt` submission queued behind it.
/// Nobody takes its thread for it.
macro_rules! waiting {
    ($r:literal) => {
        concat!(
            "(",
            $r,
            ".status = 'running' AND ",
            $r,
            ".parked_calls IS NOT NULL
              AND NOT ",
            $r,
            ".cancel_requested
              AND (",
            $r,
            ".parked_wake_at IS NULL OR ",
            $r,
            ".parked_wake_at > now())
              AND (SELECT count(*) FROM rein_decisions d WHERE d.run_id = ",
            $r,
            ".run_id) < ",
            $r,
            ".parked_calls
              AND NOT EXISTS (SELECT 1 FROM rein_runs q WHERE q.thread_id = ",
            $r,
            ".thread_id
                              AND q.status = 'queued' AND q.interrupt))"
        )
    };
}

mod orphans;
mod submit;

use crate::inbox::Inbox;
pub use auto::StoredThreadAuto;
pub(crate) use decisions::parked_call_ids;
pub use decisions::{RecordedDecision, StoredDecision, StoredPark};
pub use orphans::ORPHAN_GRACE;
pub use parked::ParkedWake;

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
    /// For an auto-mode round: the session's state, stored with the run.
    pub auto: Option<&'a Value>,
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
    /// For an auto-mode round: the session's state stored with it (or
    /// the submission's own `run_mode` / `automation_policy`, to resolve
    /// when the run starts).
    pub auto: Option<Value>,
    /// The thread's auto-mode row when it has one (`run_mode`, `policy`,
    /// `policy_set`, `tokens`), read in the claim's own statement.
    pub thread_auto: Option<Value>,
}

/// A claimed row: run id, agent, messages, cancel asked, auto, the
/// thread's auto-mode row.
type ClaimedRow = (String, String, Value, bool, Option<Value>, Option<Value>);

impl Claimed {
    /// A claimed row, its stored JSON decoded.
    fn from_row(row: ClaimedRow) -> Self {
        let (run_id, agent_id, messages, cancel_requested, auto, thread_auto) = row;
        Self {
            run_id,
            agent_id,
            messages: crate::nul::decode(messages),
            cancel_requested,
            auto: auto.map(crate::nul::decode),
            thread_auto: thread_auto.map(crate::nul::decode),
        }
    }
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

// After the macros, which they use.
mod auto;
mod decisions;
mod parked;

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

    fn fence(&self, thread_id: &str) -> Option<i64> {
        self.leases.fence(thread_id)
    }

    /// A [`fenced_events!`] statement with its first seven parameters
    /// bound: the thread, its fence, this process, the run and its events'
    /// columns.
    fn fenced_events<'q>(
        &'q self,
        sql: &'static str,
        thread_id: &'q str,
        fence: i64,
        run_id: &'q str,
        (seqs, kinds, datas): (&'q Vec<i64>, &'q Vec<&'q str>, &'q Vec<&'q str>),
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, i64, sqlx::postgres::PgArguments> {
        sqlx::query_scalar(sql)
            .bind(thread_id)
            .bind(fence)
            .bind(self.leases.owner())
            .bind(run_id)
            .bind(seqs)
            .bind(kinds)
            .bind(datas)
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
        let row: Option<ClaimedRow> = sqlx::query_as(CLAIM)
            .bind(thread_id)
            .bind(fence)
            .bind(self.leases.owner())
            .bind(interrupting_only)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Claimed::from_row))
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
        let written: i64 = self
            .fenced_events(
                APPEND_EVENTS,
                thread_id,
                fence,
                run_id,
                (&seqs, &kinds, &datas),
            )
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
        let finished: i64 = self
            .fenced_events(FINISH, thread_id, fence, run_id, (&seqs, &kinds, &datas))
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
    /// returns their ids, each with whether the run was parked and
    /// released ([`release_parked`](Self::release_parked)) when the request
    /// was stored: such a run has no process to end it until one takes its
    /// thread. A run that parks after the request sees it itself (its
    /// process checks the thread for open work when it gives it up).
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn cancel_running(
        &self,
        thread_id: &str,
    ) -> Result<Vec<(String, bool)>, sqlx::Error> {
        sqlx::query_as(CANCEL_RUNNING)
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

    /// Records a sub-agent's run (of `parent_run_id`) as `running` on its
    /// own thread, whose lease this process holds (fenced): its events and record are then
    /// written like any run's, and if this process is lost, whoever takes
    /// the child's thread ends it as lost. `false` when the fence refused
    /// it or the run exists.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn start_child(
        &self,
        thread_id: &str,
        run_id: &str,
        agent_id: &str,
        parent_run_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let Some(fence) = self.fence(thread_id) else {
            return Ok(false);
        };
        let inserted: Option<i32> = sqlx::query_scalar(
            "INSERT INTO rein_runs (run_id, thread_id, agent_id, interrupt, messages, status, worker,
                                    started_at, parent_run_id)
             SELECT $2, $1, $3, false, '[]'::jsonb, 'running', $4, now(), $6
             WHERE EXISTS (SELECT 1 FROM rein_threads
                           WHERE thread_id = $1 AND owner = $4 AND fence = $5 AND lease_until > now())
             ON CONFLICT (run_id) DO NOTHING
             RETURNING 1",
        )
        .bind(thread_id)
        .bind(run_id)
        .bind(agent_id)
        .bind(self.leases.owner())
        .bind(fence)
        .bind(parent_run_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(inserted.is_some())
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
        sqlx::query_as(RUNNING)
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
        let rows: Vec<ClaimedRow> = sqlx::query_as(
            "SELECT run_id, agent_id, messages, cancel_requested, auto,
                    (SELECT jsonb_build_object('run_mode', t.run_mode, 'policy', t.policy,
                                               'policy_set', t.policy_set, 'tokens', t.tokens)
                     FROM rein_thread_auto t WHERE t.thread_id = rein_runs.thread_id)
             FROM rein_runs
             WHERE thread_id = $1 AND status = 'running' AND worker = $2
               AND NOT EXISTS (SELECT 1 FROM rein_events e WHERE e.run_id = rein_runs.run_id)
             ORDER BY seq",
        )
        .bind(thread_id)
        .bind(self.leases.owner())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Claimed::from_row).collect())
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

    /// Whether the thread has a queued or running run to work on: none
    /// while a parked run no process holds is waiting (see the `waiting`
    /// SQL predicate) — its queued runs wait behind it.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn has_open(&self, thread_id: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(HAS_OPEN)
            .bind(thread_id)
            .fetch_one(&self.pool)
            .await
    }

    /// Forgets the thread's idempotency keys, client message ids and
    /// auto-mode defaults and totals (the thread was deleted).
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
            "WITH ids AS (DELETE FROM rein_message_ids WHERE thread_id = $1),
                  autos AS (DELETE FROM rein_thread_auto WHERE thread_id = $1)
             UPDATE rein_runs SET idempotency_key = NULL WHERE thread_id = $1",
        )
        .bind(thread_id)
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

fn columns(events: &[StoredEvent]) -> (Vec<i64>, Vec<&str>, Vec<&str>) {
    (
        events.iter().map(|e| e.seq).collect(),
        events.iter().map(|e| e.kind.as_str()).collect(),
        events.iter().map(|e| e.data.as_str()).collect(),
    )
}

/// [`PgRuns::claim`]'s statement.
pub(crate) const CLAIM: &str = fenced!(
    "next AS (
                 SELECT run_id FROM rein_runs
                 WHERE thread_id = $1 AND status = 'queued' AND ($4 = false OR interrupt)
                   AND EXISTS (SELECT 1 FROM fence)
                   AND ($4 OR NOT EXISTS (SELECT 1 FROM rein_runs p
                                          WHERE p.thread_id = $1 AND p.status = 'running'
                                            AND p.parked_calls IS NOT NULL))
                 ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED
             )
             UPDATE rein_runs AS r SET status = 'running', started_at = now(), worker = $3
             FROM next WHERE r.run_id = next.run_id
             RETURNING r.run_id, r.agent_id, r.messages, r.cancel_requested, r.auto,
                       (SELECT jsonb_build_object('run_mode', t.run_mode, 'policy', t.policy,
                                                  'policy_set', t.policy_set, 'tokens', t.tokens)
                        FROM rein_thread_auto t WHERE t.thread_id = r.thread_id)"
);

/// [`PgRuns::append_events`]'s statement.
pub(crate) const APPEND_EVENTS: &str = fenced_events!(
            "
             SELECT (SELECT count(*) FROM fence) FROM (SELECT pg_notify('rein_events', 'e:' || $4)) AS n"
        );

/// [`PgRuns::finish`]'s statement.
pub(crate) const FINISH: &str = fenced_events!(
    ",
             up AS (
                 UPDATE rein_runs SET status = 'finished', record = $8, finished_at = now()
                 WHERE run_id = $4 AND thread_id = $1 AND status <> 'finished'
                   AND EXISTS (SELECT 1 FROM fence)
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM up) FROM (SELECT pg_notify('rein_events',
                 CASE WHEN EXISTS (SELECT 1 FROM up) THEN 'f:' ELSE 'e:' END || $4)) AS n"
);

/// [`PgRuns::cancel_running`]'s statement.
pub(crate) const CANCEL_RUNNING: &str = "WITH up AS (
                 UPDATE rein_runs SET cancel_requested = true
                 WHERE thread_id = $1 AND status = 'running'
                 RETURNING run_id, parked_calls IS NOT NULL AS parked
             )
             SELECT run_id, parked FROM up,
                 LATERAL (SELECT pg_notify('rein_cancel', 'run:' || run_id)) AS n";

/// [`PgRuns::running`]'s statement.
pub(crate) const RUNNING: &str = "SELECT r.run_id, r.agent_id,
                    COALESCE((SELECT MAX(seq) FROM rein_events e WHERE e.run_id = r.run_id), 0)
             FROM rein_runs r WHERE r.thread_id = $1 AND r.status = 'running' ORDER BY r.seq";

/// [`PgRuns::has_open`]'s statement.
pub(crate) const HAS_OPEN: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM rein_runs WHERE thread_id = $1 AND status <> 'finished')
               AND NOT EXISTS (SELECT 1 FROM rein_runs w WHERE w.thread_id = $1 AND ",
    waiting!("w"),
    ")"
);
