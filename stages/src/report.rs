//! `report`: the evaluation tables and the training plots of a recipe.
//!
//! The `evals:` section adds it (see [`crate::eval`]); a stage of its own looks like:
//! ```yaml
//! - name: report
//!   kind: report
//!   needs: [eval.gemma]
//!   title: Gemma 3 270M, harness validation
//!   tasks: [piqa, arc_easy]            # columns, in this order
//!   evals: [eval.gemma]                # measured rows (their `scores.json`)
//!   train: []                          # train stages whose metrics are plotted
//!   baselines: [Gemma-3-270M-PT]       # published rows (evals/baselines; default: all)
//! ```
//! Output:
//! ```text
//! report.md            the table (value ± stderr, %), the published rows' sources, the plots
//! report.csv/.tex/.json  the same table
//! scores.parquet       every measured and published score behind it
//! plots/loss.*         training loss against tokens seen, one line per phase (PNG + SVG)
//! plots/lr.*           learning rate
//! plots/expert-load.*  share of tokens per route (experts, then the MoD skip route)
//! plots/scores.*       each task's score after each phase
//! ```
//! `zflow report RECIPE` runs what the report needs and prints `report.md`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, Float64Array, RecordBatch, UInt64Array};
use serde::{Deserialize, Serialize};
use zflow_evals::report::{
    ColumnSpec, Table, TableSpec, TaskScore, load_baselines, shipped_baselines_dir,
};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::plot::{LineChart, Series};

/// The `report` stage kind.
pub struct Report;

/// `report` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// The heading of `report.md`.
    #[serde(default = "default_title")]
    pub title: String,
    /// Table columns, in this order: a task or group name, or `{task, metric, num_fewshot}` to
    /// fix the setting a column shows (default: the first measured row's, `acc_norm` first).
    pub tasks: Vec<ColumnEntry>,
    /// `eval` stages whose scores are the measured rows.
    pub evals: Vec<String>,
    /// `train.<phase>` stages whose metrics are plotted, in phase order.
    #[serde(default)]
    pub train: Vec<String>,
    /// `ingest` stages whose counts (documents dropped per rule, decontamination per task) the
    /// report tabulates, then the `dedup` stages whose drops come after theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<String>,
    /// Published models (their `model:` names in `evals/baselines`) shown next to ours;
    /// default: every shipped baseline.
    #[serde(default)]
    pub baselines: Option<Vec<String>>,
}

/// One column of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ColumnEntry {
    /// A task or group; metric and n-shot from the scores.
    Task(String),
    /// A task with the metric and/or n-shot the column shows.
    Setting {
        /// The task or group.
        task: String,
        /// `acc`, `acc_norm`, `exact_match`, ...
        #[serde(default)]
        metric: Option<String>,
        /// Few-shot examples.
        #[serde(default)]
        num_fewshot: Option<u32>,
    },
}

impl ColumnEntry {
    fn task(&self) -> &str {
        match self {
            ColumnEntry::Task(t) | ColumnEntry::Setting { task: t, .. } => t,
        }
    }

    fn spec(&self) -> ColumnSpec {
        let mut spec = ColumnSpec::new(self.task());
        if let ColumnEntry::Setting {
            metric,
            num_fewshot,
            ..
        } = self
        {
            spec.metric = metric.clone();
            spec.num_fewshot = *num_fewshot;
        }
        spec
    }
}

fn default_title() -> String {
    "Evaluation".into()
}

impl Stage for Report {
    type Config = ReportConfig;
    const KIND: &'static str = "report";
    const VERSION: u32 = 1;

