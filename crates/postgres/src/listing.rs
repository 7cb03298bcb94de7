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
