//! Typed arguments in, serialized output out: the two conversions every
//! typed tool makes, with errors written for the model.

use rein_runtime_contract::tool::{ToolError, ToolOutput};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Parses a call's arguments into `A`.
///
/// Lenient where models commonly slip: no arguments (`null`) parse as an
/// empty object, and an object sent as a JSON string is unwrapped.
///
/// # Errors
///
/// A [`ToolError`] for the model naming the field and what was expected,
/// or saying that the arguments were not JSON.
pub(crate) fn parse<A: DeserializeOwned>(tool: &str, args: Value) -> Result<A, ToolError> {
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        Value::String(text) if text.trim_start().starts_with('{') => {
            serde_json::from_str(&text).map_err(|e| not_json(tool, &e.to_string()))?
        }
        // What an executor makes of arguments that are not JSON.
        Value::Object(map)
            if map.len() == 2
                && map.contains_key("_raw_arguments")
                && map.contains_key("_error") =>
        {
            let error = map.get("_error").and_then(Value::as_str).unwrap_or("");
            return Err(not_json(tool, error));
        }
        other => other,
    };
    serde_path_to_error::deserialize::<_, A>(args).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at = if path == "." {
            String::new()
        } else {
            format!("field `{path}`: ")
        };
        ToolError::new(format!(
            "invalid arguments for tool \"{tool}\": {at}{inner}; call it again with arguments that match its parameters schema"
        ))
    })
}

fn not_json(tool: &str, error: &str) -> ToolError {
    ToolError::new(format!(
        "invalid arguments for tool \"{tool}\": they are not valid JSON ({error}); send one JSON object that matches its parameters schema"
    ))
}

/// One typed call: parses `args` into `A`, runs `call`, serializes its
/// output — what every typed tool's `execute` does.
///
/// # Errors
///
/// A [`ToolError`] from parsing, from `call`, or from serializing.
pub(crate) async fn call_typed<A, O, Fut>(
    tool: &str,
    args: Value,
    call: impl FnOnce(A) -> Fut,
) -> Result<ToolOutput, ToolError>
where
    A: DeserializeOwned,
    O: Serialize,
    Fut: Future<Output = Result<O, ToolError>>,
{
    let args = parse::<A>(tool, args)?;
    let value = call(args).await?;
    output(tool, &value)
}

/// A typed output as the tool's output: a string is text, anything else JSON.
///
/// # Errors
///
/// A [`ToolError`] when the value cannot be serialized (e.g. a map with
/// non-string keys).
pub(crate) fn output<O: Serialize>(tool: &str, value: &O) -> Result<ToolOutput, ToolError> {
    serde_json::to_value(value)
        .map(ToolOutput::json)
        .map_err(|e| {
            ToolError::new(format!(
                "tool \"{tool}\" produced an output that is not JSON: {e}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[allow(dead_code)]
    #[derive(Debug, serde::Deserialize)]
    struct Args {
        a: f64,
        inner: Inner,
        note: Option<String>,
    }

    #[allow(dead_code)]
    #[derive(Debug, serde::Deserialize)]
    struct Inner {
        mode: Mode,
    }

    #[allow(dead_code)]
    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Exact,
    }

    fn error(args: Value) -> String {
        match parse::<Args>("t", args) {
            Ok(args) => panic!("parsed: {args:?}"),
            Err(e) => e.message().to_owned(),
        }
    }

    #[test]
    fn a_wrong_type_names_the_field_and_the_expected_type() {
        let message = error(json!({"a": "x", "inner": {"mode": "exact"}}));
        assert!(message.contains("field `a`"), "{message}");
        assert!(message.contains("expected f64"), "{message}");
        assert!(message.contains("tool \"t\""), "{message}");
    }

    #[test]
    fn a_missing_field_is_named() {
        let message = error(json!({"inner": {"mode": "exact"}}));
        assert!(message.contains("missing field `a`"), "{message}");
    }

    #[test]
    fn a_bad_nested_enum_names_its_path_and_the_variants() {
        let message = error(json!({"a": 1, "inner": {"mode": "loose"}}));
        assert!(message.contains("field `inner.mode`"), "{message}");
        assert!(message.contains("`exact`"), "{message}");
    }

    #[test]
    fn arguments_that_are_not_json_say_so() {
        let message = error(json!({"_raw_arguments": "{a:", "_error": "EOF while parsing"}));
        assert!(
            message.contains("not valid JSON (EOF while parsing)"),
            "{message}"
        );
        let message = error(json!("{not json"));
        assert!(message.contains("not valid JSON"), "{message}");
    }

    #[test]
    fn an_object_sent_as_a_string_or_nothing_is_accepted_where_it_fits() {
        let args: Args = parse("t", json!(r#"{"a": 2, "inner": {"mode": "exact"}}"#)).unwrap();
        assert_eq!(args.a, 2.0);
        #[derive(serde::Deserialize)]
        struct Empty {}
        assert!(parse::<Empty>("t", Value::Null).is_ok());
    }

    #[test]
    fn a_string_output_is_text_and_anything_else_json() {
        assert_eq!(output("t", &"hi").unwrap().to_content(), "hi");
        assert_eq!(output("t", &3.5).unwrap().to_content(), "3.5");
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(output("t", &map).is_err());
    }
}
