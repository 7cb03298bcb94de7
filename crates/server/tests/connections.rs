//! What a slow or hostile client can hold of `rein serve`: the connection
//! cap, the idle, header and body timeouts, the file-descriptor limit, and
//! an over-long request target. Through the binary and raw TCP, with short
//! configured timeouts; every wait is bounded and asserted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const AGENTS: &str = "providers:\n  p: { kind: scripted, responses: [\"one two three four five six seven eight\"], chunk_delay_ms: 120 }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n";

const SUBMIT: &str = r#"{"agent_id":"a","messages":[{"role":"user","content":"hi"}]}"#;

fn file(name: &str, yaml: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-conn-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rein.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn with_connections(connections: &str) -> String {
    format!("{AGENTS}server:\n  connections: {{ {connections} }}\n")
}

/// [`with_connections`], the scripted words `chunk_delay_ms` apart.
fn with_delay(chunk_delay_ms: u64, connections: &str) -> String {
    with_connections(connections).replace(
        "chunk_delay_ms: 120",
        &format!("chunk_delay_ms: {chunk_delay_ms}"),
    )
}

/// A `rein serve` process on a free loopback port, killed (by PID) on drop.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(config: &PathBuf) -> Self {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_rein")), config)
    }

    /// Started with at most `files` open files (`ulimit -n`); `exec` keeps
    /// the PID, so drop still kills the server itself.
    fn start_with_fd_limit(config: &PathBuf, files: u32) -> Self {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_rein"));
        Self::spawn(command, config)
    }

    fn spawn(mut command: Command, config: &PathBuf) -> Self {
        let mut child = command
            .args(["serve", "--bind", "127.0.0.1:0", "--config"])
            .arg(config)
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
            .unwrap_or_else(|| panic!("rein serve did not start: {line:?}"))
            .to_owned();
        Self { child, addr }
    }

    fn connect(&self) -> TcpStream {
        TcpStream::connect(&self.addr).unwrap()
    }

    /// Sends one request (`connection: close`); the status and body of the
    /// answer, which must come within 3 s.
    fn send(&self, head: &str, body: &str) -> (u16, String) {
        self.send_within(head, body, Duration::from_secs(3))
    }

    /// [`Serve::send`], the answer due within `bound`.
    fn send_within(&self, head: &str, body: &str, bound: Duration) -> (u16, String) {
        let mut socket = self.connect();
        socket.set_read_timeout(Some(bound)).unwrap();
        write!(
            socket,
            "{head}\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = Vec::new();
        socket
            .read_to_end(&mut answer)
            .unwrap_or_else(|e| panic!("no answer to {head:?} within {bound:?}: {e}"));
        status_and_body(&answer)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_and_body(answer: &[u8]) -> (u16, String) {
    let answer = String::from_utf8_lossy(answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

fn code(body: &str) -> String {
    let value: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON error, not {body:?}"));
    value["error"]["code"].as_str().unwrap().to_owned()
}

/// Reads until the server closes `socket`; what it sent, or `None` when it
/// is still open after `bound`.
fn closed_within(socket: &mut TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + bound;
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None;
            }
            // Reset: closed with unread data.
            Err(_) => return Some(got),
        }
    }
}

/// Whether the server has closed `socket`, without waiting.
fn is_closed(mut socket: &TcpStream) -> bool {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0; 64];
    let closed = match socket.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    socket.set_nonblocking(false).unwrap();
    closed
}

/// Half a request head, as a slowloris client leaves it.
fn half_sent(serve: &Serve) -> TcpStream {
    let mut socket = serve.connect();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")
        .unwrap();
    socket
}

