//! The sizing arithmetic of a ZAYA1 model configuration ([`crate::model::config`]): parameter counts, FLOPs per
//! token, the torch engine's memory per rank ([`memory`]), and a sizing lint. Pure
//! arithmetic, no tensors; `zflow size` prints [`ModelConfig::report`].
//!
//! Every number comes from the ZAYA1 report (arXiv 2511.17127, "the report" below) and the
//! shapes in Zyphra's released inference code (`modular_zaya.py`). The defaults are
//! ZAYA1-base, and [`ModelConfig::params`] reproduces the counts those shapes give: attention
//! 5.586M per layer, router 0.661M per MoE layer, expert 12.583M, 8.303B total and 753.6M
//! active without the 537M tied embedding.
//!

pub mod memory;
pub mod projection;

use serde::Serialize;

use self::memory::{EngineMemory, RankSetup};

use crate::model::config::ModelConfig;
use crate::model::{Part, TensorSpec, tensors};

/// Bytes in one GiB, for printing memory.
const GIB: f64 = (1u64 << 30) as f64;

/// Parameter counts of a [`ModelConfig`]. "Total" and "active" are counted *without* the
/// embedding, as ZAYA1's "760M active / 8.3B total" is (the report, "Parameters").
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// One attention sub-layer: q/k/v/o projections, both convolutions with their biases,
    /// the key temperatures, its pre-norm and its residual scaling (both pairs; the very
    /// first sub-layer has only the output pair, which `total` accounts for).
    pub attention_per_layer: u64,
    /// One router: `down_proj` with bias, EDA gamma, RMSNorm, the MLP. The first MoE layer
    /// has no EDA gamma, which `total` accounts for. The balancing biases are a buffer, not
    /// a parameter.
    pub router_per_layer: u64,
    /// One SwiGLU expert: `hidden x 2F` + `F x hidden`, no biases.
    pub expert: u64,
    /// The MoE sub-layer's own pre-norm and residual scaling (outside router and experts).
    pub moe_norms_per_layer: u64,
    /// The final residual scaling and final RMSNorm.
    pub final_norms: u64,
    /// Embedding parameters: `vocab x hidden`, twice that if input and output are untied.
    pub embedding: u64,
    /// Every parameter except the embedding.
    pub total: u64,
    /// Parameters one token touches, except the embedding: everything but the experts, plus
    /// `top_k` experts per MoE layer.
    pub active: u64,
    /// `total + embedding`.
    pub total_with_embeddings: u64,
    /// `active + embedding`.
    pub active_with_embeddings: u64,
    /// Parameters the optimizer treats as matrices (Muon): every linear weight inside the
    /// blocks (attention projections, router linears, experts). See [`MemoryOptions`].
    pub muon: u64,
    /// Everything else (AdamW): embedding, norms, biases, gates, temperatures, EDA gammas and
    /// the convolution filters. `muon + adamw == total_with_embeddings`.
    pub adamw: u64,
}

/// Forward and backward FLOPs for one token at a given sequence length.
///
/// Convention (the usual one of Kaplan et al. / Megatron):
/// - a matrix multiply costs 2 FLOPs per weight per token (one multiply, one add);
/// - `linear`: every linear weight a token passes through: attention projections, the
///   router, and `top_k` experts per MoE layer (a token sent to the skip route does less; we
///   count the full `top_k`, an upper bound);
/// - `conv`: the two causal convolutions cost 2 FLOPs per filter weight per token, like a
///   linear layer (biases are ignored);
/// - `attention`: scores `q.k` and the weighted sum of values, each 2 FLOPs per query channel
///   per key; causal masking means a token sees `seq_len / 2` keys on average, so per layer
///   `2 * 2 * (seq_len / 2) * q_heads * head_dim = 2 * seq_len * q_latent` (a sliding-window
///   layer: its average, `window - window^2 / (2 seq_len)` keys, once `seq_len > window`);
/// - `lm_head`: the output projection `hidden -> vocab` (the tied embedding used as a
///   matrix); the input embedding lookup is free;
/// - norms, activations, softmax, RoPE, residual scaling: elementwise, ignored;
/// - backward = 2 x forward (gradients w.r.t. inputs and w.r.t. weights), total = 3 x forward.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlopsPerToken {
    /// The sequence length the attention term was computed at.
    pub seq_len: usize,
    /// Linear layers inside the blocks (attention projections, router, `top_k` experts).
    pub linear: u64,
    /// The two causal convolutions over `[q;k]`.
    pub conv: u64,
    /// Attention scores and values (causal average).
    pub attention: u64,
    /// The output projection to the vocabulary.
    pub lm_head: u64,
    /// `linear + conv + attention + lm_head`.
    pub forward: u64,
    /// `2 * forward`.
    pub backward: u64,
    /// `3 * forward`.
    pub total: u64,
}

