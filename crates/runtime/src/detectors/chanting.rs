//! Content chanting (Gemini CLI's "chanting" check): inside one streamed
//! answer, one chunk of `chunk_chars` characters recurring `threshold` times
//! close together, the text between its occurrences repeating too.
//!
//! # The rule
//!
//! Every position of the watched text starts a chunk of `chunk_chars`
//! characters (a sliding window moving one character at a time). A chunk is
//! chanted when it occurs `threshold` times, the mean gap between its last
//! `threshold` occurrences is at most **5 × `chunk_chars`** characters — the
//! rule of Gemini CLI's current code (the stop-strategy article quotes an
//! older version of it: 1.5 × the chunk size) — and the `threshold − 1`
//! stretches of text from one of those occurrences to the next take at most
//! `threshold / 2` distinct values. That last test, also Gemini CLI's, tells
//! a loop (one stretch, again and again) from a list of distinct items that
//! share a long prefix. Defaults: 50 characters, 10 occurrences.
//!
//! # What is watched
//!
//! Markdown and text drawings repeat by design, so (see `lines`):
//!
//! - a line that starts (after its indentation) a code fence (```` ``` ````,
//!   `~~~`), a heading (`#` to `######` and a space), a blockquote (`>`), a
//!   list item (`- `, `* `, `+ `, `1. `, `1) `), a table row (`|`), an ASCII
//!   table border (`+-`, `+=`), a rule (`---`, `***`, `___`, `===`) or a box
//!   line (a box-drawing character, U+2500–U+257F) **resets** the detector;
//!   its marker is dropped and the rest of the line is watched — so a chant
//!   inside one long bullet or table row is still caught;
//! - fence lines and the lines between fences are skipped;
//! - **layout** — whitespace (newlines too), `- = * _ + |`, and box-drawing
//!   and block characters (U+2500–U+259F) — is collapsed: a run of layout
//!   characters counts as its first one. A border, a rule or a stretch of
//!   spaces is therefore never a chant, and sentences keep their shape.
//!
//! Counts are in watched `char`s (a layout run is one).
//!
//! # Cost
//!
//! O(1) amortised per character on every input, in memory bounded by the
//! settings, never by the stream (checked by
//! `a_megabyte_of_layout_without_a_newline_costs_constant_work_per_character`
//! and `watched_state_stays_within_its_bounds_on_a_long_chant_free_line`):
//!
//! - a line's kind is decided from at most 11 buffered characters;
//! - each watched character extends two 64-bit polynomial prefix hashes.
//!   Chunks and the text between occurrences are compared by these 128-bit
//!   hashes, never character by character (collisions are treated as
//!   negligible). The last `span + chunk_chars + 1` of them are kept in a
//!   ring, where `span = (threshold − 1) × 5 × chunk_chars`, each position
//!   linked to the previous occurrence of its chunk;
//! - the newest start of each chunk is indexed in two generations of `span`
//!   positions; a new generation drops the oldest wholesale, so at most
//!   `2 × span` starts are indexed and none is deleted one by one;
//! - a reset only moves a floor position;
//! - a chunk with `threshold` close occurrences costs a walk back over them,
//!   O(`threshold` × log `threshold`).

mod lines;

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use rein_runtime_contract::escalation::Ladder;
use rein_runtime_contract::lifecycle::OnDetect;

use self::lines::{Lines, Step};
use super::{Escalation, Verdict, snippet};

/// The spacing factor of Gemini CLI's current code (the article's older
/// version used 1.5).
pub const MEAN_GAP_FACTOR: usize = 5;

/// The ring's first allocation, in slots; it doubles up to its size as
/// text streams.
const INITIAL_RING: usize = 64;

/// The nudge added on the first detection with `nudge_then_stop`.
pub const CHANTING_NUDGE: &str = "You appear to be repeating the same text over and over; change approach and continue without repeating yourself.";

const B1: u64 = 0x100_0000_01b3;
const B2: u64 = 0x9e37_79b9_7f4a_7c15 | 1;

/// Two 64-bit hashes of one stretch of text.
type Key = (u64, u64);

/// The content-chanting detector of one stream (see the module docs).
#[derive(Debug)]
pub struct ChantingDetector {
    escalation: Escalation,
    lines: Lines,
    chunks: Chunks,
}

