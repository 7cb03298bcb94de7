//! Exporting Rein's GenAI spans to an OpenTelemetry collector over OTLP
//! (the `otel` feature).
//!
//! Rein's runs, inferences and tool calls are `tracing` spans that follow
//! the OpenTelemetry GenAI conventions (see [`telemetry`](crate::telemetry)).
//! This module wires `tracing-opentelemetry` to an OTLP/HTTP exporter so
//! they reach a collector (Jaeger, Tempo, Honeycomb, Langfuse, …):
//!
//! ```no_run
//! # fn main() -> Result<(), rein::otel::OtelError> {
//! // Before the runtime starts runs; keep the guard until the end of main:
//! // dropping it flushes the spans not yet sent.
//! let _otel = rein::otel::Otlp::new("my-agent-service").init()?;
//! # Ok(()) }
//! ```
//!
//! Without [`Otlp::with_endpoint`] the exporter follows the standard
//! environment variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`; default `http://localhost:4318`),
//! `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default, or
//! `http/json`), `OTEL_EXPORTER_OTLP_HEADERS`. Spans are sent in batches
//! from a background thread.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// How to export spans: the service's name, and optionally the endpoint
/// and JSON instead of protobuf.
#[derive(Debug, Clone)]
pub struct Otlp {
    service_name: String,
    endpoint: Option<String>,
    json: bool,
}

impl Otlp {
    /// Spans of the service `service_name` (the `service.name` resource
    /// attribute), to the endpoint the environment names.
    pub fn new(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            endpoint: None,
            json: false,
        }
    }

    /// The full URL of the collector's traces endpoint, e.g.
    /// `http://localhost:4318/v1/traces`.
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Sends OTLP/HTTP with JSON bodies instead of protobuf.
    pub fn with_json(mut self) -> Self {
        self.json = true;
        self
    }

    /// A `tracing` layer that exports spans, for a subscriber you compose
    /// yourself, and the guard that flushes them when dropped.
    ///
    /// # Errors
    ///
    /// [`OtelError::Exporter`] when the exporter cannot be built (e.g. an
    /// invalid endpoint URL).
    pub fn layer<S>(self) -> Result<(OpenTelemetryLayer<S, SdkTracer>, OtelGuard), OtelError>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let mut exporter = SpanExporter::builder().with_http();
        if let Some(url) = self.endpoint {
            exporter = exporter.with_endpoint(url);
        }
        if self.json {
            exporter = exporter.with_protocol(Protocol::HttpJson);
        } else if std::env::var_os("OTEL_EXPORTER_OTLP_PROTOCOL").is_none() {
            // The exporter's own default is JSON when its JSON feature is
            // built in; the OTLP default is protobuf.
            exporter = exporter.with_protocol(Protocol::HttpBinary);
        }
        let exporter = exporter
            .build()
            .map_err(|e| OtelError::Exporter(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(self.service_name)
                    .build(),
            )
            .build();
        let tracer = provider.tracer("rein");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok((layer, OtelGuard { provider }))
    }

    /// Installs a global subscriber that exports spans: `RUST_LOG`'s
    /// filter (default `info`) and the exporting layer.
    ///
    /// # Errors
    ///
    /// [`OtelError::Exporter`] as for [`layer`](Self::layer);
    /// [`OtelError::SubscriberAlreadySet`] when the process already has a
    /// global subscriber (compose with [`layer`](Self::layer) then).
    pub fn init(self) -> Result<OtelGuard, OtelError> {
        let (layer, guard) = self.layer()?;
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        tracing_subscriber::registry()
            .with(filter)
            .with(layer)
            .try_init()
            .map_err(|e| OtelError::SubscriberAlreadySet(e.to_string()))?;
        Ok(guard)
    }
}

/// Keeps the exporter running; dropping it sends the spans not yet sent
/// and stops the exporter.
#[derive(Debug)]
pub struct OtelGuard {
    provider: SdkTracerProvider,
}

impl OtelGuard {
    /// Sends the spans ended so far now.
    ///
    /// # Errors
    ///
    /// [`OtelError::Export`] when the collector could not be reached.
    pub fn flush(&self) -> Result<(), OtelError> {
        self.provider
            .force_flush()
            .map_err(|e| OtelError::Export(e.to_string()))
    }
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("rein::otel: exporting the last spans failed: {error}");
        }
    }
}

/// Why exporting could not be set up, or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OtelError {
    /// The OTLP exporter could not be built.
    Exporter(String),
    /// A global `tracing` subscriber is already installed.
    SubscriberAlreadySet(String),
    /// Spans could not be sent.
    Export(String),
}

impl std::fmt::Display for OtelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exporter(e) => write!(f, "the OTLP exporter could not be built: {e}"),
            Self::SubscriberAlreadySet(e) => write!(
                f,
                "a global tracing subscriber is already set ({e}); add Otlp::layer() to yours instead"
            ),
            Self::Export(e) => write!(f, "spans could not be exported: {e}"),
        }
    }
}

impl std::error::Error for OtelError {}
