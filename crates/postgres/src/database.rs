//! [`Database`]: one process's handle on distributed mode's database —
//! its leases, its fenced thread store, the runs every process shares,
//! and the notifications between processes.

use std::sync::Arc;
use std::time::Duration;

use crate::limits::PgLimitLedger;
use sqlx::postgres::PgPool;

use crate::notify::Listener;
use crate::{Leases, PgRuns, PgThreadStore};

/// What a process of distributed mode needs of the database, all fenced by
/// one set of [`Leases`] (this process's identity).
#[derive(Debug, Clone)]
pub struct Database {
    pool: PgPool,
    leases: Arc<Leases>,
    store: PgThreadStore,
    runs: PgRuns,
    limits: Arc<PgLimitLedger>,
    /// Threads taken over from a lost process.
    takeovers: Arc<std::sync::atomic::AtomicU64>,
}

impl Database {
    /// The database behind `pool` as the process `owner`, whose leases
    /// last `lease` without a heartbeat.
    pub fn new(pool: PgPool, owner: impl Into<String>, lease: Duration) -> Self {
        let leases = Leases::new(pool.clone(), owner, lease);
        let limits = Arc::new(PgLimitLedger::new(pool.clone(), leases.owner(), lease));
        Self {
            limits,
            store: PgThreadStore::fenced(pool.clone(), leases.clone()),
            runs: PgRuns::new(pool.clone(), leases.clone()),
            leases,
            pool,
            takeovers: Arc::default(),
        }
    }

    /// The provider limits' ledger, shared by every process
    /// ([`AgentRuntimeBuilder::with_limit_ledger`](rein_runtime::AgentRuntimeBuilder::with_limit_ledger)).
    pub fn limits(&self) -> &Arc<PgLimitLedger> {
        &self.limits
    }

    /// How many threads this process took over from a lost process.
    pub fn takeovers(&self) -> u64 {
        self.takeovers.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This process's leases.
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

    /// The fenced thread store (give it to the runtime).
    pub fn store(&self) -> &PgThreadStore {
        &self.store
    }

    /// The runs.
    pub fn runs(&self) -> &PgRuns {
        &self.runs
    }

    /// Takes the thread's lease (free, expired, or already ours): `false`
    /// when another live process holds it. Taking it from a lost process
    /// first answers the tool calls its run left open (they may or may
    /// not have run); returns how many through `repaired`.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Dropped after the lease was taken, the thread is held and the
    /// repair not done; the lease expires on its own unless renewed.
    pub async fn acquire(&self, thread_id: &str) -> Result<bool, crate::Error> {
        let held = self.leases.acquire(thread_id).await?.is_some();
        if held && self.leases.take_over(thread_id) {
            // A run parked there whose calls never ran is carried on: its
            // held calls stay open.
            let parked = self.runs().parked(Some(thread_id)).await?;
            let held_calls: Vec<String> = parked
                .iter()
                .filter(|p| p.thread_id == thread_id && !p.applied)
                .flat_map(|p| crate::runs::parked_call_ids(&p.event))
                .collect();
            let repaired = self
                .store
                .repair_lost(thread_id, &held_calls)
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
            self.takeovers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                thread_id,
                repaired,
                "took the thread over from a lost process"
            );
        }
        Ok(held)
    }

    /// Gives the thread's lease up and forgets its cached history.
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, the lease may be kept until it expires.
    pub async fn release(&self, thread_id: &str) {
        self.store.forget(thread_id);
        if let Err(error) = self.leases.release(thread_id).await {
            tracing::warn!(%error, thread_id, "could not release the thread's lease; it expires on its own");
        }
    }

    /// Renews every lease held; returns the threads lost to another
    /// process (their cached histories are forgotten).
    ///
    /// # Errors
    ///
    /// The database failed (nothing is known lost).
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, some leases may be renewed.
    pub async fn renew(&self) -> Result<Vec<String>, crate::Error> {
        // This process's reservations stay counted as in flight while it
        // lives; a failure here is retried at the next heartbeat.
        if let Err(error) = self.limits.heartbeat().await {
            tracing::debug!(%error, "could not renew the provider limits' lease");
        }
        let lost = self.leases.renew().await?;
        for thread_id in &lost {
            self.store.forget(thread_id);
        }
        Ok(lost)
    }

    /// A listener of every [`Notification`](crate::Notification).
    ///
    /// # Errors
    ///
    /// The database could not be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, nothing is listening.
    pub async fn listen(&self) -> Result<Listener, crate::Error> {
        Listener::connect(&self.pool).await
    }

    /// Whether the database answers.
    ///
    /// # Errors
    ///
    /// The database could not be reached.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn ping(&self) -> Result<(), crate::Error> {
        self.leases.ping().await
    }
}
