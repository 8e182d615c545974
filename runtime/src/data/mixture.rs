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
//!    `[k' * seq_len, k' * seq_len + seq_len + 1)` of epoch `e` of the source's token stream,
//!    with `spe = floor((tokens_s - 1) / seq_len)` samples per epoch, `e = k / spe` and
//!    `k' = k % spe`. The stream of epoch `e` is the source's documents concatenated in an
//!    order shuffled with `(seed, s, e)`. Documents are packed: a window may span several
//!    documents (their EOD tokens are already in the data). Windows never cross an epoch.
//!
//! # Files
//! [`MixPlan::write`] writes two files; the reader needs both.
//!
//! `<index>` — the sample index, little-endian, memory-mapped by [`MixIndex`]:
//! ```text
//! offset  size  field
//!      0     8  magic  b"ZFMIXIDX"
//!      8     4  version u32 (= 1)
//!     12     4  number of sources u32
//!     16     8  N, number of samples u64
//!     24     8  seq_len u64
//!     32     8  seed u64
//!     40     8  block_size u64
//!     48  8 N  one u64 per sample: source id << 48 | source-local sample k
//! ```
//! `<index>.json` — the sidecar ([`MixManifest`]): the spec, a digest of the sources'
//! document lengths and the [`MixReport`] (with the fingerprint). It is written after the
//! index, so its presence means the index is complete.
//!
//! # Randomness
//! All shuffles use a hand-written SplitMix64 generator and a plain Fisher–Yates, not the
//! `rand` crate: a sample order is part of an experiment's identity and must never change
//! because a dependency was upgraded.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use super::TokenSource;
use crate::rng::SplitMix64;

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
}

/// Where the sidecar of the index at `index_path` lives: the index path with `.json` appended.
pub fn manifest_path(index_path: &Path) -> PathBuf {
    let mut name = index_path.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

// ---------------------------------------------------------------------------------------------
// Randomness

/// Domain tags, so the block shuffles and the document shuffles never share a stream.
const TAG_BLOCK: u64 = 1;
const TAG_DOCS: u64 = 2;

/// A generator seeded from several numbers (e.g. seed, tag, block): each part is mixed in
/// through one SplitMix64 step, so nearby inputs give unrelated streams.
fn rng_for(parts: &[u64]) -> SplitMix64 {
    let mut state = 0u64;
    for &part in parts {
        state = SplitMix64(state ^ part).next_u64();
    }
    SplitMix64(state)
}

/// Fisher–Yates (Durstenfeld): from the back, swap each element with a uniformly chosen one
/// at or before it.
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The document order of epoch `epoch` of source `source`.
fn epoch_order(seed: u64, source: usize, epoch: u64, num_docs: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..num_docs as u32).collect();
    shuffle(
        &mut order,
        &mut rng_for(&[seed, TAG_DOCS, source as u64, epoch]),
    );
    order
}

// ---------------------------------------------------------------------------------------------
// Planning

/// Bits of an index entry that hold the source-local sample number; the source id sits above.
const K_BITS: u32 = 48;
const K_MASK: u64 = (1 << K_BITS) - 1;

fn encode(source: u16, k: u64) -> u64 {
    (source as u64) << K_BITS | k
}

fn decode(entry: u64) -> (u16, u64) {
    ((entry >> K_BITS) as u16, entry & K_MASK)
}

