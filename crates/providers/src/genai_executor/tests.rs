//! Tests of the whole executor against a canned HTTP server on 127.0.0.1:
//! requests as sent on the wire, streamed and non-streamed answers, HTTP
//! errors, cut and idle streams, refused connections; and one check of a
//! context overflow against the real local server when `REIN_LLM_BASE_URL`
//! is set.

use super::mapping::tests::search_tool;
use super::*;
use futures::StreamExt;
use rein_runtime_contract::inference::{InferenceDelta, ToolChoice};
use rein_runtime_contract::message::{CacheUsage, Message, TokenUsage, ToolCall};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[test]
fn invalid_base_url_fails_every_open_without_retry() {
    let executor = GenaiExecutor::openai_compatible("localhost:8080/v1", None);
    let error = executor.client.as_ref().err().cloned();
    assert_eq!(
        error.map(|e| e.kind()),
        Some(InferenceErrorKind::InvalidRequest)
    );
}

// -- canned HTTP server -------------------------------------------------

/// Reads one HTTP request (headers and `Content-Length` body).
async fn read_request(socket: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed before sending a request");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return text[end + 4..].to_string();
            }
        }
    }
}

/// Serves one request on 127.0.0.1 with `response`, then closes.
/// Returns the base URL and a handle yielding the request body.
async fn serve_once(response: String) -> (String, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let body = read_request(&mut socket).await;
        socket.write_all(response.as_bytes()).await.unwrap();
        socket.flush().await.unwrap();
        let _ = socket.shutdown().await;
        body
    });
    (format!("http://{address}/v1"), handle)
}

fn sse(events: &[&str]) -> String {
    let mut response = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
    );
    for event in events {
        response.push_str("data: ");
        response.push_str(event);
        response.push_str("\n\n");
    }
    response
}

fn local(base_url: &str) -> GenaiExecutor {
    GenaiExecutor::openai_compatible(base_url, None)
        .with_request_timeout(Duration::from_secs(10))
        .with_idle_timeout(Duration::from_secs(10))
}

async fn collect(stream: InferenceStream) -> Vec<Result<InferenceDelta, InferenceError>> {
    tokio::time::timeout(Duration::from_secs(20), stream.collect::<Vec<_>>())
        .await
        .expect("stream did not finish")
}

const TEXT_1: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#;
const TEXT_2: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}"#;
const CALL_1: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"search","arguments":"{\"q\":"}}]},"finish_reason":null}]}"#;
const CALL_2: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"rust\"}"}}]},"finish_reason":"tool_calls"}]}"#;
const USAGE: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;

#[tokio::test]
async fn streams_text_then_one_tool_call_then_usage() {
    let (base_url, server) =
        serve_once(sse(&[TEXT_1, TEXT_2, CALL_1, CALL_2, USAGE, "[DONE]"])).await;
    let mut request = InferenceRequest::new("local-model", vec![Message::user("find rust")])
        .with_system("you are helpful")
        .with_tools(vec![search_tool()]);
    request.tool_choice = ToolChoice::Required;

    let stream = local(&base_url).open(&request).await.unwrap();
    let items: Vec<_> = collect(stream)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        items,
        [
            InferenceDelta::Text {
                text: "Hello".into()
            },
            InferenceDelta::Text {
                text: " world".into()
            },
            InferenceDelta::ToolCall {
                call: ToolCall::new("call_1", "search", json!({"q": "rust"}))
            },
            InferenceDelta::Usage {
                usage: TokenUsage::new(11, 7)
            },
        ]
    );

    let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
    assert_eq!(sent["model"], "local-model");
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["tools"][0]["function"]["name"], "search");
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "you are helpful"})
    );
    assert_eq!(
        sent["messages"][1],
        json!({"role": "user", "content": "find rust"})
    );
}

#[tokio::test]
async fn streamed_tool_call_with_invalid_json_is_emitted_wrapped() {
    const BAD_CALL: &str = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_7","type":"function","function":{"name":"search","arguments":"{\"q\": rust"}}]},"finish_reason":"tool_calls"}]}"#;
    let (base_url, _server) = serve_once(sse(&[BAD_CALL, "[DONE]"])).await;
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")])
        .with_tools(vec![search_tool()]);
    let stream = local(&base_url).open(&request).await.unwrap();
    let items = collect(stream).await;
    assert_eq!(items.len(), 1, "{items:?}");
    let Ok(InferenceDelta::ToolCall { call }) = &items[0] else {
        panic!("expected a tool call, got {items:?}");
    };
    assert_eq!(call.id, "call_7");
    assert_eq!(call.arguments["_raw_arguments"], r#"{"q": rust"#);
    assert!(call.arguments["_error"].is_string());
}

