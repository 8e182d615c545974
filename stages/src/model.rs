//! The `model:` recipe section: the ZAYA1 model's sizes (`zflow_runtime::model::config::ModelConfig`;
//! `model: {}` is ZAYA1-base). It adds no stage by itself: `zflow size` reads it now, the
//! training stages will.

use serde_json::Value;
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec, Section};
use zflow_runtime::model::config::ModelConfig;

/// The `model:` section.
pub struct ModelSection;

impl ModelSection {
    /// The recipe's model config (ZAYA1-base when the recipe has no `model:`).
    pub fn config(recipe: &Value) -> Result<ModelConfig, ConfigError> {
        let config: ModelConfig = match recipe.get("model") {
            None => return Ok(ModelConfig::default()),
            Some(v) => parse_config(v.clone(), "model")?,
        };
        check_ranges(&config)?;
        Ok(config)
    }
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
    let positive = [("rope_base", c.rope_base), ("rms_norm_eps", c.rms_norm_eps)];
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

impl Section for ModelSection {
    fn key(&self) -> &'static str {
        "model"
    }

    fn expand(&self, _value: &Value, recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        Self::config(recipe)?;
        Ok(Vec::new())
    }
}
