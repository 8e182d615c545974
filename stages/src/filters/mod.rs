//! Document quality filters of a source (`sources.<name>.filters:` in a recipe), as datatrove
//! 0.10 defines them, in pure Rust:
//!
//! ```yaml
//! sources:
//!   web:
//!     url: ...
//!     filters:
//!       language: {languages: [en]}
//!       gopher_repetition: {}          # `{}`: datatrove's defaults
//!       gopher_quality: {min_doc_words: 100}
//!       c4: {filter_curly_bracket: false}
//!       fineweb: {}
//!       pii: {}
//! ```
//!
//! [`Filters::apply`] runs them in the order of [`Filters`]' fields (FineWeb's pipeline order):
//! [`language`], [`gopher`] repetition then quality, [`c4`] (which removes lines), [`fineweb`],
//! then [`pii`] redaction. Each filter's module says where it departs from datatrove; the main
//! difference is shared: datatrove 0.10.1 splits English words with spaCy's blank English
//! tokenizer and sentences with its sentencizer (its `tokenizer_assignment.csv`; NLTK and
//! punkt serve other languages), here with rules modelled on NLTK's steps (see `text.rs`:
//! `for_each_word` and `for_each_sentence_break`). Known effects: spaCy splits hyphenated
//! words (`well - known`), keeps `e.g.`, `U.S.` and URLs whole, and ends a sentence at every
//! `.`, `!` or `?`; these shift Gopher's ratios, C4's sentence count and FineWeb's
//! words-per-line at the margins. spaCy's time also grows with the square of a run without
//! whitespace (a 800K-character minified file took minutes); these rules are linear.

use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;

pub mod c4;
pub mod fineweb;
pub mod gopher;
pub mod language;
pub mod pii;
mod text;

pub use c4::C4Quality;
pub use fineweb::FineWebQuality;
pub use gopher::{GopherQuality, GopherRepetition};
pub use language::LanguageFilter;
pub use pii::Pii;

/// Quality filters of a source (`sources.<name>.filters:` in a recipe), applied in this order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    /// Keep documents in these languages (whatlang).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<LanguageFilter>,
    /// datatrove's `GopherRepetitionFilter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gopher_repetition: Option<GopherRepetition>,
    /// datatrove's `GopherQualityFilter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gopher_quality: Option<GopherQuality>,
    /// datatrove's `C4QualityFilter` (removes lines, may drop the document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c4: Option<C4Quality>,
    /// datatrove's `FineWebQualityFilter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fineweb: Option<FineWebQuality>,
    /// datatrove's `PIIFormatter` (redacts, never drops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pii: Option<Pii>,
}

/// What [`Filters::apply`] made of one document: kept (`kept` is `Some`, `dropped_by` and
/// `reason` are `None`) or dropped (`kept` is `None`, `dropped_by` names the filter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The text to keep, after C4's line removal and PII redaction.
    pub kept: Option<String>,
    /// The rule (filter) that dropped the document: one of [`Filters::drop_rules`].
    pub dropped_by: Option<&'static str>,
    /// datatrove's finer reason within that filter (`gopher_short_doc`, `top_2_gram`,
    /// `too_few_sentences`, `line_punct_ratio`, `language_not_listed`, ...).
    pub reason: Option<&'static str>,
    /// E-mail and IP addresses replaced (0 for a dropped document).
    pub pii_redactions: u64,
    /// Lines C4 removed, blank ones included (0 for a dropped document).
    pub c4_lines_removed: u64,
}

impl Outcome {
    fn dropped(rule: &'static str, reason: &'static str) -> Self {
        Outcome {
            dropped_by: Some(rule),
            reason: Some(reason),
            ..Outcome::default()
        }
    }
}

impl Filters {
    /// Whether no filter is set (documents pass unchanged).
    pub fn is_empty(&self) -> bool {
        self == &Filters::default()
    }

