//! The trainer's state in and out of a checkpoint: this rank's files of a snapshot (its
//! optimizer shards; rank 0 also the weights, trainer state, layout and model config), and
//! the restore that reads them back. burn's optimizer records are converted to and from the
//! engine-neutral records of [`checkpoint::optimizer`], so the torch engine reads what this
//! engine writes and the other way round.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::momentum::MomentumState;
use burn::optim::record::{AdaptorRecord, AdaptorRecordV1};
use burn::optim::{AdamW, AdamWState, AdaptiveMomentumState, Muon, MuonState, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use super::Optimizers;
use crate::checkpoint::optimizer::{self, Values};
use crate::checkpoint::saver::Snapshot;
use crate::checkpoint::{self, TrainerState};
use crate::contract::exit::Fatal;
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
            encode_all(optim.muon.to_record(), muon_record::<B>)?,
        ),
        (
            zero::shard_file("adamw", rank),
            encode_all(optim.adamw.to_record(), adamw_record::<B>)?,
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
        let params = param_shapes(&model);
        let muon = zero::shard_for(dir, files, &saved, layout, rank, "muon")?;
        let mu = optim.muon_momentum;
        let muon = decode_all(&muon, &params, device, |state, shape| {
            muon_state::<B>(state, shape, mu, device)
        })
        // A checkpoint that verifies but holds state this model cannot take: no relaunch helps.
        .with_context(|| Fatal(format!("{}: the Muon state", dir.display())))?;
        optim.muon = optim.muon.load_record(muon);
        let adamw = zero::shard_for(dir, files, &saved, layout, rank, "adamw")?;
        let adamw = decode_all(&adamw, &params, device, |state, shape| {
            adamw_state::<B>(state, shape, device)
        })
        .with_context(|| Fatal(format!("{}: the AdamW state", dir.display())))?;
        optim.adamw = optim.adamw.load_record(adamw);
    }
    Ok((model, optim, state))
}

type MuonRecord<B> = AdaptorRecord<Muon<<B as AutodiffBackend>::InnerBackend>, B>;
type AdamWRecord<B> = AdaptorRecord<AdamW, B>;

/// A shard of records: `encode` makes each one's bytes, in the order of parameter ids so the
/// same state always gives the same bytes (burn keeps them in a randomly seeded hash map).
fn encode_all<R>(
    records: hashbrown::HashMap<ParamId, R>,
    encode: impl Fn(R) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let mut encoded = Vec::with_capacity(records.len());
    for (id, r) in records {
        encoded.push((id.val(), encode(r)?));
    }
    Ok(zero::join_entries(
        encoded.iter().map(|(id, b)| (*id, b.as_slice())).collect(),
    ))
}

/// A Muon record as a neutral one: burn's velocity (every Muon parameter is a matrix).
fn muon_record<B: AutodiffBackend>(r: MuonRecord<B>) -> Result<Vec<u8>> {
    let state: MuonState<B::InnerBackend, 2> = r.into_state::<2>();
    // burn keeps the velocity private; its record item serialises it as the tensor's data.
    let item = state.momentum.into_item::<FullPrecisionSettings>();
    let data: TensorData = rmp_serde::from_slice(&rmp_serde::to_vec(&item.velocity)?)?;
    let v = values(data)?;
    optimizer::encode(&[(optimizer::VELOCITY, &v.shape, &v.data)])
}

/// An AdamW record as a neutral one.
fn adamw_record<B: AutodiffBackend>(r: AdamWRecord<B>) -> Result<Vec<u8>> {
    let AdaptorRecord::V1(r) = r;
    match r {
        AdaptorRecordV1::Rank1(s) => adamw_tensors(s.momentum),
        AdaptorRecordV1::Rank2(s) => adamw_tensors(s.momentum),
        AdaptorRecordV1::Rank3(s) => adamw_tensors(s.momentum),
        AdaptorRecordV1::Rank4(s) => adamw_tensors(s.momentum),
        _ => bail!("an AdamW state of a rank zflow's model does not have"),
    }
}

