//! What a detector does each time it fires: an escalation [`Ladder`] of
//! `warn`, `nudge`, `deny`, `escalate` and `stop` steps, and per-tool rules for the
//! tool-call loop detectors ([`ToolLoopRule`]).
//!
//! A ladder is set per detector code on the agent
//! ([`AgentSpec::escalation`](crate::spec::AgentSpec::escalation)) and
//! replaces that detector's `on_detect`:
//!
//! ```yaml
//! escalation:
//!   tool_call_loop: [warn, nudge, { deny: 2 }, stop]
//!   stuck: [nudge, stop]
//! tool_rules:
//!   write_file: { threshold: 2 }   # a side effect: two repeats are a loop
//!   poll_status: { exempt: true }  # meant to repeat: never part of a loop
//! ```
//!
//! The first detection takes the first step, and each step is taken `count`
//! times (1 when not given) before the next; the last step repeats. So
//! `[warn, nudge, { deny: 2 }, stop]` warns on the first detection, nudges
//! on the second, takes `deny` on the third and fourth (each refusing the
//! next repetition; the one that takes it has run), and stops on the fifth.
//! `on_detect: stop` is the ladder `[stop]`, `nudge_then_stop` is
//! `[nudge, stop]`; a ladder without `stop` never ends the run (a detector
//! can be measured with `[warn]` before it is trusted to stop anything).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::lifecycle::OnDetect;

/// The detector codes a ladder can be set for.
pub const LADDER_CODES: &[&str] = &[
    "tool_call_loop",
    "tool_call_cycle",
    "tool_error_loop",
    "content_chanting",
    "stuck",
    "error_rate",
    "no_progress",
    "awaiting_user",
    "llm_loop_check",
    "task_complete",
];

/// The detector codes whose ladders may `deny` (they watch tool calls).
pub const DENY_CODES: &[&str] = &["tool_call_loop", "tool_call_cycle", "tool_error_loop"];

/// The most times one step may be taken.
pub const MAX_STEP_COUNT: u32 = 1000;

/// One action of a ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EscalationAction {
    /// Report the detection as an event (`detected`); nothing else.
    Warn,
    /// Add a corrective user message before the next inference.
    Nudge,
    /// Do not run the repeated tool call; its result says why (tool-call
    /// detectors only).
    Deny,
    /// End the run with the detector's code.
    Stop,
    /// Park the run for a person ([`crate::approval`]): a pending entry of
    /// kind `escalation` with the detector's code and detail; they answer
    /// `continue` (with a message the model sees, optionally), `stop` (the
    /// run ends with the detector's code) or `take_over` (the run ends
    /// `stopped(taken_over)`, the thread left to them).
    Escalate,
}

impl EscalationAction {
    /// The action's name in YAML and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warn => "warn",
            Self::Nudge => "nudge",
            Self::Deny => "deny",
            Self::Stop => "stop",
            Self::Escalate => "escalate",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "warn" => Self::Warn,
            "nudge" => Self::Nudge,
            "deny" => Self::Deny,
            "stop" => Self::Stop,
            "escalate" => Self::Escalate,
            _ => return None,
        })
    }
}

impl fmt::Display for EscalationAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step of a ladder: an action taken `count` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EscalationStep {
    /// What to do.
    pub action: EscalationAction,
    /// How many detections it answers (at least 1).
    pub count: u32,
}

impl EscalationStep {
    /// `action`, taken `count` times.
    pub fn new(action: EscalationAction, count: u32) -> Self {
        Self { action, count }
    }
}

/// An ordered list of steps a detector climbs, one detection at a time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ladder {
    steps: Vec<EscalationStep>,
}

