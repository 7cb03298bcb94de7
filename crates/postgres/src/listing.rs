//! A thread's runs in the order they started, with when each ran: what an
//! operator lists, and what shows that a thread's runs never overlap.

use serde_json::Value;

use crate::PgRuns;

/// One run of a thread, as stored, with its times (seconds since the Unix
/// epoch, on the database's clock).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RunSpan {
    /// The run.
    pub run_id: String,
    /// `queued`, `running` or `finished`.
    pub status: String,
    /// Its record, once finished.
    pub record: Option<Value>,
    /// When it was claimed.
    pub started_at: Option<f64>,
    /// When it finished.
    pub finished_at: Option<f64>,
}

impl PgRuns {
    /// The thread's runs, started ones in the order they started, then
    /// queued ones in submission order.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn thread_runs(&self, thread_id: &str) -> Result<Vec<RunSpan>, sqlx::Error> {
        sqlx::query_as(
            "SELECT run_id, status, record,
                    extract(epoch FROM started_at)::float8 AS started_at,
                    extract(epoch FROM finished_at)::float8 AS finished_at
             FROM rein_runs WHERE thread_id = $1
             ORDER BY started_at NULLS LAST, seq",
        )
        .bind(thread_id)
        .fetch_all(self.pool())
        .await
        .map(|runs: Vec<RunSpan>| {
            runs.into_iter()
                .map(|mut run| {
                    run.record = run.record.map(crate::nul::decode);
                    run
                })
                .collect()
        })
    }
}

/// Which runs [`PgRuns::list_runs`] lists; every filter that is set must
/// match. Times are microseconds since the Unix epoch.
#[derive(Debug, Clone, Default)]
pub struct RunQuery<'a> {
    /// `queued`, `running`, `awaiting_approval` or `finished`.
    pub status: Option<&'a str>,
    /// The agent.
    pub agent_id: Option<&'a str>,
    /// The termination code of a finished run.
    pub termination: Option<&'a str>,
    /// Sub-agent runs of this run.
    pub parent_run_id: Option<&'a str>,
    /// Only runs no other run started.
    pub top_level: bool,
    /// The thread.
    pub thread_id: Option<&'a str>,
    /// Submitted at or after.
    pub since_us: Option<i64>,
    /// Submitted before.
    pub until_us: Option<i64>,
    /// Only runs before this one in the order (its time and id).
    pub after: Option<(i64, &'a str)>,
    /// At most this many.
    pub limit: i64,
}

/// Which threads [`PgRuns::list_threads`] lists (see [`RunQuery`]).
#[derive(Debug, Clone, Default)]
pub struct ThreadQuery<'a> {
    /// The status of the thread's latest run.
    pub status: Option<&'a str>,
    /// The agent of the thread's latest run.
    pub agent_id: Option<&'a str>,
    /// Created at or after.
    pub since_us: Option<i64>,
    /// Created before.
    pub until_us: Option<i64>,
    /// Only threads before this one in the order (its time and id).
    pub after: Option<(i64, &'a str)>,
    /// At most this many.
    pub limit: i64,
}

/// A run as listed.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ListedRun {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// `queued`, `running`, `awaiting_approval` or `finished`.
    pub status: String,
    /// The termination code, once finished.
    pub termination: Option<String>,
    /// For a sub-agent's run, its parent run.
    pub parent_run_id: Option<String>,
    /// When it was submitted (microseconds since the Unix epoch).
    pub created_us: i64,
    /// When it finished.
    pub finished_us: Option<i64>,
    /// Inferences made, once finished.
    pub steps: Option<i64>,
    /// Token usage (its JSON), once finished.
    pub usage: Option<Value>,
}

/// A thread as listed, with its latest run.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedThread {
    /// The thread.
    pub thread_id: String,
    /// When it was first stored or submitted to.
    pub created_us: i64,
    /// Its stored runs.
    pub runs: i64,
    /// Its latest run.
    pub last_run: Option<ListedRun>,
}

/// The listed columns of `rein_runs r`.
macro_rules! listed_run {
    () => {
        "r.run_id, r.thread_id, r.agent_id,
         CASE WHEN r.status = 'running' AND r.parked_calls IS NOT NULL
              THEN 'awaiting_approval' ELSE r.status END AS status,
         CASE r.record->'termination'->>'type'
              WHEN 'stopped' THEN r.record->'termination'->'value'->>'code'
              ELSE r.record->'termination'->>'type' END AS termination,
         COALESCE(r.parent_run_id, r.record->>'parent_run_id') AS parent_run_id,
         (extract(epoch FROM r.created_at) * 1000000)::int8 AS created_us,
         (extract(epoch FROM r.finished_at) * 1000000)::int8 AS finished_us,
         (r.record->>'steps')::int8 AS steps,
         r.record->'usage' AS usage"
    };
}

