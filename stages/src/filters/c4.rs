//! datatrove's `C4QualityFilter` (Raffel et al. 2020, the C4 corpus's heuristics): drops lines
//! without terminal punctuation, with too few words, with a too long word, mentioning
//! JavaScript or a cookie/terms policy; drops the document for "lorem ipsum", a `{` or too few
//! sentences. Unlike the other filters it changes the text: the kept lines, stripped and
//! without Wikipedia-style citations, joined by `\n`.
//!
//! As in datatrove, the document-level rules only look at lines that survived the line rules
//! before them (a `{` in a line without terminal punctuation drops that line, not the document),
//! and a word over `max_word_length` chars drops its line, not the document.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::text::{char_len, count_sentences, py_split, py_splitlines, py_strip, split_sentences};

/// The rule name of [`C4Quality`] in the stats table.
pub const RULE: &str = "c4";

/// Wikipedia-style citations (`[1]`, `[edit]`, `[citation needed]`), removed from lines.
static CITATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\[\d*\]|\[edit\]|\[citation needed\]").expect("citation regex compiles")
});

/// Phrases of cookie banners and legal boilerplate; a line containing one is dropped.
pub const POLICY_SUBSTRINGS: [&str; 6] = [
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
];

/// `c4:` settings: datatrove's `C4QualityFilter`. Every field defaults to datatrove's value;
/// for the numbers, `null` turns the rule off (datatrove's `-1`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct C4Quality {
    /// Apply the line rules to lines (default, as in C4); `false`: to sentences, joined back by
    /// spaces.
    pub split_paragraph: bool,
    /// Remove `[1]`, `[edit]` and `[citation needed]` from lines; default true.
    pub remove_citations: bool,
    /// Drop lines not ending in `.`, `?`, `!`, `"` or `'`, or ending in `...`; default true.
    pub filter_no_terminal_punct: bool,
    /// Drop the document (`too_few_sentences`) when the kept lines hold fewer sentences;
    /// default 5.
    pub min_num_sentences: Option<u64>,
    /// Drop lines with fewer whitespace-separated words; default 3.
    pub min_words_per_line: Option<u64>,
    /// Drop lines with a word longer than this many chars; default 1000.
    pub max_word_length: Option<u64>,
    /// Drop the document (`lorem_ipsum`) for a kept line containing "lorem ipsum" (any case);
    /// default true.
    pub filter_lorem_ipsum: bool,
    /// Drop lines containing "javascript" (any case); default true.
    pub filter_javascript: bool,
    /// Drop the document (`curly_bracket`) for a kept line containing `{`; default true.
    pub filter_curly_bracket: bool,
    /// Drop lines containing one of [`POLICY_SUBSTRINGS`] (any case); default true.
    pub filter_policy: bool,
}

impl Default for C4Quality {
    fn default() -> Self {
        C4Quality {
            split_paragraph: true,
            remove_citations: true,
            filter_no_terminal_punct: true,
            min_num_sentences: Some(5),
            min_words_per_line: Some(3),
            max_word_length: Some(1000),
            filter_lorem_ipsum: true,
            filter_javascript: true,
            filter_curly_bracket: true,
            filter_policy: true,
        }
    }
}

/// A document [`C4Quality`] keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct C4Kept {
    /// The kept lines, joined by `\n` (by spaces without `split_paragraph`), stripped.
    pub text: String,
    /// How many lines (sentences without `split_paragraph`) were dropped, blank ones included.
    pub lines_removed: u64,
}

