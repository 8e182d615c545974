//! zflow's formats and the engine contract: what the orchestrator, the evaluation harness, the
//! page and the CLI share with the training engine's workers (`workers/torch/`), and nothing
//! that trains. One room per concept:
//!
//! | room | owns |
//! |---|---|
//! | [`contract`] | the engine contract: train job, settings, worker protocol, rank environment, exit classes |
//! | [`model`] | ZAYA1's configuration ([`model::config`]) and the one list of its tensors |
//! | [`checkpoint`] | the checkpoint directory format, its verification, optimizer records and shard layout |
//! | [`data`] | token sources (Megatron `.bin`/`.idx`) and the deterministic mixture index |
//! | [`dist`] | where a launch's ranks are, the secret they prove, and their preflight probes |
//! | [`hf`] | Hugging Face export and import (`config.json`, `model.safetensors`, tokenizer) |
//! | [`size`] | parameter, memory and FLOP sizing, and run-time projection |
//! | [`bench`](mod@bench) | the hardware measurements `zflow bench` and `zflow size` print |
//!
//! [`rng`] is the one seeded generator. This crate never depends on DataFusion or on an ML
//! framework: training is the torch engine's.

#![warn(missing_docs)]

pub mod bench;
pub mod checkpoint;
pub mod contract;
pub mod data;
pub mod dist;
pub mod hf;
pub mod model;
pub mod rng;
pub mod size;
