//! The `rein` binary itself: `check`, `run` (exit codes, Ctrl-C) and
//! `serve` (its one stdout line, SIGTERM). Processes are stopped by PID.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../rein/tests/otlp_collector/mod.rs"]
mod otlp_collector;

fn rein() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rein"))
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// A deployment file in a fresh temporary directory.
fn file(name: &str, yaml: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-binary-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    path
}

/// `rein serve` on any free port with `extra` arguments: the process, its
/// further stdout lines, and the URL its one line announced.
fn serve(
    extra: &[&std::ffi::OsStr],
    config: &Path,
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
    String,
) {
    let mut child = rein()
        .args(["serve", "--bind", "127.0.0.1:0"])
        .args(extra)
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let url = line
        .strip_prefix("listening on ")
        .expect("the listening line")
        .to_owned();
    (child, lines, url)
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn check_says_ok_for_the_examples_and_lists_every_error_with_its_position() {
    for example in [
        "rein.yaml",
        "rein-local.yaml",
        "rein-mcp.yaml",
        "rein-subagents.yaml",
    ] {
        let out = rein()
            .args(["check", "--config"])
            .arg(examples().join(example))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    }
    let path = file(
        "check",
        "providers:\n  p: { kind: genai }\nmodels:\n  m: { provider: q, model: x }\nagents:\n  - { id: a, model_id: nope }\n",
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let shown = path.display().to_string();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(&format!(
            "{shown}:4:18: model \"m\": unknown provider \"q\""
        )),
        "{text}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{shown}:6:24: agent \"a\": unknown model \"nope\""
        )),
        "{text}"
    );
}

#[test]
fn run_streams_the_answer_to_stdout_and_exits_by_termination() {
    let out = rein()
        .args(["run", "--config"])
        .arg(examples().join("rein.yaml"))
        .args(["Hello", "there"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Hello from Rein."));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[end] natural_end ·"));

    let failing = file(
        "error",
        "providers:\n  p: { kind: scripted, responses: [ { error: \"quota exceeded\" } ] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let out = rein()
        .args(["run", "--config"])
        .arg(&failing)
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("quota exceeded"));
}

#[test]
fn a_provider_nobody_answers_ends_the_run_error_naming_it_without_its_url_and_run_exits_1() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let yaml = |agent: &str| {
        format!(
            "providers:\n  local: {{ kind: openai_compatible, base_url: \"http://127.0.0.1:{port}/v1\" }}\nmodels:\n  m: {{ provider: local, model: smollm2 }}\nagents:\n  - {agent}\n"
        )
    };
    // No limit but 50 rounds: the run ends `error` after a few attempts,
    // not `stopped(max_rounds)` after 50.
    let path = file(
        "dead-provider",
        &yaml("{ id: a, model_id: m, max_rounds: 50 }"),
    );
    let out = rein()
        .args(["run", "--config"])
        .arg(&path)
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("[end] error")
            && stderr.contains(
                "provider \"local\" (model \"smollm2\") could not be reached in 4 attempts"
            ),
        "{stderr}"
    );
    // The run's own lines (what a client of the run sees) have no URL;
    // the log lines have it, for the operator.
    let printed: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert!(
        !printed.is_empty() && printed.iter().all(|l| !l.contains(&format!(":{port}"))),
        "the URL leaked: {printed:?}"
    );
    // A stop that errors caused is a failure too.
    let path = file(
        "dead-provider-stop",
        &yaml("{ id: a, model_id: m, stop_conditions: [ { type: consecutive_errors, max: 2 } ] }"),
    );
    let out = rein()
        .args(["run", "--config"])
        .arg(&path)
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("consecutive_errors"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}

/// A server on a free port that answers every request as OpenAI does for
/// a model it does not have (404 `model_not_found`).
fn unknown_model_server() -> u16 {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let length: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            let _ = stream.read_exact(&mut body);
            let answer = r#"{"error":{"message":"The model `nope` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    port
}

