//! Rein on PostgreSQL: a durable thread store, and thread ownership with
//! fencing.
//!
//! # The model
//!
//! - [`connect`] opens a pool and runs the migrations (`sqlx::migrate!`;
//!   PostgreSQL's advisory lock makes concurrent starts safe).
//! - [`PgThreadStore`] is a [`ThreadStore`]: each thread's history is rows of
//!   `rein_messages` (one JSON message per row, in order); every append,
//!   replace or delete is one transaction.
//! - [`Leases`] is one process's ownership of threads: a lease per thread,
//!   renewed by heartbeat, that expires on the **database's** clock. Each
//!   change of owner bumps the thread's `fence`.
//! - A store made with [`PgThreadStore::fenced`] writes a thread only while
//!   its process holds the thread's lease, and every write checks, in its
//!   transaction, that the thread's fence is still the one the lease gave:
//!   a process that lost its lease (it was paused, or cut off) writes
//!   nothing — the database refuses it.
//!
//! - Taking a thread from a lost process ([`Leases::take_over`]) is
//!   followed by [`PgThreadStore::repair_lost`] ([`Database::acquire`]
//!   does both).
//! - [`PgRuns`] is the runs every process shares: the inbox of submissions
//!   (idempotency keys enforced by a unique index), the run records, and each
//!   run's events — claimed, written and finished under the same fence.
//!   Submissions made at the same time in one process are group-committed
//!   (one statement of many rows).
//! - [`PgArtifactStore`] is an
//!   [`ArtifactStore`](rein_runtime::context::ArtifactStore): the context
//!   policy's offloaded tool results, readable from any process.
//!
//! - [`Notification`] is what processes tell each other (`NOTIFY`), typed;
//!   a [`Listener`] receives them.
//! - [`Database`] bundles one process's leases, fenced store and runs.
//!
//! `rein-service`'s distributed mode builds on these; every SQL statement
//! Rein runs is in this crate. `docs/distributed.md` describes the
//! protocol.

mod artifacts;
mod database;
mod inbox;
mod leases;
mod limits;
mod listing;
mod notify;
mod nul;
mod retry;
mod runs;
mod store;
mod warm;

pub use artifacts::PgArtifactStore;
pub use database::Database;
pub use leases::Leases;
pub use limits::PgLimitLedger;
pub use listing::{ListedRun, ListedThread, RunQuery, RunSpan, ThreadQuery};
pub use notify::{Listener, Notification};
pub use retry::{is_transient, retry};
pub use runs::{
    Claimed, NewRun, ORPHAN_GRACE, ParkedWake, PgRuns, RecordedDecision, StoredDecision,
    StoredEvent, StoredPark, StoredRun, StoredThreadAuto, SubmitOutcome,
};
pub use store::{LOST_WORKER_NOTE, PgThreadStore, WRITE_RETRY};

#[doc(no_inline)]
pub use rein_runtime::thread_store::ThreadStore;

/// The database's errors (what every fallible call here returns).
pub type Error = sqlx::Error;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The migrations, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Opens a pool to `url` and brings the schema up to date.
///
/// # Errors
///
/// The connection or a migration failed.
///
/// # Cancel safety
///
/// Dropped midway, no pool is returned; each migration is its own
/// transaction, so the schema is at one of its versions.
///
/// Each of the pool's connections is warmed as it opens: its server
/// process plans Rein's tables and the statements of every run's path
/// before a request uses it (see `warm.rs`); four are kept open.
pub async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    // Rein's statements are few and prepared once per connection; a
    // generic plan saves re-planning the array-valued ones (the inbox's
    // batches) on every execution.
    let options = url
        .parse::<PgConnectOptions>()?
        .options([("plan_cache_mode", "force_generic_plan")]);
    // The schema first, on a connection of its own: each of the pool's
    // connections warms up on Rein's tables and statements as it opens
    // (`warm`), so they must exist by then.
    let schema = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await?;
    MIGRATOR.run(&schema).await?;
    schema.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .min_connections(MIN_CONNECTIONS)
        .after_connect(|conn, _| Box::pin(warm::warm_up_logged(conn)))
        .acquire_timeout(Duration::from_secs(10))
        // No ping before each use (a round trip per statement): a dead
        // connection fails its statement, which the callers retry.
        .test_before_acquire(false)
        .connect_with(options)
        .await?;
    Ok(pool)
}

/// Connections a pool keeps open, idle or not: opened in the background
/// when the pool starts, so a request does not wait for one.
const MIN_CONNECTIONS: u32 = 4;
