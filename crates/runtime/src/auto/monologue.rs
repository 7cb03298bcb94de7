//! Monologues: the same answer, round after round, within one auto-mode
//! session. In auto mode the "continue" messages are the runtime's, not the
//! user's, so an agent that gives the same answer every round is talking to
//! itself; the in-run `stuck` detector cannot see it, because every round is
//! a run of its own.
//!
//! The rule is `stuck`'s, across rounds: when a round's answer equals
//! `duplicates` earlier rounds' answers, the next round is nudged (the
//! continuation message carries the stuck nudge); the next time, the session
//! stops. `duplicates` is the agent's `stuck` setting, 2 when it lists none;
//! 0 disables.

use crate::detectors::snippet;

/// How many earlier answers a session remembers.
const REMEMBERED: usize = 64;

/// What a round's answer says about the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Nothing repeated (enough).
    No,
    /// Repeated for the first time: nudge the next round.
    Nudge,
    /// Repeated again after the nudge: stop, with this detail.
    Stop(String),
}

/// The answers of one session's rounds, as hashes: the state travels with
/// every queued round (a service stores it with the run), so it stays a
/// few bytes per answer however long the answers are.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Monologue {
    duplicates: usize,
    answers: Vec<u64>,
    nudged: bool,
}

/// An answer's hash: SipHash with fixed keys, the same in every process of
/// a build.
fn hash(answer: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    answer.hash(&mut hasher);
    hasher.finish()
}

impl Monologue {
    pub(crate) fn new(duplicates: usize) -> Self {
        Self {
            duplicates: duplicates.min(REMEMBERED - 1),
            answers: Vec::new(),
            nudged: false,
        }
    }

    /// Records a round's answer (empty answers are ignored).
    pub(crate) fn observe(&mut self, answer: &str) -> Repeat {
        if self.duplicates == 0 || answer.trim().is_empty() {
            return Repeat::No;
        }
        let answer_hash = hash(answer);
        let same = self.answers.iter().filter(|a| **a == answer_hash).count();
        if self.answers.len() == REMEMBERED {
            self.answers.remove(0);
        }
        self.answers.push(answer_hash);
        if same < self.duplicates {
            return Repeat::No;
        }
        if !self.nudged {
            self.nudged = true;
            return Repeat::Nudge;
        }
        Repeat::Stop(format!(
            "the round's answer repeated {same} earlier rounds' answers after a nudge: \"{}\"",
            snippet(answer, 80)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_answer_nudges_at_the_threshold_then_stops() {
        let mut m = Monologue::new(2);
        assert_eq!(m.observe("same"), Repeat::No);
        assert_eq!(m.observe("same"), Repeat::No);
        assert_eq!(m.observe("same"), Repeat::Nudge);
        assert!(matches!(m.observe("same"), Repeat::Stop(d) if d.contains("repeated 3 earlier")));
    }

    #[test]
    fn different_and_empty_answers_do_not_count_and_zero_disables() {
        let mut m = Monologue::new(1);
        assert_eq!(m.observe("a"), Repeat::No);
        assert_eq!(m.observe(""), Repeat::No);
        assert_eq!(m.observe("b"), Repeat::No);
        assert_eq!(m.observe("a"), Repeat::Nudge);
        let mut off = Monologue::new(0);
        assert!((0..10).all(|_| off.observe("x") == Repeat::No));
    }
}
