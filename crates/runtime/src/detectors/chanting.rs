//! Content chanting (Gemini CLI's "chanting" check): inside one streamed
//! answer, one chunk of `chunk_chars` characters recurring `threshold` times
//! close together.
//!
//! # The rule
//!
//! Every position of the answer's text starts a chunk of `chunk_chars`
//! characters (a sliding window moving one character at a time). A chunk is
//! chanted when it occurs `threshold` times and the mean gap between its
//! last `threshold` occurrences is at most **5 × `chunk_chars`** characters
//! — the rule of Gemini CLI's current code. (The stop-strategy article quotes
//! an older version of it: 1.5 × the chunk size.) Defaults: 50 characters,
//! 10 occurrences.
//!
//! Lines inside code fences (```` ``` ```` or `~~~`), table rows (starting
//! with `|`), list items (`- `, `* `, `+ `, `1. `, `1) `) and horizontal rules
//! are skipped — repetition is normal there — and each such line resets the
//! detector. Counts are in `char`s.
//!
//! # Cost
//!
//! Amortised O(1) per character: two 64-bit polynomial rolling hashes (a
//! 128-bit key; collisions are treated as negligible, so chunks are not
//! compared character by character) are updated per character, and
//! occurrences too far back to be part of a chanting run are swept out
//! every `(threshold - 1) × 5 × chunk_chars` characters, so memory stays
//! within twice that many positions.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use rein_runtime_contract::lifecycle::OnDetect;

use super::{Escalation, Verdict, snippet};

/// The spacing factor of Gemini CLI's current code (the article's older
/// version used 1.5).
pub const MEAN_GAP_FACTOR: usize = 5;

/// The nudge added on the first detection with `nudge_then_stop`.
pub const CHANTING_NUDGE: &str = "You appear to be repeating the same text over and over; change approach and continue without repeating yourself.";

const B1: u64 = 0x100_0000_01b3;
const B2: u64 = 0x9e37_79b9_7f4a_7c15 | 1;

/// Uses the key's first hash as the map's hash.
#[derive(Default)]
struct FirstHalf(u64);

impl Hasher for FirstHalf {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // The key is (h1, h2): keep h1, mix in h2 lightly.
        self.0 = if self.0 == 0 {
            n
        } else {
            self.0 ^ n.rotate_left(17)
        };
    }
}

type Key = (u64, u64);

/// How a line is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Not classified yet: its first characters are buffered.
    Pending,
    /// Ordinary text: fed to the chunk detector.
    Text,
    /// Skipped (fence line, fenced content, table row, list item, rule).
    Skip,
}

/// The content-chanting detector of one stream (see the module docs).
#[derive(Debug)]
pub struct ChantingDetector {
    chunk: usize,
    threshold: usize,
    escalation: Escalation,
    // Line classification.
    line: Line,
    pending: String,
    in_fence: bool,
    // The rolling window: the last `chunk` characters, a ring indexed by
    // `pos % chunk` once full.
    window: Vec<u32>,
    h1: u64,
    h2: u64,
    pow1: u64,
    pow2: u64,
    /// Characters fed since the last reset; the next chunk ends here.
    pos: usize,
    occurrences: HashMap<Key, Occurrences, BuildHasherDefault<FirstHalf>>,
}

/// The recent start positions of one chunk. Most chunks of ordinary text
/// occur once, so the first position is stored inline and a queue is
/// allocated only for a chunk that recurs.
#[derive(Debug)]
enum Occurrences {
    One(usize),
    Many(VecDeque<usize>),
}

impl Occurrences {
    fn front(&self) -> Option<usize> {
        match self {
            Self::One(p) => Some(*p),
            Self::Many(q) => q.front().copied(),
        }
    }

    fn last(&self) -> usize {
        match self {
            Self::One(p) => *p,
            Self::Many(q) => q.back().copied().unwrap_or(0),
        }
    }

    /// Adds `position`, keeping at most `keep`; returns how many are kept.
    fn push(&mut self, position: usize, keep: usize) -> usize {
        if let Self::One(first) = *self {
            let mut q = VecDeque::with_capacity(keep.min(16));
            q.push_back(first);
            *self = Self::Many(q);
        }
        match self {
            Self::Many(q) => {
                q.push_back(position);
                if q.len() > keep {
                    q.pop_front();
                }
                q.len()
            }
            Self::One(_) => 1,
        }
    }
}

