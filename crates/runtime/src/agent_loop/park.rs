//! A run parked for approvals: it waits, with its deadline paused, until
//! every held call is decided (or a rule's timeout passes, or it is
//! cancelled), then runs exactly the decided calls and goes on.
//!
//! Between the park and the decided calls nothing runs again: no hook of
//! the round, no inference — the round's other calls already ran and their
//! results are in the history.

use std::sync::Arc;

use rein_runtime_contract::approval::{Decider, Decision, PendingApproval, PendingKind};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::lifecycle::StoppedReason;
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::{ToolCall, ToolResult};
use tokio::time::Instant;

use super::tools::{Ready, Results};
use super::{DeadlineWatchdog, Run};
use crate::approvals::{Held, Parked, ParkedRun, rejected_text};

impl Run {
    /// The run's parked state (made on its first park).
    fn parked_state(&self) -> Arc<Parked> {
        self.control
            .parked
            .get_or_init(|| Arc::new(Parked::default()))
            .clone()
    }

    /// Parks the run on `held` calls of `calls` and, once they are all
    /// decided, runs and records them. `Err` when the run ends while parked.
    pub(super) async fn park(
        &mut self,
        calls: &[ToolCall],
        held: Vec<(usize, Held)>,
    ) -> Result<(), TerminationReason> {
        let parked = self.parked_state();
        parked.hold(held.iter().map(|(_, h)| h.clone()).collect());
        self.announce_park(&held).await?;
        if let Some(reason) = self.try_let_go(&parked) {
            return Err(reason);
        }
        self.wait_and_run(calls, held, &parked).await
    }

    /// Lets go of the run's task if it was asked to and may: not when it
    /// is cancelled, a timeout is due, or every call is decided already
    /// (it goes on here then). `Some` ends the loop; `execute` hands the
    /// parked run over instead of finishing.
    fn try_let_go(&mut self, parked: &Parked) -> Option<TerminationReason> {
        if !self.release_when_parked || self.control.token.is_cancelled() {
            return None;
        }
        if parked
            .next_deadline()
            .is_some_and(|at| at <= Instant::now())
        {
            return None;
        }
        let taken = parked.let_go()?;
        let pending = parked.all().into_iter().map(|h| h.pending).collect();
        let mut run = ParkedRun::new(
            self.id.run_id.to_string(),
            self.id.thread_id.to_string(),
            self.id.agent_id.to_string(),
            pending,
        );
        for (call_id, decision, decider) in taken.decisions {
            if let Some(decider) = decider {
                run.deciders.push((call_id.clone(), decider));
            }
            run.decisions.push((call_id, decision));
        }
        run.timed_out = taken.timed_out;
        run.steps = self.steps;
        run.usage = self.usage;
        run.active = self.started.elapsed();
        self.rare().let_go = Some(Box::new(run));
        Some(TerminationReason::NaturalEnd)
    }

