//! `awaiting_user`: a final answer that asks the user something the agent
//! needs before it can go on — permission, a choice, missing information —
//! ends the run `stopped(awaiting_user)` instead of `natural_end`.
//!
//! The answer is lowercased, with `’` read as `'`; fenced code, block
//! quotes (`> …`), drafts set between two `---` rules and quoted passages
//! are left out (a question in a quote, a log or a draft is not the
//! agent's; a short quoted word without a question mark, like `Reply
//! "continue"`, stays). Its **closing paragraph** — the text after its
//! last blank line, with the paragraph before it when the last one is only
//! a sign-off ("Thanks!") or a list that paragraph introduces with a colon;
//! at most [`CLOSING_CHARS`] characters — is read sentence by sentence
//! (and line by line):
//!
//! 1. A sentence with a polite closing ([`NOT_ASKING`]) or saying nothing
//!    is needed ([`NOT_NEEDED`]) asks nothing. An offer
//!    ([`OFFER_FORMS`]: "want me to …?", "要不要我…") that is not a "which
//!    …?" nor set against an alternative (", or …", "还是") asks nothing
//!    when it offers something *extra* ([`OFFER_EXTRAS`]: "also", "顺便")
//!    or the answer reports work done ([`COMPLETION`]), and nothing in the
//!    answer is left pending ([`NOT_DONE`]: "haven't", "now?", "can't be
//!    undone", "还没"; [`HOLD`]; [`CONDITIONAL`]).
//! 2. Any other sentence means the agent waits when it says so
//!    ([`WAITING`]: "until you decide", "without your OK", "you haven't
//!    told me"), asks ([`ASKING_EN`], [`ASKING_ZH`]: "shall i ", "i need you
//!    to", "if you can give", "your call", "请确认", "麻烦"; "我可以…吗"), or
//!    requests ([`REQUEST_STARTS`]: "send me …", "let me know which …", at
//!    the start of a clause and without an "if"; "you … and I'll …";
//!    "发我", "你…，我就…").
//! 3. An answer that says it is blocked ([`BLOCKED`]: "i can't ", "卡住")
//!    and what it needs from someone ([`NEEDS`]: "i need ", "someone with",
//!    "需要你"), unless it says nothing is needed ([`NOT_NEEDED`]), waits.
//! 4. Otherwise a question (or a last line that starts like one and lacks
//!    its question mark) means the agent waits, unless it is a tag question,
//!    a question reported from someone else ("the survey asks: …?"), an
//!    offer as in 1, deferred ([`DEFERRED`]: "no need to decide now",
//!    "以后再说"), or answered: the next sentence starts with an answer
//!    ([`ANSWER_STARTS`]: "no —", "in short", "不行"). A question followed by
//!    something left open ([`HOLD`]: "i haven't touched it", "我先没动"), a
//!    condition on its answer ([`CONDITIONAL`]: "if so", "的话") or doubt
//!    ([`UNRESOLVED`]: "i can't tell") is open. Otherwise it is not when it
//!    is an FAQ entry (a heading, bold or list line, or a line of its own
//!    answered on the next line), an impersonal question ("is it the
//!    network or the disk?") followed by an investigation
//!    ([`INVESTIGATION`]: "i ran", "我查了"), a "why …?" that the text
//!    explains, or followed by work reported done ([`DONE_MARKERS`]) with
//!    nothing pending ([`PENDING_MARKERS`]).
//!
//! Earlier paragraphs count too, more strictly: a question there means the
//! agent waits only if it is open (as in 4) and asks in so many words (as
//! in 2) or is followed in its paragraph by something left open ([`HOLD`])
//! or a condition on its answer ([`CONDITIONAL`]) — a question buried
//! mid-report that the work waits on.
//!
//! The phrase lists are data; the classifier's precision and recall on two
//! labelled sets (220 and 393 answers) are in `docs/stop-policies.md`.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::{Escalation, Verdict, snippet};
use rein_runtime_contract::escalation::Ladder;
use rein_runtime_contract::lifecycle::OnDetect;

/// The nudge that answers an agent waiting for the user when nobody is
/// there (auto mode, or a `nudge` step).
pub const PROCEED_NUDGE: &str = "Nobody is available to answer questions. Do not ask for confirmation or choices: proceed with the most reasonable option, state the assumption you made, and finish the task.";

/// How many characters of the closing paragraph are read.
pub const CLOSING_CHARS: usize = 500;

/// A last paragraph of at most this many words (a CJK character counts
/// half), without a question mark, is a sign-off ("Thanks!", "Talk
/// soon."): the paragraph before it is read with it.
const SIGN_OFF_WORDS: f32 = 3.0;