impl Ladder {
    /// A ladder of `steps`.
    ///
    /// # Errors
    ///
    /// No steps, a count of 0 or over [`MAX_STEP_COUNT`], or a step after
    /// `stop` (it could never be reached).
    pub fn new(steps: Vec<EscalationStep>) -> Result<Self, String> {
        if steps.is_empty() {
            return Err(
                "a ladder needs at least one step (warn, nudge, deny, escalate or stop)".to_owned(),
            );
        }
        for (i, step) in steps.iter().enumerate() {
            if step.count == 0 || step.count > MAX_STEP_COUNT {
                return Err(format!(
                    "step {} ({}) has count {}; a count is 1 to {MAX_STEP_COUNT}",
                    i + 1,
                    step.action,
                    step.count
                ));
            }
            if step.action == EscalationAction::Stop && i + 1 < steps.len() {
                return Err(format!(
                    "step {} is `stop`, so the {} after it can never be reached; end the ladder with `stop`",
                    i + 1,
                    steps.len() - i - 1
                ));
            }
        }
        Ok(Self { steps })
    }

    /// The ladder `on_detect` stands for: `[stop]` or `[nudge, stop]`.
    pub fn from_on_detect(on_detect: OnDetect) -> Self {
        let stop = EscalationStep::new(EscalationAction::Stop, 1);
        let steps = match on_detect {
            OnDetect::Stop => vec![stop],
            OnDetect::NudgeThenStop => vec![EscalationStep::new(EscalationAction::Nudge, 1), stop],
        };
        Self { steps }
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[EscalationStep] {
        &self.steps
    }

    /// The action for detection `n` (from 1): the step whose counts cover
    /// it, or the last step once they are used up.
    pub fn action(&self, n: u32) -> EscalationAction {
        let mut covered: u32 = 0;
        for step in &self.steps {
            covered = covered.saturating_add(step.count);
            if n <= covered {
                return step.action;
            }
        }
        self.steps
            .last()
            .map_or(EscalationAction::Stop, |s| s.action)
    }

    /// Whether any step is `action`.
    pub fn has(&self, action: EscalationAction) -> bool {
        self.steps.iter().any(|s| s.action == action)
    }
}

impl fmt::Display for Ladder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if s.count == 1 {
                write!(f, "{}", s.action)?;
            } else {
                write!(f, "{{ {}: {} }}", s.action, s.count)?;
            }
        }
        f.write_str("]")
    }
}

impl Serialize for Ladder {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.steps.len()))?;
        for step in &self.steps {
            if step.count == 1 {
                seq.serialize_element(step.action.as_str())?;
            } else {
                seq.serialize_element(&StepMap(*step))?;
            }
        }
        seq.end()
    }
}

struct StepMap(EscalationStep);

impl Serialize for StepMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(self.0.action.as_str(), &self.0.count)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for Ladder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(LadderVisitor)
    }
}

struct LadderVisitor;

impl<'de> Visitor<'de> for LadderVisitor {
    type Value = Ladder;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of steps, each `warn`, `nudge`, `deny`, `stop` or `{ <step>: count }`")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ladder, A::Error> {
        let mut steps = Vec::new();
        while let Some(step) = seq.next_element::<StepItem>()? {
            steps.push(step.0);
        }
        Ladder::new(steps).map_err(de::Error::custom)
    }
}

/// One ladder item: `nudge` or `{ nudge: 2 }`.
struct StepItem(EscalationStep);

impl<'de> Deserialize<'de> for StepItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StepVisitor)
    }
}

struct StepVisitor;

fn action<E: de::Error>(name: &str) -> Result<EscalationAction, E> {
    EscalationAction::parse(name).ok_or_else(|| {
        E::custom(format!(
            "unknown step \"{name}\"; expected warn, nudge, deny, escalate or stop"
        ))
    })
}

impl<'de> Visitor<'de> for StepVisitor {
    type Value = StepItem;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a step: `warn`, `nudge`, `deny`, `stop` or `{ <step>: count }`")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<StepItem, E> {
        Ok(StepItem(EscalationStep::new(action(v)?, 1)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StepItem, A::Error> {
        let Some(name) = map.next_key::<String>()? else {
            return Err(de::Error::custom(
                "an empty step; write `{ nudge: 2 }` or just `nudge`",
            ));
        };
        let action = action(&name)?;
        let count: u32 = map.next_value()?;
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "a step names one action: write `{ nudge: 2 }`, then the next step as its own item",
            ));
        }
        Ok(StepItem(EscalationStep::new(action, count)))
    }
}

