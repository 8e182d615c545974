//! Language identification, in place of datatrove's `LanguageFilter`, with the `whatlang` crate
//! (pure Rust, no model file) instead of fastText's `lid.176` model.
//!
//! whatlang's confidence is not fastText's probability: it measures how far the best language's
//! trigram score is ahead of the runner-up's (1.0 once it is clearly ahead, and always 1.0 for a
//! script only one supported language uses), so the same threshold keeps a different set of
//! documents than datatrove; short or mixed texts score low in both. whatlang knows 70
//! languages (fastText: 176); a language it does not know cannot be listed.

use serde::{Deserialize, Serialize};
use whatlang::Lang;
use zflow_pipeline::ConfigError;

/// The rule name of [`LanguageFilter`] in the stats table.
pub const RULE: &str = "language";

/// ISO 639-1 codes, as fastText's `lid.176` labels them (`__label__en`), of the languages
/// whatlang detects. fastText's labels `he`, `no` and `fa` are Hebrew, Norwegian (whatlang:
/// Bokmål) and Persian; `nb` is accepted for Bokmål too.
pub const LANGUAGES: &[(&str, Lang)] = &[
    ("af", Lang::Afr),
    ("ak", Lang::Aka),
    ("am", Lang::Amh),
    ("ar", Lang::Ara),
    ("az", Lang::Aze),
    ("be", Lang::Bel),
    ("bg", Lang::Bul),
    ("bn", Lang::Ben),
    ("ca", Lang::Cat),
    ("cs", Lang::Ces),
    ("cy", Lang::Cym),
    ("da", Lang::Dan),
    ("de", Lang::Deu),
    ("el", Lang::Ell),
    ("en", Lang::Eng),
    ("eo", Lang::Epo),
    ("es", Lang::Spa),
    ("et", Lang::Est),
    ("fa", Lang::Pes),
    ("fi", Lang::Fin),
    ("fr", Lang::Fra),
    ("gu", Lang::Guj),
    ("he", Lang::Heb),
    ("hi", Lang::Hin),
    ("hr", Lang::Hrv),
    ("hu", Lang::Hun),
    ("hy", Lang::Hye),
    ("id", Lang::Ind),
    ("it", Lang::Ita),
    ("ja", Lang::Jpn),
    ("jv", Lang::Jav),
    ("ka", Lang::Kat),
    ("km", Lang::Khm),
    ("kn", Lang::Kan),
    ("ko", Lang::Kor),
    ("la", Lang::Lat),
    ("lt", Lang::Lit),
    ("lv", Lang::Lav),
    ("mk", Lang::Mkd),
    ("ml", Lang::Mal),
    ("mr", Lang::Mar),
    ("my", Lang::Mya),
    ("nb", Lang::Nob),
    ("ne", Lang::Nep),
    ("nl", Lang::Nld),
    ("no", Lang::Nob),
    ("or", Lang::Ori),
    ("pa", Lang::Pan),
    ("pl", Lang::Pol),
    ("pt", Lang::Por),
    ("ro", Lang::Ron),
    ("ru", Lang::Rus),
    ("si", Lang::Sin),
    ("sk", Lang::Slk),
    ("sl", Lang::Slv),
    ("sn", Lang::Sna),
    ("sr", Lang::Srp),
    ("sv", Lang::Swe),
    ("ta", Lang::Tam),
    ("te", Lang::Tel),
    ("th", Lang::Tha),
    ("tk", Lang::Tuk),
    ("tl", Lang::Tgl),
    ("tr", Lang::Tur),
    ("uk", Lang::Ukr),
    ("ur", Lang::Urd),
    ("uz", Lang::Uzb),
    ("vi", Lang::Vie),
    ("yi", Lang::Yid),
    ("zh", Lang::Cmn),
    ("zu", Lang::Zul),
];

/// whatlang's language for an ISO 639-1 code (see [`LANGUAGES`]).
pub fn lang_of(code: &str) -> Option<Lang> {
    LANGUAGES.iter().find(|(c, _)| *c == code).map(|&(_, l)| l)
}

/// The ISO 639-1 code of a whatlang language (`no` for Bokmål, as fastText labels it).
pub fn code_of(lang: Lang) -> &'static str {
    match lang {
        Lang::Nob => "no",
        _ => LANGUAGES
            .iter()
            .find(|&&(_, l)| l == lang)
            .map_or("", |&(c, _)| c),
    }
}

/// `language:` settings: keep documents in the listed languages, detected with enough
/// confidence (datatrove's `LanguageFilter`, with whatlang: see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LanguageFilter {
    /// ISO 639-1 codes to keep (`[en]`); `null` (the default, as in datatrove) keeps any
    /// language detected with enough confidence.
    pub languages: Option<Vec<String>>,
    /// Smallest whatlang confidence to keep a document, exclusive as datatrove's
    /// `language_threshold`; default 0.65.
    pub threshold: f64,
}

impl Default for LanguageFilter {
    fn default() -> Self {
        LanguageFilter {
            languages: None,
            threshold: 0.65,
        }
    }
}

