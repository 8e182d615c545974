//! Hugging Face export and import of zflow checkpoints.
//!
//! The target is the ZAYA1 reference implementation: Zyphra's `transformers` fork, branch
//! `zaya`, `src/transformers/models/zaya/` (`ZayaConfig`, `ZayaForCausalLM`). An exported
//! folder holds
//!
//! ```text
//! config.json              ZayaConfig fields (model_type "zaya", architectures ZayaForCausalLM)
//! model.safetensors        the reference's tensor names and layouts, f32, metadata {"format": "pt"}
//! tokenizer.json           with --tokenizer: copied byte for byte
//! tokenizer_config.json    with --tokenizer: PreTrainedTokenizerFast + its special tokens
//! special_tokens_map.json  with --tokenizer
//! ```
//!
//! Names come from [`crate::model::reference_name`]. Layouts: our linear weights are `[in, out]`
//! (burn's convention) and PyTorch's `nn.Linear` holds `[out, in]`, so linears are transposed;
//! the embedding (`nn.Embedding`, `[vocab, hidden]`), the convolutions (`nn.Conv1d`,
//! `[out, in / groups, kernel]`, the layout `model.rs` already uses) and every 1-D parameter are
//! the same on both sides. The router's balancing biases, which zflow keeps in `trainer.json`
//! (they are moved by a controller, not by backprop), are the reference's persistent buffer
//! `model.layers.{2i+1}.zaya_block.router.balancing_biases`. The output head is tied to the
//! embedding, so there is no `lm_head.weight` (what `save_pretrained` writes for tied weights).
//!
//! Import is the exact inverse, so export then import gives back every tensor bit for bit (and
//! the same `model.safetensors` bytes): moving f32 values between layouts never changes their
//! bits, and bf16/f16 tensors (the released ZAYA1-base is bf16) widen to f32 exactly.
//!
//! Both directions write into a temporary sibling folder and rename it into place, so a crash
//! leaves no half-written export or checkpoint.
//!
//! Limits of the reference code, not of the export: its decode cache (`ZayaDynamicCache`)
//! hard-codes head_dim 128 and kernel 2, and its SDPA attention assumes a query latent of half
//! the hidden size. ZAYA1-base's sizes satisfy both; a smaller model (the nano recipe: head_dim
//! 64) runs in the reference with eager attention (`ZayaConfig`'s default) and `use_cache=False`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};
use safetensors::tensor::{TensorView, View};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value, json};

use crate::balance::BalanceState;
use crate::checkpoint::{Manifest, TrainerState};
use crate::data::mixture::DataCursor;
use crate::model::reference_name;
use crate::model_config::ModelConfig;

/// An imported checkpoint carries the trainer's single metadata entry, so its
/// `model.safetensors` has the same bytes as one the trainer wrote for the same weights.
const CHECKPOINT_FORMAT: &str = crate::checkpoint::WEIGHTS_FORMAT;

/// Gemma3's vocabulary, ZAYA1's (the ZAYA1 report): with it and no tokenizer, the special ids are
/// ZAYA1's bos=2, eos=1, pad=0.
const GEMMA3_VOCAB: usize = 262_272;

/// `max_position_embeddings` when the caller knows no context length: ZAYA1's pretraining
/// context (4K, the ZAYA1 report). The reference's default RoPE does not depend on it.
pub const DEFAULT_MAX_POSITIONS: usize = 4096;

/// The phase name an imported checkpoint's `trainer.json` carries.
pub const IMPORTED_PHASE: &str = "hf-import";

/// Export settings besides the checkpoint and the model.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// A tokenizer to ship with the model: a `tokenizer.json`, or a folder holding one (a
    /// `tokenizer` stage's output, whose `tokenizer_info.json` then names the special tokens).
    pub tokenizer: Option<PathBuf>,
    /// `max_position_embeddings` in `config.json`: the context the model was trained at.
    pub max_position_embeddings: usize,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            tokenizer: None,
            max_position_embeddings: DEFAULT_MAX_POSITIONS,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Which tensors a model has, under both names
// ---------------------------------------------------------------------------------------------

/// One parameter: our name and shape, the reference's name, and whether it is a linear weight
/// (stored transposed on the two sides).
#[derive(Clone, Debug, PartialEq)]
struct Spec {
    ours: String,
    shape: Vec<usize>,
    hf: String,
    linear: bool,
}

impl Spec {
    fn hf_shape(&self) -> Vec<usize> {
        if self.linear {
            vec![self.shape[1], self.shape[0]]
        } else {
            self.shape.clone()
        }
    }
}

/// Builds the list of [`Spec`]s in the model's parameter order.
struct Specs(Vec<Spec>);

impl Specs {
    fn add(&mut self, ours: String, shape: Vec<usize>, linear: bool) {
        // Every parameter path has a reference name (`model_grad.rs` checks it on a real model).
        let hf = reference_name(&ours).unwrap_or_else(|| panic!("no reference name for `{ours}`"));
        self.0.push(Spec {
            ours,
            shape,
            hf,
            linear,
        });
    }

