//! The deterministic block-staged data mixture: which token window every training sample of
//! a phase reads, written once as an on-disk sample index, and read back by a trainer through
//! a [`DataCursor`] and a [`MixtureReader`].
//!
//! # How a mixture is made
//! A [`MixSpec`] asks for `budget_tokens` tokens in samples of `seq_len` tokens, so the phase
//! has `N = ceil(budget_tokens / seq_len)` samples; each sample is a window of `seq_len + 1`
//! tokens (the inputs plus the targets shifted by one).
//!
//! 1. **Blocks.** Samples are grouped into blocks of `block_size` samples (the last block may
//!    be shorter). Block `b` uses the last schedule stage whose `start <= b * block_size / N`,
//!    so a curriculum switches at block boundaries.
//! 2. **Counts per block.** Every source keeps a running *deficit*: the samples it was owed so
//!    far (block size × normalized weight, summed over the blocks) minus the samples it got.
//!    A block's samples go, one unit at a time, to the source with the largest deficit (ties:
//!    lowest source id); this is largest-remainder apportionment with the remainders carried
//!    across blocks, so the realised share never drifts more than about a sample from the
//!    requested one, even in a small phase.
//! 3. **Order inside a block.** The block's slots (source ids, in source order) are shuffled
//!    by Fisher–Yates seeded with `(seed, block index)`. A source's samples are numbered
//!    `k = 0, 1, 2, ...` in the order they appear, so every source is read front to back.
//! 4. **Windows.** Source-local sample `k` of source `s` is the window
//!    `[w * seq_len, w * seq_len + seq_len + 1)` of epoch `e` of the source's token stream,
//!    with `spe = floor((tokens_s - 1) / seq_len)` windows per epoch, `e = k / spe` and
//!    `w = p(k % spe)`, `p` the epoch's window order: a keyed bijection on `0..spe` seeded
//!    with `(seed, s, e)` ([`permutation`]), so that a source's consecutive samples come from
//!    unrelated places in its stream and a long document is spread over the epoch instead of
//!    filling a global batch ([`batches`] measures this). The stream of epoch `e` is the
//!    source's documents concatenated in an order shuffled with `(seed, s, e)`. Documents are
//!    packed: a window may span several documents (their EOD tokens are already in the
//!    data). Windows never cross an epoch, and every window of an epoch is read once.
//!
//! # Files
//! [`MixPlan::write`] writes the index, the read plan ([`read_plan`]: flat arrays that say
//! where every sample's tokens are, so that no reader recomputes the shuffles above) and the
//! sidecar; the reader needs all three.
//!
//! `<index>` — the sample index, little-endian, memory-mapped by [`MixIndex`]:
//! ```text
//! offset  size  field
//!      0     8  magic  b"ZFMIXIDX"
//!      8     4  version u32 (= 2: windows in their epoch's window order; version 1 read
//!                them front to back)
//!     12     4  number of sources u32
//!     16     8  N, number of samples u64
//!     24     8  seq_len u64
//!     32     8  seed u64
//!     40     8  block_size u64
//!     48  8 N  one u64 per sample: source id << 48 | source-local sample k
//! ```
//! `<index>.json` — the sidecar ([`MixManifest`]): the spec, a digest of the sources'
//! document lengths, the [`MixReport`] (with the fingerprint) and the [`ReadPlan`]. It is
//! written after the index and the plan, so its presence means both are complete.
//!
//! # Randomness
//! All shuffles use a hand-written SplitMix64 generator and a plain Fisher–Yates, not the
//! `rand` crate: a sample order is part of an experiment's identity and must never change
//! because a dependency was upgraded.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::TokenSource;

mod apportion;
pub mod batches;
mod index;
pub mod permutation;
pub mod read_plan;
mod reader;

use apportion::{
    Apportioner, SourceStats, TAG_BLOCK, encode, rng_for, scan_sources, shuffle, validate,
};
pub use batches::BatchReport;
pub use index::MixIndex;
pub use reader::{Batch, DataCursor, MixtureReader, advance};

use index::Header;
use permutation::WindowOrder;
use read_plan::{ReadPlan, U64Writer, plan_dir, relative_name};

