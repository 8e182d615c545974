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

use anyhow::{Context, Result, bail};
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
}

impl Stage for MegatronSource {
    type Config = MegatronConfig;
    const KIND: &'static str = "megatron";
    const VERSION: u32 = 1;

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
        for ext in ["bin", "idx"] {
            let src = PathBuf::from(format!("{}.{ext}", prefix.display()));
            std::fs::copy(&src, ctx.out_dir().join(format!("tokens.{ext}")))
                .with_context(|| format!("copying {}", src.display()))?;
        }
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
