//! `zflow bench step`: what the torch engine's memory and optimizer settings cost and save on
//! the recipe's model, each variant being the worker's own training step (`python -m
//! zflow_torch.bench`):
//! - activation checkpointing `none`, `full` and `selective`, with the engine's chunked loss;
//! - the loss made from the full logits (plain transformers' way);
//! - the matrices' optimizer: the engine's batched Muon (Newton-Schulz in the phase's
//!   `train.muon.ns_dtype`, and in the other format), torch.optim.Muon as shipped (one matrix
//!   at a time, bf16 Newton-Schulz), and AdamW (Muon's cost is the gap to it, measured in pairs
//!   of steps taken one after the other).
//!
//! The engine is the recipe's phase as `zflow run` resolves it (`--set` included).
//!
//! Times come from one process that holds every variant and steps them in turn (`bench
//! interleaved`): a shared machine's speed drifts by 10-25% within minutes, which separate runs
//! would read as differences between variants. Each peak comes from a process of its own
//! (`bench train`), so that it is that variant's alone.

use std::process::ExitCode;

use anyhow::{Context, Result};

use zflow_runtime::contract::settings::Dtype;

use super::median;
use crate::RecipeArgs;

/// One variant: its label, activation checkpointing, loss and the matrices' optimizer.
type Variant = (String, &'static str, &'static str, &'static str);

/// The engine as the phase configures it, and the same with AdamW for the matrices: Muon's
/// cost is the gap between the two.
const ENGINE: &str = "engine (checkpointing none)";
const ADAMW: &str = "AdamW for the matrices too";

/// The variants for a phase whose Newton-Schulz runs in `ns_dtype`. The engine and AdamW come
/// first, side by side: `bench interleaved` steps neighbours one after the other, each first in
/// every other round, so Muon's cost is measured in pairs.
fn variants(ns_dtype: Dtype) -> Vec<Variant> {
    let (other, optimizer) = match ns_dtype {
        Dtype::Bf16 => ("f32", "muon-f32"),
        Dtype::F32 => ("bf16", "muon-bf16"),
    };
    vec![
        (ENGINE.into(), "none", "chunked", "muon"),
        (ADAMW.into(), "none", "chunked", "adamw"),
        ("checkpointing full".into(), "full", "chunked", "muon"),
        (
            "checkpointing selective".into(),
            "selective",
            "chunked",
            "muon",
        ),
        ("loss from the full logits".into(), "none", "full", "muon"),
        (
            format!("Muon's Newton-Schulz in {other}"),
            "none",
            "chunked",
            optimizer,
        ),
        (
            "torch.optim.Muon as shipped".into(),
            "none",
            "chunked",
            "torch-muon",
        ),
    ]
}

/// Times every variant `steps` times in turn, then measures each one's peak; prints a row per
/// variant and Muon's cost over AdamW. `shape` is (sequences per step, tokens per sequence),
/// each the phase's unless given.
pub fn run(
    args: &RecipeArgs,
    phase: Option<&str>,
    shape: (Option<usize>, Option<usize>),
    steps: usize,
    loss_chunk_tokens: Option<usize>,
) -> Result<ExitCode> {
    let mut target = super::train::recipe_phase(args, phase)?;
    if let Some(chunk) = loss_chunk_tokens {
        target.train.settings.loss_chunk_tokens = chunk;
    }
    let (batch, seq_len) = target.shape(shape.0, shape.1);
    target.print(&format!(
        "batch {batch} x {seq_len} tokens, {steps} steps of each variant in turn"
    ));
    let variants = variants(target.train.settings.muon.ns_dtype);
    // The settings every run shares, plus `fields`.
    let config = |fields: serde_json::Value| {
        let mut config = target.config(serde_json::json!({"batch": batch, "seq_len": seq_len}));
        if let (Some(config), serde_json::Value::Object(fields)) = (config.as_object_mut(), fields)
        {
            config.extend(fields);
        }
        config
    };
    let variant = |(label, checkpointing, loss, optimizer): &Variant| {
        serde_json::json!({
            "label": label, "activation_checkpointing": checkpointing, "loss": loss,
            "optimizer": optimizer,
        })
    };
    let timed = super::train::torch_engine_bench(
        "interleaved",
        config(
            serde_json::json!({"variants": variants.iter().map(variant).collect::<Vec<_>>(), "steps": steps}),
        ),
    )?;
    // Each variant's step times, one per round, in `variants`' order.
    let rounds = variants
        .iter()
        .map(|(label, ..)| {
            timed["variants"]
                .as_array()
                .and_then(|all| all.iter().find(|t| t["label"] == *label))
                .and_then(|t| {
                    t["rounds_s"]
                        .as_array()?
                        .iter()
                        .map(|s| s.as_f64())
                        .collect()
                })
                .with_context(|| format!("`bench interleaved` gave no step times for {label}"))
        })
        .collect::<Result<Vec<Vec<f64>>>>()?;
    let tokens = (batch * seq_len) as f64;
    println!();
    println!(
        "{:<32} {:>16} {:>12} {:>10} {:>12}",
        "", "median step (s)", "fastest (s)", "tokens/s", "peak (MiB)"
    );
    for (v, steps) in variants.iter().zip(&rounds) {
        let mut one_step = variant(v);
        one_step["steps"] = 1.into();
        let peak = super::train::torch_engine_bench("train", config(one_step))
            .map(|p| {
                format!(
                    "{:.0}",
                    p["peak_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64
                )
            })
            .unwrap_or_else(|e| format!("not measured ({e:#})"));
        println!(
            "{:<32} {:>16.3} {:>12.3} {:>10.0} {:>12}",
            v.0,
            median(steps),
            steps.iter().copied().fold(f64::INFINITY, f64::min),
            tokens / median(steps),
            peak
        );
    }
    println!();
    let of = |label: &str| {
        variants
            .iter()
            .position(|v| v.0 == label)
            .map(|i| &rounds[i])
    };
    if let (Some(engine), Some(adamw)) = (of(ENGINE), of(ADAMW)) {
        // Each round's pair of steps ran within seconds of each other: their ratio is free of
        // the drift that moves a whole round.
        let ratios: Vec<f64> = engine.iter().zip(adamw).map(|(e, a)| e / a).collect();
        println!(
            "Muon's cost: the engine's step against the same step with AdamW for the matrices, the median of {} rounds' pairs: {:+.1}% (the medians' ratio: {:+.1}%)",
            ratios.len(),
            (median(&ratios) - 1.0) * 100.0,
            (median(engine) / median(adamw) - 1.0) * 100.0
        );
    }
    println!(
        "peak: the step's peak resident memory above the process's size after a warm-up step (the model and the optimizer's state): the gradients, activations, logits and the loss"
    );
    Ok(ExitCode::SUCCESS)
}
