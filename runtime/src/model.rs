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
//! Reading order: [`Zaya`] (embedding, residual stream, tied head), [`Attention`] (CCA),
//! [`Router`], [`Moe`] (expert dispatch), then the small pieces they share.

use burn::module::{Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::activation::{gelu, log_softmax, silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::model_config::ModelConfig;
use crate::rng::SplitMix64;

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
    /// RMSNorm epsilon.
    pub eps: f64,
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
            hidden = block.self_attn.forward(
                block.attn_norm.forward(x.clone(), eps),
                &rope,
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

// ---------------------------------------------------------------------------------------------
// CCA attention
// ---------------------------------------------------------------------------------------------

/// Compressed convolutional attention with grouped KV heads (CCGQA).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// The latent q/k/v projections and the convolutions (reference: `self_attn.qkv`).
    pub qkv: Cca<B>,
    /// Output projection, query latent -> hidden.
    pub o_proj: Linear<B>,
}

/// CCA's latent projections, convolutions and key temperature.
#[derive(Module, Debug)]
pub struct Cca<B: Backend> {
    /// hidden -> query latent (`num_query_heads x head_dim`).
    pub linear_q: Linear<B>,
    /// hidden -> key latent (`num_kv_heads x head_dim`).
    pub linear_k: Linear<B>,
    /// hidden of token t -> the first half of the value latent.
    pub val_proj1: Linear<B>,
    /// hidden of token t-1 -> the second half (the time-shifted value head).
    pub val_proj2: Linear<B>,
    /// Depthwise causal conv over [q; k]: weight `[C, 1, 2]`.
    pub conv0_weight: Param<Tensor<B, 3>>,
    /// Its bias `[C]`.
    pub conv0_bias: Param<Tensor<B, 1>>,
    /// Grouped causal conv over [q; k], one group per head: weight `[C, head_dim, 2]`.
    pub conv1_weight: Param<Tensor<B, 3>>,
    /// Its bias `[C]`.
    pub conv1_bias: Param<Tensor<B, 1>>,
    /// Learned key temperature, one per KV head (multiplies the keys directly).
    pub temp: Param<Tensor<B, 1>>,
}

impl<B: Backend> Attention<B> {
    fn new(init: &mut Init<B>, path: &str, c: &ModelConfig, std: f64, out_std: f64) -> Self {
        let (h, lq, lk) = (c.hidden_size, c.q_latent(), c.kv_latent());
        let ch = lq + lk;
        let p = |n: &str| format!("{path}.qkv.{n}");
        // Convolutions start near identity on the newest position (kernel tap 1) so attention
        // sees the projected q/k at step 0; the older tap starts small.
        let conv0 = init.conv_near_identity(&p("conv0_weight"), ch, 1, c.conv_kernel);
        let conv1 = init.conv_near_identity(&p("conv1_weight"), ch, c.head_dim, c.conv_kernel);
        Attention {
            qkv: Cca {
                linear_q: init.linear(&p("linear_q"), h, lq, false, std),
                linear_k: init.linear(&p("linear_k"), h, lk, false, std),
                val_proj1: init.linear(&p("val_proj1"), h, lk / 2, false, std),
                val_proj2: init.linear(&p("val_proj2"), h, lk - lk / 2, false, std),
                conv0_weight: conv0,
                conv0_bias: init.constant(&p("conv0_bias"), [ch], 0.0),
                conv1_weight: conv1,
                conv1_bias: init.constant(&p("conv1_bias"), [ch], 0.0),
                // The reference code initialises the temperature to 0 and loads trained values;
                // from scratch, 1 keeps attention logits in range from step 0.
                temp: init.constant(&p("temp"), [c.num_kv_heads], 1.0),
            },
            o_proj: init.linear(&format!("{path}.o_proj"), lq, h, false, out_std),
        }
    }

    /// `x`: normed hidden states `[batch, seq, hidden]` -> attention output `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Rope<B>, o: &Options) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (nq, nkv, hd) = (o.num_query_heads, o.num_kv_heads, o.head_dim);
        let (query, key, value) = self.qkv.forward(x, o);
        // [b, s, heads, hd] -> [b, heads, s, hd]
        let query = rope.apply(query.swap_dims(1, 2));
        let key = rope.apply(key.swap_dims(1, 2));
        let value = value.swap_dims(1, 2);
        // GQA: query head i reads KV head i / (nq / nkv).
        let group = nq / nkv;
        let key = repeat_kv(key, group);
        let value = repeat_kv(value, group);
        let scores = query.matmul(key.transpose()).div_scalar((hd as f64).sqrt());
        // burn's `tril_mask` is true *outside* the lower triangle: exactly the future positions.
        let mask = Tensor::<B, 2, burn::tensor::Bool>::tril_mask([s, s], 0, &scores.device());
        let scores = scores.mask_fill(
            mask.unsqueeze::<4>().expand([b, nq, s, s]),
            f32::NEG_INFINITY,
        );
        let out = softmax(scores, 3).matmul(value); // [b, nq, s, hd]
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([b, s, nq * hd]))
    }
}