#[test]
fn check_probe_names_each_model_whose_provider_does_not_answer_or_know_it() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let unknown_port = unknown_model_server();
    let live = std::env::var("REIN_LLM_BASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let mut yaml = format!(
        "providers:\n  dead: {{ kind: openai_compatible, base_url: \"http://127.0.0.1:{dead_port}/v1\" }}\n  picky: {{ kind: openai_compatible, base_url: \"http://127.0.0.1:{unknown_port}/v1\" }}\n  offline: {{ kind: scripted, responses: [hi] }}\n"
    );
    if let Some(url) = &live {
        yaml.push_str(&format!(
            "  local: {{ kind: openai_compatible, base_url: \"{url}\" }}\n"
        ));
    }
    yaml.push_str("models:\n  gone: { provider: dead, model: smollm2 }\n  nope: { provider: picky, model: nope }\n  demo: { provider: offline, model: script }\n");
    if live.is_some() {
        yaml.push_str("  small: { provider: local, model: smollm2 }\n");
    }
    yaml.push_str("agents:\n  - { id: a, model_id: demo }\n");
    let path = file("probe", &yaml);
    // Without --probe nothing is contacted.
    let out = rein()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let out = rein()
        .args(["check", "--probe", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let line = |model: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("model \"{model}\"")))
            .copied()
            .unwrap_or_default()
    };
    assert!(
        line("gone")
            .starts_with("model \"gone\" on provider \"dead\": does not answer: connection error"),
        "{stdout}"
    );
    assert!(!stdout.contains(&format!(":{dead_port}")), "{stdout}");
    assert!(
        line("nope")
            .starts_with("model \"nope\" on provider \"picky\": does not know model \"nope\""),
        "{stdout}"
    );
    assert_eq!(
        line("demo"),
        "",
        "scripted providers are not probed: {stdout}"
    );
    if live.is_some() {
        assert_eq!(
            line("small"),
            "ok: model \"small\" on provider \"local\" answered",
            "{stdout}"
        );
    }
    let failed = if live.is_some() { "2 of 3" } else { "2 of 2" };
    assert_eq!(
        lines.last().copied(),
        Some(format!("{failed} models failed the probe").as_str()),
        "{stdout}"
    );
}

#[test]
fn a_scripted_reply_s_usage_counts_so_a_token_budget_stops_the_run_offline() {
    let path = file(
        "usage",
        "providers:\n  p:\n    kind: scripted\n    responses:\n      - { text: \"Thinking.\", tool_calls: [ { name: look } ], usage: { input: 700, output: 400 } }\n      - \"Done.\"\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m, stop_conditions: [ { type: token_budget, max_total: 1000 } ] }\n",
    );
    let out = rein()
        .args(["run", "--config"])
        .arg(&path)
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("[end] stopped (token_budget)")
            && stderr.contains("700 tokens in / 400 out"),
        "{stderr}"
    );
    // A usage with a misspelt key is refused, not ignored.
    let bad = file(
        "usage-typo",
        "providers:\n  p: { kind: scripted, responses: [ { text: hi, usage: { inputs: 1, output: 1 } } ] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("inputs"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_sub_agent_example_runs_offline_with_each_child_indented_under_its_call() {
    let out = rein()
        .args(["run", "--config"])
        .arg(examples().join("rein-subagents.yaml"))
        .args(["--agent", "lead", "Plan a day trip to Bern."])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .trim_end()
            .ends_with("Take the 8:02 from Zurich; you are in Bern at 8:58."),
        "{stdout}"
    );
    assert!(
        !stdout.contains("Trains leave"),
        "a child's text is not the answer: {stdout}"
    );
    for line in [
        "[subagent] researcher started (",
        "  [end] stopped (goal): all declared outputs were emitted: sources, summary",
        "[subagent] researcher ended: goal",
        "  │ Yes: it leaves time for the old town before lunch.",
        "[subagent] critic ended: natural_end",
        "[end] natural_end · 3 rounds · 1070 tokens in / 140 out",
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(line)),
            "{line:?} in:\n{stderr}"
        );
    }
}

