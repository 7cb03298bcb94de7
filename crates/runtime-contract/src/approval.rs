//! Tool approvals: rules that let a call run, refuse it, or **park** the
//! run until a person decides — and the decisions that resume it.
//!
//! An agent's [`ApprovalRule`]s are read in order for each tool call; the
//! first whose tool and `when` match decides ([`ApprovalAction`]); no match
//! lets the call run. An `ask` call is not run: the round's other calls run,
//! then the run waits with the call listed as a [`PendingApproval`] until a
//! [`Decision`] arrives for every pending call (or a rule's timeout passes).
//! The same run then goes on, running exactly the approved (or edited)
//! arguments — no model request, and nothing before the gate, runs again.
//!
//! The same park serves questions the model asks through the built-in
//! `ask_user` tool ([`PendingKind::Question`]).
//!
//! ```
//! use rein_runtime_contract::approval::{ApprovalAction, ApprovalRule, Decision};
//!
//! let rule: ApprovalRule = serde_json::from_str(
//!     r#"{"tool": "fs__*", "when": {"path": "^/etc/"}, "action": "deny"}"#,
//! ).unwrap();
//! assert_eq!(rule.action, ApprovalAction::Deny);
//! assert!(rule.matches("fs__write_file", &serde_json::json!({"path": "/etc/passwd"})).unwrap());
//! assert!(!rule.matches("fs__write_file", &serde_json::json!({"path": "/tmp/x"})).unwrap());
//!
//! let d: Decision = serde_json::from_str(r#"{"decision": "reject", "reason": "not today"}"#).unwrap();
//! assert_eq!(d.name(), "reject");
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde::{Deserialize, Serialize};

/// What a matching rule does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalAction {
    /// The call runs.
    Allow,
    /// The call waits for a person's decision.
    Ask,
    /// The call is not run; the model is told a rule denied it.
    Deny,
}

/// What happens when an `ask` rule's timeout passes without a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The call is answered `not run: no decision within N s`; the run goes on.
    #[default]
    Reject,
    /// The run ends `stopped(approval_timeout)`.
    Stop,
}

/// One approval rule of an agent (`approvals:` in YAML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ApprovalRule {
    /// A tool name, or a glob where `*` matches any run of characters.
    pub tool: String,
    /// Top-level argument name → regex matched against its value (a
    /// string, or the JSON text of any other value); every entry must
    /// match (an absent argument does not).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub when: BTreeMap<String, String>,
    /// What the rule does.
    pub action: ApprovalAction,
    /// For `ask`: how long a decision may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// For `ask`: what a timeout does (default `reject`).
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