    /// Carries on a run parked elsewhere ([`ParkedRun`]): its thread's
    /// stored last round holds the calls it waits on; the decisions taken
    /// so far apply, and it waits for the rest here.
    pub(super) async fn resume_parked(
        &mut self,
        resumed: ParkedRun,
    ) -> Result<(), TerminationReason> {
        // The run's input is somewhere before: its task is taken to be
        // the thread's last user message.
        self.take_history().await?;
        self.steps = resumed.steps;
        self.usage = resumed.usage;
        let cannot = |why: String| {
            TerminationReason::Error(format!("the parked run could not be carried on: {why}"))
        };
        if let Some(p) = resumed
            .pending
            .iter()
            .find(|p| p.kind == PendingKind::Escalation)
            .cloned()
        {
            return match self
                .resume_escalation(p, resumed.decisions, &resumed.deciders)
                .await?
            {
                Some(message) => {
                    self.directives.user_messages.push(message);
                    Ok(())
                }
                // Nothing to tell the model after a final answer: it stands.
                None if self.answered() => {
                    if let Some(last) = self.request.messages.last() {
                        self.response = last.content.clone();
                    }
                    Err(TerminationReason::NaturalEnd)
                }
                None => Ok(()),
            };
        }
        let at = self
            .request
            .messages
            .iter()
            .rposition(|m| !m.tool_calls.is_empty())
            .ok_or_else(|| cannot("its thread has no round with tool calls".into()))?;
        let calls = self.request.messages[at].tool_calls.clone();
        let mut held = Vec::with_capacity(resumed.pending.len());
        for p in resumed.pending {
            let i = calls
                .iter()
                .position(|c| c.id == p.call_id)
                .ok_or_else(|| {
                    cannot(format!(
                        "call {} is not in its thread's last round",
                        p.call_id
                    ))
                })?;
            let parameters = self
                .agent
                .tools
                .get(&calls[i].name)
                .map(|t| t.descriptor().parameters)
                .unwrap_or_default();
            held.push((i, Held::resumed(p, &self.agent.gate, &calls[i], parameters)));
        }
        let parked = self.parked_state();
        parked.hold(held.iter().map(|(_, h)| h.clone()).collect());
        for (call_id, decision) in resumed.decisions {
            let decider = decider_of(&resumed.deciders, &call_id);
            if let Err(error) = parked.decide(&self.id.run_id, &call_id, decision, decider) {
                tracing::warn!(%error, call_id, "a stored decision was not applied");
            }
        }
        self.rare().parked_round = Some(at);
        // A rule's timeout that passed while no task waited applies now
        // (unless the run is carried on to end).
        if !self.control.token.is_cancelled() {
            let (_, stop) = parked.expire(Instant::now());
            if let Some(detail) = stop {
                self.rare().parked_pending = parked.pending();
                return Err(TerminationReason::stopped("approval_timeout", detail));
            }
        }
        // Still waiting: let go again (a cancel is handled here first).
        if let Some(reason) = self.try_let_go(&parked) {
            return Err(reason);
        }
        self.wait_and_run(&calls, held, &parked).await
    }

    /// Carries on a run parked on an escalation: the message the model is
    /// to see, if any.
    async fn resume_escalation(
        &mut self,
        pending: PendingApproval,
        decisions: Vec<(String, Decision)>,
        deciders: &[(String, Decider)],
    ) -> Result<Option<String>, TerminationReason> {
        let parked = self.parked_state();
        let reason = StoppedReason::new(
            pending.tool.clone(),
            pending.arguments["detail"].as_str().unwrap_or_default(),
        );
        let call_id = pending.call_id.clone();
        self.rare().escalations += 1;
        parked.hold(vec![Held::waiting(pending)]);
        for (id, decision) in decisions.into_iter().filter(|(id, _)| *id == call_id) {
            let decider = decider_of(deciders, &id);
            let _ = parked.decide(&self.id.run_id, &id, decision, decider);
        }
        if let Some(ending) = self.try_let_go(&parked) {
            return Err(ending);
        }
        self.answer_escalation(&parked, reason).await
    }

