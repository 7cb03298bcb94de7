//! MCP servers in the deployment file: an agent's MCP tools over HTTP, a
//! listed tool the server lacks, `rein check` not starting servers, and
//! `rein serve` leaving no child process after SIGTERM. Against the
//! reference server `@modelcontextprotocol/server-everything`, installed by
//! `.ci/run` (`REIN_MCP_EVERYTHING` names its `dist/index.js`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;
use rein_server::deployment::Deployment;
use serde_json::json;

fn everything() -> Option<String> {
    match std::env::var("REIN_MCP_EVERYTHING") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            let _ = std::io::stderr().write_all(
                b"MCP deployment tests skipped: REIN_MCP_EVERYTHING is not set (.ci/run sets it)\n",
            );
            None
        }
    }
}

fn yaml(entry: &str, tools: &str) -> String {
    format!(
        r#"
providers:
  offline:
    kind: scripted
    responses:
      - {{ tool_calls: [ {{ name: everything__echo, arguments: {{ message: "from the model" }} }} ] }}
      - "The server echoed it."
models:
  demo: {{ provider: offline, model: script }}
mcp_servers:
  everything: {{ command: node, args: ["{entry}", "stdio"] }}
agents:
  - {{ id: assistant, model_id: demo, tools: [{tools}] }}
"#
    )
}

