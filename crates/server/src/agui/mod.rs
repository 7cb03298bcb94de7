//! AG-UI: `POST /v1/ag-ui/{agent_id}` takes a `RunAgentInput` and answers
//! with AG-UI events over SSE, for clients such as `@ag-ui/client`'s
//! `HttpAgent`.
//!
//! - **Input.** The client sends the whole conversation; only messages
//!   whose `id` the thread has not seen are appended ([`input`]). System
//!   and developer messages are refused (422 `invalid_field`), as the
//!   HTTP API refuses them: the agent's system prompt is its own. Frontend
//!   tools declared in `tools`, `state`, `context` and `forwardedProps`
//!   are accepted and not used yet.
//! - **The run** is an `interrupt` submission whose run id is the input's
//!   `runId`; a newer submission to the thread interrupts it.
//! - **Output.** The run's events become AG-UI events ([`events`]): every
//!   message, tool call and step that starts also ends before
//!   `RUN_FINISHED` (or `RUN_ERROR` for an `error` termination).
//! - **Sub-agents.** The run's log holds its descendants' events too; they
//!   become `SUBAGENT_STARTED`, the child's own events carrying
//!   `subagentRunId`, then `SUBAGENT_FINISHED` (or `SUBAGENT_ERROR`), each
//!   sub-agent's messages, tool calls and steps ended before its end
//!   ([`events`]). Messages a client sends back with a `subagentRunId` are
//!   the sub-agent's thread's, never appended to this one.
//! - **Abort.** The client closing the connection cancels the run (cause
//!   `requested`).
//!
//! Framing is what the official client parses: `data: <json>` and a blank
//! line per event, LF only, no `event:`/`id:` lines, no keep-alive
//! comments; optional fields are omitted, never `null`.

mod events;
mod input;

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use futures::{Stream, StreamExt};

use crate::http::{ApiError, JsonBody, PathParams, run_log};
use crate::service::{LoggedEvent, RunEntry, RunStatus, Service, Strategy, Submission};
use events::Translator;
pub(crate) use input::RunAgentInput;
use rein::contract::approval::{Decision, PendingApproval, PendingKind};
use rein::events::AgentEvent;
use rein_service::AutoRecord;

/// `POST /v1/ag-ui/{agent_id}`.
pub(crate) async fn run(
    State(service): State<Service>,
    scope: Option<axum::Extension<crate::http::guard::Scope>>,
    caller: Option<axum::Extension<crate::http::guard::Caller>>,
    PathParams(agent_id): PathParams<String>,
    JsonBody(input): JsonBody<RunAgentInput>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if let Some(axum::Extension(scope)) = &scope {
        scope.check_agent(&agent_id)?;
    }
    if service.runtime().agent_spec(Some(&agent_id)).is_none() {
        return Err(ApiError::new(
            404,
            "unknown_agent",
            format!(
                "unknown agent id \"{agent_id}\"; known agents: {}",
                service.runtime().agent_ids().join(", ")
            ),
        ));
    }
    if !input.resume.is_empty() {
        let by = caller.as_ref().map(|c| c.0.0.as_str());
        let (entry, translator, from) = resume(&service, &input, by).await?;
        return Ok(Sse::new(stream(service, entry, translator, from).boxed()));
    }
    // The ids (empty, too long, control characters) and the messages'
    // roles are checked by the service, for every entry point alike.
    let (run_mode, policy) = input.auto_props();
    let run_mode = match run_mode {
        None => None,
        Some((field, serde_json::Value::String(name))) => {
            Some(rein_service::RunMode::parse(&field, &name)?)
        }
        Some((field, other)) => {
            return Err(rein_service::ServiceError::invalid(
                field,
                format!("is {other}; expected \"auto\" or \"single\""),
            )
            .into());
        }
    };
    let automation_policy = match policy {
        None => None,
        Some((field, value)) => {
            crate::http::auto::policy(&field, Some(Some(value).filter(|v| !v.is_null())))?
        }
    };
    let submission = Submission {
        agent_id: Some(agent_id),
        client_messages: input.client_messages()?,
        strategy: Strategy::Interrupt,
        run_id: Some(input.run_id.clone()),
        run_mode,
        automation_policy,
        ..Submission::default()
    };
    let submitted = service.submit(&input.thread_id, submission).await?;
    let entry = service.live(&submitted).await?;
    let translator = Translator::new(&input.thread_id, &input.run_id);
    Ok(Sse::new(stream(service, entry, translator, 0).boxed()))
}