#[test]
fn a_silent_connection_and_a_kept_alive_one_are_closed_after_the_idle_timeout() {
    let serve = Serve::start(&file(
        "idle",
        &with_connections("idle_timeout_ms: 300, header_timeout_ms: 5000"),
    ));
    let opened = Instant::now();
    let mut silent = serve.connect();
    let mut kept = serve.connect();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let answer = closed_within(&mut kept, Duration::from_secs(3))
        .expect("a kept-alive connection closed after the idle timeout");
    assert_eq!(status_and_body(&answer), (200, r#"{"status":"ok"}"#.into()));
    assert!(
        closed_within(&mut silent, Duration::from_secs(3)).is_some(),
        "a silent connection is closed after the idle timeout"
    );
    assert!(
        opened.elapsed() >= Duration::from_millis(250),
        "closed by the timeout, not at once: {:?}",
        opened.elapsed()
    );
}

#[test]
fn half_a_request_head_is_closed_after_the_header_timeout_while_a_silent_one_waits_longer() {
    let serve = Serve::start(&file(
        "header",
        &with_connections("idle_timeout_ms: 4000, header_timeout_ms: 300"),
    ));
    let silent = serve.connect();
    let started = Instant::now();
    let mut slow = half_sent(&serve);
    // A byte now and then does not keep a head alive. (On a slow machine
    // the server may have closed already: a failed write is fine.)
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(100));
        let _ = slow.write_all(b"a");
    }
    let answer = closed_within(&mut slow, Duration::from_secs(2))
        .expect("half a head is closed after the header timeout");
    assert!(answer.is_empty(), "no answer to half a head: {answer:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(
        !is_closed(&silent),
        "a silent connection is under the longer idle timeout"
    );
}

