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
//!
//! The same detector, built with [`ToolCallLoopDetector::exact_cycle`],
//! enforces `tool_call_cycle`: only cycles of exactly one length count, so
//! each length can have its own threshold. A cycle counts at its shortest
//! length only: `A A A A A A` is a cycle of 1 repeated six times, never a
//! cycle of 2 repeated three times.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use rein_runtime_contract::escalation::{Ladder, ToolLoopRule};
use rein_runtime_contract::lifecycle::OnDetect;
use rein_runtime_contract::message::{ToolCall, ToolResult};

use super::{CallRecord, Denied, Escalation, Verdict};

/// The hasher of every key: deterministic, fast on short inputs, and of
/// good quality (its output is used as is, e.g. in `no_progress`'s set).
fn hasher() -> foldhash::quality::FoldHasher<'static> {
    foldhash::quality::FixedState::default().build_hasher()
}

/// Feeds `value` into `h` as its canonical form: object keys in sorted
/// order (so key order does not matter), each value tagged with its kind,
/// arrays and objects with their length and strings ended (as `Hash` for
/// `str` does), so two values feed the same bytes only
/// when they are equal as JSON with numbers kept as written (`1` and `1.0`
/// differ). Nothing is serialized or copied; an object whose keys are
/// already in order is not sorted.
pub(crate) fn hash_canonical<H: Hasher>(value: &serde_json::Value, h: &mut H) {
    use serde_json::Value;
    match value {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => h.write_u8(1 + u8::from(*b)),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                h.write_u8(3);
                h.write_u64(u);
            } else if let Some(i) = n.as_i64() {
                h.write_u8(4);
                h.write_i64(i);
            } else {
                h.write_u8(5);
                h.write_u64(n.as_f64().unwrap_or(f64::NAN).to_bits());
            }
        }
        Value::String(text) => {
            h.write_u8(6);
            text.hash(h);
        }
        Value::Array(items) => {
            h.write_u8(7);
            h.write_usize(items.len());
            for item in items {
                hash_canonical(item, h);
            }
        }
        Value::Object(map) => {
            h.write_u8(8);
            h.write_usize(map.len());
            let mut entry = |k: &String, v: &Value| {
                k.hash(h);
                hash_canonical(v, h);
            };
            if map.keys().is_sorted() {
                map.iter().for_each(|(k, v)| entry(k, v));
            } else {
                let mut entries: smallvec::SmallVec<[(&String, &Value); 8]> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                entries.into_iter().for_each(|(k, v)| entry(k, v));
            }
        }
    }
}

/// The key of a call: its name and canonical arguments.
pub(crate) fn call_key(call: &ToolCall) -> u64 {
    let mut h = hasher();
    call.name.hash(&mut h);
    hash_canonical(&call.arguments, &mut h);
    h.finish()
}

/// The key of a result text.
pub(crate) fn outcome_key(result: &str) -> u64 {
    let mut h = hasher();
    result.hash(&mut h);
    h.finish()
}

/// The key of a call (`plain`, from [`call_key`]) with its result's key.
pub(crate) fn with_result(plain: u64, outcome: u64) -> u64 {
    let mut h = hasher();
    h.write_u64(plain);
    h.write_u64(outcome);
    h.finish()
}

/// The largest `threshold` a tool-call loop accepts; larger values set in
/// code are clamped to it (YAML rejects them).
pub const MAX_TOOL_LOOP_THRESHOLD: usize = rein_runtime_contract::config::MAX_THRESHOLD;

/// The tool-call loop detector of one run (see the module docs).
#[derive(Debug)]
pub struct ToolCallLoopDetector {
    threshold: usize,
    /// The shortest cycle looked for: 1, or the one length of
    /// `tool_call_cycle`.
    min_cycle: usize,
    max_cycle: usize,
    /// The stop code: `tool_call_loop` or `tool_call_cycle`.
    code: &'static str,
    /// The most recent calls (at most `keep`).
    history: VecDeque<Entry>,
    /// `threshold × max_cycle`, the largest per-tool threshold counting.
    keep: usize,
    escalation: Escalation,
    /// After a nudge: the key of the call the loop would continue with.
    /// Repeating it as the very next call means the nudge failed.
    nudged_next: Option<u64>,
    /// Per-tool thresholds and exemptions.
    rules: Arc<BTreeMap<String, ToolLoopRule>>,
    /// The rule last looked up, by the tool name's shared `Arc` (a run's
    /// records share one per tool): most rounds call the tool before.
    last_rule: Option<(Arc<str>, Option<ToolLoopRule>)>,
    /// The calls refused after a `deny` step.
    denied: Denied,
}

