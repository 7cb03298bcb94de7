//! The automation policy: numeric goals, budgets and whether the text
//! heuristics apply. Loads from JSON or YAML with the source document's
//! camelCase keys, as the bare policy or as `{ "automation_policy": … }`.

use std::fmt;

use rein_runtime_contract::config::ConfigError;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// How several goals combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum Logic {
    /// Every goal must be met (default).
    #[default]
    #[serde(rename = "AND")]
    And,
    /// Any goal suffices.
    #[serde(rename = "OR")]
    Or,
}

impl<'de> Deserialize<'de> for Logic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Logic;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"AND\" or \"OR\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Logic, E> {
                match v.to_ascii_uppercase().as_str() {
                    "AND" => Ok(Logic::And),
                    "OR" => Ok(Logic::Or),
                    _ => Err(E::custom(format!(
                        "invalid logic \"{v}\"; expected \"AND\" or \"OR\""
                    ))),
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// A comparison of a goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Operator {
    /// `>`
    #[serde(rename = ">")]
    Gt,
    /// `>=`
    #[serde(rename = ">=")]
    Ge,
    /// `<`
    #[serde(rename = "<")]
    Lt,
    /// `<=`
    #[serde(rename = "<=")]
    Le,
    /// `==`
    #[serde(rename = "==")]
    Eq,
}

impl Operator {
    /// Whether `actual <op> target`.
    pub fn holds(self, actual: f64, target: f64) -> bool {
        match self {
            Self::Gt => actual > target,
            Self::Ge => actual >= target,
            Self::Lt => actual < target,
            Self::Le => actual <= target,
            Self::Eq => actual == target,
        }
    }

    /// The operator's symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Eq => "==",
        }
    }
}

impl<'de> Deserialize<'de> for Operator {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Operator;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("one of >, >=, <, <=, ==")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Operator, E> {
                Ok(match v {
                    ">" => Operator::Gt,
                    ">=" => Operator::Ge,
                    "<" => Operator::Lt,
                    "<=" => Operator::Le,
                    "==" => Operator::Eq,
                    other => {
                        return Err(E::custom(format!(
                            "invalid operator \"{other}\"; expected one of >, >=, <, <=, =="
                        )));
                    }
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A numeric goal on a reported metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    /// The metric's name, matched exactly (case and spaces significant).
    pub metric: String,
    /// The comparison.
    pub operator: Operator,
    /// The threshold.
    pub value: f64,
}

impl Goal {
    /// Whether the goal holds for this metric value.
    pub fn holds(&self, actual: f64) -> bool {
        self.operator.holds(actual, self.value)
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.metric,
            self.operator.symbol(),
            self.value
        )
    }
}

fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V(&'static str);
    impl<'de> Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a positive integer or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            if v == 0 {
                Err(E::custom(format!(
                    "{} must be a positive integer or null, got 0",
                    self.0
                )))
            } else {
                Ok(Some(v))
            }
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::custom(format!(
                    "{} must be a positive integer or null, got {v}",
                    self.0
                ))),
            }
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(E::custom(format!(
                "{} must be a positive integer or null, got {v}",
                self.0
            )))
        }
    }
    d.deserialize_option(V("the budget"))
}

/// When auto mode stops, besides the round ceiling and the guardrail.
///
/// JSON/YAML keys follow the source document: `logic`, `goals`,
/// `maxExperiments`, `maxTokens`, `strictHeuristics`.
///
/// ```
/// use rein_runtime::auto::AutomationPolicy;
///
/// let policy = AutomationPolicy::from_json(r#"{
///   "automation_policy": {
///     "logic": "AND",
///     "goals": [{ "metric": "Mean R", "operator": ">", "value": 0.8 }],
///     "maxExperiments": 30,
///     "maxTokens": 2000000,
///     "strictHeuristics": true
///   }
/// }"#).unwrap().expect("a policy");
/// assert_eq!(policy.max_experiments, Some(30));
/// assert!(AutomationPolicy::from_json(r#"{"automation_policy": null}"#).unwrap().is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct AutomationPolicy {
    /// How goals combine (default AND).
    #[serde(default)]
    pub logic: Logic,
    /// Numeric goals on the latest completed report.
    #[serde(default)]
    pub goals: Vec<Goal>,
    /// Stop after this many completed experiments.
    #[serde(
        default,
        deserialize_with = "positive",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_experiments: Option<u64>,
    /// Stop once the thread's session has used this many tokens.
    #[serde(
        default,
        deserialize_with = "positive",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_tokens: Option<u64>,
    /// Whether the text heuristics apply (absent = true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_heuristics: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    automation_policy: Option<AutomationPolicy>,
}

