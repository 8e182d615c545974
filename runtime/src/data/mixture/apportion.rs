//! How a mixture's samples are shared out: checks of the spec, the sources' statistics,
//! the seeded shuffles and the largest-remainder apportionment of every block.

use super::super::TokenSource;
use super::MixSpec;
use crate::rng::SplitMix64;
use anyhow::{Result, ensure};
use std::collections::HashSet;

/// Domain tags, so the block shuffles, the document shuffles and the window orders
/// ([`super::permutation`]) never share a stream.
pub(super) const TAG_BLOCK: u64 = 1;
pub(super) const TAG_DOCS: u64 = 2;
pub(super) const TAG_WINDOWS: u64 = 3;

/// A generator seeded from several numbers (e.g. seed, tag, block): each part is mixed in
/// through one SplitMix64 step, so nearby inputs give unrelated streams.
pub(super) fn rng_for(parts: &[u64]) -> SplitMix64 {
    let mut state = 0u64;
    for &part in parts {
        state = SplitMix64(state ^ part).next_u64();
    }
    SplitMix64(state)
}

/// Fisher–Yates (Durstenfeld): from the back, swap each element with a uniformly chosen one
/// at or before it.
pub(super) fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The document order of epoch `epoch` of source `source`.
pub(super) fn epoch_order(seed: u64, source: usize, epoch: u64, num_docs: usize) -> Vec<u64> {
    let mut order: Vec<u64> = (0..num_docs as u64).collect();
    shuffle(
        &mut order,
        &mut rng_for(&[seed, TAG_DOCS, source as u64, epoch]),
    );
    order
}

/// Bits of an index entry that hold the source-local sample number; the source id sits above.
pub(super) const K_BITS: u32 = 48;
pub(super) const K_MASK: u64 = (1 << K_BITS) - 1;

pub(super) fn encode(source: u16, k: u64) -> u64 {
    (source as u64) << K_BITS | k
}

pub(super) fn decode(entry: u64) -> (u16, u64) {
    ((entry >> K_BITS) as u16, entry & K_MASK)
}

/// Checks a spec on its own (no data yet); returns each stage's normalized weights.
pub(super) fn validate(spec: &MixSpec) -> Result<Vec<Vec<f64>>> {
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
pub(super) struct SourceStats {
    pub(super) docs: u64,
    pub(super) tokens: u64,
    /// Samples per epoch: `floor((tokens - 1) / seq_len)`, 0 when the source is too short for
    /// one sample.
    pub(super) per_epoch: u64,
}

/// Document counts, token totals and a blake3 digest of every document length, per source.
/// The digest goes into the fingerprint: the index alone does not depend on the lengths, but
/// the windows a sample reads do.
pub(super) fn scan_sources(
    sources: &[&dyn TokenSource],
    seq_len: usize,
) -> Result<(Vec<SourceStats>, String)> {
    let mut digest = blake3::Hasher::new();
    let mut stats = Vec::with_capacity(sources.len());
    // Lengths are hashed through a buffer: one hasher call per document would be slow for
    // sources with hundreds of millions of documents.
    let mut buf = Vec::with_capacity(64 * 1024);
    for src in sources {
        let docs = src.num_docs();
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
pub(super) struct Block {
    pub(super) index: u64,
    pub(super) size: u64,
    pub(super) stage: usize,
    /// Samples per source in this block.
    pub(super) counts: Vec<u64>,
}

/// Walks the blocks of a phase, deciding each block's per-source counts (see the module docs,
/// step 2). Both the counting pass and the writing pass run it, so the counts are never stored.
pub(super) struct Apportioner<'a> {
    pub(super) weights: &'a [Vec<f64>],
    pub(super) starts: Vec<f64>,
    pub(super) block_size: u64,
    pub(super) n: u64,
    pub(super) next_block: u64,
    /// Per source: samples owed so far minus samples given. Sums to ~0 between blocks.
    pub(super) deficit: Vec<f64>,
}

impl<'a> Apportioner<'a> {
    pub(super) fn new(spec: &MixSpec, weights: &'a [Vec<f64>]) -> Self {
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
pub(super) fn apportion(size: u64, deficit: &mut [f64]) -> Vec<u64> {
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