/// One sizing warning: a field whose value breaks a rule, and why the rule matters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lint {
    /// The [`ModelConfig`] field (or derived quantity) the warning is about.
    pub field: &'static str,
    /// Its value.
    pub value: usize,
    /// The rule it breaks and the reason for it.
    pub rule: String,
}

/// Widens a size for arithmetic; parameter and FLOP counts overflow 32 bits.
fn w(x: usize) -> u64 {
    x as u64
}

impl ModelConfig {
    /// Weights of the attention linears: `linear_q`, `linear_k`, `val_proj1`, `val_proj2`,
    /// `o_proj` (no biases in ZAYA1 attention).
    fn attention_matrices(&self) -> u64 {
        let h = w(self.hidden_size);
        h * w(self.q_latent())
            + h * w(self.kv_latent())
            + 2 * h * w(self.value_proj_width())
            + w(self.q_latent()) * h
    }

    /// Filter weights of the two convolutions over `[q;k]`: depthwise (one filter of
    /// `conv_kernel` taps per channel), then grouped with one group per head, so each output
    /// channel sees the `head_dim` channels of its head.
    fn conv_filters(&self) -> u64 {
        let c = w(self.qk_channels());
        let k = w(self.conv_kernel);
        c * k + c * w(self.head_dim) * k
    }

    /// Weights of the router linears (no biases): `down_proj`, the hidden MLP layers and the
    /// last layer to the router outputs.
    fn router_matrices(&self) -> u64 {
        let (h, d) = (w(self.hidden_size), w(self.router_dim));
        let hidden_layers = w(self.router_mlp_layers.saturating_sub(1));
        h * d + hidden_layers * d * d + d * w(self.router_outputs())
    }

    /// Parameter counts, summed over the model's parameter list ([`tensors`]). See
    /// [`ParamCounts`] for what each field includes; the per-layer fields count a block past
    /// the first (the first has no residual pair before attention and no EDA gate).
    pub fn params(&self) -> ParamCounts {
        let all = tensors(self);
        let sum = |keep: &dyn Fn(&TensorSpec) -> bool| -> u64 {
            all.iter().filter(|t| keep(t)).map(TensorSpec::numel).sum()
        };
        // A typical layer: block 1 of the same model with at least two blocks.
        let typical = tensors(&ModelConfig {
            num_blocks: self.num_blocks.max(2),
            ..self.clone()
        });
        let layer = |part: Part| -> u64 {
            typical
                .iter()
                .filter(|t| t.block == Some(1) && t.part == part)
                .map(TensorSpec::numel)
                .sum()
        };
        let n = w(self.num_blocks);
        let experts_all = sum(&|t| matches!(t.part, Part::Expert(_)));
        let total = sum(&|t| t.part != Part::Embedding);
        let shared = total - experts_all;
        let expert = layer(Part::Expert(0));
        let experts_per_token = w(self.top_k.min(self.num_experts));
        let active = shared + n * experts_per_token * expert;

        // The model always ties its output head to the embedding; an untied one (sized for
        // comparison) would hold a second `vocab x hidden` matrix.
        let copies = if self.tie_embeddings { 1 } else { 2 };
        let embedding = copies * sum(&|t| t.part == Part::Embedding);
        let total_with_embeddings = total + embedding;
        let muon = sum(&|t| t.linear);

        ParamCounts {
            attention_per_layer: layer(Part::Attention),
            router_per_layer: layer(Part::Router),
            expert,
            moe_norms_per_layer: layer(Part::MoeNorms),
            final_norms: sum(&|t| t.part == Part::Final),
            embedding,
            total,
            active,
            total_with_embeddings,
            active_with_embeddings: active + embedding,
            muon,
            adamw: total_with_embeddings - muon,
        }
    }