impl<B: Backend> Cca<B> {
    /// The CCA query, key and value heads `[batch, seq, heads, head_dim]`, before RoPE.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        o: &Options,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let [b, s, _] = x.dims();
        let (nq, nkv, hd) = (o.num_query_heads, o.num_kv_heads, o.head_dim);
        let lq = nq * hd;
        let q = self.linear_q.forward(x.clone());
        let k = self.linear_k.forward(x.clone());

        // QK-mean skip: per query head, the mean of its pre-conv query and its (GQA-repeated)
        // pre-conv key; keys get the mean of that term over their query group.
        let q_heads = q.clone().reshape([b, s, nq, hd]);
        let k_heads = k
            .clone()
            .reshape([b, s, nkv, 1, hd])
            .repeat_dim(3, nq / nkv)
            .reshape([b, s, nq, hd]);
        let mean_q = (q_heads + k_heads).div_scalar(2.0);
        let mean_k = mean_q
            .clone()
            .reshape([b, s, nkv, nq / nkv, hd])
            .mean_dim(3)
            .reshape([b, s, nkv, hd]);

        let qk = causal_conv(
            Tensor::cat(vec![q, k], 2),
            self.conv0_weight.val(),
            self.conv0_bias.val(),
            self.conv1_weight.val(),
            self.conv1_bias.val(),
            nq + nkv,
        );
        let query = qk
            .clone()
            .slice([0..b, 0..s, 0..lq])
            .reshape([b, s, nq, hd])
            + mean_q;
        let key = qk
            .slice([0..b, 0..s, lq..lq + nkv * hd])
            .reshape([b, s, nkv, hd])
            + mean_k;

        // Values: the first half from token t, the second from token t-1 (zero before the start).
        let v1 = self.val_proj1.forward(x.clone());
        let v2 = self.val_proj2.forward(shift_right(x));
        let value = Tensor::cat(vec![v1, v2], 2).reshape([b, s, nkv, hd]);

        // L2-normalise per head to norm sqrt(head_dim); keys then times their temperature.
        let scale = (hd as f64).sqrt();
        let query = l2_normalize(query).mul_scalar(scale);
        let temp = self.temp.val().reshape([1, 1, nkv, 1]);
        let key = l2_normalize(key).mul_scalar(scale) * temp;
        (query, key, value)
    }
}

