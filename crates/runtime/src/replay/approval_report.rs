//! What an agent's approval rules would have done to recorded tool calls:
//! [`approvals`] reads a recording, finds for each call the first of the
//! agent's [`ApprovalRule`](rein_runtime_contract::approval::ApprovalRule)s
//! that matches it (as the live gate does), and tallies the outcome per
//! tool and per rule. A team measures rules on real traffic this way before
//! enabling them (`rein replay`; `docs/replay.md`).
//!
//! The calls are those of `tool_call_started` events and, for calls that
//! were held and never started, of `approval_requested` events; each call
//! id counts once per run, with the arguments the model gave (the first of
//! its events: a held call that was edited starts later with other
//! arguments). Calls of `ask_user` (an `approval_requested` of kind
//! `question`, or an `ask_user` call of an agent with that plugin) are
//! questions, which no rule decides: they are counted apart. The runs are
//! the ones [`replay`](super::replay) judges: sub-agent runs of another
//! agent are left out.

use std::collections::BTreeMap;

use rein_runtime_contract::approval::{ApprovalAction, CompiledRule, PendingKind};
use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::spec::AgentSpec;
use serde::{Deserialize, Serialize};

use super::{Recorded, runs_of};
use crate::approvals::ASK_USER;

/// What an agent's approval rules would have done to the tool calls of a
/// recording ([`approvals`] says which calls count).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ApprovalReport {
    /// Runs read.
    pub runs: usize,
    /// Tool calls seen, questions excluded.
    pub calls: usize,
    /// Calls of `ask_user`: questions, which no rule decides.
    pub questions: usize,
    /// Per tool, by name.
    pub tools: BTreeMap<String, ToolTally>,
    /// Per rule, in the agent's order.
    pub rules: Vec<RuleTally>,
}

/// What the rules would have done to one tool's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolTally {
    /// Calls seen.
    pub calls: usize,
    /// Runs with at least one call of the tool.
    pub runs: usize,
    /// Calls an `ask` rule would have held for a person.
    pub ask: usize,
    /// Calls a `deny` rule would have refused.
    pub deny: usize,
    /// Calls an `allow` rule would have let run.
    pub allow: usize,
    /// Calls no rule matches: they run.
    pub no_rule: usize,
}

/// How many calls one rule would have decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RuleTally {
    /// The rule's position in the agent's `approvals` (from 0).
    pub index: usize,
    /// The rule, e.g. `ask fs__* when path =~ ^/etc/`.
    pub rule: String,
    /// What it does.
    pub action: ApprovalAction,
    /// Calls it was the first match of.
    pub calls: usize,
    /// Runs in which it decided at least one call.
    pub runs: usize,
}

impl ApprovalReport {
    /// Adds `other`'s counts to this report's: both must be reports of the
    /// same agent's rules (e.g. over two recordings).
    pub fn merge(&mut self, other: ApprovalReport) {
        self.runs += other.runs;
        self.calls += other.calls;
        self.questions += other.questions;
        for (tool, t) in other.tools {
            let mine = self.tools.entry(tool).or_default();
            mine.calls += t.calls;
            mine.runs += t.runs;
            mine.ask += t.ask;
            mine.deny += t.deny;
            mine.allow += t.allow;
            mine.no_rule += t.no_rule;
        }
        if self.rules.is_empty() {
            self.rules = other.rules;
            return;
        }
        for (mine, r) in self.rules.iter_mut().zip(other.rules) {
            mine.calls += r.calls;
            mine.runs += r.runs;
        }
    }
}

/// One recorded call: its tool, its arguments and whether it is a question.
struct Call<'a> {
    tool: &'a str,
    arguments: &'a serde_json::Value,
    question: bool,
}

