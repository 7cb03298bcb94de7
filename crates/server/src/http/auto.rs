//! Auto mode over HTTP: a submission's `run_mode` and `automation_policy`,
//! a thread's auto-mode state (`GET /v1/threads/{id}/auto`), the source's
//! `/new` (`POST /v1/threads/{id}/new`), and following a session from
//! round to round (`?wait=true`).

use axum::Json;
use axum::extract::State;
use rein::auto::AutomationPolicy;
use rein_service::{RunMode, RunRecord, Service, ServiceError, ThreadAuto};
use serde::Serialize;

use super::ApiError;
use super::extract::PathParams;

pub(super) use rein_service::auto::nullable;

/// The submission's `run_mode`, checked.
pub(crate) fn run_mode(name: Option<&str>) -> Result<Option<RunMode>, ServiceError> {
    name.map(|n| RunMode::parse("run_mode", n)).transpose()
}

/// The submission's `automation_policy` (the policy, `null`, or the
/// document form), checked as `AutomationPolicy::from_json` checks a file.
pub(crate) fn policy(
    field: &str,
    value: Option<Option<serde_json::Value>>,
) -> Result<Option<Option<AutomationPolicy>>, ServiceError> {
    value
        .map(|v| {
            let text = v.map_or_else(|| "null".to_owned(), |v| v.to_string());
            AutomationPolicy::from_json(&text)
                .map_err(|e| ServiceError::invalid(field, e.to_string()))
        })
        .transpose()
}

/// Waits for the session `record` is a round of to stop: the record of
/// its last round (a single run's own record).
pub(crate) async fn last_round(
    service: &Service,
    mut record: RunRecord,
) -> Result<RunRecord, ServiceError> {
    while let Some(next) = record.auto.as_ref().and_then(|a| a.next_run_id.clone()) {
        record = service.run(&next).await?.finished().await;
    }
    Ok(record)
}

/// A thread's auto-mode state as served.
#[derive(Serialize, schemars::JsonSchema)]
pub(super) struct ThreadAutoView {
    /// The thread.
    thread_id: String,
    /// Its stored default mode (`auto` or `single`), if one was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    run_mode: Option<String>,
    /// Its stored default policy (`null`: a stored "no policy"); absent
    /// when none was stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    automation_policy: Option<serde_json::Value>,
    /// Tokens its auto-mode rounds used since the last `/new`.
    tokens_used_session: u64,
    /// The stored default policy's `maxTokens`, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    /// Metric reports since the last `/new`, in order.
    reports: Vec<serde_json::Value>,
}

impl ThreadAutoView {
    fn new(thread_id: String, auto: ThreadAuto) -> Self {
        let max_tokens = auto
            .policy
            .as_ref()
            .and_then(|p| p.as_ref())
            .and_then(|p| p.max_tokens);
        Self {
            thread_id,
            run_mode: auto.run_mode.map(|m| m.as_str().to_owned()),
            automation_policy: auto
                .policy
                .map(|p| serde_json::to_value(p).unwrap_or_default()),
            tokens_used_session: auto.tokens_used_session,
            max_tokens,
            reports: auto
                .reports
                .iter()
                .map(|r| serde_json::to_value(r).unwrap_or_default())
                .collect(),
        }
    }
}

/// `GET /v1/threads/{thread_id}/auto`.
pub(super) async fn thread_auto(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Result<Json<ThreadAutoView>, ApiError> {
    let auto = service.thread_auto(&thread_id).await?;
    Ok(Json(ThreadAutoView::new(thread_id, auto)))
}

/// `POST /v1/threads/{thread_id}/new`.
pub(super) async fn new_session(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Result<Json<ThreadAutoView>, ApiError> {
    service.reset_session(&thread_id).await?;
    let auto = service.thread_auto(&thread_id).await?;
    Ok(Json(ThreadAutoView::new(thread_id, auto)))
}
