//! The HTTP API (axum): routes, typed extractors, error responses and SSE.
//!
//! Every refusal is `{"error": {"code", "message"}}` with a 4xx/5xx
//! status ([`ApiError`]); a refused request changes nothing. Handlers
//! read typed extractors ([`extract`]) whose rejection is an `ApiError`,
//! and return the service's errors through the one table in [`error`].
//! Connections — their cap, their timeouts, and what is refused before
//! routing (a request target over 8 KiB) — are [`listen`]'s.

pub(crate) mod auto;
mod error;
mod extract;
pub(crate) mod guard;
pub(crate) mod listen;
mod listing;
mod openapi;
mod sse;

pub use error::ApiError;
pub(crate) use extract::{JsonBody, PathParams};
pub(crate) use sse::run_log;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rein::contract::approval::{Decision, PendingApproval};
use rein::contract::message::Message;
use serde::{Deserialize, Serialize};

use crate::agui;
use crate::service::{RunStatus, Service, Strategy, Submission, Submitted};
use extract::{IdempotencyKey, Wait};
use openapi::Routes;
use rein_service::RunRecord;

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
    let (routes, document, public) = routes().finish();
    let guard = std::sync::Arc::new(guard::Guard::new(settings)?.serving_without_token(public));
    // Serialized once: every request gets the same bytes.
    let document = axum::body::Bytes::from(document.to_string());
    Ok(routes
        .route(
            "/openapi.json",
            get(move || {
                let document = document.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        document,
                    )
                }
            }),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(guard, guard::check))
        .with_state(service))
}

/// The OpenAPI document of [`router`]'s routes (`GET /openapi.json`).
pub fn openapi() -> serde_json::Value {
    routes().finish().1
}

