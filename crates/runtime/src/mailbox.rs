//! The mailbox: submit input to a thread, interrupting its active run.
//!
//! Submissions to one thread are serialized by a per-thread async lock. A
//! submission is first checked in full — the runtime is up, the agent
//! exists, the input keeps the history valid, the conversation is not
//! empty — and only a submission that will start may interrupt: it cancels
//! the thread's active run (cause `Interrupted`), waits for it to release
//! the thread — by then its history is repaired and stored — and starts a
//! new run with the full history plus the new input.
//!
//! **Invariant:** a submission that fails its checks interrupts nothing.
//!
//! **Invariant:** the per-thread lock's map entry is removed once no
//! submission holds or awaits it, also when a `submit` future is dropped.
//!
//! **Invariant 4:** a submitted message is appended to the history exactly
//! once, by the run it starts, before that run's first inference; a
//! submission that fails (`PreviousRunStuck`, unknown agent, shut down)
//! appends nothing.

use std::sync::Arc;

use rein_runtime_contract::event::CancelCause;
use tokio::task::JoinHandle;

use crate::active_runs::RunControl;
use crate::run::{AgentRunResult, RunExit, RunRequest};
use crate::runtime::{Inner, RuntimeError, StartError};
use crate::stream::RunStream;

/// Submits input to threads. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Mailbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

impl Mailbox {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// Starts a run of `request` on its thread, first interrupting and
    /// awaiting the thread's active run if there is one. Returns once the
    /// new run has started.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::PreviousRunStuck`] when the active run does not release
    /// the thread within the cancel-wait bound (nothing is appended). These
    /// are found before anything is interrupted: an unknown or missing agent
    /// id, [`RuntimeError::ShutDown`], [`RuntimeError::InvalidInput`],
    /// [`RuntimeError::EmptyConversation`].
    ///
    /// # Cancel safety
    ///
    /// Dropped before it returns, no run is started by this call and nothing
    /// is appended (an active run it already interrupted stays cancelled).
    /// The returned handle may be dropped: the run goes on unobserved.
    pub async fn submit(&self, request: RunRequest) -> Result<RunHandle, RuntimeError> {
        let thread_id = request.thread_id.clone();
        // Declared first, dropped last: after the lock's guard and this
        // submission's reference to it are gone, also when the future is
        // dropped.
        let _cleanup = LockCleanup {
            inner: &self.inner,
            thread_id: &thread_id,
        };
        let lock = self
            .inner
            .mailbox_locks
            .entry(thread_id.clone())
            .or_default()
            .clone();
        let _serial = lock.lock().await;
        self.submit_serialized(request).await
    }

    /// Like [`submit`](Self::submit), and the run's events as a stream
    /// (see [`RunStream`]); they also go to the sink the run would have
    /// had (the request's, else the runtime's default).
    ///
    /// # Errors
    ///
    /// As for [`submit`](Self::submit).
    ///
    /// # Cancel safety
    ///
    /// As for [`submit`](Self::submit) until it returns; dropping the
    /// returned stream before it ended cancels the run (cause `Requested`),
    /// unlike dropping a [`RunHandle`].
    pub async fn submit_stream(&self, mut request: RunRequest) -> Result<RunStream, RuntimeError> {
        let (events, cancellation) =
            RunStream::prepare(&mut request, &self.inner.config.default_sink);
        let handle = self.submit(request).await?;
        let run_id = handle.control().run_id.clone();
        Ok(RunStream::new(
            run_id,
            events,
            cancellation,
            Box::pin(handle.wait()),
        ))
    }

    async fn submit_serialized(&self, mut request: RunRequest) -> Result<RunHandle, RuntimeError> {
        // Validate everything first: only a submission that will start may
        // interrupt the active run.
        self.inner.check(&request)?;
        self.inner.check_conversation(&request).await?;
        let run_id = match &request.run_id {
            Some(id) => id.clone(),
            None => self.inner.next_run_id(),
        };
        loop {
            if let Some(active) = self.inner.registry.by_thread(&request.thread_id) {
                active.cancel(CancelCause::Interrupted {
                    by_run_id: run_id.to_string(),
                });
                if !active.wait_released(self.inner.config.cancel_wait).await {
                    return Err(RuntimeError::PreviousRunStuck {
                        thread_id: request.thread_id,
                        run_id: active.run_id.to_string(),
                    });
                }
            }
            match self.inner.start(request, None, Some(run_id.clone())) {
                Ok(handle) => return Ok(handle),
                // A run started directly with `run` took the thread in between.
                Err(StartError::Busy(back)) => request = *back,
                Err(StartError::Other(e)) => return Err(e),
            }
        }
    }
}

/// Removes a thread's submission lock from the map once nobody holds or
/// awaits it. Runs when `submit` returns or its future is dropped, after
/// the submission's own reference to the lock is gone.
struct LockCleanup<'a> {
    inner: &'a Inner,
    thread_id: &'a str,
}

impl Drop for LockCleanup<'_> {
    fn drop(&mut self) {
        // Every submitter drops its reference before it checks, so the
        // last one to check sees only the map's. Anyone who cloned the lock
        // since holds a second reference; the map's shard lock makes the
        // check and the removal atomic with respect to that clone.
        self.inner
            .mailbox_locks
            .remove_if(self.thread_id, |_, l| Arc::strong_count(l) == 1);
    }
}

