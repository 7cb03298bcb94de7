//! [`ApiError`]: what the service refuses, as an HTTP status and a code.

use rein::RuntimeError;
use serde::Serialize;

/// A refusal: an HTTP status, a snake_case code naming the problem, and a
/// message saying what to fix. Served as
/// `{"error": {"code": "...", "message": "..."}}`.
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

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
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
        serde_json::to_string(&Body {
            error: Inner {
                code: self.code,
                message: &self.message,
            },
        })
        .unwrap_or_default()
    }

    /// 404 `unknown_run`.
    pub fn unknown_run(run_id: &str) -> Self {
        Self::new(
            404,
            "unknown_run",
            format!(
                "no run \"{run_id}\" (unknown, or finished longer ago than the retention keeps)"
            ),
        )
    }

    /// 503 `shutting_down`.
    pub fn shutting_down() -> Self {
        Self::new(
            503,
            "shutting_down",
            "the service is shutting down; no new runs start",
        )
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let message = e.to_string();
        let (status, code) = match e {
            RuntimeError::UnknownAgent { .. } => (404, "unknown_agent"),
            RuntimeError::AgentRequired { .. } => (422, "agent_required"),
            RuntimeError::ShutDown => (503, "shutting_down"),
            RuntimeError::InvalidInput { .. } => (422, "invalid_input"),
            RuntimeError::EmptyConversation { .. } => (422, "empty_conversation"),
            RuntimeError::ThreadAlreadyRunning { .. } => (409, "thread_busy"),
            RuntimeError::PreviousRunStuck { .. } => (409, "previous_run_stuck"),
            RuntimeError::RunIdInUse { .. } => (409, "run_id_in_use"),
            RuntimeError::Store { .. } => (500, "store_failed"),
            _ => (500, "internal"),
        };
        Self::new(status, code, message)
    }
}