/// Checks a spec on its own (no data yet); returns each stage's normalized weights.
fn validate(spec: &MixSpec) -> Result<Vec<Vec<f64>>> {
    ensure!(spec.seq_len > 0, "mixture: seq_len must be > 0, got 0");
    ensure!(
        spec.block_size > 0,
        "mixture: block_size must be > 0, got 0"
    );
    ensure!(
        spec.budget_tokens > 0,
        "mixture: budget_tokens must be > 0, got 0"
    );
    let n = spec.num_samples();
    ensure!(
        n <= K_MASK,
        "mixture: budget_tokens = {} gives {n} samples, more than the index can address (2^48)",
        spec.budget_tokens
    );
    let num_sources = spec.sources.len();
    ensure!(num_sources > 0, "mixture: sources is empty");
    ensure!(
        num_sources <= u16::MAX as usize + 1,
        "mixture: {num_sources} sources, more than the index can address (65536)"
    );
    let mut seen = HashSet::new();
    for name in &spec.sources {
        ensure!(
            seen.insert(name),
            "mixture: source '{name}' is listed twice in sources"
        );
    }
    ensure!(
        spec.max_epochs.is_empty() || spec.max_epochs.len() == num_sources,
        "mixture: max_epochs has {} entries but there are {num_sources} sources ({})",
        spec.max_epochs.len(),
        spec.sources.join(", ")
    );
    for (s, cap) in spec.max_epochs.iter().enumerate() {
        if let Some(cap) = *cap {
            ensure!(
                cap.is_finite() && cap >= 0.0,
                "mixture: max_epochs[{s}] (source '{}') must be a finite number >= 0, got {cap}",
                spec.sources[s]
            );
        }
    }

    ensure!(
        !spec.schedule.is_empty(),
        "mixture: schedule is empty; it needs at least one stage, starting at 0"
    );
    ensure!(
        spec.schedule[0].start == 0.0,
        "mixture: schedule[0].start must be 0, got {}",
        spec.schedule[0].start
    );
    let mut normalized = Vec::with_capacity(spec.schedule.len());
    for (i, stage) in spec.schedule.iter().enumerate() {
        ensure!(
            stage.start.is_finite() && (0.0..1.0).contains(&stage.start),
            "mixture: schedule[{i}].start must be in [0, 1), got {}",
            stage.start
        );
        if i > 0 {
            let prev = spec.schedule[i - 1].start;
            ensure!(
                stage.start > prev,
                "mixture: schedule starts must increase, but schedule[{i}].start = {} follows \
                 schedule[{}].start = {prev}",
                stage.start,
                i - 1
            );
        }
        ensure!(
            stage.weights.len() == num_sources,
            "mixture: schedule[{i}].weights has {} entries but there are {num_sources} sources ({})",
            stage.weights.len(),
            spec.sources.join(", ")
        );
        for (s, &w) in stage.weights.iter().enumerate() {
            ensure!(
                w.is_finite() && w >= 0.0,
                "mixture: schedule[{i}].weights[{s}] (source '{}') must be a finite number >= 0, \
                 got {w}",
                spec.sources[s]
            );
        }
        let total: f64 = stage.weights.iter().sum();
        ensure!(
            total > 0.0,
            "mixture: schedule[{i}].weights are all zero; at least one source needs a positive weight"
        );
        normalized.push(stage.weights.iter().map(|w| w / total).collect());
    }
    Ok(normalized)
}

/// What the mixture needs to know about a source's data.
#[derive(Clone, Debug)]
struct SourceStats {
    docs: u64,
    tokens: u64,
    /// Samples per epoch: `floor((tokens - 1) / seq_len)`, 0 when the source is too short for
    /// one sample.
    per_epoch: u64,
}

/// Document counts, token totals and a blake3 digest of every document length, per source.
/// The digest goes into the fingerprint: the index alone does not depend on the lengths, but
/// the windows a sample reads do.
fn scan_sources(
    sources: &[&dyn TokenSource],
    seq_len: usize,
) -> Result<(Vec<SourceStats>, String)> {
    let mut digest = blake3::Hasher::new();
    let mut stats = Vec::with_capacity(sources.len());
    // Lengths are hashed through a buffer: one hasher call per document would be slow for
    // sources with hundreds of millions of documents.
    let mut buf = Vec::with_capacity(64 * 1024);
    for (s, src) in sources.iter().enumerate() {
        let docs = src.num_docs();
        ensure!(
            docs <= u32::MAX as usize,
            "mixture: source {s} has {docs} documents, more than the mixture supports (2^32 - 1)"
        );
        digest.update(&(docs as u64).to_le_bytes());
        let mut tokens = 0u64;
        for d in 0..docs {
            let len = src.doc_len(d) as u64;
            tokens += len;
            buf.extend_from_slice(&len.to_le_bytes());
            if buf.len() >= 64 * 1024 {
                digest.update(&buf);
                buf.clear();
            }
        }
        digest.update(&buf);
        buf.clear();
        stats.push(SourceStats {
            docs: docs as u64,
            tokens,
            per_epoch: tokens.saturating_sub(1) / seq_len as u64,
        });
    }
    Ok((stats, digest.finalize().to_hex().to_string()))
}

/// One block of the mixture, as the apportionment decides it.
struct Block {
    index: u64,
    size: u64,
    stage: usize,
    /// Samples per source in this block.
    counts: Vec<u64>,
}

