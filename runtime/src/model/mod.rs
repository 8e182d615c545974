//! ZAYA1's shape, as data: its configuration ([`config::ModelConfig`]), the one list of its
//! parameters ([`tensors`]: name, shape, part) and their names in the reference implementation
//! ([`reference_name`]). A parameter's id, the key of its optimizer state in a checkpoint, is
//! the worker's to derive (`workers/torch/zflow_torch/model.py`, `param_id`) and lands in
//! `layout.json`; Rust only reads it ([`crate::checkpoint::layout`]).
//!
//! ZAYA1-base (Zyphra, arXiv 2511.17127) is a decoder of `num_blocks` blocks, each two pre-norm
//! sub-layers: CCA attention, then a top-1 mixture of SwiGLU experts behind ZAYA1's MLP router.
//! Our names follow the released reference code (Zyphra's `transformers` fork, `models/zaya`),
//! so a checkpoint maps one to one onto `model.layers.{2i}.self_attn.qkv.linear_q.weight` and
//! friends; [`crate::hf`] exports and imports. Linear weights are stored `[in, out]` (export
//! transposes them), convolution weights in PyTorch's `[out, in / groups, kernel]`. The model
//! that trains is transformers' `ZayaForCausalLM` (`workers/torch/zflow_torch/model.py`).

pub mod config;
mod names;
mod tensors;

pub use names::reference_name;
pub use tensors::{Part, TensorSpec, random_weights, tensors};
