//! The training runtime: data loading ([`data`]), model sizing ([`size`]), the ZAYA1 model in
//! burn ([`model`]), its trainer pieces ([`schedule`], [`balance`]) and the worker protocol
//! ([`protocol`]). This crate never depends on DataFusion, so the trainer builds without the
//! query engine.

pub mod backend;
pub mod balance;
pub mod bench;
pub mod checkpoint;
pub mod data;
pub mod model;
pub mod protocol;
pub mod rng;
pub mod schedule;
pub mod size;
pub mod trainer;
pub mod worker;
