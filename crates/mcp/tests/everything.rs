//! Against the reference server `@modelcontextprotocol/server-everything`
//! (npm): listing and calling tools, a long call cancelled mid-way (by the
//! caller and by a run's cancellation), a timeout, the server killed
//! mid-call and restarted, shutdown and drop leaving no process, and the
//! same server over streamable HTTP.
//!
//! `.ci/run` installs the server into `$HOME/.cache/rein-npm/mcp` and sets
//! `REIN_MCP_EVERYTHING` to its `dist/index.js`; without it the tests say
//! they are skipped. Every test checks that the processes it started are
//! gone when it ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rein_mcp::{McpError, McpOptions, McpServer, McpTransport};
use rein_runtime_contract::tool::{Tool, ToolContext};
use serde_json::json;

/// The server's entry point, or `None` (skipped, said once).
fn everything() -> Option<String> {
    match std::env::var("REIN_MCP_EVERYTHING") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            let _ = std::io::stderr().write_all(
                b"MCP tests skipped: REIN_MCP_EVERYTHING is not set (.ci/run installs @modelcontextprotocol/server-everything and sets it)\n",
            );
            None
        }
    }
}

fn stdio(entry: &str) -> McpTransport {
    McpTransport::Stdio {
        command: "node".into(),
        args: vec![entry.into(), "stdio".into()],
        env: Default::default(),
        cwd: None,
    }
}

fn ctx() -> ToolContext {
    ToolContext::new("t", "r", "c", Default::default())
}

/// Whether a process (or any member of the group it leads) is alive.
fn alive(pid: u32) -> bool {
    let group = std::process::Command::new("kill")
        .args(["-s", "0", "--", &format!("-{pid}")])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    // A zombie is dead: only its entry is left until it is reaped.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) == Some("Z"))
        .unwrap_or(true);
    group && !zombie
}