#[test]
fn ctrl_c_cancels_a_run_cleanly_and_exits_130() {
    let slow = file(
        "slow",
        "providers:\n  p: { kind: scripted, chunk_delay_ms: 300, responses: [\"a b c d e f g h i j k l m n o p\"] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let mut child = rein()
        .args(["run", "--config"])
        .arg(&slow)
        .arg("hi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first streamed word, then interrupt.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    signal(child.id(), "INT");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("[end] cancelled"), "{err}");
}

#[test]
fn serve_prints_one_listening_line_and_sigterm_ends_runs_and_exits_zero() {
    let slow = file(
        "serve",
        "providers:\n  p: { kind: scripted, chunk_delay_ms: 200, responses: [\"a b c d e f g h i j k l m n o p\"] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let (mut child, mut lines, url) = serve(&[], &slow);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    // A run, and a reader of its events (plain HTTP/1.1 over a socket).
    let addr = url.trim_start_matches("http://").to_owned();
    let body = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let mut post = std::net::TcpStream::connect(&addr).unwrap();
    write!(post, "POST /v1/threads/t/runs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut post, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let mut events = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        events,
        "GET /v1/runs/run-1/events HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let start = Instant::now();
    signal(child.id(), "TERM");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "took {:?}",
        start.elapsed()
    );
    // The run's stream ended with its cancellation by the shutdown.
    let mut stream = String::new();
    std::io::Read::read_to_string(&mut events, &mut stream).unwrap();
    assert!(stream.contains("event: run_finished"), "{stream}");
    assert!(
        stream.contains(r#""cancel_cause":{"type":"shutdown"}"#),
        "{stream}"
    );
    assert!(lines.next().is_none(), "serve printed one line only");
}

#[test]
fn serve_records_runs_and_replay_reports_where_each_condition_would_have_fired() {
    // A model that calls the same (unknown) tool again and again (agent
    // a), and one that answers at once (agent b).
    let looping = file(
        "record",
        "providers:\n  p: { kind: scripted, responses: [ { tool_calls: [ { name: lookup, arguments: { q: rust } } ] } ] }\n  q: { kind: scripted, responses: [ { text: fine } ] }\nmodels:\n  m: { provider: p, model: x }\n  n: { provider: q, model: y }\nagents:\n  - { id: a, model_id: m, max_rounds: 6 }\n  - { id: b, model_id: n }\n",
    );
    let dir = looping.parent().unwrap().join("recordings");
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, _, url) = serve(&["--record".as_ref(), dir.as_os_str()], &looping);
    let addr = url.trim_start_matches("http://").to_owned();
    let wait = |thread: &str, body: &str| {
        let mut post = std::net::TcpStream::connect(&addr).unwrap();
        write!(post, "POST /v1/threads/{thread}/runs?wait=true HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut post, &mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        answer
    };
    let answer = wait(
        "t",
        r#"{"agent_id":"a","messages":[{"role":"user","content":"look it up"}]}"#,
    );
    assert!(answer.contains("max_rounds"), "{answer}");
    let answer = wait(
        "u",
        r#"{"agent_id":"b","messages":[{"role":"user","content":"all well?"}]}"#,
    );
    assert!(answer.contains("natural_end"), "{answer}");
    signal(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let recordings: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(recordings.len(), 1, "one file per serve process");

    // An agent that would have watched for loops.
    let agent = looping.parent().unwrap().join("agent.yaml");
    std::fs::write(
        &agent,
        "id: a\nstop_conditions:\n  - { type: tool_call_loop, threshold: 3 }\n  - { type: tool_error_loop, threshold: 4 }\n  - { type: max_rounds, rounds: 10 }\n",
    )
    .unwrap();
    let out = rein()
        .args(["replay", "--config"])
        .arg(&agent)
        .arg(&recordings[0])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("run run-1 (6 rounds, ended max_rounds)"),
        "{table}"
    );
    assert!(
        table.contains("round   3  tool_call_loop     stop"),
        "{table}"
    );
    assert!(
        table.contains("round   4  tool_error_loop    stop"),
        "{table}"
    );
    assert!(
        !table.contains("max_rounds         fired"),
        "10 rounds were never reached: {table}"
    );
    // Over both runs: the loop fired in one of two.
    assert!(table.contains("2 runs replayed"), "{table}");
    assert!(
        table.contains("run run-2 (1 rounds, ended natural_end)\n  nothing would have fired"),
        "{table}"
    );
    assert!(
        table.contains("tool_call_loop     fired in 1/2 runs (1 firings)"),
        "{table}"
    );

    let out = rein()
        .args(["replay", "--json", "--config"])
        .arg(&agent)
        .arg(&recordings[0])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["summary"]["runs"], 2);
    assert_eq!(json["summary"]["codes"]["tool_call_loop"]["runs"], 1);
    assert_eq!(json["summary"]["codes"]["tool_call_loop"]["firings"], 1);
    assert_eq!(json["runs"][0]["firings"][0]["round"], 3);
    // An agent without approval rules has no approvals report.
    assert!(json.get("approvals").is_none(), "{json}");
    assert!(!table.contains("approval rules"), "{table}");

    // The same recording, for an agent that would have asked before each
    // lookup: every started call is counted (five: the sixth round's call
    // never started, as max_rounds ended the run first).
    let asking = looping.parent().unwrap().join("asking.yaml");
    std::fs::write(
        &asking,
        "id: a
approvals:
  - { tool: lookup, when: { q: \"^rust$\" }, action: ask }
",
    )
    .unwrap();
    let out = rein()
        .args(["replay", "--json", "--config"])
        .arg(&asking)
        .arg(&recordings[0])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lookup = &json["approvals"]["tools"]["lookup"];
    assert_eq!(
        (&lookup["calls"], &lookup["ask"]),
        (&5.into(), &5.into()),
        "{json}"
    );
    assert_eq!(json["approvals"]["rules"][0]["calls"], 5, "{json}");

    // The committed fixture (recorded the same way) replays the same.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/loop-recording.jsonl");
    let out = rein()
        .args(["replay", "--config"])
        .arg(&agent)
        .arg(&fixture)
        .output()
        .unwrap();
    let fixed = String::from_utf8_lossy(&out.stdout);
    assert!(
        fixed.contains("round   3  tool_call_loop     stop"),
        "{fixed}"
    );

    // A bad recording is named with its line.
    let bad = looping.parent().unwrap().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"at_ms\": 0, \"event\": {\"type\": \"run_started\"}}\n",
    )
    .unwrap();
    let out = rein()
        .args(["replay", "--config"])
        .arg(&agent)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad.jsonl: line 1: not a recorded event"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn replay_asks_the_deployment_s_judging_model_and_says_when_it_has_none() {
    // The committed recording: agent a calling `lookup` six times.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/loop-recording.jsonl");
    let deployment = file(
        "replay-judged",
        "providers:\n  p: { kind: scripted, responses: [ fine ] }\n  judge: { kind: scripted, responses: [ '{\"reasoning\": \"lookup of rust, six times\", \"confidence\": 0.97}' ] }\nmodels:\n  m: { provider: p, model: x }\n  judge: { provider: judge, model: j }\nagents:\n  - id: a\n    model_id: m\n    stop_conditions: [ { type: llm_loop_check, model_id: judge, after_rounds: 4, interval: 1 } ]\n",
    );
    let out = rein()
        .args(["replay", "--json", "--config"])
        .arg(&deployment)
        .arg(&fixture)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let firings = json["runs"][0]["firings"].as_array().unwrap();
    let judged: Vec<&serde_json::Value> = firings
        .iter()
        .filter(|f| f["code"] == "llm_loop_check")
        .collect();
    assert_eq!(judged.len(), 1, "{json}");
    assert_eq!(judged[0]["round"], 4, "{json}");
    assert_eq!(judged[0]["action"], "stop", "{json}");
    assert!(
        judged[0]["detail"]
            .as_str()
            .unwrap()
            .contains("lookup of rust, six times"),
        "{json}"
    );
    assert!(json.get("not_evaluated").is_none(), "{json}");

    // The agent's spec alone names no models: the condition is listed as
    // not evaluated, and the rest of the replay stands.
    let agent = deployment.parent().unwrap().join("agent.yaml");
    std::fs::write(
        &agent,
        "id: a\nstop_conditions:\n  - { type: llm_loop_check, model_id: judge }\n  - { type: tool_call_loop, threshold: 3 }\n",
    )
    .unwrap();
    let out = rein()
        .args(["replay", "--config"])
        .arg(&agent)
        .arg(&fixture)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains("round   3  tool_call_loop     stop"),
        "{table}"
    );
    assert!(
        table.contains("not evaluated: llm_loop_check: a model judges it"),
        "{table}"
    );
}

#[test]
fn replay_reports_per_tool_and_per_rule_what_the_approval_rules_would_have_done_to_recorded_calls()
{
    // A hand-written recording: calls that ran, a held call rejected, a
    // held call edited and then started, an `ask_user` question, a
    // sub-agent run of another agent, and a second run.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/approvals-recording.jsonl");
    let agent = file(
        "replay-approvals",
        "id: ops\nplugin_ids: [ask_user]\napprovals:\n  - { tool: \"fs__*\", when: { path: \"^/etc/\" }, action: deny }\n  - { tool: shell, action: ask }\n  - { tool: fs__read_file, action: allow }\n",
    );
    let out = rein()
        .args(["replay", "--json", "--config"])
        .arg(&agent)
        .arg(&fixture)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = &json["approvals"];
    // The helper's run is another agent's: its `shell` call is not counted.
    assert_eq!(report["runs"], 2, "{report}");
    assert_eq!(report["calls"], 8, "{report}");
    assert_eq!(report["questions"], 1, "{report}");
    let counts = |tool: &str| {
        let t = &report["tools"][tool];
        ["calls", "ask", "deny", "allow", "no_rule", "runs"].map(|k| t[k].as_u64().unwrap())
    };
    assert_eq!(counts("fs__read_file"), [2, 0, 1, 1, 0, 1]);
    assert_eq!(counts("fs__write_file"), [2, 0, 1, 0, 1, 1]);
    // Held twice: once rejected, once edited and started (counted once).
    assert_eq!(counts("shell"), [2, 2, 0, 0, 0, 1]);
    assert_eq!(counts("lookup"), [1, 0, 0, 0, 1, 1]);
    assert_eq!(counts("helper"), [1, 0, 0, 0, 1, 1]);
    assert!(report["tools"].get("ask_user").is_none(), "{report}");
    let rules: Vec<(&str, u64, u64)> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rule"].as_str().unwrap(),
                r["calls"].as_u64().unwrap(),
                r["runs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            ("deny fs__* when path =~ ^/etc/", 2, 2),
            ("ask shell", 2, 1),
            ("allow fs__read_file", 1, 1),
        ]
    );
    // The stop-condition report is still there.
    assert_eq!(json["summary"]["runs"], 2);

    let out = rein()
        .args(["replay", "--config"])
        .arg(&agent)
        .arg(&fixture)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let stops = table
        .find("2 runs replayed")
        .expect("the stop-condition part");
    let approvals = table
        .find("approval rules over 2 runs: 8 tool calls (and 1 ask_user questions)")
        .unwrap_or_else(|| panic!("{table}"));
    assert!(stops < approvals, "{table}");
    assert!(
        table.contains("  shell               2     2     0      0        0     1\n"),
        "{table}"
    );
    assert!(table.contains("[1] ask shell"), "{table}");
}

#[test]
fn run_s_logs_are_plain_text_when_stderr_is_not_a_terminal() {
    let out = rein()
        .args(["run", "--config"])
        .arg(examples().join("rein.yaml"))
        .arg("Hello")
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DEBUG"), "some log line was written: {err}");
    assert!(
        !err.contains('\u{1b}'),
        "colour codes in piped logs: {err:?}"
    );
    assert!(err.contains("[end] natural_end"), "{err}");
}

#[test]
fn the_local_model_example_never_points_at_the_port_rein_serve_takes_by_default() {
    let local = std::fs::read_to_string(examples().join("rein-local.yaml")).unwrap();
    assert!(local.contains("base_url:"), "{local}");
    assert!(
        !local.contains("127.0.0.1:8080/"),
        "rein serve listens on 8080 by default: the model must not be there"
    );
}

#[test]
fn check_says_indentation_mistakes_and_negative_counts_in_words_once_positioned() {
    let base = "providers:\n  p: { kind: scripted, responses: [\"x\"] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - id: a\n    model_id: m\n";
    for (name, tail, expected) in [
        (
            "indent",
            "   max_rounds: 3\n",
            ":8:4: the indentation does not line up",
        ),
        (
            "negative",
            "    stop_conditions: [ { type: token_budget, max_total: -5 } ]\n",
            "max_total`: must be ≥ 0 (a number of tokens), not -5",
        ),
    ] {
        let path = file(name, &format!("{base}{tail}"));
        let out = rein()
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(expected), "{name}: {text}");
        assert!(!text.contains("while parsing"), "{name}: {text}");
        assert!(!text.contains("invalid type"), "{name}: {text}");
        assert!(
            !text.contains("line 8 column"),
            "{name}: the position once: {text}"
        );
    }
}

#[test]
fn run_asks_at_the_terminal_and_the_typed_answer_and_approval_decide() {
    let mut child = rein()
        .args(["run", "--config"])
        .arg(examples().join("rein-approvals.yaml"))
        .arg("Release the new build")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Option 1 of the question, then the approval.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"1\napprove\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for line in [
        "? Which environment should I release to?",
        "  1. staging",
        "[approval] waiting: ask_user",
        "[tool] ask_user -> staging",
        "approval needed: terminate",
        "[approval] waiting: terminate",
        "[end] stopped (terminate)",
    ] {
        assert!(
            stderr.lines().any(|l| l.contains(line)),
            "{line:?} in:\n{stderr}"
        );
    }
}

