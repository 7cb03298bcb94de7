//! Tracing spans that follow the OpenTelemetry GenAI semantic conventions.
//!
//! Every run is one `invoke_agent` span; each inference attempt in it one
//! `chat` span, each tool call one `execute_tool` span. They are ordinary
//! `tracing` spans (level `INFO`, target `rein::genai`), so any subscriber
//! sees them; with `tracing-opentelemetry` (the `rein` crate's `otel`
//! feature) they become OpenTelemetry spans named by their `otel.name`.
//!
//! | span (`otel.name`) | attributes |
//! |---|---|
//! | `invoke_agent {agent id}` | `gen_ai.operation.name`, `gen_ai.agent.name`, `gen_ai.agent.id`, `gen_ai.conversation.id` (thread id), `rein.run.id`, `rein.termination.code`, `error.type` |
//! | `chat {upstream model}` | `gen_ai.operation.name`, `gen_ai.provider.name` (the model's provider id), `gen_ai.request.model`, `gen_ai.request.temperature`, `gen_ai.request.max_tokens`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`, `error.type` |
//! | `execute_tool {tool name}` | `gen_ai.operation.name`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `error.type` |
//!
//! Message contents are recorded only when the runtime was built with
//! [`with_trace_content(true)`](crate::AgentRuntimeBuilder::with_trace_content):
//! `gen_ai.input.messages` and `gen_ai.output.messages` on `chat`,
//! `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result` on
//! `execute_tool` (JSON text).
//!
//! With no subscriber listening, a span is a disabled handle: no name is
//! formatted and nothing is recorded.

use futures::future::Either;
use rein_runtime_contract::inference::{InferenceError, InferenceRequest, InferenceResponse};
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::spec::ModelSpec;
use tracing::Span;
use tracing::field::Empty;
use tracing::instrument::{Instrument, Instrumented};

/// The target of every GenAI span, for filtering (`rein::genai=info`).
pub const TARGET: &str = "rein::genai";

/// The `invoke_agent` span of one run.
pub(crate) fn run_span(agent_id: &str, thread_id: &str, run_id: &str) -> Span {
    if !listening() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = Empty,
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent_id,
        gen_ai.agent.id = agent_id,
        gen_ai.conversation.id = thread_id,
        rein.run.id = run_id,
        rein.termination.code = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        span.record("otel.name", format!("invoke_agent {agent_id}"));
    }
    span
}

/// A count as `i64`: OpenTelemetry's integer type (`tracing-opentelemetry`
/// exports a `u64` field as a string).
fn int(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Records how the run ended on its `invoke_agent` span.
pub(crate) fn record_run_end(span: &Span, termination: &TerminationReason) {
    if span.is_disabled() {
        return;
    }
    span.record("rein.termination.code", termination.code());
    if let TerminationReason::Error(_) = termination {
        mark_error(span, "run_error");
    }
}

/// The `chat` span of one inference attempt.
pub(crate) fn chat_span(model: &ModelSpec, request: &InferenceRequest, content: bool) -> Span {
    if !listening() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = Empty,
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = model.provider_id.as_str(),
        gen_ai.request.model = model.upstream_model.as_str(),
        gen_ai.request.temperature = Empty,
        gen_ai.request.max_tokens = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        error.type = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("chat {}", model.upstream_model));
    if let Some(temperature) = request.temperature {
        span.record("gen_ai.request.temperature", temperature);
    }
    if let Some(max) = request.max_output_tokens {
        span.record("gen_ai.request.max_tokens", int(u64::from(max)));
    }
    if content {
        let messages = serde_json::to_string(&**request.messages).unwrap_or_default();
        span.record("gen_ai.input.messages", messages);
    }
    span
}

/// Records an attempt's usage and finish reason: `stop`, `tool_calls`,
/// `cancelled` (the run was cancelled mid-answer) or `cut` (a detector
/// dropped the stream).
pub(crate) fn record_chat_response(
    span: &Span,
    response: &InferenceResponse,
    reason: &str,
    content: bool,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(usage) = response.usage {
        span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
        span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
    }
    span.record("gen_ai.response.finish_reasons", reason);
    if content {
        let output = serde_json::json!({
            "text": response.text,
            "tool_calls": response.tool_calls,
        });
        span.record("gen_ai.output.messages", output.to_string());
    }
}

/// Records a failed attempt's error kind.
pub(crate) fn record_chat_error(span: &Span, error: &InferenceError) {
    if span.is_disabled() {
        return;
    }
    mark_error(span, error.kind().code());
}

/// Whether any `tracing` subscriber was ever installed. Without one no span
/// can be enabled, and a span is not built at all: with `tracing`'s `log`
/// feature (which a dependency turns on) a disabled span still offers its
/// creation and its drop to the `log` crate.
fn listening() -> bool {
    tracing::dispatcher::has_been_set()
}

/// `future` run inside `span`, or bare when no subscriber listens to the
/// span. An instrumented future enters and leaves its span on every poll,
/// which costs even for a disabled span (with `tracing`'s `log` feature,
/// which a dependency turns on, each entry asks the `log` crate too).
pub(crate) fn in_span<F: Future>(future: F, span: Span) -> Either<F, Instrumented<F>> {
    if span.is_disabled() {
        Either::Left(future)
    } else {
        Either::Right(future.instrument(span))
    }
}

/// The `execute_tool` span of one call.
pub(crate) fn tool_span(
    name: &str,
    call_id: &str,
    arguments: &serde_json::Value,
    content: bool,
) -> Span {
    if !listening() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = Empty,
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        error.type = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("execute_tool {name}"));
    if content {
        span.record("gen_ai.tool.call.arguments", arguments.to_string());
    }
    span
}

/// Records a call's outcome: `error_type` is `None` on success, else
/// `tool_error` or `panic`.
pub(crate) fn record_tool_outcome(
    span: &Span,
    error_type: Option<&'static str>,
    result: &str,
    content: bool,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(error_type) = error_type {
        mark_error(span, error_type);
    }
    if content {
        span.record("gen_ai.tool.call.result", result);
    }
}

/// Marks a span failed: `error.type` and the OpenTelemetry status.
fn mark_error(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "ERROR");
}
