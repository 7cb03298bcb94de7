//! The active-run registry: at most one active run per thread, and the
//! handles that cancel a run and wait for it to let go of its thread.
//!
//! **Invariant 2:** a thread has at most one active run at every instant —
//! [`ActiveRunRegistry::acquire`] inserts into the thread map only when the
//! entry is vacant, under the map's shard lock.
//!
//! **Invariant 5:** the slot is released on every exit path — it is owned by a
//! [`SlotGuard`] whose `Drop` releases it, so a normal end, an error, a panic
//! and a dropped run task all release it. The run task drops the guard only
//! after its tool futures are finished or dropped, its history is repaired
//! and `RunFinished` is emitted.
//!
//! Waiting uses a one-shot [`Latch`] (`released`), held in the run's
//! control block (no allocation of its own): opening it is idempotent, and
//! a waiter registers before it checks, so an opening that races with the
//! wait is never missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::lifecycle::CancelCause;

tokio::task_local! {
    /// The run whose task (or tool task) is executing, to detect a run
    /// waiting on itself.
    pub(crate) static CURRENT_RUN: Arc<str>;
}

/// The tool calls a run has running, each with its token.
type Calls = smallvec::SmallVec<[(String, CancellationToken); 1]>;

/// The control block of one run: its token, why it was cancelled, and the
/// latch that opens when its slot is released.
#[derive(Debug)]
pub(crate) struct RunControl {
    pub(crate) run_id: Arc<str>,
    pub(crate) thread_id: Arc<str>,
    pub(crate) token: CancellationToken,
    cause: OnceLock<CancelCause>,
    released: Latch,
    /// Set when the run's `RunFinished` is emitted, so that no path can
    /// emit a second one.
    finished: AtomicBool,
    /// The tool calls running now, with each call's token (a child of the
    /// run's): cancelling one ends that call alone.
    /// Inline room for one: most rounds make one call, and a run waiting
    /// on the model holds none (W2's memory per run).
    calls: std::sync::Mutex<Calls>,
    /// What the run shares with its sub-agent calls (runs of agents with
    /// sub-agents only).
    pub(crate) family: OnceLock<Arc<crate::subagents::Family>>,
    /// The calls the run waits on while it is parked for approvals.
    pub(crate) parked: OnceLock<crate::approvals::SharedParked>,
    /// The root of the run's tree, for a sub-agent's run.
    pub(crate) root_run_id: Option<Arc<str>>,
    /// Set when the run parked and let go of its task: what to carry on.
    let_go: std::sync::Mutex<Option<Box<crate::approvals::ParkedRun>>>,
    let_go_flag: AtomicBool,
}