/// CCA's convolution path over the packed `[q; k]` latent `x: [batch, seq, C]`: a depthwise
/// causal conv (kernel `k0`), then a grouped causal conv (`groups` groups), both with bias, with
/// `k0 + k1 - 2` zeros padded in front as in the reference (so the first outputs see biases).
pub fn causal_conv<B: Backend>(
    x: Tensor<B, 3>,
    w0: Tensor<B, 3>,
    b0: Tensor<B, 1>,
    w1: Tensor<B, 3>,
    b1: Tensor<B, 1>,
    groups: usize,
) -> Tensor<B, 3> {
    let [b, s, c] = x.dims();
    let (k0, k1) = (w0.dims()[2], w1.dims()[2]);
    let pad = k0 + k1 - 2;
    let xp = Tensor::cat(vec![Tensor::zeros([b, pad, c], &x.device()), x], 1);
    // Depthwise: z_j = sum_t w0[:, 0, t] * xp_{j+t} + b0, for j in 0..s + k1 - 1.
    let len0 = s + k1 - 1;
    let mut z = b0.reshape([1, 1, c]).expand([b, len0, c]);
    for t in 0..k0 {
        let tap = w0.clone().slice([0..c, 0..1, t..t + 1]).reshape([1, 1, c]);
        z = z + xp.clone().slice([0..b, t..t + len0, 0..c]) * tap;
    }
    // Grouped: y_j = sum_t W1[:, :, t] z_{j+t} + b1, as one batched matmul per tap over groups.
    let cg = c / groups;
    let mut y = b1.reshape([1, 1, c]).expand([b, s, c]);
    for t in 0..k1 {
        // [C_out, cg_in] -> [groups, cg_out, cg_in] -> [groups, cg_in, cg_out]
        let w = w1
            .clone()
            .slice([0..c, 0..cg, t..t + 1])
            .reshape([groups, cg, cg])
            .swap_dims(1, 2);
        let zt = z
            .clone()
            .slice([0..b, t..t + s, 0..c])
            .reshape([b * s, groups, cg])
            .swap_dims(0, 1);
        let yt = zt.matmul(w).swap_dims(0, 1).reshape([b, s, c]);
        y = y + yt;
    }
    y
}

/// `x[:, t] <- x[:, t-1]`, with zeros at t = 0.
pub fn shift_right<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [b, s, h] = x.dims();
    let zeros = Tensor::zeros([b, 1, h], &x.device());
    Tensor::cat(vec![zeros, x.slice([0..b, 0..s - 1, 0..h])], 1)
}

/// Divides the last dimension by its L2 norm.
fn l2_normalize<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let norm = x
        .clone()
        .powf_scalar(2.0)
        .sum_dim(3)
        .add_scalar(1e-12)
        .sqrt();
    x / norm
}

/// `[b, kv_heads, s, d]` -> `[b, kv_heads * group, s, d]`, each KV head repeated `group` times.
fn repeat_kv<B: Backend>(x: Tensor<B, 4>, group: usize) -> Tensor<B, 4> {
    if group == 1 {
        return x;
    }
    let [b, h, s, d] = x.dims();
    x.reshape([b, h, 1, s, d])
        .repeat_dim(2, group)
        .reshape([b, h * group, s, d])
}

/// Partial rotary position embedding: the first `dim` channels of each head rotate
/// (rotate-half convention), the rest pass through.
pub struct Rope<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    dim: usize,
}

