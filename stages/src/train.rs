//! `train.<phase>`: one pretraining phase of the recipe's model on the phase's mixture.
//!
//! The stage is the supervisor: it writes the phase's [`TrainJob`] to `job.json`, starts a
//! `zflow worker` process for it, reads the worker's JSON lines (progress bar with step, loss and
//! tokens/s; metrics to `metrics.jsonl`), and when the phase is done leaves:
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
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zflow_pipeline::stage::{parse_config, spawn_supervised, terminate_group};
use zflow_pipeline::{ConfigError, NodeSpec, Section, Stage, StageContext};
use zflow_runtime::contract::env;
use zflow_runtime::contract::exit::Failure;
use zflow_runtime::contract::job::{JOB_VERSION, SourcePaths, TrainJob};
use zflow_runtime::contract::protocol::{StepMetrics, WorkerMessage};
use zflow_runtime::size::ModelConfig;
use zflow_runtime::trainer::TrainSettings;

use crate::jsonl::JsonLines;
use crate::names;
use crate::util::write_parquet;

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
        zflow_runtime::backend::BackendKind::parse(&c.train.backend)
            .map_err(|e| ConfigError::new("train.backend", e.to_string()))?;
        if !crate::engine::ENGINES.contains(&c.train.engine.as_str()) {
            return Err(ConfigError::new(
                "train.engine",
                format!(
                    "unknown training engine `{}` (engines: {})",
                    c.train.engine,
                    crate::engine::ENGINES.join(", ")
                ),
            ));
        }
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
            let dir = ctx.input(&names::tokenize(name))?;
            crate::token_ids::check(name, dir, c.model.vocab_size)?;
            let heldout = dir.join("heldout");
            sources.push(SourcePaths {
                name: name.clone(),
                tokens: dir.join("tokens"),
                heldout: heldout.with_extension("idx").exists().then_some(heldout),
            });
        }
        let job = TrainJob {
            version: JOB_VERSION,
            phase: c.phase.clone(),
            model: c.model.clone(),
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

/// How one launch of the workers ended.
enum Outcome {
    Finished,
    /// The preflight check found `slow` ranks to leave out.
    Exclude {
        slow: usize,
    },
    Failed {
        cause: String,
        step: u64,
        /// No relaunch can fix it ([`Failure::Fatal`]).
        fatal: bool,
    },
}

/// A gap between two turns of the supervisor's loop longer than this means the supervisor
/// itself was paused.
const SUPERVISOR_PAUSE: Duration = Duration::from_secs(2);

/// One rank's process as the supervisor sees it.
struct Rank {
    child: zflow_pipeline::stage::Supervised,
    last_message: Instant,
    step: u64,
    done: bool,
    exited: Option<std::process::ExitStatus>,
    error: Option<String>,
    /// The class its `error` message gave.
    class: Option<Failure>,
    probe: Option<zflow_runtime::preflight::Probe>,
}

impl Rank {
    /// Why this (failed) rank failed: as its `error` message said, else as its exit code
    /// says, else (a signal, an unknown code) worth a retry.
    fn failure(&self) -> Failure {
        self.class
            .or_else(|| {
                self.exited
                    .and_then(|s| s.code())
                    .and_then(Failure::from_exit_code)
            })
            .unwrap_or(Failure::Retry)
    }
}

impl Train {
    /// Launches every rank once and watches them until all finish, one fails or hangs, or the
    /// run is cancelled; a failed launch has all its ranks stopped before this returns.
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &self,
        c: &TrainConfig,
        ctx: &StageContext,
        job_path: &Path,
        attempt: u32,
        world: usize,
        metrics: &mut Metrics,
        events: &mut Events,
    ) -> Result<Outcome> {
        let slurm = crate::launch::SlurmJob::from_env()?;
        let placements = crate::launch::placements(slurm.as_ref(), world, attempt)?;
        let (program, args) =
            crate::engine::worker_command(&c.train.engine, job_path, &c.train.backend)?;
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Option<String>)>();
        let mut ranks = Vec::new();
        let heartbeat = (c.launch.hang_timeout_s / 4).max(1);
        for p in &placements {
            let mut cmd =
                crate::launch::rank_command(slurm.as_ref(), &program, p.rank, world, ctx.name());
            cmd.args(&args);
            if world > 1 {
                cmd.envs(p.to_env());
            }
            cmd.env(env::ATTEMPT, attempt.to_string())
                .env(env::HEARTBEAT_S, heartbeat.to_string());
            if c.launch.preflight.enabled {
                cmd.env(env::PREFLIGHT, "1");
            }
            cmd.current_dir(ctx.out_dir())
                .envs(ctx.child_env())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(ctx.log().stdio()?);
            let mut child = spawn_supervised(&mut cmd)
                .with_context(|| format!("starting training worker rank {}", p.rank))?;
            let stdout = child.stdout.take().expect("piped stdout");
            let (tx, rank) = (tx.clone(), p.rank);
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((rank, Some(line))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((rank, None));
            });
            ranks.push(Rank {
                child,
                last_message: Instant::now(),
                step: 0,
                done: false,
                exited: None,
                error: None,
                class: None,
                probe: None,
            });
        }
        drop(tx);
        tracing::info!("attempt {attempt}: {world} worker rank(s) started");

        let stop_all = |ranks: &mut Vec<Rank>| {
            for r in ranks.iter_mut().filter(|r| r.exited.is_none()) {
                terminate_group(r.child.id() as i32, Duration::from_secs(5), &mut r.child);
            }
        };
        let hang = Duration::from_secs(c.launch.hang_timeout_s);
        let mut preflight_pending = c.launch.preflight.enabled;
        let mut last_tick = Instant::now();
        loop {
            if preflight_pending && ranks.iter().all(|r| r.probe.is_some()) {
                preflight_pending = false;
                let probes: Vec<_> = ranks.iter().map(|r| r.probe.expect("all probed")).collect();
                for (rank, p) in probes.iter().enumerate() {
                    tracing::info!(
                        "preflight rank {rank}: GEMM {:.1} GFLOP/s, memory {:.1} GB/s",
                        p.gemm_gflops,
                        p.membw_gbps
                    );
                }
                let slow =
                    zflow_runtime::preflight::outliers(&probes, c.launch.preflight.min_ratio);
                for (_, why) in &slow {
                    tracing::warn!("preflight: {why}");
                    events.push(Event {
                        kind: "preflight".into(),
                        ..Event::failure(attempt, why, 0, now_ms(), None)
                    })?;
                }
                let rest = world - slow.len();
                if c.launch.preflight.exclude && !slow.is_empty() {
                    if rest > 0
                        && c.train
                            .global_batch
                            .is_multiple_of(rest * c.train.micro_batch)
                    {
                        stop_all(&mut ranks);
                        return Ok(Outcome::Exclude { slow: slow.len() });
                    }
                    tracing::warn!(
                        "preflight: cannot leave out {} rank(s): global_batch {} does not divide over {rest} x micro_batch {}",
                        slow.len(),
                        c.train.global_batch,
                        c.train.micro_batch
                    );
                }
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((rank, Some(line))) => {
                    let r = &mut ranks[rank];
                    r.last_message = Instant::now();
                    match WorkerMessage::parse(&line) {
                        Some(m) => self.handle(rank, m, ctx, metrics, events, r)?,
                        None => ctx.log().line(&format!("[rank {rank}] {line}")),
                    }
                }
                Ok((rank, None)) => {
                    let r = &mut ranks[rank];
                    let status = r.child.wait()?;
                    r.exited = Some(status);
                    if !(status.success() && r.done) {
                        // When one rank dies, its ring neighbours fail too ("receiving from the
                        // previous rank"): give them a moment, then blame a rank that was killed
                        // by a signal or failed on its own, not the ones that lost a peer.
                        let deadline = Instant::now() + Duration::from_secs(1);
                        while Instant::now() < deadline && ranks.iter().any(|r| r.exited.is_none())
                        {
                            for r in ranks.iter_mut().filter(|r| r.exited.is_none()) {
                                r.exited = r.child.try_wait()?;
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        while let Ok((rank, Some(line))) = rx.try_recv() {
                            if let Some(WorkerMessage::Error { message, class }) =
                                WorkerMessage::parse(&line)
                            {
                                ranks[rank].error = Some(message);
                                ranks[rank].class = Some(class);
                            }
                        }
                        let failed: Vec<usize> = (0..ranks.len())
                            .filter(|&i| {
                                ranks[i]
                                    .exited
                                    .is_some_and(|s| !(s.success() && ranks[i].done))
                            })
                            .collect();
                        let class = |i: &usize| ranks[*i].failure();
                        let culprit = failed
                            .iter()
                            .copied()
                            .find(|i| class(i) == Failure::Fatal)
                            .or_else(|| {
                                failed
                                    .iter()
                                    .copied()
                                    .find(|i| class(i) != Failure::LostPeer)
                            })
                            .unwrap_or(rank);
                        let fatal = class(&culprit) == Failure::Fatal;
                        let r = &ranks[culprit];
                        let status = r.exited.expect("exited");
                        let why = r.error.clone().unwrap_or_else(|| {
                            if status.success() {
                                "exited with status 0 without reporting `done`".into()
                            } else {
                                describe(&status)
                            }
                        });
                        let step = r.step;
                        stop_all(&mut ranks);
                        return Ok(Outcome::Failed {
                            cause: format!("rank {culprit} failed after step {step}: {why}"),
                            step,
                            fatal,
                        });
                    }
                    if ranks.iter().all(|r| r.exited.is_some()) {
                        return Ok(Outcome::Finished);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Ok(Outcome::Finished);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if ctx.cancel_token().is_cancelled() {
                stop_all(&mut ranks);
                bail!("cancelled");
            }
            // A loop turn takes ~100 ms. A long gap means this process was not running (SIGSTOP,
            // a suspended laptop, a starved host): the ranks' silence over that time is ours,
            // not theirs, so their hang clocks start again.
            let gap = last_tick.elapsed();
            last_tick = Instant::now();
            if gap > SUPERVISOR_PAUSE {
                tracing::warn!(
                    "the supervisor did not run for {:.1} s; not counting that time against the ranks' hang timeout",
                    gap.as_secs_f64()
                );
                for r in &mut ranks {
                    r.last_message = last_tick;
                }
            }
            if let Some((rank, r)) = ranks
                .iter()
                .enumerate()
                .find(|(_, r)| r.exited.is_none() && r.last_message.elapsed() > hang)
            {
                let (step, secs) = (r.step, r.last_message.elapsed().as_secs());
                stop_all(&mut ranks);
                return Ok(Outcome::Failed {
                    cause: format!(
                        "rank {rank} hung after step {step}: no message for {secs} s (hang_timeout_s {})",
                        c.launch.hang_timeout_s
                    ),
                    step,
                    fatal: false,
                });
            }
        }
    }

    fn handle(
        &self,
        rank: usize,
        m: WorkerMessage,
        ctx: &StageContext,
        metrics: &mut Metrics,
        events: &mut Events,
        r: &mut Rank,
    ) -> Result<()> {
        match m {
            WorkerMessage::Hello {
                device,
                start_step,
                total_steps,
                params,
                world,
                ..
            } => {
                r.step = start_step;
                if rank == 0 {
                    ctx.progress().set_length(total_steps);
                    ctx.progress().set_position(start_step);
                    metrics.truncate_after(start_step)?;
                    let from = if start_step > 0 {
                        format!(", resuming at step {start_step}")
                    } else {
                        String::new()
                    };
                    tracing::info!(
                        "{world} rank(s) on {device}: {params} parameters, {total_steps} steps{from}"
                    );
                }
            }
            WorkerMessage::Heartbeat { .. } => {}
            WorkerMessage::Preflight { probe, .. } => r.probe = Some(probe),
            WorkerMessage::Step(s) => {
                r.step = s.step;
                if rank != 0 {
                    return Ok(());
                }
                events.training_again(now_ms())?;
                ctx.progress().set_position(s.step);
                ctx.progress()
                    .set_message(format!("loss {:.3}  {:.0} tok/s", s.loss, s.tokens_per_s));
                if s.step % 10 == 0 || s.step == 1 {
                    tracing::info!(
                        "step {} loss {:.4} lr {:.2e} grad-norm {:.3} {:.0} tok/s balance-error {:.3}",
                        s.step,
                        s.loss,
                        s.lr,
                        s.grad_norm,
                        s.tokens_per_s,
                        s.balance_error
                    );
                }
                metrics.push(Record::Step(s))?;
            }
            WorkerMessage::Eval { step, losses } => {
                let text: Vec<String> = losses.iter().map(|(s, l)| format!("{s} {l:.4}")).collect();
                tracing::info!("step {step} held-out loss: {}", text.join(", "));
                metrics.push(Record::Eval { step, losses })?;
            }
            WorkerMessage::CheckpointCommitted { step, path } => {
                tracing::info!("checkpoint at step {step}: {path}")
            }
            WorkerMessage::LossSpike {
                step,
                loss,
                z,
                rollback_to,
                skipped_sample,
            } => {
                if rank == 0 {
                    tracing::warn!(
                        "loss spike at step {step} (loss {loss:.4}, z {z:.1}): rolled back to step {rollback_to}, skipping the batch at sample {skipped_sample}"
                    );
                    metrics.truncate_after(rollback_to)?;
                    ctx.progress().set_position(rollback_to);
                    let cause = format!(
                        "loss spike at step {step}: loss {loss:.4}, z {z:.1}; batch at sample {skipped_sample} skipped"
                    );
                    events.push(Event {
                        kind: "loss_spike".into(),
                        rollback_to: Some(rollback_to),
                        ..Event::failure(
                            events.current_attempt(),
                            &cause,
                            step,
                            now_ms(),
                            Some(0.0),
                        )
                    })?;
                }
            }
            WorkerMessage::Done { step, loss } => {
                if rank == 0 {
                    match loss {
                        Some(loss) => tracing::info!("phase done at step {step}, loss {loss:.4}"),
                        None => tracing::info!("phase done at step {step}"),
                    }
                }
                r.done = true;
            }
            WorkerMessage::Error { message, class } => {
                r.error = Some(message);
                r.class = Some(class);
            }
        }
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One thing that interrupted training: a failed launch (crash, hang, error) or a loss-spike
/// rollback; a line of `events.jsonl`, which survives failed attempts of the stage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// `failure` (a launch that crashed, hung or errored), `loss_spike`, or `launch`.
    pub kind: String,
    /// Launch number (1 = first launch in this stage directory).
    pub attempt: u32,
    /// What happened.
    pub cause: String,
    /// Last step reported before it happened.
    pub step: u64,
    /// The step training went back to (loss spikes).
    #[serde(default)]
    pub rollback_to: Option<u64>,
    /// When the supervisor noticed (ms since the epoch).
    pub detected_ms: u64,
    /// Backoff before the relaunch, seconds (`None`: no relaunch, the stage failed).
    pub backoff_s: Option<f64>,
    /// When training made progress again (the first step reported afterwards).
    #[serde(default)]
    pub training_again_ms: Option<u64>,
}

impl Event {
    fn failure(
        attempt: u32,
        cause: &str,
        step: u64,
        detected_ms: u64,
        backoff_s: Option<f64>,
    ) -> Event {
        Event {
            kind: "failure".into(),
            attempt,
            cause: cause.to_string(),
            step,
            rollback_to: None,
            detected_ms,
            backoff_s,
            training_again_ms: None,
        }
    }

    /// Seconds from the fault's detection until training made progress again.
    pub fn downtime_s(&self) -> Option<f64> {
        Some(self.training_again_ms?.saturating_sub(self.detected_ms) as f64 / 1000.0)
    }
}

/// The run's events so far, mirrored in `events.jsonl`.
struct Events(JsonLines<Event>);

impl Events {
    fn open(path: &Path) -> Result<Events> {
        Ok(Events(JsonLines::open(path)))
    }

    /// Records a new launch and returns its number (numbers continue across `zflow run`s, so
    /// a fault injected into attempt 1 fires once).
    fn next_attempt(&mut self) -> Result<u32> {
        let attempt = self.current_attempt() + 1;
        self.push(Event {
            kind: "launch".into(),
            ..Event::failure(attempt, "", 0, now_ms(), None)
        })?;
        Ok(attempt)
    }

    fn current_attempt(&self) -> u32 {
        self.0
            .records
            .iter()
            .filter(|e| e.kind == "launch")
            .map(|e| e.attempt)
            .max()
            .unwrap_or(0)
    }

    /// Notes that training made progress: the newest open interruption ends here.
    fn training_again(&mut self, ms: u64) -> Result<()> {
        if let Some(e) =
            self.0.records.iter_mut().rev().find(|e| {
                e.kind != "launch" && e.training_again_ms.is_none() && e.backoff_s.is_some()
            })
        {
            e.training_again_ms = Some(ms);
            self.0.rewrite()?;
        }
        Ok(())
    }

    fn push(&mut self, e: Event) -> Result<()> {
        self.0.push(e)
    }

    /// `events.parquet`: the interruptions (not the launches), with their downtime.
    fn write_parquet(&self, phase: &str, out: &Path) -> Result<()> {
        let rows: Vec<&Event> = self
            .0
            .records
            .iter()
            .filter(|e| e.kind != "launch")
            .collect();
        write_parquet(
            &out.join("events.parquet"),
            vec![
                Field::new("phase", DataType::Utf8, false),
                Field::new("kind", DataType::Utf8, false),
                Field::new("attempt", DataType::UInt64, false),
                Field::new("step", DataType::UInt64, false),
                Field::new("cause", DataType::Utf8, false),
                Field::new("downtime_s", DataType::Float64, true),
            ],
            vec![
                Arc::new(StringArray::from(vec![phase; rows.len()])),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|e| e.kind.as_str()),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|e| e.attempt as u64),
                )),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|e| e.step))),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|e| e.cause.as_str()),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|e| e.downtime_s()).collect::<Vec<_>>(),
                )),
            ],
        )
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

