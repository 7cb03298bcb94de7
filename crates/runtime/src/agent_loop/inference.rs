//! One inference attempt and what follows it: the answer streams with the
//! judge watching the text (a verdict other than a warning cuts it), each
//! await raced against cancellation; then a failed attempt (the judge,
//! `AfterInference` hooks, the guard, the retry's backoff) or an answer
//! (statistics, hooks, the guard, the assistant message, the tool calls,
//! `StepEnd` hooks, the final answer judged).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use rein_runtime_contract::event::{AgentEvent, EventSink};
use rein_runtime_contract::inference::{
    InferenceDelta, InferenceError, InferenceErrorKind, InferenceResponse,
};
use rein_runtime_contract::lifecycle::{StoppedReason, TerminationReason};
use rein_runtime_contract::message::Message;
use rein_runtime_contract::phase::Phase;

use super::judge::{Act, Judge};
use super::{Focus, Run, emit_guarded, interrupted};
use crate::detectors::Verdict;
use crate::history;
use crate::phase::{Directives, RunIdentity, panic_message};
use crate::policies::StopStatsKey;
use crate::telemetry;

/// How many failures in a row, the last a connection failure, end a run
/// `error`: with the backoff between them, a provider that stays
/// unreachable for about 3.5 s. (A provider restarting answers in that
/// time; a wrong port or host never does.)
pub(crate) const CONNECTION_ATTEMPTS: u32 = 4;

/// How one inference attempt ended.
pub(super) enum Inference {
    Done(InferenceResponse),
    Failed(InferenceError),
    /// Cancelled (or past the deadline) mid-inference; the text streamed so far.
    Interrupted(InferenceResponse),
    /// A streaming detector fired (the judge acted on it already); the
    /// stream was dropped. The text so far.
    Cut(InferenceResponse),
}

/// The `detected` event of a detection that took the step `action`.
fn detected_event(id: &RunIdentity, reason: &StoppedReason, action: &str) -> AgentEvent {
    AgentEvent::Detected {
        run_id: id.run_id.to_string(),
        thread_id: id.thread_id.to_string(),
        code: reason.code.clone(),
        detail: reason.detail.clone(),
        action: action.to_owned(),
    }
}

/// How the loop acts on the judge's verdicts: a nudge joins the history
/// before the next inference (and the run goes on); the first stop
/// requested is the run's; a warning or denial is reported (`detected`).
pub(super) struct Acting<'a> {
    directives: &'a mut Directives,
    id: &'a RunIdentity,
    /// The sink, when it wants events.
    sink: Option<&'a Arc<dyn EventSink>>,
}

impl Act for Acting<'_> {
    fn stopping(&self) -> bool {
        self.directives.termination.is_some()
    }

    fn another_round(&self) -> bool {
        self.directives.another_round
    }

    fn act(&mut self, verdict: Verdict) {
        let (reason, action) = match verdict {
            Verdict::Nudge(text) => {
                self.directives.user_messages.push(text);
                self.directives.another_round = true;
                return;
            }
            Verdict::Stop(reason) => {
                self.directives
                    .termination
                    .get_or_insert(TerminationReason::Stopped(reason));
                return;
            }
            Verdict::Warn(reason) => (reason, "warn"),
            Verdict::Deny(reason) => (reason, "deny"),
            Verdict::Escalate(reason) => {
                // Another round, after the person's decision.
                self.directives.another_round = true;
                self.directives
                    .escalation
                    .get_or_insert_with(|| Box::new(reason.clone()));
                (reason, "escalate")
            }
        };
        if let Some(sink) = self.sink {
            emit_guarded(&**sink, detected_event(self.id, &reason, action));
        }
    }
}

impl Run {
    /// The judge and how the loop acts on its verdicts, borrowed together.
    pub(super) fn judge(&mut self) -> (&mut Judge, Acting<'_>) {
        let acting = Acting {
            directives: &mut self.directives,
            id: &self.id,
            sink: self.events.then_some(&self.sink),
        };
        (&mut self.judge, acting)
    }

