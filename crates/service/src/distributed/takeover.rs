//! Taking over, and hearing from other processes: the heartbeat renews
//! this process's leases (a thread lost to another process has its run
//! cancelled here); the listener turns notifications into pump wake-ups,
//! follower refreshes and cancels; the scan takes threads with work and
//! no live owner, acts on cancel requests it missed, and drops old runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rein_postgres::Notification;

use super::{Change, Distributed, SCAN, lock};

/// How many scans between two sweeps of old finished runs.
const SWEEP_EVERY: u32 = 120;

/// A thread another process holds, as last seen: submissions here leave
/// it to that process (which claims them when its run ends; an interrupt
/// reaches it at once through `NOTIFY rein_work`) instead of each trying
/// to take the lease — until the lease would have run out, or the holder
/// says it gave the thread up, whereupon this process takes it if
/// something was submitted here meanwhile.
#[derive(Debug)]
pub(super) struct Elsewhere {
    until: Instant,
    /// Something was submitted here while the thread was held elsewhere.
    pending: bool,
}

impl Distributed {
    /// Whether another process was seen holding the thread and its lease
    /// may still run; if so, notes that work is pending here.
    pub(super) fn held_elsewhere(&self, thread_id: &str) -> bool {
        let mut elsewhere = lock(&self.elsewhere);
        match elsewhere.get_mut(thread_id) {
            Some(e) if e.until > Instant::now() => {
                e.pending = true;
                true
            }
            Some(_) => {
                elsewhere.remove(thread_id);
                false
            }
            None => false,
        }
    }

    /// Notes that another live process holds the thread.
    pub(super) fn seen_elsewhere(&self, thread_id: &str) {
        let until = Instant::now() + self.db.leases().lease();
        lock(&self.elsewhere).insert(
            thread_id.to_owned(),
            Elsewhere {
                until,
                pending: false,
            },
        );
    }

    /// Starts the heartbeat, the listener and the scan.
    pub(super) fn start_loops(self: &Arc<Self>) {
        let core = self.core.clone();
        let heartbeat = self.db.leases().lease() / 3;
        core.every(
            heartbeat,
            Arc::downgrade(self),
            |mode: Arc<Self>| async move {
                mode.renew().await;
            },
        );
        let mut sweeps = 0u32;
        core.every(SCAN, Arc::downgrade(self), move |mode: Arc<Self>| {
            sweeps = sweeps.wrapping_add(1);
            let sweep = sweeps.is_multiple_of(SWEEP_EVERY);
            async move { mode.scan(sweep).await }
        });
        let mode = Arc::downgrade(self);
        let db = self.db.clone();
        core.background(async move {
            loop {
                let mut listener = match db.listen().await {
                    Ok(listener) => listener,
                    Err(error) => {
                        tracing::debug!(%error, "could not listen for notifications; retrying");
                        tokio::time::sleep(SCAN).await;
                        continue;
                    }
                };
                // A broken connection: listen again (the scans cover the gap).
                while let Ok(notification) = listener.recv().await {
                    let Some(mode) = mode.upgrade() else {
                        return;
                    };
                    if let Some(notification) = notification {
                        mode.notified(notification);
                    }
                }
            }
        });
    }

    /// Renews the leases; a thread lost to another process has its run
    /// cancelled here (its writes would be refused anyway).
    async fn renew(&self) {
        match self.db.renew().await {
            Ok(lost) => {
                for thread_id in lost {
                    tracing::warn!(
                        thread_id,
                        "lost the thread's lease to another process; cancelling its run here"
                    );
                    self.core.runtime.cancel_by_thread(&thread_id);
                }
            }
            Err(error) => tracing::warn!(%error, "could not renew the thread leases"),
        }
    }

    fn notified(&self, notification: Notification) {
        match notification {
            Notification::Events { run_id, finished } => {
                let _ = self.changes.send(Change { run_id, finished });
            }
            Notification::Released { thread_id } => {
                // Given up by its holder: take it if work was submitted
                // here meanwhile.
                let pending = lock(&self.elsewhere)
                    .remove(&thread_id)
                    .is_some_and(|e| e.pending);
                if pending && let Some(mode) = self.arc() {
                    tokio::spawn(async move { mode.kick(&thread_id, false, true).await });
                }
            }
            Notification::Work {
                thread_id,
                interrupt,
            } => {
                if let Some(pump) = self.pump(&thread_id) {
                    if interrupt {
                        pump.interrupt.store(true, Ordering::SeqCst);
                    }
                    if interrupt || pump.active().is_none() {
                        pump.wake.notify_one();
                    }
                }
            }
            Notification::CancelToolCall { run_id, call_id } => {
                // Not running here (or already ended): nothing to do.
                let _ = self.core.runtime.cancel_tool_call(&run_id, &call_id);
            }
            Notification::Decided { run_id } => {
                if let Some(entry) = self.core.records.get(&run_id)
                    && entry.driven_here()
                    && let Some(mode) = self.arc()
                {
                    tokio::spawn(async move { mode.apply_decisions(&entry).await });
                }
            }
            Notification::CancelRun { run_id } => {
                if let Some(entry) = self.core.records.get(&run_id)
                    && entry.driven_here()
                {
                    self.core.cancel_entry(&entry);
                }
            }
            _ => {}
        }
    }

    /// The safety net: threads with work and no live owner are taken;
    /// cancel requests for runs here are acted on; old runs are dropped.
    async fn scan(&self, sweep: bool) {
        let runs = self.db.runs();
        match runs.orphaned().await {
            Ok(threads) => {
                for thread_id in threads {
                    if self.pump(&thread_id).is_none() {
                        self.kick(&thread_id, false, true).await;
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "could not look for work"),
        }
        if let Ok(requested) = runs.cancel_requested(&self.db.leases().held()).await {
            for run_id in requested {
                if let Some(entry) = self.core.records.get(&run_id)
                    && entry.driven_here()
                {
                    self.core.cancel_entry(&entry);
                }
            }
        }
        self.apply_missed_decisions().await;
        if sweep {
            let ttl = Duration::from_secs(self.core.settings.retention.finished_run_ttl_seconds);
            if let Err(error) = runs.sweep(ttl).await {
                tracing::debug!(%error, "could not drop old runs");
            }
        }
    }
}
