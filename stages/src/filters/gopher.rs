//! datatrove's Gopher filters (Rae et al. 2021, "Scaling Language Models", appendix A.1.1):
//! [`GopherQuality`] (`GopherQualityFilter`) and [`GopherRepetition`]
//! (`GopherRepetitionFilter`), with datatrove 0.10's defaults and reason names.
//!
//! Words are those of `filters/text.rs`'s `for_each_word`, which approximate datatrove's word
//! tokenizer (punctuation marks are words of their own, as in spaCy and NLTK); see
//! `filters/mod.rs` for the differences.

use std::collections::{BTreeMap, HashSet};

use foldhash::{HashMap, HashSet as FastHashSet};

use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;

use super::text::{
    char_len, find_duplicates, for_each_word, is_punctuation, py_splitlines, py_strip,
};

/// The rule name of [`GopherQuality`] in the stats table.
pub const QUALITY_RULE: &str = "gopher_quality";
/// The rule name of [`GopherRepetition`] in the stats table.
pub const REPETITION_RULE: &str = "gopher_repetition";

/// datatrove's default Gopher stop words.
pub const STOP_WORDS: [&str; 8] = ["the", "be", "to", "of", "and", "that", "have", "with"];

/// A threshold datatrove tests for truthiness (`if self.x and ...`): `None` or zero turns its
/// rule off.
fn on<T: PartialEq + Default + Copy>(x: Option<T>) -> Option<T> {
    x.filter(|v| *v != T::default())
}

/// Checks that an optional ratio is finite and not negative.
fn check_ratio(v: Option<f64>, path: &str) -> Result<(), ConfigError> {
    match v {
        Some(x) if !x.is_finite() || x < 0.0 => Err(ConfigError::new(
            path,
            format!("must be a number >= 0, got {x}"),
        )),
        _ => Ok(()),
    }
}

/// `gopher_quality:` settings: datatrove's `GopherQualityFilter`. Every field defaults to
/// datatrove's value; `null` (or `0`, as in datatrove) turns its rule off. Word counts count
/// words with at least one character outside datatrove's punctuation set; ratios over "words"
/// count all tokens, punctuation included, as datatrove does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GopherQuality {
    /// Fewest non-punctuation words (`gopher_short_doc`); default 50.
    pub min_doc_words: Option<u64>,
    /// Most non-punctuation words (`gopher_long_doc`); default 100000.
    pub max_doc_words: Option<u64>,
    /// Smallest mean length in chars of the non-punctuation words
    /// (`gopher_below_avg_threshold`); default 3.
    pub min_avg_word_length: Option<f64>,
    /// Largest mean word length (`gopher_above_avg_threshold`); default 10.
    pub max_avg_word_length: Option<f64>,
    /// Most `#` per word (`gopher_too_many_hashes`), and most `...` plus `…` per word
    /// (`gopher_too_many_ellipsis`); default 0.1.
    pub max_symbol_word_ratio: Option<f64>,
    /// Largest share of lines starting with `•` or `-` (`gopher_too_many_bullets`); default 0.9.
    pub max_bullet_lines_ratio: Option<f64>,
    /// Largest share of lines ending with `...` or `…` (`gopher_too_many_end_ellipsis`);
    /// default 0.3.
    pub max_ellipsis_lines_ratio: Option<f64>,
    /// Despite datatrove's name, the smallest share of words with an alphabetic character
    /// (`gopher_below_alpha_threshold`); default 0.8.
    pub max_non_alpha_words_ratio: Option<f64>,
    /// Fewest distinct stop words present (`gopher_enough_stop_words`); default 2.
    pub min_stop_words: Option<u64>,
    /// The stop words, matched case-sensitively against whole words; default [`STOP_WORDS`].
    pub stop_words: Vec<String>,
}