/// Every route but `/openapi.json`, each with its description.
fn routes() -> Routes {
    const NO_RUN: (u16, &str) = (404, "unknown_run");
    const UNAVAILABLE: (u16, &str) = (503, "store_unavailable, shutting_down");
    Routes::new()
        .get("/", crate::console::index, |o| {
            o.summary("The web console (docs/console.md).")
                .answer_text(200, "text/html", "the console's page")
                .public()
        })
        .get("/console/app.js", crate::console::script, |o| {
            o.summary("The console's script.")
                .answer_text(200, "text/javascript", "the script")
                .public()
        })
        .get("/console/app.css", crate::console::style, |o| {
            o.summary("The console's style sheet.")
                .answer_text(200, "text/css", "the style sheet")
                .public()
        })
        .get("/healthz", healthz, |o| {
            o.summary("Liveness: the service and its store answer.")
                .answer::<Health>(200, "up")
                .refusals(&[UNAVAILABLE])
                .public()
        })
        .get("/metrics", metrics, |o| {
            o.summary("This process's metrics.")
                .answer_text(200, "text/plain; version=0.0.4", "Prometheus text format")
        })
        .get("/v1/agents", agents, |o| {
            o.summary("The agents, each with every tool it can call.")
                .answer::<Vec<AgentView>>(200, "the agents")
        })
        .get("/v1/providers", providers, |o| {
            o.summary("The providers: each one's limits, what its window holds and what waits.")
                .answer::<Vec<rein::limits::ProviderStatus>>(200, "the providers")
        })
        .get("/v1/threads", listing::threads, |o| {
            o.summary("Threads, newest first, each with its latest run.")
                .query::<listing::ThreadsQuery>()
                .answer::<listing::ThreadsPage>(200, "a page of threads")
                .refusals(&[(400, "invalid_query"), UNAVAILABLE])
        })
        .get("/v1/runs", listing::runs, |o| {
            o.summary("Runs, newest submitted first, filtered and paged.")
                .query::<listing::RunsQuery>()
                .answer::<listing::RunsPage>(200, "a page of runs")
                .refusals(&[(400, "invalid_query"), UNAVAILABLE])
        })
        .post("/v1/threads/{thread_id}/runs", submit, |o| {
            o.summary("Submit input to a thread.")
                .query_flag("wait", "answer the run record once the run has finished")
                .header("Idempotency-Key", "a repeated key finds the first submission's run")
                .body::<SubmitBody>()
                .answer::<RunRecord>(200, "with ?wait=true: the finished run's record; else a repeated idempotency key: the first submission's run (as 202)")
                .answer::<Accepted<'static>>(202, "accepted")
                .refusals(&[
                    (404, "unknown_agent"),
                    (409, "thread_busy, thread_owned_elsewhere, run_id_in_use"),
                    (422, "invalid_field, invalid_input, unknown_strategy, idempotency_key_reused, conflicting_idempotency_keys"),
                    UNAVAILABLE,
                ])
        })
        .get("/v1/runs/{run_id}", run_record, |o| {
            o.summary("A run's record.")
                .answer::<RunRecord>(200, "the record")
                .refusals(&[NO_RUN])
        })
        .get("/v1/runs/{run_id}/events", sse::run_events, |o| {
            o.summary("The run's events as SSE, from the start or after Last-Event-ID; ends after run_finished.")
                .header("Last-Event-ID", "resume after this event number")
                .answer_text(200, "text/event-stream", "event: the event's type, data: its JSON, id: its number")
                .refusals(&[NO_RUN])
        })
        .get("/v1/threads/{thread_id}/events", sse::thread_events, |o| {
            o.summary("Live events of every run on the thread, as SSE.")
                .answer_text(200, "text/event-stream", "the thread's live events")
        })
        .post("/v1/threads/{thread_id}/cancel", cancel_thread, |o| {
            o.summary("Cancel the thread's active run and wait (bounded) until it has released the thread.")
                .answer::<ThreadCancelled>(200, "what was cancelled")
        })
        .post("/v1/runs/{run_id}/cancel", cancel_run, |o| {
            o.summary("Cancel one run, queued or running.")
                .answer::<RunCancelled>(200, "whether it was cancelled")
                .refusals(&[NO_RUN])
        })
        .post("/v1/runs/{run_id}/tool_calls/{call_id}/cancel", cancel_tool_call,
            |o| {
                o.summary("End one running tool call; the run goes on.")
                    .answer::<ToolCallCancelled>(200, "ended here")
                    .answer::<ToolCallCancelled>(202, "the run runs in another process, which was asked to end it")
                    .refusals(&[NO_RUN, (409, "tool_call_not_running, run_not_running")])
            },
        )
        .post("/v1/runs/{run_id}/approvals/{call_id}", decide_approval,
            |o| {
                o.summary("Decide a call a parked run waits on.")
                    .body::<Decision>()
                    .answer::<DecisionTaken>(200, "the decision (the same decision again too)")
                    .refusals(&[
                        (404, "unknown_run, unknown_approval"),
                        (409, "already_decided"),
                        (422, "invalid_decision"),
                    ])
            },
        )
        .get("/v1/approvals", approvals, |o| {
            o.summary("Every pending approval.")
                .query::<ApprovalsQuery>()
                .answer::<Vec<PendingApproval>>(200, "the calls parked runs wait on")
                .refusals(&[(400, "invalid_query"), UNAVAILABLE])
        })
        .get("/v1/threads/{thread_id}/messages", messages, |o| {
            o.summary("The thread's stored history.")
                .answer::<Vec<Message>>(200, "the messages")
        })
        .get("/v1/threads/{thread_id}/auto", auto::thread_auto, |o| {
            o.summary("The thread's auto-mode defaults and session totals (tokens_used_session, reports).")
                .answer::<auto::ThreadAutoView>(200, "the thread's auto-mode state")
                .refusals(&[UNAVAILABLE])
        })
        .post("/v1/threads/{thread_id}/new", auto::new_session, |o| {
            o.summary("The source's /new: cancel the thread's runs, drop its history and clear its session tokens and reports; its auto-mode defaults stay.")
                .answer::<auto::ThreadAutoView>(200, "the thread's auto-mode state after")
                .refusals(&[(409, "thread_owned_elsewhere, previous_run_stuck"), UNAVAILABLE])
        })
        .delete("/v1/threads/{thread_id}", delete_thread, |o| {
            o.summary("Cancel the thread's runs and drop it.")
                .answer_empty(204, "deleted")
                .refusals(&[(409, "thread_owned_elsewhere, previous_run_stuck")])
        })
        .post("/v1/replay", replay_recording, |o| {
            o.summary("Replay a recording against an agent's stop conditions, detectors and approval rules: where each would have fired.")
                .body::<ReplayBody>()
                .answer::<crate::replay::Report>(200, "the replay's report")
                .refusals(&[(404, "unknown_agent"), (422, "invalid_recording")])
        })
        .post("/v1/ag-ui/{agent_id}", agui::run, |o| {
            o.summary("Run the agent with an AG-UI RunAgentInput; AG-UI events as SSE.")
                .body::<agui::RunAgentInput>()
                .answer_text(200, "text/event-stream", "AG-UI events")
                .refusals(&[(404, "unknown_agent"), (422, "invalid_input")])
        })
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

/// `GET /healthz`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
struct Health {
    /// `ok`.
    status: &'static str,
}

async fn healthz(State(service): State<Service>) -> Result<Json<Health>, ApiError> {
    service.health().await?;
    Ok(Json(Health { status: "ok" }))
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

/// An agent as `GET /v1/agents` lists it.
#[derive(Serialize, schemars::JsonSchema)]
struct AgentView {
    /// The agent's id.
    id: String,
    /// Its model's id.
    model_id: String,
    /// Every tool it can call.
    tools: Vec<String>,
    /// The tokens its `token_budget` stop condition allows a run.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_budget: Option<u64>,
}

/// `GET /v1/providers`: every provider with its limits and, for a limited
/// one, what its window holds (cluster-wide in distributed mode) and how
/// many inferences wait.
async fn providers(State(service): State<Service>) -> Json<Vec<rein::limits::ProviderStatus>> {
    Json(service.runtime().provider_status().await)
}

/// `POST /v1/replay`'s body.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// The agent whose stop conditions, detectors and approval rules judge
    /// the recording (the only agent when omitted).
    #[serde(default)]
    agent_id: Option<String>,
    /// The recording: JSON lines as `rein serve --record` or a `JsonlSink`
    /// writes them.
    recording: String,
}

/// `POST /v1/replay`: what an agent's run control would have done to a
/// recording.
async fn replay_recording(
    State(service): State<Service>,
    JsonBody(body): JsonBody<ReplayBody>,
) -> Result<Json<crate::replay::Report>, ApiError> {
    let runtime = service.runtime();
    let Some(spec) = runtime.agent_spec(body.agent_id.as_deref()) else {
        let known = runtime.agent_ids().join(", ");
        return Err(ApiError::new(
            404,
            "unknown_agent",
            match body.agent_id {
                Some(id) => format!("no agent \"{id}\"; known agents: {known}"),
                None => format!("name the agent: agent_id is one of {known}"),
            },
        ));
    };
    let models = runtime.judging_models(&spec.id);
    crate::replay::report(
        spec,
        &[("the recording".to_owned(), body.recording)],
        models.as_deref(),
    )
    .await
    .map(Json)
    .map_err(|message| ApiError::new(422, "invalid_recording", message))
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
            let token_budget = spec.stop_conditions.iter().find_map(|c| match c {
                rein::contract::lifecycle::StopConditionSpec::TokenBudget { max_total } => {
                    u64::try_from(*max_total).ok()
                }
                _ => None,
            });
            Some(AgentView {
                id: id.to_owned(),
                model_id: spec.model_id.clone(),
                tools,
                token_budget,
            })
        })
        .collect();
    Json(agents)
}

