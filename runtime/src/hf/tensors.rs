//! The tensors a model has, under zflow's names and the reference's, with their layouts.

use crate::model::config::ModelConfig;
use crate::model::reference_name;
use safetensors::Dtype;
use safetensors::tensor::View;
use std::borrow::Cow;

/// One parameter: our name and shape, the reference's name, and whether it is a linear weight
/// (stored transposed on the two sides).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Spec {
    pub(super) ours: String,
    pub(super) shape: Vec<usize>,
    pub(super) hf: String,
    pub(super) linear: bool,
}

impl Spec {
    pub(super) fn hf_shape(&self) -> Vec<usize> {
        if self.linear {
            vec![self.shape[1], self.shape[0]]
        } else {
            self.shape.clone()
        }
    }
}

/// Builds the list of [`Spec`]s in the model's parameter order.
pub(super) struct Specs(pub(super) Vec<Spec>);

impl Specs {
    pub(super) fn add(&mut self, ours: String, shape: Vec<usize>, linear: bool) {
        // Every parameter path has a reference name (`model_grad.rs` checks it on a real model).
        let hf = reference_name(&ours).unwrap_or_else(|| panic!("no reference name for `{ours}`"));
        self.0.push(Spec {
            ours,
            shape,
            hf,
            linear,
        });
    }

    pub(super) fn linear(&mut self, path: &str, d_in: usize, d_out: usize, bias: bool) {
        self.add(format!("{path}.weight"), vec![d_in, d_out], true);
        if bias {
            self.add(format!("{path}.bias"), vec![d_out], false);
        }
    }

    pub(super) fn res_scale(&mut self, path: &str, h: usize, with_residual: bool) {
        self.add(format!("{path}.hidden_states_scale"), vec![h], false);
        self.add(format!("{path}.hidden_states_bias"), vec![h], false);
        if with_residual {
            self.add(format!("{path}.residual_scale"), vec![h], false);
            self.add(format!("{path}.residual_bias"), vec![h], false);
        }
    }
}

/// The parameters `Zaya::new(c, ..)` creates, computed from the config alone: export and import
/// never build the model, so a full-size checkpoint costs no more memory than its tensors.
/// `tests::specs_match_the_model` checks this against real models.
pub(super) fn specs(c: &ModelConfig) -> Vec<Spec> {
    let (h, lq, lk, hd, d) = (
        c.hidden_size,
        c.q_latent(),
        c.kv_latent(),
        c.head_dim,
        c.router_dim,
    );
    let ch = lq + lk;
    let routes = c.num_experts + usize::from(c.mod_skip);
    let mut s = Specs(Vec::new());
    s.add("embed_tokens".into(), vec![c.vocab_size, h], false);
    for i in 0..c.num_blocks {
        let b = format!("blocks.{i}");
        if c.residual_scaling {
            s.res_scale(&format!("{b}.attn_res_scale"), h, i > 0);
        }
        s.add(format!("{b}.attn_norm.weight"), vec![h], false);
        let q = format!("{b}.self_attn.qkv");
        s.linear(&format!("{q}.linear_q"), h, lq, false);
        s.linear(&format!("{q}.linear_k"), h, lk, false);
        s.linear(&format!("{q}.val_proj1"), h, lk / 2, false);
        s.linear(&format!("{q}.val_proj2"), h, lk - lk / 2, false);
        s.add(
            format!("{q}.conv0_weight"),
            vec![ch, 1, c.conv_kernel],
            false,
        );
        s.add(format!("{q}.conv0_bias"), vec![ch], false);
        s.add(
            format!("{q}.conv1_weight"),
            vec![ch, hd, c.conv_kernel],
            false,
        );
        s.add(format!("{q}.conv1_bias"), vec![ch], false);
        s.add(format!("{q}.temp"), vec![c.num_kv_heads], false);
        s.linear(&format!("{b}.self_attn.o_proj"), lq, h, false);
        if c.residual_scaling {
            s.res_scale(&format!("{b}.moe_res_scale"), h, true);
        }
        s.add(format!("{b}.moe_norm.weight"), vec![h], false);
        let r = format!("{b}.moe.router");
        s.linear(&format!("{r}.down_proj"), h, d, true);
        if i > 0 && c.eda {
            s.add(format!("{r}.router_states_scale"), vec![d], false);
        }
        s.add(format!("{r}.rmsnorm_eda.weight"), vec![d], false);
        for k in 0..c.router_mlp_layers {
            let last = k + 1 == c.router_mlp_layers;
            // Our Vec holds only the linears; `reference_name` maps index k to the Sequential's 2k.
            s.linear(
                &format!("{r}.router_mlp.{k}"),
                d,
                if last { routes } else { d },
                !last,
            );
        }
        for e in 0..c.num_experts {
            let x = format!("{b}.moe.local_experts.{e}");
            s.linear(&format!("{x}.linear_fc1"), h, 2 * c.expert_ffn, false);
            s.linear(&format!("{x}.linear_fc2"), c.expert_ffn, h, false);
        }
    }
    if c.residual_scaling {
        s.res_scale("res_scale", h, true);
    }
    s.add("final_norm.weight".into(), vec![h], false);
    s.0
}

/// The reference's name of MoE layer `block`'s balancing-bias buffer (`ZayaRouter`'s
/// `register_buffer("balancing_biases", ...)`).
pub(super) fn biases_name(block: usize) -> String {
    format!(
        "model.layers.{}.zaya_block.router.balancing_biases",
        2 * block + 1
    )
}

/// `[rows, cols]` row-major f32 bytes -> `[cols, rows]`. Moves 4-byte elements whole, so every
/// value keeps its exact bits.
pub(super) fn transpose(bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    debug_assert_eq!(bytes.len(), rows * cols * 4);
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = ((r * cols + c) * 4, (c * rows + r) * 4);
            out[dst..dst + 4].copy_from_slice(&bytes[src..src + 4]);
        }
    }
    out
}

pub(super) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian `dtype` values as f32 bytes: f32 as is, bf16 and f16 widened (exactly: every
/// bf16 and f16 value is an f32 value).
pub(super) fn widen(data: &[u8], dtype: Dtype) -> Cow<'_, [u8]> {
    match dtype {
        Dtype::BF16 => Cow::Owned(
            data.chunks_exact(2)
                .flat_map(|c| {
                    half::bf16::from_le_bytes([c[0], c[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect(),
        ),
        Dtype::F16 => Cow::Owned(
            data.chunks_exact(2)
                .flat_map(|c| {
                    half::f16::from_le_bytes([c[0], c[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect(),
        ),
        _ => Cow::Borrowed(data),
    }
}

/// One f32 tensor to write, converted from its source (widened, then transposed if `from` is a
/// `[rows, cols]` linear weight) only when the safetensors writer asks for its bytes: the
/// writer takes one tensor at a time, so a full-size model never sits in memory twice.
pub(super) struct Lazy<'a> {
    pub(super) source: Cow<'a, [u8]>,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) transpose: Option<(usize, usize)>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let values = widen(&self.source, self.dtype);
        match self.transpose {
            Some((rows, cols)) => Cow::Owned(transpose(&values, rows, cols)),
            None => values,
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}
