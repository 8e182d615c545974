//! The train job: everything a worker needs to train one phase, as the supervisor writes it
//! (`job.json` in the train stage's folder). Versioned: a worker refuses a version it does not
//! know ([`TrainJob::read`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::settings::{ActivationCheckpointing, TrainSettings};
use crate::data::concat::Concat;
use crate::data::megatron::IndexedDataset;
use crate::model::config::ModelConfig;

/// The version of the train job document this code writes and reads. 2: a source's tokens and
/// held-out tokens are lists of datasets (a sharded source's shards). 3: `model` is the phase's
/// model, resolved ([`TrainJob::phase_model`]); workers derive nothing from `train`. 4:
/// `activation_checkpointing`, and `train.loss_chunk_tokens`. 5: `context_parallel`.
pub const JOB_VERSION: u32 = 5;

fn version_one() -> u32 {
    1
}

/// One token source as the worker sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SourcePaths {
    /// Source name.
    pub name: String,
    /// Megatron dataset prefixes of its training tokens, read as one dataset in this order
    /// (one prefix, or a sharded source's shards).
    pub tokens: Vec<PathBuf>,
    /// Prefixes of its held-out tokens, read the same way (none: no held-out loss).
    pub heldout: Vec<PathBuf>,
}

impl SourcePaths {
    /// Its training tokens, as one dataset.
    pub fn open_tokens(&self) -> Result<Concat<IndexedDataset>> {
        open_all(&self.tokens)
            .with_context(|| format!("opening the tokens of source `{}`", self.name))
    }

    /// Its held-out tokens, as one dataset (no documents when it has none).
    pub fn open_heldout(&self) -> Result<Concat<IndexedDataset>> {
        open_all(&self.heldout)
            .with_context(|| format!("opening the held-out tokens of source `{}`", self.name))
    }
}

fn open_all(prefixes: &[PathBuf]) -> Result<Concat<IndexedDataset>> {
    let parts = prefixes
        .iter()
        .map(|p| IndexedDataset::open(p))
        .collect::<Result<_>>()?;
    Ok(Concat::new(parts))
}

/// Everything a worker needs to train one phase; written by the train stage as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainJob {
    /// The schema version ([`JOB_VERSION`]); absent in jobs written before it was recorded,
    /// which are version 1.
    #[serde(default = "version_one")]
    pub version: u32,
    /// Phase name.
    pub phase: String,
    /// The model this phase trains, resolved: [`TrainJob::phase_model`] of the recipe's
    /// `model:` and the phase's settings. The worker builds it as it is, and its checkpoints
    /// record it (`model.json`).
    pub model: ModelConfig,
    /// Training settings.
    pub train: TrainSettings,
    /// The phase's mixture index (`samples.idx` of `mix.<phase>`).
    pub mixture: PathBuf,
    /// Sources in the mixture's order.
    pub sources: Vec<SourcePaths>,
    /// Where checkpoints go (`<dir>/step-N`).
    pub checkpoints: PathBuf,
    /// The previous phase's final checkpoint to start from.
    pub init: Option<PathBuf>,
    /// What each decoder layer keeps for the backward pass (not part of the stage's identity:
    /// every mode computes the same).
    pub activation_checkpointing: ActivationCheckpointing,
    /// Ranks each sequence is split over (`train.launch.context_parallel`): consecutive ranks
    /// form a group, `rank / context_parallel` is a rank's data-parallel index. Not part of the
    /// stage's identity either: the data, the checkpoints and (to float rounding) the
    /// gradients do not depend on it.
    pub context_parallel: usize,
}

impl TrainJob {
    /// Reads a job file, refusing a version this worker does not know.
    pub fn read(path: &Path) -> Result<TrainJob> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let job: TrainJob = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing the train job {}", path.display()))?;
        ensure!(
            job.version == JOB_VERSION,
            "{}: train job version {}, but this worker reads version {JOB_VERSION}",
            path.display(),
            job.version
        );
        Ok(job)
    }

    /// The model a phase trains: the recipe's `model:` with the phase's `rope_base` applied.
    /// The one place a phase setting changes the model; the train stage writes its result
    /// into the job.
    pub fn phase_model(model: &ModelConfig, train: &TrainSettings) -> ModelConfig {
        ModelConfig {
            rope_base: train.rope_base.unwrap_or(model.rope_base),
            ..model.clone()
        }
    }
}
