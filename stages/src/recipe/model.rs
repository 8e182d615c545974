//! The `model:` recipe section: the ZAYA1 model's sizes
//! ([`zflow_runtime::model::config::ModelConfig`]; `model: {}` is ZAYA1-base). It adds no stage
//! by itself: every `train.<phase>` trains it, `zflow size` sizes it.

use serde_json::Value;
use zflow_pipeline::ConfigError;
use zflow_pipeline::stage::parse_config;
use zflow_runtime::model::config::ModelConfig;

/// The `model:` section, range-checked; `None` without one.
pub fn parse(value: Option<&Value>) -> Result<Option<ModelConfig>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let config: ModelConfig = parse_config(value.clone(), "model")?;
    check_ranges(&config)?;
    Ok(Some(config))
}

/// Refuses, in a recipe whose phases train the model, an empty `model:` (every size would
/// fall back to ZAYA1-base's, 8.3B parameters, which is never what a `--set model={}` or a
/// forgotten section means: recipes/zaya1.yaml spells out ZAYA1-base's), and the variants the
/// torch engine cannot train: transformers 5.23's `ZayaForCausalLM` has no switch for them
/// (`workers/torch/zflow_torch/model.py`'s `check_supported` says the same at run time). A
/// recipe that only exports, sizes or evaluates may say either.
pub fn check_trainable(value: Option<&Value>, trains: bool) -> Result<(), ConfigError> {
    if !trains {
        return Ok(());
    }
    let Some(Value::Object(m)) = value else {
        return Ok(());
    };
    if m.is_empty() {
        return Err(ConfigError::new(
            "model",
            "`model` is empty, so every size would be ZAYA1-base's (8.3B parameters) and the phases would train that; give the sizes you mean (recipes/zaya1.yaml spells out ZAYA1-base)",
        ));
    }
    let fixed = [
        ("top_k", Value::from(1)),
        ("mod_skip", Value::from(true)),
        ("router_mlp_layers", Value::from(3)),
        ("eda", Value::from(true)),
        ("residual_scaling", Value::from(true)),
        ("tie_embeddings", Value::from(true)),
    ];
    for (field, value) in fixed {
        if let Some(given) = m.get(field)
            && given != &value
        {
            return Err(ConfigError::new(
                format!("model.{field}"),
                format!(
                    "`{field}: {given}`: the torch engine trains transformers 5.23's ZayaForCausalLM, which has {field} = {value} only"
                ),
            ));
        }
    }
    Ok(())
}

/// Sizes no model can have, named by their recipe path at load (they failed, or panicked,
/// only once training started).
fn check_ranges(c: &ModelConfig) -> Result<(), ConfigError> {
    let sizes = [
        ("hidden_size", c.hidden_size),
        ("num_blocks", c.num_blocks),
        ("vocab_size", c.vocab_size),
        ("num_query_heads", c.num_query_heads),
        ("num_kv_heads", c.num_kv_heads),
        ("head_dim", c.head_dim),
        ("conv_kernel", c.conv_kernel),
        ("num_experts", c.num_experts),
        ("top_k", c.top_k),
        ("expert_ffn", c.expert_ffn),
        ("router_dim", c.router_dim),
    ];
    for (field, value) in sizes {
        if value == 0 {
            return Err(ConfigError::new(
                format!("model.{field}"),
                format!("`{field}` must be > 0, got 0"),
            ));
        }
    }
    // Upper bounds far beyond any model that trains, so that a typo (`num_blocks: 1e8`) is
    // named here, not found by the allocator once a stage starts.
    let bounded = [
        ("hidden_size", c.hidden_size, 1 << 20),
        ("num_blocks", c.num_blocks, 4096),
        ("vocab_size", c.vocab_size, 1 << 24),
        ("num_query_heads", c.num_query_heads, 1 << 16),
        ("num_kv_heads", c.num_kv_heads, 1 << 16),
        ("head_dim", c.head_dim, 1 << 16),
        ("conv_kernel", c.conv_kernel, 64),
        ("num_experts", c.num_experts, 1 << 16),
        ("top_k", c.top_k, c.num_experts),
        ("expert_ffn", c.expert_ffn, 1 << 20),
        ("router_dim", c.router_dim, 1 << 20),
        ("router_mlp_layers", c.router_mlp_layers, 64),
    ];
    for (field, value, most) in bounded {
        if value > most {
            return Err(ConfigError::new(
                format!("model.{field}"),
                format!("`{field}` must be at most {most}, got {value}"),
            ));
        }
    }
    if c.vocab_size < 2 {
        return Err(ConfigError::new(
            "model.vocab_size",
            format!(
                "`vocab_size` must be at least 2 (a model predicts one token among several), got {}",
                c.vocab_size
            ),
        ));
    }
    // The weights, roughly (f64: no overflow): each block's attention and experts, and the
    // embedding. Above this no machine holds the model.
    const MOST_PARAMETERS: f64 = 1e13;
    let f = |x: usize| x as f64;
    let latent = f(c.num_query_heads + 2 * c.num_kv_heads) * f(c.head_dim);
    let block = f(c.hidden_size) * (2.0 * latent + f(c.num_experts) * 3.0 * f(c.expert_ffn))
        + f(c.router_dim) * (f(c.hidden_size) + f(c.router_dim) * f(c.router_mlp_layers));
    let parameters = f(c.num_blocks) * block + f(c.vocab_size) * f(c.hidden_size);
    if parameters > MOST_PARAMETERS {
        return Err(ConfigError::new(
            "model",
            format!(
                "these sizes give a model of about {parameters:.1e} parameters; zflow refuses more than {MOST_PARAMETERS:.0e}"
            ),
        ));
    }
    if !(0.0..=1.0).contains(&c.rope_fraction) || !c.rope_dims().is_multiple_of(2) {
        return Err(ConfigError::new(
            "model.rope_fraction",
            format!(
                "`rope_fraction` must lie in [0, 1] and give an even number of RoPE channels (RoPE rotates channel pairs): head_dim {} x {} = {} channels",
                c.head_dim,
                c.rope_fraction,
                c.rope_dims()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for &b in &c.sliding_blocks {
        if b >= c.num_blocks || !seen.insert(b) {
            return Err(ConfigError::new(
                "model.sliding_blocks",
                format!(
                    "block {b} is {} (blocks are 0..{})",
                    if b >= c.num_blocks {
                        "out of range"
                    } else {
                        "listed twice"
                    },
                    c.num_blocks
                ),
            ));
        }
    }
    if !c.sliding_blocks.is_empty() && c.sliding_window == 0 {
        return Err(ConfigError::new(
            "model.sliding_window",
            "`sliding_window` must be > 0 when `sliding_blocks` lists blocks",
        ));
    }
    let positive = [
        ("rope_base", c.rope_base),
        ("rms_norm_eps", c.rms_norm_eps),
        ("sliding_rope_base", c.sliding_rope_base),
    ];
    for (field, value) in positive {
        if !(value.is_finite() && value > 0.0) {
            return Err(ConfigError::new(
                format!("model.{field}"),
                format!("`{field}` must be a finite number > 0, got {value}"),
            ));
        }
    }
    if !(c.rope_fraction.is_finite() && c.rope_fraction > 0.0 && c.rope_fraction <= 1.0) {
        return Err(ConfigError::new(
            "model.rope_fraction",
            format!("`rope_fraction` must be in (0, 1], got {}", c.rope_fraction),
        ));
    }
    Ok(())
}
