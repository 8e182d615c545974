//! `tokenize.<source>`: an ingested source -> a Megatron indexed dataset (`tokens.bin` +
//! `tokens.idx`), one document per sequence, the EOD (`eos`) token after every document.
//!
//! Streaming: documents are read, encoded (in parallel, on the stage's threads) and written a
//! batch at a time, so memory stays bounded whatever the corpus size. The token dtype follows
//! the vocabulary size, as in Megatron.
//!
//! Every `holdout_every`-th document (by position in the ingested source) goes to a second
//! dataset, `heldout.bin` + `heldout.idx`, instead: trainers report held-out loss per source on
//! text they never train on.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::data::megatron::{DType, IndexedDatasetWriter};

use crate::docs;
use crate::encoder::Encoder;
use crate::tokenizer::TokenizerInfo;
use rayon::prelude::*;

/// The `tokenize` stage kind.
pub struct Tokenize;

/// `tokenize` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeConfig {
    /// Also put the `bos` token before every document.
    #[serde(default)]
    pub prepend_bos: bool,
    /// Documents per batch (memory bound; not part of the output).
    #[serde(default = "default_batch", skip_serializing)]
    pub batch_docs: usize,
    /// Hold out every N-th document (0 = none).
    #[serde(default = "default_holdout")]
    pub holdout_every: u64,
    /// Documents of the ingested input to leave out (a shard's duplicates of an earlier shard's
    /// documents; `sources.<name>.shards` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<SkipList>,
}

/// Documents to leave out: the drop list `file` (u64 document indices, [`crate::dedup`]) in
/// the output of input stage `input`. The stage's identity hashes that file only of `input`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipList {
    /// The stage (an input) whose output holds the list.
    pub input: String,
    /// Its path within that output.
    pub file: String,
}

fn default_batch() -> usize {
    2048
}

fn default_holdout() -> u64 {
    100
}

impl Stage for Tokenize {
    type Config = TokenizeConfig;
    const KIND: &'static str = "tokenize";
    const VERSION: u32 = 2;

    fn validate(&self, c: &TokenizeConfig, needs: &[String]) -> Result<(), ConfigError> {
        let want = 2 + usize::from(c.skip.is_some());
        if needs.len() != want {
            return Err(ConfigError::new(
                "needs",
                "tokenize reads an ingest stage and the tokenizer (and with `skip`, its input)",
            ));
        }
        if let Some(skip) = &c.skip
            && !needs.contains(&skip.input)
        {
            return Err(ConfigError::new(
                "skip.input",
                format!("`{}` is not one of the stage's inputs", skip.input),
            ));
        }
        if c.batch_docs == 0 {
            return Err(ConfigError::new("batch_docs", "must be at least 1"));
        }
        Ok(())
    }

    fn resources(&self, _c: &TokenizeConfig) -> zflow_pipeline::Resources {
        zflow_pipeline::Resources {
            cpus: 2,
            ..Default::default()
        }
    }

    fn reads_only(&self, c: &TokenizeConfig, input: &str) -> Option<zflow_pipeline::FileFilter> {
        let skip = c.skip.as_ref().filter(|s| s.input == input)?;
        let file = skip.file.clone();
        Some(Box::new(move |path: &str| path == file))
    }

    fn run(&self, c: &TokenizeConfig, ctx: &StageContext) -> Result<()> {
        let skip = match &c.skip {
            Some(s) => crate::dedup::read_drops(&ctx.input(&s.input)?.join(&s.file))?,
            None => Vec::new(),
        };
        let (mut documents, mut tok_dir) = (None, None);
        for dir in ctx.inputs().values() {
            if dir.join("documents.parquet").exists() {
                documents = Some(dir.join("documents.parquet"));
            } else if dir.join("tokenizer.json").exists() {
                tok_dir = Some(dir.clone());
            }
        }
        let (Some(documents), Some(tok_dir)) = (documents, tok_dir) else {
            bail!(
                "tokenize needs an ingest stage's documents.parquet and a tokenizer stage's tokenizer.json as inputs"
            );
        };
        ctx.progress().set_length(docs::count(&documents)?);
        let out = ctx.out_dir().join("tokens");
        let stats =
            tokenize_documents(&documents, &tok_dir, &out, c, &skip, ctx.threads(), &|n| {
                ctx.progress().inc(n);
                ctx.check_cancelled()
            })?;
        std::fs::write(
            ctx.out_dir().join("stats.json"),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        tracing::info!(
            "{} documents, {} tokens; held out {} documents, {} tokens",
            stats.documents,
            stats.tokens,
            stats.heldout_documents,
            stats.heldout_tokens
        );
        Ok(())
    }
}

/// What [`tokenize_documents`] wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenizeStats {
    /// Documents (held-out ones not included).
    pub documents: u64,
    /// Tokens, EOD (and BOS) included.
    pub tokens: u64,
    /// Documents in the held-out dataset.
    #[serde(default)]
    pub heldout_documents: u64,
    /// Tokens in the held-out dataset.
    #[serde(default)]
    pub heldout_tokens: u64,
    /// Bytes of text read.
    pub bytes: u64,
    /// `bytes / tokens`.
    pub bytes_per_token: f64,
    /// Token dtype of the dataset.
    pub dtype: String,
    /// Size of the `.bin` file.
    pub bin_bytes: u64,
    /// Tokens in the tokenizer's vocabulary: every id is below it ([`crate::token_ids`]).
    #[serde(default)]
    pub vocab_size: Option<u64>,
}