/// A quoted passage this short (in characters), without a question mark,
/// is kept: it is a word the agent uses (`Reply "continue"`), not a quote.
const SHORT_QUOTE_CHARS: usize = 20;

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
    "need it from you",
    "need them from you",
    "need you to",
    "want you to",
    "if you can give",
    "if you could give",
    "if you can send",
    "if you could send",
    "if you can share",
    "if you could share",
    "if you can provide",
    "if you could provide",
    "i need that",
    "i need to know",
    "just need to know",
    "need to know which",
    "need to know whether",
    "need a decision",
    "your call",
    "whichever you",
    "but it's your",
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
    "麻烦",
    "方便提供",
    "能发给我",
    "以哪个为准",
    "要我现在",
    "你希望",
    "您希望",
    "你更倾向",
    "您更倾向",
    "需要你",
    "需要您",
    "如果你能给",
    "如果您能给",
    "如果你能提供",
    "如果您能提供",
    "你来定",
    "你定一",
    "你来拍板",
    "由你决定",
    "确定哪",
];

/// Phrases (English and Chinese) in which the agent says it waits: they
/// count even in a sentence that also offers something.
pub const WAITING: &[&str] = &[
    "without your ok",
    "without your okay",
    "without your go-ahead",
    "without your approval",
    "without your sign-off",
    "until you decide",
    "until you tell",
    "until you say",
    "until you reply",
    "until i hear",
    "until i know",
    "whenever you say",
    "once you say",
    "i'll hold",
    "you haven't told",
    "you haven't said",
    "you haven't decided",
    "you haven't picked",
    "你还没定",
    "你还没说",
    "你还没告诉",
    "你还没确认",
    "没有你的同意",
    "没有您的同意",
    "你说可以",
    "等你决定",
    "等你回复",
];

/// How a request begins (after "just ", "please ", "so "): "send me …",
/// "let me know which …". A sentence with one and without an "if" asks.
pub const REQUEST_STARTS: &[&str] = &[
    "send me",
    "send over",
    "send them",
    "send it",
    "give me",
    "tell me",
    "point me",
    "show me",
    "get me",
    "forward me",
    "paste ",
    "drop ",
    "pick ",
    "choose ",
    "decide ",
    "let me know",
    "reply with",
];

/// Chinese requests ("发我", "告诉我"): a sentence with one and without a
/// condition ("如果", "的话", "随时") asks.
const REQUEST_ZH: &[&str] = &[
    "发我",
    "发给我",
    "告诉我",
    "提供一下",
    "给我一个",
    "给我一份",
];

/// Conditions that make an imperative a standing offer, not a request.
const REQUEST_CONDITIONS: &[&str] = &[
    " if ",
    "whenever",
    "anytime",
    "any time",
    "如果",
    "的话",
    "以后",
    "随时",
    "需要时",
];

