//! The context policy's steps in the loop: bringing the model's view up
//! to date before an inference (offloading, compaction, summaries in
//! passes, the token budget checked before spending) and recovering from
//! a provider's context-length error. What the view is and how it changes
//! lives in [`crate::context`]; this is when the loop asks for it.

use std::panic::AssertUnwindSafe;

use futures::{FutureExt, StreamExt};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::inference::{InferenceError, InferenceRequest, InferenceResponse};
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::Message;

use super::{MAX_SUMMARY_PASSES, Run, interrupted};
use crate::context::{Change, ContextWindow};
use crate::policies::{StopStatsKey, add_usage};
use crate::subagents::budget::Pool;

impl Run {
    /// Brings the model's view up to date before an inference: offloads
    /// new large results, compacts or summarizes when over the policy's
    /// thresholds, and refuses a call the token budget cannot pay for.
    pub(super) async fn prepare_context(&mut self) -> Option<TerminationReason> {
        let mut context = self.context.take()?;
        let reason = self.prepare(&mut context).await;
        self.context = Some(context);
        reason
    }

    /// [`prepare_context`](Self::prepare_context) for a window without a
    /// policy (a token budget alone), where nothing awaits: counts the new
    /// messages and checks the budget. `None` when the window has a view
    /// and needs the whole `prepare_context`.
    pub(super) fn prepare_counts(&mut self) -> Option<Option<TerminationReason>> {
        let context = self.context.as_mut()?;
        if !context.count_new(&self.request.messages) {
            return None;
        }
        Some(budget_verdict(
            context,
            self.usage.total(),
            self.pool.as_deref(),
            &mut self.reserved,
        ))
    }

