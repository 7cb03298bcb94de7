//! The planning flow (after OpenManus's `PlanningFlow`): the model keeps a
//! plan of titled steps with the `plan` tool, and the run ends once no
//! step is active — after one last inference that summarizes the plan's
//! outcome, whose text is the run's response.
//!
//! # The tool
//!
//! `plan { command, … }`, one command a call:
//!
//! | command | arguments | does |
//! |---|---|---|
//! | `create` | `title`, `steps: [string or { title, agent }]` | makes the plan (every step `not_started`); refused when one exists |
//! | `update` | `title?`, `steps?` | retitles or replaces the steps; a step whose text is unchanged at its place keeps its status and notes |
//! | `mark_step` | `step_index` (from 0), `step_status`, `step_notes?` | sets a step's status: `not_started`, `in_progress`, `completed` or `blocked` |
//! | `get` | | shows the plan |
//!
//! Every call answers with the plan as it now stands. A malformed call is
//! an error result naming what is wrong; the plan is unchanged.
//!
//! A step may name a sub-agent (`agent`: its tool name): when a call of
//! that sub-agent ends, the first active step naming it (an `in_progress`
//! one first) records its answer (`result`) and becomes `completed`, or
//! `blocked` when the call failed.
//!
//! # State and events
//!
//! The plan is the run's typed state under [`PlanKey`] (exported: read it
//! with `AgentRunResult::exported::<PlanKey>()`), is in the stop report
//! (`StopReport::plan`) and goes out as a `plan_updated` event when a
//! round's tool calls changed it, once they have all run (a sub-agent
//! step's result recorded in the same round sends one more; AG-UI:
//! `STATE_SNAPSHOT`, then `STATE_DELTA`s, of the state `{ "plan": … }`).
//!
//! # How the run ends
//!
//! After a round's tool results, once the plan has steps and none is
//! `not_started` or `in_progress`, the model is asked once more — with the
//! plan's state, to summarize what was accomplished (OpenManus's
//! `_finalize_plan`) — and that answer ends the run `stopped(plan_completed)`
//! with the counts per status (`3 completed, 1 blocked`). Calls in that
//! answer do not run. A final answer while steps are still active is
//! nudged back to the plan up to [`PlanPlugin::with_max_nudges`] times
//! (default 2); then the run ends `stopped(plan_incomplete)` naming them.
//! A run without a plan ends as any other.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rein_runtime_contract::event::AgentEvent;
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::{StateError, StateKey};
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::phase::{HookError, PhaseContext, PhaseHook};
use crate::plugin::{Plugin, PluginRegistrar};

/// The name of the planning tool.
pub const PLAN_TOOL: &str = "plan";

/// What the model is asked once no step is active; the plan follows it.
pub const FINALIZE_PROMPT: &str = "Every step of the plan is done or blocked. Do not call tools now: write the final answer for the user — a concise summary of what was accomplished, what is blocked and why, and anything left to do. The plan:";

/// A step's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not begun.
    #[default]
    NotStarted,
    /// Being worked on.
    InProgress,
    /// Done.
    Completed,
    /// Cannot be done (its notes say why).
    Blocked,
}

impl StepStatus {
    /// The status's name in the tool and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotStarted => "not_started",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Blocked => "blocked",
        }
    }

    /// Whether a step with this status is still to be done.
    pub fn is_active(self) -> bool {
        matches!(self, Self::NotStarted | Self::InProgress)
    }

    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "not_started" => Self::NotStarted,
            "in_progress" => Self::InProgress,
            "completed" => Self::Completed,
            "blocked" => Self::Blocked,
            _ => return None,
        })
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PlanStep {
    /// What the step is.
    pub title: String,
    /// Where it stands.
    pub status: StepStatus,
    /// Notes the model gave when it marked the step.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
    /// The sub-agent that carries the step out (its tool name), when the
    /// plan names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// What that sub-agent answered (its first 2 000 characters).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub result: String,
}

/// A run's plan.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    /// Its title.
    pub title: String,
    /// Its steps, in order.
    pub steps: Vec<PlanStep>,
}