/// Checks that `code` is a detector a ladder can be set for.
///
/// # Errors
///
/// The code is unknown; the message lists the known ones.
pub fn check_code(code: &str) -> Result<(), String> {
    if LADDER_CODES.contains(&code) {
        Ok(())
    } else {
        Err(format!(
            "unknown detector \"{code}\"; ladders can be set for: {}",
            LADDER_CODES.join(", ")
        ))
    }
}

/// Checks that `ladder` denies only if `code` watches tool calls.
///
/// # Errors
///
/// A `deny` step for a detector not in [`DENY_CODES`].
pub fn check_deny(code: &str, ladder: &Ladder) -> Result<(), String> {
    if ladder.has(EscalationAction::Deny) && !DENY_CODES.contains(&code) {
        Err(format!(
            "`{code}` does not watch tool calls, so its ladder cannot `deny`; `deny` is for {}",
            DENY_CODES.join(", ")
        ))
    } else {
        Ok(())
    }
}

/// Checks that a ladder for `code` has a detector to act on: a `code`
/// stop condition among the agent's `listed` kinds.
///
/// # Errors
///
/// No such stop condition is listed; the message says to add one or drop
/// the ladder.
pub fn check_listed(code: &str, listed: &[&str]) -> Result<(), String> {
    if listed.contains(&code) {
        Ok(())
    } else {
        Err(format!(
            "a ladder is set for `{code}`, but no `{code}` stop condition is listed; add one to stop_conditions or drop the ladder"
        ))
    }
}

/// Checks that tool rules (the first for `tool`) have a detector to apply
/// to: `tool_call_loop` or `tool_call_cycle` among the `listed` kinds.
///
/// # Errors
///
/// Neither is listed.
pub fn check_tool_rules_listed(tool: &str, listed: &[&str]) -> Result<(), String> {
    if listed
        .iter()
        .any(|k| *k == "tool_call_loop" || *k == "tool_call_cycle")
    {
        Ok(())
    } else {
        Err(format!(
            "tool_rules (for \"{tool}\") apply to `tool_call_loop` and `tool_call_cycle`, and neither is listed; add one to stop_conditions or drop the rules"
        ))
    }
}

/// Deserializes an agent's `escalation:` map, checking each code as it
/// is read (a known detector code; `deny` only for tool-call detectors).
///
/// # Errors
///
/// An unknown code, a bad ladder, or `deny` for a detector that does not
/// watch tool calls.
pub fn deserialize_escalation<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Ladder>, D::Error> {
    d.deserialize_map(EscalationVisitor { listed: None })
}

/// [`deserialize_escalation`] for an agent whose stop conditions are
/// known: a ladder for a detector not among `listed` is refused at its
/// code ([`check_listed`]).
///
/// # Errors
///
/// As [`deserialize_escalation`], and a code not listed.
pub fn deserialize_escalation_listed<'de, D: Deserializer<'de>>(
    d: D,
    listed: &[&str],
) -> Result<BTreeMap<String, Ladder>, D::Error> {
    d.deserialize_map(EscalationVisitor {
        listed: Some(listed),
    })
}

struct EscalationVisitor<'l> {
    listed: Option<&'l [&'l str]>,
}

impl<'de> Visitor<'de> for EscalationVisitor<'_> {
    type Value = BTreeMap<String, Ladder>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map from detector code to ladder")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(code) = map.next_key::<String>()? {
            // Checked at the key, then at the ladder, for the positions.
            check_code(&code).map_err(|e| de::Error::custom(format!("escalation: {e}")))?;
            if let Some(listed) = self.listed {
                check_listed(&code, listed)
                    .map_err(|e| de::Error::custom(format!("escalation: {e}")))?;
            }
            let ladder: Ladder = map.next_value()?;
            check_deny(&code, &ladder)
                .map_err(|e| de::Error::custom(format!("escalation: {e}")))?;
            if out.insert(code.clone(), ladder).is_some() {
                return Err(de::Error::custom(format!(
                    "escalation: `{code}` is given twice"
                )));
            }
        }
        Ok(out)
    }
}

