//! The plain structs stop-condition items deserialize into once their
//! `type` is known: `deny_unknown_fields`, accepting `type`, with range checks
//! inside visitors so errors point at the offending value.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MaxRounds {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) rounds: Rounds,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Timeout {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) seconds: Seconds,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenBudget {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) max_total: Budget,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConsecutiveErrors {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) max: ErrorCount,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StopOnTool {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) tool_name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ContentMatch {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) pattern: Pattern,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LoopDetection {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) window: Window,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolCallLoop {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    #[serde(default = "Threshold::default_tool_calls")]
    pub(super) threshold: Threshold,
    #[serde(default = "Cycle::default_cycle")]
    pub(super) max_cycle: Cycle,
    #[serde(default)]
    pub(super) on_detect: OnDetect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolErrorLoop {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    #[serde(default = "Threshold::default_tool_errors")]
    pub(super) threshold: Threshold,
    #[serde(default)]
    pub(super) on_detect: OnDetect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolCallCycle {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) cycle: CycleLength,
    #[serde(default = "Threshold::default_tool_calls")]
    pub(super) threshold: Threshold,
    #[serde(default)]
    pub(super) on_detect: OnDetect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ContentChanting {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    #[serde(default = "ChunkChars::default_chunk")]
    pub(super) chunk_chars: ChunkChars,
    #[serde(default = "Threshold::default_chanting")]
    pub(super) threshold: Threshold,
    #[serde(default)]
    pub(super) on_detect: OnDetect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Stuck {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    #[serde(default = "Duplicates::default_duplicates")]
    pub(super) duplicates: Duplicates,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ErrorRate {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) errors: RateErrors,
    pub(super) within_seconds: Seconds,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoProgress {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) rounds: StaleRounds,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AwaitingUser {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    #[serde(default = "AutoNudges::default_nudges")]
    pub(super) auto_nudges: AutoNudges,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LlmLoopCheck {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) model_id: ModelId,
    #[serde(default = "CheckRounds::default_after")]
    pub(super) after_rounds: CheckRounds,
    #[serde(default = "CheckInterval::default_interval")]
    pub(super) interval: CheckInterval,
    #[serde(default = "CheckInterval::default_min")]
    pub(super) min_interval: CheckInterval,
    #[serde(default = "CheckInterval::default_max")]
    pub(super) max_interval: CheckInterval,
    #[serde(default)]
    pub(super) threshold: ConfidenceItem,
    #[serde(default = "CheckHistory::default_history")]
    pub(super) history: CheckHistory,
    #[serde(default = "MaxChecks::default_checks")]
    pub(super) max_checks: MaxChecks,
    #[serde(default)]
    pub(super) on_detect: OnDetect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskComplete {
    #[serde(rename = "type")]
    _type: de::IgnoredAny,
    pub(super) model_id: ModelId,
    #[serde(default = "CheckEvery::default_every")]
    pub(super) every: CheckEvery,
    #[serde(default)]
    pub(super) threshold: ConfidenceItem,
    #[serde(default = "CheckHistory::default_history")]
    pub(super) history: CheckHistory,
    #[serde(default = "MaxChecks::default_checks")]
    pub(super) max_checks: MaxChecks,
}

impl CheckRounds {
    fn default_after() -> Self {
        Self(30)
    }
}

impl CheckInterval {
    fn default_interval() -> Self {
        Self(10)
    }
    fn default_min() -> Self {
        Self(5)
    }
    fn default_max() -> Self {
        Self(15)
    }
}

impl CheckEvery {
    fn default_every() -> Self {
        Self(0)
    }
}

impl CheckHistory {
    fn default_history() -> Self {
        Self(20)
    }
}

impl MaxChecks {
    fn default_checks() -> Self {
        Self(10)
    }
}

/// A judging model's id: not empty.
pub(super) struct ModelId(pub(super) String);

impl<'de> Deserialize<'de> for ModelId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let id = String::deserialize(d)?;
        if id.trim().is_empty() {
            return Err(de::Error::custom(
                "model_id is empty; name a registered model (the judging model)",
            ));
        }
        Ok(Self(id))
    }
}

/// A confidence threshold from 0 to 1 (default 0.9).
#[derive(Default)]
pub(super) struct ConfidenceItem(pub(super) crate::lifecycle::Confidence);

impl<'de> Deserialize<'de> for ConfidenceItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ConfidenceItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a confidence from 0 to 1")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ConfidenceItem, E> {
                if (0.0..=1.0).contains(&v) {
                    Ok(ConfidenceItem(crate::lifecycle::Confidence(v)))
                } else {
                    Err(E::custom(format!(
                        "{v} is out of range: threshold must be from 0 to 1"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfidenceItem, E> {
                #[allow(clippy::cast_precision_loss, reason = "only 0 and 1 are in range")]
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ConfidenceItem, E> {
                #[allow(clippy::cast_precision_loss, reason = "only 0 and 1 are in range")]
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_f64(V)
    }
}

impl AutoNudges {
    fn default_nudges() -> Self {
        Self(2)
    }
}

impl Duplicates {
    fn default_duplicates() -> Self {
        Self(2)
    }
}

impl Threshold {
    fn default_tool_calls() -> Self {
        Self(5)
    }
    fn default_tool_errors() -> Self {
        Self(3)
    }
    fn default_chanting() -> Self {
        Self(10)
    }
}

impl Cycle {
    fn default_cycle() -> Self {
        Self(5)
    }
}

impl ChunkChars {
    fn default_chunk() -> Self {
        Self(50)
    }
}

/// Only the `type` field, to report an unknown or missing type.
#[derive(Deserialize)]
pub(super) struct TypeOnly {
    #[serde(rename = "type")]
    _type: KnownType,
}

struct KnownType;

impl<'de> Deserialize<'de> for KnownType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KnownTypeVisitor)
    }
}

struct KnownTypeVisitor;

impl Visitor<'_> for KnownTypeVisitor {
    type Value = KnownType;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stop condition type")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KnownType, E> {
        Err(E::custom(format!(
            "unknown stop condition type \"{v}\"; expected one of: {}",
            STOP_CONDITION_TYPES.join(", ")
        )))
    }
}

/// Defines a newtype whose visitor checks an unsigned value.
macro_rules! checked_uint {
    ($name:ident, $ty:ty, $what:literal, |$v:ident| $ok:expr, $rule:literal) => {
        pub(super) struct $name(pub(super) $ty);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_u64<E: de::Error>(self, $v: u64) -> Result<$name, E> {
                        if $ok {
                            <$ty>::try_from($v)
                                .map($name)
                                .map_err(|_| E::custom(format!("{} is too large", $v)))
                        } else {
                            Err(E::custom(format!("{} is out of range: {}", $v, $rule)))
                        }
                    }
                    fn visit_i64<E: de::Error>(self, v: i64) -> Result<$name, E> {
                        match u64::try_from(v) {
                            Ok(v) => self.visit_u64(v),
                            Err(_) => Err(E::custom(format!("{v} is out of range: {}", $rule))),
                        }
                    }
                }
                d.deserialize_u64(V)
            }
        }
    };
}