impl Default for GopherQuality {
    fn default() -> Self {
        GopherQuality {
            min_doc_words: Some(50),
            max_doc_words: Some(100_000),
            min_avg_word_length: Some(3.0),
            max_avg_word_length: Some(10.0),
            max_symbol_word_ratio: Some(0.1),
            max_bullet_lines_ratio: Some(0.9),
            max_ellipsis_lines_ratio: Some(0.3),
            max_non_alpha_words_ratio: Some(0.8),
            min_stop_words: Some(2),
            stop_words: STOP_WORDS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl GopherQuality {
    /// Checks the settings; `at` is their recipe path (`filters.gopher_quality`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        for (name, v) in [
            ("min_avg_word_length", self.min_avg_word_length),
            ("max_avg_word_length", self.max_avg_word_length),
            ("max_symbol_word_ratio", self.max_symbol_word_ratio),
            ("max_bullet_lines_ratio", self.max_bullet_lines_ratio),
            ("max_ellipsis_lines_ratio", self.max_ellipsis_lines_ratio),
            ("max_non_alpha_words_ratio", self.max_non_alpha_words_ratio),
        ] {
            check_ratio(v, &format!("{at}.{name}"))?;
        }
        let mut seen = HashSet::new();
        for (i, w) in self.stop_words.iter().enumerate() {
            if w.is_empty() || w.chars().any(super::text::is_py_space) || !seen.insert(w) {
                return Err(ConfigError::new(
                    format!("{at}.stop_words[{i}]"),
                    format!("stop words must be distinct single words, got {w:?}"),
                ));
            }
        }
        if let Some(n) = on(self.min_stop_words)
            && n > self.stop_words.len() as u64
        {
            return Err(ConfigError::new(
                format!("{at}.min_stop_words"),
                format!(
                    "{n} is more than the {} stop words: every document would be dropped",
                    self.stop_words.len()
                ),
            ));
        }
        Ok(())
    }

    /// Runs the rules on `text` in datatrove's order: `Err(reason)` (datatrove's reason name)
    /// for the first it fails. An empty document (no words, where datatrove would divide by
    /// zero) passes the ratio rules.
    pub fn check(&self, text: &str) -> Result<(), &'static str> {
        let (mut n_words, mut n_content, mut content_chars, mut n_alpha) = (0usize, 0usize, 0, 0);
        let mut stop_seen = vec![false; self.stop_words.len()];
        for_each_word(text, |w| {
            n_words += 1;
            let (mut len, mut content, mut alpha) = (0, false, false);
            for c in w.chars() {
                len += 1;
                content |= !is_punctuation(c);
                // Rust's `Alphabetic` property; Python's `isalpha` is the letter categories
                // (L*): they differ only on marks and letter-like numbers and symbols.
                alpha |= c.is_alphabetic();
            }
            if content {
                n_content += 1;
                content_chars += len;
            }
            n_alpha += usize::from(alpha);
            for (seen, s) in stop_seen.iter_mut().zip(&self.stop_words) {
                *seen |= s == w;
            }
        });

        if on(self.min_doc_words).is_some_and(|m| (n_content as u64) < m) {
            return Err("gopher_short_doc");
        }
        if on(self.max_doc_words).is_some_and(|m| n_content as u64 > m) {
            return Err("gopher_long_doc");
        }
        if n_content > 0 {
            let avg = content_chars as f64 / n_content as f64;
            if on(self.min_avg_word_length).is_some_and(|m| avg < m) {
                return Err("gopher_below_avg_threshold");
            }
            if on(self.max_avg_word_length).is_some_and(|m| avg > m) {
                return Err("gopher_above_avg_threshold");
            }
        }
        if n_words > 0
            && let Some(max) = on(self.max_symbol_word_ratio)
        {
            let per_word = |n: usize| n as f64 / n_words as f64;
            if per_word(text.matches('#').count()) > max {
                return Err("gopher_too_many_hashes");
            }
            if per_word(text.matches("...").count() + text.matches('…').count()) > max {
                return Err("gopher_too_many_ellipsis");
            }
        }
        let (mut n_lines, mut bullets, mut ellipses) = (0usize, 0usize, 0usize);
        for line in py_splitlines(text) {
            n_lines += 1;
            let start = line.trim_start_matches(super::text::is_py_space);
            bullets += usize::from(start.starts_with('•') || start.starts_with('-'));
            let end = line.trim_end_matches(super::text::is_py_space);
            ellipses += usize::from(end.ends_with("...") || end.ends_with('…'));
        }
        if n_lines > 0 {
            let share = |n: usize| n as f64 / n_lines as f64;
            if on(self.max_bullet_lines_ratio).is_some_and(|m| share(bullets) > m) {
                return Err("gopher_too_many_bullets");
            }
            if on(self.max_ellipsis_lines_ratio).is_some_and(|m| share(ellipses) > m) {
                return Err("gopher_too_many_end_ellipsis");
            }
        }
        if n_words > 0
            && on(self.max_non_alpha_words_ratio)
                .is_some_and(|m| (n_alpha as f64 / n_words as f64) < m)
        {
            return Err("gopher_below_alpha_threshold");
        }
        if let Some(min) = on(self.min_stop_words) {
            let found = stop_seen.iter().filter(|&&s| s).count() as u64;
            if found < min {
                return Err("gopher_enough_stop_words");
            }
        }
        Ok(())
    }
}

