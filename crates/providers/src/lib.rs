//! LLM executors for Rein: implementations of
//! [`LlmExecutor`](rein_runtime_contract::inference::LlmExecutor).
//!
//! - [`GenaiExecutor`] talks to real models through the [`genai`] crate
//!   (re-exported here): OpenAI, Anthropic, Gemini and the other hosted
//!   providers with [`GenaiExecutor::new`] (provider from the model name, API
//!   keys from `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`, ...),
//!   local OpenAI-compatible servers (llama.cpp, vLLM, Ollama's `/v1`) with
//!   [`GenaiExecutor::openai_compatible`], or any configured
//!   [`genai::Client`] with [`GenaiExecutor::with_client`]. It streams text,
//!   emits complete tool calls and usage, applies request and idle timeouts,
//!   and classifies provider failures into retryable and fatal
//!   [`InferenceErrorKind`](rein_runtime_contract::inference::InferenceErrorKind)s.
//! - [`ScriptedExecutor`] plays a deterministic script (text streamed word by
//!   word, tool calls, usage, errors, delays) or answers from a function of
//!   the request. It is how tests, examples and the offline quickstart run
//!   without a model.
//!
//! The runtime never depends on this crate: executors are handed to
//! `AgentRuntimeBuilder::with_provider`.
//!
//! ```
//! use rein_providers::{ScriptedExecutor, ScriptedResponse};
//! use rein_runtime_contract::inference::{InferenceRequest, LlmExecutor};
//! use rein_runtime_contract::message::Message;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let model = ScriptedExecutor::new(vec![ScriptedResponse::text("hello there").with_usage(3, 2)]);
//! let request = InferenceRequest::new("scripted", vec![Message::user("hi")]);
//! let answer = model.complete(&request).await.unwrap();
//! assert_eq!(answer.text, "hello there");
//! assert_eq!(model.served_chunks(), 3); // two words and the usage
//! # });
//! ```

mod genai_executor;
mod scripted;

pub use genai;
pub use genai_executor::GenaiExecutor;
pub use scripted::{ScriptedExecutor, ScriptedResponse};