    /// Announces the park: the round so far stored, `approval_requested`
    /// per held call, `run_parked`.
    async fn announce_park(&mut self, held: &[(usize, Held)]) -> Result<(), TerminationReason> {
        // The thread shows the round so far (the other calls' results)
        // while the run waits.
        let at = self
            .request
            .messages
            .iter()
            .rposition(|m| !m.tool_calls.is_empty());
        self.rare().parked_round = at;
        self.persist().await?;
        for (_, h) in held {
            let p = &h.pending;
            self.emit(|| AgentEvent::ApprovalRequested {
                run_id: p.run_id.clone(),
                thread_id: p.thread_id.clone(),
                call_id: p.call_id.clone(),
                tool: p.tool.clone(),
                arguments: p.arguments.clone(),
                kind: p.kind,
                expires_at: p.expires_at.clone(),
            });
        }
        self.emit(|| AgentEvent::RunParked {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            pending: held
                .iter()
                .map(|(_, h)| {
                    let mut p = h.pending.clone();
                    p.root_run_id = self.control.root_run_id.as_deref().map(str::to_owned);
                    p
                })
                .collect(),
            steps: self.steps,
            usage: self.usage,
            active_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        tracing::debug!(calls = held.len(), "run parked for approvals");
        Ok(())
    }

    /// Waits for the decisions on `held` (deadline paused), then runs
    /// the decided calls.
    async fn wait_and_run(
        &mut self,
        calls: &[ToolCall],
        held: Vec<(usize, Held)>,
        parked: &Arc<Parked>,
    ) -> Result<(), TerminationReason> {
        self.wait_parked(parked).await?;
        let decided = self.run_decided(calls, parked.all(), held).await;
        if decided.is_ok()
            && let Some(rare) = &mut self.rare
        {
            rare.parked_round = None;
        }
        decided
    }

    /// Waits, with the deadline paused, until every held call is decided;
    /// `Err` when the run ends while parked.
    async fn wait_parked(&mut self, parked: &Parked) -> Result<(), TerminationReason> {
        // Parked time does not count toward the run's deadline nor its
        // `timeout` stop condition.
        let parked_at = Instant::now();
        self.watchdog = DeadlineWatchdog(None);
        let ended = self.wait_decisions(parked).await;
        let parked_for = parked_at.elapsed();
        self.started += parked_for;
        self.deadline = self.deadline.map(|d| d + parked_for);
        self.watchdog = DeadlineWatchdog::start(&self.control, self.deadline);
        if let Some(reason) = ended {
            self.rare().parked_pending = parked.pending();
            return Err(reason);
        }
        Ok(())
    }

    /// A detector's `escalate` step: parks the run for a person, who
    /// answers `continue` (`Ok`, with the message the model is to see, if
    /// any), `stop` or `take_over` (`Err`: the run ends).
    pub(super) async fn escalate(
        &mut self,
        reason: StoppedReason,
    ) -> Result<Option<String>, TerminationReason> {
        let parked = self.parked_state();
        let rare = self.rare();
        rare.escalations += 1;
        let escalation = rare.escalations;
        let mut pending = PendingApproval::new(
            &*self.id.run_id,
            &*self.id.thread_id,
            format!("escalation-{escalation}"),
            &reason.code,
            serde_json::json!({"code": reason.code, "detail": reason.detail}),
        );
        pending.kind = PendingKind::Escalation;
        let held = Held::waiting(pending);
        parked.hold(vec![held.clone()]);
        self.announce_park(std::slice::from_ref(&(0, held))).await?;
        // No call of a round waits: nothing to repair if it ends here.
        if let Some(rare) = &mut self.rare {
            rare.parked_round = None;
        }
        if let Some(ending) = self.try_let_go(&parked) {
            return Err(ending);
        }
        self.answer_escalation(&parked, reason).await
    }

    /// Waits for the answer to the escalation `parked` holds.
    async fn answer_escalation(
        &mut self,
        parked: &Parked,
        reason: StoppedReason,
    ) -> Result<Option<String>, TerminationReason> {
        self.wait_parked(parked).await?;
        let Some(held) = parked.all().into_iter().next() else {
            return Ok(None);
        };
        let decision = held
            .decision
            .unwrap_or(Decision::Continue { message: None });
        self.emit(|| AgentEvent::ApprovalDecided {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            call_id: held.pending.call_id.clone(),
            decision: decision.name().to_owned(),
            decided_by: held.decider.as_ref().and_then(|d| d.by.clone()),
            decided_at: held.decider.as_ref().map(|d| d.at.clone()),
        });
        match decision {
            Decision::Stop => Err(TerminationReason::Stopped(StoppedReason::new(
                reason.code,
                format!("{} (a person stopped the run)", reason.detail),
            ))),
            Decision::TakeOver => Err(TerminationReason::stopped(
                "taken_over",
                format!(
                    "a person took the thread over after {}: {}",
                    reason.code, reason.detail
                ),
            )),
            Decision::Continue { message } => Ok(message.filter(|m| !m.trim().is_empty())),
            // Refused by `Parked::decide` for an escalation.
            _ => Ok(None),
        }
    }

    /// Waits until every held call is decided (`None`), or the run ends
    /// while parked (the reason).
    async fn wait_decisions(&self, parked: &Parked) -> Option<TerminationReason> {
        loop {
            // A run carried on to be ended (cancelled, interrupted) ends
            // even if its decisions came in meanwhile.
            if self.control.token.is_cancelled() {
                return Some(self.cancelled_reason());
            }
            if parked.complete() {
                return None;
            }
            let next = parked.next_deadline();
            tokio::select! {
                biased;
                () = self.control.token.cancelled() => return Some(self.cancelled_reason()),
                () = parked.decided.notified() => {}
                () = sleep_until(next) => {
                    let (_, stop) = parked.expire(Instant::now());
                    if let Some(detail) = stop {
                        return Some(TerminationReason::stopped("approval_timeout", detail));
                    }
                }
            }
        }
    }

    /// Runs the decided calls: approved ones with their arguments, edited
    /// ones with the edited arguments; rejected and answered ones get their
    /// results. Records them all in call order.
    async fn run_decided(
        &mut self,
        calls: &[ToolCall],
        decided: Vec<Held>,
        held: Vec<(usize, Held)>,
    ) -> Result<(), TerminationReason> {
        let mut calls = calls.to_vec();
        let mut results: Results = smallvec::smallvec![None; calls.len()];
        let mut ready = Ready::new();
        let mut edited: Vec<usize> = Vec::new();
        for ((i, _), h) in held.iter().zip(&decided) {
            let (i, call_id) = (*i, &h.pending.call_id);
            let Some(decision) = &h.decision else {
                continue;
            };
            let name = if h.timed_out {
                "timeout"
            } else {
                decision.name()
            };
            self.emit(|| AgentEvent::ApprovalDecided {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                call_id: call_id.clone(),
                decision: name.to_owned(),
                decided_by: h.decider.as_ref().and_then(|d| d.by.clone()),
                decided_at: h.decider.as_ref().map(|d| d.at.clone()),
            });
            let tool = self.agent.tools.get(&calls[i].name).cloned();
            let answer = |content: String, is_error: bool| {
                Some(ToolResult {
                    call_id: call_id.clone(),
                    name: h.pending.tool.clone(),
                    content,
                    is_error,
                })
            };
            match (decision, tool) {
                (Decision::Approve, Some(tool)) => ready.push((i, tool)),
                (Decision::Edit { arguments }, Some(tool)) => {
                    calls[i].arguments = arguments.clone();
                    edited.push(i);
                    ready.push((i, tool));
                }
                (Decision::Reject { reason }, _) => {
                    results[i] = answer(rejected_text(reason.as_deref()), true);
                }
                (Decision::Respond { result }, _) => {
                    let text = match result {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    results[i] = answer(text, h.timed_out);
                }
                // The gate holds only calls of the agent's tools, and
                // escalation answers are refused for tool calls.
                (
                    Decision::Approve
                    | Decision::Edit { .. }
                    | Decision::Continue { .. }
                    | Decision::Stop
                    | Decision::TakeOver,
                    _,
                ) => {
                    results[i] = answer(format!("error: unknown tool \"{}\"", calls[i].name), true);
                }
            }
            if results[i].is_some() {
                self.started(&calls[i]);
            }
        }
        let first_incomplete = self.incomplete.len();
        let cut = self
            .execute_calls(
                &calls,
                ready,
                &mut results,
                self.control.token.is_cancelled(),
            )
            .await;
        for i in edited {
            if let Some(result) = &mut results[i] {
                result.content = format!(
                    "(run with arguments edited by a person: {})\n{}",
                    calls[i].arguments, result.content
                );
            }
        }
        let mut ending = None;
        self.record_results(&calls, results, first_incomplete, !cut, &mut ending)
            .await;
        if cut {
            return Err(self.cancelled_reason());
        }
        ending.map_or(Ok(()), Err)
    }
}

/// Who took the stored decision on `call_id` (a decision stored without
/// one is taken as known by nobody, now).
fn decider_of(deciders: &[(String, Decider)], call_id: &str) -> Decider {
    deciders
        .iter()
        .find(|(c, _)| c == call_id)
        .map_or_else(|| Decider::now(None), |(_, d)| d.clone())
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
