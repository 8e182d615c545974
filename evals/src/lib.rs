//! The evaluation harness: tasks as data, request scoring with an on-disk cache, metrics with
//! standard errors, and model adapters.
//!
//! The flow, one module per step:
//! - [`task`]: task and group files (`evals/tasks/*.yaml`, lm-evaluation-harness conventions);
//! - [`dataset`]: where a task's rows come from (Arrow IPC streams, JSON lines);
//! - [`process`]: the few document preprocessors lm-eval writes in Python (hellaswag, winogrande);
//! - [`template`]: `doc_to_text` / `doc_to_target` / `doc_to_choice` with minijinja;
//! - [`fewshot`]: seeded few-shot example choice;
//! - [`request`]: documents -> instances -> requests (loglikelihood, rolling, generation);
//! - [`tokenizer`]: context/continuation tokenization as lm-eval does it, rolling windows;
//! - [`model`]: the [`model::LanguageModel`] trait every adapter implements;
//! - [`engine`]: batching, prefix grouping and the request-level resume through [`cache`];
//! - [`filters`], [`metrics`]: answer extraction, per-document scores, aggregates and stderrs;
//! - [`results`]: the results document (in the spirit of lm-eval's `results.json`) and its table;
//! - [`evaluate`]: the entry point that ties them together;
//! - [`gguf`]: the GGUF adapter (candle's quantized CPU kernels; Gemma 3 and Llama);
//! - [`sandbox`]: model-written programs run with no network, no host files and hard limits;
//! - [`transformers`]: the ZAYA1 adapter (zflow checkpoints and Hugging Face folders scored by
//!   transformers in the torch engine's Python).

#![warn(missing_docs)]

pub mod cache;
pub mod dataset;
pub mod engine;
pub mod evaluate;
pub mod fewshot;
pub mod filters;
pub mod gguf;
pub mod math;
pub mod metrics;
pub mod model;
pub mod process;
pub mod report;
pub mod request;
pub mod results;
pub mod sandbox;
pub mod task;
pub mod template;
pub mod tokenizer;
pub mod transformers;

pub use evaluate::{EvalOptions, evaluate};
pub use model::{LanguageModel, Score, TokenRequest};
pub use results::EvalResults;
pub use task::TaskRegistry;
