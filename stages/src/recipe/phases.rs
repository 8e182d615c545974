//! The `phases:` section: the pretraining phases, in order. Each phase becomes `mix.<phase>`
//! (its samples, `crate::mix`) and, with a `model:` section, `train.<phase>` (`crate::train`),
//! each phase starting from the previous one's final checkpoint. [`parse`] is the one reader
//! of a phase's settings; the rest read [`PhaseEntry`]s from [`super::RecipeDoc`].
//!
//! ```yaml
//! phases:
//!   phase1:
//!     tokens: 4000000            # budget
//!     seq_len: 256
//!     mixture: {bible: 0.6, python: 0.2, fortunes: 0.2}
//!     curriculum:                # optional: new weights from a fraction of the phase on
//!       - {at: 0.5, mixture: {bible: 0.4, python: 0.4, fortunes: 0.2}}
//!     max_epochs: {fortunes: 4}  # optional upsampling cap per source
//!     seed: 1
//!     train: {rope_base: 1000000.0}   # optional: this phase's training settings
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};
use zflow_pipeline::stage::parse_config;
use zflow_pipeline::{ConfigError, NodeSpec};
use zflow_runtime::data::mixture::{MixSpec, MixStage};

use super::RecipeDoc;
use super::sources::Source;
use super::train::{PhaseTrain, SharedTrain};
use crate::names;

/// One `phases:` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    /// Tokens the phase trains on (its budget).
    pub tokens: u64,
    /// Tokens per training sequence.
    pub seq_len: usize,
    /// Source -> weight at the start of the phase.
    pub mixture: BTreeMap<String, f64>,
    /// New weights from a fraction of the phase on.
    #[serde(default)]
    pub curriculum: Vec<CurriculumStep>,
    /// Source -> the most epochs it may be repeated.
    #[serde(default)]
    pub max_epochs: BTreeMap<String, f64>,
    /// Seed of the sample order.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Samples per mixture block.
    #[serde(default = "default_block")]
    pub block_size: usize,
    /// This phase's training settings (read by `train.<phase>`).
    #[serde(default)]
    pub train: Option<Value>,
}

/// A curriculum point: the mixture from fraction `at` of the phase on.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurriculumStep {
    /// Fraction of the phase, in (0, 1).
    pub at: f64,
    /// Source -> weight from there on.
    pub mixture: BTreeMap<String, f64>,
}

/// One phase of the recipe, parsed and checked against the recipe's sources.
#[derive(Clone, Debug)]
pub struct PhaseEntry {
    /// The phase's name (its key).
    pub name: String,
    /// Its settings as written.
    pub phase: Phase,
    /// Every source the phase reads, in recipe order.
    pub sources: Vec<String>,
    /// Its mixture, ready for `mix.<phase>`.
    pub mix: MixSpec,
    /// Its training settings (used with a `model:` section; without one the phase only mixes).
    pub train: PhaseTrain,
}

/// The recipe's phases, in recipe order, each parsed, range-checked and checked against
/// `sources`, its training settings resolved against the shared `train:`; empty without a
/// `phases:` section.
pub fn parse(
    value: Option<&Value>,
    sources: &[Source],
    shared: &SharedTrain,
) -> Result<Vec<PhaseEntry>, ConfigError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Some(phases) = value.as_object() else {
        return Err(ConfigError::new(
            "phases",
            "`phases` must map phase names to their settings",
        ));
    };
    let sources: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    phases
        .iter()
        .map(|(name, entry)| {
            let path = format!("phases.{name}");
            let phase: Phase = parse_config(entry.clone(), &path)?;
            check_ranges(&phase, &path)?;
            let used = check_sources(&phase, &path, &sources)?;
            let train = shared.resolve(name, phase.train.as_ref())?;
            Ok(PhaseEntry {
                name: name.clone(),
                mix: mix_spec(&phase, &used),
                sources: used,
                phase,
                train,
            })
        })
        .collect()
}

