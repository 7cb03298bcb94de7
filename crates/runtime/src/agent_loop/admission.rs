//! Admission to a limited provider before each inference: the run reserves
//! one request and its prompt's estimate plus the output reserve, waiting
//! in line (cancellably, with a `rate_limited` event) while the provider's
//! limits are used up; the answer's usage settles the reservation, and a
//! 429 pauses the provider for every run.

use std::time::Duration;

use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::inference::{InferenceError, InferenceErrorKind};

use super::{Run, emit_guarded};
use crate::limits::{DEFAULT_OUTPUT_RESERVE, Refused};

impl Run {
    /// Reserves room for the next inference on the agent's provider, when
    /// it has limits. `Err(None)`: cancelled while waiting (nothing sent);
    /// `Err(Some(error))`: the limits' ledger failed.
    pub(super) async fn admit(&mut self) -> Result<(), Option<InferenceError>> {
        let Some(gate) = self.gate().cloned() else {
            return Ok(());
        };
        let tokens = match &self.context {
            Some(context) if gate.counts_tokens() => {
                let reserve = match context.setup.reserve {
                    0 => DEFAULT_OUTPUT_RESERVE,
                    n => n,
                };
                context.estimate() + reserve
            }
            _ => 0,
        };
        let sink = self.events.then(|| self.sink.clone());
        let (run_id, thread_id) = (&self.id.run_id, &self.id.thread_id);
        let started = tokio::time::Instant::now();
        let mut waited = false;
        let admitted = gate
            .admit(tokens, &self.control.token, |wait| {
                waited = true;
                if let Some(sink) = &sink {
                    emit_guarded(
                        &**sink,
                        AgentEvent::RateLimited {
                            run_id: run_id.to_string(),
                            thread_id: thread_id.to_string(),
                            provider: gate.provider().to_owned(),
                            wait_ms: millis(wait),
                        },
                    );
                }
            })
            .await;
        let limited = self.limited.get_or_insert_with(Box::default);
        if waited {
            limited.waited.add(millis(started.elapsed()));
        }
        match admitted {
            Ok(permit) => {
                limited.permit = Some(permit);
                Ok(())
            }
            Err(Refused::Cancelled) => Err(None),
            Err(Refused::Ledger(error)) => Err(Some(InferenceError::new(
                InferenceErrorKind::Connection,
                format!(
                    "provider \"{}\" limits could not be checked: {error}",
                    gate.provider()
                ),
            ))),
        }
    }

    /// Settles the reservation of the inference that just ended with the
    /// tokens it used (`None`: unknown, the reservation stands); a refusal
    /// for rate (429, or any `Retry-After`) pauses the provider for every
    /// run.
    pub(super) async fn settle_limits(
        &mut self,
        used: Option<u64>,
        failed: Option<&InferenceError>,
    ) {
        let Some(permit) = self.limited.as_mut().and_then(|l| l.permit.take()) else {
            return;
        };
        let pause = failed.and_then(|e| match (e.kind(), e.retry_after()) {
            (_, Some(after)) => Some(after),
            (InferenceErrorKind::RateLimited, None) => Some(self.backoff.delay(1, e)),
            _ => None,
        });
        permit.settle(used).await;
        if let (Some(pause), Some(gate)) = (pause, self.gate())
            && pause > Duration::ZERO
        {
            gate.pause(pause).await;
        }
    }

    /// The run's waits so far, for its stop report.
    pub(super) fn rate_limited(
        &self,
    ) -> Option<Box<rein_runtime_contract::lifecycle::RateLimitedWait>> {
        self.limited
            .as_ref()
            .map(|l| l.waited)
            .filter(|w| w.waits > 0)
            .map(Box::new)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
