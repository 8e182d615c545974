//! Training data: token datasets on disk and the order a trainer reads them in.
//!
//! - [`megatron`]: Megatron-LM compatible indexed datasets (`.bin` + `.idx`, `MMIDIDX` v1).
//! - [`concat`]: several datasets read as one (a sharded source's shards).
//! - [`mixture`]: the deterministic block-staged mixture of several token sources into
//!   fixed-length training samples, and the data cursor + reader a trainer uses.

pub mod concat;
pub mod megatron;
pub mod mixture;

/// A tokenized corpus: documents of token ids, read by index. Implemented by
/// [`megatron::IndexedDataset`] and [`concat::Concat`]; the mixture reads every source through
/// this trait.
pub trait TokenSource: Send + Sync {
    /// Number of documents.
    fn num_docs(&self) -> usize;
    /// Length in tokens of document `doc`.
    fn doc_len(&self, doc: usize) -> usize;
    /// Copies tokens `offset .. offset + out.len()` of document `doc` into `out`; fails on
    /// data that holds no valid token id (a corrupt dataset). Panics if the range is out of
    /// bounds (callers compute ranges from `doc_len`).
    fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> anyhow::Result<()>;

    /// Tokens in all documents. The default walks every document; datasets that know their
    /// total answer in O(1), as a reader opening a mixture must not walk a source.
    fn num_tokens(&self) -> u64 {
        (0..self.num_docs()).map(|d| self.doc_len(d) as u64).sum()
    }

    /// Tokens in each of the files the source is stored in, in order (a sharded source's
    /// shards); one entry for a source in one file. A mixture's read plan addresses a
    /// document by where its tokens start in these files read back to back.
    fn part_tokens(&self) -> Vec<u64> {
        vec![self.num_tokens()]
    }
}