/// Checks that every source the phase names is one of the recipe's `sources`; returns the
/// ones it reads, in recipe order.
fn check_sources(data: &Phase, path: &str, sources: &[String]) -> Result<Vec<String>, ConfigError> {
    let check = |m: &BTreeMap<String, f64>, at: &str| -> Result<(), ConfigError> {
        for name in m.keys() {
            if !sources.contains(name) {
                return Err(ConfigError::new(
                    format!("{at}.{name}"),
                    format!(
                        "`{name}` is not a source of this recipe (sources: {})",
                        sources.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    };
    check(&data.mixture, &format!("{path}.mixture"))?;
    for (i, step) in data.curriculum.iter().enumerate() {
        check(&step.mixture, &format!("{path}.curriculum[{i}].mixture"))?;
    }
    check(&data.max_epochs, &format!("{path}.max_epochs"))?;
    Ok(sources
        .iter()
        .filter(|s| {
            data.mixture.contains_key(*s)
                || data.curriculum.iter().any(|c| c.mixture.contains_key(*s))
        })
        .cloned()
        .collect())
}

/// The mixture of phase `data` over the sources it reads (`used`, in recipe order).
fn mix_spec(data: &Phase, used: &[String]) -> MixSpec {
    let weights = |m: &BTreeMap<String, f64>| {
        used.iter()
            .map(|s| m.get(s).copied().unwrap_or(0.0))
            .collect::<Vec<_>>()
    };
    let mut schedule = vec![MixStage {
        start: 0.0,
        weights: weights(&data.mixture),
    }];
    schedule.extend(data.curriculum.iter().map(|c| MixStage {
        start: c.at,
        weights: weights(&c.mixture),
    }));
    MixSpec {
        seq_len: data.seq_len,
        seed: data.seed,
        block_size: data.block_size,
        budget_tokens: data.tokens,
        sources: used.to_vec(),
        schedule,
        max_epochs: used
            .iter()
            .map(|s| data.max_epochs.get(s).copied())
            .collect(),
    }
}

fn default_seed() -> u64 {
    1234
}
fn default_block() -> usize {
    512
}

/// The values of a phase that no run could use, named by their recipe path at load: zero
/// sizes, negative or non-finite weights, an all-zero mixture, curriculum points outside
/// (0, 1) or out of order.
fn check_ranges(data: &Phase, path: &str) -> Result<(), ConfigError> {
    let positive = |value: u64, field: &str, what: &str| {
        if value == 0 {
            return Err(ConfigError::new(
                format!("{path}.{field}"),
                format!("`{field}` must be > 0 ({what}), got 0"),
            ));
        }
        Ok(())
    };
    positive(data.tokens, "tokens", "the tokens the phase trains on")?;
    positive(data.seq_len as u64, "seq_len", "tokens per sequence")?;
    positive(
        data.block_size as u64,
        "block_size",
        "samples per mixture block",
    )?;
    let weights = |m: &BTreeMap<String, f64>, at: &str| -> Result<(), ConfigError> {
        for (name, &w) in m {
            if !(w.is_finite() && w >= 0.0) {
                return Err(ConfigError::new(
                    format!("{at}.{name}"),
                    format!("a mixture weight must be a finite number >= 0, got {w}"),
                ));
            }
        }
        if m.values().sum::<f64>() <= 0.0 {
            return Err(ConfigError::new(
                at,
                "every weight of the mixture is zero; at least one source needs a positive weight",
            ));
        }
        Ok(())
    };
    weights(&data.mixture, &format!("{path}.mixture"))?;
    let mut previous = 0.0;
    for (i, step) in data.curriculum.iter().enumerate() {
        let at = format!("{path}.curriculum[{i}]");
        if !(step.at > previous && step.at < 1.0) {
            let after = if i == 0 {
                "0".to_string()
            } else {
                format!("the previous point, {previous}")
            };
            return Err(ConfigError::new(
                format!("{at}.at"),
                format!(
                    "a curriculum point `at` is a fraction of the phase: after {after} and below 1, got {}",
                    step.at
                ),
            ));
        }
        previous = step.at;
        weights(&step.mixture, &format!("{at}.mixture"))?;
    }
    for (name, &cap) in &data.max_epochs {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(ConfigError::new(
                format!("{path}.max_epochs.{name}"),
                format!("`max_epochs` must be a finite number > 0, got {cap}"),
            ));
        }
    }
    Ok(())
}

/// `mix.<phase>` per phase and, with a `model:` section, `train.<phase>` too, each phase
/// starting from the previous one's final checkpoint.
pub fn expand(doc: &RecipeDoc) -> Vec<NodeSpec> {
    let mut nodes = Vec::new();
    let mut previous: Option<String> = None;
    for entry in &doc.phases {
        let (phase, path) = (&entry.name, format!("phases.{}", entry.name));
        let used = &entry.sources;
        // The sharded ones among them, with their shard counts: their tokens are the
        // concatenation of their shards'.
        let shards: std::collections::BTreeMap<&str, usize> = doc
            .sources
            .iter()
            .filter(|s| used.contains(&s.name))
            .filter_map(|s| Some((s.name.as_str(), s.shards?)))
            .collect();
        let token_stages: Vec<String> = used
            .iter()
            .flat_map(|s| names::token_stages(s, shards.get(s.as_str()).copied()))
            .collect();
        nodes.push(NodeSpec {
            name: names::mix(phase),
            kind: "mix".into(),
            config: json!({"phase": phase, "spec": entry.mix, "shards": shards, "global_batch": entry.train.settings.global_batch}),
            needs: token_stages.clone(),
            resources: None,
            path: path.clone(),
        });
        if let Some(model) = &doc.model {
            let train = &entry.train;
            let name = names::train(phase);
            let mut needs = vec![names::mix(phase)];
            needs.extend(token_stages);
            needs.extend(previous.clone());
            nodes.push(NodeSpec {
                name: name.clone(),
                kind: "train".into(),
                config: json!({"phase": phase, "model": model, "train": train.settings, "sources": used, "shards": shards, "previous": previous, "launch": train.launch, "activation_checkpointing": train.activation_checkpointing}),
                needs,
                resources: None,
                path: format!("{path}.train"),
            });
            previous = Some(name);
        }
    }
    nodes
}