/// What `spec`'s approval rules would have done to each tool call of
/// `recording`: for each call the first matching rule decides, as in a
/// live run; tallied per tool and per rule.
///
/// The calls are those of `tool_call_started` events and, for calls that
/// were held and never started, of `approval_requested` events; each call
/// id counts once per run, with the arguments of its first event (the
/// model's: a held call that was edited starts later with other
/// arguments). Calls of `ask_user` are questions, counted apart. The runs
/// are the ones [`replay`](super::replay) judges: sub-agent runs of
/// another agent are left out.
///
/// # Errors
///
/// A rule that does not compile, named by its position, e.g.
/// `approvals[1]: approval rule for tool "fs__*": `when.path` is not a valid
/// regex ("(")…`.
pub fn approvals(spec: &AgentSpec, recording: &[Recorded]) -> Result<ApprovalReport, String> {
    let rules: Vec<CompiledRule> = spec
        .approvals
        .iter()
        .enumerate()
        .map(|(i, rule)| rule.compiled().map_err(|e| format!("approvals[{i}]: {e}")))
        .collect::<Result<_, _>>()?;
    let asks_user = spec.plugin_ids.iter().any(|p| p == ASK_USER);
    let mut report = ApprovalReport {
        rules: rules
            .iter()
            .enumerate()
            .map(|(index, r)| RuleTally {
                index,
                rule: r.rule.describe(),
                action: r.rule.action,
                calls: 0,
                runs: 0,
            })
            .collect(),
        ..ApprovalReport::default()
    };
    for (_, events) in runs_of(spec, recording) {
        report.runs += 1;
        // The run's calls in the order first seen, each once.
        let mut order: Vec<&str> = Vec::new();
        let mut calls: BTreeMap<&str, Call<'_>> = BTreeMap::new();
        for r in events {
            let (call_id, call) = match &r.event {
                AgentEvent::ToolCallStarted {
                    call_id,
                    name,
                    arguments,
                    ..
                } => (
                    call_id.as_str(),
                    Call {
                        tool: name,
                        arguments,
                        question: asks_user && name == ASK_USER,
                    },
                ),
                AgentEvent::ApprovalRequested {
                    call_id,
                    tool,
                    arguments,
                    kind,
                    ..
                } => (
                    call_id.as_str(),
                    Call {
                        tool,
                        arguments,
                        question: *kind == PendingKind::Question || (asks_user && tool == ASK_USER),
                    },
                ),
                _ => continue,
            };
            if !calls.contains_key(call_id) {
                order.push(call_id);
                calls.insert(call_id, call);
            }
        }
        let mut tools_seen: Vec<&str> = Vec::new();
        let mut rules_seen: Vec<usize> = Vec::new();
        for call in order.iter().filter_map(|id| calls.get(id)) {
            if call.question {
                report.questions += 1;
                continue;
            }
            report.calls += 1;
            let tally = report.tools.entry(call.tool.to_owned()).or_default();
            tally.calls += 1;
            if !tools_seen.contains(&call.tool) {
                tools_seen.push(call.tool);
                tally.runs += 1;
            }
            let Some(index) = rules
                .iter()
                .position(|r| r.matches(call.tool, call.arguments))
            else {
                tally.no_rule += 1;
                continue;
            };
            match rules[index].rule.action {
                ApprovalAction::Ask => tally.ask += 1,
                ApprovalAction::Deny => tally.deny += 1,
                ApprovalAction::Allow => tally.allow += 1,
            }
            let rule = &mut report.rules[index];
            rule.calls += 1;
            if !rules_seen.contains(&index) {
                rules_seen.push(index);
                rule.runs += 1;
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rein_runtime_contract::approval::ApprovalRule;
    use serde_json::json;

    use super::*;

    fn line(run: &str, event: serde_json::Value) -> Recorded {
        let mut event = event;
        event["run_id"] = json!(run);
        event["thread_id"] = json!("t");
        Recorded {
            at_ms: 0,
            event: serde_json::from_value(event).unwrap(),
        }
    }

    fn started(run: &str, call: &str, name: &str, arguments: serde_json::Value) -> Recorded {
        line(
            run,
            json!({"type": "tool_call_started", "call_id": call, "name": name, "arguments": arguments}),
        )
    }

    fn requested(run: &str, call: &str, tool: &str, arguments: serde_json::Value) -> Recorded {
        line(
            run,
            json!({"type": "approval_requested", "call_id": call, "tool": tool, "arguments": arguments}),
        )
    }

    fn run_started(run: &str, agent: &str) -> Recorded {
        line(run, json!({"type": "run_started", "agent_id": agent}))
    }

    fn agent(rules: Vec<ApprovalRule>) -> AgentSpec {
        let mut spec = AgentSpec::new("a");
        spec.approvals = rules;
        spec
    }

    #[test]
    fn the_first_matching_rule_decides_each_call_and_unmatched_calls_run() {
        let spec = agent(vec![
            ApprovalRule::new("fs__*", ApprovalAction::Deny).when("path", "^/etc/"),
            ApprovalRule::new("fs__write_file", ApprovalAction::Ask),
            ApprovalRule::new("fs__*", ApprovalAction::Allow),
        ]);
        let recording = vec![
            run_started("r1", "a"),
            started("r1", "c1", "fs__write_file", json!({"path": "/etc/passwd"})),
            started("r1", "c2", "fs__write_file", json!({"path": "/tmp/x"})),
            started("r1", "c3", "fs__read_file", json!({"path": "/tmp/x"})),
            started("r1", "c4", "lookup", json!({"q": "rust"})),
            run_started("r2", "a"),
            started("r2", "c1", "fs__write_file", json!({"path": "/etc/hosts"})),
        ];
        let report = approvals(&spec, &recording).unwrap();
        assert_eq!((report.runs, report.calls, report.questions), (2, 5, 0));
        let write = &report.tools["fs__write_file"];
        assert_eq!(
            (write.calls, write.runs, write.ask, write.deny, write.allow),
            (3, 2, 1, 2, 0)
        );
        assert_eq!(report.tools["fs__read_file"].allow, 1);
        let lookup = &report.tools["lookup"];
        assert_eq!((lookup.calls, lookup.no_rule), (1, 1));
        let decided: Vec<(usize, usize)> = report.rules.iter().map(|r| (r.calls, r.runs)).collect();
        assert_eq!(decided, [(2, 2), (1, 1), (1, 1)]);
        assert_eq!(report.rules[0].rule, "deny fs__* when path =~ ^/etc/");
        assert_eq!(report.rules[1].action, ApprovalAction::Ask);
    }

    #[test]
    fn a_held_call_counts_once_with_the_arguments_the_model_gave() {
        // Held, approved with edited arguments, then started; and one held
        // call that never started.
        let spec = agent(vec![
            ApprovalRule::new("pay", ApprovalAction::Ask).when("amount", "^[0-9]{4,}$"),
        ]);
        let recording = vec![
            run_started("r1", "a"),
            requested("r1", "c1", "pay", json!({"amount": 5000})),
            line(
                "r1",
                json!({"type": "approval_decided", "call_id": "c1", "decision": "edit"}),
            ),
            started("r1", "c1", "pay", json!({"amount": 50})),
            requested("r1", "c2", "pay", json!({"amount": 9999})),
        ];
        let report = approvals(&spec, &recording).unwrap();
        let pay = &report.tools["pay"];
        assert_eq!((pay.calls, pay.ask, pay.no_rule), (2, 2, 0));
        assert_eq!(report.rules[0].calls, 2);
    }

    #[test]
    fn questions_are_counted_apart_and_no_rule_decides_them() {
        let mut spec = agent(vec![ApprovalRule::new("*", ApprovalAction::Deny)]);
        spec.plugin_ids.push(ASK_USER.to_owned());
        let recording = vec![
            run_started("r1", "a"),
            line(
                "r1",
                json!({"type": "approval_requested", "call_id": "q1", "tool": "ask_user", "arguments": {"question": "which?"}, "kind": "question"}),
            ),
            started("r1", "c2", "ask_user", json!({"question": "and?"})),
            started("r1", "c3", "shell", json!({"cmd": "ls"})),
        ];
        let report = approvals(&spec, &recording).unwrap();
        assert_eq!((report.calls, report.questions), (1, 2));
        assert!(!report.tools.contains_key("ask_user"));
        assert_eq!(report.tools["shell"].deny, 1);
    }

    #[test]
    fn sub_agent_runs_of_another_agent_are_left_out() {
        let spec = agent(vec![ApprovalRule::new("*", ApprovalAction::Ask)]);
        let recording = vec![
            run_started("r1", "a"),
            started("r1", "c1", "research", json!({"topic": "x"})),
            line(
                "r1",
                json!({"type": "subagent_started", "call_id": "c1", "child_run_id": "r2", "child_thread_id": "t2", "agent_id": "researcher"}),
            ),
            run_started("r2", "researcher"),
            started("r2", "c1", "search", json!({"q": "x"})),
        ];
        let report = approvals(&spec, &recording).unwrap();
        assert_eq!(report.runs, 1);
        assert_eq!(report.tools.keys().collect::<Vec<_>>(), ["research"]);
    }

    #[test]
    fn reports_of_two_recordings_merge_into_one() {
        let spec = agent(vec![ApprovalRule::new("shell", ApprovalAction::Ask)]);
        let one = vec![
            run_started("r1", "a"),
            started("r1", "c1", "shell", json!({})),
        ];
        let two = vec![
            run_started("r9", "a"),
            started("r9", "c1", "shell", json!({})),
            started("r9", "c2", "lookup", json!({})),
        ];
        let mut report = approvals(&spec, &one).unwrap();
        report.merge(approvals(&spec, &two).unwrap());
        assert_eq!((report.runs, report.calls), (2, 3));
        let shell = &report.tools["shell"];
        assert_eq!((shell.calls, shell.runs, shell.ask), (2, 2, 2));
        assert_eq!((report.rules[0].calls, report.rules[0].runs), (2, 2));
        assert_eq!(report.tools["lookup"].no_rule, 1);
    }

    #[test]
    fn a_rule_that_does_not_compile_is_named_by_its_position_and_pattern() {
        let spec = agent(vec![
            ApprovalRule::new("shell", ApprovalAction::Ask),
            ApprovalRule::new("fs__*", ApprovalAction::Deny).when("path", "("),
        ]);
        let error = approvals(&spec, &[]).unwrap_err();
        assert!(error.starts_with("approvals[1]: "), "{error}");
        assert!(
            error.contains("`when.path`") && error.contains("\"(\""),
            "{error}"
        );
    }
}
