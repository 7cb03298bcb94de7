//! The stop report every run ends with, and the honest record of tool
//! calls that did not complete: `not_started`, `interrupted` (a read-only
//! tool stopped early), `may_have_completed` (a tool with side effects
//! stopped while it ran).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use rein::contract::event::AgentEvent;
use rein::contract::lifecycle::{IncompleteToolCall, LimitUsage, ToolCallStatus};
use rein::prelude::*;
use serde_json::{Value, json};

/// Waits until the run is cancelled; says when it has started.
struct Waiting {
    name: &'static str,
    read_only: bool,
    entered: Arc<AtomicUsize>,
}

impl Waiting {
    fn tool(name: &'static str, read_only: bool, entered: &Arc<AtomicUsize>) -> Arc<dyn Tool> {
        Arc::new(Self {
            name,
            read_only,
            entered: entered.clone(),
        })
    }
}

#[async_trait::async_trait]
impl Tool for Waiting {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.name, "waits")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        Ok(ToolOutput::text("never"))
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[tokio::test]
async fn a_run_stopped_at_its_round_limit_reports_every_limit_and_how_to_go_on() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("echo", json!({"n": 1})).with_usage(100, 10),
    ])
    .repeat_last();
    let agent = spec()
        .with_max_rounds(3)
        .with_stop_condition(StopConditionSpec::TokenBudget { max_total: 100_000 })
        .with_stop_condition(StopConditionSpec::Timeout { seconds: 600 })
        .with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 4 });
    let runtime = builder_with(model, agent)
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime.run(user("t", "go"), sink.clone()).await.unwrap();
    let report = &result.report;
    assert_eq!(report.code, "max_rounds");
    assert_eq!(
        report.detail,
        result
            .termination
            .to_string()
            .split_once(": ")
            .map_or(String::new(), |(_, d)| d.to_owned())
    );
    let names: Vec<&str> = report.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "max_rounds",
            "token_budget",
            "timeout",
            "consecutive_errors"
        ]
    );
    assert_eq!(
        report.limits[0],
        LimitUsage::new("max_rounds", 3, 3, "rounds")
    );
    assert_eq!(
        report.limits[1],
        LimitUsage::new("token_budget", 330, 100_000, "tokens")
    );
    assert_eq!(report.limits[2].limit, 600_000);
    assert_eq!(
        report.limits[3],
        LimitUsage::new("consecutive_errors", 0, 4, "errors")
    );
    // The third round's call was not run: the limit stopped the run first.
    let statuses: Vec<ToolCallStatus> = report.tool_calls.iter().map(|c| c.status).collect();
    assert_eq!(statuses, [ToolCallStatus::NotStarted]);
    assert!(report.resumable, "a call that never began had no effect");
    let hint = report.hint.as_deref().unwrap();
    assert!(hint.contains("raise max_rounds (now 3)"), "{hint}");
    // The same report ends the event stream.
    match sink.events().last() {
        Some(AgentEvent::RunFinished {
            report: Some(r), ..
        }) => assert_eq!(r, report),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_natural_end_is_resumable_and_needs_no_hint() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]),
        spec(),
    )
    .build()
    .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(result.report.code, "natural_end");
    assert!(result.report.resumable);
    assert_eq!(result.report.hint, None);
    assert_eq!(result.report.limits.len(), 1, "the default max_rounds");
}

#[tokio::test]
async fn a_cancel_records_read_only_calls_as_interrupted_and_others_as_may_have_completed() {
    let entered = Arc::new(AtomicUsize::new(0));
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_calls(vec![
        ("lookup", json!({})),
        ("send_mail", json!({})),
    ])]);
    let runtime = builder_with(model, spec())
        .with_tool("lookup", Waiting::tool("lookup", true, &entered))
        .with_tool("send_mail", Waiting::tool("send_mail", false, &entered))
        .build()
        .unwrap();
    let handle = runtime.mailbox().submit(user("t", "go")).await.unwrap();
    while entered.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    assert!(runtime.cancel_and_wait_by_thread("t").await);
    let result = handle.wait().await.unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    let report = &result.report;
    let statuses: Vec<(&str, ToolCallStatus)> = report
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("lookup", ToolCallStatus::Interrupted),
            ("send_mail", ToolCallStatus::MayHaveCompleted),
        ]
    );
    assert!(!report.resumable, "send_mail may have sent the mail");
    let hint = report.hint.as_deref().unwrap();
    assert!(
        hint.starts_with("check whether the interrupted call (send_mail) took effect"),
        "{hint}"
    );
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let results = tool_results(&history);
    assert!(results[0].1.contains("— interrupted: "), "{results:?}");
    assert!(
        results[1].1.contains("— may_have_completed: "),
        "{results:?}"
    );
    // The same, structured, on the result messages themselves.
    let statuses: Vec<Option<ToolCallStatus>> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.tool_status)
        .collect();
    assert_eq!(
        statuses,
        [
            Some(ToolCallStatus::Interrupted),
            Some(ToolCallStatus::MayHaveCompleted)
        ]
    );
}

