//! Mapping between Rein's executor protocol and genai's chat types: an
//! [`InferenceRequest`] becomes a genai [`ChatRequest`] (system prompt,
//! history, tool calls paired with their results, tools) and [`ChatOptions`]
//! (sampling, tool choice, captures); a whole genai answer becomes
//! [`InferenceDelta`]s; genai tool calls, their arguments and usage become
//! Rein's.
//!
//! It does not own I/O: sending requests, timeouts and streaming are in
//! `mod.rs` and `stream.rs`, error classification in `errors.rs`.

use std::collections::HashMap;

use genai::chat::{
    CacheControl, ChatMessage, ChatOptions, ChatRequest, ChatResponse, ContentPart, MessageContent,
    Tool, ToolName, ToolResponse,
};
use rein_runtime_contract::inference::{
    InferenceDelta, InferenceRequest, ResponseFormat, ToolChoice,
};
use rein_runtime_contract::message::{CacheUsage, Role, TokenUsage, ToolCall};
use serde_json::Value;

/// The genai chat request for `request`: system prompt, history (assistant
/// tool calls and tool results paired by id) and tools.
///
/// With `cache_hints` (providers whose prompt cache needs breakpoints:
/// Anthropic), two are marked: the system prompt, which caches the tool
/// list and the system prompt, and the last message, which caches the
/// whole prompt for the next round to read (it differs only by what the
/// round added, unless the context policy compacted).
pub(super) fn to_chat_request(request: &InferenceRequest, cache_hints: bool) -> ChatRequest {
    // Tool name of each call id, for the tool results (Gemini wants it).
    let call_names: HashMap<&str, &str> = request
        .messages
        .iter()
        .flat_map(|message| message.tool_calls.iter())
        .map(|call| (call.id.as_str(), call.name.as_str()))
        .collect();
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in request.messages.iter() {
        let chat_message = match message.role {
            Role::System => ChatMessage::system(message.content.clone()),
            Role::User => ChatMessage::user(message.content.clone()),
            Role::Assistant if message.tool_calls.is_empty() => {
                ChatMessage::assistant(message.content.clone())
            }
            Role::Assistant => {
                let mut parts = Vec::with_capacity(message.tool_calls.len() + 1);
                if !message.content.is_empty() {
                    parts.push(ContentPart::Text(message.content.clone()));
                }
                parts.extend(message.tool_calls.iter().map(|call| {
                    ContentPart::ToolCall(genai::chat::ToolCall {
                        call_id: call.id.clone(),
                        fn_name: call.name.clone(),
                        fn_arguments: call.arguments.clone(),
                        thought_signatures: None,
                    })
                }));
                ChatMessage::assistant(MessageContent::from_parts(parts))
            }
            Role::Tool => {
                let call_id = message.tool_call_id.as_deref().unwrap_or_default();
                let mut response = ToolResponse::new(call_id, message.content.clone());
                if let Some(name) = call_names.get(call_id) {
                    response = response.with_fn_name(*name);
                }
                ChatMessage::from(response)
            }
        };
        messages.push(chat_message);
    }
    if cache_hints && let Some(last) = messages.last_mut() {
        last.options = Some(CacheControl::Ephemeral.into());
    }
    let mut chat_request = ChatRequest::new(messages);
    if let Some(system) = &request.system {
        if cache_hints {
            // A system message carries its own cache breakpoint.
            let system = ChatMessage::system(system.clone()).with_options(CacheControl::Ephemeral);
            chat_request.messages.insert(0, system);
        } else {
            chat_request = chat_request.with_system(system.clone());
        }
    }
    if !request.tools.is_empty() {
        chat_request = chat_request.with_tools(request.tools.iter().map(|tool| {
            Tool::new(ToolName::Custom(tool.name.clone()))
                .with_description(tool.description.clone())
                .with_schema(tool.parameters.value().clone())
        }));
    }
    chat_request
}

/// The chat options for `request`: sampling, tool choice (only with tools),
/// the response format (`openai`: sent over the OpenAI protocol), and what
/// the stream should capture.
pub(super) fn chat_options(request: &InferenceRequest, openai: bool) -> ChatOptions {
    let mut options = ChatOptions::default()
        .with_capture_usage(true)
        .with_capture_tool_calls(true)
        .with_capture_content(false)
        .with_capture_reasoning_content(false);
    if let Some(temperature) = request.temperature {
        options = options.with_temperature(temperature);
    }
    if let Some(max_tokens) = request.max_output_tokens {
        options = options.with_max_tokens(max_tokens);
    }
    match &request.response_format {
        Some(ResponseFormat::JsonSchema(schema)) => {
            let spec = genai::chat::JsonSpec::new("rein_structured_answer", (**schema).clone());
            options = options.with_response_format(genai::chat::ChatResponseFormat::JsonSpec(spec));
        }
        Some(ResponseFormat::JsonObject(schema)) => {
            options = options.with_response_format(genai::chat::ChatResponseFormat::JsonMode);
            if openai {
                // The OpenAI protocol's JSON mode with the schema alongside:
                // llama.cpp and llama-cpp-python constrain to it.
                options = options.with_extra_body(serde_json::json!({
                    "response_format": { "type": "json_object", "schema": **schema }
                }));
            }
        }
        _ => {}
    }
    if !request.tools.is_empty() {
        let choice = match &request.tool_choice {
            ToolChoice::Auto => genai::chat::ToolChoice::Auto,
            ToolChoice::None => genai::chat::ToolChoice::None,
            ToolChoice::Required => genai::chat::ToolChoice::Required,
            ToolChoice::Tool(name) => genai::chat::ToolChoice::tool(name.clone()),
        };
        options = options.with_tool_choice(choice);
    }
    options
}