impl ChantingDetector {
    /// `None` when disabled (a chunk of 0 or a threshold below 2).
    pub fn new(chunk_chars: usize, threshold: usize, on_detect: OnDetect) -> Option<Self> {
        (chunk_chars > 0 && threshold >= 2).then(|| Self {
            chunk: chunk_chars,
            threshold,
            escalation: Escalation::new(on_detect),
            line: Line::Pending,
            pending: String::new(),
            in_fence: false,
            window: Vec::with_capacity(chunk_chars.min(1024)),
            h1: 0,
            h2: 0,
            pow1: pow(B1, chunk_chars),
            pow2: pow(B2, chunk_chars),
            pos: 0,
            // Sized for the positions that can be live at once, so a long
            // stream never rehashes.
            occurrences: HashMap::with_capacity_and_hasher(
                live_positions(chunk_chars, threshold),
                BuildHasherDefault::default(),
            ),
        })
    }

    /// Forgets the previous answer (the escalation state is kept).
    pub fn start_response(&mut self) {
        self.reset_chunks();
        self.line = Line::Pending;
        self.pending.clear();
        self.in_fence = false;
    }

    fn reset_chunks(&mut self) {
        self.window.clear();
        self.h1 = 0;
        self.h2 = 0;
        self.pos = 0;
        self.occurrences.clear();
    }

    /// Feeds streamed text; a verdict when chanting is detected.
    pub fn observe(&mut self, text: &str) -> Option<Verdict> {
        for c in text.chars() {
            if let Some(v) = self.feed_char(c) {
                return Some(v);
            }
        }
        None
    }

    fn feed_char(&mut self, c: char) -> Option<Verdict> {
        match self.line {
            Line::Text => {
                if c == '\n' {
                    self.line = Line::Pending;
                }
                self.push(c)
            }
            Line::Skip => {
                if c == '\n' {
                    self.line = Line::Pending;
                }
                None
            }
            Line::Pending => {
                self.pending.push(c);
                let ended = c == '\n';
                match classify(&self.pending, ended, self.in_fence) {
                    None => None,
                    Some(Class::Fence) => {
                        self.in_fence = !self.in_fence;
                        self.skip_line(ended);
                        None
                    }
                    Some(Class::Skip) => {
                        self.skip_line(ended);
                        None
                    }
                    Some(Class::Text) => {
                        self.line = if ended { Line::Pending } else { Line::Text };
                        let pending = std::mem::take(&mut self.pending);
                        let mut verdict = None;
                        for p in pending.chars() {
                            if verdict.is_none() {
                                verdict = self.push(p);
                            }
                        }
                        self.pending = pending;
                        self.pending.clear();
                        verdict
                    }
                }
            }
        }
    }

    fn skip_line(&mut self, ended: bool) {
        self.pending.clear();
        self.reset_chunks();
        self.line = if ended { Line::Pending } else { Line::Skip };
    }

    /// Adds one character of ordinary text to the rolling window.
    fn push(&mut self, c: char) -> Option<Verdict> {
        let v = u64::from(u32::from(c)) + 1;
        self.h1 = self.h1.wrapping_mul(B1).wrapping_add(v);
        self.h2 = self.h2.wrapping_mul(B2).wrapping_add(v);
        let slot = self.pos % self.chunk;
        if self.window.len() < self.chunk {
            self.window.push(u32::from(c));
        } else {
            let out = u64::from(std::mem::replace(&mut self.window[slot], u32::from(c))) + 1;
            self.h1 = self.h1.wrapping_sub(out.wrapping_mul(self.pow1));
            self.h2 = self.h2.wrapping_sub(out.wrapping_mul(self.pow2));
        }
        self.pos += 1;
        if self.pos < self.chunk {
            return None;
        }
        let start = self.pos - self.chunk;
        self.record(start, (self.h1, self.h2))
    }

    fn record(&mut self, start: usize, key: Key) -> Option<Verdict> {
        // Occurrences further back than this can never be part of a run of
        // `threshold` occurrences ending here with a small enough mean gap.
        // Forgetting them is only for memory (a stale position can never pass
        // the mean-gap check), so it is done in a sweep every `span`
        // characters: amortised O(1) per character.
        let span = max_span(self.chunk, self.threshold).max(1);
        if start.is_multiple_of(span) && start > 0 {
            self.occurrences
                .retain(|_, o| o.last().saturating_add(span) >= start);
        }
        let (kept, first) = match self.occurrences.entry(key) {
            Entry::Vacant(v) => {
                v.insert(Occurrences::One(start));
                (1, start)
            }
            Entry::Occupied(mut o) => {
                let kept = o.get_mut().push(start, self.threshold);
                (kept, o.get().front().unwrap_or(start))
            }
        };
        if kept < self.threshold {
            return None;
        }
        // A mean gap of at most 5 × chunk over `threshold - 1` gaps, exactly
        // (no rounding): the span may be at most (threshold - 1) × 5 × chunk.
        if start - first > max_span(self.chunk, self.threshold) {
            return None;
        }
        let mean_gap = (start - first) / (self.threshold - 1);
        // The ring's oldest character sits at `pos % chunk`.
        let oldest = self.pos % self.chunk;
        let chunk: String = self.window[oldest..]
            .iter()
            .chain(&self.window[..oldest])
            .filter_map(|c| char::from_u32(*c))
            .collect();
        let detail = format!(
            "a {}-character chunk recurred {} times with a mean gap of {mean_gap} characters: \"{}\"",
            self.chunk,
            self.threshold,
            snippet(&chunk, 60)
        );
        let verdict = self
            .escalation
            .fire("content_chanting", detail, CHANTING_NUDGE);
        self.reset_chunks();
        Some(verdict)
    }
}

