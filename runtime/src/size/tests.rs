use super::memory::{Device, RankSetup, block_elements};
use super::*;
use crate::contract::settings::{ActivationCheckpointing, Dtype};

/// A config small enough to count by hand: h 4, 1 block, vocab 8, 2 query heads and 1 KV
/// head of 2 channels (q latent 4, k latent 2, [q;k] 6 channels, value halves of 1),
/// 2 experts of F 4 plus skip (3 router outputs), router dim 2 with 3 MLP layers.
fn tiny() -> ModelConfig {
    ModelConfig {
        hidden_size: 4,
        num_blocks: 1,
        vocab_size: 8,
        num_query_heads: 2,
        num_kv_heads: 1,
        head_dim: 2,
        num_experts: 2,
        expert_ffn: 4,
        router_dim: 2,
        ..ModelConfig::default()
    }
}

#[test]
fn empty_config_is_zaya1_base_and_unknown_keys_fail() {
    let base: ModelConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(base, ModelConfig::zaya1_base());
    assert_eq!(
        (base.q_latent(), base.kv_latent(), base.qk_channels()),
        (1024, 256, 1280)
    );
    assert_eq!(
        (
            base.value_proj_width(),
            base.router_outputs(),
            base.rope_dims()
        ),
        (128, 17, 64)
    );

    let small: ModelConfig = serde_json::from_str(r#"{"num_blocks": 4}"#).unwrap();
    assert_eq!(
        small,
        ModelConfig {
            num_blocks: 4,
            ..ModelConfig::default()
        }
    );

    let err = serde_json::from_str::<ModelConfig>(r#"{"hidden": 1024}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `hidden`"), "{err}");
}

#[test]
fn zaya1_base_params_match_zaya1_md() {
    let p = ModelConfig::zaya1_base().params();

    // The exact counts from the shapes:
    // attention = q 2,097,152 + k 524,288 + v1,v2 2 x 262,144 + o 2,097,152
    //   + depthwise conv 1280x2 + 1280 + grouped conv 1280x128x2 + 1280 + temperature 2
    //   + pre-norm 2048 + residual scaling 4 x 2048.
    assert_eq!(p.attention_per_layer, 5_585_922);
    // router = down_proj 2048x256 + 256 + EDA 256 + RMSNorm 256 + 2 x (256x256 + 256)
    //   + 256x17.
    assert_eq!(p.router_per_layer, 660_992);
    assert_eq!(p.expert, 12_582_912);
    assert_eq!(p.embedding, 537_133_056);
    assert_eq!(p.total, 8_303_355_728);
    assert_eq!(p.active, 753_608_528);

    // ... and to the precision the report quotes them.
    let near = |x: u64, want: f64, tol: f64| (x as f64 - want).abs() <= tol;
    assert!(near(p.attention_per_layer, 5.586e6, 0.0005e6));
    assert!(near(p.router_per_layer, 0.661e6, 0.0005e6));
    assert!(near(p.expert, 12.583e6, 0.0005e6));
    assert!(near(p.embedding, 537e6, 0.5e6));
    assert!(near(p.total, 8.303e9, 0.0005e9));
    assert!(near(p.active, 753.6e6, 0.05e6));
    assert!(near(p.total_with_embeddings, 8.840e9, 0.0005e9));
    assert!(near(p.active_with_embeddings, 1.29e9, 0.005e9));
    assert_eq!(p.muon + p.adamw, p.total_with_embeddings);
}

#[test]
fn tiny_params_by_hand() {
    let p = tiny().params();
    // attention: q 4x4 + k 4x2 + v1 4x1 + v2 4x1 + o 4x4 = 48; depthwise conv 6x2 + 6 = 18;
    // grouped conv (3 groups of 2 channels) 6x2x2 + 6 = 30; temperature 1; norm 4;
    // residual scaling 4 x 4 = 16.
    assert_eq!(p.attention_per_layer, 48 + 18 + 30 + 1 + 4 + 16);
    // router: down 4x2 + 2; EDA 2; RMSNorm 2; 2x2 + 2; 2x2 + 2; 2x3.
    assert_eq!(p.router_per_layer, 10 + 2 + 2 + 6 + 6 + 6);
    assert_eq!(p.expert, 4 * 8 + 4 * 4);
    assert_eq!(p.moe_norms_per_layer, 4 + 16);
    assert_eq!(p.final_norms, 16 + 4);
    // The only block is the first: attention without the residual pair (117 - 8), router
    // without EDA (32 - 2).
    let shared = 109 + 30 + 20 + 20;
    assert_eq!(p.total, shared + 2 * 48);
    assert_eq!(p.active, shared + 48);
    assert_eq!(p.embedding, 32);
    assert_eq!(p.total_with_embeddings, 307);
    assert_eq!(p.muon, 48 + 22 + 96);
    assert_eq!(p.adamw, 307 - 166);

    // Untied embeddings count twice; no residual scaling, EDA or skip route shrink it.
    let plain = ModelConfig {
        tie_embeddings: false,
        residual_scaling: false,
        eda: false,
        mod_skip: false,
        ..tiny()
    }
    .params();
    assert_eq!(plain.embedding, 64);
    assert_eq!(plain.attention_per_layer, 48 + 18 + 30 + 1 + 4);
    assert_eq!(plain.router_per_layer, 10 + 2 + 6 + 6 + 4);
    assert_eq!(plain.total, 101 + 28 + 4 + 4 + 2 * 48);
}

#[test]
fn tiny_flops_by_hand() {
    let f = tiny().flops(8);
    // linear weights per token: attention 48 + router (8 + 4 + 4 + 6 = 22) + one expert 48.
    assert_eq!(f.linear, 2 * (48 + 22 + 48));
    // conv filters: depthwise 12 + grouped 24.
    assert_eq!(f.conv, 2 * 36);
    // 2 FLOPs x 2 products x 8/2 keys x 4 query channels.
    assert_eq!(f.attention, 2 * 2 * 4 * 4);
    assert_eq!(f.lm_head, 2 * 8 * 4);
    assert_eq!(f.forward, 236 + 72 + 64 + 64);
    assert_eq!(f.backward, 2 * 436);
    assert_eq!(f.total, 3 * 436);
}

#[test]
fn a_sliding_window_block_counts_the_keys_it_sees() {
    // Window 4 over 8 tokens, in the continuous convention of a full block's 8 / 2 keys:
    // 4 - 4^2 / (2 x 8) = 3 keys on average.
    let sliding = ModelConfig {
        sliding_blocks: vec![0],
        sliding_window: 4,
        ..tiny()
    };
    assert_eq!(sliding.flops(8).attention, 2 * 2 * 3 * 4);
    // A window as long as the sequence is full attention.
    let wide = ModelConfig {
        sliding_window: 8,
        ..sliding
    };
    assert_eq!(wide.flops(8).attention, tiny().flops(8).attention);
}

#[test]
fn zaya1_base_flops() {
    let cfg = ModelConfig::zaya1_base();
    let f = cfg.flops(4096);
    // Linear FLOPs are 2 x the active matrix weights: attention 5,242,880 + router 659,712
    // + one expert 12,582,912 per block.
    assert_eq!(f.linear, 2 * 40 * (5_242_880 + 659_712 + 12_582_912));
    assert_eq!(f.attention, 40 * 2 * 4096 * 1024);
    assert_eq!(f.lm_head, 2 * 537_133_056);
    assert_eq!(f.forward, f.linear + f.conv + f.attention + f.lm_head);
    assert_eq!(f.total, 3 * f.forward);
    // The attention term grows linearly with context.
    assert_eq!(cfg.flops(8192).attention, 2 * f.attention);
}

fn setup(world: usize, mode: ActivationCheckpointing, device: Device) -> RankSetup {
    RankSetup {
        seq_len: 8,
        micro_batch: 1,
        global_batch: world,
        data_parallel: world,
        context_parallel: 1,
        activation_checkpointing: mode,
        loss_chunk_tokens: 4,
        ns_dtype: Dtype::Bf16,
        grad_reduce_dtype: Dtype::F32,
        grad_bucket_bytes: 25 << 20,
        device,
    }
}

#[test]
fn tiny_engine_memory_by_hand() {
    let none = ActivationCheckpointing::None;
    let m = tiny().engine_memory(&setup(1, none, Device::Cpu));
    // 307 parameters: 166 in matrices (Muon: one momentum), 141 others (AdamW: two moments).
    assert_eq!((m.master_weights, m.gradients), (307 * 4, 307 * 4));
    assert_eq!(m.bf16_weights, 0);
    assert_eq!(m.optimizer_shard, 166 * 4 + 141 * 8);
    // Per token, one block: 12x4 + 4x4 + 6x4 + 6x2 + 7x2 + 3 + 4x3 = 129; head 4x4 + 2 x 1 rope dim = 18.
    let e = block_elements(&tiny(), none);
    assert_eq!((e.whole, e.kept, e.head), (129, 129, 18));
    assert_eq!(m.activations, (129 + 18) * 8 * 4);
    assert_eq!(m.recomputed_block, 0);
    // One chunk of 4 positions over 8 tokens of vocabulary: logits, log-softmax, gradient.
    assert_eq!(m.logits_and_loss, 4 * 8 * 3 * 4);
    assert_eq!(
        m.peak_bytes_per_rank,
        m.forward_backward_peak.max(m.step_peak)
    );

    // Full checkpointing keeps h + r per block and runs one block again, with three h-wide
    // gradients.
    let full = tiny().engine_memory(&setup(1, ActivationCheckpointing::Full, Device::Cpu));
    assert_eq!(full.activations, (6 + 18) * 8 * 4);
    let block_params: u64 = crate::model::tensors(&tiny())
        .iter()
        .filter(|t| t.block == Some(0))
        .map(|t| t.numel())
        .sum();
    assert_eq!(
        full.recomputed_block,
        (129 + 3 * 4) * 8 * 4 + 4 * block_params
    );
    // Two ranks split the optimizer state.
    let two = tiny().engine_memory(&setup(2, none, Device::Cpu));
    assert!(two.optimizer_shard < m.optimizer_shard, "{two:?}");
    // bf16 gradient reduction sends, receives and gathers back a bucket in bf16 (here all
    // 307 gradients) on more than one rank.
    let bf16_reduce = |world| RankSetup {
        grad_reduce_dtype: Dtype::Bf16,
        ..setup(world, none, Device::Cpu)
    };
    assert_eq!(
        tiny().engine_memory(&bf16_reduce(2)).communication,
        3 * 2 * 307
    );
    assert_eq!(
        tiny().engine_memory(&bf16_reduce(1)).communication,
        m.communication
    );
    // A GPU adds autocast's bf16 copies of the matrices and the tied embedding (8 x 4).
    let gpu = tiny().engine_memory(&setup(1, none, Device::Gpu));
    assert_eq!(gpu.bf16_weights, (166 + 32) * 2);
}

#[test]
fn zaya1_at_32k_needs_context_parallelism_and_checkpointing_on_an_mi300x() {
    let zaya1 = ModelConfig::zaya1_base();
    let phase = |micro_batch, seq_len, dp, cp, mode| RankSetup {
        seq_len,
        micro_batch,
        global_batch: 4096,
        data_parallel: dp,
        context_parallel: cp,
        activation_checkpointing: mode,
        loss_chunk_tokens: 4096,
        ns_dtype: Dtype::Bf16,
        grad_reduce_dtype: Dtype::F32,
        grad_bucket_bytes: 25 << 20,
        device: Device::Gpu,
    };
    let mi300x = 192_000_000_000;
    // A whole 32K sequence per rank, every activation kept: far over.
    let none = zaya1.engine_memory(&phase(1, 32768, 512, 1, ActivationCheckpointing::None));
    assert!(none.peak_bytes_per_rank > mi300x, "{none:?}");
    let full = zaya1.engine_memory(&phase(4, 4096, 1024, 1, ActivationCheckpointing::Full));
    assert!(full.peak_bytes_per_rank < mi300x, "{full:?}");
    assert_eq!(full.master_weights, 8_840_488_784 * 4);
    // 32K over two ranks holds the tokens of 16K on each.
    let long = zaya1.engine_memory(&phase(1, 32768, 512, 2, ActivationCheckpointing::Selective));
    assert!(long.peak_bytes_per_rank < mi300x, "{long:?}");
}

#[test]
fn zaya1_base_lints_clean_and_bad_dims_warn_by_name() {
    assert_eq!(ModelConfig::zaya1_base().lint(), vec![]);

    let bad = ModelConfig {
        hidden_size: 2000,  // not a multiple of 64
        expert_ffn: 2112,   // 64 x 33: a multiple of 64, not of 128
        vocab_size: 50_257, // GPT-2's vocabulary
        num_query_heads: 6, // 6 query heads over 4 KV heads
        num_kv_heads: 4,
        ..ModelConfig::default()
    };
    let lints = bad.lint();
    let fields: Vec<_> = lints.iter().map(|l| l.field).collect();
    assert_eq!(
        fields,
        ["hidden_size", "expert_ffn", "vocab_size", "num_query_heads"]
    );
    assert_eq!(lints[0].value, 2000);
    assert!(
        lints[0].rule.contains("multiple of 64"),
        "{}",
        lints[0].rule
    );
    assert!(lints[1].rule.contains("not of 128"), "{}", lints[1].rule);
}

#[test]
fn report_shows_the_headline_numbers() {
    let text =
        ModelConfig::zaya1_base().report(&setup(1024, ActivationCheckpointing::Full, Device::Gpu));
    for want in [
        "8.303 B",
        "8.840 B",
        "753.609 M",
        "1.291 B",
        "5.586 M",
        "0.661 M",
        "12.583 M",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    assert!(text.contains("sizing lint: clean"), "{text}");
    assert!(text.contains("GFLOP") && text.contains("GiB"), "{text}");

    let warned = ModelConfig {
        hidden_size: 2000,
        ..ModelConfig::default()
    }
    .report(&setup(8, ActivationCheckpointing::None, Device::Cpu));
    assert!(warned.contains("hidden_size = 2000"), "{warned}");
}
