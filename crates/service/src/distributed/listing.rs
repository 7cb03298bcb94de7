//! Listing runs and threads from the shared database
//! ([`crate::listing`]'s filters, read by SQL).

use rein_postgres::{ListedRun, ListedThread, RunQuery, ThreadQuery, retry};

use super::{Distributed, unavailable};
use crate::error::ServiceError;
use crate::listing::{
    Cursor, Page, Parent, RunFilter, RunSummary, ThreadFilter, ThreadSummary, page, page_size,
    to_us, us_rfc3339,
};
use crate::records::RunStatus;

/// How long a listing retries through a database restart.
const READ_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

impl Distributed {
    pub(super) async fn stored_runs(
        &self,
        filter: &RunFilter,
    ) -> Result<Page<RunSummary>, ServiceError> {
        let size = page_size(filter.limit);
        let (parent_run_id, top_level) = match &filter.parent {
            Some(Parent::Run(id)) => (Some(id.as_str()), false),
            Some(Parent::None) => (None, true),
            None => (None, false),
        };
        let query = RunQuery {
            status: filter.status.map(RunStatus::as_str),
            agent_id: filter.agent_id.as_deref(),
            termination: filter.termination.as_deref(),
            parent_run_id,
            top_level,
            thread_id: filter.thread_id.as_deref(),
            since_us: filter.since.map(micros),
            until_us: filter.until.map(micros),
            after: filter.cursor.as_ref().map(|c| (signed(c.at_us()), c.id())),
            limit: i64::try_from(size + 1).unwrap_or(i64::MAX),
        };
        let runs = self.db.runs();
        let rows = retry(READ_RETRY, || runs.list_runs(&query))
            .await
            .map_err(|e| unavailable(&e))?;
        let found = rows
            .into_iter()
            .map(|row| {
                (
                    Cursor::new(unsigned(row.created_us), &row.run_id),
                    summary(row),
                )
            })
            .collect();
        Ok(page(found, size))
    }

    pub(super) async fn stored_threads(
        &self,
        filter: &ThreadFilter,
    ) -> Result<Page<ThreadSummary>, ServiceError> {
        let size = page_size(filter.limit);
        let query = ThreadQuery {
            status: filter.status.map(RunStatus::as_str),
            agent_id: filter.agent_id.as_deref(),
            since_us: filter.since.map(micros),
            until_us: filter.until.map(micros),
            after: filter.cursor.as_ref().map(|c| (signed(c.at_us()), c.id())),
            limit: i64::try_from(size + 1).unwrap_or(i64::MAX),
        };
        let runs = self.db.runs();
        let rows = retry(READ_RETRY, || runs.list_threads(&query))
            .await
            .map_err(|e| unavailable(&e))?;
        let found = rows
            .into_iter()
            .map(|row: ListedThread| {
                let at = unsigned(row.created_us);
                let thread = ThreadSummary {
                    created_at: us_rfc3339(at),
                    runs: unsigned(row.runs),
                    last_run: row.last_run.map(summary),
                    thread_id: row.thread_id,
                };
                (Cursor::new(at, &thread.thread_id), thread)
            })
            .collect();
        Ok(page(found, size))
    }
}

fn summary(row: ListedRun) -> RunSummary {
    RunSummary {
        status: RunStatus::parse(&row.status).unwrap_or(RunStatus::Running),
        termination: row.termination,
        parent_run_id: row.parent_run_id,
        created_at: us_rfc3339(unsigned(row.created_us)),
        finished_at: row.finished_us.map(|us| us_rfc3339(unsigned(us))),
        steps: row.steps.and_then(|s| u32::try_from(s).ok()),
        usage: row.usage.and_then(|u| serde_json::from_value(u).ok()),
        run_id: row.run_id,
        thread_id: row.thread_id,
        agent_id: row.agent_id,
    }
}

fn micros(at: std::time::SystemTime) -> i64 {
    signed(to_us(at))
}

fn signed(us: u64) -> i64 {
    i64::try_from(us).unwrap_or(i64::MAX)
}

fn unsigned(us: i64) -> u64 {
    u64::try_from(us).unwrap_or(0)
}
