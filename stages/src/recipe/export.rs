//! The `export:` recipe section: one `export` stage after the recipe's last training phase,
//! writing its final checkpoint in an interchange format (`hf`: a Hugging Face folder for
//! ZAYA1's reference implementation), with the recipe's tokenizer when it has one.

use serde::Deserialize;
use serde_json::{Value, json};
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;

/// The `export:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSpec {
    /// The format (`hf`).
    pub format: String,
    /// The folder's layout: `transformers` (5.23, the default) or `legacy` (Zyphra's fork,
    /// vLLM).
    #[serde(default)]
    pub layout: zflow_runtime::hf::Layout,
}

/// The `export:` section, checked against the rest of the recipe (`doc`): there must be a
/// model and a phase that trains it.
pub fn parse(value: Option<&Value>, doc: &RecipeDoc) -> Result<Option<ExportSpec>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let s: ExportSpec = parse_config(value.clone(), "export")?;
    crate::export::check_format(&s.format, "export.format")?;
    if doc.model.is_none() {
        return Err(ConfigError::new(
            "export",
            "there is no model to export: the recipe has no `model:` section",
        ));
    }
    if doc.phases.is_empty() {
        return Err(ConfigError::new(
            "export",
            "there is no model to export: the recipe has no `phases:` to train it",
        ));
    }
    Ok(Some(s))
}

/// The `export` stage, reading the last phase's `train.<phase>` (the finished model) and the
/// tokenizer. The model itself comes from the checkpoint (`model.json`: what it was trained
/// with, the phase's RoPE base included), not from the section.
pub fn expand(doc: &RecipeDoc) -> Vec<NodeSpec> {
    let (Some(s), Some(last)) = (&doc.export, doc.phases.last()) else {
        return Vec::new();
    };
    let train = names::train(&last.name);
    let tokenizer = doc.tokenizer.as_ref().map(|_| names::TOKENIZER.to_string());
    let mut needs = vec![train.clone()];
    needs.extend(tokenizer.clone());
    vec![NodeSpec {
        name: names::EXPORT.into(),
        kind: "export".into(),
        config: json!({"format": s.format, "layout": s.layout, "train": train, "tokenizer": tokenizer, "max_position_embeddings": last.phase.seq_len}),
        needs,
        resources: None,
        path: "export".into(),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Export, ExportConfig};
    use zflow_pipeline::Stage;

    fn expand_export(recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        Ok(expand(&RecipeDoc::parse(recipe)?))
    }

    #[test]
    fn the_section_exports_the_last_phase_with_the_tokenizer() {
        let recipe = json!({
            "sources": {"a": {"url": "data/a.txt"}},
            "model": {"hidden_size": 64, "num_blocks": 2},
            "tokenizer": {"train": {"vocab_size": 512}},
            "phases": {"p1": {"tokens": 1000, "seq_len": 64, "mixture": {"a": 1.0}}, "p2": {"tokens": 1000, "seq_len": 256, "mixture": {"a": 1.0}}},
            "export": {"format": "hf"},
        });
        let nodes = expand_export(&recipe).unwrap();
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
        let sources = json!({"a": {"url": "data/a.txt"}});
        let phases = json!({"p1": {"tokens": 1000, "seq_len": 64, "mixture": {"a": 1.0}}});
        let with = |export: Value, model: bool| {
            let mut r = json!({"sources": sources, "phases": phases, "export": export});
            if model {
                r["model"] = json!({"num_blocks": 2});
            }
            expand_export(&r)
        };
        let e = with(json!({"format": "onnx"}), true).unwrap_err();
        assert_eq!(e.path, "export.format");
        assert!(
            e.message.contains("`onnx` is not an export format"),
            "{}",
            e.message
        );
        let e = with(json!({"format": "hf"}), false).unwrap_err();
        assert!(e.message.contains("no `model:`"), "{}", e.message);
        let e = expand_export(&json!({"model": {}, "export": {"format": "hf"}})).unwrap_err();
        assert!(e.message.contains("no `phases:`"), "{}", e.message);
        assert!(with(json!({"format": "hf", "dtype": "bf16"}), true).is_err());
    }
}
