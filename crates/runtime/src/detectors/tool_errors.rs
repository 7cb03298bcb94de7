//! Tool-error loops: the same call failing again and again, whatever its
//! error texts say.
//!
//! A call is keyed by its tool name and its arguments as canonical JSON
//! (as for [`ToolCallLoopDetector`](super::ToolCallLoopDetector)) but not by
//! its result: timestamps, request ids and temporary paths make every error
//! text unique, and the failure is what repeats. The rule is a streak over
//! the run's calls in call order: the detector fires when the last
//! `threshold` calls of the run are the same call and every one of them
//! failed (`is_error`). Any call in between that is not that call failing —
//! the same call succeeding, or any other call, failing or not — breaks the
//! streak; the calls of one round count in call order.
//!
//! State is one key and a counter, and a key is computed only for a failed
//! call, so successful calls cost nothing.

use rein_runtime_contract::lifecycle::OnDetect;
use rein_runtime_contract::message::{ToolCall, ToolResult};

use rein_runtime_contract::escalation::Ladder;

use super::{CallRecord, Denied, Escalation, MAX_TOOL_LOOP_THRESHOLD, Verdict};

/// The nudge text for a call that keeps failing.
pub(crate) fn tool_error_nudge(tool: &str, failures: usize) -> String {
    format!(
        "The tool call {tool} has failed {failures} times in a row with the same arguments; do not call it again with these arguments — change the arguments or the approach."
    )
}

/// The tool-error loop detector of one run (see the module docs).
#[derive(Debug)]
pub struct ToolErrorLoopDetector {
    threshold: usize,
    /// The key (name and canonical arguments) of the call failing at the
    /// end of the run's history, and how many times in a row it failed.
    streak: Option<(u64, usize)>,
    escalation: Escalation,
    /// After a nudge: the key of the call that kept failing. Failing with it
    /// again as the very next call means the nudge failed.
    nudged_next: Option<u64>,
    /// The call refused after a `deny` step.
    denied: Denied,
}

impl ToolErrorLoopDetector {
    /// `None` when disabled (a threshold below 2). `threshold` is clamped to
    /// [`MAX_TOOL_LOOP_THRESHOLD`].
    pub fn new(threshold: usize, on_detect: OnDetect) -> Option<Self> {
        (threshold >= 2).then(|| Self {
            threshold: threshold.min(MAX_TOOL_LOOP_THRESHOLD),
            streak: None,
            escalation: Escalation::new(on_detect),
            nudged_next: None,
            denied: Denied::default(),
        })
    }

    /// Climbs `ladder` on each detection instead of `on_detect`'s.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// Whether a call is refused now.
    pub(crate) fn denies(&self) -> bool {
        !self.denied.is_empty()
    }

    /// A call about to run: a verdict if a `deny` step refused it.
    pub(crate) fn screen(&mut self, plain: u64, name: &str) -> Option<Verdict> {
        if self.denied.is_empty() {
            return None;
        }
        let nudge = tool_error_nudge(name, self.threshold);
        self.denied
            .screen(&mut self.escalation, plain, name, &nudge)
    }

    /// Records one round's calls, in call order; the verdict of the first
    /// call that completes a streak.
    pub fn observe_round(&mut self, round: &[(&ToolCall, &ToolResult)]) -> Option<Verdict> {
        self.observe_records(&CallRecord::of_round(round))
    }

