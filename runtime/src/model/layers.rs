//! Pieces the blocks share: RMSNorm, residual scaling and parameter initialisation.

use super::names::param_id;
use crate::rng::SplitMix64;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// RMSNorm with a learned per-channel `weight` (the reference's name; burn's RmsNorm calls it
/// `gamma`).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel gain, init 1.
    pub weight: Param<Tensor<B, 1>>,
}

impl<B: Backend> RmsNorm<B> {
    pub(super) fn new(init: &mut Init<B>, path: &str, dim: usize) -> Self {
        RmsNorm {
            weight: init.constant(&format!("{path}.weight"), [dim], 1.0),
        }
    }

    /// Normalises the last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
        let rms = x
            .clone()
            .powf_scalar(2.0)
            .mean_dim(D - 1)
            .add_scalar(eps)
            .sqrt();
        (x / rms) * self.weight.val().unsqueeze::<D>()
    }
}

/// ZAYA1's residual scaling: `x <- (x + bias) * scale` per channel for the sub-layer output
/// and (except before layer 0) for the residual stream.
#[derive(Module, Debug)]
pub struct ResidualScaling<B: Backend> {
    /// Gate on the sub-layer output, init 1.
    pub hidden_states_scale: Param<Tensor<B, 1>>,
    /// Bias on the sub-layer output, init 0.
    pub hidden_states_bias: Param<Tensor<B, 1>>,
    /// Gate on the residual stream, init 1.
    pub residual_scale: Option<Param<Tensor<B, 1>>>,
    /// Bias on the residual stream, init 0.
    pub residual_bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> ResidualScaling<B> {
    pub(super) fn new(init: &mut Init<B>, path: &str, dim: usize, with_residual: bool) -> Self {
        ResidualScaling {
            hidden_states_scale: init.constant(&format!("{path}.hidden_states_scale"), [dim], 1.0),
            hidden_states_bias: init.constant(&format!("{path}.hidden_states_bias"), [dim], 0.0),
            residual_scale: with_residual
                .then(|| init.constant(&format!("{path}.residual_scale"), [dim], 1.0)),
            residual_bias: with_residual
                .then(|| init.constant(&format!("{path}.residual_bias"), [dim], 0.0)),
        }
    }

    /// Gates `(residual, hidden)`.
    pub fn forward(
        &self,
        residual: Option<Tensor<B, 3>>,
        hidden: Tensor<B, 3>,
    ) -> (Option<Tensor<B, 3>>, Tensor<B, 3>) {
        let gate = |x: Tensor<B, 3>, bias: &Param<Tensor<B, 1>>, scale: &Param<Tensor<B, 1>>| {
            (x + bias.val().unsqueeze::<3>()) * scale.val().unsqueeze::<3>()
        };
        let hidden = gate(hidden, &self.hidden_states_bias, &self.hidden_states_scale);
        let residual = match (residual, &self.residual_scale, &self.residual_bias) {
            (Some(r), Some(scale), Some(bias)) => Some(gate(r, bias, scale)),
            (r, _, _) => r,
        };
        (residual, hidden)
    }
}

/// Deterministic parameter initialisation: normal draws from a seeded host generator, and
/// parameter ids derived from the parameter's path, so optimizer state saved by one process
/// finds its parameters in another.
pub(super) struct Init<'a, B: Backend> {
    pub(super) rng: SplitMix64,
    pub(super) device: &'a B::Device,
}

impl<'a, B: Backend> Init<'a, B> {
    pub(super) fn new(seed: u64, device: &'a B::Device) -> Self {
        Init {
            rng: SplitMix64(seed ^ 0x5a59_4131),
            device,
        }
    }

    pub(super) fn param<const D: usize>(
        &self,
        path: &str,
        values: Vec<f32>,
        shape: [usize; D],
    ) -> Param<Tensor<B, D>> {
        let tensor = Tensor::<B, D>::from_data(TensorData::new(values, shape), self.device);
        Param::initialized(param_id(path), tensor.require_grad())
    }

    pub(super) fn normal<const D: usize>(
        &mut self,
        path: &str,
        shape: [usize; D],
        std: f64,
    ) -> Param<Tensor<B, D>> {
        let n = shape.iter().product();
        let values = (0..n).map(|_| (self.rng.normal() * std) as f32).collect();
        self.param(path, values, shape)
    }

    pub(super) fn constant<const D: usize>(
        &mut self,
        path: &str,
        shape: [usize; D],
        value: f32,
    ) -> Param<Tensor<B, D>> {
        self.param(path, vec![value; shape.iter().product()], shape)
    }

    pub(super) fn linear(
        &mut self,
        path: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
        std: f64,
    ) -> Linear<B> {
        Linear {
            weight: self.normal(&format!("{path}.weight"), [d_in, d_out], std),
            bias: bias.then(|| self.constant(&format!("{path}.bias"), [d_out], 0.0)),
        }
    }

    /// A causal conv weight `[c, c_in_per_group, k]` that starts as (mostly) the identity on the
    /// newest tap, plus small noise.
    pub(super) fn conv_near_identity(
        &mut self,
        path: &str,
        c: usize,
        per_group: usize,
        k: usize,
    ) -> Param<Tensor<B, 3>> {
        let mut values = vec![0f32; c * per_group * k];
        for o in 0..c {
            for i in 0..per_group {
                for t in 0..k {
                    let noise = (self.rng.normal() * 0.02) as f32;
                    let identity = t == k - 1 && (per_group == 1 || i == o % per_group);
                    values[(o * per_group + i) * k + t] = noise + if identity { 1.0 } else { 0.0 };
                }
            }
        }
        self.param(path, values, [c, per_group, k])
    }
}