impl<B: Backend> Rope<B> {
    /// Tables for positions `0..seq`.
    pub fn new(seq: usize, dim: usize, base: f64, device: &B::Device) -> Self {
        let half = dim / 2;
        let mut cos = Vec::with_capacity(seq * dim);
        let mut sin = Vec::with_capacity(seq * dim);
        for pos in 0..seq {
            for i in 0..dim {
                let freq = base.powf(-2.0 * (i % half.max(1)) as f64 / dim as f64);
                let angle = pos as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let table = |v: Vec<f32>| {
            Tensor::<B, 1>::from_data(TensorData::new(v, [seq * dim]), device)
                .reshape([1, 1, seq, dim])
        };
        Rope {
            cos: table(cos),
            sin: table(sin),
            dim,
        }
    }

    /// Applies the rotation to `x: [batch, heads, seq, head_dim]`.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if self.dim == 0 {
            return x;
        }
        let [b, h, s, d] = x.dims();
        let half = self.dim / 2;
        let rot = x.clone().slice([0..b, 0..h, 0..s, 0..self.dim]);
        let x1 = rot.clone().slice([0..b, 0..h, 0..s, 0..half]);
        let x2 = rot.clone().slice([0..b, 0..h, 0..s, half..self.dim]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        let rot = rot * self.cos.clone() + rotated * self.sin.clone();
        if self.dim == d {
            rot
        } else {
            Tensor::cat(vec![rot, x.slice([0..b, 0..h, 0..s, self.dim..d])], 3)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Router and experts
// ---------------------------------------------------------------------------------------------

/// The ZAYA1 router: down-projection (+ EDA), RMSNorm, 3-layer GELU MLP, softmax.
#[derive(Module, Debug)]
pub struct Router<B: Backend> {
    /// hidden -> router dim, with bias.
    pub down_proj: Linear<B>,
    /// EDA's learned per-channel decay of the previous MoE layer's router state (absent in the
    /// first MoE layer).
    pub router_states_scale: Option<Param<Tensor<B, 1>>>,
    /// RMSNorm over the router state.
    pub rmsnorm_eda: RmsNorm<B>,
    /// The MLP: two GELU layers with bias, then routes without bias.
    pub router_mlp: Vec<Linear<B>>,
}

impl<B: Backend> Router<B> {
    /// Route probabilities `[n, routes]` and the pre-norm router state `[n, router_dim]` (the
    /// next MoE layer's EDA input) for tokens `x: [n, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        previous: Option<Tensor<B, 2>>,
        eps: f64,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let mut r = self.down_proj.forward(x);
        if let (Some(scale), Some(prev)) = (&self.router_states_scale, previous) {
            r = r + prev * scale.val().unsqueeze::<2>();
        }
        let mut y = self.rmsnorm_eda.forward(r.clone(), eps);
        let last = self.router_mlp.len() - 1;
        for (i, layer) in self.router_mlp.iter().enumerate() {
            y = layer.forward(y);
            if i < last {
                y = gelu(y);
            }
        }
        (softmax(y, 1), r)
    }
}

/// One SwiGLU expert: `linear_fc1` to `[gate; up]`, `silu(gate) * up`, `linear_fc2` back.
#[derive(Module, Debug)]
pub struct Expert<B: Backend> {
    /// hidden -> 2 x ffn (gate, then up).
    pub linear_fc1: Linear<B>,
    /// ffn -> hidden.
    pub linear_fc2: Linear<B>,
}

impl<B: Backend> Expert<B> {
    /// Applies the expert to `x: [n, hidden]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = self.linear_fc1.forward(x);
        let f = y.dims()[1] / 2;
        let n = y.dims()[0];
        let gate = y.clone().slice([0..n, 0..f]);
        let up = y.slice([0..n, f..2 * f]);
        self.linear_fc2.forward(silu(gate) * up)
    }
}

/// The MoE sub-layer: router, top-1 choice with balancing biases, experts, MoD skip route.
#[derive(Module, Debug)]
pub struct Moe<B: Backend> {
    /// The router.
    pub router: Router<B>,
    /// The experts.
    pub local_experts: Vec<Expert<B>>,
}

impl<B: Backend> Moe<B> {
    fn new(
        init: &mut Init<B>,
        path: &str,
        c: &ModelConfig,
        eda: bool,
        std: f64,
        out_std: f64,
    ) -> Self {
        let (h, d) = (c.hidden_size, c.router_dim);
        let routes = c.num_experts + usize::from(c.mod_skip);
        // The router is initialised like PyTorch's nn.Linear (the reference code's modules):
        // std 1/sqrt(3 fan_in). With the 0.02 used elsewhere its probabilities start identical
        // for every token, so the balancing biases alone decide the choice and the whole batch
        // swings from expert to expert.
        let router_std = |fan_in: usize| 1.0 / (3.0 * fan_in as f64).sqrt();
        let mut mlp = Vec::new();
        for i in 0..c.router_mlp_layers {
            let last = i + 1 == c.router_mlp_layers;
            mlp.push(init.linear(
                &format!("{path}.router.router_mlp.{}", 2 * i),
                d,
                if last { routes } else { d },
                !last,
                router_std(d),
            ));
        }
        Moe {
            router: Router {
                down_proj: init.linear(
                    &format!("{path}.router.down_proj"),
                    h,
                    d,
                    true,
                    router_std(h),
                ),
                router_states_scale: eda.then(|| {
                    init.constant(&format!("{path}.router.router_states_scale"), [d], 1.0)
                }),
                rmsnorm_eda: RmsNorm::new(init, &format!("{path}.router.rmsnorm_eda"), d),
                router_mlp: mlp,
            },
            local_experts: (0..c.num_experts)
                .map(|e| {
                    let p = format!("{path}.local_experts.{e}");
                    Expert {
                        linear_fc1: init.linear(
                            &format!("{p}.linear_fc1"),
                            h,
                            2 * c.expert_ffn,
                            false,
                            std,
                        ),
                        linear_fc2: init.linear(
                            &format!("{p}.linear_fc2"),
                            c.expert_ffn,
                            h,
                            false,
                            out_std,
                        ),
                    }
                })
                .collect(),
        }
    }

    /// `x: [batch, seq, hidden]` (normed) -> (output, pre-norm router state, tokens per route).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        router_state: Option<Tensor<B, 2>>,
        biases: &[f32],
        o: &Options,
    ) -> (Tensor<B, 3>, Tensor<B, 2>, Vec<u64>) {
        let [b, s, h] = x.dims();
        let n = b * s;
        let x = x.reshape([n, h]);
        let (probs, state) = self.router.forward(x.clone(), router_state, o.eps);
        let routes = probs.dims()[1];

        // Choice = argmax of the *detached* probabilities plus the balancing biases; the biases
        // steer the choice but never the output scale. Done on the host: it is a tiny [n, routes]
        // array, and the counting sort below needs it there anyway.
        let host: Vec<f32> = probs
            .clone()
            .detach()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .expect("f32 probabilities");
        let mut choice = vec![0usize; n];
        let mut counts = vec![0u64; routes];
        for (t, row) in host.chunks_exact(routes).enumerate() {
            let mut best = 0;
            for r in 1..routes {
                if row[r] + biases[r] > row[best] + biases[best] {
                    best = r;
                }
            }
            choice[t] = best;
            counts[best] += 1;
        }

        // Dispatch: a stable counting sort of tokens by route, so each expert sees one
        // contiguous slice; the inverse permutation puts outputs back in token order.
        let mut start = vec![0usize; routes + 1];
        for r in 0..routes {
            start[r + 1] = start[r] + counts[r] as usize;
        }
        let mut next = start.clone();
        let mut order = vec![0i64; n];
        let mut inverse = vec![0i64; n];
        for (t, &r) in choice.iter().enumerate() {
            order[next[r]] = t as i64;
            inverse[t] = next[r] as i64;
            next[r] += 1;
        }
        let device = x.device();
        let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n]), &device);
        let sorted = x.select(0, index(order));
        let mut outputs = Vec::with_capacity(routes);
        for r in 0..routes {
            let len = counts[r] as usize;
            if len == 0 {
                continue;
            }
            let rows = sorted.clone().narrow(0, start[r], len);
            // Route `num_experts` is the MoD skip: the token passes through unchanged.
            outputs.push(if r < o.num_experts {
                self.local_experts[r].forward(rows)
            } else {
                rows
            });
        }
        let out = Tensor::cat(outputs, 0).select(0, index(inverse));

        // Scale by the chosen route's (unbiased, differentiable) probability.
        let chosen = Tensor::<B, 2, Int>::from_data(
            TensorData::new(choice.iter().map(|&c| c as i64).collect::<Vec<_>>(), [n, 1]),
            &device,
        );
        let prob = probs.gather(1, chosen);
        ((out * prob).reshape([b, s, h]), state, counts)
    }
}

