//! The two ways a Hugging Face folder can lay out ZAYA1, and the transformers release's names.
//!
//! - [`Layout::Transformers`]: the `transformers` release on PyPI (5.23.0,
//!   `transformers.models.zaya`, the `Zyphra/ZAYA1-8B` checkpoint). One decoder layer per
//!   block (`model.layers.{i}`), `layer_types` and `rope_parameters` per layer type in
//!   `config.json`, and each MoE layer's experts stacked into two tensors
//!   (`mlp.experts.gate_up_proj` `[experts, 2F, hidden]`, `mlp.experts.down_proj`
//!   `[experts, hidden, F]`). The residual scaling after a sub-layer belongs to the layer that
//!   ran it, so zflow's "scaling before block i's attention" is layer `i - 1`'s
//!   `post_mlp_residual_scale` (block 0's is the model's `input_hidden_states_*`), and the final
//!   one is the last layer's.
//! - [`Layout::Legacy`]: Zyphra's fork (and vLLM, SGLang): attention and MoE as alternating
//!   layers `2i` / `2i + 1`, one tensor per expert, the scalar `config.json`
//!   ([`crate::model::reference_name`]).
//!
//! A folder's layout is read from its `config.json` ([`Layout::of_config`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a Hugging Face folder lays out the model (`transformers` or `legacy` in settings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// transformers 5.23's `transformers.models.zaya` (the default for exports).
    #[default]
    Transformers,
    /// Zyphra's fork, vLLM and SGLang: alternating attention / MoE layers.
    Legacy,
}

/// The layout names a `--layout` flag and the export stage's `layout` setting accept.
pub const LAYOUTS: &[&str] = &["transformers", "legacy"];

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Layout, String> {
        match s {
            "transformers" => Ok(Layout::Transformers),
            "legacy" => Ok(Layout::Legacy),
            other => Err(format!(
                "unknown Hugging Face layout `{other}` (layouts: {})",
                LAYOUTS.join(", ")
            )),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Transformers => "transformers",
            Layout::Legacy => "legacy",
        })
    }
}

impl Layout {
    /// The layout a parsed `config.json` describes: transformers' when it has the fields only
    /// that release writes (`layer_types`, `moe_intermediate_size`, or `rope_parameters` keyed
    /// by layer type), else the legacy one.
    pub fn of_config(config: &Value) -> Layout {
        let has = |key: &str| config.get(key).is_some_and(|v| !v.is_null());
        let per_layer_type_rope = config
            .get("rope_parameters")
            .and_then(Value::as_object)
            .is_some_and(|r| r.contains_key("hybrid"));
        if has("layer_types") || has("moe_intermediate_size") || per_layer_type_rope {
            Layout::Transformers
        } else {
            Layout::Legacy
        }
    }
}

/// Where one of zflow's tensors lives in a transformers-layout folder.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Place {
    /// The tensor's name.
    pub(super) name: String,
    /// `Some(e)`: slice `e` of a tensor that stacks every expert's matrix along a new first axis.
    pub(super) expert: Option<usize>,
}

/// The transformers 5.23 name of zflow tensor `name` in a model of `num_blocks` blocks.
pub(super) fn transformers_place(name: &str, num_blocks: usize) -> Option<Place> {
    let whole = |name: String| Some(Place { name, expert: None });
    match name {
        "embed_tokens" => return whole("model.embed_tokens.weight".into()),
        "final_norm.weight" => return whole("model.norm.weight".into()),
        _ => {}
    }
    if let Some(tail) = name.strip_prefix("res_scale.") {
        let last = num_blocks.checked_sub(1)?;
        return whole(format!(
            "model.layers.{last}.post_mlp_residual_scale.{tail}"
        ));
    }
    let (block, rest) = name.strip_prefix("blocks.")?.split_once('.')?;
    let i: usize = block.parse().ok()?;
    let layer = format!("model.layers.{i}");
    if let Some(tail) = rest.strip_prefix("attn_res_scale.") {
        return whole(match i {
            // Block 0's pair gates the embeddings.
            0 => format!("model.input_{tail}"),
            _ => format!("model.layers.{}.post_mlp_residual_scale.{tail}", i - 1),
        });
    }
    if let Some(tail) = rest.strip_prefix("moe.local_experts.") {
        let (e, which) = tail.split_once('.')?;
        let stacked = match which {
            "linear_fc1.weight" => "gate_up_proj",
            "linear_fc2.weight" => "down_proj",
            _ => return None,
        };
        return Some(Place {
            name: format!("{layer}.mlp.experts.{stacked}"),
            expert: Some(e.parse().ok()?),
        });
    }
    let mapped = match rest {
        "attn_norm.weight" => "input_layernorm.weight".to_string(),
        "moe_norm.weight" => "post_attention_layernorm.weight".to_string(),
        "self_attn.qkv.temp" => "self_attn.qk_norm.temp".to_string(),
        "self_attn.o_proj.weight" => "self_attn.o_proj.weight".to_string(),
        "moe.router.rmsnorm_eda.weight" => "mlp.gate.router_mlp.norm.weight".to_string(),
        "moe.router.router_states_scale" => "mlp.gate.router_states_scale".to_string(),
        _ => {
            if let Some(t) = rest.strip_prefix("self_attn.qkv.") {
                let t = match t {
                    "linear_q.weight" => "q_proj.weight",
                    "linear_k.weight" => "k_proj.weight",
                    "val_proj1.weight" => "v_proj_current.weight",
                    "val_proj2.weight" => "v_proj_delayed.weight",
                    "conv0_weight" => "conv_qk_depthwise.weight",
                    "conv0_bias" => "conv_qk_depthwise.bias",
                    "conv1_weight" => "conv_qk_grouped.weight",
                    "conv1_bias" => "conv_qk_grouped.bias",
                    _ => return None,
                };
                format!("self_attn.qkv_proj.{t}")
            } else if let Some(t) = rest.strip_prefix("moe_res_scale.") {
                format!("post_attention_residual_scale.{t}")
            } else if let Some(t) = rest.strip_prefix("moe.router.down_proj.") {
                format!("mlp.gate.down_proj.{t}")
            } else if let Some(t) = rest.strip_prefix("moe.router.router_mlp.") {
                // The three linears of transformers' `ZayaRouterMLP`.
                let (k, t) = t.split_once('.')?;
                let linear = ["fc1", "fc2", "out_proj"].get(k.parse::<usize>().ok()?)?;
                format!("mlp.gate.router_mlp.{linear}.{t}")
            } else {
                return None;
            }
        }
    };
    whole(format!("{layer}.{mapped}"))
}