impl ChantingDetector {
    /// `None` when disabled (a chunk of 0 or a threshold below 2).
    pub fn new(chunk_chars: usize, threshold: usize, on_detect: OnDetect) -> Option<Self> {
        (chunk_chars > 0 && threshold >= 2).then(|| Self {
            escalation: Escalation::new(on_detect),
            lines: Lines::new(),
            chunks: Chunks::new(chunk_chars, threshold),
        })
    }

    /// Climbs `ladder` on each detection instead of `on_detect`'s (`deny`
    /// does not apply: chanting is not a tool call).
    pub fn with_ladder(mut self, ladder: Ladder) -> Self {
        self.escalation = Escalation::with_ladder(ladder);
        self
    }

    /// Forgets the previous answer (the escalation state is kept).
    pub fn start_response(&mut self) {
        self.chunks.reset();
        self.lines.start_response();
    }

    /// Feeds streamed text; a verdict when chanting is detected.
    pub fn observe(&mut self, text: &str) -> Option<Verdict> {
        for c in text.chars() {
            let found = match self.lines.step(c) {
                Step::Skip => None,
                Step::Feed(c) => self.chunks.push(c),
                Step::Reset => {
                    self.chunks.reset();
                    None
                }
                Step::Text => {
                    let (chars, n) = self.lines.take_text();
                    chars[..n].iter().find_map(|&c| self.chunks.push(c))
                }
            };
            if let Some(found) = found {
                return Some(self.fire(&found));
            }
        }
        None
    }

    fn fire(&mut self, found: &Chanted) -> Verdict {
        let detail = format!(
            "a {}-character chunk recurred {} times with a mean gap of {} characters: \"{}\"",
            self.chunks.chunk,
            self.chunks.threshold,
            found.mean_gap,
            snippet(&found.chunk, 60)
        );
        self.chunks.reset();
        self.escalation
            .fire("content_chanting", detail, CHANTING_NUDGE)
    }
}

/// A detection: the chanted chunk and its mean gap.
#[derive(Debug)]
struct Chanted {
    chunk: String,
    mean_gap: usize,
}

/// The chunk detector over the watched characters since the last reset.
#[derive(Debug)]
struct Chunks {
    chunk: usize,
    threshold: usize,
    /// The largest distance between the first and last of `threshold`
    /// occurrences whose mean gap is allowed.
    span: usize,
    text: Prefixes,
    /// The newest start of each chunk (keyed by its first hash) seen in the
    /// current generation of `span` positions…
    heads: Heads,
    /// …and in the generation before it: together they cover at least the
    /// last `span` positions, and older starts are dropped with a generation.
    older: Heads,
    /// The chunk start at which the current generation ends.
    generation_end: usize,
    /// The position of the last reset: chunks starting before it are
    /// forgotten. (Positions keep counting across resets, so a reset is O(1).)
    floor: usize,
    /// Scratch space for the periods of one check.
    periods: Vec<Key>,
}

type Heads = HashMap<u64, usize, super::ByHash>;

