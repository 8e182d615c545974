//! Text helpers the filters share: datatrove's punctuation sets, Python's whitespace, stripping
//! and line splitting, and the word and sentence splitting that stands in for datatrove's
//! (spaCy's blank English tokenizer for English in datatrove 0.10.1; these rules follow NLTK's
//! steps, which datatrove uses for other languages: see `filters/mod.rs` for the differences).
//!
//! Everything here borrows from the text (words, lines and sentences are `&str` slices of it),
//! so a document costs no allocation per word.

/// Python's `str.isspace()`: Unicode `White_Space` plus the information separators
/// U+001C..U+001F, which Python's `str.split()` and `str.strip()` also treat as whitespace.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()`.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `s.split()`: the non-empty runs of non-whitespace.
pub(crate) fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|w| !w.is_empty())
}

/// The number of characters (Python's `len`) of `s`.
pub(crate) fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Line boundaries of Python's `str.splitlines()` (`\r\n` counts as one).
fn is_line_boundary(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{0b}'
            | '\u{0c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Python's `s.splitlines()`: no trailing empty line after a final line break, none at all for
/// an empty string.
pub(crate) fn py_splitlines(s: &str) -> PyLines<'_> {
    PyLines { rest: s }
}

/// Iterator of [`py_splitlines`].
pub(crate) struct PyLines<'a> {
    rest: &'a str,
}

impl<'a> Iterator for PyLines<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        match self.rest.char_indices().find(|&(_, c)| is_line_boundary(c)) {
            None => Some(std::mem::take(&mut self.rest)),
            Some((i, c)) => {
                let line = &self.rest[..i];
                let mut next = i + c.len_utf8();
                if c == '\r' && self.rest.as_bytes().get(next) == Some(&b'\n') {
                    next += 1;
                }
                self.rest = &self.rest[next..];
                Some(line)
            }
        }
    }
}

/// The non-ASCII, non-control characters of datatrove's `PUNCTUATION` string (its ASCII part is
/// all of ASCII punctuation, its control part U+0000..U+0008, U+000B..U+001F and
/// U+007F..U+009F), sorted.
const PUNCTUATION_NON_ASCII: &[char] = &[
    '\u{ab}', '\u{b4}', '\u{bb}', '\u{2013}', '\u{2014}', '\u{2019}', '\u{201c}', '\u{201d}',
    '\u{201e}', '\u{2026}', '\u{2236}', '\u{2501}', '\u{25ba}', '\u{3001}', '\u{3002}', '\u{3008}',
    '\u{3009}', '\u{300a}', '\u{300b}', '\u{300c}', '\u{300d}', '\u{3010}', '\u{3011}', '\u{ff01}',
    '\u{ff05}', '\u{ff08}', '\u{ff09}', '\u{ff0c}', '\u{ff0e}', '\u{ff11}', '\u{ff1a}', '\u{ff1b}',
    '\u{ff1f}', '\u{ff5e}',
];

