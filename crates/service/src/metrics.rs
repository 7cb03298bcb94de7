//! [`Metrics`]: what this process's runs did, counted from their events
//! as the service logs them, served in the Prometheus text format
//! ([`Service::metrics`](crate::Service::metrics), `GET /metrics`).
//!
//! Counters only go up; the gauges (active, queued and parked runs) are
//! read when the metrics are. Every figure is this process's: a cluster's
//! is the sum over its processes (the parked approvals excepted: in
//! distributed mode they are read from the database, the cluster's).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rein_runtime_contract::event::AgentEvent;

/// The histograms' upper bounds, in seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A latency histogram (Prometheus buckets, cumulative when written).
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    /// Observations above the last bound.
    over: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        match BUCKETS.iter().position(|b| secs <= *b) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            total += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {total}");
        }
        total += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// This process's run metrics.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Runs finished, by termination code.
    finished: Mutex<BTreeMap<String, u64>>,
    /// Detector firings, by code.
    detected: Mutex<BTreeMap<String, u64>>,
    /// Inferences that waited for their provider's limits, by provider.
    rate_limited: Mutex<BTreeMap<String, u64>>,
    /// Runs that left a model for its fallback, by the model left.
    fallbacks: Mutex<BTreeMap<String, u64>>,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    inference: Histogram,
    tool: Histogram,
}

/// The gauges, read when the metrics are.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Gauges {
    pub(crate) active: u64,
    pub(crate) queued: u64,
    pub(crate) parked: u64,
    pub(crate) takeovers: u64,
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *map.entry(key.to_owned()).or_default() += 1;
}

/// Escapes a label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Counts one event of a run (its own or a sub-agent's).
    pub(crate) fn record(&self, event: &AgentEvent) {
        match event {
            AgentEvent::RunFinished {
                termination, usage, ..
            } => {
                bump(&self.finished, termination.code());
                self.input_tokens
                    .fetch_add(usage.input_tokens, Ordering::Relaxed);
                self.output_tokens
                    .fetch_add(usage.output_tokens, Ordering::Relaxed);
            }
            AgentEvent::Detected { code, .. } => bump(&self.detected, code),
            AgentEvent::RateLimited { provider, .. } => bump(&self.rate_limited, provider),
            AgentEvent::ModelFallback { from_model, .. } => bump(&self.fallbacks, from_model),
            _ => {}
        }
    }

    /// An inference (a round's model request, to its answer) took `took`.
    pub(crate) fn inference(&self, took: Duration) {
        self.inference.observe(took);
    }

    /// A tool call took `took`.
    pub(crate) fn tool(&self, took: Duration) {
        self.tool.observe(took);
    }

    /// The Prometheus text of the counters and `gauges`.
    pub(crate) fn text(&self, gauges: Gauges) -> String {
        let mut out = String::new();
        let counted = |out: &mut String,
                       name: &str,
                       help: &str,
                       key: &str,
                       map: &Mutex<BTreeMap<String, u64>>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let map = map
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (value, n) in map.iter() {
                let _ = writeln!(out, "{name}{{{key}=\"{}\"}} {n}", label(value));
            }
        };
        counted(
            &mut out,
            "rein_runs_finished_total",
            "Runs finished in this process, by termination code.",
            "termination",
            &self.finished,
        );
        counted(
            &mut out,
            "rein_detector_firings_total",
            "Detector firings, by stop code.",
            "code",
            &self.detected,
        );
        counted(
            &mut out,
            "rein_rate_limited_waits_total",
            "Inferences that waited for their provider's limits, by provider.",
            "provider",
            &self.rate_limited,
        );
        counted(
            &mut out,
            "rein_model_fallbacks_total",
            "Runs that went on with a fallback model, by the model they left.",
            "model",
            &self.fallbacks,
        );
        let gauge = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        gauge(
            &mut out,
            "rein_runs_active",
            "Runs running in this process now.",
            gauges.active,
        );
        gauge(
            &mut out,
            "rein_runs_queued",
            "Runs queued behind another on their thread (known to this process).",
            gauges.queued,
        );
        gauge(
            &mut out,
            "rein_approvals_pending",
            "Calls parked runs wait on a decision for.",
            gauges.parked,
        );
        let _ = writeln!(
            out,
            "# HELP rein_tokens_total Tokens the runs' providers reported.\n# TYPE rein_tokens_total counter\nrein_tokens_total{{direction=\"input\"}} {}\nrein_tokens_total{{direction=\"output\"}} {}",
            self.input_tokens.load(Ordering::Relaxed),
            self.output_tokens.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rein_lease_takeovers_total Threads this process took over from a lost process.\n# TYPE rein_lease_takeovers_total counter\nrein_lease_takeovers_total {}",
            gauges.takeovers
        );
        self.inference.write(
            &mut out,
            "rein_inference_duration_seconds",
            "A round's model request, from its start to its answer.",
        );
        self.tool.write(
            &mut out,
            "rein_tool_call_duration_seconds",
            "A tool call, from its start to its result.",
        );
        out
    }
}