/// The deltas of a whole (non-streamed) answer.
pub(super) fn response_deltas(response: ChatResponse) -> Vec<InferenceDelta> {
    let mut deltas = Vec::new();
    let text: String = response.content.texts().concat();
    if !text.is_empty() {
        deltas.push(InferenceDelta::Text { text });
    }
    let usage = token_usage(&response.usage);
    deltas.extend(response.content.into_tool_calls().into_iter().map(|call| {
        InferenceDelta::ToolCall {
            call: tool_call(call),
        }
    }));
    if let Some(usage) = usage {
        deltas.push(InferenceDelta::Usage { usage });
    }
    if let Some(cache) = cache_usage(&response.usage) {
        deltas.push(InferenceDelta::CacheUsage { cache });
    }
    deltas
}

/// A genai tool call as a Rein tool call, its arguments parsed.
pub(super) fn tool_call(call: genai::chat::ToolCall) -> ToolCall {
    ToolCall::new(
        call.call_id,
        call.fn_name,
        parse_arguments(call.fn_arguments),
    )
}

/// Tool-call arguments as JSON. genai leaves arguments it could not parse as
/// a JSON string of the raw text; those become
/// `{"_raw_arguments": raw, "_error": "invalid JSON: ..."}`. Empty arguments
/// are `{}`.
fn parse_arguments(arguments: Value) -> Value {
    match arguments {
        Value::String(raw) if raw.trim().is_empty() => Value::Object(serde_json::Map::new()),
        Value::String(raw) => match serde_json::from_str::<Value>(&raw) {
            Ok(parsed) => parsed,
            Err(error) => serde_json::json!({
                "_raw_arguments": raw,
                "_error": format!("invalid JSON: {error}"),
            }),
        },
        Value::Null => Value::Object(serde_json::Map::new()),
        parsed => parsed,
    }
}

/// Usage when the provider reported prompt or completion tokens.
pub(super) fn token_usage(usage: &genai::chat::Usage) -> Option<TokenUsage> {
    if usage.prompt_tokens.is_none() && usage.completion_tokens.is_none() {
        return None;
    }
    Some(TokenUsage::new(
        count(usage.prompt_tokens),
        count(usage.completion_tokens),
    ))
}