    /// Checks settings; `Err(ConfigError)` naming the field
    /// (`filters.gopher_quality.min_stop_words`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(f) = &self.language {
            f.validate("filters.language")?;
        }
        if let Some(f) = &self.gopher_repetition {
            f.validate("filters.gopher_repetition")?;
        }
        if let Some(f) = &self.gopher_quality {
            f.validate("filters.gopher_quality")?;
        }
        if let Some(f) = &self.fineweb {
            f.validate("filters.fineweb")?;
        }
        if let Some(f) = &self.pii {
            f.validate("filters.pii")?;
        }
        Ok(())
    }

    /// The names of the rules that may drop a document, in the order they apply, for the stats
    /// table: `language`, `gopher_repetition`, `gopher_quality`, `c4`, `fineweb` (those set).
    pub fn drop_rules(&self) -> Vec<&'static str> {
        [
            (self.language.is_some(), language::RULE),
            (self.gopher_repetition.is_some(), gopher::REPETITION_RULE),
            (self.gopher_quality.is_some(), gopher::QUALITY_RULE),
            (self.c4.is_some(), c4::RULE),
            (self.fineweb.is_some(), fineweb::RULE),
        ]
        .into_iter()
        .filter_map(|(on, rule)| on.then_some(rule))
        .collect()
    }

    /// Runs the filters on one document, in order; the first that fails drops it.
    pub fn apply(&self, text: String) -> Outcome {
        let mut text = text;
        let checks: [(&'static str, Option<&dyn Check>); 3] = [
            (language::RULE, self.language.as_ref().map(|f| f as _)),
            (
                gopher::REPETITION_RULE,
                self.gopher_repetition.as_ref().map(|f| f as _),
            ),
            (
                gopher::QUALITY_RULE,
                self.gopher_quality.as_ref().map(|f| f as _),
            ),
        ];
        for (rule, check) in checks {
            if let Some(check) = check
                && let Err(reason) = check.check(&text)
            {
                return Outcome::dropped(rule, reason);
            }
        }
        let mut c4_lines_removed = 0;
        if let Some(c4) = &self.c4 {
            match c4.apply(&text) {
                Ok(kept) => {
                    text = kept.text;
                    c4_lines_removed = kept.lines_removed;
                }
                Err(reason) => return Outcome::dropped(c4::RULE, reason),
            }
        }
        if let Some(fineweb) = &self.fineweb
            && let Err(reason) = fineweb.check(&text)
        {
            return Outcome::dropped(fineweb::RULE, reason);
        }
        let mut pii_redactions = 0;
        if let Some(pii) = &self.pii {
            let (redacted, n) = pii.redact(&text);
            if let std::borrow::Cow::Owned(new) = redacted {
                text = new;
            }
            pii_redactions = n;
        }
        Outcome {
            kept: Some(text),
            pii_redactions,
            c4_lines_removed,
            ..Outcome::default()
        }
    }
}

/// A check that may drop a document, so [`Filters::apply`] can loop over the simple ones.
trait Check {
    fn check(&self, text: &str) -> Result<(), &'static str>;
}

macro_rules! impl_check {
    ($($t:ty),*) => {$(
        impl Check for $t {
            fn check(&self, text: &str) -> Result<(), &'static str> {
                <$t>::check(self, text)
            }
        }
    )*};
}
impl_check!(LanguageFilter, GopherRepetition, GopherQuality);

/// Real English prose, three paragraphs, that every filter keeps (for the tests).
#[cfg(test)]
pub(crate) const CLEAN: &str = "The old stone bridge at the edge of the village was built more than two hundred years ago, when the river was still used to carry timber down to the coast. Farmers crossed it every morning with their carts, and children learned to fish from its low walls during the long summer holidays.

Over time the traffic grew heavier, and the council began to worry that the arches would not survive another century. Engineers came to inspect the foundations and found that the mortar had been washed away in several places. They recommended a careful repair rather than a new crossing, because the bridge had become part of the character of the valley.

