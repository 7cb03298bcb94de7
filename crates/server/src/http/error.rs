//! [`ApiError`]: a refusal as HTTP sends it — a status, a snake_case code
//! and a message saying what to fix — and the one table that maps the
//! service's [`ServiceError`] to status and code. Served as
//! `{"error": {"code": "...", "message": "..."}}`.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rein_service::ServiceError;
use serde::Serialize;

/// A refusal: an HTTP status, a code naming the problem, and a message
/// saying what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The code (`unknown_agent`, `thread_busy`, …).
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
}

/// A refusal's body: `{"error": {"code", "message"}}`.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub(crate) struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

/// What was refused.
#[derive(Serialize, schemars::JsonSchema)]
struct ErrorDetail<'a> {
    /// A stable snake_case code naming the problem.
    code: &'a str,
    /// What went wrong and what to do.
    message: &'a str,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::to_string(&ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: &self.message,
            },
        })
        .unwrap_or_default()
    }
}

/// The table: every service error's HTTP status (its code is the
/// service's own, [`ServiceError::code`]).
fn status(e: &ServiceError) -> u16 {
    use rein_service::ServiceError as E;
    match e {
        E::UnknownRun { .. } => 404,
        E::Runtime(r) => match r {
            rein::RuntimeError::UnknownAgent { .. } => 404,
            rein::RuntimeError::AgentRequired { .. }
            | rein::RuntimeError::InvalidInput { .. }
            | rein::RuntimeError::EmptyConversation { .. } => 422,
            rein::RuntimeError::ThreadAlreadyRunning { .. }
            | rein::RuntimeError::PreviousRunStuck { .. }
            | rein::RuntimeError::RunIdInUse { .. } => 409,
            rein::RuntimeError::ShutDown => 503,
            _ => 500,
        },
        E::InvalidField { .. } | E::UnknownStrategy { .. } | E::IdempotencyKeyReused { .. } => 422,
        E::ThreadBusy { .. }
        | E::ThreadOwnedElsewhere { .. }
        | E::RunIdInUse { .. }
        | E::RunNotRunning { .. }
        | E::ToolCall(_) => 409,
        E::Approval(a) => match a {
            rein::approvals::ApprovalError::UnknownApproval { .. } => 404,
            rein::approvals::ApprovalError::AlreadyDecided { .. } => 409,
            _ => 422,
        },
        E::ShuttingDown | E::StoreUnavailable { .. } => 503,
        _ => 500,
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        Self::new(status(&e), e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // One line per refusal (never with a token or a request body).
        if status.is_server_error() {
            tracing::warn!(target: "rein::http", status = self.status, code = self.code, message = %self.message, "request failed");
        } else {
            tracing::info!(target: "rein::http", status = self.status, code = self.code, "request refused");
        }
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response()
    }
}
