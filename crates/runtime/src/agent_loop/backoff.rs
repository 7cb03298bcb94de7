//! The wait between retried inferences: exponential from a base, capped,
//! and overridden by a provider's `retry_after`.

use std::time::Duration;

use rein_runtime_contract::inference::InferenceError;

/// The longest wait a provider's `retry_after` can impose.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Exponential backoff between retried inferences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryBackoff {
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

impl RetryBackoff {
    /// The wait before retrying after the `attempt`-th failure in a row
    /// (from 1): the provider's `retry_after` (at most 60 s) when given,
    /// else `base × 2^(attempt-1)`, at most `cap`.
    pub(crate) fn delay(&self, attempt: u32, error: &InferenceError) -> Duration {
        if let Some(after) = error.retry_after() {
            return after.min(MAX_RETRY_AFTER);
        }
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        let b = RetryBackoff::default();
        let e = InferenceError::server("x");
        let delays: Vec<_> = (1..=8).map(|a| b.delay(a, &e).as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(b.delay(200, &e), Duration::from_secs(30));
    }

    #[test]
    fn retry_after_is_honoured_up_to_sixty_seconds() {
        let b = RetryBackoff::default();
        let soon = InferenceError::rate_limited("x", Some(Duration::from_secs(3)));
        let late = InferenceError::rate_limited("x", Some(Duration::from_secs(600)));
        assert_eq!(b.delay(1, &soon), Duration::from_secs(3));
        assert_eq!(b.delay(1, &late), MAX_RETRY_AFTER);
    }
}
