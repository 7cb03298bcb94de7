//! Talking to a model: the request, the streamed answer, errors, and the
//! [`LlmExecutor`] trait every provider implements.
//!
//! # The executor protocol
//!
//! An inference has two awaits: [`LlmExecutor::open`] sends the request and
//! returns an [`InferenceStream`] once the provider has accepted it; the
//! stream then yields [`InferenceDelta`]s — text as it is generated, then
//! complete tool calls, then usage — and ends. An error at either step is an
//! [`InferenceError`]. A provider whose stream stops before the provider's
//! own end marker must yield [`InferenceError::stream_cut`], never just end.
//!
//! The runtime races both awaits against the run's cancellation token and
//! drops the stream (closing the connection) when the run is cancelled.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::message::{CacheUsage, Message, TokenUsage, ToolCall};
use crate::tool::ToolDescriptor;

/// Which tools the model may or must call.
///
/// Serialized as `"auto"`, `"none"`, `"required"` or `{ "tool": NAME }` (the
/// same shape in YAML).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool must be called.
    Tool(String),
}

impl Serialize for ToolChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Self::Auto => s.serialize_str("auto"),
            Self::None => s.serialize_str("none"),
            Self::Required => s.serialize_str("required"),
            Self::Tool(name) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("tool", name)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ToolChoice;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("auto, none, required or { tool: NAME }")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ToolChoice, E> {
                match v {
                    "auto" => Ok(ToolChoice::Auto),
                    "none" => Ok(ToolChoice::None),
                    "required" => Ok(ToolChoice::Required),
                    other => Err(E::custom(format!(
                        "unknown tool_choice \"{other}\"; expected auto, none, required or {{ tool: NAME }}"
                    ))),
                }
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ToolChoice, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| serde::de::Error::custom("expected { tool: NAME }"))?;
                if key != "tool" {
                    return Err(serde::de::Error::unknown_field(&key, &["tool"]));
                }
                let name: String = map.next_value()?;
                if map.next_key::<String>()?.is_some() {
                    return Err(serde::de::Error::custom("expected exactly one key, `tool`"));
                }
                Ok(ToolChoice::Tool(name))
            }
        }
        d.deserialize_any(V)
    }
}

/// How an answer's JSON is asked for.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ResponseFormat {
    /// The provider's JSON-schema response format, strict where the
    /// provider has that (OpenAI's `json_schema`): the answer follows the
    /// schema.
    JsonSchema(Arc<serde_json::Value>),
    /// JSON mode (OpenAI's `json_object`): the answer is a JSON object.
    /// The schema goes along where the protocol has room for it (an
    /// OpenAI-compatible server gets it as `response_format.schema`, which
    /// llama.cpp and llama-cpp-python constrain the answer to); for the
    /// others it is only what the prompt asked for.
    JsonObject(Arc<serde_json::Value>),
}

impl ResponseFormat {
    /// The schema, whichever the format.
    pub fn schema(&self) -> &serde_json::Value {
        match self {
            Self::JsonSchema(schema) | Self::JsonObject(schema) => schema,
        }
    }
}

/// One inference request.
///
/// `messages` is the conversation so far as a shared snapshot
/// (`Arc<Vec<Message>>`): it derefs to a `Vec`, so it is iterable and
/// indexable as [`Message`]s. The runtime keeps one request per run and
/// appends to its history in place (`Arc::make_mut`), so no round copies the
/// history unless an executor keeps the `Arc` past its inference.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InferenceRequest {
    /// The model's name at the provider (`ModelSpec::upstream_model`).
    pub model: String,
    /// The agent's system prompt, if any (never part of `messages`).
    pub system: Option<String>,
    /// The conversation so far, oldest first.
    pub messages: Arc<Vec<Message>>,
    /// The tools the model may call.
    pub tools: Vec<ToolDescriptor>,
    /// Which tools the model may or must call; providers do not send it when
    /// `tools` is empty.
    pub tool_choice: ToolChoice,
    /// Sampling temperature, when set.
    pub temperature: Option<f64>,
    /// Output token limit, when set.
    pub max_output_tokens: Option<u32>,
    /// How the answer's JSON is asked for (structured output), when set:
    /// providers that support it constrain the answer; the caller
    /// validates what comes back either way.
    pub response_format: Option<ResponseFormat>,
}