    /// The built-in guard after an inference (`failed`: its error).
    fn guard(&mut self, failed: Option<&InferenceError>) {
        let Ok(stats) = self.state.get::<StopStatsKey>() else {
            return;
        };
        let mut acting = Acting {
            directives: &mut self.directives,
            id: &self.id,
            sink: self.events.then_some(&self.sink),
        };
        let failed = failed.map(|e| e as &dyn std::fmt::Display);
        let items = self.guard.as_deref().unwrap_or(&self.agent.guard);
        self.judge.guard(items, stats, failed, &mut acting);
    }

    /// Replaces the tokens reserved in the tree's pool for the inference
    /// that just ended by what it spent (`None`: unknown, the reservation
    /// stands).
    pub(super) fn settle_pool(&mut self, spent: Option<u64>) {
        let reserved = std::mem::take(&mut self.reserved);
        if let Some(pool) = &self.pool
            && reserved > 0
        {
            pool.settle(reserved, spent.unwrap_or(reserved));
        }
    }

    /// Streams one inference, racing every await against cancellation and
    /// the deadline.
    pub(super) async fn infer(&mut self) -> Inference {
        let executor = self.executor().clone();
        if let Some(context) = &mut self.context {
            context.sending();
            let (estimated_tokens, window_tokens) = (context.estimate(), context.window_tokens());
            self.emit(|| AgentEvent::PromptEstimated {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                step: self.steps,
                estimated_tokens,
                window_tokens,
            });
        }
        // Boxed, and only on a limited provider: the admission's state is
        // large, and every waiting run's future would hold room for it.
        // In a block of its own, so the admission's result does not stay
        // in this future while the model streams.
        {
            let admitted = match self.gate() {
                Some(_) => Box::pin(self.admit()).await,
                None => Ok(()),
            };
            match admitted {
                Ok(()) => {}
                Err(None) => return Inference::Interrupted(InferenceResponse::default()),
                Err(Some(error)) => return Inference::Failed(error),
            }
        }
        let span = telemetry::chat_span(
            self.model(),
            self.context
                .as_ref()
                .map_or(&self.request, |c| c.request(&self.request)),
            self.trace_content,
        );
        let mut partial = InferenceResponse::default();
        let mut cut = false;
        self.judge.start_response();
        let mut stopped = false;
        let (outcome, span) = {
            let request = match &self.context {
                Some(context) => context.request(&self.request),
                None => &self.request,
            };
            let sink = self.events.then_some(&self.sink);
            let id = &self.id;
            let token = &self.control.token;
            let partial = &mut partial;
            let judge = &mut self.judge;
            let watch = judge.watches_text();
            let mut acting = Acting {
                directives: &mut self.directives,
                id,
                sink,
            };
            let cut = &mut cut;
            let stopped = &mut stopped;
            let permit = self.limited.as_mut().and_then(|l| l.permit.as_mut());
            let work = AssertUnwindSafe(async move {
                let mut stream = executor.open(request).await?;
                // The provider answered: the request counts in its limits'
                // window from now.
                if let Some(permit) = permit {
                    permit.received();
                }
                while let Some(delta) = stream.next().await {
                    // A stream whose chunks are always ready never lets the
                    // select below poll the token, so check it per chunk:
                    // work between chunks never holds off a cancel.
                    if token.is_cancelled() {
                        *stopped = true;
                        break;
                    }
                    let delta = delta?;
                    let mut cut_here = false;
                    if let InferenceDelta::Text { text } = &delta {
                        if text.is_empty() {
                            continue;
                        }
                        if let Some(sink) = sink {
                            emit_guarded(
                                &**sink,
                                AgentEvent::TextDelta {
                                    run_id: id.run_id.to_string(),
                                    thread_id: id.thread_id.to_string(),
                                    delta: text.clone(),
                                },
                            );
                        }
                        // A warning is reported and the answer goes on;
                        // any other verdict cuts it.
                        cut_here = watch && judge.text(text, &mut acting);
                    }
                    partial.apply(delta);
                    if cut_here {
                        // Returning drops the stream: nothing more is read.
                        *cut = true;
                        break;
                    }
                }
                Ok::<(), InferenceError>(())
            })
            .catch_unwind();
            // A disabled span is cloned for free; an enabled one is shared.
            let work = telemetry::in_span(work, span.clone());
            let outcome = tokio::select! {
                biased;
                _ = interrupted(&self.control) => None,
                outcome = work => Some(outcome),
            };
            (outcome, span)
        };
        let content = self.trace_content;
        match &outcome {
            None => telemetry::record_chat_response(&span, &partial, "cancelled", content),
            Some(Ok(Ok(()))) => {
                let reason = match (stopped, cut, partial.tool_calls.is_empty()) {
                    (true, _, _) => "cancelled",
                    (false, true, _) => "cut",
                    (false, false, true) => "stop",
                    (false, false, false) => "tool_calls",
                };
                telemetry::record_chat_response(&span, &partial, reason, content);
            }
            Some(Ok(Err(error))) => telemetry::record_chat_error(&span, error),
            Some(Err(_)) => telemetry::record_chat_error(
                &span,
                &InferenceError::new(InferenceErrorKind::Other, "executor panicked"),
            ),
        }
        match outcome {
            None => Inference::Interrupted(partial),
            Some(Ok(Ok(()))) if stopped => Inference::Interrupted(partial),
            Some(Ok(Ok(()))) if cut => Inference::Cut(partial),
            Some(Ok(Ok(()))) => Inference::Done(partial),
            Some(Ok(Err(error))) => Inference::Failed(error),
            Some(Err(payload)) => Inference::Failed(InferenceError::new(
                InferenceErrorKind::Other,
                format!("executor panicked: {}", panic_message(payload.as_ref())),
            )),
        }
    }

