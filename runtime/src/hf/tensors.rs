//! The tensors a model has under zflow's names and the reference's, and their layouts.

use super::layout::{Layout, transformers_place};
use crate::model::config::ModelConfig;
use crate::model::{reference_name, tensors};
use safetensors::Dtype;
use safetensors::tensor::View;
use std::borrow::Cow;

/// One parameter: our name and shape, its name in the folder, whether it is a linear weight
/// (stored transposed on the two sides), and whether the folder stacks it with the other
/// experts' (slice `e` of `experts`).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Spec {
    pub(super) ours: String,
    pub(super) shape: Vec<usize>,
    pub(super) hf: String,
    pub(super) linear: bool,
    pub(super) stacked: Option<(usize, usize)>,
}

impl Spec {
    /// The shape of one slice (the whole tensor unless stacked).
    pub(super) fn slice_shape(&self) -> Vec<usize> {
        if self.linear {
            vec![self.shape[1], self.shape[0]]
        } else {
            self.shape.clone()
        }
    }

    /// The shape of the folder's tensor.
    pub(super) fn hf_shape(&self) -> Vec<usize> {
        match self.stacked {
            Some((_, experts)) => [vec![experts], self.slice_shape()].concat(),
            None => self.slice_shape(),
        }
    }
}

/// The model's parameters ([`crate::model::tensors`]) with their names in `layout`.
pub(super) fn specs(c: &ModelConfig, layout: Layout) -> Vec<Spec> {
    tensors(c)
        .into_iter()
        .map(|t| {
            // Every parameter path has a name in both layouts (`model_grad.rs` and
            // `layout.rs` check it).
            let missing = || -> ! { panic!("no {layout} name for `{}`", t.name) };
            let (hf, stacked) = match layout {
                Layout::Legacy => (reference_name(&t.name).unwrap_or_else(|| missing()), None),
                Layout::Transformers => {
                    let p = transformers_place(&t.name, c.num_blocks).unwrap_or_else(|| missing());
                    (p.name, p.expert.map(|e| (e, c.num_experts)))
                }
            };
            Spec {
                hf,
                stacked,
                ours: t.name,
                shape: t.shape,
                linear: t.linear,
            }
        })
        .collect()
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

/// One f32 tensor to write, converted from its sources (each widened, then transposed if it
/// is a `[rows, cols]` linear weight, then concatenated: several when experts are stacked)
/// only when the safetensors writer asks for its bytes: the writer takes one tensor at a time,
/// so a full-size model never sits in memory twice.
pub(super) struct Lazy<'a> {
    pub(super) sources: Vec<Cow<'a, [u8]>>,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) transpose: Option<(usize, usize)>,
}

impl<'a> Lazy<'a> {
    /// A tensor converted from one source.
    pub(super) fn one(
        source: Cow<'a, [u8]>,
        dtype: Dtype,
        shape: Vec<usize>,
        transpose: Option<(usize, usize)>,
    ) -> Self {
        Lazy {
            sources: vec![source],
            dtype,
            shape,
            transpose,
        }
    }
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let convert = |source: &'_ Cow<'_, [u8]>| -> Vec<u8> {
            let values = widen(source, self.dtype);
            match self.transpose {
                Some((rows, cols)) => transpose(&values, rows, cols),
                None => values.into_owned(),
            }
        };
        match self.sources.as_slice() {
            [one] if self.transpose.is_none() => widen(one, self.dtype),
            parts => Cow::Owned(parts.iter().flat_map(convert).collect()),
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}
