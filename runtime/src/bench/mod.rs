//! `zflow bench train`'s measurements: this machine's matrix-multiply peak on the worker backend,
//! and the throughput of the real training step (the trainer's own [`train_step`]) on a model.

pub mod collectives;
pub mod micro;

use std::time::Instant;

use crate::dist::collective::Group;

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use burn_flex::{Flex, FlexDevice};

use crate::contract::settings::TrainSettings;
use crate::model::Zaya;
use crate::model::config::ModelConfig;
use crate::trainer::{Optimizers, train_step};

/// Best-of-`reps` f32 GFLOP/s of an `n x n x n` matrix multiply on the CPU backend.
pub fn matmul_gflops(n: usize, reps: usize) -> f64 {
    let device = FlexDevice;
    let a = Tensor::<Flex, 2>::random([n, n], Distribution::Normal(0.0, 1.0), &device);
    let b = Tensor::<Flex, 2>::random([n, n], Distribution::Normal(0.0, 1.0), &device);
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let c = a.clone().matmul(b.clone());
        let _ = c.into_data();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// Training-step throughput.
#[derive(Clone, Debug)]
pub struct StepThroughput {
    /// Best step time (seconds).
    pub step_s: f64,
    /// Tokens per second at the best step.
    pub tokens_per_s: f64,
    /// Model FLOPs per token (forward + backward, attention included; `zflow size`'s count).
    pub flops_per_token: u64,
}

/// Times `steps` optimizer steps (after one warm-up step) of `model` on fixed random tokens,
/// `batch` sequences of `seq_len`, with the trainer's own step (Muon + AdamW, clipping).
pub fn train_step_throughput(
    model: &ModelConfig,
    batch: usize,
    seq_len: usize,
    steps: usize,
) -> StepThroughput {
    type B = Autodiff<Flex>;
    let device = FlexDevice;
    let settings = TrainSettings::default();
    let mut zaya: Zaya<B> = Zaya::new(model, 0, &device);
    let mut optim = Optimizers::new(&settings, &zaya);
    let mut rng = crate::rng::SplitMix64(1);
    let rows: Vec<u32> = (0..batch * (seq_len + 1))
        .map(|_| rng.below(model.vocab_size as u64) as u32)
        .collect();
    let biases: Vec<Vec<f32>> = (0..model.num_blocks)
        .map(|_| vec![0.0; zaya.routes()])
        .collect();
    let mut best = f64::MAX;
    for i in 0..steps + 1 {
        let (inputs, targets) = crate::trainer::batch_tensors::<B>(&rows, batch, seq_len, &device);
        let t = Instant::now();
        let (m, out) = train_step(
            zaya,
            &mut optim,
            vec![(inputs, targets)],
            &biases,
            1e-3,
            1.0,
            &mut Group::single(),
            None,
        )
        .expect("a step on one rank");
        zaya = m;
        let elapsed = t.elapsed().as_secs_f64();
        assert!(out.loss.is_finite());
        if i > 0 {
            best = best.min(elapsed);
        }
    }
    StepThroughput {
        step_s: best,
        tokens_per_s: (batch * seq_len) as f64 / best,
        flops_per_token: model.flops(seq_len).total,
    }
}

/// What [`checkpoint_io`] measured.
pub struct CheckpointIo {
    /// Bytes in one checkpoint (weights, optimizer state, trainer state).
    pub bytes: u64,
    /// Best time to write, fsync, hash and commit it (s).
    pub write_s: f64,
    /// Time to serialise it into host memory (the part a training step waits for) (s).
    pub snapshot_s: f64,
}

/// Writes a checkpoint of `model` (fresh weights and optimizer state after one step) under
/// `dir` `repeats` times with the trainer's own commit (write, fsync, blake3, manifest, rename).
pub fn checkpoint_io(
    model: &ModelConfig,
    dir: &std::path::Path,
    repeats: usize,
) -> anyhow::Result<CheckpointIo> {
    let (zaya, optim, state, layout) = one_step_state(model)?;
    let t = Instant::now();
    let snap = crate::trainer::snapshot(model, &layout, 0, &zaya, &optim, &state)?;
    let snapshot_s = t.elapsed().as_secs_f64();
    let bytes = snap.files.iter().map(|(_, b)| b.len() as u64).sum();
    let mut best = f64::MAX;
    for i in 0..repeats {
        let t = Instant::now();
        crate::checkpoint::commit(dir, i as u64, snap.files.clone())?;
        best = best.min(t.elapsed().as_secs_f64());
        crate::checkpoint::retain(dir, 1)?;
    }
    Ok(CheckpointIo {
        bytes,
        write_s: best,
        snapshot_s,
    })
}

/// Mean step time over `steps` steps of `batch` x `seq_len` random tokens, in each of
/// `rounds` rounds: without checkpoints, with one every `every` steps written in the background,
/// and written inline (in that order of the result; each a list of one mean per round). Every
/// mode starts from the same state on the same batches; a round runs the modes in an order
/// rotated by one from the previous round's, so that a drift of the machine's speed falls on
/// every mode alike.
pub fn checkpoint_overhead(
    model: &ModelConfig,
    batch: usize,
    seq_len: usize,
    steps: u64,
    every: u64,
    rounds: usize,
    dir: &std::path::Path,
) -> anyhow::Result<[Vec<f64>; 3]> {
    type B = Autodiff<Flex>;
    let device = FlexDevice;
    let mut rng = crate::rng::SplitMix64(1);
    let rows: Vec<u32> = (0..batch * (seq_len + 1))
        .map(|_| rng.below(model.vocab_size as u64) as u32)
        .collect();
    let mut out: [Vec<f64>; 3] = Default::default();
    for (round, k) in (0..rounds).flat_map(|r| (0..3).map(move |k| (r, k))) {
        let mode = (round + k) % 3;
        let (mut zaya, mut optim, mut state, layout) = one_step_state(model)?;
        let biases: Vec<Vec<f32>> = (0..model.num_blocks)
            .map(|_| vec![0.0; zaya.routes()])
            .collect();
        let root = dir.join(format!("mode-{mode}-round-{round}"));
        let emit: crate::contract::protocol::Emit = std::sync::Arc::new(|_| {});
        let mut saver = crate::checkpoint::saver::Saver::new(
            root,
            0,
            1,
            1,
            mode == 1,
            Default::default(),
            emit,
        );
        let t = Instant::now();
        for step in 1..=steps {
            let (inputs, targets) =
                crate::trainer::batch_tensors::<B>(&rows, batch, seq_len, &device);
            let (m, _) = train_step(
                zaya,
                &mut optim,
                vec![(inputs, targets)],
                &biases,
                1e-3,
                1.0,
                &mut Group::single(),
                None,
            )?;
            zaya = m;
            state.step = step;
            if mode > 0 && step % every == 0 {
                saver.save(
                    crate::trainer::snapshot(model, &layout, 0, &zaya, &optim, &state)?,
                    false,
                )?;
            }
        }
        saver.wait()?;
        out[mode].push(t.elapsed().as_secs_f64() / steps as f64);
    }
    Ok(out)
}

type OneStep = (
    Zaya<Autodiff<Flex>>,
    Optimizers<Autodiff<Flex>>,
    crate::checkpoint::TrainerState,
    crate::dist::zero::Layout,
);

/// A model and optimizer after one step (so the optimizer state exists), with trainer state.
fn one_step_state(model: &ModelConfig) -> anyhow::Result<OneStep> {
    type B = Autodiff<Flex>;
    let device = FlexDevice;
    let settings = TrainSettings::default();
    let zaya: Zaya<B> = Zaya::new(model, 0, &device);
    let mut optim = Optimizers::new(&settings, &zaya);
    let layout = crate::dist::zero::Layout::new(&crate::trainer::param_list(&zaya), 1)?;
    let rows: Vec<u32> = (0..2 * 65).map(|i| (i % model.vocab_size) as u32).collect();
    let biases: Vec<Vec<f32>> = (0..model.num_blocks)
        .map(|_| vec![0.0; zaya.routes()])
        .collect();
    let (inputs, targets) = crate::trainer::batch_tensors::<B>(&rows, 2, 64, &device);
    let (zaya, _) = train_step(
        zaya,
        &mut optim,
        vec![(inputs, targets)],
        &biases,
        1e-3,
        1.0,
        &mut Group::single(),
        None,
    )?;
    let cursor = crate::data::mixture::DataCursor {
        phase: "bench".into(),
        sample: 0,
        fingerprint: String::new(),
    };
    let state = crate::checkpoint::TrainerState {
        step: 1,
        ..crate::checkpoint::TrainerState::new("bench", 1, cursor, Vec::new(), 0)
    };
    Ok((zaya, optim, state, layout))
}
