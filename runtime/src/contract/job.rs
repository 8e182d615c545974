//! The train job: everything a worker needs to train one phase, as the supervisor writes it
//! (`job.json` in the train stage's folder). Versioned: a worker refuses a version it does not
//! know ([`TrainJob::read`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::contract::settings::TrainSettings;
use crate::model::config::ModelConfig;

/// The version of the train job document this code writes and reads.
pub const JOB_VERSION: u32 = 1;

fn version_one() -> u32 {
    1
}

/// One token source as the worker sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourcePaths {
    /// Source name.
    pub name: String,
    /// Megatron dataset prefix of its training tokens.
    pub tokens: PathBuf,
    /// Prefix of its held-out tokens, if any.
    pub heldout: Option<PathBuf>,
}

/// Everything a worker needs to train one phase; written by the train stage as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainJob {
    /// The schema version ([`JOB_VERSION`]); absent in jobs written before it was recorded,
    /// which are version 1.
    #[serde(default = "version_one")]
    pub version: u32,
    /// Phase name.
    pub phase: String,
    /// The model.
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

    /// The model this phase trains: the recipe's `model:` with the phase's `rope_base`
    /// applied. Its checkpoints record exactly this config (`model.json`), which is what every
    /// reader of a checkpoint builds the model from.
    pub fn phase_model(&self) -> ModelConfig {
        ModelConfig {
            rope_base: self.train.rope_base.unwrap_or(self.model.rope_base),
            ..self.model.clone()
        }
    }
}