checked_uint!(
    Seconds,
    u64,
    "a number of seconds",
    |v| v <= MAX_TIMEOUT_SECONDS,
    "timeout seconds must be at most 86400 (24 h); 0 disables"
);
checked_uint!(
    Budget,
    usize,
    "a number of tokens",
    |v| v <= MAX_TOKEN_BUDGET,
    "max_total must be at most 1000000000; 0 disables"
);
checked_uint!(
    Window,
    usize,
    "a window size",
    |v| v == 0 || (2..=MAX_LOOP_WINDOW as u64).contains(&v),
    "window must be 0 (disabled) or 2 to 64"
);

checked_uint!(
    Threshold,
    usize,
    "a repetition count",
    |v| v == 0 || (2..=MAX_THRESHOLD as u64).contains(&v),
    "threshold must be 0 (disabled) or 2 to 1000"
);
checked_uint!(
    Rounds,
    usize,
    "a number of rounds",
    |v| v <= MAX_ROUNDS as u64,
    "rounds must be at most 1000000; 0 disables (unbounded)"
);
checked_uint!(
    ErrorCount,
    usize,
    "a number of errors",
    |v| v <= MAX_CONSECUTIVE_ERRORS as u64,
    "max must be at most 1000000; 0 disables"
);
checked_uint!(
    Duplicates,
    usize,
    "a number of earlier duplicates",
    |v| v <= MAX_STUCK_DUPLICATES as u64,
    "duplicates must be at most 63 (a run remembers its last 64 answers); 0 disables"
);
checked_uint!(
    RateErrors,
    usize,
    "a number of errors",
    |v| v <= MAX_ERROR_RATE_ERRORS as u64,
    "errors must be at most 1000; 0 disables"
);
checked_uint!(
    StaleRounds,
    usize,
    "a number of rounds",
    |v| v <= MAX_NO_PROGRESS_ROUNDS as u64,
    "rounds must be at most 1000; 0 disables"
);
checked_uint!(
    AutoNudges,
    usize,
    "a number of nudges",
    |v| v <= MAX_AUTO_NUDGES as u64,
    "auto_nudges must be at most 100"
);
checked_uint!(
    Cycle,
    usize,
    "a cycle length",
    |v| v <= MAX_CYCLE as u64,
    "max_cycle must be 0 (disabled) or 1 to 16"
);
checked_uint!(
    CycleLength,
    usize,
    "a cycle length",
    |v| v <= MAX_CYCLE as u64,
    "cycle must be 0 (disabled) or 1 to 16"
);
checked_uint!(
    ChunkChars,
    usize,
    "a chunk length",
    |v| v == 0 || (MIN_CHUNK_CHARS as u64..=MAX_CHUNK_CHARS as u64).contains(&v),
    "chunk_chars must be 0 (disabled) or 8 to 1000"
);

