//! [`Leases`]: which threads this process owns, with the fence each
//! ownership holds.
//!
//! **Invariant:** a thread's `fence` grows by one each time its owner
//! changes (taking a free, expired or released lease), never otherwise; so
//! the fence a process holds is current exactly while nobody took the
//! thread from it.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use sqlx::postgres::PgPool;

/// One process's thread leases.
#[derive(Debug)]
pub struct Leases {
    pool: PgPool,
    owner: String,
    lease: Duration,
    held: DashMap<String, i64>,
    /// Threads taken from an owner whose lease had expired (a lost
    /// process), until [`take_over`](Self::take_over) is asked.
    taken_over: dashmap::DashSet<String>,
    /// Holders of a sub-agent's thread ([`pin`](Self::pin)): the lease is
    /// given up when the last of them is done.
    pins: DashMap<String, usize>,
}

impl Leases {
    /// Leases held as `owner` (unique per process, e.g. host and pid),
    /// each valid for `lease` after its last renewal.
    pub fn new(pool: PgPool, owner: impl Into<String>, lease: Duration) -> Arc<Self> {
        Arc::new(Self {
            pool,
            owner: owner.into(),
            lease,
            held: DashMap::new(),
            taken_over: dashmap::DashSet::new(),
            pins: DashMap::new(),
        })
    }

    /// Counts one more holder of a thread whose lease this process holds
    /// (a sub-agent's run, and the service writing that run's record);
    /// `false` when the lease is not held.
    pub fn pin(&self, thread_id: &str) -> bool {
        if !self.held.contains_key(thread_id) {
            return false;
        }
        *self.pins.entry(thread_id.to_owned()).or_default() += 1;
        true
    }

    /// Counts one holder less; `true` when it was the last (the caller
    /// then [`release`](Self::release)s the lease).
    pub fn unpin(&self, thread_id: &str) -> bool {
        let last = match self.pins.get_mut(thread_id) {
            Some(mut count) => {
                *count = count.saturating_sub(1);
                *count == 0
            }
            None => true,
        };
        if last {
            self.pins.remove_if(thread_id, |_, count| *count == 0);
        }
        last
    }

    /// How long a lease lasts after its last renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// This process's owner name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Takes the thread's lease if it is free, expired or already ours;
    /// returns the fence it holds, or `None` when another process owns the
    /// thread.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped after its commit, the lease is taken but not
    /// recorded here; it expires on its own (it is not renewed).
    pub async fn acquire(&self, thread_id: &str) -> Result<Option<i64>, sqlx::Error> {
        let row: Option<(i64, bool)> = sqlx::query_as(ACQUIRE)
            .bind(thread_id)
            .bind(&self.owner)
            .bind(self.lease.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some((fence, lost)) => {
                if lost {
                    self.taken_over.insert(thread_id.to_owned());
                }
                self.held.insert(thread_id.to_owned(), fence);
            }
            None => {
                self.held.remove(thread_id);
            }
        }
        Ok(row.map(|(fence, _)| fence))
    }

    /// Renews every lease held; returns the threads whose lease was lost
    /// (taken by another process), which are no longer held.
    ///
    /// # Errors
    ///
    /// The database failed (nothing is renewed or dropped).
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn renew(&self) -> Result<Vec<String>, sqlx::Error> {
        let (threads, fences): (Vec<String>, Vec<i64>) = self
            .held
            .iter()
            .map(|e| (e.key().clone(), *e.value()))
            .unzip();
        if threads.is_empty() {
            return Ok(Vec::new());
        }
        let kept: Vec<String> = sqlx::query_scalar(
            "UPDATE rein_threads AS t
             SET lease_until = now() + make_interval(secs => $4)
             FROM unnest($1::text[], $2::bigint[]) AS h(thread_id, fence)
             WHERE t.thread_id = h.thread_id AND t.fence = h.fence AND t.owner = $3
             RETURNING t.thread_id",
        )
        .bind(&threads)
        .bind(&fences)
        .bind(&self.owner)
        .bind(self.lease.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        // A thread given up and taken again while this ran holds a new
        // fence: it is not lost.
        let mut lost = Vec::new();
        for (thread, fence) in threads.into_iter().zip(fences) {
            if !kept.contains(&thread)
                && self
                    .held
                    .remove_if(&thread, |_, held| *held == fence)
                    .is_some()
            {
                lost.push(thread);
            }
        }
        Ok(lost)
    }

    /// Whether the last [`acquire`](Self::acquire) of the thread took it
    /// from an owner whose lease had expired (a lost process); asking
    /// clears it.
    pub fn take_over(&self, thread_id: &str) -> bool {
        self.taken_over.remove(thread_id).is_some()
    }

    /// Gives the thread's lease up (if still ours) and says so (`NOTIFY
    /// rein_work`, payload `r:<thread id>`); the next owner bumps the
    /// fence.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it answers, it may or may not have
    /// been committed; calling it again is safe.
    pub async fn release(&self, thread_id: &str) -> Result<(), sqlx::Error> {
        let Some((_, fence)) = self.held.remove(thread_id) else {
            return Ok(());
        };
        sqlx::query(RELEASE)
            .bind(thread_id)
            .bind(&self.owner)
            .bind(fence)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether the database answers.
    ///
    /// # Errors
    ///
    /// The database could not be reached.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping it loses nothing.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// The threads whose lease this process holds.
    pub fn held(&self) -> Vec<String> {
        self.held.iter().map(|e| e.key().clone()).collect()
    }

    /// The fence this process holds for the thread, if it holds its lease.
    pub fn fence(&self, thread_id: &str) -> Option<i64> {
        self.held.get(thread_id).map(|f| *f)
    }
}

/// [`Leases::acquire`]'s statement.
pub(crate) const ACQUIRE: &str = "WITH previous AS (
                 SELECT owner IS NOT NULL AND owner <> $2 AND lease_until < now() AS lost
                 FROM rein_threads WHERE thread_id = $1
             )
             INSERT INTO rein_threads (thread_id, owner, fence, lease_until)
             VALUES ($1, $2, 1, now() + make_interval(secs => $3))
             ON CONFLICT (thread_id) DO UPDATE SET
                 fence = CASE
                     WHEN rein_threads.owner = EXCLUDED.owner AND rein_threads.lease_until > now()
                         THEN rein_threads.fence
                     ELSE rein_threads.fence + 1
                 END,
                 owner = EXCLUDED.owner,
                 lease_until = EXCLUDED.lease_until
             WHERE rein_threads.owner IS NULL
                OR rein_threads.owner = EXCLUDED.owner
                OR rein_threads.lease_until < now()
             RETURNING fence, COALESCE((SELECT lost FROM previous), false)";

/// [`Leases::release`]'s statement.
pub(crate) const RELEASE: &str = "WITH up AS (
                 UPDATE rein_threads SET owner = NULL, lease_until = NULL
                 WHERE thread_id = $1 AND owner = $2 AND fence = $3
                 RETURNING thread_id
             )
             SELECT pg_notify('rein_work', 'r:' || thread_id) FROM up";
