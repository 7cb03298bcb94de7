//! [`PgThreadStore`]: thread histories in PostgreSQL, each write one
//! statement, fenced when the store belongs to a [`Leases`] holder (which
//! then keeps the histories of the threads it holds).

use std::sync::Arc;

use dashmap::DashMap;
use rein_runtime::thread_store::{ThreadStore, ThreadStoreError};
use rein_runtime_contract::message::Message;
use sqlx::postgres::PgPool;

use crate::Leases;

/// A durable [`ThreadStore`]. Made with [`new`](Self::new) it writes
/// freely (one process); made with [`fenced`](Self::fenced) it writes a
/// thread only with a current lease on it.
///
/// A fenced store also keeps the histories of the threads its process
/// holds: while the lease holds, only this process writes the thread (the
/// fence refuses everyone else), so a history loaded or written at fence
/// `f` is current for as long as the lease still has fence `f`. Loads of a
/// held thread are then answered from memory; [`forget`](Self::forget)
/// drops a thread given up.
#[derive(Debug, Clone)]
pub struct PgThreadStore {
    pool: PgPool,
    leases: Option<Arc<Leases>>,
    /// Per held thread: the fence it was read or written at, and the
    /// history then.
    held: Arc<DashMap<String, (i64, Vec<Message>)>>,
}

impl PgThreadStore {
    /// A store that writes without ownership checks (a single process).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            leases: None,
            held: Arc::default(),
        }
    }

    /// A store whose writes need `leases` to hold the thread, checked in
    /// each write's transaction against the thread's current fence.
    pub fn fenced(pool: PgPool, leases: Arc<Leases>) -> Self {
        Self {
            pool,
            leases: Some(leases),
            held: Arc::default(),
        }
    }

    /// Drops what is kept of the thread's history (its lease was given up
    /// or lost).
    pub fn forget(&self, thread_id: &str) {
        self.held.remove(thread_id);
    }

    /// One write of a thread's history, in one statement: makes sure the
    /// thread's row exists and locks it, checks the fence, then (with
    /// `replace`) drops the history and appends `messages`.
    async fn write(
        &self,
        thread_id: &str,
        replace: bool,
        messages: &[Message],
    ) -> Result<(), WriteError> {
        let fence = match &self.leases {
            None => None,
            Some(leases) => match leases.fence(thread_id) {
                Some(fence) => Some(fence),
                None => {
                    self.forget(thread_id);
                    return Err(WriteError::Refused(format!(
                        "this process ({}) does not hold the thread's lease; nothing was written",
                        leases.owner()
                    )));
                }
            },
        };
        let json: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::to_value(m).map(|v| crate::nul::encode(&v).into_owned()))
            .collect::<Result<_, _>>()
            .map_err(|e| WriteError::Refused(format!("a message does not serialize: {e}")))?;
        // The upsert locks the thread's row until commit, so the fence
        // cannot change under the write. One snapshot: with `replace`, the
        // new rows number on from the old ones they replace.
        let current: i64 = sqlx::query_scalar(APPEND)
            .bind(thread_id)
            .bind(fence)
            .bind(replace)
            .bind(&json)
            .fetch_one(&self.pool)
            .await
            .inspect_err(|_| self.forget(thread_id))?;
        if let (Some(held), Some(leases)) = (fence, &self.leases) {
            if held != current {
                self.forget(thread_id);
                return Err(WriteError::Refused(format!(
                    "fenced: this process ({}) held the thread at fence {held}, but it is now at fence {current} (another process took it over); nothing was written",
                    leases.owner()
                )));
            }
            if let Some(mut kept) = self.held.get_mut(thread_id) {
                if kept.0 == held {
                    if replace {
                        kept.1.clear();
                    }
                    kept.1.extend_from_slice(messages);
                } else {
                    drop(kept);
                    self.forget(thread_id);
                }
            }
        }
        Ok(())
    }

    /// [`write`](Self::write), retried while the database is unreachable
    /// (a restart) for up to [`WRITE_RETRY`].
    async fn write_retrying(
        &self,
        thread_id: &str,
        replace: bool,
        messages: &[Message],
    ) -> Result<(), ThreadStoreError> {
        let start = tokio::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            match self.write(thread_id, replace, messages).await {
                Ok(()) => return Ok(()),
                Err(WriteError::Db(e))
                    if crate::is_transient(&e) && start.elapsed() < WRITE_RETRY =>
                {
                    tracing::warn!(error = %e, thread_id, "the database is unreachable; retrying the history write");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                Err(WriteError::Db(e)) => {
                    return Err(ThreadStoreError::new(thread_id, e.to_string()));
                }
                Err(WriteError::Refused(why)) => return Err(ThreadStoreError::new(thread_id, why)),
            }
        }
    }
}

/// How long a write waits for an unreachable database (e.g. restarting)
/// before it fails.
pub const WRITE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

enum WriteError {
    Db(sqlx::Error),
    Refused(String),
}

impl From<sqlx::Error> for WriteError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e)
    }
}

/// The result given to a tool call whose run was lost with its process.
pub const LOST_WORKER_NOTE: &str = "error: the process running this call was lost (its lease on the thread expired); the call may or may not have run";

