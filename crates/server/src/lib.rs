//! Rein as a service: the deployment file, the HTTP/SSE API, AG-UI, and
//! the `rein` binary.
//!
//! # The model
//!
//! A [`Deployment`](deployment::Deployment) (the `rein.yaml` file) names
//! providers, models and agents; [`assemble`] turns it into an
//! `AgentRuntime`. The [`Service`](service::Service) wraps the runtime with
//! what a network service needs — per-thread strategies (`interrupt`,
//! `enqueue`, `reject`), idempotency keys, run records with their event
//! logs, retention — and [`http`] serves it (with [`agui`] for AG-UI
//! clients). The `rein` binary ([`cli`]) loads a file and serves it, runs
//! one message, or checks the file; [`App`] is that binary with your own
//! Rust tools and plugins.
//!
//! ```text
//! rein.yaml ─▶ Deployment ─▶ assemble ─▶ AgentRuntime ─▶ Service ─▶ http (+ agui) ─▶ clients
//! ```

pub mod agui;
mod app;
pub mod assemble;
pub mod cli;
pub mod console;
pub mod deployment;
pub mod http;
pub mod probe;
mod prompt;
mod replay;

/// Run control as a service (`rein-service`), which the HTTP API, AG-UI
/// and the CLI are transports over.
pub use rein_service as service;

pub use app::App;

use std::future::Future;
use std::time::Duration;

use service::Service;

/// How long shutdown waits for open connections after the service shut
/// down (which already waited up to `cancel_wait_ms` for the runs).
const CONNECTION_GRACE: Duration = Duration::from_secs(2);

/// Serves the API on `listener` until `shutdown` completes; then shuts
/// the service down (queued runs end, active runs are cancelled with cause
/// `shutdown` and awaited within the cancel-wait bound, live tails end),
/// stops accepting, and gives open connections a short grace to finish
/// before dropping them. Connections are capped and timed as
/// `settings.connections` says (see `http::listen`).
///
/// # Errors
///
/// The router cannot be built from `settings` (`InvalidInput`: the auth
/// tokens' variable).
///
/// # Cancel safety
///
/// Dropping the future drops every open connection at once and does not
/// shut the service down; await `shutdown` instead to stop cleanly.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Service,
    settings: deployment::ServerSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = http::router(service.clone(), &settings)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let limits = http::listen::Limits::new(&settings.connections);
    // Accepting stops only once the service has shut down, so a client
    // arriving meanwhile is still answered (`shutting_down`).
    let stop = async move {
        shutdown.await;
        service.shutdown().await;
    };
    http::listen::serve(listener, router, limits, stop, CONNECTION_GRACE).await
}