/// Polite closings (English and Chinese): a sentence with one does not
/// ask anything the work waits for.
pub const NOT_ASKING: &[&str] = &[
    "let me know if you have",
    "let me know if you need",
    "let me know if you'd like",
    "let me know if you want",
    "let me know if anything",
    "let me know how",
    "let me know what you think",
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

/// How an offer is phrased ("want me to …", "would it help if …",
/// "要不要…").
pub const OFFER_FORMS: &[&str] = &[
    "want me to",
    "like me to",
    "shall i ",
    "should i ",
    "i can ",
    "i could ",
    "happy to",
    "want a ",
    "want an ",
    "like a ",
    "like an ",
    "would it help",
    "if you'd like",
    "if you want",
    "要我",
    "要不要我",
    "要不要顺便",
    "要不要再",
    "要不要也",
    "需不需要我",
    "需不需要再",
    "需要我",
    "我可以",
    "我还可以",
    "我也可以",
];

/// Markers of an *extra* in an offer ("want me to *also* …?").
pub const OFFER_EXTRAS: &[&str] = &[
    " also ",
    " as well",
    " too?",
    "while i'm at it",
    "顺便",
    "follow-up",
    "follow up",
];

/// Reports that the work is done: after one, an offer is optional.
pub const COMPLETION: &[&str] = &[
    "done",
    "finished",
    "complete",
    "merged",
    "scheduled",
    "deployed",
    "is live",
    "are live",
    "created",
    "all set",
    "in place",
    "i've ",
    "i have ",
    "已",
    "完成",
    "好了",
    "搞定",
];

/// Words that keep an offered action pending: it is the work itself, not
/// an extra ("haven't", "now?", "can't be undone", "还没").
pub const NOT_DONE: &[&str] = &[
    "haven't",
    "have not",
    "hasn't",
    "not yet",
    " yet",
    "until",
    "before",
    " now?",
    " now,",
    "still ",
    "can't be undone",
    "cannot be undone",
    "irreversible",
    "if not",
    "if so",
    "or hold",
    "or wait",
    "stopped here",
    "i've stopped",
    "paused",
    "还没",
    "尚未",
    "之前",
    "现在",
    "无法恢复",
    "不可恢复",
    "的话",
    "否则",
    "不然",
    "今晚",
    "马上",
    "等",
    "暂停",
    "停在",
];

/// Statements that the agent is blocked.
pub const BLOCKED: &[&str] = &[
    "i can't ",
    "i cannot ",
    "can't continue",
    "can't proceed",
    "blocked on",
    "i'm blocked",
    "i'm stuck",
    "stuck on",
    "stuck at",
    "halted",
    "work stopped",
    "hit a wall",
    "don't have permission",
    "don't have access",
    "no access to",
    "not allowed to",
    "i'm not able",
    "unable to",
    "进行不下去",
    "卡住",
    "卡在",
    "暂停",
    "没有权限",
    "无法",
    "不了",
];

/// What a blocked agent needs from someone.
pub const NEEDS: &[&str] = &[
    "i need ",
    "i'll need",
    "i'd need",
    "i will need",
    "need you",
    "you need to",
    "you'll need to",
    "would have to",
    "someone with",
    "someone who",
    "someone must",
    "you must",
    "has to be",
    "have to be",
    "需要你",
    "需要您",
    "需要有",
    "需要他们",
    "必须",
];

/// Statements that nothing is needed from the user.
pub const NOT_NEEDED: &[&str] = &[
    "nothing you need",
    "no action",
    "you don't need",
    "nothing needed",
    "不用做",
    "不需要你",
    "你不用",
];

/// Markers that a question can wait ("no need to decide now", "以后再说").
pub const DEFERRED: &[&str] = &[
    "nothing is needed",
    "nothing needed",
    "nothing to do now",
    "nothing to decide",
    "no decision needed",
    "no need to",
    "no action needed",
    "no action is needed",
    "no change is needed",
    "for later",
    "just a thought",
    "can revisit",
    "revisit then",
    "something to consider",
    "worth discussing",
    "parked",
    "not needed for now",
    "that's for your",
    "a decision for",
    "either way",
    "也没影响",
    "都不影响",
    "can wait",
    "no rush",
    "不需要做什么",
    "不需要行动",
    "现在不用",
    "不用定",
    "再说",
    "再看",
    "再定",
    "再讨论",
    "到时候",
    "不用改",
    "不急",
];

/// Something left open after a question: the work waits on its answer.
pub const HOLD: &[&str] = &[
    "until you",
    "until i hear",
    "until i know",
    "i've left",
    "i left it",
    "left unanswered",
    "left blank",
    "placeholder",
    "haven't touched",
    "haven't changed",
    "haven't applied",
    "haven't sent",
    "haven't started",
    "haven't done",
    "haven't made",
    "haven't deleted",
    "haven't exported",
    "haven't run",
    "haven't merged",
    "haven't booked",
    "not yet",
    "didn't want to",
    "rather not guess",
    "i won't",
    "on hold",
    "先没",
    "没动",
    "没碰",
    "先空",
    "先留",
    "暂时没",
    "先不",
    "确认之前",
    "定了再",
];

/// Conditions on a question's answer ("if so", "的话"): the agent plans
/// on it, so the question is open.
pub const CONDITIONAL: &[&str] = &[
    "if so",
    "if not",
    "if yes",
    "if no,",
    "if you know",
    "that decides",
    "的话",
];

/// Doubt after a question: the text did not answer it.
pub const UNRESOLVED: &[&str] = &[
    "i don't know",
    "i can't tell",
    "not sure",
    "unclear",
    "doesn't say",
    "don't say",
    "depends on",
    "我不知道",
    "不确定",
    "判断不了",
    "不清楚",
    "取决于",
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
    "the answer is",
    "the short answer",
    "in short",
    "short answer",
    "partly",
    "mostly",
    "two things",
    "three things",
    "we do",
    "we don't",
    "— ",
    "– ",
    "答",
    "不是",
    "因为",
    "也不是",
    "是的",
    "有：",
    "有，",
    "没有，",
    "能，",
    "能——",
    "不能",
    "不行",
    "可以，",
    "会，",
    "不会",
    "值：",
    "值，",
    "不值",
    "当然",
];

/// An investigation reported after an impersonal question ("is it the
/// network or the disk?" — "I ran iostat …"), or its conclusion: the text
/// answered the question itself.
pub const INVESTIGATION: &[&str] = &[
    "i checked",
    "i looked",
    "i ran ",
    "i re-ran",
    "i reran",
    "i measured",
    "i tested",
    "i searched",
    "i traced",
    "so yes",
    "so no",
    "我查了",
    "我看了",
    "我跑了",
    "我检查了",
    "我测了",
    "我试了",
    "所以是",
];

/// How a question that the text goes on to explain begins ("why …?").
const EXPLAINS: &[&str] = &[
    "why ",
    "what's next",
    "what went wrong",
    "what caused",
    "what happened",
    "what changed",
    "how come",
    "为什么",
];

/// Chinese explained questions, anywhere in the question.
const EXPLAINS_ZH: &[&str] = &["为什么", "哪里出了问题", "怎么回事", "什么原因"];

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
    "i rebuilt",
    "我把",
    "已经",
];