/// datatrove's `TERMINAL_PUNCTUATION` (Unicode's sentence terminators, as datatrove lists them),
/// sorted by code point.
const TERMINAL_PUNCTUATION: &[u32] = &[
    0x21, 0x2E, 0x3F, 0x589, 0x61D, 0x61E, 0x61F, 0x6D4, 0x700, 0x701, 0x702, 0x7F9, 0x837, 0x839,
    0x83D, 0x83E, 0x964, 0x965, 0x104A, 0x104B, 0x1362, 0x1367, 0x1368, 0x166E, 0x1735, 0x1736,
    0x17D4, 0x17D5, 0x17D6, 0x17D9, 0x17DA, 0x1803, 0x1809, 0x1944, 0x1945, 0x1AA8, 0x1AA9, 0x1AAA,
    0x1AAB, 0x1B5A, 0x1B5B, 0x1B5E, 0x1B5F, 0x1B7D, 0x1B7E, 0x1C3B, 0x1C3C, 0x1C7E, 0x1C7F, 0x203C,
    0x203D, 0x2047, 0x2048, 0x2049, 0x2E2E, 0x2E3C, 0x2E53, 0x2E54, 0x3002, 0xA4FF, 0xA60E, 0xA60F,
    0xA6F3, 0xA6F7, 0xA876, 0xA877, 0xA8CE, 0xA8CF, 0xA92F, 0xA9C8, 0xA9C9, 0xAA5D, 0xAA5E, 0xAA5F,
    0xAAF0, 0xAAF1, 0xABEB, 0xFE52, 0xFE56, 0xFE57, 0xFF01, 0xFF0E, 0xFF1F, 0xFF61, 0x10A56,
    0x10A57, 0x10F55, 0x10F56, 0x10F57, 0x10F58, 0x10F59, 0x10F86, 0x10F87, 0x10F88, 0x10F89,
    0x11047, 0x11048, 0x110BE, 0x110BF, 0x110C0, 0x110C1, 0x11141, 0x11142, 0x11143, 0x111C5,
    0x111C6, 0x111CD, 0x111DE, 0x111DF, 0x11238, 0x11239, 0x1123B, 0x1123C, 0x112A9, 0x1144B,
    0x1144C, 0x115C2, 0x115C3, 0x115C9, 0x115CA, 0x115CB, 0x115CC, 0x115CD, 0x115CE, 0x115CF,
    0x115D0, 0x115D1, 0x115D2, 0x115D3, 0x115D4, 0x115D5, 0x115D6, 0x115D7, 0x11641, 0x11642,
    0x1173C, 0x1173D, 0x1173E, 0x11944, 0x11946, 0x11A42, 0x11A43, 0x11A9B, 0x11A9C, 0x11C41,
    0x11C42, 0x11EF7, 0x11EF8, 0x11F43, 0x11F44, 0x16A6E, 0x16A6F, 0x16AF5, 0x16B37, 0x16B38,
    0x16B44, 0x16E98, 0x1BC9F, 0x1DA88,
];

/// Whether `c` is in datatrove's `TERMINAL_PUNCTUATION`.
pub(crate) fn is_terminal_punctuation(c: char) -> bool {
    match c {
        '.' | '!' | '?' => true,
        _ if c.is_ascii() => false,
        _ => TERMINAL_PUNCTUATION.binary_search(&(c as u32)).is_ok(),
    }
}

/// Whether `c` is in datatrove's `PUNCTUATION_SET` (`PUNCTUATION` plus `TERMINAL_PUNCTUATION`).
pub(crate) fn is_punctuation(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return c.is_ascii_punctuation() || (c.is_ascii_control() && c != '\t' && c != '\n');
    }
    (0x80..0xA0).contains(&u)
        || PUNCTUATION_NON_ASCII.binary_search(&c).is_ok()
        || TERMINAL_PUNCTUATION.binary_search(&u).is_ok()
}

/// `(number of duplicates, their total length in chars)` of `items`, as datatrove's
/// `find_duplicates`: every occurrence after the first of an item is a duplicate.
pub(crate) fn find_duplicates<'a>(items: impl IntoIterator<Item = &'a str>) -> (usize, usize) {
    let mut seen = foldhash::HashSet::default();
    let (mut count, mut chars) = (0, 0);
    for item in items {
        if !seen.insert(item) {
            count += 1;
            chars += char_len(item);
        }
    }
    (count, chars)
}

/// Python's `\w` for one character.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Abbreviations after which a period does not end a sentence (a small stand-in for the
/// abbreviation list of NLTK's English punkt model).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "inc", "ltd", "corp", "co", "fig",
];

/// Whether `word` (what precedes a final period) is an abbreviation: a single letter (an
/// initial), a word with periods inside (`U.S`, `e.g`) or one of [`ABBREVIATIONS`].
fn is_abbreviation(word: &str) -> bool {
    let word = word.trim_start_matches(|c: char| !c.is_alphanumeric());
    let mut chars = word.chars();
    match (chars.next(), chars.next()) {
        (None, _) => false,
        (Some(c), None) => c.is_alphabetic(),
        _ => word.contains('.') || ABBREVIATIONS.iter().any(|a| a.eq_ignore_ascii_case(word)),
    }
}

/// Closing brackets and quotes that may follow a sentence's final period.
fn is_closing(c: char) -> bool {
    matches!(c, ']' | ')' | '}' | '>' | '"' | '\'' | '»' | '”' | '’')
}

