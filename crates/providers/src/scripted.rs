//! The scripted executor: deterministic answers for tests, examples and the
//! offline quickstart.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use rein_runtime_contract::inference::{
    InferenceDelta, InferenceError, InferenceRequest, InferenceStream, LlmExecutor,
};
use rein_runtime_contract::message::{CacheUsage, TokenUsage, ToolCall};

/// One scripted answer: text (streamed one chunk per word), tool calls,
/// usage, an error, and delays.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedResponse {
    text: String,
    tool_calls: Vec<(String, serde_json::Value)>,
    error: Option<InferenceError>,
    stream_error: Option<InferenceError>,
    usage: Option<TokenUsage>,
    cache: Option<CacheUsage>,
    delay: Option<Duration>,
    chunk_delay: Option<Duration>,
    stalled: bool,
    call_id: Option<String>,
}

impl ScriptedResponse {
    fn empty() -> Self {
        Self {
            text: String::new(),
            tool_calls: Vec::new(),
            error: None,
            stream_error: None,
            usage: None,
            cache: None,
            delay: None,
            chunk_delay: None,
            stalled: false,
            call_id: None,
        }
    }

    /// A text answer, streamed one chunk per whitespace-separated word (the
    /// word with the whitespace after it).
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::empty()
        }
    }

    /// An answer that calls one tool.
    pub fn tool_call(name: impl Into<String>, args: serde_json::Value) -> Self {
        Self::tool_calls(vec![(name.into(), args)])
    }

    /// An answer that calls several tools, in order.
    pub fn tool_calls<N: Into<String>>(calls: Vec<(N, serde_json::Value)>) -> Self {
        Self {
            tool_calls: calls.into_iter().map(|(n, a)| (n.into(), a)).collect(),
            ..Self::empty()
        }
    }

    /// A failed inference: `open` returns `error` (after any delay).
    pub fn error(error: InferenceError) -> Self {
        Self {
            error: Some(error),
            ..Self::empty()
        }
    }

    /// An answer that opens and then never sends anything (a stalled model).
    pub fn stalled() -> Self {
        Self {
            stalled: true,
            ..Self::empty()
        }
    }

    /// Adds a tool call after the text.
    pub fn with_tool_call(mut self, name: impl Into<String>, args: serde_json::Value) -> Self {
        self.tool_calls.push((name.into(), args));
        self
    }

    /// Reports this prompt-cache usage after the usage: `cached` tokens
    /// read from the cache, `written` written to it.
    pub fn with_cache_usage(mut self, cached: u64, written: u64) -> Self {
        self.cache = Some(CacheUsage::new(cached, written));
        self
    }

    /// Reports this usage after the text and tool calls.
    pub fn with_usage(mut self, input: u64, output: u64) -> Self {
        self.usage = Some(TokenUsage::new(input, output));
        self
    }

    /// Delays the open step: `open` does not return until it has passed.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Sleeps this long before each chunk after the first.
    pub fn with_chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = Some(delay);
        self
    }

    /// Gives every tool call of this answer the id `id` instead of a fresh
    /// `call_<n>` — as some providers do, reusing one id within an answer.
    pub fn with_call_id(mut self, id: impl Into<String>) -> Self {
        self.call_id = Some(id.into());
        self
    }

    /// Ends the stream with `error` after the text, instead of the tool
    /// calls and usage (a stream cut mid-answer).
    pub fn with_stream_error(mut self, error: InferenceError) -> Self {
        self.stream_error = Some(error);
        self
    }
}

type Responder = dyn Fn(&InferenceRequest) -> ScriptedResponse + Send + Sync;

enum Source {
    Script {
        queue: Box<Mutex<Script>>,
        repeat_last: bool,
    },
    Function(Box<Responder>),
}

struct Script {
    pending: VecDeque<ScriptedResponse>,
    last: Option<ScriptedResponse>,
    served: usize,
}