#[test]
fn a_body_that_trickles_gets_408_request_timeout_and_the_connection_closes() {
    let serve = Serve::start(&file(
        "body",
        &with_connections("body_timeout_ms: 500, header_timeout_ms: 5000"),
    ));
    let mut socket = serve.connect();
    write!(
        socket,
        "POST /v1/threads/slow/runs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        SUBMIT.len()
    )
    .unwrap();
    let started = Instant::now();
    let mut writer = socket.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        for byte in SUBMIT.as_bytes().iter().take(30) {
            if writer.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let answer = closed_within(&mut socket, Duration::from_secs(3))
        .expect("answered and closed within the body timeout");
    let (status, body) = status_and_body(&answer);
    assert_eq!(
        (status, code(&body)),
        (408, "request_timeout".into()),
        "{body}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    trickle.join().unwrap();
    // Nothing was submitted.
    let (status, body) = serve.send("GET /v1/threads/slow/messages HTTP/1.1", "");
    assert_eq!((status, body.as_str()), (200, "[]"));
}

#[test]
fn healthz_answers_while_more_idle_and_half_sent_sockets_than_the_cap_are_open() {
    let serve = Serve::start(&file(
        "cap",
        &with_connections("max: 8, idle_timeout_ms: 10000, header_timeout_ms: 10000"),
    ));
    let attack: Vec<TcpStream> = (0..24)
        .map(|i| {
            if i % 2 == 0 {
                serve.connect()
            } else {
                half_sent(&serve)
            }
        })
        .collect();
    let (status, body) = serve.send("GET /healthz HTTP/1.1", "");
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    // 25 connections under a cap of 8: the 17 waiting longest were closed.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut closed = 0;
    while Instant::now() < deadline {
        closed = attack.iter().filter(|s| is_closed(s)).count();
        if closed >= 17 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(closed >= 17, "only {closed} of 24 idle sockets were closed");
    assert!(
        !is_closed(&attack[23]),
        "the newest are kept, the longest-waiting closed"
    );
}

#[test]
fn with_few_file_descriptors_many_idle_sockets_do_not_stop_healthz() {
    // The issue's case: `ulimit -n` below the sockets an attacker opens.
    let serve = Serve::start_with_fd_limit(&file("fds", AGENTS), 128);
    let _idle: Vec<TcpStream> = (0..200).map(|_| serve.connect()).collect();
    let (status, body) = serve.send("GET /healthz HTTP/1.1", "");
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, _) = serve.send("GET /v1/agents HTTP/1.1", "");
    assert_eq!(status, 200);
}

#[test]
fn a_request_target_over_8_kib_gets_the_json_414_and_a_shorter_one_is_routed() {
    let serve = Serve::start(&file("uri", AGENTS));
    let (status, body) = serve.send(&format!("GET /v1/runs/{} HTTP/1.1", "r".repeat(9000)), "");
    assert_eq!(
        (status, code(&body)),
        (414, "uri_too_long".into()),
        "{body}"
    );
    assert!(body.contains("8192"), "{body}");
    let (status, body) = serve.send(
        &format!("GET /v1/runs/r?x={} HTTP/1.1", "q".repeat(9000)),
        "",
    );
    assert_eq!((status, code(&body)), (414, "uri_too_long".into()));
    let (status, body) = serve.send(&format!("GET /v1/runs/{} HTTP/1.1", "r".repeat(8000)), "");
    assert_eq!((status, code(&body)), (404, "unknown_run".into()));
}

#[test]
fn an_sse_stream_and_a_waiting_submission_outlive_the_idle_header_and_body_timeouts() {
    let idle = Duration::from_millis(300);
    let serve = Serve::start(&file(
        "sse",
        &with_delay(
            300,
            "idle_timeout_ms: 300, header_timeout_ms: 300, body_timeout_ms: 300",
        ),
    ));
    // A run takes about 2.4 s (8 words, 300 ms apart): 8 idle timeouts.
    let started = Instant::now();
    let (status, body) = serve.send_within(
        "POST /v1/threads/w/runs?wait=true HTTP/1.1\r\ncontent-type: application/json",
        SUBMIT,
        Duration::from_secs(20),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""status":"finished""#), "{body}");
    assert!(
        started.elapsed() > 3 * idle,
        "the answer outlived the idle timeout: {:?}",
        started.elapsed()
    );

    let (status, body) = serve.send(
        "POST /v1/threads/s/runs HTTP/1.1\r\ncontent-type: application/json",
        SUBMIT,
    );
    assert_eq!(status, 202, "{body}");
    let accepted: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run_id = accepted["run_id"].as_str().unwrap();
    let mut socket = serve.connect();
    write!(
        socket,
        "GET /v1/runs/{run_id}/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    )
    .unwrap();
    let mut events = String::new();
    let mut buf = [0; 4096];
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut first_byte = None;
    while !events.contains("event: run_finished") {
        let n = socket.read(&mut buf).expect("the stream goes on");
        let first = *first_byte.get_or_insert_with(Instant::now);
        assert!(
            n > 0,
            "the stream was cut after {:?}: {events}",
            first.elapsed()
        );
        events.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let lasted = first_byte.unwrap().elapsed();
    assert!(
        lasted > 3 * idle,
        "the stream outlived the idle timeout, from its first byte to run_finished: {lasted:?}"
    );
    assert_eq!(
        events.matches("event: text_delta").count(),
        8,
        "every word arrived: {events}"
    );
}

/// A connection to `addr` whose receive buffer is small (4 KiB asked;
/// the kernel may round it up), so a large answer waits on the reader.
fn connect_with_small_receive_buffer(addr: &str) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let addr = addr.parse().unwrap();
    runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let stream = socket.connect(addr).await.unwrap().into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    })
}

#[test]
fn a_large_answer_read_slowly_arrives_whole_past_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let serve = Serve::start(&file(
        "large",
        &format!(
            "{}  body_limit_bytes: 16000000\n",
            with_delay(0, "idle_timeout_ms: 300, header_timeout_ms: 5000")
        ),
    ));
    // An 8 MB message: its thread's history is far more than hyper and the
    // kernel buffer, so most of it is sent while the client reads.
    let content = "word ".repeat(1_600_000);
    let submit =
        format!(r#"{{"agent_id":"a","messages":[{{"role":"user","content":"{content}"}}]}}"#);
    let (status, body) = serve.send_within(
        "POST /v1/threads/big/runs?wait=true HTTP/1.1\r\ncontent-type: application/json",
        &submit,
        Duration::from_secs(30),
    );
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);

    let mut socket = connect_with_small_receive_buffer(&serve.addr);
    // Kept alive: the server closes it once idle after the answer.
    socket
        .write_all(b"GET /v1/threads/big/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0; 16 * 1024];
    let mut next_pause = 0;
    let mut expected = None;
    loop {
        // A slow reader: a pause of several idle timeouts before the first
        // read and after every further MiB.
        if answer.len() >= next_pause {
            std::thread::sleep(3 * idle);
            next_pause += 1024 * 1024;
        }
        let n = socket
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("the answer was cut after {} bytes: {e}", answer.len()));
        assert!(n > 0, "the answer was cut after {} bytes", answer.len());
        answer.extend_from_slice(&buf[..n]);
        if expected.is_none()
            && let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let head = String::from_utf8_lossy(&answer[..end]).to_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("a content-length")
                .trim()
                .parse()
                .unwrap();
            expected = Some(end + 4 + length);
        }
        if expected.is_some_and(|total| answer.len() >= total) {
            break;
        }
    }
    let (_, body) = status_and_body(&answer);
    let messages: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        messages[0]["content"].as_str().map(str::len),
        Some(content.len())
    );
    // Then, idle, it is closed after the idle timeout.
    assert!(
        closed_within(&mut socket, Duration::from_secs(5)).is_some_and(|rest| rest.is_empty()),
        "closed once idle"
    );
}

