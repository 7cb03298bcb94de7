//! The line rules of the chanting detector: which characters of a streamed
//! answer are content to watch, and where tracking starts afresh.
//!
//! A line's kind is known from at most [`PREFIX_MAX`] of its first
//! characters (after its indentation); only those are ever buffered. This
//! module does not hash or count chunks; see the parent module.
//!
//! **Invariant:** every character is examined in O(1) — at most
//! `PREFIX_MAX` buffered characters are re-read per character — and nothing
//! here grows with the length of a line (checked by the parent module's
//! `a_megabyte_of_layout_without_a_newline_costs_constant_work_per_character`).

/// The longest line start that can leave a line's kind undecided, plus one:
/// nine digits and a `.` may still become a numbered list item.
pub(super) const PREFIX_MAX: usize = 11;

/// What one character of the stream asks of the chunk detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing: the character is skipped or buffered.
    Skip,
    /// Feed this content character.
    Feed(char),
    /// Forget everything seen so far (a structural line starts).
    Reset,
    /// The buffered line start is text: feed [`Lines::take_text`].
    Text,
}

/// Where the current line stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The line's first characters are being read (and buffered).
    Start,
    /// The line's kind is known; its characters are content.
    Content,
    /// The rest of the line is skipped (a fence line, fenced code).
    Skip,
}

/// What a line's first characters make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Undecided,
    /// ```` ``` ```` or `~~~`: opens or closes a fence.
    Fence,
    /// A line inside a fence.
    Fenced,
    /// A heading, list item, table row, border, rule or box line: tracking
    /// resets and the marker is dropped. After a quote marker (`quote`) the
    /// line starts over, so `> - item` is a quoted list item.
    Marker {
        quote: bool,
    },
    Text,
}

/// The line state of one stream.
#[derive(Debug)]
pub(super) struct Lines {
    mode: Mode,
    prefix: [char; PREFIX_MAX],
    len: usize,
    in_fence: bool,
    /// The last fed character was layout, so more layout is dropped.
    in_layout: bool,
    /// Characters read by the line classifier, re-reads included.
    pub(super) classified: u64,
}

impl Lines {
    pub(super) fn new() -> Self {
        Self {
            mode: Mode::Start,
            prefix: ['\0'; PREFIX_MAX],
            len: 0,
            in_fence: false,
            in_layout: false,
            classified: 0,
        }
    }

    /// A new answer starts.
    pub(super) fn start_response(&mut self) {
        self.mode = Mode::Start;
        self.len = 0;
        self.in_fence = false;
        self.in_layout = false;
    }

    /// How many characters are buffered (never more than `PREFIX_MAX`).
    #[cfg(test)]
    pub(super) fn buffered(&self) -> usize {
        self.len
    }

    /// Reads one character of the stream.
    #[inline]
    pub(super) fn step(&mut self, c: char) -> Step {
        match self.mode {
            Mode::Content => self.content(c),
            Mode::Skip => {
                if c == '\n' {
                    self.mode = Mode::Start;
                }
                Step::Skip
            }
            Mode::Start => self.line_start(c),
        }
    }

    /// A content character: a run of layout characters counts as its first.
    #[inline]
    fn content(&mut self, c: char) -> Step {
        if c == '\n' {
            self.mode = Mode::Start;
        }
        if is_layout(c) {
            if self.in_layout {
                return Step::Skip;
            }
            self.in_layout = true;
        } else {
            self.in_layout = false;
        }
        Step::Feed(c)
    }

    fn line_start(&mut self, c: char) -> Step {
        if self.len == 0 && c != '\n' && c.is_whitespace() {
            return Step::Skip; // indentation
        }
        self.prefix[self.len] = c;
        self.len += 1;
        let prefix = &self.prefix[..self.len];
        self.classified += prefix.len() as u64;
        let ended = c == '\n';
        let kind = match classify(prefix, self.in_fence) {
            // A line that ends, or a start this long, is decided.
            Kind::Undecided if ended || self.len == PREFIX_MAX => {
                if self.in_fence {
                    Kind::Fenced
                } else {
                    Kind::Text
                }
            }
            kind => kind,
        };
        let next_mode = if ended { Mode::Start } else { Mode::Skip };
        match kind {
            Kind::Undecided => Step::Skip,
            Kind::Fence => {
                self.in_fence = !self.in_fence;
                self.len = 0;
                self.mode = next_mode;
                Step::Reset
            }
            Kind::Fenced => {
                self.len = 0;
                self.mode = next_mode;
                Step::Skip
            }
            Kind::Marker { quote } => {
                self.len = 0;
                self.in_layout = true;
                self.mode = if ended || quote {
                    Mode::Start
                } else {
                    Mode::Content
                };
                Step::Reset
            }
            Kind::Text => Step::Text,
        }
    }

    /// After [`Step::Text`]: the buffered line start to feed, in order, with
    /// layout runs collapsed.
    pub(super) fn take_text(&mut self) -> ([char; PREFIX_MAX], usize) {
        let (prefix, len) = (self.prefix, self.len);
        self.len = 0;
        self.mode = Mode::Content;
        let mut out = ['\0'; PREFIX_MAX];
        let mut n = 0;
        for &c in &prefix[..len] {
            if let Step::Feed(c) = self.content(c) {
                out[n] = c;
                n += 1;
            }
        }
        (out, n)
    }
}