/// An executor that plays scripted responses.
///
/// One executor plays a single script shared by every run that uses it, in
/// order. Exhausted without [`repeat_last`](Self::repeat_last), it answers
/// with a non-retryable error. [`from_fn`](Self::from_fn) instead decides
/// each answer from the request, and serves any number of concurrent runs.
///
/// Tool call ids are `call_1`, `call_2`, … per executor. Delays use
/// `tokio::time::sleep`, so tests with a paused clock run instantly.
pub struct ScriptedExecutor {
    source: Source,
    served_chunks: Arc<AtomicU64>,
    next_call: AtomicU64,
}

impl std::fmt::Debug for ScriptedExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedExecutor")
            .field("served_chunks", &self.served_chunks())
            .finish_non_exhaustive()
    }
}

impl ScriptedExecutor {
    /// An executor playing `script` in order.
    pub fn new(script: Vec<ScriptedResponse>) -> Self {
        Self::with_source(Source::Script {
            queue: Box::new(Mutex::new(Script {
                pending: script.into(),
                last: None,
                served: 0,
            })),
            repeat_last: false,
        })
    }

    /// An executor answering each request with `f(request)`.
    pub fn from_fn(
        f: impl Fn(&InferenceRequest) -> ScriptedResponse + Send + Sync + 'static,
    ) -> Self {
        Self::with_source(Source::Function(Box::new(f)))
    }

    fn with_source(source: Source) -> Self {
        Self {
            source,
            served_chunks: Arc::new(AtomicU64::new(0)),
            next_call: AtomicU64::new(1),
        }
    }

    /// Once the script is exhausted, repeats its last response forever.
    pub fn repeat_last(mut self) -> Self {
        if let Source::Script { repeat_last, .. } = &mut self.source {
            *repeat_last = true;
        }
        self
    }

    /// How many stream items (text chunks, tool calls, usage) have been
    /// delivered to consumers so far.
    pub fn served_chunks(&self) -> u64 {
        self.served_chunks.load(Ordering::Relaxed)
    }

    fn next_response(
        &self,
        request: &InferenceRequest,
    ) -> Result<ScriptedResponse, InferenceError> {
        match &self.source {
            Source::Function(f) => Ok(f(request)),
            Source::Script { queue, repeat_last } => {
                let mut script = queue.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(next) = script.pending.pop_front() {
                    script.served += 1;
                    if *repeat_last {
                        script.last = Some(next.clone());
                    }
                    return Ok(next);
                }
                match (&script.last, *repeat_last) {
                    (Some(last), true) => Ok(last.clone()),
                    _ => Err(InferenceError::invalid_request(format!(
                        "scripted executor: the script is exhausted after {} responses; add responses or call repeat_last()",
                        script.served
                    ))),
                }
            }
        }
    }
}

/// Splits text into words, each with the whitespace that follows it.
fn word_chunks(text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let (mut in_word, mut after_space) = (false, false);
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            after_space = in_word;
        } else if !in_word {
            in_word = true;
        } else if after_space {
            chunks.push(text[start..i].to_owned());
            start = i;
            after_space = false;
        }
    }
    if start < text.len() {
        chunks.push(text[start..].to_owned());
    }
    chunks
}