#[test]
fn the_start_of_a_next_request_sent_during_an_answer_is_timed_as_a_head() {
    let serve = Serve::start(&file(
        "pipelined",
        &with_connections("idle_timeout_ms: 30000, header_timeout_ms: 300"),
    ));
    let (status, body) = serve.send(
        "POST /v1/threads/p/runs HTTP/1.1\r\ncontent-type: application/json",
        SUBMIT,
    );
    assert_eq!(status, 202, "{body}");
    let accepted: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run_id = accepted["run_id"].as_str().unwrap();
    let mut socket = serve.connect();
    write!(
        socket,
        "GET /v1/runs/{run_id}/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    )
    .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut events = String::new();
    let mut buf = [0; 4096];
    let mut sent_half = false;
    while !events.contains("event: run_finished") {
        let n = socket.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "the stream was cut: {events}");
        events.push_str(&String::from_utf8_lossy(&buf[..n]));
        if !sent_half {
            // The answer has started: half of a next request's head.
            socket
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")
                .unwrap();
            sent_half = true;
        }
    }
    let answered = Instant::now();
    let rest = closed_within(&mut socket, Duration::from_secs(8)).unwrap_or_else(|| {
        panic!("half a head sent during the answer is under the header timeout, not the idle one")
    });
    assert!(
        !String::from_utf8_lossy(&rest).contains("HTTP/1.1"),
        "no answer to half a head: {rest:?}"
    );
    assert!(answered.elapsed() < Duration::from_secs(8));
}

#[test]
fn a_head_over_80_kib_gets_431_and_a_target_over_64_kib_hyper_s_414() {
    let serve = Serve::start(&file("big-head", AGENTS));
    let mut socket = serve.connect();
    // The server may close before it has read all of it.
    let _ = write!(
        socket,
        "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: {}\r\nconnection: close\r\n\r\n",
        "b".repeat(90 * 1024)
    );
    let answer =
        closed_within(&mut socket, Duration::from_secs(5)).expect("a head over 80 KiB is closed");
    // Reset before the answer was read, or the answer: never routed.
    if !answer.is_empty() {
        let (status, _) = status_and_body(&answer);
        assert_eq!(status, 431);
    }
    let (status, body) = serve.send(
        &format!("GET /v1/runs/{} HTTP/1.1", "r".repeat(70 * 1024)),
        "",
    );
    assert_eq!((status, body.as_str()), (414, ""));
}

#[test]
fn a_cap_or_timeout_of_zero_is_refused_by_rein_check() {
    for setting in [
        "max",
        "idle_timeout_ms",
        "header_timeout_ms",
        "body_timeout_ms",
    ] {
        let config = file(
            &format!("zero-{setting}"),
            &with_connections(&format!("{setting}: 0")),
        );
        let out = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{setting}: {stdout}{stderr}");
        assert!(
            format!("{stdout}{stderr}").contains("nonzero"),
            "{setting}: {stdout}{stderr}"
        );
    }
}