impl Plan {
    /// How many steps have each status, in status order, leaving out the
    /// statuses no step has: `3 completed, 1 blocked`.
    pub fn counts(&self) -> String {
        let all = [
            StepStatus::Completed,
            StepStatus::Blocked,
            StepStatus::InProgress,
            StepStatus::NotStarted,
        ];
        let parts: Vec<String> = all
            .iter()
            .filter_map(|status| {
                let n = self.steps.iter().filter(|s| s.status == *status).count();
                (n > 0).then(|| format!("{n} {}", status.as_str()))
            })
            .collect();
        parts.join(", ")
    }

    /// Whether the plan has steps and none is active.
    pub fn is_done(&self) -> bool {
        !self.steps.is_empty() && !self.steps.iter().any(|s| s.status.is_active())
    }
}

impl fmt::Display for Plan {
    /// The plan as the model reads it: the title, progress, then one line
    /// per step with its index, status and notes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let done = self
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Completed)
            .count();
        writeln!(f, "Plan: {}", self.title)?;
        writeln!(f, "Progress: {done}/{} steps completed", self.steps.len())?;
        for (i, step) in self.steps.iter().enumerate() {
            write!(f, "{i}. [{}] {}", step.status.as_str(), step.title)?;
            if let Some(agent) = &step.agent {
                write!(f, " (sub-agent: {agent})")?;
            }
            if !step.notes.is_empty() {
                write!(f, " — notes: {}", step.notes)?;
            }
            if !step.result.is_empty() {
                write!(f, " — result: {}", step.result)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// The state key holding the run's plan (`None` until one is made);
/// exported.
#[derive(Debug)]
pub struct PlanKey;

impl StateKey for PlanKey {
    const KEY: &'static str = "plan";
    type Value = Option<Plan>;
}

/// The plugin's per-run bookkeeping.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
struct Bookkeeping {
    /// The final summary was asked for.
    finalizing: bool,
    /// Nudges given for final answers that left steps active.
    nudges: usize,
}

/// The state key of the plugin's bookkeeping.
struct Progress;

impl StateKey for Progress {
    const KEY: &'static str = "plan.progress";
    type Value = Bookkeeping;
}

/// The plans of the runs in progress, by run id: the tool changes them,
/// the hooks copy them into each run's state.
type Plans = Arc<Mutex<HashMap<String, Plan>>>;

fn locked(plans: &Plans) -> std::sync::MutexGuard<'_, HashMap<String, Plan>> {
    plans
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Adds the `plan` tool and the planning flow (see the [module
/// docs](self)). Register it under an id and list that id in
/// `AgentSpec.plugin_ids`; in a deployment file, the built-in id `plan`.
#[derive(Debug, Clone)]
pub struct PlanPlugin {
    plans: Plans,
    max_nudges: usize,
}

impl Default for PlanPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanPlugin {
    /// The planning flow, with 2 nudges for a final answer that leaves
    /// steps active.
    pub fn new() -> Self {
        Self {
            plans: Arc::default(),
            max_nudges: 2,
        }
    }

    /// How many times a final answer that leaves steps active is sent back
    /// to the plan before the run ends `plan_incomplete`.
    pub fn with_max_nudges(mut self, max_nudges: usize) -> Self {
        self.max_nudges = max_nudges;
        self
    }
}

impl Plugin for PlanPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_key::<PlanKey>()?;
        r.export_key::<PlanKey>()?;
        r.register_key::<Progress>()?;
        r.register_tool(PLAN_TOOL, Arc::new(PlanTool(self.plans.clone())));
        r.register_hook(
            Phase::AfterToolExecute,
            Arc::new(Mirror(self.plans.clone())),
        );
        r.register_hook(Phase::StepEnd, Arc::new(Finalize));
        r.register_hook(
            Phase::AfterInference,
            Arc::new(End {
                max_nudges: self.max_nudges,
            }),
        );
        r.register_hook(Phase::RunEnd, Arc::new(Forget(self.plans.clone())));
        Ok(())
    }
}

/// The `plan` tool.
struct PlanTool(Plans);

/// `args["key"]` as a string, or an error naming it.
fn text<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolError::new(format!(
            "invalid arguments: `{key}` must be a string, got {other}"
        ))),
    }
}

