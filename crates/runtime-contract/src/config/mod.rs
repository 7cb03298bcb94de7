//! Loading agent specs and stop conditions from YAML (or JSON, which YAML
//! accepts), with validation and positions.
//!
//! # Document forms
//!
//! - Stop conditions: a YAML list of items, or a mapping whose only key is
//!   `stop_conditions:` holding that list. Each item is tagged by `type`
//!   (see [`StopConditionSpec`]).
//! - An agent spec: a mapping with `id` (required), `model_id`,
//!   `system_prompt`, `max_rounds` (default 16), `plugin_ids` (default []),
//!   `stop_conditions` (default []), `tool_choice` (default `auto`) and
//!   `context` (a [`ContextPolicy`](crate::context::ContextPolicy); default none).
//!
//! Unknown and misspelt keys are errors. [`ConfigError::line`] and
//! [`ConfigError::column`] (1-based) point at the offending key, at the value
//! for a wrong type or an out-of-range value, and at the item for a missing
//! field or an unknown `type`.
//!
//! # Validation bounds
//!
//! | field | accepted |
//! |---|---|
//! | `timeout.seconds` | 0 (disabled) ..= 86400 (24 h) |
//! | `token_budget.max_total` | 0 (disabled) ..= 1 000 000 000 |
//! | `content_match.pattern` | at most 1024 characters, a valid `regex` (empty disables) |
//! | `loop_detection.window` | 0 (disabled) or 2 ..= 64 |
//! | `tool_call_loop.threshold`, `tool_error_loop.threshold`, `tool_call_cycle.threshold`, `content_chanting.threshold` | 0 (disabled) or 2 ..= 1000 |
//! | `tool_call_loop.max_cycle`, `tool_call_cycle.cycle` | 0 (disabled) or 1 ..= 16 |
//! | `content_chanting.chunk_chars` | 0 (disabled) or 8 ..= 1000 |
//! | `stuck.duplicates` | 0 (disabled) or ≥ 1 |
//! | `llm_loop_check.after_rounds` | 1 ..= 1 000 000 |
//! | `llm_loop_check.interval`, `min_interval`, `max_interval` | 1 ..= 1000, `min_interval` ≤ `max_interval` |
//! | `task_complete.every` | 0 (final answers only) ..= 1000 |
//! | `threshold` of `llm_loop_check` and `task_complete` | 0 ..= 1 |
//! | `history` of `llm_loop_check` and `task_complete` | 2 ..= 200 |
//! | `max_checks` of `llm_loop_check` and `task_complete` | 0 (disabled) ..= 1000 |
//! | `model_id` of `llm_loop_check` and `task_complete` | required, not empty |
//!
//! Fields with defaults may be omitted: `tool_call_loop` (threshold 5,
//! max_cycle 5, on_detect stop), `tool_error_loop` (threshold 3, on_detect
//! stop), `tool_call_cycle` (threshold 5, on_detect stop; `cycle` is
//! required), `content_chanting` (chunk_chars 50, threshold 10, on_detect
//! stop), `stuck` (duplicates 2), `llm_loop_check` (after_rounds 30,
//! interval 10, min_interval 5, max_interval 15, threshold 0.9, history 20,
//! max_checks 10, on_detect stop), `task_complete` (every 0, threshold 0.9,
//! history 20, max_checks 10).
//!
//! ```
//! use rein_runtime_contract::config::load_stop_conditions_yaml;
//! use rein_runtime_contract::lifecycle::StopConditionSpec;
//!
//! let specs = load_stop_conditions_yaml("- { type: max_rounds, rounds: 10 }\n- { type: timeout, seconds: 300 }\n").unwrap();
//! assert_eq!(specs[1], StopConditionSpec::Timeout { seconds: 300 });
//!
//! let err = load_stop_conditions_yaml("- type: max_rounds\n  rounds: 10\n- type: timeout\n  secondz: 5\n").unwrap_err();
//! assert_eq!((err.line(), err.column()), (Some(4), Some(3)));
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::inference::ToolChoice;
use crate::lifecycle::{OnDetect, StopConditionSpec};
use crate::spec::AgentSpec;

