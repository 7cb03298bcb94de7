//! [`Ownership`]: which process may run a thread, when several share one
//! durable store.
//!
//! With the in-memory store there is one process and no ownership (the
//! service has none). With a shared store, a process takes a thread's
//! lease before it starts a run there, holds it while the thread has
//! active or queued runs, and gives it up when the thread goes idle; a
//! heartbeat renews it. A process that loses a lease (it was paused past
//! the lease) cancels its run there — and its store writes are refused by
//! the fence anyway.

use std::sync::Arc;

use rein_postgres::Leases;

/// Thread ownership across processes.
#[async_trait::async_trait]
pub trait Ownership: Send + Sync + std::fmt::Debug {
    /// Takes the thread (free, expired, or already ours); `Ok(false)` when
    /// another process owns it.
    ///
    /// # Errors
    ///
    /// The shared store could not be reached.
    async fn acquire(&self, thread_id: &str) -> Result<bool, String>;

    /// Gives the thread up.
    async fn release(&self, thread_id: &str);

    /// Renews every thread held; returns those lost to another process.
    ///
    /// # Errors
    ///
    /// The shared store could not be reached (nothing is known lost).
    async fn renew(&self) -> Result<Vec<String>, String>;

    /// How often [`renew`](Self::renew) must run.
    fn heartbeat(&self) -> std::time::Duration;

    /// The threads held now.
    fn held(&self) -> Vec<String>;

    /// Whether the shared store answers (for `/healthz`).
    ///
    /// # Errors
    ///
    /// What is wrong.
    async fn check(&self) -> Result<(), String>;
}

/// PostgreSQL leases as [`Ownership`].
#[derive(Debug)]
pub struct LeaseOwnership {
    leases: Arc<Leases>,
    heartbeat: std::time::Duration,
}

impl LeaseOwnership {
    /// Ownership through `leases`, renewed every `heartbeat`.
    pub fn new(leases: Arc<Leases>, heartbeat: std::time::Duration) -> Self {
        Self { leases, heartbeat }
    }
}

#[async_trait::async_trait]
impl Ownership for LeaseOwnership {
    async fn acquire(&self, thread_id: &str) -> Result<bool, String> {
        self.leases
            .acquire(thread_id)
            .await
            .map(|fence| fence.is_some())
            .map_err(|e| e.to_string())
    }

    async fn release(&self, thread_id: &str) {
        if let Err(error) = self.leases.release(thread_id).await {
            tracing::warn!(%error, thread_id, "could not release the thread's lease; it expires on its own");
        }
    }

    async fn renew(&self) -> Result<Vec<String>, String> {
        self.leases.renew().await.map_err(|e| e.to_string())
    }

    fn heartbeat(&self) -> std::time::Duration {
        self.heartbeat
    }

    fn held(&self) -> Vec<String> {
        self.leases.held()
    }

    async fn check(&self) -> Result<(), String> {
        self.leases.ping().await.map_err(|e| e.to_string())
    }
}