#[tokio::test]
async fn an_agent_calls_its_mcp_tool_through_the_http_api() {
    let Some(entry) = everything() else { return };
    let server = Server::start(&yaml(&entry, "everything__echo")).await;
    let (_, agents) = server.get("/v1/agents").await;
    assert_eq!(agents[0]["tools"], json!(["everything__echo"]));
    let (status, record) = server
        .post(
            "/v1/threads/t/runs?wait=true",
            json!({"messages": [{"role": "user", "content": "echo something"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    let (_, history) = server.get("/v1/threads/t/messages").await;
    assert!(
        history.to_string().contains("Echo: from the model"),
        "{history}"
    );
    let pid = server.assembled.mcp_servers["everything"]
        .child_pid()
        .await
        .unwrap();
    server.stop().await;
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists() || zombie(pid));
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) == Some("Z"))
        .unwrap_or(true)
}

#[tokio::test]
async fn a_listed_tool_the_server_lacks_fails_the_start_naming_both() {
    let Some(entry) = everything() else { return };
    let deployment = Deployment::from_yaml(&yaml(&entry, "everything__nope")).unwrap();
    let error = rein_server::assemble::start(&deployment)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("MCP server \"everything\" has no tool \"nope\""),
        "{error}"
    );
    assert!(error.contains("echo"), "{error}");
}

#[test]
fn check_resolves_mcp_servers_without_starting_them() {
    let dir = std::env::temp_dir().join(format!("rein-mcp-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    // A command that does not exist: check must not try to run it.
    std::fs::write(
        &path,
        yaml("/nonexistent/server.js", "everything__echo")
            .replace("command: node", "command: /nonexistent/mcp-server"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    std::fs::write(&path, yaml("/x.js", "ghost__echo")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("names unknown MCP server \"ghost\"; known MCP servers: everything")
    );
}

/// The pids of the processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, …
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
            && fields.first() != Some(&"Z")
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn serve_with_an_mcp_server_leaves_no_child_process_after_sigterm() {
    let Some(entry) = everything() else { return };
    let dir = std::env::temp_dir().join(format!("rein-mcp-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::write(&path, yaml(&entry, "everything__echo")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    let servers = children(child.id());
    let lifelines = servers.iter().filter(|pid| is_lifeline(**pid)).count();
    assert_eq!(
        (servers.len(), lifelines),
        (2, 1),
        "one MCP server process and its lifeline: {servers:?}"
    );
    let status = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let start = Instant::now();
    while servers.iter().any(|pid| alive(*pid)) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the MCP server outlived rein serve"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is an MCP server's lifeline watchdog.
fn is_lifeline(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("rein-mcp-lifeline"))
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid)
}

#[test]
fn after_kill_9_of_rein_serve_not_even_the_mcp_server_s_own_child_is_left() {
    let Some(entry) = everything() else { return };
    let dir = std::env::temp_dir().join(format!("rein-mcp-kill9-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("grandchild.pid");
    let _ = std::fs::remove_file(&pidfile);
    // The MCP server starts a child of its own (a `sleep`), then becomes
    // the reference server.
    let script = format!(
        "sleep 300 & echo $! > {}; exec node {entry} stdio",
        pidfile.display()
    );
    let yaml = format!(
        r#"
providers:
  offline: {{ kind: scripted, responses: ["hi"] }}
models:
  demo: {{ provider: offline, model: script }}
mcp_servers:
  everything: {{ command: sh, args: ["-c", {script:?}] }}
agents:
  - {{ id: assistant, model_id: demo, tools: [everything__echo] }}
"#
    );
    let path = dir.join("rein.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    let server: Vec<u32> = children(child.id())
        .into_iter()
        .filter(|pid| !is_lifeline(*pid))
        .collect();
    assert_eq!(server.len(), 1, "{server:?}");
    let grandchild: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(grandchild));
    child.kill().unwrap(); // SIGKILL, by PID
    child.wait().unwrap();
    let start = Instant::now();
    while alive(grandchild) || alive(server[0]) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a process the MCP server started outlived rein serve's kill -9 (server {}, its child {grandchild})",
            server[0]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_mcp_example_runs_offline() {
    let Some(_) = everything() else { return };
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rein-mcp.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["run", "--config"])
        .arg(example)
        .arg("Echo something")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("[tool] everything__echo -> Echo: hello over MCP"),
        "{err}"
    );
}

/// A deployment whose agent starts the server's 60-second operation, then
/// answers "Stopped it."; `extra` is appended (e.g. a `store:` line).
fn long_operation(entry: &str, extra: &str) -> String {
    format!(
        r#"
providers:
  offline:
    kind: scripted
    responses:
      - {{ tool_calls: [ {{ name: everything__trigger-long-running-operation, arguments: {{ duration: 60, steps: 60 }} }} ] }}
      - "Stopped it."
models:
  demo: {{ provider: offline, model: script }}
mcp_servers:
  everything: {{ command: node, args: ["{entry}", "stdio"] }}
agents:
  - {{ id: assistant, model_id: demo, tools: [everything__trigger-long-running-operation] }}
{extra}
"#
    )
}

#[tokio::test]
async fn cancelling_one_mcp_tool_call_over_http_ends_that_call_and_the_run_goes_on() {
    let Some(entry) = everything() else { return };
    let yaml = long_operation(&entry, "");
    let server = Server::start(&yaml).await;
    let (status, accepted) = server
        .post(
            "/v1/threads/t/runs",
            json!({"messages": [{"role": "user", "content": "run the long operation"}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let cancel = format!("/v1/runs/{run_id}/tool_calls/call_1/cancel");
    // Until the call has started, the route says which calls are running.
    let started = std::time::Instant::now();
    loop {
        let (status, body) = server.post(&cancel, json!({})).await;
        if status == 200 {
            assert_eq!(
                body,
                json!({"cancelled": true, "run_id": run_id, "call_id": "call_1"})
            );
            break;
        }
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["error"]["code"], "tool_call_not_running", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("running now: none"),
            "{body}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the call never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let record = server.finished(&run_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(record["response"], "Stopped it.");
    assert_eq!(
        record["report"]["tool_calls"],
        json!([{"call_id": "call_1", "name": "everything__trigger-long-running-operation", "status": "interrupted"}]),
        "the server marks the tool read-only"
    );
    assert_eq!(record["report"]["resumable"], true);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the 60 s operation was cut short"
    );
    let (_, history) = server.get("/v1/threads/t/messages").await;
    assert!(
        history.to_string().contains("cancelled by the user: this call was stopped before it finished; the run goes on — interrupted"),
        "{history}"
    );
    // Afterwards: the run is finished; an unknown run is 404.
    let (status, body) = server.post(&cancel, json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("tool_call_not_running")),
        "{body}"
    );
    let (status, body) = server
        .post("/v1/runs/nope/tool_calls/c/cancel", json!({}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_run")),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cancel_sent_to_another_process_reaches_the_run() {
    let Some(entry) = everything() else { return };
    if std::env::var("REIN_DATABASE_URL").map_or(true, |u| u.is_empty()) {
        let _ = std::io::stderr()
            .write_all(b"cross-process tool-call cancel skipped: REIN_DATABASE_URL is not set\n");
        return;
    }
    let yaml = long_operation(
        &entry,
        "store: { postgres: { url_env: REIN_DATABASE_URL } }",
    );
    let a = Server::start(&yaml).await;
    let b = Server::start(&yaml).await;
    let thread = format!(
        "tool-cancel-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let (status, accepted) = a
        .post(
            &format!("/v1/threads/{thread}/runs"),
            json!({"messages": [{"role": "user", "content": "run the long operation"}]}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    // Wait until the call runs on a: a's route, asked for a call that does
    // not exist, names the running ones.
    let started = std::time::Instant::now();
    loop {
        let (_, body) = a
            .post(
                &format!("/v1/runs/{run_id}/tool_calls/none/cancel"),
                json!({}),
            )
            .await;
        if body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("running now: call_1"))
        {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, body) = b
        .post(
            &format!("/v1/runs/{run_id}/tool_calls/call_1/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["requested"], true);
    let record = b.finished(&run_id).await;
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    assert_eq!(
        record["report"]["tool_calls"][0]["status"], "interrupted",
        "{record}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_compact_calls_rule_in_the_deployment_gives_an_mcp_tool_s_old_calls_a_compact_form() {
    let Some(entry) = everything() else { return };
    let dir = std::env::temp_dir().join(format!("rein-mcp-compact-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let long = "lorem ipsum dolor ".repeat(200);
    let yaml = format!(
        r#"
providers:
  offline:
    kind: scripted
    responses:
      - {{ tool_calls: [ {{ name: everything__echo, arguments: {{ message: "first {long}" }} }} ] }}
      - {{ tool_calls: [ {{ name: everything__echo, arguments: {{ message: "second {long}" }} }} ] }}
      - {{ tool_calls: [ {{ name: everything__echo, arguments: {{ message: "third {long}" }} }} ] }}
      - "Echoed three times."
models:
  demo: {{ provider: offline, model: script }}
mcp_servers:
  everything: {{ command: node, args: ["{entry}", "stdio"] }}
artifacts: {{ dir: "{dir}" }}
agents:
  - id: assistant
    model_id: demo
    tools: [everything__echo]
    context:
      window_tokens: 3000
      compact: {{ at: 0.5, keep_last_rounds: 1, calls: {{ everything__echo: [] }} }}
"#,
        dir = dir.display()
    );
    let server = Server::start(&yaml).await;
    let (status, record) = server
        .post(
            "/v1/threads/compact/runs?wait=true",
            json!({"messages": [{"role": "user", "content": "echo three times"}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["termination"]["type"], "natural_end", "{record}");
    server.stop().await;
    // The first call's whole arguments were offloaded as an artifact of
    // their own, next to the results.
    let artifacts: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flat_map(|thread| std::fs::read_dir(thread.unwrap().path()).unwrap())
        .map(|file| std::fs::read_to_string(file.unwrap().path()).unwrap())
        .collect();
    assert!(
        artifacts
            .iter()
            .any(|text| text.starts_with("{\"message\":\"first lorem")),
        "{} artifacts, none the first call's arguments",
        artifacts.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