impl Chunks {
    fn new(chunk: usize, threshold: usize) -> Self {
        let span = threshold
            .saturating_sub(1)
            .saturating_mul(MEAN_GAP_FACTOR)
            .saturating_mul(chunk);
        // P(start − span) to P(start + chunk) must still be in the ring.
        let ring = span
            .saturating_add(chunk)
            .saturating_add(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
        // The maps and the ring grow with what is streamed (a generation
        // holds at most `span` starts): most answers are short, and sizing
        // them for the longest stream cost every run ~200 KB allocated and
        // freed. A long stream pays a few early rehashes, then none
        // (generations keep their capacity).
        Self {
            chunk,
            threshold,
            span,
            text: Prefixes::new(chunk, ring),
            heads: Heads::default(),
            older: Heads::default(),
            generation_end: span.max(1),
            floor: 0,
            periods: Vec::new(),
        }
    }

    fn reset(&mut self) {
        self.floor = self.text.len;
    }

    /// Adds one watched character; the detection it completes, if any.
    #[inline]
    fn push(&mut self, c: char) -> Option<Chanted> {
        self.text.push(c);
        let start = self.text.len.checked_sub(self.chunk)?;
        if start < self.floor {
            return None;
        }
        self.record(start, self.text.window(start))
    }

    fn record(&mut self, start: usize, key: Key) -> Option<Chanted> {
        let span = self.span;
        if start >= self.generation_end {
            // O(buckets) once per `span` positions (a memset: the values
            // need no drop), so amortised O(1) per character.
            std::mem::swap(&mut self.heads, &mut self.older);
            self.heads.clear();
            self.generation_end = start.saturating_add(span.max(1));
        }
        let newest = match self.heads.entry(key.0) {
            Entry::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), start)),
            Entry::Vacant(v) => {
                v.insert(start);
                self.older.get(&key.0).copied()
            }
        };
        // The previous occurrence, when it can be part of a chanting run: a
        // gap wider than `span` fails the mean-gap check of every run it is
        // part of.
        let previous =
            newest.filter(|&q| q >= self.floor && start - q <= span && self.text.window(q) == key);
        let link = previous.and_then(|q| u32::try_from(start - q).ok());
        let Some(gap) = link.filter(|&gap| gap > 0) else {
            self.text.link(start, 0, 1);
            return None;
        };
        let cap = u32::try_from(self.threshold).unwrap_or(u32::MAX);
        let count = self
            .text
            .slot(start - gap as usize)
            .count
            .saturating_add(1)
            .min(cap);
        self.text.link(start, gap, count);
        if (count as usize) < self.threshold {
            return None;
        }
        // Walk back over the last `threshold` occurrences: a mean gap of at
        // most 5 × chunk over `threshold − 1` gaps, exactly (no rounding),
        // is a span of at most (threshold − 1) × 5 × chunk.
        self.periods.clear();
        let mut first = start;
        for _ in 1..self.threshold {
            let gap = self.text.slot(first).gap as usize;
            if gap == 0 || start - (first - gap) > span {
                return None;
            }
            self.periods.push(self.text.period(first - gap, first));
            first -= gap;
        }
        self.periods.sort_unstable();
        self.periods.dedup();
        if self.periods.len() > self.threshold / 2 {
            return None; // distinct items sharing a prefix, not a loop
        }
        Some(Chanted {
            chunk: self.text.chars(start),
            mean_gap: (start - first) / (self.threshold - 1),
        })
    }
}

/// The watched text of the stream as prefix hashes: P(i) hashes its first
/// `i` characters, so any stretch of the last `ring` positions hashes in
/// O(1) as P(end) − P(start) × B^(end − start).
#[derive(Debug)]
struct Prefixes {
    /// Slot `i & mask` holds P(i), character `i − 1` and the link of the
    /// chunk starting at `i`. It grows up to `mask + 1` slots, so absurd
    /// settings allocate only what is streamed.
    ring: Vec<Slot>,
    mask: usize,
    /// Characters watched so far.
    len: usize,
    /// P(len).
    hash: Key,
    chunk: usize,
    /// B^chunk.
    pow_chunk: Key,
    /// B^n for the period lengths n met so far (at most `span + 1`).
    pows: Vec<Key>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: Key,
    c: char,
    /// The distance back to the previous occurrence of the chunk starting
    /// here (0: none close enough).
    gap: u32,
    /// How many occurrences that chain of links holds, capped at the
    /// threshold.
    count: u32,
}

impl Prefixes {
    fn new(chunk: usize, ring: usize) -> Self {
        let empty = Slot {
            hash: (0, 0),
            c: '\0',
            gap: 0,
            count: 0,
        };
        let mut slots = Vec::with_capacity(ring.min(INITIAL_RING));
        slots.push(empty);
        Self {
            ring: slots,
            mask: ring - 1,
            len: 0,
            hash: (0, 0),
            chunk,
            pow_chunk: (pow(B1, chunk), pow(B2, chunk)),
            pows: vec![(1, 1)],
        }
    }

    #[inline]
    fn push(&mut self, c: char) {
        let v = u64::from(c) + 1;
        self.hash = (
            self.hash.0.wrapping_mul(B1).wrapping_add(v),
            self.hash.1.wrapping_mul(B2).wrapping_add(v),
        );
        self.len += 1;
        let slot = Slot {
            hash: self.hash,
            c,
            gap: 0,
            count: 0,
        };
        let i = self.len & self.mask;
        if i < self.ring.len() {
            self.ring[i] = slot;
        } else {
            self.ring.push(slot);
        }
    }

