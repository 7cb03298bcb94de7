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

use crate::error::ServiceError;
use crate::records::Records;
use crate::settings::ServiceSettings;

/// The parts of a service both modes use.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) runtime: AgentRuntime,
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
}
