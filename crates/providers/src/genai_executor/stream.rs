//! The streaming state machine of [`GenaiExecutor`](super::GenaiExecutor):
//! [`DeltaStream`] turns genai's [`ChatStream`] into Rein's
//! [`InferenceStream`] — text as it arrives, then each tool call once,
//! complete, then the usage — and applies the idle timeout between two
//! stream events. A stream that ends before the provider's end marker ends
//! with a `StreamCut` error.
//!
//! It does not own opening the request (the executor in `mod.rs` waits for
//! the first event under the request timeout and hands it over), the
//! mapping of tool calls and usage (`mapping.rs`) or error classification
//! (`errors.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use genai::chat::{ChatStream, ChatStreamEvent, StreamEnd};
use rein_runtime_contract::inference::{InferenceDelta, InferenceError, InferenceStream};

use super::errors::{Phase, classify_genai_error, secs};
use super::mapping::{cache_usage, token_usage, tool_call};

/// Turns genai's stream into deltas: text as it comes, then the complete
/// tool calls and the usage at genai's `End`.
pub(super) struct DeltaStream {
    /// genai's stream; `None` once it has ended or failed (dropping it
    /// closes the connection).
    inner: Option<ChatStream>,
    /// The event `open` read to know the provider had answered.
    first: Option<ChatStreamEvent>,
    /// Items to yield before reading more.
    pending: VecDeque<Result<InferenceDelta, InferenceError>>,
    /// Tool calls as seen in chunks, in order, latest version of each:
    /// used when `End` carries no captured calls.
    chunked_calls: Vec<genai::chat::ToolCall>,
    idle_timeout: Duration,
}

impl DeltaStream {
    /// The deltas of `inner`, starting with `first`, the event the executor
    /// read to know the provider had answered.
    pub(super) fn into_inference_stream(
        inner: ChatStream,
        first: ChatStreamEvent,
        idle_timeout: Duration,
    ) -> InferenceStream {
        let deltas = DeltaStream {
            inner: Some(inner),
            first: Some(first),
            pending: VecDeque::new(),
            chunked_calls: Vec::new(),
            idle_timeout,
        };
        futures::stream::unfold(deltas, |mut deltas| async move {
            let item = deltas.next_item().await?;
            Some((item, deltas))
        })
        .boxed()
    }

    async fn next_item(&mut self) -> Option<Result<InferenceDelta, InferenceError>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            let event = match self.first.take() {
                Some(event) => event,
                None => {
                    let inner = self.inner.as_mut()?;
                    match tokio::time::timeout(self.idle_timeout, inner.next()).await {
                        Ok(Some(Ok(event))) => event,
                        Ok(Some(Err(error))) => {
                            self.inner = None;
                            return Some(Err(classify_genai_error(&error, Phase::Stream)));
                        }
                        Ok(None) => {
                            self.inner = None;
                            return Some(Err(InferenceError::stream_cut(
                                "the stream ended before the provider's end marker",
                            )));
                        }
                        Err(_) => {
                            self.inner = None;
                            return Some(Err(InferenceError::timeout(format!(
                                "no stream event for {} s",
                                secs(self.idle_timeout)
                            ))));
                        }
                    }
                }
            };
            match event {
                ChatStreamEvent::Chunk(chunk) if !chunk.content.is_empty() => {
                    return Some(Ok(InferenceDelta::Text {
                        text: chunk.content,
                    }));
                }
                ChatStreamEvent::ToolCallChunk(chunk) => self.observe_call(chunk.tool_call),
                ChatStreamEvent::End(end) => {
                    self.inner = None;
                    self.finish(end);
                }
                ChatStreamEvent::Start
                | ChatStreamEvent::Chunk(_)
                | ChatStreamEvent::ReasoningChunk(_)
                | ChatStreamEvent::ThoughtSignatureChunk(_)
                | ChatStreamEvent::Heartbeat => {}
            }
        }
    }

    /// Records a tool-call chunk. genai's chunks carry the call so far
    /// (arguments accumulated), so the latest one of each id wins.
    fn observe_call(&mut self, call: genai::chat::ToolCall) {
        match self
            .chunked_calls
            .iter_mut()
            .find(|seen| seen.call_id == call.call_id)
        {
            Some(seen) => *seen = call,
            None => self.chunked_calls.push(call),
        }
    }

    /// Queues the tool calls (once each) and the usage of a finished stream.
    fn finish(&mut self, end: StreamEnd) {
        let usage = end.captured_usage.as_ref().and_then(token_usage);
        let cache = end.captured_usage.as_ref().and_then(cache_usage);
        let mut calls = end.captured_into_tool_calls().unwrap_or_default();
        if calls.is_empty() {
            calls = std::mem::take(&mut self.chunked_calls);
        }
        self.pending.extend(calls.into_iter().map(|call| {
            Ok(InferenceDelta::ToolCall {
                call: tool_call(call),
            })
        }));
        if let Some(usage) = usage {
            self.pending.push_back(Ok(InferenceDelta::Usage { usage }));
        }
        if let Some(cache) = cache {
            self.pending
                .push_back(Ok(InferenceDelta::CacheUsage { cache }));
        }
    }
}
