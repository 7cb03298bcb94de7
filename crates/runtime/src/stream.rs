//! [`RunStream`]: a run's events as a `futures::Stream`, and its result.
//!
//! The run's events go through an unbounded channel, so a slow consumer
//! loses none and never slows the run down (the run's events are held
//! until read). The stream ends right after `RunFinished`; then
//! [`RunStream::result`] has the run's result.
//!
//! **Invariant:** a run sends all its events before its task completes,
//! so once the run's result is in, the events left in the channel are all
//! there will be: the stream yields them and ends.
//!
//! Dropping a `RunStream` before it ended cancels the run (cause
//! `Requested`), like dropping the future of [`AgentRuntime::run`]; the
//! run's cleanup completes in the background.
//!
//! [`AgentRuntime::run`]: crate::AgentRuntime::run

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::FusedStream;
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::event::{AgentEvent, EventSink};
use tokio::sync::mpsc;

use crate::run::{AgentRunResult, RunRequest};
use crate::runtime::RuntimeError;

/// A run's events, in order, ending with `RunFinished`; then its result.
///
/// Made by [`AgentRuntime::run_stream`](crate::AgentRuntime::run_stream)
/// and [`Mailbox::submit_stream`](crate::Mailbox::submit_stream). It is
/// `Unpin`: use it with `StreamExt::next` directly.
///
/// # Cancel safety
///
/// Dropping it before it ended cancels the run (cause `Requested`).
pub struct RunStream {
    run_id: Arc<str>,
    events: mpsc::UnboundedReceiver<AgentEvent>,
    /// The run until it ends; `None` afterwards.
    run: Option<BoxFuture<'static, Result<AgentRunResult, RuntimeError>>>,
    result: Option<Result<AgentRunResult, RuntimeError>>,
    cancellation: CancellationToken,
}

impl std::fmt::Debug for RunStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStream")
            .field("run_id", &self.run_id)
            .field("ended", &self.run.is_none())
            .finish_non_exhaustive()
    }
}

impl RunStream {
    /// Prepares `request` for streaming: its events also go to the
    /// returned channel (and still to the sink it would have had), and its
    /// cancellation token is one the stream owns (a child of the request's).
    pub(crate) fn prepare(
        request: &mut RunRequest,
        fallback: &Arc<dyn EventSink>,
    ) -> (mpsc::UnboundedReceiver<AgentEvent>, CancellationToken) {
        let (sender, events) = mpsc::unbounded_channel();
        let also = request
            .event_sink
            .take()
            .unwrap_or_else(|| fallback.clone());
        request.event_sink = Some(Arc::new(StreamSink {
            sender,
            also_enabled: also.is_enabled(),
            also,
        }));
        let cancellation = match &request.cancellation {
            Some(parent) => parent.child_token(),
            None => CancellationToken::new(),
        };
        request.cancellation = Some(cancellation.clone());
        (events, cancellation)
    }

    pub(crate) fn new(
        run_id: Arc<str>,
        events: mpsc::UnboundedReceiver<AgentEvent>,
        cancellation: CancellationToken,
        run: BoxFuture<'static, Result<AgentRunResult, RuntimeError>>,
    ) -> Self {
        Self {
            run_id,
            events,
            run: Some(run),
            result: None,
            cancellation,
        }
    }

    /// The run's id (known before the run starts).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Cancels the run (cause `Requested`); the stream goes on to its
    /// `RunFinished`.
    pub fn cancel(&self) {
        self.cancellation.cancel();
    }

    /// The run's result, once the stream has ended: `Ok` for every run
    /// that started (whatever its termination), `Err` when it could not
    /// start (as [`AgentRuntime::run`](crate::AgentRuntime::run) would
    /// have returned). `None` while the stream has not ended.
    pub fn result(&self) -> Option<&Result<AgentRunResult, RuntimeError>> {
        self.result.as_ref()
    }

    /// Waits for the run to end, skipping the events not yet read, and
    /// returns its result.
    ///
    /// # Errors
    ///
    /// As for [`AgentRuntime::run`](crate::AgentRuntime::run): only when
    /// the run could not start or its task failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the stream, which cancels the run.
    pub async fn wait(mut self) -> Result<AgentRunResult, RuntimeError> {
        while futures::StreamExt::next(&mut self).await.is_some() {}
        match self.result.take() {
            Some(result) => result,
            None => Err(RuntimeError::RunTaskFailed {
                run_id: self.run_id.to_string(),
                message: "the run's stream ended without a result".to_owned(),
            }),
        }
    }
}

impl Stream for RunStream {
    type Item = AgentEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AgentEvent>> {
        let this = &mut *self;
        if let Some(run) = &mut this.run {
            if let Poll::Ready(Some(event)) = this.events.poll_recv(cx) {
                return Poll::Ready(Some(event));
            }
            match run.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    this.result = Some(result);
                    this.run = None;
                }
            }
        }
        // The run has ended: what is left in the channel is all there is.
        Poll::Ready(this.events.try_recv().ok())
    }
}

impl FusedStream for RunStream {
    fn is_terminated(&self) -> bool {
        self.run.is_none() && self.events.is_empty()
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if self.run.is_some() {
            self.cancellation.cancel();
        }
    }
}

/// Sends each event to the stream's channel, then to the sink the run
/// would have had without the stream.
struct StreamSink {
    sender: mpsc::UnboundedSender<AgentEvent>,
    also: Arc<dyn EventSink>,
    also_enabled: bool,
}

impl EventSink for StreamSink {
    fn emit(&self, event: AgentEvent) {
        let copy = self.also_enabled.then(|| event.clone());
        // The receiver is gone only once the stream was dropped.
        let _ = self.sender.send(event);
        if let Some(copy) = copy {
            self.also.emit(copy);
        }
    }
}