/// The largest accepted `timeout.seconds` (24 hours).
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 60 * 60;
/// The largest accepted `token_budget.max_total`.
pub const MAX_TOKEN_BUDGET: u64 = 1_000_000_000;
/// The longest accepted `content_match.pattern`, in characters.
pub const MAX_PATTERN_CHARS: usize = 1024;
/// The largest accepted `loop_detection.window`.
pub const MAX_LOOP_WINDOW: usize = 64;
/// The largest accepted `tool_call_loop.max_cycle` and `tool_call_cycle.cycle`.
pub const MAX_CYCLE: usize = 16;
/// The smallest accepted non-zero `content_chanting.chunk_chars`.
pub const MIN_CHUNK_CHARS: usize = 8;
/// The largest accepted `content_chanting.chunk_chars`.
pub const MAX_CHUNK_CHARS: usize = 1000;
/// The largest accepted `threshold` of `tool_call_loop`, `tool_error_loop`,
/// `tool_call_cycle` and `content_chanting`.
pub const MAX_THRESHOLD: usize = 1000;
/// The largest accepted round limit (`max_rounds` of an agent and of the
/// `max_rounds` stop condition).
pub const MAX_ROUNDS: usize = 1_000_000;
/// The largest accepted `consecutive_errors.max`.
pub const MAX_CONSECUTIVE_ERRORS: usize = 1_000_000;
/// The largest accepted `stuck.duplicates`: a run remembers its last 64
/// answers, so at most 63 earlier ones can repeat the newest.
pub const MAX_STUCK_DUPLICATES: usize = 63;
/// The largest accepted `error_rate.errors`.
pub const MAX_ERROR_RATE_ERRORS: usize = 1000;
/// The largest accepted `awaiting_user.auto_nudges`.
pub const MAX_AUTO_NUDGES: usize = 100;
/// The largest accepted `no_progress.rounds`.
pub const MAX_NO_PROGRESS_ROUNDS: usize = 1000;
/// The largest accepted interval of `llm_loop_check` and `every` of
/// `task_complete`, in rounds.
pub const MAX_CHECK_INTERVAL: usize = 1000;
/// The most recent messages a judging model may be given (`history`).
pub const MAX_CHECK_HISTORY: usize = 200;
/// The largest accepted `max_checks` of a model-judged condition.
pub const MAX_CHECKS: usize = 1000;

/// A configuration document that could not be loaded: what is wrong, and
/// where (file, 1-based line and column) when known.
///
/// `Debug` prints the same text as `Display`, so a `main` returning
/// `Result<(), ConfigError>` (or `?` into `Box<dyn Error>`) reports
/// `Error: agent.yaml: line 4, column 3: …` rather than a struct dump; the
/// alternate form (`{:#?}`) shows the fields.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
    line: Option<usize>,
    column: Option<usize>,
    path: Option<PathBuf>,
}

impl ConfigError {
    /// An error without a position.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            line: None,
            column: None,
            path: None,
        }
    }

    /// An error at a 1-based line and column.
    pub fn at(message: impl Into<String>, line: usize, column: usize) -> Self {
        Self {
            line: Some(line),
            column: Some(column),
            ..Self::new(message)
        }
    }

    /// What is wrong, without the position.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The 1-based line of the offending key, value or item.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The 1-based column of the offending key, value or item.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The file, for errors from the `*_file` loaders.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn with_path(mut self, path: &Path) -> Self {
        self.path = Some(path.to_owned());
        self
    }

    /// A serde_yaml error as a `ConfigError`, with its position (for
    /// documents that embed agent specs, e.g. with [`AgentSpecSeed`]).
    pub fn from_yaml_error(e: &serde_yaml::Error) -> Self {
        Self::from_yaml(e, &[])
    }

    /// Converts a serde_yaml error: its position becomes ours, and its path
    /// prefix (`.stop_conditions[1].seconds: `) becomes words naming the item
    /// and its `type` (from `kinds`) and the field.
    fn from_yaml(e: &serde_yaml::Error, kinds: &[Option<String>]) -> Self {
        let text = e.to_string();
        let (text, position) = match e.location() {
            Some(loc) => {
                let suffix = format!(" at line {} column {}", loc.line(), loc.column());
                let text = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
                (text, Some((loc.line(), loc.column())))
            }
            None => (text, None),
        };
        let message = describe_path(&plain_words(&text), kinds);
        match position {
            Some((line, column)) => Self::at(message, line, column),
            None => Self::new(message),
        }
    }
}

