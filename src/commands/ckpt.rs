//! `zflow ckpt export|import|reshape`: checkpoints to and from Hugging Face folders, and
//! re-partitioned for another number of ranks.

use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zflow_pipeline::{LoadOptions, recipe};

/// `zflow ckpt export --format hf`: the model the checkpoint was trained with (its model.json,
/// or the train job next to it); `recipe`'s `model:` only for a checkpoint that records neither.
pub fn ckpt_export(
    checkpoint: &Path,
    out: &Path,
    layout: zflow_runtime::hf::Layout,
    tokenizer: Option<PathBuf>,
    recipe: Option<&Path>,
) -> Result<ExitCode> {
    let model = match (zflow_runtime::checkpoint::model_config(checkpoint), recipe) {
        (Ok(model), _) => model,
        (Err(_), Some(path)) => {
            let opts = LoadOptions {
                sets: Vec::new(),
                store: None,
            };
            let recipe = recipe::load(path, &opts, &zflow_stages::registry())?;
            zflow_stages::recipe::RecipeDoc::parse(&recipe.document)
                .map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path, e.message))?
                .model_or_default()
        }
        (Err(e), None) => return Err(e),
    };
    let opts = zflow_runtime::hf::ExportOptions {
        tokenizer,
        layout,
        ..Default::default()
    };
    zflow_runtime::hf::export_hf(checkpoint, &model, &opts, out)?;
    println!(
        "exported {} to {} (Hugging Face, model_type zaya, {layout} layout)",
        checkpoint.display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `zflow ckpt import`: a Hugging Face ZAYA1 folder as a zflow checkpoint.
pub fn ckpt_import(hf: &Path, out: &Path) -> Result<ExitCode> {
    let model = zflow_runtime::hf::import_hf(hf, out)?;
    println!(
        "imported {} to {} ({} blocks, hidden {}, {} experts)",
        hf.display(),
        out.display(),
        model.num_blocks,
        model.hidden_size,
        model.num_experts
    );
    Ok(ExitCode::SUCCESS)
}

/// `zflow ckpt reshape IN OUT --dp N`.
pub fn ckpt_reshape(input: &Path, out: &Path, dp: usize) -> Result<ExitCode> {
    let layout = zflow_runtime::checkpoint::layout::reshape(input, out, dp)?;
    let load: Vec<String> = layout
        .load()
        .iter()
        .map(|n| format!("{:.2}M", *n as f64 / 1e6))
        .collect();
    println!(
        "{} -> {}: optimizer state over {} data-parallel rank(s) ({} parameters each)",
        input.display(),
        out.display(),
        layout.dp,
        load.join(" / ")
    );
    Ok(ExitCode::SUCCESS)
}