/// The byte offset of every sentence break inside `text` (the end of the whitespace-separated
/// chunk that ends the sentence), in order. Approximates NLTK's English punkt model, which
/// datatrove's `split_into_sentences` uses: a chunk ending in `?` or `!`, or in a period that
/// does not follow an abbreviation or an initial (closing quotes and brackets after it allowed),
/// ends a sentence when another chunk follows; an ellipsis (`..`, `...`) ends one only before a
/// capitalized chunk. Line breaks are plain whitespace, as for punkt.
pub(crate) fn for_each_sentence_break(text: &str, mut f: impl FnMut(usize)) {
    let base = text.as_ptr() as usize;
    let mut chunks = py_split(text).peekable();
    while let Some(chunk) = chunks.next() {
        let Some(next) = chunks.peek() else { break };
        if ends_sentence(chunk, next) {
            f(chunk.as_ptr() as usize - base + chunk.len());
        }
    }
}

/// Whether `chunk`, followed by `next`, ends a sentence (see [`for_each_sentence_break`]).
fn ends_sentence(chunk: &str, next: &str) -> bool {
    let core = chunk.trim_end_matches(is_closing);
    if core.ends_with('?') || core.ends_with('!') {
        return true;
    }
    let Some(head) = core.strip_suffix('.') else {
        return false;
    };
    if head.ends_with('.') {
        return next.chars().next().is_some_and(char::is_uppercase);
    }
    head.is_empty() || !is_abbreviation(head)
}

/// The number of sentences in `text`: breaks plus one (datatrove counts an empty text as one
/// sentence too).
pub(crate) fn count_sentences(text: &str) -> usize {
    let mut n = 1;
    for_each_sentence_break(text, |_| n += 1);
    n
}

/// The sentences of `text` as datatrove's `split_into_sentences` cuts them: from each break to
/// the next, the whitespace between sentences kept at the start of the next.
pub(crate) fn split_sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for_each_sentence_break(text, |end| {
        out.push(&text[start..end]);
        start = end;
    });
    out.push(&text[start..]);
    out
}

/// A piece of a whitespace-separated chunk: a word (`core`) or a token split off on its own.
#[derive(Clone, Copy)]
struct Piece {
    start: usize,
    end: usize,
    core: bool,
}

/// Calls `f` with every word (token) of `text`, in order, the way datatrove's English word
/// tokenizer splits it (NLTK's `word_tokenize`: punkt sentences, then the Treebank-style
/// `NLTKWordTokenizer`), approximately:
///
/// - tokens never span whitespace (Python's);
/// - `;@#$%&?!*()[]{}<>"«»“”‘’„`, the dashes U+2012..U+2015 and backtick runs are tokens of
///   their own; `,` and `:` too unless a digit follows (`1,000` and `10:30` stay whole); runs of
///   two or more periods, `--` and `''` are tokens;
/// - a word's final period is split off when it ends the chunk (before closing quotes or
///   brackets) and does not follow an abbreviation (see [`for_each_sentence_break`]), which is
///   where punkt would end a sentence; periods inside a word (`3.14`, `example.com`) stay;
/// - the clitics `'s 'm 'd 'll 're 've n't` (and a lone trailing `'`) are split off a word's
///   end, a leading `'` off a word's start, and `cannot gimme gonna gotta lemme wanna more'n
///   d'ye` in two.
///
/// Known differences from NLTK: `"` stays a one-character token where NLTK writes ``` `` ``` or
/// `''` (two characters; this changes n-gram character lengths by one per quote); punkt's
/// learned abbreviation list and its orthographic heuristics are reduced to the rules above;
/// `-` runs of three or more dashes are split differently; contractions glued to punctuation
/// other than the split characters (`gonna-be`) are left whole.
pub(crate) fn for_each_word<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let mut pieces = Vec::new();
    for chunk in py_split(text) {
        if chunk.bytes().all(|b| b.is_ascii_alphanumeric()) {
            emit_core(chunk, &mut f);
            continue;
        }
        split_chunk(chunk, &mut pieces);
        emit_pieces(chunk, &pieces, &mut f);
    }
}

