//! Tool approvals through the public API: rules (allow, ask, deny, globs,
//! argument matchers), parking with the round's other calls run, decisions
//! in any order and batching, exactly the approved or edited arguments
//! running once, no model request between the park and the decided calls,
//! timeouts, cancels and new input while parked, `ask_user`, and approvals
//! inside a sub-agent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rein::approvals::{
    ApprovalAction, ApprovalError, ApprovalRule, AskUserPlugin, Decision, OnTimeout, PendingKind,
};
use rein::prelude::*;
use serde_json::{Value, json};

/// What the tools of a test saw: (tool, arguments), in order of running.
type Ran = Arc<Mutex<Vec<(String, Value)>>>;

fn recording_tool(name: &'static str, ran: &Ran) -> Arc<dyn Tool> {
    let ran = ran.clone();
    tool_fn(
        name,
        "records its arguments",
        move |args: Value, _ctx: ToolContext| {
            let ran = ran.clone();
            async move {
                ran.lock().unwrap().push((name.to_owned(), args.clone()));
                Ok::<_, ToolError>(format!("{name} done"))
            }
        },
    )
}

/// A model that counts its requests and answers from `script`; after the
/// script it answers "asked again" — a model that would answer
/// differently if asked again.
fn counting_model(script: Vec<ScriptedResponse>) -> (ScriptedExecutor, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let script = Mutex::new(script.into_iter());
    let executor = ScriptedExecutor::from_fn(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        script
            .lock()
            .unwrap()
            .next()
            .unwrap_or_else(|| ScriptedResponse::text("asked again"))
    });
    (executor, asked)
}

fn runtime(spec: AgentSpec, executor: ScriptedExecutor, ran: &Ran) -> AgentRuntime {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec.with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(executor))
        .with_tool("fs__write_file", recording_tool("fs__write_file", ran))
        .with_tool("fs__read_file", recording_tool("fs__read_file", ran))
        .with_tool("shell", recording_tool("shell", ran))
        .with_tool("search", recording_tool("search", ran))
        .with_plugin("ask_user", Arc::new(AskUserPlugin::new()))
        .build()
        .unwrap()
}

fn ops() -> AgentSpec {
    AgentSpec::new("ops")
        .with_approval(
            ApprovalRule::new("fs__write_file", ApprovalAction::Deny).when("path", "^/etc/"),
        )
        .with_approval(ApprovalRule::new("fs__*", ApprovalAction::Ask))
        .with_approval(ApprovalRule::new("shell", ApprovalAction::Ask))
}

