//! The HTTP API (axum): routes, typed extractors, error responses and SSE.
//!
//! Every refusal is `{"error": {"code", "message"}}` with a 4xx/5xx
//! status ([`ApiError`]); a refused request changes nothing. Handlers
//! read typed extractors ([`extract`]) whose rejection is an `ApiError`,
//! and return the service's errors through the one table in [`error`].
//! Connections — their cap, their timeouts, and what is refused before
//! routing (a request target over 8 KiB) — are [`listen`]'s.

mod error;
mod extract;
pub(crate) mod guard;
pub(crate) mod listen;
mod listing;
mod sse;

pub use error::ApiError;
pub(crate) use extract::{JsonBody, PathParams};
pub(crate) use sse::run_log;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use rein::contract::approval::{Decision, PendingApproval};
use rein::contract::message::Message;
use serde::{Deserialize, Serialize};

use crate::agui;
use crate::service::{RunStatus, Service, Strategy, Submission, Submitted};
use extract::{IdempotencyKey, Wait};

/// The router of the whole API, AG-UI included, behind the guard of
/// `settings` (auth, origins, hosts, JSON bodies).
///
/// # Errors
///
/// The auth settings cannot be used (the tokens' variable is not set or
/// holds a malformed token).
pub fn router(
    service: Service,
    settings: &crate::deployment::ServerSettings,
) -> Result<Router, String> {
    let limit = settings.body_limit_bytes;
    let guard = std::sync::Arc::new(guard::Guard::new(settings)?);
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/agents", get(agents))
        .route("/v1/threads", get(listing::threads))
        .route("/v1/runs", get(listing::runs))
        .route("/v1/threads/{thread_id}/runs", post(submit))
        .route("/v1/runs/{run_id}", get(run_record))
        .route("/v1/runs/{run_id}/events", get(sse::run_events))
        .route("/v1/threads/{thread_id}/events", get(sse::thread_events))
        .route("/v1/threads/{thread_id}/cancel", post(cancel_thread))
        .route("/v1/runs/{run_id}/cancel", post(cancel_run))
        .route(
            "/v1/runs/{run_id}/tool_calls/{call_id}/cancel",
            post(cancel_tool_call),
        )
        .route(
            "/v1/runs/{run_id}/approvals/{call_id}",
            post(decide_approval),
        )
        .route("/v1/approvals", get(approvals))
        .route("/v1/threads/{thread_id}/messages", get(messages))
        .route("/v1/threads/{thread_id}", delete(delete_thread))
        .route("/v1/ag-ui/{agent_id}", post(agui::run))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(guard, guard::check))
        .with_state(service))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        format!(
            "{} is not a method of {}; see docs/service.md for the routes",
            method,
            uri.path()
        ),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(404, "not_found", "no such route; see docs/service.md")
}

async fn healthz(State(service): State<Service>) -> Result<Json<serde_json::Value>, ApiError> {
    service.health().await?;
    Ok(Json(serde_json::json!({"status": "ok"})))
}

/// `GET /metrics`: this process's metrics, Prometheus text format.
async fn metrics(State(service): State<Service>) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let text = service.metrics().await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[derive(Serialize)]
struct AgentView {
    id: String,
    model_id: String,
    tools: Vec<String>,
}

async fn agents(State(service): State<Service>) -> Json<Vec<AgentView>> {
    let runtime = service.runtime();
    let agents = runtime
        .agent_ids()
        .into_iter()
        .filter_map(|id| {
            let spec = runtime.agent_spec(Some(id))?;
            let tools = runtime
                .agent_tools(id)?
                .into_iter()
                .map(|t| t.name)
                .collect();
            Some(AgentView {
                id: id.to_owned(),
                model_id: spec.model_id.clone(),
                tools,
            })
        })
        .collect();
    Json(agents)
}

/// `POST /v1/threads/{thread_id}/runs`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(deserialize_with = "extract::strict_messages")]
    messages: Vec<Message>,
    #[serde(default)]
    strategy: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

#[derive(Serialize)]
struct Accepted<'a> {
    run_id: &'a str,
    thread_id: &'a str,
    status: RunStatus,
}