impl LanguageFilter {
    /// Checks the settings; `at` is their recipe path (`filters.language`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(ConfigError::new(
                format!("{at}.threshold"),
                format!("must be within 0..=1, got {}", self.threshold),
            ));
        }
        if let Some(langs) = &self.languages {
            if langs.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.languages"),
                    "an empty list would drop every document; leave `languages` out to keep any language",
                ));
            }
            for (i, code) in langs.iter().enumerate() {
                if lang_of(code).is_none() {
                    let known: Vec<&str> = LANGUAGES.iter().map(|(c, _)| *c).collect();
                    return Err(ConfigError::new(
                        format!("{at}.languages[{i}]"),
                        format!(
                            "`{code}` is not an ISO 639-1 code whatlang detects; known: {}",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The detected language's ISO 639-1 code and whatlang's confidence, if whatlang detects
    /// one.
    pub fn detect(text: &str) -> Option<(&'static str, f64)> {
        whatlang::detect(text).map(|info| (code_of(info.lang()), info.confidence()))
    }

    /// `Err(reason)` for a document to drop: `language_undetected` (no letters whatlang
    /// knows), `language_not_listed`, or `language_low_confidence` (confidence not above
    /// `threshold`).
    pub fn check(&self, text: &str) -> Result<(), &'static str> {
        let Some((code, confidence)) = Self::detect(text) else {
            return Err("language_undetected");
        };
        let listed = self.languages.as_ref().is_none_or(|langs| {
            // `nb` and `no` both mean Bokmål.
            langs
                .iter()
                .any(|l| l == code || (code == "no" && l == "nb"))
        });
        if !listed {
            return Err("language_not_listed");
        }
        if confidence <= self.threshold {
            return Err("language_low_confidence");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::CLEAN;

    const GERMAN: &str = "Die alte Steinbrücke am Rande des Dorfes wurde vor mehr als zweihundert Jahren gebaut, als der Fluss noch genutzt wurde, um Holz zur Küste zu bringen. Jeden Morgen überquerten die Bauern sie mit ihren Karren, und die Kinder lernten in den langen Sommerferien, von ihren niedrigen Mauern aus zu angeln.";
    const FRENCH: &str = "Le vieux pont de pierre, à l'entrée du village, a été construit il y a plus de deux cents ans, lorsque la rivière servait encore à transporter le bois jusqu'à la côte. Chaque matin, les paysans le traversaient avec leurs charrettes, et les enfants apprenaient à pêcher depuis ses murets pendant les longues vacances d'été.";

    fn only(codes: &[&str]) -> LanguageFilter {
        LanguageFilter {
            languages: Some(codes.iter().map(|c| c.to_string()).collect()),
            ..LanguageFilter::default()
        }
    }

    #[test]
    fn detects_english_german_french() {
        assert_eq!(LanguageFilter::detect(CLEAN).map(|d| d.0), Some("en"));
        assert_eq!(LanguageFilter::detect(GERMAN).map(|d| d.0), Some("de"));
        assert_eq!(LanguageFilter::detect(FRENCH).map(|d| d.0), Some("fr"));
        let en = only(&["en"]);
        assert_eq!(en.check(CLEAN), Ok(()));
        assert_eq!(en.check(GERMAN), Err("language_not_listed"));
        assert_eq!(en.check(FRENCH), Err("language_not_listed"));
        assert_eq!(only(&["en", "de"]).check(GERMAN), Ok(()));
        assert_eq!(only(&["fr"]).check(FRENCH), Ok(()));
        // Without a list, any confidently detected language is kept.
        let any = LanguageFilter::default();
        for text in [CLEAN, GERMAN, FRENCH] {
            assert_eq!(any.check(text), Ok(()));
        }
    }

    #[test]
    fn garbage_is_dropped() {
        let any = LanguageFilter::default();
        let garbage = "xq zv 4812 kfw pl0 @@ qrt mnb zzt 77 wxk";
        let (_, confidence) = LanguageFilter::detect(garbage).expect("some guess");
        assert!(confidence <= 0.65, "confidence {confidence}");
        assert_eq!(any.check(garbage), Err("language_low_confidence"));
        assert_eq!(any.check("1234 5678 !!! ---"), Err("language_undetected"));
        assert_eq!(any.check(""), Err("language_undetected"));
        // A zero threshold keeps any detected language.
        let zero = LanguageFilter {
            threshold: 0.0,
            ..LanguageFilter::default()
        };
        assert_eq!(zero.check(garbage).is_ok(), confidence > 0.0);
    }

    #[test]
    fn settings() {
        let parsed: LanguageFilter =
            serde_json::from_str(r#"{"languages": ["en", "no"]}"#).unwrap();
        assert_eq!(parsed.threshold, 0.65);
        assert!(parsed.validate("filters.language").is_ok());
        let err = only(&["en", "xx"])
            .validate("filters.language")
            .unwrap_err();
        assert_eq!(err.path, "filters.language.languages[1]");
        assert!(only(&[]).validate("filters.language").is_err());
        let high = LanguageFilter {
            threshold: 1.5,
            ..LanguageFilter::default()
        };
        assert_eq!(high.validate("f").unwrap_err().path, "f.threshold");
        for &(code, lang) in LANGUAGES {
            assert_eq!(lang_of(code), Some(lang));
            assert_eq!(code_of(lang), if code == "nb" { "no" } else { code });
        }
        assert_eq!(LANGUAGES.len(), whatlang::Lang::all().len() + 1);
    }
}