/// Says in words what the YAML parser's own messages say in its terms:
/// indentation mistakes, a `key: value` where none may stand, a tab, and a
/// negative number where only counts are allowed. The position is the
/// error's; a parser message names the block it was in by its own
/// position, kept once, in words.
fn plain_words(text: &str) -> String {
    let (head, context) = match text.split_once(", while parsing ") {
        Some((head, context)) => (head, Some(context)),
        None => (text, None),
    };
    // `… at line 6 column 3` of the enclosing block.
    let block = context.and_then(|c| {
        let (_, at) = c.rsplit_once(" at line ")?;
        let (line, column) = at.split_once(" column ")?;
        Some(format!(
            " (the block it should belong to starts at line {line}, column {column})"
        ))
    });
    let block = block.unwrap_or_default();
    let head = head.split(" at line ").next().unwrap_or(head).trim_end();
    if head.starts_with("did not find expected key") {
        return format!(
            "the indentation does not line up: this line is indented differently from the keys of the mapping above it{block}; indent it with spaces like its siblings"
        );
    }
    if head.starts_with("did not find expected '-' indicator") {
        return format!(
            "the indentation does not line up: a list's items must each start with `-` at the same column{block}; indent this line like the items before it, or start it with `-`"
        );
    }
    if head.starts_with("mapping values are not allowed in this context") {
        return "a `key: value` stands where a plain value was expected; indent it under a key, or quote the value if it contains `: `".to_owned();
    }
    if head.starts_with("found character that cannot start any token") {
        return "a character that cannot start a value here (a tab? YAML indents with spaces only)"
            .to_owned();
    }
    // `invalid type: integer `-5`, expected a number of tokens`
    if let Some((path, rest)) = text.split_once("invalid type: integer `-")
        && let Some((number, expected)) = rest.split_once("`, expected ")
    {
        return format!("{path}must be ≥ 0 ({expected}), not -{number}");
    }
    text.to_owned()
}

