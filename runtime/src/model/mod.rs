//! ZAYA1 in burn, top to bottom.
//!
//! ZAYA1-base (Zyphra, arXiv 2511.17127) is a decoder of `num_blocks` blocks, each two pre-norm
//! sub-layers: CCA attention, then a top-1 mixture of SwiGLU experts behind ZAYA1's MLP router.
//! Field names follow the released reference code (Zyphra's `transformers` fork, `models/zaya`)
//! so a checkpoint maps one to one onto `model.layers.{2i}.self_attn.qkv.linear_q.weight` and
//! friends (see `reference_name`; `hf.rs` exports and imports). Linear weights are stored
//! `[in, out]` (burn's layout; export transposes them), convolution weights in PyTorch's
//! `[out, in / groups, kernel]`.
//!
//! Reading order: this file ([`Zaya`]: embedding, residual stream, tied head), then
//! `attention.rs` ([`Attention`], CCA), `moe.rs` ([`Router`], [`Moe`]: expert dispatch),
//! `layers.rs` (the small pieces they share) and `names.rs` (parameter names on both sides).
//! Every size comes from [`config::ModelConfig`].

pub mod config;
mod tensors;

use burn::module::{Module, Param};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::model::config::ModelConfig;

mod attention;
mod layers;
mod moe;
mod names;

pub use attention::{Attention, Cca, Rope, causal_conv, shift_right};
pub use layers::{ResidualScaling, RmsNorm};
pub use moe::{Expert, Moe, Router};
pub use names::{param_id, reference_name};
pub use tensors::{Part, TensorSpec, tensors};

use layers::Init;

/// The whole model: embedding, `num_blocks` x (attention, MoE), final scaling and norm, and the
/// output head tied to the embedding.
#[derive(Module, Debug)]
pub struct Zaya<B: Backend> {
    /// Token embedding `[vocab, hidden]`; also the output head (tied).
    pub embed_tokens: Param<Tensor<B, 2>>,
    /// The blocks.
    pub blocks: Vec<Block<B>>,
    /// Residual scaling applied before the final norm.
    pub res_scale: Option<ResidualScaling<B>>,
    /// The final RMSNorm.
    pub final_norm: RmsNorm<B>,
    /// Options that are not parameters.
    pub options: Options,
}

/// Model options that shape the forward pass but are not parameters.
#[derive(Module, Clone, Debug)]
pub struct Options {
    /// Query heads.
    pub num_query_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Channels of each head that get RoPE (even).
    pub rope_dim: usize,
    /// RoPE base; the trainer changes it between phases (10K -> 1M in ZAYA1's long-context phase).
    pub rope_base: f64,
    /// Experts per MoE layer (without the skip route).
    pub num_experts: usize,
    /// Whether the MoD skip route exists (the last route).
    pub mod_skip: bool,
    /// Whether the skip route outputs zero ([`config::SkipOutput::Zero`]) rather than its
    /// normed input (`Input`). A flag: burn modules hold plain values.
    pub skip_zero: bool,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base of the sliding-window blocks (the others use `rope_base`).
    pub sliding_rope_base: f64,
}

/// One block: the attention sub-layer (reference layer `2i`) and the MoE sub-layer (`2i + 1`).
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Residual scaling before the attention sub-layer (layer 0 has no residual pair).
    pub attn_res_scale: Option<ResidualScaling<B>>,
    /// Pre-norm of the attention sub-layer.
    pub attn_norm: RmsNorm<B>,
    /// CCA attention.
    pub self_attn: Attention<B>,
    /// Residual scaling before the MoE sub-layer.
    pub moe_res_scale: Option<ResidualScaling<B>>,
    /// Pre-norm of the MoE sub-layer.
    pub moe_norm: RmsNorm<B>,
    /// Router and experts.
    pub moe: Moe<B>,
    /// The attention's window in tokens, the query included (`ModelConfig::sliding_blocks`);
    /// 0: the whole context.
    pub window: usize,
}

/// What a forward pass reports besides its output: the routing of every MoE layer.
#[derive(Clone, Debug, Default)]
pub struct Routing {
    /// Tokens per route (experts, then skip) for each MoE layer.
    pub counts: Vec<Vec<u64>>,
}

impl<B: Backend> Zaya<B> {
    /// Builds a freshly initialised model; the same config and seed give the same weights on
    /// every backend (the random numbers are drawn on the host).
    pub fn new(config: &ModelConfig, seed: u64, device: &B::Device) -> Self {
        let mut init = Init::new(seed, device);
        let h = config.hidden_size;
        // GPT-2/Megatron style: N(0, 0.02), output projections scaled down by sqrt(2 x layers).
        let std = 0.02;
        let out_std = std / ((2 * config.num_blocks) as f64).sqrt();
        let embed_tokens = init.normal("embed_tokens", [config.vocab_size, h], std);
        let blocks = (0..config.num_blocks)
            .map(|i| {
                let scaled = config.residual_scaling;
                Block {
                    attn_res_scale: scaled.then(|| {
                        ResidualScaling::new(
                            &mut init,
                            &format!("blocks.{i}.attn_res_scale"),
                            h,
                            i > 0,
                        )
                    }),
                    attn_norm: RmsNorm::new(&mut init, &format!("blocks.{i}.attn_norm"), h),
                    self_attn: Attention::new(
                        &mut init,
                        &format!("blocks.{i}.self_attn"),
                        config,
                        std,
                        out_std,
                    ),
                    moe_res_scale: scaled.then(|| {
                        ResidualScaling::new(
                            &mut init,
                            &format!("blocks.{i}.moe_res_scale"),
                            h,
                            true,
                        )
                    }),
                    moe_norm: RmsNorm::new(&mut init, &format!("blocks.{i}.moe_norm"), h),
                    moe: Moe::new(
                        &mut init,
                        &format!("blocks.{i}.moe"),
                        config,
                        i > 0 && config.eda,
                        std,
                        out_std,
                    ),
                    window: config.window(i).unwrap_or(0),
                }
            })
            .collect();
        Zaya {
            embed_tokens,
            blocks,
            res_scale: config
                .residual_scaling
                .then(|| ResidualScaling::new(&mut init, "res_scale", h, true)),
            final_norm: RmsNorm::new(&mut init, "final_norm", h),
            options: Options {
                num_query_heads: config.num_query_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
                rope_dim: config.rope_dims(),
                rope_base: config.rope_base,
                num_experts: config.num_experts,
                mod_skip: config.mod_skip,
                skip_zero: config.skip_output == config::SkipOutput::Zero,
                sliding_rope_base: config.sliding_rope_base,
                eps: config.rms_norm_eps,
            },
        }
    }