/// One stage of a phase's curriculum: from `start` (a fraction of the phase's samples) on,
/// sources are drawn with these weights.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MixStage {
    /// Where the stage starts, as a fraction of the phase in `[0, 1)`; the first stage starts
    /// at 0 and starts increase strictly.
    pub start: f64,
    /// One non-negative weight per source (in [`MixSpec::sources`] order), not all zero; they
    /// are normalized, so only their ratios matter.
    pub weights: Vec<f64>,
}

/// What a phase's data mixture should be. Everything that decides the sample order is here
/// (plus the sources' document lengths), so equal specs over equal data give byte-identical
/// indexes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MixSpec {
    /// Tokens per sample (a sample reads `seq_len + 1` tokens: inputs and shifted targets).
    pub seq_len: usize,
    /// Seed of every shuffle in the mixture.
    pub seed: u64,
    /// Samples per block, the unit of apportionment and shuffling (e.g. 512).
    pub block_size: usize,
    /// Tokens the phase trains on; the phase has `ceil(budget_tokens / seq_len)` samples.
    pub budget_tokens: u64,
    /// Source names; a source's position here is its id.
    pub sources: Vec<String>,
    /// The curriculum: stages with increasing starts, the first at 0.
    pub schedule: Vec<MixStage>,
    /// Per source, the most epochs it may be read for (upsampling cap); `None` = unlimited.
    /// Empty means no source is capped.
    #[serde(default)]
    pub max_epochs: Vec<Option<f64>>,
}

impl MixSpec {
    /// Number of samples in the phase: `ceil(budget_tokens / seq_len)`.
    pub fn num_samples(&self) -> u64 {
        self.budget_tokens.div_ceil(self.seq_len.max(1) as u64)
    }
}

/// One source's line of a [`MixReport`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SourceReport {
    /// The source's name.
    pub name: String,
    /// Share of samples the schedule asks for, each stage weighted by the samples of the
    /// blocks it governs (stages switch at block boundaries).
    pub requested_share: f64,
    /// Share of samples the source got: `samples / N`.
    pub realised_share: f64,
    /// Samples drawn from the source.
    pub samples: u64,
    /// Training tokens drawn from the source: `samples * seq_len`.
    pub tokens: u64,
    /// Epochs of the source consumed: `samples / samples_per_epoch` (over 1 = upsampled).
    pub epochs: f64,
    /// Documents in the source.
    pub documents: u64,
    /// Tokens in the source (all documents).
    pub data_tokens: u64,
}

/// What a mixture turned out to be: per-source shares, samples and epochs, totals, and the
/// fingerprint that identifies it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MixReport {
    /// One entry per source, in source order.
    pub sources: Vec<SourceReport>,
    /// N, the number of samples.
    pub samples: u64,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Training tokens: `N * seq_len`.
    pub tokens: u64,
    /// blake3 (hex) over the spec, the sources' document lengths and the index bytes. A data
    /// cursor carries it, so a checkpoint can never resume on a different mixture.
    pub fingerprint: String,
}

/// The sidecar `<index>.json` written next to an index: everything the reader needs besides
/// the index itself.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MixManifest {
    /// The spec the index was made from.
    pub spec: MixSpec,
    /// blake3 (hex) of the sources' document counts and lengths, to check the reader is given
    /// the same data.
    pub data_digest: String,
    /// The mixture's report.
    pub report: MixReport,
    /// The files that say where each sample's tokens are ([`read_plan`]).
    pub read_plan: ReadPlan,
}

