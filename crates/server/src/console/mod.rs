//! The web console at `/`: a page to watch and steer runs in a browser,
//! served from assets compiled into the binary (no build step, no network).
//!
//! The page itself holds no data, so it is served without a token, like
//! `/healthz`; everything it shows comes from the API, with the token the
//! operator enters (kept in the tab's `sessionStorage`) on every request.
//! Its streams are read with `fetch`, which can send that token (an
//! `EventSource` cannot). docs/console.md shows it.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

/// `GET /`: the page.
pub(crate) async fn index() -> Response {
    asset(
        "text/html; charset=utf-8",
        INDEX,
        // Only this origin's script, style and API; no inline script.
        Some(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    )
}

/// `GET /console/app.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS, None)
}

/// `GET /console/app.css`.
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS, None)
}

fn asset(content_type: &'static str, body: &'static str, policy: Option<&'static str>) -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // The assets change with the binary: revalidate each load.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    if let Some(policy) = policy {
        response.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            header::HeaderValue::from_static(policy),
        );
    }
    response
}

/// The bytes a first load of the console fetches (the page and its two
/// assets): what the 300 KB budget of docs/console.md counts.
pub fn page_bytes() -> usize {
    INDEX.len() + APP_JS.len() + APP_CSS.len()
}
