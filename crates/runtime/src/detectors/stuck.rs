//! Stuck responses (OpenManus's `is_stuck`): the newest response text equals
//! `duplicates` earlier ones of the same run. The first time, the run is
//! nudged; on the next repeat it stops with code `stuck`.

use rein_runtime_contract::escalation::Ladder;
use rein_runtime_contract::lifecycle::OnDetect;

use super::{Escalation, Verdict, snippet};
use crate::policies::StopPolicyStats;

/// The nudge added when the run first looks stuck.
pub const STUCK_NUDGE: &str = "Observed duplicate responses; consider a new strategy and avoid repeating paths you already tried.";

/// The stuck-response detector of one run.
#[derive(Debug)]
pub struct StuckDetector {
    duplicates: usize,
    escalation: Escalation,
}

impl StuckDetector {
    /// A detector that fires when the newest text equals `duplicates`
    /// earlier ones (0 disables).
    pub fn new(duplicates: usize) -> Self {
        Self {
            duplicates,
            escalation: Escalation::new(OnDetect::NudgeThenStop),
        }
    }

    /// Climbs `ladder` on each detection instead of nudge-then-stop.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// Checks the newest response against the run's earlier ones (empty
    /// texts are ignored; 0 disables).
    pub fn check(&mut self, stats: &StopPolicyStats) -> Option<Verdict> {
        let newest = &stats.last_response_text;
        if self.duplicates == 0 || newest.is_empty() {
            return None;
        }
        // The newest non-empty text is the last of the recent ones.
        let earlier =
            &stats.recent_response_texts[..stats.recent_response_texts.len().saturating_sub(1)];
        let same = earlier.iter().filter(|t| *t == newest).count();
        if same < self.duplicates {
            return None;
        }
        Some(self.escalation.fire(
            "stuck",
            format!(
                "the response repeated {same} earlier responses of this run: \"{}\"",
                snippet(newest, 80)
            ),
            STUCK_NUDGE,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(texts: &[&str]) -> StopPolicyStats {
        StopPolicyStats {
            last_response_text: texts.last().copied().unwrap_or_default().to_owned(),
            recent_response_texts: texts.iter().map(|t| t.to_string()).collect(),
            ..StopPolicyStats::default()
        }
    }

    #[test]
    fn it_nudges_at_the_threshold_then_stops_on_the_next_repeat() {
        let mut d = StuckDetector::new(2);
        assert_eq!(d.check(&stats(&["a", "a"])), None);
        assert_eq!(
            d.check(&stats(&["a", "a", "a"])),
            Some(Verdict::Nudge(STUCK_NUDGE.into()))
        );
        assert_eq!(d.check(&stats(&["a", "a", "a", "b"])), None);
        match d.check(&stats(&["a", "a", "a", "b", "a"])) {
            Some(Verdict::Stop(r)) => {
                assert_eq!(r.code, "stuck");
                assert!(r.detail.contains("after a nudge"), "{}", r.detail);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zero_disables_and_empty_texts_are_ignored() {
        assert_eq!(
            StuckDetector::new(0).check(&stats(&["a", "a", "a", "a"])),
            None
        );
        let mut s = stats(&["a", "a", "a"]);
        s.last_response_text.clear();
        assert_eq!(StuckDetector::new(1).check(&s), None);
    }
}
