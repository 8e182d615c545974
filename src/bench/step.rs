//! `zflow bench step`: what the torch engine's memory and optimizer settings cost and save on
//! the recipe's model. Each variant is the worker's own training step (`python -m
//! zflow_torch.bench train`) in a process of its own, so that each peak is its own:
//! - activation checkpointing `none`, `full` and `selective`, with the engine's chunked loss;
//! - the loss made from the full logits (plain transformers' way);
//! - the matrices' optimizer: the engine's batched Muon (Newton-Schulz in bf16, the default
//!   `train.muon.ns_dtype`, and in f32), torch.optim.Muon as shipped (one matrix at a time,
//!   bf16 Newton-Schulz), and AdamW (Muon's cost is the gap to it).
//!
//! The variants alternate within each round, so a change in the machine's load shows as a
//! spread between rounds, not as a difference between them.

use std::process::ExitCode;

use anyhow::Result;

use crate::RecipeArgs;

/// One variant: its label, activation checkpointing, loss and the matrices' optimizer.
const VARIANTS: [(&str, &str, &str, &str); 7] = [
    ("engine (checkpointing none)", "none", "chunked", "muon"),
    ("checkpointing full", "full", "chunked", "muon"),
    ("checkpointing selective", "selective", "chunked", "muon"),
    ("loss from the full logits", "none", "full", "muon"),
    ("Muon's Newton-Schulz in f32", "none", "chunked", "muon-f32"),
    (
        "torch.optim.Muon as shipped",
        "none",
        "chunked",
        "torch-muon",
    ),
    ("AdamW for the matrices too", "none", "chunked", "adamw"),
];

/// Runs every variant `rounds` times; prints a row per variant and round.
pub fn run(
    args: &RecipeArgs,
    batch: usize,
    seq_len: usize,
    steps: usize,
    rounds: usize,
    loss_chunk_tokens: Option<usize>,
) -> Result<ExitCode> {
    let mut train = zflow_runtime::contract::settings::TrainSettings::default();
    if let Some(chunk) = loss_chunk_tokens {
        train.loss_chunk_tokens = chunk;
    }
    let chunk = train.loss_chunk_tokens;
    let workload = format!("batch {batch} x {seq_len} tokens, loss chunks of {chunk} positions");
    let (model, threads) = super::train::recipe_model(args, &workload, rounds)?;
    println!();
    println!(
        "{:<48} {:>10} {:>10} {:>16}",
        "", "step (s)", "tokens/s", "peak (MiB)"
    );
    for round in 1..=rounds {
        for (label, checkpointing, loss, optimizer) in VARIANTS {
            let config = serde_json::json!({
                "model": model, "batch": batch, "seq_len": seq_len, "steps": steps,
                "threads": threads, "activation_checkpointing": checkpointing, "loss": loss,
                "optimizer": optimizer, "train": train,
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
        "peak: the step's peak resident memory above the process's size after a warm-up step (the model and the optimizer's state): the gradients, activations, logits and the loss"
    );
    Ok(ExitCode::SUCCESS)
}
