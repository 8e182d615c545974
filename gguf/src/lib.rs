//! The GGUF forward pass zflow scores published models with: quantized Gemma 3 and Llama on
//! the CPU. candle reads the file and runs the graph; [`model`] holds the layers and the KV
//! cache, and the integer matrix kernels (AVX2 where the CPU has it) multiply the quantized
//! weights by the batch's rows. Its input is a [`batch::Packed`] batch; the evaluator side
//! (requests, tokenizer, scoring) lives in `zflow_evals::gguf`.

#![warn(missing_docs)]

pub mod batch;
pub mod config;
pub mod model;
mod qgemm;