/// A tool's own rule for the tool-call loop detectors (`tool_call_loop`,
/// `tool_call_cycle`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawRule")]
#[non_exhaustive]
pub struct ToolLoopRule {
    /// Repetitions that make a loop of a cycle with this tool, instead of
    /// the detector's threshold (the lowest of the cycle's tools holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<usize>,
    /// The tool is meant to repeat: its calls are never part of a loop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exempt: bool,
}

impl ToolLoopRule {
    /// A loop of this tool after `threshold` repetitions (at least 2).
    pub fn threshold(threshold: usize) -> Self {
        Self {
            threshold: Some(threshold),
            exempt: false,
        }
    }

    /// A tool whose calls never count toward a loop.
    pub fn exempt() -> Self {
        Self {
            threshold: None,
            exempt: true,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    threshold: Option<usize>,
    #[serde(default)]
    exempt: bool,
}

impl TryFrom<RawRule> for ToolLoopRule {
    type Error = String;

    fn try_from(raw: RawRule) -> Result<Self, String> {
        if let Some(t) = raw.threshold
            && !(2..=crate::config::MAX_THRESHOLD).contains(&t)
        {
            return Err(format!(
                "threshold {t} is out of range: 2 to {}",
                crate::config::MAX_THRESHOLD
            ));
        }
        if raw.exempt && raw.threshold.is_some() {
            return Err("a tool is either exempt or has its own threshold, not both".to_owned());
        }
        if !raw.exempt && raw.threshold.is_none() {
            return Err("give the tool a `threshold` or `exempt: true`".to_owned());
        }
        Ok(Self {
            threshold: raw.threshold,
            exempt: raw.exempt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(yaml: &str) -> Result<Ladder, String> {
        serde_yaml::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn each_step_answers_its_count_of_detections_and_the_last_repeats() {
        let l = ladder("[warn, nudge, { deny: 2 }, stop]").unwrap();
        let actions: Vec<_> = (1..=6).map(|n| l.action(n).as_str()).collect();
        assert_eq!(actions, ["warn", "nudge", "deny", "deny", "stop", "stop"]);
        let watch = ladder("[warn]").unwrap();
        assert_eq!(watch.action(100), EscalationAction::Warn);
        assert_eq!(l.to_string(), "[warn, nudge, { deny: 2 }, stop]");
        let back: Ladder = serde_yaml::from_str(&serde_yaml::to_string(&l).unwrap()).unwrap();
        assert_eq!(back, l);
    }

    #[test]
    fn on_detect_values_are_ladders() {
        assert_eq!(
            Ladder::from_on_detect(OnDetect::NudgeThenStop),
            ladder("[nudge, stop]").unwrap()
        );
        assert_eq!(
            Ladder::from_on_detect(OnDetect::Stop),
            ladder("[stop]").unwrap()
        );
    }

    #[test]
    fn bad_ladders_say_what_to_fix() {
        assert!(ladder("[]").unwrap_err().contains("at least one step"));
        assert!(
            ladder("[shout]")
                .unwrap_err()
                .contains("unknown step \"shout\"")
        );
        assert!(ladder("[{ nudge: 0 }]").unwrap_err().contains("count 0"));
        assert!(
            ladder("[stop, warn]")
                .unwrap_err()
                .contains("can never be reached")
        );
        assert!(
            ladder("[{ nudge: 1, stop: 1 }]")
                .unwrap_err()
                .contains("names one action")
        );
    }

    #[test]
    fn a_tool_rule_is_a_threshold_or_an_exemption() {
        let rule: ToolLoopRule = serde_yaml::from_str("{ threshold: 2 }").unwrap();
        assert_eq!(rule, ToolLoopRule::threshold(2));
        let rule: ToolLoopRule = serde_yaml::from_str("{ exempt: true }").unwrap();
        assert_eq!(rule, ToolLoopRule::exempt());
        let e = serde_yaml::from_str::<ToolLoopRule>("{ threshold: 1 }").unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = serde_yaml::from_str::<ToolLoopRule>("{ exempt: true, threshold: 3 }").unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
        let e = serde_yaml::from_str::<ToolLoopRule>("{ treshold: 3 }").unwrap_err();
        assert!(e.to_string().contains("unknown field `treshold`"), "{e}");
    }
}
