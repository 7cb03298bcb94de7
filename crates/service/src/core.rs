//! [`Core`]: what both modes share — the runtime, this process's run
//! records, the settings, the shutdown flag, and the background loops.
//!
//! **Invariant:** every background loop (the retention sweeper, a
//! distributed mode's heartbeat, listener and scans) is started through
//! [`Core::every`] or [`Core::background`], ends when the service closes,
//! and is awaited by [`Core::stop_background`], so nothing of the service
//! runs after `Service::shutdown` returns.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rein_runtime::approvals::{ApprovalError, Decided};
use rein_runtime::{AgentRuntime, RunRequest};
use rein_runtime_contract::CancellationToken;
use rein_runtime_contract::approval::{Decision, PendingApproval};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::message::Message;
use tokio_util::task::TaskTracker;

use crate::auto::{AgentAuto, ThreadAuto};
use crate::error::ServiceError;
use crate::mode::Mode;
use crate::records::{Records, RunEntry};
use crate::settings::ServiceSettings;
use crate::submission::{Strategy, Submission};

/// The parts of a service both modes use.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) runtime: AgentRuntime,
    /// Auto mode's thread totals and defaults, in-process mode.
    pub(crate) autos: crate::auto::InMemory,
    /// The agents' auto-mode defaults (from the deployment file).
    pub(crate) agent_autos: std::sync::RwLock<std::collections::HashMap<String, AgentAuto>>,
    pub(crate) records: Arc<Records>,
    pub(crate) settings: ServiceSettings,
    /// Cancelled when the service shuts down.
    pub(crate) closing: CancellationToken,
    shutting_down: AtomicBool,
    loops: TaskTracker,
}