fn adamw_tensors<B: Backend, const D: usize>(m: AdaptiveMomentumState<B, D>) -> Result<Vec<u8>> {
    let step = [m.time as f32];
    let (m1, m2) = (
        values(m.moment_1.into_data())?,
        values(m.moment_2.into_data())?,
    );
    let max = m.max_moment_2.map(|t| values(t.into_data())).transpose()?;
    let mut tensors = vec![
        (optimizer::STEP, &[][..], &step[..]),
        (optimizer::EXP_AVG, &m1.shape[..], &m1.data[..]),
        (optimizer::EXP_AVG_SQ, &m2.shape[..], &m2.data[..]),
    ];
    if let Some(max) = &max {
        tensors.push((optimizer::MAX_EXP_AVG_SQ, &max.shape, &max.data));
    }
    optimizer::encode(&tensors)
}

fn values(data: TensorData) -> Result<Values> {
    let shape = data.shape.to_vec();
    let data = data
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("optimizer state as f32: {e:?}"))?;
    Ok(Values { shape, data })
}

/// Every parameter's name and shape by id.
fn param_shapes<B: Backend>(model: &Zaya<B>) -> HashMap<u64, (String, Vec<usize>)> {
    struct Shapes(HashMap<u64, Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0.insert(p.id.val(), p.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(HashMap::new());
    model.visit(&mut shapes);
    checkpoint::param_names::<B, _>(model)
        .into_iter()
        .map(|(name, id)| {
            (
                id.val(),
                (name, shapes.0.remove(&id.val()).unwrap_or_default()),
            )
        })
        .collect()
}

/// A shard's records as burn records: neutral ones through `convert` (given the parameter's
/// shape), the native engine's older burn records through burn's recorder. Errors name the
/// parameter.
fn decode_all<B: AutodiffBackend, R: Record<B>>(
    shard: &[u8],
    params: &HashMap<u64, (String, Vec<usize>)>,
    device: &B::Device,
    convert: impl Fn(Neutral, &[usize]) -> Result<R>,
) -> Result<hashbrown::HashMap<ParamId, R>> {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
    let mut out = hashbrown::HashMap::new();
    for (id, bytes) in zero::entries(shard)? {
        let (name, shape) = params
            .get(&id)
            .with_context(|| format!("parameter id {id} is not in this model"))?;
        let r = match optimizer::decode(bytes, name)? {
            optimizer::Record::Burn => Recorder::<B>::load(&recorder, bytes.to_vec(), device)
                .with_context(|| format!("`{name}`: not a burn record either"))?,
            optimizer::Record::State {
                tensors,
                torch_layout,
            } => convert(
                Neutral {
                    tensors,
                    torch_layout,
                },
                shape,
            )
            .with_context(|| format!("`{name}`"))?,
        };
        out.insert(ParamId::from(id), r);
    }
    Ok(out)
}

/// A neutral record's tensors, taken one key at a time.
struct Neutral {
    tensors: BTreeMap<String, Values>,
    torch_layout: bool,
}

impl Neutral {
    fn take(&mut self, key: &str) -> Option<Values> {
        self.tensors.remove(key)
    }

    /// Tensor `key` in the parameter's `shape` (transposed from torch's older layout).
    fn take_shaped(&mut self, key: &str, shape: &[usize]) -> Result<Values> {
        let mut v = self
            .take(key)
            .with_context(|| format!("no `{key}` in its optimizer state"))?;
        if self.torch_layout && shape.len() == 2 && v.shape == [shape[1], shape[0]] {
            v = Values {
                data: optimizer::transpose(&v.data, shape[1], shape[0]),
                shape: shape.to_vec(),
            };
        }
        ensure!(
            v.shape == shape,
            "optimizer state `{key}` has shape {:?}, the parameter {:?}",
            v.shape,
            shape
        );
        Ok(v)
    }

    /// Fails on keys no one took.
    fn done(self) -> Result<()> {
        ensure!(
            self.tensors.is_empty(),
            "unexpected optimizer state {:?} (is it another optimizer's?)",
            self.tensors.keys().collect::<Vec<_>>()
        );
        Ok(())
    }
}

fn tensor<B: Backend, const D: usize>(v: Values, device: &B::Device) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v.data, v.shape), device)
}

/// A neutral Muon record as burn's: its velocity, or torch's momentum buffer converted at
/// this run's momentum `mu`.
fn muon_state<B: AutodiffBackend>(
    mut n: Neutral,
    shape: &[usize],
    mu: f64,
    device: &B::Device,
) -> Result<MuonRecord<B>> {
    ensure!(
        shape.len() == 2,
        "Muon state for a {}-d parameter",
        shape.len()
    );
    let velocity = if n.tensors.contains_key(optimizer::VELOCITY) {
        n.take_shaped(optimizer::VELOCITY, shape)?
    } else {
        let b = n.take_shaped(optimizer::MOMENTUM_BUFFER, shape)?;
        Values {
            data: optimizer::velocity_from_buffer(&b.data, mu)?,
            shape: b.shape,
        }
    };
    n.done()?;
    let state = MuonState::new(MomentumState::new(tensor::<B::InnerBackend, 2>(
        velocity, device,
    )));
    Ok(AdaptorRecord::from_state::<2>(state))
}