/// The instant `$n` microseconds after the epoch, exactly.
macro_rules! at_us {
    ($n:literal) => {
        concat!(
            "('epoch'::timestamptz + ",
            $n,
            "::int8 * interval '1 microsecond')"
        )
    };
}

impl PgRuns {
    /// Runs matching `query`, newest submitted first.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn list_runs(&self, query: &RunQuery<'_>) -> Result<Vec<ListedRun>, sqlx::Error> {
        sqlx::query_as(concat!(
            "SELECT * FROM (SELECT ",
            listed_run!(),
            " FROM rein_runs r
              WHERE ($2::text IS NULL OR r.agent_id = $2)
                AND ($5::text IS NULL OR r.thread_id = $5)
                AND ($6::int8 IS NULL OR r.created_at >= ",
            at_us!("$6"),
            ")
                AND ($7::int8 IS NULL OR r.created_at < ",
            at_us!("$7"),
            ")
                AND ($8::int8 IS NULL OR (r.created_at, r.run_id) < (",
            at_us!("$8"),
            ", $9::text))
             ) l
             WHERE ($1::text IS NULL OR l.status = $1)
               AND ($3::text IS NULL OR l.termination = $3)
               AND ($4::text IS NULL OR l.parent_run_id = $4)
               AND (NOT $10 OR l.parent_run_id IS NULL)
             -- The outer query orders: a subquery's order is not kept.
             ORDER BY l.created_us DESC, l.run_id DESC
             LIMIT $11"
        ))
        .bind(query.status)
        .bind(query.agent_id)
        .bind(query.termination)
        .bind(query.parent_run_id)
        .bind(query.thread_id)
        .bind(query.since_us)
        .bind(query.until_us)
        .bind(query.after.map(|a| a.0))
        .bind(query.after.map(|a| a.1))
        .bind(query.top_level)
        .bind(query.limit)
        .fetch_all(self.pool())
        .await
    }

    /// Threads matching `query`, newest first, each with its latest run:
    /// every thread stored or submitted to.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only.
    pub async fn list_threads(
        &self,
        query: &ThreadQuery<'_>,
    ) -> Result<Vec<ListedThread>, sqlx::Error> {
        #[derive(sqlx::FromRow)]
        struct Row {
            id: String,
            created: i64,
            count: i64,
            run_id: Option<String>,
            thread_id: Option<String>,
            agent_id: Option<String>,
            status: Option<String>,
            termination: Option<String>,
            parent_run_id: Option<String>,
            created_us: Option<i64>,
            finished_us: Option<i64>,
            steps: Option<i64>,
            usage: Option<Value>,
        }
        let rows: Vec<Row> = sqlx::query_as(concat!(
            "WITH threads AS (
                 SELECT thread_id, min(created_at) AS created_at FROM (
                     SELECT thread_id, created_at FROM rein_threads
                     UNION ALL SELECT thread_id, created_at FROM rein_runs) ids
                 GROUP BY thread_id)
             SELECT t.thread_id AS id,
                    (extract(epoch FROM t.created_at) * 1000000)::int8 AS created,
                    (SELECT count(*) FROM rein_runs c WHERE c.thread_id = t.thread_id) AS count,
                    last.*
             FROM threads t
             LEFT JOIN LATERAL (SELECT ",
            listed_run!(),
            " FROM rein_runs r WHERE r.thread_id = t.thread_id
                 ORDER BY r.seq DESC LIMIT 1) last ON true
             WHERE ($1::text IS NULL OR last.status = $1)
               AND ($2::text IS NULL OR last.agent_id = $2)
               AND ($3::int8 IS NULL OR t.created_at >= ",
            at_us!("$3"),
            ")
               AND ($4::int8 IS NULL OR t.created_at < ",
            at_us!("$4"),
            ")
               AND ($5::int8 IS NULL OR (t.created_at, t.thread_id) < (",
            at_us!("$5"),
            ", $6::text))
             ORDER BY t.created_at DESC, t.thread_id DESC
             LIMIT $7"
        ))
        .bind(query.status)
        .bind(query.agent_id)
        .bind(query.since_us)
        .bind(query.until_us)
        .bind(query.after.map(|a| a.0))
        .bind(query.after.map(|a| a.1))
        .bind(query.limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let last_run = match (row.run_id, row.thread_id, row.agent_id, row.status) {
                    (Some(run_id), Some(thread_id), Some(agent_id), Some(status)) => {
                        Some(ListedRun {
                            run_id,
                            thread_id,
                            agent_id,
                            status,
                            termination: row.termination,
                            parent_run_id: row.parent_run_id,
                            created_us: row.created_us.unwrap_or(row.created),
                            finished_us: row.finished_us,
                            steps: row.steps,
                            usage: row.usage,
                        })
                    }
                    _ => None,
                };
                ListedThread {
                    thread_id: row.id,
                    created_us: row.created,
                    runs: row.count,
                    last_run,
                }
            })
            .collect())
    }
}
