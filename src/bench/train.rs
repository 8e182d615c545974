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

/// Runs the benchmark; prints a table with a row per side and round, and each round's ratio.
pub fn run(
    args: &RecipeArgs,
    batch: usize,
    seq_len: usize,
    steps: usize,
    rounds: usize,
) -> Result<ExitCode> {
    let (model, threads) = recipe_model(
        args,
        &format!("batch {batch} x {seq_len} tokens, {rounds} rounds"),
    )?;

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
        let engine_tps = match torch_engine_step(&model, batch, seq_len, steps, threads) {
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
            match torch_step(&model, batch, seq_len, steps, threads, optimizer) {
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
/// (`workload`) and its `rounds`.
pub(crate) fn recipe_model(
    args: &RecipeArgs,
    workload: &str,
) -> Result<(zflow_runtime::model::config::ModelConfig, usize)> {
    let engine = crate::commands::open(args)?;
    let model = crate::commands::recipe_doc(&engine)?.model_or_default();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "model: {} (hidden {}, {} blocks, {} experts, vocab {}), {workload}, {threads} threads",
        engine.recipe.name,
        model.hidden_size,
        model.num_blocks,
        model.num_experts,
        model.vocab_size
    );
    Ok((model, threads))
}

/// The torch engine's own step (`python -m zflow_torch.bench`), in the engine's Python.
fn torch_engine_step(
    model: &zflow_runtime::model::config::ModelConfig,
    batch: usize,
    seq_len: usize,
    steps: usize,
    threads: usize,
) -> Result<serde_json::Value> {
    let config = serde_json::json!({"model": model, "batch": batch, "seq_len": seq_len, "steps": steps, "threads": threads});
    torch_engine_bench("train", config)
}

/// Runs `python -m zflow_torch.bench WHAT CONFIG` (the torch engine's own code, in its
/// Python) with `config`, plus the default training settings where it has none; returns its
/// JSON line.
pub(crate) fn torch_engine_bench(
    what: &str,
    mut config: serde_json::Value,
) -> Result<serde_json::Value> {
    if config.get("train").is_none() {
        config["train"] =
            serde_json::to_value(zflow_runtime::contract::settings::TrainSettings::default())?;
    }
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
