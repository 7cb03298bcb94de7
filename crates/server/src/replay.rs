//! `rein replay`: an agent's stop conditions and detectors over recorded
//! runs ([`rein::replay`]), and what its approval rules would have done to
//! the recorded tool calls ([`rein::replay::approvals`]), printed as a
//! table or as JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rein::registry_spec::AgentSpec;
use rein::replay::{
    ApprovalReport, JudgingModel, RunReplay, approvals, read_recording, replay, replay_judged,
};
use serde::Serialize;

use crate::deployment::Deployment;

/// How often one code fired over all runs.
#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub(crate) struct Tally {
    /// Runs in which it fired at least once.
    runs: usize,
    /// Firings in all.
    firings: usize,
}

/// A replay's report: each recorded run with where each condition would
/// have fired, how often each fired, and what the approval rules would
/// have done (`rein replay --json`, `POST /v1/replay`).
#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct Report {
    /// The recorded runs the agent's conditions judge, in order.
    runs: Vec<RunReplay>,
    /// How often each code fired.
    summary: Summary,
    /// Present when the agent has approval rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    approvals: Option<ApprovalReport>,
    /// Conditions the replay could not evaluate, each with why (the
    /// conditions a model judges, replayed without their models).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_evaluated: Vec<String>,
}

/// How often each code fired over all runs.
#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct Summary {
    /// The runs replayed.
    runs: usize,
    /// By stop code.
    codes: BTreeMap<String, Tally>,
}

/// Replays `recordings` (each a name for errors and its JSON-lines text)
/// against `spec`; with `models`, the judging models of its
/// `llm_loop_check` and `task_complete` conditions, those are evaluated
/// too (each check a real inference).
///
/// # Errors
///
/// A recording that does not parse, or approval rules that do not
/// compile; the message names the recording.
pub(crate) async fn report(
    spec: &AgentSpec,
    recordings: &[(String, String)],
    models: Option<&[JudgingModel]>,
) -> Result<Report, String> {
    let mut runs = Vec::new();
    let mut approval_report: Option<ApprovalReport> = None;
    let judged: Vec<&str> = spec
        .stop_conditions
        .iter()
        .map(|c| c.kind())
        .filter(|kind| matches!(*kind, "llm_loop_check" | "task_complete"))
        .collect();
    let not_evaluated = match models {
        None if !judged.is_empty() => judged
            .iter()
            .map(|kind| {
                format!("{kind}: a model judges it, and this replay has no models (replay with the deployment file that declares them)")
            })
            .collect(),
        _ => Vec::new(),
    };
    for (name, text) in recordings {
        let recording = read_recording(text).map_err(|message| format!("{name}: {message}"))?;
        match models {
            Some(models) if !judged.is_empty() => {
                runs.extend(replay_judged(spec, &recording, models).await?);
            }
            _ => runs.extend(replay(spec, &recording)),
        }
        if !spec.approvals.is_empty() {
            let report = approvals(spec, &recording)
                .map_err(|message| format!("agent \"{}\": {message}", spec.id))?;
            match approval_report.as_mut() {
                Some(all) => all.merge(report),
                None => approval_report = Some(report),
            }
        }
    }
    let mut codes: BTreeMap<String, Tally> = BTreeMap::new();
    for run in &runs {
        let mut seen: Vec<&str> = Vec::new();
        for f in &run.firings {
            let tally = codes.entry(f.code.clone()).or_default();
            tally.firings += 1;
            if !seen.contains(&f.code.as_str()) {
                seen.push(&f.code);
                tally.runs += 1;
            }
        }
    }
    Ok(Report {
        summary: Summary {
            runs: runs.len(),
            codes,
        },
        runs,
        approvals: approval_report,
        not_evaluated,
    })
}