/// Splits one chunk into word pieces and split-off tokens (all but the final-period rule and
/// the apostrophe rules, which [`emit_pieces`] and [`emit_core`] apply).
fn split_chunk(chunk: &str, out: &mut Vec<Piece>) {
    out.clear();
    let mut core_start: Option<usize> = None;
    let mut it = chunk.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let next = it.peek().map(|&(_, n)| n);
        let sep_end = match c {
            ';'
            | '@'
            | '#'
            | '$'
            | '%'
            | '&'
            | '?'
            | '!'
            | '*'
            | '('
            | ')'
            | '['
            | ']'
            | '{'
            | '}'
            | '<'
            | '>'
            | '"'
            | '«'
            | '»'
            | '“'
            | '”'
            | '‘'
            | '’'
            | '„'
            | '\u{2012}'..='\u{2015}' => Some(i + c.len_utf8()),
            ',' | ':' if !next.is_some_and(char::is_numeric) => Some(i + 1),
            '`' | '.' if c == '`' || next == Some('.') => {
                while it.peek().is_some_and(|&(_, n)| n == c) {
                    it.next();
                }
                Some(it.peek().map_or(chunk.len(), |&(j, _)| j))
            }
            '-' | '\'' if next == Some(c) => {
                it.next();
                Some(i + 2)
            }
            _ => None,
        };
        match sep_end {
            Some(end) => {
                if let Some(s) = core_start.take() {
                    out.push(Piece {
                        start: s,
                        end: i,
                        core: true,
                    });
                }
                out.push(Piece {
                    start: i,
                    end,
                    core: false,
                });
            }
            None => {
                core_start.get_or_insert(i);
            }
        }
    }
    if let Some(s) = core_start {
        out.push(Piece {
            start: s,
            end: chunk.len(),
            core: true,
        });
    }
}

/// Emits a chunk's pieces, splitting the final period off the last word when only closing
/// quotes and brackets follow it.
fn emit_pieces<'a>(chunk: &'a str, pieces: &[Piece], f: &mut impl FnMut(&'a str)) {
    let last_core = pieces.iter().rposition(|p| p.core).filter(|&k| {
        pieces[k + 1..]
            .iter()
            .all(|p| chunk[p.start..p.end].chars().all(is_closing))
    });
    for (k, p) in pieces.iter().enumerate() {
        let s = &chunk[p.start..p.end];
        if !p.core {
            f(s);
            continue;
        }
        if Some(k) == last_core {
            let body = s.trim_end_matches('\'');
            if let Some(head) = body.strip_suffix('.')
                && !head.is_empty()
                && !is_abbreviation(head)
            {
                emit_core(head, f);
                f(".");
                let quotes = &s[body.len()..];
                if !quotes.is_empty() {
                    f(quotes);
                }
                continue;
            }
        }
        emit_core(s, f);
    }
}

/// NLTK's two-part contractions (`CONTRACTIONS2`), and where each splits.
const CONTRACTIONS: &[(&str, usize)] = &[
    ("cannot", 3),
    ("d'ye", 1),
    ("gimme", 3),
    ("gonna", 3),
    ("gotta", 3),
    ("lemme", 3),
    ("more'n", 4),
    ("wanna", 3),
];

/// Clitics split off a word's end: `(suffix, also when the word before ends in ')`.
const CLITICS: &[&str] = &[
    "n't", "N'T", "'ll", "'LL", "'re", "'RE", "'ve", "'VE", "'s", "'S", "'m", "'M", "'d", "'D",
];

/// Emits one word piece, with NLTK's apostrophe and contraction rules.
fn emit_core<'a>(mut s: &'a str, f: &mut impl FnMut(&'a str)) {
    // A leading quote before a word, unless it starts a clitic (`'s`, `'re`, ...).
    if let Some(rest) = s.strip_prefix('\'')
        && rest.chars().next().is_some_and(is_word_char)
        && !starts_with_clitic(rest)
    {
        f("'");
        s = rest;
    }
    if s.len() <= 6
        && let Some(&(_, at)) = CONTRACTIONS.iter().find(|(w, _)| w.eq_ignore_ascii_case(s))
    {
        f(&s[..at]);
        f(&s[at..]);
        return;
    }
    let split = CLITICS
        .iter()
        .find(|c| s.len() > c.len() && s.ends_with(*c))
        .map(|c| s.len() - c.len())
        .filter(|&at| !s[..at].ends_with('\''))
        .or_else(|| {
            let at = s.len().checked_sub(1)?;
            (at > 0 && s.ends_with('\'') && !s[..at].ends_with('\'')).then_some(at)
        });
    match split {
        Some(at) => {
            f(&s[..at]);
            f(&s[at..]);
        }
        None if !s.is_empty() => f(s),
        None => {}
    }
}

