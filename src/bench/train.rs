//! `zflow bench train`: the training step of a recipe's model on the torch engine (its worker's
//! own step, `zflow_torch.bench`), against this machine's matmul peak and against the same
//! model trained by plain transformers + PyTorch (`scripts/bench_train_torch.py`), in one run,
//! the two alternating for `--rounds` rounds so that a change in the machine's load shows as a
//! spread, not as a ratio. The torch rows run
//! in the torch engine's Python (`stages/src/engine.rs`: `ZFLOW_TORCH_PYTHON`, else the one
//! `scripts/setup.sh` made); `scripts/bench_train_vs_torch.sh` runs this.

use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::RecipeArgs;

/// Runs the benchmark on `phase` (default: the recipe's first) with its resolved settings;
/// `batch` and `seq_len` default to the phase's micro-batch and sequence length.
pub fn run(
    args: &RecipeArgs,
    phase: Option<&str>,
    batch: Option<usize>,
    seq_len: Option<usize>,
    steps: usize,
    rounds: usize,
) -> Result<ExitCode> {
    let target = recipe_phase(args, phase)?;
    let (batch, seq_len) = target.shape(batch, seq_len);
    target.print(&format!(
        "batch {batch} x {seq_len} tokens, {rounds} rounds"
    ));
    let (model, threads) = (&target.model, target.threads);

    let peak = zflow_runtime::bench::matmul_gflops(1024, 5);
    println!();
    println!(
        "{:<42} {:>12} {:>12} {:>14} {:>10}",
        "", "step (s)", "tokens/s", "model GFLOP/s", "of peak"
    );
    println!(
        "{:<42} {:>12} {:>12} {:>14.1} {:>9.0}%",
        "matmul 1024^3 (gemm crate, f32)", "", "", peak, 100.0
    );
    let row = |label: &str, step_s: f64, tokens_per_s: f64, flops_per_token: u64| {
        let gflops = tokens_per_s * flops_per_token as f64 / 1e9;
        println!(
            "{label:<42} {step_s:>12.3} {tokens_per_s:>12.0} {gflops:>14.1} {:>9.1}%",
            100.0 * gflops / peak
        );
    };
    let mut ratios = vec![Vec::new(); STOCK_OPTIMIZERS.len()];
    let flops_per_token = model.flops(seq_len).total;
    for round in 1..=rounds {
        let engine_tps = match torch_engine_step(&target, batch, seq_len, steps) {
            Ok(t) => {
                let tps = t["tokens_per_s"].as_f64().unwrap_or(0.0);
                row(
                    &format!("zflow torch engine (worker step), round {round}"),
                    t["step_s"].as_f64().unwrap_or(0.0),
                    tps,
                    flops_per_token,
                );
                Some(tps)
            }
            Err(e) => {
                println!("zflow torch engine: not run ({e:#})");
                None
            }
        };
        for (i, optimizer) in STOCK_OPTIMIZERS.iter().enumerate() {
            match torch_step(model, batch, seq_len, steps, threads, optimizer) {
                Ok(t) => {
                    let tps = t["tokens_per_s"].as_f64().unwrap_or(0.0);
                    let label = format!(
                        "transformers {} + PyTorch {} ({}), round {round}",
                        t["transformers"].as_str().unwrap_or("?"),
                        t["torch"].as_str().unwrap_or("?"),
                        t["optimizer"].as_str().unwrap_or("?")
                    );
                    row(
                        &label,
                        t["step_s"].as_f64().unwrap_or(0.0),
                        tps,
                        flops_per_token,
                    );
                    if let Some(e) = engine_tps {
                        ratios[i].push(e / tps);
                    }
                }
                Err(e) => println!("plain PyTorch ({optimizer}): not run ({e:#})"),
            }
        }
    }
    println!();
    for (optimizer, ratios) in STOCK_OPTIMIZERS.iter().zip(&ratios) {
        if !ratios.is_empty() {
            let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
            println!(
                "torch engine / plain PyTorch with {optimizer}, per round: {}",
                shown.join(", ")
            );
        }
    }
    println!(
        "model FLOPs per token (forward + backward): {:.1} M",
        flops_per_token as f64 / 1e6
    );
    Ok(ExitCode::SUCCESS)
}