/// The largest distance between the first and last of `threshold`
/// occurrences whose mean gap is allowed.
fn max_span(chunk: usize, threshold: usize) -> usize {
    threshold
        .saturating_sub(1)
        .saturating_mul(MEAN_GAP_FACTOR)
        .saturating_mul(chunk)
}

/// How many chunk positions can be live at once between two sweeps (capped
/// for preallocation).
fn live_positions(chunk: usize, threshold: usize) -> usize {
    max_span(chunk, threshold)
        .saturating_mul(2)
        .saturating_add(1)
        .min(1 << 16)
}

fn pow(base: u64, exp: usize) -> u64 {
    base.wrapping_pow(u32::try_from(exp).unwrap_or(u32::MAX))
}

enum Class {
    Fence,
    Skip,
    Text,
}

/// Classifies a line from its first characters; `None` while undecided.
fn classify(pending: &str, ended: bool, in_fence: bool) -> Option<Class> {
    let t = pending.trim_start_matches([' ', '\t']);
    let t = t.strip_suffix('\n').unwrap_or(t);
    if t.starts_with("```") || t.starts_with("~~~") {
        return Some(Class::Fence);
    }
    if !ended && ("```".starts_with(t) || "~~~".starts_with(t)) {
        return None; // maybe a fence, maybe empty so far
    }
    if in_fence {
        return Some(Class::Skip);
    }
    if t.starts_with('|') {
        return Some(Class::Skip);
    }
    // Horizontal rules: only rule characters (decided at the line's end).
    if !t.is_empty() && t.chars().all(|c| matches!(c, '-' | '=' | '*' | '_' | ' ')) {
        if ended {
            return Some(if t.chars().filter(|c| *c != ' ').count() >= 3 {
                Class::Skip
            } else {
                Class::Text
            });
        }
        if t.len() == 1 {
            return None; // "-", "*": a list item or a rule
        }
        if t.starts_with("- ") || t.starts_with("* ") {
            // "- - -" is a rule, "- item" a list item: both are skipped.
            return Some(Class::Skip);
        }
        return None;
    }
    if t.starts_with("- ") || t.starts_with("* ") || t.starts_with("+ ") {
        return Some(Class::Skip);
    }
    if !ended && t == "+" {
        return None;
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits <= 9 {
        let rest = &t[digits..];
        if rest.starts_with(". ") || rest.starts_with(") ") {
            return Some(Class::Skip);
        }
        if !ended && (rest.is_empty() || rest == "." || rest == ")") {
            return None;
        }
    }
    Some(Class::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> ChantingDetector {
        ChantingDetector::new(50, 10, OnDetect::Stop).unwrap()
    }

    fn fed_in_pieces(
        d: &mut ChantingDetector,
        text: &str,
        piece: usize,
    ) -> Option<(usize, Verdict)> {
        let chars: Vec<char> = text.chars().collect();
        let mut fed = 0;
        for p in chars.chunks(piece) {
            let s: String = p.iter().collect();
            fed += p.len();
            if let Some(v) = d.observe(&s) {
                return Some((fed, v));
            }
        }
        None
    }

    const SENTENCE: &str = "The answer is forty-two, as computed before. ";

    #[test]
    fn a_sentence_chanted_over_and_over_is_detected_early() {
        let text = SENTENCE.repeat(40);
        let mut d = detector();
        let (fed, verdict) = fed_in_pieces(&mut d, &text, 7).expect("chanting must be detected");
        assert!(
            fed < text.chars().count() / 2,
            "detected after {fed} characters"
        );
        match verdict {
            Verdict::Stop(r) => {
                assert_eq!(r.code, "content_chanting");
                assert!(
                    r.detail
                        .starts_with("a 50-character chunk recurred 10 times"),
                    "{}",
                    r.detail
                );
            }
            Verdict::Nudge(_) => panic!("stop by default"),
        }
    }

    #[test]
    fn varied_prose_is_not_chanting() {
        let text: String = (0..400)
            .map(|i| format!("Sentence number {i} says something new. "))
            .collect();
        assert!(fed_in_pieces(&mut detector(), &text, 13).is_none());
    }

    #[test]
    fn repeats_below_the_threshold_are_not_chanting() {
        let d = &mut ChantingDetector::new(20, 5, OnDetect::Stop).unwrap();
        let text = format!(
            "{}{}",
            "abcdefghijklmnopqrstuvwxyz! ".repeat(4),
            "and then something else entirely."
        );
        assert!(fed_in_pieces(d, &text, 5).is_none());
    }

    #[test]
    fn repeated_lines_in_code_fences_tables_and_lists_do_not_count() {
        let fenced = format!(
            "Here is the code:\n```\n{}```\nDone.\n",
            "println!(\"the same line again and again and again\");\n".repeat(40)
        );
        assert!(fed_in_pieces(&mut detector(), &fenced, 9).is_none());
        let table = format!(
            "| a | b |\n|---|---|\n{}",
            "| the same cell content, row after row | 1 |\n".repeat(40)
        );
        assert!(fed_in_pieces(&mut detector(), &table, 9).is_none());
        let list = "- the same list item repeated for every entry here\n".repeat(40);
        assert!(fed_in_pieces(&mut detector(), &list, 9).is_none());
        let numbered: String = (1..40)
            .map(|i| format!("{i}. the same list item repeated for every entry here\n"))
            .collect();
        assert!(fed_in_pieces(&mut detector(), &numbered, 9).is_none());
    }

    #[test]
    fn chanting_after_a_fence_closes_is_detected() {
        let text = format!("```\ncode\n```\n{}", SENTENCE.repeat(40));
        assert!(fed_in_pieces(&mut detector(), &text, 11).is_some());
    }

    #[test]
    fn spacing_wider_than_five_chunks_is_not_chanting() {
        // The same 50 characters recur every 300 characters (> 5 × 50).
        let mut text = String::new();
        for i in 0..30 {
            let filler: String = (0..32).map(|j| format!("{i:03}:{j:03};")).collect();
            text.push_str("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN");
            text.push_str(&filler[..250]);
        }
        let mut d = ChantingDetector::new(50, 10, OnDetect::Stop).unwrap();
        assert!(fed_in_pieces(&mut d, &text, 64).is_none());
    }

    /// A 50-character chunk, then unique filler up to the next occurrence,
    /// once per gap.
    fn spaced(gaps: &[usize]) -> String {
        let chunk = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
        let mut text = String::new();
        let mut n = 0;
        for &gap in gaps {
            text.push_str(chunk);
            let mut filler = String::new();
            while filler.len() < gap - 50 {
                filler.push_str(&format!("<{n:05}>"));
                n += 1;
            }
            text.push_str(&filler[..gap - 50]);
        }
        text
    }

    #[test]
    fn the_mean_gap_limit_is_exact() {
        // Ten occurrences 250 apart: a mean gap of exactly 5 × 50.
        assert!(fed_in_pieces(&mut detector(), &spaced(&[250; 10]), 64).is_some());
        // One gap of 251: a mean of 250.1, just over the limit (rounding
        // the mean down would wrongly accept it).
        let mut gaps = [250; 10];
        gaps[8] = 251;
        assert!(fed_in_pieces(&mut detector(), &spaced(&gaps), 64).is_none());
    }

    #[test]
    fn huge_settings_do_not_allocate_or_spin() {
        let mut d = ChantingDetector::new(1 << 40, 10, OnDetect::Stop).unwrap();
        assert!(d.observe("some text").is_none());
    }

    #[test]
    fn nudge_then_stop_nudges_first_and_resets() {
        let mut d = ChantingDetector::new(50, 10, OnDetect::NudgeThenStop).unwrap();
        let text = SENTENCE.repeat(40);
        assert!(matches!(d.observe(&text), Some(Verdict::Nudge(_))));
        d.start_response();
        assert!(matches!(d.observe(&text), Some(Verdict::Stop(_))));
    }

    #[test]
    fn memory_stays_bounded_on_long_varied_streams() {
        let mut d = detector();
        for i in 0..20_000 {
            assert!(d.observe(&format!("{i:08x} ")).is_none());
        }
        assert!(
            d.occurrences.len() <= 2 * 9 * 5 * 50 + 1,
            "{}",
            d.occurrences.len()
        );
    }

    #[test]
    fn disabled_settings_build_no_detector() {
        assert!(ChantingDetector::new(0, 10, OnDetect::Stop).is_none());
        assert!(ChantingDetector::new(50, 1, OnDetect::Stop).is_none());
    }
}
