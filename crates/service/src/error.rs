//! [`ServiceError`]: everything the service refuses, as typed fields.
//!
//! One enum for both modes. Transports map it once: the HTTP server has
//! one table from variant to status and code (`rein_server::http`); the
//! CLI prints its `Display`, which names the offending id and says what
//! to do.

use rein_runtime::approvals::ApprovalError;
use rein_runtime::{CancelToolCallError, RuntimeError};

use crate::records::RunStatus;

/// Why the service refused a request. Nothing was appended, queued or
/// interrupted by a refused request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The engine refused the request (unknown agent, invalid input, an
    /// empty conversation, shut down, a stuck run, a store failure).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A field of the request is not acceptable (too long, a NUL
    /// character, empty); the same limits hold in both modes.
    #[error("{field} {problem}")]
    InvalidField {
        /// The field (`thread_id`, `idempotency_key`, `run_id`,
        /// `messages[2].content`, …).
        field: String,
        /// What is wrong with it and what to send instead.
        problem: String,
    },
    /// No such strategy.
    #[error("unknown strategy \"{name}\"; use interrupt, enqueue or reject")]
    UnknownStrategy {
        /// The name sent.
        name: String,
    },
    /// `reject` and the thread has a run (or a queued one).
    #[error(
        "thread \"{thread_id}\" has a run; submit with strategy interrupt or enqueue, or cancel it first"
    )]
    ThreadBusy {
        /// The thread.
        thread_id: String,
    },
    /// Another process runs the thread and did not let it go in time.
    #[error(
        "thread \"{thread_id}\" is being run by another process that did not let it go; retry when its run has finished"
    )]
    ThreadOwnedElsewhere {
        /// The thread.
        thread_id: String,
    },
    /// The idempotency key was used on the thread by a submission with a
    /// different body (agent or messages).
    #[error(
        "idempotency key \"{key}\" was used on thread \"{thread_id}\" for run \"{run_id}\" with a different agent or messages; send a new key for new input"
    )]
    IdempotencyKeyReused {
        /// The thread.
        thread_id: String,
        /// The key.
        key: String,
        /// The run the key names.
        run_id: String,
    },
    /// A client-chosen run id is taken.
    #[error("run id \"{run_id}\" is already taken; choose another")]
    RunIdInUse {
        /// The id.
        run_id: String,
    },
    /// No such run (or it finished longer ago than retention keeps).
    #[error("no run \"{run_id}\" (unknown, or finished longer ago than the retention keeps)")]
    UnknownRun {
        /// The id asked for.
        run_id: String,
    },
    /// The run is not running, so none of its tool calls is.
    #[error(
        "run \"{run_id}\" is {}, not running; a tool call can be cancelled only while its run runs",
        status.as_str()
    )]
    RunNotRunning {
        /// The run.
        run_id: String,
        /// Where it is.
        status: RunStatus,
    },
    /// The run runs here but has no running call with this id.
    #[error(transparent)]
    ToolCall(CancelToolCallError),
    /// A decision on a pending approval was refused: no such pending call
    /// (`unknown_approval`), already decided differently
    /// (`already_decided`), or it does not fit the call (`invalid_decision`).
    #[error(transparent)]
    Approval(#[from] ApprovalError),
    /// The service is shutting down: no new runs start.
    #[error("the service is shutting down; no new runs start")]
    ShuttingDown,
    /// The shared database did not answer (distributed mode), also after
    /// retrying through a restart.
    #[error("the database could not be reached: {detail}")]
    StoreUnavailable {
        /// The database's error.
        detail: String,
    },
}

impl ServiceError {
    /// A stable snake_case code for the error (what the HTTP API puts in
    /// `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Runtime(e) => match e {
                RuntimeError::UnknownAgent { .. } => "unknown_agent",
                RuntimeError::AgentRequired { .. } => "agent_required",
                RuntimeError::ShutDown => "shutting_down",
                RuntimeError::InvalidInput { .. } => "invalid_input",
                RuntimeError::EmptyConversation { .. } => "empty_conversation",
                RuntimeError::ThreadAlreadyRunning { .. } => "thread_busy",
                RuntimeError::PreviousRunStuck { .. } => "previous_run_stuck",
                RuntimeError::RunIdInUse { .. } => "run_id_in_use",
                RuntimeError::Store { .. } => "store_failed",
                _ => "internal",
            },
            Self::InvalidField { .. } => "invalid_field",
            Self::UnknownStrategy { .. } => "unknown_strategy",
            Self::ThreadBusy { .. } => "thread_busy",
            Self::ThreadOwnedElsewhere { .. } => "thread_owned_elsewhere",
            Self::RunIdInUse { .. } => "run_id_in_use",
            Self::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            Self::UnknownRun { .. } => "unknown_run",
            Self::RunNotRunning { .. } | Self::ToolCall(_) => "tool_call_not_running",
            Self::Approval(e) => e.code(),
            Self::ShuttingDown => "shutting_down",
            Self::StoreUnavailable { .. } => "store_unavailable",
        }
    }

    /// [`ServiceError::UnknownRun`].
    pub fn unknown_run(run_id: &str) -> Self {
        Self::UnknownRun {
            run_id: run_id.to_owned(),
        }
    }

    /// [`ServiceError::StoreUnavailable`] from any database error.
    pub fn unavailable(error: &impl std::fmt::Display) -> Self {
        Self::StoreUnavailable {
            detail: error.to_string(),
        }
    }

    /// [`ServiceError::InvalidField`]: `field` (its path in the input) and
    /// what is wrong with it.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
