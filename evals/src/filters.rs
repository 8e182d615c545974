//! Answer extraction and `exact_match` normalisation for generation tasks.
//!
//! [`Extractor`] is lm-eval's `regex` filter followed by `take_first`: all matches are found,
//! `group_select` picks one (negative counts from the end), and a pattern's capture groups
//! decide what a match is (Python's `re.findall`: no group -> the match, one group -> that
//! group, several -> the first non-empty one). [`Normalizer`] is Hugging Face `evaluate`'s
//! `exact_match` preprocessing, applied to prediction and reference alike.

use anyhow::Result;
use regex::Regex;

use crate::task::{AnswerNormalization, ExactMatchSpec, FilterSpec};

/// A compiled extraction filter.
#[derive(Debug, Clone)]
pub struct Extractor {
    /// Its name in results (`strict-match`).
    pub name: String,
    regex: Regex,
    group_select: i64,
    fallback: String,
    suffix: String,
    normalize: Option<AnswerNormalization>,
}

impl Extractor {
    /// Compiles a filter.
    pub fn new(spec: &FilterSpec) -> Result<Self> {
        Ok(Extractor {
            name: spec.name.clone(),
            regex: Regex::new(&spec.regex)?,
            group_select: spec.group_select,
            fallback: spec.fallback.clone(),
            suffix: spec.suffix.clone(),
            normalize: spec.normalize,
        })
    }

    /// The extracted answer (stripped, then normalised), or the fallback (normalised too).
    pub fn apply(&self, text: &str) -> String {
        let answer = self.extract(&format!("{text}{}", self.suffix));
        match self.normalize {
            None => answer,
            Some(AnswerNormalization::MinervaMath) => crate::math::normalize_final_answer(&answer),
        }
    }

    fn extract(&self, text: &str) -> String {
        let groups = self.regex.captures_len();
        let matches: Vec<Option<String>> = self
            .regex
            .captures_iter(text)
            .map(|c| match groups {
                1 => c.get(0).map(|m| m.as_str().to_string()),
                2 => Some(c.get(1).map_or(String::new(), |m| m.as_str().to_string())),
                _ => (1..groups)
                    .filter_map(|g| c.get(g))
                    .map(|m| m.as_str())
                    .find(|s| !s.is_empty())
                    .map(str::to_string),
            })
            .collect();
        if matches.is_empty() {
            return self.fallback.clone();
        }
        let n = matches.len() as i64;
        let idx = if self.group_select < 0 {
            n + self.group_select
        } else {
            self.group_select
        };
        match usize::try_from(idx).ok().and_then(|i| matches.get(i)) {
            Some(Some(m)) => m.trim().to_string(),
            _ => self.fallback.clone(),
        }
    }
}

/// `exact_match` preprocessing.
#[derive(Debug, Clone)]
pub struct Normalizer {
    ignore: Vec<Regex>,
    ignore_case: bool,
    ignore_punctuation: bool,
}

impl Normalizer {
    /// Compiles the options.
    pub fn new(spec: &ExactMatchSpec) -> Result<Self> {
        Ok(Normalizer {
            ignore: spec
                .regexes_to_ignore
                .iter()
                .map(|r| Regex::new(r))
                .collect::<Result<_, _>>()?,
            ignore_case: spec.ignore_case,
            ignore_punctuation: spec.ignore_punctuation,
        })
    }

    /// The normalised text.
    pub fn apply(&self, text: &str) -> String {
        let mut s = text.to_string();
        for r in &self.ignore {
            s = r.replace_all(&s, "").into_owned();
        }
        if self.ignore_case {
            s = s.to_lowercase();
        }
        if self.ignore_punctuation {
            // Python's string.punctuation is exactly ASCII punctuation.
            s.retain(|c| !c.is_ascii_punctuation());
        }
        s
    }

    /// 1.0 when prediction and reference normalise to the same text, or to a pair in
    /// `equivalent` (those the task's `exact_match.equivalence` judged equal).
    pub fn score(
        &self,
        prediction: &str,
        reference: &str,
        equivalent: &std::collections::HashSet<(String, String)>,
    ) -> f64 {
        let pair = (self.apply(prediction), self.apply(reference));
        f64::from(u8::from(pair.0 == pair.1 || equivalent.contains(&pair)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gsm8k() -> (Extractor, Extractor, Normalizer) {
        let strict = Extractor::new(&FilterSpec {
            name: "strict-match".into(),
            regex: r"#### (\-?[0-9\.\,]+)".into(),
            group_select: 0,
            fallback: "[invalid]".into(),
            suffix: String::new(),
            normalize: None,
        })
        .unwrap();
        let flexible = Extractor::new(&FilterSpec {
            name: "flexible-extract".into(),
            regex: r"(-?[$0-9.,]{2,})|(-?[0-9]+)".into(),
            group_select: -1,
            fallback: "[invalid]".into(),
            suffix: String::new(),
            normalize: None,
        })
        .unwrap();
        let norm = Normalizer::new(&ExactMatchSpec {
            ignore_case: true,
            ignore_punctuation: false,
            regexes_to_ignore: vec![
                ",".into(),
                r"\$".into(),
                "(?s).*#### ".into(),
                r"\.$".into(),
            ],
            equivalence: None,
        })
        .unwrap();
        (strict, flexible, norm)
    }

    #[test]
    fn gsm8k_extraction_matches_lm_eval() {
        let (strict, flexible, norm) = gsm8k();
        let none = Default::default();
        let reference = "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18";
        let out = " Janet has 16 - 3 - 4 = 9 eggs. 9 * 2 = $18.\n#### 18";
        assert_eq!(strict.apply(out), "18");
        assert_eq!(norm.score(&strict.apply(out), reference, &none), 1.0);
        let out = " She sells 9 eggs for $2 each, so she makes $18.";
        assert_eq!(strict.apply(out), "[invalid]");
        assert_eq!(flexible.apply(out), "$18.");
        assert_eq!(norm.score(&flexible.apply(out), reference, &none), 1.0);
        assert_eq!(flexible.apply("1,234 and then 5"), "5");
        assert_eq!(norm.apply("$1,234."), "1234");
        assert_eq!(flexible.apply("no digits"), "[invalid]");
    }

    #[test]
    fn minerva_answers_are_extracted_and_normalised_as_lm_eval_does() {
        let minerva = Extractor::new(&FilterSpec {
            name: "minerva".into(),
            regex: "Final Answer: The final answer is(.*?). I hope it is correct.".into(),
            group_select: 0,
            fallback: "[invalidanswer]".into(),
            suffix: "I hope it is correct.".into(),
            normalize: Some(AnswerNormalization::MinervaMath),
        })
        .unwrap();
        let g = "so x = 4.\nFinal Answer: The final answer is $4$. I hope it is correct.\n\n";
        assert_eq!(minerva.apply(g), "4");
        // Cut off before the closing sentence.
        let g = "Final Answer: The final answer is $\\frac{1}{2}$ inches. ";
        assert_eq!(minerva.apply(g), "\\frac{1}{2}");
        assert_eq!(minerva.apply("no answer here"), "[invalidanswer]");
    }
}
