//! `doc_to_text`, `doc_to_target`, `doc_to_choice` and `description`, evaluated per document.
//!
//! lm-eval's conventions, made strict:
//! - an integer or a list in the YAML is a literal;
//! - a string that is a bare identifier (`label`, `question_stem`) names a column: a missing
//!   column is an error, never silently literal text;
//! - a string that is exactly one `{{ expression }}` is evaluated as an expression, so it can
//!   yield a list or an integer (`"{{[sol1, sol2]}}"`, `"{{choices.label.index(answerKey)}}"`);
//! - anything else is a minijinja template rendered to text.
//!
//! Templates run with strict undefined values (a typo in a column name fails) and keep a
//! trailing newline (as lm-eval's Jinja environment does), with Python's string and list
//! methods (`.strip()`, `.split(' ')`, `.index(x)`) so lm-eval's templates work as written.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};
use minijinja::value::{Serde, Value as JValue, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};

use crate::dataset::Doc;
use crate::task::FieldSpec;

/// A compiled field.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    /// A literal index.
    Index(i64),
    /// A literal list.
    List(Vec<String>),
    /// A column's value.
    Column(String),
    /// A single expression (its source), evaluated to a typed value.
    Expr(String),
    /// A template, by its name in the environment.
    Template(String),
}

/// The templates of one or more tasks, and the environment they run in.
pub struct Templates {
    env: Environment<'static>,
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

/// The names templates may use that are not columns.
const GLOBALS: &[&str] = &[
    "range",
    "dict",
    "namespace",
    "debug",
    "loop",
    "true",
    "false",
    "none",
];

impl Templates {
    /// An environment configured as described in the module docs.
    pub fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .keep_trailing_newline(true)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_unknown_method_callback(python_methods);
        Templates { env }
    }

    /// Compiles `spec`, the field `field` of task file `file`; syntax errors name both.
    pub fn compile(&mut self, file: &str, field: &str, spec: &FieldSpec) -> Result<Field> {
        let ctx = || format!("task file {file}: field `{field}`");
        Ok(match spec {
            FieldSpec::Index(i) => Field::Index(*i),
            FieldSpec::List(l) => Field::List(l.clone()),
            FieldSpec::Text(s) if is_identifier(s) => Field::Column(s.clone()),
            FieldSpec::Text(s) => match single_expression(s) {
                Some(expr) => {
                    self.env
                        .compile_expression(expr)
                        .map_err(|e| anyhow::anyhow!(describe(&e)))
                        .with_context(ctx)?;
                    Field::Expr(expr.to_string())
                }
                None => {
                    let name = format!("{file}:{field}");
                    self.env
                        .add_template_owned(name.clone(), s.clone())
                        .map_err(|e| anyhow::anyhow!(describe(&e)))
                        .with_context(ctx)?;
                    Field::Template(name)
                }
            },
        })
    }

    /// The columns a field reads (top-level names only), sorted.
    pub fn columns(&self, field: &Field) -> Result<BTreeSet<String>> {
        let names = match field {
            Field::Index(_) | Field::List(_) => Default::default(),
            Field::Column(c) => [c.clone()].into_iter().collect(),
            Field::Expr(src) => self
                .env
                .compile_expression(src)?
                .undeclared_variables(false),
            Field::Template(name) => self.env.get_template(name)?.undeclared_variables(false),
        };
        Ok(names
            .into_iter()
            .filter(|n| !GLOBALS.contains(&n.as_str()))
            .collect())
    }