// ---------------------------------------------------------------------------------------------
// Shared pieces: norms, residual scaling, initialisation
// ---------------------------------------------------------------------------------------------

/// RMSNorm with a learned per-channel `weight` (the reference's name; burn's RmsNorm calls it
/// `gamma`).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel gain, init 1.
    pub weight: Param<Tensor<B, 1>>,
}

impl<B: Backend> RmsNorm<B> {
    fn new(init: &mut Init<B>, path: &str, dim: usize) -> Self {
        RmsNorm {
            weight: init.constant(&format!("{path}.weight"), [dim], 1.0),
        }
    }

    /// Normalises the last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
        let rms = x
            .clone()
            .powf_scalar(2.0)
            .mean_dim(D - 1)
            .add_scalar(eps)
            .sqrt();
        (x / rms) * self.weight.val().unsqueeze::<D>()
    }
}

/// ZAYA1's residual scaling: `x <- (x + bias) * scale` per channel for the sub-layer output
/// and (except before layer 0) for the residual stream.
#[derive(Module, Debug)]
pub struct ResidualScaling<B: Backend> {
    /// Gate on the sub-layer output, init 1.
    pub hidden_states_scale: Param<Tensor<B, 1>>,
    /// Bias on the sub-layer output, init 0.
    pub hidden_states_bias: Param<Tensor<B, 1>>,
    /// Gate on the residual stream, init 1.
    pub residual_scale: Option<Param<Tensor<B, 1>>>,
    /// Bias on the residual stream, init 0.
    pub residual_bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> ResidualScaling<B> {
    fn new(init: &mut Init<B>, path: &str, dim: usize, with_residual: bool) -> Self {
        ResidualScaling {
            hidden_states_scale: init.constant(&format!("{path}.hidden_states_scale"), [dim], 1.0),
            hidden_states_bias: init.constant(&format!("{path}.hidden_states_bias"), [dim], 0.0),
            residual_scale: with_residual
                .then(|| init.constant(&format!("{path}.residual_scale"), [dim], 1.0)),
            residual_bias: with_residual
                .then(|| init.constant(&format!("{path}.residual_bias"), [dim], 0.0)),
        }
    }

    /// Gates `(residual, hidden)`.
    pub fn forward(
        &self,
        residual: Option<Tensor<B, 3>>,
        hidden: Tensor<B, 3>,
    ) -> (Option<Tensor<B, 3>>, Tensor<B, 3>) {
        let gate = |x: Tensor<B, 3>, bias: &Param<Tensor<B, 1>>, scale: &Param<Tensor<B, 1>>| {
            (x + bias.val().unsqueeze::<3>()) * scale.val().unsqueeze::<3>()
        };
        let hidden = gate(hidden, &self.hidden_states_bias, &self.hidden_states_scale);
        let residual = match (residual, &self.residual_scale, &self.residual_bias) {
            (Some(r), Some(scale), Some(bias)) => Some(gate(r, bias, scale)),
            (r, _, _) => r,
        };
        (residual, hidden)
    }
}

/// Deterministic parameter initialisation: normal draws from a seeded host generator, and
/// parameter ids derived from the parameter's path, so optimizer state saved by one process
/// finds its parameters in another.
struct Init<'a, B: Backend> {
    rng: SplitMix64,
    device: &'a B::Device,
}