/// Where the sidecar of the index at `index_path` lives: the index path with `.json` appended.
pub fn manifest_path(index_path: &Path) -> PathBuf {
    let mut name = index_path.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

/// A checked mixture, ready to be written: the spec, the data's shape, and how many samples
/// each source gets. Made by [`plan`]; cheap (no index is built until [`MixPlan::write`]).
pub struct MixPlan {
    spec: MixSpec,
    weights: Vec<Vec<f64>>,
    stats: Vec<SourceStats>,
    data_digest: String,
    samples: Vec<u64>,
    requested: Vec<f64>,
}

/// Checks `spec` against the data and decides how many samples each source gets.
///
/// `sources` are the sources' token data, in `spec.sources` order. Fails with a message naming
/// the field and value on a bad spec, on a source too short for one sample that has a weight,
/// and when a source would be read for more epochs than its `max_epochs` allows.
pub fn plan(spec: &MixSpec, sources: &[&dyn TokenSource]) -> Result<MixPlan> {
    let weights = validate(spec)?;
    ensure!(
        sources.len() == spec.sources.len(),
        "mixture: {} token sources given for {} sources in the spec ({})",
        sources.len(),
        spec.sources.len(),
        spec.sources.join(", ")
    );
    let (stats, data_digest) = scan_sources(sources, spec.seq_len)?;
    for (i, stage) in spec.schedule.iter().enumerate() {
        for (s, &w) in stage.weights.iter().enumerate() {
            let st = &stats[s];
            ensure!(
                w == 0.0 || st.per_epoch > 0,
                "mixture: source '{}' has weight {w} in schedule[{i}] but only {} tokens in {} \
                 documents; one sample needs seq_len + 1 = {} tokens",
                spec.sources[s],
                st.tokens,
                st.docs,
                spec.seq_len + 1
            );
        }
    }

    let n = spec.num_samples();
    let mut samples = vec![0u64; spec.sources.len()];
    let mut requested = vec![0f64; spec.sources.len()];
    for block in Apportioner::new(spec, &weights) {
        for s in 0..samples.len() {
            samples[s] += block.counts[s];
            requested[s] += block.size as f64 * weights[block.stage][s];
        }
    }
    for r in &mut requested {
        *r /= n as f64;
    }

    for (s, &count) in samples.iter().enumerate() {
        let cap = spec.max_epochs.get(s).copied().flatten();
        let per_epoch = stats[s].per_epoch;
        if let (Some(cap), true) = (cap, count > 0) {
            let needed = count as f64 / per_epoch as f64;
            if needed > cap {
                bail!(
                    "mixture: budget larger than the data: source '{}' needs {needed:.3} epochs \
                     but max_epochs allows {cap} ({count} samples of {} tokens requested, {per_epoch} \
                     per epoch from {} tokens)",
                    spec.sources[s],
                    spec.seq_len,
                    stats[s].tokens
                );
            }
        }
    }

    Ok(MixPlan {
        spec: spec.clone(),
        weights,
        stats,
        data_digest,
        samples,
        requested,
    })
}

impl MixPlan {
    /// The spec this plan was made from.
    pub fn spec(&self) -> &MixSpec {
        &self.spec
    }

    /// Calls `emit(block index, entries)` for every block in order, with the block's index
    /// entries (source << 48 | k) after the in-block shuffle (module docs, steps 2 and 3).
    fn for_each_block(&self, mut emit: impl FnMut(u64, &[u64]) -> Result<()>) -> Result<()> {
        let mut next_k = vec![0u64; self.spec.sources.len()];
        let mut slots: Vec<u16> = Vec::with_capacity(self.spec.block_size);
        let mut entries: Vec<u64> = Vec::with_capacity(self.spec.block_size);
        for block in Apportioner::new(&self.spec, &self.weights) {
            slots.clear();
            for (s, &count) in block.counts.iter().enumerate() {
                slots.extend(std::iter::repeat_n(s as u16, count as usize));
            }
            shuffle(
                &mut slots,
                &mut rng_for(&[self.spec.seed, TAG_BLOCK, block.index]),
            );
            entries.clear();
            for &s in &slots {
                entries.push(encode(s, next_k[s as usize]));
                next_k[s as usize] += 1;
            }
            emit(block.index, &entries)?;
        }
        Ok(())
    }

    /// Writes the index to `index_path`, the read plan into [`plan_dir`]`(index_path)` and
    /// the sidecar to [`manifest_path`]`(index_path)` (layouts in the module docs and in
    /// [`read_plan`]), and returns the report. `sources` are the data [`plan`] was given. The
    /// index and the sample positions are streamed block by block; laying out an epoch holds
    /// its document order in memory (8 bytes per document).
    pub fn write(&self, index_path: &Path, sources: &[&dyn TokenSource]) -> Result<MixReport> {
        ensure!(
            sources.len() == self.stats.len()
                && sources
                    .iter()
                    .zip(&self.stats)
                    .all(|(src, st)| src.num_docs() as u64 == st.docs),
            "mixture: write was given other sources than its plan"
        );
        let n = self.spec.num_samples();
        let file = File::create(index_path)
            .with_context(|| format!("creating mixture index {}", index_path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let base = index_path.parent().unwrap_or(Path::new("."));
        let dir = plan_dir(index_path);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the read plan folder {}", dir.display()))?;
        let positions_name = "positions.u64";
        let mut positions = U64Writer::create(&dir.join(positions_name))?;
        let per_epoch: Vec<u64> = self.stats.iter().map(|st| st.per_epoch).collect();
        // Per source, the window order of the epoch its samples are in (read front to back).
        let mut windows: Vec<Option<(u64, WindowOrder)>> = vec![None; per_epoch.len()];

        let mut fingerprint = blake3::Hasher::new();
        let spec_json = serde_json::to_vec(&self.spec)?;
        fingerprint.update(b"zflow-mixture-v2");
        fingerprint.update(&(spec_json.len() as u64).to_le_bytes());
        fingerprint.update(&spec_json);
        fingerprint.update(self.data_digest.as_bytes());

        let header = Header {
            num_sources: self.spec.sources.len() as u32,
            num_samples: n,
            seq_len: self.spec.seq_len as u64,
            seed: self.spec.seed,
            block_size: self.spec.block_size as u64,
        }
        .to_bytes();
        let write_err = || format!("writing mixture index {}", index_path.display());
        out.write_all(&header).with_context(write_err)?;
        fingerprint.update(&header);

        let mut bytes = Vec::with_capacity(self.spec.block_size * 8);
        self.for_each_block(|_, entries| {
            bytes.clear();
            for e in entries {
                bytes.extend_from_slice(&e.to_le_bytes());
            }
            fingerprint.update(&bytes);
            for &e in entries {
                let (s, k) = apportion::decode(e);
                let s = s as usize;
                let epoch = k / per_epoch[s];
                if windows[s].as_ref().map(|(at, _)| *at) != Some(epoch) {
                    let order = WindowOrder::new(self.spec.seed, s, epoch, per_epoch[s]);
                    windows[s] = Some((epoch, order));
                }
                let (_, order) = windows[s].as_ref().expect("set above");
                positions.push(order.get(k % per_epoch[s]) * self.spec.seq_len as u64)?;
            }
            out.write_all(&bytes).with_context(write_err)
        })?;
        positions.finish()?;
        let read_plan = ReadPlan {
            positions: relative_name(base, &dir, positions_name),
            sources: read_plan::write_sources(
                base,
                &dir,
                self.spec.seed,
                sources,
                &self.samples,
                &per_epoch,
            )?,
        };
        let file = out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(write_err)?;
        file.sync_all().with_context(write_err)?;

        let report = self.report(fingerprint.finalize().to_hex().to_string());
        let manifest = MixManifest {
            spec: self.spec.clone(),
            data_digest: self.data_digest.clone(),
            report: report.clone(),
            read_plan,
        };
        // Written after the index and renamed into place, so a sidecar means a complete index.
        zflow_files::atomic::write(
            &manifest_path(index_path),
            &serde_json::to_vec_pretty(&manifest)?,
        )?;
        Ok(report)
    }

    fn report(&self, fingerprint: String) -> MixReport {
        let n = self.spec.num_samples();
        let seq_len = self.spec.seq_len as u64;
        let sources = self
            .spec
            .sources
            .iter()
            .enumerate()
            .map(|(s, name)| {
                let samples = self.samples[s];
                let st = &self.stats[s];
                SourceReport {
                    name: name.clone(),
                    requested_share: self.requested[s],
                    realised_share: samples as f64 / n as f64,
                    samples,
                    tokens: samples * seq_len,
                    epochs: if samples == 0 {
                        0.0
                    } else {
                        samples as f64 / st.per_epoch as f64
                    },
                    documents: st.docs,
                    data_tokens: st.tokens,
                }
            })
            .collect();
        MixReport {
            sources,
            samples: n,
            seq_len: self.spec.seq_len,
            tokens: n * seq_len,
            fingerprint,
        }
    }
}

#[cfg(test)]
mod tests;
