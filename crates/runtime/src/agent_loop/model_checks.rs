//! The stop conditions a model judges (`llm_loop_check`, `task_complete`;
//! their rules are in `detectors::model_checks`), sent after a round is
//! stored: paid for like an inference, raced against the run's cancel,
//! reported as `model_check` events, and acted on through the judge's
//! [`Act`](super::judge::Act) like every detector's verdict.
//!
//! # Cost
//!
//! A check's tokens count in the run's usage, its statistics (so
//! `token_budget` sees them) and its tree's pool. Before a check is sent,
//! its prompt is estimated (the agent's calibration) and the answer's
//! `max_output_tokens` reserved; a check the run's token budget or its
//! tree's pool cannot pay for is not sent (`skipped`). A check on a
//! provider with limits waits for them like an inference, and a 429 it
//! gets pauses that provider as an inference's does.
//!
//! # Failures
//!
//! A check is attempted at most twice, as Gemini CLI does: after an error
//! the request goes again in JSON mode, the schema alongside (some
//! OpenAI-compatible servers refuse the JSON-schema response format). A
//! second error, a panic in the executor or output that is not the
//! asked-for JSON is logged and reported (`failed`); the run goes on as if
//! the check had not been made. Only a cancel of the run ends it: the
//! check is dropped at once.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::TokenUsage;

use super::judge::Act;
use super::{Run, interrupted};
use crate::detectors::model_checks::{Answer, ModelCheck, Outcome, ask, task_of};

/// A run's model-judged conditions.
#[derive(Debug)]
pub(super) struct Checks {
    list: Vec<ModelCheck>,
    /// Where the run's input starts in the history: the user's task is
    /// its first user message.
    pub(super) task_from: usize,
}

impl Checks {
    /// The checks of the agent's `spec`, or `None` when it has none.
    pub(super) fn of(agent: &crate::agent::Agent) -> Option<Box<Self>> {
        if agent.checks.is_empty() {
            return None;
        }
        Some(Box::new(Self {
            list: ModelCheck::all(&agent.spec.stop_conditions, &agent.spec.escalation),
            task_from: 0,
        }))
    }
}

/// What one check came to, for its event.
struct Report {
    outcome: Outcome,
    answer: Option<Answer>,
    detail: String,
    usage: Option<TokenUsage>,
}

impl Run {
    /// The model checks due after the round just stored (`final_answer`:
    /// its answer called no tools), in list order, until one requests a
    /// stop or another round.
    ///
    /// # Cancel safety
    ///
    /// A cancel of the run drops the check in flight and returns the
    /// run's cancelled reason; nothing of the check is recorded.
    pub(super) async fn model_checks(
        &mut self,
        final_answer: bool,
    ) -> Result<(), TerminationReason> {
        let Some(mut checks) = self.checks.take() else {
            return Ok(());
        };
        let result = self.run_checks(&mut checks, final_answer).await;
        self.checks = Some(checks);
        result
    }

    async fn run_checks(
        &mut self,
        checks: &mut Checks,
        final_answer: bool,
    ) -> Result<(), TerminationReason> {
        for check in &mut checks.list {
            {
                let (_, acting) = self.judge();
                if acting.stopping() || acting.another_round() {
                    return Ok(());
                }
            }
            if !check.due(self.steps, final_answer) {
                continue;
            }
            let mut report = self.check(check, checks.task_from).await?;
            let model_id = self.agent.checks[check.index].model.id.clone();
            let verdict = match &report.answer {
                Some(answer) => {
                    let (outcome, verdict) = check.judge(&model_id, answer, final_answer);
                    report.outcome = outcome;
                    verdict
                }
                None => None,
            };
            match report.outcome {
                Outcome::Failed | Outcome::Skipped => tracing::warn!(
                    run_id = &*self.id.run_id,
                    code = check.code(),
                    model = model_id,
                    outcome = report.outcome.as_str(),
                    detail = report.detail,
                    "a model check failed or was not sent; the run goes on"
                ),
                _ => tracing::debug!(
                    run_id = &*self.id.run_id,
                    code = check.code(),
                    outcome = report.outcome.as_str(),
                    "model check"
                ),
            }
            self.emit(|| AgentEvent::ModelCheck {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                code: check.code().to_owned(),
                model_id,
                step: self.steps,
                outcome: report.outcome.as_str().to_owned(),
                confidence: report.answer.as_ref().map(|a| a.confidence),
                complete: report.answer.as_ref().and_then(|a| a.complete),
                detail: report.detail.clone(),
                usage: report.usage,
            });
            // Reported first, then acted on: a stop's `RunFinished` comes
            // after the check that caused it.
            if let Some(verdict) = verdict {
                let (_, mut acting) = self.judge();
                acting.act(verdict);
            }
        }
        Ok(())
    }