impl<'a, B: Backend> Init<'a, B> {
    fn new(seed: u64, device: &'a B::Device) -> Self {
        Init {
            rng: SplitMix64(seed ^ 0x5a59_4131),
            device,
        }
    }

    fn param<const D: usize>(
        &self,
        path: &str,
        values: Vec<f32>,
        shape: [usize; D],
    ) -> Param<Tensor<B, D>> {
        let tensor = Tensor::<B, D>::from_data(TensorData::new(values, shape), self.device);
        Param::initialized(param_id(path), tensor.require_grad())
    }

    fn normal<const D: usize>(
        &mut self,
        path: &str,
        shape: [usize; D],
        std: f64,
    ) -> Param<Tensor<B, D>> {
        let n = shape.iter().product();
        let values = (0..n).map(|_| (self.rng.normal() * std) as f32).collect();
        self.param(path, values, shape)
    }

    fn constant<const D: usize>(
        &mut self,
        path: &str,
        shape: [usize; D],
        value: f32,
    ) -> Param<Tensor<B, D>> {
        self.param(path, vec![value; shape.iter().product()], shape)
    }

    fn linear(&mut self, path: &str, d_in: usize, d_out: usize, bias: bool, std: f64) -> Linear<B> {
        Linear {
            weight: self.normal(&format!("{path}.weight"), [d_in, d_out], std),
            bias: bias.then(|| self.constant(&format!("{path}.bias"), [d_out], 0.0)),
        }
    }

