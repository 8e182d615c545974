//! How correlated a mixture's global batches are: how many documents a batch's sequences come
//! from, and the largest share of a batch that one document fills. A mixture that reads a
//! long document's windows one after another fills whole batches from it (the model then
//! memorises a document instead of learning its source); the window order
//! ([`super::permutation`]) is there to prevent that, and this measure shows that it does.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::MixtureReader;

/// Global batches measured at most: all of them in a smaller phase, evenly spaced ones in a
/// larger one, so that the measure costs the same for a 9M-token phase and an 8T-token one.
pub const MAX_MEASURED_BATCHES: u64 = 4096;

/// The batch measure of a phase's mixture (the mix stage's `report.json`, under `batches`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BatchReport {
    /// Samples per global batch (the phase's `global_batch`).
    pub global_batch: u64,
    /// Whole global batches in the phase.
    pub batches: u64,
    /// Global batches measured (all of them, or [`MAX_MEASURED_BATCHES`] evenly spaced).
    pub measured_batches: u64,
    /// Distinct documents per global batch, on average, each sequence counted for the
    /// document that gives it most of its tokens ([`MixtureReader::main_document`]).
    pub mean_distinct_docs: f64,
    /// The largest share of any measured global batch whose sequences come from one document.
    pub max_doc_share: f64,
}

/// Measures the global batches of `global_batch` samples of the mixture `reader` reads.
pub fn measure(reader: &MixtureReader, global_batch: u64) -> Result<BatchReport> {
    let global_batch = global_batch.max(1);
    let batches = reader.num_samples() / global_batch;
    let measured = batches.min(MAX_MEASURED_BATCHES);
    let (mut distinct_sum, mut max_share) = (0u64, 0f64);
    let mut counts: HashMap<(u16, u64), u64> = HashMap::new();
    for j in 0..measured {
        // Evenly spaced over the phase: batch floor(j * batches / measured).
        let batch = (j as u128 * batches as u128 / measured as u128) as u64;
        counts.clear();
        for i in batch * global_batch..(batch + 1) * global_batch {
            *counts.entry(reader.main_document(i)?).or_default() += 1;
        }
        distinct_sum += counts.len() as u64;
        let most = counts.values().copied().max().unwrap_or(0);
        max_share = max_share.max(most as f64 / global_batch as f64);
    }
    Ok(BatchReport {
        global_batch,
        batches,
        measured_batches: measured,
        mean_distinct_docs: if measured == 0 {
            0.0
        } else {
            distinct_sum as f64 / measured as f64
        },
        max_doc_share: max_share,
    })
}