/// Rewrites serde_yaml's `.<path>: message` prefix into words.
fn describe_path(text: &str, kinds: &[Option<String>]) -> String {
    let is_path = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c))
    };
    let Some((path, message)) = text.split_once(": ").filter(|(p, _)| is_path(p)) else {
        return text.to_owned();
    };
    let path = path.trim_start_matches('.');
    let path = path.strip_prefix("stop_conditions").unwrap_or(path);
    if let Some(rest) = path.strip_prefix('[')
        && let Some((index, field)) = rest.split_once(']')
        && let Ok(i) = index.parse::<usize>()
    {
        let kind = match kinds.get(i).and_then(Option::as_deref) {
            Some(kind) => format!(" ({kind})"),
            None => String::new(),
        };
        let field = field.trim_start_matches('.');
        let field = if field.is_empty() {
            String::new()
        } else {
            format!(", field `{field}`")
        };
        return format!("stop condition #{}{kind}{field}: {message}", i + 1);
    }
    format!("field `{path}`: {message}")
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, "line {line}, column {column}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.debug_struct("ConfigError")
                .field("message", &self.message)
                .field("line", &self.line)
                .field("column", &self.column)
                .field("path", &self.path)
                .finish()
        } else {
            fmt::Display::fmt(self, f)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Loads stop conditions from a YAML (or JSON) string.
///
/// # Errors
///
/// A [`ConfigError`] naming the problem and its position: invalid YAML, an
/// unknown `type`, an unknown, missing or mistyped field, or a value out of
/// the bounds in the module docs.
pub fn load_stop_conditions_yaml(text: &str) -> Result<Vec<StopConditionSpec>, ConfigError> {
    let kinds = match parse_value(text)? {
        serde_yaml::Value::Mapping(m) => {
            m.get("stop_conditions").map(item_kinds).unwrap_or_default()
        }
        other => item_kinds(&other),
    };
    StopConditionsDocSeed { kinds: &kinds }
        .deserialize(serde_yaml::Deserializer::from_str(text))
        .map_err(|e| ConfigError::from_yaml(&e, &kinds))
}

/// Loads stop conditions from a YAML (or JSON) file.
///
/// # Errors
///
/// As for [`load_stop_conditions_yaml`], with the file's path; or the file
/// cannot be read.
pub fn load_stop_conditions_file(
    path: impl AsRef<Path>,
) -> Result<Vec<StopConditionSpec>, ConfigError> {
    let path = path.as_ref();
    load_stop_conditions_yaml(&read(path)?).map_err(|e| e.with_path(path))
}

/// Loads an agent spec from a YAML (or JSON) string.
///
/// # Errors
///
/// A [`ConfigError`] naming the problem and its position: invalid YAML, a
/// missing `id`, an unknown or mistyped key, or an invalid stop condition.
pub fn load_agent_spec_yaml(text: &str) -> Result<AgentSpec, ConfigError> {
    let kinds = match parse_value(text)? {
        serde_yaml::Value::Mapping(m) => {
            m.get("stop_conditions").map(item_kinds).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    serde_yaml::Deserializer::from_str(text)
        .deserialize_map(AgentSpecVisitor {
            kinds: &kinds,
            keys: AGENT_SPEC_KEYS,
        })
        .map(|(spec, _)| spec)
        .map_err(|e| ConfigError::from_yaml(&e, &kinds))
}

/// Loads an agent spec from a YAML (or JSON) file.
///
/// # Errors
///
/// As for [`load_agent_spec_yaml`], with the file's path; or the file cannot
/// be read.
pub fn load_agent_spec_file(path: impl AsRef<Path>) -> Result<AgentSpec, ConfigError> {
    let path = path.as_ref();
    load_agent_spec_yaml(&read(path)?).map_err(|e| e.with_path(path))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read the file: {e}")).with_path(path))
}

/// First pass: the document as a value, to learn each item's `type` (the
/// second pass keeps positions but must know the type before the fields).
fn parse_value(text: &str) -> Result<serde_yaml::Value, ConfigError> {
    serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(&e, &[]))
}

fn item_kinds(list: &serde_yaml::Value) -> Vec<Option<String>> {
    match list {
        serde_yaml::Value::Sequence(items) => items
            .iter()
            .map(|item| item.get("type").and_then(|t| t.as_str()).map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// The stop condition `type` names, in declaration order.
pub const STOP_CONDITION_TYPES: [&str; 17] = [
    "max_rounds",
    "timeout",
    "token_budget",
    "consecutive_errors",
    "stop_on_tool",
    "content_match",
    "loop_detection",
    "tool_call_loop",
    "tool_error_loop",
    "tool_call_cycle",
    "content_chanting",
    "stuck",
    "error_rate",
    "no_progress",
    "awaiting_user",
    "llm_loop_check",
    "task_complete",
];

struct StopConditionsDocSeed<'k> {
    kinds: &'k [Option<String>],
}

impl<'de> DeserializeSeed<'de> for StopConditionsDocSeed<'_> {
    type Value = Vec<StopConditionSpec>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StopConditionsDocSeed<'_> {
    type Value = Vec<StopConditionSpec>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of stop conditions, or a mapping with a `stop_conditions` list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        ListSeed { kinds: self.kinds }.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut specs = None;
        while map.next_key_seed(KeySeed(&["stop_conditions"]))?.is_some() {
            if specs.is_some() {
                return Err(de::Error::duplicate_field("stop_conditions"));
            }
            specs = Some(map.next_value_seed(ListSeed { kinds: self.kinds })?);
        }
        specs.ok_or_else(|| de::Error::missing_field("stop_conditions"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
}

/// A mapping key that must be one of `self.0`; an unknown key is reported
/// at the key itself (for documents that embed these loaders' items).
#[derive(Debug, Clone, Copy)]
pub struct KeySeed(pub &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = &'static str;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = &'static str;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<&'static str, E> {
        self.0
            .iter()
            .find(|k| **k == v)
            .copied()
            .ok_or_else(|| E::unknown_field(v, self.0))
    }
}

/// A list of stop-condition items whose types are known from the first pass.
struct ListSeed<'k> {
    kinds: &'k [Option<String>],
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = Vec<StopConditionSpec>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = Vec<StopConditionSpec>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of stop conditions")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut specs = Vec::new();
        let mut i = 0;
        loop {
            let kind = self.kinds.get(i).and_then(|k| k.as_deref());
            match seq.next_element_seed(ItemSeed { kind })? {
                Some(spec) => specs.push(spec),
                None => return Ok(specs),
            }
            i += 1;
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
}

/// One item, deserialized as the plain struct of its (known) type so that
/// key and value positions survive.
struct ItemSeed<'k> {
    kind: Option<&'k str>,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = StopConditionSpec;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Ok(match self.kind {
            Some("max_rounds") => {
                let i = items::MaxRounds::deserialize(d)?;
                StopConditionSpec::MaxRounds { rounds: i.rounds.0 }
            }
            Some("timeout") => {
                let i = items::Timeout::deserialize(d)?;
                StopConditionSpec::Timeout {
                    seconds: i.seconds.0,
                }
            }
            Some("token_budget") => {
                let i = items::TokenBudget::deserialize(d)?;
                StopConditionSpec::TokenBudget {
                    max_total: i.max_total.0,
                }
            }
            Some("consecutive_errors") => {
                let i = items::ConsecutiveErrors::deserialize(d)?;
                StopConditionSpec::ConsecutiveErrors { max: i.max.0 }
            }
            Some("stop_on_tool") => {
                let i = items::StopOnTool::deserialize(d)?;
                StopConditionSpec::StopOnTool {
                    tool_name: i.tool_name,
                }
            }
            Some("content_match") => {
                let i = items::ContentMatch::deserialize(d)?;
                StopConditionSpec::ContentMatch {
                    pattern: i.pattern.0,
                }
            }
            Some("loop_detection") => {
                let i = items::LoopDetection::deserialize(d)?;
                StopConditionSpec::LoopDetection { window: i.window.0 }
            }
            Some("tool_call_loop") => {
                let i = items::ToolCallLoop::deserialize(d)?;
                StopConditionSpec::ToolCallLoop {
                    threshold: i.threshold.0,
                    max_cycle: i.max_cycle.0,
                    on_detect: i.on_detect,
                }
            }
            Some("tool_error_loop") => {
                let i = items::ToolErrorLoop::deserialize(d)?;
                StopConditionSpec::ToolErrorLoop {
                    threshold: i.threshold.0,
                    on_detect: i.on_detect,
                }
            }
            Some("tool_call_cycle") => {
                let i = items::ToolCallCycle::deserialize(d)?;
                StopConditionSpec::ToolCallCycle {
                    cycle: i.cycle.0,
                    threshold: i.threshold.0,
                    on_detect: i.on_detect,
                }
            }
            Some("content_chanting") => {
                let i = items::ContentChanting::deserialize(d)?;
                StopConditionSpec::ContentChanting {
                    chunk_chars: i.chunk_chars.0,
                    threshold: i.threshold.0,
                    on_detect: i.on_detect,
                }
            }
            Some("stuck") => {
                let i = items::Stuck::deserialize(d)?;
                StopConditionSpec::Stuck {
                    duplicates: i.duplicates.0,
                }
            }
            Some("error_rate") => {
                let i = items::ErrorRate::deserialize(d)?;
                StopConditionSpec::ErrorRate {
                    errors: i.errors.0,
                    within_seconds: i.within_seconds.0,
                }
            }
            Some("awaiting_user") => {
                let i = items::AwaitingUser::deserialize(d)?;
                StopConditionSpec::AwaitingUser {
                    auto_nudges: i.auto_nudges.0,
                }
            }
            Some("no_progress") => {
                let i = items::NoProgress::deserialize(d)?;
                StopConditionSpec::NoProgress { rounds: i.rounds.0 }
            }
            Some("llm_loop_check") => {
                let i = items::LlmLoopCheck::deserialize(d)?;
                if i.min_interval.0 > i.max_interval.0 {
                    return Err(de::Error::custom(format!(
                        "min_interval ({}) is above max_interval ({}); the interval adapts between them",
                        i.min_interval.0, i.max_interval.0
                    )));
                }
                StopConditionSpec::LlmLoopCheck {
                    model_id: i.model_id.0,
                    after_rounds: i.after_rounds.0,
                    interval: i.interval.0,
                    min_interval: i.min_interval.0,
                    max_interval: i.max_interval.0,
                    threshold: i.threshold.0,
                    history: i.history.0,
                    max_checks: i.max_checks.0,
                    on_detect: i.on_detect,
                }
            }
            Some("task_complete") => {
                let i = items::TaskComplete::deserialize(d)?;
                StopConditionSpec::TaskComplete {
                    model_id: i.model_id.0,
                    every: i.every.0,
                    threshold: i.threshold.0,
                    history: i.history.0,
                    max_checks: i.max_checks.0,
                }
            }
            // Unknown or missing: report it at the `type` value (or the item).
            _ => {
                items::TypeOnly::deserialize(d)?;
                return Err(de::Error::custom("invalid stop condition item"));
            }
        })
    }
}

