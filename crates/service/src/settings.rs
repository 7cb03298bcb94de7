//! The service's settings: how long a cancel waits, what is kept, and the
//! limits every field of a submission is held to.

use serde::Deserialize;

/// How the service behaves (the deployment file's `server:` section
/// carries these).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServiceSettings {
    /// How long a cancel waits for a run to release its thread, and
    /// shutdown for each run (default 5000).
    pub cancel_wait_ms: u64,
    /// How long finished runs and their events are kept.
    pub retention: Retention,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            cancel_wait_ms: 5000,
            retention: Retention::default(),
        }
    }
}

/// How long finished runs (records, events, idempotency keys) are kept:
/// at most `max_finished_runs`, none older than `finished_run_ttl_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// The most finished runs kept (default 10 000); the oldest go first.
    pub max_finished_runs: usize,
    /// How long a finished run is kept, in seconds (default 3600).
    pub finished_run_ttl_seconds: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_finished_runs: 10_000,
            finished_run_ttl_seconds: 3600,
        }
    }
}

/// The longest id the service accepts (a thread, run, agent id or an
/// idempotency key), in bytes: the same in both modes, well under what
/// PostgreSQL indexes hold.
pub const MAX_ID_BYTES: usize = 512;
