//! The tensors a model has under zflow's names and the reference's, and their layouts.

use crate::model::config::ModelConfig;
use crate::model::{reference_name, tensors};
use safetensors::Dtype;
use safetensors::tensor::View;
use std::borrow::Cow;

/// One parameter: our name and shape, the reference's name, and whether it is a linear weight
/// (stored transposed on the two sides).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Spec {
    pub(super) ours: String,
    pub(super) shape: Vec<usize>,
    pub(super) hf: String,
    pub(super) linear: bool,
}

impl Spec {
    pub(super) fn hf_shape(&self) -> Vec<usize> {
        if self.linear {
            vec![self.shape[1], self.shape[0]]
        } else {
            self.shape.clone()
        }
    }
}

/// The model's parameters ([`crate::model::tensors`]) with their reference names.
pub(super) fn specs(c: &ModelConfig) -> Vec<Spec> {
    tensors(c)
        .into_iter()
        .map(|t| Spec {
            // Every parameter path has a reference name (`model_grad.rs` checks it on a real
            // model).
            hf: reference_name(&t.name)
                .unwrap_or_else(|| panic!("no reference name for `{}`", t.name)),
            ours: t.name,
            shape: t.shape,
            linear: t.linear,
        })
        .collect()
}

/// The reference's name of MoE layer `block`'s balancing-bias buffer (`ZayaRouter`'s
/// `register_buffer("balancing_biases", ...)`).
pub(super) fn biases_name(block: usize) -> String {
    format!(
        "model.layers.{}.zaya_block.router.balancing_biases",
        2 * block + 1
    )
}

/// `[rows, cols]` row-major f32 bytes -> `[cols, rows]`. Moves 4-byte elements whole, so every
/// value keeps its exact bits.
pub(super) fn transpose(bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    debug_assert_eq!(bytes.len(), rows * cols * 4);
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = ((r * cols + c) * 4, (c * rows + r) * 4);
            out[dst..dst + 4].copy_from_slice(&bytes[src..src + 4]);
        }
    }
    out
}

pub(super) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian `dtype` values as f32 bytes: f32 as is, bf16 and f16 widened (exactly: every
/// bf16 and f16 value is an f32 value).
pub(super) fn widen(data: &[u8], dtype: Dtype) -> Cow<'_, [u8]> {
    match dtype {
        Dtype::BF16 => Cow::Owned(
            data.chunks_exact(2)
                .flat_map(|c| {
                    half::bf16::from_le_bytes([c[0], c[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect(),
        ),
        Dtype::F16 => Cow::Owned(
            data.chunks_exact(2)
                .flat_map(|c| {
                    half::f16::from_le_bytes([c[0], c[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect(),
        ),
        _ => Cow::Borrowed(data),
    }
}

/// One f32 tensor to write, converted from its source (widened, then transposed if `from` is a
/// `[rows, cols]` linear weight) only when the safetensors writer asks for its bytes: the
/// writer takes one tensor at a time, so a full-size model never sits in memory twice.
pub(super) struct Lazy<'a> {
    pub(super) source: Cow<'a, [u8]>,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) transpose: Option<(usize, usize)>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let values = widen(&self.source, self.dtype);
        match self.transpose {
            Some((rows, cols)) => Cow::Owned(transpose(&values, rows, cols)),
            None => values,
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}
