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
pub async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    // Rein's statements are few and prepared once per connection; a
    // generic plan saves re-planning the array-valued ones (the inbox's
    // batches) on every execution.
    let options = url
        .parse::<PgConnectOptions>()?
        .options([("plan_cache_mode", "force_generic_plan")]);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .min_connections(MIN_CONNECTIONS)
        .after_connect(|conn, _| Box::pin(warm_up_logged(conn)))
        .acquire_timeout(Duration::from_secs(10))
        // No ping before each use (a round trip per statement): a dead
        // connection fails its statement, which the callers retry.
        .test_before_acquire(false)
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Connections a pool keeps open, idle or not: opened in the background
/// when the pool starts, so a request does not wait for one.
const MIN_CONNECTIONS: u32 = 4;

/// Plans a query on each of Rein's tables in a new connection, so its
/// server process has loaded their catalog entries (the tables and their
/// indexes) before a request needs them: a cold process took ~1–2.5 ms per
/// statement the first time, and a cross-process cancel on cold
/// connections up to 12–25 ms (docs/performance.md, W8). Returns how many
/// tables it planned (none before the first migration).
async fn warm_up(conn: &mut sqlx::PgConnection) -> Result<usize, sqlx::Error> {
    let tables: Vec<String> = sqlx::query_scalar(
        r"SELECT c.relname::text FROM pg_class c
          WHERE c.relkind = 'r' AND c.relname LIKE 'rein\_%'
            AND c.relnamespace = current_schema()::regnamespace",
    )
    .fetch_all(&mut *conn)
    .await?;
    if tables.is_empty() {
        return Ok(0);
    }
    // One round trip; the names are Rein's own (`rein_` and letters).
    let plans: String = tables
        .iter()
        .map(|t| format!("SELECT 1 FROM \"{t}\" LIMIT 0;"))
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(plans))
        .execute(&mut *conn)
        .await?;
    Ok(tables.len())
}

/// [`warm_up`] for the pool: a failure is logged, not fatal (the
/// connection works, only cold).
async fn warm_up_logged(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    if let Err(error) = warm_up(conn).await {
        tracing::warn!(%error, "could not warm a new database connection");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    /// The tables Rein's migrations create.
    fn migrated_tables() -> std::collections::BTreeSet<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut tables = std::collections::BTreeSet::new();
        for file in std::fs::read_dir(dir).unwrap() {
            let sql = std::fs::read_to_string(file.unwrap().path()).unwrap();
            let mut rest = sql.as_str();
            while let Some(at) = rest.find("CREATE TABLE IF NOT EXISTS ") {
                rest = &rest[at + "CREATE TABLE IF NOT EXISTS ".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                tables.insert(name);
            }
        }
        tables
    }

    #[tokio::test]
    async fn a_new_connection_has_planned_a_query_on_every_table_the_migrations_create() {
        let Some(url) = std::env::var("REIN_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            eprintln!("PostgreSQL tests skipped: REIN_DATABASE_URL is not set");
            return;
        };
        let pool = super::connect(&url).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let tables = migrated_tables();
        assert!(tables.len() >= 13, "{tables:?}");
        assert_eq!(super::warm_up(&mut conn).await.unwrap(), tables.len());
    }
}
