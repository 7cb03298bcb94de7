//! Tool-call loops: the same cycle of calls, repeated.
//!
//! Each call is keyed by its tool name, its arguments as canonical JSON
//! (object keys sorted, so key order does not matter) and the text of its
//! result (errors included). A loop is a cycle of 1 to `max_cycle` keys
//! repeated `threshold` times back to back at the end of the run's call
//! history: `A A A A A` (cycle 1) and `A B A B A B A B A B` (cycle 2) both
//! count for a threshold of 5. Because the result is part of the key,
//! polling a status that changes, or batch work over different arguments,
//! is never a loop.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use rein_runtime_contract::lifecycle::OnDetect;
use rein_runtime_contract::message::{ToolCall, ToolResult};

use super::{Escalation, Verdict};

/// Writes `value` as JSON with object keys sorted, whatever the map type.
pub(crate) fn canonical_json(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn key(call: &ToolCall, result: &ToolResult) -> u64 {
    let mut args = String::new();
    canonical_json(&call.arguments, &mut args);
    let mut h = DefaultHasher::new();
    (&call.name, &args, &result.content).hash(&mut h);
    h.finish()
}

/// The tool-call loop detector of one run (see the module docs).
#[derive(Debug)]
pub struct ToolCallLoopDetector {
    threshold: usize,
    max_cycle: usize,
    /// Keys of the most recent calls (at most `threshold × max_cycle`), with names.
    history: VecDeque<(u64, String)>,
    escalation: Escalation,
}

/// The nudge text for a loop over these tools.
pub(crate) fn tool_loop_nudge(tools: &str) -> String {
    format!(
        "You appear to be repeating the same tool calls ({tools}) with the same arguments and getting the same results; change approach instead of calling them again."
    )
}

impl ToolCallLoopDetector {
    /// `None` when disabled (a threshold below 2 or a max cycle of 0).
    pub fn new(threshold: usize, max_cycle: usize, on_detect: OnDetect) -> Option<Self> {
        (threshold >= 2 && max_cycle >= 1).then(|| Self {
            threshold,
            max_cycle,
            history: VecDeque::new(),
            escalation: Escalation::new(on_detect),
        })
    }

    /// Records one round's calls and checks the tail of the history.
    pub fn observe_round(&mut self, round: &[(&ToolCall, &ToolResult)]) -> Option<Verdict> {
        let keep = self.threshold.saturating_mul(self.max_cycle);
        let mut found = None;
        for (call, result) in round {
            self.history
                .push_back((key(call, result), call.name.clone()));
            if self.history.len() > keep {
                self.history.pop_front();
            }
            if found.is_none() {
                found = self.cycle_at_tail();
            }
        }
        let cycle = found?;
        let n = self.history.len();
        let names: Vec<&str> = self
            .history
            .range(n - cycle..)
            .map(|(_, name)| name.as_str())
            .collect();
        let tools = names.join(" → ");
        let detail = format!(
            "the tool call cycle [{tools}] repeated {} times with identical arguments and results",
            self.threshold
        );
        let verdict = self
            .escalation
            .fire("tool_call_loop", detail, &tool_loop_nudge(&tools));
        if matches!(verdict, Verdict::Nudge(_)) {
            self.history.clear();
        }
        Some(verdict)
    }

    /// The shortest cycle length repeated `threshold` times at the tail.
    fn cycle_at_tail(&self) -> Option<usize> {
        let n = self.history.len();
        (1..=self.max_cycle).find(|&c| {
            let span = c * self.threshold;
            span <= n && (n - span..n - c).all(|i| self.history[i].0 == self.history[i + c].0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall::new("id", name, args)
    }

    fn result(content: &str) -> ToolResult {
        ToolResult {
            call_id: "id".into(),
            name: "t".into(),
            content: content.into(),
            is_error: false,
        }
    }

    fn feed(
        d: &mut ToolCallLoopDetector,
        calls: &[(&str, serde_json::Value, &str)],
    ) -> Vec<Option<Verdict>> {
        calls
            .iter()
            .map(|(n, a, r)| {
                let (c, r) = (call(n, a.clone()), result(r));
                d.observe_round(&[(&c, &r)])
            })
            .collect()
    }

    #[test]
    fn five_identical_calls_are_a_loop_and_four_are_not() {
        let mut d = ToolCallLoopDetector::new(5, 5, OnDetect::Stop).unwrap();
        let v = feed(&mut d, &vec![("search", json!({"q": "x"}), "none"); 5]);
        assert!(v[..4].iter().all(Option::is_none));
        match &v[4] {
            Some(Verdict::Stop(r)) => {
                assert_eq!(r.code, "tool_call_loop");
                assert_eq!(
                    r.detail,
                    "the tool call cycle [search] repeated 5 times with identical arguments and results"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_alternating_pair_is_a_loop_of_cycle_two() {
        let mut d = ToolCallLoopDetector::new(5, 5, OnDetect::Stop).unwrap();
        let mut calls = Vec::new();
        for _ in 0..5 {
            calls.push(("open", json!({"f": 1}), "a"));
            calls.push(("close", json!({"f": 1}), "b"));
        }
        let v = feed(&mut d, &calls);
        assert!(v[..9].iter().all(Option::is_none));
        assert!(matches!(&v[9], Some(Verdict::Stop(r)) if r.detail.contains("[open → close]")));
    }

    #[test]
    fn key_order_does_not_matter_but_results_do() {
        let mut d = ToolCallLoopDetector::new(3, 1, OnDetect::Stop).unwrap();
        let v = feed(
            &mut d,
            &[
                ("f", json!({"a": 1, "b": {"x": 1, "y": 2}}), "r"),
                ("f", json!({"b": {"y": 2, "x": 1}, "a": 1}), "r"),
                ("f", json!({"b": {"x": 1, "y": 2}, "a": 1}), "r"),
            ],
        );
        assert!(v[2].is_some(), "reordered keys are the same call");
        let mut d = ToolCallLoopDetector::new(3, 5, OnDetect::Stop).unwrap();
        let progress: Vec<String> = (0..10).map(|i| format!("{}% done", i * 10)).collect();
        let polling: Vec<_> = progress
            .iter()
            .map(|p| ("status", json!({"job": 7}), p.as_str()))
            .collect();
        assert!(
            feed(&mut d, &polling).iter().all(Option::is_none),
            "changing results are not a loop"
        );
    }

    #[test]
    fn batch_work_over_different_arguments_is_not_a_loop() {
        let mut d = ToolCallLoopDetector::new(5, 5, OnDetect::Stop).unwrap();
        let calls: Vec<_> = (0..50)
            .map(|i| ("convert", json!({ "file": i }), "ok"))
            .collect();
        assert!(feed(&mut d, &calls).iter().all(Option::is_none));
    }

    #[test]
    fn nudge_then_stop_nudges_resets_and_stops_on_the_second_detection() {
        let mut d = ToolCallLoopDetector::new(2, 1, OnDetect::NudgeThenStop).unwrap();
        let v = feed(&mut d, &vec![("f", json!({}), "r"); 4]);
        assert_eq!(v[0], None);
        assert!(matches!(&v[1], Some(Verdict::Nudge(t)) if t.contains("(f)")));
        assert_eq!(v[2], None, "the detector was reset");
        assert!(
            matches!(&v[3], Some(Verdict::Stop(r)) if r.detail.ends_with("(again, after a nudge)"))
        );
    }

    #[test]
    fn disabled_settings_build_no_detector() {
        assert!(ToolCallLoopDetector::new(0, 5, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::new(1, 5, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::new(5, 0, OnDetect::Stop).is_none());
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let mut out = String::new();
        canonical_json(&json!({"b": [ {"d": 1, "c": 2} ], "a": "x"}), &mut out);
        assert_eq!(out, r#"{"a":"x","b":[{"c":2,"d":1}]}"#);
    }
}
