//! Error classification for [`GenaiExecutor`](super::GenaiExecutor): genai's
//! errors, HTTP statuses and bodies, `Retry-After` headers, transport
//! failures and in-stream error events, turned into [`InferenceError`]s of
//! the right [`InferenceErrorKind`], with the provider's body quoted as a
//! short one-line snippet (for a context overflow, the provider's message
//! and token numbers; recognising one is `overflow`'s job).
//!
//! It does not own when errors happen or what is retried: the executor
//! (`mod.rs`) and the stream (`stream.rs`) say which [`Phase`] failed, and
//! the runtime decides on retries from the kind.

use std::time::{Duration, SystemTime};

use rein_runtime_contract::inference::{InferenceError, InferenceErrorKind};

use super::overflow::context_overflow;

/// Longest provider body quoted in an error message, in characters.
const SNIPPET_CHARS: usize = 300;

/// Where a failure happened: before the provider answered, or mid-stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Open,
    Stream,
}

/// Classifies an HTTP failure from its status, body and `Retry-After`.
///
/// 429 → rate limited; 503/529 → overloaded; 408/504 → timeout; other 5xx →
/// server; 400/422 (and 413) whose body says the prompt is over the context
/// window (see [`context_overflow`]) → context overflow, its message the
/// provider's own with the token numbers the body gave; 400/422 → invalid
/// request; 401/403 → unauthorized; 404 → not found; anything else, or no
/// status → other.
pub(super) fn classify(
    status: Option<u16>,
    body: &str,
    retry_after: Option<Duration>,
) -> InferenceError {
    if let Some(status @ (400 | 413 | 422)) = status
        && let Some(overflow) = context_overflow(body)
    {
        let text = overflow.describe().unwrap_or_else(|| snippet(body));
        return InferenceError::context_overflow(format!("HTTP {status}: {text}"));
    }
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
        400 | 422 => InferenceError::invalid_request(message),
        401 | 403 => InferenceError::unauthorized(message),
        404 => InferenceError::not_found(message),
        _ => InferenceError::new(InferenceErrorKind::Other, message),
    }
}

/// The delay a `Retry-After` header asks for, in either of RFC 9110's
/// forms: delay-seconds (whole, or fractional as some providers send) or an
/// HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, and the obsolete RFC 850 and
/// asctime forms), measured from the system clock; a date already past
/// means retry now (zero). `retry-after-ms`, which OpenAI also sends, is
/// used when `Retry-After` is absent. A value in neither form is `None`.
pub(super) fn parse_retry_after(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
) -> Option<Duration> {
    parse_retry_after_at(retry_after, retry_after_ms, SystemTime::now())
}