    /// [`observe_round`](Self::observe_round) over records made once per
    /// call for every detector.
    pub(crate) fn observe_records(&mut self, records: &[CallRecord]) -> Option<Verdict> {
        let nudged_next = self.nudged_next.take();
        let mut verdict = None;
        for (i, record) in records.iter().enumerate() {
            let Some((key, error)) = &record.failure else {
                self.streak = None;
                continue;
            };
            let (key, name) = (*key, &record.name);
            // After a nudge, the very next call failing the same way is the
            // nudge failing: stop on it rather than wait for a fresh streak.
            if i == 0 && nudged_next == Some(key) {
                self.streak = None;
                let detail = format!(
                    "the tool call {name} failed again with the same arguments right after a nudge to stop calling it (last error: {error})"
                );
                let v = self.escalation.fire(
                    "tool_error_loop",
                    detail,
                    &tool_error_nudge(name, self.threshold),
                );
                match v {
                    Verdict::Nudge(_) => self.nudged_next = Some(key),
                    Verdict::Deny(_) => self.denied.set("tool_error_loop", [key]),
                    _ => {}
                }
                verdict = Some(v);
                continue;
            }
            let count = match self.streak {
                Some((k, n)) if k == key => n + 1,
                _ => 1,
            };
            self.streak = Some((key, count));
            if count < self.threshold || verdict.is_some() {
                continue;
            }
            let detail = format!(
                "the tool call {name} failed {count} times in a row with the same arguments (last error: {error})"
            );
            let v = self
                .escalation
                .fire("tool_error_loop", detail, &tool_error_nudge(name, count));
            match v {
                Verdict::Nudge(_) => {
                    self.nudged_next = Some(key);
                    self.streak = None;
                }
                Verdict::Deny(_) => {
                    self.denied.set("tool_error_loop", [key]);
                    self.streak = None;
                }
                Verdict::Warn(_) => self.streak = None,
                _ => {}
            }
            verdict = Some(v);
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall::new("id", name, args)
    }

    fn outcome(content: &str, is_error: bool) -> ToolResult {
        ToolResult {
            call_id: "id".into(),
            name: "t".into(),
            content: content.into(),
            is_error,
        }
    }

    /// Feeds one call per round: (name, args, failed).
    fn feed(
        d: &mut ToolErrorLoopDetector,
        calls: &[(&str, serde_json::Value, bool)],
    ) -> Vec<Option<Verdict>> {
        calls
            .iter()
            .enumerate()
            .map(|(i, (n, a, failed))| {
                let text = format!("error at 2026-11-24T10:00:{i:02}Z, request id {i}");
                let (c, r) = (call(n, a.clone()), outcome(&text, *failed));
                d.observe_round(&[(&c, &r)])
            })
            .collect()
    }

    #[test]
    fn three_failures_of_the_same_call_with_different_error_texts_stop() {
        let mut d = ToolErrorLoopDetector::new(3, OnDetect::Stop).unwrap();
        let v = feed(
            &mut d,
            &vec![("fetch", json!({"url": "u", "n": 1}), true); 3],
        );
        assert!(v[..2].iter().all(Option::is_none));
        match &v[2] {
            Some(Verdict::Stop(r)) => {
                assert_eq!(r.code, "tool_error_loop");
                assert_eq!(
                    r.detail,
                    "the tool call fetch failed 3 times in a row with the same arguments (last error: error at 2026-11-24T10:00:02Z, request id 2)"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn argument_key_order_does_not_matter() {
        let mut d = ToolErrorLoopDetector::new(2, OnDetect::Stop).unwrap();
        let v = feed(
            &mut d,
            &[
                ("f", json!({"a": 1, "b": 2}), true),
                ("f", json!({"b": 2, "a": 1}), true),
            ],
        );
        assert!(v[1].is_some());
    }

    #[test]
    fn a_success_or_another_call_in_between_breaks_the_streak() {
        let mut d = ToolErrorLoopDetector::new(3, OnDetect::Stop).unwrap();
        let f = || ("f", json!({"x": 1}), true);
        let v = feed(
            &mut d,
            &[
                f(),
                f(),
                ("f", json!({"x": 1}), false),
                f(),
                f(),
                ("g", json!({}), true),
                f(),
                f(),
                ("f", json!({"x": 2}), true),
                f(),
                f(),
            ],
        );
        assert!(v.iter().all(Option::is_none), "{v:?}");
        let v = feed(&mut d, &[f()]);
        assert!(matches!(&v[0], Some(Verdict::Stop(_))));
    }

    #[test]
    fn failures_inside_one_round_count_in_call_order() {
        let mut d = ToolErrorLoopDetector::new(3, OnDetect::Stop).unwrap();
        let (c, g) = (call("f", json!({})), call("g", json!({})));
        let (bad, good) = (outcome("e", true), outcome("ok", false));
        assert!(
            d.observe_round(&[(&c, &bad), (&c, &bad), (&g, &good)])
                .is_none()
        );
        assert!(d.observe_round(&[(&c, &bad), (&c, &bad)]).is_none());
        assert!(d.observe_round(&[(&c, &bad)]).is_some());
    }

    #[test]
    fn nudge_then_stop_stops_when_the_call_fails_again_at_once() {
        let mut d = ToolErrorLoopDetector::new(2, OnDetect::NudgeThenStop).unwrap();
        let v = feed(&mut d, &vec![("f", json!({}), true); 3]);
        assert_eq!(v[0], None);
        assert!(
            matches!(&v[1], Some(Verdict::Nudge(t)) if t.starts_with("The tool call f has failed 2 times in a row"))
        );
        assert!(
            matches!(&v[2], Some(Verdict::Stop(r)) if r.detail.contains("right after a nudge") && r.detail.ends_with("(again, after a nudge)")),
            "{:?}",
            v[2]
        );
    }

    #[test]
    fn after_a_nudge_a_success_resets_and_a_fresh_streak_stops() {
        let mut d = ToolErrorLoopDetector::new(2, OnDetect::NudgeThenStop).unwrap();
        let v = feed(
            &mut d,
            &[
                ("f", json!({}), true),
                ("f", json!({}), true),
                ("f", json!({}), false),
                ("f", json!({}), true),
                ("f", json!({}), true),
            ],
        );
        assert!(matches!(&v[1], Some(Verdict::Nudge(_))));
        assert_eq!(v[2], None);
        assert_eq!(v[3], None);
        assert!(
            matches!(&v[4], Some(Verdict::Stop(r)) if r.detail.ends_with("(again, after a nudge)"))
        );
    }

    #[test]
    fn disabled_settings_build_no_detector_and_huge_ones_are_clamped() {
        assert!(ToolErrorLoopDetector::new(0, OnDetect::Stop).is_none());
        assert!(ToolErrorLoopDetector::new(1, OnDetect::Stop).is_none());
        let mut d = ToolErrorLoopDetector::new(usize::MAX, OnDetect::Stop).unwrap();
        let v = feed(
            &mut d,
            &vec![("f", json!({}), true); MAX_TOOL_LOOP_THRESHOLD],
        );
        assert!(v[..MAX_TOOL_LOOP_THRESHOLD - 1].iter().all(Option::is_none));
        assert!(v[MAX_TOOL_LOOP_THRESHOLD - 1].is_some());
    }
}
