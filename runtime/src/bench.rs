//! `zflow bench train`'s measurements: this machine's matrix-multiply peak on the worker backend,
//! and the throughput of the real training step (the trainer's own [`train_step`]) on a model.

use std::time::Instant;

use crate::collective::Group;

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use burn_flex::{Flex, FlexDevice};

use crate::model::Zaya;
use crate::size::ModelConfig;
use crate::trainer::{Optimizers, TrainSettings, train_step};

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
pub fn train_step_throughput(model: &ModelConfig, batch: usize, seq_len: usize, steps: usize) -> StepThroughput {
    type B = Autodiff<Flex>;
    let device = FlexDevice;
    let settings = TrainSettings::default();
    let mut zaya: Zaya<B> = Zaya::new(model, 0, &device);
    let mut optim = Optimizers::new(&settings, &zaya);
    let mut rng = crate::rng::SplitMix64(1);
    let rows: Vec<u32> = (0..batch * (seq_len + 1)).map(|_| rng.below(model.vocab_size as u64) as u32).collect();
    let biases: Vec<Vec<f32>> = (0..model.num_blocks).map(|_| vec![0.0; zaya.routes()]).collect();
    let mut best = f64::MAX;
    for i in 0..steps + 1 {
        let (inputs, targets) = crate::trainer::batch_tensors::<B>(&rows, batch, seq_len, &device);
        let t = Instant::now();
        let (m, out) = train_step(zaya, &mut optim, vec![(inputs, targets)], &biases, 1e-3, 1.0, &mut Group::single(), None).expect("a step on one rank");
        zaya = m;
        let elapsed = t.elapsed().as_secs_f64();
        assert!(out.loss.is_finite());
        if i > 0 {
            best = best.min(elapsed);
        }
    }
    StepThroughput { step_s: best, tokens_per_s: (batch * seq_len) as f64 / best, flops_per_token: model.flops(seq_len).total }
}
