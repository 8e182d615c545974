//! The trainer's state in and out of a checkpoint: this rank's files of a snapshot (its
//! optimizer shards; rank 0 also the weights, trainer state, layout and model config), and
//! the restore that reads them back.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use burn::module::ParamId;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::Optimizers;
use crate::checkpoint::saver::Snapshot;
use crate::checkpoint::{self, TrainerState};
use crate::dist::zero;
use crate::model::Zaya;
use crate::model::config::ModelConfig;

/// This rank's files of a checkpoint of the current state: every rank its optimizer shards;
/// rank 0 also the weights, the trainer state, the layout and the model config.
pub(crate) fn snapshot<B: AutodiffBackend>(
    model_config: &ModelConfig,
    layout: &zero::Layout,
    rank: usize,
    model: &Zaya<B>,
    optim: &Optimizers<B>,
    state: &TrainerState,
) -> Result<Snapshot> {
    let mut files = vec![
        (
            zero::shard_file("muon", rank),
            optimizer_bytes(optim.muon.to_record())?,
        ),
        (
            zero::shard_file("adamw", rank),
            optimizer_bytes(optim.adamw.to_record())?,
        ),
    ];
    if rank == 0 {
        // One metadata entry: safetensors keeps metadata in a HashMap, so with two or more the
        // header's byte order would change from process to process.
        let mut meta = BTreeMap::new();
        meta.insert("format".into(), checkpoint::WEIGHTS_FORMAT.into());
        files.push((
            "model.safetensors".to_string(),
            checkpoint::weights_to_safetensors(model, meta)?,
        ));
        files.push((
            "trainer.json".to_string(),
            serde_json::to_vec_pretty(state)?,
        ));
        files.push((
            "layout.json".to_string(),
            serde_json::to_vec_pretty(layout)?,
        ));
        files.push((
            "model.json".to_string(),
            serde_json::to_vec_pretty(model_config)?,
        ));
    }
    Ok(Snapshot {
        step: state.step,
        files,
    })
}

/// Loads a checkpoint's weights (always), this rank's optimizer shards (if `shard` names the
/// run's layout and rank) and trainer state.
pub(super) fn restore<B: AutodiffBackend>(
    model: Zaya<B>,
    mut optim: Optimizers<B>,
    dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    device: &B::Device,
    shard: Option<(&zero::Layout, usize)>,
) -> Result<(Zaya<B>, Optimizers<B>, TrainerState)> {
    let get = |name: &str| {
        files
            .get(name)
            .with_context(|| format!("{}: no {name} in the checkpoint", dir.display()))
    };
    let model = checkpoint::load_weights(
        model,
        get("model.safetensors")?,
        &dir.join("model.safetensors"),
    )?;
    let state: TrainerState = serde_json::from_slice(get("trainer.json")?)
        .with_context(|| format!("{}/trainer.json", dir.display()))?;
    if let Some((layout, rank)) = shard {
        let saved = zero::read_layout(dir, files)?;
        if saved.dp != layout.dp && rank == 0 {
            tracing::warn!(
                "{} holds optimizer state for {} data-parallel ranks and this run has {}: every rank reads every shard (`zflow ckpt reshape` does this once, offline)",
                dir.display(),
                saved.dp,
                layout.dp
            );
        }
        let muon = zero::shard_for(dir, files, &saved, layout, rank, "muon")?;
        let adamw = zero::shard_for(dir, files, &saved, layout, rank, "adamw")?;
        if from_torch(&muon) || from_torch(&adamw) {
            tracing::warn!(
                "{}: the optimizer state was written by the torch engine, whose records this engine cannot read; Muon and AdamW start afresh",
                dir.display()
            );
        } else {
            let muon = optimizer_record(&muon, device)
                .with_context(|| format!("{}: Muon state of rank {rank}", dir.display()))?;
            let adamw = optimizer_record(&adamw, device)
                .with_context(|| format!("{}: AdamW state of rank {rank}", dir.display()))?;
            optim.muon = optim.muon.load_record(muon);
            optim.adamw = optim.adamw.load_record(adamw);
        }
    }
    Ok((model, optim, state))
}

/// Whether a shard's records were written by the torch engine ([`zero::TORCH_RECORD`]).
fn from_torch(shard: &[u8]) -> bool {
    zero::entries(shard).is_ok_and(|e| e.iter().any(|(_, r)| r.starts_with(zero::TORCH_RECORD)))
}

/// An optimizer record as bytes ([`zero`]'s shard format), entries sorted by parameter id so
/// the same state always serialises to the same bytes (burn keeps them in a randomly seeded
/// hash map).
fn optimizer_bytes<RB: Backend, R: Record<RB>>(
    record: hashbrown::HashMap<ParamId, R>,
) -> Result<Vec<u8>> {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
    let mut encoded = Vec::with_capacity(record.len());
    for (id, r) in record {
        encoded.push((id.val(), Recorder::<RB>::record(&recorder, r, ())?));
    }
    Ok(zero::join_entries(
        encoded.iter().map(|(id, b)| (*id, b.as_slice())).collect(),
    ))
}

/// Reads what [`optimizer_bytes`] wrote.
fn optimizer_record<RB: Backend, R: Record<RB>>(
    bytes: &[u8],
    device: &RB::Device,
) -> Result<hashbrown::HashMap<ParamId, R>> {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
    let mut out = hashbrown::HashMap::new();
    for (id, record) in zero::entries(bytes)? {
        let r: R = Recorder::<RB>::load(&recorder, record.to_vec(), device)?;
        out.insert(ParamId::from(id), r);
    }
    Ok(out)
}