/// Decides a parked run's interrupts from `input.resume`; returns the
/// root run's entry, a translator that knows the tree so far, and where
/// in the root's log the continued run starts (after its `run_parked`).
async fn resume(
    service: &Service,
    input: &RunAgentInput,
    by: Option<&str>,
) -> Result<(Arc<RunEntry>, Translator, u64), ApiError> {
    let thread = &input.thread_id;
    let pending = service.pending_approvals(Some(thread)).await?;
    let Some(first) = pending.first() else {
        return Err(ApiError::new(
            409,
            "no_pending_interrupts",
            format!(
                "thread \"{thread}\" has no run waiting on interrupts; send the input without `resume`"
            ),
        ));
    };
    let root = first
        .root_run_id
        .clone()
        .unwrap_or_else(|| first.run_id.clone());
    // Every entry is checked before any is decided.
    let mut decisions = Vec::with_capacity(input.resume.len());
    for entry in &input.resume {
        let Some(p) = pending
            .iter()
            .find(|p| interrupt_id(p) == entry.interrupt_id)
        else {
            let open: Vec<String> = pending.iter().map(interrupt_id).collect();
            return Err(ApiError::new(
                404,
                "unknown_approval",
                format!(
                    "interrupt \"{}\" is not pending on thread \"{thread}\"; pending: {}",
                    entry.interrupt_id,
                    open.join(", ")
                ),
            ));
        };
        let decision = decision_of(entry, p.kind)?;
        decisions.push((p.run_id.clone(), p.call_id.clone(), decision));
    }
    let run = service.run(&root).await?;
    for (run_id, call_id, decision) in decisions {
        service.decide_as(&run_id, &call_id, decision, by).await?;
    }
    let (events, _) = run.events_after(0);
    let parked_at = events
        .iter()
        .rposition(|e| e.kind == "run_parked")
        .map_or(0, |i| i + 1);
    let before: Vec<AgentEvent> = events[..parked_at]
        .iter()
        .filter_map(|e| e.event().cloned())
        .collect();
    let translator = Translator::resuming(thread, &input.run_id, &root, &before);
    Ok((run, translator, parked_at as u64))
}

/// The AG-UI id of a pending call's interrupt: its tool call's AG-UI id
/// (`<child run>:<call>` for a sub-agent's, as the translator names it).
fn interrupt_id(pending: &PendingApproval) -> String {
    match pending.root_run_id {
        Some(_) => format!("{}:{}", pending.run_id, pending.call_id),
        None => pending.call_id.clone(),
    }
}

/// The decision an AG-UI resume entry means: `cancelled` rejects;
/// `resolved` carries the decision's JSON as its payload (for a question,
/// a bare answer is a `respond`).
fn decision_of(entry: &input::ResumeEntry, kind: PendingKind) -> Result<Decision, ApiError> {
    let invalid = |message: String| ApiError::new(422, "invalid_decision", message);
    match (entry.status.as_str(), &entry.payload) {
        // Cancelling an escalation stops the run; a call, it rejects.
        ("cancelled", _) if kind == PendingKind::Escalation => Ok(Decision::Stop),
        ("cancelled", _) => Ok(Decision::Reject { reason: None }),
        ("resolved", Some(payload)) if payload.get("decision").is_some() => {
            serde_json::from_value(payload.clone()).map_err(|e| {
                invalid(format!(
                    "interrupt \"{}\": payload is not a decision ({e}); send {{\"decision\": \"approve\" | \"reject\" | \"edit\" | \"respond\", …}}",
                    entry.interrupt_id
                ))
            })
        }
        ("resolved", Some(answer)) if kind == PendingKind::Question => Ok(Decision::Respond {
            result: answer.get("result").cloned().unwrap_or_else(|| answer.clone()),
        }),
        ("resolved", _) => Err(invalid(format!(
            "interrupt \"{}\": a resolved entry needs a payload {{\"decision\": …}}",
            entry.interrupt_id
        ))),
        (other, _) => Err(invalid(format!(
            "interrupt \"{}\": unknown status \"{other}\"; use resolved or cancelled",
            entry.interrupt_id
        ))),
    }
}

/// What the stream follows: the run's events, and for an auto-mode
/// round, its end with its record (to go on with the next round or end the
/// session).
enum Followed {
    Event(Arc<LoggedEvent>),
    RoundEnd(Arc<LoggedEvent>, Option<AutoRecord>, Option<Arc<RunEntry>>),
}

