//! The `tokenizer:` recipe section: one `tokenizer` stage that trains a BPE tokenizer on every
//! ingested source (`train:`) or fetches a `tokenizer.json` (`file:`, via `fetch.tokenizer`).
//! The stage's settings are `crate::tokenizer::TokenizerConfig`.

use serde_json::{Map, Value};
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;

/// The `tokenizer:` section.
#[derive(Clone, Debug)]
pub struct TokenizerSpec {
    /// `file:` (a URL of a `tokenizer.json`) and its `sha256`: the `fetch.tokenizer` stage's
    /// settings. `None` with `train:`.
    pub fetch: Option<Map<String, Value>>,
    /// The `tokenizer` stage's settings (everything but `file` and `sha256`).
    pub settings: Map<String, Value>,
}

/// Refuses a model whose vocabulary is smaller than the one the recipe's tokenizer trains
/// (`train: {vocab_size: N}`): its token ids would fall outside the embedding. A fetched
/// tokenizer's size is known only once fetched; the train stage checks the ids then.
pub fn check_fits(
    spec: &TokenizerSpec,
    model: &zflow_runtime::model::config::ModelConfig,
) -> Result<(), ConfigError> {
    let trained = spec
        .settings
        .get("train")
        .and_then(|t| t.get("vocab_size"))
        .and_then(Value::as_u64);
    match trained {
        Some(n) if (model.vocab_size as u64) < n => Err(ConfigError::new(
            "model.vocab_size",
            format!(
                "the model's vocabulary ({}) is smaller than the tokenizer's (`tokenizer.train.vocab_size`: {n}): token ids would fall outside the embedding",
                model.vocab_size
            ),
        )),
        _ => Ok(()),
    }
}

/// The `tokenizer:` section, if the recipe has one.
pub fn parse(value: Option<&Value>) -> Result<Option<TokenizerSpec>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(entry) = value.as_object() else {
        return Err(ConfigError::new(
            "tokenizer",
            "`tokenizer` must be a mapping with `train:` or `file:`",
        ));
    };
    let settings: Map<String, Value> = entry
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "file" | "sha256"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let fetch = match (entry.get("file"), entry.get("train")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "tokenizer.file",
                "set either `file:` or `train:`, not both",
            ));
        }
        (None, None) => {
            return Err(ConfigError::new(
                "tokenizer",
                "set `train: {vocab_size: N}` or `file: <url of a tokenizer.json>`",
            ));
        }
        (Some(url), None) => {
            let mut fetch = Map::new();
            fetch.insert("url".into(), url.clone());
            if let Some(sha) = entry.get("sha256") {
                fetch.insert("sha256".into(), sha.clone());
            }
            Some(fetch)
        }
        (None, Some(_)) => None,
    };
    Ok(Some(TokenizerSpec { fetch, settings }))
}

/// `fetch.tokenizer` (for `file:`) and the `tokenizer` stage, which reads every ingested
/// source: of a sharded one, its first shard (a bounded sample either way, and a change to the
/// other shards leaves the tokenizer, and so every shard's tokens, as they are).
pub fn expand(doc: &RecipeDoc) -> Vec<NodeSpec> {
    let Some(spec) = &doc.tokenizer else {
        return Vec::new();
    };
    let mut nodes = Vec::new();
    let mut needs: Vec<String> = doc
        .sources
        .iter()
        .filter(|s| !s.megatron)
        .map(|s| s.ingest_stages().swap_remove(0))
        .collect();
    if let Some(fetch) = &spec.fetch {
        nodes.push(NodeSpec {
            name: names::FETCH_TOKENIZER.into(),
            kind: "fetch".into(),
            config: Value::Object(fetch.clone()),
            needs: vec![],
            resources: None,
            path: "tokenizer".into(),
        });
        needs.push(names::FETCH_TOKENIZER.into());
    }
    nodes.push(NodeSpec {
        name: names::TOKENIZER.into(),
        kind: "tokenizer".into(),
        config: Value::Object(spec.settings.clone()),
        needs,
        resources: None,
        path: "tokenizer".into(),
    });
    nodes
}
