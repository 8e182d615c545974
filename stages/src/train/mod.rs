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
use zflow_pipeline::stage::LaunchSite;
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::contract::job::{JOB_VERSION, SourcePaths, TrainJob};
use zflow_runtime::contract::settings::ActivationCheckpointing;
use zflow_runtime::contract::settings::TrainSettings;
use zflow_runtime::dist::placement::Placement;
use zflow_runtime::model::config::ModelConfig;

use crate::launch::{LaunchSpec, SlurmJob, Target, threads_per_rank};
use crate::names;

mod launch_settings;
mod record;
mod supervisor;

pub use launch_settings::{LaunchSettings, PreflightSettings};

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
    /// What each decoder layer keeps for the backward pass. Not part of the identity either:
    /// every mode gives the same loss and gradients, so a phase that ran out of memory resumes
    /// with it changed.
    #[serde(default, skip_serializing)]
    pub activation_checkpointing: ActivationCheckpointing,
}

impl Stage for Train {
    type Config = TrainConfig;
    const KIND: &'static str = "train";
    // Bump when the runtime's numerics change (model, init, optimizer, data order). 3: the
    // loss made in chunks of `train.loss_chunk_tokens` positions.
    const VERSION: u32 = 3;

    fn validate(&self, c: &TrainConfig, needs: &[String]) -> Result<(), ConfigError> {
        c.train
            .validate()
            .map_err(|e| ConfigError::new("train", e))?;
        c.launch
            .check()
            .map_err(|e| ConfigError::new(format!("train.launch.{}", e.path), e.message))?;
        let ranks = c.launch.data_parallel_groups();
        if !c
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
        let ranks = c.launch.world() as u32;
        // Without `cpus_per_rank`, training takes the whole machine: its ranks share every core
        // (`crate::launch::threads_per_rank`).
        let cpus = match c.launch.cpus_per_rank {
            Some(n) => n * ranks,
            None => std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        };
        zflow_pipeline::Resources {
            cpus,
            gpus: if c.train.backend == "cpu" { 0 } else { ranks },
            ranks,
            nodes: c.launch.nodes as u32,
            memory_gb: c.launch.memory_gb_per_node.unwrap_or(0.0),
            time_min: c.launch.time_min.unwrap_or(0),
        }
    }

