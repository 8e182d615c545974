//! Minerva's final-answer normalisation for MATH (Lewkowycz et al. 2022, appendix D), with the
//! refinements lm-eval 0.4.13's `minerva_math` makes to it, so zflow's extracted answers are
//! lm-eval's, character for character.
//!
//! [`normalize_final_answer`] turns a model's final answer (`$\frac{1}{2}$ inches`) into the form
//! MATH's gold answers are kept in (`\frac{1}{2}`); two answers are then compared as strings,
//! and where they differ, by sympy (`workers/torch/zflow_torch/math_equivalence.py`).

use std::sync::LazyLock;

use regex::Regex;

/// Replaced in order, everywhere (plain text, not patterns).
const SUBSTITUTIONS: [(&str, &str); 10] = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
];

/// Units and filler removed from answers: the alphabetic ones as words (never inside a LaTeX
/// command's name, so `\left` keeps its `ft`), the others as plain text.
const REMOVED_EXPRESSIONS: [&str; 42] = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "ft",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    "\"",
    "\\dots",
];

fn is_alphabetic(s: &str) -> bool {
    !s.is_empty() && s.chars().all(char::is_alphabetic)
}

macro_rules! re {
    ($name:ident, $pattern:expr) => {
        static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($pattern).expect("a valid pattern"));
    };
}

re!(LATEX_COMMAND, r"\\[a-zA-Z]+");
re!(DOLLARS, r"(.*?)(\$)(.*?)(\$)(.*)");
re!(TEXT, r"(\\text\{)(.*?)(\})");
re!(TEXTBF, r"(\\textbf\{)(.*?)(\})");
re!(OVERLINE, r"(\\overline\{)(.*?)(\})");
re!(BOXED, r"(\\boxed\{)(.*)(\})");
re!(FRAC, r"(frac)([^{])(.)");
re!(INDEXED_SQRT, r"(sqrt)(\[[^\]]*\])(\w)");
// `(sqrt)(?!\[)([^{])`: a character that is neither `[` nor `{`, consumed the same way.
re!(SQRT, r"(sqrt)([^{\[])");
re!(THOUSANDS, r"^-?\d{1,3}(,\d{3})+$");

/// Removes `word` where it stands as a whole word not preceded by a backslash (Python's
/// `(?<!\\)\bword\b`: the `regex` crate has no look-behind, so matches are filtered).
fn remove_word(text: &str, word: &str) -> String {
    let re = Regex::new(&format!(r"\b{}\b", regex::escape(word))).expect("a valid pattern");
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for m in re.find_iter(text) {
        if text[..m.start()].ends_with('\\') {
            continue;
        }
        out.push_str(&text[last..m.start()]);
        last = m.end();
    }
    out.push_str(&text[last..]);
    out
}

/// Replaces `from` by `to` outside LaTeX command names (`\left` stays whole).
fn replace_outside_commands(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for m in LATEX_COMMAND.find_iter(text) {
        out.push_str(&text[last..m.start()].replace(from, to));
        out.push_str(m.as_str());
        last = m.end();
    }
    out.push_str(&text[last..].replace(from, to));
    out
}

/// Normalises a final answer as Minerva does (see the module's docs).
pub fn normalize_final_answer(answer: &str) -> String {
    let mut s = answer.rsplit('=').next().unwrap_or("").to_string();
    for word in REMOVED_EXPRESSIONS.iter().filter(|e| is_alphabetic(e)) {
        s = remove_word(&s, word);
    }
    for (from, to) in SUBSTITUTIONS {
        s = s.replace(from, to);
    }
    for expr in REMOVED_EXPRESSIONS {
        s = if is_alphabetic(expr) {
            // Units glued to their neighbours once the spaces are gone.
            replace_outside_commands(&s, expr, "")
        } else {
            s.replace(expr, "")
        };
    }
    s = DOLLARS.replace_all(&s, "$$${3}$$").into_owned();
    s = TEXT.replace_all(&s, "${2}").into_owned();
    s = TEXTBF.replace_all(&s, "${2}").into_owned();
    s = OVERLINE.replace_all(&s, "${2}").into_owned();
    s = BOXED.replace_all(&s, "${2}").into_owned();
    s = FRAC.replace_all(&s, "frac{${2}}{${3}}").into_owned();
    s = INDEXED_SQRT.replace_all(&s, "${1}${2}{${3}}").into_owned();
    s = SQRT.replace_all(&s, "sqrt{${2}}").into_owned();
    s = s.replace('$', "");
    if THOUSANDS.is_match(&s) {
        s = s.replace(',', "");
    }
    s
}

/// The last `\boxed{...}` (or `\boxed x`, `\fbox{...}`) of a solution, braces balanced.
pub fn last_boxed(solution: &str) -> Option<&str> {
    if let Some(at) = solution.rfind("\\boxed ") {
        let rest = &solution[at..];
        return Some(rest.split('$').next().unwrap_or(rest));
    }
    let start = solution
        .rfind("\\boxed")
        .or_else(|| solution.rfind("\\fbox"))?;
    let mut depth = 0i32;
    for (i, c) in solution[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&solution[start..start + i + 1]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The content of a `\boxed{...}` or `\boxed x`.
pub fn remove_boxed(boxed: &str) -> Option<&str> {
    boxed
        .strip_prefix("\\boxed ")
        .or_else(|| boxed.strip_prefix("\\boxed{")?.strip_suffix('}'))
}

/// A MATH solution's gold answer: its last box's content, normalised.
pub fn gold_answer(solution: &str) -> Option<String> {
    last_boxed(solution)
        .and_then(remove_boxed)
        .map(normalize_final_answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_matches_hand_checked_answers() {
        for (raw, want) in [
            ("$4$", "4"),
            ("$\\frac{1}{2}$ inches", "\\frac{1}{2}"),
            ("x = 10", "10"),
            ("\\$1,000,000", "1000000"),
            ("(0,1)", "(0,1)"),
            ("0,1", "0,1"),
            ("\\boxed{5}", "5"),
            ("\\text{(A)}", "(A)"),
            ("\\dfrac12", "\\dfrac{1}{2}"),
            ("\\sqrt2", "\\sqrt{2}"),
            ("\\sqrt[3]8", "\\sqrt[3]{8}"),
            ("\\sqrt[3]{8}", "\\sqrt[3]{8}"),
            ("90^\\circ", "90"),
            ("5 \\text{ cm}", "5"),
            ("\\left( 1, 2 \\right)", "\\left(1,2\\right)"),
            ("an integer 7", "integer7"),
        ] {
            assert_eq!(normalize_final_answer(raw), want, "{raw}");
        }
    }

    #[test]
    fn gold_answers_come_from_the_last_box() {
        let s = "First \\boxed{1}, then $x = \\boxed{\\frac{2}{3}}$.";
        assert_eq!(last_boxed(s), Some("\\boxed{\\frac{2}{3}}"));
        assert_eq!(gold_answer(s).as_deref(), Some("\\frac{2}{3}"));
        assert_eq!(gold_answer("\\boxed 5$ and more").as_deref(), Some("5"));
        assert_eq!(gold_answer("no box"), None);
    }
}
