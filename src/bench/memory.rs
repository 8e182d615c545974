//! `zflow bench memory`: `zflow size`'s memory model against the torch engine's measured peak,
//! phase by phase, on this machine's CPU. Each phase runs its own training set-up (model,
//! settings, micro-batch, sequence length, activation checkpointing, context parallelism) for
//! `--steps` steps on random tokens (`python -m zflow_torch.bench memory`), on as many ranks as
//! the phase has, and the table shows the prediction, the largest rank's measured peak and the
//! error. The phases' own `train.backend` is set aside: the measurement runs on the CPU, and so
//! does the prediction it is compared with.

use std::process::ExitCode;

use anyhow::{Result, bail};
use zflow_runtime::size::memory::{Device, RankSetup};

use crate::RecipeArgs;

/// Measures every phase; prints a row each, or one JSON object with `--json`
/// (`{"phases": [{"name", "predicted_bytes", "measured_bytes", "error"}]}`).
pub fn run(args: &RecipeArgs, steps: usize, json: bool) -> Result<ExitCode> {
    let engine = crate::commands::open(args)?;
    let doc = crate::commands::recipe_doc(&engine)?;
    if doc.phases.is_empty() {
        bail!(
            "{}: the recipe has no phases to measure",
            engine.recipe.name
        );
    }
    let model = doc.model_or_default();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if !json {
        println!(
            "{:<12} {:>8} {:>6} {:>10} {:>14} {:>14} {:>8}",
            "phase", "tokens", "ranks", "checkpt", "predicted MiB", "measured MiB", "error"
        );
    }
    let mut rows = Vec::new();
    for entry in &doc.phases {
        let setup = RankSetup {
            device: Device::Cpu,
            ..entry.train.rank_setup(entry.phase.seq_len)
        };
        let predicted = model.engine_memory(&setup).peak_bytes_per_rank;
        let world = setup.world();
        let config = serde_json::json!({
            "model": model,
            "train": entry.train.settings,
            "batch": setup.micro_batch,
            "seq_len": setup.seq_len,
            "steps": steps,
            "threads": (threads / world).max(1),
            "ranks": world,
            "context_parallel": setup.context_parallel,
            "activation_checkpointing": setup.activation_checkpointing,
        });
        let measured = super::train::torch_engine_bench("memory", config)?["peak_bytes"]
            .as_u64()
            .unwrap_or(0);
        let error = (predicted as f64 - measured as f64) / measured.max(1) as f64;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        if !json {
            println!(
                "{:<12} {:>8} {:>6} {:>10} {:>14.0} {:>14.0} {:>+7.1}%",
                entry.name,
                setup.tokens_per_rank(),
                world,
                format!("{:?}", setup.activation_checkpointing).to_lowercase(),
                mib(predicted),
                mib(measured),
                100.0 * error
            );
        }
        rows.push(serde_json::json!({
            "name": entry.name, "predicted_bytes": predicted, "measured_bytes": measured,
            "error": error, "setup": setup,
        }));
    }
    if json {
        println!("{}", serde_json::json!({ "phases": rows }));
    } else {
        println!();
        println!(
            "measured: the largest rank's peak resident memory above its size before the model was built (runtime/src/size/memory.rs lists what the prediction counts)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