    #[inline]
    fn slot(&self, i: usize) -> Slot {
        self.ring[i & self.mask]
    }

    fn link(&mut self, start: usize, gap: u32, count: u32) {
        let slot = &mut self.ring[start & self.mask];
        slot.gap = gap;
        slot.count = count;
    }

    /// The hashes of the chunk starting at `start`.
    #[inline]
    fn window(&self, start: usize) -> Key {
        self.stretch(start, start + self.chunk, self.pow_chunk)
    }

    /// The hashes of the text from `from` up to `to`.
    fn period(&mut self, from: usize, to: usize) -> Key {
        let n = to - from;
        while self.pows.len() <= n {
            let last = self.pows[self.pows.len() - 1];
            self.pows
                .push((last.0.wrapping_mul(B1), last.1.wrapping_mul(B2)));
        }
        self.stretch(from, to, self.pows[n])
    }

    #[inline]
    fn stretch(&self, from: usize, to: usize, pow: Key) -> Key {
        let (a, b) = (self.slot(from).hash, self.slot(to).hash);
        (
            b.0.wrapping_sub(a.0.wrapping_mul(pow.0)),
            b.1.wrapping_sub(a.1.wrapping_mul(pow.1)),
        )
    }

    /// The chunk starting at `start`.
    fn chars(&self, start: usize) -> String {
        (start + 1..=start + self.chunk)
            .map(|i| self.slot(i).c)
            .collect()
    }
}