/// Whether `s` (after a leading `'`) starts with one of NLTK's clitics `re ve ll m t s d n`
/// followed by a word boundary.
fn starts_with_clitic(s: &str) -> bool {
    ["re", "ve", "ll", "m", "t", "s", "d", "n"].iter().any(|c| {
        s.len() >= c.len()
            && s.as_bytes()[..c.len()].eq_ignore_ascii_case(c.as_bytes())
            && !s[c.len()..].chars().next().is_some_and(is_word_char)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for_each_word(text, |w| out.push(w));
        out
    }

    #[test]
    fn splits_like_nltk_word_tokenize() {
        assert_eq!(
            words(
                "Good muffins cost $3.88 (roughly 3,36 euros)\nin New York.  Please buy me\ntwo of them.\nThanks."
            ),
            [
                "Good", "muffins", "cost", "$", "3.88", "(", "roughly", "3,36", "euros", ")", "in",
                "New", "York", ".", "Please", "buy", "me", "two", "of", "them", ".", "Thanks", "."
            ]
        );
        assert_eq!(
            words("They don't know, can't you see? I'm sure it's \"fine\"..."),
            [
                "They", "do", "n't", "know", ",", "ca", "n't", "you", "see", "?", "I", "'m",
                "sure", "it", "'s", "\"", "fine", "\"", "..."
            ]
        );
        assert_eq!(
            words("Mr. Smith met Dr. Jones in the U.S. yesterday."),
            [
                "Mr.",
                "Smith",
                "met",
                "Dr.",
                "Jones",
                "in",
                "the",
                "U.S.",
                "yesterday",
                "."
            ]
        );
        assert_eq!(
            words("I cannot go -- #tags @home, well-known; e-mail: a@b.com"),
            [
                "I",
                "can",
                "not",
                "go",
                "--",
                "#",
                "tags",
                "@",
                "home",
                ",",
                "well-known",
                ";",
                "e-mail",
                ":",
                "a",
                "@",
                "b.com"
            ]
        );
        assert_eq!(
            words("'Hello,' she said. The end.\")"),
            [
                "'", "Hello", ",", "'", "she", "said", ".", "The", "end", ".", "\"", ")"
            ]
        );
        assert!(words(" \n\t ").is_empty());
    }

    #[test]
    fn python_lines_and_whitespace() {
        let lines: Vec<_> = py_splitlines("a\r\nb\n\nc\u{2028}d\n").collect();
        assert_eq!(lines, ["a", "b", "", "c", "d"]);
        assert_eq!(py_splitlines("").count(), 0);
        assert_eq!(py_splitlines("\n").collect::<Vec<_>>(), [""]);
        assert_eq!(py_strip("\u{1f} x \u{a0}"), "x");
    }

    #[test]
    fn punctuation_sets() {
        for c in [
            '!', '#', '~', '…', '’', '“', '\u{7f}', '\u{0}', '｡', '।', '１',
        ] {
            assert!(is_punctuation(c), "{c:?}");
        }
        for c in ['a', '7', ' ', '\n', '\t', 'é', '‘', '中'] {
            assert!(!is_punctuation(c), "{c:?}");
        }
        assert!(is_terminal_punctuation('。') && is_terminal_punctuation('?'));
        assert!(!is_terminal_punctuation('"') && !is_terminal_punctuation(','));
    }

    #[test]
    fn sentences() {
        assert_eq!(count_sentences("One. Two? Three! Four"), 4);
        assert_eq!(
            count_sentences("Mr. Smith went to Washington. He stayed."),
            2
        );
        assert_eq!(count_sentences("He said \"stop.\" Then he left."), 2);
        assert_eq!(count_sentences("Wait... what? And then... Nothing."), 3);
        assert_eq!(count_sentences(""), 1);
        assert_eq!(
            split_sentences("Ab cd. Ef gh.  Ij kl."),
            ["Ab cd.", " Ef gh.", "  Ij kl."]
        );
        // A single letter before the period is an initial.
        assert_eq!(count_sentences("J. R. Smith wrote it."), 1);
    }

    #[test]
    fn duplicates() {
        assert_eq!(find_duplicates(["ab", "c", "ab", "ab", "c", "é"]), (3, 5));
    }
}