/// A token count genai reported, 0 when absent or negative.
fn count(tokens: Option<i32>) -> u64 {
    tokens.and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

/// Prompt-cache usage when the provider reported cache reads or writes
/// (genai's `prompt_tokens_details`, which it fills from Anthropic's
/// `cache_read_input_tokens` / `cache_creation_input_tokens` and OpenAI's
/// `cached_tokens`).
pub(super) fn cache_usage(usage: &genai::chat::Usage) -> Option<CacheUsage> {
    let details = usage.prompt_tokens_details.as_ref()?;
    if details.cached_tokens.is_none() && details.cache_creation_tokens.is_none() {
        return None;
    }
    Some(CacheUsage::new(
        count(details.cached_tokens),
        count(details.cache_creation_tokens),
    ))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rein_runtime_contract::message::Message;
    use rein_runtime_contract::tool::ToolDescriptor;
    use serde_json::json;

    /// A `search` tool taking a string `q`; also used by the executor tests.
    pub(crate) fn search_tool() -> ToolDescriptor {
        ToolDescriptor::new("search", "Searches the web").with_parameters(json!({
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        }))
    }

    #[test]
    fn request_maps_system_history_and_tool_pairs() {
        let history = vec![
            Message::user("find rust"),
            Message::assistant_with_tools(
                "looking",
                vec![ToolCall::new("call_1", "search", json!({"q": "rust"}))],
            ),
            Message::tool("call_1", "3 results"),
            Message::system("be brief"),
            Message::assistant("done"),
        ];
        let request = InferenceRequest::new("m", history)
            .with_system("you are helpful")
            .with_tools(vec![search_tool()]);
        let chat = to_chat_request(&request, false);

        assert_eq!(chat.system.as_deref(), Some("you are helpful"));
        let roles: Vec<_> = chat.messages.iter().map(|m| m.role.clone()).collect();
        use genai::chat::ChatRole as R;
        assert_eq!(
            roles,
            [R::User, R::Assistant, R::Tool, R::System, R::Assistant]
        );

        let assistant = &chat.messages[1].content;
        assert_eq!(assistant.texts(), ["looking"]);
        let calls = assistant.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].call_id, "call_1");
        assert_eq!(calls[0].fn_name, "search");
        assert_eq!(calls[0].fn_arguments, json!({"q": "rust"}));

        let responses = chat.messages[2].content.tool_responses();
        assert_eq!(responses.len(), 1);
        assert_eq!(responses[0].call_id, "call_1");
        assert_eq!(responses[0].fn_name.as_deref(), Some("search"));
        assert_eq!(responses[0].content, "3 results");

        let tools = chat.tools.as_deref().unwrap_or_default();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name.as_str(), "search");
        assert_eq!(tools[0].description.as_deref(), Some("Searches the web"));
        assert_eq!(
            tools[0].schema.as_ref(),
            Some(search_tool().parameters.value())
        );
    }

    #[test]
    fn assistant_tool_calls_without_text_have_no_empty_text_part() {
        let history = vec![
            Message::user("hi"),
            Message::assistant_with_tools("", vec![ToolCall::new("c", "t", json!({}))]),
        ];
        let chat = to_chat_request(&InferenceRequest::new("m", history), false);
        assert!(chat.messages[1].content.texts().is_empty());
        assert_eq!(chat.messages[1].content.tool_calls().len(), 1);
    }

    #[test]
    fn tool_choice_is_sent_only_with_tools() {
        let mut request = InferenceRequest::new("m", vec![Message::user("hi")]);
        request.tool_choice = ToolChoice::Required;
        request.temperature = Some(0.25);
        request.max_output_tokens = Some(128);
        let options = chat_options(&request, true);
        assert_eq!(options.tool_choice, None);
        assert_eq!(options.temperature, Some(0.25));
        assert_eq!(options.max_tokens, Some(128));
        assert_eq!(options.capture_usage, Some(true));
        assert_eq!(options.capture_tool_calls, Some(true));
        assert!(to_chat_request(&request, false).tools.is_none());

        let mut request = request.with_tools(vec![search_tool()]);
        request.tool_choice = ToolChoice::Tool("search".into());
        assert_eq!(
            chat_options(&request, true).tool_choice,
            Some(genai::chat::ToolChoice::tool("search"))
        );
        request.tool_choice = ToolChoice::None;
        assert_eq!(
            chat_options(&request, true).tool_choice,
            Some(genai::chat::ToolChoice::None)
        );
    }

    #[test]
    fn a_json_schema_is_a_json_spec_and_json_mode_carries_the_schema_over_the_openai_protocol() {
        let schema = std::sync::Arc::new(json!({"type": "object", "required": ["a"]}));
        let request = InferenceRequest::new("m", vec![Message::user("hi")])
            .with_response_format(ResponseFormat::JsonSchema(schema.clone()));
        match chat_options(&request, true).response_format {
            Some(genai::chat::ChatResponseFormat::JsonSpec(spec)) => {
                assert_eq!(spec.schema, *schema);
            }
            other => panic!("{other:?}"),
        }
        let request = request.with_response_format(ResponseFormat::JsonObject(schema.clone()));
        let options = chat_options(&request, true);
        assert!(matches!(
            options.response_format,
            Some(genai::chat::ChatResponseFormat::JsonMode)
        ));
        assert_eq!(
            options.extra_body,
            Some(json!({"response_format": {"type": "json_object", "schema": *schema}}))
        );
        // Another protocol: JSON mode alone.
        assert_eq!(chat_options(&request, false).extra_body, None);
        assert!(
            chat_options(&InferenceRequest::new("m", vec![]), true)
                .response_format
                .is_none()
        );
    }

    #[test]
    fn arguments_are_parsed_and_invalid_json_is_wrapped() {
        assert_eq!(
            parse_arguments(Value::String(r#"{"q":"rust"}"#.into())),
            json!({"q": "rust"})
        );
        assert_eq!(parse_arguments(json!({"a": 1})), json!({"a": 1}));
        assert_eq!(parse_arguments(Value::String("  ".into())), json!({}));
        assert_eq!(parse_arguments(Value::Null), json!({}));
        let wrapped = parse_arguments(Value::String(r#"{"q": "ru"#.into()));
        assert_eq!(wrapped["_raw_arguments"], r#"{"q": "ru"#);
        assert!(
            wrapped["_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("invalid JSON: "))
        );
    }

    #[test]
    fn usage_is_reported_only_when_known() {
        assert_eq!(token_usage(&genai::chat::Usage::default()), None);
        let usage = genai::chat::Usage {
            prompt_tokens: Some(11),
            completion_tokens: Some(7),
            ..Default::default()
        };
        assert_eq!(token_usage(&usage), Some(TokenUsage::new(11, 7)));
    }
}
