//! datatrove's `FineWebQualityFilter` (Penedo et al. 2024, the FineWeb heuristics): too few
//! lines ending in terminal punctuation, too many short lines, too many characters in
//! duplicated lines, too many line breaks per word (lists).

use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;

use super::text::{char_len, find_duplicates, for_each_word, is_terminal_punctuation, py_strip};

/// The rule name of [`FineWebQuality`] in the stats table.
pub const RULE: &str = "fineweb";

/// `fineweb:` settings: datatrove's `FineWebQualityFilter`, every field defaulting to
/// datatrove's value. Lines are the non-blank pieces between `\n`s, not stripped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FineWebQuality {
    /// Smallest share of lines ending in a terminal punctuation mark (datatrove's
    /// `TERMINAL_PUNCTUATION`) (`line_punct_ratio`); default 0.12.
    pub line_punct_thr: f64,
    /// Keep documents where no line ends in terminal punctuation (the ratio is exactly 0);
    /// default false.
    pub line_punct_exclude_zero: bool,
    /// Largest share of lines of at most `short_line_length` chars (`short_line_ratio`);
    /// default 0.67.
    pub short_line_thr: f64,
    /// The length in chars up to which a line is short; default 30.
    pub short_line_length: usize,
    /// Largest share of characters (line breaks not counted) in lines that repeat an earlier
    /// line (`char_dup_ratio`); default 0.01.
    pub char_duplicates_ratio: f64,
    /// Largest number of `\n` per word (`list_ratio`); default 0.3.
    pub new_line_ratio: f64,
}

impl Default for FineWebQuality {
    fn default() -> Self {
        FineWebQuality {
            line_punct_thr: 0.12,
            line_punct_exclude_zero: false,
            short_line_thr: 0.67,
            short_line_length: 30,
            char_duplicates_ratio: 0.01,
            new_line_ratio: 0.3,
        }
    }
}

impl FineWebQuality {
    /// Checks the settings; `at` is their recipe path (`filters.fineweb`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        for (name, v) in [
            ("line_punct_thr", self.line_punct_thr),
            ("short_line_thr", self.short_line_thr),
            ("char_duplicates_ratio", self.char_duplicates_ratio),
            ("new_line_ratio", self.new_line_ratio),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::new(
                    format!("{at}.{name}"),
                    format!("must be a number >= 0, got {v}"),
                ));
            }
        }
        Ok(())
    }

    /// Runs the rules on `text` in datatrove's order: `Err(reason)` (`empty`,
    /// `line_punct_ratio`, `short_line_ratio`, `char_dup_ratio`, `list_ratio`) for the first
    /// it fails.
    pub fn check(&self, text: &str) -> Result<(), &'static str> {
        let lines = || text.split('\n').filter(|l| !py_strip(l).is_empty());
        let (mut n_lines, mut punct, mut short) = (0usize, 0usize, 0usize);
        for line in lines() {
            n_lines += 1;
            punct += usize::from(
                line.chars()
                    .next_back()
                    .is_some_and(is_terminal_punctuation),
            );
            short += usize::from(
                line.len() <= self.short_line_length || char_len(line) <= self.short_line_length,
            );
        }
        if n_lines == 0 {
            return Err("empty");
        }
        let ratio = punct as f64 / n_lines as f64;
        if ratio < self.line_punct_thr && !(ratio == 0.0 && self.line_punct_exclude_zero) {
            return Err("line_punct_ratio");
        }
        if short as f64 / n_lines as f64 > self.short_line_thr {
            return Err("short_line_ratio");
        }
        let newlines = text.bytes().filter(|&b| b == b'\n').count();
        let (_, dup_chars) = find_duplicates(lines());
        // Not empty: there is a non-blank line.
        if dup_chars as f64 / (char_len(text) - newlines) as f64 > self.char_duplicates_ratio {
            return Err("char_dup_ratio");
        }
        let mut words = 0usize;
        for_each_word(text, |_| words += 1);
        if newlines as f64 / words as f64 > self.new_line_ratio {
            return Err("list_ratio");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::CLEAN;

    fn fineweb(text: &str) -> Result<(), &'static str> {
        FineWebQuality::default().check(text)
    }

    #[test]
    fn clean_prose_passes() {
        assert_eq!(fineweb(CLEAN), Ok(()));
    }

    #[test]
    fn empty() {
        assert_eq!(fineweb(""), Err("empty"));
        assert_eq!(fineweb("\n  \n\t\n"), Err("empty"));
    }

    #[test]
    fn line_punctuation() {
        // 1 of 9 lines (0.11) ends in punctuation: dropped; 1 of 8 (0.125): kept.
        let lines: Vec<String> = (0..8)
            .map(|i| format!("This is navigation entry number {i} of the site menu"))
            .collect();
        let text = |n: usize| format!("{}\nThe page ends here.", lines[..n].join("\n"));
        assert_eq!(fineweb(&text(8)), Err("line_punct_ratio"));
        assert_eq!(fineweb(&text(7)), Ok(()));
        // A line ending in a space or `\r` does not end in punctuation.
        assert_eq!(
            fineweb("One line here.\r\nTwo lines.\r\n"),
            Err("line_punct_ratio")
        );
        let zero_ok = FineWebQuality {
            line_punct_exclude_zero: true,
            ..FineWebQuality::default()
        };
        assert_eq!(zero_ok.check(&lines.join("\n")), Ok(()));
        // Other scripts' terminal punctuation counts.
        assert_eq!(
            fineweb("これは日本語の文章です。とても良い天気ですね、散歩に行きましょう。"),
            Ok(())
        );
    }

    #[test]
    fn short_lines() {
        // 7 of 10 lines are short (0.7 > 0.67); with 6 of 10 (0.6) the document is kept.
        let short: Vec<String> = (0..7).map(|i| format!("Short line number {i}.")).collect();
        let long: Vec<String> = (0..4)
            .map(|i| format!("This is a much longer line of ordinary prose, number {i}."))
            .collect();
        let text =
            |s: usize, l: usize| format!("{}\n{}", short[..s].join("\n"), long[..l].join("\n"));
        assert_eq!(fineweb(&text(7, 3)), Err("short_line_ratio"));
        assert_eq!(fineweb(&text(6, 4)), Ok(()));
        // Exactly 30 chars is short.
        let thirty = "A line of exactly thirty char.";
        assert_eq!(thirty.len(), 30);
        assert_eq!(fineweb(&[thirty; 7].join("\n")), Err("short_line_ratio"));
    }

    #[test]
    fn duplicated_lines() {
        let dup = "Subscribe to our newsletter for weekly updates.";
        assert_eq!(
            fineweb(&format!("{CLEAN}\n{dup}\n{dup}")),
            Err("char_dup_ratio")
        );
        // Duplicates under 1% of the characters are fine.
        assert_eq!(fineweb(&format!("{CLEAN}\nThe end.\nThe end.")), Ok(()));
    }

    #[test]
    fn list_ratio() {
        // Unique lines of three long words (4 words with the period), each followed by a blank
        // line: 2 line breaks per 4 words.
        let lines: Vec<String> = (0..10)
            .map(|i| format!("Extraordinarily comprehensive documentation{i}."))
            .collect();
        assert_eq!(fineweb(&lines.join("\n\n")), Err("list_ratio"));
        assert_eq!(fineweb(&lines.join("\n")), Ok(()));
    }
}
