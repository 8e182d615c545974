//! `zflow bench train`: the training step of a recipe's model, against this machine's matmul
//! peak and against the same model and step in PyTorch (`scripts/bench_train_torch.py`), in
//! one run. PyTorch is used when `python3` can import it (`ZFLOW_TORCH_PYTHON` picks another
//! interpreter); zflow does not install it (a ~1 GB download).

use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::RecipeArgs;

/// Runs the benchmark; prints a table.
pub fn run(args: &RecipeArgs, batch: usize, seq_len: usize, steps: usize) -> Result<ExitCode> {
    let engine = crate::commands::open(args)?;
    let model = zflow_stages::model::ModelSection::config(&engine.recipe.document)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "model: {} (hidden {}, {} blocks, {} experts, vocab {}), batch {batch} x {seq_len} tokens, {threads} threads",
        engine.recipe.name,
        model.hidden_size,
        model.num_blocks,
        model.num_experts,
        model.vocab_size
    );

    let peak = zflow_runtime::bench::matmul_gflops(1024, 5);
    let zflow = zflow_runtime::bench::train_step_throughput(&model, batch, seq_len, steps);
    let achieved = zflow.tokens_per_s * zflow.flops_per_token as f64 / 1e9;

    let torch = torch_step(&model, batch, seq_len, steps, threads);
    println!();
    println!(
        "{:<34} {:>12} {:>12} {:>14} {:>10}",
        "", "step (s)", "tokens/s", "model GFLOP/s", "of peak"
    );
    println!(
        "{:<34} {:>12} {:>12} {:>14.1} {:>9.0}%",
        "matmul 1024^3 (burn flex, f32)", "", "", peak, 100.0
    );
    println!(
        "{:<34} {:>12.3} {:>12.0} {:>14.1} {:>9.1}%",
        "zflow train step (burn flex)",
        zflow.step_s,
        zflow.tokens_per_s,
        achieved,
        100.0 * achieved / peak
    );
    match &torch {
        Ok(t) => {
            let tps = t["tokens_per_s"].as_f64().unwrap_or(0.0);
            let g = tps * zflow.flops_per_token as f64 / 1e9;
            let label = format!(
                "PyTorch {} ({})",
                t["torch"].as_str().unwrap_or("?"),
                t["optimizer"].as_str().unwrap_or("?")
            );
            println!(
                "{:<34} {:>12.3} {:>12.0} {:>14.1} {:>9.1}%",
                label,
                t["step_s"].as_f64().unwrap_or(0.0),
                tps,
                g,
                100.0 * g / peak
            );
            println!();
            println!("zflow / PyTorch: {:.2}x", zflow.tokens_per_s / tps);
        }
        Err(e) => println!("PyTorch: not run ({e:#})"),
    }
    println!(
        "model FLOPs per token (forward + backward): {:.1} M",
        zflow.flops_per_token as f64 / 1e6
    );
    Ok(ExitCode::SUCCESS)
}

fn torch_step(
    model: &zflow_runtime::size::ModelConfig,
    batch: usize,
    seq_len: usize,
    steps: usize,
    threads: usize,
) -> Result<serde_json::Value> {
    let python = std::env::var("ZFLOW_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_train_torch.py");
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("bench.json");
    let config = serde_json::json!({"model": model, "batch": batch, "seq_len": seq_len, "steps": steps, "threads": threads});
    std::fs::write(&cfg, serde_json::to_vec(&config)?)?;
    let out = Command::new(&python)
        .arg(script)
        .arg(&cfg)
        .output()
        .with_context(|| format!("running {python}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::bail!(
            "{python} {script} failed: {}",
            err.lines().last().unwrap_or("")
        );
    }
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .to_string();
    serde_json::from_str(&line)
        .with_context(|| format!("parsing the PyTorch benchmark's output: {line}"))
}
