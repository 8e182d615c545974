//! `config.json`: a [`ModelConfig`] to `ZayaConfig` fields and back, in either layout
//! ([`Layout`]: transformers 5.23's, or the scalar form of Zyphra's fork).
//!
//! Both state the skip route's semantics in `zflow_skip_output` (`zero` or `input`,
//! [`SkipOutput`]); transformers keeps unknown config keys, so the field survives a
//! `save_pretrained`. A folder without it follows its layout's code: zero for transformers',
//! the normed input for the legacy one (the `zaya1-legacy` branch).

use super::layout::Layout;
use crate::model::config::{ModelConfig, SkipOutput};
use anyhow::{Context, Result, anyhow, ensure};
use serde_json::{Map, Value, json};
use std::path::Path;

/// The `config.json` key that states the skip route's semantics.
const SKIP_OUTPUT_KEY: &str = "zflow_skip_output";

fn skip_output_name(s: SkipOutput) -> &'static str {
    match s {
        SkipOutput::Zero => "zero",
        SkipOutput::Input => "input",
    }
}

/// Refuses a model that `layout`'s implementation cannot express (or that zflow's model does
/// not actually implement as configured), naming the `model:` field.
pub(super) fn check_exportable(c: &ModelConfig, layout: Layout) -> Result<()> {
    if layout == Layout::Legacy {
        ensure!(
            c.sliding_blocks.is_empty(),
            "model.sliding_blocks lists blocks; zflow writes sliding-window layers in transformers' layout only (export without --layout legacy)"
        );
    }
    if layout == Layout::Transformers {
        // transformers 5.23's ZAYA has no switch for these.
        for (field, on) in [
            ("mod_skip", c.mod_skip),
            ("eda", c.eda),
            ("residual_scaling", c.residual_scaling),
        ] {
            ensure!(
                on,
                "model.{field} is false; transformers 5.23's ZAYA always has it (export with --layout legacy)"
            );
        }
    }
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
    // Checked: the sizes may come from a hostile config.json, before any tensor bounds them.
    let kv_latent = c.num_kv_heads.checked_mul(c.head_dim).ok_or_else(|| {
        anyhow::anyhow!(
            "model.num_kv_heads ({}) x model.head_dim ({}) overflows",
            c.num_kv_heads,
            c.head_dim
        )
    })?;
    ensure!(
        kv_latent.is_multiple_of(2),
        "model.num_kv_heads x model.head_dim ({kv_latent}) must be even: the reference splits it between two value projections"
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
pub(super) struct Specials {
    pub(super) bos: Option<(u32, Option<String>)>,
    pub(super) eos: Option<(u32, Option<String>)>,
    pub(super) pad: Option<(u32, Option<String>)>,
}

/// `config.json` for `c`, field names and order as in the reference's `ZayaConfig.__init__`
/// (the scalar form of `configuration_zaya.py`: `num_attention_heads` = CCA query heads,
/// `num_query_groups` = `num_key_value_heads` = KV heads, explicit `head_dim`). serde_json keeps
/// insertion order here, so the same inputs give the same bytes.
fn legacy_config(c: &ModelConfig, max_positions: usize, specials: &Specials) -> Value {
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
        (SKIP_OUTPUT_KEY, json!(skip_output_name(c.skip_output))),
    ];
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// `config.json` for `c` in `layout`; see [`legacy_config`] and [`transformers_config`].
pub(super) fn hf_config(
    c: &ModelConfig,
    layout: Layout,
    max_positions: usize,
    specials: &Specials,
) -> Value {
    match layout {
        Layout::Transformers => transformers_config(c, max_positions, specials),
        Layout::Legacy => legacy_config(c, max_positions, specials),
    }
}

/// `config.json` for `c` as transformers 5.23's `ZayaConfig` writes it (its fields, sorted as
/// `save_pretrained` sorts them): one `hybrid` layer type per block with its RoPE parameters.
/// serde_json keeps insertion order here, so the same inputs give the same bytes.
fn transformers_config(c: &ModelConfig, max_positions: usize, specials: &Specials) -> Value {
    let id = |t: &Option<(u32, Option<String>)>| t.as_ref().map(|(id, _)| *id);
    let fields: Vec<(&str, Value)> = vec![
        ("architectures", json!(["ZayaForCausalLM"])),
        ("attention_bias", json!(false)),
        ("attention_dropout", json!(0.0)),
        ("bos_token_id", json!(id(&specials.bos))),
        ("cca_time0", json!(c.conv_kernel)),
        ("cca_time1", json!(c.conv_kernel)),
        ("dtype", json!("float32")),
        ("eos_token_id", json!(id(&specials.eos))),
        ("head_dim", json!(c.head_dim)),
        ("hidden_act", json!("silu")),
        ("hidden_size", json!(c.hidden_size)),
        ("initializer_range", json!(0.02)),
        (
            "layer_types",
            json!(
                (0..c.num_blocks)
                    .map(|i| match c.window(i) {
                        Some(_) => "hybrid_sliding",
                        None => "hybrid",
                    })
                    .collect::<Vec<_>>()
            ),
        ),
        ("lm_head_bias", json!(false)),
        ("max_position_embeddings", json!(max_positions)),
        ("model_type", json!("zaya")),
        ("moe_intermediate_size", json!(c.expert_ffn)),
        ("num_attention_heads", json!(c.num_query_heads)),
        ("num_experts", json!(c.num_experts)),
        ("num_experts_per_tok", json!(c.top_k)),
        ("num_hidden_layers", json!(c.num_blocks)),
        ("num_key_value_heads", json!(c.num_kv_heads)),
        ("output_router_logits", json!(false)),
        ("pad_token_id", json!(id(&specials.pad))),
        ("rms_norm_eps", json!(c.rms_norm_eps)),
        ("rope_parameters", {
            let rope = |theta: f64| json!({"partial_rotary_factor": c.rope_fraction, "rope_theta": theta, "rope_type": "default"});
            let mut r = json!({"hybrid": rope(c.rope_base)});
            if !c.sliding_blocks.is_empty() {
                r["hybrid_sliding"] = rope(c.sliding_rope_base);
            }
            r
        }),
        ("router_hidden_size", json!(c.router_dim)),
        (
            "sliding_window",
            match c.sliding_blocks.is_empty() {
                true => Value::Null,
                false => json!(c.sliding_window),
            },
        ),
        ("tie_word_embeddings", json!(true)),
        ("transformers_version", json!("5.23.0")),
        ("use_cache", json!(true)),
        ("vocab_size", json!(c.vocab_size)),
        (SKIP_OUTPUT_KEY, json!(skip_output_name(c.skip_output))),
    ];
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// Typed reads of `config.json` fields whose errors name the file and the field.
pub(super) struct Fields<'a> {
    pub(super) map: &'a Map<String, Value>,
    pub(super) file: &'a Path,
}

impl Fields<'_> {
    pub(super) fn error(&self, key: &str, msg: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}: `{key}`: {msg}", self.file.display())
    }

    /// The value, treating `null` as absent (the reference writes `null` for unset options).
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn usize_of(&self, key: &str, v: &Value) -> Result<usize> {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| self.error(key, format!("expected a non-negative integer, found {v}")))
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key).map(|v| self.usize_of(key, v)).transpose()
    }

    pub(super) fn required(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.error(key, "missing"))
    }

    /// An integer, or a per-layer list of them (the form ZAYA1-base's config uses for some
    /// fields: 0 on the layers it does not apply to); the list's first non-zero entry, all of
    /// which must agree.
    pub(super) fn usize_or_list(&self, key: &str) -> Result<Option<usize>> {
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

    pub(super) fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.error(key, format!("expected a number, found {v}"))),
        }
    }

    pub(super) fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.error(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.error(key, format!("expected a string, found {v}")))
            })
            .transpose()
    }

    /// The skip route's semantics the folder states ([`SKIP_OUTPUT_KEY`]), else `unstated`.
    pub(super) fn skip_output(&self, unstated: SkipOutput) -> Result<SkipOutput> {
        match self.str(SKIP_OUTPUT_KEY)? {
            None => Ok(unstated),
            Some("zero") => Ok(SkipOutput::Zero),
            Some("input") => Ok(SkipOutput::Input),
            Some(other) => Err(self.error(
                SKIP_OUTPUT_KEY,
                format!("`{other}`; expected `zero` or `input`"),
            )),
        }
    }

    /// Fails unless boolean `key` is `want` (default `default`): a feature zflow's model lacks.
    pub(super) fn expect_bool(
        &self,
        key: &str,
        default: bool,
        want: bool,
        why: &str,
    ) -> Result<()> {
        if self.bool(key, default)? != want {
            return Err(self.error(key, format!("{} is not supported: {why}", !want)));
        }
        Ok(())
    }
}