    /// FLOPs per token at `seq_len`; the convention is documented on [`FlopsPerToken`].
    pub fn flops(&self, seq_len: usize) -> FlopsPerToken {
        let n = w(self.num_blocks);
        let expert = 3 * w(self.hidden_size) * w(self.expert_ffn);
        let experts_per_token = w(self.top_k.min(self.num_experts));
        let linear = 2
            * n
            * (self.attention_matrices() + self.router_matrices() + experts_per_token * expert);
        let conv = 2 * n * self.conv_filters();
        // 2 FLOPs x 2 products (q.k and p.v) x seq_len/2 keys x q_latent channels; a
        // sliding-window block's query sees min(its position, window) keys, on average
        // `window - window^2 / (2 seq_len)` when the sequence is longer than the window.
        let sliding = w(self.sliding_blocks.len());
        let twice_sliding_keys = match w(self.sliding_window) {
            win if sliding > 0 && win < w(seq_len) => {
                (2 * win * w(seq_len) - win * win) / w(seq_len)
            }
            _ => w(seq_len),
        };
        let attention =
            2 * w(self.q_latent()) * ((n - sliding) * w(seq_len) + sliding * twice_sliding_keys);
        let lm_head = 2 * w(self.vocab_size) * w(self.hidden_size);
        let forward = linear + conv + attention + lm_head;
        FlopsPerToken {
            seq_len,
            linear,
            conv,
            attention,
            lm_head,
            forward,
            backward: 2 * forward,
            total: 3 * forward,
        }
    }

    /// Sizing warnings; empty for ZAYA1-base.
    ///
    /// The report's systems section (the report, "The systems side") asks for hidden, head, FFN
    /// and vocabulary dims that are multiples of 64/128: GEMMs are computed in tiles on the
    /// MI300X/H100 matrix cores, and a dim that is not a tile multiple wastes a partial tile
    /// per row or column (and can fall off the fast kernel path). The GEMM dims that carry
    /// most FLOPs (hidden, expert FFN, vocab for the LM head) should be multiples of 128;
    /// head and router dims multiples of 64. A few structural rules the shapes rely on are
    /// checked too.
    pub fn lint(&self) -> Vec<Lint> {
        let mut lints = Vec::new();
        let mut tile =
            |field: &'static str, value: usize, preferred: usize| {
                if !value.is_multiple_of(64) {
                    lints.push(Lint {
                    field,
                    value,
                    rule: format!(
                        "should be a multiple of 64{}: GEMMs tile in 64/128 blocks on MI300X/H100 \
                         matrix cores, a remainder wastes a partial tile",
                        if preferred == 128 { " (128 preferred)" } else { "" }
                    ),
                });
                } else if !value.is_multiple_of(preferred) {
                    lints.push(Lint {
                    field,
                    value,
                    rule: format!(
                        "multiple of 64 but not of {preferred}: this dim carries most GEMM FLOPs, \
                         {preferred} tiles more efficiently"
                    ),
                });
                }
            };
        tile("hidden_size", self.hidden_size, 128);
        tile("expert_ffn", self.expert_ffn, 128);
        tile("vocab_size", self.vocab_size, 128);
        tile("head_dim", self.head_dim, 64);
        tile("router_dim", self.router_dim, 64);

