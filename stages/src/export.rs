//! `export`: the recipe's trained model as a Hugging Face folder for ZAYA1's reference
//! implementation (`zflow_runtime::hf`): `hf/` in the stage's output holds `config.json`,
//! `model.safetensors` and, with a tokenizer, its files; `from_pretrained` on that folder loads
//! it in Zyphra's `transformers` fork.
//!
//! Recipe section:
//! ```yaml
//! export: {format: hf}     # the only format
//! ```
//! adds one stage, `export`, after the last phase's `train.<phase>` (its `final/` checkpoint),
//! needing the `tokenizer` stage too when the recipe has one.

use crate::names;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec, Section, Stage, StageContext};
use zflow_runtime::hf::{self, ExportOptions};

/// The `export` stage kind.
pub struct Export;

/// `export` settings (what the `export:` section writes).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// The output format; `hf` is the one there is.
    pub format: String,
    /// The train stage whose `final/` checkpoint is exported.
    pub train: String,
    /// The tokenizer stage whose `tokenizer.json` ships with the model.
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// The context the model was trained at (`max_position_embeddings`).
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
}

fn default_positions() -> usize {
    hf::DEFAULT_MAX_POSITIONS
}

/// Checks the format name, so the section and the stage say the same thing.
fn check_format(format: &str, path: &str) -> Result<(), ConfigError> {
    if format == "hf" {
        return Ok(());
    }
    Err(ConfigError::new(
        path,
        format!(
            "`{format}` is not an export format; the one there is: `hf` (Hugging Face, for ZAYA1's reference implementation)"
        ),
    ))
}

impl Stage for Export {
    type Config = ExportConfig;
    const KIND: &'static str = "export";
    // 2: the model comes from the checkpoint's model.json, not from the recipe's `model:`.
    const VERSION: u32 = 2;

    fn validate(&self, c: &ExportConfig, needs: &[String]) -> Result<(), ConfigError> {
        check_format(&c.format, "format")?;
        for stage in std::iter::once(&c.train).chain(&c.tokenizer) {
            if !needs.contains(stage) {
                return Err(ConfigError::new(
                    "needs",
                    format!("the export reads `{stage}` but does not need it"),
                ));
            }
        }
        Ok(())
    }

    fn run(&self, c: &ExportConfig, ctx: &StageContext) -> anyhow::Result<()> {
        let checkpoint = ctx.input(&c.train)?.join("final");
        let tokenizer = c
            .tokenizer
            .as_ref()
            .map(|t| ctx.input(t).map(|p| p.to_path_buf()))
            .transpose()?;
        let opts = ExportOptions {
            tokenizer,
            max_position_embeddings: c.max_position_embeddings,
        };
        let model = zflow_runtime::checkpoint::model_config(&checkpoint)?;
        hf::export_hf(&checkpoint, &model, &opts, &ctx.out_dir().join("hf"))?;
        tracing::info!("exported {} as a Hugging Face folder", checkpoint.display());
        Ok(())
    }
}

/// The `export:` section's value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportSettings {
    format: String,
}

/// The `export:` section: one `export` stage after the recipe's last training phase.
pub struct ExportSection;

impl Section for ExportSection {
    fn key(&self) -> &'static str {
        "export"
    }

    fn expand(&self, value: &Value, recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        let s: ExportSettings = parse_config(value.clone(), "export")?;
        check_format(&s.format, "export.format")?;
        if recipe.get("model").is_none() {
            return Err(ConfigError::new(
                "export",
                "there is no model to export: the recipe has no `model:` section",
            ));
        }
        // The model itself comes from the checkpoint (`model.json`: what it was trained with,
        // the phase's RoPE base included), not from the section.
        crate::model::ModelSection::config(recipe)?;
        // `phases:` adds `train.<phase>` for every phase, in recipe order; the last one holds the
        // finished model.
        let phases = crate::phases::parse(recipe)?;
        let Some((phase, entry)) = phases.last() else {
            return Err(ConfigError::new(
                "export",
                "there is no model to export: the recipe has no `phases:` to train it",
            ));
        };
        let train = names::train(phase);
        let tokenizer = recipe.get("tokenizer").map(|_| "tokenizer".to_string());
        let positions = entry.seq_len;
        let mut needs = vec![train.clone()];
        needs.extend(tokenizer.clone());
        Ok(vec![NodeSpec {
            name: names::EXPORT.into(),
            kind: "export".into(),
            config: json!({"format": s.format, "train": train, "tokenizer": tokenizer, "max_position_embeddings": positions}),
            needs,
            resources: None,
            path: "export".into(),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_exports_the_last_phase_with_the_tokenizer() {
        let recipe = json!({
            "model": {"hidden_size": 64, "num_blocks": 2},
            "tokenizer": {"train": {"vocab_size": 512}},
            "phases": {"p1": {"tokens": 1000, "seq_len": 64, "mixture": {"a": 1.0}}, "p2": {"tokens": 1000, "seq_len": 256, "mixture": {"a": 1.0}}},
            "export": {"format": "hf"},
        });
        let nodes = ExportSection.expand(&recipe["export"], &recipe).unwrap();
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!(
            (n.name.as_str(), n.kind.as_str(), n.needs.clone()),
            (
                "export",
                "export",
                vec!["train.p2".to_string(), "tokenizer".to_string()]
            )
        );
        let c: ExportConfig = serde_json::from_value(n.config.clone()).unwrap();
        assert_eq!(
            (
                c.train.as_str(),
                c.tokenizer.as_deref(),
                c.max_position_embeddings
            ),
            ("train.p2", Some("tokenizer"), 256)
        );
        assert!(Export.validate(&c, &n.needs).is_ok());
        assert!(
            Export
                .validate(&c, &["train.p2".to_string()])
                .unwrap_err()
                .message
                .contains("`tokenizer`")
        );
    }

    #[test]
    fn the_section_names_what_is_wrong() {
        let recipe = json!({"model": {}, "phases": {"p1": {"tokens": 1000, "seq_len": 64, "mixture": {"a": 1.0}}}});
        let e = ExportSection
            .expand(&json!({"format": "onnx"}), &recipe)
            .unwrap_err();
        assert_eq!(e.path, "export.format");
        assert!(
            e.message.contains("`onnx` is not an export format"),
            "{}",
            e.message
        );
        let e = ExportSection
            .expand(&json!({"format": "hf"}), &json!({"phases": {"p1": {}}}))
            .unwrap_err();
        assert!(e.message.contains("no `model:`"), "{}", e.message);
        let e = ExportSection
            .expand(&json!({"format": "hf"}), &json!({"model": {}}))
            .unwrap_err();
        assert!(e.message.contains("no `phases:`"), "{}", e.message);
        assert!(
            ExportSection
                .expand(&json!({"format": "hf", "dtype": "bf16"}), &recipe)
                .is_err()
        );
    }
}