/// A handle to a started run: its id, a way to cancel it, and its result.
#[derive(Debug)]
pub struct RunHandle {
    control: Arc<RunControl>,
    task: JoinHandle<AgentRunResult>,
}

impl RunHandle {
    pub(crate) fn new(control: Arc<RunControl>, task: JoinHandle<AgentRunResult>) -> Self {
        Self { control, task }
    }

    pub(crate) fn control(&self) -> &Arc<RunControl> {
        &self.control
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.control.run_id
    }

    /// Cancels the run (cause `Requested`); it ends `Cancelled`.
    pub fn cancel(&self) {
        self.control.cancel(CancelCause::Requested);
    }

    /// Waits for the run to end.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::RunTaskFailed`] if the run's task was aborted or
    /// failed outside the loop (e.g. the tokio runtime shut down).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel the run; the result is lost.
    pub async fn wait(self) -> Result<AgentRunResult, RuntimeError> {
        let run_id = self.control.run_id.to_string();
        match self.wait_or_parked().await? {
            RunExit::Finished(result) => Ok(*result),
            RunExit::Parked(_) => Err(RuntimeError::RunParked { run_id }),
        }
    }

    /// Waits for the run to end or, for a run started with
    /// [`RunRequest::release_when_parked`](crate::RunRequest::release_when_parked),
    /// to park and let go of its task.
    ///
    /// # Errors
    ///
    /// As for [`wait`](Self::wait).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel the run; the result (or the
    /// parked run to carry on) is lost.
    pub async fn wait_or_parked(self) -> Result<RunExit, RuntimeError> {
        let result = self.task.await.map_err(|e| RuntimeError::RunTaskFailed {
            run_id: self.control.run_id.to_string(),
            message: e.to_string(),
        })?;
        Ok(match self.control.take_let_go() {
            Some(parked) => RunExit::Parked(parked),
            None => RunExit::Finished(Box::new(result)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::FutureExt;
    use rein_providers::{ScriptedExecutor, ScriptedResponse};
    use rein_runtime_contract::message::Message;
    use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
    use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};

    use crate::{AgentRuntimeBuilder, RunRequest};

    /// Never returns and ignores its token: its run never lets go.
    struct Stuck(Arc<tokio::sync::Notify>);

    #[async_trait::async_trait]
    impl Tool for Stuck {
        fn descriptor(&self) -> ToolDescriptor {
            ToolDescriptor::new("stuck", "never returns")
        }
        async fn execute(
            &self,
            _args: serde_json::Value,
            _ctx: &ToolContext,
        ) -> Result<ToolOutput, ToolError> {
            self.0.notify_one();
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn dropped_submit_futures_leave_no_lock_entry_behind() {
        let entered = Arc::new(tokio::sync::Notify::new());
        let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_call(
            "stuck",
            serde_json::json!({}),
        )]);
        let runtime = AgentRuntimeBuilder::new()
            .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
            .with_model(ModelSpec::new("m", "p", "x"))
            .with_provider("p", Arc::new(model))
            .with_tool("stuck", Arc::new(Stuck(entered.clone())))
            .with_cancel_wait_timeout(Duration::from_secs(3600))
            .build()
            .unwrap();
        let request = || RunRequest::new("t", vec![Message::user("go")]);
        let sink = Arc::new(rein_runtime_contract::event::NullSink);
        let mut stuck = runtime.run(request(), sink).boxed();
        let mailbox = runtime.mailbox();
        // Let the stuck run take the thread.
        tokio::select! {
            _ = entered.notified() => {}
            _ = &mut stuck => unreachable!("the run never ends"),
        }
        // The first submission holds the lock, waiting for the stuck run;
        // a hundred more wait for the lock. Poll each once, then drop all.
        let mut first = mailbox.submit(request()).boxed();
        assert!((&mut first).now_or_never().is_none());
        for _ in 0..100 {
            let mut waiting = mailbox.submit(request()).boxed();
            assert!((&mut waiting).now_or_never().is_none());
        }
        drop(first);
        assert_eq!(runtime.inner_for_tests().mailbox_locks.len(), 0);
        drop(stuck);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_submitters_leave_no_lock_entry_behind() {
        let model = ScriptedExecutor::from_fn(|_| ScriptedResponse::text("ok"));
        let runtime = AgentRuntimeBuilder::new()
            .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
            .with_model(ModelSpec::new("m", "p", "x"))
            .with_provider("p", Arc::new(model))
            .build()
            .unwrap();
        for round in 0..20 {
            let mut tasks = Vec::new();
            for i in 0..16 {
                let mailbox = runtime.mailbox();
                tasks.push(tokio::spawn(async move {
                    let thread = format!("t{}", i % 3);
                    let request = RunRequest::new(thread, vec![Message::user("go")]);
                    let handle = mailbox.submit(request).await.unwrap();
                    handle.wait().await.unwrap();
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(
                runtime.inner_for_tests().mailbox_locks.len(),
                0,
                "round {round}"
            );
        }
    }
}