/// Words that keep work pending after a question ("before", "once you").
pub const PENDING_MARKERS: &[&str] = &[
    "before", "once you", "until", "blocking", "i'll", "i will", "才能", "之后", "再",
];

/// Discourse words before a question ("so why …?").
const LEADS: &[&str] = &["so ", "and ", "but ", "hmm, ", "ok, ", "okay, ", "well, "];

/// How a question for a piece of information begins.
const WH_STARTS: &[&str] = &["which ", "what ", "how ", "where ", "when ", "who "];

/// An offer set against something else: a choice, not an offer.
const ALTERNATIVES: &[&str] = &[", or ", "还是"];

/// How questions someone else asks are introduced ("the survey asks: …?"):
/// that question and those right after it are reported, not asked.
const REPORTED: &[&str] = &["asks:", "asked:", "ask:", "questions:", "问道"];

/// How a question that lost its question mark begins (on the closing's
/// last line): "which way do you want to go".
const QUESTION_STARTS: &[&str] = &[
    "which ",
    "what ",
    "where ",
    "when ",
    "who ",
    "how ",
    "should ",
    "shall ",
    "do you ",
    "would you ",
    "can you ",
    "could you ",
    "are you ",
    "is it ",
];

fn normalize(text: &str) -> String {
    text.replace('’', "'").to_lowercase()
}

fn has_any(text: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| text.contains(p))
}

fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

/// `text` without fenced code blocks, block-quote lines (`> …`) and
/// drafts set between two horizontal rules (`---`).
fn without_code_and_block_quotes(text: &str) -> String {
    let rule = |l: &str| matches!(l.trim(), "---" | "***" | "___");
    let rules = text.lines().filter(|l| rule(l)).count();
    let mut rules_seen = 0;
    let mut out = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            out.push_str(" x\n");
            continue;
        }
        if rule(line) {
            rules_seen += 1;
            continue;
        }
        let in_draft = rules_seen % 2 == 1 && rules_seen < rules + rules % 2;
        if fenced || in_draft || trimmed.starts_with('>') {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `text` with inline code and quoted passages replaced by ` x `: a
/// question in a quote or a log line is not the agent's. A short quote
/// without a question mark is kept (see [`SHORT_QUOTE_CHARS`]).
fn unquoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((at, open, close)) = [("`", "`"), ("\"", "\""), ("“", "”")]
        .iter()
        .filter_map(|(o, c)| rest.find(o).map(|i| (i, *o, *c)))
        .min_by_key(|(i, _, _)| *i)
    {
        let after = &rest[at + open.len()..];
        let Some(end) = after.find(close) else {
            break;
        };
        let quoted = &after[..end];
        out.push_str(&rest[..at]);
        if open != "`"
            && quoted.chars().count() <= SHORT_QUOTE_CHARS
            && !quoted.contains(['?', '？'])
        {
            out.push_str(&rest[at..at + open.len() + end + close.len()]);
        } else {
            out.push_str(" x ");
        }
        rest = &after[end + close.len()..];
    }
    out.push_str(rest);
    out
}

