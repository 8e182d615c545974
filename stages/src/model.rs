//! The `model:` recipe section: the ZAYA1 model's sizes (`zflow_runtime::size::ModelConfig`;
//! `model: {}` is ZAYA1-base). It adds no stage by itself: `zflow size` reads it now, the
//! training stages will.

use serde_json::Value;
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec, Section};
use zflow_runtime::size::ModelConfig;

/// The `model:` section.
pub struct ModelSection;

impl ModelSection {
    /// The recipe's model config (ZAYA1-base when the recipe has no `model:`).
    pub fn config(recipe: &Value) -> Result<ModelConfig, ConfigError> {
        match recipe.get("model") {
            None => Ok(ModelConfig::default()),
            Some(v) => parse_config(v.clone(), "model"),
        }
    }
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