fn describe(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("killed by signal {sig}{name}")
        }
        _ => "ended without finishing the phase".into(),
    }
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Record {
    Step(StepMetrics),
    Eval {
        step: u64,
        losses: Vec<(String, f64)>,
    },
}

impl Record {
    fn step(&self) -> u64 {
        match self {
            Record::Step(s) => s.step,
            Record::Eval { step, .. } => *step,
        }
    }
}

/// The phase's metrics so far, mirrored in `metrics.jsonl` (which survives failed attempts).
struct Metrics(JsonLines<Record>);

impl Metrics {
    fn open(path: &Path) -> Result<Metrics> {
        Ok(Metrics(JsonLines::open(path)))
    }

    /// Drops what came after `step` (a resumed worker recomputes it) and rewrites the file.
    fn truncate_after(&mut self, step: u64) -> Result<()> {
        self.0.records.retain(|r| r.step() <= step);
        self.0.rewrite()
    }

    fn push(&mut self, r: Record) -> Result<()> {
        self.0.push(r)
    }

    fn write_parquet(&self, phase: &str, out: &Path) -> Result<()> {
        let steps: Vec<&StepMetrics> = self
            .0
            .records
            .iter()
            .filter_map(|r| {
                if let Record::Step(s) = r {
                    Some(s)
                } else {
                    None
                }
            })
            .collect();
        let routes = steps.first().map(|s| s.expert_load.len()).unwrap_or(0);
        let mut fields = vec![
            Field::new("phase", DataType::Utf8, false),
            Field::new("step", DataType::UInt64, false),
            Field::new("loss", DataType::Float64, false),
            Field::new("lr", DataType::Float64, false),
            Field::new("grad_norm", DataType::Float64, false),
            Field::new("tokens_per_s", DataType::Float64, false),
            Field::new("tokens", DataType::UInt64, false),
            Field::new("balance_error", DataType::Float64, false),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![phase; steps.len()])),
            Arc::new(UInt64Array::from_iter_values(steps.iter().map(|s| s.step))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.loss))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.lr))),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.grad_norm),
            )),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.tokens_per_s),
            )),
            Arc::new(UInt64Array::from_iter_values(
                steps.iter().map(|s| s.tokens),
            )),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.balance_error),
            )),
        ];
        // One column per route: tokens routed there this step, summed over MoE layers.
        for r in 0..routes {
            fields.push(Field::new(format!("load_{r}"), DataType::UInt64, false));
            cols.push(Arc::new(UInt64Array::from_iter_values(
                steps
                    .iter()
                    .map(|s| s.expert_load.get(r).copied().unwrap_or(0)),
            )));
        }
        write_parquet(&out.join("metrics.parquet"), fields, cols)?;

        let mut evals: BTreeMap<(u64, String), f64> = BTreeMap::new();
        for r in &self.0.records {
            if let Record::Eval { step, losses } = r {
                for (s, l) in losses {
                    evals.insert((*step, s.clone()), *l);
                }
            }
        }
        write_parquet(
            &out.join("eval.parquet"),
            vec![
                Field::new("phase", DataType::Utf8, false),
                Field::new("step", DataType::UInt64, false),
                Field::new("source", DataType::Utf8, false),
                Field::new("loss", DataType::Float64, false),
            ],
            vec![
                Arc::new(StringArray::from(vec![phase; evals.len()])),
                Arc::new(UInt64Array::from_iter_values(evals.keys().map(|k| k.0))),
                Arc::new(StringArray::from_iter_values(
                    evals.keys().map(|k| k.1.as_str()),
                )),
                Arc::new(Float64Array::from_iter_values(evals.values().copied())),
            ],
        )
    }
}