/// One call the detector remembers.
#[derive(Debug)]
struct Entry {
    /// Name, canonical arguments and result.
    key: u64,
    name: Arc<str>,
    /// Name and canonical arguments (what `deny` refuses).
    plain: u64,
    /// The repetitions that make a loop of this tool.
    threshold: usize,
}

/// The nudge text for a loop over these tools.
pub(crate) fn tool_loop_nudge(tools: &str) -> String {
    format!(
        "You appear to be repeating the same tool calls ({tools}) with the same arguments and getting the same results; change approach instead of calling them again."
    )
}

impl ToolCallLoopDetector {
    /// `None` when disabled (a threshold below 2 or a max cycle of 0).
    /// `threshold` is clamped to [`MAX_TOOL_LOOP_THRESHOLD`] and `max_cycle`
    /// to [`MAX_CYCLE`](rein_runtime_contract::config::MAX_CYCLE), so the
    /// history it keeps stays bounded.
    pub fn new(threshold: usize, max_cycle: usize, on_detect: OnDetect) -> Option<Self> {
        Self::build(threshold, 1, max_cycle, "tool_call_loop", on_detect)
    }

    /// The detector of `tool_call_cycle`: only cycles of exactly `cycle`
    /// calls count (stop code `tool_call_cycle`). `None` when disabled (a
    /// threshold below 2 or a cycle of 0). `threshold` is clamped as in
    /// [`new`](Self::new), and a `cycle` above
    /// [`MAX_CYCLE`](rein_runtime_contract::config::MAX_CYCLE) builds no
    /// detector either (YAML rejects it), since clamping it would watch for
    /// another cycle than the one asked for.
    pub fn exact_cycle(cycle: usize, threshold: usize, on_detect: OnDetect) -> Option<Self> {
        if cycle > rein_runtime_contract::config::MAX_CYCLE {
            return None;
        }
        Self::build(threshold, cycle, cycle, "tool_call_cycle", on_detect)
    }

    fn build(
        threshold: usize,
        min_cycle: usize,
        max_cycle: usize,
        code: &'static str,
        on_detect: OnDetect,
    ) -> Option<Self> {
        (threshold >= 2 && min_cycle >= 1 && max_cycle >= 1).then(|| Self {
            threshold: threshold.min(MAX_TOOL_LOOP_THRESHOLD),
            min_cycle,
            max_cycle: max_cycle.min(rein_runtime_contract::config::MAX_CYCLE),
            code,
            history: VecDeque::new(),
            keep: threshold
                .min(MAX_TOOL_LOOP_THRESHOLD)
                .saturating_mul(max_cycle.min(rein_runtime_contract::config::MAX_CYCLE)),
            escalation: Escalation::new(on_detect),
            nudged_next: None,
            rules: Arc::default(),
            last_rule: None,
            denied: Denied::default(),
        })
    }

    /// Climbs `ladder` on each detection instead of `on_detect`'s.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// Applies per-tool rules: a tool's own threshold (the lowest among a
    /// cycle's tools holds), or an exemption (its calls are skipped: they
    /// neither count nor break a cycle).
    pub fn with_tool_rules(mut self, rules: Arc<BTreeMap<String, ToolLoopRule>>) -> Self {
        let most = rules
            .values()
            .filter_map(|r| r.threshold)
            .fold(self.threshold, usize::max)
            .min(MAX_TOOL_LOOP_THRESHOLD);
        self.keep = most.saturating_mul(self.max_cycle);
        self.rules = rules;
        self.last_rule = None;
        self
    }

    /// Whether calls are refused now.
    pub(crate) fn denies(&self) -> bool {
        !self.denied.is_empty()
    }

    /// A call about to run: a verdict if a `deny` step refused it.
    pub(crate) fn screen(&mut self, plain: u64, name: &str) -> Option<Verdict> {
        if self.denied.is_empty() {
            return None;
        }
        self.denied
            .screen(&mut self.escalation, plain, name, &tool_loop_nudge(name))
    }

