//! The sample index file: its header and the memory-mapped [`MixIndex`].

use super::apportion::decode;
use anyhow::{Context, Result, ensure};
use memmap2::Mmap;
use std::path::Path;

pub(super) const MAGIC: &[u8; 8] = b"ZFMIXIDX";
/// Version 2 reads each epoch's windows in a keyed order (`super::permutation`); an index of
/// version 1 was made for reading them front to back, and is refused rather than read
/// differently from how it was made.
pub(super) const VERSION: u32 = 2;
pub(super) const HEADER_LEN: usize = 48;

/// The index file's header (layout in the module docs).
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    pub(super) num_sources: u32,
    pub(super) num_samples: u64,
    pub(super) seq_len: u64,
    pub(super) seed: u64,
    pub(super) block_size: u64,
}

impl Header {
    pub(super) fn to_bytes(&self) -> [u8; HEADER_LEN] {
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

    pub(super) fn parse(b: &[u8], path: &Path) -> Result<Header> {
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
            "{}: mixture index version {version}, this build reads version {VERSION}{}",
            path.display(),
            if version < VERSION {
                " (an older index, made before a source's windows were read in a shuffled \
                 order: run its mix stage again)"
            } else {
                ""
            }
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
    pub(super) mmap: Mmap,
    pub(super) header: Header,
}

impl MixIndex {
    /// Maps the index at `path` and checks its header and size.
    pub fn open(path: &Path) -> Result<MixIndex> {
        let mmap = zflow_files::map::read_only(path).context("opening the mixture index")?;
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

    /// Whether the index has no samples (never true for an index [`MixPlan::write`](super::MixPlan::write) made).
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
