//! Recognising a provider's "the prompt does not fit the context window"
//! answer, whatever its dialect: OpenAI's (and vLLM's, llama-cpp-python's)
//! `context_length_exceeded`, llama.cpp's `exceed_context_size_error`,
//! Anthropic's `prompt is too long`, Gemini's `input token count … exceeds
//! the maximum number of tokens`.
//!
//! It only reads error bodies; `errors` decides which statuses may be a
//! context overflow at all and builds the [`InferenceError`].
//!
//! [`InferenceError`]: rein_runtime_contract::inference::InferenceError

use serde_json::Value;

use super::errors::snippet;

/// Substrings of an error's `type` or `code` that name a context overflow:
/// `context_length_exceeded` (OpenAI and its imitators),
/// `exceed_context_size_error` (llama.cpp's server),
/// `model_context_window_exceeded` (Anthropic's stop reason).
const OVERFLOW_FIELDS: [&str; 3] = ["context_length", "context_size", "context_window"];

/// Well-known phrases of context-overflow messages, lowercase. Used when no
/// structured field says so: Anthropic and Gemini put only a generic
/// `invalid_request_error` / `INVALID_ARGUMENT` there.
const OVERFLOW_PHRASES: [&str; 12] = [
    "context_length_exceeded",
    "context length",
    "context window",
    "context_window",
    "available context size",
    "max context size",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "input token count",
    "exceeds the maximum number of tokens",
    "exceed_context_size",
];

/// What an error body says about a prompt over the context window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ContextOverflow {
    /// The provider's own message, when the body is JSON with one.
    pub(super) message: Option<String>,
    /// The prompt's size in tokens, when the body gives it as a field
    /// (llama.cpp's `n_prompt_tokens`).
    pub(super) prompt_tokens: Option<u64>,
    /// The context window in tokens, when the body gives it as a field
    /// (llama.cpp's `n_ctx`).
    pub(super) context_tokens: Option<u64>,
    /// Whether a `type` or `code` field said so (rather than a phrase).
    pub(super) by_field: bool,
}

