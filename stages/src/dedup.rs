//! `dedup.<source>`: exact dedup across the shards of a sharded source.
//!
//! Each shard's ingest drops its own duplicates and writes `hashes.bin`: one record per kept
//! document (the first 16 bytes of the blake3 of its normalised text, its index in the shard,
//! its size in bytes), sorted. This stage merges every shard's records, a k-way merge that
//! holds one record per shard in memory however large the source, and keeps each text's first
//! occurrence in shard order. Every later occurrence goes into its shard's drop list,
//! `drops/<index>.bin` (document indices, u64 little-endian, ascending; a file for every shard,
//! empty when it drops nothing), which that shard's tokenize stage leaves out. A tokenize
//! stage's identity hashes its own drop list only ([`crate::tokenize::SkipList`]), so a
//! changed shard re-runs this stage (cheap: it reads 32 bytes per document) but only the
//! tokenize stages whose drop lists changed.
//!
//! The result equals deduplicating the concatenation of the shards in order: what stays is
//! the same set of texts as one unsharded ingest keeps (in shard order rather than file order).
//!
//! `stats.json` and `stats.parquet` (`source`, `shard`, `rule`, `documents`, `bytes`): per
//! shard, the documents it holds and those dropped as duplicates of an earlier shard's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use arrow::array::{ArrayRef, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::names;

/// The `dedup` stage kind.
pub struct Dedup;

/// `dedup` settings (what `sources.<name>.shards` writes).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// The source.
    pub source: String,
    /// Its number of shards; the inputs are its ingest shards.
    pub shards: usize,
}

/// One kept document of a shard, as `hashes.bin` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocHash {
    /// The first 16 bytes of the blake3 of the normalised text (the order of the records).
    pub hash: [u8; 16],
    /// The document's index in its shard's `documents.parquet`.
    pub doc: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl DocHash {
    /// Bytes per record.
    const LEN: usize = 32;

    /// The record of document `doc` with text `text`.
    pub fn of(text: &str, doc: u64) -> DocHash {
        let full = blake3::hash(text.as_bytes());
        DocHash {
            hash: full.as_bytes()[..16].try_into().expect("16 bytes"),
            doc,
            bytes: text.len() as u64,
        }
    }

    fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        out[..16].copy_from_slice(&self.hash);
        out[16..24].copy_from_slice(&self.doc.to_le_bytes());
        out[24..].copy_from_slice(&self.bytes.to_le_bytes());
        out
    }

    fn decode(b: &[u8; Self::LEN]) -> DocHash {
        DocHash {
            hash: b[..16].try_into().expect("16 bytes"),
            doc: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            bytes: u64::from_le_bytes(b[24..].try_into().expect("8 bytes")),
        }
    }
}

/// Writes a shard's `hashes.bin` into `out`: `hashes` sorted.
pub fn write_hashes(out: &Path, mut hashes: Vec<DocHash>) -> Result<()> {
    hashes.sort_unstable();
    let mut w = BufWriter::new(std::fs::File::create(out.join("hashes.bin"))?);
    for h in &hashes {
        w.write_all(&h.encode())?;
    }
    w.into_inner()?.sync_all()?;
    Ok(())
}

/// The path, within a dedup stage's output, of shard `index`'s (of `count`) drop list.
pub fn drops_file(index: usize, count: usize) -> String {
    let width = (count.max(2) - 1).to_string().len();
    format!("drops/{index:0width$}.bin")
}

/// Reads a drop list: the document indices a shard leaves out, ascending.
pub fn read_drops(path: &Path) -> Result<Vec<u64>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() % 8 == 0,
        "{}: {} bytes, not a list of u64 document indices",
        path.display(),
        bytes.len()
    );
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// One shard's `hashes.bin`, read a record at a time.
struct Records {
    reader: BufReader<std::fs::File>,
    path: std::path::PathBuf,
    previous: Option<[u8; 16]>,
}

impl Records {
    fn open(path: std::path::PathBuf) -> Result<Records> {
        let file = std::fs::File::open(&path).with_context(|| {
            format!(
                "opening {} (an ingest shard of a deduplicated source writes it)",
                path.display()
            )
        })?;
        Ok(Records {
            reader: BufReader::with_capacity(1 << 16, file),
            path,
            previous: None,
        })
    }

    fn next(&mut self) -> Result<Option<DocHash>> {
        let mut b = [0u8; DocHash::LEN];
        match self.reader.read_exact(&mut b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
        let h = DocHash::decode(&b);
        // Sorted, and without duplicates (the shard's ingest dropped its own).
        ensure!(
            self.previous.is_none_or(|p| p < h.hash),
            "{}: records out of order (a damaged file?)",
            self.path.display()
        );
        self.previous = Some(h.hash);
        Ok(Some(h))
    }
}

impl Stage for Dedup {
    type Config = DedupConfig;
    const KIND: &'static str = "dedup";
    const VERSION: u32 = 1;