    /// Evaluates a field to a template value.
    pub fn value(&self, field: &Field, doc: &Doc) -> Result<JValue> {
        Ok(match field {
            Field::Index(i) => JValue::from(*i),
            Field::List(l) => JValue::from(l.clone()),
            Field::Column(c) => {
                let v = doc
                    .get(c)
                    .with_context(|| format!("the document has no column `{c}`"))?;
                JValue::from(Serde(v))
            }
            Field::Expr(src) => {
                let expr = self.env.compile_expression(src)?;
                let v = expr
                    .eval(JValue::from(Serde(doc)))
                    .map_err(|e| anyhow::anyhow!(describe(&e)))?;
                if v.is_undefined() {
                    bail!("`{src}` is undefined for this document");
                }
                v
            }
            Field::Template(name) => {
                let t = self.env.get_template(name)?;
                JValue::from(
                    t.render(Serde(doc))
                        .map_err(|e| anyhow::anyhow!(describe(&e)))?,
                )
            }
        })
    }

    /// Evaluates a field to text (numbers are formatted; lists are an error).
    pub fn text(&self, field: &Field, doc: &Doc) -> Result<String> {
        let v = self.value(field, doc)?;
        match v.kind() {
            ValueKind::String => Ok(v.as_str().unwrap_or_default().to_string()),
            ValueKind::Number | ValueKind::Bool => Ok(v.to_string()),
            other => bail!("expected text, got a {other:?}: {v}"),
        }
    }

    /// Evaluates a field to a list of strings (choices).
    pub fn list(&self, field: &Field, doc: &Doc) -> Result<Vec<String>> {
        let v = self.value(field, doc)?;
        if v.kind() != ValueKind::Seq {
            bail!("expected a list, got a {:?}: {v}", v.kind());
        }
        v.try_iter()?
            .map(|item| match item.kind() {
                ValueKind::String => Ok(item.as_str().unwrap_or_default().to_string()),
                ValueKind::Number => Ok(item.to_string()),
                k => bail!("a choice is a {k:?}, not text: {item}"),
            })
            .collect()
    }

    /// Evaluates a gold field to an index into `choices`: an integer, a string of digits, or the
    /// text of one of the choices (lm-eval's three ways).
    pub fn index(&self, field: &Field, doc: &Doc, choices: &[String]) -> Result<usize> {
        let v = self.value(field, doc)?;
        let idx = match v.kind() {
            ValueKind::Number => v
                .as_i64()
                .with_context(|| format!("{v} is not an integer"))?,
            ValueKind::String => {
                let s = v.as_str().unwrap_or_default();
                match s.trim().parse::<i64>() {
                    Ok(i) => i,
                    Err(_) => match choices.iter().position(|c| c == s) {
                        Some(i) => i as i64,
                        None => bail!(
                            "gold {s:?} is neither an index nor one of the choices {choices:?}"
                        ),
                    },
                }
            }
            k => bail!("gold is a {k:?}, expected an index: {v}"),
        };
        if idx < 0 || idx as usize >= choices.len() {
            bail!(
                "gold index {idx} is out of range for {} choices",
                choices.len()
            );
        }
        Ok(idx as usize)
    }
}

