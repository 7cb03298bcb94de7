//! `awaiting_user`: a final answer that asks the user something the agent
//! needs before it can go on — permission, a choice, missing information —
//! ends the run `stopped(awaiting_user)` instead of `natural_end`.
//!
//! The classifier reads the answer's **closing paragraph** (the text after
//! its last blank line — with the paragraph before it when the last one is
//! only a sign-off like "Thanks!" — at most [`CLOSING_CHARS`] characters),
//! lowercased, with `’` read as `'`, and with code and quoted passages
//! left out (a question in a quote or a draft is not the agent's). Sentence
//! by sentence:
//!
//! 1. A sentence with a polite closing ([`NOT_ASKING`]) or an offer of
//!    optional extra work ([`OFFERS`]: "want me to *also* …?") asks
//!    nothing the work waits for.
//! 2. Any other sentence with a blocking phrase ([`ASKING_EN`],
//!    [`ASKING_ZH`]: "shall i ", "please confirm", "could you share",
//!    "which option do you", "请确认", "等你确认") means the agent waits.
//! 3. Otherwise a question means the agent waits, unless it is a tag
//!    question (", right?"), an FAQ entry, or the text goes on to answer
//!    it ([`ANSWER_STARTS`], or reports of work done after it,
//!    [`DONE_MARKERS`], with nothing left pending, [`PENDING_MARKERS`]).
//!
//! The phrase lists are data; the classifier's precision and recall on a
//! labelled set of 220 answers are in `docs/stop-policies.md`.

use super::{Escalation, Verdict, snippet};
use rein_runtime_contract::escalation::Ladder;
use rein_runtime_contract::lifecycle::OnDetect;

/// The nudge that answers an agent waiting for the user when nobody is
/// there (auto mode, or a `nudge` step).
pub const PROCEED_NUDGE: &str = "Nobody is available to answer questions. Do not ask for confirmation or choices: proceed with the most reasonable option, state the assumption you made, and finish the task.";

/// How many characters of the closing paragraph are read.
pub const CLOSING_CHARS: usize = 500;

/// A last paragraph shorter than this, without a question mark, is a
/// sign-off ("Thanks!"): the paragraph before it is read with it.
const SIGN_OFF_CHARS: usize = 40;

/// Phrases (English) that ask the user for permission, a choice or
/// information the agent needs.
pub const ASKING_EN: &[&str] = &[
    "shall i ",
    "should i ",
    "may i ",
    "can i go ahead",
    "ok to go ahead",
    "okay to go ahead",
    "ok to proceed",
    "okay to proceed",
    "do you want me to proceed",
    "do you want me to continue",
    "do you want me to go ahead",
    "would you like me to proceed",
    "would you like me to continue",
    "would you like me to go ahead",
    "is it ok if i",
    "is it okay if i",
    "please confirm",
    "can you confirm",
    "could you confirm",
    "confirm whether",
    "confirm that i should",
    "until you confirm",
    "once you confirm",
    "your confirmation",
    "your approval",
    "your go-ahead",
    "your permission",
    "waiting for your",
    "waiting on your",
    "awaiting your",
    "before i proceed",
    "before i continue",
    "before i go ahead",
    "let me know if i should",
    "let me know whether",
    "let me know which",
    "tell me which",
    "once you tell me",
    "please provide",
    "please share",
    "please specify",
    "please clarify",
    "please choose",
    "please select",
    "please send",
    "please tell me",
    "could you provide",
    "could you share",
    "could you tell me",
    "could you clarify",
    "could you specify",
    "could you send",
    "can you provide",
    "can you share",
    "can you tell me",
    "can you clarify",
    "can you specify",
    "can you send",
    "can you grant",
    "could you grant",
    "which one do you",
    "which option do you",
    "which option would you",
    "which do you prefer",
    "which would you prefer",
    "do you prefer",
    "would you prefer",
    "do you mean",
    "when you say",
    "i need your",
    "i'll need your",
    "i will need your",
    "need your input",
    "need from you",
    "i need that",
    "i need to know",
    "need a decision",
    "how would you like to proceed",
    "how should i proceed",
    "what would you like me to do",
    "what would you like to do next",
    "reply \"",
    "reply '",
    "reply with",
];

