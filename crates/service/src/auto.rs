//! Auto mode as a service: a session whose rounds are ordinary runs.
//!
//! # The model
//!
//! A submission in auto mode starts a **session** on its thread. Each of
//! its rounds is an ordinary run — queued, claimed, cancelled, recorded
//! and streamed like any other — that carries the session's state between
//! rounds ([`AutoRounds`]) with it: in memory in-process, in the run's row
//! in distributed mode, so the next round may run in another process.
//! When a round ends, the process that ran it adds the round's tokens and
//! metric reports to the thread's session totals, decides with the same
//! step `AgentRuntime::auto_run` uses, and either submits the next round
//! (`enqueue`, with the continuation message) or ends the session. The
//! round's run record says which (`auto`: [`AutoRecord`]), so a client
//! follows a session from record to record (`next_run_id`).
//!
//! **Which mode, which policy** (the source's precedence, highest first):
//! the submission's `run_mode` / `automation_policy` (which also become
//! the thread's stored defaults); the thread's stored defaults; the
//! agent's defaults in the deployment file ([`AgentAuto`]); else a single
//! run.
//!
//! **Session totals** ([`ThreadAuto`]): tokens and reports belong to the
//! thread, across sessions and user messages, until a reset (the source's
//! `/new`, [`Service::reset_session`](crate::Service::reset_session)). In
//! distributed mode they live in the database with the thread's defaults.
//!
//! **Invariants:** a session has at most one round queued or running (the
//! next is submitted only by the end of the previous one); a cancelled or
//! interrupted round ends its session (`cancelled`); every run's last
//! event is still its `run_finished` — progress goes to the thread's live
//! tail and into the round's record, never into a run's log.

use std::collections::HashMap;

use rein_runtime::AgentRunResult;
use rein_runtime::auto::{AutoRounds, AutomationPolicy, MetricsReport, MetricsReports, Verdict};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::message::Message;
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;

/// How a submission runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// One run (what a submission does without auto mode).
    Single,
    /// An auto-mode session: round after round until a stop condition.
    Auto,
}

impl RunMode {
    /// Its name: `single` or `auto`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Auto => "auto",
        }
    }

    /// Parses `single` or `auto`.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Invalid`] naming the field and the value.
    pub fn parse(field: &str, name: &str) -> Result<Self, ServiceError> {
        match name {
            "single" => Ok(Self::Single),
            "auto" => Ok(Self::Auto),
            other => Err(ServiceError::invalid(
                field,
                format!("is \"{other}\"; expected \"auto\" or \"single\""),
            )),
        }
    }
}

/// An agent's auto-mode defaults (the deployment file's `run_mode` and
/// `automation_policy` on the agent).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAuto {
    /// The agent's default mode.
    pub run_mode: RunMode,
    /// Its default policy (`None`: no policy).
    pub policy: Option<AutomationPolicy>,
}

/// What a thread keeps for auto mode: its stored defaults and its
/// session totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadAuto {
    /// The stored default mode (the last submission that named one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_mode: Option<RunMode>,
    /// The stored default policy: `Some(None)` is a stored "no policy".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Option<AutomationPolicy>>,
    /// Tokens the thread's auto-mode rounds used since the last reset.
    #[serde(default)]
    pub tokens_used_session: u64,
    /// Their metric reports since the last reset, in order.
    #[serde(default)]
    pub reports: Vec<MetricsReport>,
}

/// A round's part of its run record: the session it belongs to and what
/// its end decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct AutoRecord {
    /// The session (`auto-<n>`).
    pub session_id: String,
    /// This round's number, from 1.
    pub round: u32,
    /// The thread's session tokens after this round (before it, while it
    /// runs).
    pub tokens_used_session: u64,
    /// The policy's token budget, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The progress messages this round's end reported, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub progress: Vec<String>,
    /// Why the session stopped, when it stopped after this round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The next round's run, when the session goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_id: Option<String>,
}

