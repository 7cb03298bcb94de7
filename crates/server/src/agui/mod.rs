//! AG-UI: `POST /v1/ag-ui/{agent_id}` takes a `RunAgentInput` and answers
//! with AG-UI events over SSE, for clients such as `@ag-ui/client`'s
//! `HttpAgent`.
//!
//! - **Input.** The client sends the whole conversation; only messages
//!   whose `id` the thread has not seen are appended ([`input`]). System
//!   and developer messages are not stored (the agent's system prompt is
//!   its own); frontend tools declared in `tools`, `state`, `context` and
//!   `forwardedProps` are accepted and not used yet.
//! - **The run** is an `interrupt` submission whose run id is the input's
//!   `runId`; a newer submission to the thread interrupts it.
//! - **Output.** The run's events become AG-UI events ([`events`]): every
//!   message, tool call and step that starts also ends before
//!   `RUN_FINISHED` (or `RUN_ERROR` for an `error` termination).
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

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::sse::{Event, Sse};
use futures::{Stream, StreamExt};

use crate::http::{body_error, parse_json, run_log};
use crate::service::{ApiError, RunEntry, RunStatus, Service, Strategy, Submission};
use events::Translator;
use input::RunAgentInput;

/// `POST /v1/ag-ui/{agent_id}`.
pub(crate) async fn run(
    State(service): State<Service>,
    Path(agent_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let body = body.map_err(|r| body_error(&r, service.settings().body_limit_bytes))?;
    let input: RunAgentInput = parse_json(&body)?;
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
    if input.thread_id.is_empty() || input.run_id.is_empty() {
        return Err(ApiError::new(
            422,
            "invalid_body",
            "threadId and runId must not be empty",
        ));
    }
    let seen = service.seen_message_ids(&input.thread_id);
    let (messages, ids) = input.new_messages(&seen)?;
    let submitted = service
        .submit(
            &input.thread_id,
            Submission {
                agent_id: Some(agent_id),
                messages,
                strategy: Strategy::Interrupt,
                idempotency_key: None,
                run_id: Some(input.run_id.clone()),
            },
        )
        .await?;
    service.remember_message_ids(&input.thread_id, ids);
    let entry = service.live(&submitted).await?;
    let translator = Translator::new(&input.thread_id, &input.run_id);
    Ok(Sse::new(stream(service, entry, translator)))
}

/// The AG-UI events of one run; dropping it before `RUN_FINISHED` (the
/// client went away) cancels the run.
fn stream(
    service: Service,
    entry: Arc<RunEntry>,
    mut translator: Translator,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let guard = AbortOnDrop(Some(entry.clone()));
    let first = futures::stream::iter(translator.start());
    let thread_id = entry.thread_id.clone();
    let rest = run_log(entry, 0).flat_map(move |logged| {
        let out = translator.translate(&logged.json);
        service.remember_message_ids(&thread_id, translator.take_emitted_ids());
        futures::stream::iter(out)
    });
    first.chain(rest).map(move |json| {
        let _keep = &guard;
        Ok(Event::default().data(json))
    })
}

/// Cancels the run when the response stream is dropped before the run
/// finished.
struct AbortOnDrop(Option<Arc<RunEntry>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(entry) = self.0.take()
            && entry.status() != RunStatus::Finished
        {
            entry.cancellation().cancel();
        }
    }
}