/// Runs the subcommand.
pub(crate) fn command(
    config: &Path,
    agent: Option<&str>,
    json: bool,
    recordings: &[PathBuf],
    app: &crate::App,
) -> ExitCode {
    let (spec, deployment) = match agent_spec(config, agent, app) {
        Ok(found) => found,
        Err(message) => {
            eprintln!("rein: {message}");
            return ExitCode::FAILURE;
        }
    };
    let mut texts = Vec::new();
    for path in recordings {
        match std::fs::read_to_string(path) {
            Ok(text) => texts.push((path.display().to_string(), text)),
            Err(e) => {
                eprintln!("rein: {}: cannot read the recording: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rein: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(async {
        let models = match &deployment {
            Some(deployment)
                if spec
                    .stop_conditions
                    .iter()
                    .any(|c| matches!(c.kind(), "llm_loop_check" | "task_complete")) =>
            {
                Some(judging_models(deployment, &spec.id)?)
            }
            _ => None,
        };
        report(&spec, &texts, models.as_deref()).await
    });
    let report = match report {
        Ok(report) => report,
        Err(message) => {
            eprintln!("rein: {message}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("rein: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", table(&report.runs, &report.summary));
        if let Some(approvals) = &report.approvals {
            print!("{}", approvals_table(approvals));
        }
        for note in &report.not_evaluated {
            println!("not evaluated: {note}");
        }
    }
    ExitCode::SUCCESS
}

/// The readable report: each run's firings, then how often each fired.
fn table(runs: &[RunReplay], summary: &Summary) -> String {
    let mut out = String::new();
    for run in runs {
        out.push_str(&format!(
            "run {} ({} rounds, ended {})\n",
            run.run_id,
            run.rounds,
            run.ended.as_deref().unwrap_or("unknown")
        ));
        if run.firings.is_empty() {
            out.push_str("  nothing would have fired\n");
        }
        for f in &run.firings {
            out.push_str(&format!(
                "  round {:>3}  {:<18} {:<6} {}\n",
                f.round, f.code, f.action, f.detail
            ));
        }
    }
    out.push_str(&format!("\n{} runs replayed\n", summary.runs));
    if summary.codes.is_empty() {
        out.push_str("no condition would have fired\n");
    }
    for (code, tally) in &summary.codes {
        out.push_str(&format!(
            "{code:<18} fired in {}/{} runs ({} firings)\n",
            tally.runs, summary.runs, tally.firings
        ));
    }
    out
}

/// The readable approvals report: per tool what the rules would have done
/// to its calls, then how many calls each rule would have decided.
fn approvals_table(report: &ApprovalReport) -> String {
    let mut out = format!(
        "\napproval rules over {} runs: {} tool calls",
        report.runs, report.calls
    );
    if report.questions > 0 {
        out.push_str(&format!(" (and {} ask_user questions)", report.questions));
    }
    out.push('\n');
    let width = report
        .tools
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max("tool".len());
    out.push_str(&format!(
        "  {:<width$}  {:>5}  {:>4}  {:>4}  {:>5}  {:>7}  {:>4}\n",
        "tool", "calls", "ask", "deny", "allow", "no rule", "runs"
    ));
    for (tool, t) in &report.tools {
        out.push_str(&format!(
            "  {tool:<width$}  {:>5}  {:>4}  {:>4}  {:>5}  {:>7}  {:>4}\n",
            t.calls, t.ask, t.deny, t.allow, t.no_rule, t.runs
        ));
    }
    for r in &report.rules {
        out.push_str(&format!(
            "  [{}] {:<40} would have decided {} calls in {}/{} runs\n",
            r.index, r.rule, r.calls, r.runs, report.runs
        ));
    }
    out
}

/// The judging models of agent `agent_id` of `deployment`: its runtime is
/// built (no MCP server is started) for their executors.
fn judging_models(deployment: &Deployment, agent_id: &str) -> Result<Vec<JudgingModel>, String> {
    let runtime = crate::assemble::builder(deployment)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .judging_models(agent_id)
        .ok_or_else(|| format!("no agent \"{agent_id}\""))
}

/// The agent to evaluate: `config` is an agent spec, or a deployment file
/// whose agent `agent` names (or its only agent); the deployment too when
/// it is one.
fn agent_spec(
    config: &Path,
    agent: Option<&str>,
    app: &crate::App,
) -> Result<(AgentSpec, Option<Deployment>), String> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("{}: cannot read the file: {e}", config.display()))?;
    let is_deployment = serde_yaml::from_str::<serde_yaml::Value>(&text)
        .ok()
        .and_then(|v| v.get("agents").cloned())
        .is_some();
    if !is_deployment {
        return rein::config::load_agent_spec_file(config)
            .map(|spec| (spec, None))
            .map_err(|e| e.to_string());
    }
    let deployment = Deployment::load_with(config, &app.extras()).map_err(|e| e.to_string())?;
    let known = || {
        deployment
            .agents
            .iter()
            .map(|a| a.spec.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let spec = match agent {
        Some(id) => deployment
            .agent(id)
            .map(|a| a.spec.clone())
            .ok_or_else(|| format!("--agent {id}: no such agent; agents: {}", known())),
        None if deployment.agents.len() == 1 => Ok(deployment.agents[0].spec.clone()),
        None => Err(format!(
            "{} has {} agents; choose one with --agent ({})",
            config.display(),
            deployment.agents.len(),
            known()
        )),
    }?;
    Ok((spec, Some(deployment)))
}