    /// Sends one check and reads its answer.
    async fn check(
        &mut self,
        check: &mut ModelCheck,
        task_from: usize,
    ) -> Result<Report, TerminationReason> {
        let route = self.agent.checks[check.index].clone();
        let history = &self.request.messages;
        let request = check.request(
            self.steps,
            history,
            task_of(history, task_from),
            &route.model,
        );
        let reserve = u64::from(request.max_output_tokens.unwrap_or_default());
        let need = self.agent.measure.calibration.estimate(&request) + reserve;
        if let Some(budget) = self.token_budget {
            let used = self.usage.total();
            let remaining = budget.saturating_sub(used);
            if need > remaining {
                return Ok(skipped(format!(
                    "not sent: it would need about {need} tokens but {remaining} of the {budget}-token budget remain ({used} used)"
                )));
            }
        }
        let mut reserved = 0;
        if let Some(pool) = &self.pool {
            if let Err(refused) = pool.reserve(need) {
                return Ok(skipped(format!(
                    "not sent: it would need about {need} tokens but run \"{}\" has {} of its {}-token budget left for its whole tree",
                    refused.run_id,
                    refused.limit.saturating_sub(refused.used),
                    refused.limit
                )));
            }
            reserved = need;
        }
        let permit = match &route.limits {
            Some(gate) => match gate.admit(need, &self.control.token, |_| {}).await {
                Ok(permit) => Some(permit),
                Err(crate::limits::Refused::Ledger(error)) => {
                    self.release(reserved, 0);
                    return Ok(failed(format!("the provider's limits failed: {error}")));
                }
                Err(_) => {
                    self.release(reserved, 0);
                    return Err(self.cancelled_reason());
                }
            },
            None => None,
        };
        check.sent();
        let executor = route.executor.clone();
        let work = ask(&*executor, &request);
        let outcome = tokio::select! {
            biased;
            _ = interrupted(&self.control) => {
                self.release(reserved, reserved);
                if let Some(permit) = permit {
                    permit.settle(None).await;
                }
                return Err(self.cancelled_reason());
            }
            outcome = AssertUnwindSafe(work).catch_unwind() => outcome,
        };
        let usage = match &outcome {
            Ok(Ok(response)) => response.usage,
            _ => None,
        };
        // An answer without usage keeps its reservation; a failure spent
        // nothing the run is told of.
        let spent = match &outcome {
            Ok(Ok(_)) => usage.map_or(reserved, |u| u.total()),
            _ => 0,
        };
        self.release(reserved, spent);
        if let Some(permit) = permit {
            let spent = match &outcome {
                Ok(Ok(_)) => usage.map(|u| u.total()),
                _ => Some(0),
            };
            permit.settle(spent).await;
            // The judge's provider said to wait: every run on it waits, as
            // after an inference's 429.
            let pause = match &outcome {
                Ok(Err(error)) => match (error.kind(), error.retry_after()) {
                    (_, Some(after)) => Some(after),
                    (rein_runtime_contract::inference::InferenceErrorKind::RateLimited, None) => {
                        Some(self.backoff.delay(1, error))
                    }
                    _ => None,
                },
                _ => None,
            };
            if let (Some(pause), Some(gate)) = (pause, &route.limits)
                && pause > std::time::Duration::ZERO
            {
                gate.pause(pause).await;
            }
        }
        let response = match outcome {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Ok(failed(format!("the model failed: {error}"))),
            Err(_) => return Ok(failed("the model's executor panicked".to_owned())),
        };
        // The run paid for it: budgets and `token_budget` count it.
        self.pay_aside(&response);
        let answer = match check.parse(&response.text) {
            Ok(answer) => answer,
            Err(problem) => {
                return Ok(Report {
                    usage,
                    ..failed(format!("malformed answer: {problem}"))
                });
            }
        };
        Ok(Report {
            // The caller judges the answer.
            outcome: Outcome::Clear,
            detail: answer.reasoning.clone(),
            answer: Some(answer),
            usage,
        })
    }

    /// Gives back the tree pool's `reserved` tokens, counting `spent`.
    fn release(&self, reserved: u64, spent: u64) {
        if let Some(pool) = &self.pool
            && reserved > 0
        {
            pool.settle(reserved, spent);
        }
    }
}

fn skipped(detail: String) -> Report {
    Report {
        outcome: Outcome::Skipped,
        answer: None,
        detail,
        usage: None,
    }
}

fn failed(detail: String) -> Report {
    Report {
        outcome: Outcome::Failed,
        answer: None,
        detail,
        usage: None,
    }
}
