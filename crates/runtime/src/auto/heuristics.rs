//! The text heuristics of auto mode: does the round's answer ask the user
//! for input, or report a failure? The phrase lists are data, in one place.
//!
//! Matching is case-insensitive (ASCII lowercase; `’` counts as `'`). The
//! **closing paragraph** is the text after the answer's last blank line
//! (`\n\n`), trimmed, and cut to its last 600 characters.

/// Phrases asking the user for input (English), looked for in the closing paragraph.
pub const USER_INPUT_PHRASES_EN: &[&str] = &[
    "please confirm",
    "please choose",
    "please provide",
    "could you provide",
    "could you confirm",
    "can you provide",
    "need your input",
    "awaiting your input",
    "awaiting your confirmation",
    "what would you like to do next",
    "shall i proceed",
    "should i proceed",
    "do you want me to",
];

/// Phrases asking the user for input (Chinese), looked for in the closing paragraph.
pub const USER_INPUT_PHRASES_ZH: &[&str] = &[
    "请提供",
    "请确认",
    "请选择",
    "是否继续",
    "是否开始",
    "是否要我",
    "等待你的确认",
    "等待用户",
];

/// Failure signals that count anywhere in the answer.
pub const FAILURE_HARD_SIGNALS: &[&str] = &[
    "traceback (most recent call last)",
    "sorry, i encountered an error",
    "memory archival failed",
    "tool call failed",
    "unrecoverable error",
    "无法继续",
];

/// Failure signals that count only in the closing paragraph.
pub const FAILURE_SOFT_SIGNALS: &[&str] = &[
    "i'm unable to proceed",
    "i am unable to proceed",
    "cannot proceed because",
    "cannot continue because",
    "i cannot continue",
    "blocked by",
];

/// How many characters of the closing paragraph are looked at.
pub const CLOSING_PARAGRAPH_CHARS: usize = 600;

fn normalize(text: &str) -> String {
    text.replace('’', "'").to_lowercase()
}

/// The closing paragraph of `text` (see the module docs), normalized.
pub fn closing_paragraph(text: &str) -> String {
    let trimmed = text.trim();
    let last = trimmed.rsplit("\n\n").next().unwrap_or(trimmed).trim();
    let chars: Vec<char> = last.chars().collect();
    let start = chars.len().saturating_sub(CLOSING_PARAGRAPH_CHARS);
    normalize(&chars[start..].iter().collect::<String>())
}

/// Whether the answer ends by asking the user for input.
pub fn looks_like_user_input_request(text: &str) -> bool {
    let closing = closing_paragraph(text);
    USER_INPUT_PHRASES_EN
        .iter()
        .chain(USER_INPUT_PHRASES_ZH)
        .any(|p| closing.contains(p))
}

/// Whether the answer reports a failure: a hard signal anywhere, or a soft
/// signal in the closing paragraph.
pub fn looks_like_failure(text: &str) -> bool {
    let all = normalize(text);
    if FAILURE_HARD_SIGNALS.iter().any(|p| all.contains(p)) {
        return true;
    }
    let closing = closing_paragraph(text);
    FAILURE_SOFT_SIGNALS.iter().any(|p| closing.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_user_input_phrase_hits_in_the_closing_paragraph() {
        for phrase in USER_INPUT_PHRASES_EN.iter().chain(USER_INPUT_PHRASES_ZH) {
            let text = format!(
                "I ran the experiment.\n\nResults look fine. {} Thanks.",
                phrase.to_uppercase()
            );
            assert!(looks_like_user_input_request(&text), "{phrase}");
        }
    }

    #[test]
    fn user_input_phrases_before_the_closing_paragraph_do_not_count() {
        for phrase in USER_INPUT_PHRASES_EN.iter().chain(USER_INPUT_PHRASES_ZH) {
            let text = format!("Earlier you said: {phrase}.\n\nI went ahead and finished the run.");
            assert!(!looks_like_user_input_request(&text), "{phrase}");
        }
    }

    #[test]
    fn every_hard_failure_signal_hits_anywhere() {
        for signal in FAILURE_HARD_SIGNALS {
            let text = format!(
                "Step one: {}.\n\nAfter that everything went well.",
                signal.to_uppercase()
            );
            assert!(looks_like_failure(&text), "{signal}");
        }
    }

    #[test]
    fn soft_failure_signals_count_only_in_the_closing_paragraph() {
        for signal in FAILURE_SOFT_SIGNALS {
            let closing =
                format!("All good so far.\n\nUnfortunately {signal} the missing dataset.");
            assert!(looks_like_failure(&closing), "{signal}");
            let earlier =
                format!("Earlier: {signal} a lock.\n\nThe lock was released and I finished.");
            assert!(!looks_like_failure(&earlier), "{signal}");
        }
    }

    #[test]
    fn curly_apostrophes_and_case_are_normalized() {
        assert!(looks_like_failure(
            "Done.\n\nI’M UNABLE TO PROCEED without credentials."
        ));
    }

    #[test]
    fn the_closing_paragraph_is_cut_to_its_last_600_characters() {
        let text = format!("please confirm {}", "x".repeat(700));
        assert!(
            !looks_like_user_input_request(&text),
            "the phrase is more than 600 characters from the end"
        );
        let text = format!("{} please confirm", "x".repeat(700));
        assert!(looks_like_user_input_request(&text));
        assert_eq!(
            closing_paragraph(&"y".repeat(900)).chars().count(),
            CLOSING_PARAGRAPH_CHARS
        );
    }
}