async fn submit(
    State(service): State<Service>,
    scope: Option<axum::Extension<guard::Scope>>,
    PathParams(thread_id): PathParams<String>,
    Wait(wait): Wait,
    IdempotencyKey(header_key): IdempotencyKey,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<Response, ApiError> {
    let strategy = match &body.strategy {
        Some(name) => Strategy::parse(name)?,
        None => Strategy::default(),
    };
    let idempotency_key = match (header_key, body.idempotency_key) {
        (Some(h), Some(b)) if h != b => {
            return Err(ApiError::new(
                422,
                "conflicting_idempotency_keys",
                "the Idempotency-Key header and the body's idempotency_key differ; send one",
            ));
        }
        (h, b) => h.or(b),
    };
    if idempotency_key.as_deref() == Some("") {
        return Err(ApiError::new(
            422,
            "invalid_idempotency_key",
            "the idempotency key is empty",
        ));
    }
    if let Some(axum::Extension(scope)) = &scope {
        let agent = service
            .runtime()
            .agent_spec(body.agent_id.as_deref())
            .map(|spec| spec.id.clone())
            .unwrap_or_default();
        scope.check_agent(&agent)?;
    }
    let submission = Submission {
        agent_id: body.agent_id,
        messages: body.messages,
        strategy,
        idempotency_key,
        ..Submission::default()
    };
    let submitted = service.submit(&thread_id, submission).await?;
    let entry = submitted.entry().clone();
    if wait {
        let entry = service.live(&submitted).await?;
        return Ok((StatusCode::OK, Json(entry.finished().await)).into_response());
    }
    let status = match submitted {
        Submitted::New(_) => StatusCode::ACCEPTED,
        Submitted::Duplicate(_) => StatusCode::OK,
    };
    let accepted = Accepted {
        run_id: &entry.run_id,
        thread_id: &entry.thread_id,
        status: entry.status(),
    };
    Ok((status, Json(accepted)).into_response())
}

async fn run_record(
    State(service): State<Service>,
    PathParams(run_id): PathParams<String>,
) -> Result<Response, ApiError> {
    Ok(Json(service.run(&run_id).await?.record()).into_response())
}

async fn cancel_thread(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Json<serde_json::Value> {
    let (cancelled, released) = service.cancel_thread(&thread_id).await;
    Json(serde_json::json!({"cancelled": cancelled, "released": released}))
}

async fn cancel_run(
    State(service): State<Service>,
    PathParams(run_id): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let cancelled = service.cancel_run(&run_id).await?;
    Ok(Json(serde_json::json!({"cancelled": cancelled})))
}

async fn cancel_tool_call(
    State(service): State<Service>,
    PathParams((run_id, call_id)): PathParams<(String, String)>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let here = service.cancel_tool_call(&run_id, &call_id).await?;
    let (status, body) = if here {
        (
            StatusCode::OK,
            serde_json::json!({"cancelled": true, "run_id": run_id, "call_id": call_id}),
        )
    } else {
        (
            StatusCode::ACCEPTED,
            serde_json::json!({"cancelled": false, "requested": true, "run_id": run_id, "call_id": call_id}),
        )
    };
    Ok((status, Json(body)))
}

/// `POST /v1/runs/{run_id}/approvals/{call_id}`: a decision on a pending
/// call (`docs/approvals.md`).
async fn decide_approval(
    State(service): State<Service>,
    scope: Option<axum::Extension<guard::Scope>>,
    caller: Option<axum::Extension<guard::Caller>>,
    PathParams((run_id, call_id)): PathParams<(String, String)>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(axum::Extension(scope)) = &scope {
        let entry = service.run(&run_id).await?;
        scope.check_agent(&entry.agent_id)?;
    }
    let by = caller.as_ref().map(|c| c.0.0.as_str());
    let decided = service.decide_as(&run_id, &call_id, decision, by).await?;
    Ok(Json(
        serde_json::json!({"call_id": decided.call_id, "decision": decided.decision}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsQuery {
    #[serde(default)]
    thread_id: Option<String>,
}

/// `GET /v1/approvals[?thread_id=]`: every pending approval.
async fn approvals(
    State(service): State<Service>,
    query: Result<axum::extract::Query<ApprovalsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<PendingApproval>>, ApiError> {
    let axum::extract::Query(query) =
        query.map_err(|r| ApiError::new(400, "invalid_query", r.body_text()))?;
    Ok(Json(
        service
            .pending_approvals(query.thread_id.as_deref())
            .await?,
    ))
}

async fn messages(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Json<Vec<Message>> {
    Json(service.messages(&thread_id).await)
}

async fn delete_thread(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Result<StatusCode, ApiError> {
    service.delete_thread(&thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
