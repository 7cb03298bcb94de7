//! Declared outputs (after Gemini CLI's goal mode): the run is done when the
//! model has emitted every declared output with a value of its type.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::{StateError, StateKey};
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::phase::{HookError, PhaseContext, PhaseHook};
use crate::plugin::{Plugin, PluginRegistrar};

/// The JSON type a declared output must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonType {
    /// A JSON string.
    String,
    /// Any JSON number.
    Number,
    /// A number with no fractional part (`3` and `3.0`, not `3.5`).
    Integer,
    /// `true` or `false`.
    Boolean,
    /// A JSON object.
    Object,
    /// A JSON array.
    Array,
}

impl JsonType {
    /// Whether `value` has this type.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Number => value.is_number(),
            Self::Integer => {
                value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            Self::Boolean => value.is_boolean(),
            Self::Object => value.is_object(),
            Self::Array => value.is_array(),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Number => "number",
            Self::Integer => "integer",
            Self::Boolean => "boolean",
            Self::Object => "object",
            Self::Array => "array",
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JsonType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "string" => Self::String,
            "number" => Self::Number,
            "integer" => Self::Integer,
            "boolean" => Self::Boolean,
            "object" => Self::Object,
            "array" => Self::Array,
            other => {
                return Err(format!(
                    "unknown JSON type \"{other}\"; expected string, number, integer, boolean, object or array"
                ));
            }
        })
    }
}

/// The state key holding the outputs emitted so far in a run (name → value).
/// `AgentRunResult::outputs` and the `RunFinished` event report it.
#[derive(Debug)]
pub struct EmittedOutputs;

impl StateKey for EmittedOutputs {
    const KEY: &'static str = "outputs.emitted";
    type Value = BTreeMap<String, Value>;
}

/// How many nudges the run has had for missing outputs.
struct NudgesUsed;

impl StateKey for NudgesUsed {
    const KEY: &'static str = "outputs.nudges";
    type Value = usize;
}

/// Declares named outputs and adds the tool `emit_output { name, value }`.
///
/// - Each call stores a value (re-emitting overwrites); a name that is not
///   declared, or a value of the wrong type, gives the model an error result.
/// - After each round's tool results are recorded, once every declared
///   output has been emitted the run ends with `Stopped { code: "goal" }`.
/// - When the model answers without calling tools while outputs are
///   missing, a nudge naming them is added and the run goes on — at most
///   [`with_max_nudges`](Self::with_max_nudges) times (default 2); then the
///   run ends with `Stopped { code: "missing_outputs" }` naming them.
///
/// Whatever ends the run, `AgentRunResult::outputs` holds what was emitted.
#[derive(Debug, Clone)]
pub struct OutputsPlugin {
    outputs: Arc<BTreeMap<String, Result<JsonType, String>>>,
    max_nudges: usize,
}

impl OutputsPlugin {
    /// Declares `outputs` as (name, JSON type) pairs, the type one of
    /// `"string"`, `"number"`, `"integer"`, `"boolean"`, `"object"`,
    /// `"array"`. An unknown type makes `build()` fail naming it.
    pub fn new<N, T>(outputs: impl IntoIterator<Item = (N, T)>) -> Self
    where
        N: Into<String>,
        T: AsRef<str>,
    {
        Self {
            outputs: Arc::new(
                outputs
                    .into_iter()
                    .map(|(n, t)| (n.into(), t.as_ref().parse()))
                    .collect(),
            ),
            max_nudges: 2,
        }
    }

    /// How many nudges the model gets for missing outputs (default 2).
    pub fn with_max_nudges(mut self, max_nudges: usize) -> Self {
        self.max_nudges = max_nudges;
        self
    }
}

type Declared = BTreeMap<String, JsonType>;

fn missing(declared: &Declared, emitted: &BTreeMap<String, Value>) -> Vec<String> {
    declared
        .keys()
        .filter(|name| !emitted.contains_key(*name))
        .cloned()
        .collect()
}

fn validate(declared: &Declared, args: &Value) -> Result<(String, Value), ToolError> {
    let names = || declared.keys().cloned().collect::<Vec<_>>().join(", ");
    let name = args.get("name").and_then(Value::as_str).ok_or_else(|| {
        ToolError::new("invalid arguments: `name` must be a string naming a declared output")
    })?;
    let ty = declared.get(name).ok_or_else(|| {
        ToolError::new(format!(
            "unknown output \"{name}\"; declared outputs: {}",
            names()
        ))
    })?;
    let value = args.get("value").ok_or_else(|| {
        ToolError::new(format!(
            "invalid arguments: `value` is required for output \"{name}\""
        ))
    })?;
    if !ty.accepts(value) {
        return Err(ToolError::new(format!(
            "output \"{name}\" must be of type {ty}, got {value}"
        )));
    }
    Ok((name.to_owned(), value.clone()))
}

struct EmitTool(Arc<Declared>);