/// A rule that cannot be used, naming the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("approval rule for tool \"{tool}\": {message}")]
pub struct RuleError {
    /// The rule's `tool`.
    pub tool: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ApprovalRule {
    /// A rule for `tool` (a name or a `*` glob) with `action`.
    pub fn new(tool: impl Into<String>, action: ApprovalAction) -> Self {
        Self {
            tool: tool.into(),
            when: BTreeMap::new(),
            action,
            timeout_seconds: None,
            on_timeout: OnTimeout::Reject,
        }
    }

    /// Adds an argument matcher: `argument`'s value must match `regex`.
    pub fn when(mut self, argument: impl Into<String>, regex: impl Into<String>) -> Self {
        self.when.insert(argument.into(), regex.into());
        self
    }

    /// Sets the timeout of an `ask` rule and what it does.
    pub fn with_timeout(mut self, seconds: u64, on_timeout: OnTimeout) -> Self {
        self.timeout_seconds = Some(seconds);
        self.on_timeout = on_timeout;
        self
    }

    /// Whether the rule's `tool` pattern matches the tool `name`.
    pub fn matches_tool(&self, name: &str) -> bool {
        glob_matches(&self.tool, name)
    }

    /// Checks the rule: its regexes compile, its timeout is positive and
    /// only on an `ask` rule.
    ///
    /// # Errors
    /// A [`RuleError`] naming the bad field.
    pub fn check(&self) -> Result<(), RuleError> {
        self.compiled().map(drop)
    }

    /// Whether the rule decides a call of `tool` with `arguments`.
    ///
    /// # Errors
    /// A [`RuleError`] when a `when` regex does not compile.
    pub fn matches(&self, tool: &str, arguments: &serde_json::Value) -> Result<bool, RuleError> {
        Ok(self.compiled()?.matches(tool, arguments))
    }

    /// The rule with its regexes compiled.
    ///
    /// # Errors
    /// A [`RuleError`] naming the bad field.
    pub fn compiled(&self) -> Result<CompiledRule, RuleError> {
        let error = |message: String| RuleError {
            tool: self.tool.clone(),
            message,
        };
        if self.tool.is_empty() {
            return Err(error(
                "`tool` is empty; name a tool or a glob such as \"fs__*\"".into(),
            ));
        }
        if self.timeout_seconds == Some(0) {
            return Err(error(
                "`timeout_seconds` is 0; use a positive number of seconds or leave it out".into(),
            ));
        }
        if self.action != ApprovalAction::Ask && self.timeout_seconds.is_some() {
            return Err(error(format!(
                "`timeout_seconds` applies only to `action: ask` (this rule is `{}`)",
                action_name(self.action)
            )));
        }
        let mut when = Vec::with_capacity(self.when.len());
        for (argument, pattern) in &self.when {
            let regex = Regex::new(pattern).map_err(|e| {
                error(format!(
                    "`when.{argument}` is not a valid regex ({pattern:?}): {e}"
                ))
            })?;
            when.push((argument.clone(), regex));
        }
        Ok(CompiledRule {
            rule: self.clone(),
            when,
        })
    }

    /// A short description, e.g. `ask fs__* when path =~ ^/etc/`.
    pub fn describe(&self) -> String {
        let mut text = format!("{} {}", action_name(self.action), self.tool);
        for (i, (argument, pattern)) in self.when.iter().enumerate() {
            text.push_str(if i == 0 { " when " } else { ", " });
            text.push_str(&format!("{argument} =~ {pattern}"));
        }
        text
    }
}

/// An [`ApprovalRule`] ready to match calls.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    /// The rule.
    pub rule: ApprovalRule,
    when: Vec<(String, Regex)>,
}

impl CompiledRule {
    /// Whether the rule decides a call of `tool` with `arguments`.
    pub fn matches(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        self.rule.matches_tool(tool)
            && self
                .when
                .iter()
                .all(|(argument, regex)| match arguments.get(argument) {
                    Some(serde_json::Value::String(s)) => regex.is_match(s),
                    Some(other) => regex.is_match(&other.to_string()),
                    None => false,
                })
    }
}

/// The name of `action` as written in YAML.
pub fn action_name(action: ApprovalAction) -> &'static str {
    match action {
        ApprovalAction::Allow => "allow",
        ApprovalAction::Ask => "ask",
        ApprovalAction::Deny => "deny",
    }
}

/// Whether `pattern` (where `*` matches any run of characters, and every
/// other character itself) matches all of `name`.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What a pending entry waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A tool call an `ask` rule holds.
    #[default]
    Approval,
    /// A question the model asked through `ask_user`; answered with `respond`.
    Question,
    /// A detector's `escalate` step: `tool` is the detector's code and
    /// `arguments` `{code, detail}`; answered with `continue`, `stop` or
    /// `take_over`.
    Escalation,
}

/// One call a parked run waits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct PendingApproval {
    /// The tool call (also the approval's id within its run).
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments the model gave.
    pub arguments: serde_json::Value,
    /// What it waits for.
    #[serde(default)]
    pub kind: PendingKind,
    /// The run it belongs to.
    pub run_id: String,
    /// That run's thread.
    pub thread_id: String,
    /// The rule that asked (`ask fs__* …`), for an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// When a rule's timeout passes (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// For a question: the question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// For a question: the answers offered, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// The root run of the tree, when the call is a sub-agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
}