    fn linear(&mut self, path: &str, d_in: usize, d_out: usize, bias: bool) {
        self.add(format!("{path}.weight"), vec![d_in, d_out], true);
        if bias {
            self.add(format!("{path}.bias"), vec![d_out], false);
        }
    }

    fn res_scale(&mut self, path: &str, h: usize, with_residual: bool) {
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
fn specs(c: &ModelConfig) -> Vec<Spec> {
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
fn biases_name(block: usize) -> String {
    format!(
        "model.layers.{}.zaya_block.router.balancing_biases",
        2 * block + 1
    )
}

/// `[rows, cols]` row-major f32 bytes -> `[cols, rows]`. Moves 4-byte elements whole, so every
/// value keeps its exact bits.
fn transpose(bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
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

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian `dtype` values as f32 bytes: f32 as is, bf16 and f16 widened (exactly: every
/// bf16 and f16 value is an f32 value).
fn widen(data: &[u8], dtype: Dtype) -> Cow<'_, [u8]> {
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
struct Lazy<'a> {
    source: Cow<'a, [u8]>,
    dtype: Dtype,
    shape: Vec<usize>,
    transpose: Option<(usize, usize)>,
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

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

/// Refuses a model the reference implementation cannot express (or that zflow's model does not
/// actually implement as configured), naming the `model:` field.
fn check_exportable(c: &ModelConfig) -> Result<()> {
    ensure!(
        c.router_mlp_layers == 3,
        "model.router_mlp_layers is {}; the reference implementation's router MLP has exactly 3 layers",
        c.router_mlp_layers
    );
    ensure!(
        c.top_k == 1,
        "model.top_k is {}; zflow's ZAYA1 routes each token to one expert, so its checkpoints are top-1 models",
        c.top_k
    );
    ensure!(
        c.tie_embeddings,
        "model.tie_embeddings is false, but zflow's ZAYA1 always ties the output head to the embedding"
    );
    ensure!(
        c.num_kv_heads > 0 && c.num_query_heads.is_multiple_of(c.num_kv_heads),
        "model.num_query_heads ({}) must be a multiple of model.num_kv_heads ({})",
        c.num_query_heads,
        c.num_kv_heads
    );
    // The reference's two value projections are each `latent_k // 2` wide.
    ensure!(
        c.kv_latent().is_multiple_of(2),
        "model.num_kv_heads x model.head_dim ({}) must be even: the reference splits it between two value projections",
        c.kv_latent()
    );
    // Both rotate `int(head_dim * partial_rotary_factor)` channels ([`ModelConfig::rope_dims`]).
    let rotated = c.rope_dims();
    ensure!(
        rotated.is_multiple_of(2),
        "model.head_dim x model.rope_fraction = {rotated} RoPE channels; the reference needs an even number"
    );
    Ok(())
}

/// Special token ids (and their text, when a tokenizer names them).
#[derive(Clone, Debug, Default, PartialEq)]
struct Specials {
    bos: Option<(u32, Option<String>)>,
    eos: Option<(u32, Option<String>)>,
    pad: Option<(u32, Option<String>)>,
}

/// `config.json` for `c`, field names and order as in the reference's `ZayaConfig.__init__`
/// (the scalar form of `configuration_zaya.py`: `num_attention_heads` = CCA query heads,
/// `num_query_groups` = `num_key_value_heads` = KV heads, explicit `head_dim`). serde_json keeps
/// insertion order here, so the same inputs give the same bytes.
fn hf_config(c: &ModelConfig, max_positions: usize, specials: &Specials) -> Value {
    let id = |t: &Option<(u32, Option<String>)>| t.as_ref().map(|(id, _)| *id);
    // A list of pairs rather than one `json!` (which would exceed the macro recursion limit).
    let fields: Vec<(&str, Value)> = vec![
        ("architectures", json!(["ZayaForCausalLM"])),
        ("model_type", json!("zaya")),
        ("cca", json!(true)),
        ("num_query_groups", json!(c.num_kv_heads)),
        ("use_cache", json!(true)),
        ("attention_bias", json!(false)),
        ("lm_head_bias", json!(false)),
        ("vocab_size", json!(c.vocab_size)),
        ("hidden_size", json!(c.hidden_size)),
        // gate and up in one matrix: the reference's width is 2 x the expert's SwiGLU width.
        ("ffn_hidden_size", json!(2 * c.expert_ffn)),
        // Each of our blocks is two reference layers (attention 2i, MoE 2i + 1).
        ("num_hidden_layers", json!(2 * c.num_blocks)),
        ("num_experts", json!(c.num_experts)),
        ("num_attention_heads", json!(c.num_query_heads)),
        ("head_dim", json!(c.head_dim)),
        ("activation_func", json!("swiglu")),
        ("max_position_embeddings", json!(max_positions)),
        ("norm_epsilon", json!(c.rms_norm_eps)),
        ("pad_token_id", json!(id(&specials.pad))),
        ("bos_token_id", json!(id(&specials.bos))),
        ("eos_token_id", json!(id(&specials.eos))),
        ("tie_word_embeddings", json!(true)),
        ("rope_theta", json!(c.rope_base)),
        ("attention_dropout", json!(0.0)),
        ("moe_router_topk", json!(c.top_k)),
        ("normalization", json!("RMSNorm")),
        ("zaya_mlp_expansion", json!(c.router_dim)),
        ("zaya_use_mod", json!(c.mod_skip)),
        ("zaya_high_prec", json!(true)),
        ("zaya_use_eda", json!(c.eda)),
        ("add_bias_linear", json!(false)),
        ("gated_linear_unit", json!(true)),
        ("scale_residual_merge", json!(c.residual_scaling)),
        ("fused_add_norm", json!(false)),
        // zflow trains and exports in f32 throughout, the residual stream included.
        ("residual_in_fp32", json!(true)),
        ("apply_rope_fusion", json!(true)),
        ("bias_activation_fusion", json!(true)),
        ("activation_func_fp8_input_store", json!(false)),
        ("sliding_window", Value::Null),
        ("rope_scaling", Value::Null),
        ("partial_rotary_factor", json!(c.rope_fraction)),
        ("num_key_value_heads", json!(c.num_kv_heads)),
        ("clamp_temp", json!(false)),
        ("cca_time0", json!(c.conv_kernel)),
        ("cca_time1", json!(c.conv_kernel)),
        ("swa_layers", Value::Null),
        ("swa_rotary_base", Value::Null),
        ("torch_dtype", json!("float32")),
    ];
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// Typed reads of `config.json` fields whose errors name the file and the field.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    file: &'a Path,
}

impl Fields<'_> {
    fn error(&self, key: &str, msg: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}: `{key}`: {msg}", self.file.display())
    }

    /// The value, treating `null` as absent (the reference writes `null` for unset options).
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn usize_of(&self, key: &str, v: &Value) -> Result<usize> {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| self.error(key, format!("expected a non-negative integer, found {v}")))
    }

    fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key).map(|v| self.usize_of(key, v)).transpose()
    }

