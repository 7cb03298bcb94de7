//! What a thread accumulates across runs for auto mode: tokens used and
//! metric reports. It lives in memory, in the runtime; `reset_session`
//! clears a thread's, and a process restart loses all of it.

use dashmap::DashMap;

use super::metrics::MetricsReport;
use crate::run::AgentRunResult;

/// One thread's accumulated tokens and reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct Session {
    pub(crate) tokens: u64,
    pub(crate) reports: Vec<MetricsReport>,
}

impl Session {
    /// Completed experiments so far.
    pub(crate) fn completed(&self) -> u64 {
        self.reports.iter().filter(|r| r.is_completed()).count() as u64
    }

    /// The latest completed report.
    pub(crate) fn latest_completed(&self) -> Option<&MetricsReport> {
        self.reports.iter().rev().find(|r| r.is_completed())
    }
}

/// Sessions by thread.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    threads: DashMap<String, Session>,
}

impl Sessions {
    /// Adds a finished run's tokens and reports to its thread.
    pub(crate) fn record(&self, result: &AgentRunResult) {
        if result.usage.total() == 0 && result.reports.is_empty() {
            return;
        }
        let mut session = self.threads.entry(result.thread_id.clone()).or_default();
        session.tokens = session.tokens.saturating_add(result.usage.total());
        session.reports.extend(result.reports.iter().cloned());
    }

    pub(crate) fn get(&self, thread_id: &str) -> Session {
        self.threads
            .get(thread_id)
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn tokens(&self, thread_id: &str) -> u64 {
        self.threads.get(thread_id).map_or(0, |s| s.tokens)
    }

    pub(crate) fn reset(&self, thread_id: &str) {
        self.threads.remove(thread_id);
    }
}
