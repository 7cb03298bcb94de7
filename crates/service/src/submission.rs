//! What a client submits ([`Submission`], [`Strategy`]), what it gets back
//! ([`Submitted`]), and the limits every submission is checked against at
//! the edge, the same in both modes.

use std::collections::HashSet;
use std::sync::Arc;

use rein_runtime_contract::message::{Message, Role};
use serde::Deserialize;

use crate::error::ServiceError;
use crate::records::RunEntry;
use crate::settings::MAX_ID_BYTES;

/// What to do with a submission to a thread that has a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Cancel the active run (cause `interrupted`), then run (the default).
    #[default]
    Interrupt,
    /// Run after the active run and any queued ones, in order.
    Enqueue,
    /// Refuse with [`ServiceError::ThreadBusy`].
    Reject,
}

impl Strategy {
    /// Parses a strategy name.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownStrategy`] naming it.
    pub fn parse(name: &str) -> Result<Self, ServiceError> {
        match name {
            "interrupt" => Ok(Self::Interrupt),
            "enqueue" => Ok(Self::Enqueue),
            "reject" => Ok(Self::Reject),
            other => Err(ServiceError::UnknownStrategy {
                name: other.to_owned(),
            }),
        }
    }
}

/// A message a client identifies by ids of its own (AG-UI): appended only
/// if the thread has seen none of its ids; `message: None` records the ids
/// of something not stored (a system message), so it stays skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientMessage {
    /// The client's ids for it (the message's, and its tool calls').
    pub ids: Vec<String>,
    /// The message to append, if any.
    pub message: Option<Message>,
}

/// One submission to a thread.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    /// The agent (optional when the runtime has one).
    pub agent_id: Option<String>,
    /// The new messages.
    pub messages: Vec<Message>,
    /// Messages the client identifies by ids (AG-UI), appended after
    /// `messages` when their ids are new to the thread. The check and the
    /// record of the ids happen under the thread's lock, in the mode's
    /// store, so concurrent resends and other processes agree.
    pub client_messages: Vec<ClientMessage>,
    /// What to do when the thread is busy.
    pub strategy: Strategy,
    /// A key that makes a repeated submission return the first one's run.
    pub idempotency_key: Option<String>,
    /// The run's id, when the client chooses it (AG-UI); else one is made
    /// that no client-chosen id can take.
    pub run_id: Option<String>,
    /// `auto` starts an auto-mode session, `single` one run; when given,
    /// also the thread's stored default ([`crate::auto`]).
    pub run_mode: Option<crate::auto::RunMode>,
    /// The session's policy (`Some(None)`: explicitly none); when given,
    /// also the thread's stored default.
    pub automation_policy: Option<Option<rein_runtime::auto::AutomationPolicy>>,
}

impl Submission {
    /// A submission of `messages` with the defaults (`interrupt`, the
    /// runtime's only agent, no key).
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Checks the ids against the service's limits (the same in both
    /// modes): each at most [`MAX_ID_BYTES`], with no control characters,
    /// the thread id and a key not empty. And refuses instructions from
    /// clients (a `system` message, which AG-UI's `developer` role is
    /// too): an agent's instructions are its spec's `system_prompt`, for
    /// every entry point.
    pub(crate) fn validate(&self, thread_id: &str) -> Result<(), ServiceError> {
        check_id("thread_id", thread_id)?;
        if let Some(agent_id) = &self.agent_id {
            check_id("agent_id", agent_id)?;
        }
        if let Some(key) = &self.idempotency_key {
            check_id("idempotency_key", key)?;
        }
        if let Some(run_id) = &self.run_id {
            check_id("run_id", run_id)?;
        }
        for (i, m) in self.client_messages.iter().enumerate() {
            for id in &m.ids {
                check_id(&format!("messages[{i}].id"), id)?;
            }
        }
        let client = self.client_messages.iter().map(|m| m.message.as_ref());
        for (i, m) in self.messages.iter().map(Some).chain(client).enumerate() {
            if m.is_some_and(|m| m.role == Role::System) {
                return Err(ServiceError::invalid(
                    format!("messages[{i}].role"),
                    "is an instruction (system or developer): clients may not send one; the agent's system_prompt gives its instructions, so send this text as a user message",
                ));
            }
        }
        Ok(())
    }

    /// The messages to append when the thread has seen `seen`: `messages`,
    /// then the client messages none of whose ids is in `seen` (nor earlier
    /// in this submission); and the ids to record.
    pub(crate) fn unseen(&self, seen: &HashSet<String>) -> (Vec<Message>, Vec<String>) {
        let mut messages = self.messages.clone();
        let mut ids = Vec::new();
        let mut now: HashSet<&str> = HashSet::new();
        for m in &self.client_messages {
            if m.ids
                .iter()
                .any(|id| seen.contains(id) || now.contains(id.as_str()))
            {
                continue;
            }
            now.extend(m.ids.iter().map(String::as_str));
            ids.extend(m.ids.iter().cloned());
            messages.extend(m.message.clone());
        }
        (messages, ids)
    }

    /// What makes two submissions with one idempotency key the same: the
    /// agent that runs them and their messages.
    pub(crate) fn fingerprint(&self, agent_id: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        agent_id.hash(&mut hasher);
        serde_json::to_string(&self.messages)
            .unwrap_or_default()
            .hash(&mut hasher);
        hasher.finish()
    }

    /// Every client message id of the submission.
    pub(crate) fn client_ids(&self) -> Vec<String> {
        self.client_messages
            .iter()
            .flat_map(|m| m.ids.iter().cloned())
            .collect()
    }
}

/// Refuses an empty id, one over [`MAX_ID_BYTES`], or one with a control
/// character (NUL included), naming the field.
fn check_id(field: &str, id: &str) -> Result<(), ServiceError> {
    if id.is_empty() {
        return Err(ServiceError::invalid(
            field,
            "is empty; send a non-empty id",
        ));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(ServiceError::invalid(
            field,
            format!(
                "is {} bytes long; the limit is {MAX_ID_BYTES} bytes",
                id.len()
            ),
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(ServiceError::invalid(
            field,
            format!(
                "contains the control character U+{:04X}; ids are printable text",
                c as u32
            ),
        ));
    }
    Ok(())
}

/// A submission's outcome.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A new run (queued or running).
    New(Arc<RunEntry>),
    /// The idempotency key was seen: the first submission's run.
    Duplicate(Arc<RunEntry>),
}

impl Submitted {
    /// The run's entry. In distributed mode a new run's entry may be a
    /// snapshot taken at submission (the run is queued for another
    /// process): use [`Service::live`](crate::Service::live) for one that
    /// follows the run.
    pub fn entry(&self) -> &Arc<RunEntry> {
        match self {
            Self::New(e) | Self::Duplicate(e) => e,
        }
    }
}