/// Tokenizes `documents` (an ingest stage's Parquet file) with the tokenizer in `tok_dir` into
/// the Megatron dataset `out_prefix` (`.bin` + `.idx`), every `holdout_every`-th document into
/// `heldout` next to it, leaving out the documents at the (ascending) indices `skip`, streaming
/// a batch at a time on `threads` threads. `batch_done` is called after each batch with its
/// number of documents (progress); an error from it (cancellation) stops the work. Shared by the
/// stage and `zflow bench tokenize`.
pub fn tokenize_documents(
    documents: &std::path::Path,
    tok_dir: &std::path::Path,
    out_prefix: &std::path::Path,
    c: &TokenizeConfig,
    skip: &[u64],
    threads: usize,
    batch_done: &dyn Fn(u64) -> Result<()>,
) -> Result<TokenizeStats> {
    let info = TokenizerInfo::read(tok_dir)?;
    let tokenizer = Tokenizer::from_file(tok_dir.join("tokenizer.json")).map_err(|e| {
        anyhow::anyhow!("loading {}: {e}", tok_dir.join("tokenizer.json").display())
    })?;
    let encoder = Encoder::new(&tokenizer);
    let dtype = DType::for_vocab(info.vocab_size);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?;
    let mut writer = IndexedDatasetWriter::create(out_prefix, dtype)?;
    let mut heldout = match c.holdout_every {
        0 => None,
        _ => Some(IndexedDatasetWriter::create(
            &out_prefix.with_file_name("heldout"),
            dtype,
        )?),
    };
    let (mut n_docs, mut n_tokens, mut n_bytes) = (0u64, 0u64, 0u64);
    let (mut h_docs, mut h_tokens, mut position) = (0u64, 0u64, 0u64);
    // The index in `documents` of the next document read, and the skip entries not yet passed.
    let (mut read, mut skip) = (0u64, skip.iter().peekable());
    let mut ids: Vec<u32> = Vec::new();
    // Read the next batch while this one is encoded: reading Parquet then cost ~15% of the
    // time on corpora of short documents.
    let batches = docs::stream(documents, c.batch_docs)?;
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<String>>>(1);
        scope.spawn(move || {
            for batch in batches {
                if tx.send(batch).is_err() {
                    break;
                }
            }
        });
        for batch in rx {
            let mut texts = batch?;
            let count = texts.len() as u64;
            if skip.peek().is_some() {
                texts.retain(|_| {
                    let at = read;
                    read += 1;
                    let left_out = skip.next_if_eq(&&at).is_some();
                    !left_out
                });
            } else {
                read += count;
            }
            n_bytes += texts.iter().map(|t| t.len() as u64).sum::<u64>();
            let encodings: Vec<Vec<u32>> = pool
                .install(|| {
                    texts
                        .par_iter()
                        .map(|t| {
                            let mut ids = Vec::new();
                            encoder.encode_into(t, &mut ids).map(|()| ids)
                        })
                        .collect::<Result<_>>()
                })
                .with_context(|| format!("encoding documents {n_docs}.."))?;
            for enc in &encodings {
                ids.clear();
                if c.prepend_bos {
                    ids.push(info.bos_id);
                }
                ids.extend_from_slice(enc);
                ids.push(info.eos_id);
                position += 1;
                match &mut heldout {
                    Some(h) if position % c.holdout_every == 0 => {
                        h_docs += 1;
                        h_tokens += ids.len() as u64;
                        h.add_document(&ids).context("writing held-out tokens")?;
                    }
                    _ => {
                        n_docs += 1;
                        n_tokens += ids.len() as u64;
                        writer.add_document(&ids).context("writing tokens")?;
                    }
                }
            }
            batch_done(count)?;
        }
        Ok(())
    })?;
    if let Some(at) = skip.next() {
        bail!(
            "{}: the documents to leave out name document {at} (or name one twice), but the \
             documents end at {read}",
            documents.display()
        );
    }
    let summary = writer.finish()?;
    if let Some(h) = heldout {
        h.finish()?;
    }
    Ok(TokenizeStats {
        documents: n_docs,
        tokens: n_tokens,
        heldout_documents: h_docs,
        heldout_tokens: h_tokens,
        bytes: n_bytes,
        bytes_per_token: n_bytes as f64 / n_tokens.max(1) as f64,
        dtype: dtype.name().to_string(),
        bin_bytes: summary.bin_bytes,
        vocab_size: Some(info.vocab_size as u64),
    })
}
