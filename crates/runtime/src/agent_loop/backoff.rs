//! The wait between retried inferences: exponential from a base, capped,
//! with equal jitter, and overridden by a provider's `retry_after`.
//!
//! Why jitter: runs that fail together (one provider outage, one rate
//! limit shared by many threads) would otherwise retry together, in
//! lockstep, at every step of the backoff. Why *equal* jitter (half the
//! ceiling fixed, the other half random) rather than full jitter (anywhere
//! from zero to the ceiling): a run's own retries still back off — the
//! shortest wait doubles with every failure — so a struggling provider is
//! never retried at once by chance, while concurrent runs still spread over
//! half the ceiling.
//!
//! It does not own when a retry happens or whether the wait is cut short
//! (cancellation, deadlines): the agent loop does.

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
    /// (from 1): the provider's `retry_after` (at most 60 s) exactly when
    /// given, else a random wait between half and all of the
    /// [`ceiling`](Self::ceiling).
    pub(crate) fn delay(&self, attempt: u32, error: &InferenceError) -> Duration {
        if let Some(after) = error.retry_after() {
            return after.min(MAX_RETRY_AFTER);
        }
        equal_jitter(self.ceiling(attempt), |spread| fastrand::u64(..=spread))
    }

    /// The longest wait after the `attempt`-th failure:
    /// `base × 2^(attempt-1)`, at most `cap`.
    fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// Half of `ceiling` (rounded up) plus `pick(spread)` of the other half,
/// `spread` being that half: within `ceiling / 2 ..= ceiling`, in
/// nanoseconds. `pick` returns a number in `0..=spread` (a larger one is
/// clamped).
fn equal_jitter(ceiling: Duration, pick: impl FnOnce(u64) -> u64) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    let spread = nanos / 2;
    Duration::from_nanos(nanos - spread + pick(spread).min(spread))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_ceiling_doubles_from_the_base_up_to_the_cap() {
        let b = RetryBackoff::default();
        let ceilings: Vec<_> = (1..=8).map(|a| b.ceiling(a).as_millis()).collect();
        assert_eq!(ceilings, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(b.ceiling(200), Duration::from_secs(30));
    }

    #[test]
    fn every_delay_is_between_half_the_ceiling_and_the_ceiling() {
        let b = RetryBackoff::default();
        let e = InferenceError::server("x");
        for attempt in [1, 2, 3, 6, 7, 8, 200] {
            let ceiling = b.ceiling(attempt);
            for _ in 0..1000 {
                let delay = b.delay(attempt, &e);
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "attempt {attempt}: {delay:?} outside {:?}..={ceiling:?}",
                    ceiling / 2
                );
            }
        }
    }

    #[test]
    fn equal_jitter_reaches_both_ends_and_never_passes_them() {
        let ceiling = Duration::from_millis(500);
        let all = |spread| spread;
        assert_eq!(equal_jitter(ceiling, |_| 0), Duration::from_millis(250));
        assert_eq!(equal_jitter(ceiling, all), ceiling);
        assert_eq!(equal_jitter(ceiling, |_| u64::MAX), ceiling);
        // Odd nanoseconds, zero, and a ceiling too long for u64 nanoseconds.
        assert_eq!(equal_jitter(Duration::from_nanos(3), |_| 0).as_nanos(), 2);
        assert_eq!(equal_jitter(Duration::from_nanos(3), all).as_nanos(), 3);
        assert_eq!(equal_jitter(Duration::ZERO, all), Duration::ZERO);
        assert_eq!(
            equal_jitter(Duration::MAX, all),
            Duration::from_nanos(u64::MAX)
        );
    }

    #[test]
    fn delays_for_the_same_attempt_differ() {
        let b = RetryBackoff::default();
        let e = InferenceError::overloaded("x");
        let distinct: BTreeSet<Duration> = (0..100).map(|_| b.delay(3, &e)).collect();
        assert!(
            distinct.len() > 50,
            "100 draws gave {} distinct delays",
            distinct.len()
        );
    }

    #[test]
    fn retry_after_is_honoured_exactly_up_to_sixty_seconds() {
        let b = RetryBackoff::default();
        let soon = InferenceError::rate_limited("x", Some(Duration::from_secs(3)));
        let now = InferenceError::rate_limited("x", Some(Duration::ZERO));
        let late = InferenceError::rate_limited("x", Some(Duration::from_secs(600)));
        for attempt in [1, 5, 200] {
            assert_eq!(b.delay(attempt, &soon), Duration::from_secs(3));
            assert_eq!(b.delay(attempt, &now), Duration::ZERO);
            assert_eq!(b.delay(attempt, &late), MAX_RETRY_AFTER);
        }
    }
}