/// The largest `n` of an n-gram rule (the reason names are static strings).
pub const MAX_N: usize = 12;

const TOP_REASONS: [&str; MAX_N + 1] = [
    "",
    "top_1_gram",
    "top_2_gram",
    "top_3_gram",
    "top_4_gram",
    "top_5_gram",
    "top_6_gram",
    "top_7_gram",
    "top_8_gram",
    "top_9_gram",
    "top_10_gram",
    "top_11_gram",
    "top_12_gram",
];

const DUP_REASONS: [&str; MAX_N + 1] = [
    "",
    "duplicated_1_n_grams",
    "duplicated_2_n_grams",
    "duplicated_3_n_grams",
    "duplicated_4_n_grams",
    "duplicated_5_n_grams",
    "duplicated_6_n_grams",
    "duplicated_7_n_grams",
    "duplicated_8_n_grams",
    "duplicated_9_n_grams",
    "duplicated_10_n_grams",
    "duplicated_11_n_grams",
    "duplicated_12_n_grams",
];

/// `gopher_repetition:` settings: datatrove's `GopherRepetitionFilter` (Gopher's table A1).
/// Every field defaults to datatrove's value; `null` (or `0`) turns a line or paragraph rule
/// off, and an n-gram rule is off when its `n` is not listed. Fractions of characters are of
/// the whole document's characters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GopherRepetition {
    /// Largest share of lines (split on runs of `\n`) that repeat an earlier line
    /// (`dup_line_frac`); default 0.3.
    pub dup_line_frac: Option<f64>,
    /// Largest share of paragraphs (split on `\n\n+`) that repeat an earlier one
    /// (`dup_para_frac`); default 0.3.
    pub dup_para_frac: Option<f64>,
    /// Largest share of characters in repeated lines (`dup_line_char_frac`); default 0.2.
    pub dup_line_char_frac: Option<f64>,
    /// Largest share of characters in repeated paragraphs (`dup_para_char_frac`); default 0.2.
    pub dup_para_char_frac: Option<f64>,
    /// `n: fraction`: the most common n-gram (words joined by spaces) times its count may cover
    /// at most this share of characters (`top_<n>_gram`); default `{2: 0.2, 3: 0.18, 4: 0.16}`.
    pub top_n_grams: BTreeMap<usize, f64>,
    /// `n: fraction`: n-grams that repeat an earlier one (words joined without spaces, counted
    /// without overlap) may cover at most this share of characters (`duplicated_<n>_n_grams`);
    /// default `{5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.1}`.
    pub dup_n_grams: BTreeMap<usize, f64>,
}