/// Phrases (Chinese) that ask the user for permission, a choice or
/// information.
pub const ASKING_ZH: &[&str] = &[
    "请确认",
    "请提供",
    "请选择",
    "请告诉我",
    "请告知",
    "请指定",
    "请说明",
    "是否继续",
    "是否开始",
    "是否要我",
    "是否需要我",
    "是否可以",
    "可以继续吗",
    "可以开始吗",
    "要继续吗",
    "等待你的",
    "等待您的",
    "等待用户",
    "等你确认",
    "等您确认",
    "请你定",
    "麻烦确认",
    "方便提供",
    "能发给我",
    "以哪个为准",
    "要我现在",
    "你希望",
    "您希望",
    "你更倾向",
    "您更倾向",
];

/// Polite closings (English and Chinese): a sentence with one does not
/// ask anything the work waits for.
pub const NOT_ASKING: &[&str] = &[
    "let me know if you have",
    "let me know if you need",
    "let me know if anything",
    "feel free to",
    "hope this helps",
    "happy to help",
    "anything else",
    "if you have any questions",
    "if you need anything",
    "如有其他问题",
    "如果还有问题",
    "有任何问题",
    "随时告诉我",
    "希望对你有帮助",
    "希望对您有帮助",
    "还有什么可以帮",
];

/// Markers of an optional offer after finished work ("want me to
/// *also* …?"): a sentence with one is not a blocking question.
pub const OFFERS: &[&str] = &[
    " also ",
    " as well",
    " too?",
    "顺便",
    "follow-up",
    "follow up",
];

/// How a sentence that answers the question before it begins: that
/// question was rhetorical.
pub const ANSWER_STARTS: &[&str] = &[
    "because",
    "no,",
    "no —",
    "no.",
    "not ",
    "yes",
    "probably",
    "also no",
    "according to",
    "turns out",
    "the answer",
    "答",
    "不是",
    "因为",
    "也不是",
    "是的",
];

/// Reports of work done after a question: the agent answered it itself.
pub const DONE_MARKERS: &[&str] = &[
    "i've ",
    "i have ",
    "i set ",
    "i added",
    "i fixed",
    "i switched",
    "i updated",
    "i changed",
    "我把",
    "已经",
];

/// Words that keep work pending after a question ("before", "once you").
pub const PENDING_MARKERS: &[&str] = &[
    "before", "once you", "until", "blocking", "i'll", "i will", "才能", "之后", "再",
];

fn normalize(text: &str) -> String {
    text.replace('’', "'").to_lowercase()
}

/// The answer's closing paragraph, normalized (see the module docs): the
/// last paragraph, with the one before it when it is only a sign-off.
fn closing(text: &str) -> String {
    let paragraphs: Vec<&str> = text
        .trim()
        .split("\n\n")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let Some(&last) = paragraphs.last() else {
        return String::new();
    };
    let sign_off = last.chars().count() < SIGN_OFF_CHARS && !last.contains(['?', '？']);
    let bare = !last.chars().any(char::is_alphanumeric);
    let closing = match paragraphs.len() {
        n if n > 1 && (sign_off || bare) => format!("{}\n{last}", paragraphs[n - 2]),
        _ => last.to_owned(),
    };
    let chars: Vec<char> = closing.chars().collect();
    let start = chars.len().saturating_sub(CLOSING_CHARS);
    normalize(&chars[start..].iter().collect::<String>())
}

/// `text` with code and quoted passages replaced by ` x `: a question in a
/// quote, a log line or a draft for someone else is not the agent's.
fn unquoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((at, open, close)) = [("```", "```"), ("`", "`"), ("\"", "\""), ("“", "”")]
        .iter()
        .filter_map(|(o, c)| rest.find(o).map(|i| (i, *o, *c)))
        .min_by_key(|(i, o, _)| (*i, std::cmp::Reverse(o.len())))
    {
        let after = &rest[at + open.len()..];
        let Some(end) = after.find(close) else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(" x ");
        rest = &after[end + close.len()..];
    }
    out.push_str(rest);
    out
}

