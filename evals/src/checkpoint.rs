//! The zflow checkpoint adapter: a `step-N/` or `final/` folder of a train stage (or a
//! Hugging Face ZAYA1 folder, imported first) scored with the runtime's own ZAYA1 forward pass
//! (burn: the CPU `flex` backend, or CUDA / ROCm in a build with those features, so a
//! released ZAYA1-base folder can be scored on a GPU), the routing biases from its
//! `trainer.json`, and the recipe's tokenizer.
//!
//! No KV cache: each request is one forward pass over context + continuation, which is what
//! the nano models need; a request group (the choices of one question) is one padded batch.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, activation::log_softmax};
use burn_flex::{Flex, FlexDevice};
use zflow_runtime::backend::BackendKind;
use zflow_runtime::checkpoint::{TrainerState, load_weights};
use zflow_runtime::model::Zaya;

use crate::model::{LanguageModel, Score, TokenRequest};
use crate::tokenizer::Tokenizer;

/// Bumped when the way scores are computed changes (part of the identity, so of every cache key).
/// 2: the identity covers the model config (a RoPE base changes the function, not the weights).
const ADAPTER_VERSION: u32 = 2;

/// A zflow checkpoint as a [`LanguageModel`].
pub struct CheckpointModel<B: Backend = Flex> {
    model: Zaya<B>,
    device: B::Device,
    biases: Vec<Vec<f32>>,
    tokenizer: Tokenizer,
    identity: String,
    max_length: usize,
}

/// Opens a checkpoint on `backend` (`cpu`, `cuda`, `rocm`) device `device`: [`CheckpointModel::open_on`]
/// for the backends this build has.
pub fn open_checkpoint(
    dir: &Path,
    tokenizer: &Path,
    eos: &str,
    max_length: usize,
    backend: &str,
    device: usize,
) -> Result<Box<dyn LanguageModel + Send>> {
    let kind = BackendKind::parse(backend)?;
    let description = zflow_runtime::backend::probe(kind, device)?;
    Ok(match kind {
        BackendKind::Cpu => Box::new(CheckpointModel::<Flex>::open_on(
            dir, tokenizer, eos, max_length, FlexDevice, None,
        )?),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Box::new(CheckpointModel::<burn::backend::Cuda>::open_on(
            dir,
            tokenizer,
            eos,
            max_length,
            burn::backend::cuda::CudaDevice::new(device),
            Some(&description),
        )?),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => Box::new(CheckpointModel::<burn::backend::Rocm>::open_on(
            dir,
            tokenizer,
            eos,
            max_length,
            burn::backend::rocm::RocmDevice::new(device),
            Some(&description),
        )?),
        #[allow(unreachable_patterns)]
        _ => unreachable!("probe rejects backends that are not compiled in ({description})"),
    })
}

impl CheckpointModel<Flex> {
    /// [`CheckpointModel::open_on`] the CPU.
    pub fn open(
        dir: &Path,
        tokenizer: &Path,
        eos: &str,
        max_length: usize,
    ) -> Result<CheckpointModel> {
        Self::open_on(dir, tokenizer, eos, max_length, FlexDevice, None)
    }
}

impl<B: Backend> CheckpointModel<B> {
    /// Loads `dir` (a checkpoint folder with `model.safetensors`, `trainer.json` and
    /// `model.json`, or a Hugging Face ZAYA1 folder with `config.json`) and the tokenizer at
    /// `tokenizer` (a `tokenizer.json`; its `eos` token doubles as the prefix of empty
    /// contexts, as the EOD between training documents). `max_length` is the context the
    /// model was trained at. `gpu` describes the device when it is not the CPU: GPU kernels
    /// round differently, so their scores are cached apart.
    pub fn open_on(
        dir: &Path,
        tokenizer: &Path,
        eos: &str,
        max_length: usize,
        device: B::Device,
        gpu: Option<&str>,
    ) -> Result<CheckpointModel<B>> {
        let (dir, _imported) = checkpoint_dir(dir)?;
        let config = zflow_runtime::checkpoint::model_config(&dir)?;
        let weights_path = dir.join("model.safetensors");
        let weights = std::fs::read(&weights_path)
            .with_context(|| format!("reading {}", weights_path.display()))?;
        let state_path = dir.join("trainer.json");
        let state: TrainerState = serde_json::from_slice(
            &std::fs::read(&state_path)
                .with_context(|| format!("reading {}", state_path.display()))?,
        )
        .with_context(|| format!("parsing {}", state_path.display()))?;
        let model = load_weights(Zaya::<B>::new(&config, 0, &device), &weights, &weights_path)?;
        let (tokenizer, tok_hash) = zflow_tokenizer(tokenizer, eos)?;
        // Everything that changes the function: the weights, the routing biases, the model
        // config they run under (RoPE base, skip semantics, ...) and the tokenizer.
        let mut identity = format!(
            "zflow-checkpoint v{ADAPTER_VERSION} weights {} config {} biases {} tokenizer {tok_hash}",
            &blake3::hash(&weights).to_hex()[..16],
            &blake3::hash(&serde_json::to_vec(&config)?).to_hex()[..16],
            &blake3::hash(
                serde_json::to_string(
                    &state.balance.iter().map(|b| &b.biases).collect::<Vec<_>>()
                )?
                .as_bytes()
            )
            .to_hex()[..16],
        );
        if let Some(gpu) = gpu {
            identity.push_str(&format!(" on {gpu}"));
        }
        let biases = state.balance.into_iter().map(|b| b.biases).collect();
        Ok(CheckpointModel {
            model,
            device,
            biases,
            tokenizer,
            identity,
            max_length,
        })
    }

