//! The read plan: everything a reader needs to find sample `i`'s tokens, computed once by the
//! mix stage and written as flat little-endian `u64` arrays that every rank memory-maps.
//! Opening a mixture then costs the same for a source of a thousand documents and one of ten
//! billion: no reader walks, shuffles or sums over documents (Megatron's `GPTDataset` caches
//! its document, sample and shuffle indices as `.npy` files for the same reason).
//!
//! For an index `<dir>/samples.idx` the plan lives in `<dir>/samples.plan/`, described by the
//! sidecar's [`ReadPlan`] (file names relative to `<dir>`):
//! ```text
//! positions.u64            N entries: where sample i's window starts in its epoch's stream
//! s<S>.addresses.u64       docs + 1 entries: where document d's tokens start in source S's
//!                          files read back to back (the last entry is the total)
//! s<S>.e<E>.order.u64      docs entries: the document at place j of epoch E's stream
//! s<S>.e<E>.starts.u64     docs + 1 entries: where place j starts in that stream
//! ```
//! Only the epochs the mixture reads are written. Sample `i` = (source `s`, local sample
//! `k`) reads tokens `[p, p + seq_len + 1)` of epoch `k / samples_per_epoch` of source `s`,
//! `p = positions[i]`: the document at the last place `j` with `starts[j] <= p`, then the
//! places after it. `workers/torch/zflow_torch/mixture.py` reads the same files with numpy.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use super::super::TokenSource;
use super::apportion::epoch_order;

/// The read plan of one mixture, as the sidecar (`<index>.json`) records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReadPlan {
    /// `u64` per sample: the start of its window in its epoch's token stream.
    pub positions: String,
    /// One entry per source, in source order.
    pub sources: Vec<SourcePlan>,
}

/// One source's part of a [`ReadPlan`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourcePlan {
    /// Documents in the source.
    pub documents: u64,
    /// Tokens in the source.
    pub tokens: u64,
    /// Windows per epoch: `(tokens - 1) / seq_len`.
    pub samples_per_epoch: u64,
    /// Tokens in each of the source's files (shards), in order.
    pub part_tokens: Vec<u64>,
    /// `documents + 1` `u64`s: where each document's tokens start in the files back to back.
    pub addresses: String,
    /// The epochs the mixture reads, from epoch 0.
    pub epochs: Vec<EpochPlan>,
}

/// The files of one epoch of one source.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EpochPlan {
    /// `documents` `u64`s: the document at each place of the epoch's stream.
    pub order: String,
    /// `documents + 1` `u64`s: where each place starts in the stream.
    pub starts: String,
}

/// The plan's folder for the index at `index_path`: `samples.idx` -> `samples.plan`.
pub fn plan_dir(index_path: &Path) -> PathBuf {
    index_path.with_extension("plan")
}

/// A file of little-endian `u64`s being written, through a large buffer.
pub(super) struct U64Writer {
    out: BufWriter<File>,
    path: PathBuf,
}

impl U64Writer {
    pub(super) fn create(path: &Path) -> Result<U64Writer> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(U64Writer {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
        })
    }

    pub(super) fn push(&mut self, value: u64) -> Result<()> {
        self.out
            .write_all(&value.to_le_bytes())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Flushes and syncs the file.
    pub(super) fn finish(self) -> Result<()> {
        let path = self.path;
        let file = self
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", path.display()))?;
        file.sync_all()
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// Writes the per-source files of the plan (addresses and the epochs read) into `plan_dir`,
/// for sources that give `samples[s]` samples of `samples_per_epoch[s]` per epoch; returns
/// the source entries with names relative to `base` (the index's folder). Holds one epoch's
/// document order in memory (8 bytes per document of the largest source) and streams the rest.
pub(super) fn write_sources(
    base: &Path,
    plan_dir: &Path,
    seed: u64,
    sources: &[&dyn TokenSource],
    samples: &[u64],
    samples_per_epoch: &[u64],
) -> Result<Vec<SourcePlan>> {
    let relative = |name: &str| relative_name(base, plan_dir, name);
    let mut plans = Vec::with_capacity(sources.len());
    for (s, src) in sources.iter().enumerate() {
        let docs = src.num_docs();
        let addresses = format!("s{s}.addresses.u64");
        let mut out = U64Writer::create(&plan_dir.join(&addresses))?;
        let mut at = 0u64;
        out.push(0)?;
        for d in 0..docs {
            at += src.doc_len(d) as u64;
            out.push(at)?;
        }
        out.finish()?;
        let per_epoch = samples_per_epoch[s];
        let epochs_read = if samples[s] == 0 {
            0
        } else {
            samples[s].div_ceil(per_epoch)
        };
        let mut epochs = Vec::with_capacity(epochs_read as usize);
        for e in 0..epochs_read {
            let order = epoch_order(seed, s, e, docs);
            let (order_name, starts_name) = (
                format!("s{s}.e{e}.order.u64"),
                format!("s{s}.e{e}.starts.u64"),
            );
            let mut order_out = U64Writer::create(&plan_dir.join(&order_name))?;
            let mut starts_out = U64Writer::create(&plan_dir.join(&starts_name))?;
            let mut start = 0u64;
            starts_out.push(0)?;
            for &d in &order {
                order_out.push(d)?;
                start += src.doc_len(d as usize) as u64;
                starts_out.push(start)?;
            }
            order_out.finish()?;
            starts_out.finish()?;
            epochs.push(EpochPlan {
                order: relative(&order_name),
                starts: relative(&starts_name),
            });
        }
        plans.push(SourcePlan {
            documents: docs as u64,
            tokens: at,
            samples_per_epoch: per_epoch,
            part_tokens: src.part_tokens(),
            addresses: relative(&addresses),
            epochs,
        });
    }
    Ok(plans)
}

/// The name a plan file has relative to the index's folder.
pub(super) fn relative_name(base: &Path, plan_dir: &Path, name: &str) -> String {
    let dir = plan_dir.strip_prefix(base).unwrap_or(plan_dir);
    format!("{}/{name}", dir.to_string_lossy())
}

/// A memory-mapped file of little-endian `u64`s, its length checked against what the plan
/// says it holds.
pub(super) struct U64Array {
    map: Option<Mmap>,
    len: u64,
}

impl U64Array {
    /// Maps `base/name` and checks that it holds `len` values.
    pub(super) fn open(base: &Path, name: &str, len: u64) -> Result<U64Array> {
        let path = base.join(name);
        let size = std::fs::metadata(&path)
            .with_context(|| format!("opening the mixture's read plan file {}", path.display()))?
            .len();
        ensure!(
            Some(size) == len.checked_mul(8),
            "{}: {size} bytes, but the mixture's read plan says it holds {len} u64 values; the \
             file is truncated or damaged (run the mix stage again)",
            path.display()
        );
        let map = if len == 0 {
            None
        } else {
            Some(zflow_files::map::read_only(&path)?)
        };
        Ok(U64Array { map, len })
    }

    /// Value `i`; panics past the end.
    pub(super) fn get(&self, i: u64) -> u64 {
        assert!(i < self.len, "value {i} of {}", self.len);
        let at = i as usize * 8;
        let bytes = &self.map.as_ref().expect("a non-empty array is mapped")[at..at + 8];
        u64::from_le_bytes(bytes.try_into().unwrap())
    }

    /// The first index whose value fails `pred` (values ascending, `pred` true then false).
    pub(super) fn partition_point(&self, pred: impl Fn(u64) -> bool) -> u64 {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.get(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}