/// Waits until `n` calls of `run_id` are pending.
async fn until_pending(
    rt: &AgentRuntime,
    run_id: &str,
    n: usize,
) -> Vec<rein::approvals::PendingApproval> {
    for _ in 0..2000 {
        let pending: Vec<_> = rt
            .pending_approvals(None)
            .into_iter()
            .filter(|p| p.run_id == run_id)
            .collect();
        if pending.len() == n {
            return pending;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!(
        "run {run_id} never had {n} pending approvals: {:?}",
        rt.pending_approvals(None)
    );
}

/// Starts `request` to let go when it parks; the parked run it hands over.
async fn let_go(rt: &AgentRuntime, request: RunRequest) -> rein::approvals::ParkedRun {
    let handle = rt
        .mailbox()
        .submit(request.release_when_parked())
        .await
        .unwrap();
    match handle.wait_or_parked().await.unwrap() {
        RunExit::Parked(parked) => *parked,
        other => panic!("the run did not let go when it parked: {other:?}"),
    }
}

fn kinds(events: &[AgentEvent]) -> Vec<&'static str> {
    events.iter().map(AgentEvent::kind).collect()
}

fn spawn(
    rt: &AgentRuntime,
    request: RunRequest,
) -> tokio::task::JoinHandle<Result<AgentRunResult, RuntimeError>> {
    let rt = rt.clone();
    tokio::spawn(async move { rt.run_to_completion(request).await })
}

#[tokio::test]
async fn an_approved_call_runs_once_with_its_arguments_and_no_model_request_comes_between() {
    let ran = Ran::default();
    let (model, asked) = counting_model(vec![
        ScriptedResponse::tool_calls(vec![
            ("search", json!({"q": "disk"})),
            ("shell", json!({"cmd": "df -h"})),
        ]),
        ScriptedResponse::text("disk is fine"),
    ]);
    let rt = runtime(ops(), model, &ran);
    let sink = Arc::new(CollectingSink::new());
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("check the disk")])
            .with_run_id("r1")
            .with_event_sink(sink.clone()),
    );
    let pending = until_pending(&rt, "r1", 1).await;
    assert_eq!(pending[0].tool, "shell");
    assert_eq!(pending[0].arguments, json!({"cmd": "df -h"}));
    assert_eq!(pending[0].kind, PendingKind::Approval);
    assert_eq!(pending[0].rule.as_deref(), Some("ask shell"));
    // The round's other call ran; the held one did not; the model was
    // asked once.
    assert_eq!(
        ran.lock().unwrap().clone(),
        vec![("search".to_owned(), json!({"q": "disk"}))]
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    // The thread shows the round so far while the run waits.
    let history = rt.thread_messages("t").await;
    assert_eq!(history.iter().filter(|m| m.role == Role::Tool).count(), 1);

    let decided = rt
        .decide("r1", &pending[0].call_id, Decision::Approve)
        .unwrap();
    assert!(!decided.repeated);
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "disk is fine");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(
        ran.lock().unwrap().clone(),
        vec![
            ("search".to_owned(), json!({"q": "disk"})),
            ("shell".to_owned(), json!({"cmd": "df -h"})),
        ]
    );
    // Between the decision and the held call's start nothing else happened.
    let events = sink.events();
    let k = kinds(&events);
    let decided_at = k.iter().position(|k| *k == "approval_decided").unwrap();
    assert_eq!(
        &k[decided_at - 2..decided_at],
        ["approval_requested", "run_parked"]
    );
    assert_eq!(
        &k[decided_at + 1..decided_at + 3],
        ["tool_call_started", "tool_call_finished"]
    );
    assert_eq!(k[decided_at + 3], "step_started");
    assert!(rt.pending_approvals(None).is_empty());
    // Deciding again after the run went on: the run is gone.
    assert!(matches!(
        rt.decide("r1", &pending[0].call_id, Decision::Approve),
        Err(ApprovalError::UnknownApproval { .. })
    ));
}

#[tokio::test]
async fn a_deny_rule_refuses_the_call_and_the_run_goes_on() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![
        ScriptedResponse::tool_call(
            "fs__write_file",
            json!({"path": "/etc/passwd", "text": "x"}),
        ),
        ScriptedResponse::text("could not write"),
    ]);
    let rt = runtime(ops(), model, &ran);
    let result = rt
        .run_to_completion(RunRequest::new("t", vec![Message::user("write")]))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(ran.lock().unwrap().is_empty());
    let history = rt.thread_messages("t").await;
    let tool = history.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(
        tool.content,
        "not run: denied by an approval rule (deny fs__write_file when path =~ ^/etc/)"
    );
}

#[tokio::test]
async fn parallel_held_calls_are_decided_in_any_order_and_batching() {
    let ran = Ran::default();
    let (model, asked) = counting_model(vec![
        ScriptedResponse::tool_calls(vec![
            ("fs__write_file", json!({"path": "/tmp/a", "text": "1"})),
            ("search", json!({"q": "x"})),
            ("fs__read_file", json!({"path": "/tmp/b"})),
            ("shell", json!({"cmd": "ls"})),
        ]),
        ScriptedResponse::text("done"),
    ]);
    let rt = runtime(ops(), model, &ran);
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("go")]).with_run_id("r"),
    );
    let pending = until_pending(&rt, "r", 3).await;
    let ids: Vec<String> = pending.iter().map(|p| p.call_id.clone()).collect();
    assert_eq!(
        ids.iter().collect::<std::collections::HashSet<_>>().len(),
        3,
        "distinct ids"
    );
    // The ungated call did not wait for them.
    assert_eq!(ran.lock().unwrap().len(), 1);
    // Last first, then the other two; one decision repeated.
    rt.decide(
        "r",
        &ids[2],
        Decision::Reject {
            reason: Some("no shell".into()),
        },
    )
    .unwrap();
    assert!(
        rt.decide(
            "r",
            &ids[2],
            Decision::Reject {
                reason: Some("no shell".into())
            }
        )
        .unwrap()
        .repeated
    );
    assert!(matches!(
        rt.decide("r", &ids[2], Decision::Approve),
        Err(ApprovalError::AlreadyDecided { .. })
    ));
    assert_eq!(until_pending(&rt, "r", 2).await.len(), 2);
    rt.decide(
        "r",
        &ids[0],
        Decision::Edit {
            arguments: json!({"path": "/tmp/c", "text": "2"}),
        },
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "still parked with one undecided"
    );
    rt.decide("r", &ids[1], Decision::Approve).unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len(), 3);
    assert!(ran.contains(&(
        "fs__write_file".to_owned(),
        json!({"path": "/tmp/c", "text": "2"})
    )));
    assert!(ran.contains(&("fs__read_file".to_owned(), json!({"path": "/tmp/b"}))));
    assert!(!ran.iter().any(|(t, _)| t == "shell"));
    let history = rt.thread_messages("t").await;
    let results = rein_results(&history);
    assert_eq!(results.len(), 4);
    assert!(results.iter().any(|c| c == "not run: rejected: no shell"));
    assert!(
        results
            .iter()
            .any(|c| c.starts_with("(run with arguments edited by a person"))
    );
}

