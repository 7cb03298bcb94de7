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
use crate::service::{RunEntry, RunStatus, Service, Strategy, Submission};
use events::Translator;
use input::RunAgentInput;

/// `POST /v1/ag-ui/{agent_id}`.
pub(crate) async fn run(
    State(service): State<Service>,
    scope: Option<axum::Extension<crate::http::guard::Scope>>,
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
    // The ids (empty, too long, control characters) and the messages'
    // roles are checked by the service, for every entry point alike.
    let submission = Submission {
        agent_id: Some(agent_id),
        client_messages: input.client_messages()?,
        strategy: Strategy::Interrupt,
        run_id: Some(input.run_id.clone()),
        ..Submission::default()
    };
    let submitted = service.submit(&input.thread_id, submission).await?;
    let entry = service.live(&submitted).await?;
    let translator = Translator::new(&input.thread_id, &input.run_id);
    Ok(Sse::new(stream(service, entry, translator)))
}

/// The AG-UI events of one run; dropping it before `RUN_FINISHED` (the
/// client went away) cancels the run. The ids of the messages it emits
/// are recorded with the thread, so a client sending them back appends
/// nothing.
fn stream(
    service: Service,
    entry: Arc<RunEntry>,
    mut translator: Translator,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let guard = AbortOnDrop(Some(entry.clone()));
    let first = futures::stream::iter(translator.start());
    let thread_id = entry.thread_id.clone();
    let rest = run_log(entry, 0).then(move |logged| {
        let out = match logged.event() {
            Some(event) => translator.translate(event),
            None => Vec::new(),
        };
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
    first.chain(rest.flatten()).map(move |json| {
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
