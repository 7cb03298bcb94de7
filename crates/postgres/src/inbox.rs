//! The inbox writer: submissions from one process, **group-committed**.
//!
//! Each [`PgRuns::submit`](crate::PgRuns::submit) that can be written
//! without first looking at the thread (every strategy but `reject`) joins
//! a queue; one task writes whatever is queued as one `INSERT` of many
//! rows (one commit, one `NOTIFY rein_work` per thread with an
//! `interrupt` row that this process does not hold), then answers each
//! submitter. Nothing waits for a batch to fill: a lone submission is
//! written at once, and the submissions that arrive while a statement is in
//! flight form the next one — so under load the commits per second stay
//! low while each submission still waits for one statement at most.
//!
//! **Invariants:** a submission is answered `Queued` only after its row
//! is committed; rows of one batch get `seq` in their arrival order, so a
//! thread's submissions from one process are claimed in the order they
//! were accepted; a row the batch could not insert (its idempotency key
//! seen, its run id taken) is answered from what the database holds; a
//! batch is retried while the database is unreachable (a restart, up to
//! `WRITE_RETRY`), and one that fails for good is retried row by row, so
//! each submitter gets its own row's outcome or error.

use std::collections::HashSet;

use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};

use crate::runs::SubmitOutcome;

/// The most rows written by one statement.
const MAX_BATCH: usize = 512;

/// How long a batch waits for more rows when submissions are arriving
/// together (never when one comes alone).
const LINGER: std::time::Duration = std::time::Duration::from_micros(500);

/// One submission, owned (it crosses to the writer task).
#[derive(Debug)]
pub(crate) struct Row {
    pub run_id: String,
    pub thread_id: String,
    pub agent_id: String,
    pub interrupt: bool,
    pub idempotency_key: Option<String>,
    /// The messages' JSON text.
    pub messages: String,
    /// An auto-mode round's session state (JSON text).
    pub auto: Option<String>,
    /// Whether to tell the thread's owner (`NOTIFY rein_work`): for an
    /// `interrupt`, when the submitting process does not hold the thread
    /// (holding it, it starts the run itself).
    pub notify: bool,
}

type Reply = oneshot::Sender<Result<SubmitOutcome, sqlx::Error>>;

/// The queue into the writer task (started on first use).
#[derive(Debug)]
pub(crate) struct Inbox {
    sender: mpsc::UnboundedSender<(Row, Reply)>,
}

impl Inbox {
    /// Starts the writer task on the current Tokio runtime; it ends when
    /// the last `Inbox` handle is dropped.
    pub(crate) fn start(pool: PgPool) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(write(pool, receiver));
        Self { sender }
    }

    /// Writes `row` with whatever else is queued; answers once committed.
    pub(crate) async fn submit(&self, row: Row) -> Result<SubmitOutcome, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        if self.sender.send((row, reply)).is_err() {
            return Err(sqlx::Error::PoolClosed);
        }
        answer.await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

async fn write(pool: PgPool, mut receiver: mpsc::UnboundedReceiver<(Row, Reply)>) {
    let mut batch = Vec::new();
    let mut busy = false;
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if busy && batch.len() < MAX_BATCH {
            // Under load (the last batch was not alone), wait a moment
            // for the submissions on their way: fewer, fuller commits.
            tokio::time::sleep(LINGER).await;
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(row) => batch.push(row),
                    Err(_) => break,
                }
            }
        }
        busy = batch.len() > 1;
        let (rows, replies): (Vec<Row>, Vec<Reply>) =
            std::mem::take(&mut batch).into_iter().unzip();
        let mut attempts = 0;
        let inserted = crate::retry(crate::WRITE_RETRY, || {
            attempts += 1;
            insert(&pool, &rows)
        })
        .await;
        // After a lost connection, a row may have been committed by the
        // attempt whose answer was lost.
        let retried = attempts > 1;
        match inserted {
            Ok(mut inserted) => {
                for (row, reply) in rows.into_iter().zip(replies) {
                    // `remove`: of two rows with one run id, the first won.
                    let outcome = if inserted.remove(&row.run_id) {
                        Ok(SubmitOutcome::Queued)
                    } else {
                        not_inserted(&pool, &row, retried).await
                    };
                    let _ = reply.send(outcome);
                }
            }
            Err(_) => {
                // One bad row (or the database gone for good) fails them
                // all: write them one by one, so each gets its own answer.
                for (row, reply) in rows.into_iter().zip(replies) {
                    let outcome = match insert(&pool, std::slice::from_ref(&row)).await {
                        Ok(inserted) if inserted.contains(&row.run_id) => Ok(SubmitOutcome::Queued),
                        Ok(_) => not_inserted(&pool, &row, true).await,
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(outcome);
                }
            }
        }
    }
}