/// Walks the blocks of a phase, deciding each block's per-source counts (see the module docs,
/// step 2). Both the counting pass and the writing pass run it, so the counts are never stored.
struct Apportioner<'a> {
    weights: &'a [Vec<f64>],
    starts: Vec<f64>,
    block_size: u64,
    n: u64,
    next_block: u64,
    /// Per source: samples owed so far minus samples given. Sums to ~0 between blocks.
    deficit: Vec<f64>,
}

impl<'a> Apportioner<'a> {
    fn new(spec: &MixSpec, weights: &'a [Vec<f64>]) -> Self {
        Apportioner {
            weights,
            starts: spec.schedule.iter().map(|st| st.start).collect(),
            block_size: spec.block_size as u64,
            n: spec.num_samples(),
            next_block: 0,
            deficit: vec![0.0; spec.sources.len()],
        }
    }
}

impl Iterator for Apportioner<'_> {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        let first = self.next_block * self.block_size;
        if first >= self.n {
            return None;
        }
        let size = self.block_size.min(self.n - first);
        let position = first as f64 / self.n as f64;
        // The first stage starts at 0, so some stage always applies.
        let stage = self
            .starts
            .iter()
            .rposition(|&start| start <= position)
            .unwrap_or(0);
        for (d, w) in self.deficit.iter_mut().zip(&self.weights[stage]) {
            *d += size as f64 * w;
        }
        let counts = apportion(size, &mut self.deficit);
        let index = self.next_block;
        self.next_block += 1;
        Some(Block {
            index,
            size,
            stage,
            counts,
        })
    }
}

/// Hands `size` samples out, one at a time, to the source with the largest deficit (ties: the
/// lowest id), and lowers the deficits by what was handed out.
///
/// Done naively that is `size × sources` steps per block; the bulk step below gives every
/// source the whole units it is owed first, which ends in exactly the same counts (a source
/// owed `d >= 1` stays the largest-deficit candidate until it got `floor(d)` units) and leaves
/// fewer than `sources` units for the one-at-a-time loop, which is then largest remainder.
/// If the whole units owed exceed the block (possible only right after a stage change), the
/// loop does all the work.
fn apportion(size: u64, deficit: &mut [f64]) -> Vec<u64> {
    let mut counts = vec![0u64; deficit.len()];
    let whole = |d: f64| d.max(0.0).floor() as u64;
    let bulk: u64 = deficit.iter().map(|&d| whole(d)).sum();
    let mut given = 0;
    if bulk <= size {
        for (c, d) in counts.iter_mut().zip(deficit.iter_mut()) {
            *c = whole(*d);
            *d -= *c as f64;
        }
        given = bulk;
    }
    for _ in given..size {
        let mut best = 0;
        for s in 1..deficit.len() {
            if deficit[s] > deficit[best] {
                best = s;
            }
        }
        counts[best] += 1;
        deficit[best] -= 1.0;
    }
    counts
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

    /// Writes the index to `index_path` and its sidecar to [`manifest_path`]`(index_path)`
    /// (layout in the module docs), and returns the report. Streams block by block, so memory
    /// stays small however long the phase.
    pub fn write(&self, index_path: &Path) -> Result<MixReport> {
        let n = self.spec.num_samples();
        let file = File::create(index_path)
            .with_context(|| format!("creating mixture index {}", index_path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);

        let mut fingerprint = blake3::Hasher::new();
        let spec_json = serde_json::to_vec(&self.spec)?;
        fingerprint.update(b"zflow-mixture-v1");
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
            out.write_all(&bytes).with_context(write_err)
        })?;
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
        };
        // Written after the index and renamed into place, so a sidecar means a complete index.
        let path = manifest_path(index_path);
        let tmp = manifest_path(&path);
        std::fs::write(&tmp, serde_json::to_vec_pretty(&manifest)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
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

// ---------------------------------------------------------------------------------------------
// The index file

const MAGIC: &[u8; 8] = b"ZFMIXIDX";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 48;

/// The index file's header (layout in the module docs).
#[derive(Debug, PartialEq)]
struct Header {
    num_sources: u32,
    num_samples: u64,
    seq_len: u64,
    seed: u64,
    block_size: u64,
}

impl Header {
    fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.num_sources.to_le_bytes());
        b[16..24].copy_from_slice(&self.num_samples.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.seed.to_le_bytes());
        b[40..48].copy_from_slice(&self.block_size.to_le_bytes());
        b
    }

    fn parse(b: &[u8], path: &Path) -> Result<Header> {
        ensure!(
            b.len() >= HEADER_LEN && &b[0..8] == MAGIC,
            "{} is not a mixture index (bad magic or shorter than its header)",
            path.display()
        );
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let version = u32_at(8);
        ensure!(
            version == VERSION,
            "{}: mixture index version {version}, this build reads version {VERSION}",
            path.display()
        );
        Ok(Header {
            num_sources: u32_at(12),
            num_samples: u64_at(16),
            seq_len: u64_at(24),
            seed: u64_at(32),
            block_size: u64_at(40),
        })
    }
}