    fn required(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.error(key, "missing"))
    }

    /// An integer, or a per-layer list of them (the form ZAYA1-base's config uses for some
    /// fields: 0 on the layers it does not apply to); the list's first non-zero entry, all of
    /// which must agree.
    fn usize_or_list(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => {
                let mut found = None;
                for v in items {
                    let n = self.usize_of(key, v)?;
                    if n != 0 && found.is_some_and(|f| f != n) {
                        return Err(self.error(
                            key,
                            "per-layer values differ; zflow's ZAYA1 uses one value for every layer",
                        ));
                    }
                    if n != 0 {
                        found = Some(n);
                    }
                }
                Ok(found)
            }
            Some(v) => self.usize_of(key, v).map(Some),
        }
    }

    fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.error(key, format!("expected a number, found {v}"))),
        }
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.error(key, format!("expected true or false, found {v}"))),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.error(key, format!("expected a string, found {v}")))
            })
            .transpose()
    }

    /// Fails unless boolean `key` is `want` (default `default`): a feature zflow's model lacks.
    fn expect_bool(&self, key: &str, default: bool, want: bool, why: &str) -> Result<()> {
        if self.bool(key, default)? != want {
            return Err(self.error(key, format!("{} is not supported: {why}", !want)));
        }
        Ok(())
    }
}