/// The `train:` section: settings shared by every phase (each phase's `train:` overrides them).
/// It adds no stage by itself; `phases:` reads it.
pub struct TrainSection;

impl TrainSection {
    /// Phase `phase`'s settings: the recipe's `train:` merged with the phase's own `train:`,
    /// and its `launch:` part apart.
    pub fn settings(
        recipe: &Value,
        phase: &str,
        own: Option<&Value>,
    ) -> Result<(TrainSettings, LaunchSettings), ConfigError> {
        let mut merged = recipe
            .get("train")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        if let Some(own) = own {
            merge(&mut merged, own);
        }
        let supervisor = merged
            .as_object_mut()
            .and_then(|m| m.remove("launch"))
            .unwrap_or_else(|| Value::Object(Default::default()));
        let supervisor = parse_config(supervisor, &format!("phases.{phase}.train.launch"))?;
        Ok((
            parse_config(merged, &format!("phases.{phase}.train"))?,
            supervisor,
        ))
    }
}

/// Deep-merges `patch` into `base` (objects key by key; anything else replaces).
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

impl Section for TrainSection {
    fn key(&self) -> &'static str {
        "train"
    }

    fn expand(&self, value: &Value, _recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        let mut value = value.clone();
        let supervisor = value
            .as_object_mut()
            .and_then(|m| m.remove("launch"))
            .unwrap_or_else(|| Value::Object(Default::default()));
        let _: LaunchSettings = parse_config(supervisor, "train.launch")?;
        let _: TrainSettings = parse_config(value, "train")?;
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn phase_settings_override_the_shared_ones_key_by_key() {
        let recipe = json!({"train": {"global_batch": 32, "micro_batch": 8, "schedule": {"peak_lr": 0.01, "warmup": 0.1}}});
        let own = json!({"micro_batch": 16, "schedule": {"warmup": 0.0}, "rope_base": 1.0e6});
        let (s, launch) = TrainSection::settings(&recipe, "p3", Some(&own)).unwrap();
        assert_eq!(launch, LaunchSettings::default());
        assert_eq!(
            (s.global_batch, s.micro_batch, s.rope_base),
            (32, 16, Some(1.0e6))
        );
        assert_eq!((s.schedule.peak_lr, s.schedule.warmup), (0.01, 0.0));
        let err =
            TrainSection::settings(&recipe, "p3", Some(&json!({"globl_batch": 1}))).unwrap_err();
        assert!(
            format!("{}: {}", err.path, err.message).contains("globl_batch"),
            "{}: {}",
            err.path,
            err.message
        );
    }
}
