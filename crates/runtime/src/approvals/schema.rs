//! The check of edited arguments against a tool's parameters: the JSON
//! Schema subset tools use (`type`, `properties`, `required`, `enum`,
//! `items`, `additionalProperties: false`), so an edit that the tool would
//! refuse is refused when it is decided, not when it runs.

use serde_json::Value;

/// Whether `value` fits `schema`; `Err` names the first field that does not.
pub(crate) fn check(schema: &Value, value: &Value) -> Result<(), String> {
    // A tool's arguments are a JSON object, whatever its schema says.
    if !value.is_object() {
        return Err(format!(
            "`arguments` must be an object, got {}",
            shown(value)
        ));
    }
    at(schema, value, "arguments")
}

fn at(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    if let Some(ty) = schema.get("type") {
        let types: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.is_empty() && !types.iter().any(|t| fits(t, value)) {
            return Err(format!(
                "`{path}` must be {}, got {}",
                types.join(" or "),
                shown(value)
            ));
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        return Err(format!(
            "`{path}` must be one of {}, got {}",
            Value::Array(allowed.clone()),
            shown(value)
        ));
    }
    if let Value::Object(fields) = value {
        if let Some(Value::Array(required)) = schema.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(name) {
                    return Err(format!("`{path}.{name}` is required"));
                }
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in fields {
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => at(sub, field, &format!("{path}.{name}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("`{path}.{name}` is not a parameter of the tool"));
                }
                None => {}
            }
        }
    }
    if let (Value::Array(items), Some(item)) = (value, schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            at(item, v, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn fits(ty: &str, value: &Value) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    }
}

fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(60).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn edits_outside_the_schema_name_the_field() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}, "required": ["path"], "additionalProperties": false});
        assert!(check(&schema, &json!({"path": "/tmp/a"})).is_ok());
        assert_eq!(
            check(&schema, &json!({})).unwrap_err(),
            "`arguments.path` is required"
        );
        assert!(
            check(&schema, &json!({"path": 3}))
                .unwrap_err()
                .contains("`arguments.path` must be string")
        );
        assert!(
            check(&schema, &json!({"path": "a", "x": 1}))
                .unwrap_err()
                .contains("not a parameter")
        );
        assert!(
            check(&schema, &json!("text"))
                .unwrap_err()
                .contains("must be an object")
        );
    }
}