#[test]
fn check_lists_provider_limits_and_model_fallbacks() {
    let config = file(
        "limits-check",
        r#"providers:
  hosted:
    kind: scripted
    responses: ["hi"]
    limits: { requests_per_minute: 500, tokens_per_minute: 200000, max_concurrent: 16 }
  local:
    kind: scripted
    responses: ["hi"]
    limits: { requests_per_minute: 120, window_ms: 1000 }
models:
  main: { provider: hosted, model: big, fallbacks: [small] }
  small: { provider: local, model: little }
agents:
  - { id: a, model_id: main }
"#,
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for line in [
        "provider \"hosted\": at most 500 requests per minute, 200000 tokens per minute, 16 at once",
        "provider \"local\": at most 2 requests per 1000 ms window",
        "model \"main\": falls back to small",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in:\n{stdout}");
    }
}

#[test]
fn check_lists_approval_rules_and_positions_one_that_matches_no_tool() {
    let out = rein()
        .args(["check", "--config"])
        .arg(examples().join("rein-approvals.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("agent \"releaser\": 2 approval rule(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[1] ask terminate, timeout 600 s then reject (tools: terminate)"),
        "{stdout}"
    );

    let bad = file(
        "approvals-bad",
        r#"providers:
  p: { kind: scripted, responses: ["hi"] }
models:
  m: { provider: p, model: x }
agents:
  - id: a
    model_id: m
    plugin_ids: [terminate]
    approvals:
      - { tool: terminate, action: ask }
      - { tool: "fs__*", action: deny }
      - { tool: terminate, when: { message: "(" }, action: deny }
"#,
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("rein.yaml:11:")
            && text.contains("\"fs__*\" matches none of the agent's tools (terminate)"),
        "{text}"
    );
    assert!(
        text.contains("rein.yaml:12:") && text.contains("`when.message` is not a valid regex"),
        "{text}"
    );
}

/// Sends one HTTP/1.1 request to `addr`; returns the answer's text.
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut socket, &mut answer).unwrap();
    answer
}

