//! Text with NUL characters, stored losslessly in `JSONB` columns, which
//! refuse `\u0000`: a tool that returns a binary file's text, or a client
//! message with a NUL, is stored and read back exactly.
//!
//! Inside every JSON string (and object key), U+E000 (a private-use
//! character) becomes two of them and NUL becomes U+E000 followed by `0`;
//! reading reverses it. Text with neither character is stored as it is,
//! so what was stored before this encoding reads back unchanged.

use std::borrow::Cow;

use serde_json::Value;

const MARK: char = '\u{E000}';

/// The value as stored.
pub(crate) fn encode(value: &Value) -> Cow<'_, Value> {
    if needs(value, &|s| s.contains(['\0', MARK])) {
        Cow::Owned(map(value, &encode_str))
    } else {
        Cow::Borrowed(value)
    }
}

/// The value as it was before [`encode`].
pub(crate) fn decode(value: Value) -> Value {
    if needs(&value, &|s| s.contains(MARK)) {
        map(&value, &decode_str)
    } else {
        value
    }
}

fn needs(value: &Value, test: &dyn Fn(&str) -> bool) -> bool {
    match value {
        Value::String(s) => test(s),
        Value::Array(items) => items.iter().any(|v| needs(v, test)),
        Value::Object(fields) => fields.iter().any(|(k, v)| test(k) || needs(v, test)),
        _ => false,
    }
}

fn map(value: &Value, f: &dyn Fn(&str) -> String) -> Value {
    match value {
        Value::String(s) => Value::String(f(s)),
        Value::Array(items) => Value::Array(items.iter().map(|v| map(v, f)).collect()),
        Value::Object(fields) => {
            Value::Object(fields.iter().map(|(k, v)| (f(k), map(v, f))).collect())
        }
        other => other.clone(),
    }
}

fn encode_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        match c {
            '\0' => {
                out.push(MARK);
                out.push('0');
            }
            MARK => {
                out.push(MARK);
                out.push(MARK);
            }
            c => out.push(c),
        }
    }
    out
}

fn decode_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == MARK {
            match chars.peek() {
                Some('0') => {
                    chars.next();
                    out.push('\0');
                    continue;
                }
                Some(&MARK) => {
                    chars.next();
                }
                // A lone mark (stored before this encoding): kept.
                _ => {}
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{decode, encode};

    #[test]
    fn text_with_nul_and_the_mark_reads_back_exactly() {
        for text in [
            "a\0b",
            "\u{E000}",
            "\u{E000}0",
            "\0\u{E000}\0",
            "plain",
            "",
            "\u{E000}\u{E000}x",
        ] {
            let value = json!({"content": text, "list": [text], text: 1});
            let stored = encode(&value).into_owned();
            assert!(!stored.to_string().contains("\\u0000"), "{stored}");
            assert_eq!(decode(stored), value, "{text:?}");
        }
    }

    #[test]
    fn text_without_either_character_is_stored_as_it_is() {
        let value = json!({"content": "hello", "n": [1, 2]});
        assert!(matches!(encode(&value), std::borrow::Cow::Borrowed(_)));
    }
}
