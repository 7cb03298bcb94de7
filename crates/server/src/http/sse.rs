//! Server-sent events: a run's log (resumable with `Last-Event-ID`, ends
//! after `run_finished`) and a thread's live tail.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use super::ApiError;
use super::extract::{LastEventId, PathParams};
use crate::service::{LoggedEvent, RunEntry, RunStatus, Service};

/// How often an idle stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn event(logged: &LoggedEvent, id: u64) -> Event {
    Event::default()
        .event(logged.kind)
        .data(logged.json())
        .id(id.to_string())
}

/// `GET /v1/runs/{run_id}/events`.
pub(super) async fn run_events(
    State(service): State<Service>,
    PathParams(run_id): PathParams<String>,
    LastEventId(after): LastEventId,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let entry = service.run(&run_id).await?;
    let logged = entry.logged();
    if entry.status() == RunStatus::Finished && after >= logged {
        // A silent close would leave the client reconnecting for ever.
        return Err(ApiError::new(
            400,
            "invalid_last_event_id",
            format!(
                "run \"{run_id}\" has finished and has {logged} events; Last-Event-ID {after} is at or past its end (its run_finished is event {logged})"
            ),
        ));
    }
    Ok(Sse::new(run_stream(entry, after)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// The run's events after `after`, then those still to come, ending after
/// `run_finished`.
pub(crate) fn run_stream(
    entry: Arc<RunEntry>,
    after: u64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    run_log(entry, after).map(|logged| Ok(event(&logged, logged.seq)))
}

/// The run's logged events after `after`, ending after `run_finished`.
///
/// `run_finished` is held back until the run's record is finished (the
/// runtime logs it a moment before the service records the result): a
/// client that reads `GET /v1/runs/{id}` on seeing it never finds the run
/// still running.
pub(crate) fn run_log(entry: Arc<RunEntry>, after: u64) -> impl Stream<Item = Arc<LoggedEvent>> {
    struct Reader {
        changes: tokio::sync::watch::Receiver<u64>,
        entry: Arc<RunEntry>,
        after: u64,
        pending: VecDeque<Arc<LoggedEvent>>,
        complete: bool,
    }
    // Subscribed before the first read: nothing appended later is missed.
    let reader = Reader {
        changes: entry.watch(),
        entry,
        after,
        pending: VecDeque::new(),
        complete: false,
    };
    futures::stream::unfold(reader, |mut r| async move {
        loop {
            if let Some(next) = r.pending.pop_front() {
                return Some((next, r));
            }
            if r.complete {
                return None;
            }
            let (mut events, complete) = r.entry.events_after(r.after);
            // `run_finished` waits for the record to say finished, so a
            // client that reads the run on seeing it finds it finished.
            if !complete && events.last().is_some_and(|e| e.kind == "run_finished") {
                events.pop();
            }
            if let Some(last) = events.last() {
                r.after = last.seq;
            }
            r.pending.extend(events);
            r.complete = complete;
            if r.pending.is_empty() && !complete && r.changes.changed().await.is_err() {
                return None;
            }
        }
    })
}

/// `GET /v1/threads/{thread_id}/events`: live events of every run on the
/// thread, until the client leaves or the service shuts down. A client
/// that falls more than 1024 events behind gets a comment saying how many
/// it missed.
pub(super) async fn thread_events(
    State(service): State<Service>,
    PathParams(thread_id): PathParams<String>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let subscription = service.subscribe_tail(&thread_id);
    let closing = service.closing().clone();
    let stream =
        futures::stream::unfold((subscription, closing), |(mut sub, closing)| async move {
            let next = tokio::select! {
                _ = closing.cancelled() => return None,
                next = sub.receiver.recv() => next,
            };
            let event = match next {
                Ok(e) => event(&e.json, e.seq),
                Err(RecvError::Lagged(missed)) => {
                    Event::default().comment(format!("lagged: {missed} events were skipped"))
                }
                Err(RecvError::Closed) => return None,
            };
            Some((Ok(event), (sub, closing)))
        });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