    /// The repetitions that make a loop of the cycle of the last `cycle`
    /// calls: the lowest of its tools' thresholds, each tool's own or the
    /// detector's.
    fn threshold_of(&self, cycle: usize) -> usize {
        if self.rules.is_empty() {
            return self.threshold;
        }
        let n = self.history.len();
        self.history
            .range(n.saturating_sub(cycle)..)
            .map(|e| e.threshold)
            .min()
            .unwrap_or(self.threshold)
    }

    /// The rule for the tool `name`, if any.
    fn rule_of(&mut self, name: &Arc<str>) -> Option<ToolLoopRule> {
        if self.rules.is_empty() {
            return None;
        }
        if let Some((last, rule)) = &self.last_rule
            && Arc::ptr_eq(last, name)
        {
            return *rule;
        }
        let rule = self.rules.get(&**name).copied();
        self.last_rule = Some((name.clone(), rule));
        rule
    }

    /// Records one round's calls and checks the tail of the history.
    pub fn observe_round(&mut self, round: &[(&ToolCall, &ToolResult)]) -> Option<Verdict> {
        self.observe_records(&CallRecord::of_round(round))
    }

    /// [`observe_round`](Self::observe_round) over records made once per
    /// call for every detector.
    pub(crate) fn observe_records(&mut self, records: &[CallRecord]) -> Option<Verdict> {
        // After a nudge, the next call repeating the loop is the nudge
        // failing: stop on it rather than wait for a fresh streak.
        if let (Some(next), Some(first)) = (self.nudged_next.take(), records.first())
            && first.key == next
        {
            let detail = format!(
                "the tool call {} was repeated right after a nudge to stop repeating it",
                first.name
            );
            let verdict = self
                .escalation
                .fire(self.code, detail, &tool_loop_nudge(&first.name));
            let (key, plain) = (first.key, first.plain);
            match verdict {
                Verdict::Nudge(_) => self.nudged_next = Some(key),
                Verdict::Deny(_) => self.denied.set(self.code, [plain]),
                _ => {}
            }
            return Some(verdict);
        }
        let mut found = None;
        for record in records {
            let rule = self.rule_of(&record.name);
            if rule.is_some_and(|r| r.exempt) {
                continue;
            }
            self.history.push_back(Entry {
                key: record.key,
                name: record.name.clone(),
                plain: record.plain,
                threshold: rule
                    .and_then(|r| r.threshold)
                    .map_or(self.threshold, |t| t.clamp(2, MAX_TOOL_LOOP_THRESHOLD)),
            });
            if self.history.len() > self.keep {
                self.history.pop_front();
            }
            if found.is_none() {
                found = self.cycle_at_tail();
            }
        }
        let cycle = found?;
        let n = self.history.len();
        let names: Vec<&str> = self.history.range(n - cycle..).map(|e| &*e.name).collect();
        let tools = names.join(" → ");
        let detail = format!(
            "the tool call cycle [{tools}] repeated {} times with identical arguments and results",
            self.threshold_of(cycle)
        );
        let verdict = self
            .escalation
            .fire(self.code, detail, &tool_loop_nudge(&tools));
        match verdict {
            Verdict::Nudge(_) => {
                // The loop would go on with the cycle's first call.
                self.nudged_next = self.history.get(n - cycle).map(|e| e.key);
                self.history.clear();
            }
            Verdict::Deny(_) => {
                let keys: Vec<u64> = self.history.range(n - cycle..).map(|e| e.plain).collect();
                self.denied.set(self.code, keys);
                self.history.clear();
            }
            Verdict::Warn(_) => self.history.clear(),
            _ => {}
        }
        Some(verdict)
    }

