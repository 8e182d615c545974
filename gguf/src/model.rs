//! The forward pass of a quantized Gemma 3 or Llama model on candle's CPU kernels.
//!
//! Written here rather than taken from `candle_transformers::models::quantized_{gemma3,llama}`
//! because scoring needs what those do not give: logits at every continuation position (they
//! return the last position's only), several sequences sharing one prefix in one pass (their
//! mask hides the whole KV cache from any multi-token step after the first), and arbitrary
//! positions per row. (candle-transformers 0.11.1's quantized Gemma 3 also applies SiLU where
//! Gemma 3 uses GELU-tanh, and builds 128k-position rotary tables per layer.) The graph follows
//! llama.cpp's `gemma3` and `llama` builders, so the numbers can be checked against it.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{Device, Module, Tensor};

use crate::batch::Packed;
use crate::config::{Arch, Config};
use crate::qgemm::{QActs, QMatrix};

/// A weight matrix `[out, in]`, kept quantized for single-row steps (generation: candle's
/// quantized kernels, one row at a time) and, unless disabled, also in the block form of
/// [`QMatrix`] for multi-row passes (scoring).
///
/// Why both: candle 0.11's quantized matrix products read every weight block once per
/// activation row and have no AVX2 kernel for Q5_0; the integer kernel of [`crate::qgemm`]
/// tiles rows and columns and runs ~2x faster than candle's f32 GEMM on dequantized weights
/// (which this adapter used before), at 2 bytes a weight. It rounds the activations to 16
/// bits (one scale a row), so scores stay within ~0.01 of the f32 product of the same weights.
/// Formats the kernel does not know are dequantized to f32 for candle's GEMM instead.
pub(crate) struct Linear {
    q: QMatMul,
    fast: Option<Fast>,
}

enum Fast {
    Int(QMatrix),
    F32(Tensor),
}

/// A layer input, quantized once for all the matrices that read it.
pub(crate) enum Input<'a> {
    /// Generation steps (candle's kernels).
    Plain(&'a Tensor),
    /// Multi-row passes: the tensor and, for the integer kernel, its 16-bit form.
    Batch(&'a Tensor, QActs),
}

impl<'a> Input<'a> {
    fn new(x: &'a Tensor, batch: bool) -> Result<Self> {
        if !batch {
            return Ok(Input::Plain(x));
        }
        let (m, k) = x.dims2()?;
        let flat: Vec<f32> = x.flatten_all()?.to_vec1()?;
        Ok(Input::Batch(x, QActs::quantize(&flat, m, k)))
    }
}

impl Linear {
    fn new(t: QTensor, fast: bool) -> Result<Self> {
        let f = if fast { Some(Fast::of(&t)?) } else { None };
        // Q5_0 has no SIMD dot product in candle; its blocks convert exactly to Q8_0's (same
        // 32-value blocks and f16 scale, 5-bit integers widened to 8), which has one.
        let t = if t.dtype() == GgmlDType::Q5_0 {
            q5_0_to_q8_0(&t)?
        } else {
            t
        };
        Ok(Linear {
            q: QMatMul::from_qtensor(t)?,
            fast: f,
        })
    }

    fn from_arc(t: Arc<QTensor>, fast: bool) -> Result<Self> {
        let f = if fast { Some(Fast::of(&t)?) } else { None };
        Ok(Linear {
            q: QMatMul::from_arc(t)?,
            fast: f,
        })
    }

    /// `x @ W^T`: through the integer kernel for a [`Input::Batch`] (and when kept), candle's
    /// quantized kernels otherwise. The choice is the caller's, not the row count's, so a
    /// request scores the same in any batch.
    fn forward(&self, x: &Input) -> Result<Tensor> {
        Ok(match (x, &self.fast) {
            (Input::Batch(_, a), Some(Fast::Int(w))) => {
                Tensor::from_vec(w.matmul(a)?, (a.rows(), w.n), &Device::Cpu)?
            }
            (Input::Batch(t, _), Some(Fast::F32(w))) => t.matmul(&w.t()?)?,
            (Input::Batch(t, _) | Input::Plain(t), _) => self.q.forward(t)?,
        })
    }
}

impl Linear {
    /// The integer kernel's copy, if kept.
    fn int(&self) -> Option<&QMatrix> {
        match &self.fast {
            Some(Fast::Int(w)) => Some(w),
            _ => None,
        }
    }
}

impl Fast {
    fn of(t: &QTensor) -> Result<Fast> {
        Ok(match QMatrix::from_qtensor(t)? {
            Some(w) => Fast::Int(w),
            None => Fast::F32(t.dequantize(&Device::Cpu)?),
        })
    }
}

/// Q5_0 blocks (f16 scale, 4 bytes of high bits, 16 bytes of low nibbles) as Q8_0 blocks (f16
/// scale, 32 signed bytes): value j is `(low nibble | high bit << 4) - 16`, as in ggml's
/// `dequantize_row_q5_0`.
pub(crate) fn q5_0_to_q8_0(t: &QTensor) -> Result<QTensor> {
    let src = t.data()?;
    let mut out = Vec::with_capacity(src.len() / 22 * 34);
    for b in src.chunks_exact(22) {
        out.extend_from_slice(&b[0..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let mut vals = [0u8; 32];
        for j in 0..16 {
            let h0 = (((qh >> j) << 4) & 0x10) as u8;
            let h1 = ((qh >> (j + 12)) & 0x10) as u8;
            vals[j] = (((qs[j] & 0x0F) | h0) as i8 - 16) as u8;
            vals[j + 16] = (((qs[j] >> 4) | h1) as i8 - 16) as u8;
        }
        out.extend_from_slice(&vals);
    }
    Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
        GgmlDType::Q8_0,
        &out,
        t.shape().dims().to_vec(),
        &Device::Cpu,
    )?)
}

struct Layer {
    attn_norm: Tensor,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
    post_ffn_norm: Option<Tensor>,
    local: bool,
}

/// Keys and values of every layer for the tokens seen so far (generation).
pub struct KvCache {
    kv: Vec<(Tensor, Tensor)>,
    /// Tokens cached.
    pub len: usize,
}

impl KvCache {
    /// A copy (tensors are shared until a step replaces them).
    pub fn clone_of(other: &KvCache) -> KvCache {
        KvCache {
            kv: other.kv.clone(),
            len: other.len,
        }
    }
}

/// A loaded model.
pub struct Model {
    /// Hyperparameters.
    pub cfg: Config,
    embed: Arc<QTensor>,
    layers: Vec<Layer>,
    norm: Tensor,
    output: Linear,
    device: Device,
}

fn norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?)
}

