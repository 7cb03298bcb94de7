//! Who may call `rein serve`: bearer tokens, browser origins (CORS and
//! preflights), loopback host names without auth (DNS rebinding), JSON
//! bodies on writes, and no public bind without auth. Through the binary
//! and raw HTTP, as a browser or an attacker would send it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const AGENTS: &str = "providers:\n  p: { kind: scripted, responses: [\"Done.\"] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n  - { id: b, model_id: m }\n";

const TOKENS: &str = "full-token-0123456789, read-token-0123456789:read, agent-token-0123456789:agents=b, alice=alice-token-0123456789";

fn file(name: &str, yaml: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-guard-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A `rein serve` process on a free loopback port, killed (by PID) on drop.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(config: &PathBuf) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--bind", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("REIN_TEST_TOKENS", TOKENS)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap()
            .to_owned();
        Self { child, addr }
    }

    /// Sends `head` (request line and headers, without the final blank
    /// line) and `body`; returns the status, the headers and the body.
    fn send(&self, head: &str, body: &str) -> (u16, String, String) {
        let mut socket = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(
            socket,
            "{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).unwrap();
        let (headers, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = headers.split(' ').nth(1).unwrap().parse().unwrap();
        (status, headers.to_ascii_lowercase(), body.to_owned())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SUBMIT: &str = r#"{"agent_id":"a","messages":[{"role":"user","content":"hi"}]}"#;

fn code(body: &str) -> String {
    let value: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON error, not {body:?}"));
    value["error"]["code"].as_str().unwrap().to_owned()
}

#[test]
fn without_auth_a_foreign_page_a_rebinding_host_and_a_form_post_are_refused() {
    let serve = Serve::start(&file("open", AGENTS));
    // A page of another origin posting text/plain (no preflight needed).
    let (status, _, body) = serve.send(
        "POST /v1/threads/t/runs HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: https://evil.example\r\ncontent-type: text/plain",
        SUBMIT,
    );
    assert_eq!((status, code(&body)), (403, "origin_not_allowed".into()));
    // DNS rebinding: the page's own host name, resolving to 127.0.0.1.
    let (status, _, body) = serve.send(
        "GET /v1/threads/t/messages HTTP/1.1\r\nhost: rebind.evil.example",
        "",
    );
    assert_eq!((status, code(&body)), (403, "host_not_allowed".into()));
    // A body that is not JSON.
    let (status, _, body) = serve.send(
        "POST /v1/threads/t/runs HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/plain",
        SUBMIT,
    );
    assert_eq!(
        (status, code(&body)),
        (415, "unsupported_media_type".into())
    );
    // A preflight from a foreign origin.
    let (status, _, body) = serve.send(
        "OPTIONS /v1/threads/t/runs HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: https://evil.example\r\naccess-control-request-method: POST",
        "",
    );
    assert_eq!((status, code(&body)), (403, "origin_not_allowed".into()));
    // A page the service serves itself (same origin) may call.
    let (status, _, body) = serve.send(
        &format!(
            "POST /v1/threads/same/runs HTTP/1.1\r\nhost: {}\r\norigin: http://{}\r\ncontent-type: application/json",
            serve.addr, serve.addr
        ),
        SUBMIT,
    );
    assert_eq!(status, 202, "{body}");
    // Nothing of the refused ones ran; a plain local client still can.
    let (status, _, body) =
        serve.send("GET /v1/threads/t/messages HTTP/1.1\r\nhost: 127.0.0.1", "");
    assert_eq!((status, body.as_str()), (200, "[]"));
    let (status, _, body) = serve.send(
        "POST /v1/threads/t/runs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json",
        SUBMIT,
    );
    assert_eq!(status, 202, "{body}");
}

#[test]
fn with_auth_each_token_does_what_it_may_and_nothing_else() {
    let yaml = format!(
        "{AGENTS}server:\n  auth: {{ tokens_env: REIN_TEST_TOKENS }}\n  cors: {{ origins: [\"http://app.example\"] }}\n"
    );
    let serve = Serve::start(&file("auth", &yaml));
    let post = |token: &str, agent: &str| {
        let auth = if token.is_empty() {
            String::new()
        } else {
            format!("\r\nauthorization: Bearer {token}")
        };
        serve.send(
            &format!("POST /v1/threads/t-{agent}/runs HTTP/1.1\r\nhost: api.example\r\ncontent-type: application/json{auth}"),
            &format!(r#"{{"agent_id":"{agent}","messages":[{{"role":"user","content":"hi"}}]}}"#),
        )
    };
    let (status, headers, body) = post("", "a");
    assert_eq!((status, code(&body)), (401, "unauthorized".into()));
    assert!(headers.contains("www-authenticate: bearer"), "{headers}");
    let (status, _, body) = post("not-a-token-0123456789", "a");
    assert_eq!((status, code(&body)), (401, "unauthorized".into()));
    assert!(
        !body.contains("not-a-token"),
        "the token is never quoted: {body}"
    );
    let (status, _, body) = post("read-token-0123456789", "a");
    assert_eq!((status, code(&body)), (403, "forbidden".into()));
    let (status, _, body) = post("agent-token-0123456789", "a");
    assert_eq!((status, code(&body)), (403, "forbidden".into()));
    assert_eq!(post("agent-token-0123456789", "b").0, 202);
    assert_eq!(post("full-token-0123456789", "a").0, 202);
    // Reads with the read token; liveness without any.
    let (status, _, _) = serve.send(
        "GET /v1/threads/t-a/messages HTTP/1.1\r\nhost: api.example\r\nauthorization: Bearer read-token-0123456789",
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(
        serve
            .send("GET /healthz HTTP/1.1\r\nhost: api.example", "")
            .0,
        200
    );
    // The configured origin's preflight is answered, and its calls carry
    // the CORS header.
    let (status, headers, _) = serve.send(
        "OPTIONS /v1/threads/t/runs HTTP/1.1\r\nhost: api.example\r\norigin: http://app.example\r\naccess-control-request-method: POST",
        "",
    );
    assert_eq!(status, 204);
    assert!(
        headers.contains("access-control-allow-origin: http://app.example"),
        "{headers}"
    );
    assert!(
        headers.contains("access-control-allow-headers:"),
        "{headers}"
    );
}

#[test]
fn serve_refuses_a_public_bind_without_auth_unless_told_and_a_missing_token_variable() {
    let config = file("public", AGENTS);
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--bind", "0.0.0.0:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without authentication") && err.contains("--insecure-public"),
        "{err}"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args([
            "serve",
            "--bind",
            "0.0.0.0:0",
            "--insecure-public",
            "--config",
        ])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("listening on http://0.0.0.0:"), "{line}");
    let unset = file(
        "unset",
        &format!("{AGENTS}server: {{ auth: {{ tokens_env: REIN_NO_SUCH_VARIABLE }} }}\n"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&unset)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("REIN_NO_SUCH_VARIABLE is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_decision_records_the_name_of_the_token_that_took_it() {
    let config = file(
        "decided-by",
        "providers:\n  p:\n    kind: scripted\n    responses:\n      - { text: \"Finishing.\", tool_calls: [ { name: terminate, arguments: { status: success, message: done } } ] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: ops, model_id: m, plugin_ids: [terminate], approvals: [ { tool: terminate, action: ask } ] }\nserver:\n  auth: { tokens_env: REIN_TEST_TOKENS }\n",
    );
    let serve = Serve::start(&config);
    let auth = "authorization: Bearer alice-token-0123456789\r\ncontent-type: application/json";
    let (status, _, body) = serve.send(
        &format!("POST /v1/threads/t/runs HTTP/1.1\r\nhost: localhost\r\n{auth}"),
        r#"{"agent_id":"ops","messages":[{"role":"user","content":"finish"}]}"#,
    );
    assert_eq!(status, 202, "{body}");
    let run: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let read = |serve: &Serve| -> serde_json::Value {
        let (_, _, body) = serve.send(
            &format!("GET /v1/runs/{run_id} HTTP/1.1\r\nhost: localhost\r\n{auth}"),
            "",
        );
        serde_json::from_str(&body).unwrap()
    };
    let mut record = read(&serve);
    for _ in 0..400 {
        if record["status"] == "awaiting_approval" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        record = read(&serve);
    }
    let call = record["pending_approvals"][0]["call_id"]
        .as_str()
        .unwrap_or_else(|| panic!("never parked: {record}"))
        .to_owned();
    let (status, _, body) = serve.send(
        &format!("POST /v1/runs/{run_id}/approvals/{call} HTTP/1.1\r\nhost: localhost\r\n{auth}"),
        r#"{"decision":"approve"}"#,
    );
    assert_eq!(status, 200, "{body}");
    for _ in 0..400 {
        if record["status"] == "finished" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        record = read(&serve);
    }
    assert_eq!(record["status"], "finished", "{record}");
    let decision = &record["decisions"][0];
    assert_eq!(decision["call_id"], call.as_str(), "{record}");
    assert_eq!(decision["decision"], "approve", "{record}");
    assert_eq!(decision["decided_by"], "alice", "{record}");
    let at = decision["decided_at"].as_str().unwrap();
    assert!(
        rein::contract::approval::parse_rfc3339(at).is_some(),
        "decided_at is RFC 3339: {at}"
    );
    // The event in the run's log says the same.
    let (_, _, events) = serve.send(
        &format!("GET /v1/runs/{run_id}/events HTTP/1.1\r\nhost: localhost\r\n{auth}"),
        "",
    );
    assert!(
        events.contains(r#""decided_by":"alice""#),
        "approval_decided names who decided: {events}"
    );
}

#[test]
fn with_auth_the_console_s_assets_need_no_token_and_the_api_behind_them_does() {
    let yaml = format!("{AGENTS}server:\n  auth: {{ tokens_env: REIN_TEST_TOKENS }}\n");
    let serve = Serve::start(&file("console", &yaml));
    let get = |path: &str, token: &str| {
        let auth = if token.is_empty() {
            String::new()
        } else {
            format!("\r\nauthorization: Bearer {token}")
        };
        serve.send(
            &format!("GET {path} HTTP/1.1\r\nhost: api.example{auth}"),
            "",
        )
    };
    let (status, headers, page) = get("/", "");
    assert_eq!(status, 200);
    assert!(headers.contains("content-type: text/html"), "{headers}");
    assert!(
        headers.contains("content-security-policy: default-src 'self'"),
        "{headers}"
    );
    assert!(page.contains("/console/app.js"), "{page}");
    for (path, kind) in [
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let (status, headers, body) = get(path, "");
        assert_eq!(status, 200, "{path}");
        assert!(
            headers.contains(kind) && !body.is_empty(),
            "{path}: {headers}"
        );
    }
    // What the page shows comes from the API, which needs the token.
    for path in ["/v1/runs", "/v1/threads", "/v1/approvals", "/v1/agents"] {
        let (status, _, body) = get(path, "");
        assert_eq!(
            (status, code(&body)),
            (401, "unauthorized".into()),
            "{path}"
        );
        let (status, _, _) = get(path, "read-token-0123456789");
        assert_eq!(status, 200, "{path}");
    }
    // Only GET: the console's paths take nothing else without a token.
    let (status, _, body) = serve.send(
        "POST / HTTP/1.1\r\nhost: api.example\r\ncontent-type: application/json",
        "{}",
    );
    assert_eq!((status, code(&body)), (401, "unauthorized".into()));
}
