//! The real executor: any provider `genai` speaks (OpenAI, Anthropic, Gemini,
//! Ollama, OpenAI-compatible servers, ...), mapped onto Rein's executor
//! protocol.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use genai::adapter::AdapterKind;
use genai::chat::{
    ChatMessage, ChatOptions, ChatRequest, ChatResponse, ChatStream, ChatStreamEvent, ContentPart,
    MessageContent, StreamEnd, Tool, ToolName, ToolResponse,
};
use genai::resolver::{AuthData, Endpoint};
use rein_runtime_contract::inference::{
    InferenceDelta, InferenceError, InferenceErrorKind, InferenceRequest, InferenceStream,
    LlmExecutor, ToolChoice,
};
use rein_runtime_contract::message::{Role, TokenUsage, ToolCall};
use serde_json::Value;

/// Default [`GenaiExecutor::with_request_timeout`]: 60 s.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`GenaiExecutor::with_idle_timeout`]: 30 s.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The key sent to OpenAI-compatible servers when none is given.
const PLACEHOLDER_API_KEY: &str = "rein-local";
/// Longest provider body quoted in an error message, in characters.
const SNIPPET_CHARS: usize = 300;

/// An [`LlmExecutor`] that talks to real models through the
/// [`genai`](https://crates.io/crates/genai) crate.
///
/// The model is [`InferenceRequest::model`], passed to genai as is.
///
/// # Configuration
///
/// - **OpenAI, Anthropic, Gemini** (and the other hosted providers genai
///   knows): [`GenaiExecutor::new`]. genai picks the provider from the model
///   name (`gpt-4o-mini`, `o3-mini` → OpenAI; `claude-*` → Anthropic;
///   `gemini-*` → Gemini; also `grok-*`, `deepseek-*`, `command-*`, ...) and
///   reads the key from the provider's environment variable:
///   `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` (and likewise
///   `XAI_API_KEY`, `DEEPSEEK_API_KEY`, ...). A missing variable surfaces as
///   an [`Unauthorized`](InferenceErrorKind::Unauthorized) error from
///   [`open`](LlmExecutor::open). The provider can also be named explicitly
///   with genai's namespace syntax, `adapter::model`: `openai::gpt-4o-mini`,
///   `anthropic::claude-sonnet-4-5`, `gemini::gemini-2.5-flash`.
/// - **Ollama** (native API on `http://localhost:11434`): also
///   [`GenaiExecutor::new`], with the model named `ollama::llama3.2` (or
///   any name genai does not recognise, see the pitfall below).
/// - **OpenAI-compatible servers** (llama.cpp's `llama-server`, vLLM,
///   LM Studio, Ollama's `/v1` endpoint, gateways):
///   [`GenaiExecutor::openai_compatible`] with the API root, e.g.
///   `http://localhost:8080/v1`. Every model name then goes to that server
///   over the OpenAI chat-completions protocol.
/// - Anything else genai can be configured for (custom resolvers, proxies,
///   default headers): build a [`genai::Client`] and pass it to
///   [`GenaiExecutor::with_client`].
///
/// **Pitfalls.** With [`new`](GenaiExecutor::new), a model name genai does
/// not recognise is routed to the **Ollama** adapter on localhost, so a typo
/// or a local model name shows up as a connection error to port 11434; name
/// the adapter (`openai::my-model`) or use
/// [`openai_compatible`](GenaiExecutor::openai_compatible). For the
/// OpenAI-protocol adapters genai also reads a trailing
/// `-low`/`-medium`/`-high`/`-max`/`-none`/`-zero`/`-minimal`/`-xhigh` of the
/// model name as a reasoning-effort setting and strips it from the name it
/// sends.
///
/// # Timeouts
///
/// - The **request timeout** ([`with_request_timeout`](Self::with_request_timeout),
///   default 60 s) bounds the wait for the response headers when streaming
///   (genai's `stream_header_timeout`), and the whole response when not.
/// - The **idle timeout** ([`with_idle_timeout`](Self::with_idle_timeout),
///   default 30 s) bounds the gap between two stream events (text, tool
///   call pieces, reasoning, heartbeats all count). [`open`](LlmExecutor::open)
///   waits for the first event after the `Start` marker, so it returns within
///   the request timeout plus the idle timeout.
///
/// Either one expiring is a (retryable) [`InferenceErrorKind::Timeout`].
///
/// # Errors
///
/// Failures are classified into [`InferenceErrorKind`]s from the HTTP status
/// and body: 429 → `RateLimited` (with the `Retry-After` header's delay when
/// it is given in seconds), 503/529 → `Overloaded`, 408/504 → `Timeout`,
/// other 5xx → `Server`, refused/reset connections and DNS failures →
/// `Connection`, 400/422 → `InvalidRequest` or `ContextOverflow` (when the
/// body talks about the context length or window), 401/403 →
/// `Unauthorized`, 404 → `NotFound`, anything else → `Other`. Messages carry
/// the status and the start of the provider's body. A stream that stops
/// before the provider's end marker ends with a `StreamCut` error.
///
/// Text is streamed as it arrives; tool calls are emitted once each, complete,
/// after the text; usage comes last, and only when the provider reported it.
/// A tool call whose arguments are not valid JSON does not fail the
/// inference: it is emitted with arguments
/// `{"_raw_arguments": "<the raw text>", "_error": "invalid JSON: <reason>"}`,
/// which the tool rejects, so the model sees the error and can retry.
///
/// ```no_run
/// use std::time::Duration;
/// use rein_providers::GenaiExecutor;
///
/// // Hosted providers, keys from the environment.
/// let cloud = GenaiExecutor::new().with_request_timeout(Duration::from_secs(120));
/// // A local llama.cpp / vLLM server.
/// let local = GenaiExecutor::openai_compatible("http://localhost:8080/v1", None);
/// # let _ = (cloud, local);
/// ```
#[derive(Debug, Clone)]
pub struct GenaiExecutor {
    client: Result<genai::Client, InferenceError>,
    request_timeout: Duration,
    idle_timeout: Duration,
    streaming: bool,
}

