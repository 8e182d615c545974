//! The training runtime: everything a rank of the native engine runs, and the formats the
//! supervisor and every engine share. One room per concept:
//!
//! | room | owns |
//! |---|---|
//! | [`contract`] | the engine contract: train job, worker protocol, rank environment, exit classes |
//! | [`model`] | ZAYA1 in burn, read top to bottom, and its one configuration ([`model::config`]) |
//! | [`trainer`] | one phase on one rank: the step, schedule, balancing, spikes, faults, the worker |
//! | [`dist`] | the native engine's data-parallel group: handshake, TCP ring, ZeRO-1, preflight |
//! | [`checkpoint`] | the checkpoint directory format, its verification, and the async saver |
//! | [`data`] | token sources (Megatron `.bin`/`.idx`) and the deterministic mixture index |
//! | [`hf`] | Hugging Face export and import (`config.json`, `model.safetensors`, tokenizer) |
//! | [`size`] | parameter, memory and FLOP sizing, and run-time projection |
//! | [`bench`](mod@bench) | the measurements `zflow bench` prints: GEMM, bandwidth, train step, collectives |
//!
//! [`backend`] picks the burn backend and [`rng`] is the one seeded generator. This crate never
//! depends on DataFusion, so the trainer builds without the query engine.

#![warn(missing_docs)]

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod contract;
pub mod data;
pub mod dist;
pub mod hf;
pub mod model;
pub mod rng;
pub mod size;
pub mod trainer;