/// A memory-mapped sample index: sample `i` -> (source, source-local sample) in O(1).
pub struct MixIndex {
    mmap: Mmap,
    header: Header,
}

impl MixIndex {
    /// Maps the index at `path` and checks its header and size.
    pub fn open(path: &Path) -> Result<MixIndex> {
        let file = File::open(path)
            .with_context(|| format!("opening mixture index {}", path.display()))?;
        // SAFETY: the map is read-only, and index files are never modified after they are
        // written (they live in committed, immutable store folders).
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("mapping mixture index {}", path.display()))?;
        let header = Header::parse(&mmap, path)?;
        let expected = (HEADER_LEN as u64).checked_add(header.num_samples.saturating_mul(8));
        ensure!(
            expected == Some(mmap.len() as u64),
            "{}: mixture index is {} bytes, but its header says {} samples ({} bytes expected); \
             the file is truncated or damaged",
            path.display(),
            mmap.len(),
            header.num_samples,
            expected.map_or("too many".to_string(), |e| e.to_string())
        );
        Ok(MixIndex { mmap, header })
    }

    /// N, the number of samples.
    pub fn len(&self) -> u64 {
        self.header.num_samples
    }

    /// Whether the index has no samples (never true for an index [`MixPlan::write`] made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per sample.
    pub fn seq_len(&self) -> usize {
        self.header.seq_len as usize
    }

    /// The mixture's seed.
    pub fn seed(&self) -> u64 {
        self.header.seed
    }

    /// Samples per block.
    pub fn block_size(&self) -> usize {
        self.header.block_size as usize
    }

    /// Number of sources.
    pub fn num_sources(&self) -> usize {
        self.header.num_sources as usize
    }

    /// Sample `i` as (source id, source-local sample number), or `None` past the end.
    pub fn get(&self, i: u64) -> Option<(u16, u64)> {
        if i >= self.len() {
            return None;
        }
        let at = HEADER_LEN + i as usize * 8;
        Some(decode(u64::from_le_bytes(
            self.mmap[at..at + 8].try_into().unwrap(),
        )))
    }
}

// ---------------------------------------------------------------------------------------------
// Cursor and reader

/// Where a trainer is in a phase's data; saved in checkpoints. The fingerprint ties it to one
/// mixture, so a resumed run can never silently read different data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DataCursor {
    /// The phase's name (used in error messages).
    pub phase: String,
    /// The next global sample to read.
    pub sample: u64,
    /// The [`MixReport::fingerprint`] of the mixture the cursor belongs to.
    pub fingerprint: String,
}

impl DataCursor {
    /// The cursor after one global batch of `world * micro_batch` samples.
    pub fn advance(&self, world: usize, micro_batch: usize) -> DataCursor {
        DataCursor {
            sample: self.sample + (world * micro_batch) as u64,
            ..self.clone()
        }
    }
}

/// The cursor after one global batch of `world * micro_batch` samples (same as
/// [`DataCursor::advance`]).
pub fn advance(cursor: &DataCursor, world: usize, micro_batch: usize) -> DataCursor {
    cursor.advance(world, micro_batch)
}

/// One rank's part of a global batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// `micro_batch` rows of `seq_len + 1` tokens, row-major (inputs = row[..seq_len],
    /// targets = row[1..]).
    pub tokens: Vec<u32>,
    /// The source id of each row.
    pub sources: Vec<u16>,
    /// Global sample number of the first row.
    pub first_sample: u64,
}

/// One epoch of a source: its document order and where each document starts in the stream.
struct EpochLayout {
    order: Vec<u32>,
    /// `starts[j]` = stream offset of the j-th document in `order`; one extra entry = total.
    starts: Vec<u64>,
}

