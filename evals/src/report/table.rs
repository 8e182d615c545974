//! The table model: rows = models, columns = tasks, cells = value (± stderr).

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use super::score::{TaskScore, natural_cmp};

/// Which columns to show, in which order, and (optionally) which metric / n-shot each shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableSpec {
    /// The columns, left to right.
    pub columns: Vec<ColumnSpec>,
}

impl TableSpec {
    /// Columns for these tasks, in this order, with metric and n-shot taken from the scores.
    pub fn tasks(tasks: &[&str]) -> TableSpec {
        TableSpec {
            columns: tasks.iter().map(|t| ColumnSpec::new(*t)).collect(),
        }
    }
}

/// One wanted column.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    /// The task the column shows.
    pub task: String,
    /// The metric the column shows; `None`: that of the first row that has the task.
    pub metric: Option<String>,
    /// The n-shot the column shows; `None`: that of the first row that has the task.
    pub num_fewshot: Option<u32>,
}

impl ColumnSpec {
    /// A column for `task`, metric and n-shot taken from the scores.
    pub fn new(task: impl Into<String>) -> ColumnSpec {
        ColumnSpec {
            task: task.into(),
            metric: None,
            num_fewshot: None,
        }
    }

    /// The column with this metric.
    pub fn metric(mut self, metric: impl Into<String>) -> ColumnSpec {
        self.metric = Some(metric.into());
        self
    }

    /// The column with this n-shot.
    pub fn fewshot(mut self, n: u32) -> ColumnSpec {
        self.num_fewshot = Some(n);
        self
    }
}

/// A column as shown: the task and the setting in its header.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The task.
    pub task: String,
    /// The metric in its header.
    pub metric: String,
    /// The n-shot in its header.
    pub num_fewshot: u32,
}

/// One cell: the chosen score of a row on a column's task.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The metric of the score shown.
    pub metric: String,
    /// Its n-shot.
    pub num_fewshot: u32,
    /// Fraction.
    pub value: f64,
    /// Fraction.
    pub stderr: Option<f64>,
    /// Where a published score comes from.
    pub source: Option<String>,
    /// The task version it was measured on.
    pub version: Option<String>,
    /// The hash of the task configuration it was measured on.
    pub config_hash: Option<String>,
    /// A remark shown beside it.
    pub note: Option<String>,
}

impl Cell {
    /// True when the cell was measured with another metric or n-shot than its column shows.
    pub fn differs_from(&self, column: &Column) -> bool {
        self.metric != column.metric || self.num_fewshot != column.num_fewshot
    }
}

/// One model.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The model's name.
    pub model: String,
    /// True for a published (baseline) row: one whose scores carry sources.
    pub published: bool,
    /// One per column.
    pub cells: Vec<Option<Cell>>,
    /// Distinct sources of the row's scores (all of them, shown or not), in order of first use.
    pub sources: Vec<String>,
}

/// Rows = models, columns = tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The columns, left to right.
    pub columns: Vec<Column>,
    /// Measured rows first, then published rows; each group in natural order of model name.
    pub rows: Vec<Row>,
}

/// Metrics preferred when a row has several for one task and the column does not say.
const METRIC_PREFERENCE: &[&str] = &["acc_norm", "acc", "exact_match"];

fn metric_rank(m: &str) -> usize {
    METRIC_PREFERENCE
        .iter()
        .position(|p| *p == m)
        .unwrap_or(METRIC_PREFERENCE.len())
}