mod items;

/// The keys of an agent spec document.
/// The keys of an agent spec mapping.
pub const AGENT_SPEC_KEYS: &[&str] = &[
    "id",
    "model_id",
    "system_prompt",
    "max_rounds",
    "plugin_ids",
    "stop_conditions",
    "tool_choice",
    "context",
    "escalation",
    "tool_rules",
    "subagents",
    "approvals",
];

/// Deserializes an agent spec that is one item of a larger YAML document
/// (e.g. a deployment file's `agents:` list), so that errors keep their
/// positions in the whole document. The document may give an agent more
/// keys than a spec has: `keys` lists every accepted key ([`AGENT_SPEC_KEYS`]
/// and the extra ones); the extra keys' values come back raw, in order.
///
/// `kinds` are the `type`s of the agent's stop conditions, learnt from a
/// first pass over the document ([`stop_condition_kinds`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentSpecSeed<'k> {
    kinds: &'k [Option<String>],
    keys: &'static [&'static str],
}

impl<'k> AgentSpecSeed<'k> {
    /// A seed accepting `keys` (which should include [`AGENT_SPEC_KEYS`]).
    pub fn new(kinds: &'k [Option<String>], keys: &'static [&'static str]) -> Self {
        Self { kinds, keys }
    }
}

/// The `type` of each stop condition of an agent mapping (from a first,
/// position-free pass), for [`AgentSpecSeed`].
pub fn stop_condition_kinds(agent: &serde_yaml::Value) -> Vec<Option<String>> {
    agent
        .get("stop_conditions")
        .map(item_kinds)
        .unwrap_or_default()
}

impl<'de> DeserializeSeed<'de> for AgentSpecSeed<'_> {
    type Value = (AgentSpec, Vec<(&'static str, serde_yaml::Value)>);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(AgentSpecVisitor {
            kinds: self.kinds,
            keys: self.keys,
        })
    }
}

