//! Conditions over time and progress: `error_rate` (failed inferences and
//! tool errors in a sliding window of time) and `no_progress` (rounds whose
//! tool results all repeat earlier ones).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use rein_runtime_contract::escalation::Ladder;
use rein_runtime_contract::lifecycle::OnDetect;

use super::{CallRecord, Escalation, Verdict};

/// The nudge when errors pile up.
pub const ERROR_RATE_NUDGE: &str = "Many of your recent requests or tool calls have failed. Stop and reconsider: check the tool's arguments and the errors it returned before trying again.";

/// The nudge when rounds bring nothing new.
pub const NO_PROGRESS_NUDGE: &str = "Your recent tool calls have returned nothing you had not already seen. Change your approach, or finish with what you have.";

/// The most distinct results `no_progress` remembers; past it, it starts
/// afresh (a run that long has made progress many times over).
const MAX_SEEN: usize = 65_536;

/// `error_rate`: `errors` errors (failed inferences and tool calls that
/// returned an error) within `within` of each other.
#[derive(Debug)]
pub struct ErrorRateDetector {
    errors: usize,
    within: Duration,
    /// When the detector was made: errors are kept as times since then.
    origin: Instant,
    times: VecDeque<Duration>,
    escalation: Escalation,
}

impl ErrorRateDetector {
    /// `None` when disabled (0 errors or 0 seconds).
    pub fn new(errors: usize, within_seconds: u64) -> Option<Self> {
        (errors > 0 && within_seconds > 0).then(|| Self {
            errors,
            within: Duration::from_secs(within_seconds),
            origin: Instant::now(),
            times: VecDeque::with_capacity(errors),
            escalation: Escalation::new(OnDetect::Stop),
        })
    }

    /// Climbs `ladder` on each detection instead of stopping at once.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// An error at `now`; a verdict when the window holds `errors` of them
    /// (the window then starts afresh).
    pub fn observe(&mut self, now: Instant) -> Option<Verdict> {
        self.observe_after(now.saturating_duration_since(self.origin))
    }

    /// An error `after` the detector's start (a recorded time, in replay);
    /// as [`observe`](Self::observe).
    pub fn observe_after(&mut self, after: Duration) -> Option<Verdict> {
        while self
            .times
            .front()
            .is_some_and(|t| after.saturating_sub(*t) > self.within)
        {
            self.times.pop_front();
        }
        self.times.push_back(after);
        if self.times.len() < self.errors {
            return None;
        }
        let span = self
            .times
            .front()
            .map_or(Duration::ZERO, |t| after.saturating_sub(*t));
        self.times.clear();
        let detail = format!(
            "{} errors (failed inferences or tool errors) within {:.1} s; the limit is {} within {} s",
            self.errors,
            span.as_secs_f64(),
            self.errors,
            self.within.as_secs()
        );
        Some(self.escalation.fire("error_rate", detail, ERROR_RATE_NUDGE))
    }
}

/// `no_progress`: `rounds` rounds in a row whose tool results all repeat
/// results the run had already seen. Rounds without tool calls do not
/// count either way.
#[derive(Debug)]
pub struct NoProgressDetector {
    rounds: usize,
    /// The results' keys, already hashes: hashed again by identity.
    seen: HashSet<u64, super::ByHash>,
    stale: usize,
    escalation: Escalation,
}

impl NoProgressDetector {
    /// `None` when disabled (0 rounds).
    pub fn new(rounds: usize) -> Option<Self> {
        (rounds > 0).then(|| Self {
            rounds,
            seen: HashSet::default(),
            stale: 0,
            escalation: Escalation::new(OnDetect::Stop),
        })
    }

    /// Climbs `ladder` on each detection instead of stopping at once.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// One round's finished calls; a verdict after `rounds` stale rounds.
    pub(crate) fn observe_round(&mut self, records: &[CallRecord]) -> Option<Verdict> {
        if records.is_empty() {
            return None;
        }
        if self.seen.len() > MAX_SEEN {
            self.seen.clear();
        }
        let mut new = false;
        for record in records {
            new |= self.seen.insert(record.outcome);
        }
        if new {
            self.stale = 0;
            return None;
        }
        self.stale += 1;
        if self.stale < self.rounds {
            return None;
        }
        self.stale = 0;
        let detail = format!(
            "{} rounds in a row brought no tool result that differed from the run's earlier ones",
            self.rounds
        );
        Some(
            self.escalation
                .fire("no_progress", detail, NO_PROGRESS_NUDGE),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime_contract::escalation::{EscalationAction, EscalationStep};
    use rein_runtime_contract::message::{ToolCall, ToolResult};
    use serde_json::json;

    fn record(name: &str, args: serde_json::Value, result: &str) -> CallRecord {
        let call = ToolCall::new("id", name, args);
        let result = ToolResult {
            call_id: "id".into(),
            name: name.into(),
            content: result.into(),
            is_error: false,
        };
        CallRecord::new(&call, &result)
    }

    #[test]
    fn errors_count_only_within_the_window() {
        let mut d = ErrorRateDetector::new(3, 60).unwrap();
        let t0 = Instant::now();
        assert_eq!(d.observe(t0), None);
        assert_eq!(d.observe(t0 + Duration::from_secs(30)), None);
        // The first has left the window: two within 60 s.
        assert_eq!(d.observe(t0 + Duration::from_secs(70)), None);
        match d.observe(t0 + Duration::from_secs(80)) {
            Some(Verdict::Stop(r)) => {
                assert_eq!(r.code, "error_rate");
                assert!(r.detail.starts_with("3 errors"), "{}", r.detail);
                assert!(r.detail.contains("within 50.0 s"), "{}", r.detail);
            }
            other => panic!("{other:?}"),
        }
        assert!(ErrorRateDetector::new(0, 60).is_none());
        assert!(ErrorRateDetector::new(3, 0).is_none());
    }

    #[test]
    fn rounds_that_only_repeat_results_are_no_progress_and_a_new_result_resets() {
        let ladder = Ladder::new(vec![
            EscalationStep::new(EscalationAction::Warn, 1),
            EscalationStep::new(EscalationAction::Stop, 1),
        ])
        .unwrap();
        let mut d = NoProgressDetector::new(2).unwrap().with_ladder(ladder);
        assert_eq!(d.observe_round(&[record("ls", json!({}), "a")]), None);
        // Other arguments, same result: nothing new.
        assert_eq!(d.observe_round(&[record("ls", json!({"x": 1}), "a")]), None);
        assert!(matches!(
            d.observe_round(&[record("ls", json!({}), "a")]),
            Some(Verdict::Warn(_))
        ));
        assert_eq!(
            d.observe_round(&[record("ls", json!({}), "b")]),
            None,
            "new"
        );
        assert_eq!(d.observe_round(&[]), None, "no calls: not counted");
        assert_eq!(d.observe_round(&[record("ls", json!({}), "a")]), None);
        match d.observe_round(&[record("ls", json!({}), "b")]) {
            Some(Verdict::Stop(r)) => assert!(r.detail.starts_with("2 rounds"), "{}", r.detail),
            other => panic!("{other:?}"),
        }
    }
}
