//! Shutdown awaits everything the service started: after
//! `Service::shutdown` returns, no task of the service is left on the
//! runtime — in-process, and distributed (with `REIN_DATABASE_URL`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rein::prelude::*;
use rein_service::{Service, ServiceSettings, Submission};

fn runtime(store: Option<Arc<dyn rein::thread_store::ThreadStore>>) -> AgentRuntime {
    let mut builder = AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider(
            "p",
            Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text("Hi.")])),
        );
    if let Some(store) = store {
        builder = builder.with_thread_store(store);
    }
    builder.build().unwrap()
}

fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits (bounded) for tasks that are ending to be reaped.
async fn settle_to(expected: usize) -> usize {
    for _ in 0..100 {
        if alive() <= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    alive()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_service_leaves_no_task_behind_after_shutdown() {
    let before = alive();
    let service = Service::new(runtime(None), ServiceSettings::default());
    let submitted = service
        .submit("t", Submission::new(vec![Message::user("hello")]))
        .await
        .unwrap();
    service.live(&submitted).await.unwrap().finished().await;
    assert!(alive() > before, "the sweeper runs");
    service.shutdown().await;
    // A tracked task is reported done just before the runtime reaps it.
    assert_eq!(settle_to(before).await, before);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_service_stops_its_heartbeat_listener_and_scans_at_shutdown() {
    let Ok(url) = std::env::var("REIN_DATABASE_URL") else {
        eprintln!("skipped: REIN_DATABASE_URL is not set");
        return;
    };
    let pool = rein_postgres::connect(&url).await.unwrap();
    let database = rein_postgres::Database::new(pool, "shutdown-test", Duration::from_secs(2));
    let store: Arc<dyn rein::thread_store::ThreadStore> = Arc::new(database.store().clone());
    let runtime = runtime(Some(store));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = alive();
    let service = Service::distributed(runtime, ServiceSettings::default(), database);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive() >= before + 3, "heartbeat, listener and scan run");
    service.shutdown().await;
    // sqlx returns the listener's connection to its pool on a task of its
    // own: it may still be ending.
    assert_eq!(settle_to(before).await, before);
}
