//! The context policy: how a run keeps the prompt inside the model's
//! window (`AgentSpec::context`).
//!
//! Without a policy the runtime sends the whole history every round, as it
//! always did. With one, it keeps a second view of the history — what the
//! model sees — next to the stored one, and manages that view:
//!
//! - **offload**: a tool result over `offload.min_tokens` is kept in an
//!   artifact store and shown to the model as a short reference with a
//!   preview; the built-in `read_artifact` tool reads the rest;
//! - **compact**: over `compact.at` of the usable window, older tool results
//!   (outside the last `keep_last_rounds` rounds) become references too,
//!   and older calls of tools with a compact form keep only the arguments
//!   it names (the rest become a reference); `compact.fraction` of them per
//!   step, oldest first, until the prompt is under `compact.at`;
//! - **summarize**: still over `summarize.at`, older rounds are replaced by
//!   a summary the model writes.
//!
//! The usable window is `window_tokens - reserve_output_tokens`. The stored
//! history always keeps every message in full.
//!
//! In YAML (an agent's `context:` key), every key is checked where it
//! stands:
//!
//! ```
//! use rein_runtime_contract::config::load_agent_spec_yaml;
//!
//! let spec = load_agent_spec_yaml(
//!     "id: researcher\n\
//!      model_id: m\n\
//!      context:\n\
//!      \x20 window_tokens: 8192\n\
//!      \x20 reserve_output_tokens: 1024\n\
//!      \x20 offload: { min_tokens: 500 }\n\
//!      \x20 compact: { at: 0.7, keep_last_rounds: 2 }\n\
//!      \x20 summarize: { at: 0.85 }\n",
//! )
//! .unwrap();
//! let context = spec.context.unwrap();
//! assert_eq!(context.usable_tokens(), 7168);
//! assert_eq!(context.compact.unwrap().keep_last_rounds, 2);
//! ```

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// The largest `window_tokens` accepted (10 M).
pub const MAX_WINDOW_TOKENS: u64 = 10_000_000;

/// An agent's context policy. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawPolicy")]
#[non_exhaustive]
pub struct ContextPolicy {
    /// The model's context window, in tokens.
    pub window_tokens: u64,
    /// Tokens kept free for the answer. Default 0 (the model's
    /// `max_output_tokens`, when set, is reserved as well).
    #[serde(default)]
    pub reserve_output_tokens: u64,
    /// Offloading of large tool results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadPolicy>,
    /// Compaction of older tool results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact: Option<CompactPolicy>,
    /// Summary of older rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarize: Option<SummarizePolicy>,
}

impl ContextPolicy {
    /// A policy for a window of `window_tokens`, with nothing reserved and
    /// no offloading, compaction or summary. The window then only sizes
    /// the `prompt_estimated` events and the numbers of a `context_window`
    /// stop: a prompt over it is still sent (the estimate may be off; the
    /// provider decides), and a provider's context-length error is
    /// answered by one retry only where something can be reduced.
    pub fn new(window_tokens: u64) -> Self {
        Self {
            window_tokens,
            reserve_output_tokens: 0,
            offload: None,
            compact: None,
            summarize: None,
        }
    }

    /// Keeps `tokens` free for the answer.
    pub fn with_reserve_output_tokens(mut self, tokens: u64) -> Self {
        self.reserve_output_tokens = tokens;
        self
    }

    /// Offloads tool results over `min_tokens`.
    pub fn with_offload(mut self, min_tokens: u64) -> Self {
        self.offload = Some(OffloadPolicy { min_tokens });
        self
    }

    /// Compacts at `at` of the usable window, keeping the last
    /// `keep_last_rounds` rounds whole.
    pub fn with_compact(mut self, at: f64, keep_last_rounds: usize) -> Self {
        self.compact = Some(CompactPolicy::new(at, keep_last_rounds));
        self
    }

    /// Compacts as `compact` says (its fraction per step, its call forms).
    pub fn with_compact_policy(mut self, compact: CompactPolicy) -> Self {
        self.compact = Some(compact);
        self
    }

    /// Summarizes at `at` of the usable window.
    pub fn with_summarize(mut self, summarize: SummarizePolicy) -> Self {
        self.summarize = Some(summarize);
        self
    }

    /// The tokens a prompt may take: the window less the reserve.
    pub fn usable_tokens(&self) -> u64 {
        self.window_tokens
            .saturating_sub(self.reserve_output_tokens)
    }

    /// Whether any part of the history may be shown as references
    /// (offloading or compaction): the agent then gets `read_artifact`.
    pub fn uses_artifacts(&self) -> bool {
        self.offload.is_some() || self.compact.is_some()
    }

