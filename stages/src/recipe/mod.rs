//! The recipe's ML sections as one typed document: [`RecipeDoc`].
//!
//! The engine (`zflow_pipeline`) owns a recipe's core keys (`name`, `store`, `executor`,
//! `stages`) and hands the rest to [`RecipeSections`]. That parses every section once, in one
//! place, checks the sections against each other (a phase's mixture names sources, evals need
//! a tokenizer, ...) and only then expands them into stage nodes. Commands that read a recipe
//! (`zflow size`, `zflow bench`, `zflow ckpt`) call [`RecipeDoc::parse`] too, so every reader
//! sees the same values with the same defaults.
//!
//! One file per section: [`sources`], [`tokenizer`], [`model`], [`train`], [`phases`],
//! [`evals`], [`export`]. Adding a section is one file, one field here and one line in
//! [`RecipeDoc::parse`] and [`RecipeSections::expand`].

pub mod evals;
pub mod export;
pub mod model;
pub mod phases;
pub mod sources;
pub mod tokenizer;
pub mod train;

use serde_json::Value;
use zflow_pipeline::{ConfigError, NodeSpec, Sections};
use zflow_runtime::model::config::ModelConfig;

/// The ML sections of one recipe, parsed and checked.
#[derive(Clone, Debug)]
pub struct RecipeDoc {
    /// The recipe's `name:`, if it has one (labels of evaluated models).
    pub name: Option<String>,
    /// `sources:`, in recipe order.
    pub sources: Vec<sources::Source>,
    /// `tokenizer:`.
    pub tokenizer: Option<tokenizer::TokenizerSpec>,
    /// `model:`; `model: {}` is ZAYA1-base. Without it, phases mix data but do not train.
    pub model: Option<ModelConfig>,
    /// `phases:`, in recipe order, each with its resolved training settings.
    pub phases: Vec<phases::PhaseEntry>,
    /// `evals:`.
    pub evals: Option<evals::EvalsSpec>,
    /// `export:`.
    pub export: Option<export::ExportSpec>,
}

impl RecipeDoc {
    /// Parses and checks the sections of `recipe` (the composed recipe as JSON). Errors name
    /// the recipe path of the offending value.
    pub fn parse(recipe: &Value) -> Result<Self, ConfigError> {
        let name = recipe.get("name").and_then(Value::as_str).map(String::from);
        let sources = sources::parse(recipe.get("sources"), recipe.pointer("/model/vocab_size"))?;
        let tokenizer = tokenizer::parse(recipe.get("tokenizer"))?;
        let model = model::parse(recipe.get("model"))?;
        if let (Some(m), Some(t)) = (&model, &tokenizer) {
            tokenizer::check_fits(t, m)?;
        }
        let train = train::parse(recipe.get("train"))?;
        let phases = phases::parse(recipe.get("phases"), &sources, &train)?;
        model::check_trainable(recipe.get("model"), !phases.is_empty())?;
        let mut doc = RecipeDoc {
            name,
            sources,
            tokenizer,
            model,
            phases,
            evals: None,
            export: None,
        };
        doc.evals = evals::parse(recipe.get("evals"), &doc)?;
        doc.export = export::parse(recipe.get("export"), &doc)?;
        Ok(doc)
    }

    /// The recipe's model config, ZAYA1-base when the recipe has no `model:`.
    pub fn model_or_default(&self) -> ModelConfig {
        self.model.clone().unwrap_or_default()
    }
}

/// The sections zflow's recipes have, for the engine's registry.
pub struct RecipeSections;

impl Sections for RecipeSections {
    fn keys(&self) -> &'static [&'static str] {
        &[
            "sources",
            "tokenizer",
            "phases",
            "model",
            "train",
            "export",
            "evals",
        ]
    }

    fn expand(&self, recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        let doc = RecipeDoc::parse(recipe)?;
        let mut nodes = sources::expand(&doc);
        nodes.extend(tokenizer::expand(&doc));
        nodes.extend(phases::expand(&doc));
        nodes.extend(export::expand(&doc));
        nodes.extend(evals::expand(&doc));
        Ok(nodes)
    }
}
