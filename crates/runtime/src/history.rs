//! Validity of a thread's history: every assistant tool call answered by
//! exactly one tool result.
//!
//! **Invariant:** after any run ends, its thread's history is valid; calls
//! that did not run (stopped, cancelled, interrupted) are answered by a
//! result that says so. [`repair`] is the one place that writes such results.
//!
//! Also how a model that judges a run reads its history: the [`recent`]
//! messages (a window that neither starts with a tool result nor ends
//! with a call left without its result) as a plain [`transcript`].

use std::collections::HashMap;

use rein_runtime_contract::lifecycle::ToolCallStatus;
use rein_runtime_contract::message::{Message, Role, ToolCall};
use serde_json::{Map, Value};

/// Appends a result for every tool call in `messages[from..]` that has none,
/// right after the results already present, so the history stays valid.
/// `note` is the text of the added results. Returns how many were added.
///
/// Calls before `from` are assumed answered (the caller validated them).
pub fn repair(messages: &mut Vec<Message>, from: usize, note: &str) -> usize {
    repair_calls(messages, from, note, None).len()
}

/// [`repair`], giving each added result the structured `status`
/// ([`Message::tool_status`]) its `note` explains.
pub fn repair_with_status(
    messages: &mut Vec<Message>,
    from: usize,
    note: &str,
    status: ToolCallStatus,
) -> usize {
    repair_calls(messages, from, note, Some(status)).len()
}