/// `POST /v1/threads/{thread_id}/runs`'s body.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    /// The agent (the deployment's only agent when omitted).
    #[serde(default)]
    agent_id: Option<String>,
    /// The input: user messages.
    #[serde(deserialize_with = "extract::strict_messages")]
    messages: Vec<Message>,
    /// For a busy thread: `interrupt` (default), `enqueue` or `reject`.
    #[serde(default)]
    strategy: Option<String>,
    /// A repeated key on the thread finds the first submission's run.
    #[serde(default)]
    idempotency_key: Option<String>,
    /// `auto` starts an auto-mode session, `single` one run; also the
    /// thread's default from now on (docs/auto-mode.md).
    #[serde(default)]
    run_mode: Option<String>,
    /// The session's policy (`null`: none); also the thread's default.
    #[serde(default, deserialize_with = "auto::nullable")]
    #[schemars(with = "Option<serde_json::Value>")]
    automation_policy: Option<Option<serde_json::Value>>,
}

/// An accepted submission.
#[derive(Serialize, schemars::JsonSchema)]
struct Accepted<'a> {
    /// The run.
    run_id: &'a str,
    /// Its thread.
    thread_id: &'a str,
    /// `running` or `queued`.
    status: RunStatus,
    /// An auto-mode session's id (its first round is `run_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
}

