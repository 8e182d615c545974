//! Hugging Face export and import of zflow checkpoints, in two layouts ([`Layout`]): the
//! transformers release's (5.23, `transformers.models.zaya`; the default, see `layout.rs` for
//! its names) and the legacy one described below.
//!
//! The legacy target is the ZAYA1 reference implementation: Zyphra's `transformers` fork, branch
//! `zaya`, `src/transformers/models/zaya/` (`ZayaConfig`, `ZayaForCausalLM`). An exported
//! folder holds
//!
//! ```text
//! config.json              ZayaConfig fields (model_type "zaya", architectures ZayaForCausalLM)
//! model.safetensors        the reference's tensor names and layouts, f32, metadata {"format": "pt"}
//! tokenizer.json           with --tokenizer: copied byte for byte
//! tokenizer_config.json    with --tokenizer: PreTrainedTokenizerFast + its special tokens
//! special_tokens_map.json  with --tokenizer
//! ```
//!
//! Names come from [`crate::model::reference_name`]. Layouts: our linear weights are `[in, out]`
//! (zflow's convention) and PyTorch's `nn.Linear` holds `[out, in]`, so linears are transposed;
//! the embedding (`nn.Embedding`, `[vocab, hidden]`), the convolutions (`nn.Conv1d`,
//! `[out, in / groups, kernel]`, the layout `model.rs` already uses) and every 1-D parameter are
//! the same on both sides. The router's balancing biases, which zflow keeps in `trainer.json`
//! (they are moved by a controller, not by backprop), are the reference's persistent buffer
//! `model.layers.{2i+1}.zaya_block.router.balancing_biases`. The output head is tied to the
//! embedding, so there is no `lm_head.weight` (what `save_pretrained` writes for tied weights).
//!
//! Import is the exact inverse, so export then import gives back every tensor bit for bit (and
//! the same `model.safetensors` bytes): moving f32 values between layouts never changes their
//! bits, and bf16/f16 tensors (the released ZAYA1-base is bf16) widen to f32 exactly.
//!
//! Both directions write into a temporary sibling folder and rename it into place, so a crash
//! leaves no half-written export or checkpoint.
//!
//! Limits of the reference code, not of the export: its decode cache (`ZayaDynamicCache`)
//! hard-codes head_dim 128 and kernel 2, and its SDPA attention assumes a query latent of half
//! the hidden size. ZAYA1-base's sizes satisfy both; a smaller model (the nano recipe: head_dim
//! 64) runs in the reference with eager attention (`ZayaConfig`'s default) and `use_cache=False`.

use std::path::PathBuf;

mod config;
mod export;
mod files;
mod import;
mod layout;
mod tensors;
mod tokenizer;

pub use config::model_config_from_hf;
pub use export::export_hf;
pub use files::HfFiles;
pub use import::{check_hf, import_hf};
pub use layout::{LAYOUTS, Layout};
pub use tokenizer::MAX_TOKENIZER_BYTES;

/// An imported checkpoint carries the trainer's single metadata entry, so its
/// `model.safetensors` has the same bytes as one the trainer wrote for the same weights.
const CHECKPOINT_FORMAT: &str = crate::checkpoint::WEIGHTS_FORMAT;

/// Gemma3's vocabulary, ZAYA1's (the ZAYA1 report): with it and no tokenizer, the special ids are
/// ZAYA1's bos=2, eos=1, pad=0.
const GEMMA3_VOCAB: usize = 262_272;

/// `max_position_embeddings` when the caller knows no context length: ZAYA1's pretraining
/// context (4K, the ZAYA1 report). The reference's default RoPE does not depend on it.
pub const DEFAULT_MAX_POSITIONS: usize = 4096;

/// The phase name an imported checkpoint's `trainer.json` carries.
pub const IMPORTED_PHASE: &str = "hf-import";

/// Export settings besides the checkpoint and the model.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// A tokenizer to ship with the model: a `tokenizer.json`, or a folder holding one (a
    /// `tokenizer` stage's output, whose `tokenizer_info.json` then names the special tokens).
    pub tokenizer: Option<PathBuf>,
    /// `max_position_embeddings` in `config.json`: the context the model was trained at.
    pub max_position_embeddings: usize,
    /// The folder's layout: transformers 5.23's (the default) or the legacy one.
    pub layout: Layout,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            tokenizer: None,
            max_position_embeddings: DEFAULT_MAX_POSITIONS,
            layout: Layout::default(),
        }
    }
}

#[cfg(test)]
mod tests;
