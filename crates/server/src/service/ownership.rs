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
//!
//! The trait, its PostgreSQL implementation, and what the service does
//! with it (giving idle threads up, the heartbeat, cross-process cancels)
//! live here; the in-memory path never reaches this code.

use std::sync::Arc;
use std::time::Duration;

use rein_postgres::{Leases, PgThreadStore};

use super::{Lane, Service};

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
        self.store.forget(thread_id);
        if let Err(error) = self.leases.release(thread_id).await {
            tracing::warn!(%error, thread_id, "could not release the thread's lease; it expires on its own");
        }
    }

    async fn renew(&self) -> Result<Vec<String>, String> {
        let lost = self.leases.renew().await.map_err(|e| e.to_string())?;
        for thread_id in &lost {
            self.store.forget(thread_id);
        }
        Ok(lost)
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

/// What the service does with its [`Ownership`]: give idle threads up,
/// renew what it holds, act on cancel requests from other processes, and
/// send its own.
impl Service {
    /// Gives the thread up (with a shared store) once its lane has no run;
    /// the caller holds the lane's submission lock.
    pub(super) async fn release_if_idle(&self, lane: &Lane, thread_id: &str) {
        let Some(ownership) = &self.inner.ownership else {
            return;
        };
        // In distributed mode the threads' pumps give them up.
        if self.inner.cluster.is_some() {
            return;
        }
        let idle = {
            let state = lane.state();
            state.active.is_none() && state.queue.is_empty()
        };
        if idle {
            ownership.release(thread_id).await;
        }
    }

    /// Renews the threads this process holds, every heartbeat until
    /// shutdown: a thread lost to another process has its run cancelled
    /// here (its writes would be refused anyway); a held thread with no
    /// run is given up.
    pub(super) fn start_heartbeat(&self) {
        let Some(ownership) = self.inner.ownership.clone() else {
            return;
        };
        let service = Arc::downgrade(&self.inner);
        let closing = self.inner.closing.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = closing.cancelled() => return,
                    _ = tokio::time::sleep(ownership.heartbeat()) => {}
                }
                let Some(inner) = service.upgrade() else {
                    return;
                };
                let service = Service { inner };
                match ownership.renew().await {
                    Ok(lost) => {
                        for thread_id in lost {
                            tracing::warn!(
                                thread_id,
                                "lost the thread's lease to another process; cancelling its run here"
                            );
                            service.inner.runtime.cancel_by_thread(&thread_id);
                        }
                    }
                    Err(error) => tracing::warn!(%error, "could not renew the thread leases"),
                }
                for thread_id in ownership.held() {
                    let lane = service.lane(&thread_id);
                    // A lane in the middle of a submission is skipped: the
                    // next renewal must not wait behind it.
                    if let Ok(serial) = lane.submit.try_lock() {
                        service.release_if_idle(&lane, &thread_id).await;
                        drop(serial);
                    }
                    drop(lane);
                    service.tidy(&thread_id);
                }
            }
        });
    }

    /// Cancels the runs of held threads that another process asked to
    /// cancel, until shutdown.
    pub(super) fn start_cancel_listener(&self) {
        let Some(ownership) = self.inner.ownership.clone() else {
            return;
        };
        let service = Arc::downgrade(&self.inner);
        let closing = self.inner.closing.clone();
        tokio::spawn(async move {
            loop {
                let threads = tokio::select! {
                    _ = closing.cancelled() => return,
                    threads = ownership.next_cancels() => threads,
                };
                let Some(inner) = service.upgrade() else {
                    return;
                };
                for thread_id in threads {
                    inner.runtime.cancel_by_thread(&thread_id);
                }
            }
        });
    }

    /// Asks the process that owns the thread to cancel its run, and waits
    /// (bounded by the cancel-wait bound) until it has given the thread up.
    pub(super) async fn cancel_elsewhere(
        &self,
        ownership: &dyn Ownership,
        thread_id: &str,
    ) -> (bool, bool) {
        match ownership.request_cancel(thread_id).await {
            Ok(true) => {}
            Ok(false) => return (false, true),
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not send the cancel request");
                return (false, false);
            }
        }
        let bound = Duration::from_millis(self.inner.settings.cancel_wait_ms);
        let start = tokio::time::Instant::now();
        while start.elapsed() < bound {
            if !ownership.is_owned(thread_id).await.unwrap_or(true) {
                return (true, true);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (true, false)
    }
}
