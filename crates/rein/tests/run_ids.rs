//! A request may bring its own run id (`RunRequest::with_run_id`), unless
//! it is the id of an active run; `check_request` finds what would stop a
//! run from starting without starting it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use common::*;
use rein::prelude::*;

#[tokio::test]
async fn a_run_takes_the_requests_id_and_an_active_runs_id_is_refused() {
    let (runtime, entered) = gated_runtime(true);
    let first = runtime
        .mailbox()
        .submit(user("t1", "go").with_run_id("client-7"))
        .await
        .unwrap();
    assert_eq!(first.run_id(), "client-7");
    entered.notified().await;
    let again = runtime
        .run_to_completion(user("t2", "go").with_run_id("client-7"))
        .await
        .unwrap_err();
    assert_eq!(
        again,
        RuntimeError::RunIdInUse {
            run_id: "client-7".into()
        }
    );
    assert!(runtime.cancel_run("client-7"));
    assert_eq!(first.wait().await.unwrap().run_id, "client-7");
    let stream = runtime.run_stream(user("t3", "hello").with_run_id("mine"));
    assert_eq!(stream.run_id(), "mine");
}

#[tokio::test]
async fn check_request_reports_what_run_would_without_starting_anything() {
    let runtime = builder_with(
        ScriptedExecutor::new(vec![ScriptedResponse::text("hi")]),
        spec(),
    )
    .build()
    .unwrap();
    assert_eq!(
        runtime.check_request(&RunRequest::new("t", vec![])).await,
        Err(RuntimeError::EmptyConversation {
            thread_id: "t".into()
        })
    );
    assert!(matches!(
        runtime
            .check_request(&user("t", "x").with_agent_id("nobody"))
            .await,
        Err(RuntimeError::UnknownAgent { .. })
    ));
    assert_eq!(runtime.check_request(&user("t", "x")).await, Ok(()));
    assert!(runtime.thread_messages("t").await.is_empty());
    assert_eq!(runtime.agent_tools("agent").unwrap(), vec![]);
    assert_eq!(runtime.agent_tools("nobody"), None);
}