/// The name of block `block`'s balancing-bias buffer in `layout`.
pub(super) fn biases_name(layout: Layout, block: usize) -> String {
    match layout {
        Layout::Transformers => format!("model.layers.{block}.mlp.gate.balancing_biases"),
        Layout::Legacy => format!(
            "model.layers.{}.zaya_block.router.balancing_biases",
            2 * block + 1
        ),
    }
}

/// transformers 5.23's `from_pretrained` sets every router's skip bias (the last route) to
/// -1.0 after it reads the weights. Routing depends only on the differences between one
/// router's biases (the choice is an argmax over probability + bias), so the export shifts each
/// router's biases by one constant that makes the skip bias exactly -1.0, and the folder routes
/// the same in transformers as in zflow. Computed in f64, the skip bias set exactly.
pub(super) fn skip_bias_at_minus_one(biases: &[f32]) -> Vec<f32> {
    let Some((&skip, experts)) = biases.split_last() else {
        return Vec::new();
    };
    let shift = f64::from(skip) + 1.0;
    experts
        .iter()
        .map(|&b| (f64::from(b) - shift) as f32)
        .chain([-1.0])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_told_apart_by_their_config() {
        let legacy =
            serde_json::json!({"model_type": "zaya", "ffn_hidden_size": 8, "num_query_groups": 2});
        let release = serde_json::json!({"model_type": "zaya", "layer_types": ["hybrid"]});
        let rope_only = serde_json::json!({"rope_parameters": {"hybrid": {"rope_theta": 1e6}}});
        assert_eq!(Layout::of_config(&legacy), Layout::Legacy);
        assert_eq!(Layout::of_config(&release), Layout::Transformers);
        assert_eq!(Layout::of_config(&rope_only), Layout::Transformers);
        assert_eq!("legacy".parse::<Layout>(), Ok(Layout::Legacy));
        assert!(
            "megatron"
                .parse::<Layout>()
                .unwrap_err()
                .contains("transformers, legacy")
        );
    }

    #[test]
    fn the_skip_bias_moves_to_minus_one_and_the_differences_stay() {
        let shifted = skip_bias_at_minus_one(&[0.25, -0.5, 0.125]);
        assert_eq!(shifted, vec![-0.875, -1.625, -1.0]);
        let odd = skip_bias_at_minus_one(&[0.1, 0.3, 0.7]);
        assert_eq!(*odd.last().unwrap(), -1.0);
        assert!(((odd[1] - odd[0]) - 0.2).abs() < 1e-6);
    }

    #[test]
    fn every_zflow_tensor_has_one_transformers_place() {
        let c = crate::model::config::ModelConfig {
            hidden_size: 16,
            num_blocks: 3,
            vocab_size: 13,
            num_query_heads: 4,
            num_kv_heads: 2,
            head_dim: 4,
            num_experts: 3,
            expert_ffn: 6,
            router_dim: 8,
            ..Default::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        for t in crate::model::tensors(&c) {
            let p = transformers_place(&t.name, c.num_blocks)
                .unwrap_or_else(|| panic!("no place for {}", t.name));
            assert!(seen.insert((p.name.clone(), p.expert)), "{} twice", p.name);
        }
        assert!(seen.contains(&("model.input_hidden_states_scale".to_string(), None)));
        assert!(seen.contains(&(
            "model.layers.2.post_mlp_residual_scale.residual_bias".to_string(),
            None
        )));
        assert!(seen.contains(&("model.layers.1.mlp.experts.down_proj".to_string(), Some(2))));
    }
}