impl AutomationPolicy {
    /// Whether the text heuristics apply (`strictHeuristics`, default true).
    pub fn strict_heuristics(&self) -> bool {
        self.strict_heuristics.unwrap_or(true)
    }

    /// "No policy", as the source defines it: no goals, and
    /// `maxExperiments`, `maxTokens` and `strictHeuristics` all absent
    /// (`logic` alone does not make a policy).
    pub fn is_empty(&self) -> bool {
        self.goals.is_empty()
            && self.max_experiments.is_none()
            && self.max_tokens.is_none()
            && self.strict_heuristics.is_none()
    }

    fn normalize(policy: Option<Self>) -> Option<Self> {
        policy.filter(|p| !p.is_empty())
    }

    /// Loads a policy from JSON: the policy itself (or `null`), or the
    /// document form `{ "automation_policy": <policy or null> }`. `None`
    /// means "no policy".
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] with line and column for invalid JSON, unknown or
    /// misspelt keys, an invalid `logic` or operator, or a budget that is
    /// not a positive integer.
    pub fn from_json(text: &str) -> Result<Option<Self>, ConfigError> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
        let policy = if is_document(
            value
                .as_object()
                .map(|m| m.contains_key("automation_policy")),
        ) {
            serde_json::from_str::<Document>(text)
                .map_err(json_error)?
                .automation_policy
        } else {
            serde_json::from_str::<Option<Self>>(text).map_err(json_error)?
        };
        Ok(Self::normalize(policy))
    }

    /// Loads a policy from YAML (JSON is YAML too), in either form.
    ///
    /// # Errors
    ///
    /// As for [`from_json`](Self::from_json).
    pub fn from_yaml(text: &str) -> Result<Option<Self>, ConfigError> {
        let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_error)?;
        let policy = if is_document(
            value
                .as_mapping()
                .map(|m| m.contains_key("automation_policy")),
        ) {
            serde_yaml::from_str::<Document>(text)
                .map_err(yaml_error)?
                .automation_policy
        } else {
            serde_yaml::from_str::<Option<Self>>(text).map_err(yaml_error)?
        };
        Ok(Self::normalize(policy))
    }
}

fn is_document(has_key: Option<bool>) -> bool {
    has_key == Some(true)
}

fn json_error(e: serde_json::Error) -> ConfigError {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
    if e.line() == 0 {
        ConfigError::new(message)
    } else {
        ConfigError::at(
            format!("automation policy: {message}"),
            e.line(),
            e.column(),
        )
    }
}