pub(super) struct Pattern(pub(super) String);

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor)
    }
}

struct PatternVisitor;

impl Visitor<'_> for PatternVisitor {
    type Value = Pattern;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a regular expression")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Pattern, E> {
        let chars = v.chars().count();
        if chars > MAX_PATTERN_CHARS {
            return Err(E::custom(format!(
                "the pattern is {chars} characters long; at most {MAX_PATTERN_CHARS} are accepted"
            )));
        }
        if !v.is_empty() {
            regex::Regex::new(v).map_err(|e| E::custom(format!("invalid regex \"{v}\": {e}")))?;
        }
        Ok(Pattern(v.to_owned()))
    }
}
checked_uint!(
    CheckRounds,
    usize,
    "a number of rounds",
    |v| (1..=MAX_ROUNDS as u64).contains(&v),
    "after_rounds must be 1 to 1000000"
);
checked_uint!(
    CheckInterval,
    usize,
    "a number of rounds",
    |v| (1..=MAX_CHECK_INTERVAL as u64).contains(&v),
    "an interval must be 1 to 1000 rounds"
);
checked_uint!(
    CheckEvery,
    usize,
    "a number of rounds",
    |v| v <= MAX_CHECK_INTERVAL as u64,
    "every must be at most 1000 rounds; 0 judges final answers only"
);
checked_uint!(
    CheckHistory,
    usize,
    "a number of messages",
    |v| (2..=MAX_CHECK_HISTORY as u64).contains(&v),
    "history must be 2 to 200 messages"
);
checked_uint!(
    MaxChecks,
    usize,
    "a number of checks",
    |v| v <= MAX_CHECKS as u64,
    "max_checks must be at most 1000; 0 disables"
);