impl PendingApproval {
    /// A pending approval of `call_id` (`tool` with `arguments`) in run
    /// `run_id` on `thread_id`.
    pub fn new(
        run_id: impl Into<String>,
        thread_id: impl Into<String>,
        call_id: impl Into<String>,
        tool: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            tool: tool.into(),
            arguments,
            kind: PendingKind::Approval,
            run_id: run_id.into(),
            thread_id: thread_id.into(),
            rule: None,
            expires_at: None,
            question: None,
            options: Vec::new(),
            root_run_id: None,
        }
    }
}

/// A person's decision on one pending call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Decision {
    /// Run the call with the model's arguments.
    Approve,
    /// Do not run it; the model gets `not run: rejected: <reason>`.
    Reject {
        /// Why, shown to the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Run it with these arguments instead.
    Edit {
        /// The arguments that run.
        arguments: serde_json::Value,
    },
    /// Do not run it; this is its result (the answer to a question).
    Respond {
        /// The result the model sees (a string as is, anything else as JSON).
        result: serde_json::Value,
    },
    /// An escalation: the run goes on (with `message` as a user message
    /// before the next inference, if given).
    Continue {
        /// What the model is told.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// An escalation: the run ends with the detector's code.
    Stop,
    /// An escalation: the run ends `stopped(taken_over)`; the person goes
    /// on with the thread.
    TakeOver,
}

impl Decision {
    /// `approve`, `reject`, `edit` or `respond`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject { .. } => "reject",
            Self::Edit { .. } => "edit",
            Self::Respond { .. } => "respond",
            Self::Continue { .. } => "continue",
            Self::Stop => "stop",
            Self::TakeOver => "take_over",
        }
    }
}

/// Who took a decision, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Decider {
    /// Who decided: an API token's name, `rein run`, or a name the library
    /// caller gave; `None` when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When (RFC 3339, UTC).
    pub at: String,
}

impl Decider {
    /// A decision taken now by `by`.
    pub fn now(by: Option<&str>) -> Self {
        Self {
            by: by.map(str::to_owned),
            at: rfc3339(SystemTime::now()),
        }
    }
}

/// `at` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-27T17:05:09.120Z`.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The instant an [`rfc3339`] text names (`YYYY-MM-DDTHH:MM:SS[.mmm]Z`);
/// `None` for any other form.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, millis) = match time.split_once('.') {
        Some((hms, frac)) => (hms, format!("{frac:0<3}").get(..3)?.parse::<u64>().ok()?),
        None => (time, 0),
    };
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days since 1970-01-01 from a civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(
        UNIX_EPOCH + Duration::from_millis((days * 86_400 + h * 3600 + m * 60 + s) * 1000 + millis),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_matches("shell", "shell"));
        assert!(!glob_matches("shell", "shell2"));
        assert!(glob_matches("fs__*", "fs__write_file"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("*_file", "write_file"));
        assert!(glob_matches("a*b*c", "a-b-b-c"));
        assert!(!glob_matches("a*b*c", "a-c-b"));
        assert!(!glob_matches("ab*ba", "aba"));
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_798_509_120);
        assert_eq!(rfc3339(at), "2026-11-27T16:55:09.120Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
        for at in [at, UNIX_EPOCH, leap] {
            assert_eq!(parse_rfc3339(&rfc3339(at)), Some(at));
        }
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
    }

    #[test]
    fn non_string_arguments_match_as_json_text() {
        let rule = ApprovalRule::new("pay", ApprovalAction::Ask).when("amount", "^[0-9]{4,}$");
        assert!(
            rule.matches("pay", &serde_json::json!({"amount": 12000}))
                .unwrap()
        );
        assert!(
            !rule
                .matches("pay", &serde_json::json!({"amount": 12}))
                .unwrap()
        );
        assert!(!rule.matches("pay", &serde_json::json!({})).unwrap());
    }

    #[test]
    fn a_bad_regex_and_a_timeout_on_deny_are_named() {
        let bad = ApprovalRule::new("x", ApprovalAction::Ask).when("path", "(");
        assert!(bad.check().unwrap_err().message.contains("`when.path`"));
        let mut deny = ApprovalRule::new("x", ApprovalAction::Deny);
        deny.timeout_seconds = Some(5);
        assert!(
            deny.check()
                .unwrap_err()
                .message
                .contains("only to `action: ask`")
        );
    }
}
