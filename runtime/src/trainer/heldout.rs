//! Held-out loss: rank 0 scores the first tokens of each source's held-out stream.

use anyhow::Result;
use burn::tensor::backend::Backend;

use crate::contract::job::TrainJob;
use crate::data::TokenSource;
use crate::data::concat::Concat;
use crate::data::megatron::IndexedDataset;
use crate::model::Zaya;

use super::{batch_tensors, scalar};

/// A source's held-out tokens (its shards' in order, for a sharded source).
pub type Heldout = Concat<IndexedDataset>;

/// Held-out token streams, one per source that has them.
pub(super) fn open_heldout(job: &TrainJob) -> Result<Vec<(String, Heldout)>> {
    let mut out = Vec::new();
    for s in &job.sources {
        let ds = s.open_heldout()?;
        if ds.num_docs() > 0 {
            out.push((s.name.clone(), ds));
        }
    }
    Ok(out)
}

/// Mean held-out loss per source over the first `tokens` tokens of its held-out stream, in
/// windows of `seq_len` predictions.
pub fn evaluate<B: Backend>(
    model: &Zaya<B>,
    heldout: &[(String, Heldout)],
    seq_len: usize,
    tokens: usize,
    batch: usize,
    biases: &[Vec<f32>],
) -> Result<Vec<(String, f64)>> {
    let device = model.embed_tokens.val().device();
    let mut out = Vec::new();
    for (name, ds) in heldout {
        let stream = read_stream(ds, tokens + 1)?;
        let windows: Vec<&[u32]> = stream.windows(seq_len + 1).step_by(seq_len).collect();
        if windows.is_empty() {
            continue;
        }
        let (mut sum, mut count) = (0.0, 0usize);
        for chunk in windows.chunks(batch) {
            let rows: Vec<u32> = chunk.iter().flat_map(|w| w.iter().copied()).collect();
            let (inputs, targets) = batch_tensors::<B>(&rows, chunk.len(), seq_len, &device);
            let (nll, _) = model.token_losses(inputs, targets, biases);
            sum += scalar(nll.sum());
            count += chunk.len() * seq_len;
        }
        out.push((name.clone(), sum / count as f64));
    }
    Ok(out)
}

/// The first `n` tokens of a dataset's documents, concatenated.
fn read_stream(ds: &Heldout, n: usize) -> Result<Vec<u32>> {
    let mut out = Vec::with_capacity(n);
    for doc in 0..ds.num_docs() {
        let len = ds.doc_len(doc).min(n - out.len());
        let start = out.len();
        out.resize(start + len, 0);
        ds.read(doc, 0, &mut out[start..])?;
        if out.len() == n {
            break;
        }
    }
    Ok(out)
}