impl AutoRecord {
    /// The part of a record of a round that has not ended.
    pub(crate) fn running(rounds: &AutoRounds, tokens_used_session: u64) -> Self {
        Self {
            session_id: rounds.session_id.clone(),
            round: rounds.rounds.saturating_add(1),
            tokens_used_session,
            max_tokens: rounds.max_tokens(),
            progress: Vec::new(),
            stop_reason: None,
            next_run_id: None,
        }
    }
}

impl AutoRecord {
    /// The part of the record of a round that ended without running to its
    /// end by the engine (cancelled while queued, lost with its process,
    /// unable to start): its session ends, with the round's termination.
    pub(crate) fn ended_without_engine(
        rounds: &AutoRounds,
        tokens_used_session: u64,
        termination: &rein_runtime_contract::lifecycle::TerminationReason,
    ) -> Self {
        use rein_runtime_contract::lifecycle::TerminationReason;
        let round = rounds.rounds.saturating_add(1);
        let stop_reason = match termination {
            TerminationReason::Cancelled => "cancelled".to_owned(),
            TerminationReason::Error(message) => format!("run error: {message}"),
            other => format!("run error: the round ended ({other}) before it ran"),
        };
        tracing::info!(
            session = rounds.session_id,
            tokens_used_session,
            "auto-run stop condition: {stop_reason}"
        );
        Self {
            session_id: rounds.session_id.clone(),
            round,
            tokens_used_session,
            max_tokens: rounds.max_tokens(),
            progress: vec![
                format!("auto-run round {round} finished: {termination}"),
                format!("auto-run stop condition: {stop_reason}"),
            ],
            stop_reason: Some(stop_reason),
            next_run_id: None,
        }
    }
}

/// The mode and policy a submission runs with, by the precedence in the
/// module docs. `None`: a single run.
pub(crate) fn resolve(
    run_mode: Option<RunMode>,
    policy: Option<&Option<AutomationPolicy>>,
    thread: &ThreadAuto,
    agent: Option<&AgentAuto>,
) -> Option<Option<AutomationPolicy>> {
    let mode = run_mode
        .or(thread.run_mode)
        .or(agent.map(|a| a.run_mode))
        .unwrap_or(RunMode::Single);
    if mode == RunMode::Single {
        return None;
    }
    let policy = policy
        .cloned()
        .or_else(|| thread.policy.clone())
        .or_else(|| agent.map(|a| a.policy.clone()))
        .unwrap_or(None);
    Some(policy)
}

/// A submission's own `run_mode` / `automation_policy`, kept with its
/// run when the mode resolves the session only when the run starts
/// (distributed mode: the thread's defaults are read in the claim's own
/// statement, not on the submission's path).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct AutoRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run_mode: Option<RunMode>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) automation_policy: Option<Option<AutomationPolicy>>,
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value
/// (with `#[serde(default, deserialize_with = "nullable")]`).
///
/// # Errors
///
/// The value's own deserialization error.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// What a run's row carries for auto mode: a round's session state, or
/// the submission's request to resolve when the run starts.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum StoredAuto {
    Rounds(AutoRounds),
    Request { request: AutoRequest },
}

/// The thread totals in memory (in-process mode).
#[derive(Debug, Default)]
pub(crate) struct InMemory {
    threads: std::sync::Mutex<HashMap<String, ThreadAuto>>,
}