impl Default for GenaiExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl GenaiExecutor {
    /// An executor on genai's default client: the provider is chosen from
    /// the model name, API keys are read from the environment (see the
    /// [type docs](GenaiExecutor)).
    ///
    /// Never fails; if the HTTP client cannot be built, every
    /// [`open`](LlmExecutor::open) returns that failure (not retryable).
    pub fn new() -> Self {
        Self::from_build(genai::Client::builder().build())
    }

    /// An executor for an OpenAI-compatible server (llama.cpp, vLLM,
    /// LM Studio, Ollama's OpenAI endpoint, gateways).
    ///
    /// `base_url` is the API root including its version segment, e.g.
    /// `http://localhost:8080/v1` (a trailing `/` is added when missing);
    /// requests go to `<base_url>chat/completions`. Every model name,
    /// whatever it looks like, is sent there over the OpenAI protocol (a
    /// name namespaced to another adapter, like `anthropic::x`, is an
    /// [`InvalidRequest`](InferenceErrorKind::InvalidRequest)). `api_key` is
    /// sent as a bearer token; without one, the placeholder `rein-local` is
    /// sent, which local servers ignore.
    ///
    /// Never fails; a base URL that is not `http://` or `https://` makes
    /// every [`open`](LlmExecutor::open) fail with `InvalidRequest`.
    pub fn openai_compatible(base_url: impl Into<String>, api_key: Option<String>) -> Self {
        let mut base_url = base_url.into().trim().to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Self::with_failure(InferenceError::invalid_request(format!(
                "OpenAI-compatible base URL {base_url:?} must start with http:// or https://"
            )));
        }
        if !base_url.ends_with('/') {
            base_url.push('/');
        }
        let key = api_key
            .filter(|key| !key.is_empty())
            .unwrap_or_else(|| PLACEHOLDER_API_KEY.to_owned());
        let client = genai::Client::builder()
            .with_adapter_kind(AdapterKind::OpenAI)
            .append_provider_config(
                AdapterKind::OpenAI,
                (Endpoint::from_owned(base_url), AuthData::from_single(key)),
            )
            .build();
        Self::from_build(client)
    }

    /// An executor on a client configured by the caller (resolvers, proxies,
    /// default headers, a bound adapter, ...).
    pub fn with_client(client: genai::Client) -> Self {
        Self::from_client(Ok(client))
    }

    /// Sets the request timeout: the wait for the response headers when
    /// streaming, for the whole response otherwise. Default 60 s.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the idle timeout: the longest gap between two stream events.
    /// Default 30 s. Not used when streaming is off.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Streams answers (`true`, the default) or asks for the whole answer at
    /// once and replays it as the same deltas (`false`; for servers whose
    /// streaming is broken).
    pub fn with_streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    fn from_client(client: Result<genai::Client, InferenceError>) -> Self {
        Self {
            client,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            streaming: true,
        }
    }

    fn from_build(client: genai::Result<genai::Client>) -> Self {
        Self::from_client(client.map_err(|error| {
            InferenceError::new(
                InferenceErrorKind::Other,
                format!(
                    "could not build the genai client: {}",
                    snippet(&error.to_string())
                ),
            )
        }))
    }

    fn with_failure(error: InferenceError) -> Self {
        Self::from_client(Err(error))
    }

    async fn open_streaming(
        &self,
        client: &genai::Client,
        model: &str,
        chat_request: ChatRequest,
        options: &ChatOptions,
    ) -> Result<InferenceStream, InferenceError> {
        let opening = async {
            let response = client
                .exec_chat_stream(model, chat_request, Some(options))
                .await
                .map_err(|error| classify_genai_error(&error, Phase::Open))?;
            let mut stream = response.stream;
            // genai sends the request on the first poll after `Start`; wait
            // for the first real event so HTTP errors surface from `open`.
            loop {
                match stream.next().await {
                    Some(Ok(ChatStreamEvent::Start)) => {}
                    Some(Ok(event)) => return Ok((stream, event)),
                    Some(Err(error)) => return Err(classify_genai_error(&error, Phase::Open)),
                    None => {
                        return Err(InferenceError::stream_cut(
                            "the provider closed the stream before sending anything",
                        ));
                    }
                }
            }
        };
        let budget = self.request_timeout.saturating_add(self.idle_timeout);
        let (stream, first) = match tokio::time::timeout(budget, opening).await {
            Ok(opened) => opened?,
            Err(_) => {
                return Err(InferenceError::timeout(format!(
                    "no response from the provider within {} s",
                    secs(budget)
                )));
            }
        };
        let deltas = DeltaStream {
            inner: Some(stream),
            first: Some(first),
            pending: VecDeque::new(),
            chunked_calls: Vec::new(),
            idle_timeout: self.idle_timeout,
        };
        Ok(futures::stream::unfold(deltas, |mut deltas| async move {
            let item = deltas.next_item().await?;
            Some((item, deltas))
        })
        .boxed())
    }

    async fn open_buffered(
        &self,
        client: &genai::Client,
        model: &str,
        chat_request: ChatRequest,
        options: &ChatOptions,
    ) -> Result<InferenceStream, InferenceError> {
        let call = client.exec_chat(model, chat_request, Some(options));
        let response = match tokio::time::timeout(self.request_timeout, call).await {
            Ok(response) => response.map_err(|error| classify_genai_error(&error, Phase::Open))?,
            Err(_) => {
                return Err(InferenceError::timeout(format!(
                    "no complete response within {} s",
                    secs(self.request_timeout)
                )));
            }
        };
        let deltas = response_deltas(response);
        Ok(futures::stream::iter(deltas.into_iter().map(Ok)).boxed())
    }
}

