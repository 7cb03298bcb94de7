//! [`Mode`]: the one seam between the service and where its runs are
//! coordinated. A service picks its mode once, at construction; every
//! call the service answers goes through it, with no per-call checks of
//! which mode is in use.
//!
//! Two modes implement it: [`InProcess`](crate::in_process::InProcess)
//! (lanes in memory) and, with the `postgres` feature,
//! [`Distributed`](crate::Distributed) (the database is the truth). A
//! further backend (another database, a queue) would be one more type
//! implementing this trait.

use std::sync::Arc;

use rein_runtime::approvals::Decided;
use rein_runtime_contract::approval::{Decision, PendingApproval};

use rein_runtime::auto::{AutoRounds, AutomationPolicy, MetricsReport};

use crate::auto::{RunMode, ThreadAuto};
use crate::error::ServiceError;
use crate::listing::{Page, RunFilter, RunSummary, ThreadFilter, ThreadSummary};
use crate::records::RunEntry;
use crate::submission::{Submission, Submitted};

/// Where runs are coordinated. Methods mirror `Service`'s; their errors
/// and cancel safety are documented there.
#[async_trait::async_trait]
pub(crate) trait Mode: Send + Sync + std::fmt::Debug {
    /// Accepts a checked submission (ids validated, not shutting down);
    /// with `rounds`, its run is a round of that auto-mode session (whose
    /// empty `session_id` is made from the run's id).
    async fn submit(
        &self,
        thread_id: &str,
        s: Submission,
        rounds: Option<AutoRounds>,
    ) -> Result<Submitted, ServiceError>;

    /// Submits an auto-mode session's next round from the end of round
    /// `after` (in-process, the caller holds the thread's lane: see
    /// `InProcess::drive`). `None` when a client overtook `after`'s end (a
    /// cancel, new input, the thread lost to another process): the session
    /// ends there.
    async fn submit_round(
        &self,
        thread_id: &str,
        s: Submission,
        rounds: AutoRounds,
        after: &str,
    ) -> Result<Option<Submitted>, ServiceError>;

    /// Whether a submission's auto-mode session is resolved when its run
    /// starts (by the mode) rather than when it is submitted (by the
    /// service, which then passes the `rounds`).
    fn resolves_at_start(&self) -> bool {
        false
    }

    /// The thread's auto-mode defaults and session totals.
    async fn thread_auto(&self, thread_id: &str) -> Result<ThreadAuto, ServiceError>;

    /// Stores the thread's auto-mode defaults (each only when given).
    async fn set_auto_defaults(
        &self,
        thread_id: &str,
        run_mode: Option<RunMode>,
        policy: Option<Option<AutomationPolicy>>,
    ) -> Result<(), ServiceError>;

    /// Adds a round's tokens and reports to the thread's session totals;
    /// the totals after.
    async fn add_to_session(
        &self,
        thread_id: &str,
        tokens: u64,
        reports: &[MetricsReport],
    ) -> Result<ThreadAuto, ServiceError>;

    /// Clears the thread's session totals (its defaults stay).
    async fn reset_session(&self, thread_id: &str) -> Result<(), ServiceError>;

    /// A run's entry, up to date with the mode's truth, followed until it
    /// finishes.
    async fn run(&self, run_id: &str) -> Result<Arc<RunEntry>, ServiceError>;

    /// Cancels a run, queued or running.
    async fn cancel_run(&self, run_id: &str) -> Result<bool, ServiceError>;

    /// A tool call that is not running in this process: asks the process
    /// running it, or says why it cannot be cancelled.
    async fn cancel_tool_call_elsewhere(
        &self,
        run_id: &str,
        call_id: &str,
    ) -> Result<bool, ServiceError>;

    /// Decides a pending call (see `Service::decide`).
    async fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Decided, ServiceError>;

    /// The pending approvals of every parked run, or of `thread_id`'s.
    async fn pending_approvals(
        &self,
        thread_id: Option<&str>,
    ) -> Result<Vec<PendingApproval>, ServiceError>;

    /// A page of runs, newest first.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Page<RunSummary>, ServiceError>;

    /// A page of threads, newest first.
    async fn list_threads(
        &self,
        filter: &ThreadFilter,
    ) -> Result<Page<ThreadSummary>, ServiceError>;

    /// Cancels the thread's running run and waits, bounded.
    async fn cancel_thread(&self, thread_id: &str) -> (bool, bool);

    /// Ends the thread's runs and drops its history and keys.
    async fn delete_thread(&self, thread_id: &str) -> Result<(), ServiceError>;

    /// Records client message ids the thread has now been sent (AG-UI:
    /// the ids of the messages a run emitted).
    async fn remember_message_ids(
        &self,
        thread_id: &str,
        ids: Vec<String>,
    ) -> Result<(), ServiceError>;

    /// Whether the mode's store answers.
    async fn health(&self) -> Result<(), ServiceError>;

    /// Threads this process took over from a lost process.
    fn takeovers(&self) -> u64 {
        0
    }

    /// Ends queued runs (or leaves them to others), cancels and awaits
    /// running ones; the core's loops are stopped after it.
    async fn shutdown(&self);
}
