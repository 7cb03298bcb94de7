//! One round's tool calls: `BeforeToolExecute` hooks in call order, the
//! calls run concurrently (one call on the run's own task, several as
//! spawned tasks), then results and `AfterToolExecute` hooks in call order.
//!
//! **Invariant:** every tool future has completed or been dropped before
//! [`Run::run_tools`] returns, so a run never releases its thread while one
//! of its tools still runs.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::lifecycle::{IncompleteToolCall, TerminationReason, ToolCallStatus};
use rein_runtime_contract::message::{ToolCall, ToolResult};
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::tool::{Tool, ToolContext};
use smallvec::SmallVec;
use tokio::task::{AbortHandle, JoinHandle};

use super::judge::Screened;
use super::{Focus, Run, interrupted};
use crate::active_runs::CURRENT_RUN;
use crate::approvals::{Gated, Held, denied_text};
use crate::phase::panic_message;
use crate::telemetry;

impl Run {
    pub(super) fn started(&self, call: &ToolCall) {
        self.emit(|| AgentEvent::ToolCallStarted {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }

    /// The future that runs one call: a panic becomes an error result. The
    /// call is registered with the run (its token, a child of the run's) so
    /// that [`cancel_tool_call`](crate::AgentRuntime::cancel_tool_call) can
    /// end it alone. A call stopped through its token returns its status
    /// with its result.
    fn tool_future(
        &self,
        tool: Arc<dyn Tool>,
        call: &ToolCall,
    ) -> impl Future<Output = CallOutcome> + Send + 'static + use<> {
        let token = self.control.token.child_token();
        self.control.call_started(&call.id, token.clone());
        let run = self.control.token.clone();
        let ctx = ToolContext::new(
            self.id.thread_id.to_string(),
            self.id.run_id.to_string(),
            call.id.clone(),
            token.clone(),
        );
        let args = call.arguments.clone();
        let (call_id, name) = (call.id.clone(), call.name.clone());
        let trace_content = self.trace_content;
        let span = telemetry::tool_span(&name, &call_id, &args, trace_content);
        let span_in = span.clone();
        let subagent = self.agent.subagents.get(&call.name).cloned();
        let call = async move {
            // A sub-agent call is not dropped on cancel: its child's token
            // is a child of the call's, so the child ends at once, and the
            // call ends after it (a run releases its thread after its
            // children released theirs).
            if let Some(subagent) = subagent {
                // Boxed: a child run's state is large, and only sub-agent
                // calls should carry it.
                let ended = Box::pin(subagent.call(&args, &ctx)).await;
                let error_type = ended.is_error.then_some("subagent");
                telemetry::record_tool_outcome(&span_in, error_type, &ended.content, trace_content);
                let result = ToolResult {
                    call_id,
                    name,
                    content: ended.content,
                    is_error: ended.is_error,
                };
                return (result, None);
            }
            let outcome = tokio::select! {
                biased;
                () = token.cancelled() => None,
                outcome = AssertUnwindSafe(tool.execute(args, &ctx)).catch_unwind() => Some(outcome),
            };
            let Some(outcome) = outcome else {
                // The call alone (`cancel_tool_call`), or the whole run.
                let status = status_of(tool.read_only());
                let content = if run.is_cancelled() {
                    cut_text(status)
                } else {
                    format!(
                        "cancelled by the user: this call was stopped before it finished; the run goes on — {status}: {}",
                        status.explanation()
                    )
                };
                telemetry::record_tool_outcome(
                    &span_in,
                    Some("cancelled"),
                    &content,
                    trace_content,
                );
                let result = ToolResult {
                    call_id,
                    name,
                    content,
                    is_error: true,
                };
                return (result, Some(status));
            };
            let mut status = None;
            let (content, error_type) = match outcome {
                Ok(Ok(output)) => (output.to_content(), None),
                Ok(Err(error)) => {
                    status = error.status();
                    let content = match status {
                        Some(s) => format!("error: {error} — {s}: {}", s.explanation()),
                        None => format!("error: {error}"),
                    };
                    (content, Some("tool_error"))
                }
                Err(payload) => (
                    format!(
                        "error: tool \"{name}\" panicked: {}",
                        panic_message(payload.as_ref())
                    ),
                    Some("panic"),
                ),
            };
            telemetry::record_tool_outcome(&span_in, error_type, &content, trace_content);
            let is_error = error_type.is_some();
            let result = ToolResult {
                call_id,
                name,
                content,
                is_error,
            };
            (result, status)
        };
        telemetry::in_span(call, span)
    }

    fn unknown_tool(&self, call: &ToolCall) -> ToolResult {
        let mut names: Vec<&str> = self.agent.tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: format!(
                "error: unknown tool \"{}\"; available tools: {}",
                call.name,
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
            is_error: true,
        }
    }

    /// Runs one response's tool calls concurrently and records their results
    /// in call order; calls the approval gate holds park the run after the
    /// others ran (see [`crate::approvals`]). Returns the reason if the run
    /// must end now.
    ///
    /// **Invariant:** every spawned tool future has completed or been
    /// dropped (aborted and awaited) before this returns.
    pub(super) async fn run_tools(&mut self, calls: &[ToolCall]) -> Result<(), TerminationReason> {
        let mut results: Results = smallvec::smallvec![None; calls.len()];
        let mut ready = Ready::with_capacity(calls.len());
        let mut held: Vec<(usize, Held)> = Vec::new();
        let mut ending: Option<TerminationReason> = None;
        for (i, call) in calls.iter().enumerate() {
            let focus = Focus {
                tool_call: Some(call),
                ..Focus::default()
            };
            if let Err(reason) = self.hooks(Phase::BeforeToolExecute, focus).await {
                ending = Some(reason);
                break;
            }
            if self.directives.termination.is_some() || self.control.token.is_cancelled() {
                break;
            }
            // A call a detector denied does not run (the judge does not
            // count it as run); one past the ladder's `deny` steps may stop
            // the run instead.
            let (judge, mut acting) = self.judge();
            match judge.screen(i, call, &mut acting) {
                Screened::Run => {}
                Screened::Denied(denial) => {
                    self.started(call);
                    results[i] = Some(ToolResult {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        content: denial.result(),
                        is_error: true,
                    });
                    let (judge, mut acting) = self.judge();
                    judge.refuse(denial, &mut acting);
                    continue;
                }
                Screened::Stop => break,
            }
            let Some(tool) = self.agent.tools.get(&call.name) else {
                self.started(call);
                results[i] = Some(self.unknown_tool(call));
                continue;
            };
            if self.agent.gate.is_open() {
                ready.push((i, tool.clone()));
                continue;
            }
            match self.agent.gate.check(call) {
                Gated::Run => ready.push((i, tool.clone())),
                Gated::Deny(rule) => {
                    self.started(call);
                    results[i] = Some(ToolResult {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        content: denied_text(rule),
                        is_error: true,
                    });
                }
                gated @ (Gated::Ask(_) | Gated::Question) => {
                    let ids = (self.id.run_id.as_ref(), self.id.thread_id.as_ref());
                    let parameters = tool.descriptor().parameters;
                    held.push((i, Held::new(ids, call, &gated, parameters)));
                }
            }
        }

        // Nothing starts once the run is cancelled or a hook failed: those
        // calls get "not run" results when the run finishes.
        let cut = ending.is_some() || self.control.token.is_cancelled();
        let first_incomplete = self.incomplete.len();
        let cut = self.execute_calls(calls, ready, &mut results, cut).await;
        let cancelled = cut && ending.is_none();
        let run_after_hooks = !cancelled && ending.is_none();
        self.record_results(
            calls,
            results,
            first_incomplete,
            run_after_hooks,
            &mut ending,
        )
        .await;
        if cancelled {
            return Err(self.cancelled_reason());
        }
        if ending.is_none() && !held.is_empty() {
            Box::pin(self.park(calls, held)).await?;
        }
        if ending.is_none() {
            let (judge, mut acting) = self.judge();
            judge.round_results(&mut acting);
        }
        ending.map_or(Ok(()), Err)
    }

    /// Runs the `ready` calls of `calls` concurrently (one on the run's own
    /// task), putting their results in `results`; nothing starts when `cut`.
    /// Returns whether the run was cut (cancelled) by the end.
    ///
    /// **Invariant:** every spawned tool future has completed or been
    /// dropped (aborted and awaited) before this returns.
    pub(super) async fn execute_calls(
        &mut self,
        calls: &[ToolCall],
        mut ready: Ready,
        results: &mut [Option<ToolResult>],
        mut cut: bool,
    ) -> bool {
        if !cut {
            for (i, _) in &ready {
                self.started(&calls[*i]);
            }
        }
        // Calls whose futures were dropped before they finished.
        let mut stopped: Vec<usize> = Vec::new();
        let first_incomplete = self.incomplete.len();
        if !cut && let Some(family) = self.control.family.get() {
            let left =
                (self.max_rounds > 0).then(|| self.max_rounds.saturating_sub(self.steps as usize));
            family.update(left, &self.request.messages);
        }
        if let ([(i, tool)], false) = (ready.as_slice(), cut) {
            // A single call runs on the run's own task: no spawn, no
            // cross-task wake-up. Dropping it on cancellation is what an
            // abort would do to a spawned task.
            //
            // The call's own token is a child of the run's, so the call's
            // future ends on the run's cancel by itself, with the result a
            // cut call gets (no second wait on the run's token).
            let i = *i;
            let (result, status) = self.tool_future(tool.clone(), &calls[i]).await;
            self.record_stopped(&result, status);
            results[i] = Some(result);
            cut = self.control.token.is_cancelled();
            ready.clear();
        }

        if !ready.is_empty() && !cut {
            // Boxed: several calls in one answer are the rarer case, and
            // their state stays out of every round's.
            cut = Box::pin(self.spawn_calls(calls, ready, results, &mut stopped)).await;
        }
        self.control.calls_ended();
        if let Some(family) = self.control.family.get() {
            // The children's usage is the run's too.
            for (child, usage) in family.round_ended() {
                self.usage.add(usage);
                self.rare().children.push(child);
            }
        }
        for i in stopped {
            results[i] = Some(self.cut_result(&calls[i]));
        }
        // The round's incomplete calls, in call order (they were recorded
        // as they ended).
        if self.incomplete.len() > first_incomplete {
            let at = |id: &str| calls.iter().position(|c| c.id == id);
            self.incomplete[first_incomplete..].sort_by_key(|c| at(&c.call_id));
        }
        cut
    }

    /// Runs `ready` (more than one call, nothing cut yet) as spawned tasks
    /// and waits for all, putting their results in `results` and the calls
    /// whose tasks were aborted in `stopped`. Returns whether the run was
    /// cancelled meanwhile.
    ///
    /// **Invariant:** every spawned task has completed or been aborted and
    /// awaited before this returns.
    async fn spawn_calls(
        &mut self,
        calls: &[ToolCall],
        ready: Ready,
        results: &mut [Option<ToolResult>],
        stopped: &mut Vec<usize>,
    ) -> bool {
        // Spawn the calls; wait for all; on cancellation (or a failed hook)
        // abort the rest and keep draining, so that each future has
        // completed or been dropped before the results are recorded.
        let run_id = self.control.run_id.clone();
        let pending: Vec<(usize, JoinHandle<CallOutcome>)> = ready
            .into_iter()
            .map(|(i, tool)| {
                let call = self.tool_future(tool, &calls[i]);
                (i, tokio::spawn(CURRENT_RUN.scope(run_id.clone(), call)))
            })
            .collect();
        let mut cut = false;
        // Sub-agent calls are not aborted: they end once their child did.
        let aborts: Vec<_> = pending
            .iter()
            .filter(|(i, _)| !self.agent.subagents.contains_key(&calls[*i].name))
            .map(|(_, h)| h.abort_handle())
            .collect();
        let mut running: FuturesUnordered<_> = pending
            .into_iter()
            .map(|(i, handle)| async move { (i, handle.await) })
            .collect();
        loop {
            tokio::select! {
                biased;
                _ = interrupted(&self.control), if !cut => {
                    cut = true;
                    aborts.iter().for_each(AbortHandle::abort);
                }
                next = running.next() => match next {
                    Some((i, Ok((result, status)))) => {
                        self.record_stopped(&result, status);
                        results[i] = Some(result);
                    }
                    Some((i, Err(_))) => stopped.push(i),
                    None => break,
                },
            }
        }
        cut
    }

    /// Records `results` in call order: `AfterToolExecute` hooks (while
    /// `run_after_hooks` and no hook failed; a failure goes to `ending`),
    /// `ToolCallFinished`, the judge, the history. Calls without a result
    /// are skipped.
    pub(super) async fn record_results(
        &mut self,
        calls: &[ToolCall],
        results: Results,
        first_incomplete: usize,
        run_after_hooks: bool,
        ending: &mut Option<TerminationReason>,
    ) {
        for (i, (call, result)) in calls.iter().zip(results).enumerate() {
            let Some(result) = result else { continue };
            if run_after_hooks && ending.is_none() {
                let focus = Focus {
                    tool_call: Some(call),
                    tool_result: Some(&result),
                    ..Focus::default()
                };
                if let Err(reason) = self.hooks(Phase::AfterToolExecute, focus).await {
                    *ending = Some(reason);
                }
            }
            self.emit(|| AgentEvent::ToolCallFinished {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                call_id: result.call_id.clone(),
                name: result.name.clone(),
                result: result.content.clone(),
                is_error: result.is_error,
            });
            let started = self.started;
            let (judge, mut acting) = self.judge();
            judge.tool_result(i, call, &result, || started.elapsed(), &mut acting);
            let mut message = result.into_message();
            if self.incomplete.len() > first_incomplete {
                message.tool_status = self.incomplete[first_incomplete..]
                    .iter()
                    .find(|c| c.call_id == call.id)
                    .map(|c| c.status);
            }
            self.push_history(message);
        }
    }
}

/// The calls of a round that are to run, by position. One inline: most
/// answers make one call, and a round allocates nothing for it.
pub(super) type Ready = SmallVec<[(usize, Arc<dyn Tool>); 1]>;

/// A round's results by call position (`None` until the call has one).
pub(super) type Results = SmallVec<[Option<ToolResult>; 1]>;

/// A call's result, and its status when its token stopped it or its tool
/// failed with an uncertain outcome.
type CallOutcome = (ToolResult, Option<ToolCallStatus>);

/// How a call stopped before it finished is recorded: `interrupted` for a
/// read-only tool, `may_have_completed` for any other.
fn status_of(read_only: bool) -> ToolCallStatus {
    if read_only {
        ToolCallStatus::Interrupted
    } else {
        ToolCallStatus::MayHaveCompleted
    }
}

/// The result text of a call the run's cancel stopped.
fn cut_text(status: ToolCallStatus) -> String {
    format!(
        "cancelled: the run was cancelled before this call finished — {status}: {}",
        status.explanation()
    )
}

impl Run {
    /// The result of a call stopped before it finished (its future was
    /// dropped or aborted), recorded as `interrupted` for a read-only tool
    /// and `may_have_completed` for any other.
    fn cut_result(&mut self, call: &ToolCall) -> ToolResult {
        let read_only = self
            .agent
            .tools
            .get(&call.name)
            .is_some_and(|t| t.read_only());
        let status = status_of(read_only);
        self.incomplete
            .push(IncompleteToolCall::new(&call.id, &call.name, status));
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: cut_text(status),
            is_error: true,
        }
    }

    /// Records a call that did not complete normally: its token stopped it,
    /// or its tool failed with an uncertain outcome (`status` is `Some`).
    fn record_stopped(&mut self, result: &ToolResult, status: Option<ToolCallStatus>) {
        if let Some(status) = status {
            self.incomplete.push(IncompleteToolCall::new(
                &result.call_id,
                &result.name,
                status,
            ));
        }
    }
}