impl Default for GopherRepetition {
    fn default() -> Self {
        GopherRepetition {
            dup_line_frac: Some(0.3),
            dup_para_frac: Some(0.3),
            dup_line_char_frac: Some(0.2),
            dup_para_char_frac: Some(0.2),
            top_n_grams: [(2, 0.2), (3, 0.18), (4, 0.16)].into_iter().collect(),
            dup_n_grams: [
                (5, 0.15),
                (6, 0.14),
                (7, 0.13),
                (8, 0.12),
                (9, 0.11),
                (10, 0.1),
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// The words of a document with their n-grams as slices of two buffers, so counting n-grams
/// allocates nothing per n-gram.
struct Grams<'a> {
    words: Vec<&'a str>,
    /// The words joined by single spaces (datatrove's `get_n_grams`).
    spaced: String,
    /// The words joined without separator (datatrove's `find_all_duplicate`).
    joined: String,
    /// Byte offset of word `i` in `spaced`, and its end.
    spaced_at: Vec<(usize, usize)>,
    /// Byte offset of word `i` in `joined` (one more entry: the total length).
    joined_at: Vec<usize>,
    /// Chars of the words before word `i` (one more entry: the total).
    chars_before: Vec<usize>,
}

impl<'a> Grams<'a> {
    fn new(text: &'a str) -> Self {
        let mut g = Grams {
            words: Vec::new(),
            spaced: String::with_capacity(text.len()),
            joined: String::with_capacity(text.len()),
            spaced_at: Vec::new(),
            joined_at: vec![0],
            chars_before: vec![0],
        };
        for_each_word(text, |w| {
            if !g.words.is_empty() {
                g.spaced.push(' ');
            }
            let start = g.spaced.len();
            g.spaced.push_str(w);
            g.spaced_at.push((start, g.spaced.len()));
            g.joined.push_str(w);
            g.joined_at.push(g.joined.len());
            g.chars_before
                .push(g.chars_before[g.words.len()] + char_len(w));
            g.words.push(w);
        });
        g
    }

    /// Characters of the words `i..i + n` (without separators).
    fn chars(&self, i: usize, n: usize) -> usize {
        self.chars_before[i + n] - self.chars_before[i]
    }

    fn spaced(&self, i: usize, n: usize) -> &str {
        &self.spaced[self.spaced_at[i].0..self.spaced_at[i + n - 1].1]
    }

    fn joined(&self, i: usize, n: usize) -> &str {
        &self.joined[self.joined_at[i]..self.joined_at[i + n]]
    }

    /// datatrove's `find_top_duplicate`: chars of the most common n-gram (spaces included)
    /// times its count; ties go to the n-gram seen first, as with Python's `Counter`.
    fn top_duplicate(&self, n: usize) -> Option<usize> {
        let count = (self.words.len() + 1).checked_sub(n).filter(|&c| c > 0)?;
        let mut counts: HashMap<&str, (usize, usize)> =
            HashMap::with_capacity_and_hasher(count, Default::default());
        for i in 0..count {
            counts.entry(self.spaced(i, n)).or_insert((0, i)).0 += 1;
        }
        let &(times, first) = counts
            .values()
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))?;
        Some((self.chars(first, n) + n - 1) * times)
    }

    /// datatrove's `find_all_duplicate`: chars of the n-grams (no spaces) that repeat an earlier
    /// one, skipping past each repeat.
    fn all_duplicates(&self, n: usize) -> usize {
        let mut seen = FastHashSet::default();
        let (mut repeated, mut i) = (0, 0);
        while i + n <= self.words.len() {
            if seen.insert(self.joined(i, n)) {
                i += 1;
            } else {
                repeated += self.chars(i, n);
                i += n;
            }
        }
        repeated
    }
}

impl GopherRepetition {
    /// Checks the settings; `at` is their recipe path (`filters.gopher_repetition`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        for (name, v) in [
            ("dup_line_frac", self.dup_line_frac),
            ("dup_para_frac", self.dup_para_frac),
            ("dup_line_char_frac", self.dup_line_char_frac),
            ("dup_para_char_frac", self.dup_para_char_frac),
        ] {
            check_ratio(v, &format!("{at}.{name}"))?;
        }
        for (name, map) in [
            ("top_n_grams", &self.top_n_grams),
            ("dup_n_grams", &self.dup_n_grams),
        ] {
            for (&n, &frac) in map {
                let path = format!("{at}.{name}.{n}");
                if !(1..=MAX_N).contains(&n) {
                    return Err(ConfigError::new(path, format!("n must be 1..={MAX_N}")));
                }
                check_ratio(Some(frac), &path)?;
            }
        }
        Ok(())
    }

    /// Runs the rules on `text` in datatrove's order (paragraphs, lines, top n-grams by
    /// increasing `n`, duplicated n-grams by increasing `n`): `Err(reason)` for the first it
    /// fails. An empty document passes (datatrove would divide by zero).
    pub fn check(&self, text: &str) -> Result<(), &'static str> {
        let text_chars = char_len(text);
        if text_chars == 0 {
            return Ok(());
        }
        let share = |n: usize| n as f64 / text_chars as f64;

        let mut n_paras = 0;
        let (para_dups, para_dup_chars) =
            find_duplicates(split_on_newline_runs(py_strip(text), 2).inspect(|_| n_paras += 1));
        if on(self.dup_para_frac).is_some_and(|m| para_dups as f64 / n_paras as f64 > m) {
            return Err("dup_para_frac");
        }
        if on(self.dup_para_char_frac).is_some_and(|m| share(para_dup_chars) > m) {
            return Err("dup_para_char_frac");
        }

        let mut n_lines = 0;
        let (line_dups, line_dup_chars) =
            find_duplicates(split_on_newline_runs(text, 1).inspect(|_| n_lines += 1));
        if on(self.dup_line_frac).is_some_and(|m| line_dups as f64 / n_lines as f64 > m) {
            return Err("dup_line_frac");
        }
        if on(self.dup_line_char_frac).is_some_and(|m| share(line_dup_chars) > m) {
            return Err("dup_line_char_frac");
        }

        if self.top_n_grams.is_empty() && self.dup_n_grams.is_empty() {
            return Ok(());
        }
        let grams = Grams::new(text);
        for (&n, &frac) in &self.top_n_grams {
            if let Some(top) = grams.top_duplicate(n)
                && share(top) > frac
            {
                return Err(TOP_REASONS[n.min(MAX_N)]);
            }
        }
        for (&n, &frac) in &self.dup_n_grams {
            if share(grams.all_duplicates(n)) > frac {
                return Err(DUP_REASONS[n.min(MAX_N)]);
            }
        }
        Ok(())
    }
}

