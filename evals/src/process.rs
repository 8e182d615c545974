//! Built-in document preprocessors: the parts of lm-eval's tasks written in Python
//! (`process_docs: hellaswag`, `process_docs: winogrande`). Each adds columns to every document;
//! templates then read them like any other column.

use std::sync::LazyLock;

use anyhow::{Context, Result, bail};
use regex::Regex;
use serde_json::{Value, json};

use crate::dataset::Dataset;

/// The columns a preprocessor adds (so templates that use them pass the column check), and the
/// columns it reads.
pub fn columns(name: &str) -> Result<(&'static [&'static str], &'static [&'static str])> {
    Ok(match name {
        "hellaswag" => (
            &["query", "choices", "gold"],
            &["activity_label", "ctx_a", "ctx_b", "endings", "label"],
        ),
        "winogrande" => (
            &["contexts", "continuation", "gold"],
            &["sentence", "option1", "option2", "answer"],
        ),
        "minerva_math" => (&["answer"], &["solution"]),
        other => {
            bail!("unknown process_docs `{other}` (known: hellaswag, winogrande, minerva_math)")
        }
    })
}

/// Applies the preprocessor `name` to every document of `ds`.
pub fn apply(name: &str, ds: &mut Dataset) -> Result<()> {
    let (added, read) = columns(name)?;
    for c in read {
        ds.require_column(c, &format!("process_docs `{name}`"))?;
    }
    for (i, doc) in ds.docs.iter_mut().enumerate() {
        let extra = match name {
            "hellaswag" => hellaswag(doc),
            "winogrande" => winogrande(doc),
            "minerva_math" => minerva_math(doc),
            _ => unreachable!("checked by columns()"),
        }
        .with_context(|| {
            format!(
                "process_docs `{name}`: document {i} of {}",
                ds.source.display()
            )
        })?;
        for (k, v) in extra {
            doc.insert(k.to_string(), v);
        }
    }
    for c in added {
        if !ds.columns.iter().any(|x| x == c) {
            ds.columns.push(c.to_string());
        }
    }
    Ok(())
}

fn str_col<'a>(doc: &'a crate::dataset::Doc, col: &str) -> Result<&'a str> {
    doc.get(col)
        .and_then(Value::as_str)
        .with_context(|| format!("column `{col}` is not a string"))
}

/// lm-eval's `minerva_math` `process_docs`: the gold answer is the solution's last box,
/// normalised ([`crate::math::gold_answer`]). AllenAI's prepared documents carry an `answer`
/// of their own that differs on 96 of MATH's 5,500 test problems; this one replaces it.
fn minerva_math(doc: &crate::dataset::Doc) -> Result<Vec<(&'static str, Value)>> {
    let solution = str_col(doc, "solution")?;
    let answer = crate::math::gold_answer(solution)
        .with_context(|| "the solution has no \\boxed{} answer")?;
    Ok(vec![("answer", json!(answer))])
}

static BRACKETS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\[.*?\]").unwrap());

/// lm-eval's `hellaswag.utils.preprocess`: WikiHow artifacts out, double spaces collapsed once.
pub fn hellaswag_preprocess(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let text = BRACKETS.replace_all(&text, "");
    text.replace("  ", " ")
}

/// Python's `str.capitalize`: the first character upper case, the rest lower case.
pub fn py_capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        None => String::new(),
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
    }
}

fn hellaswag(doc: &crate::dataset::Doc) -> Result<Vec<(&'static str, Value)>> {
    let ctx = format!(
        "{} {}",
        str_col(doc, "ctx_a")?,
        py_capitalize(str_col(doc, "ctx_b")?)
    );
    let query = hellaswag_preprocess(&format!("{}: {ctx}", str_col(doc, "activity_label")?));
    let endings = doc["endings"]
        .as_array()
        .context("column `endings` is not a list")?;
    let choices: Vec<String> = endings
        .iter()
        .map(|e| {
            e.as_str()
                .map(hellaswag_preprocess)
                .context("an ending is not a string")
        })
        .collect::<Result<_>>()?;
    let gold = label_index(&doc["label"]).context("column `label`")?;
    Ok(vec![
        ("query", json!(query)),
        ("choices", json!(choices)),
        ("gold", json!(gold)),
    ])
}

/// lm-eval's winogrande partial scoring: the sentence up to the blank with each option is a
/// context; the rest of the sentence is the continuation every context is scored on.
fn winogrande(doc: &crate::dataset::Doc) -> Result<Vec<(&'static str, Value)>> {
    let sentence = str_col(doc, "sentence")?;
    let blank = sentence
        .find('_')
        .context("the sentence has no `_` blank")?;
    let contexts: Vec<String> = ["option1", "option2"]
        .iter()
        .map(|o| Ok(format!("{}{}", &sentence[..blank], str_col(doc, o)?)))
        .collect::<Result<_>>()?;
    let continuation = sentence[blank + 1..].trim().to_string();
    let gold = match str_col(doc, "answer")? {
        "1" => 0,
        "2" => 1,
        other => bail!("column `answer` is {other:?}, expected \"1\" or \"2\""),
    };
    Ok(vec![
        ("contexts", json!(contexts)),
        ("continuation", json!(continuation)),
        ("gold", json!(gold)),
    ])
}

/// A label stored as an integer or as a string of digits (hellaswag's `"3"`).
pub fn label_index(v: &Value) -> Result<i64> {
    match v {
        Value::Number(n) => n.as_i64().context("not an integer"),
        Value::String(s) => s
            .trim()
            .parse()
            .with_context(|| format!("{s:?} is not an integer")),
        other => bail!("{other} is not an integer label"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellaswag_matches_lm_eval() {
        let doc = json!({"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
            "ctx_b": "he", "endings": ["is using wrap to wrap a pair of skis.", "[header] How to x [title] Do y."],
            "label": "3"});
        let out = hellaswag(doc.as_object().unwrap()).unwrap();
        assert_eq!(
            out[0].1,
            json!("Roof shingle removal: A man is sitting on a roof. He")
        );
        // lm-eval strips before removing brackets, so a leading space can remain.
        assert_eq!(
            out[1].1,
            json!(["is using wrap to wrap a pair of skis.", " How to x. Do y."])
        );
        assert_eq!(out[2].1, json!(3));
    }

    #[test]
    fn capitalize_lowercases_the_rest() {
        assert_eq!(py_capitalize("then The man"), "Then the man");
        assert_eq!(py_capitalize(""), "");
    }

    #[test]
    fn winogrande_partial_scoring() {
        let doc = json!({"sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.",
            "option1": "Sarah", "option2": "Maria", "answer": "2"});
        let out = winogrande(doc.as_object().unwrap()).unwrap();
        assert_eq!(
            out[0].1,
            json!([
                "Sarah was a much better surgeon than Maria so Sarah",
                "Sarah was a much better surgeon than Maria so Maria"
            ])
        );
        assert_eq!(out[1].1, json!("always got the easier cases."));
        assert_eq!(out[2].1, json!(1));
    }
}