    fn launch_lines(&self, c: &TrainConfig, on: &LaunchSite) -> Result<Vec<String>> {
        let world = c.launch.world();
        let job = on
            .slurm_nodes
            .map(|n| SlurmJob::on_hosts(0, (0..n).map(|i| format!("<node {i}>")).collect()));
        let spec = launch_spec(c, &on.stage, on.threads, job.as_ref(), world, 1);
        let host = match &job {
            Some(job) if job.hosts.len() > 1 => job.hosts[0].clone(),
            _ => "127.0.0.1".to_string(),
        };
        let placements = Placement::all(world, &format!("{host}:<port>"), "<secret>");
        let engine = crate::engine::worker_command(
            &c.train.engine,
            &on.out_dir.join("job.json"),
            &c.train.backend,
        )?;
        let mut lines =
            vec![
            format!("# {}, {} thread(s) each", describe_launch(c, world), spec.threads),
            "# chosen at each launch: <port> (free on the first node) and <secret> (fresh, never \
             shown); each rank also gets the stage's ZFLOW_OUT, ZFLOW_STAGE and ZFLOW_IN_* \
             and runs in its output folder"
                .to_string(),
        ];
        lines.extend(
            spec.processes(&engine, &placements)?
                .iter()
                .map(|p| p.shell_line()),
        );
        Ok(lines)
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
                tokens.push(crate::megatron_source::tokens_prefix(dir)?);
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
            activation_checkpointing: c.activation_checkpointing,
            context_parallel: c.launch.context_parallel(),
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
        let mut world = c.launch.world();
        let slurm = SlurmJob::from_env()?;
        loop {
            let attempt = events.next_attempt(&describe_launch(c, world))?;
            let launch = (slurm.as_ref(), world, attempt);
            match self.attempt(c, ctx, &job_path, launch, &mut metrics, &mut events)? {
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
                    if let Some(job) = slurm.as_ref().filter(|j| j.hosts.len() > 1) {
                        wait_out_lost_nodes(job, c.launch.hang_timeout_s);
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

/// The launch of `world` ranks of phase `c` (stage `stage`, given `stage_threads` cores): on
/// this machine or in the Slurm job `slurm`, each rank with its share of the cores.
fn launch_spec<'a>(
    c: &'a TrainConfig,
    stage: &'a str,
    stage_threads: usize,
    slurm: Option<&'a SlurmJob>,
    world: usize,
    attempt: u32,
) -> LaunchSpec<'a> {
    let target = match slurm {
        None => Target::Local,
        Some(job) => Target::Slurm(job),
    };
    // On this machine its ranks share the stage's cores; in a Slurm job each task was given
    // its `--cpus-per-task`, the same share.
    let threads = threads_per_rank(c.launch.cpus_per_rank, stage_threads, world);
    LaunchSpec {
        target,
        world,
        backend: &c.train.backend,
        threads,
        env: rank_variables(c, world, attempt),
        stage,
    }
}

/// What every rank of launch `attempt` of `world` ranks gets besides its place: the attempt,
/// the heartbeat period, the store and collective timeouts, the preflight request, then
/// `train.launch.env`.
fn rank_variables(c: &TrainConfig, world: usize, attempt: u32) -> Vec<(String, String)> {
    use zflow_runtime::contract::env;
    let heartbeat = (c.launch.hang_timeout_s / 4).max(1);
    let mut vars = vec![
        (env::ATTEMPT.to_string(), attempt.to_string()),
        (env::HEARTBEAT_S.to_string(), heartbeat.to_string()),
        (
            env::STORE_TIMEOUT_S.to_string(),
            c.launch.store_timeout_s(world).to_string(),
        ),
        (
            env::COLLECTIVE_TIMEOUT_S.to_string(),
            c.launch.collective_timeout_s(world).to_string(),
        ),
    ];
    if c.launch.preflight.enabled {
        vars.push((env::PREFLIGHT.to_string(), "1".to_string()));
    }
    vars.extend(c.launch.env.iter().map(|(k, v)| (k.clone(), v.to_string())));
    vars
}

/// After a failed launch in a Slurm job of several nodes: while a node of the job does not
/// answer (it died, or its slurmd did), relaunching onto it would only fail again and spend
/// the restarts. Slurm marks such a node down within its `SlurmdTimeout`, ends this job and
/// requeues it on nodes that answer (the `--requeue` the executor submits with); the phase
/// then resumes there from its newest checkpoint. So this waits, until Slurm does that (and
/// stops this process) or the node answers again (and the relaunch goes ahead as usual).
fn wait_out_lost_nodes(job: &SlurmJob, probe_timeout_s: u64) {
    let timeout = Duration::from_secs(probe_timeout_s.clamp(5, 60));
    loop {
        let lost = job.unreachable(timeout);
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            "node(s) {} of slurm job {} do not answer: waiting for Slurm to take them out and \
             requeue the job on the nodes left (the phase resumes from its newest checkpoint)",
            lost.join(", "),
            job.id
        );
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// A launch of `world` ranks as the run record keeps it: the topology, the store and
/// collective timeouts, and every variable of `train.launch.env`.
fn describe_launch(c: &TrainConfig, world: usize) -> String {
    let mut text = format!(
        "{world} rank(s) on {} node(s), backend {}, store timeout {} s, collective timeout {} s",
        c.launch.nodes,
        c.train.backend,
        c.launch.store_timeout_s(world),
        c.launch.collective_timeout_s(world),
    );
    if !c.launch.env.is_empty() {
        let vars: Vec<String> = c
            .launch
            .env
            .iter()
            // Escaped: the text is one line of the run record and of `zflow plan --launch`'s
            // script comment, which a line break in a value would end.
            .map(|(k, v)| format!("{k}={}", v.to_string().escape_debug()))
            .collect();
        text.push_str(&format!("; env {}", vars.join(" ")));
    }
    text
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
