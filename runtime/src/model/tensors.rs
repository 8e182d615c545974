//! The one list of the parameters a [`ModelConfig`] has: name, shape, whether it is a linear
//! weight, and which part of the model it belongs to. Hugging Face export and import map it
//! to the reference's names and layouts, sizing counts it, and `tests/torch_model.rs` checks it
//! against the parameters transformers' `ZayaForCausalLM` has.

use super::config::ModelConfig;
use crate::rng::SplitMix64;

/// Which part of the model a parameter belongs to (what sizing reports separately).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The token embedding (also the tied output head).
    Embedding,
    /// An attention sub-layer: projections, convolutions, temperatures, its norm and scaling.
    Attention,
    /// A router: down-projection, EDA gate, norm, MLP.
    Router,
    /// Expert `e` of an MoE layer.
    Expert(usize),
    /// The MoE sub-layer's own norm and residual scaling.
    MoeNorms,
    /// The final residual scaling and norm.
    Final,
}

/// One parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Our name, e.g. `blocks.1.moe.local_experts.3.linear_fc1.weight`.
    pub name: String,
    /// Its shape; linear weights are `[in, out]`.
    pub shape: Vec<usize>,
    /// A linear layer's weight matrix: transposed on export, updated by Muon.
    pub linear: bool,
    /// The block it belongs to (`None` for the embedding and the final norms).
    pub block: Option<usize>,
    /// The part of the model.
    pub part: Part,
}

impl TensorSpec {
    /// Its number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// Builds the list in the model's parameter order.
struct List {
    tensors: Vec<TensorSpec>,
    block: Option<usize>,
    part: Part,
}

impl List {
    fn add(&mut self, name: String, shape: Vec<usize>) {
        self.push(name, shape, false);
    }

    fn push(&mut self, name: String, shape: Vec<usize>, linear: bool) {
        self.tensors.push(TensorSpec {
            name,
            shape,
            linear,
            block: self.block,
            part: self.part,
        });
    }

    fn linear(&mut self, path: &str, d_in: usize, d_out: usize, bias: bool) {
        self.push(format!("{path}.weight"), vec![d_in, d_out], true);
        if bias {
            self.add(format!("{path}.bias"), vec![d_out]);
        }
    }

    fn res_scale(&mut self, path: &str, h: usize, with_residual: bool) {
        self.add(format!("{path}.hidden_states_scale"), vec![h]);
        self.add(format!("{path}.hidden_states_bias"), vec![h]);
        if with_residual {
            self.add(format!("{path}.residual_scale"), vec![h]);
            self.add(format!("{path}.residual_bias"), vec![h]);
        }
    }

    fn at(&mut self, block: Option<usize>, part: Part) -> &mut Self {
        (self.block, self.part) = (block, part);
        self
    }
}

/// Every parameter of the model `c` describes, in checkpoint order, computed from the config
/// alone: export, import and sizing never build the model, so a full-size model costs nothing
/// here. The torch engine lists the same (`workers/torch/zflow_torch/model.py`'s `zflow_tensors`;
/// `tests/torch_model.rs` compares the two).
pub fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, lq, lk, hd, d) = (
        c.hidden_size,
        c.q_latent(),
        c.kv_latent(),
        c.head_dim,
        c.router_dim,
    );
    let ch = c.qk_channels();
    let mut s = List {
        tensors: Vec::new(),
        block: None,
        part: Part::Embedding,
    };
    s.add("embed_tokens".into(), vec![c.vocab_size, h]);
    for i in 0..c.num_blocks {
        let b = format!("blocks.{i}");
        s.at(Some(i), Part::Attention);
        if c.residual_scaling {
            // The first sub-layer has no residual stream to scale yet.
            s.res_scale(&format!("{b}.attn_res_scale"), h, i > 0);
        }
        s.add(format!("{b}.attn_norm.weight"), vec![h]);
        let q = format!("{b}.self_attn.qkv");
        s.linear(&format!("{q}.linear_q"), h, lq, false);
        s.linear(&format!("{q}.linear_k"), h, lk, false);
        s.linear(&format!("{q}.val_proj1"), h, c.value_proj_width(), false);
        s.linear(
            &format!("{q}.val_proj2"),
            h,
            lk - c.value_proj_width(),
            false,
        );
        // Depthwise over [q; k], then grouped with one group per head.
        s.add(format!("{q}.conv0_weight"), vec![ch, 1, c.conv_kernel]);
        s.add(format!("{q}.conv0_bias"), vec![ch]);
        s.add(format!("{q}.conv1_weight"), vec![ch, hd, c.conv_kernel]);
        s.add(format!("{q}.conv1_bias"), vec![ch]);
        s.add(format!("{q}.temp"), vec![c.num_kv_heads]);
        s.linear(&format!("{b}.self_attn.o_proj"), lq, h, false);
        s.at(Some(i), Part::MoeNorms);
        if c.residual_scaling {
            s.res_scale(&format!("{b}.moe_res_scale"), h, true);
        }
        s.add(format!("{b}.moe_norm.weight"), vec![h]);
        s.at(Some(i), Part::Router);
        let r = format!("{b}.moe.router");
        s.linear(&format!("{r}.down_proj"), h, d, true);
        if i > 0 && c.eda {
            // The first MoE layer has no previous router state to mix in.
            s.add(format!("{r}.router_states_scale"), vec![d]);
        }
        s.add(format!("{r}.rmsnorm_eda.weight"), vec![d]);
        for k in 0..c.router_mlp_layers {
            let last = k + 1 == c.router_mlp_layers;
            // Our Vec holds only the linears; `reference_name` maps index k to the Sequential's 2k.
            let out = if last { c.router_outputs() } else { d };
            s.linear(&format!("{r}.router_mlp.{k}"), d, out, !last);
        }
        for e in 0..c.num_experts {
            s.at(Some(i), Part::Expert(e));
            let x = format!("{b}.moe.local_experts.{e}");
            s.linear(&format!("{x}.linear_fc1"), h, 2 * c.expert_ffn, false);
            s.linear(&format!("{x}.linear_fc2"), c.expert_ffn, h, false);
        }
    }
    s.at(None, Part::Final);
    if c.residual_scaling {
        s.res_scale("res_scale", h, true);
    }
    s.add("final_norm.weight".into(), vec![h]);
    s.tensors
}

/// Weights for every tensor of `c`, in [`tensors`] order, drawn from a normal distribution of
/// standard deviation `std` with [`SplitMix64`] seeded by `seed`: what the checkpoint, export
/// and import tests write when they need a model without training one.
pub fn random_weights(c: &ModelConfig, seed: u64, std: f64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = SplitMix64(seed);
    tensors(c)
        .into_iter()
        .map(|t| {
            let values = (0..t.numel())
                .map(|_| (std * rng.normal()) as f32)
                .collect();
            (t.name, t.shape, values)
        })
        .collect()
}