The work took nearly two years to finish. Masons cut new blocks from the same quarry that had supplied the original builders, and they matched the colour of the stone so well that visitors can hardly tell which parts are new. Today the bridge carries walkers and cyclists, while heavy lorries use a modern road further upstream.";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all() -> Filters {
        serde_json::from_value(json!({
            "language": {"languages": ["en"]},
            "gopher_repetition": {},
            "gopher_quality": {},
            "c4": {},
            "fineweb": {},
            "pii": {},
        }))
        .unwrap()
    }

    #[test]
    fn empty_settings_are_datatrove_defaults() {
        let f = all();
        assert_eq!(f.gopher_quality, Some(GopherQuality::default()));
        assert_eq!(f.gopher_repetition, Some(GopherRepetition::default()));
        assert_eq!(f.c4, Some(C4Quality::default()));
        assert_eq!(f.fineweb, Some(FineWebQuality::default()));
        assert_eq!(f.pii, Some(Pii::default()));
        assert_eq!(f.language.as_ref().unwrap().threshold, 0.65);
        assert!(f.validate().is_ok());
        assert_eq!(
            f.drop_rules(),
            [
                "language",
                "gopher_repetition",
                "gopher_quality",
                "c4",
                "fineweb"
            ]
        );
        assert!(Filters::default().drop_rules().is_empty());
        assert!(Filters::default().is_empty());
        // Round trip, n-gram maps included (JSON object keys are strings).
        let back: Filters = serde_json::from_value(serde_json::to_value(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn settings_errors_name_the_field() {
        assert!(serde_json::from_value::<Filters>(json!({"gopher": {}})).is_err());
        assert!(serde_json::from_value::<Filters>(json!({"c4": {"min_sentences": 3}})).is_err());
        let off: Filters = serde_json::from_value(json!({
            "gopher_quality": {"min_doc_words": null},
            "c4": {"min_num_sentences": null},
            "gopher_repetition": {"top_n_grams": {"3": 0.5}},
        }))
        .unwrap();
        assert_eq!(off.gopher_quality.unwrap().min_doc_words, None);
        assert_eq!(off.c4.unwrap().min_num_sentences, None);
        assert_eq!(off.gopher_repetition.unwrap().top_n_grams.len(), 1);
        for (settings, path) in [
            (
                json!({"gopher_quality": {"min_stop_words": 9}}),
                "filters.gopher_quality.min_stop_words",
            ),
            (
                json!({"gopher_repetition": {"dup_n_grams": {"40": 0.1}}}),
                "filters.gopher_repetition.dup_n_grams.40",
            ),
            (
                json!({"fineweb": {"new_line_ratio": -1.0}}),
                "filters.fineweb.new_line_ratio",
            ),
            (
                json!({"language": {"languages": ["english"]}}),
                "filters.language.languages[0]",
            ),
            (
                json!({"pii": {"ip_replacement": []}}),
                "filters.pii.ip_replacement",
            ),
        ] {
            let f: Filters = serde_json::from_value(settings).unwrap();
            assert_eq!(f.validate().unwrap_err().path, path);
        }
    }

    #[test]
    fn apply_runs_in_order() {
        let f = all();
        let text = format!(
            "{CLEAN}\nWrite to the mayor at mayor@village.example.org for a guided tour.\nShare this page"
        );
        let out = f.apply(text);
        assert_eq!(out.dropped_by, None);
        assert_eq!(out.pii_redactions, 1);
        assert_eq!(out.c4_lines_removed, 3);
        let kept = out.kept.unwrap();
        assert!(
            kept.ends_with("at email@example.com for a guided tour."),
            "{kept}"
        );
        assert!(!kept.contains("Share this page"));

        // Each filter drops what it should, and earlier ones first.
        let short = "The old stone bridge at the edge of the village was built more than two hundred years ago, when the river was still used to carry timber down to the coast.".to_string();
        let out = f.apply(short.clone());
        assert_eq!(
            (out.dropped_by, out.reason),
            (Some("gopher_quality"), Some("gopher_short_doc"))
        );
        // whatlang is not confident about very short texts.
        assert_eq!(
            f.apply("The cat sat on the mat.".into()).dropped_by,
            Some("language")
        );
        let german = "Die alte Steinbrücke am Rande des Dorfes wurde vor mehr als zweihundert Jahren gebaut.";
        let out = f.apply(german.to_string());
        assert_eq!(
            (out.dropped_by, out.reason),
            (Some("language"), Some("language_not_listed"))
        );
        assert_eq!(
            f.apply(format!("{CLEAN}\n\n{CLEAN}")).dropped_by,
            Some("gopher_repetition")
        );
        let out = f.apply(format!(
            "{CLEAN}\nThe function returns {{x}} to its caller."
        ));
        assert_eq!(
            (out.dropped_by, out.reason),
            (Some("c4"), Some("curly_bracket"))
        );
        assert_eq!(out.kept, None);

        // No filters: the text passes unchanged.
        let none = Filters::default().apply(short.clone());
        assert_eq!(none.kept, Some(short));
    }

    #[test]
    fn fineweb_sees_c4_output() {
        // Without C4, FineWeb would see the menu lines; with it, they are gone first.
        let menu = (0..30)
            .map(|i| format!("Menu item {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let text = format!("{CLEAN}\n{menu}");
        let fineweb_only = Filters {
            fineweb: Some(FineWebQuality::default()),
            ..Filters::default()
        };
        assert_eq!(
            fineweb_only.apply(text.clone()).reason,
            Some("line_punct_ratio")
        );
        let both = Filters {
            c4: Some(C4Quality::default()),
            ..fineweb_only
        };
        let out = both.apply(text);
        assert_eq!(
            out.kept.as_deref(),
            Some(CLEAN.replace("\n\n", "\n").as_str())
        );
        assert_eq!(out.c4_lines_removed, 32);
    }
}