impl InMemory {
    fn threads(&self) -> std::sync::MutexGuard<'_, HashMap<String, ThreadAuto>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, thread_id: &str) -> ThreadAuto {
        self.threads().get(thread_id).cloned().unwrap_or_default()
    }

    /// The thread's stored defaults and tokens (not its reports): what a
    /// submission is resolved with, cheap on every submission.
    pub(crate) fn defaults(&self, thread_id: &str) -> ThreadAuto {
        let threads = self.threads();
        match threads.get(thread_id) {
            None => ThreadAuto::default(),
            Some(t) => ThreadAuto {
                run_mode: t.run_mode,
                policy: t.policy.clone(),
                tokens_used_session: t.tokens_used_session,
                reports: Vec::new(),
            },
        }
    }

    pub(crate) fn set_defaults(
        &self,
        thread_id: &str,
        run_mode: Option<RunMode>,
        policy: Option<Option<AutomationPolicy>>,
    ) {
        let mut threads = self.threads();
        let thread = threads.entry(thread_id.to_owned()).or_default();
        if run_mode.is_some() {
            thread.run_mode = run_mode;
        }
        if policy.is_some() {
            thread.policy = policy;
        }
    }

    pub(crate) fn add(
        &self,
        thread_id: &str,
        tokens: u64,
        reports: &[MetricsReport],
    ) -> ThreadAuto {
        let mut threads = self.threads();
        let thread = threads.entry(thread_id.to_owned()).or_default();
        thread.tokens_used_session = thread.tokens_used_session.saturating_add(tokens);
        thread.reports.extend_from_slice(reports);
        thread.clone()
    }

    pub(crate) fn reset(&self, thread_id: &str) {
        if let Some(thread) = self.threads().get_mut(thread_id) {
            thread.tokens_used_session = 0;
            thread.reports.clear();
        }
    }

    pub(crate) fn delete(&self, thread_id: &str) {
        self.threads().remove(thread_id);
    }
}

/// What a round's end decided: its record part, and the next round's
/// input when the session goes on.
pub(crate) struct RoundEnd {
    pub(crate) record: AutoRecord,
    pub(crate) next: Option<(Message, AutoRounds)>,
    /// The progress events to send to the thread's tail.
    pub(crate) events: Vec<AgentEvent>,
    thread_id: String,
    round_run_id: String,
}

impl RoundEnd {
    /// Ends the session with `reason` instead of going on (nothing when
    /// the round's end stopped it already): the stop's progress message,
    /// event and log line.
    pub(crate) fn stop_instead(&mut self, reason: String) {
        if self.next.take().is_none() {
            return;
        }
        tracing::info!(
            thread_id = self.thread_id,
            session = self.record.session_id,
            "auto-run stop condition: {reason}"
        );
        let message = format!("auto-run stop condition: {reason}");
        self.events.push(AgentEvent::Progress {
            run_id: self.record.session_id.clone(),
            thread_id: self.thread_id.clone(),
            message: message.clone(),
            tokens_used_session: self.record.tokens_used_session,
            max_tokens: self.record.max_tokens,
            round_run_id: Some(self.round_run_id.clone()),
        });
        self.record.progress.push(message);
        self.record.stop_reason = Some(reason);
    }
}

/// Decides after a round whose session totals (this round included) are
/// `totals`.
pub(crate) fn end_round(
    runtime: &rein_runtime::AgentRuntime,
    mut rounds: AutoRounds,
    result: &AgentRunResult,
    totals: &ThreadAuto,
) -> RoundEnd {
    let tokens = totals.tokens_used_session;
    let step = rounds.after_round(runtime, result, tokens, &totals.reports);
    let max_tokens = rounds.max_tokens();
    let events = step
        .progress
        .iter()
        .map(|message| AgentEvent::Progress {
            run_id: rounds.session_id.clone(),
            thread_id: result.thread_id.clone(),
            message: message.clone(),
            tokens_used_session: tokens,
            max_tokens,
            round_run_id: Some(result.run_id.clone()),
        })
        .collect();
    let mut record = AutoRecord {
        session_id: rounds.session_id.clone(),
        round: rounds.rounds,
        tokens_used_session: tokens,
        max_tokens,
        progress: step.progress,
        stop_reason: None,
        next_run_id: None,
    };
    let next = match step.verdict {
        Verdict::Continue { message } => Some((Message::user(message), rounds)),
        Verdict::Stop { stop_reason } => {
            // The source logs each stop; operators grep for this line.
            tracing::info!(
                thread_id = result.thread_id,
                session = record.session_id,
                tokens_used_session = tokens,
                "auto-run stop condition: {stop_reason}"
            );
            record.stop_reason = Some(stop_reason);
            None
        }
    };
    RoundEnd {
        record,
        next,
        events,
        thread_id: result.thread_id.clone(),
        round_run_id: result.run_id.clone(),
    }
}

/// The round's metric reports.
pub(crate) fn reports_of(result: &AgentRunResult) -> Vec<MetricsReport> {
    result.exported::<MetricsReports>().unwrap_or_default()
}
