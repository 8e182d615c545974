//! Evaluates a GGUF model on tasks of `evals/tasks`.
//!
//! ```text
//! cargo run -p zflow-evals --example eval_gguf -- --model gemma-3-270m-q4_k_m.gguf \
//!     --tasks piqa,arc_easy --data DIR --cache DIR [--limit N] [--output results.json]
//! ```
//! `DIR` is what `evals/scripts/fetch_data.sh DIR` fills. For a SentencePiece model without
//! `--tokenizer`, `tokenizer.json` beside the model or `DIR/tokenizer-gemma3/tokenizer.json` is
//! used. The results table goes to stdout, timings to stderr.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use zflow_evals::engine::EngineOptions;
use zflow_evals::gguf::GgufModel;
use zflow_evals::{EvalOptions, LanguageModel, TaskRegistry};

#[derive(Parser)]
struct Args {
    /// The GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated tasks or groups (e.g. piqa,arc_easy,mmlu).
    #[arg(long, value_delimiter = ',', required = true)]
    tasks: Vec<String>,
    /// The data root (see evals/scripts/fetch_data.sh).
    #[arg(long)]
    data: PathBuf,
    /// The request cache folder (resume: rerun with the same folder).
    #[arg(long)]
    cache: PathBuf,
    /// Only the first N documents of each task.
    #[arg(long)]
    limit: Option<usize>,
    /// The model's tokenizer.json (SentencePiece vocabularies need one).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Override the tasks' number of few-shot examples.
    #[arg(long)]
    num_fewshot: Option<usize>,
    /// Task files folder (default: the crate's evals/tasks).
    #[arg(long)]
    tasks_dir: Option<PathBuf>,
    /// Packed model inputs per forward pass.
    #[arg(long, default_value_t = 2048)]
    batch_tokens: usize,
    /// Longest model input (default: the model's context, at most 4096).
    #[arg(long, default_value_t = 4096)]
    max_length: usize,
    /// Write the results JSON here.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Include per-document scores in the results.
    #[arg(long)]
    log_samples: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let tokenizer = args.tokenizer.clone().or_else(|| {
        let beside = args.model.with_file_name("tokenizer.json");
        let fetched = args.data.join("tokenizer-gemma3/tokenizer.json");
        [beside, fetched].into_iter().find(|p| p.exists())
    });
    let t0 = Instant::now();
    let mut model = match GgufModel::load(&args.model, None, Some(args.max_length)) {
        Ok(m) => m,
        // A SentencePiece vocabulary: retry with the tokenizer.json found above.
        Err(e) if tokenizer.is_some() && format!("{e:#}").contains("SentencePiece") => {
            GgufModel::load(&args.model, tokenizer.as_deref(), Some(args.max_length))?
        }
        Err(e) => return Err(e),
    };
    eprintln!("loaded {} ({:?}, {} layers) in {:.1} s; identity {}", args.model.display(), model.config().arch, model.config().n_layer, t0.elapsed().as_secs_f64(), model.identity());
    let registry = TaskRegistry::load_dir(&args.tasks_dir.clone().unwrap_or_else(zflow_evals::task::builtin_tasks_dir))?;
    let opts = EvalOptions {
        data_root: args.data.clone(),
        cache_dir: args.cache.clone(),
        limit: args.limit,
        num_fewshot: args.num_fewshot,
        log_samples: args.log_samples,
        engine: EngineOptions { max_batch_tokens: args.batch_tokens, progress: true, sink: None },
    };
    let t0 = Instant::now();
    let report = zflow_evals::evaluate(&mut model, &registry, &args.tasks, &opts)?;
    let wall = t0.elapsed().as_secs_f64();
    print!("{}", report.results.table());
    for (task, s, t) in &report.timings {
        let model_s = s.model_time.as_secs_f64();
        eprintln!(
            "{task}: {:.1} s wall, {:.1} s in the model; {} requests scored, {} from the cache; {} input tokens ({} packed), {:.0} input tokens/s in the model{}",
            t.as_secs_f64(),
            model_s,
            s.scored,
            s.cached,
            s.input_tokens,
            s.packed_tokens,
            s.input_tokens as f64 / model_s.max(1e-9),
            if s.generated_tokens > 0 { format!(", {} tokens generated", s.generated_tokens) } else { String::new() }
        );
    }
    eprintln!("total {wall:.1} s");
    if let Some(out) = &args.output {
        std::fs::write(out, report.results.to_json()).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("results written to {}", out.display());
    }
    Ok(())
}
