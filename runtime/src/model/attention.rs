//! CCA attention: compressed convolutional attention with grouped KV heads, and RoPE.

use super::Options;
use super::layers::Init;
use crate::model::config::ModelConfig;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

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
    pub(super) fn new(
        init: &mut Init<B>,
        path: &str,
        c: &ModelConfig,
        std: f64,
        out_std: f64,
    ) -> Self {
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
    /// A query sees the `window` tokens up to and including itself (0: all before it).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        window: usize,
        o: &Options,
    ) -> Tensor<B, 3> {
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
        // A sliding window also hides keys `window` or more positions back (transformers'
        // `hybrid_sliding`: key j is seen from query i when i - window < j <= i).
        let mask = if window > 0 && window < s {
            let hidden: Vec<bool> = (0..s * s)
                .map(|at| {
                    let (i, j) = (at / s, at % s);
                    j > i || i - j >= window
                })
                .collect();
            Tensor::<B, 2, burn::tensor::Bool>::from_data(
                TensorData::new(hidden, [s, s]),
                &scores.device(),
            )
        } else {
            Tensor::<B, 2, burn::tensor::Bool>::tril_mask([s, s], 0, &scores.device())
        };
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
pub(super) fn l2_normalize<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let norm = x
        .clone()
        .powf_scalar(2.0)
        .sum_dim(3)
        .add_scalar(1e-12)
        .sqrt();
    x / norm
}

/// `[b, kv_heads, s, d]` -> `[b, kv_heads * group, s, d]`, each KV head repeated `group` times.
pub(super) fn repeat_kv<B: Backend>(x: Tensor<B, 4>, group: usize) -> Tensor<B, 4> {
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
    pub(super) cos: Tensor<B, 4>,
    pub(super) sin: Tensor<B, 4>,
    pub(super) dim: usize,
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
