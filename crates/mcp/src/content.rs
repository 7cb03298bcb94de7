//! An MCP `CallToolResult` as a Rein tool result.
//!
//! Read from the result's JSON (the MCP schema's shape), so it does not
//! depend on the SDK's types: `content` items of type `text`, `image`,
//! `audio`, `resource` and `resource_link`, `structuredContent`, `isError`.

use rein_runtime_contract::tool::{ToolError, ToolOutput};
use serde_json::{Value, json};

/// The tool's output, or the error the model sees for `isError: true`.
pub(crate) fn to_output(result: &Value) -> Result<ToolOutput, ToolError> {
    let text = result
        .get("content")
        .and_then(Value::as_array)
        .map(|items| items.iter().map(describe).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default();
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(ToolError::new(if text.is_empty() {
            "the MCP tool reported an error without a message".to_owned()
        } else {
            text
        }));
    }
    match result.get("structuredContent") {
        Some(structured) if !structured.is_null() => Ok(ToolOutput::json(
            json!({"content": text, "structured_content": structured}),
        )),
        _ => Ok(ToolOutput::text(text)),
    }
}

/// One content item in words: text as is, anything else described.
fn describe(item: &Value) -> String {
    let field = |name: &str| item.get(name).and_then(Value::as_str).unwrap_or("");
    let size = |name: &str| {
        item.get(name)
            .and_then(Value::as_str)
            .map_or(0, |data| data.len() * 3 / 4)
    };
    match field("type") {
        "text" => field("text").to_owned(),
        "image" => format!(
            "[image: {}, about {} bytes, not shown]",
            field("mimeType"),
            size("data")
        ),
        "audio" => format!(
            "[audio: {}, about {} bytes, not shown]",
            field("mimeType"),
            size("data")
        ),
        "resource" => {
            let resource = item.get("resource").cloned().unwrap_or_default();
            let get = |name: &str| resource.get(name).and_then(Value::as_str).unwrap_or("");
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => format!("[resource {}]\n{text}", get("uri")),
                None => format!(
                    "[resource {}: {}, about {} bytes, not shown]",
                    get("uri"),
                    get("mimeType"),
                    get("blob").len() * 3 / 4
                ),
            }
        }
        "resource_link" => format!("[resource link: {} ({})]", field("uri"), field("name")),
        other => format!("[{other} content, not shown]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_the_output_and_other_content_is_described() {
        let out = to_output(&json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"}
        ]}))
        .unwrap();
        assert_eq!(
            out.to_content(),
            "hello\n[image: image/png, about 3 bytes, not shown]\n[resource file:///a.txt]\ninside\n[resource link: file:///b (b)]"
        );
    }

    #[test]
    fn structured_content_comes_with_the_text_and_is_error_is_an_error() {
        let out = to_output(
            &json!({"content": [{"type": "text", "text": "3"}], "structuredContent": {"sum": 3}}),
        )
        .unwrap();
        assert_eq!(
            out.value,
            json!({"content": "3", "structured_content": {"sum": 3}})
        );
        let err =
            to_output(&json!({"content": [{"type": "text", "text": "bad"}], "isError": true}))
                .unwrap_err();
        assert_eq!(err.message(), "bad");
    }
}
