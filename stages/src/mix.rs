//! `mix.<phase>`: the phase's training samples, drawn from the tokenized sources by the
//! deterministic block-staged mixture (`zflow_runtime::data::mixture`).
//!
//! Outputs `samples.idx` (memory-mappable: sample -> source, source-local sample),
//! `samples.idx.json` (spec, data digest, report), `report.json` and `report.parquet`
//! (requested vs realised share, epochs, tokens per source).
//!
//! Recipe section:
//! ```yaml
//! phases:
//!   phase1:
//!     tokens: 4000000            # budget
//!     seq_len: 256
//!     mixture: {bible: 0.6, python: 0.2, fortunes: 0.2}
//!     curriculum:                # optional: new weights from a fraction of the phase on
//!       - {at: 0.5, mixture: {bible: 0.4, python: 0.4, fortunes: 0.2}}
//!     max_epochs: {fortunes: 4}  # optional upsampling cap per source
//!     seed: 1
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::names;
use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec, Section, Stage, StageContext};
use zflow_runtime::data::TokenSource;
use zflow_runtime::data::megatron::IndexedDataset;
use zflow_runtime::data::mixture::{self, MixSpec, MixStage};

/// The `mix` stage kind.
pub struct Mix;

/// `mix` settings (what a `phases:` entry's data keys expand to).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixConfig {
    /// Phase name (for cursors and reports).
    pub phase: String,
    /// The mixture spec.
    pub spec: MixSpec,
}

impl Stage for Mix {
    type Config = MixConfig;
    const KIND: &'static str = "mix";
    const VERSION: u32 = 1;

    fn validate(&self, c: &MixConfig, needs: &[String]) -> Result<(), ConfigError> {
        for s in &c.spec.sources {
            if !needs.iter().any(|n| n == &names::tokenize(s)) {
                return Err(ConfigError::new(
                    "needs",
                    format!("the mixture reads `{s}` but the stage does not need `tokenize.{s}`"),
                ));
            }
        }
        Ok(())
    }

    fn run(&self, c: &MixConfig, ctx: &StageContext) -> Result<()> {
        let mut sources: Vec<Arc<dyn TokenSource>> = Vec::new();
        for name in &c.spec.sources {
            let dir = ctx.input(&names::tokenize(name))?;
            let ds = IndexedDataset::open(&dir.join("tokens"))
                .with_context(|| format!("opening the tokens of `{name}`"))?;
            sources.push(Arc::new(ds));
        }
        let refs: Vec<&dyn TokenSource> = sources.iter().map(|s| s.as_ref()).collect();
        let plan = mixture::plan(&c.spec, &refs).with_context(|| format!("phase `{}`", c.phase))?;
        ctx.progress()
            .set_message(format!("{} samples", c.spec.num_samples()));
        let report = plan.write(&ctx.out_dir().join("samples.idx"))?;
        std::fs::write(
            ctx.out_dir().join("report.json"),
            serde_json::to_vec_pretty(&report)?,
        )?;
        write_report_parquet(ctx, &c.phase, &report)?;
        for s in &report.sources {
            tracing::info!(
                "{} {}: requested {:.2}% realised {:.2}%, {} samples, {:.2} epochs",
                c.phase,
                s.name,
                100.0 * s.requested_share,
                100.0 * s.realised_share,
                s.samples,
                s.epochs
            );
        }
        Ok(())
    }
}

fn write_report_parquet(ctx: &StageContext, phase: &str, r: &mixture::MixReport) -> Result<()> {
    let fields = vec![
        Field::new("phase", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("requested_share", DataType::Float64, false),
        Field::new("realised_share", DataType::Float64, false),
        Field::new("samples", DataType::UInt64, false),
        Field::new("tokens", DataType::UInt64, false),
        Field::new("epochs", DataType::Float64, false),
    ];
    let n = r.sources.len();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![phase; n])),
        Arc::new(StringArray::from_iter_values(
            r.sources.iter().map(|s| s.name.as_str()),
        )),
        Arc::new(Float64Array::from_iter_values(
            r.sources.iter().map(|s| s.requested_share),
        )),
        Arc::new(Float64Array::from_iter_values(
            r.sources.iter().map(|s| s.realised_share),
        )),
        Arc::new(UInt64Array::from_iter_values(
            r.sources.iter().map(|s| s.samples),
        )),
        Arc::new(UInt64Array::from_iter_values(
            r.sources.iter().map(|s| s.tokens),
        )),
        Arc::new(Float64Array::from_iter_values(
            r.sources.iter().map(|s| s.epochs),
        )),
    ];
    crate::util::write_parquet(&ctx.out_dir().join("report.parquet"), fields, cols)
}

/// One `phases:` entry's data settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseData {
    tokens: u64,
    seq_len: usize,
    mixture: BTreeMap<String, f64>,
    #[serde(default)]
    curriculum: Vec<CurriculumStep>,
    #[serde(default)]
    max_epochs: BTreeMap<String, f64>,
    #[serde(default = "default_seed")]
    seed: u64,
    #[serde(default = "default_block")]
    block_size: usize,
    /// This phase's training settings (read by `train.<phase>`).
    #[serde(default)]
    train: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CurriculumStep {
    at: f64,
    mixture: BTreeMap<String, f64>,
}

fn default_seed() -> u64 {
    1234
}
fn default_block() -> usize {
    512
}