#[async_trait]
impl LlmExecutor for GenaiExecutor {
    /// Sends the request through genai and returns the answer's stream.
    ///
    /// When streaming, this returns once the provider has started answering
    /// (its first event after the HTTP response headers), so HTTP errors
    /// such as 429 or 401 are returned here rather than from the stream.
    ///
    /// # Errors
    ///
    /// An [`InferenceError`] classified as described on [`GenaiExecutor`];
    /// the stored failure when the client could not be built.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future, or the stream, drops genai's stream and
    /// with it the HTTP response, which closes the connection; no background
    /// task keeps it alive.
    async fn open(&self, request: &InferenceRequest) -> Result<InferenceStream, InferenceError> {
        let client = self.client.as_ref().map_err(Clone::clone)?;
        let chat_request = to_chat_request(request);
        let mut options = chat_options(request);
        if self.streaming {
            options = options.with_stream_header_timeout(self.request_timeout);
            self.open_streaming(client, &request.model, chat_request, &options)
                .await
        } else {
            self.open_buffered(client, &request.model, chat_request, &options)
                .await
        }
    }
}

// ---------------------------------------------------------------------------
// Request mapping

/// The genai chat request for `request`: system prompt, history (assistant
/// tool calls and tool results paired by id) and tools.
fn to_chat_request(request: &InferenceRequest) -> ChatRequest {
    // Tool name of each call id, for the tool results (Gemini wants it).
    let call_names: HashMap<&str, &str> = request
        .messages
        .iter()
        .flat_map(|message| message.tool_calls.iter())
        .map(|call| (call.id.as_str(), call.name.as_str()))
        .collect();
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in request.messages.iter() {
        let chat_message = match message.role {
            Role::System => ChatMessage::system(message.content.clone()),
            Role::User => ChatMessage::user(message.content.clone()),
            Role::Assistant if message.tool_calls.is_empty() => {
                ChatMessage::assistant(message.content.clone())
            }
            Role::Assistant => {
                let mut parts = Vec::with_capacity(message.tool_calls.len() + 1);
                if !message.content.is_empty() {
                    parts.push(ContentPart::Text(message.content.clone()));
                }
                parts.extend(message.tool_calls.iter().map(|call| {
                    ContentPart::ToolCall(genai::chat::ToolCall {
                        call_id: call.id.clone(),
                        fn_name: call.name.clone(),
                        fn_arguments: call.arguments.clone(),
                        thought_signatures: None,
                    })
                }));
                ChatMessage::assistant(MessageContent::from_parts(parts))
            }
            Role::Tool => {
                let call_id = message.tool_call_id.as_deref().unwrap_or_default();
                let mut response = ToolResponse::new(call_id, message.content.clone());
                if let Some(name) = call_names.get(call_id) {
                    response = response.with_fn_name(*name);
                }
                ChatMessage::from(response)
            }
        };
        messages.push(chat_message);
    }
    let mut chat_request = ChatRequest::new(messages);
    if let Some(system) = &request.system {
        chat_request = chat_request.with_system(system.clone());
    }
    if !request.tools.is_empty() {
        chat_request = chat_request.with_tools(request.tools.iter().map(|tool| {
            Tool::new(ToolName::Custom(tool.name.clone()))
                .with_description(tool.description.clone())
                .with_schema(tool.parameters.clone())
        }));
    }
    chat_request
}

/// The chat options for `request`: sampling, tool choice (only with tools),
/// and what the stream should capture.
fn chat_options(request: &InferenceRequest) -> ChatOptions {
    let mut options = ChatOptions::default()
        .with_capture_usage(true)
        .with_capture_tool_calls(true)
        .with_capture_content(false)
        .with_capture_reasoning_content(false);
    if let Some(temperature) = request.temperature {
        options = options.with_temperature(temperature);
    }
    if let Some(max_tokens) = request.max_output_tokens {
        options = options.with_max_tokens(max_tokens);
    }
    if !request.tools.is_empty() {
        let choice = match &request.tool_choice {
            ToolChoice::Auto => genai::chat::ToolChoice::Auto,
            ToolChoice::None => genai::chat::ToolChoice::None,
            ToolChoice::Required => genai::chat::ToolChoice::Required,
            ToolChoice::Tool(name) => genai::chat::ToolChoice::tool(name.clone()),
        };
        options = options.with_tool_choice(choice);
    }
    options
}

// ---------------------------------------------------------------------------
// Response mapping

/// Turns genai's stream into deltas: text as it comes, then the complete
/// tool calls and the usage at genai's `End`.
struct DeltaStream {
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
    }
}

/// The deltas of a whole (non-streamed) answer.
fn response_deltas(response: ChatResponse) -> Vec<InferenceDelta> {
    let mut deltas = Vec::new();
    let text: String = response.content.texts().concat();
    if !text.is_empty() {
        deltas.push(InferenceDelta::Text { text });
    }
    let usage = token_usage(&response.usage);
    deltas.extend(response.content.into_tool_calls().into_iter().map(|call| {
        InferenceDelta::ToolCall {
            call: tool_call(call),
        }
    }));
    if let Some(usage) = usage {
        deltas.push(InferenceDelta::Usage { usage });
    }
    deltas
}