#[test]
fn serve_at_info_logs_one_json_line_per_run_start_and_end_and_per_refusal() {
    let config = file(
        "logs",
        "providers:\n  p: { kind: scripted, responses: [ { text: \"Done.\", usage: { input: 12, output: 3 } } ] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let mut child = rein()
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--config",
        ])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap();
    let addr = url.trim_start_matches("listening on http://").to_owned();
    let answer = http(
        &addr,
        "POST",
        "/v1/threads/t/runs?wait=true",
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let refused = http(
        &addr,
        "POST",
        "/v1/threads/t/runs",
        r#"{"agent_id":"nobody","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert!(refused.starts_with("HTTP/1.1 404"), "{refused}");
    signal(child.id(), "TERM");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{stderr}");
    let logs: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let find = |message: &str| {
        logs.iter()
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line: {stderr}"))
            .clone()
    };
    let started = find("run started");
    assert_eq!(
        (
            &started["level"],
            &started["thread_id"],
            &started["agent_id"]
        ),
        (&"INFO".into(), &"t".into(), &"a".into()),
        "{started}"
    );
    let finished = find("run finished");
    assert_eq!(finished["run_id"], started["run_id"], "{finished}");
    assert_eq!(finished["termination"], "natural_end", "{finished}");
    assert_eq!(finished["rounds"], 1, "{finished}");
    assert_eq!(
        (&finished["input_tokens"], &finished["output_tokens"]),
        (&12.into(), &3.into()),
        "{finished}"
    );
    assert!(finished["duration_ms"].is_u64(), "{finished}");
    let refusal = find("request refused");
    assert_eq!(
        (&refusal["status"], &refusal["code"]),
        (&404.into(), &"unknown_agent".into()),
        "{refusal}"
    );
}

#[test]
fn check_puts_environment_values_into_the_file_and_names_an_unset_one_at_its_position() {
    let path = file(
        "interpolate",
        "providers:\n  p: { kind: scripted, responses: [\"${REIN_TEST_ANSWER:-Done.}\"] }\nmodels:\n  m: { provider: p, model: \"${REIN_TEST_MODEL}\" }\nagents:\n  - { id: a, model_id: m, max_rounds: ${REIN_TEST_ROUNDS} }\n",
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&path)
        .env("REIN_TEST_MODEL", "x")
        .env("REIN_TEST_ROUNDS", "3")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = rein()
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("REIN_TEST_MODEL")
        .env_remove("REIN_TEST_ROUNDS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let shown = path.display().to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "both unset variables are named: {text}");
    assert!(
        lines[0].starts_with(&format!(
            "{shown}:4:29: the environment variable REIN_TEST_MODEL is not set"
        )),
        "{text}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{shown}:6:39: the environment variable REIN_TEST_ROUNDS is not set"
        )),
        "{text}"
    );
}