fn rein_results(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.clone())
        .collect()
}

#[tokio::test]
async fn an_ask_user_question_is_answered_with_respond_and_the_model_sees_the_answer() {
    let ran = Ran::default();
    // `ask_user` is an `ask` by nature: a question is answered, not approved.
    let (model, _) = counting_model(vec![
        ScriptedResponse::tool_call(
            "ask_user",
            json!({"question": "Which region?", "options": ["eu", "us"]}),
        ),
        ScriptedResponse::text("ok"),
    ]);
    let rt = runtime(AgentSpec::new("a").with_plugin_id("ask_user"), model, &ran);
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("deploy")]).with_run_id("q"),
    );
    let pending = until_pending(&rt, "q", 1).await;
    assert_eq!(pending[0].kind, PendingKind::Question);
    assert_eq!(pending[0].question.as_deref(), Some("Which region?"));
    assert_eq!(pending[0].options, vec!["eu", "us"]);
    let err = rt
        .decide("q", &pending[0].call_id, Decision::Approve)
        .unwrap_err();
    assert!(matches!(err, ApprovalError::Invalid { .. }), "{err}");
    rt.decide(
        "q",
        &pending[0].call_id,
        Decision::Respond {
            result: json!("eu"),
        },
    )
    .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let history = rt.thread_messages("t").await;
    assert_eq!(rein_results(&history), vec!["eu"]);
}

#[tokio::test]
async fn an_edit_that_does_not_fit_the_tool_is_refused_and_the_call_stays_pending() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![ScriptedResponse::tool_call(
        "shell",
        json!({"cmd": "ls"}),
    )]);
    let typed_shell = tool_fn(
        "shell",
        "runs a command",
        |args: ShellArgs, _ctx: ToolContext| async move { Ok::<_, ToolError>(args.cmd) },
    );
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("a")
                .with_model_id("m")
                .with_approval(ApprovalRule::new("shell", ApprovalAction::Ask)),
        )
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model))
        .with_tool("shell", typed_shell)
        .build()
        .unwrap();
    let _ = ran;
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("go")]).with_run_id("e"),
    );
    let pending = until_pending(&rt, "e", 1).await;
    let err = rt
        .decide(
            "e",
            &pending[0].call_id,
            Decision::Edit {
                arguments: json!({"cmd": 3}),
            },
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("`arguments.cmd` must be string"),
        "{err}"
    );
    assert_eq!(until_pending(&rt, "e", 1).await.len(), 1);
    rt.decide(
        "e",
        &pending[0].call_id,
        Decision::Edit {
            arguments: json!({"cmd": "pwd"}),
        },
    )
    .unwrap();
    run.await.unwrap().unwrap();
    let history = rt.thread_messages("t").await;
    assert!(
        rein_results(&history)[0].ends_with("\npwd"),
        "{:?}",
        rein_results(&history)
    );
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct ShellArgs {
    cmd: String,
}

