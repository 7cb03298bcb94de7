//! Token estimates of a prompt, before it is sent.
//!
//! No tokenizer is loaded: a prompt's tokens are estimated from its
//! characters, at a characters-per-token ratio **calibrated per model** from
//! the input tokens the provider reports for the prompts actually sent
//! (an exponential average, starting at 4 characters per token, kept within
//! 1.5 to 8). `docs/context.md` records the error against reported usage on
//! the live local model.

use std::sync::atomic::{AtomicU64, Ordering};

use rein_runtime_contract::message::Message;
use rein_runtime_contract::tool::ToolDescriptor;

/// Characters per token before any usage has been reported.
const INITIAL_CHARS_PER_TOKEN: f64 = 4.0;
/// Tokens a message costs besides its text (role, separators).
const PER_MESSAGE_TOKENS: u64 = 4;
/// How much each new observation moves the ratio.
const SMOOTHING: f64 = 0.5;

/// A model's calibration, shared by its runs: the characters per token
/// observed in its reported usage.
#[derive(Debug)]
pub struct Calibration {
    /// `f64` bits of the ratio.
    chars_per_token: AtomicU64,
    observations: AtomicU64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            chars_per_token: AtomicU64::new(INITIAL_CHARS_PER_TOKEN.to_bits()),
            observations: AtomicU64::new(0),
        }
    }
}

impl Calibration {
    /// The current ratio.
    pub fn chars_per_token(&self) -> f64 {
        f64::from_bits(self.chars_per_token.load(Ordering::Relaxed))
    }

    /// How many reported usages it has learnt from.
    pub fn observations(&self) -> u64 {
        self.observations.load(Ordering::Relaxed)
    }

    /// Learns from a prompt of `chars` characters in `messages` messages
    /// that the provider counted as `input_tokens`.
    pub fn observe(&self, chars: u64, messages: u64, input_tokens: u64) {
        let overhead = messages.saturating_mul(PER_MESSAGE_TOKENS);
        let text_tokens = input_tokens.saturating_sub(overhead);
        if text_tokens == 0 || chars == 0 {
            return;
        }
        let observed = (chars as f64 / text_tokens as f64).clamp(1.5, 8.0);
        let seen = self.observations.fetch_add(1, Ordering::Relaxed);
        let next = if seen == 0 {
            observed
        } else {
            let old = self.chars_per_token();
            old + SMOOTHING * (observed - old)
        };
        self.chars_per_token
            .store(next.to_bits(), Ordering::Relaxed);
    }

    /// The estimated tokens of `chars` characters in `messages` messages.
    pub fn tokens(&self, chars: u64, messages: u64) -> u64 {
        (chars as f64 / self.chars_per_token()).ceil() as u64
            + messages.saturating_mul(PER_MESSAGE_TOKENS)
    }
}

/// The characters a message contributes to a prompt.
pub fn message_chars(message: &Message) -> u64 {
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|c| c.id.len() + c.name.len() + json_len(&c.arguments))
        .sum();
    (message.content.len() + calls + message.tool_call_id.as_ref().map_or(0, String::len)) as u64
}

/// The characters the system prompt and tool list contribute.
pub fn fixed_chars(system: Option<&str>, tools: &[ToolDescriptor]) -> u64 {
    let tools: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + json_len(&t.parameters))
        .sum();
    (system.map_or(0, str::len) + tools) as u64
}

fn json_len(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::String(s) => s.len() + 2,
        serde_json::Value::Null => 4,
        other => other.to_string().len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_moves_toward_what_the_provider_reports() {
        let c = Calibration::default();
        assert_eq!(c.tokens(4000, 0), 1000);
        // The provider counted 2 000 tokens for 4 000 characters: 2 a token.
        c.observe(4000, 0, 2000);
        assert_eq!(c.tokens(4000, 0), 2000);
        c.observe(4000, 0, 1000);
        assert!((c.chars_per_token() - 3.0).abs() < 1e-9);
        assert_eq!(c.observations(), 2);
    }

    #[test]
    fn absurd_reports_are_clamped() {
        let c = Calibration::default();
        c.observe(100, 0, 10_000);
        assert_eq!(c.chars_per_token(), 1.5);
    }
}