/// `args["steps"]` as steps — each a title, or `{ title, agent }` naming
/// the sub-agent that carries it out — or an error naming what is wrong.
fn steps(args: &Value) -> Result<Option<Vec<PlanStep>>, ToolError> {
    let Some(steps) = args.get("steps").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let list = steps.as_array().ok_or_else(|| {
        ToolError::new(format!(
            "invalid arguments: `steps` must be a list of step titles, got {steps}"
        ))
    })?;
    let mut parsed = Vec::with_capacity(list.len());
    for (i, step) in list.iter().enumerate() {
        let (title, agent) = match step {
            Value::String(title) => (title.as_str(), None),
            Value::Object(fields) => (
                fields.get("title").and_then(Value::as_str).unwrap_or(""),
                fields
                    .get("agent")
                    .and_then(Value::as_str)
                    .filter(|a| !a.trim().is_empty())
                    .map(str::to_owned),
            ),
            _ => ("", None),
        };
        let title = title.trim();
        if title.is_empty() {
            return Err(ToolError::new(format!(
                "invalid arguments: step {i} must be a non-empty title, or {{ title, agent }}; got {step}"
            )));
        }
        parsed.push(PlanStep {
            title: title.to_owned(),
            agent,
            ..PlanStep::default()
        });
    }
    if parsed.is_empty() {
        return Err(ToolError::new(
            "invalid arguments: `steps` is empty; a plan needs at least one step",
        ));
    }
    Ok(Some(parsed))
}

/// Applies one command to `plan` (`None`: there is none yet).
fn apply(plan: &mut Option<Plan>, args: &Value) -> Result<(), ToolError> {
    let command = text(args, "command")?.ok_or_else(|| {
        ToolError::new("invalid arguments: `command` is required: create, update, mark_step or get")
    })?;
    match command {
        "create" => {
            if plan.is_some() {
                return Err(ToolError::new(
                    "a plan exists already; change it with `update`, or mark its steps with `mark_step`",
                ));
            }
            let title = text(args, "title")?.unwrap_or("Plan").to_owned();
            let steps = steps(args)?.ok_or_else(|| {
                ToolError::new("invalid arguments: `create` needs `steps`, a list of step titles")
            })?;
            *plan = Some(Plan { title, steps });
        }
        "update" => {
            let current = plan
                .as_mut()
                .ok_or_else(|| ToolError::new("there is no plan yet; make one with `create`"))?;
            if let Some(title) = text(args, "title")? {
                title.clone_into(&mut current.title);
            }
            if let Some(steps) = steps(args)? {
                let old = std::mem::take(&mut current.steps);
                current.steps = steps
                    .into_iter()
                    .enumerate()
                    .map(|(i, step)| match old.get(i) {
                        Some(kept) if kept.title == step.title && kept.agent == step.agent => {
                            kept.clone()
                        }
                        _ => step,
                    })
                    .collect();
            }
        }
        "mark_step" => {
            let current = plan
                .as_mut()
                .ok_or_else(|| ToolError::new("there is no plan yet; make one with `create`"))?;
            let count = current.steps.len();
            let index = args
                .get("step_index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|i| *i < count)
                .ok_or_else(|| {
                    ToolError::new(format!(
                        "invalid arguments: `step_index` must be a step's index, 0 to {}; got {}",
                        count.saturating_sub(1),
                        args.get("step_index").unwrap_or(&Value::Null)
                    ))
                })?;
            let status = text(args, "step_status")?
                .map(|s| {
                    StepStatus::parse(s).ok_or_else(|| {
                        ToolError::new(format!(
                            "invalid arguments: unknown `step_status` \"{s}\"; use not_started, in_progress, completed or blocked"
                        ))
                    })
                })
                .transpose()?;
            let notes = text(args, "step_notes")?;
            if status.is_none() && notes.is_none() {
                return Err(ToolError::new(
                    "invalid arguments: `mark_step` needs `step_status` or `step_notes`",
                ));
            }
            let step = &mut current.steps[index];
            if let Some(status) = status {
                step.status = status;
            }
            if let Some(notes) = notes {
                notes.clone_into(&mut step.notes);
            }
        }
        "get" => {
            if plan.is_none() {
                return Err(ToolError::new(
                    "there is no plan yet; make one with `create`",
                ));
            }
        }
        other => {
            return Err(ToolError::new(format!(
                "invalid arguments: unknown command \"{other}\"; use create, update, mark_step or get"
            )));
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl Tool for PlanTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            PLAN_TOOL,
            "Keep a plan for the task: `create` it with a title and its steps, `mark_step` each step in_progress when you start it and completed (or blocked, with notes saying why) when it is done, `update` it if the task changes, `get` it to see it. The task is finished when no step is not_started or in_progress.",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "command": { "type": "string", "enum": ["create", "update", "mark_step", "get"] },
                "title": { "type": "string", "description": "The plan's title (create, update)." },
                "steps": {
                    "type": "array",
                    "items": {
                        "anyOf": [
                            { "type": "string" },
                            { "type": "object", "properties": { "title": { "type": "string" }, "agent": { "type": "string" } }, "required": ["title"] }
                        ]
                    },
                    "description": "The steps, in order (create, update): a title, or { title, agent } to carry the step out with that sub-agent (its result is recorded on the step)."
                },
                "step_index": { "type": "integer", "minimum": 0, "description": "The step to mark, from 0 (mark_step)." },
                "step_status": { "type": "string", "enum": ["not_started", "in_progress", "completed", "blocked"] },
                "step_notes": { "type": "string", "description": "What was found or why the step is blocked (mark_step)." }
            },
            "required": ["command"]
        }))
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let mut plans = locked(&self.0);
        let mut plan = plans.get(&ctx.run_id).cloned();
        apply(&mut plan, &args)?;
        let Some(plan) = plan else {
            return Err(ToolError::new(
                "there is no plan yet; make one with `create`",
            ));
        };
        let shown = plan.to_string();
        plans.insert(ctx.run_id.clone(), plan);
        Ok(ToolOutput::text(shown))
    }
}

