//! The names of the stages that recipe sections make: one function per convention, so a
//! section that creates a stage and one that reads it cannot disagree on its name.

use crate::shard::Shard;

/// `fetch.<source>`: a source's download.
pub fn fetch(source: &str) -> String {
    format!("fetch.{source}")
}

/// `ingest.<source>`: a source's documents.
pub fn ingest(source: &str) -> String {
    format!("ingest.{source}")
}

/// `tokenize.<source>`: a source's tokens (a `tokenize` or `megatron` stage).
pub fn tokenize(source: &str) -> String {
    format!("tokenize.{source}")
}

/// `dedup.<source>`: exact and near dedup over the whole of a deduplicated source.
pub fn dedup(source: &str) -> String {
    format!("dedup.{source}")
}

/// The prefix of a dedup's key-range tasks ([`dedup_keys`]).
pub const DEDUP_KEYS: &str = "dedup_keys";

/// Task `task` of `tasks` of the dedup stage `dedup` (`dedup.<source>` or [`CROSS_DEDUP`]):
/// `dedup_keys.<source>.k<label>`, or `dedup_keys.k<label>` ([`Shard::label`]).
pub fn dedup_keys(dedup: &str, task: usize, tasks: usize) -> String {
    let source = dedup.strip_prefix(CROSS_DEDUP).unwrap_or(dedup);
    format!("{DEDUP_KEYS}{source}.k{}", Shard::label(task, tasks))
}

/// The stage that deduplicates the `cross_dedup` sources against each other.
pub const CROSS_DEDUP: &str = "dedup";

/// Whether `stage` is a `dedup` stage: `dedup.<source>`, or [`CROSS_DEDUP`].
pub fn is_dedup(stage: &str) -> bool {
    stage == CROSS_DEDUP || stage.starts_with("dedup.")
}

/// Shard `index` of `count` of the stage named `stage`: `<stage>.s<label>` ([`Shard::label`]).
fn shard(stage: &str, index: usize, count: usize) -> String {
    format!("{stage}.s{}", Shard::label(index, count))
}

/// The stage `stage`, or with `shards` its shards' stages (`<stage>.s<label>`), in shard order.
pub fn sharded(stage: &str, shards: Option<usize>) -> Vec<String> {
    match shards {
        None => vec![stage.to_string()],
        Some(n) => (0..n).map(|i| shard(stage, i, n)).collect(),
    }
}

/// The stages holding a source's tokens: `tokenize.<source>`, or with `shards` its shards'
/// (`tokenize.<source>.s<i>`), in shard order.
pub fn token_stages(source: &str, shards: Option<usize>) -> Vec<String> {
    sharded(&tokenize(source), shards)
}

/// `mix.<phase>`: a phase's sample index.
pub fn mix(phase: &str) -> String {
    format!("mix.{phase}")
}

/// `train.<phase>`: a phase's training.
pub fn train(phase: &str) -> String {
    format!("train.{phase}")
}

/// `eval.<phase>`: a phase's checkpoint scored on the `evals:` tasks.
pub fn eval(phase: &str) -> String {
    format!("eval.{phase}")
}

/// `eval_data.<prefix>`: the fetch of a benchmark data prefix.
pub fn eval_data(prefix: &str) -> String {
    format!("eval_data.{prefix}")
}

/// The tokenizer stage.
pub const TOKENIZER: &str = "tokenizer";

/// The export stage.
pub const EXPORT: &str = "export";

/// The report stage.
pub const REPORT: &str = "report";

/// The n-grams of the eval tasks' test documents ([`crate::decontaminate`]).
pub const CONTAMINATION: &str = "contamination";

/// The fetch of a `tokenizer: {file: ...}`.
pub const FETCH_TOKENIZER: &str = "fetch.tokenizer";