    /// Checks the values the YAML loader checks; the message names the key.
    ///
    /// # Errors
    ///
    /// A value out of range, or `summarize.at` below `compact.at`.
    pub fn validate(&self) -> Result<(), String> {
        if self.window_tokens == 0 || self.window_tokens > MAX_WINDOW_TOKENS {
            return Err(format!(
                "window_tokens is {}; it must be 1 to {MAX_WINDOW_TOKENS}",
                self.window_tokens
            ));
        }
        if self.reserve_output_tokens >= self.window_tokens {
            return Err(format!(
                "reserve_output_tokens ({}) must be less than window_tokens ({})",
                self.reserve_output_tokens, self.window_tokens
            ));
        }
        for (key, at) in [
            ("compact.at", self.compact.as_ref().map(|c| c.at)),
            ("summarize.at", self.summarize.as_ref().map(|s| s.at)),
        ] {
            if let Some(at) = at
                && !(at > 0.0 && at <= 1.0)
            {
                return Err(format!(
                    "{key} is {at}; it must be a fraction of the window above 0 and at most 1"
                ));
            }
        }
        if let Some(c) = &self.compact {
            if !(c.fraction > 0.0 && c.fraction <= 1.0) {
                return Err(format!(
                    "compact.fraction is {}; it must be a share above 0 and at most 1",
                    c.fraction
                ));
            }
            if let Some(tool) = c.calls.keys().find(|t| t.trim().is_empty()) {
                return Err(format!(
                    "compact.calls has an empty tool name ({tool:?}); name the tool whose calls keep the listed arguments"
                ));
            }
        }
        if let (Some(c), Some(s)) = (&self.compact, &self.summarize)
            && s.at < c.at
        {
            return Err(format!(
                "summarize.at ({}) is below compact.at ({}): compaction is tried first, so summarize.at must be at least compact.at",
                s.at, c.at
            ));
        }
        Ok(())
    }
}

/// `offload:` — tool results over `min_tokens` go to the artifact store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct OffloadPolicy {
    /// The smallest result (in estimated tokens) that is offloaded.
    pub min_tokens: u64,
}

/// `compact:` — over `at` of the usable window, older tool results become
/// references.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CompactPolicy {
    /// The fraction of the usable window that triggers compaction.
    pub at: f64,
    /// The most recent rounds left whole. Default 2.
    #[serde(default = "default_keep_last_rounds")]
    pub keep_last_rounds: usize,
    /// The share of what can be compacted that one step compacts, oldest
    /// first; another step follows only while the prompt is still over
    /// `at`. Default 1: everything at once (see docs/context.md for why).
    #[serde(default = "default_fraction")]
    pub fraction: f64,
    /// Compact forms of calls, by tool name: the argument keys an old
    /// call keeps when it is compacted (the rest go to the artifact store
    /// with a reference). Added to, and over, what the tools themselves
    /// declare (`Tool::compact_call`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub calls: std::collections::BTreeMap<String, Vec<String>>,
}

impl CompactPolicy {
    /// Compaction at `at` of the usable window, keeping the last
    /// `keep_last_rounds` rounds whole, everything at once, with no call
    /// forms beyond the tools' own.
    pub fn new(at: f64, keep_last_rounds: usize) -> Self {
        Self {
            at,
            keep_last_rounds,
            fraction: default_fraction(),
            calls: std::collections::BTreeMap::new(),
        }
    }

    /// Compacts `fraction` of what can be, oldest first, per step.
    pub fn with_fraction(mut self, fraction: f64) -> Self {
        self.fraction = fraction;
        self
    }

    /// An old call of `tool` keeps only the arguments `keep` when
    /// compacted.
    pub fn with_call(
        mut self,
        tool: impl Into<String>,
        keep: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.calls
            .insert(tool.into(), keep.into_iter().map(Into::into).collect());
        self
    }
}

fn default_fraction() -> f64 {
    1.0
}

/// `summarize:` — over `at` of the usable window, older rounds are
/// summarized by a model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SummarizePolicy {
    /// The fraction of the usable window that triggers a summary.
    pub at: f64,
    /// The model that writes it (a registered model id); default the
    /// agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// The instruction given with the rounds to summarize; default
    /// [`DEFAULT_SUMMARY_PROMPT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The most recent rounds left out of the summary. Default 2.
    #[serde(default = "default_keep_last_rounds")]
    pub keep_last_rounds: usize,
}

impl SummarizePolicy {
    /// A summary at `at` of the usable window, by the agent's model, with
    /// the default prompt, keeping the last 2 rounds.
    pub fn new(at: f64) -> Self {
        Self {
            at,
            model_id: None,
            prompt: None,
            keep_last_rounds: default_keep_last_rounds(),
        }
    }

    /// The model that writes the summary.
    pub fn with_model_id(mut self, model_id: impl Into<String>) -> Self {
        self.model_id = Some(model_id.into());
        self
    }

    /// The instruction given with the rounds to summarize.
    pub fn with_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.prompt = Some(prompt.into());
        self
    }

    /// Leaves the last `rounds` rounds out of the summary.
    pub fn with_keep_last_rounds(mut self, rounds: usize) -> Self {
        self.keep_last_rounds = rounds;
        self
    }
}

/// The instruction a summary is written with, unless the policy gives one.
pub const DEFAULT_SUMMARY_PROMPT: &str = "Summarize the conversation below for your own later use. \
Keep every fact, decision, file name, identifier, number and open question that later steps may \
need; drop pleasantries and repetition. Write plain prose or a short list, no preamble.";