/// The log of `entry` from `from`, and of each next round of its auto-mode
/// session after it; `current` always holds the run being followed.
fn session_log(
    service: Service,
    entry: Arc<RunEntry>,
    from: u64,
    current: Arc<std::sync::Mutex<Arc<RunEntry>>>,
) -> impl Stream<Item = Followed> {
    type Log = futures::stream::BoxStream<'static, Arc<LoggedEvent>>;
    let log: Log = run_log(entry.clone(), from).boxed();
    futures::stream::unfold(Some((entry, log)), move |state| {
        let service = service.clone();
        let current = current.clone();
        async move {
            let (entry, mut log) = state?;
            let logged = log.next().await?;
            let ends_round = logged.kind == "run_finished"
                && logged.event().is_some_and(|e| e.run_id() == entry.run_id);
            if !ends_round {
                return Some((Followed::Event(logged), Some((entry, log))));
            }
            // The round's record says whether the session goes on.
            let auto = entry.finished().await.auto;
            let next = match auto.as_ref().and_then(|a| a.next_run_id.as_deref()) {
                Some(next) => service.run(next).await.ok(),
                None => None,
            };
            let state = next.clone().map(|next| {
                *current.lock().unwrap_or_else(|e| e.into_inner()) = next.clone();
                let log: Log = run_log(next.clone(), 0).boxed();
                (next, log)
            });
            Some((Followed::RoundEnd(logged, auto, next), state))
        }
    })
}

/// The AG-UI events of one run — for an auto-mode session, of all its
/// rounds in one AG-UI run; dropping it before `RUN_FINISHED` (the client
/// went away) cancels the run being followed. The ids of the messages it
/// emits are recorded with the thread, so a client sending them back
/// appends nothing.
fn stream(
    service: Service,
    entry: Arc<RunEntry>,
    mut translator: Translator,
    from: u64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let suspended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let current = Arc::new(std::sync::Mutex::new(entry.clone()));
    let guard = AbortOnDrop(Some(current.clone()), suspended.clone(), service.clone());
    let first = futures::stream::iter(translator.start());
    let thread_id = entry.thread_id.clone();
    let rest = session_log(service.clone(), entry, from, current).then(move |followed| {
        let mut out = match followed {
            Followed::Event(logged) => match logged.event() {
                Some(event) => translator.translate(event),
                None => Vec::new(),
            },
            Followed::RoundEnd(logged, Some(auto), Some(next)) => {
                let _ = logged;
                translator.next_round(&auto, &next.run_id)
            }
            Followed::RoundEnd(logged, auto, _) => {
                let mut out = auto.map(|a| translator.last_round(&a)).unwrap_or_default();
                if let Some(event) = logged.event() {
                    out.extend(translator.translate(event));
                }
                out
            }
        };
        if translator.suspended() {
            suspended.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        // The stream ends with the run's end, or with an interrupt (the
        // run goes on without it): `None` marks the end.
        let mut out: Vec<Option<String>> = out.drain(..).map(Some).collect();
        if translator.done() {
            out.push(None);
        }
        let ids = translator.take_emitted_ids();
        let service = service.clone();
        let thread_id = thread_id.clone();
        async move {
            if !ids.is_empty()
                && let Err(error) = service.remember_message_ids(&thread_id, ids).await
            {
                tracing::warn!(%error, thread_id, "could not record the AG-UI message ids");
            }
            futures::stream::iter(out)
        }
    });
    first
        .map(Some)
        .chain(rest.flatten())
        .take_while(|item| std::future::ready(item.is_some()))
        .filter_map(std::future::ready)
        .map(move |json| {
            let _keep = &guard;
            Ok(Event::default().data(json))
        })
}

/// Cancels the run when the response stream is dropped before the run
/// finished.
struct AbortOnDrop(
    Option<Arc<std::sync::Mutex<Arc<RunEntry>>>>,
    Arc<std::sync::atomic::AtomicBool>,
    Service,
);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let entry = self
            .0
            .take()
            .map(|current| current.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let Some(entry) = entry else { return };
        if self.1.load(std::sync::atomic::Ordering::SeqCst) {
            return; // suspended on an interrupt: the run goes on
        }
        if entry.status() != RunStatus::Finished {
            entry.cancellation().cancel();
        }
        // An auto-mode round may have queued the next one as the client
        // left: that round is cancelled too, so the session ends.
        if entry.record().auto.is_some() {
            let service = self.2.clone();
            tokio::spawn(async move {
                let record = entry.finished().await;
                if let Some(next) = record.auto.and_then(|a| a.next_run_id)
                    && let Err(error) = service.cancel_run(&next).await
                {
                    tracing::warn!(%error, run_id = next, "could not cancel the session's next round");
                }
            });
        }
    }
}