/// Epoch layouts kept per source. A batch touches at most two epochs of a source (sources
/// are read front to back), so two per source is enough.
const EPOCHS_CACHED: usize = 2;

/// One source's cached epochs: (epoch, layout), most recently used last.
type RecentEpochs = Vec<(u64, Arc<EpochLayout>)>;

/// Reads a phase's samples: the index (memory-mapped) plus the sources' tokens.
///
/// Opened from the index path alone plus the sources; seq_len and seed come from the index
/// header, and the fingerprint, source names and data digest from the sidecar
/// (`<index>.json`). Safe to share between threads.
pub struct MixtureReader {
    index: MixIndex,
    sources: Vec<Arc<dyn TokenSource>>,
    manifest: MixManifest,
    per_epoch: Vec<u64>,
    /// Per source: recently used epochs, most recent last.
    epochs: Mutex<Vec<RecentEpochs>>,
}

impl MixtureReader {
    /// Opens the index at `index_path` and its sidecar, with the sources' data in source
    /// order. Fails if the sources are not the data the mixture was made from (count,
    /// documents or document lengths differ).
    pub fn open(index_path: &Path, sources: Vec<Arc<dyn TokenSource>>) -> Result<MixtureReader> {
        let index = MixIndex::open(index_path)?;
        let mpath = manifest_path(index_path);
        let text = std::fs::read(&mpath)
            .with_context(|| format!("reading mixture sidecar {}", mpath.display()))?;
        let manifest: MixManifest = serde_json::from_slice(&text)
            .with_context(|| format!("parsing mixture sidecar {}", mpath.display()))?;
        let spec = &manifest.spec;
        let h = &index.header;
        ensure!(
            h.num_samples == spec.num_samples()
                && h.seq_len == spec.seq_len as u64
                && h.seed == spec.seed
                && h.num_sources as usize == spec.sources.len(),
            "{}: the index header does not match its sidecar {} (from different runs?)",
            index_path.display(),
            mpath.display()
        );
        ensure!(
            sources.len() == spec.sources.len(),
            "mixture {}: {} token sources given for {} sources ({})",
            index_path.display(),
            sources.len(),
            spec.sources.len(),
            spec.sources.join(", ")
        );
        let refs: Vec<&dyn TokenSource> = sources.iter().map(|s| s.as_ref()).collect();
        let (stats, digest) = scan_sources(&refs, spec.seq_len)?;
        if digest != manifest.data_digest {
            for (s, (st, rep)) in stats.iter().zip(&manifest.report.sources).enumerate() {
                ensure!(
                    st.docs == rep.documents && st.tokens == rep.data_tokens,
                    "mixture {}: source {s} ('{}') was {} documents / {} tokens when the mixture \
                     was made, but the data given has {} documents / {} tokens",
                    index_path.display(),
                    rep.name,
                    rep.documents,
                    rep.data_tokens,
                    st.docs,
                    st.tokens
                );
            }
            bail!(
                "mixture {}: the sources' document lengths differ from the data the mixture was \
                 made from (same counts, different documents)",
                index_path.display()
            );
        }
        let per_epoch = stats.iter().map(|st| st.per_epoch).collect();
        let epochs = Mutex::new(vec![Vec::new(); sources.len()]);
        Ok(MixtureReader {
            index,
            sources,
            manifest,
            per_epoch,
            epochs,
        })
    }

    /// The mixture's fingerprint.
    pub fn fingerprint(&self) -> &str {
        &self.manifest.report.fingerprint
    }

    /// The mixture's report, as written next to the index.
    pub fn report(&self) -> &MixReport {
        &self.manifest.report
    }

    /// The spec the mixture was made from.
    pub fn spec(&self) -> &MixSpec {
        &self.manifest.spec
    }

    /// N, the number of samples.
    pub fn num_samples(&self) -> u64 {
        self.index.len()
    }

    /// Tokens per sample (a row holds `seq_len + 1`).
    pub fn seq_len(&self) -> usize {
        self.index.seq_len()
    }

    /// A cursor at the start of this mixture, for phase `phase`.
    pub fn start(&self, phase: &str) -> DataCursor {
        DataCursor {
            phase: phase.to_string(),
            sample: 0,
            fingerprint: self.fingerprint().to_string(),
        }
    }

