//! The GenAI tracing spans: `invoke_agent` per run, `chat` per inference
//! attempt, `execute_tool` per tool call, with the OpenTelemetry GenAI
//! attribute keys, captured by a `tracing` layer.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use rein::contract::inference::{InferenceError, InferenceErrorKind};
use rein::prelude::*;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured span: its name, its parent's name, and every field
/// recorded on it (as text).
#[derive(Debug, Clone, Default)]
struct Captured {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
}

impl Captured {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

/// Keeps each span's fields in its extensions; on close, moves it to `done`.
#[derive(Clone, Default)]
struct Capture {
    done: Arc<Mutex<Vec<Captured>>>,
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut captured = Captured {
            name: attrs.metadata().name().to_owned(),
            parent: span.parent().map(|p| p.name().to_owned()),
            ..Captured::default()
        };
        attrs.record(&mut Fields(&mut captured.fields));
        span.extensions_mut().insert(captured);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        if let Some(captured) = span.extensions_mut().get_mut::<Captured>() {
            values.record(&mut Fields(&mut captured.fields));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        if let Some(captured) = span.extensions_mut().remove::<Captured>() {
            self.done.lock().unwrap().push(captured);
        }
    }
}

/// Runs `request` on `runtime` with the capturing layer installed on this
/// thread (the test's runtime is current-thread, so the run's task and
/// its tools run here too), and returns the spans closed meanwhile.
async fn capture_run(
    runtime: &AgentRuntime,
    request: RunRequest,
) -> (AgentRunResult, Vec<Captured>) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    let result = runtime.run_to_completion(request).await.unwrap();
    // Let the run's task finish and close its span.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    drop(guard);
    let spans = capture.done.lock().unwrap().clone();
    (result, spans)
}

fn named<'a>(spans: &'a [Captured], name: &str) -> Vec<&'a Captured> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn model() -> ModelSpec {
    ModelSpec::new("m", "p", "scripted-model")
        .with_temperature(0.25)
        .with_max_output_tokens(256)
}