impl Core {
    pub(crate) fn new(runtime: AgentRuntime, settings: ServiceSettings) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            autos: crate::auto::InMemory::default(),
            agent_autos: std::sync::RwLock::default(),
            records: Arc::new(Records::new(settings.retention)),
            settings,
            closing: CancellationToken::new(),
            shutting_down: AtomicBool::new(false),
            loops: TaskTracker::new(),
        })
    }

    /// The answer to a decision on `call_id` of `entry`'s run that is no
    /// longer pending: the same decision as the one logged is `repeated`,
    /// another is `already_decided`; a call never decided is unknown.
    pub(crate) fn decided_before(
        entry: &crate::records::RunEntry,
        call_id: &str,
        decision: &Decision,
    ) -> Result<Decided, ServiceError> {
        let (events, _) = entry.events_after(0);
        let logged = events.iter().find_map(|e| match e.event() {
            Some(AgentEvent::ApprovalDecided {
                call_id: id,
                decision,
                ..
            }) if id == call_id => Some(decision.clone()),
            _ => None,
        });
        match logged {
            Some(first) if first == decision.name() => Ok(Decided::repeated(call_id, decision)),
            Some(first) => Err(ApprovalError::AlreadyDecided {
                call_id: call_id.to_owned(),
                decision: first,
            }
            .into()),
            None => Err(ApprovalError::UnknownApproval {
                run_id: entry.run_id.clone(),
                call_id: call_id.to_owned(),
            }
            .into()),
        }
    }

    /// Whether a pending call on `thread` (or on a sub-agent's thread
    /// under it) is listed when the thread is asked for.
    pub(crate) fn on_thread(pending: &PendingApproval, thread: Option<&str>) -> bool {
        thread.is_none_or(|t| {
            pending.thread_id == t
                || pending
                    .thread_id
                    .strip_prefix(t)
                    .is_some_and(|rest| rest.starts_with(':'))
        })
    }

    /// Cancels a run driven here: through its parent token, or for a
    /// sub-agent's run (whose token is a child of its parent's tool call),
    /// through the runtime.
    pub(crate) fn cancel_entry(&self, entry: &crate::records::RunEntry) {
        entry.supersede(crate::records::Superseded::Cancelled);
        entry.cancellation().cancel();
        if entry.parent().is_some() {
            self.runtime.cancel_run(&entry.run_id);
        }
    }

    /// Whether shutdown has begun (no new runs start).
    pub(crate) fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Ends the live tails and every background loop, and waits for them.
    pub(crate) async fn stop_background(&self) {
        self.closing.cancel();
        self.loops.close();
        self.loops.wait().await;
    }

    /// The cancel-wait bound.
    pub(crate) fn cancel_wait(&self) -> Duration {
        Duration::from_millis(self.settings.cancel_wait_ms)
    }

    /// Runs `task` in the background until it ends or the service closes.
    pub(crate) fn background(&self, task: impl Future<Output = ()> + Send + 'static) {
        let closing = self.closing.clone();
        self.loops.spawn(async move {
            tokio::select! {
                _ = closing.cancelled() => {}
                _ = task => {}
            }
        });
    }

    /// Runs `tick` on `owner` every `period` until the service closes or
    /// `owner` is dropped (a loop never keeps its owner alive).
    pub(crate) fn every<T, F, Fut>(&self, period: Duration, owner: Weak<T>, mut tick: F)
    where
        T: Send + Sync + 'static,
        F: FnMut(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        self.background(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(owner) = owner.upgrade() else {
                    return;
                };
                tick(owner).await;
            }
        });
    }

    /// The submission as a run request checked by the runtime (agent,
    /// messages, thread), with the id of the agent that will run it.
    pub(crate) async fn checked_request(
        &self,
        thread_id: &str,
        agent_id: Option<&str>,
        messages: Vec<Message>,
    ) -> Result<(RunRequest, String), ServiceError> {
        let mut request = RunRequest::new(thread_id, messages);
        if let Some(agent) = agent_id {
            request = request.with_agent_id(agent);
        }
        self.runtime.check_request(&request).await?;
        let agent_id = self
            .runtime
            .agent_spec(agent_id)
            .map(|spec| spec.id.clone())
            .unwrap_or_default();
        Ok((request, agent_id))
    }

    /// The agent's auto-mode defaults, if the deployment gave it any.
    pub(crate) fn agent_auto(&self, agent_id: &str) -> Option<AgentAuto> {
        self.agent_autos
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(agent_id)
            .cloned()
    }

    /// The auto-mode session a run starts, by the precedence in
    /// [`crate::auto`] (the request's mode and policy, the thread's
    /// defaults, the agent's); `None` for a single run.
    pub(crate) fn resolve_rounds(
        &self,
        agent_id: Option<&str>,
        request: &crate::auto::AutoRequest,
        thread: &ThreadAuto,
        session_id: String,
    ) -> Option<rein_runtime::auto::AutoRounds> {
        let agent_id = self
            .runtime
            .agent_spec(agent_id)
            .map(|spec| spec.id.clone());
        let agent = agent_id.as_deref().and_then(|id| self.agent_auto(id));
        let policy = crate::auto::resolve(
            request.run_mode,
            request.automation_policy.as_ref(),
            thread,
            agent.as_ref(),
        )?;
        Some(rein_runtime::auto::AutoRounds::new(
            &self.runtime,
            agent_id.as_deref(),
            session_id,
            policy,
        ))
    }

    /// Ends an auto-mode round (a run whose entry carries a session):
    /// adds its tokens and reports to the thread's totals, decides, submits
    /// the next round or ends the session, sends the progress to the
    /// thread's tail and puts the round's part in its record. Does nothing
    /// for other runs.
    pub(crate) async fn end_round(
        &self,
        mode: &dyn Mode,
        entry: &Arc<RunEntry>,
        result: &rein_runtime::AgentRunResult,
    ) {
        let Some(rounds) = entry.take_rounds() else {
            return;
        };
        let reports = crate::auto::reports_of(result);
        let superseded = entry.superseded().or_else(|| {
            entry
                .cancellation()
                .is_cancelled()
                .then_some(crate::records::Superseded::Cancelled)
        });
        // A dropped thread's totals are gone (`/new`, delete): nothing adds
        // to them again.
        let totals = if superseded == Some(crate::records::Superseded::Dropped) {
            Ok(ThreadAuto::default())
        } else {
            mode.add_to_session(&entry.thread_id, result.usage.total(), &reports)
                .await
        };
        let mut end = match &totals {
            Ok(totals) => crate::auto::end_round(&self.runtime, rounds, result, totals),
            Err(e) => {
                let mut end =
                    crate::auto::end_round(&self.runtime, rounds, result, &ThreadAuto::default());
                end.stop_instead(format!(
                    "run error: the session's totals could not be stored: {e}"
                ));
                end
            }
        };
        // Cancelled or interrupted (also just after its end): no next
        // round, whatever the round's own end said.
        if superseded.is_some() {
            end.stop_instead("cancelled".to_owned());
        }
        if let Some((message, next)) = end.next.clone() {
            let submission = Submission {
                agent_id: Some(entry.agent_id.clone()).filter(|a| !a.is_empty()),
                messages: vec![message],
                strategy: Strategy::Enqueue,
                ..Submission::default()
            };
            match mode
                .submit_round(&entry.thread_id, submission, next, &entry.run_id)
                .await
            {
                Ok(Some(submitted)) => {
                    end.next = None;
                    end.record.next_run_id = Some(submitted.entry().run_id.clone());
                }
                // Overtaken by a client (see `Mode::submit_round`).
                Ok(None) => end.stop_instead("cancelled".to_owned()),
                Err(e) => end.stop_instead(format!(
                    "run error: the next round could not be submitted: {e}"
                )),
            }
        }
        for event in end.events {
            self.records.send_to_tail(&entry.thread_id, event);
        }
        entry.set_auto(end.record);
    }
}
