//! `mix.<phase>`: the phase's training samples, drawn from the tokenized sources by the
//! deterministic block-staged mixture (`zflow_runtime::data::mixture`).
//!
//! Outputs `samples.idx` (memory-mappable: sample -> source, source-local sample),
//! `samples.plan/` (the read plan: where every sample's tokens are,
//! `zflow_runtime::data::mixture::read_plan`), `samples.idx.json` (spec, data digest, report,
//! the plan's files), `report.json` (the mixture's report, and
//! under `batches` how many documents the phase's global batches mix, [`BatchReport`]) and
//! `report.parquet` (requested vs realised share, epochs, tokens per source).
//!
//! The `phases:` section (`crate::phases`) makes one per phase.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::names;
use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::data::TokenSource;
use zflow_runtime::data::concat::Concat;
use zflow_runtime::data::megatron::IndexedDataset;
use zflow_runtime::data::mixture::{self, BatchReport, MixSpec, MixtureReader};

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
    /// The sharded sources among the spec's, with their shard counts: each is read as its
    /// shards' tokens in shard order ([`names::token_stages`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<String, usize>,
    /// The phase's `global_batch` (samples per optimizer step), for the batch measure.
    pub global_batch: u64,
}

/// `report.json`: the mixture's report with the batch measure beside it.
#[derive(Serialize)]
struct StageReport<'a> {
    #[serde(flatten)]
    mixture: &'a mixture::MixReport,
    batches: BatchReport,
}

impl Stage for Mix {
    type Config = MixConfig;
    const KIND: &'static str = "mix";
    // 2: each epoch's windows are read in a keyed order (mixture index version 2).
    // 3: writes the read plan (`samples.plan/`) the readers map instead of recomputing it.
    const VERSION: u32 = 3;

    fn validate(&self, c: &MixConfig, needs: &[String]) -> Result<(), ConfigError> {
        for s in &c.spec.sources {
            for stage in names::token_stages(s, c.shards.get(s).copied()) {
                if !needs.contains(&stage) {
                    return Err(ConfigError::new(
                        "needs",
                        format!("the mixture reads `{s}` but the stage does not need `{stage}`"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn run(&self, c: &MixConfig, ctx: &StageContext) -> Result<()> {
        let mut sources: Vec<Arc<dyn TokenSource>> = Vec::new();
        for name in &c.spec.sources {
            let mut parts = Vec::new();
            for stage in names::token_stages(name, c.shards.get(name).copied()) {
                let dir = ctx.input(&stage)?;
                parts.push(
                    IndexedDataset::open(&crate::megatron_source::tokens_prefix(dir)?)
                        .with_context(|| format!("opening the tokens of `{stage}`"))?,
                );
            }
            sources.push(Arc::new(Concat::new(parts)));
        }
        let refs: Vec<&dyn TokenSource> = sources.iter().map(|s| s.as_ref()).collect();
        let plan = mixture::plan(&c.spec, &refs).with_context(|| format!("phase `{}`", c.phase))?;
        ctx.progress()
            .set_message(format!("{} samples", c.spec.num_samples()));
        let index = ctx.out_dir().join("samples.idx");
        let report = plan.write(&index, &refs)?;
        ctx.progress().set_message("measuring the global batches");
        let batches = mixture::batches::measure(
            &MixtureReader::open(&index, sources.clone())?,
            c.global_batch,
        )?;
        tracing::info!(
            "{}: global batches of {} mix {:.1} documents on average; one document fills at \
             most {:.0}% of one ({} of {} batches measured)",
            c.phase,
            batches.global_batch,
            batches.mean_distinct_docs,
            100.0 * batches.max_doc_share,
            batches.measured_batches,
            batches.batches
        );
        let stage_report = StageReport {
            mixture: &report,
            batches,
        };
        std::fs::write(
            ctx.out_dir().join("report.json"),
            serde_json::to_vec_pretty(&stage_report)?,
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