/// [`parse_retry_after`] with the current time given.
fn parse_retry_after_at(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
    now: SystemTime,
) -> Option<Duration> {
    if let Some(value) = retry_after {
        let value = value.trim();
        if let Ok(seconds) = value.parse::<u64>() {
            return Some(Duration::from_secs(seconds));
        }
        if let Ok(seconds) = value.parse::<f64>() {
            return Duration::try_from_secs_f64(seconds).ok();
        }
        return httpdate::parse_http_date(value)
            .ok()
            .map(|date| date.duration_since(now).unwrap_or(Duration::ZERO));
    }
    retry_after_ms
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// Classifies a genai error.
pub(super) fn classify_genai_error(error: &genai::Error, phase: Phase) -> InferenceError {
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
    let mut message = snippet(&error_chain(error, cause));
    if let Some(reqwest) = downcast_field(genai::webc::Error::Reqwest, error) {
        // The URL may be internal (a local server, a gateway): the log
        // has it, the run's termination (which clients read) does not.
        if let Some(url) = reqwest.url() {
            message = message.replace(url.as_str(), "the provider's URL");
            tracing::warn!(url = %url, "provider request failed: {message}");
        }
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
pub(super) fn classify_error_event(body: &str) -> InferenceError {
    let overflow = context_overflow(body);
    if let Some(overflow) = overflow.as_ref().filter(|overflow| overflow.by_field) {
        let text = overflow.describe().unwrap_or_else(|| snippet(body));
        return InferenceError::context_overflow(format!("provider error event: {text}"));
    }
    let message = format!("provider error event: {}", snippet(body));
    let lower = body.to_lowercase();
    if lower.contains("overloaded") {
        InferenceError::overloaded(message)
    } else if lower.contains("rate_limit") || lower.contains("rate limit") {
        InferenceError::rate_limited(message, None)
    } else if let Some(overflow) = overflow {
        let text = overflow.describe().unwrap_or_else(|| snippet(body));
        InferenceError::context_overflow(format!("provider error event: {text}"))
    } else if lower.contains("invalid_request") {
        InferenceError::invalid_request(message)
    } else if lower.contains("authentication") || lower.contains("permission") {
        InferenceError::unauthorized(message)
    } else {
        InferenceError::server(message)
    }
}

/// `text` on one line, at most [`SNIPPET_CHARS`] characters (`…` when cut).
pub(super) fn snippet(text: &str) -> String {
    // Bound the work on huge bodies before collapsing whitespace.
    let head: String = text.chars().take(SNIPPET_CHARS * 4).collect();
    let head = redact(&head);
    let collapsed = head.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() > SNIPPET_CHARS {
        let mut cut: String = collapsed.chars().take(SNIPPET_CHARS - 1).collect();
        cut.push('…');
        cut
    } else {
        collapsed
    }
}

/// The keys executors were configured with (see [`register_secret`]).
static SECRETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// What a redacted secret reads as.
const REDACTED: &str = "[redacted]";

/// Remembers a key an executor sends, so no provider body that echoes it
/// is ever quoted (proxies and some servers echo the key in a 401).
pub(super) fn register_secret(key: &str) {
    if key.len() >= 8 {
        let mut secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
        if !secrets.iter().any(|s| s == key) {
            secrets.push(key.to_owned());
        }
    }
}

/// Every secret to keep out of quoted bodies: the configured keys, and the
/// values of environment variables named like keys (`*_KEY`, `*_TOKEN`,
/// `*_SECRET`), where genai and deployment files take them from.
fn secrets() -> Vec<String> {
    let mut all = SECRETS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (name, value) in std::env::vars() {
        let name = name.to_ascii_uppercase();
        if value.len() >= 8
            && (name.ends_with("_KEY") || name.ends_with("_TOKEN") || name.ends_with("_SECRET"))
        {
            all.push(value);
        }
    }
    all
}

/// `text` with every known secret, and every string that looks like a key
/// or a bearer token, replaced by `[redacted]`.
pub(super) fn redact(text: &str) -> String {
    let mut out = text.to_owned();
    for secret in secrets() {
        if out.contains(&secret) {
            out = out.replace(&secret, REDACTED);
        }
    }
    let is_token_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '=');
    let mut redacted = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(start) = rest.find(is_token_char) {
        let (before, from) = rest.split_at(start);
        redacted.push_str(before);
        let end = from.find(|c| !is_token_char(c)).unwrap_or(from.len());
        let (token, after) = from.split_at(end);
        let bearer = redacted.to_ascii_lowercase().trim_end().ends_with("bearer");
        let key_like = token.len() >= 20
            && ["sk-", "sk_", "pk-", "rk-", "ghp_", "xox", "AKIA", "eyJ"]
                .iter()
                .any(|p| token.starts_with(p));
        if (bearer && token.len() >= 8) || key_like {
            redacted.push_str(REDACTED);
        } else {
            redacted.push_str(token);
        }
        rest = after;
    }
    redacted.push_str(rest);
    redacted
}

/// A duration in seconds for messages: `30`, `0.25`.
pub(super) fn secs(duration: Duration) -> String {
    duration.as_secs_f64().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_bodies_never_carry_a_configured_key_or_a_token() {
        register_secret("local-secret-key-123");
        let body = r#"{"error":"invalid key local-secret-key-123; sent Authorization: Bearer abc.def-ghi_123 and sk-live-0123456789abcdefABCDEF"}"#;
        let quoted = snippet(body);
        assert!(!quoted.contains("local-secret-key-123"), "{quoted}");
        assert!(!quoted.contains("abc.def-ghi_123"), "{quoted}");
        assert!(!quoted.contains("sk-live-0123456789"), "{quoted}");
        assert!(quoted.contains("invalid key [redacted]"), "{quoted}");
        assert_eq!(snippet("plain words stay"), "plain words stay");
    }
    use genai::adapter::AdapterKind;

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
    fn every_providers_context_length_400_is_a_context_overflow() {
        use crate::genai_executor::overflow::tests::{LLAMA_CPP_PYTHON, LLAMA_SERVER};
        let rows = [
            (
                LLAMA_SERVER,
                "HTTP 400: request (4476 tokens) exceeds the available context size (4096 tokens), \
                 try increasing it (prompt 4476 tokens, context 4096 tokens)",
            ),
            (
                LLAMA_CPP_PYTHON,
                "HTTP 400: This model's maximum context length is 2048 tokens. However, you \
                 requested 4018 tokens (4010 in the messages, 8 in the completion). Please reduce \
                 the length of the messages or completion.",
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208000 tokens > 200000 maximum"}}"#,
                "HTTP 400: prompt is too long: 208000 tokens > 200000 maximum",
            ),
            (
                r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
                "HTTP 400: The input token count (1200000) exceeds the maximum number of tokens \
                 allowed (1048576).",
            ),
        ];
        for (body, message) in rows {
            let error = classify(Some(400), body, None);
            assert_eq!(error.kind(), InferenceErrorKind::ContextOverflow, "{body}");
            assert!(!error.is_retryable());
            assert_eq!(error.message(), message);
        }
        // Only client-error statuses can be an overflow.
        assert_eq!(
            classify(Some(500), LLAMA_SERVER, None).kind(),
            InferenceErrorKind::Server
        );
    }

    #[test]
    fn a_plain_invalid_request_400_stays_an_invalid_request() {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#;
        let error = classify(Some(400), body, None);
        assert_eq!(error.kind(), InferenceErrorKind::InvalidRequest);
        assert_eq!(error.message(), format!("HTTP 400: {body}"));
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
            parse_retry_after(None, Some("250")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_retry_after(None, None), None);
        assert_eq!(parse_retry_after(Some("-3"), None), None);
        assert_eq!(parse_retry_after(Some("soon"), Some("5")), None);
    }

    #[test]
    fn retry_after_parses_an_http_date_as_the_time_until_it() {
        // 2015-10-21 07:28:00 UTC.
        let date = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let at = |now: SystemTime, value: &str| parse_retry_after_at(Some(value), None, now);
        let before = date - Duration::from_secs(90);
        assert_eq!(
            at(before, "Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(90))
        );
        // The obsolete forms RFC 9110 still asks recipients to accept.
        assert_eq!(
            at(before, "Wednesday, 21-Oct-15 07:28:00 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            at(before, "Wed Oct 21 07:28:00 2015"),
            Some(Duration::from_secs(90))
        );
        // A date already past means retry now; a date wins over retry-after-ms.
        let after = date + Duration::from_secs(3600);
        assert_eq!(
            parse_retry_after_at(Some("Wed, 21 Oct 2015 07:28:00 GMT"), Some("5"), after),
            Some(Duration::ZERO)
        );
        assert_eq!(at(before, "Wed, 32 Oct 2015 07:28:00 GMT"), None);
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
            (
                r#"{"error":{"code":400,"type":"exceed_context_size_error","message":"request (10 tokens) exceeds the available context size (8 tokens), try increasing it","n_prompt_tokens":10,"n_ctx":8}}"#,
                K::ContextOverflow,
            ),
            (
                r#"{"type":"invalid_request_error","message":"prompt is too long: 208000 tokens > 200000 maximum"}"#,
                K::ContextOverflow,
            ),
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
        let event = classify_error_event(cases[3].0);
        assert_eq!(
            event.message(),
            "provider error event: request (10 tokens) exceeds the available context size \
             (8 tokens), try increasing it (prompt 10 tokens, context 8 tokens)"
        );
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
}
