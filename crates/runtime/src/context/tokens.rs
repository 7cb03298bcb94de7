//! Token estimates of a prompt, before it is sent.
//!
//! A prompt is measured in **units**: its exact tokens where a
//! [`TokenCounter`] fits the model (with the `tiktoken` feature, OpenAI's
//! models get one by name), otherwise its characters. Units become tokens
//! at a ratio **calibrated per model** from the input tokens the provider
//! reports for the prompts actually sent (an exponential average). For
//! characters it starts at 4 a token and stays within 1.5 to 8; for exact
//! counts it starts at 1 and stays within 0.8 to 1.25 (what a provider's
//! chat template adds). `docs/context.md` records the error against
//! reported usage on the live local model.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rein_runtime_contract::inference::InferenceRequest;
use rein_runtime_contract::message::Message;
use rein_runtime_contract::tool::ToolDescriptor;

/// Counts the tokens of a text exactly, as one model family's tokenizer
/// does. Registered per model with
/// [`AgentRuntimeBuilder::with_token_counter`](crate::AgentRuntimeBuilder::with_token_counter).
pub trait TokenCounter: Send + Sync {
    /// The tokens of `text`.
    fn count(&self, text: &str) -> u64;
}

/// Characters per token before any usage has been reported.
const INITIAL_CHARS_PER_TOKEN: f64 = 4.0;
/// Tokens a message costs besides its text (role, separators).
const PER_MESSAGE_TOKENS: u64 = 4;
/// How much each new observation moves the ratio.
const SMOOTHING: f64 = 0.5;

/// A model's calibration, shared by its runs: how it measures text (a
/// [`TokenCounter`] or characters) and the units per token observed in its
/// reported usage.
pub struct Calibration {
    counter: Option<Arc<dyn TokenCounter>>,
    /// `f64` bits of the ratio.
    chars_per_token: AtomicU64,
    observations: AtomicU64,
}

impl std::fmt::Debug for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calibration")
            .field("exact", &self.counter.is_some())
            .field("units_per_token", &self.chars_per_token())
            .field("observations", &self.observations())
            .finish()
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            counter: None,
            chars_per_token: AtomicU64::new(INITIAL_CHARS_PER_TOKEN.to_bits()),
            observations: AtomicU64::new(0),
        }
    }
}

impl Calibration {
    /// A calibration that measures text with `counter` (exact tokens).
    pub fn with_counter(counter: Arc<dyn TokenCounter>) -> Self {
        Self {
            counter: Some(counter),
            chars_per_token: AtomicU64::new(1.0_f64.to_bits()),
            observations: AtomicU64::new(0),
        }
    }

    /// Whether text is counted by a tokenizer (else by characters).
    pub fn is_exact(&self) -> bool {
        self.counter.is_some()
    }

    /// The current ratio: characters per token, or with a counter, counted
    /// tokens per reported token.
    pub fn chars_per_token(&self) -> f64 {
        f64::from_bits(self.chars_per_token.load(Ordering::Relaxed))
    }

    fn bounds(&self) -> (f64, f64) {
        if self.counter.is_some() {
            (0.8, 1.25)
        } else {
            (1.5, 8.0)
        }
    }

    /// The size of `text` in this calibration's units.
    pub fn size(&self, text: &str) -> u64 {
        match &self.counter {
            Some(counter) => counter.count(text),
            None => text.len() as u64,
        }
    }

    /// The units a message contributes to a prompt (its text, its calls'
    /// ids, names and arguments, the id of the call it answers).
    pub fn message_size(&self, message: &Message) -> u64 {
        let calls: u64 = message
            .tool_calls
            .iter()
            .map(|c| self.size(&c.id) + self.size(&c.name) + self.json_size(&c.arguments))
            .sum();
        self.size(&message.content)
            + calls
            + message
                .tool_call_id
                .as_deref()
                .map_or(0, |id| self.size(id))
    }

    /// The units the system prompt and tool list contribute.
    pub fn fixed_size(&self, system: Option<&str>, tools: &[ToolDescriptor]) -> u64 {
        let tools: u64 = tools
            .iter()
            .map(|t| self.size(&t.name) + self.size(&t.description) + self.json_size(&t.parameters))
            .sum();
        system.map_or(0, |s| self.size(s)) + tools
    }