/// Copies the run's plan into its state after a `plan` call, and reports
/// a change (AfterToolExecute: the round's calls have all run, so the
/// first of them reports the plan as the round left it).
struct Mirror(Plans);

#[async_trait::async_trait]
impl PhaseHook for Mirror {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let (Some(call), Some(result)) = (ctx.tool_call(), ctx.tool_result()) else {
            return Ok(());
        };
        if call.name != PLAN_TOOL && !record_step_result(&self.0, ctx.run_id(), &call.name, result)
        {
            return Ok(());
        }
        let plan = locked(&self.0).get(ctx.run_id()).cloned();
        if plan.is_none() || *ctx.state::<PlanKey>()? == plan {
            return Ok(());
        }
        let value = serde_json::to_value(&plan).unwrap_or(Value::Null);
        *ctx.state_mut::<PlanKey>()? = plan;
        let (run_id, thread_id) = (ctx.run_id().to_owned(), ctx.thread_id().to_owned());
        ctx.emit(AgentEvent::PlanUpdated {
            run_id,
            thread_id,
            plan: value,
        });
        Ok(())
    }
}

/// The most characters of a sub-agent's answer a step keeps.
const MAX_STEP_RESULT: usize = 2_000;

/// A call of the sub-agent `tool` ended with `result`: the first active
/// step naming it (one `in_progress` first, else one `not_started`) keeps
/// the answer and is `completed`, or `blocked` when the call failed.
/// Whether a step changed.
fn record_step_result(
    plans: &Plans,
    run_id: &str,
    tool: &str,
    result: &rein_runtime_contract::message::ToolResult,
) -> bool {
    let mut plans = locked(plans);
    let Some(plan) = plans.get_mut(run_id) else {
        return false;
    };
    let names = |s: &PlanStep| s.agent.as_deref() == Some(tool);
    let at = plan
        .steps
        .iter()
        .position(|s| names(s) && s.status == StepStatus::InProgress)
        .or_else(|| {
            plan.steps
                .iter()
                .position(|s| names(s) && s.status == StepStatus::NotStarted)
        });
    let Some(step) = at.map(|i| &mut plan.steps[i]) else {
        return false;
    };
    step.result = crate::detectors::snippet(&result.content, MAX_STEP_RESULT);
    step.status = if result.is_error {
        StepStatus::Blocked
    } else {
        StepStatus::Completed
    };
    true
}

/// Once no step is active, asks for the final summary (StepEnd, after
/// the round's tool results).
struct Finalize;

#[async_trait::async_trait]
impl PhaseHook for Finalize {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.termination_requested().is_some() || ctx.state::<Progress>()?.finalizing {
            return Ok(());
        }
        let Some(plan) = ctx.state::<PlanKey>()?.as_ref().filter(|p| p.is_done()) else {
            return Ok(());
        };
        let prompt = format!("{FINALIZE_PROMPT}\n{plan}");
        ctx.state_mut::<Progress>()?.finalizing = true;
        ctx.push_user_message(prompt);
        ctx.request_another_round();
        Ok(())
    }
}

