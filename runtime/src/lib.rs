//! The training runtime. So far: data loading ([`data`]) — Megatron indexed datasets, the
//! deterministic block-staged mixture and the data cursor a trainer reads batches through.
//! The ZAYA1 model, trainer, workers and checkpoints come next (they will use burn; this crate
//! must never depend on DataFusion, so the trainer builds without the query engine).

pub mod data;
pub mod size;