    fn json_size(&self, value: &serde_json::Value) -> u64 {
        match value {
            serde_json::Value::String(s) => self.size(s) + 2,
            serde_json::Value::Null => 4,
            other => match &self.counter {
                Some(counter) => counter.count(&other.to_string()),
                // Bytes are counted as they are written: no text is built.
                None => json_len(other),
            },
        }
    }

    /// The units of a whole request: system prompt, tools, messages.
    fn request_size(&self, request: &InferenceRequest) -> u64 {
        let messages: u64 = request.messages.iter().map(|m| self.message_size(m)).sum();
        self.fixed_size(request.system.as_deref(), &request.tools) + messages
    }

    /// The estimated prompt tokens of `request` as it would be sent now.
    pub fn estimate(&self, request: &InferenceRequest) -> u64 {
        self.tokens(self.request_size(request), request.messages.len() as u64)
    }

    /// Learns from the input tokens the provider reported for `request`
    /// (what [`estimate`](Self::estimate) measured).
    pub fn observe_request(&self, request: &InferenceRequest, input_tokens: u64) {
        let units = self.request_size(request);
        self.observe(units, request.messages.len() as u64, input_tokens);
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
        let (low, high) = self.bounds();
        let observed = (chars as f64 / text_tokens as f64).clamp(low, high);
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

/// OpenAI's tokenizers (`tiktoken-rs`, its encodings built in, offline).
#[cfg(feature = "tiktoken")]
pub struct TiktokenCounter {
    bpe: &'static tiktoken_rs::CoreBPE,
}

#[cfg(feature = "tiktoken")]
impl std::fmt::Debug for TiktokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiktokenCounter").finish_non_exhaustive()
    }
}

#[cfg(feature = "tiktoken")]
impl TiktokenCounter {
    /// The tokenizer of an OpenAI model by its name (`gpt-4o`,
    /// `gpt-4.1-mini`, `o3`, `openai::gpt-4o` …); `None` for a model
    /// `tiktoken` does not know (other families are estimated instead).
    /// The first call loads the encoding (about 0.1 s).
    pub fn for_model(model: &str) -> Option<Self> {
        let name = model.rsplit("::").next().unwrap_or(model);
        tiktoken_rs::bpe_for_model(name)
            .ok()
            .map(|bpe| Self { bpe })
    }
}

#[cfg(feature = "tiktoken")]
impl TokenCounter for TiktokenCounter {
    fn count(&self, text: &str) -> u64 {
        self.bpe.encode_ordinary(text).len() as u64
    }
}

/// The length in bytes of `value` as compact JSON, counted without building
/// the text.
fn json_len(value: &serde_json::Value) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a `Value` into a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_value_is_counted_as_long_as_its_compact_text() {
        let values = [
            serde_json::json!({"i": 3, "path": "a/b", "list": [1, 2.5, null, true]}),
            serde_json::json!([]),
            serde_json::json!({"quote": "say \"hi\"\n", "é": "ü"}),
            serde_json::json!(-17),
        ];
        for value in values {
            assert_eq!(json_len(&value), value.to_string().len() as u64, "{value}");
        }
    }

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

    struct Words;
    impl TokenCounter for Words {
        fn count(&self, text: &str) -> u64 {
            text.split_whitespace().count() as u64
        }
    }

    #[test]
    fn a_counter_measures_in_tokens_and_calibrates_within_a_narrow_band() {
        let c = Calibration::with_counter(Arc::new(Words));
        let request = InferenceRequest::new("m", vec![Message::user("one two three four")]);
        assert_eq!(c.estimate(&request), 4 + PER_MESSAGE_TOKENS);
        // The provider counted twice as many: the band stops at 0.8.
        c.observe_request(&request, 2 * 4 + PER_MESSAGE_TOKENS);
        assert_eq!(c.chars_per_token(), 0.8);
        assert_eq!(c.estimate(&request), 5 + PER_MESSAGE_TOKENS);
    }

    #[cfg(feature = "tiktoken")]
    #[test]
    fn openai_models_get_an_exact_counter_and_others_none() {
        let counter = TiktokenCounter::for_model("openai::gpt-4o").unwrap();
        assert_eq!(counter.count("hello world"), 2);
        assert!(TiktokenCounter::for_model("smollm2").is_none());
    }

    #[test]
    fn absurd_reports_are_clamped() {
        let c = Calibration::default();
        c.observe(100, 0, 10_000);
        assert_eq!(c.chars_per_token(), 1.5);
    }
}