/// The answer's paragraphs, normalized, without code and quotes.
fn paragraphs(text: &str) -> Vec<String> {
    normalize(&without_code_and_block_quotes(text))
        .split("\n\n")
        .map(|p| unquoted(p.trim()))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// How many words `text` has, a CJK character counting half.
fn words(text: &str) -> f32 {
    let cjk = text.chars().filter(|c| is_cjk(*c)).count() as f32;
    let latin = text
        .split_whitespace()
        .filter(|w| w.chars().any(|c| c.is_alphanumeric() && !is_cjk(c)))
        .count() as f32;
    latin + cjk / 2.0
}

/// Whether every line of `paragraph` is a list or table item.
fn is_list(paragraph: &str) -> bool {
    paragraph.lines().all(|l| {
        let l = l.trim_start();
        l.starts_with(['-', '*', '•', '|'])
            || l.split_once(['.', ')'])
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    })
}

/// How many paragraphs at the end form the closing: the last one, with the
/// one before it when the last is a sign-off, has no letters, or is a
/// list the one before introduces with a colon.
fn closing_len(paragraphs: &[String]) -> usize {
    let Some(last) = paragraphs.last() else {
        return 0;
    };
    let sign_off = words(last) <= SIGN_OFF_WORDS && !last.contains(['?', '？']);
    let bare = !last.chars().any(char::is_alphanumeric);
    let introduced = paragraphs.len() > 1
        && is_list(last)
        && paragraphs[paragraphs.len() - 2].ends_with([':', '：']);
    if paragraphs.len() > 1 && (sign_off || bare || introduced) {
        2
    } else {
        1
    }
}

/// The answer's closing (see the module docs) and the paragraphs before
/// it.
fn split_closing(text: &str) -> (String, Vec<String>) {
    let mut paragraphs = paragraphs(text);
    let n = closing_len(&paragraphs);
    let closing = paragraphs.split_off(paragraphs.len() - n).join("\n");
    let chars: Vec<char> = closing.chars().collect();
    let start = chars.len().saturating_sub(CLOSING_CHARS);
    (chars[start..].iter().collect(), paragraphs)
}

/// One sentence, with where it sits on its line.
#[derive(Debug, Clone, Copy)]
struct Sentence<'a> {
    text: &'a str,
    /// The first sentence of its line.
    line_start: bool,
    /// The last sentence of its line.
    line_end: bool,
    /// On a heading, list-item or bold line.
    marked: bool,
}

/// The sentences of `text`, line by line: split after `.`, `!`, `?`
/// followed by white space or the line's end, and after `。`, `！`, `？`.
fn sentences(text: &str) -> Vec<Sentence<'_>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let marked = line.starts_with(['#', '-', '*', '•'])
            || line
                .split_once('.')
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        let mut parts = Vec::new();
        let mut start = 0;
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            let end = i + c.len_utf8();
            let split = match c {
                '。' | '！' | '？' => true,
                '.' | '!' | '?' => chars.peek().is_none_or(|(_, n)| n.is_whitespace()),
                _ => false,
            };
            if split {
                parts.push(line[start..end].trim());
                start = end;
            }
        }
        parts.push(line[start..].trim());
        parts.retain(|s| !s.is_empty());
        let n = parts.len();
        for (k, text) in parts.into_iter().enumerate() {
            out.push(Sentence {
                text,
                line_start: k == 0,
                line_end: k + 1 == n,
                marked,
            });
        }
    }
    out
}

/// Whether `sentence` is a question: it ends with a question mark (before
/// closing emphasis, brackets or quotes).
fn is_question(sentence: &str) -> bool {
    sentence
        .trim_end_matches(['*', ')', '）', '"', '”', '_'])
        .ends_with(['?', '？'])
}

/// `sentence` without list markers, emphasis and discourse words ("so").
fn bare(sentence: &str) -> &str {
    let mut s = sentence.trim_start_matches(['#', '-', '*', '•', '_', ' ']);
    if let Some((n, rest)) = s.split_once(['.', ')'])
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
    {
        s = rest.trim_start();
    }
    for lead in LEADS {
        if let Some(rest) = s.strip_prefix(lead) {
            return rest;
        }
    }
    s
}

/// Whether the question `sentences[i]` is an FAQ entry: a "Q:"/"问："
/// line, a question heading, list item or bold line, or a line of its own
/// answered on the next line.
fn faq_entry(sentences: &[Sentence], i: usize) -> bool {
    let s = sentences[i];
    let q = s.text.trim_start_matches(['*', '#', '-', ' ']);
    if q.starts_with("问") || q.starts_with("q:") {
        return true;
    }
    if s.line_start && s.marked {
        return true;
    }
    let answered_below = sentences
        .get(i + 1)
        .is_some_and(|n| n.line_start && !is_question(n.text) && words(n.text) >= SIGN_OFF_WORDS);
    s.line_start && s.line_end && answered_below
}

/// Whether `text` has no addressee: no "you", "I" or "we" (English or
/// Chinese).
fn impersonal(text: &str) -> bool {
    let padded = format!(
        " {} ",
        text.replace(|c: char| !c.is_alphanumeric() && c != '\'', " ")
    );
    ![" you ", " your ", " i ", " i'd ", " i'm ", " we ", " us "]
        .iter()
        .any(|w| padded.contains(w))
        && !has_any(text, &["你", "您", "我"])
}

