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
//! one message, or checks the file.
//!
//! ```text
//! rein.yaml ─▶ Deployment ─▶ assemble ─▶ AgentRuntime ─▶ Service ─▶ http (+ agui) ─▶ clients
//! ```

pub mod agui;
pub mod assemble;
pub mod cli;
pub mod deployment;
pub mod http;
mod replay;

/// Run control as a service (`rein-service`), which the HTTP API, AG-UI
/// and the CLI are transports over.
pub use rein_service as service;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use service::Service;

/// How long shutdown waits for open connections after the runs ended.
const CONNECTION_GRACE: Duration = Duration::from_secs(2);

/// Serves the API on `listener` until `shutdown` completes; then shuts
/// the service down (queued runs end, active runs are cancelled with cause
/// `shutdown` and awaited within the cancel-wait bound, live tails end) and
/// gives open connections a short grace to finish.
///
/// # Errors
///
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Service,
    settings: deployment::ServerSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let fired = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let (service, fired) = (service.clone(), fired.clone());
        async move {
            shutdown.await;
            service.shutdown().await;
            fired.notify_one();
        }
    };
    let grace = Duration::from_millis(service.settings().cancel_wait_ms) + CONNECTION_GRACE;
    // No Nagle delay: SSE events and small answers go out at once.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let router = http::router(service, &settings)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let server = axum::serve(listener, router).with_graceful_shutdown(signal);
    tokio::select! {
        result = server => result,
        // Connections that stay open past the grace are dropped.
        _ = async { fired.notified().await; tokio::time::sleep(grace).await } => Ok(()),
    }
}