/// Inserts the rows that conflict with nothing (in order) and notifies
/// each thread that got one; returns the run ids inserted.
async fn insert(pool: &PgPool, rows: &[Row]) -> Result<HashSet<String>, sqlx::Error> {
    let column = |f: fn(&Row) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let keys: Vec<Option<String>> = rows.iter().map(|r| r.idempotency_key.clone()).collect();
    let interrupts: Vec<bool> = rows.iter().map(|r| r.interrupt).collect();
    let notify: Vec<bool> = rows.iter().map(|r| r.notify).collect();
    let inserted: Vec<String> = sqlx::query_scalar(SUBMIT)
        .bind(column(|r| r.run_id.clone()))
        .bind(column(|r| r.thread_id.clone()))
        .bind(column(|r| r.agent_id.clone()))
        .bind(interrupts)
        .bind(keys)
        .bind(column(|r| r.messages.clone()))
        .bind(notify)
        .bind(rows.iter().map(|r| r.auto.clone()).collect::<Vec<_>>())
        .fetch_all(pool)
        .await?;
    Ok(inserted.into_iter().collect())
}

/// Why a row was not inserted: its idempotency key was seen on the thread
/// (the first run's id), else its run id is taken — unless, `retried`,
/// the row found is this very submission, committed by an earlier attempt.
async fn not_inserted(
    pool: &PgPool,
    row: &Row,
    retried: bool,
) -> Result<SubmitOutcome, sqlx::Error> {
    if let Some(key) = &row.idempotency_key {
        let first: Option<String> = sqlx::query_scalar(
            "SELECT run_id FROM rein_runs WHERE thread_id = $1 AND idempotency_key = $2",
        )
        .bind(&row.thread_id)
        .bind(key)
        .fetch_optional(pool)
        .await?;
        return Ok(match first {
            Some(first) if retried && first == row.run_id => SubmitOutcome::Queued,
            Some(first) => SubmitOutcome::Duplicate(first),
            None => SubmitOutcome::RunIdTaken,
        });
    }
    if retried {
        let mine: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM rein_runs
                            WHERE run_id = $1 AND thread_id = $2 AND messages = $3::jsonb)",
        )
        .bind(&row.run_id)
        .bind(&row.thread_id)
        .bind(&row.messages)
        .fetch_one(pool)
        .await?;
        if mine {
            return Ok(SubmitOutcome::Queued);
        }
    }
    Ok(SubmitOutcome::RunIdTaken)
}

/// The statement that inserts submissions (`insert`).
pub(crate) const SUBMIT: &str = "WITH input AS (
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[], $5::text[], $6::text[], $8::text[])
                 WITH ORDINALITY AS s(run_id, thread_id, agent_id, interrupt, idempotency_key, messages, auto, ord)
         ),
         ins AS (
             INSERT INTO rein_runs (run_id, thread_id, agent_id, interrupt, idempotency_key, messages, auto)
             SELECT run_id, thread_id, agent_id, interrupt, idempotency_key, messages::jsonb, auto::jsonb
             FROM input ORDER BY ord
             ON CONFLICT DO NOTHING
             RETURNING run_id, thread_id, interrupt
         ),
         woken AS (
             SELECT pg_notify('rein_work', (CASE WHEN bool_or(ins.interrupt) THEN 'i:' ELSE 'e:' END) || ins.thread_id)
             FROM ins JOIN unnest($1::text[], $7::bool[]) AS n(run_id, notify) USING (run_id)
             WHERE n.notify
             GROUP BY ins.thread_id
         )
         SELECT run_id FROM ins, (SELECT count(*) FROM woken) AS w";