/// A neutral AdamW record as burn's.
fn adamw_state<B: AutodiffBackend>(
    mut n: Neutral,
    shape: &[usize],
    device: &B::Device,
) -> Result<AdamWRecord<B>> {
    let step = n
        .take(optimizer::STEP)
        .context("no `step` in its optimizer state")?;
    let time = match step.data[..] {
        [t] if t >= 1.0 && t.fract() == 0.0 => t as usize,
        _ => bail!(
            "AdamW `step` is {:?}, expected one whole number >= 1",
            step.data
        ),
    };
    let m1 = n.take_shaped(optimizer::EXP_AVG, shape)?;
    let m2 = n.take_shaped(optimizer::EXP_AVG_SQ, shape)?;
    let max = if n.tensors.contains_key(optimizer::MAX_EXP_AVG_SQ) {
        Some(n.take_shaped(optimizer::MAX_EXP_AVG_SQ, shape)?)
    } else {
        None
    };
    n.done()?;
    fn of<B: AutodiffBackend, const D: usize>(
        time: usize,
        m1: Values,
        m2: Values,
        max: Option<Values>,
        device: &B::Device,
    ) -> AdamWRecord<B> {
        AdaptorRecord::from_state::<D>(AdamWState::new(AdaptiveMomentumState {
            time,
            moment_1: tensor(m1, device),
            moment_2: tensor(m2, device),
            max_moment_2: max.map(|m| tensor(m, device)),
        }))
    }
    Ok(match shape.len() {
        1 => of::<B, 1>(time, m1, m2, max, device),
        2 => of::<B, 2>(time, m1, m2, max, device),
        3 => of::<B, 3>(time, m1, m2, max, device),
        4 => of::<B, 4>(time, m1, m2, max, device),
        d => bail!("AdamW state for a {d}-d parameter"),
    })
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn_flex::{Flex, FlexDevice};

    use super::*;
    use crate::contract::settings::TrainSettings;
    use crate::dist::collective::Group;
    use crate::trainer::{Optimizers, batch_tensors, train_step};

    type B = Autodiff<Flex>;

    fn tiny() -> ModelConfig {
        ModelConfig {
            hidden_size: 32,
            num_blocks: 2,
            vocab_size: 64,
            num_query_heads: 2,
            num_kv_heads: 1,
            head_dim: 16,
            num_experts: 3,
            expert_ffn: 16,
            router_dim: 8,
            ..ModelConfig::default()
        }
    }

    /// The optimizer shards of a snapshot, by file name.
    fn shards(snapshot: &Snapshot) -> BTreeMap<String, Vec<u8>> {
        snapshot
            .files
            .iter()
            .filter(|(name, _)| name.starts_with("optim-"))
            .cloned()
            .collect()
    }

    #[test]
    fn optimizer_state_round_trips_through_the_neutral_records_bit_for_bit() {
        let config = tiny();
        let device = FlexDevice;
        let t = TrainSettings::default();
        let mut model: Zaya<B> = Zaya::new(&config, 3, &device);
        let mut optim = Optimizers::new(&t, &model);
        let biases = vec![vec![0.0; model.routes()]; config.num_blocks];
        let rows: Vec<u32> = (0..2 * 9).map(|i| (i * 7 % 64) as u32).collect();
        for _ in 0..2 {
            let batch = batch_tensors::<B>(&rows, 2, 8, &device);
            (model, _) = train_step(
                model,
                &mut optim,
                vec![batch],
                &biases,
                1e-3,
                1.0,
                &mut Group::single(),
                None,
            )
            .unwrap();
        }
        let params = crate::trainer::param_list(&model);
        let layout = zero::Layout::new(&params, 1).unwrap();
        let cursor = crate::data::mixture::DataCursor {
            phase: "p".into(),
            sample: 0,
            fingerprint: String::new(),
        };
        let state = TrainerState::new("p", 10, cursor, vec![], 3);
        let first = snapshot(&config, &layout, 0, &model, &optim, &state).unwrap();
        // Every record is in the neutral format, with burn's keys.
        for (name, bytes) in shards(&first) {
            for (_, record) in zero::entries(&bytes).unwrap() {
                let optimizer::Record::State { tensors, .. } =
                    optimizer::decode(record, &name).unwrap()
                else {
                    panic!("{name}: a burn record")
                };
                let keys: Vec<&str> = tensors.keys().map(String::as_str).collect();
                if name.contains("muon") {
                    assert_eq!(keys, [optimizer::VELOCITY]);
                } else {
                    assert_eq!(
                        keys,
                        [optimizer::EXP_AVG, optimizer::EXP_AVG_SQ, optimizer::STEP]
                    );
                    assert_eq!(tensors[optimizer::STEP].data, [2.0]);
                }
            }
        }
        let files: BTreeMap<String, Vec<u8>> = first.files.iter().cloned().collect();
        let fresh: Zaya<B> = Zaya::new(&config, 4, &device);
        let fresh_optim = Optimizers::new(&t, &fresh);
        let (model2, optim2, _) = restore(
            fresh,
            fresh_optim,
            Path::new("ckpt"),
            &files,
            &device,
            Some((&layout, 0)),
        )
        .unwrap();
        let second = snapshot(&config, &layout, 0, &model2, &optim2, &state).unwrap();
        assert_eq!(shards(&first), shards(&second));
        assert!(!shards(&first)["optim-muon.rank-0.bin"].is_empty());
    }

    #[test]
    fn torch_momentum_buffers_read_as_velocities_and_bad_records_are_named() {
        let config = tiny();
        let device = FlexDevice;
        let model: Zaya<B> = Zaya::new(&config, 3, &device);
        let params = param_shapes(&model);
        let (id, (name, shape)) = params
            .iter()
            .find(|(_, (_, s))| s.len() == 2 && s[0] != s[1])
            .unwrap();
        let n = shape[0] * shape[1];
        let buffer: Vec<f32> = (0..n).map(|i| i as f32 * 0.05).collect();
        // The torch engine's older record: [out, in].
        let legacy = {
            let mut r = optimizer::LEGACY_TORCH.to_vec();
            let torch_shape = [shape[1], shape[0]];
            let transposed = optimizer::transpose(&buffer, shape[0], shape[1]);
            let body =
                optimizer::encode(&[(optimizer::MOMENTUM_BUFFER, &torch_shape, &transposed)])
                    .unwrap();
            r.extend(&body[optimizer::RECORD.len()..]);
            r
        };
        let current = optimizer::encode(&[(optimizer::MOMENTUM_BUFFER, shape, &buffer)]).unwrap();
        for record in [current, legacy] {
            let shard = zero::join_entries(vec![(*id, &record)]);
            let mut read = decode_all::<B, _>(&shard, &params, &device, |n, s| {
                muon_state::<B>(n, s, 0.9, &device)
            })
            .unwrap();
            let state: MuonState<Flex, 2> =
                read.remove(&ParamId::from(*id)).unwrap().into_state::<2>();
            let item = state.momentum.into_item::<FullPrecisionSettings>();
            let data: TensorData =
                rmp_serde::from_slice(&rmp_serde::to_vec(&item.velocity).unwrap()).unwrap();
            let v = values(data).unwrap();
            assert_eq!(&v.shape, shape);
            for (got, b) in v.data.iter().zip(&buffer) {
                assert!((got - b * 10.0).abs() <= 1e-5 * (1.0 + b.abs() * 10.0));
            }
        }
        // An AdamW record where Muon's is expected, and a wrong shape: named.
        let adamw = optimizer::encode(&[
            (optimizer::STEP, &[], &[1.0]),
            (optimizer::EXP_AVG, shape, &buffer),
            (optimizer::EXP_AVG_SQ, shape, &buffer),
        ])
        .unwrap();
        let wrong = optimizer::encode(&[(optimizer::VELOCITY, &[n], &buffer)]).unwrap();
        for (record, says) in [(adamw, "no `momentum_buffer`"), (wrong, "has shape")] {
            let shard = zero::join_entries(vec![(*id, &record)]);
            let Err(err) = decode_all::<B, _>(&shard, &params, &device, |n, s| {
                muon_state::<B>(n, s, 0.9, &device)
            }) else {
                panic!("{says}: read")
            };
            let msg = format!("{err:#}");
            assert!(msg.contains(name.as_str()) && msg.contains(says), "{msg}");
        }
    }
}