#[async_trait::async_trait]
impl Tool for EmitTool {
    fn descriptor(&self) -> ToolDescriptor {
        let declared: Vec<String> = self.0.iter().map(|(n, t)| format!("{n} ({t})")).collect();
        ToolDescriptor::new(
            "emit_output",
            format!(
                "Record one of the task's required outputs. Required outputs: {}. Call once per output; emitting a name again replaces its value.",
                declared.join(", ")
            ),
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "enum": self.0.keys().collect::<Vec<_>>() },
                "value": { "description": "The output's value, of its declared type." }
            },
            "required": ["name", "value"]
        }))
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let (name, _) = validate(&self.0, &args)?;
        Ok(ToolOutput::text(format!("recorded output \"{name}\"")))
    }
}

/// Stores valid emissions (AfterToolExecute).
struct Store(Arc<Declared>);

#[async_trait::async_trait]
impl PhaseHook for Store {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let (Some(call), Some(result)) = (ctx.tool_call(), ctx.tool_result()) else {
            return Ok(());
        };
        if call.name != "emit_output" || result.is_error {
            return Ok(());
        }
        if let Ok((name, value)) = validate(&self.0, &call.arguments) {
            ctx.state_mut::<EmittedOutputs>()?.insert(name, value);
        }
        Ok(())
    }
}

/// Ends the run once everything is emitted (StepEnd, after tool results).
struct Goal(Arc<Declared>);

#[async_trait::async_trait]
impl PhaseHook for Goal {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let emitted = ctx.state::<EmittedOutputs>()?;
        if missing(&self.0, emitted).is_empty() {
            let names: Vec<&str> = self.0.keys().map(String::as_str).collect();
            ctx.request_termination(TerminationReason::stopped(
                "goal",
                format!("all declared outputs were emitted: {}", names.join(", ")),
            ));
        }
        Ok(())
    }
}

/// Nudges, then stops, when the model ends with outputs missing (AfterInference).
struct Nudge {
    declared: Arc<Declared>,
    max_nudges: usize,
}

#[async_trait::async_trait]
impl PhaseHook for Nudge {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let answered_without_tools = ctx.inference().is_some_and(|r| r.tool_calls.is_empty());
        if !answered_without_tools || ctx.termination_requested().is_some() {
            return Ok(());
        }
        let missing = missing(&self.declared, ctx.state::<EmittedOutputs>()?);
        if missing.is_empty() {
            return Ok(());
        }
        let list = missing.join(", ");
        let used = *ctx.state::<NudgesUsed>()?;
        if used < self.max_nudges {
            *ctx.state_mut::<NudgesUsed>()? += 1;
            ctx.push_user_message(format!(
                "You stopped calling tools but have not emitted these required outputs: {list}. Call `emit_output` for each of them now, or keep working if you need to."
            ));
            ctx.request_another_round();
        } else {
            ctx.request_termination(TerminationReason::stopped(
                "missing_outputs",
                format!("declared outputs never emitted: {list} (after {used} nudges)"),
            ));
        }
        Ok(())
    }
}

impl Plugin for OutputsPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        let mut declared = Declared::new();
        for (name, ty) in self.outputs.iter() {
            match ty {
                Ok(ty) => {
                    declared.insert(name.clone(), *ty);
                }
                Err(e) => {
                    return Err(StateError::InvalidConfig {
                        message: format!("output \"{name}\": {e}"),
                    });
                }
            }
        }
        if declared.is_empty() {
            return Err(StateError::InvalidConfig {
                message: "OutputsPlugin declares no outputs; declare at least one".to_owned(),
            });
        }
        let declared = Arc::new(declared);
        r.register_key::<EmittedOutputs>()?;
        r.register_key::<NudgesUsed>()?;
        r.register_tool("emit_output", Arc::new(EmitTool(declared.clone())));
        r.register_hook(Phase::AfterToolExecute, Arc::new(Store(declared.clone())));
        r.register_hook(Phase::StepEnd, Arc::new(Goal(declared.clone())));
        r.register_hook(
            Phase::AfterInference,
            Arc::new(Nudge {
                declared,
                max_nudges: self.max_nudges,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_accept_their_values_only() {
        assert!(JsonType::Integer.accepts(&json!(3)));
        assert!(JsonType::Integer.accepts(&json!(3.0)));
        assert!(!JsonType::Integer.accepts(&json!(3.5)));
        assert!(JsonType::Number.accepts(&json!(3.5)));
        assert!(!JsonType::String.accepts(&json!(3)));
        assert!(JsonType::Array.accepts(&json!([])));
        assert!(JsonType::Object.accepts(&json!({})));
        assert!(JsonType::Boolean.accepts(&json!(false)));
        assert!(
            "float"
                .parse::<JsonType>()
                .unwrap_err()
                .contains("unknown JSON type \"float\"")
        );
    }

    #[test]
    fn emissions_are_validated_against_the_declaration() {
        let declared: Declared = [("score".to_owned(), JsonType::Number)].into();
        assert_eq!(
            validate(&declared, &json!({"name": "score", "value": 0.5}))
                .unwrap()
                .0,
            "score"
        );
        let e = validate(&declared, &json!({"name": "scor", "value": 1})).unwrap_err();
        assert_eq!(
            e.message(),
            "unknown output \"scor\"; declared outputs: score"
        );
        let e = validate(&declared, &json!({"name": "score", "value": "high"})).unwrap_err();
        assert_eq!(
            e.message(),
            "output \"score\" must be of type number, got \"high\""
        );
        assert!(validate(&declared, &json!({"name": "score"})).is_err());
    }
}