/// Whether `sentence` offers optional extra work given the answer
/// `context` it is in (see the module docs). A question that asks what or
/// which ("which one should I …?") or offers an alternative to something
/// else (", or should I …?", "还是") is not an offer.
fn optional_offer(sentence: &str, context: &str) -> bool {
    let s = bare(sentence);
    // "which …", or ", which …" / ": which …" inside the sentence.
    let after_separator = |w: &str| {
        s.contains(w)
            && s.match_indices(w)
                .any(|(at, _)| s[..at].ends_with(", ") || s[..at].ends_with(": "))
    };
    let asks_what = WH_STARTS
        .iter()
        .any(|w| s.starts_with(w) || after_separator(w))
        || s.contains('哪');
    let alternative = has_any(s, ALTERNATIVES);
    has_any(s, OFFER_FORMS)
        && !asks_what
        && !alternative
        && (has_any(s, OFFER_EXTRAS) || has_any(context, COMPLETION))
        && !has_any(context, NOT_DONE)
        && !has_any(context, HOLD)
        && !has_any(context, CONDITIONAL)
}

/// Whether `sentence` requests something of the user without a question
/// mark: an imperative ([`REQUEST_STARTS`]), "you … and I'll …", or a
/// Chinese request ("发我", "你…，我就…"), none of them conditional.
fn requests(sentence: &str) -> bool {
    if has_any(sentence, REQUEST_CONDITIONS) {
        return false;
    }
    let imperative = bare(sentence).split([';', ':', '—']).any(|clause| {
        let mut c = clause.trim_start();
        for lead in ["just ", "please ", "then ", "either "] {
            c = c.strip_prefix(lead).unwrap_or(c);
        }
        REQUEST_STARTS.iter().any(|r| c.starts_with(r))
    });
    if imperative || has_any(sentence, REQUEST_ZH) {
        return true;
    }
    let you_then_i = |you: &[&str], then: &[&str]| {
        let first_you = you.iter().filter_map(|y| sentence.find(y)).min();
        let first_then = then.iter().filter_map(|t| sentence.find(t)).min();
        matches!((first_you, first_then), (Some(y), Some(t)) if y < t)
    };
    you_then_i(&["you "], YOU_THEN_I_EN) || you_then_i(&["你", "您"], YOU_THEN_I_ZH)
}

/// What follows "you …" in "you … and I'll …".
const YOU_THEN_I_EN: &[&str] = &["and i'll", "and i will", "then i'll"];
/// What follows "你…" in "你…，我就…".
const YOU_THEN_I_ZH: &[&str] = &["我就", "我再", "我马上", "我立刻", "我好"];

/// Whether the question `sentences[i]` is one the agent waits on: not a
/// tag question, a polite closing, an optional offer, an FAQ entry, a
/// deferred question, or one the text goes on to answer itself.
fn open_question(sentences: &[Sentence], i: usize, context: &str) -> bool {
    let question = bare(sentences[i].text);
    if question.ends_with(", right?") || question.contains("isn't it?") {
        return false;
    }
    if has_any(question, NOT_ASKING) || optional_offer(question, context) {
        return false;
    }
    let rest: Vec<&str> = sentences[i + 1..].iter().map(|s| s.text).collect();
    if has_any(question, DEFERRED) || rest.iter().any(|r| has_any(r, DEFERRED)) {
        return false;
    }
    let next = rest.first().map(|n| bare(n)).unwrap_or_default();
    if ANSWER_STARTS.iter().any(|a| next.starts_with(a)) {
        return false;
    }
    if rest
        .iter()
        .any(|r| has_any(r, HOLD) || has_any(r, CONDITIONAL) || has_any(r, UNRESOLVED))
    {
        return true;
    }
    if faq_entry(sentences, i) {
        return false;
    }
    if impersonal(question) && rest.iter().any(|r| has_any(r, INVESTIGATION)) {
        return false;
    }
    let explains =
        EXPLAINS.iter().any(|w| question.starts_with(w)) || has_any(question, EXPLAINS_ZH);
    if explains && !rest.is_empty() {
        return false;
    }
    let done = rest.iter().any(|r| has_any(r, DONE_MARKERS));
    let pending = rest.iter().any(|r| has_any(r, PENDING_MARKERS));
    !done || pending
}

