//! `zflow bench ...`: the systems benchmarks, each in its own file here, and the command line
//! that dispatches to them.

mod checkpoint;
mod data_scale;
mod experts;
mod hw;
mod memory;
mod near_dedup_scale;
mod step;
mod tokenize;
mod train;

use crate::RecipeArgs;
use crate::commands::open;
use anyhow::Result;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use zflow_pipeline::CancelToken;
use zflow_pipeline::plan::{Engine, StageState};
use zflow_pipeline::progress::Progress;
use zflow_pipeline::run::{self, RunOptions};
use zflow_pipeline::store::now_ms;

/// `zflow bench ...`
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Time `plan` and a no-op `run` on a generated recipe of N shell stages.
    Plan {
        /// Number of stages.
        #[arg(long, default_value_t = 2000)]
        stages: usize,
        /// Where to put the recipe and store (default: a temp folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The data plane's cost as the corpus grows: for each count, a synthetic pre-tokenized
    /// source of that many small documents, its validation, the mix stage (documents/s), and
    /// one rank's start-up up to its first batch (time, peak RSS), which must not grow.
    DataScale {
        /// Document counts, comma-separated (`1e5,1e6,1e7,1e8`).
        #[arg(long, default_value = "1e5,1e6,1e7")]
        docs: String,
        /// Scratch folder (default: a temporary one); each count's files are removed after it.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Tokenize one source of a recipe (whose `ingest.<source>` and `tokenizer` are complete)
    /// through zflow and through the Python `tokenizers` package's `encode_batch`, same
    /// tokenizer.json, same documents, one run.
    Tokenize {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The source to tokenize.
        #[arg(long)]
        source: String,
    },
    /// GEMM throughput over the recipe model's matrix shapes, and the same shapes off
    /// 64-alignment, on this machine's cores (GPUs: `scripts/gpu_check.sh`, through torch);
    /// `gemm.parquet` in `--out`.
    Gemm {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Tokens per GEMM (the m dimension).
        #[arg(long, default_value_t = 2048)]
        tokens: usize,
        /// Where `gemm.parquet` goes.
        #[arg(long, default_value = "zflow-bench")]
        out: PathBuf,
    },
    /// STREAM memory bandwidth (copy, scale, add, triad) on one thread and on all;
    /// `membw.parquet` in `--out`.
    Membw {
        /// MiB per array.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Where `membw.parquet` goes.
        #[arg(long, default_value = "zflow-bench")]
        out: PathBuf,
    },
    /// Checkpoint write throughput against `dd` on the same disk, and the step-time cost of
    /// checkpointing in the background and inline, in one run.
    Checkpoint {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Scratch folder on the disk to measure (default: the store's).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Training steps per mode and round.
        #[arg(long, default_value_t = 10)]
        steps: u64,
        /// Rounds, each running every mode once (in a rotated order); the median is reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// A checkpoint every this many steps.
        #[arg(long, default_value_t = 5)]
        every: u64,
        /// The phase whose training settings are timed (default: the recipe's first).
        #[arg(long)]
        phase: Option<String>,
        /// Sequences per step (default: the phase's micro-batch).
        #[arg(long)]
        batch: Option<usize>,
        /// Tokens per sequence (default: the phase's).
        #[arg(long)]
        seq_len: Option<usize>,
    },
    /// The training step of the recipe's model with one phase's resolved settings: tokens/s
    /// and model FLOP/s against this machine's matmul peak and against PyTorch on the same
    /// model, in one run.
    Train {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The phase whose training settings are timed (default: the recipe's first).
        #[arg(long)]
        phase: Option<String>,
        /// Sequences per step (default: the phase's micro-batch).
        #[arg(long)]
        batch: Option<usize>,
        /// Tokens per sequence (default: the phase's).
        #[arg(long)]
        seq_len: Option<usize>,
        /// Timed steps (the best one is reported).
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Rounds, each timing the torch engine's step and then plain PyTorch's.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
    /// The MoE layer's expert paths (per-expert loop, grouped matmul, padded batched matmul)
    /// on one layer of the recipe's model: each checked against the loop, then timed,
    /// alternating; prints the fastest correct one.
    Experts {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Tokens through the layer per step.
        #[arg(long, default_value_t = 4096)]
        tokens: usize,
        /// `cpu`, or `cuda` (GPU 0, bf16 autocast as training runs there).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Rounds, each timing every path.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Also write the whole result (every path's figures, the fastest) here as JSON.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// `zflow size`'s memory per rank against the torch engine's measured peak, for every
    /// phase of the recipe, on this machine's CPU.
    Memory {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Training steps per phase (the optimizer's state is made in the first).
        #[arg(long, default_value_t = 2)]
        steps: usize,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The torch engine's training step under each of its memory and optimizer settings
    /// (activation checkpointing, the loss in chunks or from the full logits, batched Muon,
    /// torch's own Muon, AdamW alone): time, stepping every variant in turn in one process, and
    /// each one's peak memory.
    Step {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The phase whose training settings are the engine's (default: the recipe's first).
        #[arg(long)]
        phase: Option<String>,
        /// Sequences per step (default: the phase's micro-batch).
        #[arg(long)]
        batch: Option<usize>,
        /// Tokens per sequence (default: the phase's).
        #[arg(long)]
        seq_len: Option<usize>,
        /// Timed steps of each variant, taken in turn with the other variants' (the median and
        /// the fastest are reported).
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Positions per chunk of the engine's loss (default: `train.loss_chunk_tokens`'s).
        #[arg(long)]
        loss_chunk_tokens: Option<usize>,
    },
}

pub async fn bench(what: Bench) -> Result<ExitCode> {
    match what {
        Bench::Plan { stages, dir } => bench_plan(stages, dir).await,
        Bench::Tokenize { recipe, source } => tokenize::run(&recipe, &source),
        Bench::DataScale { docs, dir } => {
            let counts = data_scale::parse_counts(&docs)?;
            tokio::task::spawn_blocking(move || data_scale::run(&counts, dir.as_deref())).await?
        }
        Bench::Train {
            recipe,
            phase,
            batch,
            seq_len,
            steps,
            rounds,
        } => train::run(&recipe, phase.as_deref(), batch, seq_len, steps, rounds),
        Bench::Experts {
            recipe,
            tokens,
            device,
            rounds,
            out,
        } => experts::run(&recipe, tokens, &device, rounds, out.as_deref()),
        Bench::Memory {
            recipe,
            steps,
            json,
        } => memory::run(&recipe, steps, json),
        Bench::Step {
            recipe,
            phase,
            batch,
            seq_len,
            steps,
            loss_chunk_tokens,
        } => step::run(
            &recipe,
            phase.as_deref(),
            (batch, seq_len),
            steps,
            loss_chunk_tokens,
        ),
        Bench::Gemm {
            recipe,
            tokens,
            out,
        } => hw::gemm(&recipe, tokens, &out),
        Bench::Membw { mib, out } => hw::membw(mib, &out),
        Bench::Checkpoint {
            recipe,
            dir,
            steps,
            rounds,
            every,
            phase,
            batch,
            seq_len,
        } => checkpoint::run(
            &recipe,
            dir.as_deref(),
            phase.as_deref(),
            checkpoint::Shape {
                steps,
                rounds,
                every,
                batch,
                seq_len,
            },
        ),
    }
}

/// A recipe of `n` stages: a chain with fan-in (stage i needs i-1 and i/2), every stage a
/// tiny shell command.
pub fn generated_recipe(n: usize) -> String {
    let mut y = String::from("name: bench\nstages:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  - name: s{i}\n    kind: shell\n    run: echo {i} > \"$ZFLOW_OUT/x\"\n"
        ));
        if i > 0 {
            let mut needs = vec![format!("s{}", i - 1)];
            if i / 2 != i - 1 {
                needs.push(format!("s{}", i / 2));
            }
            y.push_str(&format!("    needs: [{}]\n", needs.join(", ")));
        }
    }
    y
}

async fn bench_plan(n: usize, dir: Option<PathBuf>) -> Result<ExitCode> {
    let tmp;
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            d
        }
        None => {
            tmp = tempdir()?;
            tmp.clone()
        }
    };
    let recipe_path = dir.join("bench.yaml");
    std::fs::write(&recipe_path, generated_recipe(n))?;
    let args = RecipeArgs {
        recipe: recipe_path.clone(),
        sets: vec![],
        store: Some(dir.join("store")),
    };

    let t = Instant::now();
    let engine = open(&args)?;
    let load = t.elapsed();
    let t = Instant::now();
    let states = engine.plan(&BTreeSet::new())?;
    let plan_time = t.elapsed();
    let to_run = states
        .iter()
        .filter(|s| !matches!(s, StageState::Cached { .. }))
        .count();
    println!(
        "{n} stages: load {:.3}s, plan {:.3}s ({to_run} to run)",
        load.as_secs_f64(),
        plan_time.as_secs_f64()
    );

    let quiet = Progress::new(zflow_pipeline::progress::Mode::Quiet);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let run_all = |engine: Engine| RunOptions {
        selected: (0..engine.graph.nodes().len()).collect(),
        force: BTreeSet::new(),
        cpus: cores,
        gpus: 0,
        memory_gb: f64::MAX,
        progress: quiet.clone(),
        cancel: CancelToken::default(),
    };
    let t = Instant::now();
    let opts = run_all(open(&args)?);
    let first = run::run(Arc::new(engine), opts).await?;
    println!(
        "first run: {} stages ran in {:.2}s",
        first.ran.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let engine = open(&args)?;
    let states = engine.plan(&BTreeSet::new())?;
    let cached_plan = t.elapsed();
    println!(
        "plan when all cached (load + plan): {:.3}s ({} cached)",
        cached_plan.as_secs_f64(),
        states
            .iter()
            .filter(|s| matches!(s, StageState::Cached { .. }))
            .count()
    );
    let t = Instant::now();
    let opts = run_all(open(&args)?);
    let second = run::run(Arc::new(engine), opts).await?;
    println!(
        "no-op run (load + run, all cached): {:.3}s ({} ran, {} cached)",
        t.elapsed().as_secs_f64(),
        second.ran.len(),
        second.cached.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("zflow-bench-{}-{}", std::process::id(), now_ms()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// The median of `values` (NaN when there are none).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