/// The recipe's model and this machine's cores, once printed with what the benchmark runs
/// (`workload`, with its rounds): for benchmarks of the model alone.
pub(crate) fn recipe_model(
    args: &RecipeArgs,
    workload: &str,
) -> Result<(zflow_runtime::model::config::ModelConfig, usize)> {
    let engine = crate::commands::open(args)?;
    let model = crate::commands::recipe_doc(&engine)?.model_or_default();
    let threads = threads();
    println!(
        "model: {}, {workload}, {threads} threads",
        describe_model(&engine.recipe.name, &model)
    );
    Ok((model, threads))
}

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn describe_model(recipe: &str, model: &zflow_runtime::model::config::ModelConfig) -> String {
    format!(
        "{recipe} (hidden {}, {} blocks, {} experts, vocab {})",
        model.hidden_size, model.num_blocks, model.num_experts, model.vocab_size
    )
}

/// What a benchmark of the training step runs: the recipe's model and one phase's training
/// settings as `zflow run` resolves them (`--set` included, and the defaults that follow the
/// backend), so that a bench times what the recipe trains with.
pub(crate) struct PhaseBench {
    /// The recipe's name.
    pub recipe: String,
    /// Its model.
    pub model: zflow_runtime::model::config::ModelConfig,
    /// The phase (`train` for a recipe without phases: its `train:` section alone).
    pub phase: String,
    /// The phase's resolved settings.
    pub train: zflow_stages::recipe::train::PhaseTrain,
    /// The phase's sequence length (none without phases).
    pub seq_len: Option<usize>,
    /// This machine's cores.
    pub threads: usize,
}

/// The recipe's phase `phase` (default: the first) for a benchmark.
pub(crate) fn recipe_phase(args: &RecipeArgs, phase: Option<&str>) -> Result<PhaseBench> {
    let engine = crate::commands::open(args)?;
    let doc = crate::commands::recipe_doc(&engine)?;
    let model = doc.model_or_default();
    let (phase, train, seq_len) = match phase {
        Some(name) => {
            let Some(entry) = doc.phases.iter().find(|p| p.name == name) else {
                let names: Vec<&str> = doc.phases.iter().map(|p| p.name.as_str()).collect();
                anyhow::bail!(
                    "{} has no phase `{name}` (its phases: {})",
                    args.recipe.display(),
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                );
            };
            (
                name.to_string(),
                entry.train.clone(),
                Some(entry.phase.seq_len),
            )
        }
        None => match doc.phases.first() {
            Some(entry) => (
                entry.name.clone(),
                entry.train.clone(),
                Some(entry.phase.seq_len),
            ),
            None => {
                let shared =
                    zflow_stages::recipe::train::parse(engine.recipe.document.get("train"))
                        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
                let train = shared
                    .resolve("train", None)
                    .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
                ("train".to_string(), train, None)
            }
        },
    };
    Ok(PhaseBench {
        recipe: engine.recipe.name.clone(),
        model,
        phase,
        train,
        seq_len,
        threads: threads(),
    })
}

impl PhaseBench {
    /// Sequences per step and tokens per sequence: as given, else the phase's micro-batch and
    /// sequence length.
    pub fn shape(&self, batch: Option<usize>, seq_len: Option<usize>) -> (usize, usize) {
        (
            batch.unwrap_or(self.train.settings.micro_batch),
            seq_len.or(self.seq_len).unwrap_or(256),
        )
    }

    /// Prints the model, the settings that decide the step's speed, and `workload`.
    pub fn print(&self, workload: &str) {
        let s = &self.train.settings;
        println!(
            "model: {}, {workload}, {} threads",
            describe_model(&self.recipe, &self.model),
            self.threads
        );
        println!(
            "{} settings: backend {}, muon.ns_dtype {}, grad_reduce_dtype {}, loss_chunk_tokens {}, activation_checkpointing {}",
            self.phase,
            s.backend,
            dtype_name(s.muon.ns_dtype),
            dtype_name(s.grad_reduce_dtype),
            s.loss_chunk_tokens,
            format!("{:?}", self.train.activation_checkpointing).to_lowercase()
        );
    }