/// The [`ModelConfig`] a reference `config.json` describes (parsed JSON `v`, read from `file`).
/// Accepts the scalar `ZayaConfig` form [`export_hf`] writes and the older per-layer list form
/// (`zaya_layers`, `cca_num_q_heads`, `*_list` fields, `num_attention_heads` = uncompressed
/// heads), which is what SGLang's `ZayaConfig` reads from the released ZAYA1-base; fields the
/// reference gives defaults to default as there. Rejects what zflow's model cannot represent.
pub fn model_config_from_hf(v: &Value, file: &Path) -> Result<ModelConfig> {
    let map = v
        .as_object()
        .ok_or_else(|| anyhow!("{}: not a JSON object", file.display()))?;
    let f = Fields { map, file };
    match f.str("model_type")? {
        Some("zaya") => {}
        Some(other) => {
            return Err(f.error(
                "model_type",
                format!("`{other}` is not a ZAYA1 model (expected `zaya`)"),
            ));
        }
        None => return Err(f.error("model_type", "missing (expected `zaya`)")),
    }
    let hidden_size = f.required("hidden_size")?;
    let vocab_size = f.required("vocab_size")?;

    // Layers: `zaya_layers` ("a" = attention, an integer = a MoE layer's experts) wins over
    // `num_hidden_layers`, as in the reference.
    let mut layer_experts = None;
    let layers = match f.get("zaya_layers") {
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let ok = match (i % 2, item) {
                    (0, Value::String(s)) => s == "a",
                    (1, v) => match v.as_u64() {
                        Some(n) if layer_experts.is_none_or(|e| e == n as usize) => {
                            layer_experts = Some(n as usize);
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !ok {
                    return Err(f.error("zaya_layers", format!("entry {i} is {item}; zflow's ZAYA1 alternates \"a\" (attention) and one expert count for every MoE layer")));
                }
            }
            items.len()
        }
        Some(other) => {
            return Err(f.error("zaya_layers", format!("expected a list, found {other}")));
        }
        None => f.required("num_hidden_layers")?,
    };
    if layers == 0 || layers % 2 != 0 {
        return Err(f.error("num_hidden_layers", format!("{layers} layers; ZAYA1 pairs an attention layer with a MoE layer, so the count must be even")));
    }

    let num_attention_heads = f.usize("num_attention_heads")?;
    // The older form names the CCA query heads `cca_num_q_heads`; the newer one
    // `num_attention_heads`.
    let cca_num_q_heads = f.usize_or_list("cca_num_q_heads")?;
    let num_query_heads = match cca_num_q_heads {
        Some(n) => n,
        None => num_attention_heads.ok_or_else(|| f.error("num_attention_heads", "missing"))?,
    };
    let groups = f
        .usize_or_list("num_query_groups")?
        .or(f.usize_or_list("num_query_groups_list")?);
    let kv = f.usize("num_key_value_heads")?;
    let num_kv_heads = match (groups, kv) {
        (Some(g), Some(k)) if g != k => {
            return Err(f.error(
                "num_query_groups",
                format!("{g}, but num_key_value_heads is {k}; ZAYA1 needs them equal"),
            ));
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => 2, // the reference's default
    };
    // `head_dim`, else `kv_channels`, else (older form only) hidden_size / num_attention_heads,
    // where `num_attention_heads` counts the uncompressed heads, twice the CCA query heads.
    let head_dim = match (
        f.usize("head_dim")?,
        f.usize("kv_channels")?,
        cca_num_q_heads.and(num_attention_heads),
    ) {
        (Some(d), _, _) | (None, Some(d), _) => d,
        (None, None, Some(n)) if n > 0 && hidden_size % n == 0 => hidden_size / n,
        _ => return Err(f.error("head_dim", "missing")),
    };
    let num_experts = match (f.usize("num_experts")?, layer_experts) {
        (Some(n), Some(e)) if n != e => {
            return Err(f.error("num_experts", format!("{n}, but zaya_layers says {e}")));
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => return Err(f.error("num_experts", "missing")),
    };
    let ffn = match f
        .usize_or_list("ffn_hidden_size")?
        .or(f.usize_or_list("ffn_hidden_size_list")?)
    {
        Some(n) => n,
        None => return Err(f.error("ffn_hidden_size", "missing")),
    };
    if ffn % 2 != 0 {
        return Err(f.error(
            "ffn_hidden_size",
            format!("{ffn} is odd; with gated_linear_unit it holds gate and up, two equal halves"),
        ));
    }
    let top_k = f.usize("moe_router_topk")?.unwrap_or(1);
    if top_k != 1 {
        return Err(f.error(
            "moe_router_topk",
            format!("{top_k} is not supported: zflow's ZAYA1 routes top-1"),
        ));
    }
    let (t0, t1) = (
        f.usize("cca_time0")?.unwrap_or(2),
        f.usize("cca_time1")?.unwrap_or(2),
    );
    if t0 != t1 || t0 == 0 {
        return Err(f.error(
            "cca_time1",
            format!(
                "{t1} with cca_time0 {t0}; zflow's ZAYA1 uses one kernel size for both convolutions"
            ),
        ));
    }

    f.expect_bool("cca", true, true, "zflow's ZAYA1 uses CCA attention")?;
    f.expect_bool(
        "attention_bias",
        false,
        false,
        "zflow's attention linears have no bias",
    )?;
    f.expect_bool(
        "add_bias_linear",
        false,
        false,
        "zflow's experts have no bias",
    )?;
    f.expect_bool(
        "lm_head_bias",
        false,
        false,
        "zflow's output head has no bias",
    )?;
    f.expect_bool(
        "gated_linear_unit",
        true,
        true,
        "zflow's experts are SwiGLU",
    )?;
    f.expect_bool(
        "tie_word_embeddings",
        true,
        true,
        "zflow's ZAYA1 ties the output head to the embedding",
    )?;
    if let Some(a) = f.str("activation_func")?.filter(|a| *a != "swiglu") {
        return Err(f.error(
            "activation_func",
            format!("`{a}` is not supported: zflow's experts are SwiGLU"),
        ));
    }
    if let Some(n) = f.str("normalization")?.filter(|n| *n != "RMSNorm") {
        return Err(f.error(
            "normalization",
            format!("`{n}` is not supported: zflow's ZAYA1 uses RMSNorm"),
        ));
    }
    if let Some(r) = f.get("rope_scaling") {
        return Err(f.error(
            "rope_scaling",
            format!("{r} is not supported: zflow's RoPE is the default (unscaled) one"),
        ));
    }
    if let Some(Value::Array(w)) = f.get("swa_layers")
        && w.iter().any(|x| x.as_u64() != Some(0))
    {
        return Err(f.error(
            "swa_layers",
            "sliding-window layers are not supported: zflow's ZAYA1 attends over the whole context",
        ));
    }
    // `rope_parameters` (newer transformers) carries theta and the partial factor too.
    let rope = f.get("rope_parameters").and_then(Value::as_object);
    let rope_theta = match rope.and_then(|r| r.get("rope_theta")) {
        Some(v) => v.as_f64().ok_or_else(|| {
            f.error(
                "rope_parameters.rope_theta",
                format!("expected a number, found {v}"),
            )
        })?,
        None => f.f64("rope_theta", 10_000.0)?,
    };
    let rope_fraction = match rope.and_then(|r| r.get("partial_rotary_factor")) {
        Some(v) => v.as_f64().ok_or_else(|| {
            f.error(
                "rope_parameters.partial_rotary_factor",
                format!("expected a number, found {v}"),
            )
        })?,
        None => f.f64("partial_rotary_factor", 0.5)?,
    };

    let c = ModelConfig {
        hidden_size,
        num_blocks: layers / 2,
        vocab_size,
        num_query_heads,
        num_kv_heads,
        head_dim,
        conv_kernel: t0,
        rope_fraction,
        rope_base: rope_theta,
        num_experts,
        top_k,
        expert_ffn: ffn / 2,
        mod_skip: f.bool("zaya_use_mod", true)?,
        router_dim: f.usize_or_list("zaya_mlp_expansion")?.unwrap_or(256),
        // The reference's router MLP is always Linear-GELU-Linear-GELU-Linear.
        router_mlp_layers: 3,
        eda: f.bool("zaya_use_eda", true)?,
        residual_scaling: f.bool("scale_residual_merge", true)?,
        tie_embeddings: true,
        rms_norm_eps: f.f64("norm_epsilon", 1e-5)?,
    };
    check_exportable(&c)
        .with_context(|| format!("{}: a ZAYA1 model zflow cannot represent", file.display()))?;
    Ok(c)
}

// ---------------------------------------------------------------------------------------------
// Tokenizer files
// ---------------------------------------------------------------------------------------------

/// A tokenizer to ship with an export.
struct TokenizerFiles {
    /// `tokenizer.json`, byte for byte.
    json: Vec<u8>,
    /// Where it came from (for errors).
    path: PathBuf,
    /// Tokens it knows (highest id + 1).
    size: usize,
    specials: Specials,
}

impl TokenizerFiles {
    /// Reads a `tokenizer.json`, or the one in folder `path`. The special tokens are those a
    /// `tokenizer` stage recorded in its `tokenizer_info.json` next to it, else the added tokens
    /// `<bos>`, `<eos>`, `<pad>` (the names zflow's trained tokenizers and Gemma3's use).
    fn read(path: &Path) -> Result<TokenizerFiles> {
        let (file, info) = if path.is_dir() {
            (
                path.join("tokenizer.json"),
                Some(path.join("tokenizer_info.json")),
            )
        } else {
            (path.to_path_buf(), None)
        };
        let json =
            fs::read(&file).with_context(|| format!("reading the tokenizer {}", file.display()))?;
        let v: Value = serde_json::from_slice(&json)
            .with_context(|| format!("{}: not JSON", file.display()))?;
        let mut added: BTreeMap<u32, String> = BTreeMap::new();
        for t in v
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(id), Some(content)) = (
                t.get("id").and_then(Value::as_u64),
                t.get("content").and_then(Value::as_str),
            ) {
                added.insert(id as u32, content.to_string());
            }
        }
        let vocab = v.get("model").and_then(|m| m.get("vocab"));
        let model_size = match vocab {
            // BPE / WordPiece: token -> id.
            Some(Value::Object(m)) => m
                .values()
                .filter_map(Value::as_u64)
                .max()
                .map_or(0, |n| n as usize + 1),
            // Unigram: [piece, score] in id order.
            Some(Value::Array(a)) => a.len(),
            _ => bail!(
                "{}: no model.vocab; not a Hugging Face tokenizer.json",
                file.display()
            ),
        };
        let size = model_size.max(added.keys().next_back().map_or(0, |&id| id as usize + 1));
        let named = |id: u32| Some((id, added.get(&id).cloned()));
        let by_text = |text: &str| {
            added
                .iter()
                .find(|(_, c)| c.as_str() == text)
                .map(|(&id, c)| (id, Some(c.clone())))
        };
        let specials = match info.filter(|p| p.exists()) {
            Some(info) => {
                let i: Value = serde_json::from_slice(&fs::read(&info)?)
                    .with_context(|| format!("parsing {}", info.display()))?;
                let id = |k: &str| i.get(k).and_then(Value::as_u64).map(|n| n as u32);
                Specials {
                    bos: id("bos_id").and_then(named),
                    eos: id("eos_id").and_then(named),
                    pad: id("pad_id").and_then(named),
                }
            }
            None => Specials {
                bos: by_text("<bos>"),
                eos: by_text("<eos>"),
                pad: by_text("<pad>"),
            },
        };
        Ok(TokenizerFiles {
            json,
            path: file,
            size,
            specials,
        })
    }

    /// `tokenizer_config.json` and `special_tokens_map.json`: what `AutoTokenizer` needs to load
    /// `tokenizer.json` as a fast tokenizer with the right special tokens. Only tokens whose
    /// text is known are named.
    fn configs(&self, max_positions: usize) -> (Value, Value) {
        let mut map = Map::new();
        for (key, t) in [
            ("bos_token", &self.specials.bos),
            ("eos_token", &self.specials.eos),
            ("pad_token", &self.specials.pad),
        ] {
            if let Some((_, Some(text))) = t {
                map.insert(key.into(), Value::String(text.clone()));
            }
        }
        let mut config = Map::new();
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        config.extend(map.clone());
        config.insert("model_max_length".into(), json!(max_positions));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        (Value::Object(config), Value::Object(map))
    }
}

// ---------------------------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------------------------

/// Checks checkpoint `dir` against its manifest as [`crate::checkpoint::read_verified`] does
/// (every file present with its size and blake3), streaming the files instead of holding them:
/// the optimizer state alone is twice the weights, and export needs none of it. Returns the
/// manifest's file names.
fn verify(dir: &Path) -> Result<BTreeSet<String>> {
    let mpath = dir.join("manifest.json");
    let manifest: Manifest = serde_json::from_slice(
        &fs::read(&mpath).with_context(|| format!("reading {}", mpath.display()))?,
    )
    .with_context(|| format!("parsing {}", mpath.display()))?;
    for (name, (size, hash)) in &manifest.files {
        let path = dir.join(name);
        let (len, digest) =
            hash_file(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            len == *size,
            "{}: {len} bytes, the manifest says {size}",
            path.display()
        );
        ensure!(digest == *hash, "{}: checksum mismatch", path.display());
    }
    Ok(manifest.files.into_keys().collect())
}

/// Size and blake3 (hex) of a file, read as a stream.
fn hash_file(path: &Path) -> Result<(u64, String)> {
    let mut hasher = blake3::Hasher::new();
    let len = std::io::copy(&mut fs::File::open(path)?, &mut hasher)?;
    Ok((len, hasher.finalize().to_hex().to_string()))
}

/// Maps `path` read-only.
fn map(path: &Path) -> Result<memmap2::Mmap> {
    let f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: a read-only mapping; like any reader of a file, we assume nobody rewrites it
    // while we read.
    unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))
}