    /// The final hidden states `[batch, seq, hidden]` for token ids `[batch, seq]`, and the
    /// routing. `biases[l]` are MoE layer `l`'s balancing biases (one per route).
    pub fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        biases: &[Vec<f32>],
    ) -> (Tensor<B, 3>, Routing) {
        let [batch, seq] = tokens.dims();
        let h = self.embed_tokens.dims()[1];
        let rope = Rope::new(
            seq,
            self.options.rope_dim,
            self.options.rope_base,
            &tokens.device(),
        );
        // The sliding-window blocks' own RoPE tables, when there are any.
        let sliding_rope = self.blocks.iter().any(|b| b.window > 0).then(|| {
            Rope::new(
                seq,
                self.options.rope_dim,
                self.options.sliding_rope_base,
                &tokens.device(),
            )
        });
        let mut hidden = self
            .embed_tokens
            .val()
            .select(0, tokens.reshape([batch * seq]))
            .reshape([batch, seq, h]);
        // The reference keeps two streams: `residual` (the running sum) and `hidden` (the last
        // sub-layer's output); residual scaling gates both before they are added.
        let mut residual: Option<Tensor<B, 3>> = None;
        let mut router_state = None;
        let mut routing = Routing::default();
        let eps = self.options.eps;
        for (i, block) in self.blocks.iter().enumerate() {
            let x = merge(&block.attn_res_scale, residual.take(), hidden);
            let block_rope = match (&sliding_rope, block.window) {
                (Some(sliding), w) if w > 0 => sliding,
                _ => &rope,
            };
            hidden = block.self_attn.forward(
                block.attn_norm.forward(x.clone(), eps),
                block_rope,
                block.window,
                &self.options,
            );
            residual = Some(x);

            let x = merge(&block.moe_res_scale, residual.take(), hidden);
            let (out, state, counts) = block.moe.forward(
                block.moe_norm.forward(x.clone(), eps),
                router_state,
                &biases[i],
                &self.options,
            );
            hidden = out;
            router_state = Some(state);
            routing.counts.push(counts);
            residual = Some(x);
        }
        let x = merge(&self.res_scale, residual, hidden);
        (self.final_norm.forward(x, eps), routing)
    }

    /// Logits `[batch, seq, vocab]` through the tied head.
    pub fn logits(
        &self,
        tokens: Tensor<B, 2, Int>,
        biases: &[Vec<f32>],
    ) -> (Tensor<B, 3>, Routing) {
        let (hidden, routing) = self.hidden(tokens, biases);
        let [b, s, h] = hidden.dims();
        let logits = hidden
            .reshape([b * s, h])
            .matmul(self.embed_tokens.val().transpose());
        let v = logits.dims()[1];
        (logits.reshape([b, s, v]), routing)
    }

    /// Mean next-token cross-entropy (nats) of `targets` given `tokens`, both `[batch, seq]`.
    pub fn loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        biases: &[Vec<f32>],
    ) -> (Tensor<B, 1>, Routing) {
        let (nll, routing) = self.token_losses(tokens, targets, biases);
        (nll.mean(), routing)
    }

    /// Per-token negative log-likelihood `[batch * seq]` (nats).
    pub fn token_losses(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        biases: &[Vec<f32>],
    ) -> (Tensor<B, 1>, Routing) {
        let (logits, routing) = self.logits(tokens, biases);
        let [b, s, v] = logits.dims();
        let logp = log_softmax(logits.reshape([b * s, v]), 1);
        let picked = logp.gather(1, targets.reshape([b * s, 1]));
        (picked.reshape([b * s]).neg(), routing)
    }

    /// Number of routes per MoE layer (experts, plus one with the MoD skip route).
    pub fn routes(&self) -> usize {
        self.options.num_experts + usize::from(self.options.mod_skip)
    }
}

/// Gates the two residual streams (if scaling is on) and adds them: the input of the next
/// sub-layer's norm, and the new running residual.
fn merge<B: Backend>(
    scale: &Option<ResidualScaling<B>>,
    residual: Option<Tensor<B, 3>>,
    hidden: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let (residual, hidden) = match scale {
        Some(s) => s.forward(residual, hidden),
        None => (residual, hidden),
    };
    match residual {
        Some(r) => r + hidden,
        None => hidden,
    }
}