#[tokio::test]
async fn calls_a_stop_leaves_unrun_are_not_started_and_the_run_stays_resumable() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::tool_calls(vec![
        ("finish", json!({})),
        ("echo", json!({})),
    ])]);
    let agent = spec().with_stop_condition(StopConditionSpec::StopOnTool {
        tool_name: "finish".into(),
    });
    let runtime = builder_with(model, agent)
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_tool("finish", Arc::new(Echo("finish")))
        .build()
        .unwrap();
    let result = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(result.report.code, "stop_on_tool");
    let names: Vec<&IncompleteToolCall> = result.report.tool_calls.iter().collect();
    assert_eq!(names.len(), 2);
    assert!(names.iter().all(|c| c.status == ToolCallStatus::NotStarted));
    assert!(result.report.resumable);
    let history = runtime.thread_messages("t").await;
    assert!(tool_results(&history).iter().all(|r| {
        r.1.ends_with("— not_started: the call never began, so it had no effect")
    }));
    let tool_messages: Vec<&Message> = history.iter().filter(|m| m.role == Role::Tool).collect();
    assert_eq!(tool_messages.len(), 2);
    assert!(
        tool_messages
            .iter()
            .all(|m| m.tool_status == Some(ToolCallStatus::NotStarted)),
        "{tool_messages:?}"
    );
    // It is part of the stored JSON, and absent from a completed result.
    let json = serde_json::to_value(tool_messages[0]).unwrap();
    assert_eq!(json["tool_status"], "not_started");
    let plain = serde_json::to_value(Message::tool("c", "ok")).unwrap();
    assert!(plain.get("tool_status").is_none(), "{plain}");
}

#[tokio::test]
async fn cancelling_one_tool_call_answers_it_as_cancelled_by_the_user_and_the_run_goes_on() {
    let entered = Arc::new(AtomicUsize::new(0));
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("send_mail", json!({"to": "x"})).with_call_id("c1"),
        ScriptedResponse::text("I stopped sending it."),
    ]);
    let runtime = builder_with(model, spec())
        .with_tool("send_mail", Waiting::tool("send_mail", false, &entered))
        .build()
        .unwrap();
    let handle = runtime.mailbox().submit(user("t", "go")).await.unwrap();
    let run_id = handle.run_id().to_owned();
    match runtime.cancel_tool_call("no-such-run", "c1") {
        Err(e @ rein::CancelToolCallError::UnknownRun { .. }) => {
            assert_eq!(e.code(), "unknown_run");
        }
        other => panic!("{other:?}"),
    }
    while entered.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    match runtime.cancel_tool_call(&run_id, "c2") {
        Err(e @ rein::CancelToolCallError::NotRunning { .. }) => {
            assert!(e.to_string().contains("running now: c1"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    runtime.cancel_tool_call(&run_id, "c1").unwrap();
    let result = handle.wait().await.unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "I stopped sending it.");
    assert_eq!(
        result.report.tool_calls,
        [IncompleteToolCall::new(
            "c1",
            "send_mail",
            ToolCallStatus::MayHaveCompleted
        )]
    );
    assert!(!result.report.resumable);
    let history = runtime.thread_messages("t").await;
    assert_history_valid(&history);
    let results = tool_results(&history);
    assert!(
        results[0].1.starts_with("cancelled by the user: this call was stopped before it finished; the run goes on — may_have_completed"),
        "{results:?}"
    );
}