fn default_keep_last_rounds() -> usize {
    2
}

/// What YAML gives, before the cross-field checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    window_tokens: Tokens,
    #[serde(default)]
    reserve_output_tokens: Option<Tokens>,
    #[serde(default)]
    offload: Option<RawOffload>,
    #[serde(default)]
    compact: Option<RawCompact>,
    #[serde(default)]
    summarize: Option<RawSummarize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOffload {
    min_tokens: Tokens,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompact {
    at: Fraction,
    #[serde(default)]
    keep_last_rounds: Option<usize>,
    #[serde(default)]
    fraction: Option<Fraction>,
    #[serde(default)]
    calls: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSummarize {
    at: Fraction,
    #[serde(default)]
    model_id: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    keep_last_rounds: Option<usize>,
}

impl TryFrom<RawPolicy> for ContextPolicy {
    type Error = String;

    fn try_from(raw: RawPolicy) -> Result<Self, String> {
        let policy = Self {
            window_tokens: raw.window_tokens.0,
            reserve_output_tokens: raw.reserve_output_tokens.map_or(0, |t| t.0),
            offload: raw.offload.map(|o| OffloadPolicy {
                min_tokens: o.min_tokens.0,
            }),
            compact: raw.compact.map(|c| CompactPolicy {
                at: c.at.0,
                keep_last_rounds: c.keep_last_rounds.unwrap_or_else(default_keep_last_rounds),
                fraction: c.fraction.map_or_else(default_fraction, |f| f.0),
                calls: c.calls,
            }),
            summarize: raw.summarize.map(|s| SummarizePolicy {
                at: s.at.0,
                model_id: s.model_id,
                prompt: s.prompt,
                keep_last_rounds: s.keep_last_rounds.unwrap_or_else(default_keep_last_rounds),
            }),
        };
        policy.validate().map(|()| policy)
    }
}

impl fmt::Display for ContextPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "window {} tokens, {} reserved",
            self.window_tokens, self.reserve_output_tokens
        )
    }
}

/// A token count, 0 to [`MAX_WINDOW_TOKENS`], checked at the value.
struct Tokens(u64);

impl<'de> Deserialize<'de> for Tokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Tokens;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of tokens")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tokens, E> {
                if v <= MAX_WINDOW_TOKENS {
                    Ok(Tokens(v))
                } else {
                    Err(E::custom(format!(
                        "{v} is out of range: at most {MAX_WINDOW_TOKENS} tokens"
                    )))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tokens, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is out of range: a count of tokens")))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_u64(V)
    }
}

/// A fraction of the window, above 0 and at most 1, checked at the value.
struct Fraction(f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Fraction;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fraction of the window (e.g. 0.7)")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Fraction, E> {
                if v > 0.0 && v <= 1.0 {
                    Ok(Fraction(v))
                } else {
                    Err(E::custom(format!(
                        "{v} is out of range: a fraction of the window above 0 and at most 1"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fraction, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fraction, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_f64(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_round_trips_through_json() {
        let policy = ContextPolicy::new(4096)
            .with_reserve_output_tokens(512)
            .with_offload(300)
            .with_compact(0.7, 1)
            .with_summarize(SummarizePolicy::new(0.85).with_model_id("small"));
        let json = serde_json::to_value(&policy).unwrap();
        let back: ContextPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(back, policy);
    }

    #[test]
    fn summarize_below_compact_is_refused_naming_both() {
        let e = ContextPolicy::new(4096)
            .with_compact(0.8, 1)
            .with_summarize(SummarizePolicy::new(0.5))
            .validate()
            .unwrap_err();
        assert!(
            e.contains("summarize.at (0.5) is below compact.at (0.8)"),
            "{e}"
        );
    }

    #[test]
    fn compact_reads_its_fraction_and_call_forms_from_yaml_and_checks_the_fraction() {
        let policy: ContextPolicy = serde_yaml::from_str(
            "window_tokens: 8192\ncompact: { at: 0.7, fraction: 0.5, calls: { fs__write_file: [path] } }\n",
        )
        .unwrap();
        let compact = policy.compact.unwrap();
        assert_eq!(compact.fraction, 0.5);
        assert_eq!(compact.calls["fs__write_file"], vec!["path".to_owned()]);
        let e = serde_yaml::from_str::<ContextPolicy>(
            "window_tokens: 8192\ncompact: { at: 0.7, fraction: 0 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("above 0 and at most 1"), "{e}");
        let e = ContextPolicy::new(4096)
            .with_compact_policy(CompactPolicy::new(0.7, 1).with_fraction(1.5))
            .validate()
            .unwrap_err();
        assert!(e.contains("compact.fraction is 1.5"), "{e}");
    }

    #[test]
    fn a_reserve_as_large_as_the_window_is_refused() {
        let e = ContextPolicy::new(1000)
            .with_reserve_output_tokens(1000)
            .validate()
            .unwrap_err();
        assert!(e.contains("reserve_output_tokens (1000)"), "{e}");
    }
}