fn describe(e: &Error) -> String {
    // minijinja's Display has the kind and the detail; the debug info adds the template
    // source around the error line, which is what a task author needs.
    match e.display_debug_info().to_string() {
        s if s.trim().is_empty() => e.to_string(),
        s => format!("{e}\n{s}"),
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `Some(expr)` when `s` is exactly `{{ expr }}`.
fn single_expression(s: &str) -> Option<&str> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    if inner.contains("{{") || inner.contains("}}") || inner.contains("{%") {
        return None;
    }
    Some(inner.trim())
}

/// Python's `list.index` / `str.index` (which minijinja-contrib's pycompat lacks), then
/// pycompat's `str`/`dict`/`list` methods.
fn python_methods(
    state: &mut State,
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> Result<JValue, Error> {
    if method == "index" && args.len() == 1 {
        match value.kind() {
            ValueKind::Seq => {
                for (i, item) in value.try_iter()?.enumerate() {
                    if item == args[0] {
                        return Ok(JValue::from(i));
                    }
                }
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{} is not in list", args[0]),
                ));
            }
            ValueKind::String => {
                let (hay, needle) = (
                    value.as_str().unwrap_or_default(),
                    args[0].as_str().unwrap_or_default(),
                );
                return match hay.find(needle) {
                    // Python indexes characters, not bytes.
                    Some(b) => Ok(JValue::from(hay[..b].chars().count())),
                    None => Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "substring not found",
                    )),
                };
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: serde_json::Value) -> Doc {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn lm_eval_templates_work_as_written() {
        let mut t = Templates::new();
        let d = doc(
            json!({"goal": "Open a jar", "sol1": "twist", "sol2": "smash", "label": 1,
            "question": "Q?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B",
            "support": "  S.", "text": "the quick brown fox"}),
        );
        let f = t
            .compile(
                "piqa.yaml",
                "doc_to_text",
                &FieldSpec::Text("Question: {{goal}}\nAnswer:".into()),
            )
            .unwrap();
        assert_eq!(t.text(&f, &d).unwrap(), "Question: Open a jar\nAnswer:");
        let f = t
            .compile(
                "piqa.yaml",
                "doc_to_choice",
                &FieldSpec::Text("{{[sol1, sol2]}}".into()),
            )
            .unwrap();
        assert_eq!(t.list(&f, &d).unwrap(), vec!["twist", "smash"]);
        let f = t
            .compile(
                "piqa.yaml",
                "doc_to_target",
                &FieldSpec::Text("label".into()),
            )
            .unwrap();
        assert_eq!(t.index(&f, &d, &["x".into(), "y".into()]).unwrap(), 1);
        let f = t
            .compile(
                "arc.yaml",
                "doc_to_target",
                &FieldSpec::Text("{{choices.label.index(answerKey)}}".into()),
            )
            .unwrap();
        assert_eq!(t.index(&f, &d, &["a".into(), "b".into()]).unwrap(), 1);
        let f = t
            .compile(
                "sciq.yaml",
                "doc_to_text",
                &FieldSpec::Text("{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:".into()),
            )
            .unwrap();
        assert_eq!(t.text(&f, &d).unwrap(), "S.\nQuestion: Q?\nAnswer:");
        let f = t
            .compile(
                "lambada.yaml",
                "doc_to_text",
                &FieldSpec::Text("{{text.split(' ')[:-1]|join(' ')}}".into()),
            )
            .unwrap();
        assert_eq!(t.text(&f, &d).unwrap(), "the quick brown");
        let f = t
            .compile(
                "lambada.yaml",
                "doc_to_target",
                &FieldSpec::Text("{{' '+text.split(' ')[-1]}}".into()),
            )
            .unwrap();
        assert_eq!(t.text(&f, &d).unwrap(), " fox");
    }

    #[test]
    fn trailing_newline_is_kept() {
        let mut t = Templates::new();
        let f = t
            .compile(
                "f",
                "description",
                &FieldSpec::Text("About {{ s }}.\n\n".into()),
            )
            .unwrap();
        assert_eq!(t.text(&f, &doc(json!({"s": "x"}))).unwrap(), "About x.\n\n");
    }

    #[test]
    fn columns_are_found_and_errors_are_named() {
        let mut t = Templates::new();
        let f = t.compile("a.yaml", "doc_to_text", &FieldSpec::Text("{{question.strip()}}\nA. {{choices[0]}}\n{% for x in range(2) %}{{x}}{% endfor %}".into())).unwrap();
        let cols: Vec<String> = t.columns(&f).unwrap().into_iter().collect();
        assert_eq!(cols, vec!["choices", "question"]);
        let err = format!(
            "{:#}",
            t.compile(
                "bad.yaml",
                "doc_to_text",
                &FieldSpec::Text("{{ goal ".into())
            )
            .unwrap_err()
        );
        assert!(
            err.contains("bad.yaml") && err.contains("doc_to_text"),
            "{err}"
        );
        let f = t
            .compile("a.yaml", "x", &FieldSpec::Text("Q: {{gaol}}".into()))
            .unwrap();
        let err = format!("{:#}", t.text(&f, &doc(json!({"goal": 1}))).unwrap_err());
        assert!(err.contains("undefined"), "{err}");
    }
}
