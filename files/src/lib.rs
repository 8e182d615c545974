//! Durable file operations every zflow crate shares, so each exists once: content hashing
//! ([`hash`]), atomic files and folder commits ([`atomic`]), read-only memory maps ([`map`]), reads with a bound ([`read`])
//! and layered JSON settings ([`json`]). It depends on nothing of zflow's, so the engine, the
//! runtime and the evaluators can all use it.

#![warn(missing_docs)]

pub mod atomic;
pub mod hash;
pub mod json;
pub mod map;
pub mod read;