impl InferenceRequest {
    /// A request for `model` over `messages`, with no system prompt, no
    /// tools and default options.
    pub fn new(model: impl Into<String>, messages: impl Into<Arc<Vec<Message>>>) -> Self {
        Self {
            model: model.into(),
            system: None,
            messages: messages.into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_output_tokens: None,
            response_format: None,
        }
    }

    /// Asks for the answer as JSON in `format` (structured output).
    pub fn with_response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = Some(format);
        self
    }

    /// Sets the system prompt.
    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    /// Sets the tools.
    pub fn with_tools(mut self, tools: Vec<ToolDescriptor>) -> Self {
        self.tools = tools;
        self
    }

    /// The last message, if any.
    pub fn last_message(&self) -> Option<&Message> {
        self.messages.last()
    }
}

/// One item of a streamed answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InferenceDelta {
    /// A piece of the answer's text.
    Text {
        /// The text.
        text: String,
    },
    /// One complete tool call.
    ToolCall {
        /// The call.
        call: ToolCall,
    },
    /// The tokens the inference used, when the provider reports them.
    Usage {
        /// The usage.
        usage: TokenUsage,
    },
    /// What the provider's prompt cache did, when it reports it (after
    /// [`Usage`](Self::Usage); the tokens are part of its input tokens).
    CacheUsage {
        /// Tokens read from and written to the cache.
        cache: CacheUsage,
    },
}

/// A whole answer, assembled from its deltas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InferenceResponse {
    /// The answer's text.
    pub text: String,
    /// The tool calls, in the order the model made them.
    pub tool_calls: Vec<ToolCall>,
    /// Usage, `None` when the provider did not report it (never zero-filled).
    pub usage: Option<TokenUsage>,
    /// Prompt-cache usage, `None` when the provider did not report it.
    pub cache: Option<CacheUsage>,
}

impl InferenceResponse {
    /// Folds one delta into the response.
    pub fn apply(&mut self, delta: InferenceDelta) {
        match delta {
            InferenceDelta::Text { text } => self.text.push_str(&text),
            InferenceDelta::ToolCall { call } => self.tool_calls.push(call),
            InferenceDelta::Usage { usage } => {
                self.usage
                    .get_or_insert_with(TokenUsage::default)
                    .add(usage);
            }
            InferenceDelta::CacheUsage { cache } => {
                self.cache
                    .get_or_insert_with(CacheUsage::default)
                    .add(cache);
            }
        }
    }
}

/// The stream an executor returns from [`LlmExecutor::open`].
pub type InferenceStream = BoxStream<'static, Result<InferenceDelta, InferenceError>>;

/// A model provider.
///
/// Implementors turn a request into a stream of deltas; see the module docs
/// for the protocol. Both the future returned by `open` and the stream may be
/// dropped at any await point (that is how a run is cancelled); dropping must
/// release the connection.
#[async_trait::async_trait]
pub trait LlmExecutor: Send + Sync {
    /// Sends the request and returns the answer's stream.
    ///
    /// # Errors
    ///
    /// An [`InferenceError`] when the request could not be sent or the
    /// provider rejected it; its [`kind`](InferenceError::kind) says whether
    /// retrying can help.
    async fn open(&self, request: &InferenceRequest) -> Result<InferenceStream, InferenceError>;

    /// Opens the stream and collects it into one response.
    ///
    /// # Errors
    ///
    /// The first error of `open` or of the stream.
    async fn complete(
        &self,
        request: &InferenceRequest,
    ) -> Result<InferenceResponse, InferenceError> {
        let mut stream = self.open(request).await?;
        let mut response = InferenceResponse::default();
        while let Some(delta) = stream.next().await {
            response.apply(delta?);
        }
        Ok(response)
    }
}

/// The class of an [`InferenceError`], which decides whether a retry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum InferenceErrorKind {
    /// HTTP 429: too many requests. Retryable.
    RateLimited,
    /// HTTP 503/529: the provider is overloaded. Retryable.
    Overloaded,
    /// The request or the stream timed out (HTTP 408/504 too). Retryable.
    Timeout,
    /// Another 5xx. Retryable.
    Server,
    /// The connection could not be made or was reset. Retryable.
    Connection,
    /// The stream ended before the provider's end marker. Retryable.
    StreamCut,
    /// HTTP 400 and other malformed requests. Not retryable.
    InvalidRequest,
    /// HTTP 401/403: a missing or bad key. Not retryable.
    Unauthorized,
    /// The prompt exceeds the model's context window. Not retryable.
    ContextOverflow,
    /// HTTP 404: the model or endpoint does not exist. Not retryable.
    NotFound,
    /// Anything else; not retryable.
    Other,
}