#[tokio::test]
async fn rate_limit_is_retryable_with_retry_after() {
    let body = r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (base_url, server) = serve_once(response).await;
    let mut request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    request.tool_choice = ToolChoice::Required; // no tools: must not be sent

    let error = match local(&base_url).open(&request).await {
        Ok(_) => panic!("a 429 must fail the open"),
        Err(error) => error,
    };
    assert_eq!(error.kind(), InferenceErrorKind::RateLimited);
    assert!(error.is_retryable());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
    assert!(
        error.message().starts_with("HTTP 429"),
        "{}",
        error.message()
    );
    assert!(error.message().contains("Rate limit reached"));

    let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
    assert!(sent.get("tool_choice").is_none(), "{sent}");
    assert!(sent.get("tools").is_none(), "{sent}");
}

#[tokio::test]
async fn rate_limit_with_an_http_date_retry_after_waits_until_that_date() {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    let error = open_error(
        format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {date}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        true,
    )
    .await;
    assert_eq!(error.kind(), InferenceErrorKind::RateLimited);
    // The date has whole seconds and some time passes before it is read.
    let after = error.retry_after().unwrap();
    assert!(
        after > Duration::from_secs(25) && after <= Duration::from_secs(30),
        "Retry-After: {date} gave {after:?}"
    );

    let past = "Wed, 21 Oct 2015 07:28:00 GMT";
    let error = open_error(
        format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {past}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        false,
    )
    .await;
    assert_eq!(
        error.retry_after(),
        Some(Duration::ZERO),
        "a past date: retry now"
    );
}

#[tokio::test]
async fn a_stream_cut_before_done_ends_with_stream_cut() {
    let (base_url, _server) = serve_once(sse(&[TEXT_1, TEXT_2])).await;
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let stream = local(&base_url).open(&request).await.unwrap();
    let items = collect(stream).await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(
        items[0],
        Ok(InferenceDelta::Text {
            text: "Hello".into()
        })
    );
    let last = items[2].as_ref().unwrap_err();
    assert_eq!(last.kind(), InferenceErrorKind::StreamCut);
    assert!(last.is_retryable());
}

#[tokio::test]
async fn a_stream_cut_mid_event_ends_with_stream_cut() {
    let mut response = sse(&[TEXT_1]);
    response.push_str(r#"data: {"id":"c1","choices":[{"index":0,"delta":{"cont"#);
    let (base_url, _server) = serve_once(response).await;
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let stream = local(&base_url).open(&request).await.unwrap();
    let items = collect(stream).await;
    assert_eq!(items.len(), 2, "{items:?}");
    let last = items[1].as_ref().unwrap_err();
    assert_eq!(last.kind(), InferenceErrorKind::StreamCut);
}

#[tokio::test]
async fn idle_stream_times_out_and_dropping_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        socket.write_all(sse(&[TEXT_1]).as_bytes()).await.unwrap();
        socket.flush().await.unwrap();
        // Stall; the next read returns 0 once the client hangs up.
        let mut rest = [0_u8; 64];
        while socket.read(&mut rest).await.unwrap_or(0) > 0 {}
    });
    let executor = local(&base_url).with_idle_timeout(Duration::from_millis(300));
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let mut stream = executor.open(&request).await.unwrap();
    assert_eq!(
        stream.next().await,
        Some(Ok(InferenceDelta::Text {
            text: "Hello".into()
        }))
    );
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(error.kind(), InferenceErrorKind::Timeout);
    assert!(error.message().contains("no stream event for 0.3 s"));
    assert_eq!(stream.next().await, None);
    drop(stream);
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the connection was not closed")
        .unwrap();
}

#[tokio::test]
async fn connection_refused_is_a_retryable_connection_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let error = match local(&base_url).open(&request).await {
        Ok(_) => panic!("nothing listens there"),
        Err(error) => error,
    };
    assert_eq!(error.kind(), InferenceErrorKind::Connection, "{error}");
}