/// The values of a phase that no run could use, named by their recipe path at load: zero
/// sizes, negative or non-finite weights, an all-zero mixture, curriculum points outside
/// (0, 1) or out of order.
fn check_ranges(data: &PhaseData, path: &str) -> Result<(), ConfigError> {
    let positive = |value: u64, field: &str, what: &str| {
        if value == 0 {
            return Err(ConfigError::new(
                format!("{path}.{field}"),
                format!("`{field}` must be > 0 ({what}), got 0"),
            ));
        }
        Ok(())
    };
    positive(data.tokens, "tokens", "the tokens the phase trains on")?;
    positive(data.seq_len as u64, "seq_len", "tokens per sequence")?;
    positive(
        data.block_size as u64,
        "block_size",
        "samples per mixture block",
    )?;
    let weights = |m: &BTreeMap<String, f64>, at: &str| -> Result<(), ConfigError> {
        for (name, &w) in m {
            if !(w.is_finite() && w >= 0.0) {
                return Err(ConfigError::new(
                    format!("{at}.{name}"),
                    format!("a mixture weight must be a finite number >= 0, got {w}"),
                ));
            }
        }
        if m.values().sum::<f64>() <= 0.0 {
            return Err(ConfigError::new(
                at,
                "every weight of the mixture is zero; at least one source needs a positive weight",
            ));
        }
        Ok(())
    };
    weights(&data.mixture, &format!("{path}.mixture"))?;
    let mut previous = 0.0;
    for (i, step) in data.curriculum.iter().enumerate() {
        let at = format!("{path}.curriculum[{i}]");
        if !(step.at > previous && step.at < 1.0) {
            let after = if i == 0 {
                "0".to_string()
            } else {
                format!("the previous point, {previous}")
            };
            return Err(ConfigError::new(
                format!("{at}.at"),
                format!(
                    "a curriculum point `at` is a fraction of the phase: after {after} and below 1, got {}",
                    step.at
                ),
            ));
        }
        previous = step.at;
        weights(&step.mixture, &format!("{at}.mixture"))?;
    }
    for (name, &cap) in &data.max_epochs {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(ConfigError::new(
                format!("{path}.max_epochs.{name}"),
                format!("`max_epochs` must be a finite number > 0, got {cap}"),
            ));
        }
    }
    Ok(())
}

/// The `phases:` section: `mix.<phase>` per phase, and with a `model:` section
/// `train.<phase>` too, each phase starting from the previous one's final checkpoint.
pub struct Phases;

impl Section for Phases {
    fn key(&self) -> &'static str {
        "phases"
    }

    fn expand(&self, value: &Value, recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        let Some(phases) = value.as_object() else {
            return Err(ConfigError::new(
                "phases",
                "`phases` must map phase names to their settings",
            ));
        };
        let sources: Vec<String> = recipe
            .get("sources")
            .and_then(Value::as_object)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        let mut nodes = Vec::new();
        let model = recipe
            .get("model")
            .map(|_| crate::model::ModelSection::config(recipe))
            .transpose()?;
        let mut previous: Option<String> = None;
        for (phase, entry) in phases {
            let path = format!("phases.{phase}");
            let data: PhaseData = parse_config(entry.clone(), &path)?;
            let check = |m: &BTreeMap<String, f64>, at: &str| -> Result<(), ConfigError> {
                for name in m.keys() {
                    if !sources.contains(name) {
                        return Err(ConfigError::new(
                            format!("{at}.{name}"),
                            format!(
                                "`{name}` is not a source of this recipe (sources: {})",
                                sources.join(", ")
                            ),
                        ));
                    }
                }
                Ok(())
            };
            check(&data.mixture, &format!("{path}.mixture"))?;
            for (i, step) in data.curriculum.iter().enumerate() {
                check(&step.mixture, &format!("{path}.curriculum[{i}].mixture"))?;
            }
            check(&data.max_epochs, &format!("{path}.max_epochs"))?;
            check_ranges(&data, &path)?;
            // Every source named anywhere in the phase, in recipe order.
            let used: Vec<String> = sources
                .iter()
                .filter(|s| {
                    data.mixture.contains_key(*s)
                        || data.curriculum.iter().any(|c| c.mixture.contains_key(*s))
                })
                .cloned()
                .collect();
            let weights = |m: &BTreeMap<String, f64>| {
                used.iter()
                    .map(|s| m.get(s).copied().unwrap_or(0.0))
                    .collect::<Vec<_>>()
            };
            let mut schedule = vec![MixStage {
                start: 0.0,
                weights: weights(&data.mixture),
            }];
            schedule.extend(data.curriculum.iter().map(|c| MixStage {
                start: c.at,
                weights: weights(&c.mixture),
            }));
            let spec = MixSpec {
                seq_len: data.seq_len,
                seed: data.seed,
                block_size: data.block_size,
                budget_tokens: data.tokens,
                sources: used.clone(),
                schedule,
                max_epochs: used
                    .iter()
                    .map(|s| data.max_epochs.get(s).copied())
                    .collect(),
            };
            nodes.push(NodeSpec {
                name: names::mix(phase),
                kind: "mix".into(),
                config: json!({"phase": phase, "spec": spec}),
                needs: used.iter().map(|s| names::tokenize(s)).collect(),
                resources: None,
                path: path.clone(),
            });
            if let Some(model) = &model {
                let (train, launch) =
                    crate::train::TrainSection::settings(recipe, phase, data.train.as_ref())?;
                let name = names::train(phase);
                let mut needs = vec![names::mix(phase)];
                needs.extend(used.iter().map(|s| names::tokenize(s)));
                needs.extend(previous.clone());
                nodes.push(NodeSpec {
                    name: name.clone(),
                    kind: "train".into(),
                    config: json!({"phase": phase, "model": model, "train": train, "sources": used, "previous": previous, "launch": launch}),
                    needs,
                    resources: None,
                    path: format!("{path}.train"),
                });
                previous = Some(name);
            }
        }
        Ok(nodes)
    }
}
