//! The PostgreSQL artifact store against a real database: the store's own
//! operations, and an offloaded tool result read back with `read_artifact`
//! by a second runtime (as another process would after a restart or a
//! takeover). Needs `REIN_DATABASE_URL` (`cargo xtask postgres start`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use rein::context::{ArtifactStore, ContextPolicy};
use rein::prelude::*;
use rein_postgres::{PgArtifactStore, PgThreadStore};
use serde_json::{Value, json};

mod common;
use common::{thread, url};

#[tokio::test]
async fn artifacts_are_kept_per_thread_replaced_and_deleted_with_their_thread() {
    let Some(url) = url() else { return };
    let store = PgArtifactStore::new(rein_postgres::connect(&url).await.unwrap());
    let (a, b) = (thread("artifacts-a"), thread("artifacts-b"));
    assert_eq!(store.get(&a, "c1").await.unwrap(), None);
    // Text PostgreSQL's TEXT refuses (a NUL) and any Unicode come back whole.
    let text = "line 1\nnul:\0 — 完成\n";
    store.put(&a, "c1", text).await.unwrap();
    store.put(&b, "c1", "other thread").await.unwrap();
    assert_eq!(store.get(&a, "c1").await.unwrap().as_deref(), Some(text));
    assert_eq!(
        store.get(&b, "c1").await.unwrap().as_deref(),
        Some("other thread"),
        "ids are per thread"
    );
    store.put(&a, "c1", "again").await.unwrap();
    assert_eq!(store.get(&a, "c1").await.unwrap().as_deref(), Some("again"));
    store.delete_thread(&a).await.unwrap();
    assert_eq!(store.get(&a, "c1").await.unwrap(), None);
    assert_eq!(
        store.get(&b, "c1").await.unwrap().as_deref(),
        Some("other thread"),
        "deleting one thread leaves the others"
    );
    store.delete_thread(&b).await.unwrap();
}

/// Returns 300 numbered lines.
struct Listing;

#[async_trait::async_trait]
impl Tool for Listing {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("listing", "returns a long listing")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let lines: Vec<String> = (1..=300)
            .map(|i| format!("row {i:03} of the listing"))
            .collect();
        Ok(ToolOutput::text(lines.join("\n")))
    }
}

#[tokio::test]
async fn a_result_offloaded_by_one_runtime_is_read_back_by_another() {
    let Some(url) = url() else { return };
    let t = thread("offload");
    let runtime = |script: Vec<ScriptedResponse>, pool: sqlx::PgPool| {
        AgentRuntimeBuilder::new()
            .with_agent_spec(
                AgentSpec::new("a")
                    .with_model_id("m")
                    .with_context(ContextPolicy::new(100_000).with_offload(200)),
            )
            .with_model(ModelSpec::new("m", "p", "x"))
            .with_provider("p", Arc::new(ScriptedExecutor::new(script)))
            .with_tool("listing", Arc::new(Listing))
            .with_thread_store(Arc::new(PgThreadStore::new(pool.clone())))
            .with_artifact_store(Arc::new(PgArtifactStore::new(pool)))
            .build()
            .unwrap()
    };
    let first = runtime(
        vec![
            ScriptedResponse::tool_call("listing", json!({})).with_call_id("call-listing"),
            ScriptedResponse::text("listed"),
        ],
        rein_postgres::connect(&url).await.unwrap(),
    );
    first
        .run_to_completion(RunRequest::new(&t, vec![Message::user("list")]))
        .await
        .unwrap();
    // Another runtime on its own pool (another process) reads it back.
    let second = runtime(
        vec![
            ScriptedResponse::tool_call(
                "read_artifact",
                json!({"id": "call-listing", "contains": "row 25"}),
            ),
            ScriptedResponse::text("read"),
        ],
        rein_postgres::connect(&url).await.unwrap(),
    );
    let result = second
        .run_to_completion(RunRequest::new(&t, vec![Message::user("show row 25x")]))
        .await
        .unwrap();
    assert_eq!(result.response, "read");
    let history = second.thread_messages(&t).await;
    let read = history
        .iter()
        .rev()
        .find(|m| m.role == Role::Tool)
        .expect("the read_artifact result");
    assert!(
        read.content.contains("row 250 of the listing"),
        "{}",
        read.content
    );
    assert!(!read.content.contains("row 249"), "{}", read.content);
    // Deleting the thread deletes its artifacts.
    second.delete_thread(&t).await.unwrap();
    let store = PgArtifactStore::new(rein_postgres::connect(&url).await.unwrap());
    assert_eq!(store.get(&t, "call-listing").await.unwrap(), None);
}