    /// The config of `python -m zflow_torch.bench` for this phase: the model, its settings,
    /// its activation checkpointing and the machine's threads, plus `fields`.
    pub fn config(&self, fields: serde_json::Value) -> serde_json::Value {
        let mut config = serde_json::json!({
            "model": self.model, "train": self.train.settings, "threads": self.threads,
            "activation_checkpointing": self.train.activation_checkpointing,
        });
        if let (Some(config), serde_json::Value::Object(fields)) = (config.as_object_mut(), fields)
        {
            config.extend(fields);
        }
        config
    }
}

/// `bf16` or `f32`, as recipes write it.
pub(crate) fn dtype_name(d: zflow_runtime::contract::settings::Dtype) -> String {
    serde_json::to_value(d)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// The torch engine's own step (`python -m zflow_torch.bench`), in the engine's Python.
fn torch_engine_step(
    target: &PhaseBench,
    batch: usize,
    seq_len: usize,
    steps: usize,
) -> Result<serde_json::Value> {
    let config =
        target.config(serde_json::json!({"batch": batch, "seq_len": seq_len, "steps": steps}));
    torch_engine_bench("train", config)
}

/// Runs `python -m zflow_torch.bench WHAT CONFIG` (the torch engine's own code, in its
/// Python) with `config`, which names the training settings (`train`) it times.
pub(crate) fn torch_engine_bench(
    what: &str,
    config: serde_json::Value,
) -> Result<serde_json::Value> {
    anyhow::ensure!(
        config.get("train").is_some(),
        "a torch engine bench needs the recipe's training settings"
    );
    torch_module_json("zflow_torch.bench", Some(what), &config)
}

/// Runs `python -m MODULE [WHAT] CONFIG_FILE` in the torch engine's Python with `config`
/// written to a temporary file; returns the JSON of its last stdout line.
pub(crate) fn torch_module_json(
    module: &str,
    what: Option<&str>,
    config: &serde_json::Value,
) -> Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, serde_json::to_vec(config)?)?;
    let mut args: Vec<std::ffi::OsString> = what.map(Into::into).into_iter().collect();
    args.push(cfg.into_os_string());
    let command = zflow_stages::engine::torch_module(module, args)?;
    let out = Command::new(&command.program)
        .args(&command.args)
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {}", command.program.display()))?;
    let label = match what {
        Some(w) => format!("python -m {module} {w}"),
        None => format!("python -m {module}"),
    };
    last_json_line(&out, &label)
}

/// The last stdout line of a finished benchmark process, parsed; its stderr's last line as
/// the error if it failed.
fn last_json_line(out: &std::process::Output, what: &str) -> Result<serde_json::Value> {
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::bail!("{what} failed: {}", err.lines().last().unwrap_or(""));
    }
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .to_string();
    serde_json::from_str(&line).with_context(|| format!("parsing {what}'s output: {line}"))
}

/// The optimizer loops of the plain PyTorch side (`scripts/bench_train_torch.py`): AdamW over
/// every parameter, and torch.optim.Muon over the hidden 2-D matrices with AdamW for the rest.
const STOCK_OPTIMIZERS: [&str; 2] = ["adamw", "muon"];

fn torch_step(
    model: &zflow_runtime::model::config::ModelConfig,
    batch: usize,
    seq_len: usize,
    steps: usize,
    threads: usize,
    optimizer: &str,
) -> Result<serde_json::Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_train_torch.py");
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("bench.json");
    let config = serde_json::json!({"model": model, "batch": batch, "seq_len": seq_len, "steps": steps, "threads": threads, "optimizer": optimizer});
    std::fs::write(&cfg, serde_json::to_vec(&config)?)?;
    // The torch engine's Python, with `zflow_torch` on the path for its config mapping.
    let python = zflow_stages::engine::torch_module("zflow_torch", Vec::new())?;
    let out = Command::new(&python.program)
        .arg(script)
        .arg(&cfg)
        .envs(python.env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {}", python.program.display()))?;
    last_json_line(&out, script)
}
