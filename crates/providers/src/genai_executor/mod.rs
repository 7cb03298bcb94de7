//! The real executor: any provider `genai` speaks (OpenAI, Anthropic, Gemini,
//! Ollama, OpenAI-compatible servers, ...), mapped onto Rein's executor
//! protocol.
//!
//! This module owns [`GenaiExecutor`]: its configuration (client, request
//! and idle timeouts, streaming on or off) and [`LlmExecutor::open`], which
//! sends the request and waits for the provider to start answering. It does
//! not own the request/response mapping (`mapping`), the streaming state
//! machine (`stream`) or error classification (`errors`).

mod errors;
mod mapping;
mod overflow;
mod stream;
#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use genai::adapter::AdapterKind;
use genai::chat::{ChatOptions, ChatRequest, ChatStreamEvent};
use genai::resolver::{AuthData, Endpoint};
use rein_runtime_contract::inference::{
    InferenceError, InferenceErrorKind, InferenceRequest, InferenceStream, LlmExecutor,
};

use errors::{Phase, classify_genai_error, secs, snippet};
use mapping::{chat_options, response_deltas, to_chat_request};
use stream::DeltaStream;

/// Default [`GenaiExecutor::with_request_timeout`]: 60 s.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`GenaiExecutor::with_idle_timeout`]: 30 s.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The key sent to OpenAI-compatible servers when none is given.
const PLACEHOLDER_API_KEY: &str = "rein-local";

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
/// body says the prompt is over the context window: OpenAI's
/// `context_length_exceeded`, llama.cpp's `exceed_context_size_error`,
/// Anthropic's `prompt is too long`, Gemini's `input token count … exceeds`),
/// 401/403 →
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
        if key != PLACEHOLDER_API_KEY {
            errors::register_secret(&key);
        }
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
        Ok(DeltaStream::into_inference_stream(
            stream,
            first,
            self.idle_timeout,
        ))
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

/// The protocol `model` is served over, if it resolves (sending reports
/// the error otherwise). Anthropic's prompt cache needs explicit
/// breakpoints (`cache_control`; OpenAI and Gemini cache prefixes on their
/// own, other adapters get no hints); the OpenAI protocol takes a schema
/// with its JSON mode.
async fn adapter_kind(client: &genai::Client, model: &str) -> Option<AdapterKind> {
    client
        .resolve_service_target(model)
        .await
        .ok()
        .map(|target| target.model.adapter_kind)
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
        let adapter = adapter_kind(client, &request.model).await;
        let chat_request = to_chat_request(request, adapter == Some(AdapterKind::Anthropic));
        let mut options = chat_options(request, adapter == Some(AdapterKind::OpenAI));
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