/// Python's `re.split(r"\n{min,}", s)`: pieces between runs of at least `min` newlines, empty
/// pieces at the ends included.
fn split_on_newline_runs(s: &str, min: usize) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut from = 0;
        loop {
            let Some(i) = s[from..].find('\n').map(|i| from + i) else {
                rest = None;
                return Some(s);
            };
            let run = s[i..].bytes().take_while(|&b| b == b'\n').count();
            if run >= min {
                rest = Some(&s[i + run..]);
                return Some(&s[..i]);
            }
            from = i + run;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::CLEAN;

    fn quality(text: &str) -> Result<(), &'static str> {
        GopherQuality::default().check(text)
    }

    fn repetition(text: &str) -> Result<(), &'static str> {
        GopherRepetition::default().check(text)
    }

    /// `n` distinct lowercase words of five letters or more, none a stop word.
    fn distinct_words(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                let mut w = String::from("word");
                let mut k = i;
                loop {
                    w.push((b'a' + (k % 26) as u8) as char);
                    k /= 26;
                    if k == 0 {
                        break;
                    }
                }
                w
            })
            .collect()
    }

    #[test]
    fn clean_prose_passes() {
        assert_eq!(quality(CLEAN), Ok(()));
        assert_eq!(repetition(CLEAN), Ok(()));
    }

    #[test]
    fn quality_word_counts() {
        assert_eq!(
            quality("The cat sat on the mat with a hat."),
            Err("gopher_short_doc")
        );
        // 50 content words is enough, 49 is not (the period is not a content word).
        let fifty = format!("the and {}.", vec!["house"; 48].join(" "));
        assert_eq!(quality(&fifty), Ok(()));
        let forty_nine = format!("the and {}.", vec!["house"; 47].join(" "));
        assert_eq!(quality(&forty_nine), Err("gopher_short_doc"));
        let long = format!("the and {}", vec!["house"; 100_000].join(" "));
        assert_eq!(quality(&long), Err("gopher_long_doc"));
    }

    #[test]
    fn quality_mean_word_length() {
        let short = format!("the and {}", vec!["it is no go"; 20].join(" "));
        assert_eq!(quality(&short), Err("gopher_below_avg_threshold"));
        let long = format!("the and {}", vec!["extraordinarily"; 60].join(" "));
        assert_eq!(quality(&long), Err("gopher_above_avg_threshold"));
        // Exactly 3 and exactly 10 pass (the bounds are strict).
        let three = format!("the and {}", vec!["cat"; 60].join(" "));
        assert_eq!(quality(&three), Ok(()));
        // (3 + 3 + 17 + 17 + 58 * 10) / 62 = 10.
        let ten = format!(
            "the and abcdefghijklmnopq abcdefghijklmnopq {}",
            vec!["abcdefghij"; 58].join(" ")
        );
        assert_eq!(quality(&ten), Ok(()));
    }

    #[test]
    fn quality_symbols() {
        let hashes = format!("{CLEAN}\n{}", vec!["#tag"; 60].join(" "));
        assert_eq!(quality(&hashes), Err("gopher_too_many_hashes"));
        let ellipses = format!("{CLEAN}\n{}", vec!["wait… for it"; 50].join(" "));
        assert_eq!(quality(&ellipses), Err("gopher_too_many_ellipsis"));
        // `...` counts too; here the ellipses are words of their own, as in NLTK.
        let dots = format!("{CLEAN}\n{}", vec!["wait... for it"; 50].join(" "));
        assert_eq!(quality(&dots), Err("gopher_too_many_ellipsis"));
    }

    #[test]
    fn quality_lines() {
        let bullets: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    "- the quick brown fox and number {} jumps",
                    distinct_words(20)[i]
                )
            })
            .collect();
        assert_eq!(quality(&bullets.join("\n")), Err("gopher_too_many_bullets"));
        // 18 bullet lines of 20 is exactly 0.9: kept.
        let mut some = bullets.clone();
        some[0] = some[0].replacen("- ", "", 1);
        some[1] = some[1].replacen("- ", "", 1);
        assert_eq!(quality(&some.join("\n")), Ok(()));

        // One sentence a line; 4 of 8 lines (0.5) end with an ellipsis, then 2 (0.25).
        let sentences: Vec<&str> = CLEAN
            .split(['.', '\n'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(sentences.len(), 8);
        let ending = |n: usize| {
            let lines: Vec<String> = sentences
                .iter()
                .enumerate()
                .map(|(i, s)| format!("{s}{}", if i < n { "..." } else { "." }))
                .collect();
            lines.join("\n")
        };
        assert_eq!(quality(&ending(4)), Err("gopher_too_many_end_ellipsis"));
        assert_eq!(quality(&ending(2)), Ok(()));
    }

    #[test]
    fn quality_alpha_and_stop_words() {
        let numbers = format!("{CLEAN} {}", vec!["1234 5678"; 40].join(" "));
        assert_eq!(quality(&numbers), Err("gopher_below_alpha_threshold"));
        let no_stop = distinct_words(60).join(" ");
        assert_eq!(quality(&no_stop), Err("gopher_enough_stop_words"));
        // One stop word is not enough, two are; `The` is not `the`.
        assert_eq!(
            quality(&format!("The {no_stop} and")),
            Err("gopher_enough_stop_words")
        );
        assert_eq!(quality(&format!("the {no_stop} and")), Ok(()));
    }

    #[test]
    fn quality_settings() {
        let q = GopherQuality {
            min_doc_words: None,
            min_stop_words: Some(0),
            ..GopherQuality::default()
        };
        assert_eq!(
            q.check("The quick brown fox jumps over the lazy dog."),
            Ok(())
        );
        assert_eq!(q.check(""), Ok(()));
        let bad = GopherQuality {
            min_stop_words: Some(9),
            ..GopherQuality::default()
        };
        assert_eq!(
            bad.validate("filters.gopher_quality").unwrap_err().path,
            "filters.gopher_quality.min_stop_words"
        );
    }

    #[test]
    fn repetition_paragraphs_and_lines() {
        let a = "The first paragraph talks about the weather in the mountains.";
        let b = "A second paragraph describes the old mill by the river.";
        let c = "Finally the third one is about the market in the square.";
        assert_eq!(
            repetition(&format!("{a}\n\n{a}\n\n{b}")),
            Err("dup_para_frac")
        );
        // 1 of 4 paragraphs repeated (0.25) but most characters repeated.
        let long = [a; 4].join(" ");
        assert_eq!(
            repetition(&format!("{long}\n\n{long}\n\nShort one.\n\nAnother short.")),
            Err("dup_para_char_frac")
        );
        assert_eq!(repetition(&format!("{a}\n{a}\n{b}")), Err("dup_line_frac"));
        assert_eq!(
            repetition(&format!("{long}\n{long}\n{b}\n{c}")),
            Err("dup_line_char_frac")
        );
        // Runs of newlines are one separator for lines: no empty duplicate lines.
        assert_eq!(repetition(&format!("{a}\n\n\n{b}\n\n\n{c}")), Ok(()));
    }

    #[test]
    fn repetition_top_n_grams() {
        let filler = distinct_words(400);
        let mut f = filler.iter();
        let mut two = String::new();
        for _ in 0..20 {
            two.push_str(&format!("alpha beta {} ", f.next().unwrap()));
        }
        assert_eq!(repetition(&two), Err("top_2_gram"));

        // "abcd efgh ijkl" (14 chars) 15 times in ~850 chars: 0.18 < share, while its
        // 2-grams (9 chars) stay under 0.2.
        let mut three = String::new();
        for _ in 0..15 {
            three.push_str("abcd efgh ijkl ");
            for _ in 0..6 {
                three.push_str(f.next().unwrap());
                three.push(' ');
            }
        }
        assert_eq!(repetition(&three), Err("top_3_gram"));

        let mut four = String::new();
        for _ in 0..10 {
            four.push_str("abcd efgh ijkl mnop ");
            for _ in 0..12 {
                four.push_str(f.next().unwrap());
                four.push(' ');
            }
        }
        assert_eq!(repetition(&four), Err("top_4_gram"));
    }

    #[test]
    fn repetition_duplicated_n_grams() {
        // The same 50 distinct words twice: every 2-gram appears only twice, but half the
        // characters are in repeated 5-grams.
        let half = distinct_words(50).join(" ");
        let text = format!("{half} {half}");
        assert_eq!(repetition(&text), Err("duplicated_5_n_grams"));
        let only_six = GopherRepetition {
            dup_n_grams: [(6, 0.14)].into_iter().collect(),
            ..GopherRepetition::default()
        };
        assert_eq!(only_six.check(&text), Err("duplicated_6_n_grams"));
        let none = GopherRepetition {
            dup_n_grams: BTreeMap::new(),
            ..GopherRepetition::default()
        };
        assert_eq!(none.check(&text), Ok(()));
    }

    #[test]
    fn n_gram_helpers_match_datatrove() {
        let g = Grams::new("a b a b a b c");
        // "a b" 3 times: 3 chars each.
        assert_eq!(g.top_duplicate(2), Some(9));
        // Ties go to the first seen: "a b a" (x2) over "b a b" (x2).
        assert_eq!(g.top_duplicate(3), Some(10));
        // Non-overlapping repeats: "ab" at 0 new, "ba" new, "ab" repeat (skip 2), "ab" repeat.
        assert_eq!(g.all_duplicates(2), 4);
        // Joined without spaces: "ab"+"c" equals "a"+"bc".
        let g = Grams::new("ab c a bc");
        assert_eq!(g.all_duplicates(2), 3);
        assert_eq!(g.top_duplicate(8), None);
    }

    #[test]
    fn newline_runs() {
        let v: Vec<_> = split_on_newline_runs("\na\nb\n\n\nc\n", 1).collect();
        assert_eq!(v, ["", "a", "b", "c", ""]);
        let v: Vec<_> = split_on_newline_runs("a\nb\n\nc", 2).collect();
        assert_eq!(v, ["a\nb", "c"]);
        assert_eq!(split_on_newline_runs("", 2).collect::<Vec<_>>(), [""]);
    }
}