    fn validate(&self, c: &ReportConfig, needs: &[String]) -> Result<(), ConfigError> {
        if c.tasks.is_empty() {
            return Err(ConfigError::new(
                "tasks",
                "no tasks: expected the task columns of the table",
            ));
        }
        for stage in c.evals.iter().chain(&c.train).chain(&c.data) {
            if !needs.contains(stage) {
                return Err(ConfigError::new(
                    "needs",
                    format!("the report reads `{stage}` but does not need it"),
                ));
            }
        }
        if let Some(names) = &c.baselines {
            let known = load_baselines(&shipped_baselines_dir())
                .map_err(|e| ConfigError::new("baselines", format!("{e:#}")))?;
            for n in names {
                if !known.iter().any(|b| &b.model == n) {
                    let all: Vec<&str> = known.iter().map(|b| b.model.as_str()).collect();
                    return Err(ConfigError::new(
                        "baselines",
                        format!(
                            "no baseline `{n}` in {}; there are: {}",
                            shipped_baselines_dir().display(),
                            all.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn external_fingerprint(&self, _c: &ReportConfig, _cwd: &Path) -> Result<Option<String>> {
        // The published numbers are data: a corrected baseline file re-renders the report.
        Ok(Some(crate::util::definitions_fingerprint(
            &shipped_baselines_dir(),
            "yaml",
        )?))
    }

    fn run(&self, c: &ReportConfig, ctx: &StageContext) -> Result<()> {
        let out = ctx.out_dir();
        let mut scores: Vec<TaskScore> = Vec::new();
        for stage in &c.evals {
            let path = ctx.input(stage)?.join("scores.json");
            let text =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            scores.extend(
                serde_json::from_slice::<Vec<TaskScore>>(&text)
                    .with_context(|| format!("parsing {}", path.display()))?,
            );
        }
        for b in load_baselines(&shipped_baselines_dir())? {
            if c.baselines
                .as_ref()
                .is_none_or(|names| names.contains(&b.model))
            {
                scores.extend(b.scores());
            }
        }
        // Only the asked-for columns: an `mmlu` column is the group, not its 57 subjects.
        scores.retain(|s| c.tasks.iter().any(|t| t.task() == s.task));
        let spec = TableSpec {
            columns: c.tasks.iter().map(ColumnEntry::spec).collect(),
        };
        let table = Table::from_scores(&scores, &spec)?;
        std::fs::write(out.join("report.csv"), table.to_csv())?;
        std::fs::write(out.join("report.tex"), table.to_latex())?;
        std::fs::write(out.join("report.json"), table.to_json())?;
        crate::eval::write_scores(&out.join("scores.parquet"), &scores)?;

        let mut plots = Vec::new();
        let measured_rows = table.rows.iter().filter(|r| !r.published).count();
        if !c.train.is_empty() || measured_rows > 1 {
            std::fs::create_dir_all(out.join("plots"))?;
        }
        if !c.train.is_empty() {
            let phases = c
                .train
                .iter()
                .map(|t| {
                    Ok((
                        t.strip_prefix("train.").unwrap_or(t).to_string(),
                        read_metrics(&ctx.input(t)?.join("metrics.parquet"))?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            plots.extend(training_plots(&phases, &out.join("plots"))?);
        }
        if measured_rows > 1 {
            plots.push(scores_plot(&table, &out.join("plots/scores"))?);
        }

        let mut md = format!("# {}\n\n", c.title);
        md.push_str(&table.to_markdown());
        let _ = writeln!(
            md,
            "\nValues in percent, ± one standard error. Rows without a source were measured by this recipe (`scores.parquet` holds every number)."
        );
        if !c.data.is_empty() {
            md.push_str(&data_section(&c.data, ctx)?);
        }
        if !plots.is_empty() {
            md.push_str("\n## Plots\n\n");
            for (name, what) in &plots {
                let _ = writeln!(
                    md,
                    "- {what}: ![{name}](plots/{name}.png) ([svg](plots/{name}.svg))"
                );
            }
        }
        std::fs::write(out.join("report.md"), md)?;
        tracing::info!(
            "report: {} rows x {} columns, {} plots",
            table.rows.len(),
            table.columns.len(),
            plots.len()
        );
        Ok(())
    }
}

/// The `## Data` section: per source, documents read, kept and dropped by each rule; and, with
/// decontamination, per eval task the training documents that share an n-gram with its test
/// documents and how many of them were removed. Sums over a sharded source's stages; a `dedup`
/// stage's drops (`crate::dedup`'s stats rows) count under their rule and leave the kept.
fn data_section(stages: &[String], ctx: &StageContext) -> Result<String> {
    use crate::ingest_stats::IngestStats;
    use std::collections::BTreeMap;
    let mut sources: Vec<(String, IngestStats)> = Vec::new();
    let mut tasks: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for stage in stages {
        let path = ctx.input(stage)?.join("stats.json");
        if crate::names::is_dedup(stage) {
            add_dedup_drops(&path, &mut sources)?;
            continue;
        }
        let stats: IngestStats = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("{}: not an ingest stage's stats", path.display()))?;
        // `ingest.<source>` or a shard of it, `ingest.<source>.s<i>`.
        let name = stage.strip_prefix("ingest.").unwrap_or(stage);
        let source = match name.rsplit_once(".s") {
            Some((src, i)) if i.parse::<usize>().is_ok() => src,
            _ => name,
        };
        for (task, overlapping, removed) in &stats.contamination {
            let t = tasks.entry(task.clone()).or_default();
            t.0 += overlapping;
            t.1 += removed;
        }
        match sources.iter_mut().find(|(s, _)| s == source) {
            None => sources.push((source.to_string(), stats)),
            Some((_, sum)) => {
                sum.docs_in += stats.docs_in;
                sum.docs_out += stats.docs_out;
                for (rule, docs, bytes) in stats.dropped {
                    match sum.dropped.iter_mut().find(|r| r.0 == rule) {
                        Some(r) => (r.1, r.2) = (r.1 + docs, r.2 + bytes),
                        None => sum.dropped.push((rule, docs, bytes)),
                    }
                }
            }
        }
    }
    let mut md = String::from(
        "\n## Data\n\n| source | documents read | kept | dropped (by rule) |\n| --- | ---: | ---: | --- |\n",
    );
    for (source, s) in &sources {
        let dropped: Vec<String> = s
            .dropped
            .iter()
            .filter(|r| r.1 > 0)
            .map(|(rule, docs, _)| format!("{rule} {docs}"))
            .collect();
        let _ = writeln!(
            md,
            "| {source} | {} | {} | {} |",
            s.docs_in,
            s.docs_out,
            dropped.join(", ")
        );
    }
    if !tasks.is_empty() {
        md.push_str(
            "\n### Decontamination\n\nTraining documents sharing an n-gram with a task's test documents (before dedup).\n\n| task | overlapping | removed |\n| --- | ---: | ---: |\n",
        );
        for (task, (overlapping, removed)) in &tasks {
            let _ = writeln!(md, "| {task} | {overlapping} | {removed} |");
        }
    }
    Ok(md)
}

/// Adds a `dedup` stage's drops (its `stats.json` rows `dropped:<rule>`) to the sources'
/// tallies: counted under `<rule>`, taken off the kept documents.
fn add_dedup_drops(
    path: &Path,
    sources: &mut [(String, crate::ingest_stats::IngestStats)],
) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Row {
        source: String,
        rule: String,
        documents: u64,
        bytes: u64,
    }
    let rows: Vec<Row> = serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{}: not a dedup stage's stats", path.display()))?;
    for row in rows {
        let Some(rule) = row.rule.strip_prefix("dropped:") else {
            continue;
        };
        let Some((_, sum)) = sources.iter_mut().find(|(s, _)| *s == row.source) else {
            continue;
        };
        sum.docs_out = sum.docs_out.saturating_sub(row.documents);
        match sum.dropped.iter_mut().find(|r| r.0 == rule) {
            Some(r) => (r.1, r.2) = (r.1 + row.documents, r.2 + row.bytes),
            None => sum
                .dropped
                .push((rule.to_string(), row.documents, row.bytes)),
        }
    }
    Ok(())
}

/// One phase's per-step metrics.
#[derive(Debug, Default)]
struct PhaseMetrics {
    step: Vec<u64>,
    tokens: Vec<u64>,
    loss: Vec<f64>,
    lr: Vec<f64>,
    /// Per route, tokens per step.
    load: Vec<Vec<u64>>,
}

fn read_metrics(path: &Path) -> Result<PhaseMetrics> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
    let mut m = PhaseMetrics::default();
    for batch in reader {
        let batch: RecordBatch = batch?;
        let u64s = |name: &str| -> Result<Vec<u64>> {
            let col = batch
                .column_by_name(name)
                .with_context(|| format!("{}: no column `{name}`", path.display()))?;
            Ok(col
                .as_any()
                .downcast_ref::<UInt64Array>()
                .with_context(|| format!("{}: `{name}` is not u64", path.display()))?
                .values()
                .to_vec())
        };
        let f64s = |name: &str| -> Result<Vec<f64>> {
            let col = batch
                .column_by_name(name)
                .with_context(|| format!("{}: no column `{name}`", path.display()))?;
            Ok(col
                .as_any()
                .downcast_ref::<Float64Array>()
                .with_context(|| format!("{}: `{name}` is not f64", path.display()))?
                .values()
                .to_vec())
        };
        m.step.extend(u64s("step")?);
        m.tokens.extend(u64s("tokens")?);
        m.loss.extend(f64s("loss")?);
        m.lr.extend(f64s("lr")?);
        let routes = batch
            .schema()
            .fields()
            .iter()
            .filter(|f| f.name().starts_with("load_"))
            .count();
        m.load.resize(routes, Vec::new());
        for (r, load) in m.load.iter_mut().enumerate() {
            load.extend(u64s(&format!("load_{r}"))?);
        }
    }
    Ok(m)
}

/// Loss, learning rate and expert load against tokens seen over all phases.
fn training_plots(phases: &[(String, PhaseMetrics)], dir: &Path) -> Result<Vec<(String, String)>> {
    let mut offset = 0u64;
    let mut loss = Vec::new();
    let mut lr = Vec::new();
    let routes = phases.iter().map(|(_, m)| m.load.len()).max().unwrap_or(0);
    let mut load: Vec<Vec<(f64, f64)>> = vec![Vec::new(); routes];
    for (phase, m) in phases {
        let x = |i: usize| (offset + m.tokens[i]) as f64 / 1e6;
        loss.push(Series::line(
            phase.clone(),
            (0..m.step.len()).map(|i| (x(i), m.loss[i])).collect(),
        ));
        lr.push(Series::line(
            phase.clone(),
            (0..m.step.len()).map(|i| (x(i), m.lr[i])).collect(),
        ));
        for i in 0..m.step.len() {
            let total: u64 = m.load.iter().map(|l| l[i]).sum();
            for (r, l) in m.load.iter().enumerate() {
                load[r].push((x(i), l[i] as f64 / total.max(1) as f64));
            }
        }
        offset += m.tokens.last().copied().unwrap_or(0);
    }
    let chart = |title: &str, y: &str, series: Vec<Series>| LineChart {
        title: title.into(),
        x_label: "tokens seen (millions)".into(),
        y_label: y.into(),
        series,
        ..Default::default()
    };
    chart("Training loss per phase", "loss (nats/token)", loss).write(&dir.join("loss"))?;
    chart("Learning rate", "learning rate", lr).write(&dir.join("lr"))?;
    let skip = routes.saturating_sub(1);
    let load_series = load
        .into_iter()
        .enumerate()
        .map(|(r, points)| {
            Series::line(
                if r == skip {
                    "skip (MoD)".to_string()
                } else {
                    format!("expert {r}")
                },
                points,
            )
        })
        .collect();
    chart(
        "Expert load: share of tokens per route",
        "share of routed tokens",
        load_series,
    )
    .write(&dir.join("expert-load"))?;
    Ok(vec![
        ("loss".into(), "training loss per phase".into()),
        ("lr".into(), "learning rate".into()),
        ("expert-load".into(), "expert load".into()),
    ])
}

/// Each task's score (the table's metric) after each measured row (phase).
fn scores_plot(table: &Table, stem: &Path) -> Result<(String, String)> {
    let rows: Vec<_> = table.rows.iter().filter(|r| !r.published).collect();
    let mut series = Vec::new();
    for (j, col) in table.columns.iter().enumerate() {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.cells[j].as_ref().map(|c| (i as f64, 100.0 * c.value)))
            .collect();
        if !points.is_empty() {
            series.push(Series::line(
                format!("{} ({})", col.task, col.metric),
                points,
            ));
        }
    }
    if series.is_empty() {
        bail!("no measured scores to plot");
    }
    LineChart {
        title: "Scores after each phase".into(),
        x_label: "checkpoint".into(),
        y_label: "score (%)".into(),
        // `nano/phase1` -> `phase1`: the recipe name is the title's business.
        x_names: rows
            .iter()
            .map(|r| r.model.rsplit('/').next().unwrap_or(&r.model).to_string())
            .collect(),
        series,
        ..Default::default()
    }
    .write(stem)?;
    Ok(("scores".into(), "scores per phase".into()))
}
