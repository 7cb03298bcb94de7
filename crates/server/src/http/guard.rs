//! Who may call, checked before any handler: bearer tokens (when
//! `server.auth` is set), the browser's `Origin` (only the configured CORS
//! origins; preflights answered), the `Host` (without auth, only loopback
//! names, so a DNS-rebinding page cannot reach a local service), and JSON
//! bodies on writes (a form or `text/plain` post is refused).
//!
//! Every refusal is the API's JSON error. Tokens are never logged or
//! quoted; an unknown token is refused without saying which part was
//! wrong.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::deployment::ServerSettings;

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Everything.
    All,
    /// Only reads (`GET`).
    Read,
    /// Everything, but submissions only to these agents.
    Agents(Vec<String>),
}

impl Scope {
    /// Refuses a submission to `agent_id` that the token may not make.
    pub(crate) fn check_agent(&self, agent_id: &str) -> Result<(), ApiError> {
        match self {
            Self::Agents(agents) if !agents.iter().any(|a| a == agent_id) => Err(ApiError::new(
                403,
                "forbidden",
                format!(
                    "this token may not run agent \"{agent_id}\"; it may run: {}",
                    agents.join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// One accepted token.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    secret: String,
    scope: Scope,
    /// Who holds it: its `NAME=` prefix, else `token #<position>`.
    name: String,
}

/// Who called: the name of the token the request presented (an extension
/// of authenticated requests), recorded with what it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller(pub(crate) String);

/// The checks, from the server's settings.
#[derive(Debug)]
pub(crate) struct Guard {
    /// `None`: no authentication.
    tokens: Option<Vec<Token>>,
    origins: Vec<String>,
    /// Served on a public interface without auth (`--insecure-public`):
    /// any `Host`.
    public: bool,
    /// `GET` paths served without a token (the routes described public:
    /// liveness and the console's assets, which hold no data).
    tokenless: Vec<&'static str>,
}

impl Guard {
    /// The guard of `settings`, reading the tokens' variable.
    ///
    /// # Errors
    ///
    /// The variable is not set, or holds no token, or a malformed one
    /// (named by its position, never by its text).
    pub(crate) fn new(settings: &ServerSettings) -> Result<Self, String> {
        let tokens =
            match &settings.auth {
                None => None,
                Some(auth) => {
                    let raw = std::env::var(&auth.tokens_env).map_err(|_| {
                        format!(
                            "server.auth.tokens_env: the environment variable {} is not set",
                            auth.tokens_env
                        )
                    })?;
                    Some(parse_tokens(&raw).map_err(|e| {
                        format!("server.auth.tokens_env ({}): {e}", auth.tokens_env)
                    })?)
                }
            };
        Ok(Self {
            tokens,
            origins: settings.cors.origins.clone(),
            public: settings.insecure_public,
            tokenless: Vec::new(),
        })
    }

    /// The guard, serving `paths` to `GET` without a token.
    pub(crate) fn serving_without_token(mut self, paths: Vec<&'static str>) -> Self {
        self.tokenless = paths;
        self
    }

    /// Whether callers must present a token.
    pub(crate) fn authenticates(&self) -> bool {
        self.tokens.is_some()
    }

    /// The request's origin if it may call (listed, or the service's own
    /// origin: a page it serves itself); `Err` if it may not.
    fn allowed_origin<'a>(&self, headers: &'a HeaderMap) -> Result<Option<&'a HeaderValue>, ()> {
        match headers.get(header::ORIGIN) {
            None => Ok(None),
            Some(origin) => {
                let text = origin.to_str().map_err(|_| ())?;
                let host = headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or_default();
                let same = !host.is_empty()
                    && (text.strip_prefix("http://") == Some(host)
                        || text.strip_prefix("https://") == Some(host));
                if same || self.origins.iter().any(|o| o == text) {
                    Ok(Some(origin))
                } else {
                    Err(())
                }
            }
        }
    }
}

/// `[NAME=]TOKEN`, `[NAME=]TOKEN:read`, `[NAME=]TOKEN:agents=a|b`,
/// comma-separated. `NAME` (a letter, then letters, digits, `_`, `.`, `-`;
/// at most 64) names who holds the token; an entry whose part after the
/// first `=` is not a token of its own (e.g. base64 padding) is a token
/// with no name, called `token #<position>`.
fn parse_tokens(raw: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    for (i, entry) in raw.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let (name, entry) = match entry.split_once('=') {
            Some((name, rest))
                if token_name(name) && rest.split(':').next().is_some_and(|t| t.len() >= 16) =>
            {
                (name.to_owned(), rest)
            }
            _ => (format!("token #{}", i + 1), entry),
        };
        let (secret, scope) = match entry.split_once(':') {
            None => (entry, Scope::All),
            Some((secret, "read")) => (secret, Scope::Read),
            Some((secret, limit)) => match limit.strip_prefix("agents=") {
                Some(agents) if !agents.is_empty() => (
                    secret,
                    Scope::Agents(agents.split('|').map(str::to_owned).collect()),
                ),
                _ => {
                    return Err(format!(
                        "token #{} has an unknown limit; use TOKEN, TOKEN:read or TOKEN:agents=a|b",
                        i + 1
                    ));
                }
            },
        };
        if secret.len() < 16 {
            return Err(format!(
                "token #{} is shorter than 16 characters; use a long random token",
                i + 1
            ));
        }
        tokens.push(Token {
            secret: secret.to_owned(),
            scope,
            name,
        });
    }
    if tokens.is_empty() {
        return Err("no token: set it to TOKEN[,TOKEN…]".to_owned());
    }
    Ok(tokens)
}

/// Whether `name` can name a token's holder.
fn token_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Whether the host part of a `Host` header names this machine's loopback.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn cors(mut response: Response, origin: Option<HeaderValue>) -> Response {
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The checks of every request (see the module docs).
pub(crate) async fn check(
    State(guard): State<Arc<Guard>>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let origin = match guard.allowed_origin(headers) {
        Ok(origin) => origin.cloned(),
        Err(()) => {
            return ApiError::new(
                403,
                "origin_not_allowed",
                "pages of this origin may not call the API; list it in server.cors.origins",
            )
            .into_response();
        }
    };
    if request.method() == Method::OPTIONS {
        let mut response = axum::http::StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type, idempotency-key, last-event-id"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        return cors(response, origin);
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !guard.authenticates() && !guard.public && !loopback_host(host) {
        return ApiError::new(
            403,
            "host_not_allowed",
            "without server.auth only loopback host names (localhost, 127.0.0.1, [::1]) are served",
        )
        .into_response();
    }
    let has_body = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|l| l.as_bytes() != b"0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| {
            c.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if request.method() != Method::GET && has_body && !json {
        return cors(
            ApiError::new(
                415,
                "unsupported_media_type",
                "a request body must be JSON: send Content-Type: application/json",
            )
            .into_response(),
            origin,
        );
    }
    // The routes described public (liveness, the console's assets) need
    // no token.
    let path = request.uri().path();
    if let Some(tokens) = &guard.tokens
        && !(request.method() == Method::GET && guard.tokenless.contains(&path))
    {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|a| a.to_str().ok())
            .and_then(|a| a.strip_prefix("Bearer "));
        let token = presented.and_then(|p| tokens.iter().find(|t| t.secret.as_str() == p));
        let Some(Token { scope, name, .. }) = token.cloned() else {
            let mut response = ApiError::new(
                401,
                "unauthorized",
                "send a token of server.auth as Authorization: Bearer <token>",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return cors(response, origin);
        };
        if scope == Scope::Read && request.method() != Method::GET {
            return cors(
                ApiError::new(403, "forbidden", "this token may only read").into_response(),
                origin,
            );
        }
        request.extensions_mut().insert(scope);
        request.extensions_mut().insert(Caller(name));
    }
    cors(next.run(request).await, origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_with_their_limits_and_bad_ones_are_named_by_position() {
        let tokens =
            parse_tokens("aaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbb:read, cccccccccccccccc:agents=a|b")
                .unwrap();
        assert_eq!(tokens[0].scope, Scope::All);
        assert_eq!(tokens[1].scope, Scope::Read);
        assert_eq!(tokens[2].scope, Scope::Agents(vec!["a".into(), "b".into()]));
        assert_eq!(tokens[1].name, "token #2");
        let error = parse_tokens("aaaaaaaaaaaaaaaa, tiny").unwrap_err();
        assert!(error.contains("token #2"), "{error}");
        assert!(
            !error.contains("tiny"),
            "the token is never quoted: {error}"
        );
        assert!(parse_tokens(" , ").is_err());
    }

    #[test]
    fn a_token_may_be_named_and_base64_padding_is_not_a_name() {
        let tokens = parse_tokens(
            "alice=aaaaaaaaaaaaaaaa:read, ops.bot-1=bbbbbbbbbbbbbbbb, cccccccccccccccc==, 9x=dddddddddddddddd",
        )
        .unwrap();
        assert_eq!(
            (tokens[0].name.as_str(), tokens[0].secret.as_str()),
            ("alice", "aaaaaaaaaaaaaaaa")
        );
        assert_eq!(tokens[0].scope, Scope::Read);
        assert_eq!(tokens[1].name, "ops.bot-1");
        // Padding, not a name: the whole entry is the token.
        assert_eq!(
            (tokens[2].name.as_str(), tokens[2].secret.as_str()),
            ("token #3", "cccccccccccccccc==")
        );
        // A name starts with a letter: this is a token with no name.
        assert_eq!(tokens[3].secret, "9x=dddddddddddddddd");
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for host in [
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "127.0.0.1",
            "LOCALHOST",
        ] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "rebind.evil.example",
            "10.0.0.1:80",
            "",
            "localhost.evil:80",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
    }
}
