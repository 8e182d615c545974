//! The ZAYA1 model configuration: the recipe's `model:` section, and every dimension derived
//! from it. The model (`model.rs`), its Hugging Face interchange (`hf.rs`) and its sizing
//! (`size.rs`) all read their shapes from here. The defaults are ZAYA1-base, from the ZAYA1
//! report (arXiv 2511.17127, "the report" below) and Zyphra's released inference code.
//!
//! # The model in one paragraph
//! `num_blocks` blocks, each an attention sub-layer then an MoE sub-layer. Every sub-layer has
//! a pre-norm RMSNorm and *residual scaling*: the residual stream and the sub-layer output each
//! get a learned per-channel gate and bias (the very first sub-layer has only the output
//! pair); a final residual scaling and a final RMSNorm close the stack. Attention is CCGQA:
//! linear q/k projections into a compressed latent, two causal convolutions over `[q;k]`, two
//! value projections (one on the previous token's hidden state), a per-KV-head key
//! temperature, then GQA softmax attention and `o_proj`. The MoE sub-layer is a small MLP
//! router (with exponential depth averaging, EDA) choosing top-k of `num_experts` SwiGLU
//! experts, plus an optional "skip" route (mixture-of-depths).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The MoE output of a token that the router sends to the MoD skip route. Both keep the
/// residual stream (the token skips the experts); they differ in what the sub-layer adds to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipOutput {
    /// Nothing: the sub-layer's output is zero. transformers 5.23 (`transformers.models.zaya`),
    /// Zyphra's vLLM model and the newest branch of their fork; the default for new recipes.
    #[default]
    Zero,
    /// The normed input, scaled by the skip route's probability: the older `zaya1-legacy`
    /// branch of Zyphra's fork, and every zflow checkpoint trained before this setting existed
    /// (a model config without `skip_output` reads as `zero`: state `input` for those).
    Input,
}

/// The size of a ZAYA1-style model. Serde defaults are ZAYA1-base, so an empty `model: {}`
/// in a recipe means ZAYA1-base; unknown keys are rejected so a typo never silently falls
/// back to a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Width of the residual stream. 2048 (the report, "The model": hidden size 2048).
    pub hidden_size: usize,
    /// Number of blocks; each block is one attention sub-layer plus one MoE sub-layer, so the
    /// released checkpoint has `2 * num_blocks` layer entries. 40 (the report, "40 blocks").
    pub num_blocks: usize,
    /// Vocabulary size. 262,272 = 2049 x 128, the Gemma3 tokenizer (the report).
    pub vocab_size: usize,
    /// CCA query heads. 8, i.e. 2x query compression of a 16-head reference MHA; the query
    /// latent is `num_query_heads * head_dim` = 1024 (the report, "Attention: CCA / CCGQA").
    pub num_query_heads: usize,
    /// CCA key/value heads (GQA groups). 2; the key latent is `num_kv_heads * head_dim` = 256
    /// (the report, "8x KV-cache compression").
    pub num_kv_heads: usize,
    /// Channels per attention head. 128 (the report; `hidden_size / 16` in the released code).
    pub head_dim: usize,
    /// Kernel size of each of the two causal convolutions over the `[q;k]` latent (the
    /// depthwise one and the grouped one). 2 (the report, "Conv1d(k=2 ...)").
    pub conv_kernel: usize,
    /// Fraction of each head's channels that get RoPE. 0.5, i.e. 64 of 128 (the report,
    /// "Partial RoPE on half of each head's channels").
    pub rope_fraction: f64,
    /// RoPE base. 10,000 in pretraining phases 1-2; the long-context mid-train uses 1M
    /// (the report, "Context 4K ... RoPE base 10K ... 32K ... RoPE base 1M").
    pub rope_base: f64,
    /// Routed experts per MoE sub-layer, not counting the skip route. 16 (the report, "MoE
    /// layer and the ZAYA1 router").
    pub num_experts: usize,
    /// Experts each token is routed to. 1 (the report, "top-1, no shared expert").
    pub top_k: usize,
    /// Expert SwiGLU width F: gate and up are `hidden -> 2F` in one matrix, down is
    /// `F -> hidden`. 2048 (the report, "Expert = SwiGLU, 2048 -> 2x2048 (gate+up) -> 2048").
    pub expert_ffn: usize,
    /// Mixture-of-depths: the router has one extra "skip" choice that passes the token through
    /// (17 router outputs for 16 experts). true for the base checkpoint (the report).
    pub mod_skip: bool,
    /// What the MoE sub-layer outputs for a token routed to the skip route (with `mod_skip`);
    /// [`SkipOutput`] has the two behaviours ZAYA1's code bases implement. `zero` by default.
    pub skip_output: SkipOutput,
    /// Width of the router's hidden state (`down_proj` output, EDA state, MLP width). 256
    /// (the report, "down_proj 2048->256").
    pub router_dim: usize,
    /// Linear layers in the router MLP: `router_mlp_layers - 1` layers `router_dim ->
    /// router_dim` with bias and GELU, then one `router_dim -> experts` without bias. 3
    /// (the report, "MLP 256->256 GELU ->256 GELU ->E (last layer without bias)"). At least 1.
    pub router_mlp_layers: usize,
    /// Exponential depth averaging in the router: a learned `router_dim` vector gamma mixes in
    /// the previous MoE layer's router state (absent at the first MoE layer). true (the report,
    /// "EDA").
    pub eda: bool,
    /// Residual scaling: learned per-channel gate and bias on the residual stream and on each
    /// sub-layer output, plus a final pair of pairs before the final norm. true (the report,
    /// "Residual scaling").
    pub residual_scaling: bool,
    /// Input and output embeddings share one matrix. true (the report, "Tied input/output
    /// embeddings").
    pub tie_embeddings: bool,
    /// RMSNorm epsilon. 1e-5 (the report, "Pre-norm RMSNorm (eps 1e-5)").
    pub rms_norm_eps: f64,
    /// Blocks whose attention slides (transformers' `hybrid_sliding` layer type): a query
    /// there sees itself and the `sliding_window - 1` tokens before it. Empty (the default,
    /// ZAYA1-base): every block attends over the whole context.
    pub sliding_blocks: Vec<usize>,
    /// Tokens a sliding block's query sees, itself included (transformers' `sliding_window`).
    /// Read only when `sliding_blocks` is not empty.
    pub sliding_window: usize,
    /// RoPE base of the sliding blocks (transformers' `rope_parameters.hybrid_sliding`: 10,000
    /// by default). A phase's `rope_base` changes the other blocks' base only.
    pub sliding_rope_base: f64,
}

