//! What a thread accumulates across runs for auto mode — tokens used and
//! metric reports — and the auto-mode sessions running on it.
//!
//! A thread's session begins with its first `auto_run`; from then on every
//! run on the thread adds its tokens and reports (auto mode learns of runs
//! through a [`RunObserver`], like any layer), until `reset_session` or
//! `delete_thread`. Threads that never ran in auto mode keep nothing here.
//! It lives in memory only: a process restart loses it.

use std::sync::Arc;

use dashmap::DashMap;
use rein_runtime_contract::CancellationToken;

use super::metrics::{MetricsReport, MetricsReports};
use crate::extensions::RunObserver;
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

/// Sessions by thread, and the tokens of the `auto_run`s in progress.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    threads: DashMap<String, Session>,
    /// `auto_run`s in progress by thread: (session id, its token).
    running: DashMap<String, Vec<(String, CancellationToken)>>,
}

/// Marks an `auto_run` as in progress on its thread until dropped.
#[derive(Debug)]
pub(crate) struct Running {
    sessions: Arc<Sessions>,
    thread_id: String,
    session_id: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let dashmap::mapref::entry::Entry::Occupied(mut entry) =
            self.sessions.running.entry(self.thread_id.clone())
        {
            entry.get_mut().retain(|(id, _)| *id != self.session_id);
            if entry.get().is_empty() {
                entry.remove();
            }
        }
    }
}

impl Sessions {
    /// Starts an `auto_run` on `thread_id`: the thread gets a session if it
    /// has none (`true` then), and cancelling the thread cancels `token`.
    pub(crate) fn begin(
        self: &Arc<Self>,
        thread_id: &str,
        session_id: &str,
        token: CancellationToken,
    ) -> (Running, bool) {
        let created = match self.threads.entry(thread_id.to_owned()) {
            dashmap::mapref::entry::Entry::Vacant(v) => {
                v.insert(Session::default());
                true
            }
            dashmap::mapref::entry::Entry::Occupied(_) => false,
        };
        self.running
            .entry(thread_id.to_owned())
            .or_default()
            .push((session_id.to_owned(), token));
        let running = Running {
            sessions: self.clone(),
            thread_id: thread_id.to_owned(),
            session_id: session_id.to_owned(),
        };
        (running, created)
    }

    /// Forgets a session that `begin` created for a thread on which no
    /// round could start.
    pub(crate) fn forget(&self, thread_id: &str) {
        self.threads.remove(thread_id);
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

    /// Clears the thread's tokens and reports; the session goes on.
    pub(crate) fn reset(&self, thread_id: &str) {
        if let Some(mut session) = self.threads.get_mut(thread_id) {
            *session = Session::default();
        }
    }

    /// How many threads have a session (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }
}

/// Auto mode's view of the runtime's runs.
#[derive(Debug)]
pub(crate) struct SessionObserver(pub(crate) Arc<Sessions>);

impl RunObserver for SessionObserver {
    fn run_finished(&self, result: &AgentRunResult) {
        let Some(mut session) = self.0.threads.get_mut(&result.thread_id) else {
            return;
        };
        session.tokens = session.tokens.saturating_add(result.usage.total());
        if let Some(reports) = result.exported::<MetricsReports>() {
            session.reports.extend(reports);
        }
    }

    fn thread_cancelled(&self, thread_id: &str) -> bool {
        match self.0.running.get(thread_id) {
            Some(running) => {
                running.iter().for_each(|(_, token)| token.cancel());
                !running.is_empty()
            }
            None => false,
        }
    }

    fn thread_deleted(&self, thread_id: &str) {
        self.0.threads.remove(thread_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_threads_that_began_a_session_keep_one() {
        let sessions = Arc::new(Sessions::default());
        let observer = SessionObserver(sessions.clone());
        let mut plain = crate::run::tests_support::result("plain", 10);
        observer.run_finished(&plain);
        assert_eq!(sessions.len(), 0, "a plain thread keeps nothing");
        let (running, created) = sessions.begin("auto", "auto-1", CancellationToken::new());
        assert!(created);
        plain.thread_id = "auto".into();
        observer.run_finished(&plain);
        assert_eq!(sessions.tokens("auto"), 10);
        drop(running);
        assert!(
            !observer.thread_cancelled("auto"),
            "no auto_run in progress"
        );
        observer.thread_deleted("auto");
        assert_eq!(sessions.len(), 0);
    }
}