impl Model {
    /// Reads the weights of a GGUF file; `dense` keeps the integer kernel's copies for multi-row
    /// passes (see `Linear`).
    pub fn load(
        path: &Path,
        content: &gguf_file::Content,
        cfg: Config,
        dense: bool,
    ) -> Result<Self> {
        let device = Device::Cpu;
        let mut file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut qt = |name: &str| -> Result<QTensor> {
            content
                .tensor(&mut file, name, &device)
                .with_context(|| format!("{}: tensor {name}", path.display()))
        };
        let embed = Arc::new(qt("token_embd.weight")?);
        let output = match content.tensor_infos.contains_key("output.weight") {
            true => Linear::new(qt("output.weight")?, dense)?,
            false => Linear::from_arc(embed.clone(), dense)?,
        };
        let norm = qt("output_norm.weight")?.dequantize(&device)?;
        let gemma = cfg.arch == Arch::Gemma3;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let mut t = |n: &str| qt(&format!("blk.{i}.{n}.weight"));
            let mut mm = |n: &str| -> Result<Linear> { Linear::new(t(n)?, dense) };
            let (wq, wk, wv, wo) = (
                mm("attn_q")?,
                mm("attn_k")?,
                mm("attn_v")?,
                mm("attn_output")?,
            );
            let (gate, up, down) = (mm("ffn_gate")?, mm("ffn_up")?, mm("ffn_down")?);
            let mut f32t = |n: &str| -> Result<Tensor> { Ok(t(n)?.dequantize(&device)?) };
            let opt =
                |n: &str, f: &mut dyn FnMut(&str) -> Result<Tensor>| -> Result<Option<Tensor>> {
                    if gemma { f(n).map(Some) } else { Ok(None) }
                };
            layers.push(Layer {
                attn_norm: f32t("attn_norm")?,
                q_norm: opt("attn_q_norm", &mut f32t)?,
                k_norm: opt("attn_k_norm", &mut f32t)?,
                post_attn_norm: opt("post_attention_norm", &mut f32t)?,
                ffn_norm: f32t("ffn_norm")?,
                post_ffn_norm: opt("post_ffw_norm", &mut f32t)?,
                wq,
                wk,
                wv,
                wo,
                gate,
                up,
                down,
                local: cfg.is_local(i),
            });
        }
        Ok(Model {
            cfg,
            embed,
            layers,
            norm,
            output,
            device,
        })
    }

    /// cos and sin tables (`positions x head_dim/2`) for one rotary base.
    fn rope_tables(&self, positions: &[u32], base: f32) -> Result<(Tensor, Tensor)> {
        let half = self.cfg.head_dim / 2;
        let inv: Vec<f64> = (0..half)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / self.cfg.head_dim as f64))
            .collect();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, &self.device)?,
            Tensor::from_vec(sin, shape, &self.device)?,
        ))
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::from_slice(tokens, tokens.len(), &self.device)?;
        let x = self.embed.embedding(&ids)?;
        Ok(match self.cfg.arch {
            Arch::Gemma3 => (x * (self.cfg.n_embd as f64).sqrt())?,
            Arch::Llama => x,
        })
    }

    /// Projections with norms and rotary embeddings: q `[H, M, hd]` (already scaled by
    /// 1/sqrt(hd)), k and v `[KV, M, hd]`.
    fn qkv(
        &self,
        layer: &Layer,
        h: &Tensor,
        rope: &(Tensor, Tensor),
        dense: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.cfg;
        let m = h.dim(0)?;
        let h = Input::new(h, dense)?;
        let mut q = layer.wq.forward(&h)?.reshape((m, c.n_head, c.head_dim))?;
        let mut k = layer
            .wk
            .forward(&h)?
            .reshape((m, c.n_kv_head, c.head_dim))?;
        let v = layer
            .wv
            .forward(&h)?
            .reshape((m, c.n_kv_head, c.head_dim))?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = norm(&q, qn, c.eps)?;
            k = norm(&k, kn, c.eps)?;
        }
        let rot = |x: Tensor| -> Result<Tensor> {
            let x = x.transpose(0, 1)?.contiguous()?.unsqueeze(0)?;
            let x = match c.arch {
                // llama.cpp's NEOX rotation (halves) for Gemma, the interleaved one for Llama
                // (GGUF's Llama q/k weights are permuted for it).
                Arch::Gemma3 => candle_nn::rotary_emb::rope(&x, &rope.0, &rope.1)?,
                Arch::Llama => candle_nn::rotary_emb::rope_i(&x, &rope.0, &rope.1)?,
            };
            Ok(x.squeeze(0)?)
        };
        let q = (rot(q)? * (1.0 / (c.head_dim as f64).sqrt()))?;
        let k = rot(k)?;
        let v = v.transpose(0, 1)?.contiguous()?;
        Ok((q, k, v))
    }

    /// Softmax attention of q `[H, L, hd]` over k, v `[KV, L', hd]`, with an additive mask
    /// `[L, L']`; returns `[H, L, hd]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let c = &self.cfg;
        let g = c.n_head / c.n_kv_head;
        let l = q.dim(1)?;
        let lk = k.dim(1)?;
        // Grouped-query attention without copying k/v per head: the g query heads of one kv
        // head become g*L rows of one matrix product.
        let q = q.contiguous()?.reshape((c.n_kv_head, g * l, c.head_dim))?;
        let mut s = q.matmul(&k.contiguous()?.t()?)?;
        if let Some(mask) = mask {
            s = s
                .reshape((c.n_kv_head, g, l, lk))?
                .broadcast_add(mask)?
                .reshape((c.n_kv_head, g * l, lk))?;
        }
        let p = candle_nn::ops::softmax_last_dim(&s)?;
        Ok(p.matmul(&v.contiguous()?)?
            .reshape((c.n_head, l, c.head_dim))?)
    }

    /// The rest of a block after attention: output projection, residuals, MLP.
    fn finish(&self, layer: &Layer, x: &Tensor, attn: &Tensor, dense: bool) -> Result<Tensor> {
        let eps = self.cfg.eps;
        let mut o = layer.wo.forward(&Input::new(attn, dense)?)?;
        if let Some(n) = &layer.post_attn_norm {
            o = norm(&o, n, eps)?;
        }
        let x = (x + o)?;
        let h = norm(&x, &layer.ffn_norm, eps)?;
        let h = Input::new(&h, dense)?;
        let gemma = self.cfg.arch == Arch::Gemma3;
        let mut f = match (&h, layer.gate.int(), layer.up.int(), layer.down.int()) {
            // The integer kernels end to end: activation and product on plain vectors, rounded
            // once for `down`.
            (Input::Batch(_, a), Some(g), Some(u), Some(d)) => {
                let (mut act, up) = (g.matmul(a)?, u.matmul(a)?);
                use rayon::prelude::*;
                act.par_chunks_mut(4096)
                    .zip(up.par_chunks(4096))
                    .for_each(|(g, u)| {
                        for (g, &u) in g.iter_mut().zip(u) {
                            *g = if gemma { gelu_tanh(*g) } else { silu(*g) } * u;
                        }
                    });
                let m = a.rows();
                Tensor::from_vec(
                    d.matmul(&QActs::quantize(&act, m, g.n))?,
                    (m, d.n),
                    &Device::Cpu,
                )?
            }
            _ => {
                let gate = layer.gate.forward(&h)?;
                let act = match gemma {
                    true => gate.gelu()?, // tanh approximation, as llama.cpp and HF's gelu_pytorch_tanh
                    false => candle_nn::ops::silu(&gate)?,
                };
                layer
                    .down
                    .forward(&Input::new(&(act * layer.up.forward(&h)?)?, dense)?)?
            }
        };
        if let Some(n) = &layer.post_ffn_norm {
            f = norm(&f, n, eps)?;
        }
        Ok((x + f)?)
    }

    /// Hidden states `[M, d]` (before the final norm) of a packed batch; with `kv_out`, each
    /// layer's keys and values are kept (for a single-segment prefill).
    pub fn hidden_packed(&self, p: &Packed, mut kv_out: Option<&mut KvCache>) -> Result<Tensor> {
        let c = &self.cfg;
        let m = p.tokens.len();
        let mut x = self.embed(&p.tokens)?;
        let rope_global = self.rope_tables(&p.positions, c.rope_base)?;
        let rope_local = self.rope_tables(&p.positions, c.rope_base_local)?;
        let mut masks = Vec::with_capacity(p.segments.len());
        for s in &p.segments {
            let n = s.len();
            let global = Tensor::from_vec(s.mask(None), (n, n), &self.device)?;
            // The local mask differs only when the segment spans more than the window.
            let span = s.pos.iter().max().copied().unwrap_or(0) as usize + 1;
            let local = match c.sliding_window {
                Some(w) if span > w => Tensor::from_vec(s.mask(Some(w)), (n, n), &self.device)?,
                _ => global.clone(),
            };
            masks.push((global, local));
        }
        for layer in &self.layers {
            let h = norm(&x, &layer.attn_norm, c.eps)?;
            let rope = if layer.local {
                &rope_local
            } else {
                &rope_global
            };
            let (q, k, v) = self.qkv(layer, &h, rope, true)?;
            let mut outs = Vec::with_capacity(p.segments.len());
            for (s, (mg, ml)) in p.segments.iter().zip(&masks) {
                let (start, n) = (s.start, s.len());
                let mask = if layer.local { ml } else { mg };
                outs.push(self.attend(
                    &q.narrow(1, start, n)?,
                    &k.narrow(1, start, n)?,
                    &v.narrow(1, start, n)?,
                    Some(mask),
                )?);
            }
            let attn = Tensor::cat(&outs, 1)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((m, c.n_head * c.head_dim))?;
            if let Some(cache) = kv_out.as_deref_mut() {
                cache.kv.push((k, v));
                cache.len = m;
            }
            x = self.finish(layer, &x, &attn, true)?;
        }
        Ok(x)
    }

    /// Logits `[R, vocab]` of hidden states `[R, d]` (dense: see `Linear::forward`).
    pub fn logits(&self, hidden: &Tensor, dense: bool) -> Result<Tensor> {
        let h = norm(hidden, &self.norm, self.cfg.eps)?;
        self.output.forward(&Input::new(&h, dense)?)
    }

    /// For each row of hidden states `[R, d]`, `log softmax(logits)[t]` and whether `t` is the
    /// argmax (first of equal maxima), for each `t` of `targets[row]` (dense: see
    /// `Linear::forward`). With the integer kernel the output layer is reduced a chunk of the
    /// vocabulary at a time, never writing the `R x vocab` logits; the chunks and the order
    /// they are combined in are fixed, so the result does not depend on threads or batch.
    pub fn token_logprobs(
        &self,
        hidden: &Tensor,
        targets: &[Vec<u32>],
        dense: bool,
    ) -> Result<Vec<Vec<(f64, bool)>>> {
        let h = norm(hidden, &self.norm, self.cfg.eps)?;
        let Some(w) = self.output.int().filter(|_| dense) else {
            let logits = self.output.forward(&Input::new(&h, dense)?)?;
            let vocab = logits.dim(1)?;
            let flat: Vec<f32> = logits.flatten_all()?.to_vec1()?;
            use rayon::prelude::*;
            return Ok(flat
                .par_chunks(vocab)
                .zip(targets)
                .map(|(l, ts)| ts.iter().map(|&t| token_logprob(l, t)).collect())
                .collect());
        };
        let Input::Batch(_, x) = Input::new(&h, true)? else {
            unreachable!()
        };
        // Per chunk and row: max, its first index, sum of exp(logit - max); and the logits of
        // the targets in the chunk.
        let chunks = w.map_column_chunks(&x, LOGIT_CHUNK, |c_lo, vals| {
            let width = vals.len() / targets.len();
            let mut stats = Vec::with_capacity(targets.len());
            let mut hits = Vec::new();
            for (r, row) in vals.chunks_exact(width).enumerate() {
                let (max, arg, sum) = softmax_stats(row);
                stats.push((max, (c_lo + arg) as u32, sum));
                for &t in &targets[r] {
                    if (c_lo..c_lo + width).contains(&(t as usize)) {
                        hits.push((r, t, row[t as usize - c_lo]));
                    }
                }
            }
            (stats, hits)
        })?;
        let logits: std::collections::HashMap<(usize, u32), f32> = chunks
            .iter()
            .flat_map(|(_, hits)| hits)
            .map(|&(r, t, v)| ((r, t), v))
            .collect();
        let mut out = Vec::with_capacity(targets.len());
        for (r, ts) in targets.iter().enumerate() {
            let (mut max, mut arg) = (f32::NEG_INFINITY, 0u32);
            for (stats, _) in &chunks {
                if stats[r].0 > max {
                    (max, arg) = (stats[r].0, stats[r].1);
                }
            }
            let sum: f64 = chunks
                .iter()
                .map(|(stats, _)| stats[r].2 * ((stats[r].0 - max) as f64).exp())
                .sum();
            let lse = sum.ln();
            out.push(
                ts.iter()
                    .map(|&t| {
                        let logit = logits.get(&(r, t)).copied().unwrap_or(f32::NAN);
                        ((logit - max) as f64 - lse, arg == t)
                    })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// Runs `tokens` as one sequence, keeping the KV cache; returns the last position's logits.
    pub fn prefill(&self, tokens: &[u32]) -> Result<(KvCache, Vec<f32>)> {
        let n = tokens.len();
        let seg = crate::batch::Segment {
            start: 0,
            branch: vec![0; n],
            pos: (0..n as u32).collect(),
        };
        let p = Packed {
            tokens: tokens.to_vec(),
            positions: seg.pos.clone(),
            segments: vec![seg],
            targets: vec![],
        };
        let mut cache = KvCache {
            kv: Vec::with_capacity(self.layers.len()),
            len: 0,
        };
        let h = self.hidden_packed(&p, Some(&mut cache))?;
        let last = self.logits(&h.narrow(0, n - 1, 1)?, true)?;
        Ok((cache, last.flatten_all()?.to_vec1()?))
    }

    /// One generation step: appends `token` at the cache's end; returns the next logits.
    /// Generation runs it on candle's quantized kernels (`dense: false`; `true` computes what
    /// the packed path computes).
    pub fn step(&self, cache: &mut KvCache, token: u32, dense: bool) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let pos = [cache.len as u32];
        let mut x = self.embed(&[token])?;
        let rope_global = self.rope_tables(&pos, c.rope_base)?;
        let rope_local = self.rope_tables(&pos, c.rope_base_local)?;
        for (layer, (kc, vc)) in self.layers.iter().zip(cache.kv.iter_mut()) {
            let h = norm(&x, &layer.attn_norm, c.eps)?;
            let (q, k, v) = self.qkv(
                layer,
                &h,
                if layer.local {
                    &rope_local
                } else {
                    &rope_global
                },
                dense,
            )?;
            *kc = Tensor::cat(&[&*kc, &k], 1)?;
            *vc = Tensor::cat(&[&*vc, &v], 1)?;
            let total = kc.dim(1)?;
            let (ks, vs) = match c.sliding_window {
                Some(w) if layer.local && total > w => {
                    (kc.narrow(1, total - w, w)?, vc.narrow(1, total - w, w)?)
                }
                _ => (kc.clone(), vc.clone()),
            };
            let attn = self
                .attend(&q, &ks, &vs, None)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((1, c.n_head * c.head_dim))?;
            x = self.finish(layer, &x, &attn, dense)?;
        }
        cache.len += 1;
        Ok(self.logits(&x, dense)?.flatten_all()?.to_vec1()?)
    }
}

/// Vocabulary words per chunk of the output layer's reduction (see [`Model::token_logprobs`]).
const LOGIT_CHUNK: usize = 256;

/// The max of `row`, its first index, and the sum of `e^(v - max)` (8 lanes of f32, added in a
/// fixed order; written so that the compiler vectorises it).
fn softmax_stats(row: &[f32]) -> (f32, usize, f64) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let (body, tail) = row.as_chunks::<8>();
    for c in body {
        for l in 0..8 {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let max = tail.iter().fold(
        lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)),
        |m, &v| m.max(v),
    );
    let arg = row.iter().position(|&v| v == max).unwrap_or(0);
    let mut sums = [0f32; 8];
    for c in body {
        for l in 0..8 {
            sums[l] += exp(c[l] - max);
        }
    }
    let tail: f32 = tail.iter().map(|&v| exp(v - max)).sum();
    (
        max,
        arg,
        sums.iter().map(|&v| v as f64).sum::<f64>() + tail as f64,
    )
}

