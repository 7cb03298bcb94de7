//! Warming a new connection: its server process loads, before a request
//! needs them, the catalog entries Rein's statements touch.
//!
//! A new PostgreSQL server process starts with empty caches: the first
//! time it parses and plans a statement it reads the tables, indexes,
//! types, operators and functions the statement names from the catalog.
//! That took ~0.3–1 ms to parse and ~0.3–1.6 ms to plan each of Rein's
//! statements the first time on each connection, and a pool hands out its
//! connections in turn, so every (connection, statement) pair was slow
//! once — up to 12–25 ms for a cross-process cancel on cold connections
//! (docs/performance.md, W8).
//!
//! So each new connection, before the pool hands it out:
//! - plans `SELECT 1 FROM <table> LIMIT 0` on every `rein_` table (their
//!   relations and indexes), in one round trip;
//! - prepares and plans (`EXPLAIN EXECUTE`, which runs nothing) each
//!   statement of [`HOT`], the statements every run's path runs, one round
//!   trip each, then drops the prepared statement. The catalog entries
//!   stay cached in the server process; sqlx's own prepared statements
//!   then find them warm.
//!
//! A failure only leaves the connection cold: it is logged, never fatal.

use crate::{inbox, leases, runs, store};

/// The statements on the path of every run, by name: a submission, its
/// claim, the thread's lease, its history, its events and record, a
/// cancel from another process, and giving the thread up.
pub(crate) const HOT: &[(&str, &str)] = &[
    ("submit", inbox::SUBMIT),
    ("acquire", leases::ACQUIRE),
    ("release", leases::RELEASE),
    ("claim", runs::CLAIM),
    ("running", runs::RUNNING),
    ("has_open", runs::HAS_OPEN),
    ("append_events", runs::APPEND_EVENTS),
    ("finish", runs::FINISH),
    ("cancel_running", runs::CANCEL_RUNNING),
    ("load", store::LOAD),
    ("append", store::APPEND),
];

/// Plans a query on each of Rein's tables. Returns how many tables it
/// planned (none before the first migration).
pub(crate) async fn warm_tables(conn: &mut sqlx::PgConnection) -> Result<usize, sqlx::Error> {
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

/// Prepares and plans each statement of [`HOT`] (with every parameter
/// `NULL`; nothing runs). Returns the names of those that failed, with
/// why.
pub(crate) async fn warm_statements(conn: &mut sqlx::PgConnection) -> Vec<(&'static str, String)> {
    warm(conn, HOT).await
}

/// Prepares and plans each of `statements` (see [`warm_statements`]).
async fn warm(
    conn: &mut sqlx::PgConnection,
    statements: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut failed = Vec::new();
    for (name, sql) in statements {
        let params = vec!["NULL"; parameters(sql)].join(", ");
        let args = if params.is_empty() {
            String::new()
        } else {
            format!("({params})")
        };
        // Rein's own statement text, not input.
        let warm = format!(
            "PREPARE rein_warm AS {sql}; EXPLAIN EXECUTE rein_warm{args}; DEALLOCATE rein_warm;"
        );
        if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(warm))
            .execute(&mut *conn)
            .await
        {
            failed.push((*name, error.to_string()));
            // A batch that failed after its `PREPARE` leaves the statement
            // (it outlives the aborted transaction); the next one reuses
            // the name. Only this name: sqlx's own statements stay.
            let _ = sqlx::raw_sql("DEALLOCATE rein_warm")
                .execute(&mut *conn)
                .await;
        }
    }
    failed
}

/// The number of parameters `sql` takes: its highest `$n`.
fn parameters(sql: &str) -> usize {
    let mut highest = 0;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if let Ok(n) = rest[..digits].parse::<usize>() {
            highest = highest.max(n);
        }
        rest = &rest[digits..];
    }
    highest
}

/// Warms a new connection for the pool ([`warm_tables`], then
/// [`warm_statements`]): a failure is logged, not fatal (the connection
/// works, only cold).
pub(crate) async fn warm_up_logged(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    match warm_tables(conn).await {
        // Before the first migration there is nothing to warm.
        Ok(0) => return Ok(()),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "could not warm a new database connection"),
    }
    for (name, error) in warm_statements(conn).await {
        tracing::warn!(statement = name, %error, "could not warm a statement on a new database connection");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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

    fn database() -> Option<String> {
        let url = std::env::var("REIN_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty());
        if url.is_none() {
            eprintln!("PostgreSQL tests skipped: REIN_DATABASE_URL is not set");
        }
        url
    }

    /// How many statements stay prepared under the warm-up's name.
    async fn left_prepared(conn: &mut sqlx::PgConnection) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pg_prepared_statements WHERE name = 'rein_warm'")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    #[test]
    fn a_statement_s_parameters_are_counted_by_its_highest_number() {
        assert_eq!(parameters("SELECT 1"), 0);
        assert_eq!(parameters("SELECT $1 WHERE a = $12 OR b = $3"), 12);
        assert_eq!(parameters("SELECT '$' || $2"), 2);
        assert_eq!(parameters(runs::FINISH), 8);
    }

    #[tokio::test]
    async fn a_new_connection_has_planned_a_query_on_every_table_the_migrations_create() {
        let Some(url) = database() else { return };
        let pool = crate::connect(&url).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let tables = migrated_tables();
        assert!(tables.len() >= 13, "{tables:?}");
        assert_eq!(warm_tables(&mut conn).await.unwrap(), tables.len());
    }

    #[tokio::test]
    async fn every_hot_statement_prepares_and_plans_on_a_new_connection() {
        let Some(url) = database() else { return };
        let pool = crate::connect(&url).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(warm_statements(&mut conn).await, Vec::new());
        // No statement stays prepared under the warm-up's name.
        assert_eq!(left_prepared(&mut conn).await, 0);
    }

    #[tokio::test]
    async fn a_statement_that_fails_to_warm_is_reported_and_the_next_still_warms() {
        let Some(url) = database() else { return };
        let pool = crate::connect(&url).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let statements = [
            // Fails at `PREPARE`: no such column.
            ("no_column", "SELECT no_such_column FROM rein_threads"),
            // Prepared, then fails at `EXECUTE`: the `$2` in the literal
            // counts as a second parameter the statement does not take.
            ("prepared_then_failed", "SELECT $1::text, '$2'"),
            ("load", store::LOAD),
        ];
        let failed = warm(&mut conn, &statements).await;
        let names: Vec<_> = failed.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["no_column", "prepared_then_failed"], "{failed:?}");
        assert_eq!(left_prepared(&mut conn).await, 0);
    }
}