/// `escalation:`, checked as
/// [`crate::escalation::deserialize_escalation_listed`] against the
/// agent's stop-condition kinds.
struct EscalationSeed<'k>(&'k [&'k str]);

impl<'de> DeserializeSeed<'de> for EscalationSeed<'_> {
    type Value = std::collections::BTreeMap<String, crate::escalation::Ladder>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        crate::escalation::deserialize_escalation_listed(d, self.0)
    }
}

/// `tool_rules:`, refused at its mapping when no tool-call loop detector
/// is listed ([`crate::escalation::check_tool_rules_listed`]).
struct ToolRulesSeed<'k>(&'k [&'k str]);

impl<'de> DeserializeSeed<'de> for ToolRulesSeed<'_> {
    type Value = std::collections::BTreeMap<String, crate::escalation::ToolLoopRule>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ToolRulesSeed<'_> {
    type Value = std::collections::BTreeMap<String, crate::escalation::ToolLoopRule>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map from tool name to rule")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rules = Self::Value::new();
        while let Some(tool) = map.next_key::<String>()? {
            // Checked at the first tool, for the position.
            if rules.is_empty() {
                crate::escalation::check_tool_rules_listed(&tool, self.0)
                    .map_err(de::Error::custom)?;
            }
            let rule = map.next_value()?;
            if rules.insert(tool.clone(), rule).is_some() {
                return Err(de::Error::custom(format!(
                    "tool_rules: \"{tool}\" is given twice"
                )));
            }
        }
        Ok(rules)
    }
}