    /// A causal conv weight `[c, c_in_per_group, k]` that starts as (mostly) the identity on the
    /// newest tap, plus small noise.
    fn conv_near_identity(
        &mut self,
        path: &str,
        c: usize,
        per_group: usize,
        k: usize,
    ) -> Param<Tensor<B, 3>> {
        let mut values = vec![0f32; c * per_group * k];
        for o in 0..c {
            for i in 0..per_group {
                for t in 0..k {
                    let noise = (self.rng.normal() * 0.02) as f32;
                    let identity = t == k - 1 && (per_group == 1 || i == o % per_group);
                    values[(o * per_group + i) * k + t] = noise + if identity { 1.0 } else { 0.0 };
                }
            }
        }
        self.param(path, values, [c, per_group, k])
    }
}

/// The reference implementation's name (Zyphra's `transformers` fork, `ZayaForCausalLM`) of one
/// of our parameters, e.g. `blocks.1.moe.local_experts.3.linear_fc1.weight` ->
/// `model.layers.3.zaya_block.experts.local_experts.3.linear_fc1.weight`. Our blocks pair the
/// reference's layers: attention is layer `2i`, the MoE layer `2i + 1`. Linear weights are
/// stored transposed relative to PyTorch (export transposes them back).
pub fn reference_name(name: &str) -> Option<String> {
    if name == "embed_tokens" {
        return Some("model.embed_tokens.weight".into());
    }
    if let Some(rest) = name.strip_prefix("res_scale.") {
        return Some(format!("model.res_scale.{rest}"));
    }
    if name == "final_norm.weight" {
        return Some("model.final_norm.weight".into());
    }
    let rest = name.strip_prefix("blocks.")?;
    let (block, rest) = rest.split_once('.')?;
    let block: usize = block.parse().ok()?;
    let (attn, moe) = (2 * block, 2 * block + 1);
    let mapped = if let Some(r) = rest.strip_prefix("attn_res_scale.") {
        format!("{attn}.res_scale.{r}")
    } else if let Some(r) = rest.strip_prefix("attn_norm.") {
        format!("{attn}.input_norm.{r}")
    } else if let Some(r) = rest.strip_prefix("self_attn.qkv.") {
        let r = match r {
            "conv0_weight" => "conv_qk.0.weight",
            "conv0_bias" => "conv_qk.0.bias",
            "conv1_weight" => "conv_qk.1.weight",
            "conv1_bias" => "conv_qk.1.bias",
            other => other,
        };
        format!("{attn}.self_attn.qkv.{r}")
    } else if let Some(r) = rest.strip_prefix("self_attn.") {
        format!("{attn}.self_attn.{r}")
    } else if let Some(r) = rest.strip_prefix("moe_res_scale.") {
        format!("{moe}.res_scale.{r}")
    } else if let Some(r) = rest.strip_prefix("moe_norm.") {
        format!("{moe}.input_norm.{r}")
    } else if let Some(r) = rest.strip_prefix("moe.router.router_mlp.") {
        // Our Vec holds the linears only; the reference's Sequential has GELUs at 1 and 3.
        let (k, tail) = r.split_once('.')?;
        format!(
            "{moe}.zaya_block.router.router_mlp.{}.{tail}",
            2 * k.parse::<usize>().ok()?
        )
    } else if let Some(r) = rest.strip_prefix("moe.router.") {
        format!("{moe}.zaya_block.router.{r}")
    } else if let Some(r) = rest.strip_prefix("moe.local_experts.") {
        format!("{moe}.zaya_block.experts.local_experts.{r}")
    } else {
        return None;
    };
    Some(format!("model.layers.{mapped}"))
}

/// A parameter id that is a pure function of the parameter's path.
pub fn param_id(path: &str) -> ParamId {
    let hash = blake3::hash(path.as_bytes());
    ParamId::from(u64::from_le_bytes(
        hash.as_bytes()[..8].try_into().expect("8 bytes"),
    ))
}