/// `POST /v1/threads/{thread_id}/cancel`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
struct ThreadCancelled {
    /// Whether a run was cancelled.
    cancelled: bool,
    /// Whether the thread was released within the wait.
    released: bool,
}

/// `POST /v1/runs/{run_id}/cancel`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
struct RunCancelled {
    /// Whether the run was cancelled (`false`: it had finished).
    cancelled: bool,
}

/// `POST /v1/runs/{run_id}/tool_calls/{call_id}/cancel`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
struct ToolCallCancelled {
    /// Whether the call was ended here.
    cancelled: bool,
    /// The run runs in another process, which was asked to end the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    requested: Option<bool>,
    /// The run.
    run_id: String,
    /// The call.
    call_id: String,
}

/// A decision taken on a pending call.
#[derive(Serialize, schemars::JsonSchema)]
struct DecisionTaken {
    /// The call.
    call_id: String,
    /// `approve`, `reject`, `edit` or `respond`.
    decision: String,
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
        run_mode: auto::run_mode(body.run_mode.as_deref())?,
        automation_policy: auto::policy("automation_policy", body.automation_policy)?,
        ..Submission::default()
    };
    let submitted = service.submit(&thread_id, submission).await?;
    let entry = submitted.entry().clone();
    if wait {
        let entry = service.live(&submitted).await?;
        // An auto-mode session: its last round's record.
        let record = auto::last_round(&service, entry.finished().await).await?;
        return Ok((StatusCode::OK, Json(record)).into_response());
    }
    let status = match submitted {
        Submitted::New(_) => StatusCode::ACCEPTED,
        Submitted::Duplicate(_) => StatusCode::OK,
    };
    let session = entry.auto_session();
    let accepted = Accepted {
        run_id: &entry.run_id,
        thread_id: &entry.thread_id,
        status: entry.status(),
        session_id: session.as_deref(),
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
) -> Json<ThreadCancelled> {
    let (cancelled, released) = service.cancel_thread(&thread_id).await;
    Json(ThreadCancelled {
        cancelled,
        released,
    })
}

async fn cancel_run(
    State(service): State<Service>,
    PathParams(run_id): PathParams<String>,
) -> Result<Json<RunCancelled>, ApiError> {
    let cancelled = service.cancel_run(&run_id).await?;
    Ok(Json(RunCancelled { cancelled }))
}

async fn cancel_tool_call(
    State(service): State<Service>,
    PathParams((run_id, call_id)): PathParams<(String, String)>,
) -> Result<(StatusCode, Json<ToolCallCancelled>), ApiError> {
    let here = service.cancel_tool_call(&run_id, &call_id).await?;
    let status = if here {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(ToolCallCancelled {
            cancelled: here,
            requested: (!here).then_some(true),
            run_id,
            call_id,
        }),
    ))
}

/// `POST /v1/runs/{run_id}/approvals/{call_id}`: a decision on a pending
/// call (`docs/approvals.md`).
async fn decide_approval(
    State(service): State<Service>,
    scope: Option<axum::Extension<guard::Scope>>,
    caller: Option<axum::Extension<guard::Caller>>,
    PathParams((run_id, call_id)): PathParams<(String, String)>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<Json<DecisionTaken>, ApiError> {
    if let Some(axum::Extension(scope)) = &scope {
        let entry = service.run(&run_id).await?;
        scope.check_agent(&entry.agent_id)?;
    }
    let by = caller.as_ref().map(|c| c.0.0.as_str());
    let decided = service.decide_as(&run_id, &call_id, decision, by).await?;
    Ok(Json(DecisionTaken {
        call_id: decided.call_id,
        decision: decided.decision.to_owned(),
    }))
}

/// `GET /v1/approvals`' query.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ApprovalsQuery {
    /// Only this thread's runs' approvals (and its sub-agents').
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