/// The sentences of `text`: split after `.`, `!`, `?` followed by white
/// space, and after `。`, `！`, `？`.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = i + c.len_utf8();
        let split = match c {
            '。' | '！' | '？' => true,
            '.' | '!' | '?' => chars.peek().is_some_and(|(_, n)| n.is_whitespace()),
            _ => false,
        };
        if split {
            out.push(text[start..end].trim());
            start = end;
        }
    }
    out.push(text[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

fn has_any(text: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| text.contains(p))
}

/// Whether the question `sentences[i]` is one the agent waits on: not a
/// tag question, a polite closing, an offer, an FAQ entry, or a question
/// the text goes on to answer itself.
fn open_question(sentences: &[&str], i: usize) -> bool {
    let question = sentences[i];
    if question.ends_with(", right?") || question.contains("isn't it?") {
        return false;
    }
    if has_any(question, NOT_ASKING) || has_any(question, OFFERS) {
        return false;
    }
    if question.trim_start_matches('*').starts_with("问") || question.starts_with("q:") {
        return false;
    }
    let rest = &sentences[i + 1..];
    let next = rest.first().copied().unwrap_or_default();
    if ANSWER_STARTS.iter().any(|a| next.starts_with(a)) {
        return false;
    }
    let explains = ["why ", "what's next", "为什么"]
        .iter()
        .any(|w| question.starts_with(w));
    if explains && !rest.is_empty() {
        return false;
    }
    let done = rest.iter().any(|r| has_any(r, DONE_MARKERS));
    let pending = rest.iter().any(|r| has_any(r, PENDING_MARKERS));
    !done || pending
}

/// Whether `text` ends by asking the user something the agent waits for.
pub fn looks_like_awaiting_user(text: &str) -> bool {
    let closing = unquoted(&closing(text));
    let sentences = sentences(&closing);
    for sentence in &sentences {
        if has_any(sentence, OFFERS) || has_any(sentence, NOT_ASKING) {
            continue;
        }
        if has_any(sentence, ASKING_EN) || has_any(sentence, ASKING_ZH) {
            return true;
        }
    }
    (0..sentences.len())
        .filter(|&i| sentences[i].ends_with(['?', '？']))
        .any(|i| open_question(&sentences, i))
}

/// The last question of the answer's closing paragraph, or its last
/// sentence: what a detection quotes.
fn quoted_question(answer: &str) -> String {
    let closing = closing(answer);
    let sentences = sentences(&closing);
    sentences
        .iter()
        .rev()
        .find(|s| s.ends_with(['?', '？']))
        .or(sentences.last())
        .map_or_else(String::new, |s| (*s).to_owned())
}

/// The `awaiting_user` detector of one run.
#[derive(Debug)]
pub struct AwaitingUserDetector {
    escalation: Escalation,
}

impl Default for AwaitingUserDetector {
    fn default() -> Self {
        Self::new()
    }
}

impl AwaitingUserDetector {
    /// A detector that stops the run at once.
    pub fn new() -> Self {
        Self {
            escalation: Escalation::new(OnDetect::Stop),
        }
    }

    /// Climbs `ladder` on each detection instead of stopping at once.
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// Checks a final answer (one without tool calls).
    pub fn check(&mut self, answer: &str) -> Option<Verdict> {
        if !looks_like_awaiting_user(answer) {
            return None;
        }
        let detail = format!(
            "the answer ends by asking the user: \"{}\"",
            snippet(&quoted_question(answer), 160)
        );
        Some(self.escalation.fire("awaiting_user", detail, PROCEED_NUDGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_choices_and_missing_information_are_waiting() {
        for text in [
            "I prepared the migration.\n\nShall I run it on production?",
            "Two designs are ready. Which one do you prefer?",
            "I need the staging API key to continue — could you share it?",
            "Please confirm the target branch and I'll push.",
            "迁移脚本已准备好。是否继续在生产环境执行？",
            "Do you mean the 2023 or the 2024 report?",
        ] {
            assert!(looks_like_awaiting_user(text), "{text}");
        }
    }

    #[test]
    fn completions_polite_closings_and_rhetorical_questions_are_not() {
        for text in [
            "All 12 tests pass and the fix is merged.",
            "Done. Let me know if you have any questions!",
            "Why did it fail? The cache was stale. I cleared it and the build is green.",
            "The report is attached. Hope this helps.",
            "I added the endpoint. If you'd like, I can also add tests?",
            "已完成部署。如有其他问题，随时告诉我。",
        ] {
            assert!(!looks_like_awaiting_user(text), "{text}");
        }
    }

    #[test]
    fn only_the_closing_paragraph_counts() {
        assert!(!looks_like_awaiting_user(
            "You asked: shall I proceed?\n\nI proceeded: the migration ran on production and all 1 204 rows were updated."
        ));
    }
}
