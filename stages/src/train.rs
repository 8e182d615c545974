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
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zflow_pipeline::stage::{parse_config, spawn_supervised, terminate_group};
use zflow_pipeline::{ConfigError, NodeSpec, Section, Stage, StageContext};
use zflow_runtime::protocol::{StepMetrics, WorkerMessage};
use zflow_runtime::size::ModelConfig;
use zflow_runtime::trainer::{SourcePaths, TrainJob, TrainSettings};

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
    /// Seconds without a message from the worker before it is declared hung and stopped.
    #[serde(default = "default_hang", skip_serializing)]
    pub hang_timeout_s: u64,
}

fn default_hang() -> u64 {
    600
}

impl Stage for Train {
    type Config = TrainConfig;
    const KIND: &'static str = "train";
    // Bump when the runtime's numerics change (model, init, optimizer, data order).
    const VERSION: u32 = 2;

    fn validate(&self, c: &TrainConfig, needs: &[String]) -> Result<(), ConfigError> {
        c.train.validate().map_err(|e| ConfigError::new("train", e))?;
        zflow_runtime::backend::BackendKind::parse(&c.train.backend).map_err(|e| ConfigError::new("train.backend", e.to_string()))?;
        let want = format!("mix.{}", c.phase);
        if !needs.contains(&want) {
            return Err(ConfigError::new("needs", format!("a train stage needs its phase's mixture `{want}`")));
        }
        if let Some(p) = &c.previous {
            if !needs.contains(p) {
                return Err(ConfigError::new("needs", format!("the phase starts from `{p}` but does not need it")));
            }
        }
        Ok(())
    }

    fn resources(&self, c: &TrainConfig) -> zflow_pipeline::Resources {
        // Training takes the whole machine: the worker's matrix kernels use every core.
        let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        zflow_pipeline::Resources { cpus, gpus: u32::from(c.train.backend != "cpu"), ..Default::default() }
    }

    fn resumable(&self, _c: &TrainConfig) -> bool {
        true
    }

    fn run(&self, c: &TrainConfig, ctx: &StageContext) -> Result<()> {
        let out = ctx.out_dir();
        let mut sources = Vec::new();
        for name in &c.sources {
            let dir = ctx.input(&format!("tokenize.{name}"))?;
            let heldout = dir.join("heldout");
            sources.push(SourcePaths {
                name: name.clone(),
                tokens: dir.join("tokens"),
                heldout: heldout.with_extension("idx").exists().then_some(heldout),
            });
        }
        let job = TrainJob {
            phase: c.phase.clone(),
            model: c.model.clone(),
            train: c.train.clone(),
            mixture: ctx.input(&format!("mix.{}", c.phase))?.join("samples.idx"),
            sources,
            checkpoints: out.join("checkpoints"),
            init: c.previous.as_ref().map(|p| ctx.input(p).map(|d| d.join("final"))).transpose()?,
            rank: 0,
            world: 1,
        };
        let job_path = out.join("job.json");
        std::fs::write(&job_path, serde_json::to_vec_pretty(&job)?)?;
        // An earlier attempt finished the phase and died before the stage was committed.
        if finished(&out.join("final")) {
            tracing::info!("the phase already finished in an earlier attempt; keeping its final checkpoint");
            return Metrics::open(&out.join("metrics.jsonl"))?.write_parquet(&c.phase, out);
        }

        let exe = std::env::current_exe().context("locating the zflow binary to start a worker")?;
        let mut cmd = Command::new(exe);
        cmd.arg("worker").arg("--job").arg(&job_path).arg("--backend").arg(&c.train.backend);
        cmd.current_dir(out).envs(ctx.child_env()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(ctx.log().stdio()?);
        let mut child = spawn_supervised(&mut cmd).context("starting the training worker")?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });

        let mut metrics = Metrics::open(&out.join("metrics.jsonl"))?;
        let mut last_message = Instant::now();
        let mut worker_error = None;
        let mut done = false;
        let status = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    last_message = Instant::now();
                    match WorkerMessage::parse(&line) {
                        Some(m) => self.handle(m, ctx, &mut metrics, &mut worker_error, &mut done)?,
                        None => ctx.log().line(&line),
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break child.wait()?;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if ctx.cancel_token().is_cancelled() {
                terminate_group(child.id() as i32, Duration::from_secs(5), &mut child);
                bail!("cancelled");
            }
            if last_message.elapsed() > Duration::from_secs(c.hang_timeout_s) {
                terminate_group(child.id() as i32, Duration::from_secs(5), &mut child);
                bail!("the worker sent nothing for {} s (hang_timeout_s) and was stopped", c.hang_timeout_s);
            }
        };
        if !status.success() || !done {
            let why = worker_error.unwrap_or_else(|| describe(&status));
            bail!("the training worker failed: {why} (log: {})", ctx.log().path().display());
        }

        // The phase's artifact: its last checkpoint as `final/`, metrics as Parquet.
        let (_, last) = zflow_runtime::checkpoint::list(&out.join("checkpoints"))
            .into_iter()
            .next()
            .context("the worker finished without committing a checkpoint")?;
        let final_dir = out.join("final");
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir)?;
        }
        std::fs::rename(&last, &final_dir)?;
        std::fs::remove_dir_all(out.join("checkpoints"))?;
        metrics.write_parquet(&c.phase, out)?;
        Ok(())
    }
}

