//! Published base-model scores: `evals/baselines/*.yaml`, one file per model.
//!
//! ```yaml
//! model: Llama-3-8B                      # row label
//! hf_id: meta-llama/Meta-Llama-3-8B      # optional
//! params: {total_b: 8.0, active_b: 8.0}  # billions; optional `note`
//! source: https://...                    # default source of every number below
//! notes: free text                       # optional
//! scores:
//!   - {task: mmlu, metric: acc, num_fewshot: 5, value: 66.6}   # value in percent, as published
//!   - {task: gsm8k_cot, metric: exact_match, num_fewshot: 4, value: 55.3,
//!      source: https://..., note: evaluated by the Qwen team}
//! ```
//!
//! Every number must have a source (its own or the file's), and every source must be an https
//! URL. Unknown keys are errors, reported with the file, line and key path.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::score::TaskScore;

/// Task names a baseline may use (our naming, as in `evals/tasks/`).
pub const KNOWN_TASKS: &[&str] = &[
    "arc_challenge",
    "arc_easy",
    "boolq",
    "gsm8k_cot",
    "hellaswag",
    "humaneval",
    "lambada",
    "mbpp",
    "minerva_math",
    "mmlu",
    "openbookqa",
    "piqa",
    "sciq",
    "winogrande",
];

/// One published model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Row label in tables.
    pub model: String,
    /// The Hugging Face repository of the checkpoint the numbers are for.
    #[serde(default)]
    pub hf_id: Option<String>,
    /// Parameter counts.
    pub params: Params,
    /// Default source of every score that has none of its own.
    #[serde(default)]
    pub source: Option<String>,
    /// Remarks on the numbers (settings, what could not be found).
    #[serde(default)]
    pub notes: Option<String>,
    /// The published numbers (may be empty when none could be verified).
    pub scores: Vec<BaselineScore>,
    /// The file this was read from (set by the loader).
    #[serde(skip)]
    pub file: PathBuf,
}

/// Parameter counts in billions.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// All parameters.
    pub total_b: f64,
    /// Parameters active per token (equal to `total_b` for a dense model).
    pub active_b: f64,
    /// How the counts were obtained, when not from the source.
    #[serde(default)]
    pub note: Option<String>,
}

/// One published number.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineScore {
    /// The task, by zflow's task name.
    pub task: String,
    /// The metric (`acc`, `acc_norm`, ...).
    pub metric: String,
    /// Few-shot examples the number was measured with.
    pub num_fewshot: u32,
    /// In percent, as published.
    pub value: f64,
    /// Overrides the file's `source` for this number.
    #[serde(default)]
    pub source: Option<String>,
    /// A remark shown beside the number (how it differs from ours).
    #[serde(default)]
    pub note: Option<String>,
}

impl Baseline {
    /// The source of score `i`: its own, else the file's.
    pub fn source_of(&self, i: usize) -> Option<&str> {
        self.scores[i].source.as_deref().or(self.source.as_deref())
    }

    /// The scores as [`TaskScore`]s (values as fractions, each with its source).
    pub fn scores(&self) -> Vec<TaskScore> {
        (0..self.scores.len())
            .map(|i| {
                let s = &self.scores[i];
                TaskScore {
                    model: self.model.clone(),
                    task: s.task.clone(),
                    metric: s.metric.clone(),
                    num_fewshot: s.num_fewshot,
                    value: percent_to_fraction(s.value),
                    stderr: None,
                    source: self.source_of(i).map(str::to_string),
                    version: None,
                    config_hash: None,
                    note: s.note.clone(),
                }
            })
            .collect()
    }

    /// Every distinct source, in order of first use (file source first).
    pub fn sources(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let all = self
            .source
            .as_deref()
            .into_iter()
            .chain(self.scores.iter().filter_map(|s| s.source.as_deref()));
        for s in all {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }
}

/// `72.99` -> the f64 nearest to 0.7299 (dividing by 100 would give 0.7298999999999999).
fn percent_to_fraction(p: f64) -> f64 {
    format!("{p}e-2").parse().unwrap_or(p / 100.0)
}

/// The folder of the baselines shipped with this crate.
pub fn shipped_baselines_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines")
}

/// Reads and checks one baseline file.
pub fn load_baseline(path: &Path) -> Result<Baseline> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut b = parse_baseline(&text, &path.display().to_string())?;
    b.file = path.to_path_buf();
    Ok(b)
}