/// Ends the run after the final summary, or nudges a final answer that
/// leaves steps active (AfterInference).
struct End {
    max_nudges: usize,
}

#[async_trait::async_trait]
impl PhaseHook for End {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        if ctx.termination_requested().is_some() {
            return Ok(());
        }
        let Bookkeeping { finalizing, nudges } = *ctx.state::<Progress>()?;
        let Some(plan) = ctx.state::<PlanKey>()?.clone() else {
            return Ok(());
        };
        // A failed attempt is retried as usual; only an answer counts.
        if ctx.inference().is_none() {
            return Ok(());
        }
        if finalizing {
            ctx.request_termination(TerminationReason::stopped(
                "plan_completed",
                format!(
                    "plan \"{}\": {} ({} steps)",
                    plan.title,
                    plan.counts(),
                    plan.steps.len()
                ),
            ));
            return Ok(());
        }
        let answered_without_tools = ctx.inference().is_some_and(|r| r.tool_calls.is_empty());
        if !answered_without_tools || plan.is_done() {
            return Ok(());
        }
        let active: Vec<String> = plan
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.status.is_active())
            .map(|(i, s)| format!("{i}. {} ({})", s.title, s.status.as_str()))
            .collect();
        if nudges < self.max_nudges {
            ctx.state_mut::<Progress>()?.nudges += 1;
            ctx.push_user_message(format!(
                "The plan still has steps to do: {}. Work on them and mark each with `plan` (mark_step), or mark a step blocked with notes saying why.",
                active.join("; ")
            ));
            ctx.request_another_round();
        } else {
            ctx.request_termination(TerminationReason::stopped(
                "plan_incomplete",
                format!(
                    "plan \"{}\" still has active steps after {nudges} nudges: {}",
                    plan.title,
                    active.join("; ")
                ),
            ));
        }
        Ok(())
    }
}

/// Drops the run's plan from the tool's table (RunEnd), keeping it in the
/// run's state (which its export and stop report read): a `plan` call
/// whose round was cut before its hooks ran is not lost.
struct Forget(Plans);

#[async_trait::async_trait]
impl PhaseHook for Forget {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let plan = locked(&self.0).remove(ctx.run_id());
        if plan.is_some() && *ctx.state::<PlanKey>()? != plan {
            *ctx.state_mut::<PlanKey>()? = plan;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_change_the_plan_and_bad_ones_name_what_is_wrong() {
        let mut plan = None;
        apply(
            &mut plan,
            &json!({"command": "create", "title": "Ship", "steps": ["build", "test", "tag"]}),
        )
        .unwrap();
        apply(
            &mut plan,
            &json!({"command": "mark_step", "step_index": 1, "step_status": "completed", "step_notes": "green"}),
        )
        .unwrap();
        // An update keeps a step whose text is unchanged at its place.
        apply(
            &mut plan,
            &json!({"command": "update", "steps": ["build", "test", "publish"]}),
        )
        .unwrap();
        let shown = plan.as_ref().unwrap();
        assert_eq!(shown.steps[1].status, StepStatus::Completed);
        assert_eq!(shown.steps[1].notes, "green");
        assert_eq!(shown.steps[2].status, StepStatus::NotStarted);
        assert_eq!(shown.counts(), "1 completed, 2 not_started");
        assert!(
            shown
                .to_string()
                .contains("1. [completed] test — notes: green")
        );
        let cases = [
            (
                json!({"command": "create", "steps": ["x"]}),
                "a plan exists already",
            ),
            (
                json!({"command": "mark_step", "step_index": 3, "step_status": "completed"}),
                "0 to 2; got 3",
            ),
            (
                json!({"command": "mark_step", "step_index": 0, "step_status": "done"}),
                "unknown `step_status` \"done\"",
            ),
            (
                json!({"command": "update", "steps": []}),
                "`steps` is empty",
            ),
            (json!({"command": "fly"}), "unknown command \"fly\""),
            (json!({}), "`command` is required"),
        ];
        for (args, expected) in cases {
            let before = plan.clone();
            let error = apply(&mut plan, &args).unwrap_err();
            assert!(
                error.message().contains(expected),
                "{args}: {}",
                error.message()
            );
            assert_eq!(plan, before, "a refused call changes nothing");
        }
        assert!(!plan.as_ref().unwrap().is_done());
    }
}