impl ContextOverflow {
    /// The provider's message (at most a snippet's length) followed by the
    /// token numbers the body gave as fields; `None` without a message.
    pub(super) fn describe(&self) -> Option<String> {
        let mut text = snippet(self.message.as_deref()?);
        let numbers: Vec<String> = [
            self.prompt_tokens.map(|n| format!("prompt {n} tokens")),
            self.context_tokens.map(|n| format!("context {n} tokens")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !numbers.is_empty() {
            text.push_str(" (");
            text.push_str(&numbers.join(", "));
            text.push(')');
        }
        Some(text)
    }
}

/// Reads `body` as a context-overflow answer: by the error's `type` and
/// `code` fields first, then by well-known phrases in its message (or in the
/// whole body when it is not JSON with a message). `None` when neither says
/// the prompt is over the context window.
pub(super) fn context_overflow(body: &str) -> Option<ContextOverflow> {
    let json: Option<Value> = serde_json::from_str(body.trim()).ok();
    let error = json.as_ref().and_then(error_object);
    let message = json.as_ref().and_then(|json| message_of(json, error));
    let by_field = error.is_some_and(|error| {
        ["type", "code"].iter().any(|field| {
            error
                .get(field)
                .and_then(Value::as_str)
                .is_some_and(|value| {
                    let value = value.to_lowercase();
                    OVERFLOW_FIELDS.iter().any(|name| value.contains(name))
                })
        })
    });
    if !by_field {
        let text = message.as_deref().unwrap_or(body).to_lowercase();
        if !OVERFLOW_PHRASES.iter().any(|phrase| text.contains(phrase)) {
            return None;
        }
    }
    let number = |field: &str| error.and_then(|error| error.get(field)?.as_u64());
    Some(ContextOverflow {
        message,
        prompt_tokens: number("n_prompt_tokens"),
        context_tokens: number("n_ctx"),
        by_field,
    })
}

/// The object describing the error: `error` when it is an object (OpenAI,
/// Anthropic, Gemini, llama.cpp), else the body itself (an in-stream error
/// event, or a bare `{"type": …, "message": …}`). Gemini may wrap its answer
/// in a one-element array.
fn error_object(json: &Value) -> Option<&Value> {
    let json = match json {
        Value::Array(items) => items.first()?,
        other => other,
    };
    match json.get("error") {
        Some(error @ Value::Object(_)) => Some(error),
        _ => json.is_object().then_some(json),
    }
}

/// The error's message: `message` of the error object, or a string `error`
/// or `detail` at the top (FastAPI-style servers).
fn message_of(json: &Value, error: Option<&Value>) -> Option<String> {
    let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    text(error.and_then(|error| error.get("message")))
        .or_else(|| text(json.get("error")))
        .or_else(|| text(json.get("detail")))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// What llama-cpp-python 0.3.36's server (the one `cargo xtask local-llm`
    /// starts, n_ctx 2048) answered to a 4010-token prompt, recorded
    /// 2026-11-24 with curl, non-streaming.
    pub(in super::super) const LLAMA_CPP_PYTHON: &str =
        include_str!("../../fixtures/context_overflow/llama-cpp-python.json");
    /// llama.cpp's own `llama-server`: the message, type and fields its
    /// `server-context.cpp` / `server-task.cpp` send for a prompt of
    /// `n_prompt_tokens` over `n_ctx`.
    pub(in super::super) const LLAMA_SERVER: &str =
        include_str!("../../fixtures/context_overflow/llama-server.json");
    /// Anthropic's Messages API.
    const ANTHROPIC: &str = include_str!("../../fixtures/context_overflow/anthropic.json");
    /// Gemini's `generateContent`.
    const GEMINI: &str = include_str!("../../fixtures/context_overflow/gemini.json");
    /// OpenAI's chat completions.
    const OPENAI: &str = include_str!("../../fixtures/context_overflow/openai.json");

    #[test]
    fn llama_server_overflow_is_recognised_by_its_type_with_both_numbers() {
        let overflow = context_overflow(LLAMA_SERVER).unwrap();
        assert!(overflow.by_field);
        assert_eq!(overflow.prompt_tokens, Some(4476));
        assert_eq!(overflow.context_tokens, Some(4096));
        assert_eq!(
            overflow.describe().unwrap(),
            "request (4476 tokens) exceeds the available context size (4096 tokens), \
             try increasing it (prompt 4476 tokens, context 4096 tokens)"
        );
    }

    #[test]
    fn llama_server_overflow_without_numbers_keeps_its_message() {
        let body = r#"{"error": {"code": 400, "type": "exceed_context_size_error", "message": "the request exceeds the available context size, try increasing it"}}"#;
        let overflow = context_overflow(body).unwrap();
        assert!(overflow.by_field);
        assert_eq!(
            overflow.describe().unwrap(),
            "the request exceeds the available context size, try increasing it"
        );
        // The message alone is enough when the type is missing.
        let body = r#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it"}}"#;
        assert!(!context_overflow(body).unwrap().by_field);
    }

    #[test]
    fn openai_style_overflow_is_recognised_by_its_code() {
        for body in [OPENAI, LLAMA_CPP_PYTHON] {
            let overflow = context_overflow(body).unwrap();
            assert!(overflow.by_field, "{body}");
            assert!(
                overflow
                    .describe()
                    .unwrap()
                    .starts_with("This model's maximum context length is"),
                "{body}"
            );
            assert_eq!(overflow.prompt_tokens, None);
        }
    }

    #[test]
    fn anthropic_and_gemini_overflows_are_recognised_by_their_messages() {
        let overflow = context_overflow(ANTHROPIC).unwrap();
        assert!(!overflow.by_field);
        assert_eq!(
            overflow.describe().unwrap(),
            "prompt is too long: 208000 tokens > 200000 maximum"
        );
        let overflow = context_overflow(GEMINI).unwrap();
        assert!(!overflow.by_field);
        assert_eq!(
            overflow.describe().unwrap(),
            "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
        );
        // Gemini's array-wrapped form.
        let wrapped = format!("[{}]", GEMINI.trim());
        assert!(context_overflow(&wrapped).is_some());
    }

    #[test]
    fn plain_invalid_requests_are_not_overflows() {
        let bodies = [
            r#"{"error":{"message":"bad field"}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate between \"user\" and \"assistant\""}}"#,
            r#"{"error":{"code":400,"message":"Invalid JSON payload received. Unknown name \"foo\"","status":"INVALID_ARGUMENT"}}"#,
            r#"{"error":{"code":400,"type":"invalid_request_error","message":"'messages' must contain at least one message"}}"#,
            // A phrase outside the message does not count when there is one.
            r#"{"error":{"message":"unknown parameter","param":"context_window"}}"#,
            r#"{"detail":"Not a chat model"}"#,
            "Bad Request",
            "",
        ];
        for body in bodies {
            assert_eq!(context_overflow(body), None, "{body}");
        }
    }

    #[test]
    fn a_body_that_is_not_json_is_searched_whole() {
        let overflow = context_overflow("Input is too long for requested model.").unwrap();
        assert_eq!(overflow.message, None);
        assert_eq!(overflow.describe(), None);
    }

    #[test]
    fn a_bare_error_event_is_read_like_a_wrapped_one() {
        let event = r#"{"type":"exceed_context_size_error","message":"request (10 tokens) exceeds the available context size (8 tokens), try increasing it","n_prompt_tokens":10,"n_ctx":8}"#;
        let overflow = context_overflow(event).unwrap();
        assert!(overflow.by_field);
        assert_eq!(overflow.prompt_tokens, Some(10));
        assert_eq!(overflow.context_tokens, Some(8));
    }
}