        let mut rule = |ok: bool, field: &'static str, value: usize, why: &str| {
            if !ok {
                lints.push(Lint {
                    field,
                    value,
                    rule: why.to_string(),
                });
            }
        };
        rule(
            self.num_kv_heads > 0 && self.num_query_heads.is_multiple_of(self.num_kv_heads),
            "num_query_heads",
            self.num_query_heads,
            "should be a multiple of num_kv_heads: each KV head serves a whole group of query heads (GQA)",
        );
        rule(
            self.kv_latent().is_multiple_of(2),
            "num_kv_heads",
            self.num_kv_heads,
            "num_kv_heads * head_dim should be even: the values are two equal halves (v1 on h_t, v2 on h_{t-1})",
        );
        rule(
            self.top_k >= 1 && self.top_k <= self.num_experts,
            "top_k",
            self.top_k,
            "should be between 1 and num_experts",
        );
        rule(
            self.router_mlp_layers >= 1,
            "router_mlp_layers",
            self.router_mlp_layers,
            "should be at least 1: the last router layer produces the expert logits",
        );
        rule(
            self.rope_dims().is_multiple_of(2) && self.rope_dims() <= self.head_dim,
            "rope_fraction",
            self.rope_dims(),
            "head_dim * rope_fraction should be an even channel count within the head: RoPE rotates channel pairs",
        );
        lints
    }

    /// The readable table `zflow size` prints: parameters, FLOPs per token, memory per device
    /// and sizing warnings.
    pub fn render(
        &self,
        params: &ParamCounts,
        flops: &FlopsPerToken,
        setup: &RankSetup,
        memory: &EngineMemory,
        lints: &[Lint],
    ) -> String {
        let mut out = String::new();

        title(&mut out, "parameters");
        row(&mut out, "", "w/o embedding", "with embedding");
        row(
            &mut out,
            "total",
            &count(params.total),
            &count(params.total_with_embeddings),
        );
        let active = format!(
            "active (top-{} of {} experts)",
            self.top_k, self.num_experts
        );
        row(
            &mut out,
            &active,
            &count(params.active),
            &count(params.active_with_embeddings),
        );
        let emb = if self.tie_embeddings {
            "embedding (tied)"
        } else {
            "embedding (untied)"
        };
        row(&mut out, emb, &count(params.embedding), "");
        row(
            &mut out,
            "attention per layer",
            &count(params.attention_per_layer),
            "",
        );
        row(
            &mut out,
            "router per MoE layer",
            &count(params.router_per_layer),
            "",
        );
        row(&mut out, "expert (each)", &count(params.expert), "");

        title(
            &mut out,
            &format!("\nFLOPs per token at seq_len {}", flops.seq_len),
        );
        row(&mut out, "forward", &flop(flops.forward), "");
        row(&mut out, "  linear", &flop(flops.linear), "");
        row(&mut out, "  conv", &flop(flops.conv), "");
        row(&mut out, "  attention (causal)", &flop(flops.attention), "");
        row(&mut out, "  lm head", &flop(flops.lm_head), "");
        row(&mut out, "backward (2x forward)", &flop(flops.backward), "");
        row(&mut out, "total (3x forward)", &flop(flops.total), "");

        render_memory(&mut out, setup, memory);

        if lints.is_empty() {
            title(&mut out, "\nsizing lint: clean");
        } else {
            title(
                &mut out,
                &format!("\nsizing lint: {} warning(s)", lints.len()),
            );
            for l in lints {
                title(
                    &mut out,
                    &format!("  {} = {}: {}", l.field, l.value, l.rule),
                );
            }
        }
        out
    }

    /// Computes everything for one phase's `setup` and renders it: what `zflow size` prints.
    pub fn report(&self, setup: &RankSetup) -> String {
        self.render(
            &self.params(),
            &self.flops(setup.seq_len),
            setup,
            &self.engine_memory(setup),
            &self.lint(),
        )
    }
}

/// The memory table: each term of [`EngineMemory`] for one rank of `setup`.
fn render_memory(out: &mut String, setup: &RankSetup, m: &EngineMemory) {
    let checkpointing = format!("{:?}", setup.activation_checkpointing).to_lowercase();
    title(
        out,
        &format!(
            "\nmemory per rank ({:?}): {} tokens per micro-batch (micro_batch {} x seq_len {} / context_parallel {}), {} ranks, activation checkpointing {checkpointing}, loss chunks of {} tokens",
            setup.device,
            setup.tokens_per_rank(),
            setup.micro_batch,
            setup.seq_len,
            setup.context_parallel,
            setup.world(),
            setup.loss_chunk_tokens,
        )
        .to_lowercase(),
    );
    for (label, bytes) in [
        ("master weights (fp32)", m.master_weights),
        ("bf16 weight copies", m.bf16_weights),
        ("gradients (fp32)", m.gradients),
        ("optimizer shard (ZeRO-1)", m.optimizer_shard),
        ("optimizer step temporaries", m.optimizer_step),
        ("activations", m.activations),
        ("recomputed block", m.recomputed_block),
        ("logits and loss (a chunk)", m.logits_and_loss),
        ("communication buffers", m.communication),
    ] {
        row(out, label, &gib(bytes), "");
    }
    row(
        out,
        "forward/backward peak",
        &gib(m.forward_backward_peak),
        "",
    );
    row(out, "optimizer step peak", &gib(m.step_peak), "");
    row(out, "peak per rank", &gib(m.peak_bytes_per_rank), "");
}

/// Appends a line as is (section titles, lint messages).
fn title(out: &mut String, text: &str) {
    out.push_str(text);
    out.push('\n');
}

/// Appends an indented table row: a label and up to two right-aligned values.
fn row(out: &mut String, label: &str, a: &str, b: &str) {
    let line = format!("  {label:<28}{a:>14}{b:>16}");
    title(out, line.trim_end());
}

/// A parameter count in B or M with three decimals, the precision the report quotes
/// (8.303 B, 753.609 M, 0.661 M); small counts as plain numbers.
fn count(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.3} B", x / 1e9)
    } else if x >= 1e5 {
        format!("{:.3} M", x / 1e6)
    } else {
        n.to_string()
    }
}

/// FLOPs in GFLOP (small counts as plain FLOP).
fn flop(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.3} GFLOP", n as f64 / 1e9)
    } else {
        format!("{n} FLOP")
    }
}

/// Bytes in GiB (small amounts as plain bytes).
fn gib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests;