/// [`repair`], returning the calls it answered (id and tool name), in
/// history order.
pub(crate) fn repair_calls(
    messages: &mut Vec<Message>,
    from: usize,
    note: &str,
    status: Option<ToolCallStatus>,
) -> Vec<(String, String)> {
    // Each assistant message with calls is answered by the tool messages
    // right after it (its block); ids are matched within the block, so an
    // id a provider reuses in a later round is not mistaken for answered.
    // Within a block, calls and results pair by position among equal ids:
    // the k-th result with id X answers the k-th call with id X, so two
    // calls sharing an id need two results.
    let mut missing: Vec<(usize, String, String)> = Vec::new();
    let mut i = from.min(messages.len());
    while i < messages.len() {
        if messages[i].role == Role::Assistant && !messages[i].tool_calls.is_empty() {
            let mut end = i + 1;
            while end < messages.len() && messages[end].role == Role::Tool {
                end += 1;
            }
            let mut answered: HashMap<&str, usize> = HashMap::new();
            for id in messages[i + 1..end]
                .iter()
                .filter_map(|m| m.tool_call_id.as_deref())
            {
                *answered.entry(id).or_default() += 1;
            }
            for call in &messages[i].tool_calls {
                match answered.get_mut(call.id.as_str()) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => missing.push((end, call.id.clone(), call.name.clone())),
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    // Insert from the back so earlier insertion points stay correct; calls of
    // one block keep their order because equal points are inserted in reverse.
    for (at, id, _) in missing.iter().rev() {
        let mut result = Message::tool(id.clone(), note);
        result.tool_status = status;
        messages.insert(*at, result);
    }
    missing
        .into_iter()
        .map(|(_, id, name)| (id, name))
        .collect()
}

/// Copies of `calls` for the history, their arguments [`compact`]: a
/// history keeps its calls for as long as its thread lives.
pub(crate) fn compact_calls(calls: &[ToolCall]) -> Vec<ToolCall> {
    calls
        .iter()
        .map(|c| ToolCall {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: compact(&c.arguments),
        })
        .collect()
}

/// A copy of `value` whose objects and arrays hold no spare room. A parsed
/// (or `Clone`d) object keeps room for more keys: a one-key object of tool
/// arguments holds ~190 bytes of it, on every call the history keeps.
pub(crate) fn compact(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                out.insert(k.clone(), compact(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(compact).collect()),
        other => other.clone(),
    }
}

/// Why a run's input would make the history invalid: a tool result that
/// answers no call of the input, or a second result for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidInput {
    /// The offending message's position in the input, from 0.
    pub(crate) index: usize,
    /// What is wrong with it.
    pub(crate) reason: String,
}

/// Checks that every tool message of a run's `input` answers a call, made
/// by an assistant message of the input right before it (in the same
/// block), that has no result yet. Calls left without a result are fine:
/// the run answers them with "not run" results.
///
/// The stored history is valid before the input joins it (a run repairs
/// it first), so a result can only answer a call of the input itself.
pub(crate) fn validate_input(input: &[Message]) -> Result<(), InvalidInput> {
    // The open calls of the current block, by id, with how many remain.
    let mut open: HashMap<&str, usize> = HashMap::new();
    let mut in_block = false;
    for (index, m) in input.iter().enumerate() {
        match m.role {
            Role::Tool => {
                let Some(id) = m.tool_call_id.as_deref() else {
                    return Err(InvalidInput {
                        index,
                        reason: "a tool result without a tool_call_id".into(),
                    });
                };
                if !in_block {
                    return Err(InvalidInput {
                        index,
                        reason: format!(
                            "a tool result for call \"{id}\" that no assistant message right before it made"
                        ),
                    });
                }
                match open.get_mut(id) {
                    Some(n) if *n > 0 => *n -= 1,
                    Some(_) => {
                        return Err(InvalidInput {
                            index,
                            reason: format!("a second tool result for call \"{id}\""),
                        });
                    }
                    None => {
                        return Err(InvalidInput {
                            index,
                            reason: format!(
                                "a tool result for call \"{id}\", which the assistant message before it did not make"
                            ),
                        });
                    }
                }
            }
            Role::Assistant => {
                open.clear();
                for call in &m.tool_calls {
                    *open.entry(call.id.as_str()).or_default() += 1;
                }
                in_block = !m.tool_calls.is_empty();
            }
            Role::User | Role::System => {
                open.clear();
                in_block = false;
            }
        }
    }
    Ok(())
}

/// Whether every tool call in `messages` has exactly one result.
#[cfg(test)]
pub(crate) fn is_valid(messages: &[Message]) -> bool {
    let mut open: Vec<&str> = Vec::new();
    for m in messages {
        match m.role {
            Role::Assistant => {
                if !open.is_empty() {
                    return false;
                }
                open.extend(m.tool_calls.iter().map(|c| c.id.as_str()));
            }
            Role::Tool => {
                let Some(id) = m.tool_call_id.as_deref() else {
                    return false;
                };
                let Some(pos) = open.iter().position(|o| *o == id) else {
                    return false;
                };
                open.swap_remove(pos);
            }
            Role::User | Role::System => {
                if !open.is_empty() {
                    return false;
                }
            }
        }
    }
    open.is_empty()
}

/// The last `n` messages of `messages`, so that the window does not start
/// with a tool result (it reaches back to the call's assistant message, a
/// few messages past `n` at most: a round's results stay with their call)
/// and does not end with an assistant message whose calls have no results
/// in it.
pub(crate) fn recent(messages: &[Message], n: usize) -> &[Message] {
    let mut start = messages.len().saturating_sub(n);
    while start > 0 && messages[start].role == Role::Tool {
        start -= 1;
    }
    let mut window = &messages[start..];
    while let [rest @ .., last] = window
        && last.role == Role::Assistant
        && !last.tool_calls.is_empty()
    {
        window = rest;
    }
    window
}

/// `messages` as a plain transcript: `[user] …`, `[assistant] …`,
/// `[assistant called <name>] <arguments>`, `[tool result] …`, one line
/// each; each text cut to `max_chars` characters when given.
pub(crate) fn transcript(messages: &[Message], max_chars: Option<usize>) -> String {
    use std::fmt::Write;
    let cut = |text: &str| match max_chars {
        Some(max) => crate::detectors::snippet(text, max),
        None => text.to_owned(),
    };
    let mut out = String::new();
    for m in messages {
        let who = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
            Role::Tool => "tool result",
        };
        if !(m.content.is_empty() && m.role == Role::Assistant && !m.tool_calls.is_empty()) {
            let _ = writeln!(out, "[{who}] {}", cut(&m.content));
        }
        for call in &m.tool_calls {
            let _ = writeln!(
                out,
                "[assistant called {}] {}",
                call.name,
                cut(&call.arguments.to_string())
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", serde_json::json!({}))
    }

    #[test]
    fn compacted_arguments_are_equal_and_keep_their_key_order() {
        let arguments =
            serde_json::json!({"z": [1, {"y": null, "b": "ü"}], "a": {"k": -3.5}, "m": true});
        let calls = vec![ToolCall::new("c1", "write", arguments.clone())];
        let compacted = compact_calls(&calls);
        assert_eq!(compacted, calls);
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&compacted[0].arguments), ["z", "a", "m"]);
        assert_eq!(keys(&compacted[0].arguments["z"][1]), ["y", "b"]);
    }

    #[test]
    fn missing_results_are_added_after_the_existing_ones() {
        let mut h = vec![
            Message::user("go"),
            Message::assistant_with_tools("", vec![call("a"), call("b"), call("c")]),
            Message::tool("b", "ok"),
        ];
        assert!(!is_valid(&h));
        assert_eq!(repair(&mut h, 0, "not run"), 2);
        assert!(is_valid(&h));
        let ids: Vec<_> = h[2..]
            .iter()
            .map(|m| m.tool_call_id.clone().unwrap())
            .collect();
        assert_eq!(ids, ["b", "a", "c"]);
        assert_eq!(h[3].content, "not run");
    }

    #[test]
    fn a_block_followed_by_user_input_is_repaired_before_the_input() {
        let mut h = vec![
            Message::assistant_with_tools("", vec![call("a")]),
            Message::user("new input"),
        ];
        assert_eq!(repair(&mut h, 0, "interrupted"), 1);
        assert!(is_valid(&h));
        assert_eq!(h[1].tool_call_id.as_deref(), Some("a"));
        assert_eq!(h[2].content, "new input");
    }

    #[test]
    fn valid_histories_are_left_alone() {
        let mut h = vec![
            Message::user("go"),
            Message::assistant_with_tools("", vec![call("a")]),
            Message::tool("a", "ok"),
            Message::assistant("done"),
        ];
        let before = h.clone();
        assert!(is_valid(&h));
        assert_eq!(repair(&mut h, 0, "x"), 0);
        assert_eq!(h, before);
    }

    #[test]
    fn a_reused_call_id_is_answered_per_block() {
        let mut h = vec![
            Message::assistant_with_tools("", vec![call("a")]),
            Message::tool("a", "ok"),
            Message::assistant_with_tools("", vec![call("a")]),
        ];
        assert_eq!(repair(&mut h, 0, "not run"), 1);
        assert!(is_valid(&h));
        assert_eq!(h[3].content, "not run");
    }

    #[test]
    fn two_calls_sharing_an_id_need_two_results() {
        let mut h = vec![
            Message::assistant_with_tools("", vec![call("a"), call("a")]),
            Message::tool("a", "ok"),
        ];
        assert_eq!(repair(&mut h, 0, "not run"), 1);
        assert_eq!(h.len(), 3);
        assert_eq!(h[2].content, "not run");
    }

    #[test]
    fn input_results_must_answer_an_open_call_of_the_input() {
        let ok = [
            Message::user("go"),
            Message::assistant_with_tools("", vec![call("a"), call("a")]),
            Message::tool("a", "1"),
            Message::tool("a", "2"),
        ];
        assert_eq!(validate_input(&ok), Ok(()));
        let orphan = [Message::user("go"), Message::tool("x", "orphan")];
        assert_eq!(validate_input(&orphan).unwrap_err().index, 1);
        let second = [
            Message::assistant_with_tools("", vec![call("a")]),
            Message::tool("a", "1"),
            Message::tool("a", "2"),
        ];
        let e = validate_input(&second).unwrap_err();
        assert_eq!(e.index, 2);
        assert!(e.reason.contains("second"), "{}", e.reason);
        let after_user = [
            Message::assistant_with_tools("", vec![call("a")]),
            Message::user("wait"),
            Message::tool("a", "late"),
        ];
        assert_eq!(validate_input(&after_user).unwrap_err().index, 2);
    }

    #[test]
    fn results_without_calls_are_invalid() {
        assert!(!is_valid(&[Message::tool("x", "orphan")]));
    }
}
