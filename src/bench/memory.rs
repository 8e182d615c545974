//! `zflow bench memory`: what the torch engine's memory settings cost and save on the recipe's
//! model. Each variant is the worker's own training step (`python -m zflow_torch.bench train`)
//! in a process of its own, so that each peak is its own: activation checkpointing `none`,
//! `full` and `selective` with the engine's chunked loss, and `none` with the loss made from the
//! full logits (plain transformers' way). The variants alternate within each round, so a change
//! in the machine's load shows as a spread between rounds, not as a difference between them.

use std::process::ExitCode;

use anyhow::Result;

use crate::RecipeArgs;

/// One variant: its label and what it adds to the benchmark's config.
const VARIANTS: [(&str, &str, &str); 4] = [
    ("checkpointing none, chunked loss", "none", "chunked"),
    ("checkpointing full, chunked loss", "full", "chunked"),
    (
        "checkpointing selective, chunked loss",
        "selective",
        "chunked",
    ),
    ("checkpointing none, full logits", "none", "full"),
];

/// Runs every variant `rounds` times; prints a row per variant and round.
pub fn run(
    args: &RecipeArgs,
    batch: usize,
    seq_len: usize,
    steps: usize,
    rounds: usize,
) -> Result<ExitCode> {
    let engine = crate::commands::open(args)?;
    let model = crate::commands::recipe_doc(&engine)?.model_or_default();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let chunk = zflow_runtime::contract::settings::TrainSettings::default().loss_chunk_tokens;
    println!(
        "model: {} (hidden {}, {} blocks, {} experts, vocab {}), batch {batch} x {seq_len} tokens, loss chunks of {chunk} positions, {threads} threads, {rounds} rounds",
        engine.recipe.name,
        model.hidden_size,
        model.num_blocks,
        model.num_experts,
        model.vocab_size
    );
    println!();
    println!(
        "{:<48} {:>10} {:>10} {:>16}",
        "", "step (s)", "tokens/s", "peak (MiB)"
    );
    for round in 1..=rounds {
        for (label, checkpointing, loss) in VARIANTS {
            let config = serde_json::json!({
                "model": model, "batch": batch, "seq_len": seq_len, "steps": steps,
                "threads": threads, "activation_checkpointing": checkpointing, "loss": loss,
            });
            match super::train::torch_engine_bench("train", config) {
                Ok(t) => println!(
                    "{:<48} {:>10.3} {:>10.0} {:>16.0}",
                    format!("{label}, round {round}"),
                    t["step_s"].as_f64().unwrap_or(0.0),
                    t["tokens_per_s"].as_f64().unwrap_or(0.0),
                    t["peak_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64
                ),
                Err(e) => println!("{label}: not run ({e:#})"),
            }
        }
    }
    println!();
    println!(
        "peak: the process's peak resident memory above its size once torch was loaded (the model, its gradients, the optimizer state and the step's activations)"
    );
    Ok(ExitCode::SUCCESS)
}