/// Layout characters: whitespace, the rule and table characters
/// `- = * _ + |`, and box-drawing and block characters (U+2500–U+259F).
#[inline]
pub(super) fn is_layout(c: char) -> bool {
    if c.is_ascii() {
        matches!(
            c,
            ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c' | '-' | '=' | '*' | '_' | '+' | '|'
        )
    } else {
        matches!(c, '\u{2500}'..='\u{259F}') || c.is_whitespace()
    }
}

/// Classifies a line from its first characters (indentation excluded).
fn classify(p: &[char], in_fence: bool) -> Kind {
    let Some(&first) = p.first() else {
        return Kind::Undecided;
    };
    let run = p.iter().take_while(|&&c| c == first).count();
    if first == '`' || first == '~' {
        if run >= 3 {
            return Kind::Fence;
        }
        if run == p.len() {
            return Kind::Undecided;
        }
    }
    if in_fence {
        return Kind::Fenced;
    }
    let marker = Kind::Marker { quote: false };
    let next = p.get(run).copied();
    match first {
        '>' => Kind::Marker { quote: true },
        '|' | '\u{2500}'..='\u{257F}' => marker,
        // `#` to `######` and a space: a heading.
        '#' => match next {
            None if run <= 6 => Kind::Undecided,
            Some(c) if run <= 6 && c.is_whitespace() => marker,
            _ => Kind::Text,
        },
        // `+-`, `+=`: an ASCII table border; `+ `: a list item.
        '+' => match p.get(1) {
            None => Kind::Undecided,
            Some('-' | '=' | ' ' | '\t') => marker,
            _ => Kind::Text,
        },
        // Three of one: a rule (`===` underlines a setext heading).
        '-' | '*' | '_' | '=' if run >= 3 => marker,
        '-' | '*' | '_' | '=' => match next {
            None => Kind::Undecided,
            Some(' ' | '\t') if run == 1 && matches!(first, '-' | '*') => marker,
            _ => Kind::Text,
        },
        '0'..='9' => {
            let digits = p.iter().take_while(|c| c.is_ascii_digit()).count();
            match (p.get(digits), p.get(digits + 1)) {
                _ if digits > 9 => Kind::Text,
                (None, _) | (Some('.' | ')'), None) => Kind::Undecided,
                (Some('.' | ')'), Some(' ' | '\t')) => marker,
                _ => Kind::Text,
            }
        }
        _ => Kind::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `text` feeds, with `|` for each reset.
    fn fed(text: &str) -> String {
        let mut lines = Lines::new();
        let mut out = String::new();
        for c in text.chars() {
            match lines.step(c) {
                Step::Skip => {}
                Step::Feed(c) => out.push(c),
                Step::Reset => out.push('|'),
                Step::Text => {
                    let (chars, n) = lines.take_text();
                    out.extend(&chars[..n]);
                }
            }
        }
        out
    }

    #[test]
    fn markers_reset_and_are_dropped_but_the_content_after_them_is_fed() {
        assert_eq!(
            fed("- one\n* two\n+ three\n12. four\n3) five\n"),
            "|one\n|two\n|three\n|four\n|five\n"
        );
        assert_eq!(fed("# Title\n###### Six\n"), "|Title\n|Six\n");
        assert_eq!(
            fed("> quoted\n> - quoted item\n"),
            "|quoted\n||quoted item\n"
        );
        assert_eq!(fed("| a | b |\n"), "|a b ");
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_fed_whole() {
        assert_eq!(fed("#hashtag\n"), "#hashtag\n");
        assert_eq!(fed("####### seven\n"), "####### seven\n");
        assert_eq!(fed("2024 was long\n"), "2024 was long\n");
        assert_eq!(fed("3.14 is pi\n"), "3.14 is pi\n");
        assert_eq!(fed("--verbose\n"), "-verbose\n");
        assert_eq!(fed("**bold** text\n"), "*bold*text\n");
        assert_eq!(fed("+1 for this\n"), "+1 for this\n");
        assert_eq!(fed("1234567890. ten digits\n"), "1234567890. ten digits\n");
    }

    #[test]
    fn rules_borders_and_box_lines_are_structure() {
        assert_eq!(fed("---\n***\n___\n===\n"), "||||");
        assert_eq!(fed("+---+---+\n"), "|");
        assert_eq!(fed("╭──╮\n│ hi │\n╰──╯\n"), "||hi |");
    }

    #[test]
    fn fences_reset_and_their_content_is_skipped() {
        assert_eq!(fed("a\n```rust\n- x\n# y\n```\nb\n"), "a\n||b\n");
        assert_eq!(fed("  ~~~\n| z |\n  ~~~\n"), "||");
    }

    #[test]
    fn layout_runs_count_as_their_first_character() {
        assert_eq!(fed("a    b\t\t\tc -- d\n\n\n\ne"), "a b\tc d\ne");
    }
}