/// A genai tool call as a Rein tool call, its arguments parsed.
fn tool_call(call: genai::chat::ToolCall) -> ToolCall {
    ToolCall::new(
        call.call_id,
        call.fn_name,
        parse_arguments(call.fn_arguments),
    )
}

/// Tool-call arguments as JSON. genai leaves arguments it could not parse as
/// a JSON string of the raw text; those become
/// `{"_raw_arguments": raw, "_error": "invalid JSON: ..."}`. Empty arguments
/// are `{}`.
fn parse_arguments(arguments: Value) -> Value {
    match arguments {
        Value::String(raw) if raw.trim().is_empty() => Value::Object(serde_json::Map::new()),
        Value::String(raw) => match serde_json::from_str::<Value>(&raw) {
            Ok(parsed) => parsed,
            Err(error) => serde_json::json!({
                "_raw_arguments": raw,
                "_error": format!("invalid JSON: {error}"),
            }),
        },
        Value::Null => Value::Object(serde_json::Map::new()),
        parsed => parsed,
    }
}

/// Usage when the provider reported prompt or completion tokens.
fn token_usage(usage: &genai::chat::Usage) -> Option<TokenUsage> {
    if usage.prompt_tokens.is_none() && usage.completion_tokens.is_none() {
        return None;
    }
    let count = |tokens: Option<i32>| tokens.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
    Some(TokenUsage::new(
        count(usage.prompt_tokens),
        count(usage.completion_tokens),
    ))
}

// ---------------------------------------------------------------------------
// Error classification

/// Where a failure happened: before the provider answered, or mid-stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Stream,
}

/// Classifies an HTTP failure from its status, body and `Retry-After`.
///
/// 429 → rate limited; 503/529 → overloaded; 408/504 → timeout; other 5xx →
/// server; 400/422 (and 413) mentioning the context length → context
/// overflow; 400/422 → invalid request; 401/403 → unauthorized; 404 → not
/// found; anything else, or no status → other.
fn classify(status: Option<u16>, body: &str, retry_after: Option<Duration>) -> InferenceError {
    let quoted = snippet(body);
    let Some(status) = status else {
        let message = if quoted.is_empty() {
            "the request failed".to_owned()
        } else {
            quoted
        };
        return InferenceError::new(InferenceErrorKind::Other, message);
    };
    let message = if quoted.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {quoted}")
    };
    match status {
        429 => InferenceError::rate_limited(message, retry_after),
        503 | 529 => InferenceError::overloaded(message),
        408 | 504 => InferenceError::timeout(message),
        500..=599 => InferenceError::server(message),
        400 | 413 | 422 if mentions_context_overflow(body) => {
            InferenceError::context_overflow(message)
        }
        400 | 422 => InferenceError::invalid_request(message),
        401 | 403 => InferenceError::unauthorized(message),
        404 => InferenceError::not_found(message),
        _ => InferenceError::new(InferenceErrorKind::Other, message),
    }
}

/// Whether a provider's error body says the prompt is over the context window.
fn mentions_context_overflow(body: &str) -> bool {
    const PHRASES: [&str; 8] = [
        "context_length_exceeded",
        "context length",
        "context window",
        "context_window",
        "too many tokens",
        "prompt is too long",
        "input is too long",
        "input token count",
    ];
    let body = body.to_lowercase();
    PHRASES.iter().any(|phrase| body.contains(phrase))
}

/// The delay a `Retry-After` header asks for: whole (or fractional) seconds.
/// The HTTP-date form is not understood (`None`). `retry-after-ms`, which
/// OpenAI also sends, is used when `Retry-After` is absent.
fn parse_retry_after(retry_after: Option<&str>, retry_after_ms: Option<&str>) -> Option<Duration> {
    if let Some(value) = retry_after {
        let value = value.trim();
        if let Ok(seconds) = value.parse::<u64>() {
            return Some(Duration::from_secs(seconds));
        }
        return value
            .parse::<f64>()
            .ok()
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok());
    }
    retry_after_ms
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// Classifies a genai error.
fn classify_genai_error(error: &genai::Error, phase: Phase) -> InferenceError {
    use genai::Error as E;
    match error {
        E::HttpError { status, body, .. } => {
            classify(Some(status.as_u16()), body, retry_after_of(error))
        }
        E::WebModelCall { webc_error, .. } | E::WebAdapterCall { webc_error, .. } => {
            classify_webc_error(webc_error, retry_after_of(error), phase)
        }
        E::WebStream {
            error: source,
            cause,
            ..
        } => {
            if let Some(inner) = source.downcast_ref::<genai::Error>() {
                return classify_genai_error(inner, phase);
            }
            if let Some(timeout) = source.downcast_ref::<genai::webc::StreamTimeout>() {
                return InferenceError::timeout(format!("{timeout} (request timeout)"));
            }
            classify_transport(source.as_ref(), cause, phase)
        }
        E::StreamParse { serde_error, .. } => {
            InferenceError::stream_cut(format!("malformed or truncated stream data: {serde_error}"))
        }
        E::ChatResponse { body, .. } => classify_error_event(&body.to_string()),
        E::RequiresApiKey { .. } | E::NoAuthResolver { .. } | E::NoAuthData { .. } => {
            InferenceError::unauthorized(snippet(&error.to_string()))
        }
        E::Resolver {
            resolver_error: genai::resolver::Error::ApiKeyEnvNotFound { env_name },
            model_iden,
        } => InferenceError::unauthorized(format!(
            "no API key for model {model_iden}: environment variable {env_name} is not set"
        )),
        E::ChatReqHasNoMessages { .. }
        | E::LastChatMessageIsNotUser { .. }
        | E::MessageRoleNotSupported { .. }
        | E::MessageContentTypeNotSupported { .. }
        | E::JsonModeWithoutInstruction
        | E::AdapterNotSupported { .. }
        | E::AdapterKindMismatch { .. }
        | E::CacheBreakpointNoEligibleContent { .. } => {
            InferenceError::invalid_request(snippet(&error.to_string()))
        }
        _ => InferenceError::new(InferenceErrorKind::Other, snippet(&error.to_string())),
    }
}