impl Default for ModelConfig {
    /// ZAYA1-base.
    fn default() -> Self {
        ModelConfig {
            hidden_size: 2048,
            num_blocks: 40,
            vocab_size: 262_272,
            num_query_heads: 8,
            num_kv_heads: 2,
            head_dim: 128,
            conv_kernel: 2,
            rope_fraction: 0.5,
            rope_base: 10_000.0,
            num_experts: 16,
            top_k: 1,
            expert_ffn: 2048,
            mod_skip: true,
            skip_output: SkipOutput::Zero,
            router_dim: 256,
            router_mlp_layers: 3,
            eda: true,
            residual_scaling: true,
            tie_embeddings: true,
            rms_norm_eps: 1e-5,
            sliding_blocks: Vec::new(),
            sliding_window: 4096,
            sliding_rope_base: 10_000.0,
        }
    }
}

impl ModelConfig {
    /// ZAYA1-base (the same as `ModelConfig::default()`).
    pub fn zaya1_base() -> Self {
        Self::default()
    }

    /// Width of the query latent, `num_query_heads * head_dim` (1024 for ZAYA1-base).
    pub fn q_latent(&self) -> usize {
        self.num_query_heads * self.head_dim
    }

    /// Width of the key latent, `num_kv_heads * head_dim` (256 for ZAYA1-base).
    pub fn kv_latent(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Channels of the `[q;k]` latent the convolutions run over (1280 for ZAYA1-base).
    pub fn qk_channels(&self) -> usize {
        self.q_latent() + self.kv_latent()
    }

    /// Output width of each value projection. The released code makes `val_proj1` (on h_t)
    /// and `val_proj2` (on h_{t-1}) each half the key latent, and views their concatenation
    /// as `num_kv_heads` heads; for ZAYA1's 2 KV heads that is one head (128) each.
    pub fn value_proj_width(&self) -> usize {
        self.kv_latent() / 2
    }

    /// Router outputs: the experts, plus the skip route when `mod_skip` (17 for ZAYA1-base).
    pub fn router_outputs(&self) -> usize {
        self.num_experts + usize::from(self.mod_skip)
    }

    /// Head channels that get RoPE (64 for ZAYA1-base): `floor(head_dim * rope_fraction)`, as
    /// the reference implementation counts them. The model, its export and this sizing all use
    /// this one count; a recipe whose count is odd (RoPE rotates channel pairs) is refused when
    /// it loads.
    pub fn rope_dims(&self) -> usize {
        (self.head_dim as f64 * self.rope_fraction) as usize
    }

    /// The window of block `block`'s attention: `Some(sliding_window)` for a sliding block,
    /// `None` for one that attends over the whole context.
    pub fn window(&self, block: usize) -> Option<usize> {
        self.sliding_blocks
            .contains(&block)
            .then_some(self.sliding_window)
    }
}