    fn validate(&self, c: &DedupConfig, needs: &[String]) -> Result<(), ConfigError> {
        let ingest = names::ingest(&c.source);
        let want: Vec<String> = (0..c.shards)
            .map(|i| names::shard(&ingest, i, c.shards))
            .collect();
        if needs != want.as_slice() {
            return Err(ConfigError::new(
                "needs",
                format!(
                    "a dedup stage reads the {} ingest shards of `{}` in order ({} ...)",
                    c.shards,
                    c.source,
                    want.first().map(String::as_str).unwrap_or("")
                ),
            ));
        }
        Ok(())
    }

    fn run(&self, c: &DedupConfig, ctx: &StageContext) -> Result<()> {
        raise_open_files_limit(c.shards as u64 + 64);
        let ingest = names::ingest(&c.source);
        let mut shards = Vec::with_capacity(c.shards);
        for i in 0..c.shards {
            let dir = ctx.input(&names::shard(&ingest, i, c.shards))?;
            shards.push(Records::open(dir.join("hashes.bin"))?);
        }
        // The smallest (hash, shard) first: of equal texts, the earliest shard's comes first.
        let mut heap = BinaryHeap::new();
        for (i, r) in shards.iter_mut().enumerate() {
            if let Some(h) = r.next()? {
                heap.push(Reverse((h.hash, i, h.doc, h.bytes)));
            }
        }
        let mut kept = vec![(0u64, 0u64); c.shards];
        let mut drops: Vec<Vec<u64>> = vec![Vec::new(); c.shards];
        let mut dropped_bytes = vec![0u64; c.shards];
        let mut last: Option<[u8; 16]> = None;
        ctx.progress()
            .set_message("merging the shards' document hashes");
        let mut merged = 0u64;
        while let Some(Reverse((hash, shard, doc, bytes))) = heap.pop() {
            if last == Some(hash) {
                drops[shard].push(doc);
                dropped_bytes[shard] += bytes;
            } else {
                kept[shard].0 += 1;
                kept[shard].1 += bytes;
                last = Some(hash);
            }
            if let Some(h) = shards[shard].next()? {
                heap.push(Reverse((h.hash, shard, h.doc, h.bytes)));
            }
            merged += 1;
            if merged.is_multiple_of(1 << 20) {
                ctx.check_cancelled()?;
            }
        }
        let dir = ctx.out_dir().join("drops");
        std::fs::create_dir_all(&dir)?;
        for (i, list) in drops.iter_mut().enumerate() {
            list.sort_unstable();
            let bytes: Vec<u8> = list.iter().flat_map(|d| d.to_le_bytes()).collect();
            std::fs::write(ctx.out_dir().join(drops_file(i, c.shards)), bytes)?;
        }
        let total: usize = drops.iter().map(Vec::len).sum();
        tracing::info!(
            "{}: {merged} documents in {} shards, {total} dropped as duplicates of an earlier shard's",
            c.source,
            c.shards
        );
        write_stats(ctx.out_dir(), &c.source, &kept, &drops, &dropped_bytes)
    }
}

fn write_stats(
    out: &Path,
    source: &str,
    kept: &[(u64, u64)],
    drops: &[Vec<u64>],
    dropped_bytes: &[u64],
) -> Result<()> {
    let mut rows: Vec<(u64, &str, u64, u64)> = Vec::new();
    for (i, (&(docs, bytes), list)) in kept.iter().zip(drops).enumerate() {
        rows.push((i as u64, "kept", docs, bytes));
        rows.push((
            i as u64,
            "dropped:duplicate_of_earlier_shard",
            list.len() as u64,
            dropped_bytes[i],
        ));
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|(s, rule, d, b)| serde_json::json!({"shard": s, "rule": rule, "documents": d, "bytes": b}))
        .collect();
    std::fs::write(out.join("stats.json"), serde_json::to_vec_pretty(&json)?)?;
    let fields = vec![
        Field::new("source", DataType::Utf8, false),
        Field::new("shard", DataType::UInt64, false),
        Field::new("rule", DataType::Utf8, false),
        Field::new("documents", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ];
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![source; rows.len()])),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.3))),
    ];
    crate::util::write_parquet(&out.join("stats.parquet"), fields, cols)
}

/// Raises this process's soft limit on open files towards `want` (up to the hard limit): the
/// merge holds every shard's file open at once.
fn raise_open_files_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_sort_by_hash_first() {
        let a = DocHash::of("one text", 7);
        assert_eq!(DocHash::decode(&a.encode()), a);
        let mut v = [
            DocHash::of("b", 0),
            DocHash::of("a", 1),
            DocHash::of("c", 2),
        ];
        v.sort();
        assert!(v.windows(2).all(|w| w[0].hash < w[1].hash));
        assert_eq!(drops_file(3, 12), "drops/03.bin");
        assert_eq!(drops_file(0, 1), "drops/0.bin");
    }
}
