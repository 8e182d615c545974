//! The `train:` recipe section: training settings shared by every phase. A phase's own
//! `train:` overrides them key by key; `launch:` (how the phase runs: ranks, restarts,
//! preflight) and `activation_checkpointing` (what it keeps in memory) are kept apart from what
//! the phase computes. It adds no stage by itself: each
//! `train.<phase>` gets its resolved settings ([`PhaseTrain`]).

use serde_json::Value;
use zflow_files::json::merge;
use zflow_pipeline::ConfigError;
use zflow_pipeline::stage::parse_config;
use zflow_runtime::contract::settings::{ActivationCheckpointing, TrainSettings};
use zflow_runtime::size::memory::{Device, RankSetup};

use crate::train::LaunchSettings;

/// The `train:` section as written (an empty mapping without one), checked on its own.
#[derive(Clone, Debug)]
pub struct SharedTrain(Value);

/// One phase's training settings: the shared `train:` with the phase's own merged in.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTrain {
    /// What the phase computes (part of the stage's identity).
    pub settings: TrainSettings,
    /// How it runs (not part of the identity).
    pub launch: LaunchSettings,
    /// What each layer keeps for the backward pass (not part of the identity either: every
    /// mode computes the same).
    pub activation_checkpointing: ActivationCheckpointing,
}

impl PhaseTrain {
    /// What one rank of this phase holds in memory depends on (`zflow size`, `zflow plan
    /// --hardware`), for sequences of `seq_len` tokens.
    pub fn rank_setup(&self, seq_len: usize) -> RankSetup {
        RankSetup {
            seq_len,
            micro_batch: self.settings.micro_batch,
            global_batch: self.settings.global_batch,
            data_parallel: self.launch.data_parallel_groups(),
            context_parallel: self.launch.context_parallel(),
            activation_checkpointing: self.activation_checkpointing,
            loss_chunk_tokens: self.settings.loss_chunk_tokens,
            ns_dtype: self.settings.muon.ns_dtype,
            grad_reduce_dtype: self.settings.grad_reduce_dtype,
            grad_bucket_bytes: self.settings.grad_bucket_bytes,
            device: Device::of_backend(&self.settings.backend),
        }
    }
}

/// The `train:` section; its settings must parse on their own, so a typo is named at
/// `train.<field>` rather than at every phase.
pub fn parse(value: Option<&Value>) -> Result<SharedTrain, ConfigError> {
    let shared = SharedTrain(
        value
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default())),
    );
    split(shared.0.clone(), "train")?;
    Ok(shared)
}

impl SharedTrain {
    /// Phase `phase`'s settings: these merged with the phase's own `train:` (`own`).
    pub fn resolve(&self, phase: &str, own: Option<&Value>) -> Result<PhaseTrain, ConfigError> {
        let mut merged = self.0.clone();
        if let Some(own) = own {
            merge(&mut merged, own.clone());
        }
        split(merged, &format!("phases.{phase}.train"))
    }
}

/// Parses settings at recipe path `path`, their `launch:` and `activation_checkpointing` parts
/// apart.
fn split(mut value: Value, path: &str) -> Result<PhaseTrain, ConfigError> {
    let launch = value
        .as_object_mut()
        .and_then(|m| m.remove("launch"))
        .unwrap_or_else(|| Value::Object(Default::default()));
    let activation_checkpointing = match value
        .as_object_mut()
        .and_then(|m| m.remove("activation_checkpointing"))
    {
        Some(v) => parse_config(v, &format!("{path}.activation_checkpointing"))?,
        None => ActivationCheckpointing::None,
    };
    TrainSettings::fill_backend_defaults(&mut value);
    let settings: TrainSettings = parse_config(value, path)?;
    if settings.checkpoint_every == 0 {
        return Err(ConfigError::new(
            format!("{path}.checkpoint_every"),
            "`checkpoint_every` must be at least 1 (steps between checkpoints; without them a failure loses the whole phase); a phase always checkpoints at its end too",
        ));
    }
    if settings.keep_checkpoints == 0 {
        return Err(ConfigError::new(
            format!("{path}.keep_checkpoints"),
            "`keep_checkpoints` must be at least 1 (a restart resumes from the newest kept checkpoint)",
        ));
    }
    let launch: LaunchSettings = parse_config(launch, &format!("{path}.launch"))?;
    launch
        .check()
        .map_err(|e| ConfigError::new(format!("{path}.launch.{}", e.path), e.message))?;
    Ok(PhaseTrain {
        launch,
        settings,
        activation_checkpointing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn phase_settings_override_the_shared_ones_key_by_key() {
        let shared = parse(Some(&json!({"global_batch": 32, "micro_batch": 8, "schedule": {"peak_lr": 0.01, "warmup": 0.1}}))).unwrap();
        let own = json!({"micro_batch": 16, "schedule": {"warmup": 0.0}, "rope_base": 1.0e6});
        let t = shared.resolve("p3", Some(&own)).unwrap();
        assert_eq!(t.launch, LaunchSettings::default());
        let s = t.settings;
        assert_eq!(
            (s.global_batch, s.micro_batch, s.rope_base),
            (32, 16, Some(1.0e6))
        );
        assert_eq!((s.schedule.peak_lr, s.schedule.warmup), (0.01, 0.0));
        let err = shared
            .resolve("p3", Some(&json!({"globl_batch": 1})))
            .unwrap_err();
        assert!(
            format!("{}: {}", err.path, err.message).contains("globl_batch"),
            "{}: {}",
            err.path,
            err.message
        );
    }

    #[test]
    fn newton_schulz_runs_in_f32_on_the_cpu_and_bf16_on_gpus_unless_written() {
        use zflow_runtime::contract::settings::Dtype;
        let dtype = |shared: Value, own: Option<Value>| {
            parse(Some(&shared))
                .unwrap()
                .resolve("p", own.as_ref())
                .unwrap()
                .settings
                .muon
                .ns_dtype
        };
        assert_eq!(dtype(json!({}), None), Dtype::F32);
        assert_eq!(dtype(json!({"backend": "cuda"}), None), Dtype::Bf16);
        // A phase's own backend decides, and a written dtype stays.
        assert_eq!(
            dtype(json!({"backend": "rocm"}), Some(json!({"backend": "cpu"}))),
            Dtype::F32
        );
        assert_eq!(
            dtype(json!({"muon": {"ns_dtype": "bf16", "momentum": 0.9}}), None),
            Dtype::Bf16
        );
        assert_eq!(
            dtype(json!({"backend": "cuda", "muon": {"momentum": 0.9}}), None),
            Dtype::Bf16
        );
    }
}