/// The `Retry-After` of a failed HTTP response, when genai kept its headers.
fn retry_after_of(error: &genai::Error) -> Option<Duration> {
    let headers = error.headers()?;
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    parse_retry_after(header("retry-after"), header("retry-after-ms"))
}

/// Classifies a failure of genai's HTTP layer.
fn classify_webc_error(
    error: &genai::webc::Error,
    retry_after: Option<Duration>,
    phase: Phase,
) -> InferenceError {
    use genai::webc::Error as W;
    match error {
        W::ResponseFailedStatus { status, body, .. } => {
            classify(Some(status.as_u16()), body, retry_after)
        }
        W::Reqwest(source) => classify_transport(source, &source.to_string(), phase),
        W::ResponseFailedNotJson { content_type, body } => InferenceError::new(
            InferenceErrorKind::Other,
            format!(
                "unexpected response content type {content_type:?}: {}",
                snippet(body)
            ),
        ),
        _ => InferenceError::new(InferenceErrorKind::Other, snippet(&error.to_string())),
    }
}

/// Downcasts to the type of `variant`'s field: names `reqwest::Error` through
/// `genai::webc::Error::Reqwest` without a direct dependency on reqwest.
fn downcast_field<'e, T: std::error::Error + 'static, U>(
    _variant: fn(T) -> U,
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e T> {
    error.downcast_ref::<T>()
}

/// Classifies a transport failure (no HTTP status): a timeout, a request
/// that could not be built, else a connection failure before the provider
/// answered or a cut stream after.
fn classify_transport(
    error: &(dyn std::error::Error + 'static),
    cause: &str,
    phase: Phase,
) -> InferenceError {
    let message = snippet(&error_chain(error, cause));
    if let Some(reqwest) = downcast_field(genai::webc::Error::Reqwest, error) {
        if reqwest.is_timeout() {
            return InferenceError::timeout(message);
        }
        if reqwest.is_builder() {
            return InferenceError::invalid_request(message);
        }
    }
    match phase {
        Phase::Open => InferenceError::connection(message),
        Phase::Stream => InferenceError::stream_cut(message),
    }
}

/// `cause` followed by the error's sources, `: `-separated.
fn error_chain(error: &(dyn std::error::Error + 'static), cause: &str) -> String {
    let mut chain = cause.to_owned();
    let mut source = error.source();
    while let Some(next) = source {
        let text = next.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = next.source();
    }
    chain
}

/// Classifies an error event inside a 200 stream (e.g. Anthropic's
/// `overloaded_error`, OpenAI's `server_error`) from its body.
fn classify_error_event(body: &str) -> InferenceError {
    let message = format!("provider error event: {}", snippet(body));
    let lower = body.to_lowercase();
    if lower.contains("overloaded") {
        InferenceError::overloaded(message)
    } else if lower.contains("rate_limit") || lower.contains("rate limit") {
        InferenceError::rate_limited(message, None)
    } else if mentions_context_overflow(&lower) {
        InferenceError::context_overflow(message)
    } else if lower.contains("invalid_request") {
        InferenceError::invalid_request(message)
    } else if lower.contains("authentication") || lower.contains("permission") {
        InferenceError::unauthorized(message)
    } else {
        InferenceError::server(message)
    }
}

/// `text` on one line, at most [`SNIPPET_CHARS`] characters (`…` when cut).
fn snippet(text: &str) -> String {
    // Bound the work on huge bodies before collapsing whitespace.
    let head: String = text.chars().take(SNIPPET_CHARS * 4).collect();
    let collapsed = head.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() > SNIPPET_CHARS {
        let mut cut: String = collapsed.chars().take(SNIPPET_CHARS - 1).collect();
        cut.push('…');
        cut
    } else {
        collapsed
    }
}

/// A duration in seconds for messages: `30`, `0.25`.
fn secs(duration: Duration) -> String {
    duration.as_secs_f64().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::message::Message;
    use rein_runtime_contract::tool::ToolDescriptor;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    // -- classify -----------------------------------------------------------

    #[test]
    fn classify_maps_every_status_row() {
        use InferenceErrorKind as K;
        let rows: &[(Option<u16>, &str, K)] = &[
            (Some(429), "slow down", K::RateLimited),
            (Some(503), "unavailable", K::Overloaded),
            (Some(529), "overloaded_error", K::Overloaded),
            (Some(408), "", K::Timeout),
            (Some(504), "gateway timeout", K::Timeout),
            (Some(500), "boom", K::Server),
            (Some(502), "bad gateway", K::Server),
            (
                Some(400),
                r#"{"error":{"message":"bad field"}}"#,
                K::InvalidRequest,
            ),
            (Some(422), "unprocessable", K::InvalidRequest),
            (
                Some(400),
                r#"{"error":{"code":"context_length_exceeded"}}"#,
                K::ContextOverflow,
            ),
            (
                Some(400),
                "This model's maximum context length is 8192 tokens",
                K::ContextOverflow,
            ),
            (
                Some(400),
                "the request exceeds the Context Window",
                K::ContextOverflow,
            ),
            (Some(400), "Too many tokens in prompt", K::ContextOverflow),
            (
                Some(400),
                "prompt is too long: 210000 tokens > 200000 maximum",
                K::ContextOverflow,
            ),
            (Some(401), "bad key", K::Unauthorized),
            (Some(403), "forbidden", K::Unauthorized),
            (Some(404), "no such model", K::NotFound),
            (Some(409), "conflict", K::Other),
            (Some(302), "moved", K::Other),
            (None, "something odd", K::Other),
            (None, "", K::Other),
        ];
        for (status, body, kind) in rows {
            let error = classify(*status, body, None);
            assert_eq!(error.kind(), *kind, "status {status:?}, body {body:?}");
        }
    }

    #[test]
    fn classify_keeps_retry_after_status_and_a_trimmed_body() {
        let error = classify(
            Some(429),
            "  too\n many   requests ",
            Some(Duration::from_secs(7)),
        );
        assert!(error.is_retryable());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(error.message(), "HTTP 429: too many requests");

        let long = "x".repeat(5_000);
        let error = classify(Some(500), &long, None);
        let quoted = error.message().trim_start_matches("HTTP 500: ");
        assert_eq!(quoted.chars().count(), SNIPPET_CHARS);
        assert!(quoted.ends_with('…'));
        assert_eq!(classify(Some(404), "", None).message(), "HTTP 404");
    }

    #[test]
    fn retry_after_parses_seconds_and_milliseconds() {
        assert_eq!(
            parse_retry_after(Some(" 7 "), None),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(Some("1.5"), None),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), Some("5")),
            None
        );
        assert_eq!(
            parse_retry_after(None, Some("250")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_retry_after(None, None), None);
        assert_eq!(parse_retry_after(Some("-3"), None), None);
    }

    #[test]
    fn error_events_are_classified_by_body() {
        use InferenceErrorKind as K;
        let cases = [
            (
                r#"{"type":"overloaded_error","message":"Overloaded"}"#,
                K::Overloaded,
            ),
            (r#"{"type":"rate_limit_error"}"#, K::RateLimited),
            (r#"{"code":"context_length_exceeded"}"#, K::ContextOverflow),
            (r#"{"type":"invalid_request_error"}"#, K::InvalidRequest),
            (r#"{"type":"authentication_error"}"#, K::Unauthorized),
            (
                r#"{"message":"Error in input stream","type":"server_error"}"#,
                K::Server,
            ),
        ];
        for (body, kind) in cases {
            assert_eq!(classify_error_event(body).kind(), kind, "{body}");
        }
    }

    #[test]
    fn missing_api_key_is_unauthorized() {
        let error = genai::Error::Resolver {
            model_iden: genai::ModelIden::new(AdapterKind::OpenAI, "gpt-4o-mini"),
            resolver_error: genai::resolver::Error::ApiKeyEnvNotFound {
                env_name: "OPENAI_API_KEY".to_owned(),
            },
        };
        let classified = classify_genai_error(&error, Phase::Open);
        assert_eq!(classified.kind(), InferenceErrorKind::Unauthorized);
        assert!(classified.message().contains("OPENAI_API_KEY"));
    }

    // -- mapping ------------------------------------------------------------

    fn search_tool() -> ToolDescriptor {
        ToolDescriptor::new("search", "Searches the web").with_parameters(json!({
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        }))
    }

    #[test]
    fn request_maps_system_history_and_tool_pairs() {
        let history = vec![
            Message::user("find rust"),
            Message::assistant_with_tools(
                "looking",
                vec![ToolCall::new("call_1", "search", json!({"q": "rust"}))],
            ),
            Message::tool("call_1", "3 results"),
            Message::system("be brief"),
            Message::assistant("done"),
        ];
        let request = InferenceRequest::new("m", history)
            .with_system("you are helpful")
            .with_tools(vec![search_tool()]);
        let chat = to_chat_request(&request);

        assert_eq!(chat.system.as_deref(), Some("you are helpful"));
        let roles: Vec<_> = chat.messages.iter().map(|m| m.role.clone()).collect();
        use genai::chat::ChatRole as R;
        assert_eq!(
            roles,
            [R::User, R::Assistant, R::Tool, R::System, R::Assistant]
        );

        let assistant = &chat.messages[1].content;
        assert_eq!(assistant.texts(), ["looking"]);
        let calls = assistant.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].call_id, "call_1");
        assert_eq!(calls[0].fn_name, "search");
        assert_eq!(calls[0].fn_arguments, json!({"q": "rust"}));

        let responses = chat.messages[2].content.tool_responses();
        assert_eq!(responses.len(), 1);
        assert_eq!(responses[0].call_id, "call_1");
        assert_eq!(responses[0].fn_name.as_deref(), Some("search"));
        assert_eq!(responses[0].content, "3 results");

        let tools = chat.tools.as_deref().unwrap_or_default();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name.as_str(), "search");
        assert_eq!(tools[0].description.as_deref(), Some("Searches the web"));
        assert_eq!(tools[0].schema.as_ref(), Some(&search_tool().parameters));
    }

    #[test]
    fn assistant_tool_calls_without_text_have_no_empty_text_part() {
        let history = vec![
            Message::user("hi"),
            Message::assistant_with_tools("", vec![ToolCall::new("c", "t", json!({}))]),
        ];
        let chat = to_chat_request(&InferenceRequest::new("m", history));
        assert!(chat.messages[1].content.texts().is_empty());
        assert_eq!(chat.messages[1].content.tool_calls().len(), 1);
    }

    #[test]
    fn tool_choice_is_sent_only_with_tools() {
        let mut request = InferenceRequest::new("m", vec![Message::user("hi")]);
        request.tool_choice = ToolChoice::Required;
        request.temperature = Some(0.25);
        request.max_output_tokens = Some(128);
        let options = chat_options(&request);
        assert_eq!(options.tool_choice, None);
        assert_eq!(options.temperature, Some(0.25));
        assert_eq!(options.max_tokens, Some(128));
        assert_eq!(options.capture_usage, Some(true));
        assert_eq!(options.capture_tool_calls, Some(true));
        assert!(to_chat_request(&request).tools.is_none());

        let mut request = request.with_tools(vec![search_tool()]);
        request.tool_choice = ToolChoice::Tool("search".into());
        assert_eq!(
            chat_options(&request).tool_choice,
            Some(genai::chat::ToolChoice::tool("search"))
        );
        request.tool_choice = ToolChoice::None;
        assert_eq!(
            chat_options(&request).tool_choice,
            Some(genai::chat::ToolChoice::None)
        );
    }

    #[test]
    fn arguments_are_parsed_and_invalid_json_is_wrapped() {
        assert_eq!(
            parse_arguments(Value::String(r#"{"q":"rust"}"#.into())),
            json!({"q": "rust"})
        );
        assert_eq!(parse_arguments(json!({"a": 1})), json!({"a": 1}));
        assert_eq!(parse_arguments(Value::String("  ".into())), json!({}));
        assert_eq!(parse_arguments(Value::Null), json!({}));
        let wrapped = parse_arguments(Value::String(r#"{"q": "ru"#.into()));
        assert_eq!(wrapped["_raw_arguments"], r#"{"q": "ru"#);
        assert!(
            wrapped["_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("invalid JSON: "))
        );
    }

    #[test]
    fn usage_is_reported_only_when_known() {
        assert_eq!(token_usage(&genai::chat::Usage::default()), None);
        let usage = genai::chat::Usage {
            prompt_tokens: Some(11),
            completion_tokens: Some(7),
            ..Default::default()
        };
        assert_eq!(token_usage(&usage), Some(TokenUsage::new(11, 7)));
    }

    #[test]
    fn invalid_base_url_fails_every_open_without_retry() {
        let executor = GenaiExecutor::openai_compatible("localhost:8080/v1", None);
        let error = executor.client.as_ref().err().cloned();
        assert_eq!(
            error.map(|e| e.kind()),
            Some(InferenceErrorKind::InvalidRequest)
        );
    }

    // -- canned HTTP server -------------------------------------------------

    /// Reads one HTTP request (headers and `Content-Length` body).
    async fn read_request(socket: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut chunk = [0_u8; 4096];
        loop {
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed before sending a request");
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    return text[end + 4..].to_string();
                }
            }
        }
    }

    /// Serves one request on 127.0.0.1 with `response`, then closes.
    /// Returns the base URL and a handle yielding the request body.
    async fn serve_once(response: String) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let body = read_request(&mut socket).await;
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.flush().await.unwrap();
            let _ = socket.shutdown().await;
            body
        });
        (format!("http://{address}/v1"), handle)
    }

    fn sse(events: &[&str]) -> String {
        let mut response = String::from(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
        );
        for event in events {
            response.push_str("data: ");
            response.push_str(event);
            response.push_str("\n\n");
        }
        response
    }

    fn local(base_url: &str) -> GenaiExecutor {
        GenaiExecutor::openai_compatible(base_url, None)
            .with_request_timeout(Duration::from_secs(10))
            .with_idle_timeout(Duration::from_secs(10))
    }

    async fn collect(stream: InferenceStream) -> Vec<Result<InferenceDelta, InferenceError>> {
        tokio::time::timeout(Duration::from_secs(20), stream.collect::<Vec<_>>())
            .await
            .expect("stream did not finish")
    }

    const TEXT_1: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#;
    const TEXT_2: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}"#;
    const CALL_1: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"search","arguments":"{\"q\":"}}]},"finish_reason":null}]}"#;
    const CALL_2: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"rust\"}"}}]},"finish_reason":"tool_calls"}]}"#;
    const USAGE: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;

    #[tokio::test]
    async fn streams_text_then_one_tool_call_then_usage() {
        let (base_url, server) =
            serve_once(sse(&[TEXT_1, TEXT_2, CALL_1, CALL_2, USAGE, "[DONE]"])).await;
        let mut request = InferenceRequest::new("local-model", vec![Message::user("find rust")])
            .with_system("you are helpful")
            .with_tools(vec![search_tool()]);
        request.tool_choice = ToolChoice::Required;

        let stream = local(&base_url).open(&request).await.unwrap();
        let items: Vec<_> = collect(stream)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            items,
            [
                InferenceDelta::Text {
                    text: "Hello".into()
                },
                InferenceDelta::Text {
                    text: " world".into()
                },
                InferenceDelta::ToolCall {
                    call: ToolCall::new("call_1", "search", json!({"q": "rust"}))
                },
                InferenceDelta::Usage {
                    usage: TokenUsage::new(11, 7)
                },
            ]
        );

        let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
        assert_eq!(sent["model"], "local-model");
        assert_eq!(sent["stream"], true);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(sent["tool_choice"], "required");
        assert_eq!(sent["tools"][0]["function"]["name"], "search");
        assert_eq!(
            sent["messages"][0],
            json!({"role": "system", "content": "you are helpful"})
        );
        assert_eq!(
            sent["messages"][1],
            json!({"role": "user", "content": "find rust"})
        );
    }

    #[tokio::test]
    async fn streamed_tool_call_with_invalid_json_is_emitted_wrapped() {
        const BAD_CALL: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_7","type":"function","function":{"name":"search","arguments":"{\"q\": rust"}}]},"finish_reason":"tool_calls"}]}"#;
        let (base_url, _server) = serve_once(sse(&[BAD_CALL, "[DONE]"])).await;
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")])
            .with_tools(vec![search_tool()]);
        let stream = local(&base_url).open(&request).await.unwrap();
        let items = collect(stream).await;
        assert_eq!(items.len(), 1, "{items:?}");
        let Ok(InferenceDelta::ToolCall { call }) = &items[0] else {
            panic!("expected a tool call, got {items:?}");
        };
        assert_eq!(call.id, "call_7");
        assert_eq!(call.arguments["_raw_arguments"], r#"{"q": rust"#);
        assert!(call.arguments["_error"].is_string());
    }

    #[tokio::test]
    async fn rate_limit_is_retryable_with_retry_after() {
        let body = r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
        let response = format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let (base_url, server) = serve_once(response).await;
        let mut request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
        request.tool_choice = ToolChoice::Required; // no tools: must not be sent

        let error = match local(&base_url).open(&request).await {
            Ok(_) => panic!("a 429 must fail the open"),
            Err(error) => error,
        };
        assert_eq!(error.kind(), InferenceErrorKind::RateLimited);
        assert!(error.is_retryable());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
        assert!(
            error.message().starts_with("HTTP 429"),
            "{}",
            error.message()
        );
        assert!(error.message().contains("Rate limit reached"));

        let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
        assert!(sent.get("tool_choice").is_none(), "{sent}");
        assert!(sent.get("tools").is_none(), "{sent}");
    }

    #[tokio::test]
    async fn a_stream_cut_before_done_ends_with_stream_cut() {
        let (base_url, _server) = serve_once(sse(&[TEXT_1, TEXT_2])).await;
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
        let stream = local(&base_url).open(&request).await.unwrap();
        let items = collect(stream).await;
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(
            items[0],
            Ok(InferenceDelta::Text {
                text: "Hello".into()
            })
        );
        let last = items[2].as_ref().unwrap_err();
        assert_eq!(last.kind(), InferenceErrorKind::StreamCut);
        assert!(last.is_retryable());
    }

    #[tokio::test]
    async fn a_stream_cut_mid_event_ends_with_stream_cut() {
        let mut response = sse(&[TEXT_1]);
        response.push_str(r#"data: {"id":"c1","choices":[{"index":0,"delta":{"cont"#);
        let (base_url, _server) = serve_once(response).await;
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
        let stream = local(&base_url).open(&request).await.unwrap();
        let items = collect(stream).await;
        assert_eq!(items.len(), 2, "{items:?}");
        let last = items[1].as_ref().unwrap_err();
        assert_eq!(last.kind(), InferenceErrorKind::StreamCut);
    }

    #[tokio::test]
    async fn idle_stream_times_out_and_dropping_closes_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_request(&mut socket).await;
            socket.write_all(sse(&[TEXT_1]).as_bytes()).await.unwrap();
            socket.flush().await.unwrap();
            // Stall; the next read returns 0 once the client hangs up.
            let mut rest = [0_u8; 64];
            while socket.read(&mut rest).await.unwrap_or(0) > 0 {}
        });
        let executor = local(&base_url).with_idle_timeout(Duration::from_millis(300));
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
        let mut stream = executor.open(&request).await.unwrap();
        assert_eq!(
            stream.next().await,
            Some(Ok(InferenceDelta::Text {
                text: "Hello".into()
            }))
        );
        let error = stream.next().await.unwrap().unwrap_err();
        assert_eq!(error.kind(), InferenceErrorKind::Timeout);
        assert!(error.message().contains("no stream event for 0.3 s"));
        assert_eq!(stream.next().await, None);
        drop(stream);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the connection was not closed")
            .unwrap();
    }

    #[tokio::test]
    async fn connection_refused_is_a_retryable_connection_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        drop(listener);
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
        let error = match local(&base_url).open(&request).await {
            Ok(_) => panic!("nothing listens there"),
            Err(error) => error,
        };
        assert_eq!(error.kind(), InferenceErrorKind::Connection, "{error}");
    }

    #[tokio::test]
    async fn non_streaming_answers_become_the_same_deltas() {
        let body = json!({
            "id": "x",
            "object": "chat.completion",
            "model": "local-model",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [{
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}
                    }]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let (base_url, server) = serve_once(response).await;
        let request = InferenceRequest::new("local-model", vec![Message::user("hi")])
            .with_tools(vec![search_tool()]);
        let answer = local(&base_url)
            .with_streaming(false)
            .complete(&request)
            .await
            .unwrap();
        assert_eq!(answer.text, "Hi");
        assert_eq!(
            answer.tool_calls,
            [ToolCall::new("call_9", "search", json!({"q": "rust"}))]
        );
        assert_eq!(answer.usage, Some(TokenUsage::new(3, 2)));
        let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
        assert_eq!(sent["stream"], false);
    }
}