#[tokio::test]
async fn a_timeout_with_reject_answers_the_call_and_one_with_stop_ends_the_run() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![
        ScriptedResponse::tool_call("shell", json!({"cmd": "ls"})),
        ScriptedResponse::text("no answer came"),
    ]);
    let spec = AgentSpec::new("a").with_approval(
        ApprovalRule::new("shell", ApprovalAction::Ask).with_timeout(1, OnTimeout::Reject),
    );
    let rt = runtime(spec, model, &ran);
    let sink = Arc::new(CollectingSink::new());
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("go")])
            .with_run_id("a")
            .with_event_sink(sink.clone()),
    );
    let pending = until_pending(&rt, "a", 1).await;
    assert!(
        pending[0]
            .expires_at
            .as_deref()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(ran.lock().unwrap().is_empty());
    assert_eq!(
        rein_results(&rt.thread_messages("t").await),
        vec!["not run: no decision within 1 s"]
    );
    assert!(sink.events().iter().any(
        |e| matches!(e, AgentEvent::ApprovalDecided { decision, .. } if decision == "timeout")
    ));

    let (model, asked) = counting_model(vec![ScriptedResponse::tool_call(
        "shell",
        json!({"cmd": "ls"}),
    )]);
    let spec = AgentSpec::new("a").with_approval(
        ApprovalRule::new("shell", ApprovalAction::Ask).with_timeout(1, OnTimeout::Stop),
    );
    let rt = runtime(spec, model, &ran);
    let result = rt
        .run_to_completion(RunRequest::new("t", vec![Message::user("go")]))
        .await
        .unwrap();
    assert_eq!(result.termination.code(), "approval_timeout");
    assert_eq!(result.report.pending_approvals.len(), 1);
    assert_eq!(result.report.tool_calls.len(), 1);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    common_history_valid(&rt.thread_messages("t").await);
}

fn common_history_valid(history: &[Message]) {
    // Every call answered exactly once, right after its assistant message.
    let mut open: Vec<String> = Vec::new();
    for m in history {
        match m.role {
            Role::Tool => {
                let id = m.tool_call_id.clone().unwrap();
                let at = open
                    .iter()
                    .position(|c| *c == id)
                    .unwrap_or_else(|| panic!("unpaired result {id}: {history:#?}"));
                open.remove(at);
            }
            _ => {
                assert!(
                    open.is_empty(),
                    "calls {open:?} unanswered before a {:?} message: {history:#?}",
                    m.role
                );
                open = m.tool_calls.iter().map(|c| c.id.clone()).collect();
            }
        }
    }
    assert!(open.is_empty(), "calls {open:?} unanswered at the end");
}

#[tokio::test]
async fn parked_time_does_not_count_toward_the_runs_timeout() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![
        ScriptedResponse::tool_call("shell", json!({"cmd": "ls"})),
        ScriptedResponse::text("done"),
    ]);
    let rt = runtime(ops(), model, &ran);
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("go")])
            .with_run_id("p")
            .with_timeout(Duration::from_millis(800)),
    );
    let pending = until_pending(&rt, "p", 1).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    rt.decide("p", &pending[0].call_id, Decision::Approve)
        .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn cancel_and_new_input_while_parked_keep_every_call_paired() {
    for (held, by_input) in [(1, false), (3, false), (1, true), (3, true)] {
        let ran = Ran::default();
        let calls: Vec<(&str, Value)> = [
            ("shell", json!({"cmd": "a"})),
            ("fs__read_file", json!({"path": "b"})),
            ("shell", json!({"cmd": "c"})),
        ]
        .into_iter()
        .take(held)
        .chain([("search", json!({"q": "free"}))])
        .collect();
        let (model, _) = counting_model(vec![
            ScriptedResponse::tool_calls(calls),
            ScriptedResponse::text("after new input"),
        ]);
        let rt = runtime(ops(), model, &ran);
        let run = spawn(
            &rt,
            RunRequest::new("t", vec![Message::user("go")]).with_run_id("x"),
        );
        until_pending(&rt, "x", held).await;
        if by_input {
            let next = rt
                .mailbox()
                .submit(RunRequest::new("t", vec![Message::user("stop that")]))
                .await
                .unwrap();
            let first = run.await.unwrap().unwrap();
            assert_eq!(first.termination, TerminationReason::Cancelled);
            assert!(matches!(
                first.cancel_cause,
                Some(CancelCause::Interrupted { .. })
            ));
            assert_eq!(first.report.pending_approvals.len(), held);
            let second = next.wait().await.unwrap();
            assert_eq!(second.termination, TerminationReason::NaturalEnd);
            let history = rt.thread_messages("t").await;
            let superseded = rein_results(&history)
                .iter()
                .filter(|c| c.starts_with("not run: superseded by new input"))
                .count();
            assert_eq!(superseded, held);
            common_history_valid(&history);
        } else {
            assert!(rt.cancel_run("x"));
            let result = run.await.unwrap().unwrap();
            assert_eq!(result.termination, TerminationReason::Cancelled);
            assert_eq!(result.report.pending_approvals.len(), held);
            assert_eq!(result.report.tool_calls.len(), held);
            common_history_valid(&rt.thread_messages("t").await);
        }
        // Only the free call ever ran.
        assert_eq!(
            ran.lock().unwrap().len(),
            1,
            "held {held}, by input {by_input}"
        );
    }
}