/// Which of `sentences` are questions someone else asks, reported: one
/// introduced by [`REPORTED`] ("the survey asks: …?") and the questions
/// right after it.
fn reported(sentences: &[Sentence]) -> Vec<bool> {
    let mut out = Vec::with_capacity(sentences.len());
    let mut run = false;
    for s in sentences {
        run = is_question(s.text) && (run || has_any(s.text, REPORTED));
        out.push(run);
    }
    out
}

/// Whether `sentence` asks in so many words: a phrase of [`ASKING_EN`] or
/// [`ASKING_ZH`], or a Chinese "may I" ("我可以…吗").
fn asks(sentence: &str) -> bool {
    has_any(sentence, ASKING_EN)
        || has_any(sentence, ASKING_ZH)
        || (has_any(sentence, ASKS_ZH_WITH_MA) && sentence.contains('吗'))
}

/// "May I …" in Chinese, with a "吗" anywhere in the sentence.
const ASKS_ZH_WITH_MA: &[&str] = &["我可以", "我能"];

/// Whether the closing paragraph asks the user something the agent waits
/// for (rules 1–4 of the module docs); `context` is the whole answer.
fn closing_waits(closing: &str, context: &str) -> bool {
    let sentences = sentences(closing);
    for s in &sentences {
        let text = s.text;
        if has_any(text, NOT_ASKING) || has_any(text, NOT_NEEDED) {
            continue;
        }
        if has_any(text, WAITING) {
            return true;
        }
        if optional_offer(text, context) {
            continue;
        }
        if asks(text) || requests(text) {
            return true;
        }
    }
    if has_any(closing, BLOCKED) && has_any(closing, NEEDS) && !has_any(closing, NOT_NEEDED) {
        return true;
    }
    let last = sentences.len().saturating_sub(1);
    let reported = reported(&sentences);
    (0..sentences.len())
        .filter(|&i| !reported[i])
        .filter(|&i| {
            let s = bare(sentences[i].text);
            is_question(s)
                || (i == last
                    && s.ends_with(char::is_alphanumeric)
                    && QUESTION_STARTS.iter().any(|q| s.starts_with(q)))
        })
        .any(|i| open_question(&sentences, i, context))
}

/// Whether an earlier paragraph asks the user something the work waits
/// on: an open question that asks in so many words, or that is followed
/// by something left open or a condition on its answer.
fn earlier_waits(paragraph: &str, context: &str) -> bool {
    let sentences = sentences(paragraph);
    let reported = reported(&sentences);
    (0..sentences.len())
        .filter(|&i| is_question(sentences[i].text) && !reported[i])
        .any(|i| {
            let held = sentences[i + 1..]
                .iter()
                .any(|r| has_any(r.text, HOLD) || has_any(r.text, CONDITIONAL));
            (asks(sentences[i].text) || held) && open_question(&sentences, i, context)
        })
}

/// Whether `text` asks the user something the agent waits for.
pub fn looks_like_awaiting_user(text: &str) -> bool {
    let (closing, earlier) = split_closing(text);
    if !may_wait(&closing, &earlier) {
        return false;
    }
    waits(&closing, &earlier)
}

/// The rules themselves (see the module docs), on the answer's closing
/// and the paragraphs before it.
fn waits(closing: &str, earlier: &[String]) -> bool {
    let context = format!("{}\n{closing}", earlier.join("\n"));
    closing_waits(closing, &context) || earlier.iter().any(|p| earlier_waits(p, &context))
}

/// The phrases of [`may_wait`], in one automaton (built once per process,
/// ~1 ms: see [`prepare`]).
static TRIGGERS: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    let phrases = [
        WAITING,
        ASKING_EN,
        ASKING_ZH,
        ASKS_ZH_WITH_MA,
        REQUEST_STARTS,
        REQUEST_ZH,
        YOU_THEN_I_EN,
        YOU_THEN_I_ZH,
        BLOCKED,
        QUESTION_STARTS,
    ];
    AhoCorasick::new(phrases.into_iter().flatten()).ok()
});

/// Builds what reading an answer needs, so that a runtime with an
/// `awaiting_user` agent pays for it when it is built, not in its first
/// run's final answer.
pub(crate) fn prepare() {
    LazyLock::force(&TRIGGERS);
}

/// Whether some rule could find the answer waiting: each one needs a
/// question mark or one of these phrases in the closing (or, for an
/// earlier paragraph, a question mark). Most final answers have none, and
/// finding that takes one pass over the closing instead of a search per
/// phrase of every list (~23 000 instructions for "done" before).
fn may_wait(closing: &str, earlier: &[String]) -> bool {
    const QUESTION_MARKS: [char; 2] = ['?', '？'];
    closing.contains(QUESTION_MARKS)
        || earlier.iter().any(|p| p.contains(QUESTION_MARKS))
        // No automaton (it cannot fail to build): the rules decide.
        || TRIGGERS.as_ref().is_none_or(|t| t.is_match(closing))
}

