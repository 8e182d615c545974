//! The GGUF adapter: published quantized Gemma 3 and Llama models as [`LanguageModel`]s. The
//! forward pass and its kernels are the `zflow_gguf` crate; this side packs requests, reads the
//! tokenizer from the file and turns logits into scores.
//!
//! Scoring packs each batch of request groups into one sequence ([`pack`]): every question's
//! context is computed once and shared by its choices, and all rows of a batch go through each
//! weight matrix in one quantized matrix product. Logits are computed only at the rows that
//! predict a continuation token (a 262k-word output layer is most of a small model's work).

pub mod pack;
pub mod tokenizer;

pub use zflow_gguf::{config, model};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use candle_core::quantized::gguf_file;

use crate::model::{LanguageModel, Score, TokenRequest};
use crate::tokenizer::Tokenizer;

/// Bumped whenever a change here can change a score, so cached results are not reused.
pub const ADAPTER_VERSION: u32 = 2;

/// Rows of logits computed at once (bounds memory: with the integer kernel, 16 bytes a row per
/// 256 words of the vocabulary, 4 MiB for 262144 words; otherwise the logits, 256 MiB).
const LOGIT_ROWS: usize = 256;

/// A GGUF model with its tokenizer.
pub struct GgufModel {
    model: model::Model,
    tokenizer: Tokenizer,
    identity: String,
    max_length: usize,
    /// Where it was loaded from.
    pub path: PathBuf,
}

impl GgufModel {
    /// Loads `path`; `tokenizer_json` is required for SentencePiece vocabularies (Gemma).
    /// `max_length` caps the context (default: the model's training context).
    pub fn load(
        path: &Path,
        tokenizer_json: Option<&Path>,
        max_length: Option<usize>,
    ) -> Result<Self> {
        Self::load_with(path, tokenizer_json, max_length, true)
    }

    /// As [`GgufModel::load`]; `dense: false` keeps only candle's quantized weights (a quarter of the
    /// memory, much slower scoring; see `model::Linear`).
    pub fn load_with(
        path: &Path,
        tokenizer_json: Option<&Path>,
        max_length: Option<usize>,
        dense: bool,
    ) -> Result<Self> {
        let mut file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let content = gguf_file::Content::read(&mut file)
            .with_context(|| format!("{}: not a GGUF file", path.display()))?;
        let cfg =
            config::Config::from_gguf(&content).with_context(|| path.display().to_string())?;
        let tokenizer = tokenizer::load(&content, tokenizer_json)?;
        let model = model::Model::load(path, &content, cfg, dense)?;
        let file_hash = zflow_files::hash::file(path)?.1;
        let kernels = if dense { "int16" } else { "quantized" };
        let identity = format!(
            "gguf-adapter-v{ADAPTER_VERSION}:{kernels}:{file_hash}:{}",
            tokenizer.identity()
        );
        let max_length = max_length
            .unwrap_or(model.cfg.context_length)
            .min(model.cfg.context_length);
        Ok(GgufModel {
            model,
            tokenizer,
            identity,
            max_length,
            path: path.to_path_buf(),
        })
    }

    /// The architecture and sizes.
    pub fn config(&self) -> &config::Config {
        &self.model.cfg
    }
}

impl LanguageModel for GgufModel {
    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn max_length(&self) -> usize {
        self.max_length
    }

    fn loglikelihood(&mut self, groups: &[Vec<TokenRequest>]) -> Result<Vec<Vec<Score>>> {
        if groups
            .iter()
            .flatten()
            .any(|r| r.context.is_empty() || r.continuation.is_empty())
        {
            bail!("a request with an empty context or continuation");
        }
        let packed = pack::pack(groups);
        let t0 = std::time::Instant::now();
        let hidden = self.model.hidden_packed(&packed, None)?;
        let t_hidden = t0.elapsed();
        // Each row whose logits are needed, once (a question's last row predicts the first
        // token of every choice), with the target tokens asked of it.
        let mut wanted: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (row, tok) in packed.targets.iter().flatten().flatten() {
            wanted.entry(*row).or_default().push(*tok);
        }
        let rows: Vec<usize> = wanted.keys().copied().collect();
        let mut answers: BTreeMap<(usize, u32), (f64, bool)> = BTreeMap::new();
        for chunk in rows.chunks(LOGIT_ROWS) {
            let idx = candle_core::Tensor::from_vec(
                chunk.iter().map(|&r| r as u32).collect::<Vec<_>>(),
                chunk.len(),
                hidden.device(),
            )?;
            let targets: Vec<Vec<u32>> = chunk.iter().map(|r| wanted[r].clone()).collect();
            let lps = self
                .model
                .token_logprobs(&hidden.index_select(&idx, 0)?, &targets, true)?;
            for ((&row, ts), lp) in chunk.iter().zip(&targets).zip(lps) {
                answers.extend(ts.iter().zip(lp).map(|(&t, a)| ((row, t), a)));
            }
        }
        if std::env::var_os("ZFLOW_EVAL_PROFILE").is_some() {
            eprintln!(
                "batch: {} rows in {:.2} s, {} logit rows in {:.2} s",
                packed.tokens.len(),
                t_hidden.as_secs_f64(),
                rows.len(),
                (t0.elapsed() - t_hidden).as_secs_f64()
            );
        }
        Ok(packed
            .targets
            .iter()
            .map(|group| {
                group
                    .iter()
                    .map(|pairs| {
                        pairs.iter().fold(
                            Score {
                                logprob: 0.0,
                                is_greedy: true,
                            },
                            |s, p| {
                                let (lp, greedy) = answers[p];
                                Score {
                                    logprob: s.logprob + lp,
                                    is_greedy: s.is_greedy && greedy,
                                }
                            },
                        )
                    })
                    .collect()
            })
            .collect())
    }