#[tokio::test]
async fn a_rule_matching_none_of_the_agents_tools_fails_the_build_naming_it() {
    let err = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("a")
                .with_model_id("m")
                .with_approval(ApprovalRule::new("fs_*", ApprovalAction::Ask)),
        )
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(ScriptedExecutor::new(vec![])))
        .with_tool("shell", recording_tool("shell", &Ran::default()))
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("approvals[0]") && text.contains("\"fs_*\"") && text.contains("shell"),
        "{text}"
    );
}

#[tokio::test]
async fn an_approval_inside_a_sub_agent_surfaces_with_its_root_and_resumes_the_child() {
    let ran = Ran::default();
    let lead = AgentSpec::new("lead")
        .with_model_id("m-lead")
        .with_subagent(SubagentSpec::new("worker").with_tool("delegate"));
    let worker = AgentSpec::new("worker")
        .with_model_id("m-worker")
        .with_approval(ApprovalRule::new("shell", ApprovalAction::Ask));
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(lead)
        .with_agent_spec(worker)
        .with_model(ModelSpec::new("m-lead", "p-lead", "x"))
        .with_model(ModelSpec::new("m-worker", "p-worker", "x"))
        .with_provider(
            "p-lead",
            Arc::new(ScriptedExecutor::new(vec![
                ScriptedResponse::tool_call("delegate", json!({"task": "clean up"})),
                ScriptedResponse::text("the worker finished"),
            ])),
        )
        .with_provider(
            "p-worker",
            Arc::new(ScriptedExecutor::new(vec![
                ScriptedResponse::tool_call("shell", json!({"cmd": "rm tmp"})),
                ScriptedResponse::text("cleaned"),
            ])),
        )
        .with_tool("shell", recording_tool("shell", &ran))
        .build()
        .unwrap();
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("go")])
            .with_agent_id("lead")
            .with_run_id("root"),
    );
    let pending = until_pending(&rt, "root.1", 1).await;
    assert_eq!(pending[0].root_run_id.as_deref(), Some("root"));
    assert_eq!(pending[0].thread_id, "t:root.1");
    assert_eq!(rt.pending_approvals(Some("t:root.1")).len(), 1);
    assert!(rt.pending_approvals(Some("t")).is_empty());
    rt.decide("root.1", &pending[0].call_id, Decision::Approve)
        .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.response, "the worker finished");
    assert_eq!(ran.lock().unwrap().len(), 1);
}

/// A store shared by two runtimes whose writes can be cut off, as a
/// process killed mid-park writes nothing more.
struct Freezable {
    inner: Arc<rein::thread_store::InMemoryThreadStore>,
    frozen: std::sync::atomic::AtomicBool,
}

#[rein::async_trait]
impl rein::thread_store::ThreadStore for Freezable {
    async fn load(
        &self,
        thread_id: &str,
    ) -> Result<Vec<Message>, rein::thread_store::ThreadStoreError> {
        self.inner.load(thread_id).await
    }
    async fn append(
        &self,
        thread_id: &str,
        messages: &[Message],
    ) -> Result<(), rein::thread_store::ThreadStoreError> {
        if self.frozen.load(Ordering::SeqCst) {
            return Err(rein::thread_store::ThreadStoreError::new(
                thread_id, "frozen",
            ));
        }
        self.inner.append(thread_id, messages).await
    }
    async fn replace(
        &self,
        thread_id: &str,
        messages: &[Message],
    ) -> Result<(), rein::thread_store::ThreadStoreError> {
        if self.frozen.load(Ordering::SeqCst) {
            return Err(rein::thread_store::ThreadStoreError::new(
                thread_id, "frozen",
            ));
        }
        self.inner.replace(thread_id, messages).await
    }
}