/// The last question of the answer's closing paragraph, or its last
/// sentence: what a detection quotes.
fn quoted_question(answer: &str) -> String {
    let (closing, _) = split_closing(answer);
    let sentences = sentences(&closing);
    sentences
        .iter()
        .rev()
        .find(|s| is_question(s.text))
        .or(sentences.last())
        .map_or_else(String::new, |s| s.text.to_owned())
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
    fn requests_without_a_question_mark_blocks_and_choices_are_waiting() {
        for text in [
            "The report is almost ready. I need the logo in SVG — send it over and I'll finish the cover page.",
            "All set except one thing: the webhook secret. Paste it here and I'll finish the setup.",
            "I can't find the signing certificate in the repo or the vault. I'll need you to upload it before I can publish the build.",
            "The data is ready for the chart, but you haven't told me which metric to plot: revenue or order count.",
            "Two ways: keep the current host or move to the managed one. Your call; I'll start on whichever you pick.",
            "我这边没有发布权限，需要你在后台点一下发布，点完我再检查线上效果。",
            "页面改好了，但首页 banner 用哪张图你还没定，我先放了占位图。",
        ] {
            assert!(looks_like_awaiting_user(text), "{text}");
        }
    }

    #[test]
    fn a_question_mid_report_that_the_work_waits_on_is_waiting() {
        for text in [
            "The invoice template is done.\n\nOne thing: should the footer show the old address or the new one? I've left the old one until you decide.\n\nEverything else is exported to PDF.",
            "Findings so far:\n\n- 3 services use the old TLS config.\n- Should I update the payments service too? It's owned by another team, so I haven't touched it.\n\nThe other two are updated and redeployed.",
        ] {
            assert!(looks_like_awaiting_user(text), "{text}");
        }
        // A question mid-report that the text answers is not.
        assert!(!looks_like_awaiting_user(
            "Summary:\n\nIs the cache the bottleneck? I haven't seen evidence of that: hit rate is 97%.\n\nThe slowness came from N+1 queries; fixed with a join."
        ));
    }

    #[test]
    fn optional_offers_deferred_questions_faq_and_answered_questions_are_not() {
        for text in [
            "The migration ran fine and all 3,200 rows are in the new table. Want me to write a rollback script as well?",
            "Done, the export job runs nightly now. 要不要再加一个导出按钮？",
            "Should we move to the new pricing API eventually? Maybe next year; nothing to do now.",
            "团队周报已发出。下季度要不要引入代码评审机器人？可以在季度规划时再讨论。",
            "如何申请发票？\n在订单详情页点击“申请发票”，填写抬头即可。",
            "I can't reproduce the flaky test locally after 200 runs. It must be CI-specific timing; I added a retry with logging.",
            "Released v2.3.0 to npm. Tell me if anything breaks.",
            "报销单已提交，审批人是张经理，一般两个工作日内处理，不需要你做什么。",
        ] {
            assert!(!looks_like_awaiting_user(text), "{text}");
        }
    }

    #[test]
    fn a_question_reported_from_the_user_does_not_count() {
        assert!(!looks_like_awaiting_user(
            "You asked: shall I proceed?\n\nI proceeded: the migration ran on production and all 1 204 rows were updated."
        ));
    }

    /// Every answer of the labelled corpora and of these tests, read with
    /// and without the pre-check: the same verdict.
    #[test]
    fn the_pre_check_never_hides_what_the_rules_find() {
        let corpora = [
            include_str!("../../../rein/tests/data/awaiting_user.jsonl"),
            include_str!("../../../rein/tests/data/awaiting_user_heldout.jsonl"),
        ];
        let mut answers: Vec<String> = corpora
            .iter()
            .flat_map(|c| c.lines())
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["text"].as_str().map(str::to_owned))
            .collect();
        assert!(answers.len() > 600, "{}", answers.len());
        answers.extend(
            [
                "done",
                "Shall I?",
                "Paste it here",
                "which branch",
                "我可以继续吗",
            ]
            .map(String::from),
        );
        let mut waiting = 0;
        for answer in &answers {
            let (closing, earlier) = split_closing(answer);
            let found = waits(&closing, &earlier);
            assert_eq!(looks_like_awaiting_user(answer), found, "{answer}");
            if found {
                assert!(may_wait(&closing, &earlier), "{answer}");
                waiting += 1;
            }
        }
        assert!(waiting > 200, "{waiting}");
    }
}