#[async_trait::async_trait]
impl LlmExecutor for ScriptedExecutor {
    async fn open(&self, request: &InferenceRequest) -> Result<InferenceStream, InferenceError> {
        let response = self.next_response(request)?;
        if let Some(delay) = response.delay {
            tokio::time::sleep(delay).await;
        }
        if let Some(error) = response.error {
            return Err(error);
        }
        if response.stalled {
            return Ok(futures::stream::pending().boxed());
        }
        let mut items: VecDeque<Result<InferenceDelta, InferenceError>> =
            word_chunks(&response.text)
                .into_iter()
                .map(|text| Ok(InferenceDelta::Text { text }))
                .collect();
        match response.stream_error {
            Some(error) => items.push_back(Err(error)),
            None => {
                for (name, arguments) in response.tool_calls {
                    let id = match &response.call_id {
                        Some(id) => id.clone(),
                        None => format!("call_{}", self.next_call.fetch_add(1, Ordering::Relaxed)),
                    };
                    items.push_back(Ok(InferenceDelta::ToolCall {
                        call: ToolCall::new(id, name, arguments),
                    }));
                }
                if let Some(usage) = response.usage {
                    items.push_back(Ok(InferenceDelta::Usage { usage }));
                }
                if let Some(cache) = response.cache {
                    items.push_back(Ok(InferenceDelta::CacheUsage { cache }));
                }
            }
        }
        let counter = self.served_chunks.clone();
        let chunk_delay = response.chunk_delay;
        let stream = futures::stream::unfold((items, true), move |(mut items, first)| {
            let counter = counter.clone();
            async move {
                let item = items.pop_front()?;
                if let (Some(delay), false) = (chunk_delay, first) {
                    tokio::time::sleep(delay).await;
                }
                counter.fetch_add(1, Ordering::Relaxed);
                Some((item, (items, false)))
            }
        });
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::message::Message;

    fn request() -> InferenceRequest {
        InferenceRequest::new("m", vec![Message::user("hi")])
    }

    #[test]
    fn words_keep_their_following_whitespace() {
        assert_eq!(
            word_chunks("one two  three\n"),
            ["one ", "two  ", "three\n"]
        );
        assert_eq!(word_chunks("  lead"), ["  lead"]);
        assert!(word_chunks("").is_empty());
    }

    #[tokio::test]
    async fn the_script_plays_in_order_then_fails_unless_repeated() {
        let ex = ScriptedExecutor::new(vec![
            ScriptedResponse::text("a"),
            ScriptedResponse::text("b"),
        ]);
        assert_eq!(ex.complete(&request()).await.unwrap().text, "a");
        assert_eq!(ex.complete(&request()).await.unwrap().text, "b");
        let err = ex.complete(&request()).await.unwrap_err();
        assert!(!err.is_retryable());
        assert!(
            err.message().contains("exhausted after 2 responses"),
            "{err}"
        );

        let ex = ScriptedExecutor::new(vec![ScriptedResponse::text("x")]).repeat_last();
        for _ in 0..3 {
            assert_eq!(ex.complete(&request()).await.unwrap().text, "x");
        }
    }

    #[tokio::test]
    async fn tool_calls_and_usage_follow_the_text() {
        let ex = ScriptedExecutor::new(vec![
            ScriptedResponse::text("thinking")
                .with_tool_call("search", serde_json::json!({"q": "rust"}))
                .with_usage(7, 3),
        ]);
        let r = ex.complete(&request()).await.unwrap();
        assert_eq!(r.text, "thinking");
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].name, "search");
        assert_eq!(r.tool_calls[0].id, "call_1");
        assert_eq!(r.usage, Some(TokenUsage::new(7, 3)));
        assert_eq!(ex.served_chunks(), 3);
    }

    #[tokio::test]
    async fn a_stream_error_follows_the_partial_text() {
        let ex = ScriptedExecutor::new(vec![
            ScriptedResponse::text("half an").with_stream_error(InferenceError::stream_cut("cut")),
        ]);
        let err = ex.complete(&request()).await.unwrap_err();
        assert_eq!(err, InferenceError::stream_cut("cut"));
        assert_eq!(ex.served_chunks(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn delays_use_the_tokio_clock() {
        let ex = ScriptedExecutor::new(vec![
            ScriptedResponse::text("a b c")
                .with_delay(Duration::from_secs(10))
                .with_chunk_delay(Duration::from_secs(1)),
        ]);
        let start = tokio::time::Instant::now();
        ex.complete(&request()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(12));
    }

    #[tokio::test]
    async fn from_fn_answers_from_the_request() {
        let ex = ScriptedExecutor::from_fn(|req| {
            ScriptedResponse::text(format!("{} messages", req.messages.len()))
        });
        assert_eq!(ex.complete(&request()).await.unwrap().text, "1 messages");
    }
}