#[tokio::test]
async fn non_streaming_answers_become_the_same_deltas() {
    let body = json!({
        "id": "x",
        "object": "chat.completion",
        "model": "local-model",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hi",
                "tool_calls": [{
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}
                }]
            },
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (base_url, server) = serve_once(response).await;
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")])
        .with_tools(vec![search_tool()]);
    let answer = local(&base_url)
        .with_streaming(false)
        .complete(&request)
        .await
        .unwrap();
    assert_eq!(answer.text, "Hi");
    assert_eq!(
        answer.tool_calls,
        [ToolCall::new("call_9", "search", json!({"q": "rust"}))]
    );
    assert_eq!(answer.usage, Some(TokenUsage::new(3, 2)));
    let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
    assert_eq!(sent["stream"], false);
    assert!(
        !sent.to_string().contains("cache_control"),
        "an OpenAI request got cache hints: {sent}"
    );
}

#[tokio::test]
async fn an_anthropic_request_marks_the_system_and_last_message_and_reports_cache_usage() {
    let body = json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 5,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "output_tokens": 2
        }
    })
    .to_string();
    let (base_url, server) = serve_once(json_response("200 OK", &body)).await;
    let client = genai::Client::builder()
        .with_adapter_kind(AdapterKind::Anthropic)
        .append_provider_config(
            AdapterKind::Anthropic,
            (
                Endpoint::from_owned(format!("{base_url}/")),
                AuthData::from_single("test-key"),
            ),
        )
        .build()
        .unwrap();
    let history = vec![
        Message::user("first"),
        Message::assistant("answer"),
        Message::user("second"),
    ];
    let request = InferenceRequest::new("claude-test", history)
        .with_system("be brief")
        .with_tools(vec![search_tool()]);
    let answer = GenaiExecutor::with_client(client)
        .with_streaming(false)
        .complete(&request)
        .await
        .unwrap();
    assert_eq!(answer.text, "Hi");
    assert_eq!(answer.cache, Some(CacheUsage::new(100, 20)));
    // genai counts cached and written tokens into the prompt tokens.
    assert_eq!(answer.usage, Some(TokenUsage::new(125, 2)));
    let sent: Value = serde_json::from_str(&server.await.unwrap()).unwrap();
    let system = sent["system"].as_array().expect("system as blocks");
    assert_eq!(system.last().unwrap()["text"], "be brief");
    assert_eq!(
        system.last().unwrap()["cache_control"]["type"],
        "ephemeral",
        "{sent}"
    );
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{sent}");
    let marked: Vec<usize> = (0..messages.len())
        .filter(|i| messages[*i].to_string().contains("cache_control"))
        .collect();
    assert_eq!(marked, [2], "only the last message is a breakpoint: {sent}");
}

fn json_response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Opens a streamed request against a server answering `response` once.
async fn open_error(response: String, streaming: bool) -> InferenceError {
    let (base_url, _server) = serve_once(response).await;
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let executor = local(&base_url).with_streaming(streaming);
    match executor.open(&request).await {
        Ok(stream) => match collect(stream).await.into_iter().find_map(Result::err) {
            Some(error) => error,
            None => panic!("the server's error must surface"),
        },
        Err(error) => error,
    }
}

#[tokio::test]
async fn a_server_error_is_retryable() {
    for streaming in [true, false] {
        let error = open_error(
            json_response(
                "500 Internal Server Error",
                r#"{"error":{"message":"boom"}}"#,
            ),
            streaming,
        )
        .await;
        assert_eq!(error.kind(), InferenceErrorKind::Server, "{error}");
        assert!(error.is_retryable());
        assert!(
            error.message().starts_with("HTTP 500"),
            "{}",
            error.message()
        );
    }
}

#[tokio::test]
async fn a_rejected_key_is_unauthorized_and_not_retryable() {
    for streaming in [true, false] {
        let error = open_error(
            json_response(
                "401 Unauthorized",
                r#"{"error":{"message":"Incorrect API key provided"}}"#,
            ),
            streaming,
        )
        .await;
        assert_eq!(error.kind(), InferenceErrorKind::Unauthorized, "{error}");
        assert!(!error.is_retryable());
    }
}