/// Reads and checks every `*.yaml` in `dir` (sorted by file name); model names must be unique.
pub fn load_baselines(dir: &Path) -> Result<Vec<Baseline>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        }
    }
    files.sort();
    let mut out: Vec<Baseline> = Vec::new();
    for f in files {
        let b = load_baseline(&f)?;
        if let Some(prev) = out.iter().find(|p| p.model == b.model) {
            bail!(
                "{}: model `{}` is already defined in {}",
                f.display(),
                b.model,
                prev.file.display()
            );
        }
        out.push(b);
    }
    Ok(out)
}

/// Parses and checks baseline YAML; `file` names it in errors.
pub fn parse_baseline(text: &str, file: &str) -> Result<Baseline> {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    let mut path = String::new();
    let parsed = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize::<_, Baseline>(de).map_err(|e| {
            path = e.path().to_string();
            e.into_inner()
        })
    });
    let b = match parsed {
        Ok(b) => b,
        Err(e) => {
            let loc = e
                .location()
                .filter(|l| l.line() > 0)
                .map(|l| format!(":{}:{}", l.line(), l.column()))
                .unwrap_or_default();
            let message = e.to_string();
            let message = strip_location(message.lines().next().unwrap_or("invalid baseline file"));
            if path.is_empty() || path == "." {
                bail!("{file}{loc}: {message}");
            }
            bail!("{file}{loc}: `{path}`: {message}");
        }
    };
    validate(&b).map_err(|e| anyhow::anyhow!("{file}: {e:#}"))?;
    Ok(b)
}

fn validate(b: &Baseline) -> Result<()> {
    if b.model.trim().is_empty() {
        bail!("`model`: must not be empty");
    }
    let p = &b.params;
    if !(p.total_b.is_finite() && p.total_b > 0.0) {
        bail!(
            "`params.total_b`: must be a positive number of billions, not {}",
            p.total_b
        );
    }
    if !(p.active_b.is_finite() && p.active_b > 0.0 && p.active_b <= p.total_b) {
        bail!(
            "`params.active_b`: must be positive and at most `total_b`, not {}",
            p.active_b
        );
    }
    if let Some(s) = &b.source {
        check_url(s).context("`source`")?;
    }
    for (i, s) in b.scores.iter().enumerate() {
        let at = format!("scores[{i}]");
        if !KNOWN_TASKS.contains(&s.task.as_str()) {
            bail!(
                "`{at}.task`: unknown task `{}` (known: {})",
                s.task,
                KNOWN_TASKS.join(", ")
            );
        }
        if s.metric.is_empty()
            || !s
                .metric
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_@".contains(c))
        {
            bail!(
                "`{at}.metric`: `{}` is not a metric name (lowercase, digits, `_`, `@`)",
                s.metric
            );
        }
        if !(s.value.is_finite() && (0.0..=100.0).contains(&s.value)) {
            bail!("`{at}.value`: {} is not a percentage in 0..=100", s.value);
        }
        match &s.source {
            Some(src) => check_url(src).with_context(|| format!("`{at}.source`"))?,
            None if b.source.is_none() => {
                bail!("`{at}`: no `source` for this number and no file-level `source`")
            }
            None => {}
        }
        if let Some(j) = b.scores[..i].iter().position(|o| o.task == s.task) {
            bail!(
                "`{at}`: a second score for `{}` (first at `scores[{j}]`); one per task",
                s.task
            );
        }
    }
    Ok(())
}

/// `msg at line 3, column 5` -> `msg` (the location is printed in front instead).
fn strip_location(message: &str) -> &str {
    let message = message.trim();
    if let Some(i) = message.rfind(" at line ") {
        let rest = &message[i + " at line ".len()..];
        if let Some((line, col)) = rest.split_once(", column ")
            && !line.is_empty()
            && line.chars().all(|c| c.is_ascii_digit())
            && !col.is_empty()
            && col.chars().all(|c| c.is_ascii_digit())
        {
            return &message[..i];
        }
    }
    message
}

/// An https URL with a host.
fn check_url(s: &str) -> Result<()> {
    let Some(rest) = s.strip_prefix("https://") else {
        bail!("`{s}` is not an https URL");
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || !host.contains('.') || s.chars().any(char::is_whitespace) {
        bail!("`{s}` is not a valid https URL");
    }
    Ok(())
}