/// Exports checkpoint `checkpoint` (a zflow checkpoint folder of `model`) as a Hugging Face
/// folder `out` for the reference implementation; see the module docs for what it holds.
/// Refuses a checkpoint that does not verify against its manifest, and a folder `out` that
/// exists and is not empty.
pub fn export_hf(
    checkpoint: &Path,
    model: &ModelConfig,
    opts: &ExportOptions,
    out: &Path,
) -> Result<()> {
    check_exportable(model)?;
    let listed = verify(checkpoint).with_context(|| {
        format!(
            "{} does not verify against its manifest; refusing to export a damaged checkpoint",
            checkpoint.display()
        )
    })?;
    for name in ["model.safetensors", "trainer.json"] {
        ensure!(
            listed.contains(name),
            "{}: the manifest lists no {name}",
            checkpoint.display()
        );
    }
    let state_path = checkpoint.join("trainer.json");
    let state: TrainerState = serde_json::from_slice(&fs::read(&state_path)?)
        .with_context(|| format!("parsing {}", state_path.display()))?;
    let tokenizer = opts
        .tokenizer
        .as_deref()
        .map(TokenizerFiles::read)
        .transpose()?;
    if let Some(t) = &tokenizer {
        ensure!(
            t.size <= model.vocab_size,
            "{}: {} tokens, more than the model's vocabulary of {}; is it the model's tokenizer?",
            t.path.display(),
            t.size,
            model.vocab_size
        );
    }
    // Special ids: the tokenizer's if given (it is what the model was trained on); without one,
    // ZAYA1's own when the vocabulary is Gemma3's; otherwise unknown (null).
    let specials = match &tokenizer {
        Some(t) => t.specials.clone(),
        None if model.vocab_size == GEMMA3_VOCAB => Specials {
            bos: Some((2, None)),
            eos: Some((1, None)),
            pad: Some((0, None)),
        },
        None => Specials::default(),
    };

    let origin = checkpoint.join("model.safetensors");
    let weights = map(&origin)?;
    let st = SafeTensors::deserialize(&weights)
        .with_context(|| format!("{}: not a safetensors file", origin.display()))?;
    let specs = specs(model);
    let known: BTreeSet<&str> = specs.iter().map(|s| s.ours.as_str()).collect();
    let mut names = st.names();
    names.sort();
    if let Some(extra) = names.iter().find(|n| !known.contains(**n)) {
        bail!(
            "{}: tensor `{extra}` is not a parameter of the given model config; is it the checkpoint's model?",
            origin.display()
        );
    }
    let mut tensors: Vec<(String, Lazy<'_>)> = Vec::with_capacity(specs.len() + model.num_blocks);
    for s in &specs {
        let view = st.tensor(&s.ours).map_err(|_| {
            anyhow!(
                "{}: tensor `{}` is missing (the model config has it)",
                origin.display(),
                s.ours
            )
        })?;
        ensure!(
            view.dtype() == Dtype::F32 && view.shape() == s.shape.as_slice(),
            "{}: tensor `{}` is {:?} {:?}, the model config implies F32 {:?}; is it the checkpoint's model?",
            origin.display(),
            s.ours,
            view.dtype(),
            view.shape(),
            s.shape
        );
        let transpose = s.linear.then(|| (s.shape[0], s.shape[1]));
        tensors.push((
            s.hf.clone(),
            Lazy {
                source: Cow::Borrowed(view.data()),
                dtype: Dtype::F32,
                shape: s.hf_shape(),
                transpose,
            },
        ));
    }
    let routes = model.num_experts + usize::from(model.mod_skip);
    ensure!(
        state.balance.len() == model.num_blocks,
        "{}/trainer.json: balancing state for {} MoE layers, the model has {}",
        checkpoint.display(),
        state.balance.len(),
        model.num_blocks
    );
    for (i, b) in state.balance.iter().enumerate() {
        ensure!(
            b.biases.len() == routes,
            "{}/trainer.json: MoE layer {i} has {} balancing biases, the model routes to {routes}",
            checkpoint.display(),
            b.biases.len()
        );
        let biases = Lazy {
            source: Cow::Owned(f32_bytes(&b.biases)),
            dtype: Dtype::F32,
            shape: vec![routes],
            transpose: None,
        };
        tensors.push((biases_name(i), biases));
    }

    let config = hf_config(model, opts.max_position_embeddings, &specials);
    publish(out, |dir| {
        fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(tensors, Some(meta), &dir.join("model.safetensors"))
            .context("writing model.safetensors")?;
        if let Some(t) = &tokenizer {
            fs::write(dir.join("tokenizer.json"), &t.json)?;
            let (config, map) = t.configs(opts.max_position_embeddings);
            fs::write(
                dir.join("tokenizer_config.json"),
                serde_json::to_vec_pretty(&config)?,
            )?;
            fs::write(
                dir.join("special_tokens_map.json"),
                serde_json::to_vec_pretty(&map)?,
            )?;
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", out.display()))
}

// ---------------------------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------------------------

/// The tensors of a Hugging Face folder: `model.safetensors`, or the shards a
/// `model.safetensors.index.json` lists, memory-mapped.
struct HfFiles {
    files: Vec<(memmap2::Mmap, PathBuf)>,
}

impl HfFiles {
    fn open(dir: &Path) -> Result<HfFiles> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let v: Value = serde_json::from_slice(&fs::read(&index)?)
                .with_context(|| format!("parsing {}", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| anyhow!("{}: no `weight_map`", index.display()))?;
            let shards: BTreeSet<&str> = map.values().filter_map(Value::as_str).collect();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            bail!(
                "{}: neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            );
        };
        let files = paths
            .into_iter()
            .map(|p| Ok((map(&p)?, p)))
            .collect::<Result<_>>()?;
        Ok(HfFiles { files })
    }
}

/// A tensor's values as f32 bytes, refusing dtypes other than F32, BF16 and F16.
fn to_f32<'a>(view: &TensorView<'a>, name: &str, file: &Path) -> Result<Cow<'a, [u8]>> {
    match view.dtype() {
        Dtype::F32 | Dtype::BF16 | Dtype::F16 => Ok(widen(view.data(), view.dtype())),
        other => bail!(
            "{}: tensor `{name}` is {other:?}; zflow reads F32, BF16 and F16",
            file.display()
        ),
    }
}

/// Imports Hugging Face folder `hf` (a reference-implementation ZAYA1: `config.json` and
/// `model.safetensors` or its shards) as zflow checkpoint folder `out`: `model.safetensors` with
/// our names and layouts (f32, the bytes the trainer would write for these weights),
/// `trainer.json` (the balancing biases, the RoPE base, step 0 of phase `hf-import`; no data
/// cursor or optimizer state), `model.json` and `manifest.json`. Returns the model config.
pub fn import_hf(hf: &Path, out: &Path) -> Result<ModelConfig> {
    let cpath = hf.join("config.json");
    let v: Value = serde_json::from_slice(
        &fs::read(&cpath).with_context(|| format!("reading {}", cpath.display()))?,
    )
    .with_context(|| format!("{}: not JSON", cpath.display()))?;
    let model = model_config_from_hf(&v, &cpath)?;

    let files = HfFiles::open(hf)?;
    let mut tables: Vec<(&Path, SafeTensors<'_>)> = Vec::new();
    for (map, p) in &files.files {
        tables.push((
            p,
            SafeTensors::deserialize(map)
                .with_context(|| format!("{}: not a safetensors file", p.display()))?,
        ));
    }
    // Every tensor name -> the file holding it.
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (p, t)) in tables.iter().enumerate() {
        for name in t.names() {
            if at.insert(name.to_string(), i).is_some() {
                bail!("{}: tensor `{name}` is in two shards", p.display());
            }
        }
    }
    let get = |name: &str| -> Result<(TensorView<'_>, &Path)> {
        let &i = at.get(name).ok_or_else(|| {
            anyhow!(
                "{}: tensor `{name}` is missing (config.json implies it)",
                hf.display()
            )
        })?;
        let (p, t) = &tables[i];
        Ok((t.tensor(name)?, p))
    };

    let specs = specs(&model);
    let routes = model.num_experts + usize::from(model.mod_skip);
    let mut expected: BTreeSet<String> = specs.iter().map(|s| s.hf.clone()).collect();
    expected.extend((0..model.num_blocks).map(biases_name));
    if let Some(extra) = at
        .keys()
        .find(|n| !expected.contains(*n) && n.as_str() != "lm_head.weight")
    {
        bail!(
            "{}: unexpected tensor `{extra}` (not part of the ZAYA1 model config.json describes)",
            hf.display()
        );
    }

    let mut tensors: Vec<(String, Lazy<'_>)> = Vec::with_capacity(specs.len());
    for s in &specs {
        let (view, file) = get(&s.hf)?;
        let want = s.hf_shape();
        ensure!(
            view.shape() == want.as_slice(),
            "{}: tensor `{}` is {:?}, config.json implies {:?}",
            file.display(),
            s.hf,
            view.shape(),
            want
        );
        to_f32(&view, &s.hf, file)?; // the dtype check, before anything is written
        let transpose = s.linear.then(|| (want[0], want[1]));
        tensors.push((
            s.ours.clone(),
            Lazy {
                source: Cow::Borrowed(view.data()),
                dtype: view.dtype(),
                shape: s.shape.clone(),
                transpose,
            },
        ));
    }
    // A saved tied head duplicates the embedding; anything else is a model zflow cannot hold.
    if at.contains_key("lm_head.weight") {
        let (head, file) = get("lm_head.weight")?;
        let (embed, efile) = get("model.embed_tokens.weight")?;
        let same = head.shape() == embed.shape()
            && to_f32(&head, "lm_head.weight", file)?
                == to_f32(&embed, "model.embed_tokens.weight", efile)?;
        ensure!(
            same,
            "{}: `lm_head.weight` differs from the embedding; zflow's ZAYA1 ties the output head to it",
            file.display()
        );
    }
    let mut balance = Vec::with_capacity(model.num_blocks);
    for i in 0..model.num_blocks {
        let name = biases_name(i);
        let (view, file) = get(&name)?;
        ensure!(
            view.shape() == [routes],
            "{}: tensor `{name}` is {:?}, config.json implies [{routes}]",
            file.display(),
            view.shape()
        );
        let biases = to_f32(&view, &name, file)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // A fresh controller around the imported biases (its gains' state is not exported).
        balance.push(BalanceState {
            biases,
            ..BalanceState::new(routes, model.mod_skip)
        });
    }
    let cursor = DataCursor {
        phase: IMPORTED_PHASE.into(),
        sample: 0,
        fingerprint: String::new(),
    };
    let state = TrainerState::new(IMPORTED_PHASE, 0, cursor, balance, 0);

    publish(out, |dir| {
        let meta = HashMap::from([("format".to_string(), CHECKPOINT_FORMAT.to_string())]);
        safetensors::serialize_to_file(tensors, Some(meta), &dir.join("model.safetensors"))
            .context("writing model.safetensors")?;
        fs::write(dir.join("trainer.json"), serde_json::to_vec_pretty(&state)?)?;
        fs::write(dir.join("model.json"), serde_json::to_vec_pretty(&model)?)?;
        // The manifest, as `checkpoint::commit` writes it (step, size and blake3 per file), last.
        let mut manifest = Manifest {
            step: 0,
            files: BTreeMap::new(),
        };
        for name in ["model.safetensors", "trainer.json", "model.json"] {
            manifest
                .files
                .insert(name.to_string(), hash_file(&dir.join(name))?);
        }
        fs::write(
            dir.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        Ok(())
    })
    .with_context(|| format!("writing {}", out.display()))?;
    Ok(model)
}

// ---------------------------------------------------------------------------------------------
// Atomic folders
// ---------------------------------------------------------------------------------------------

/// Creates folder `out` holding what `fill` writes into the folder it is given: `fill` writes
/// into a temporary sibling, every file is fsynced, and the folder is renamed into place, so
/// `out` either does not exist or is complete. `out` may exist only as an empty folder.
fn publish(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if out.exists() {
        let empty = fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        ensure!(
            empty,
            "{} already exists; remove it or choose another folder",
            out.display()
        );
    }
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a folder name", out.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let filled = fill(&tmp).and_then(|()| {
        for entry in fs::read_dir(&tmp)? {
            fs::File::open(entry?.path())?.sync_all()?;
        }
        fs::File::open(&tmp)?.sync_all()?;
        Ok(())
    });
    if let Err(e) = filled {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if out.exists() {
        fs::remove_dir(out)?;
    }
    fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    fs::File::open(&parent)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests;