async fn gone(pid: u32) {
    let start = Instant::now();
    while alive(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "process group {pid} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start(entry: &str, options: McpOptions) -> (Arc<McpServer>, u32) {
    let server = McpServer::start("everything", stdio(entry), options)
        .await
        .unwrap();
    let pid = server.child_pid().await.expect("a child process");
    (server, pid)
}

fn tool(server: &Arc<McpServer>, name: &str) -> Arc<dyn Tool> {
    server.tool(name).unwrap()
}

#[tokio::test]
async fn tools_are_listed_with_their_schemas_and_echo_and_get_sum_answer() {
    let Some(entry) = everything() else { return };
    let (server, pid) = start(&entry, McpOptions::default()).await;
    let names = server.tool_names();
    for expected in ["echo", "get-sum", "trigger-long-running-operation"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let echo = tool(&server, "echo");
    let descriptor = echo.descriptor();
    assert_eq!(descriptor.name, "everything__echo");
    assert!(!descriptor.description.is_empty());
    assert_eq!(
        descriptor.parameters["properties"]["message"]["type"],
        "string"
    );
    let out = echo
        .execute(json!({"message": "hello"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.to_content(), "Echo: hello");
    // The server's `readOnlyHint` says how an interrupted call is recorded.
    assert!(echo.read_only(), "echo is annotated read-only");
    assert!(!tool(&server, "toggle-simulated-logging").read_only());
    let sum = tool(&server, "get-sum")
        .execute(json!({"a": 2, "b": 3}), &ctx())
        .await
        .unwrap();
    assert!(sum.to_content().contains('5'), "{}", sum.to_content());
    // A call the server refuses is an errored result, not a failure.
    let bad = tool(&server, "get-sum")
        .execute(json!({"a": "x"}), &ctx())
        .await;
    assert!(bad.is_err());
    match server.tool("nope") {
        Err(McpError::UnknownTool { known, .. }) => assert!(known.contains("echo")),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a tool that does not exist"),
    }
    server.shutdown().await;
    gone(pid).await;
}

#[tokio::test]
async fn a_long_call_dropped_mid_way_ends_at_once_and_the_server_keeps_serving() {
    let Some(entry) = everything() else { return };
    let (server, pid) = start(&entry, McpOptions::default()).await;
    let long = tool(&server, "trigger-long-running-operation");
    let started = Instant::now();
    let context = ctx();
    let call = long.execute(json!({"duration": 30, "steps": 30}), &context);
    // Dropped after 300 ms, as a cancelled run drops its tools' futures.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let out = tool(&server, "echo")
        .execute(json!({"message": "still here"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.to_content(), "Echo: still here");
    assert_eq!(server.child_pid().await, Some(pid), "not restarted");
    server.shutdown().await;
    gone(pid).await;
}

#[tokio::test]
async fn a_call_past_the_tool_timeout_is_an_errored_result() {
    let Some(entry) = everything() else { return };
    let options = McpOptions {
        tool_timeout: Duration::from_millis(500),
        ..McpOptions::default()
    };
    let (server, pid) = start(&entry, options).await;
    let started = Instant::now();
    let error = tool(&server, "trigger-long-running-operation")
        .execute(json!({"duration": 30, "steps": 30}), &ctx())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        error
            .message()
            .contains("did not answer tool \"trigger-long-running-operation\" within 0.5 s"),
        "{error}"
    );
    assert!(
        tool(&server, "echo")
            .execute(json!({"message": "ok"}), &ctx())
            .await
            .is_ok()
    );
    server.shutdown().await;
    gone(pid).await;
}

#[tokio::test]
async fn a_server_killed_mid_call_fails_the_call_naming_it_and_restarts_on_next_use() {
    let Some(entry) = everything() else { return };
    let (server, pid) = start(&entry, McpOptions::default()).await;
    let long = tool(&server, "trigger-long-running-operation");
    let call = tokio::spawn(async move {
        long.execute(json!({"duration": 30, "steps": 30}), &ctx())
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = std::process::Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(killed.success());
    let error = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        error.message().contains("MCP server \"everything\""),
        "{error}"
    );
    gone(pid).await;
    let out = tool(&server, "echo")
        .execute(json!({"message": "back"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.to_content(), "Echo: back");
    let new_pid = server.child_pid().await.unwrap();
    assert_ne!(new_pid, pid);
    server.shutdown().await;
    gone(new_pid).await;
}

#[tokio::test]
async fn dropping_the_server_kills_its_process_group() {
    let Some(entry) = everything() else { return };
    let (server, pid) = start(&entry, McpOptions::default()).await;
    assert!(alive(pid));
    drop(server);
    gone(pid).await;
}

#[tokio::test]
async fn cancelling_a_run_ends_its_mcp_call_at_once() {
    use rein::prelude::*;
    let Some(entry) = everything() else { return };
    let (server, pid) = start(&entry, McpOptions::default()).await;
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call(
            "everything__trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
        ),
        ScriptedResponse::tool_call("everything__echo", json!({"message": "after"})),
        ScriptedResponse::text("done"),
    ]);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model))
        .with_tools(server.tools())
        .build()
        .unwrap();
    let run = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            runtime
                .run_to_completion(RunRequest::new("t", vec![Message::user("go")]))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = Instant::now();
    assert!(runtime.cancel_and_wait_by_thread("t").await);
    assert!(started.elapsed() < Duration::from_secs(1));
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.termination, TerminationReason::Cancelled);
    // The next run's MCP call works: the server was not left stuck.
    let result = runtime
        .run_to_completion(RunRequest::new("t", vec![Message::user("again")]))
        .await
        .unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::NaturalEnd,
        "{result:?}"
    );
    let history = runtime.thread_messages("t").await;
    assert!(
        history.iter().any(|m| m.content == "Echo: after"),
        "{history:#?}"
    );
    server.shutdown().await;
    gone(pid).await;
}

#[tokio::test]
async fn the_same_server_over_streamable_http() {
    let Some(entry) = everything() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    // Wait until it listens.
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the HTTP server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let server = McpServer::start("remote", McpTransport::Http { url }, McpOptions::default())
        .await
        .unwrap();
    assert!(server.tool_names().contains(&"echo"));
    let out = server
        .tool("echo")
        .unwrap()
        .execute(json!({"message": "over http"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.to_content(), "Echo: over http");
    let long = server.tool("trigger-long-running-operation").unwrap();
    let context = ctx();
    let call = long.execute(json!({"duration": 30, "steps": 30}), &context);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    assert!(
        server
            .tool("echo")
            .unwrap()
            .execute(json!({"message": "again"}), &ctx())
            .await
            .is_ok()
    );
    server.shutdown().await;
    child.kill().await.unwrap();
    gone(pid).await;
}

#[tokio::test]
async fn the_server_receives_the_cancellation_of_a_dropped_call() {
    let Some(entry) = everything() else { return };
    // The reference server's own dependencies hold the official SDK.
    let modules = std::path::Path::new(&entry)
        .ancestors()
        .nth(4)
        .unwrap()
        .to_path_buf();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/cancel_log.cjs");
    let log = std::env::temp_dir().join(format!("rein-mcp-cancel-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let transport = McpTransport::Stdio {
        command: "node".into(),
        args: vec![script.display().to_string()],
        env: [
            ("NODE_PATH".to_owned(), modules.display().to_string()),
            ("CANCEL_LOG".to_owned(), log.display().to_string()),
        ]
        .into(),
        cwd: None,
    };
    let server = McpServer::start("logger", transport, McpOptions::default())
        .await
        .unwrap();
    let pid = server.child_pid().await.unwrap();
    let wait = server.tool("wait").unwrap();
    let context = ctx();
    let call = wait.execute(json!({}), &context);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    let start = Instant::now();
    loop {
        let seen = std::fs::read_to_string(&log).unwrap_or_default();
        if seen.starts_with("cancelled ") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the server never saw the cancellation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
    gone(pid).await;
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn an_eight_megabyte_result_is_answered_as_too_large_recorded_may_have_completed_and_not_kept()
 {
    use rein::contract::lifecycle::ToolCallStatus;
    use rein::prelude::*;
    let Some(entry) = everything() else { return };
    // A timeout far longer than any test: the answer must not wait for it.
    let options = McpOptions {
        tool_timeout: Duration::from_secs(600),
        ..McpOptions::default()
    };
    let (server, pid) = start(&entry, options).await;
    // The reference server reads at most about 10 MB per message, so its
    // echo answers at most that much; the framing is the same for any size
    // (a 20 MB line is covered by the unit tests of `stdout`).
    let big = "x".repeat(8 * 1024 * 1024);
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("everything__echo", json!({ "message": big })),
        ScriptedResponse::tool_call("everything__echo", json!({"message": "small"})),
        ScriptedResponse::text("done"),
    ]);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("a").with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", Arc::new(model))
        .with_tools(server.tools())
        .build()
        .unwrap();
    let result = runtime
        .run_to_completion(RunRequest::new("t", vec![Message::user("go")]))
        .await
        .unwrap();
    assert_eq!(
        result.termination,
        TerminationReason::NaturalEnd,
        "{result:?}"
    );
    let history = runtime.thread_messages("t").await;
    let tools: Vec<&Message> = history.iter().filter(|m| m.role == Role::Tool).collect();
    assert_eq!(tools.len(), 2, "{history:#?}");
    let refused = &tools[0];
    assert!(
        refused.content.contains("result too large (")
            && refused
                .content
                .contains("bytes; the limit is 1048576 bytes"),
        "{}",
        &refused.content[..refused.content.len().min(500)]
    );
    assert!(refused.content.len() < 1000, "the result was not kept");
    assert_eq!(refused.tool_status, Some(ToolCallStatus::MayHaveCompleted));
    // The connection is intact: the next call is answered.
    assert_eq!(tools[1].content, "Echo: small");
    assert_eq!(tools[1].tool_status, None);
    server.shutdown().await;
    gone(pid).await;
}

#[tokio::test]
async fn a_result_over_the_configured_limit_is_refused_and_one_within_it_passes() {
    let Some(entry) = everything() else { return };
    let options = McpOptions {
        max_result_bytes: 100_000,
        ..McpOptions::default()
    };
    let (server, pid) = start(&entry, options).await;
    let echo = tool(&server, "echo");
    let within = echo
        .execute(json!({"message": "a".repeat(50_000)}), &ctx())
        .await
        .unwrap();
    assert_eq!(within.to_content().len(), "Echo: ".len() + 50_000);
    let over = echo
        .execute(json!({"message": "b".repeat(200_000)}), &ctx())
        .await
        .unwrap_err();
    assert!(
        over.message().contains("result too large (")
            && over.message().contains("the limit is 100000 bytes")
            && over.message().contains("MCP server \"everything\""),
        "{over}"
    );
    assert_eq!(
        over.status(),
        Some(rein::contract::lifecycle::ToolCallStatus::MayHaveCompleted)
    );
    server.shutdown().await;
    gone(pid).await;
}