    async fn prepare(&mut self, context: &mut ContextWindow) -> Option<TerminationReason> {
        context.sync(&self.request).await;
        // Compaction in steps of `compact.fraction`, oldest first, while
        // the prompt is still over `compact.at`.
        if let Some(keep) = context.compact_keep() {
            let fraction = context.compact_fraction();
            while context.compaction_due() {
                let Some(change) = context.compact(keep, fraction).await else {
                    break;
                };
                self.compacted(change, "threshold");
            }
        }
        // A history far over the window is summarized in passes (each
        // takes what fits one summarizing call).
        let mut passes = 0;
        while passes < MAX_SUMMARY_PASSES
            && context.summary_due()
            && let Some(keep) = context.summary_keep()
        {
            passes += 1;
            match self.summarize(context, keep).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(reason) => return Some(reason),
            }
        }
        let budget = context.budget?;
        let remaining = budget.saturating_sub(self.usage.total());
        if context.estimate() + context.setup.reserve > remaining
            && let Some(keep) = context.compact_keep()
            && let Some(change) = context.compact(keep.min(1), 1.0).await
        {
            self.compacted(change, "budget");
        }
        budget_verdict(
            context,
            self.usage.total(),
            self.pool.as_deref(),
            &mut self.reserved,
        )
    }

    fn compacted(&self, change: Change, trigger: &str) {
        self.emit(|| AgentEvent::ContextCompacted {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            before_tokens: change.before,
            after_tokens: change.after,
            references: change.count,
            trigger: trigger.to_owned(),
        });
    }

    /// Replaces the view's rounds before the last `keep` by a summary the
    /// summarizing model writes. The history is stored first. A failed
    /// summary changes nothing (logged); a cancel ends the run.
    async fn summarize(
        &mut self,
        context: &mut ContextWindow,
        keep: usize,
    ) -> Result<bool, TerminationReason> {
        let Some((model, executor)) = context.setup.summarizer.clone() else {
            return Ok(false);
        };
        let Some(plan) = context.summary_plan(keep, &self.request.messages) else {
            return Ok(false);
        };
        self.persist().await?;
        let prompt = context
            .setup
            .policy
            .as_ref()
            .and_then(|p| p.summarize.as_ref())
            .and_then(|s| s.prompt.clone())
            .unwrap_or_else(|| rein_runtime_contract::context::DEFAULT_SUMMARY_PROMPT.to_owned());
        let mut request = InferenceRequest::new(
            model.upstream_model.clone(),
            vec![Message::user(plan.transcript.clone())],
        )
        .with_system(prompt);
        request.temperature = model.temperature;
        request.max_output_tokens = model.max_output_tokens;
        let work = async {
            let mut stream = executor.open(&request).await?;
            let mut response = InferenceResponse::default();
            while let Some(delta) = stream.next().await {
                response.apply(delta?);
            }
            Ok::<InferenceResponse, InferenceError>(response)
        };
        let outcome = tokio::select! {
            biased;
            _ = interrupted(&self.control) => return Err(self.cancelled_reason()),
            outcome = AssertUnwindSafe(work).catch_unwind() => outcome,
        };
        let response = match outcome {
            Ok(Ok(response)) if !response.text.trim().is_empty() => response,
            Ok(Ok(_)) => {
                tracing::warn!(
                    run_id = &*self.id.run_id,
                    "the summary came back empty; the rounds stay"
                );
                return Ok(false);
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, run_id = &*self.id.run_id, "the summary failed; the rounds stay");
                return Ok(false);
            }
            Err(_) => {
                tracing::warn!(
                    run_id = &*self.id.run_id,
                    "the summarizing executor panicked; the rounds stay"
                );
                return Ok(false);
            }
        };
        self.pay_aside(&response);
        let Some(change) = context.apply_summary(&plan, &response.text) else {
            return Ok(false);
        };
        self.emit(|| AgentEvent::ContextSummarized {
            run_id: self.id.run_id.to_string(),
            thread_id: self.id.thread_id.to_string(),
            before_tokens: change.before,
            after_tokens: change.after,
            messages: change.count,
            usage: response.usage,
        });
        Ok(true)
    }

    /// Counts an inference made aside from the rounds (a summary, a model
    /// check) as the run's: its usage in the run's and in the totals the
    /// stop policies read, its cache usage.
    pub(super) fn pay_aside(&mut self, response: &InferenceResponse) {
        match response.usage {
            Some(usage) => {
                self.usage.add(usage);
                if let Some(stats) = self.state.slot_mut::<StopStatsKey>() {
                    add_usage(stats, usage);
                }
            }
            None => self.usage_complete = false,
        }
        if let Some(cache) = response.cache {
            self.cache_usage.get_or_insert_with(Box::default).add(cache);
        }
    }

    /// The provider refused the prompt as over its window: compact (and
    /// summarize) what can be, keeping only the last round, and retry the
    /// inference once. Ends the run with `context_window` when nothing
    /// can be reduced or the retry is refused too.
    pub(super) async fn recover_overflow(
        &mut self,
        error: &InferenceError,
    ) -> Option<TerminationReason> {
        let mut context = self.context.take()?;
        let mut reduced = false;
        if !self.overflow_retried {
            self.overflow_retried = true;
            if let Some(change) = context.compact(1, 1.0).await {
                self.compacted(change, "overflow");
                reduced = true;
            }
            match self.summarize(&mut context, 1).await {
                Ok(summarized) => reduced |= summarized,
                Err(reason) => {
                    self.context = Some(context);
                    return Some(reason);
                }
            }
        }
        let estimate = context.estimate();
        let window = context.setup.policy.as_ref().map(|p| p.window_tokens);
        self.context = Some(context);
        if reduced {
            // Numbered like any retry: the refused attempt is counted in
            // the failure streak.
            let attempt = self
                .state
                .get::<StopStatsKey>()
                .map_or(1, |s| s.consecutive_errors.max(1));
            self.emit(|| AgentEvent::InferenceRetry {
                run_id: self.id.run_id.to_string(),
                thread_id: self.id.thread_id.to_string(),
                attempt,
                error: error.to_string(),
                delay_ms: 0,
            });
            return None;
        }
        let window = window.map_or_else(
            || "no context policy to reduce it".to_owned(),
            |w| format!("a window of {w} tokens"),
        );
        Some(TerminationReason::stopped(
            "context_window",
            format!(
                "the prompt does not fit the model's context window even after compaction: about {estimate} tokens estimated for {window}; the provider said: {error}"
            ),
        ))
    }
}

/// Whether the token budget can pay for the next inference (the window's
/// estimate plus the reserve for the answer), reserving it in the tree's
/// pool when there is one (`reserved` gets the amount); the stop when not.
fn budget_verdict(
    context: &ContextWindow,
    used: u64,
    pool: Option<&Pool>,
    reserved: &mut u64,
) -> Option<TerminationReason> {
    let budget = context.budget?;
    let remaining = budget.saturating_sub(used);
    let reserve = context.setup.reserve;
    let prompt = context.estimate();
    let need = prompt + reserve;
    if need <= remaining
        && let Some(pool) = pool
    {
        // The tree's budget: reserved in every ancestor's pool, so
        // siblings running at once cannot pass it together.
        match pool.reserve(need) {
            Ok(()) => *reserved = need,
            Err(refused) => {
                return Some(TerminationReason::stopped(
                    "token_budget",
                    format!(
                        "the next inference was not sent: it would need about {need} tokens (a prompt of about {prompt} estimated + {reserve} reserved for the answer) but run \"{}\" has {} of its {}-token budget left for its whole tree",
                        refused.run_id,
                        refused.limit.saturating_sub(refused.used),
                        refused.limit
                    ),
                ));
            }
        }
    }
    (need > remaining).then(|| {
        TerminationReason::stopped(
            "token_budget",
            format!(
                "the next inference was not sent: it would need about {need} tokens (a prompt of about {prompt} estimated + {reserve} reserved for the answer) but {remaining} of the {budget}-token budget remain ({used} used), so it would exceed the budget by about {}",
                need - remaining
            ),
        )
    })
}
