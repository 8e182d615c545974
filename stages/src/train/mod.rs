//! `train.<phase>`: one pretraining phase of the recipe's model on the phase's mixture.
//!
//! The stage is the supervisor: it writes the phase's [`TrainJob`] to `job.json`, starts every
//! rank through its training engine ([`crate::engine`]) and watches the launch
//! (`supervisor.rs`: progress bar with step, loss and tokens/s, relaunches), records metrics and
//! events (`record.rs`), and when the phase is done leaves:
//!
//! ```text
//! final/            the last checkpoint (weights, optimizer state, trainer state, manifest)
//! metrics.parquet   one row per optimizer step: loss, lr, grad norm, tokens/s, balance error, load
//! eval.parquet      held-out loss per source every `eval_every` steps
//! job.json          what the worker was asked to do
//! ```
//!
//! The stage is resumable: its folder survives a failed attempt, and the next attempt's worker
//! resumes from the newest complete checkpoint (metrics after that step are dropped and
//! recomputed). Phase N starts from phase N-1's `final/`.
//!
//! Recipe: a `train:` section holds settings for every phase; a phase's own `train:` overrides
//! them key by key. With a `model:` section, every phase gets a `train.<phase>` stage.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::contract::job::{JOB_VERSION, SourcePaths, TrainJob};
use zflow_runtime::contract::settings::TrainSettings;
use zflow_runtime::model::config::ModelConfig;

use crate::names;

mod record;
mod supervisor;

pub use record::{Event, Record, interruptions, metrics};
use record::{Events, Metrics, now_ms};
use supervisor::Outcome;

/// The `train` stage kind.
pub struct Train;

/// `train` settings (what the `phases:` section writes for each phase).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Phase name.
    pub phase: String,
    /// The model.
    pub model: ModelConfig,
    /// Training settings.
    pub train: TrainSettings,
    /// Sources of the phase's mixture, in its order.
    pub sources: Vec<String>,
    /// The sharded ones among them, with their shard counts (their tokens are their shards',
    /// in order: [`names::token_stages`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<String, usize>,
    /// The previous phase's train stage, whose final checkpoint this phase starts from.
    pub previous: Option<String>,
    /// How the phase is launched and supervised. Not part of the stage's identity: more ranks
    /// or more retries do not change what the phase computes (beyond float rounding of the
    /// gradient sums), and a phase started on 2 ranks can finish on 4.
    #[serde(default, skip_serializing)]
    pub launch: LaunchSettings,
}

/// How a phase runs (`train.launch` in the recipe).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LaunchSettings {
    /// Data-parallel worker processes (ranks); the optimizer state is sharded over them
    /// (ZeRO-1). `global_batch` must be a multiple of `data_parallel x micro_batch`.
    pub data_parallel: usize,
    /// Relaunches after a crash or hang before the stage fails.
    pub max_restarts: u32,
    /// Seconds to wait before the first relaunch; doubled for each further one (up to 60 s).
    pub backoff_s: f64,
    /// Seconds without a message from a rank before it is declared hung. Workers send a
    /// heartbeat every quarter of this.
    pub hang_timeout_s: u64,
    /// The preflight health check of every rank's device before training.
    pub preflight: PreflightSettings,
}

/// The preflight health check (`train.launch.preflight`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreflightSettings {
    /// Probe every rank's device (a short GEMM and a bandwidth test) at each launch.
    pub enabled: bool,
    /// A rank below this fraction of the median GEMM or bandwidth is reported...
    pub min_ratio: f64,
    /// ...and, with `exclude`, the phase runs without it (on fewer ranks, when the global
    /// batch still divides).
    pub exclude: bool,
}

impl Default for PreflightSettings {
    fn default() -> Self {
        PreflightSettings {
            enabled: true,
            min_ratio: 0.5,
            exclude: false,
        }
    }
}

impl Default for LaunchSettings {
    fn default() -> Self {
        LaunchSettings {
            data_parallel: 1,
            max_restarts: 3,
            backoff_s: 1.0,
            hang_timeout_s: 600,
            preflight: PreflightSettings::default(),
        }
    }
}

impl Stage for Train {
    type Config = TrainConfig;
    const KIND: &'static str = "train";
    // Bump when the runtime's numerics change (model, init, optimizer, data order).
    const VERSION: u32 = 2;

    fn validate(&self, c: &TrainConfig, needs: &[String]) -> Result<(), ConfigError> {
        c.train
            .validate()
            .map_err(|e| ConfigError::new("train", e))?;
        let ranks = c.launch.data_parallel;
        if ranks == 0
            || !c
                .train
                .global_batch
                .is_multiple_of(ranks * c.train.micro_batch)
        {
            return Err(ConfigError::new(
                "train.launch.data_parallel",
                format!(
                    "global_batch ({}) must be a multiple of data_parallel ({ranks}) x micro_batch ({})",
                    c.train.global_batch, c.train.micro_batch
                ),
            ));
        }
        if c.launch.hang_timeout_s == 0 {
            return Err(ConfigError::new(
                "train.launch.hang_timeout_s",
                "`hang_timeout_s` must be > 0 (seconds of silence before a rank counts as hung), got 0",
            ));
        }
        if !(c.launch.backoff_s.is_finite() && c.launch.backoff_s >= 0.0) {
            return Err(ConfigError::new(
                "train.launch.backoff_s",
                format!(
                    "`backoff_s` must be a finite number of seconds >= 0, got {}",
                    c.launch.backoff_s
                ),
            ));
        }
        zflow_runtime::contract::backend::check_backend(&c.train.backend)
            .map_err(|e| ConfigError::new("train.backend", e))?;
        crate::engine::check(&c.train.engine).map_err(|e| ConfigError::new("train.engine", e))?;
        let want = names::mix(&c.phase);
        if !needs.contains(&want) {
            return Err(ConfigError::new(
                "needs",
                format!("a train stage needs its phase's mixture `{want}`"),
            ));
        }
        if let Some(p) = &c.previous
            && !needs.contains(p)
        {
            return Err(ConfigError::new(
                "needs",
                format!("the phase starts from `{p}` but does not need it"),
            ));
        }
        Ok(())
    }

