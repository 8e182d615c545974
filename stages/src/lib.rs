//! zflow's stage kinds and recipe sections, and [`registry`], which registers them all.
//!
//! Adding a kind: write `src/<kind>.rs` with a type implementing
//! [`zflow_pipeline::Stage`], then add one `.register(...)` line below. The recipe's sections
//! (`sources:`, `phases:`, ...) are one typed document, [`recipe::RecipeDoc`].

#![warn(missing_docs)]

pub mod components;
pub mod decontaminate;
pub mod dedup;
pub mod dedup_keys;
pub mod docs;
pub mod encoder;
pub mod engine;
pub mod eval;
pub mod export;
pub mod external_sort;
pub mod fetch;
pub mod filters;
pub mod forkserver;
pub mod ingest;
pub mod ingest_stats;
mod jsonl;
pub mod launch;
pub mod megatron_source;
pub mod minhash;
pub mod mix;
pub mod names;
pub mod node_agent;
pub mod plot;
pub mod preflight;
pub mod recipe;
pub mod report;
pub mod running;
pub mod shard;
pub mod shell;
pub mod sorted_runs;
pub mod token_ids;
pub mod tokenize;
pub mod tokenizer;
pub mod train;
pub mod util;

use zflow_pipeline::Registry;

/// Every stage kind and section this build of zflow knows.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(fetch::Fetch)
        .register(shell::Shell)
        .register(ingest::Ingest)
        .register(tokenizer::TokenizerStage)
        .register(tokenize::Tokenize)
        .register(dedup::Dedup)
        .register(dedup_keys::DedupKeys)
        .register(decontaminate::Contamination)
        .register(mix::Mix)
        .register(megatron_source::MegatronSource)
        .register(train::Train)
        .register(export::Export)
        .register(preflight::Preflight)
        .register(eval::Eval)
        .register(report::Report);
    r.set_sections(recipe::RecipeSections);
    r
}