/// `base` to the power `exp`, wrapping, by squaring.
fn pow(mut base: u64, mut exp: usize) -> u64 {
    let mut acc: u64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
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
            other => panic!("stop by default, got {other:?}"),
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
        // The same 300 characters recur: the 50-character chunk every 300
        // characters (> 5 × 50).
        assert!(fed_in_pieces(&mut detector(), &spaced(&[300; 30]), 64).is_none());
    }

    /// A 50-character chunk, then filler up to the next occurrence, once
    /// per gap. The filler is the same text every time (cut to the gap), so
    /// the periods repeat and only the gaps differ.
    fn spaced(gaps: &[usize]) -> String {
        let chunk = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
        let filler: String = (0..200).map(|n| format!("<{n:05}>")).collect();
        let mut text = String::new();
        for &gap in gaps {
            text.push_str(chunk);
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
        for chunk in [1 << 40, usize::MAX] {
            let mut d = ChantingDetector::new(chunk, usize::MAX, OnDetect::Stop).unwrap();
            assert!(d.observe("some text").is_none());
        }
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
            d.chunks.heads.len() + d.chunks.older.len() <= 2 * 9 * 5 * 50,
            "{}",
            d.chunks.heads.len() + d.chunks.older.len()
        );
    }

    #[test]
    fn disabled_settings_build_no_detector() {
        assert!(ChantingDetector::new(0, 10, OnDetect::Stop).is_none());
        assert!(ChantingDetector::new(50, 1, OnDetect::Stop).is_none());
    }

    /// 45 characters: nine in a row hold a 50-character chunk only 8 times.
    fn nine_times() -> String {
        SENTENCE.repeat(9)
    }

    #[test]
    fn a_heading_between_two_chanted_stretches_resets_the_count() {
        let with_heading = format!("{}\n## Next\n{}", nine_times(), nine_times());
        assert!(fed_in_pieces(&mut detector(), &with_heading, 7).is_none());
        let without = format!("{}\nNext\n{}", nine_times(), nine_times());
        assert!(fed_in_pieces(&mut detector(), &without, 7).is_some());
    }

    #[test]
    fn a_blockquote_between_two_chanted_stretches_resets_the_count() {
        let with_quote = format!("{}\n> Next\n{}", nine_times(), nine_times());
        assert!(fed_in_pieces(&mut detector(), &with_quote, 7).is_none());
    }

    #[test]
    fn a_report_of_twelve_sections_with_the_same_verdict_is_not_chanting() {
        let report: String = (1..=12)
            .map(|i| {
                format!(
                    "## File src/module_{i:02}.rs\n\n\
                     Verdict: no issues found in this file, all checks passed.\n\n"
                )
            })
            .collect();
        assert!(fed_in_pieces(&mut detector(), &report, 5).is_none());
    }

    #[test]
    fn box_drawing_lines_are_structure_not_chanting() {
        let rule = "─".repeat(80);
        let mut text = format!("╭{rule}╮\n");
        for _ in 0..12 {
            text.push_str("│ ✓ passed, no warnings, no errors, nothing to report │\n");
        }
        text.push_str(&format!("╰{rule}╯\n"));
        assert!(fed_in_pieces(&mut detector(), &text, 9).is_none());
    }

    #[test]
    fn ascii_table_borders_are_structure_not_chanting() {
        let border = format!("{}+\n", "+---".repeat(30));
        let text = format!("{border}{}|\n{border}", "| x ".repeat(30));
        assert!(fed_in_pieces(&mut detector(), &text, 9).is_none());
        // And so is a long border in the middle of a line.
        let inline = format!("Grid: {} end\n", "+---".repeat(30));
        assert!(fed_in_pieces(&mut detector(), &inline, 9).is_none());
    }

    #[test]
    fn lines_sharing_a_long_prefix_are_distinct_items_not_chanting() {
        let prefix = "/home/developers/projects/acme-platform/services/billing/src/handlers/";
        assert_eq!(prefix.chars().count(), 70);
        let listing: String = (0..15)
            .map(|i| {
                format!(
                    "{prefix}{}.rs\n",
                    ["alpha", "beta_two", "gamma_3"][i % 3].repeat(i / 3 + 1)
                )
            })
            .collect();
        assert!(fed_in_pieces(&mut detector(), &listing, 11).is_none());
        // The same line fifteen times is a loop.
        let same = format!("{prefix}alpha.rs\n").repeat(15);
        assert!(fed_in_pieces(&mut detector(), &same, 11).is_some());
    }

    /// 60 characters.
    const LONG_SENTENCE: &str = "Retrying the request now as the last attempt has timed out. ";

    #[test]
    fn a_chant_inside_one_long_list_item_or_table_row_is_detected() {
        assert_eq!(LONG_SENTENCE.chars().count(), 60);
        for marker in ["- ", "* ", "+ ", "1. ", "12) ", "| ", "> "] {
            let text = format!("Intro.\n{marker}{}", LONG_SENTENCE.repeat(40));
            let (fed, _) = fed_in_pieces(&mut detector(), &text, 13)
                .unwrap_or_else(|| panic!("a chant after {marker:?} must be detected"));
            assert!(fed < text.len() / 2, "{marker:?}: detected after {fed}");
        }
    }

    #[test]
    fn a_megabyte_of_layout_without_a_newline_costs_constant_work_per_character() {
        let inputs = [
            " ".repeat(1 << 20),
            "\t".repeat(1 << 20),
            "=".repeat(1 << 20),
            "-".repeat(1 << 20),
            "*".repeat(1 << 20),
            "_".repeat(1 << 20),
            "─".repeat(1 << 18),
            format!("Some words first, then{}", " ".repeat(1 << 20)),
            " \t\n".repeat(1 << 18),
        ];
        for text in inputs {
            let mut d = detector();
            let mut seen = 0;
            for piece in text.as_bytes().chunks(64) {
                let piece = std::str::from_utf8(piece).unwrap_or("");
                assert!(d.observe(piece).is_none());
                seen += piece.chars().count();
                // The line classifier reads each character at most
                // PREFIX_MAX times; a buffer of the unfinished line, re-read
                // per character, fails this from the second piece on.
                assert!(
                    d.lines.classified <= (lines::PREFIX_MAX * seen) as u64,
                    "{} reads for {seen} characters",
                    d.lines.classified
                );
                assert!(d.lines.buffered() < lines::PREFIX_MAX);
            }
            // No layout run is watched past its first character.
            assert!(
                d.chunks.text.ring.len() <= 64,
                "{}",
                d.chunks.text.ring.len()
            );
        }
    }

    #[test]
    fn watched_state_stays_within_its_bounds_on_a_long_chant_free_line() {
        let mut d = detector();
        let text: String = (0..40_000).map(|i| format!("{i:x} ")).collect();
        assert!(fed_in_pieces(&mut d, &text, 64).is_none());
        let ring = (9 * 5 * 50 + 50 + 1usize).next_power_of_two();
        assert!(d.chunks.text.ring.len() <= ring);
        assert!(d.chunks.heads.len() + d.chunks.older.len() <= 2 * 9 * 5 * 50);
    }
}