    fn resources(&self, c: &TrainConfig) -> zflow_pipeline::Resources {
        // Training takes the whole machine: the worker's matrix kernels use every core.
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let ranks = c.launch.data_parallel as u32;
        zflow_pipeline::Resources {
            cpus,
            gpus: if c.train.backend == "cpu" { 0 } else { ranks },
            ranks,
            ..Default::default()
        }
    }

    fn resumable(&self, _c: &TrainConfig) -> bool {
        true
    }

    fn run(&self, c: &TrainConfig, ctx: &StageContext) -> Result<()> {
        let out = ctx.out_dir();
        let mut sources = Vec::new();
        for name in &c.sources {
            let (mut tokens, mut heldout) = (Vec::new(), Vec::new());
            for stage in names::token_stages(name, c.shards.get(name).copied()) {
                let dir = ctx.input(&stage)?;
                crate::token_ids::check(name, dir, c.model.vocab_size)?;
                tokens.push(dir.join("tokens"));
                let held = dir.join("heldout");
                if held.with_extension("idx").exists() {
                    heldout.push(held);
                }
            }
            sources.push(SourcePaths {
                name: name.clone(),
                tokens,
                heldout,
            });
        }
        let job = TrainJob {
            version: JOB_VERSION,
            phase: c.phase.clone(),
            model: TrainJob::phase_model(&c.model, &c.train),
            train: c.train.clone(),
            mixture: ctx.input(&names::mix(&c.phase))?.join("samples.idx"),
            sources,
            checkpoints: out.join("checkpoints"),
            init: c
                .previous
                .as_ref()
                .map(|p| ctx.input(p).map(|d| d.join("final")))
                .transpose()?,
        };
        let job_path = out.join("job.json");
        std::fs::write(&job_path, serde_json::to_vec_pretty(&job)?)?;
        // An earlier attempt finished the phase and died before the stage was committed.
        if finished(&out.join("final")) {
            tracing::info!(
                "the phase already finished in an earlier attempt; keeping its final checkpoint"
            );
            Events::open(&out.join("events.jsonl"))?.write_parquet(&c.phase, out)?;
            return Metrics::open(&out.join("metrics.jsonl"))?.write_parquet(&c.phase, out);
        }

        let mut events = Events::open(&out.join("events.jsonl"))?;
        let mut metrics = Metrics::open(&out.join("metrics.jsonl"))?;
        let sup = &c.launch;
        let mut restarts = 0u32;
        let mut world = c.launch.data_parallel;
        loop {
            let attempt = events.next_attempt()?;
            match self.attempt(c, ctx, &job_path, attempt, world, &mut metrics, &mut events)? {
                Outcome::Finished => break,
                Outcome::Exclude { slow } => {
                    world -= slow;
                    tracing::warn!("relaunching on {world} rank(s) without the slow one(s)");
                }
                Outcome::Failed { cause, step, fatal } => {
                    let detected = now_ms();
                    if fatal {
                        events.push(Event::failure(attempt, &cause, step, detected, None))?;
                        bail!(
                            "the training workers failed: {cause} (not retried: no relaunch can fix this; log: {})",
                            ctx.log().path().display()
                        );
                    }
                    if restarts >= sup.max_restarts {
                        events.push(Event::failure(attempt, &cause, step, detected, None))?;
                        bail!(
                            "the training workers failed: {cause} (no restarts left after {restarts}; log: {})",
                            ctx.log().path().display()
                        );
                    }
                    let backoff = (sup.backoff_s * 2f64.powi(restarts as i32)).min(60.0);
                    restarts += 1;
                    tracing::warn!(
                        "{cause}; relaunching from the newest complete checkpoint in {backoff:.1} s (restart {restarts} of {})",
                        sup.max_restarts
                    );
                    events.push(Event::failure(
                        attempt,
                        &cause,
                        step,
                        detected,
                        Some(backoff),
                    ))?;
                    std::thread::sleep(Duration::from_secs_f64(backoff));
                }
            }
        }

        // The phase's artifact: its last checkpoint as `final/`, metrics as Parquet.
        let (_, last) = zflow_runtime::checkpoint::list(&out.join("checkpoints"))
            .into_iter()
            .next()
            .context("the workers finished without committing a checkpoint")?;
        let final_dir = out.join("final");
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir)?;
        }
        std::fs::rename(&last, &final_dir)?;
        std::fs::remove_dir_all(out.join("checkpoints"))?;
        metrics.write_parquet(&c.phase, out)?;
        events.write_parquet(&c.phase, out)?;
        Ok(())
    }
}

/// Whether `dir` is a verified checkpoint at the end of its phase.
fn finished(dir: &Path) -> bool {
    let Ok(files) = zflow_runtime::checkpoint::read_verified(dir) else {
        return false;
    };
    let state = files
        .get("trainer.json")
        .and_then(|b| serde_json::from_slice::<zflow_runtime::checkpoint::TrainerState>(b).ok());
    state.is_some_and(|s| s.step == s.total_steps)
}
