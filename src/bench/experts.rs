//! `zflow bench experts`: the MoE layer's expert paths (`workers/torch/zflow_torch/model.py`:
//! `loop`, one matrix product per expert after a host sync; `grouped`, `torch._grouped_mm`;
//! `padded` and `padded_max`, batched products over padded expert slots) timed against each
//! other on one layer of the recipe's model, on this machine's CPU or its GPU
//! (`python -m zflow_torch.experts_bench`, which checks every path against `loop` first). It
//! prints a row per path and the fastest correct one, and with `--out` writes the whole result
//! as JSON, the record of which path this machine should run.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::RecipeArgs;

/// Times every path on `tokens` tokens; `device` is `cpu` or `cuda`.
pub fn run(
    args: &RecipeArgs,
    tokens: usize,
    device: &str,
    rounds: usize,
    out: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let workload = format!("{tokens} tokens through one MoE layer on {device}");
    let (model, threads) =
        super::train::recipe_model(args, &format!("{workload}, {rounds} rounds"))?;
    let config = serde_json::json!({
        "hidden": model.hidden_size, "expert_ffn": model.expert_ffn,
        "num_experts": model.num_experts, "router_dim": model.router_dim,
        "skip_output": model.skip_output, "tokens": tokens, "device": device,
        "dtype": if device == "cpu" { "float32" } else { "bfloat16" },
        "rounds": rounds, "threads": threads,
    });
    let result = super::train::torch_module_json("zflow_torch.experts_bench", None, &config)?;
    println!(
        "{:<12} {:>6} {:>9} {:>12} {:>12} {:>12}",
        "path", "ok", "bitwise", "max rel err", "s/step", "tokens/s"
    );
    for p in result["paths"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        match p["error"].as_str() {
            Some(e) => println!("{name:<12} {:>6} not run here: {e}", "no"),
            None => println!(
                "{name:<12} {:>6} {:>9} {:>12.1e} {:>12.4} {:>12.0}",
                if p["ok"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                },
                if p["bitwise"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                },
                p["max_rel_err"].as_f64().unwrap_or(f64::NAN),
                p["seconds_per_step"].as_f64().unwrap_or(f64::NAN),
                p["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            ),
        }
    }
    println!(
        "fastest correct path on {}: {}",
        result["device"].as_str().unwrap_or(device),
        result["fastest"].as_str().unwrap_or("none")
    );
    if let Some(out) = out {
        std::fs::write(out, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