/// `rein serve` with an OTLP endpoint in its environment: runs one message
/// with a tool call, stops with SIGTERM, and returns what the collector
/// received (paths and bodies, lossily as text).
fn served_spans(protocol: Option<&str>) -> Vec<(String, String)> {
    let (traces, bodies) = otlp_collector::collector();
    let config = file(
        &format!("otlp-{}", protocol.unwrap_or("default").replace('/', "-")),
        "providers:\n  p:\n    kind: scripted\n    responses:\n      - { tool_calls: [ { name: terminate, arguments: { status: success, message: ok } } ], usage: { input: 12, output: 3 } }\nmodels:\n  m: { provider: p, model: tiny }\nagents:\n  - { id: clerk, model_id: m, plugin_ids: [terminate] }\n",
    );
    let mut command = rein();
    command
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&config)
        // The base endpoint: the exporter appends /v1/traces.
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            traces.trim_end_matches("/v1/traces"),
        )
        .env("OTEL_SERVICE_NAME", "rein-binary-test")
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(protocol) = protocol {
        command.env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol);
    }
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let addr = line
        .strip_prefix("listening on http://")
        .unwrap()
        .to_owned();
    let answer = http(
        &addr,
        "POST",
        "/v1/threads/t-otlp/runs?wait=true",
        r#"{"messages":[{"role":"user","content":"go"}]}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    signal(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // Everything was flushed before the process exited.
    let mut received = Vec::new();
    while let Ok(body) = bodies.recv_timeout(Duration::from_millis(200)) {
        received.push(body);
    }
    received
}