#[tokio::test]
async fn a_parked_run_is_carried_on_by_another_runtime_from_its_run_parked_event() {
    let shared = Arc::new(rein::thread_store::InMemoryThreadStore::default());
    let store_a = Arc::new(Freezable {
        inner: shared.clone(),
        frozen: false.into(),
    });
    let (ran_a, ran_b) = (Ran::default(), Ran::default());
    let build =
        |store: Arc<dyn rein::thread_store::ThreadStore>, ran: &Ran, model: ScriptedExecutor| {
            AgentRuntimeBuilder::new()
                .with_agent_spec(ops().with_model_id("m"))
                .with_model(ModelSpec::new("m", "p", "x"))
                .with_provider("p", Arc::new(model))
                .with_tool("fs__write_file", recording_tool("fs__write_file", ran))
                .with_tool("fs__read_file", recording_tool("fs__read_file", ran))
                .with_tool("shell", recording_tool("shell", ran))
                .with_tool("search", recording_tool("search", ran))
                .with_thread_store(store)
                .build()
                .unwrap()
        };
    let (model_a, _) = counting_model(vec![ScriptedResponse::tool_calls(vec![
        ("search", json!({"q": "x"})),
        ("shell", json!({"cmd": "ls"})),
        ("fs__read_file", json!({"path": "/tmp/a"})),
    ])]);
    let a = build(store_a.clone(), &ran_a, model_a);
    let sink = Arc::new(CollectingSink::new());
    let _parked_task = spawn(
        &a,
        RunRequest::new("t", vec![Message::user("go")])
            .with_run_id("r")
            .with_event_sink(sink.clone()),
    );
    let pending = until_pending(&a, "r", 2).await;
    // One decision reached A before it was lost.
    a.decide("r", &pending[0].call_id, Decision::Approve)
        .unwrap();
    store_a.frozen.store(true, Ordering::SeqCst);
    let parked = sink
        .events()
        .into_iter()
        .find_map(|e| match e {
            AgentEvent::RunParked {
                pending,
                steps,
                usage,
                active_ms,
                ..
            } => Some((pending, steps, usage, active_ms)),
            _ => None,
        })
        .unwrap();
    assert_eq!(parked.0.len(), 2);
    assert_eq!(parked.1, 1);

    let (model_b, asked_b) = counting_model(vec![ScriptedResponse::text("carried on")]);
    let b = build(shared.clone(), &ran_b, model_b);
    let mut resumed = rein::approvals::ParkedRun::new("r", "t", "ops", parked.0.clone());
    resumed.steps = parked.1;
    resumed.active = Duration::from_millis(parked.3);
    resumed.decisions = vec![(pending[0].call_id.clone(), Decision::Approve)];
    let sink_b = Arc::new(CollectingSink::new());
    let run_b = spawn(
        &b,
        RunRequest::resume(resumed).with_event_sink(sink_b.clone()),
    );
    // The rest is decided on B.
    let left = until_pending(&b, "r", 1).await;
    assert_eq!(left[0].call_id, pending[1].call_id);
    b.decide(
        "r",
        &left[0].call_id,
        Decision::Reject {
            reason: Some("no".into()),
        },
    )
    .unwrap();
    let result = run_b.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "carried on");
    assert_eq!(result.steps, 2, "rounds go on from the park");
    assert_eq!(
        asked_b.load(Ordering::SeqCst),
        1,
        "no model request before the decided calls"
    );
    // The approved call ran once, on B; nothing held ran on A.
    assert_eq!(
        ran_a.lock().unwrap().clone(),
        vec![("search".to_owned(), json!({"q": "x"}))]
    );
    assert_eq!(
        ran_b.lock().unwrap().clone(),
        vec![("shell".to_owned(), json!({"cmd": "ls"}))]
    );
    assert!(
        !kinds(&sink_b.events()).contains(&"run_started"),
        "the same run goes on"
    );
    let history = rein::thread_store::ThreadStore::load(&*shared, "t")
        .await
        .unwrap();
    common_history_valid(&history);
    a.cancel_run("r");
}

/// An agent whose `awaiting_user` detector escalates to a person.
fn escalating(model: ScriptedExecutor) -> AgentRuntime {
    use rein::escalation::{EscalationAction, EscalationStep, Ladder};
    let ladder = Ladder::new(vec![EscalationStep::new(EscalationAction::Escalate, 1)]).unwrap();
    AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("a")
                .with_model_id("m")
                .with_stop_condition(StopConditionSpec::AwaitingUser { auto_nudges: 1 })
                .with_escalation("awaiting_user", ladder),
        )
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model))
        .build()
        .unwrap()
}

const ASKING: &str = "I prepared the migration.\n\nShall I run it on production now?";