impl Train {
    fn handle(&self, m: WorkerMessage, ctx: &StageContext, metrics: &mut Metrics, error: &mut Option<String>, done: &mut bool) -> Result<()> {
        match m {
            WorkerMessage::Hello { device, start_step, total_steps, params, .. } => {
                ctx.progress().set_length(total_steps);
                ctx.progress().set_position(start_step);
                metrics.truncate_after(start_step)?;
                let from = if start_step > 0 { format!(", resuming at step {start_step}") } else { String::new() };
                tracing::info!("worker on {device}: {params} parameters, {total_steps} steps{from}");
            }
            WorkerMessage::Heartbeat { .. } => {}
            WorkerMessage::Step(s) => {
                ctx.progress().set_position(s.step);
                ctx.progress().set_message(format!("loss {:.3}  {:.0} tok/s", s.loss, s.tokens_per_s));
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
            WorkerMessage::CheckpointCommitted { step, path } => tracing::info!("checkpoint at step {step}: {path}"),
            WorkerMessage::Done { step, loss } => {
                tracing::info!("phase done at step {step}, loss {loss:.4}");
                *done = true;
            }
            WorkerMessage::Error { message } => *error = Some(message),
        }
        Ok(())
    }
}

/// Whether `dir` is a verified checkpoint at the end of its phase.
fn finished(dir: &Path) -> bool {
    let Ok(files) = zflow_runtime::checkpoint::read_verified(dir) else { return false };
    let state = files.get("trainer.json").and_then(|b| serde_json::from_slice::<zflow_runtime::checkpoint::TrainerState>(b).ok());
    state.is_some_and(|s| s.step == s.total_steps)
}

fn describe(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended without finishing the phase".into(),
    }
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Record {
    Step(StepMetrics),
    Eval { step: u64, losses: Vec<(String, f64)> },
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
struct Metrics {
    path: std::path::PathBuf,
    records: Vec<Record>,
}

impl Metrics {
    fn open(path: &Path) -> Result<Metrics> {
        let records = match std::fs::read_to_string(path) {
            // A torn last line (crash mid-write) is dropped; the step is recomputed anyway.
            Ok(text) => text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect(),
            Err(_) => Vec::new(),
        };
        Ok(Metrics { path: path.to_path_buf(), records })
    }

    /// Drops what came after `step` (a resumed worker recomputes it) and rewrites the file.
    fn truncate_after(&mut self, step: u64) -> Result<()> {
        self.records.retain(|r| r.step() <= step);
        let mut text = String::new();
        for r in &self.records {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        std::fs::write(&self.path, text)?;
        Ok(())
    }

    fn push(&mut self, r: Record) -> Result<()> {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
        writeln!(f, "{}", serde_json::to_string(&r)?)?;
        self.records.push(r);
        Ok(())
    }

    fn write_parquet(&self, phase: &str, out: &Path) -> Result<()> {
        let steps: Vec<&StepMetrics> = self.records.iter().filter_map(|r| if let Record::Step(s) = r { Some(s) } else { None }).collect();
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
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.grad_norm))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.tokens_per_s))),
            Arc::new(UInt64Array::from_iter_values(steps.iter().map(|s| s.tokens))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.balance_error))),
        ];
        // One column per route: tokens routed there this step, summed over MoE layers.
        for r in 0..routes {
            fields.push(Field::new(format!("load_{r}"), DataType::UInt64, false));
            cols.push(Arc::new(UInt64Array::from_iter_values(steps.iter().map(|s| s.expert_load.get(r).copied().unwrap_or(0)))));
        }
        write_parquet(&out.join("metrics.parquet"), fields, cols)?;

        let mut evals: BTreeMap<(u64, String), f64> = BTreeMap::new();
        for r in &self.records {
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
                Arc::new(StringArray::from_iter_values(evals.keys().map(|k| k.1.as_str()))),
                Arc::new(Float64Array::from_iter_values(evals.values().copied())),
            ],
        )
    }
}

/// The `train:` section: settings shared by every phase (each phase's `train:` overrides them).
/// It adds no stage by itself; `phases:` reads it.
pub struct TrainSection;

impl TrainSection {
    /// Phase `phase`'s settings: the recipe's `train:` merged with the phase's own `train:`.
    pub fn settings(recipe: &Value, phase: &str, own: Option<&Value>) -> Result<TrainSettings, ConfigError> {
        let mut merged = recipe.get("train").cloned().unwrap_or_else(|| Value::Object(Default::default()));
        if let Some(own) = own {
            merge(&mut merged, own);
        }
        parse_config(merged, &format!("phases.{phase}.train"))
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
        let _: TrainSettings = parse_config(value.clone(), "train")?;
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
        let s = TrainSection::settings(&recipe, "p3", Some(&own)).unwrap();
        assert_eq!((s.global_batch, s.micro_batch, s.rope_base), (32, 16, Some(1.0e6)));
        assert_eq!((s.schedule.peak_lr, s.schedule.warmup), (0.01, 0.0));
        let err = TrainSection::settings(&recipe, "p3", Some(&json!({"globl_batch": 1}))).unwrap_err();
        assert!(format!("{}: {}", err.path, err.message).contains("globl_batch"), "{}: {}", err.path, err.message);
    }
}