impl PgThreadStore {
    /// After taking a thread from a lost process: answers every tool call
    /// of its history that has no result with [`LOST_WORKER_NOTE`] (the
    /// call may or may not have run). Returns how many were answered.
    ///
    /// # Errors
    ///
    /// The store failed (or, fenced, the thread is not held).
    ///
    /// # Cancel safety
    ///
    /// One transaction: dropped before it commits, nothing is repaired.
    pub async fn repair_lost(
        &self,
        thread_id: &str,
        held: &[String],
    ) -> Result<usize, ThreadStoreError> {
        let mut history = self.load(thread_id).await?;
        // The round of a parked run's held calls stays as it is (the run
        // is carried on); the rounds before it are repaired.
        let parked_round = (!held.is_empty())
            .then(|| {
                history
                    .iter()
                    .rposition(|m| m.tool_calls.iter().any(|c| held.contains(&c.id)))
            })
            .flatten();
        let tail = match parked_round {
            Some(at) => history.split_off(at),
            None => Vec::new(),
        };
        let added = rein_runtime::history::repair_with_status(
            &mut history,
            0,
            LOST_WORKER_NOTE,
            rein_runtime_contract::lifecycle::ToolCallStatus::MayHaveCompleted,
        );
        history.extend(tail);
        if added > 0 {
            self.replace(thread_id, &history).await?;
        }
        Ok(added)
    }
}

#[async_trait::async_trait]
impl ThreadStore for PgThreadStore {
    /// Histories live in the database: a round's calls are stored before
    /// they run, so a lost process's open calls can be answered.
    fn outlives_the_process(&self) -> bool {
        true
    }

    /// A fenced store takes the child's thread's lease (renewed with the
    /// process's other leases until [`release_child`](Self::release_child)).
    async fn hold_for_child(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        let Some(leases) = &self.leases else {
            return Ok(());
        };
        match leases.acquire(thread_id).await {
            Ok(Some(_)) => {
                leases.pin(thread_id);
                Ok(())
            }
            Ok(None) => Err(ThreadStoreError::new(
                thread_id,
                "another process holds this thread; the sub-agent's run did not start",
            )),
            Err(e) => Err(ThreadStoreError::new(thread_id, e.to_string())),
        }
    }

    async fn release_child(&self, thread_id: &str) {
        // The last of the child's holders (its run, the service writing
        // its record) gives the lease up.
        if let Some(leases) = &self.leases
            && leases.unpin(thread_id)
        {
            self.forget(thread_id);
            if let Err(e) = leases.release(thread_id).await {
                tracing::warn!(thread = %thread_id, "could not release a sub-agent's thread (its lease expires on its own): {e}");
            }
        }
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Message>, ThreadStoreError> {
        let fence = self.leases.as_ref().and_then(|l| l.fence(thread_id));
        if let Some(fence) = fence
            && let Some(kept) = self.held.get(thread_id)
            && kept.0 == fence
        {
            return Ok(kept.1.clone());
        }
        let rows: Vec<serde_json::Value> = sqlx::query_scalar(LOAD)
            .bind(thread_id)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| ThreadStoreError::new(thread_id, e.to_string()))?;
        let history: Vec<Message> = rows
            .into_iter()
            .map(|row| {
                serde_json::from_value(crate::nul::decode(row)).map_err(|e| {
                    ThreadStoreError::new(thread_id, format!("a stored message is unreadable: {e}"))
                })
            })
            .collect::<Result<_, _>>()?;
        match fence {
            // Read under the lease: nobody else writes it until it ends.
            // (A fence taken before the read and unchanged after it.)
            Some(fence) if self.leases.as_ref().and_then(|l| l.fence(thread_id)) == Some(fence) => {
                self.held
                    .insert(thread_id.to_owned(), (fence, history.clone()));
            }
            _ => self.forget(thread_id),
        }
        Ok(history)
    }

    async fn append(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.write_retrying(thread_id, false, messages).await
    }

    async fn replace(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.write_retrying(thread_id, true, messages).await
    }

    /// Drops the history; the thread's row (and its fence) stays, so a
    /// stale owner stays fenced out of a thread that is used again.
    async fn delete(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        self.replace(thread_id, &[]).await
    }
}

/// The statement that appends to (or replaces) a thread's stored history.
pub(crate) const APPEND: &str = "WITH t AS (
                 INSERT INTO rein_threads (thread_id) VALUES ($1)
                 ON CONFLICT (thread_id) DO UPDATE SET fence = rein_threads.fence
                 RETURNING fence
             ),
             ok AS (SELECT 1 FROM t WHERE $2::bigint IS NULL OR t.fence = $2),
             del AS (
                 DELETE FROM rein_messages WHERE $3 AND thread_id = $1 AND EXISTS (SELECT 1 FROM ok)
             ),
             ins AS (
                 INSERT INTO rein_messages (thread_id, seq, message)
                 SELECT $1, base.n + m.ord, m.message
                 FROM (SELECT COALESCE(MAX(seq), 0) AS n FROM rein_messages WHERE thread_id = $1) AS base,
                      unnest($4::jsonb[]) WITH ORDINALITY AS m(message, ord)
                 WHERE EXISTS (SELECT 1 FROM ok)
             )
             SELECT fence FROM t";

/// The statement that loads a thread's stored history.
pub(crate) const LOAD: &str = "SELECT message FROM rein_messages WHERE thread_id = $1 ORDER BY seq";