#[test]
fn serve_exports_each_run_s_genai_spans_over_otlp_when_an_endpoint_is_set() {
    let received = served_spans(Some("http/json"));
    assert!(!received.is_empty(), "no export reached the collector");
    let mut spans = Vec::new();
    for (path, body) in &received {
        assert_eq!(path, "/v1/traces");
        let export: serde_json::Value = serde_json::from_str(body).unwrap();
        for resource in export["resourceSpans"].as_array().unwrap() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == "service.name")
                .unwrap();
            assert_eq!(service["value"]["stringValue"], "rein-binary-test");
            for scope in resource["scopeSpans"].as_array().unwrap() {
                spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
            .clone()
    };
    let run = named("invoke_agent clerk");
    let chat = named("chat tiny");
    let tool = named("execute_tool terminate");
    // One trace: the inference and the tool call are children of the run.
    for child in [&chat, &tool] {
        assert_eq!(child["traceId"], run["traceId"]);
        assert_eq!(child["parentSpanId"], run["spanId"]);
    }
    let attribute = |span: &serde_json::Value, key: &str| {
        span["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| a["value"].clone())
            .unwrap_or_else(|| panic!("{key} missing on {span}"))
    };
    assert_eq!(
        attribute(&run, "gen_ai.conversation.id")["stringValue"],
        "t-otlp"
    );
    assert_eq!(
        attribute(&run, "rein.termination.code")["stringValue"],
        "terminate"
    );
    // An int64 is a JSON string in OTLP/JSON; some encoders write a number.
    let input = attribute(&chat, "gen_ai.usage.input_tokens")["intValue"].to_string();
    assert_eq!(input.trim_matches('"'), "12");
}

#[test]
fn serve_exports_protobuf_by_default_and_nothing_without_an_endpoint() {
    let received = served_spans(None);
    let all: String = received.iter().map(|(_, body)| body.as_str()).collect();
    for name in [
        "invoke_agent clerk",
        "chat tiny",
        "execute_tool terminate",
        "rein-binary-test",
    ] {
        assert!(
            all.contains(name),
            "{name} missing from the protobuf export"
        );
    }
    for (_, body) in &received {
        assert!(
            serde_json::from_str::<serde_json::Value>(body).is_err(),
            "protobuf, not JSON"
        );
    }

    // Without an endpoint, nothing is exported (and nothing fails).
    let (_, bodies) = otlp_collector::collector();
    let config = file(
        "otlp-off",
        "providers:\n  p: { kind: scripted, responses: [\"Hi.\"] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    let output = rein()
        .args(["run", "--config"])
        .arg(&config)
        .arg("hi")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(bodies.recv_timeout(Duration::from_millis(300)).is_err());
}

#[test]
fn run_in_auto_mode_goes_round_after_round_until_its_experiment_budget_and_says_why() {
    // Each round reports one experiment through the built-in `automation`
    // plugin, then answers.
    let config = file(
        "auto",
        "providers:\n  p:\n    kind: scripted\n    responses:\n      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: 0.5 } } } ], usage: { input: 10, output: 5 } }\n      - { text: \"Experiment 1 done.\", usage: { input: 10, output: 5 } }\n      - { tool_calls: [ { name: report_metrics, arguments: { metrics: { acc: \"0.7\" } } } ], usage: { input: 10, output: 5 } }\n      - { text: \"Experiment 2 done.\", usage: { input: 10, output: 5 } }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m, plugin_ids: [automation] }\n",
    );
    let out = rein()
        .args([
            "run",
            "--mode",
            "auto",
            "--max-experiments",
            "2",
            "--max-tokens",
            "1000",
            "--config",
        ])
        .arg(&config)
        .arg("tune the classifier")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    // The answers on stdout, the progress on stderr.
    assert_eq!(stdout, "Experiment 1 done.\nExperiment 2 done.\n");
    assert!(
        stderr.contains("[auto] auto-run round 1 finished"),
        "{stderr}"
    );
    assert!(
        stderr.contains("[auto] auto-run round 2 finished"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "[auto] stopped: max experiments reached (2/2) · 2 rounds · 60 of 1000 session tokens"
        ),
        "{stderr}"
    );

    // The budgets belong to auto mode.
    let out = rein()
        .args(["run", "--max-tokens", "10", "--config"])
        .arg(&config)
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("add --mode auto"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
