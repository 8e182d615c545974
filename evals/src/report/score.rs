//! One reported number, whatever produced it.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// One score of one model on one task, as it goes into a [`crate::report::Table`].
///
/// `value` and `stderr` are fractions (0.301 = 30.1%); tables show them in percent.
/// A score with a `source` is a published number (a baseline): its row is listed after the
/// measured rows and its sources are listed under the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskScore {
    /// Row label: a zflow checkpoint (`nano/phase1`) or a published model (`Llama-3-8B`).
    pub model: String,
    /// Task name in our naming (`hellaswag`, `arc_easy`, `mmlu`, ...).
    pub task: String,
    /// Metric name (`acc`, `acc_norm`, `exact_match`, ...).
    pub metric: String,
    /// Few-shot examples per document.
    pub num_fewshot: u32,
    /// The value, as a fraction.
    pub value: f64,
    /// Standard error of `value`, as a fraction (published numbers have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<f64>,
    /// Where a published number was read (an https URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Task version (as in lm-eval's `versions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Hash of the resolved task configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// A remark on how the number was obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl TaskScore {
    /// A score with no stderr, source, version, hash or note.
    pub fn new(
        model: impl Into<String>,
        task: impl Into<String>,
        metric: impl Into<String>,
        num_fewshot: u32,
        value: f64,
    ) -> TaskScore {
        TaskScore {
            model: model.into(),
            task: task.into(),
            metric: metric.into(),
            num_fewshot,
            value,
            stderr: None,
            source: None,
            version: None,
            config_hash: None,
            note: None,
        }
    }

    /// The score with its standard error.
    pub fn with_stderr(mut self, stderr: f64) -> TaskScore {
        self.stderr = Some(stderr);
        self
    }

    /// The score with where it was published.
    pub fn with_source(mut self, source: impl Into<String>) -> TaskScore {
        self.source = Some(source.into());
        self
    }

    /// The score with the task version it was measured on.
    pub fn with_version(mut self, version: impl Into<String>) -> TaskScore {
        self.version = Some(version.into());
        self
    }

    /// The score with the hash of the task configuration it was measured on.
    pub fn with_config_hash(mut self, hash: impl Into<String>) -> TaskScore {
        self.config_hash = Some(hash.into());
        self
    }
}

/// Orders strings with digit runs compared as numbers, so `phase2` < `phase10`; ties (such as
/// `a01` and `a1`) fall back to plain byte order, so the order is total and stable.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < ab.len() && j < bb.len() {
        if ab[i].is_ascii_digit() && bb[j].is_ascii_digit() {
            let si = i;
            while i < ab.len() && ab[i].is_ascii_digit() {
                i += 1;
            }
            let sj = j;
            while j < bb.len() && bb[j].is_ascii_digit() {
                j += 1;
            }
            let x = a[si..i].trim_start_matches('0');
            let y = b[sj..j].trim_start_matches('0');
            let ord = x.len().cmp(&y.len()).then_with(|| x.cmp(y));
            if ord != Ordering::Equal {
                return ord;
            }
        } else {
            let ord = ab[i].cmp(&bb[j]);
            if ord != Ordering::Equal {
                return ord;
            }
            i += 1;
            j += 1;
        }
    }
    (ab.len() - i).cmp(&(bb.len() - j)).then_with(|| a.cmp(b))
}
