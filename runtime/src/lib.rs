//! The training runtime: data loading ([`data`]), the model configuration ([`model_config`])
//! and its sizing ([`size`]), the ZAYA1 model in burn ([`model`]), the trainer ([`trainer`])
//! and its pieces ([`schedule`], [`balance`]), the engine contract a worker keeps with its
//! supervisor ([`contract`]) and Hugging Face export/import ([`hf`]). This crate never depends on
//! DataFusion, so the trainer builds without the query engine.

#![warn(missing_docs)]

pub mod backend;
pub mod balance;
pub mod bench;
pub mod checkpoint;
pub mod collective;
pub mod collective_bench;
pub mod contract;
pub mod data;
pub mod data_parallel;
pub mod faults;
pub mod handshake;
pub mod hf;
pub mod microbench;
pub mod model;
pub mod model_config;
pub mod preflight;
pub mod projection;
pub mod rng;
pub mod saver;
pub mod schedule;
pub mod size;
pub mod spike;
pub mod trainer;
pub mod worker;
pub mod zero;