/// `e^x` to ~2 ulp for `x` in `[-87.3, 88.3]` (0 below, `e^88.3` above), in plain arithmetic the
/// compiler vectorises: Cephes' `expf` (Cody-Waite reduction by ln 2, degree-7 polynomial).
/// Used where libm's scalar `expf`/`tanhf` calls were a tenth of the scoring time (the
/// log-softmax over the vocabulary, GELU); the same on every CPU.
pub fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.3, 88.3);
    let n = (xc * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = (xc - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = p * r + c;
    }
    let y = p * (r * r) + r + 1.0;
    // 2^n from n's bits in MAGIC + n.
    let two_n = f32::from_bits(
        ((n + MAGIC)
            .to_bits()
            .wrapping_sub(MAGIC.to_bits())
            .wrapping_add(127))
            << 23,
    );
    if x < -87.3 { 0.0 } else { y * two_n }
}

/// GELU, tanh approximation (llama.cpp's, HF's `gelu_pytorch_tanh`), as `x * sigmoid(2z)`
/// (`0.5 * (1 + tanh z) = sigmoid(2z)`).
fn gelu_tanh(x: f32) -> f32 {
    let z = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * z))
}

/// SiLU, `x * sigmoid(x)`.
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `log softmax(logits)[target]` and whether `target` is the argmax (first of equal maxima).
pub fn token_logprob(logits: &[f32], target: u32) -> (f64, bool) {
    let (mut max, mut arg) = (f32::NEG_INFINITY, 0usize);
    for (i, &x) in logits.iter().enumerate() {
        if x > max {
            max = x;
            arg = i;
        }
    }
    // Sum in chunks of f32 (vectorises), accumulated in f64.
    let mut sum = 0f64;
    for chunk in logits.chunks(1024) {
        sum += chunk.iter().map(|&x| (x - max).exp()).sum::<f32>() as f64;
    }
    let lp = (logits[target as usize] - max) as f64 - sum.ln();
    (lp, arg == target as usize)
}

#[cfg(test)]
mod tests;
