//! `megatron`: an existing Megatron-LM indexed dataset (`.bin` + `.idx`, tokenized by another
//! tool) used as a source, read where it is: validated once (every sequence, every id against
//! the vocabulary), then recorded in [`IN_PLACE`] (its path, and each file's size, BLAKE3 and
//! stat fingerprint) instead of copied. Readers find a source's dataset through
//! [`tokens_prefix`], which takes a `tokenize` stage's `tokens` and this stage's record alike,
//! and refuses a dataset that changed after it was validated. A local dataset's fetch is in
//! place too (`sources:` sets it), so no byte of it is copied into the store.
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

use crate::fetch::in_place;

/// The record of a dataset read in place, in a `megatron` stage's output.
pub const IN_PLACE: &str = "tokens.in-place.json";

/// A dataset read in place: where it is, and what its files were when they were validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InPlaceDataset {
    /// The dataset's prefix (the path of its `.bin` and `.idx` without the extension).
    pub prefix: PathBuf,
    /// The `.bin` file.
    pub bin: RecordedFile,
    /// The `.idx` file.
    pub idx: RecordedFile,
}

/// One file of a dataset read in place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedFile {
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3 (hex) of the content: part of the output's content hash, so a changed dataset
    /// changes every identity downstream.
    pub blake3: String,
    /// [`in_place::stat_fingerprint`] when validated: any write since changes it.
    pub fingerprint: String,
}

/// The token dataset of a `tokenize` or `megatron` stage's output folder `dir`: `dir/tokens`,
/// or the dataset [`IN_PLACE`] records, after checking (by its files' stat fingerprints, no
/// byte read) that it has not changed since it was validated.
pub fn tokens_prefix(dir: &Path) -> Result<PathBuf> {
    let record = dir.join(IN_PLACE);
    if !record.exists() {
        return Ok(dir.join("tokens"));
    }
    let ds: InPlaceDataset = serde_json::from_slice(
        &std::fs::read(&record).with_context(|| format!("reading {}", record.display()))?,
    )
    .with_context(|| format!("parsing {}", record.display()))?;
    for (ext, file) in [("bin", &ds.bin), ("idx", &ds.idx)] {
        let path = PathBuf::from(format!("{}.{ext}", ds.prefix.display()));
        let now = in_place::stat_fingerprint(&path).ok();
        ensure!(
            now.as_deref() == Some(file.fingerprint.as_str()),
            "{} changed (or went) after its `megatron` stage validated it ({} bytes, blake3 \
             {}): run again, and the stage validates it anew",
            path.display(),
            file.size,
            &file.blake3[..file.blake3.len().min(16)]
        );
    }
    Ok(ds.prefix)
}

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
    // v3: reads the dataset in place (tokens.in-place.json) instead of copying it.
    const VERSION: u32 = 3;

    fn run(&self, c: &MegatronConfig, ctx: &StageContext) -> Result<()> {
        let input = ctx
            .inputs()
            .values()
            .next()
            .context("megatron needs its fetch stage as input")?;
        let named = find_prefix(input, c.prefix.as_deref())?;
        // The fetch's files, or the files its pointers name when it read them in place.
        let resolve = |ext: &str| {
            let file = PathBuf::from(format!("{}.{ext}", named.display()));
            in_place::resolve(input, &file, ctx.cache_dir(), ctx.cwd())
        };
        let (bin, idx) = (resolve("bin")?, resolve("idx")?);
        ensure!(
            bin.with_extension("") == idx.with_extension(""),
            "{} and {} are a Megatron dataset's files only side by side, with one prefix",
            bin.display(),
            idx.display()
        );
        let prefix = std::path::absolute(idx.with_extension(""))?;
        // Stat before reading: a write while the dataset is validated changes the fingerprint.
        let fingerprints = (
            in_place::stat_fingerprint(&bin)?,
            in_place::stat_fingerprint(&idx)?,
        );
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
        let record = |path: &Path, fingerprint: String| -> Result<RecordedFile> {
            let (size, blake3, _) = in_place::content_hash(ctx.cache_dir(), path)?;
            Ok(RecordedFile {
                size,
                blake3,
                fingerprint,
            })
        };
        let recorded = InPlaceDataset {
            bin: record(&bin, fingerprints.0)?,
            idx: record(&idx, fingerprints.1)?,
            prefix,
        };
        std::fs::write(
            ctx.out_dir().join(IN_PLACE),
            serde_json::to_vec_pretty(&recorded)?,
        )?;
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