    /// The shortest cycle length in `min_cycle ..= max_cycle` repeated
    /// `threshold` times at the tail, the cycle itself not being a
    /// repetition of a shorter one.
    fn cycle_at_tail(&self) -> Option<usize> {
        let n = self.history.len();
        let last = self.history.back()?.key;
        // A cycle of `c` repeated at least twice at the tail has the last
        // call `c` back too: a call new to the last `max_cycle` calls
        // (most calls, in a run that is not looping) ends no cycle.
        let lengths = (self.max_cycle + 1).saturating_sub(self.min_cycle);
        let mut earlier = self.history.iter().rev().skip(self.min_cycle).take(lengths);
        if !earlier.any(|e| e.key == last) {
            return None;
        }
        let same = |i: usize, j: usize| self.history[i].key == self.history[j].key;
        (self.min_cycle..=self.max_cycle).find(|&c| {
            n > c && same(n - 1 - c, n - 1)
            // Checked: an overflowing span is longer than any history.
            && c.checked_mul(self.threshold_of(c)).is_some_and(|span| {
                span <= n
                    && (n - span..n - c).all(|i| same(i, i + c))
                    // With `min_cycle` 1 a shorter period would have been
                    // found first; with an exact length, `A A` is not a
                    // cycle of 2.
                    && (1..c)
                        .filter(|d| c % d == 0)
                        .all(|d| (n - c..n - d).any(|i| !same(i, i + d)))
            })
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
    fn nudge_then_stop_stops_when_the_nudged_call_is_repeated_at_once() {
        let mut d = ToolCallLoopDetector::new(2, 1, OnDetect::NudgeThenStop).unwrap();
        let v = feed(&mut d, &vec![("f", json!({}), "r"); 3]);
        assert_eq!(v[0], None);
        assert!(matches!(&v[1], Some(Verdict::Nudge(t)) if t.contains("(f)")));
        assert!(
            matches!(&v[2], Some(Verdict::Stop(r)) if r.detail.contains("right after a nudge")),
            "{:?}",
            v[2]
        );
    }

    #[test]
    fn after_a_nudge_another_call_resets_and_a_fresh_streak_stops() {
        let mut d = ToolCallLoopDetector::new(2, 2, OnDetect::NudgeThenStop).unwrap();
        // A B A B → nudge; the loop would go on with A. B breaks it.
        let v = feed(
            &mut d,
            &[
                ("a", json!({}), "r"),
                ("b", json!({}), "r"),
                ("a", json!({}), "r"),
                ("b", json!({}), "r"),
                ("b", json!({}), "r"),
                ("c", json!({}), "r"),
                ("c", json!({}), "r"),
            ],
        );
        assert!(matches!(&v[3], Some(Verdict::Nudge(_))));
        assert_eq!(v[4], None, "b is not the cycle's next call (a)");
        assert_eq!(v[5], None);
        assert!(
            matches!(&v[6], Some(Verdict::Stop(r)) if r.detail.ends_with("(again, after a nudge)"))
        );
    }

    #[test]
    fn a_huge_threshold_neither_overflows_nor_keeps_an_unbounded_history() {
        let mut d = ToolCallLoopDetector::new(usize::MAX, usize::MAX, OnDetect::Stop).unwrap();
        let calls: Vec<_> = (0..3000).map(|_| ("f", json!({}), "r")).collect();
        let v = feed(&mut d, &calls);
        // Clamped to MAX_TOOL_LOOP_THRESHOLD: the 1000th identical call stops.
        assert!(v[..999].iter().all(Option::is_none));
        assert!(matches!(&v[999], Some(Verdict::Stop(_))));
        assert!(
            d.history.len() <= MAX_TOOL_LOOP_THRESHOLD * rein_runtime_contract::config::MAX_CYCLE
        );
    }

    #[test]
    fn disabled_settings_build_no_detector() {
        assert!(ToolCallLoopDetector::new(0, 5, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::new(1, 5, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::new(5, 0, OnDetect::Stop).is_none());
    }

    #[test]
    fn an_exact_cycle_of_two_fires_on_an_a_b_pair_repeated_and_not_on_identical_calls() {
        let mut d = ToolCallLoopDetector::exact_cycle(2, 3, OnDetect::Stop).unwrap();
        let v = feed(&mut d, &vec![("f", json!({}), "r"); 12]);
        assert!(v.iter().all(Option::is_none), "A A A … is a cycle of 1");
        let mut d = ToolCallLoopDetector::exact_cycle(2, 3, OnDetect::Stop).unwrap();
        let mut calls = Vec::new();
        for _ in 0..3 {
            calls.push(("a", json!({}), "r"));
            calls.push(("b", json!({}), "r"));
        }
        let v = feed(&mut d, &calls);
        assert!(v[..5].iter().all(Option::is_none));
        match &v[5] {
            Some(Verdict::Stop(r)) => {
                assert_eq!(r.code, "tool_call_cycle");
                assert_eq!(
                    r.detail,
                    "the tool call cycle [a → b] repeated 3 times with identical arguments and results"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_exact_cycle_of_one_ignores_longer_cycles() {
        let mut d = ToolCallLoopDetector::exact_cycle(1, 3, OnDetect::Stop).unwrap();
        let mut calls = Vec::new();
        for _ in 0..5 {
            calls.push(("a", json!({}), "r"));
            calls.push(("b", json!({}), "r"));
        }
        assert!(feed(&mut d, &calls).iter().all(Option::is_none));
        let v = feed(&mut d, &vec![("a", json!({}), "r"); 3]);
        assert!(matches!(&v[2], Some(Verdict::Stop(r)) if r.code == "tool_call_cycle"));
    }

    #[test]
    fn an_exact_cycle_of_four_is_not_a_pair_repeated_twice() {
        let mut d = ToolCallLoopDetector::exact_cycle(4, 2, OnDetect::Stop).unwrap();
        let pairs: Vec<_> = (0..8)
            .map(|i| (if i % 2 == 0 { "a" } else { "b" }, json!({}), "r"))
            .collect();
        assert!(feed(&mut d, &pairs).iter().all(Option::is_none));
        let abac: Vec<_> = ["a", "b", "a", "c", "a", "b", "a", "c"]
            .into_iter()
            .map(|n| (n, json!({}), "r"))
            .collect();
        let v = feed(&mut d, &abac);
        assert!(v[..7].iter().all(Option::is_none));
        assert!(matches!(&v[7], Some(Verdict::Stop(_))));
    }

    #[test]
    fn an_exact_cycle_nudges_then_stops_when_the_cycle_goes_on_at_once() {
        let mut d = ToolCallLoopDetector::exact_cycle(2, 2, OnDetect::NudgeThenStop).unwrap();
        let v = feed(
            &mut d,
            &[
                ("a", json!({}), "r"),
                ("b", json!({}), "r"),
                ("a", json!({}), "r"),
                ("b", json!({}), "r"),
                ("a", json!({}), "r"),
            ],
        );
        assert!(matches!(&v[3], Some(Verdict::Nudge(t)) if t.contains("(a → b)")));
        assert!(
            matches!(&v[4], Some(Verdict::Stop(r)) if r.code == "tool_call_cycle" && r.detail.contains("right after a nudge"))
        );
    }

    #[test]
    fn exact_cycles_that_are_disabled_or_out_of_range_build_no_detector() {
        assert!(ToolCallLoopDetector::exact_cycle(0, 3, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::exact_cycle(17, 3, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::exact_cycle(2, 0, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::exact_cycle(2, 1, OnDetect::Stop).is_none());
        assert!(ToolCallLoopDetector::exact_cycle(16, usize::MAX, OnDetect::Stop).is_some());
    }

    fn key(args: serde_json::Value) -> u64 {
        call_key(&call("t", args))
    }

    #[test]
    fn arguments_differing_only_in_key_order_at_any_level_have_one_key() {
        assert_eq!(
            key(json!({"b": [{"d": 1, "c": 2}], "a": "x\"y", "e": [null, true, 1.5]})),
            key(json!({"e": [null, true, 1.5], "a": "x\"y", "b": [{"c": 2, "d": 1}]}))
        );
    }

    #[test]
    fn arguments_that_differ_as_json_have_different_keys() {
        let distinct = [
            json!({}),
            json!([]),
            json!(null),
            json!({"a": 1}),
            json!({"a": 1.0}),
            json!({"a": -1}),
            json!({"a": "1"}),
            json!({"a": true}),
            json!({"a": false}),
            json!({"a": null}),
            json!({"a": "b,c"}),
            json!({"a": "b", "c": null}),
            json!({"ab": "c"}),
            json!({"a": "bc"}),
            json!({"a": [1, 2]}),
            json!({"a": [[1], 2]}),
            json!({"a": [1, [2]]}),
            json!({"a": {"b": 1}}),
            json!([{"a": 1}]),
        ];
        let keys: std::collections::HashSet<u64> = distinct.iter().cloned().map(key).collect();
        assert_eq!(keys.len(), distinct.len());
        assert_ne!(
            call_key(&call("a", json!({}))),
            call_key(&call("b", json!({})))
        );
    }
}