impl InferenceErrorKind {
    /// Whether an error of this kind may succeed when retried.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::RateLimited
                | Self::Overloaded
                | Self::Timeout
                | Self::Server
                | Self::Connection
                | Self::StreamCut
        )
    }

    /// The kind as an identifier (`rate_limited`, `context_overflow`, …),
    /// e.g. for a trace's `error.type`.
    pub fn code(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::Server => "server_error",
            Self::Connection => "connection_error",
            Self::StreamCut => "stream_cut",
            Self::InvalidRequest => "invalid_request",
            Self::Unauthorized => "unauthorized",
            Self::ContextOverflow => "context_overflow",
            Self::NotFound => "not_found",
            Self::Other => "other",
        }
    }

    /// The kind's name in words, as used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate limited",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::Server => "server error",
            Self::Connection => "connection error",
            Self::StreamCut => "stream cut",
            Self::InvalidRequest => "invalid request",
            Self::Unauthorized => "unauthorized",
            Self::ContextOverflow => "context overflow",
            Self::NotFound => "not found",
            Self::Other => "error",
        }
    }
}

impl fmt::Display for InferenceErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed inference: its kind, the provider's message and, for rate
/// limits, how long the provider asked to wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct InferenceError {
    kind: InferenceErrorKind,
    message: String,
    retry_after: Option<Duration>,
}

impl InferenceError {
    /// An error of the given kind.
    pub fn new(kind: InferenceErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Rate limited (retryable), with the provider's `Retry-After` if given.
    pub fn rate_limited(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        Self {
            retry_after,
            ..Self::new(InferenceErrorKind::RateLimited, message)
        }
    }

    /// Provider overloaded (retryable).
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::Overloaded, message)
    }

    /// Timed out (retryable).
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::Timeout, message)
    }

    /// Server error (retryable).
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::Server, message)
    }

    /// Connection failed or reset (retryable).
    pub fn connection(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::Connection, message)
    }

    /// Stream ended before its end marker (retryable).
    pub fn stream_cut(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::StreamCut, message)
    }

    /// Malformed request (not retryable).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::InvalidRequest, message)
    }

    /// Missing or rejected credentials (not retryable).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::Unauthorized, message)
    }

    /// The prompt does not fit the context window (not retryable).
    pub fn context_overflow(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::ContextOverflow, message)
    }

    /// Unknown model or endpoint (not retryable).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(InferenceErrorKind::NotFound, message)
    }

    /// The error's class.
    pub fn kind(&self) -> InferenceErrorKind {
        self.kind
    }

    /// The provider's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }

    /// How long the provider asked to wait before retrying, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_classify_retryability() {
        let retryable = [
            InferenceError::rate_limited("x", Some(Duration::from_secs(2))),
            InferenceError::overloaded("x"),
            InferenceError::timeout("x"),
            InferenceError::server("x"),
            InferenceError::connection("x"),
            InferenceError::stream_cut("x"),
        ];
        assert!(retryable.iter().all(InferenceError::is_retryable));
        let fatal = [
            InferenceError::invalid_request("x"),
            InferenceError::unauthorized("x"),
            InferenceError::context_overflow("x"),
            InferenceError::not_found("x"),
        ];
        assert!(fatal.iter().all(|e| !e.is_retryable()));
        assert_eq!(retryable[0].retry_after(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn error_display_names_the_kind_and_message() {
        assert_eq!(
            InferenceError::unauthorized("bad key").to_string(),
            "unauthorized: bad key"
        );
    }

    #[test]
    fn tool_choice_uses_the_yaml_shape() {
        assert_eq!(serde_json::to_value(ToolChoice::Auto).unwrap(), "auto");
        assert_eq!(
            serde_json::to_value(ToolChoice::Tool("search".into())).unwrap(),
            serde_json::json!({"tool": "search"})
        );
        for choice in [
            ToolChoice::Auto,
            ToolChoice::None,
            ToolChoice::Required,
            ToolChoice::Tool("x".into()),
        ] {
            let yaml = serde_yaml::to_string(&choice).unwrap();
            assert_eq!(serde_yaml::from_str::<ToolChoice>(&yaml).unwrap(), choice);
        }
        assert!(serde_json::from_str::<ToolChoice>("\"sometimes\"").is_err());
    }
}
