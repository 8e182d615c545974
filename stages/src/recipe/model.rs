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
