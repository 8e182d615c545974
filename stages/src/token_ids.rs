//! Token ids against the model's vocabulary, checked before any rank starts: an id at or
//! beyond `model.vocab_size` would index past the embedding (an index error in the worker,
//! on every relaunch).
//!
//! A tokenized source's bound comes from its `stats.json`: the tokenizer's vocabulary for a
//! `tokenize` stage (`vocab_size`), the largest id found for a `megatron` one (`max_token_id`).
//! A source folder without either (written by an older zflow) is read through.

use std::path::Path;

use anyhow::{Context, Result};
use zflow_runtime::contract::exit::Fatal;
use zflow_runtime::data::megatron::IndexedDataset;

/// What bounds a source's token ids, and how that is known.
#[derive(Debug, PartialEq)]
pub enum Bound {
    /// Ids come from a tokenizer with this many tokens.
    Tokenizer(u64),
    /// The largest id in the data (`None`: no tokens at all).
    MaxId(Option<u64>),
}

impl Bound {
    /// The smallest vocabulary that holds every id.
    pub fn vocab_needed(&self) -> u64 {
        match self {
            Bound::Tokenizer(n) => *n,
            Bound::MaxId(max) => max.map_or(0, |m| m + 1),
        }
    }
}

/// The bound of the token ids in a `tokenize` or `megatron` stage's output folder.
pub fn bound(source_dir: &Path) -> Result<Bound> {
    let stats_path = source_dir.join("stats.json");
    if let Ok(bytes) = std::fs::read(&stats_path) {
        let stats: serde_json::Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing {}", stats_path.display()))?;
        if let Some(n) = stats.get("vocab_size").and_then(|v| v.as_u64()) {
            return Ok(Bound::Tokenizer(n));
        }
        if let Some(max) = stats.get("max_token_id") {
            return Ok(Bound::MaxId(max.as_u64()));
        }
    }
    let mut max = None;
    for name in ["tokens", "heldout"] {
        let prefix = source_dir.join(name);
        if prefix.with_extension("idx").exists() {
            max = max.max(IndexedDataset::open(&prefix)?.max_token_id()?);
        }
    }
    Ok(Bound::MaxId(max.map(u64::from)))
}

/// Fails (with an error no relaunch retries) when source `name`'s ids do not fit a model
/// vocabulary of `vocab_size`, naming both sizes and what to change.
pub fn check(name: &str, source_dir: &Path, vocab_size: usize) -> Result<()> {
    let bound = bound(source_dir)?;
    if bound.vocab_needed() <= vocab_size as u64 {
        return Ok(());
    }
    let why = match bound {
        Bound::Tokenizer(n) => format!(
            "its tokenizer has {n} tokens, more than model.vocab_size {vocab_size}: set model.vocab_size to at least {n}, or tokenizer.train.vocab_size to at most {vocab_size}"
        ),
        Bound::MaxId(max) => format!(
            "it holds token id {}, beyond model.vocab_size {vocab_size}: set model.vocab_size to at least {}, or use data tokenized for this vocabulary",
            max.unwrap_or(0),
            bound.vocab_needed()
        ),
    };
    Err(Fatal(format!("source `{name}`: {why}")).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zflow_runtime::data::megatron::{DType, IndexedDatasetWriter};

    #[test]
    fn bounds_from_stats_or_from_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = IndexedDatasetWriter::create(&dir.path().join("tokens"), DType::U16).unwrap();
        w.add_document(&[3, 700, 5]).unwrap();
        w.finish().unwrap();
        assert_eq!(bound(dir.path()).unwrap(), Bound::MaxId(Some(700)));
        let err = format!("{:#}", check("legacy", dir.path(), 512).unwrap_err());
        assert!(
            err.contains("source `legacy`: it holds token id 700, beyond model.vocab_size 512"),
            "{err}"
        );
        check("legacy", dir.path(), 701).unwrap();

        std::fs::write(dir.path().join("stats.json"), r#"{"vocab_size": 1024}"#).unwrap();
        let err = check("web", dir.path(), 512).unwrap_err();
        assert_eq!(
            zflow_runtime::contract::exit::Failure::of(&err),
            zflow_runtime::contract::exit::Failure::Fatal
        );
        assert!(
            format!("{err:#}")
                .contains("its tokenizer has 1024 tokens, more than model.vocab_size 512"),
            "{err:#}"
        );
    }
}
