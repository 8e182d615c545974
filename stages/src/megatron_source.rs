//! `megatron`: an existing Megatron-LM indexed dataset (`.bin` + `.idx`, tokenized by another
//! tool) used as a source: validated and copied as `tokens.bin` / `tokens.idx`, the same
//! output a `tokenize` stage writes, so mixtures read it like any other source.
//!
//! ```yaml
//! sources:
//!   legacy:
//!     url: /data/legacy        # a folder holding legacy_text_document.{bin,idx}
//!     format: megatron
//!     prefix: legacy_text_document   # optional when the folder holds one dataset
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{Stage, StageContext};
use zflow_runtime::data::megatron::IndexedDataset;

/// The `megatron` stage kind.
pub struct MegatronSource;

/// `megatron` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MegatronConfig {
    /// Dataset prefix (file name without `.bin`/`.idx`) inside the input folder; optional when
    /// there is exactly one dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The model's vocabulary (`model.vocab_size`, filled in from the recipe): every token id
    /// must lie below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
}

impl Stage for MegatronSource {
    type Config = MegatronConfig;
    const KIND: &'static str = "megatron";
    // v2: checks ids against the model's vocabulary and writes stats.json (max_token_id).
    const VERSION: u32 = 2;

    fn run(&self, c: &MegatronConfig, ctx: &StageContext) -> Result<()> {
        let input = ctx
            .inputs()
            .values()
            .next()
            .context("megatron needs its fetch stage as input")?;
        let prefix = find_prefix(input, c.prefix.as_deref())?;
        let ds = IndexedDataset::open(&prefix)?;
        tracing::info!(
            "{} sequences, {} tokens ({})",
            ds.num_sequences(),
            ds.total_tokens(),
            ds.dtype()
        );
        let max_token_id = ds.max_token_id()?;
        if let (Some(max), Some(vocab)) = (max_token_id, c.vocab_size) {
            ensure!(
                (max as usize) < vocab,
                "{}.bin holds token id {max}, beyond model.vocab_size {vocab}: this dataset was tokenized for a larger vocabulary",
                prefix.display()
            );
        }
        for ext in ["bin", "idx"] {
            let src = PathBuf::from(format!("{}.{ext}", prefix.display()));
            std::fs::copy(&src, ctx.out_dir().join(format!("tokens.{ext}")))
                .with_context(|| format!("copying {}", src.display()))?;
        }
        let stats = serde_json::json!({
            "sequences": ds.num_sequences(),
            "tokens": ds.total_tokens(),
            "dtype": ds.dtype().name(),
            "max_token_id": max_token_id,
        });
        std::fs::write(
            ctx.out_dir().join("stats.json"),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        Ok(())
    }
}

fn find_prefix(dir: &Path, prefix: Option<&str>) -> Result<PathBuf> {
    if let Some(p) = prefix {
        return Ok(dir.join(p));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .map(|p| p.with_extension(""))
        .collect();
    found.sort();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no Megatron dataset (.idx file) in {}", dir.display()),
        many => bail!(
            "{} holds {} datasets; set `prefix:` to one of: {}",
            dir.display(),
            many.len(),
            many.iter()
                .map(|p| p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
