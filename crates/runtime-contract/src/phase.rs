//! The phases of a run, in loop order. Plugins attach hooks to them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A point in a run where plugin hooks run.
///
/// Order within a run: `RunStart`, then per round `StepStart`,
/// `BeforeInference`, `AfterInference`, per tool call `BeforeToolExecute` and
/// `AfterToolExecute`, `StepEnd`; finally `RunEnd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Once, before the first round.
    RunStart,
    /// At the start of each round.
    StepStart,
    /// Just before the model is called.
    BeforeInference,
    /// After the model answered (or failed); stop conditions run here.
    AfterInference,
    /// Before each tool call, in call order.
    BeforeToolExecute,
    /// After each tool call, in call order.
    AfterToolExecute,
    /// At the end of each round.
    StepEnd,
    /// Once, after the last round, before `RunFinished`.
    RunEnd,
}

impl Phase {
    /// Every phase, in loop order.
    pub const ALL: [Phase; 8] = [
        Phase::RunStart,
        Phase::StepStart,
        Phase::BeforeInference,
        Phase::AfterInference,
        Phase::BeforeToolExecute,
        Phase::AfterToolExecute,
        Phase::StepEnd,
        Phase::RunEnd,
    ];

    /// The phase's snake-case name, e.g. `after_inference`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::RunStart => "run_start",
            Phase::StepStart => "step_start",
            Phase::BeforeInference => "before_inference",
            Phase::AfterInference => "after_inference",
            Phase::BeforeToolExecute => "before_tool_execute",
            Phase::AfterToolExecute => "after_tool_execute",
            Phase::StepEnd => "step_end",
            Phase::RunEnd => "run_end",
        }
    }

    /// The phase's position in [`Phase::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
