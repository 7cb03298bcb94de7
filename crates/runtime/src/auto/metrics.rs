//! Metric reports: the `report_metrics` tool through which an agent records
//! the results of one experiment, and the reports a thread has collected.

use std::collections::BTreeMap;
use std::sync::Arc;

use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::{StateError, StateKey};
use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::phase::{HookError, PhaseContext, PhaseHook};
use crate::plugin::{Plugin, PluginRegistrar};

/// One `report_metrics` call: named numbers and a status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsReport {
    /// Metric values by name (names are matched exactly).
    pub metrics: BTreeMap<String, f64>,
    /// The experiment's status (default `completed`).
    pub status: String,
}

impl MetricsReport {
    /// Whether this report counts as a completed experiment (status
    /// `completed` or `finished`, case-insensitive).
    pub fn is_completed(&self) -> bool {
        let s = self.status.trim();
        s.eq_ignore_ascii_case("completed") || s.eq_ignore_ascii_case("finished")
    }
}

/// The state key holding the reports made during one run. The plugin
/// exports it, so `AgentRunResult::exported::<MetricsReports>()` gives a
/// run's reports.
#[derive(Debug)]
pub struct MetricsReports;

impl StateKey for MetricsReports {
    const KEY: &'static str = "auto.reports";
    type Value = Vec<MetricsReport>;
}

/// A metric's value: a JSON number, or a string holding one as the
/// source's `float()` reads it — surrounding whitespace, a sign, an
/// exponent, `inf`/`nan`, and `_` between digits (`"1_000"`).
fn number(value: &Value) -> Option<f64> {
    if let Some(n) = value.as_f64() {
        return Some(n);
    }
    let text = value.as_str()?.trim();
    if let Ok(n) = text.parse::<f64>() {
        return Some(n);
    }
    let bytes = text.as_bytes();
    let digit = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    let underscores_between_digits = text
        .char_indices()
        .filter(|(_, c)| *c == '_')
        .all(|(i, _)| i > 0 && digit(i - 1) && digit(i + 1));
    if text.contains('_') && underscores_between_digits {
        return text.replace('_', "").parse().ok();
    }
    None
}

fn parse(args: &Value) -> Result<MetricsReport, ToolError> {
    let object = args
        .get("metrics")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ToolError::new("invalid arguments: `metrics` must be an object of name → number")
        })?;
    let mut metrics = BTreeMap::new();
    for (name, value) in object {
        let number = number(value).ok_or_else(|| {
            ToolError::new(format!(
                "invalid arguments: metric \"{name}\" must be a number (or a string holding one, like \"0.93\"), got {value}"
            ))
        })?;
        metrics.insert(name.clone(), number);
    }
    let status = match args.get("status") {
        None | Some(Value::Null) => "completed".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ToolError::new(format!(
                "invalid arguments: `status` must be a string, got {other}"
            )));
        }
    };
    Ok(MetricsReport { metrics, status })
}

/// Adds the tool `report_metrics { metrics: { <name>: number, … }, status?: string }`
/// for auto mode: each valid call records one experiment's results on the
/// run's thread (status `completed` by default). List its id in
/// `plugin_ids` to use goals and experiment budgets.
#[derive(Debug, Clone, Copy, Default)]
pub struct AutomationPlugin;

impl AutomationPlugin {
    /// The plugin.
    pub fn new() -> Self {
        Self
    }
}

struct ReportTool;

#[async_trait::async_trait]
impl Tool for ReportTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            "report_metrics",
            "Record the results of one experiment or work item: named numeric metrics and its status (completed by default).",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "metrics": { "type": "object", "additionalProperties": { "type": "number" } },
                "status": { "type": "string", "description": "completed (default), finished, failed, …" }
            },
            "required": ["metrics"]
        }))
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let report = parse(&args)?;
        Ok(ToolOutput::text(format!(
            "recorded {} metrics with status {}",
            report.metrics.len(),
            report.status
        )))
    }
}

struct Record;

#[async_trait::async_trait]
impl PhaseHook for Record {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let (Some(call), Some(result)) = (ctx.tool_call(), ctx.tool_result()) else {
            return Ok(());
        };
        if call.name != "report_metrics" || result.is_error {
            return Ok(());
        }
        if let Ok(report) = parse(&call.arguments) {
            ctx.state_mut::<MetricsReports>()?.push(report);
        }
        Ok(())
    }
}

impl Plugin for AutomationPlugin {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_key::<MetricsReports>()?;
        // Exported: each run's reports leave the run in its result, where
        // auto mode's session observer picks them up.
        r.export_key::<MetricsReports>()?;
        r.register_tool("report_metrics", Arc::new(ReportTool));
        r.register_hook(Phase::AfterToolExecute, Arc::new(Record));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_with_a_default_status() {
        let r = parse(&json!({"metrics": {"Val ACC": 0.9, "n": 3}})).unwrap();
        assert_eq!(r.metrics["Val ACC"], 0.9);
        assert_eq!(r.status, "completed");
        assert!(r.is_completed());
        let r = parse(&json!({"metrics": {}, "status": "Finished"})).unwrap();
        assert!(r.is_completed());
        let r = parse(&json!({"metrics": {}, "status": "failed"})).unwrap();
        assert!(!r.is_completed());
        assert!(
            parse(&json!({"metrics": {"a": "high"}}))
                .unwrap_err()
                .message()
                .contains("metric \"a\" must be a number")
        );
        assert!(parse(&json!({})).is_err());
    }

    #[test]
    fn numeric_strings_are_read_as_the_source_s_float_reads_them() {
        let r = parse(&json!({"metrics": {
            "F1": "0.93", "loss": " -1.5e-3 ", "n": "+7", "big": "1_000", "inf": "inf"
        }}))
        .unwrap();
        assert_eq!(r.metrics["F1"], 0.93);
        assert_eq!(r.metrics["loss"], -0.0015);
        assert_eq!(r.metrics["n"], 7.0);
        assert_eq!(r.metrics["big"], 1000.0);
        assert!(r.metrics["inf"].is_infinite());
        for bad in ["", "0.9x", "_1", "1__0", "1_", "high"] {
            let error = parse(&json!({"metrics": {"a": bad}})).unwrap_err();
            assert!(
                error.message().contains("metric \"a\" must be a number"),
                "{bad:?}"
            );
        }
    }
}
