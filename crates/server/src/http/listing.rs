//! `GET /v1/runs` and `GET /v1/threads`: listings with filters and cursor
//! pagination ([`rein_service::RunFilter`], [`rein_service::ThreadFilter`]).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use rein::contract::approval::parse_rfc3339;
use rein_service::{
    Cursor, MAX_PAGE, Page, Parent, RunFilter, RunStatus, RunSummary, Service, ThreadFilter,
    ThreadSummary,
};
use serde::{Deserialize, Serialize};

use super::ApiError;

/// `GET /v1/runs`'s query.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunsQuery {
    /// `queued`, `running`, `awaiting_approval` or `finished`.
    status: Option<String>,
    /// The run's agent.
    agent_id: Option<String>,
    /// A finished run's termination code (`natural_end`, `cancelled`, `error`, a stop code).
    termination: Option<String>,
    /// Sub-agent runs a tool call of this run started.
    parent_run_id: Option<String>,
    /// `true`: only runs no other run started.
    top_level: Option<bool>,
    /// The run's thread.
    thread_id: Option<String>,
    /// Submitted at or after (UTC RFC 3339).
    since: Option<String>,
    /// Submitted before (UTC RFC 3339).
    until: Option<String>,
    /// Page size, 1 to 500 (default 50).
    limit: Option<usize>,
    /// The previous page's next_cursor.
    cursor: Option<String>,
}

/// `GET /v1/threads`'s query.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ThreadsQuery {
    /// The status of the thread's latest run.
    status: Option<String>,
    /// The agent of the thread's latest run.
    agent_id: Option<String>,
    /// Created at or after (UTC RFC 3339).
    since: Option<String>,
    /// Created before (UTC RFC 3339).
    until: Option<String>,
    /// Page size, 1 to 500 (default 50).
    limit: Option<usize>,
    /// The previous page's next_cursor.
    cursor: Option<String>,
}

/// `GET /v1/runs`' answer.
#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct RunsPage {
    /// The runs, newest submitted first.
    runs: Vec<RunSummary>,
    /// Where the next page starts; null on the last page.
    next_cursor: Option<String>,
}

/// `GET /v1/threads`' answer.
#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct ThreadsPage {
    /// The threads, newest first.
    threads: Vec<ThreadSummary>,
    /// Where the next page starts; null on the last page.
    next_cursor: Option<String>,
}

/// `GET /v1/runs`: runs, newest submitted first.
pub(crate) async fn runs(
    State(service): State<Service>,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunsPage>, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let parent = match (q.parent_run_id, q.top_level) {
        (Some(_), Some(true)) => {
            return Err(invalid(
                "parent_run_id and top_level=true exclude each other; send one",
            ));
        }
        (Some(id), _) => Some(Parent::Run(id)),
        (None, Some(true)) => Some(Parent::None),
        (None, _) => None,
    };
    let filter = RunFilter {
        status: status(q.status.as_deref())?,
        agent_id: q.agent_id,
        termination: q.termination,
        parent,
        thread_id: q.thread_id,
        since: instant("since", q.since.as_deref())?,
        until: instant("until", q.until.as_deref())?,
        limit: limit(q.limit)?,
        cursor: cursor(q.cursor.as_deref())?,
    };
    let Page { items, next_cursor } = service.list_runs(&filter).await?;
    Ok(Json(RunsPage {
        runs: items,
        next_cursor: next_cursor.map(|c| c.to_string()),
    }))
}

/// `GET /v1/threads`: threads, newest first, with their latest run.
pub(crate) async fn threads(
    State(service): State<Service>,
    query: Result<Query<ThreadsQuery>, QueryRejection>,
) -> Result<Json<ThreadsPage>, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let filter = ThreadFilter {
        status: status(q.status.as_deref())?,
        agent_id: q.agent_id,
        since: instant("since", q.since.as_deref())?,
        until: instant("until", q.until.as_deref())?,
        limit: limit(q.limit)?,
        cursor: cursor(q.cursor.as_deref())?,
    };
    let Page { items, next_cursor } = service.list_threads(&filter).await?;
    Ok(Json(ThreadsPage {
        threads: items,
        next_cursor: next_cursor.map(|c| c.to_string()),
    }))
}

fn bad_query(rejection: QueryRejection) -> ApiError {
    invalid(rejection.body_text())
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "invalid_query", message)
}

fn status(name: Option<&str>) -> Result<Option<RunStatus>, ApiError> {
    name.map(|n| {
        RunStatus::parse(n).ok_or_else(|| {
            invalid(format!(
                "status `{n}` is not one of queued, running, awaiting_approval, finished"
            ))
        })
    })
    .transpose()
}

fn instant(field: &str, text: Option<&str>) -> Result<Option<std::time::SystemTime>, ApiError> {
    text.map(|t| {
        parse_rfc3339(t).ok_or_else(|| {
            invalid(format!(
                "{field} `{t}` is not a UTC RFC 3339 time such as 2026-11-27T17:05:09Z"
            ))
        })
    })
    .transpose()
}

fn limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(0),
        Some(n @ 1..=MAX_PAGE) => Ok(n),
        Some(n) => Err(invalid(format!(
            "limit {n} is out of range; send 1 to {MAX_PAGE}"
        ))),
    }
}

fn cursor(text: Option<&str>) -> Result<Option<Cursor>, ApiError> {
    text.map(|t| Cursor::parse(t).map_err(invalid)).transpose()
}