    /// Next-token log-probabilities `[rows, len, vocab]` for right-padded rows of tokens.
    fn log_probs(&self, rows: &[Vec<u32>]) -> Tensor<B, 3> {
        let len = rows.iter().map(Vec::len).max().unwrap_or(1);
        let flat: Vec<i64> = rows
            .iter()
            .flat_map(|r| {
                r.iter()
                    .map(|&t| t as i64)
                    .chain(std::iter::repeat_n(0, len - r.len()))
            })
            .collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows.len(), len]), &self.device);
        let (logits, _) = self.model.logits(tokens, &self.biases);
        log_softmax(logits, 2)
    }
}

/// A zflow model's tokenizer (a `tokenizer.json` whose `eos` token doubles as the prefix of
/// empty contexts) and the short hash of its file, for model identities.
pub(crate) fn zflow_tokenizer(tokenizer: &Path, eos: &str) -> Result<(Tokenizer, String)> {
    let inner = tokenizers::Tokenizer::from_file(tokenizer)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tokenizer.display()))?;
    let eos_id = inner
        .token_to_id(eos)
        .with_context(|| format!("{}: no token `{eos}`", tokenizer.display()))?;
    let tok_hash = blake3::hash(&std::fs::read(tokenizer)?).to_hex()[..16].to_string();
    let tokenizer = Tokenizer::new(
        inner,
        None,
        vec![eos_id],
        false,
        format!("zflow tokenizer {tok_hash}"),
    );
    Ok((tokenizer, tok_hash))
}

/// `dir` itself for a zflow checkpoint; for a Hugging Face folder, its import into a
/// temporary folder (kept alive by the returned guard).
fn checkpoint_dir(dir: &Path) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    if dir.join("trainer.json").exists() {
        return Ok((dir.to_path_buf(), None));
    }
    ensure!(
        dir.join("config.json").exists(),
        "{}: neither a zflow checkpoint (trainer.json) nor a Hugging Face folder (config.json)",
        dir.display()
    );
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("imported");
    zflow_runtime::hf::import_hf(dir, &out)
        .with_context(|| format!("importing the Hugging Face folder {}", dir.display()))?;
    Ok((out, Some(tmp)))
}

impl<B: Backend> LanguageModel for CheckpointModel<B> {
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
        let mut out = Vec::with_capacity(groups.len());
        for group in groups {
            let rows: Vec<Vec<u32>> = group
                .iter()
                .map(|r| {
                    r.context
                        .iter()
                        .chain(&r.continuation[..r.continuation.len().saturating_sub(1)])
                        .copied()
                        .collect()
                })
                .collect();
            let lp = self.log_probs(&rows);
            let [_, len, vocab] = lp.dims();
            let data: Vec<f32> = lp
                .into_data()
                .convert::<f32>()
                .into_vec()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let scores = group
                .iter()
                .enumerate()
                .map(|(row, r)| {
                    let mut score = Score {
                        logprob: 0.0,
                        is_greedy: true,
                    };
                    for (j, &target) in r.continuation.iter().enumerate() {
                        let pos = r.context.len() - 1 + j;
                        let dist = &data[(row * len + pos) * vocab..(row * len + pos + 1) * vocab];
                        score.logprob += dist[target as usize] as f64;
                        let best = dist
                            .iter()
                            .enumerate()
                            .max_by(|a, b| a.1.total_cmp(b.1))
                            .map_or(0, |(i, _)| i);
                        score.is_greedy &= best == target as usize;
                    }
                    score
                })
                .collect();
            out.push(scores);
        }
        Ok(out)
    }

    fn generate_greedy(
        &mut self,
        context: &[u32],
        max_new_tokens: usize,
        stop: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Vec<u32>> {
        let mut tokens = context.to_vec();
        let mut generated = Vec::new();
        for _ in 0..max_new_tokens {
            let window = &tokens[tokens.len().saturating_sub(self.max_length)..];
            let lp = self.log_probs(&[window.to_vec()]);
            let [_, len, vocab] = lp.dims();
            let last: Vec<f32> = lp
                .slice([0..1, len - 1..len, 0..vocab])
                .into_data()
                .convert::<f32>()
                .into_vec()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let next = last
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i) as u32;
            tokens.push(next);
            generated.push(next);
            if self.tokenizer.eos.contains(&next) || stop(&generated) {
                break;
            }
        }
        Ok(generated)
    }
}
