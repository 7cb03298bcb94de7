//! Typed extractors whose rejection is an [`ApiError`]: a refused request
//! gets the API's JSON error naming what is wrong, never axum's plain
//! text, and the handlers read typed values.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use rein::contract::message::Message;
use serde::de::DeserializeOwned;

use super::ApiError;
use super::listen::BodyTimedOut;

/// A JSON body: 413 `body_too_large` over the limit, 408
/// `request_timeout` when it arrives too slowly, 400 `malformed_json` for
/// bad JSON, 422 `invalid_body` for the wrong shape.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|r| body_error(&r))?;
        parse_json(&bytes).map(Self)
    }
}

/// A body that failed to buffer: too large, too slow (408
/// `request_timeout`, see `listen`), or broken.
fn body_error(rejection: &BytesRejection) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(e) = cause {
        if let Some(timed_out) = e.downcast_ref::<BodyTimedOut>() {
            return ApiError::new(408, "request_timeout", timed_out.to_string());
        }
        cause = e.source();
    }
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            413,
            "body_too_large",
            format!(
                "the request body is over the server's limit (server.body_limit_bytes): {rejection}"
            ),
        )
    } else {
        ApiError::new(
            400,
            "unreadable_body",
            format!("the request body could not be read: {rejection}"),
        )
    }
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::new(
            422,
            "invalid_body",
            format!("the body does not have the expected shape: {e}"),
        ),
        _ => ApiError::new(
            400,
            "malformed_json",
            format!("the body is not valid JSON: {e}"),
        ),
    })
}

/// Path parameters: 400 `invalid_path` when they cannot be read (e.g. bad
/// percent-encoding), naming what axum found.
#[derive(Debug)]
pub(crate) struct PathParams<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0))
            .map_err(|r| ApiError::new(400, "invalid_path", r.body_text()))
    }
}

/// `?wait=true|false` (also `1`/`0`, or bare `wait`): 400 `invalid_query`
/// otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait(pub(crate) bool);

impl<S: Send + Sync> FromRequestParts<S> for Wait {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let value = query
            .split('&')
            .filter_map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                (name == "wait").then_some(value)
            })
            .next_back();
        match value {
            None | Some("false" | "0") => Ok(Self(false)),
            Some("true" | "1" | "") => Ok(Self(true)),
            Some(other) => Err(ApiError::new(
                400,
                "invalid_query",
                format!("wait must be true or false, not \"{other}\""),
            )),
        }
    }
}

/// The `Idempotency-Key` header, if sent: 400 `invalid_idempotency_key`
/// when it is not text.
#[derive(Debug, Clone)]
pub(crate) struct IdempotencyKey(pub(crate) Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match parts.headers.get("idempotency-key") {
            None => Ok(Self(None)),
            Some(v) => v.to_str().map(|s| Self(Some(s.to_owned()))).map_err(|_| {
                ApiError::new(
                    400,
                    "invalid_idempotency_key",
                    "the Idempotency-Key header is not text",
                )
            }),
        }
    }
}

/// The `Last-Event-ID` header: the event after which a run's stream
/// resumes (0 when absent); 400 `invalid_last_event_id` when it is not a
/// number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastEventId(pub(crate) u64);

impl<S: Send + Sync> FromRequestParts<S> for LastEventId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match parts.headers.get("last-event-id") {
            None => Ok(Self(0)),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(Self)
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "invalid_last_event_id",
                        "Last-Event-ID must be an event id of this run (a number)",
                    )
                }),
        }
    }
}

/// The fields a message of a submission may have.
const MESSAGE_FIELDS: [&str; 6] = [
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "interrupted",
    "tool_status",
];

/// A submission's messages, each refused when it has a field a message
/// does not have (a misspelt `conten` would otherwise store an empty
/// message), naming the message and the field.
pub(crate) fn strict_messages<'de, D>(deserializer: D) -> Result<Vec<Message>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize;
    use serde::de::Error;
    let raw = Vec::<serde_json::Map<String, serde_json::Value>>::deserialize(deserializer)?;
    raw.into_iter()
        .enumerate()
        .map(|(i, fields)| {
            if let Some(unknown) = fields
                .keys()
                .find(|k| !MESSAGE_FIELDS.contains(&k.as_str()))
            {
                return Err(D::Error::custom(format!(
                    "messages[{i}]: unknown field `{unknown}`; a message has {}",
                    MESSAGE_FIELDS.join(", ")
                )));
            }
            serde_json::from_value(serde_json::Value::Object(fields))
                .map_err(|e| D::Error::custom(format!("messages[{i}]: {e}")))
        })
        .collect()
}