fn runtime(script: Vec<ScriptedResponse>, content: bool) -> AgentRuntime {
    AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m"))
        .with_model(model())
        .with_provider("p", Arc::new(ScriptedExecutor::new(script)))
        .with_tool("echo", Arc::new(Echo("echo")))
        .with_tool("failing", Arc::new(Failing))
        .with_trace_content(content)
        .with_retry_backoff(std::time::Duration::ZERO, std::time::Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_run_is_one_invoke_agent_span_with_a_chat_span_per_inference_and_a_tool_span_per_call() {
    let rt = runtime(
        vec![
            ScriptedResponse::tool_call("echo", json!({"x": 1}))
                .with_call_id("call-7")
                .with_usage(11, 3),
            ScriptedResponse::text("done").with_usage(20, 2),
        ],
        false,
    );
    let (result, spans) = capture_run(&rt, user("thread-9", "go")).await;

    let runs = named(&spans, "invoke_agent");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run = runs[0];
    assert_eq!(run.get("otel.name"), Some("invoke_agent agent"));
    assert_eq!(run.get("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(run.get("gen_ai.agent.name"), Some("agent"));
    assert_eq!(run.get("gen_ai.agent.id"), Some("agent"));
    assert_eq!(run.get("gen_ai.conversation.id"), Some("thread-9"));
    assert_eq!(run.get("rein.run.id"), Some(result.run_id.as_str()));
    assert_eq!(run.get("rein.termination.code"), Some("natural_end"));
    assert_eq!(run.get("error.type"), None);

    let chats = named(&spans, "chat");
    assert_eq!(chats.len(), 2, "{spans:#?}");
    for chat in &chats {
        assert_eq!(chat.parent.as_deref(), Some("invoke_agent"));
        assert_eq!(chat.get("otel.name"), Some("chat scripted-model"));
        assert_eq!(chat.get("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.get("gen_ai.provider.name"), Some("p"));
        assert_eq!(chat.get("gen_ai.request.model"), Some("scripted-model"));
        assert_eq!(chat.get("gen_ai.request.temperature"), Some("0.25"));
        assert_eq!(chat.get("gen_ai.request.max_tokens"), Some("256"));
        // Contents are not recorded by default.
        assert_eq!(chat.get("gen_ai.input.messages"), None);
        assert_eq!(chat.get("gen_ai.output.messages"), None);
    }
    assert_eq!(chats[0].get("gen_ai.usage.input_tokens"), Some("11"));
    assert_eq!(chats[0].get("gen_ai.usage.output_tokens"), Some("3"));
    assert_eq!(
        chats[0].get("gen_ai.response.finish_reasons"),
        Some("tool_calls")
    );
    assert_eq!(chats[1].get("gen_ai.usage.input_tokens"), Some("20"));
    assert_eq!(chats[1].get("gen_ai.response.finish_reasons"), Some("stop"));

    let tools = named(&spans, "execute_tool");
    assert_eq!(tools.len(), 1, "{spans:#?}");
    let tool = tools[0];
    assert_eq!(tool.parent.as_deref(), Some("invoke_agent"));
    assert_eq!(tool.get("otel.name"), Some("execute_tool echo"));
    assert_eq!(tool.get("gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(tool.get("gen_ai.tool.name"), Some("echo"));
    assert_eq!(tool.get("gen_ai.tool.call.id"), Some("call-7"));
    assert_eq!(tool.get("error.type"), None);
    assert_eq!(tool.get("gen_ai.tool.call.arguments"), None);
}

#[tokio::test]
async fn failures_are_recorded_as_error_type() {
    let rt = runtime(
        vec![
            ScriptedResponse::error(InferenceError::new(
                InferenceErrorKind::RateLimited,
                "slow down",
            )),
            ScriptedResponse::tool_call("failing", json!({})),
            ScriptedResponse::error(InferenceError::new(
                InferenceErrorKind::Unauthorized,
                "bad key",
            )),
        ],
        false,
    );
    let (result, spans) = capture_run(&rt, user("t", "go")).await;
    assert!(
        matches!(result.termination, TerminationReason::Error(_)),
        "{result:?}"
    );

    let chats = named(&spans, "chat");
    assert_eq!(chats.len(), 3, "{spans:#?}");
    assert_eq!(chats[0].get("error.type"), Some("rate_limited"));
    assert_eq!(chats[1].get("error.type"), None);
    assert_eq!(chats[2].get("error.type"), Some("unauthorized"));
    let tool = named(&spans, "execute_tool")[0];
    assert_eq!(tool.get("error.type"), Some("tool_error"));
    let run = named(&spans, "invoke_agent")[0];
    assert_eq!(run.get("rein.termination.code"), Some("error"));
    assert_eq!(run.get("error.type"), Some("run_error"));
}

#[tokio::test]
async fn contents_are_recorded_only_when_opted_in() {
    let rt = runtime(
        vec![
            ScriptedResponse::tool_call("echo", json!({"secret": "s3"})),
            ScriptedResponse::text("the answer"),
        ],
        true,
    );
    let (_, spans) = capture_run(&rt, user("t", "my question")).await;
    let chats = named(&spans, "chat");
    assert!(
        chats[0]
            .get("gen_ai.input.messages")
            .unwrap()
            .contains("my question")
    );
    assert!(
        chats[1]
            .get("gen_ai.output.messages")
            .unwrap()
            .contains("the answer")
    );
    let tool = named(&spans, "execute_tool")[0];
    assert!(
        tool.get("gen_ai.tool.call.arguments")
            .unwrap()
            .contains("s3")
    );
    assert!(tool.get("gen_ai.tool.call.result").is_some());
}

#[tokio::test]
async fn a_sub_agent_s_invoke_agent_span_is_a_child_of_the_parent_s_execute_tool_span() {
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(
            AgentSpec::new("lead")
                .with_model_id("m-lead")
                .with_subagent(SubagentSpec::new("helper")),
        )
        .with_agent_spec(AgentSpec::new("helper").with_model_id("m-helper"))
        .with_model(ModelSpec::new("m-lead", "p-lead", "x"))
        .with_model(ModelSpec::new("m-helper", "p-helper", "x"))
        .with_provider(
            "p-lead",
            Arc::new(ScriptedExecutor::new(vec![
                ScriptedResponse::tool_call("helper", json!({"task": "help"})),
                ScriptedResponse::text("done"),
            ])),
        )
        .with_provider(
            "p-helper",
            Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text(
                "helped",
            )])),
        )
        .build()
        .unwrap();
    let (_, spans) = capture_run(
        &runtime,
        RunRequest::new("t", vec![Message::user("go")]).with_agent_id("lead"),
    )
    .await;
    let by_otel = |name: &str| {
        spans
            .iter()
            .filter(|s| s.get("otel.name") == Some(name))
            .collect::<Vec<_>>()
    };
    let child = by_otel("invoke_agent helper");
    assert_eq!(child.len(), 1, "{spans:#?}");
    assert_eq!(
        child[0].parent.as_deref(),
        Some("execute_tool"),
        "{spans:#?}"
    );
    let call = by_otel("execute_tool helper");
    assert_eq!(call.len(), 1, "{spans:#?}");
    assert_eq!(call[0].parent.as_deref(), Some("invoke_agent"));
}

#[tokio::test]
async fn after_a_fallback_the_chat_spans_name_the_model_that_answered() {
    let rt = AgentRuntimeBuilder::new()
        .with_agent_spec(spec().with_model_id("m"))
        .with_model(model().with_fallbacks(["small"]))
        .with_model(ModelSpec::new("small", "q", "small-model"))
        .with_provider(
            "p",
            Arc::new(
                ScriptedExecutor::new(vec![ScriptedResponse::error(InferenceError::overloaded(
                    "HTTP 529",
                ))])
                .repeat_last(),
            ),
        )
        .with_provider(
            "q",
            Arc::new(ScriptedExecutor::new(vec![ScriptedResponse::text("ok")])),
        )
        .with_retry_backoff(std::time::Duration::ZERO, std::time::Duration::ZERO)
        .build()
        .unwrap();
    let (result, spans) = capture_run(&rt, user("t", "hi")).await;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    let models: Vec<_> = named(&spans, "chat")
        .iter()
        .map(|s| s.get("gen_ai.request.model").unwrap().to_owned())
        .collect();
    assert_eq!(
        models,
        [
            "scripted-model",
            "scripted-model",
            "scripted-model",
            "small-model"
        ]
    );
}