#[tokio::test]
async fn a_context_length_400_is_its_own_kind() {
    let body = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","code":"context_length_exceeded"}}"#;
    for streaming in [true, false] {
        let error = open_error(json_response("400 Bad Request", body), streaming).await;
        assert_eq!(error.kind(), InferenceErrorKind::ContextOverflow, "{error}");
        assert!(!error.is_retryable());
    }
    let error = open_error(
        json_response("400 Bad Request", r#"{"error":{"message":"bad field"}}"#),
        true,
    )
    .await;
    assert_eq!(error.kind(), InferenceErrorKind::InvalidRequest, "{error}");
}

#[tokio::test]
async fn llama_servers_exceed_context_size_error_is_a_context_overflow() {
    use super::overflow::tests::{LLAMA_CPP_PYTHON, LLAMA_SERVER};
    for streaming in [true, false] {
        let error = open_error(json_response("400 Bad Request", LLAMA_SERVER), streaming).await;
        assert_eq!(error.kind(), InferenceErrorKind::ContextOverflow, "{error}");
        assert!(!error.is_retryable());
        assert_eq!(
            error.message(),
            "HTTP 400: request (4476 tokens) exceeds the available context size (4096 tokens), \
             try increasing it (prompt 4476 tokens, context 4096 tokens)",
            "streaming: {streaming}"
        );

        let error = open_error(
            json_response("400 Bad Request", LLAMA_CPP_PYTHON),
            streaming,
        )
        .await;
        assert_eq!(error.kind(), InferenceErrorKind::ContextOverflow, "{error}");
        assert!(
            error
                .message()
                .contains("maximum context length is 2048 tokens")
        );
    }
}

/// Against the real local server (`cargo xtask local-llm start`), when
/// `REIN_LLM_BASE_URL` is set; passes without running otherwise.
#[tokio::test]
async fn a_real_over_long_prompt_is_a_context_overflow() {
    let Ok(base_url) = std::env::var("REIN_LLM_BASE_URL") else {
        eprintln!("live check skipped: REIN_LLM_BASE_URL is not set");
        return;
    };
    // About 4000 tokens, twice the local server's 2048-token context.
    let prompt = "hello world ".repeat(2000);
    let request = InferenceRequest::new("smollm2", vec![Message::user(prompt)]);
    let executor = GenaiExecutor::openai_compatible(base_url.clone(), None)
        .with_request_timeout(Duration::from_secs(60))
        .with_streaming(false);
    let error = match executor.open(&request).await {
        Ok(_) => panic!("a prompt twice the context must be refused"),
        Err(error) => error,
    };
    assert_eq!(error.kind(), InferenceErrorKind::ContextOverflow, "{error}");
    assert!(!error.is_retryable());
    assert!(error.message().starts_with("HTTP 400: "), "{error}");

    // Streamed, llama-cpp-python 0.3.36 answers 200 and closes the stream
    // without a byte (its error is raised after the headers), so there is no
    // body to classify: the stream fails, it does not end as an empty answer.
    let streamed = GenaiExecutor::openai_compatible(base_url, None)
        .with_request_timeout(Duration::from_secs(60));
    let error = match streamed.open(&request).await {
        Ok(stream) => collect(stream).await.into_iter().find_map(Result::err),
        Err(error) => Some(error),
    };
    let kind = error.map(|error| error.kind());
    assert!(
        matches!(
            kind,
            Some(InferenceErrorKind::StreamCut | InferenceErrorKind::ContextOverflow)
        ),
        "{kind:?}"
    );
}

#[test]
fn an_api_key_never_shows_in_debug_output() {
    let executor = GenaiExecutor::openai_compatible(
        "http://127.0.0.1:9/v1/",
        Some("sk-very-secret-key".to_owned()),
    );
    let shown = format!("{executor:?} {executor:#?}");
    assert!(!shown.contains("sk-very-secret-key"), "{shown}");
}

#[tokio::test]
async fn a_401_that_echoes_the_configured_key_never_quotes_it() {
    let key = "my-deployment-key-0123456789";
    let body = format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}"}}}}"#);
    let (base_url, _server) = serve_once(json_response("401 Unauthorized", &body)).await;
    let executor = GenaiExecutor::openai_compatible(&base_url, Some(key.to_owned()))
        .with_request_timeout(Duration::from_secs(10));
    let request = InferenceRequest::new("local-model", vec![Message::user("hi")]);
    let error = match executor.open(&request).await {
        Ok(stream) => collect(stream)
            .await
            .into_iter()
            .find_map(Result::err)
            .unwrap(),
        Err(error) => error,
    };
    assert_eq!(error.kind(), InferenceErrorKind::Unauthorized, "{error}");
    assert!(!error.message().contains(key), "{}", error.message());
    assert!(
        error.message().contains("[redacted]"),
        "{}",
        error.message()
    );
}