impl RunControl {
    pub(crate) fn new(run_id: Arc<str>, thread_id: Arc<str>, token: CancellationToken) -> Self {
        Self {
            run_id,
            thread_id,
            token,
            cause: OnceLock::new(),
            released: Latch::default(),
            finished: AtomicBool::new(false),
            calls: std::sync::Mutex::default(),
            family: OnceLock::new(),
            parked: OnceLock::new(),
            root_run_id: None,
            let_go: std::sync::Mutex::new(None),
            let_go_flag: AtomicBool::new(false),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a running tool call and its token.
    pub(crate) fn call_started(&self, call_id: &str, token: CancellationToken) {
        self.calls().push((call_id.to_owned(), token));
    }

    /// Forgets the round's calls: they all ended. A list that outgrew its
    /// inline room gives the heap's back.
    pub(crate) fn calls_ended(&self) {
        *self.calls() = Calls::new();
    }

    /// Cancels the running call `call_id` (every call with that id); `Err`
    /// lists the running calls when it is not one of them.
    pub(crate) fn cancel_call(&self, call_id: &str) -> Result<(), Vec<String>> {
        let calls = self.calls();
        let mut found = false;
        for (_, token) in calls.iter().filter(|(id, _)| id == call_id) {
            token.cancel();
            found = true;
        }
        if found {
            return Ok(());
        }
        let mut running: Vec<String> = calls.iter().map(|(id, _)| id.clone()).collect();
        running.sort();
        running.dedup();
        Err(running)
    }

    /// Claims the run's one `RunFinished`: `true` the first time only.
    pub(crate) fn claim_finished(&self) -> bool {
        !self.finished.swap(true, Ordering::AcqRel)
    }

    /// Records that the run parked and let go of its task.
    pub(crate) fn let_go(&self, parked: crate::approvals::ParkedRun) {
        *self
            .let_go
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(parked));
        self.let_go_flag.store(true, Ordering::Release);
    }

    /// Whether the run parked and let go of its task.
    pub(crate) fn has_let_go(&self) -> bool {
        self.let_go_flag.load(Ordering::Acquire)
    }

    /// The parked run it let go of, once.
    pub(crate) fn take_let_go(&self) -> Option<Box<crate::approvals::ParkedRun>> {
        self.let_go
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Cancels the run; the first cause recorded is the one reported.
    pub(crate) fn cancel(&self, cause: CancelCause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }

    /// The recorded cause, if any.
    pub(crate) fn cause(&self) -> Option<&CancelCause> {
        self.cause.get()
    }

    /// Whether the calling task is this run (or one of its tools).
    fn is_current(&self) -> bool {
        CURRENT_RUN
            .try_with(|id| **id == *self.run_id)
            .unwrap_or(false)
    }

    /// Waits until the slot is released, at most `bound`; `true` if it was.
    /// A run waiting on itself returns `false` at once instead of deadlocking.
    ///
    /// A waiter that is not a runtime task (`block_on` on the thread that
    /// owns the runtime) parks its thread at once. Polling the latch first
    /// (for 50 µs, yielding in between) was tried and measured against
    /// parking, alternating processes (docs/performance.md, W3): it halved
    /// the median only when the cancel came microseconds after the run
    /// started, with the workers still awake, and made every percentile
    /// worse when the workers had parked (p99 339 against 232 µs) — the
    /// shape a real caller has. A task never spins either.
    pub(crate) async fn wait_released(&self, bound: Duration) -> bool {
        if self.is_current() {
            return self.released.is_open();
        }
        tokio::time::timeout(bound, self.released.opened())
            .await
            .is_ok()
    }
}

/// A one-shot latch: once [`open`](Self::open), it stays open, and every
/// waiter, earlier or later, returns.
#[derive(Debug, Default)]
struct Latch {
    open: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Latch {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Returns once the latch is open.
    ///
    /// # Cancel safety
    ///
    /// Dropping it loses nothing: the latch stays open for the next wait.
    async fn opened(&self) {
        loop {
            // Registered before the check: an `open` between the two
            // wakes it.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}

/// The runs that currently hold a thread, by thread and by run id.
#[derive(Debug, Default)]
pub(crate) struct ActiveRunRegistry {
    threads: DashMap<Arc<str>, Arc<RunControl>>,
    runs: DashMap<Arc<str>, Arc<RunControl>>,
}

/// Error of [`ActiveRunRegistry::acquire`]: the thread is taken.
#[derive(Debug)]
pub(crate) struct ThreadBusy;

impl ActiveRunRegistry {
    /// Takes the slot of `control.thread_id`, or fails if a run holds it.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        control: Arc<RunControl>,
    ) -> Result<SlotGuard, ThreadBusy> {
        match self.threads.entry(control.thread_id.clone()) {
            Entry::Occupied(_) => return Err(ThreadBusy),
            Entry::Vacant(v) => {
                v.insert(control.clone());
            }
        }
        self.runs.insert(control.run_id.clone(), control.clone());
        Ok(SlotGuard {
            registry: self.clone(),
            control,
        })
    }

    /// The run holding `thread_id`, if any.
    pub(crate) fn by_thread(&self, thread_id: &str) -> Option<Arc<RunControl>> {
        self.threads.get(thread_id).map(|c| c.value().clone())
    }

    /// The active run with this id, if any.
    pub(crate) fn by_run(&self, run_id: &str) -> Option<Arc<RunControl>> {
        self.runs.get(run_id).map(|c| c.value().clone())
    }

    /// Every active run.
    pub(crate) fn all(&self) -> Vec<Arc<RunControl>> {
        self.threads.iter().map(|e| e.value().clone()).collect()
    }

    pub(crate) fn is_active(&self, thread_id: &str) -> bool {
        self.threads.contains_key(thread_id)
    }
}

/// Ownership of one thread's slot; dropping it releases the slot and opens
/// the run's `released` latch.
#[derive(Debug)]
pub(crate) struct SlotGuard {
    registry: Arc<ActiveRunRegistry>,
    control: Arc<RunControl>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let c = &self.control;
        self.registry
            .threads
            .remove_if(&c.thread_id, |_, held| Arc::ptr_eq(held, c));
        self.registry.runs.remove(&c.run_id);
        // Open the latch last: a waiter that wakes finds the slot free.
        c.released.open();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(run: &str, thread: &str) -> Arc<RunControl> {
        Arc::new(RunControl::new(
            run.into(),
            thread.into(),
            CancellationToken::new(),
        ))
    }

    #[test]
    fn a_thread_has_at_most_one_slot_and_dropping_the_guard_frees_it() {
        let reg = Arc::new(ActiveRunRegistry::default());
        let guard = reg.acquire(control("r1", "t")).unwrap();
        assert!(reg.acquire(control("r2", "t")).is_err());
        assert!(reg.acquire(control("r3", "other")).is_ok());
        assert!(reg.by_run("r1").is_some());
        drop(guard);
        assert!(!reg.is_active("t"));
        assert!(reg.by_run("r1").is_none());
        assert!(reg.acquire(control("r4", "t")).is_ok());
    }

    fn two_workers() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_waiter_outside_any_task_sees_a_release_made_at_once_or_later() {
        let rt = two_workers();
        let reg = Arc::new(ActiveRunRegistry::default());
        for delay in [Duration::ZERO, Duration::from_millis(20)] {
            let c = control("r", "t");
            let guard = reg.acquire(c.clone()).unwrap();
            rt.spawn(async move {
                tokio::time::sleep(delay).await;
                drop(guard);
            });
            assert!(rt.block_on(c.wait_released(Duration::from_secs(5))));
        }
        // Not released: `false` at the bound.
        let c = control("r", "t");
        let _guard = reg.acquire(c.clone()).unwrap();
        assert!(!rt.block_on(c.wait_released(Duration::from_millis(10))));
        // In a current-thread runtime the wait lets the run's task run.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let c = control("r2", "t2");
        let guard = reg.acquire(c.clone()).unwrap();
        rt.block_on(async {
            tokio::spawn(async move { drop(guard) });
            assert!(c.wait_released(Duration::from_secs(5)).await);
        });
    }

    #[test]
    fn a_release_racing_with_its_waiters_wakes_every_one_of_them() {
        let rt = two_workers();
        let reg = Arc::new(ActiveRunRegistry::default());
        for i in 0..2_000 {
            let c = control(&format!("r{i}"), &format!("t{i}"));
            let guard = reg.acquire(c.clone()).unwrap();
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let c = c.clone();
                    rt.spawn(async move { c.wait_released(Duration::from_secs(10)).await })
                })
                .collect();
            // Released from another worker while the waiters register.
            rt.spawn(async move { drop(guard) });
            for waiter in waiters {
                assert!(
                    rt.block_on(waiter).unwrap(),
                    "iteration {i}: a waiter missed the release"
                );
            }
            // And a wait that starts after the release returns at once.
            assert!(rt.block_on(c.wait_released(Duration::ZERO)));
        }
    }

    #[test]
    fn the_first_cancel_cause_is_kept() {
        let c = control("r", "t");
        c.cancel(CancelCause::Shutdown);
        c.cancel(CancelCause::Requested);
        assert_eq!(c.cause(), Some(&CancelCause::Shutdown));
        assert!(c.token.is_cancelled());
    }
}