    /// Handles a failed attempt: hooks and guard see it; retryable errors
    /// wait out the backoff. Returns the reason if the run ends here.
    pub(super) async fn after_failed_inference(
        &mut self,
        error: InferenceError,
    ) -> Option<TerminationReason> {
        // A failed attempt spent nothing the provider reports.
        self.settle_pool(Some(0));
        self.settle_limits(Some(0), Some(&error)).await;
        let at = self.started.elapsed();
        if let Some(stats) = self.state.slot_mut::<StopStatsKey>() {
            let mut acting = Acting {
                directives: &mut self.directives,
                id: &self.id,
                sink: self.events.then_some(&self.sink),
            };
            self.judge.failed(stats, at, &mut acting);
        }
        // Past its attempts, a failing model hands over to its next
        // fallback (the attempt was still a failed round, seen below).
        let fell_back = self.fall_back(&error);
        let focus = Focus {
            error: Some(&error),
            ..Focus::default()
        };
        if let Err(reason) = self.hooks(Phase::AfterInference, focus).await {
            return Some(reason);
        }
        self.guard(Some(&error));
        if let Some(reason) = self.termination() {
            return Some(reason);
        }
        if fell_back {
            return None;
        }
        // A refused attempt is a round like any failed one (counted above,
        // seen by hooks and policies); with a context policy it is then
        // answered by reducing the prompt and retrying once.
        if error.kind() == InferenceErrorKind::ContextOverflow
            && self
                .context
                .as_ref()
                .is_some_and(|c| c.setup.policy.is_some())
        {
            return Box::pin(self.recover_overflow(&error)).await;
        }
        if !error.is_retryable() {
            return Some(TerminationReason::Error(format!(
                "inference failed: {error}"
            )));
        }
        let attempt = self
            .state
            .get::<StopStatsKey>()
            .map(|s| s.consecutive_errors)
            .unwrap_or(1);
        // A provider that cannot be reached at all (refused, no route, no
        // such host) is not retried round after round until a limit says
        // `stopped`: after a few attempts the run ends `error`, naming it.
        if error.kind() == InferenceErrorKind::Connection && attempt >= CONNECTION_ATTEMPTS {
            let model = self.model();
            return Some(TerminationReason::Error(format!(
                "inference failed: provider \"{}\" (model \"{}\") could not be reached in {attempt} attempts: {error}",
                model.provider_id, model.upstream_model
            )));
        }
        let delay = self.backoff.delay(attempt, &error);
        self.emit(|| AgentEvent::InferenceRetry {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            attempt,
            error: error.to_string(),
            delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        });
        tracing::debug!(attempt, ?delay, %error, "retrying inference");
        tokio::select! {
            biased;
            _ = interrupted(&self.control) => Some(self.cancelled_reason()),
            _ = tokio::time::sleep(delay) => None,
        }
    }

