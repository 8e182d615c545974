//! The results document (in the spirit of lm-eval's `results.json`) and its text table.
//!
//! Everything in it is a function of the inputs (task files, data, model, options): no times,
//! no host names, no absolute paths. So the same inputs give byte-identical JSON; timings are
//! reported next to it ([`crate::evaluate::EvalReport`]).

use serde::Serialize;

use crate::metrics::{DocScores, MetricValue};

/// The model evaluated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The adapter's identity string ([`crate::LanguageModel::identity`]).
    pub identity: String,
    /// blake3 of the identity.
    pub hash: String,
}

/// One task's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskResult {
    /// Task name.
    pub task: String,
    /// Task version.
    pub version: String,
    /// Few-shot examples per document.
    pub n_shot: usize,
    /// Documents scored.
    pub n_samples: usize,
    /// Documents in the split.
    pub n_total: usize,
    /// blake3 of the resolved task config.
    pub config_hash: String,
    /// The dataset file, relative to the data root.
    pub dataset: String,
    /// Aggregates with standard errors.
    pub metrics: Vec<MetricValue>,
    /// Per-document scores (only when asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<Vec<DocScores>>,
}

/// One group's aggregate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupResult {
    /// Group name.
    pub group: String,
    /// Its direct members.
    pub members: Vec<String>,
    /// Documents over all member tasks.
    pub n_samples: usize,
    /// Whether members were weighted by size.
    pub weight_by_size: bool,
    /// Aggregates with standard errors.
    pub metrics: Vec<MetricValue>,
}

/// A whole evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalResults {
    /// The model.
    pub model: ModelInfo,
    /// `--limit`, if any.
    pub limit: Option<usize>,
    /// `--max-gen-toks`, if any: every generation's cap in place of its task's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gen_toks: Option<usize>,
    /// Tasks, in the order they were asked for (groups expanded depth first).
    pub tasks: Vec<TaskResult>,
    /// Groups, innermost first.
    pub groups: Vec<GroupResult>,
}

impl EvalResults {
    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("results serialise");
        s.push('\n');
        s
    }

    /// A markdown table like lm-eval's.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| Task | Version | Filter | n-shot | n | Metric | Value | Stderr |\n|---|---:|---|---:|---:|---|---:|---:|\n",
        );
        let fmt = |v: f64| {
            if v.abs() < 10.0 {
                format!("{v:.4}")
            } else {
                format!("{v:.2}")
            }
        };
        let row =
            |out: &mut String, name: &str, version: &str, shot: &str, n: usize, m: &MetricValue| {
                let (metric, filter) = m
                    .metric
                    .split_once(',')
                    .unwrap_or((m.metric.as_str(), "none"));
                let se = m.stderr.map_or("N/A".to_string(), fmt);
                out.push_str(&format!(
                    "| {name} | {version} | {filter} | {shot} | {n} | {metric} | {} | {se} |\n",
                    fmt(m.value)
                ));
            };
        for t in &self.tasks {
            for m in &t.metrics {
                row(
                    &mut out,
                    &t.task,
                    &t.version,
                    &t.n_shot.to_string(),
                    t.n_samples,
                    m,
                );
            }
        }
        for g in &self.groups {
            for m in &g.metrics {
                row(&mut out, &g.group, "", "", g.n_samples, m);
            }
        }
        out
    }
}