#[tokio::test]
async fn an_escalate_step_parks_the_run_and_continue_with_a_message_goes_on() {
    let (model, asked) = counting_model(vec![
        ScriptedResponse::text(ASKING),
        ScriptedResponse::text("Ran it: 12 rows updated."),
    ]);
    let rt = escalating(model);
    let sink = Arc::new(CollectingSink::new());
    let run = spawn(
        &rt,
        RunRequest::new("t", vec![Message::user("migrate")])
            .with_run_id("e")
            .with_event_sink(sink.clone()),
    );
    let pending = until_pending(&rt, "e", 1).await;
    assert_eq!(pending[0].kind, PendingKind::Escalation);
    assert_eq!(pending[0].tool, "awaiting_user");
    let detail = pending[0].arguments["detail"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(detail.contains("production"), "{detail}");
    // A tool-call decision is refused for an escalation.
    let refused = rt
        .decide("e", &pending[0].call_id, Decision::Approve)
        .unwrap_err();
    assert!(refused.to_string().contains("continue"), "{refused}");
    rt.decide(
        "e",
        &pending[0].call_id,
        Decision::Continue {
            message: Some("Yes, run it.".into()),
        },
    )
    .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "Ran it: 12 rows updated.");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    let history = rt.thread_messages("t").await;
    assert!(
        history
            .iter()
            .any(|m| m.role == Role::User && m.content == "Yes, run it.")
    );
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Detected { action, .. } if action == "escalate"))
    );
}

