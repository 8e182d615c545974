//! Evaluation tables and published baselines.
//!
//! - [`TaskScore`]: one number (model, task, metric, n-shot, value as a fraction, optional
//!   standard error and source). Everything else is built from a flat list of these, so the
//!   tables do not depend on how the scores were produced (our harness, a results file, or the
//!   published numbers in `evals/baselines/*.yaml`).
//! - [`Baseline`]: one published base model (`evals/baselines/<model>.yaml`): name, parameter
//!   counts, and per task the published value with the URL it was read from.
//! - [`Table`]: rows = models, columns = tasks; built by [`Table::from_scores`] and rendered by
//!   [`Table::to_markdown`], [`Table::to_csv`], [`Table::to_latex`] and [`Table::to_json`].
//!
//! ```no_run
//! use zflow_evals::report::{Table, TableSpec, TaskScore, load_baselines, shipped_baselines_dir};
//! let mut scores = vec![TaskScore::new("nano/phase1", "hellaswag", "acc_norm", 0, 0.301).with_stderr(0.0046)];
//! for b in load_baselines(&shipped_baselines_dir()).unwrap() { scores.extend(b.scores()); }
//! let table = Table::from_scores(&scores, &TableSpec::tasks(&["hellaswag", "arc_easy", "mmlu"])).unwrap();
//! println!("{}", table.to_markdown());
//! ```

mod baseline;
mod render;
mod score;
mod table;

#[cfg(test)]
mod tests;

pub use baseline::{
    Baseline, BaselineScore, KNOWN_TASKS, Params, load_baseline, load_baselines, parse_baseline,
    shipped_baselines_dir,
};
pub use render::latex_escape;
pub use score::{TaskScore, natural_cmp};
pub use table::{Cell, Column, ColumnSpec, Row, Table, TableSpec};