    fn generate_greedy(
        &mut self,
        context: &[u32],
        max_new_tokens: usize,
        stop: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Vec<u32>> {
        if context.is_empty() || max_new_tokens == 0 {
            return Ok(vec![]);
        }
        let (mut cache, mut logits) = self.model.prefill(context)?;
        let mut out = Vec::new();
        loop {
            let next = argmax(&logits);
            out.push(next);
            if self.tokenizer.eos.contains(&next) || out.len() >= max_new_tokens || stop(&out) {
                break;
            }
            logits = self.model.step(&mut cache, next, false)?;
        }
        Ok(out)
    }
}

fn argmax(xs: &[f32]) -> u32 {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &x) in xs.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0 as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `$ZFLOW_EVAL_GGUF` (a model file) and `$ZFLOW_EVAL_TOKENIZER` (its tokenizer.json, if
    /// SentencePiece): the Gemma 3 270M GGUF and tokenizer that `scripts/test.sh` fetches with
    /// their pins. Tests that use it are ignored where they are not set (`build.rs`).
    pub fn test_model() -> GgufModel {
        let path = std::env::var_os("ZFLOW_EVAL_GGUF")
            .expect("ZFLOW_EVAL_GGUF is not set: scripts/test.sh fetches Gemma 3 270M and sets it");
        let tok = std::env::var_os("ZFLOW_EVAL_TOKENIZER").map(PathBuf::from);
        GgufModel::load(Path::new(&path), tok.as_deref(), Some(4096)).unwrap()
    }

    /// Prefix sharing, batching and one-at-a-time scoring give the same numbers, and the
    /// incremental (KV cache) path predicts what the packed path scores.
    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs Gemma 3 270M: scripts/test.sh fetches it and sets ZFLOW_EVAL_GGUF"
    )]
    fn packed_scores_match_unpacked_and_the_kv_cache() {
        let mut m = test_model();
        let t = m.tokenizer();
        let q = "Question: Which is a fruit?\nAnswer:";
        let reqs: Vec<TokenRequest> = [" an apple", " a brick", " a red apple"]
            .iter()
            .map(|c| t.encode_pair(q, c).unwrap())
            .collect();
        let other = vec![t.encode_pair("The capital of France is", " Paris").unwrap()];
        let together = m.loglikelihood(&[reqs.clone(), other.clone()]).unwrap();
        for (i, r) in reqs.iter().enumerate() {
            let alone = m.loglikelihood(&[vec![r.clone()]]).unwrap()[0][0];
            assert!(
                (alone.logprob - together[0][i].logprob).abs() < 2e-3,
                "{alone:?} vs {:?}",
                together[0][i]
            );
            assert_eq!(alone.is_greedy, together[0][i].is_greedy);
        }
        // Greedy decoding from the KV cache reproduces the packed path's first-token logprob.
        let r = &other[0];
        let (_, logits) = m.model.prefill(&r.context).unwrap();
        let (lp, _) = model::token_logprob(&logits, r.continuation[0]);
        let first = m
            .loglikelihood(&[vec![TokenRequest {
                context: r.context.clone(),
                continuation: vec![r.continuation[0]],
            }]])
            .unwrap();
        assert!(
            (lp - first[0][0].logprob).abs() < 1e-4,
            "{lp} vs {:?}",
            first[0][0]
        );
        // A generation step on the cache computes the same function; on the quantized weights
        // (as generation runs) it agrees to quantization noise (llama.cpp's own differences
        // from exact arithmetic are up to ~0.8 per token on these tasks).
        let (mut cache, _) = m.model.prefill(&r.context[..r.context.len() - 1]).unwrap();
        let mut cache_q = model::KvCache::clone_of(&cache);
        let step = m
            .model
            .step(&mut cache, *r.context.last().unwrap(), true)
            .unwrap();
        let (lp_step, _) = model::token_logprob(&step, r.continuation[0]);
        assert!((lp_step - lp).abs() < 1e-4, "{lp_step} vs {lp}");
        let step = m
            .model
            .step(&mut cache_q, *r.context.last().unwrap(), false)
            .unwrap();
        let (lp_q, _) = model::token_logprob(&step, r.continuation[0]);
        assert!((lp_q - lp).abs() < 0.5, "{lp_q} vs {lp}");
        assert!(
            together[1][0].logprob > -5.0,
            "Paris should be likely: {:?}",
            together[1][0]
        );
    }
}
