//! A run tree's records: a sub-agent's run gets its own run entry (with
//! its parent run and tool call), made from the root run's events.
//!
//! The runtime delivers a child run's events on its parent's sink, so the
//! root run's sink sees the whole tree: `subagent_started` (on the parent)
//! makes the child's entry and notes it among the parent's children; every
//! event of a descendant is logged, unchanged, in its own run's entry and
//! in each ancestor's below the root (the root logs everything anyway),
//! and sent to those runs' thread tails; the child's `run_finished`
//! finishes its entry with the result it carries.
//!
//! So `GET /v1/runs/{child}` and its stream work as for any run, and
//! cancelling a child (by its run id) ends that child alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rein_runtime::AgentRunResult;
use rein_runtime_contract::event::AgentEvent;

use crate::records::{Records, RunEntry, ThreadTail};

/// A descendant's entry and its thread's tail.
type Descendant = (Arc<RunEntry>, Arc<ThreadTail>);

/// Told of each descendant's new entry, on the sink's call (a mode that
/// keeps runs elsewhere writes the child's there too).
pub(crate) type ChildHook = Arc<dyn Fn(&Arc<RunEntry>) + Send + Sync>;

/// The descendants of one root run, by run id.
pub(crate) struct Tree {
    records: Arc<Records>,
    runs: Mutex<HashMap<String, Descendant>>,
    on_child: Option<ChildHook>,
}

impl Tree {
    pub(crate) fn new(records: Arc<Records>, on_child: Option<ChildHook>) -> Self {
        Self {
            records,
            runs: Mutex::default(),
            on_child,
        }
    }

    /// Routes an event of the tree under `root`: makes a child's entry on
    /// `subagent_started`, logs a descendant's event in its entry and its
    /// ancestors' (below the root), and finishes a child on its
    /// `run_finished`.
    pub(crate) fn route(&self, root: &Arc<RunEntry>, event: &AgentEvent) {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut at = runs.get(event.run_id()).cloned();
        while let Some((entry, tail)) = at {
            entry.log_to(&tail, event.clone());
            at = entry
                .parent()
                .and_then(|(parent, _)| runs.get(&parent).cloned());
        }
        match event {
            AgentEvent::SubagentStarted {
                run_id,
                call_id,
                child_run_id,
                child_thread_id,
                agent_id,
                ..
            } => {
                let Some(child) = self.records.create_child(
                    child_run_id,
                    child_thread_id,
                    agent_id,
                    (run_id, call_id),
                ) else {
                    tracing::warn!(run = %child_run_id, "a sub-agent run's id is taken; its record is not kept");
                    return;
                };
                match runs.get(run_id) {
                    Some((parent, _)) => parent.add_child(child_run_id),
                    None => root.add_child(child_run_id),
                }
                let tail = self.records.tail(child_thread_id);
                if let Some(hook) = &self.on_child {
                    hook(&child);
                }
                runs.insert(child_run_id.clone(), (child, tail));
            }
            // A child that never ran (it could not start) has no
            // `run_finished`: its end is the parent's word.
            AgentEvent::SubagentFinished {
                child_run_id,
                termination,
                ..
            } => {
                if let Some((entry, tail)) = runs.remove(child_run_id) {
                    drop(tail);
                    drop(runs);
                    let result =
                        AgentRunResult::new(child_run_id, &entry.thread_id, termination.clone());
                    self.records.finish_child(&entry, result);
                }
            }
            AgentEvent::RunFinished {
                run_id,
                thread_id,
                termination,
                response,
                cancel_cause,
                steps,
                usage,
                cache_usage,
                outputs,
                report,
                ..
            } => {
                if let Some((entry, tail)) = runs.remove(run_id) {
                    drop(tail);
                    let mut result = AgentRunResult::new(run_id, thread_id, termination.clone());
                    result.response.clone_from(response);
                    result.cancel_cause.clone_from(cancel_cause);
                    result.steps = *steps;
                    result.usage = *usage;
                    result.cache_usage = *cache_usage;
                    result.outputs.clone_from(outputs);
                    if let Some(report) = report {
                        result.report = report.clone();
                    }
                    drop(runs);
                    self.records.finish_child(&entry, result);
                }
            }
            _ => {}
        }
    }
}