impl C4Quality {
    /// Runs the filter on `text`: the kept text, or `Err(reason)` with datatrove's reason
    /// (`lorem_ipsum`, `curly_bracket`, `too_few_sentences`).
    ///
    /// Lines are Python's `splitlines()`; sentences and the sentence count come from
    /// `filters/text.rs`'s `for_each_sentence_break`, an approximation of NLTK's punkt. Case is
    /// folded for ASCII letters only (Python's `lower()` also folds e.g. the Kelvin sign to
    /// `k`).
    pub fn apply(&self, text: &str) -> Result<C4Kept, &'static str> {
        if self.split_paragraph {
            self.filter_lines(py_splitlines(text), '\n')
        } else {
            self.filter_lines(split_sentences(text).into_iter(), ' ')
        }
    }

    fn filter_lines<'a>(
        &self,
        lines: impl Iterator<Item = &'a str>,
        sep: char,
    ) -> Result<C4Kept, &'static str> {
        let mut out = String::new();
        let (mut total, mut kept, mut sentences) = (0u64, 0u64, 0u64);
        let mut lower = String::new();
        for line in lines {
            total += 1;
            let line = py_strip(line);
            let mut n_words = 0u64;
            let mut too_long = false;
            for word in py_split(line) {
                n_words += 1;
                too_long |= self
                    .max_word_length
                    .is_some_and(|max| word.len() as u64 > max && char_len(word) as u64 > max);
            }
            if too_long {
                continue;
            }
            let line: Cow<str> = if self.remove_citations && line.contains('[') {
                CITATION.replace_all(line, "")
            } else {
                Cow::Borrowed(line)
            };
            if self.filter_no_terminal_punct
                && (!line.ends_with(['.', '?', '!', '"', '\'']) || line.ends_with("..."))
            {
                continue;
            }
            if self.min_words_per_line.is_some_and(|min| n_words < min) {
                continue;
            }
            lower.clear();
            lower.extend(line.chars().map(|c| c.to_ascii_lowercase()));
            if self.filter_lorem_ipsum && lower.contains("lorem ipsum") {
                return Err("lorem_ipsum");
            }
            if self.filter_javascript && lower.contains("javascript") {
                continue;
            }
            if self.filter_curly_bracket && line.contains('{') {
                return Err("curly_bracket");
            }
            if self.filter_policy && POLICY_SUBSTRINGS.iter().any(|p| lower.contains(p)) {
                continue;
            }
            if self.min_num_sentences.is_some() {
                sentences += if sep == '\n' {
                    count_sentences(&line) as u64
                } else {
                    1
                };
            }
            if kept > 0 {
                out.push(sep);
            }
            out.push_str(&line);
            kept += 1;
        }
        if self.min_num_sentences.is_some_and(|min| sentences < min) {
            return Err("too_few_sentences");
        }
        let stripped = py_strip(&out);
        let text = if stripped.len() == out.len() {
            out
        } else {
            stripped.to_string()
        };
        Ok(C4Kept {
            text,
            lines_removed: total - kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::CLEAN;

    fn c4(text: &str) -> Result<C4Kept, &'static str> {
        C4Quality::default().apply(text)
    }

    /// CLEAN as C4 keeps it: blank lines dropped.
    fn clean_kept() -> String {
        CLEAN.replace("\n\n", "\n")
    }

    /// Runs C4 on CLEAN plus `extra` lines: the kept text and the lines removed besides the
    /// two blank lines of CLEAN.
    fn with_lines(extra: &str) -> Result<(String, u64), &'static str> {
        c4(&format!("{CLEAN}\n{extra}")).map(|k| (k.text, k.lines_removed - 2))
    }

    #[test]
    fn clean_prose_passes_with_blank_lines_removed() {
        let kept = c4(CLEAN).unwrap();
        assert_eq!(kept.text, clean_kept());
        assert_eq!(kept.lines_removed, 2);
    }

    #[test]
    fn line_rules() {
        let clean = clean_kept();
        // No terminal punctuation, ellipsis, too few words.
        assert_eq!(
            with_lines("Click here to subscribe"),
            Ok((clean.clone(), 1))
        );
        assert_eq!(
            with_lines("And then the story goes on..."),
            Ok((clean.clone(), 1))
        );
        assert_eq!(with_lines("Read more."), Ok((clean.clone(), 1)));
        assert_eq!(
            with_lines("Read more now."),
            Ok((format!("{clean}\nRead more now."), 0))
        );
        assert_eq!(
            with_lines("  He said \"yes.\"  "),
            Ok((format!("{clean}\nHe said \"yes.\""), 0))
        );
        // JavaScript and policy phrases, any case.
        assert_eq!(
            with_lines("Please enable JavaScript to view the comments."),
            Ok((clean.clone(), 1))
        );
        assert_eq!(
            with_lines(
                "This site uses cookies to improve your experience.\nRead our Privacy Policy today."
            ),
            Ok((clean.clone(), 2))
        );
        // A word over 1000 chars drops its line; 1000 is fine.
        // The period belongs to the word.
        let long = |n: usize| format!("The code is {}.", "x".repeat(n - 1));
        assert_eq!(with_lines(&long(1001)), Ok((clean.clone(), 1)));
        assert_eq!(
            with_lines(&long(1000)),
            Ok((format!("{clean}\n{}", long(1000)), 0))
        );
    }

    #[test]
    fn citations_are_removed() {
        assert_eq!(
            with_lines("The bridge was repaired in 1820.[1] It held.[citation needed][edit]"),
            Ok((
                format!(
                    "{}\nThe bridge was repaired in 1820. It held.",
                    clean_kept()
                ),
                0
            ))
        );
        // A citation after the final space leaves a line ending in a space: dropped, as in
        // datatrove.
        assert_eq!(
            with_lines("The bridge was repaired in 1820. [12]"),
            Ok((clean_kept(), 1))
        );
    }

    #[test]
    fn document_rules() {
        assert_eq!(
            with_lines("Lorem ipsum dolor sit amet."),
            Err("lorem_ipsum")
        );
        assert_eq!(
            with_lines("The function returns {x} to the caller."),
            Err("curly_bracket")
        );
        // Only lines that survive the line rules count.
        assert_eq!(with_lines("lorem ipsum dolor sit amet").map(|k| k.1), Ok(1));
        assert_eq!(with_lines("function f() { return 1 }").map(|k| k.1), Ok(1));
    }

    #[test]
    fn sentence_minimum() {
        let four = "One two three. Four five six. Seven eight nine. Ten eleven twelve.";
        assert_eq!(c4(four), Err("too_few_sentences"));
        let five = format!("{four}\nThirteen fourteen fifteen.");
        assert_eq!(c4(&five).map(|k| k.text), Ok(five.clone()));
        assert_eq!(c4(""), Err("too_few_sentences"));
        let off = C4Quality {
            min_num_sentences: None,
            ..C4Quality::default()
        };
        assert_eq!(off.apply(four).map(|k| k.lines_removed), Ok(0));
    }

    #[test]
    fn sentence_mode() {
        let by_sentence = C4Quality {
            split_paragraph: false,
            ..C4Quality::default()
        };
        let text = "The first line is fine. Click here\nto subscribe now. Short one. The third good sentence. \
                    A fourth sentence here. And a fifth one now. Plus a sixth one.";
        let kept = by_sentence.apply(text).unwrap();
        assert_eq!(
            kept.text,
            "The first line is fine. Click here\nto subscribe now. The third good sentence. \
             A fourth sentence here. And a fifth one now. Plus a sixth one."
        );
        assert_eq!(kept.lines_removed, 1);
    }
}
