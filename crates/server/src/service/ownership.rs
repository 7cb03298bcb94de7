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

use rein_postgres::{Leases, PgThreadStore};

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

    /// Asks the thread's owner, in whatever process, to cancel its run;
    /// `Ok(false)` when nobody owns the thread.
    ///
    /// # Errors
    ///
    /// The shared store could not be reached.
    async fn request_cancel(&self, thread_id: &str) -> Result<bool, String>;

    /// Whether some process owns the thread now.
    ///
    /// # Errors
    ///
    /// The shared store could not be reached.
    async fn is_owned(&self, thread_id: &str) -> Result<bool, String>;

    /// Waits until threads this process holds have cancel requests (from
    /// any process) and returns them, each request once.
    ///
    /// # Cancel safety
    ///
    /// A request seen by a dropped call is reported by the next one only
    /// if it was not yet returned.
    async fn next_cancels(&self) -> Vec<String>;

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
    store: PgThreadStore,
    heartbeat: std::time::Duration,
    listener: tokio::sync::Mutex<Option<sqlx::postgres::PgListener>>,
}

/// How often cancel requests are polled when no notification comes (the
/// safety net under LISTEN/NOTIFY).
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl LeaseOwnership {
    /// Ownership through `leases`, renewed every `heartbeat`.
    pub fn new(leases: Arc<Leases>, store: PgThreadStore, heartbeat: std::time::Duration) -> Self {
        Self {
            leases,
            store,
            heartbeat,
            listener: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait::async_trait]
impl Ownership for LeaseOwnership {
    /// Taking a thread from a lost process first answers the tool calls
    /// its run left open: they may or may not have run.
    async fn acquire(&self, thread_id: &str) -> Result<bool, String> {
        let held = self
            .leases
            .acquire(thread_id)
            .await
            .map(|fence| fence.is_some())
            .map_err(|e| e.to_string())?;
        if held && self.leases.take_over(thread_id) {
            let repaired = self
                .store
                .repair_lost(thread_id)
                .await
                .map_err(|e| e.to_string())?;
            tracing::warn!(
                thread_id,
                repaired,
                "took the thread over from a lost process"
            );
        }
        Ok(held)
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

    async fn request_cancel(&self, thread_id: &str) -> Result<bool, String> {
        self.leases
            .request_cancel(thread_id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn is_owned(&self, thread_id: &str) -> Result<bool, String> {
        self.leases
            .is_owned(thread_id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn next_cancels(&self) -> Vec<String> {
        loop {
            {
                let mut listener = self.listener.lock().await;
                if listener.is_none() {
                    *listener = self.leases.listen().await.ok();
                }
                match listener.as_mut() {
                    // A notification, or the poll interval, whichever first.
                    Some(l) => {
                        if let Ok(Err(_)) = tokio::time::timeout(CANCEL_POLL, l.recv()).await {
                            *listener = None;
                        }
                    }
                    None => tokio::time::sleep(CANCEL_POLL).await,
                }
            }
            match self.leases.cancel_requests().await {
                Ok(threads) if !threads.is_empty() => return threads,
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "could not read cancel requests"),
            }
        }
    }
}