#[tokio::test]
async fn an_escalation_answered_stop_or_take_over_ends_the_run_with_that_reason() {
    for (decision, code) in [
        (Decision::Stop, "awaiting_user"),
        (Decision::TakeOver, "taken_over"),
    ] {
        let (model, asked) = counting_model(vec![ScriptedResponse::text(ASKING)]);
        let rt = escalating(model);
        let run = spawn(
            &rt,
            RunRequest::new("t", vec![Message::user("migrate")]).with_run_id("e"),
        );
        let pending = until_pending(&rt, "e", 1).await;
        rt.decide("e", &pending[0].call_id, decision).unwrap();
        let result = run.await.unwrap().unwrap();
        assert_eq!(result.termination.code(), code, "{:?}", result.termination);
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn a_run_released_when_parked_holds_no_task_nor_slot_and_its_carried_on_run_runs_exactly_the_approved_call()
 {
    let ran = Ran::default();
    let (model, asked) = counting_model(vec![
        ScriptedResponse::tool_calls(vec![
            ("search", json!({"q": "disk"})),
            ("shell", json!({"cmd": "df -h"})),
            ("fs__write_file", json!({"path": "/tmp/a", "text": "x"})),
        ]),
        ScriptedResponse::text("done"),
    ]);
    let rt = runtime(ops(), model, &ran);
    let sink = Arc::new(CollectingSink::new());
    let mut parked = let_go(
        &rt,
        RunRequest::new("t", vec![Message::user("check the disk")])
            .with_run_id("r1")
            .with_event_sink(sink.clone()),
    )
    .await;
    // Nothing of it is left in the runtime: no slot, no pending entry.
    assert!(!rt.is_thread_active("t"));
    assert!(rt.pending_approvals(None).is_empty());
    assert_eq!(parked.pending.len(), 2);
    assert_eq!(parked.steps, 1);
    assert!(!parked.is_decided());
    assert_eq!(
        kinds(&sink.events()).last(),
        Some(&"run_parked"),
        "no run_finished while parked"
    );
    assert_eq!(
        ran.lock().unwrap().clone(),
        vec![("search".to_owned(), json!({"q": "disk"}))]
    );
    // Decided outside any run: checked as the runtime checks a live one.
    let shell = parked.pending[0].call_id.clone();
    let write = parked.pending[1].call_id.clone();
    assert!(matches!(
        rt.decide_parked(
            &mut parked,
            &write,
            Decision::Continue { message: None },
            None
        ),
        Err(ApprovalError::Invalid { .. })
    ));
    rt.decide_parked(&mut parked, &shell, Decision::Approve, Some("alice"))
        .unwrap();
    assert!(
        rt.decide_parked(&mut parked, &shell, Decision::Approve, None)
            .unwrap()
            .repeated
    );
    assert!(matches!(
        rt.decide_parked(&mut parked, &shell, Decision::Reject { reason: None }, None),
        Err(ApprovalError::AlreadyDecided { .. })
    ));
    // Carried on while a call still waits: it lets go again at once.
    let still = let_go(&rt, RunRequest::resume(parked.clone())).await;
    assert_eq!(still.decisions.len(), 1);
    assert_eq!(ran.lock().unwrap().len(), 1, "nothing ran meanwhile");
    rt.decide_parked(
        &mut parked,
        &write,
        Decision::Edit {
            arguments: json!({"path": "/tmp/b", "text": "y"}),
        },
        Some("bob"),
    )
    .unwrap();
    assert!(parked.is_decided());
    let result = rt
        .mailbox()
        .submit(
            RunRequest::resume(parked)
                .with_event_sink(sink.clone())
                .release_when_parked(),
        )
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(result.response, "done");
    assert_eq!(asked.load(Ordering::SeqCst), 2, "no model request between");
    assert_eq!(
        ran.lock().unwrap().clone(),
        vec![
            ("search".to_owned(), json!({"q": "disk"})),
            ("shell".to_owned(), json!({"cmd": "df -h"})),
            (
                "fs__write_file".to_owned(),
                json!({"path": "/tmp/b", "text": "y"})
            ),
        ]
    );
    let events = sink.events();
    let k = kinds(&events);
    assert_eq!(k.iter().filter(|k| **k == "run_started").count(), 1);
    assert_eq!(k.iter().filter(|k| **k == "run_finished").count(), 1);
    // Who decided each call, and when, reach the events.
    let deciders: Vec<(String, Option<String>, bool)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ApprovalDecided {
                call_id,
                decided_by,
                decided_at,
                ..
            } => Some((call_id.clone(), decided_by.clone(), decided_at.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deciders,
        vec![
            (shell.clone(), Some("alice".to_owned()), true),
            (write.clone(), Some("bob".to_owned()), true),
        ]
    );
    let history = rt.thread_messages("t").await;
    assert_eq!(history.iter().filter(|m| m.role == Role::Tool).count(), 3);
}

#[tokio::test]
async fn waiting_on_a_run_that_let_go_says_so_instead_of_inventing_a_result() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![ScriptedResponse::tool_call(
        "shell",
        json!({"cmd": "ls"}),
    )]);
    let rt = runtime(ops(), model, &ran);
    let handle = rt
        .mailbox()
        .submit(
            RunRequest::new("t", vec![Message::user("list")])
                .with_run_id("r1")
                .release_when_parked(),
        )
        .await
        .unwrap();
    assert!(matches!(
        handle.wait().await,
        Err(RuntimeError::RunParked { run_id }) if run_id == "r1"
    ));
}

#[tokio::test]
async fn a_timeout_that_passes_while_no_task_waits_answers_its_call_and_the_run_lets_go_again() {
    let ran = Ran::default();
    let (model, _) = counting_model(vec![
        ScriptedResponse::tool_calls(vec![
            ("shell", json!({"cmd": "ls"})),
            ("fs__write_file", json!({"path": "/tmp/a", "text": "x"})),
        ]),
        ScriptedResponse::text("done"),
    ]);
    let spec = AgentSpec::new("a")
        .with_approval(
            ApprovalRule::new("shell", ApprovalAction::Ask).with_timeout(1, OnTimeout::Reject),
        )
        .with_approval(ApprovalRule::new("fs__*", ApprovalAction::Ask));
    let rt = runtime(spec, model, &ran);
    let sink = Arc::new(CollectingSink::new());
    let parked = let_go(
        &rt,
        RunRequest::new("t", vec![Message::user("go")])
            .with_run_id("a")
            .with_event_sink(sink.clone()),
    )
    .await;
    let shell = parked.pending[0].call_id.clone();
    let write = parked.pending[1].call_id.clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Carried on once the timeout is due: it answers `shell` and, with
    // `write` still waiting, lets go again — knowing `shell` timed out.
    let mut parked = let_go(
        &rt,
        RunRequest::resume(parked).with_event_sink(sink.clone()),
    )
    .await;
    assert_eq!(parked.timed_out, vec![shell.clone()]);
    assert_eq!(
        parked
            .undecided()
            .map(|p| p.call_id.clone())
            .collect::<Vec<_>>(),
        vec![write.clone()]
    );
    rt.decide_parked(&mut parked, &write, Decision::Approve, None)
        .unwrap();
    assert!(parked.is_decided());
    let result = rt
        .mailbox()
        .submit(RunRequest::resume(parked).with_event_sink(sink.clone()))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert_eq!(
        ran.lock().unwrap().clone(),
        vec![(
            "fs__write_file".to_owned(),
            json!({"path": "/tmp/a", "text": "x"})
        )]
    );
    let decided: Vec<(String, String)> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ApprovalDecided {
                call_id, decision, ..
            } => Some((call_id.clone(), decision.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        decided,
        vec![(shell, "timeout".to_owned()), (write, "approve".to_owned())]
    );
}