fn yaml_error(e: serde_yaml::Error) -> ConfigError {
    let text = e.to_string();
    match e.location() {
        Some(loc) => {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            let message = text.strip_suffix(&suffix).unwrap_or(&text);
            ConfigError::at(
                format!("automation policy: {message}"),
                loc.line(),
                loc.column(),
            )
        }
        None => ConfigError::new(format!("automation policy: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The five policy examples of the source document, verbatim.
    pub(crate) const SEED_EXAMPLES: [&str; 5] = [
        r#"{
"automation_policy": {
"logic": "AND",
"goals": [
{ "metric": "Mean R", "operator": ">", "value": 0.8 },
{ "metric": "Val ACC", "operator": ">=", "value": 0.92 }
],
"maxExperiments": 30,
"maxTokens": 2000000,
"strictHeuristics": true
}
}"#,
        r#"{
"automation_policy": {
"logic": "AND",
"goals": [],
"maxExperiments": 50,
"maxTokens": 5000000,
"strictHeuristics": false
}
}"#,
        r#"{
"automation_policy": {
"logic": "AND",
"goals": [
{ "metric": "Val ACC", "operator": ">=", "value": 0.95 },
{ "metric": "Val Loss", "operator": "<", "value": 0.15 }
],
"maxExperiments": 50,
"maxTokens": 5000000,
"strictHeuristics": false
}
}"#,
        r#"{
"automation_policy": {
"logic": "OR",
"goals": [
{ "metric": "AUC", "operator": ">", "value": 0.9 },
{ "metric": "F1", "operator": ">", "value": 0.85 }
],
"maxExperiments": 20,
"strictHeuristics": true
}
}"#,
        r#"{
"automation_policy": {
"maxTokens": 1000000,
"strictHeuristics": true
}
}"#,
    ];

    #[test]
    fn the_source_documents_examples_load_unchanged_from_json_and_yaml() {
        for example in SEED_EXAMPLES {
            let json = AutomationPolicy::from_json(example)
                .unwrap()
                .expect("a policy");
            let yaml = AutomationPolicy::from_yaml(example)
                .unwrap()
                .expect("a policy");
            assert_eq!(json, yaml);
        }
        let first = AutomationPolicy::from_json(SEED_EXAMPLES[0])
            .unwrap()
            .unwrap();
        assert_eq!(first.goals[0].to_string(), "Mean R > 0.8");
        assert_eq!(first.max_tokens, Some(2_000_000));
        let or = AutomationPolicy::from_json(SEED_EXAMPLES[3])
            .unwrap()
            .unwrap();
        assert_eq!(or.logic, Logic::Or);
        assert!(or.strict_heuristics());
        let budget = AutomationPolicy::from_json(SEED_EXAMPLES[4])
            .unwrap()
            .unwrap();
        assert!(budget.goals.is_empty());
        assert_eq!(budget.logic, Logic::And);
    }

    #[test]
    fn null_and_all_empty_fields_mean_no_policy() {
        for text in [
            "null",
            r#"{"automation_policy": null}"#,
            "{}",
            r#"{"logic": "OR", "goals": []}"#,
            r#"{"automation_policy": {"logic": "and"}}"#,
            "automation_policy:\n",
        ] {
            assert_eq!(AutomationPolicy::from_yaml(text).unwrap(), None, "{text}");
        }
        assert!(
            AutomationPolicy::from_json(r#"{"strictHeuristics": true}"#)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn logic_is_case_insensitive_and_yaml_bare_policies_load() {
        let p = AutomationPolicy::from_yaml(
            "logic: or\ngoals:\n  - {metric: F1, operator: '>=', value: 0.5}\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.logic, Logic::Or);
        assert_eq!(p.goals[0].operator, Operator::Ge);
    }

    #[test]
    fn invalid_values_and_unknown_keys_are_clear_errors_with_positions() {
        let e = AutomationPolicy::from_json(
            "{\n  \"goals\": [{\"metric\": \"F1\", \"operator\": \"=>\", \"value\": 1}]\n}",
        )
        .unwrap_err();
        assert!(
            e.message()
                .contains("invalid operator \"=>\"; expected one of >, >=, <, <=, =="),
            "{e}"
        );
        assert_eq!(e.line(), Some(2));
        let e = AutomationPolicy::from_json(r#"{"maxExperiments": 0}"#).unwrap_err();
        assert!(
            e.message()
                .contains("must be a positive integer or null, got 0"),
            "{e}"
        );
        let e = AutomationPolicy::from_json(r#"{"maxTokens": -5}"#).unwrap_err();
        assert!(e.message().contains("got -5"), "{e}");
        let e = AutomationPolicy::from_json(r#"{"maxToken": 5}"#).unwrap_err();
        assert!(e.message().contains("unknown field `maxToken`"), "{e}");
        let e = AutomationPolicy::from_yaml("automation_policy:\n  logic: XOR\n").unwrap_err();
        assert!(e.message().contains("invalid logic \"XOR\""), "{e}");
        assert_eq!(e.line(), Some(2));
        let e =
            AutomationPolicy::from_json(r#"{"automation_policy": {}, "extra": 1}"#).unwrap_err();
        assert!(e.message().contains("unknown field `extra`"), "{e}");
    }

    #[test]
    fn operators_compare_as_written() {
        let cases = [
            (Operator::Gt, 1.0, 1.0, false),
            (Operator::Gt, 1.1, 1.0, true),
            (Operator::Ge, 1.0, 1.0, true),
            (Operator::Lt, 0.9, 1.0, true),
            (Operator::Lt, 1.0, 1.0, false),
            (Operator::Le, 1.0, 1.0, true),
            (Operator::Eq, 1.0, 1.0, true),
            (Operator::Eq, 1.0, 1.0001, false),
        ];
        for (op, actual, target, expected) in cases {
            assert_eq!(
                op.holds(actual, target),
                expected,
                "{actual} {} {target}",
                op.symbol()
            );
        }
    }
}