/// The [`ModelConfig`] a reference `config.json` describes (parsed JSON `v`, read from `file`).
/// Accepts the scalar `ZayaConfig` form [`export_hf`](super::export_hf) writes and the older per-layer list form
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
    if Layout::of_config(v) == Layout::Transformers {
        return transformers_model_config(&f);
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
        skip_output: f.skip_output(SkipOutput::Input)?,
        // `swa_layers` with a window is refused above.
        ..ModelConfig::default()
    };
    check_exportable(&c, Layout::Legacy)
        .with_context(|| format!("{}: a ZAYA1 model zflow cannot represent", file.display()))?;
    Ok(c)
}

/// The [`ModelConfig`] of a transformers 5.23 `config.json` (`ZayaConfig`; absent fields take
/// that class's defaults, which are ZAYA1-8B's).
fn transformers_model_config(f: &Fields<'_>) -> Result<ModelConfig> {
    let or = |key: &str, default: usize| -> Result<usize> { Ok(f.usize(key)?.unwrap_or(default)) };
    let num_blocks = or("num_hidden_layers", 40)?;
    let mut sliding_blocks = Vec::new();
    if let Some(types) = f.get("layer_types") {
        let types = types
            .as_array()
            .ok_or_else(|| f.error("layer_types", format!("expected a list, found {types}")))?;
        if types.len() != num_blocks {
            return Err(f.error(
                "layer_types",
                format!("{} entries for {num_blocks} layers", types.len()),
            ));
        }
        for (i, t) in types.iter().enumerate() {
            match t.as_str() {
                Some("hybrid") => {}
                Some("hybrid_sliding") => sliding_blocks.push(i),
                _ => {
                    return Err(f.error(
                        "layer_types",
                        format!("entry {i} is {t}; expected `hybrid` or `hybrid_sliding`"),
                    ));
                }
            }
        }
    }
    let sliding_window = match (f.usize("sliding_window")?, sliding_blocks.is_empty()) {
        (Some(w), _) => w,
        (None, true) => ModelConfig::default().sliding_window,
        (None, false) => {
            return Err(f.error(
                "sliding_window",
                "missing, but `layer_types` has `hybrid_sliding` layers",
            ));
        }
    };
    let top_k = or("num_experts_per_tok", 1)?;
    if top_k != 1 {
        return Err(f.error(
            "num_experts_per_tok",
            format!("{top_k} is not supported: zflow's ZAYA1 routes top-1"),
        ));
    }
    let conv = or("cca_time0", 2)?;
    let conv1 = or("cca_time1", 2)?;
    if conv != conv1 || conv == 0 {
        return Err(f.error(
            "cca_time1",
            format!("{conv1} with cca_time0 {conv}; zflow's ZAYA1 uses one kernel size for both convolutions"),
        ));
    }
    for (key, why) in [
        ("attention_bias", "zflow's attention linears have no bias"),
        ("lm_head_bias", "zflow's output head has no bias"),
    ] {
        f.expect_bool(key, false, false, why)?;
    }
    f.expect_bool(
        "tie_word_embeddings",
        true,
        true,
        "zflow's ZAYA1 ties the output head to the embedding",
    )?;
    if let Some(a) = f.str("hidden_act")?.filter(|a| *a != "silu") {
        return Err(f.error(
            "hidden_act",
            format!("`{a}` is not supported: zflow's experts are SwiGLU (silu)"),
        ));
    }
    // `rope_parameters.<layer type>`: theta and the partial factor of each layer type. A flat
    // `rope_parameters` (one set, no layer types) is the `hybrid` layers'.
    let rope = |layer_type: &str, key: &str, default: f64| -> Result<f64> {
        let all = f.get("rope_parameters");
        let flat = all
            .filter(|r| layer_type == "hybrid" && r.get("hybrid").is_none())
            .filter(|r| r.get("rope_theta").is_some());
        let params = flat
            .or_else(|| all.and_then(|r| r.get(layer_type)))
            .and_then(Value::as_object);
        if let Some(t) = params
            .and_then(|h| h.get("rope_type"))
            .filter(|t| t.as_str() != Some("default"))
        {
            return Err(f.error(
                &format!("rope_parameters.{layer_type}.rope_type"),
                format!("{t} is not supported: zflow's RoPE is the default (unscaled) one"),
            ));
        }
        match params.and_then(|h| h.get(key)) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| {
                f.error(
                    &format!("rope_parameters.{layer_type}.{key}"),
                    format!("expected a number, found {v}"),
                )
            }),
        }
    };
    let rope_fraction = rope("hybrid", "partial_rotary_factor", 0.5)?;
    if !sliding_blocks.is_empty()
        && rope("hybrid_sliding", "partial_rotary_factor", 0.5)? != rope_fraction
    {
        return Err(f.error(
            "rope_parameters.hybrid_sliding.partial_rotary_factor",
            "differs from the `hybrid` layers'; zflow's ZAYA1 rotates one fraction of every head",
        ));
    }
    let c = ModelConfig {
        hidden_size: or("hidden_size", 2048)?,
        num_blocks,
        vocab_size: or("vocab_size", 262_272)?,
        num_query_heads: or("num_attention_heads", 8)?,
        num_kv_heads: or("num_key_value_heads", 2)?,
        head_dim: or("head_dim", 128)?,
        conv_kernel: conv,
        rope_fraction,
        rope_base: rope("hybrid", "rope_theta", 5_000_000.0)?,
        num_experts: or("num_experts", 16)?,
        top_k,
        expert_ffn: or("moe_intermediate_size", 2048)?,
        // transformers' ZAYA always has the skip route, EDA, residual scaling and a 3-layer
        // router MLP.
        mod_skip: true,
        skip_output: f.skip_output(SkipOutput::Zero)?,
        router_dim: or("router_hidden_size", 256)?,
        router_mlp_layers: 3,
        eda: true,
        residual_scaling: true,
        tie_embeddings: true,
        rms_norm_eps: f.f64("rms_norm_eps", 1e-5)?,
        sliding_blocks,
        sliding_window,
        sliding_rope_base: rope("hybrid_sliding", "rope_theta", 10_000.0)?,
    };
    check_exportable(&c, Layout::Transformers)
        .with_context(|| format!("{}: a ZAYA1 model zflow cannot represent", f.file.display()))?;
    Ok(c)
}