struct AgentSpecVisitor<'k> {
    kinds: &'k [Option<String>],
    keys: &'static [&'static str],
}

impl<'de> Visitor<'de> for AgentSpecVisitor<'_> {
    type Value = (AgentSpec, Vec<(&'static str, serde_yaml::Value)>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an agent spec mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let listed: Vec<&str> = self.kinds.iter().flatten().map(String::as_str).collect();
        let mut id: Option<String> = None;
        let mut spec = AgentSpec::new("");
        let mut extra = Vec::new();
        let mut seen: Vec<&'static str> = Vec::new();
        while let Some(known) = map.next_key_seed(KeySeed(self.keys))? {
            if seen.contains(&known) {
                return Err(de::Error::duplicate_field(known));
            }
            seen.push(known);
            match known {
                "id" => id = Some(map.next_value()?),
                "model_id" => spec.model_id = map.next_value()?,
                "system_prompt" => spec.system_prompt = map.next_value()?,
                "max_rounds" => spec.max_rounds = map.next_value::<items::Rounds>()?.0,
                "plugin_ids" => spec.plugin_ids = map.next_value()?,
                "stop_conditions" => {
                    spec.stop_conditions = map.next_value_seed(ListSeed { kinds: self.kinds })?;
                }
                "tool_choice" => spec.tool_choice = map.next_value::<ToolChoice>()?,
                "context" => spec.context = Some(map.next_value()?),
                "escalation" => spec.escalation = map.next_value_seed(EscalationSeed(&listed))?,
                "tool_rules" => spec.tool_rules = map.next_value_seed(ToolRulesSeed(&listed))?,
                "subagents" => spec.subagents = map.next_value()?,
                "approvals" => spec.approvals = map.next_value()?,
                other => extra.push((other, map.next_value::<serde_yaml::Value>()?)),
            }
        }
        spec.id = id.ok_or_else(|| de::Error::missing_field("id"))?;
        Ok((spec, extra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(e: &ConfigError) -> (usize, usize) {
        (e.line().unwrap_or(0), e.column().unwrap_or(0))
    }

    #[test]
    fn every_variant_loads_from_the_documented_shape() {
        let specs = load_stop_conditions_yaml(
            "stop_conditions:\n\
             \x20 - { type: max_rounds, rounds: 10 }\n\
             \x20 - { type: timeout, seconds: 300 }\n\
             \x20 - { type: token_budget, max_total: 100000 }\n\
             \x20 - { type: consecutive_errors, max: 3 }\n\
             \x20 - { type: stop_on_tool, tool_name: finish }\n\
             \x20 - { type: content_match, pattern: \"(?i)done\" }\n\
             \x20 - { type: loop_detection, window: 3 }\n",
        )
        .unwrap();
        let kinds: Vec<&str> = specs.iter().map(StopConditionSpec::kind).collect();
        assert_eq!(kinds, STOP_CONDITION_TYPES[..7]);
    }

    #[test]
    fn a_misspelt_key_is_reported_at_the_key() {
        let e = load_stop_conditions_yaml(
            "- type: max_rounds\n  rounds: 2\n- type: timeout\n  secondz: 5\n",
        )
        .unwrap_err();
        assert_eq!(at(&e), (4, 3));
        assert_eq!(
            e.to_string(),
            "line 4, column 3: stop condition #2 (timeout): unknown field `secondz`, expected `type` or `seconds`"
        );
    }

    #[test]
    fn debug_reads_like_display_so_main_prints_the_message() {
        let e = load_stop_conditions_yaml("- type: timeout\n  secondz: 5\n")
            .unwrap_err()
            .with_path(Path::new("stop.yaml"));
        let shown = "stop.yaml: line 2, column 3: stop condition #1 (timeout): \
                     unknown field `secondz`, expected `type` or `seconds`";
        assert_eq!(e.to_string(), shown);
        assert_eq!(format!("{e:?}"), shown);
        assert_eq!(format!("{:?}", ConfigError::new("bad")), "bad");
        let fields = format!("{e:#?}");
        assert!(fields.starts_with("ConfigError {"), "{fields}");
        assert!(fields.contains("line: Some(\n        2,"), "{fields}");
    }

    #[test]
    fn out_of_range_values_are_reported_at_the_value() {
        let e = load_stop_conditions_yaml("- type: timeout\n  seconds: 90000\n").unwrap_err();
        assert_eq!(at(&e), (2, 12));
        assert!(e.message().contains("at most 86400"), "{e}");
        let e = load_stop_conditions_yaml("- {type: loop_detection, window: 1}").unwrap_err();
        assert!(e.message().contains("0 (disabled) or 2 to 64"), "{e}");
        let e =
            load_stop_conditions_yaml("- {type: token_budget, max_total: 1000000001}").unwrap_err();
        assert!(e.message().contains("at most 1000000000"), "{e}");
    }

    #[test]
    fn an_invalid_regex_is_reported_at_the_pattern() {
        let e =
            load_stop_conditions_yaml("- type: content_match\n  pattern: \"(open\"\n").unwrap_err();
        assert_eq!(at(&e), (2, 12));
        assert!(e.message().contains("invalid regex \"(open\""), "{e}");
    }

    #[test]
    fn an_unknown_type_is_reported_and_names_the_known_types() {
        let e = load_stop_conditions_yaml("- type: max_round\n  rounds: 3\n").unwrap_err();
        assert_eq!(at(&e).0, 1);
        assert!(
            e.message().contains(
                "unknown stop condition type \"max_round\"; expected one of: max_rounds,"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_missing_field_is_reported_at_the_item() {
        let e = load_stop_conditions_yaml("- type: max_rounds\n  rounds: 1\n- type: timeout\n")
            .unwrap_err();
        assert_eq!(at(&e), (3, 3));
        assert!(e.message().contains("missing field `seconds`"), "{e}");
        let e = load_stop_conditions_yaml("- rounds: 3\n").unwrap_err();
        assert!(e.message().contains("missing field `type`"), "{e}");
    }

    #[test]
    fn a_wrong_type_is_reported_at_the_value() {
        let e = load_stop_conditions_yaml("- type: max_rounds\n  rounds: lots\n").unwrap_err();
        assert_eq!(at(&e), (2, 11));
    }

    #[test]
    fn agent_specs_load_with_defaults_and_reject_unknown_keys() {
        let spec = load_agent_spec_yaml("id: triage\nmodel_id: m\n").unwrap();
        assert_eq!(spec.max_rounds, 16);
        assert!(spec.plugin_ids.is_empty());
        assert_eq!(spec.tool_choice, ToolChoice::Auto);
        let e = load_agent_spec_yaml("id: triage\nmax_round: 3\n").unwrap_err();
        assert_eq!(at(&e), (2, 1));
        let e = load_agent_spec_yaml("model_id: m\n").unwrap_err();
        assert!(e.message().contains("missing field `id`"), "{e}");
        let e =
            load_agent_spec_yaml("id: a\nstop_conditions:\n  - type: timeout\n    seconds: -1\n")
                .unwrap_err();
        assert_eq!(at(&e), (4, 14));
    }

    #[test]
    fn json_documents_load_too() {
        let specs = load_stop_conditions_yaml(r#"[{"type": "max_rounds", "rounds": 4}]"#).unwrap();
        assert_eq!(specs, [StopConditionSpec::MaxRounds { rounds: 4 }]);
        let spec =
            load_agent_spec_yaml(r#"{"id": "a", "tool_choice": {"tool": "search"}}"#).unwrap();
        assert_eq!(spec.tool_choice, ToolChoice::Tool("search".into()));
    }

    #[test]
    fn empty_documents_are_empty_lists_and_garbage_is_an_error() {
        assert!(load_stop_conditions_yaml("").unwrap().is_empty());
        assert!(load_stop_conditions_yaml("[").is_err());
        assert!(load_stop_conditions_yaml("42").is_err());
        assert!(load_agent_spec_yaml("- a").is_err());
    }
}