    /// Handles a successful inference. Returns the reason if the run ends.
    pub(super) async fn after_inference(
        &mut self,
        response: InferenceResponse,
    ) -> Option<TerminationReason> {
        self.settle_pool(response.usage.map(|u| u.total()));
        self.settle_limits(response.usage.map(|u| u.total()), None)
            .await;
        match response.usage {
            Some(usage) => {
                self.usage.add(usage);
                self.emit(|| AgentEvent::RoundUsage {
                    run_id: self.id.run_id.to_string(),
                    thread_id: self.id.thread_id.to_string(),
                    step: self.steps,
                    usage,
                    model: self.model().id.clone(),
                });
                if let Some(context) = &self.context {
                    context.observe(usage.input_tokens);
                }
            }
            None => self.usage_complete = false,
        }
        if let Some(cache) = response.cache {
            self.cache_usage.get_or_insert_with(Box::default).add(cache);
        }
        self.overflow_retried = false;
        let at = self.started.elapsed();
        if let Some(stats) = self.state.slot_mut::<StopStatsKey>() {
            self.judge.answered(stats, &response, at);
        }
        // A per-request tool choice applies until the first successful inference.
        if self.request.tool_choice != self.agent.spec.tool_choice {
            self.request.tool_choice = self.agent.spec.tool_choice.clone();
        }
        let focus = Focus {
            inference: Some(&response),
            ..Focus::default()
        };
        let hooks = self.hooks(Phase::AfterInference, focus).await;
        self.guard(None);
        let InferenceResponse {
            text, tool_calls, ..
        } = response;
        self.response.clone_from(&text);
        let calls = if tool_calls.is_empty() {
            // An empty answer is not stored: some providers (Anthropic)
            // reject empty assistant content in every later request.
            if !text.is_empty() {
                self.push_history(Message::assistant(text));
            }
            Vec::new()
        } else {
            self.push_history(Message::assistant_with_tools(
                text,
                history::compact_calls(&tool_calls),
            ));
            tool_calls
        };
        if let Err(reason) = hooks {
            return Some(reason);
        }
        if let Some(reason) = self.termination() {
            return Some(reason);
        }
        // With a store that outlives the process, the calls are stored
        // before they run: a process lost mid-call leaves them open in the
        // history, for whoever runs the thread next to answer.
        if !calls.is_empty()
            && self.store.outlives_the_process()
            && let Err(reason) = self.persist().await
        {
            return Some(reason);
        }
        if !calls.is_empty()
            && let Err(reason) = self.run_tools(&calls).await
        {
            return Some(reason);
        }
        if let Err(reason) = self.hooks(Phase::StepEnd, Focus::default()).await {
            return Some(reason);
        }
        // A stop requested during the round ends it before the round is
        // stored: `finish` answers the calls that did not run, then stores.
        if let Some(reason) = self.termination() {
            return Some(reason);
        }
        if let Err(reason) = self.persist_round().await {
            return Some(reason);
        }
        if calls.is_empty() {
            // A final answer that asks the user something: stop (or nudge,
            // or warn) instead of ending naturally.
            let answer = std::mem::take(&mut self.response);
            let (judge, mut acting) = self.judge();
            judge.final_answer(&answer, &mut acting);
            self.response = answer;
        }
        // The conditions a model judges, once the round is stored.
        if self.checks.is_some()
            && let Err(reason) = Box::pin(self.model_checks(calls.is_empty())).await
        {
            return Some(reason);
        }
        if calls.is_empty() && !std::mem::take(&mut self.directives.another_round) {
            return Some(self.termination().unwrap_or(TerminationReason::NaturalEnd));
        }
        None
    }
}