    /// Sample `i` as (source id, source-local sample number).
    pub fn lookup(&self, i: u64) -> Result<(u16, u64)> {
        self.index.get(i).with_context(|| {
            format!(
                "sample {i} is past the end of the mixture (N = {})",
                self.num_samples()
            )
        })
    }

    /// Reads sample `i`'s `seq_len + 1` tokens into `out`; returns its source id.
    pub fn read_sample(&self, i: u64, out: &mut [u32]) -> Result<u16> {
        ensure!(
            out.len() == self.seq_len() + 1,
            "read_sample: buffer of {} tokens, a sample is seq_len + 1 = {}",
            out.len(),
            self.seq_len() + 1
        );
        let (s, k) = self.lookup(i)?;
        let source = s as usize;
        let per_epoch = self.per_epoch[source];
        let layout = self.layout(source, k / per_epoch);
        let src = &self.sources[source];
        let mut pos = (k % per_epoch) * self.seq_len() as u64;
        // The document holding `pos`: the last one starting at or before it (empty documents
        // start where the next one does, so this skips them).
        let mut j = layout.starts.partition_point(|&start| start <= pos) - 1;
        let mut filled = 0;
        while filled < out.len() {
            let offset = pos - layout.starts[j];
            let len = layout.starts[j + 1] - layout.starts[j];
            let take = (len - offset).min((out.len() - filled) as u64) as usize;
            if take > 0 {
                src.read(
                    layout.order[j] as usize,
                    offset as usize,
                    &mut out[filled..filled + take],
                )?;
            }
            filled += take;
            pos += take as u64;
            j += 1;
        }
        Ok(s)
    }

    /// Rank `rank`'s part of the global batch at `cursor`: samples
    /// `cursor.sample + rank * micro_batch ..` (`micro_batch` of them). The global batch is
    /// `world * micro_batch` consecutive samples, so the global order never depends on the
    /// world size. Fails if the cursor belongs to another mixture, or if the *global* batch
    /// would read past N (so all ranks fail on the same step).
    pub fn batch(
        &self,
        cursor: &DataCursor,
        rank: usize,
        world: usize,
        micro_batch: usize,
    ) -> Result<Batch> {
        ensure!(
            cursor.fingerprint == self.fingerprint(),
            "phase '{}': the data cursor's mixture fingerprint {} does not match this mixture's \
             {}; the data, the mixture spec or its seed changed since the cursor was saved",
            cursor.phase,
            cursor.fingerprint,
            self.fingerprint()
        );
        ensure!(
            world > 0 && micro_batch > 0,
            "batch: world ({world}) and micro_batch ({micro_batch}) must be > 0"
        );
        ensure!(
            rank < world,
            "batch: rank {rank} is not below world {world}"
        );
        let n = self.num_samples();
        let global = (world * micro_batch) as u64;
        let end = cursor.sample.saturating_add(global);
        ensure!(
            end <= n,
            "phase '{}': the mixture has N = {n} samples, but the batch at sample {} needs samples \
             up to {end} (world {world} x micro_batch {micro_batch})",
            cursor.phase,
            cursor.sample
        );
        let row = self.seq_len() + 1;
        let first = cursor.sample + (rank * micro_batch) as u64;
        let mut tokens = vec![0u32; micro_batch * row];
        let mut sources = Vec::with_capacity(micro_batch);
        for (r, out) in tokens.chunks_exact_mut(row).enumerate() {
            sources.push(self.read_sample(first + r as u64, out)?);
        }
        Ok(Batch {
            tokens,
            sources,
            first_sample: first,
        })
    }

    /// The layout of epoch `epoch` of `source`, from the cache or built (O(documents)).
    fn layout(&self, source: usize, epoch: u64) -> Arc<EpochLayout> {
        let mut cache = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let entries = &mut cache[source];
        if let Some(at) = entries.iter().position(|(e, _)| *e == epoch) {
            let hit = entries.remove(at);
            let layout = hit.1.clone();
            entries.push(hit);
            return layout;
        }
        let src = &self.sources[source];
        let order = epoch_order(self.index.seed(), source, epoch, src.num_docs());
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut total = 0u64;
        starts.push(0);
        for &d in &order {
            total += src.doc_len(d as usize) as u64;
            starts.push(total);
        }
        let layout = Arc::new(EpochLayout { order, starts });
        if entries.len() == EPOCHS_CACHED {
            entries.remove(0);
        }
        entries.push((epoch, layout.clone()));
        layout
    }
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests;