impl Table {
    /// Builds the table from any list of scores.
    ///
    /// Columns: the tasks that occur in `scores`, in the order of `spec` (tasks not in `spec`
    /// follow, in name order; tasks in `spec` that no score has are left out). A column's
    /// metric and n-shot are the spec's, else those of the first row (in row order) that has
    /// the task. Per cell, a score with the column's metric and n-shot wins; else, among the
    /// row's scores for the task, the preferred metric (`acc_norm`, `acc`, `exact_match`, then
    /// by name), then the smallest n-shot. Such a cell is marked as measured differently.
    ///
    /// Errors on two scores with the same model, task, metric and n-shot, and on values that
    /// are not finite.
    pub fn from_scores(scores: &[TaskScore], spec: &TableSpec) -> Result<Table> {
        // Group by model, check duplicates and values.
        let mut by_model: BTreeMap<&str, Vec<&TaskScore>> = BTreeMap::new();
        for s in scores {
            if !s.value.is_finite() || s.stderr.is_some_and(|e| !e.is_finite() || e < 0.0) {
                bail!(
                    "score of `{}` on `{}` ({}): value {} / stderr {:?} is not a finite number",
                    s.model,
                    s.task,
                    s.metric,
                    s.value,
                    s.stderr
                );
            }
            let list = by_model.entry(s.model.as_str()).or_default();
            if list
                .iter()
                .any(|o| o.task == s.task && o.metric == s.metric && o.num_fewshot == s.num_fewshot)
            {
                bail!(
                    "two scores of `{}` on `{}` with metric `{}` and {}-shot",
                    s.model,
                    s.task,
                    s.metric,
                    s.num_fewshot
                );
            }
            list.push(s);
        }

        // Row order: measured, then published; natural order within each.
        let mut models: Vec<(&str, bool)> = by_model
            .iter()
            .map(|(m, list)| (*m, list.iter().any(|s| s.source.is_some())))
            .collect();
        models.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| natural_cmp(a.0, b.0)));

        // Column order.
        let mut tasks: Vec<&str> = Vec::new();
        for c in &spec.columns {
            if !tasks.contains(&c.task.as_str()) && scores.iter().any(|s| s.task == c.task) {
                tasks.push(&c.task);
            }
        }
        let mut rest: Vec<&str> = scores
            .iter()
            .map(|s| s.task.as_str())
            .filter(|t| !tasks.contains(t))
            .collect();
        rest.sort_by(|a, b| natural_cmp(a, b));
        rest.dedup();
        tasks.extend(rest);

        // Column settings.
        let mut columns = Vec::new();
        for task in &tasks {
            let wanted = spec.columns.iter().find(|c| c.task == *task);
            let wanted_metric = wanted.and_then(|c| c.metric.clone());
            let wanted_shot = wanted.and_then(|c| c.num_fewshot);
            let first = models
                .iter()
                .find_map(|(m, _)| pick(&by_model[m], task, wanted_metric.as_deref(), wanted_shot));
            let first = first.expect("a listed task has at least one score");
            columns.push(Column {
                task: task.to_string(),
                metric: wanted_metric.unwrap_or_else(|| first.metric.clone()),
                num_fewshot: wanted_shot.unwrap_or(first.num_fewshot),
            });
        }

        let rows = models
            .iter()
            .map(|(model, published)| {
                let list = &by_model[model];
                let cells = columns
                    .iter()
                    .map(|c| {
                        pick(list, &c.task, Some(&c.metric), Some(c.num_fewshot)).map(|s| Cell {
                            metric: s.metric.clone(),
                            num_fewshot: s.num_fewshot,
                            value: s.value,
                            stderr: s.stderr,
                            source: s.source.clone(),
                            version: s.version.clone(),
                            config_hash: s.config_hash.clone(),
                            note: s.note.clone(),
                        })
                    })
                    .collect();
                let mut sources: Vec<String> = Vec::new();
                for s in list.iter().filter_map(|s| s.source.as_ref()) {
                    if !sources.contains(s) {
                        sources.push(s.clone());
                    }
                }
                Row {
                    model: model.to_string(),
                    published: *published,
                    cells,
                    sources,
                }
            })
            .collect();
        Ok(Table { columns, rows })
    }

    /// Footnote number (1-based) of each published row, by row index.
    pub(crate) fn footnotes(&self) -> Vec<Option<usize>> {
        let mut n = 0;
        self.rows
            .iter()
            .map(|r| {
                (r.published && !r.sources.is_empty()).then(|| {
                    n += 1;
                    n
                })
            })
            .collect()
    }

    /// True when some cell was measured with another setting than its column shows.
    pub fn has_differing_cells(&self) -> bool {
        self.rows.iter().any(|r| {
            r.cells
                .iter()
                .zip(&self.columns)
                .any(|(c, col)| c.as_ref().is_some_and(|c| c.differs_from(col)))
        })
    }
}

/// The score of `list` on `task` that best matches the metric and n-shot.
fn pick<'a>(
    list: &[&'a TaskScore],
    task: &str,
    metric: Option<&str>,
    shot: Option<u32>,
) -> Option<&'a TaskScore> {
    list.iter()
        .copied()
        .filter(|s| s.task == task)
        .min_by(|a, b| {
            let key = |s: &TaskScore| {
                (
                    metric.is_some_and(|m| m != s.metric),
                    shot.is_some_and(|n| n != s.num_fewshot),
                    metric_rank(&s.metric),
                )
            };
            key(a)
                .cmp(&key(b))
                .then_with(|| a.metric.cmp(&b.metric))
                .then_with(|| a.num_fewshot.cmp(&b.num_fewshot))
        })
}
